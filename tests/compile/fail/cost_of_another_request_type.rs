//! A cost is checked against the requests the extractor keys, at `.cost()`.
use std::time::Duration;
use tower_sliding_window::{PeerIp, Policy, SlidingWindowLayer};

struct Job {
    units: u32,
}

fn main() {
    let _ = SlidingWindowLayer::builder(PeerIp::new())
        .policy(Policy::per(1, Duration::from_secs(1)).unwrap())
        .cost(|job: &Job| job.units);
}

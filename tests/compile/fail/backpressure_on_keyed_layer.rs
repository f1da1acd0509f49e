//! `poll_ready` sees no request, so only a global limit can hold it back.
use std::time::Duration;
use tower_sliding_window::{HeaderKey, Policy, SlidingWindowLayer};

fn main() {
    let _ = SlidingWindowLayer::builder(HeaderKey::named("x-api-key").unwrap())
        .policy(Policy::per(1, Duration::from_secs(1)).unwrap())
        .backpressure();
}

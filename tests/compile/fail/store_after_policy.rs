//! In-memory policies and given stores do not mix.
use std::time::Duration;
use tower_sliding_window::{GlobalKey, Limiter, Policy, SlidingWindowLayer};

fn main() {
    let p = || Policy::per(1, Duration::from_secs(1)).unwrap();
    let _ = SlidingWindowLayer::builder(GlobalKey)
        .policy(p())
        .store(Limiter::<()>::new(p()).unwrap());
}

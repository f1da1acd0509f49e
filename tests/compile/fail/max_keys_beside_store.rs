//! A store keeps its own key cap: there is none to set beside one.
use std::time::Duration;
use tower_sliding_window::{GlobalKey, Limiter, Policy, SlidingWindowLayer};

fn main() {
    let p = Policy::per(1, Duration::from_secs(1)).unwrap();
    let _ = SlidingWindowLayer::builder(GlobalKey)
        .store(Limiter::<()>::new(p).unwrap())
        .max_keys(1000);
}

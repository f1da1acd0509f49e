//! A store keeps its own clock: there is no clock to set beside one.
use std::time::Duration;
use tower_sliding_window::{GlobalKey, Limiter, ManualClock, Policy, SlidingWindowLayer};

fn main() {
    let p = Policy::per(1, Duration::from_secs(1)).unwrap();
    let _ = SlidingWindowLayer::builder(GlobalKey)
        .store(Limiter::<()>::new(p).unwrap())
        .clock(ManualClock::new());
}

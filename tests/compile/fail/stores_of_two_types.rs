//! Every store of a layer has one type.
use std::time::Duration;
use tower_sliding_window::{GlobalKey, Limiter, ManualClock, Policy, SlidingWindowLayer};

fn main() {
    let p = |name: &str| Policy::builder().name(name).limit(1).window(Duration::from_secs(1)).build().unwrap();
    let manual: Limiter<(), ManualClock> = Limiter::builder(p("b")).clock(ManualClock::new()).build().unwrap();
    let _ = SlidingWindowLayer::builder(GlobalKey)
        .store(Limiter::<()>::new(p("a")).unwrap())
        .store(manual);
}

//! Only in-memory limiters can wait: a store cannot tell when a unit frees.
use std::time::Duration;
use tower_sliding_window::redis::RedisStore;
use tower_sliding_window::{FailurePolicy, OnLimit, PeerIp, Policy, SlidingWindowLayer, WaitConfig};

fn main() {
    let p = Policy::per(1, Duration::from_secs(1)).unwrap();
    let store = RedisStore::builder(p, FailurePolicy::Open).url("redis://127.0.0.1").build().unwrap();
    let _ = SlidingWindowLayer::builder(PeerIp::new())
        .store(store)
        .on_limit(OnLimit::Wait(WaitConfig::bounded(Duration::from_secs(1), 8).unwrap()));
}

//! The two layers `benches/layer.rs` and `benches/profile.rs` compare, with the
//! same settings: one global key, `limit` per hour.

use axum::body::Body;
use governor::middleware::NoOpMiddleware;
use std::sync::Arc;
use std::time::Duration;
use tower_governor::{
    governor::GovernorConfigBuilder, key_extractor::GlobalKeyExtractor, GovernorLayer,
};
use tower_sliding_window::{GlobalKey, Policy, SlidingWindowLayer};

pub fn ours(limit: u32) -> SlidingWindowLayer<(), GlobalKey> {
    SlidingWindowLayer::builder(GlobalKey)
        .policy(Policy::per(limit, Duration::from_secs(3600)).unwrap())
        .build()
        .unwrap()
}

/// A burst of `limit`; for `u32::MAX` (every request passes) one more per
/// nanosecond, else one more per hour. (A burst of `u32::MAX` refilled hourly, as
/// in `benches/http.rs`, starts rejecting after about a million requests, well
/// within one criterion run.)
pub fn governor(limit: u32) -> GovernorLayer<GlobalKeyExtractor, NoOpMiddleware, Body> {
    let mut config = GovernorConfigBuilder::default();
    if limit == u32::MAX {
        config.per_nanosecond(1);
    } else {
        config.per_second(3600);
    }
    let config = config
        .burst_size(limit)
        .key_extractor(GlobalKeyExtractor)
        .finish()
        .unwrap();
    GovernorLayer::new(Arc::new(config))
}

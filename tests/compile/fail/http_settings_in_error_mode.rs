//! In error mode rejections are error values: there is no status to set.
use std::time::Duration;
use tower_sliding_window::{GlobalKey, Policy, SlidingWindowLayer};

fn main() {
    let _ = SlidingWindowLayer::builder(GlobalKey)
        .policy(Policy::per(1, Duration::from_secs(1)).unwrap())
        .reject_with_errors()
        .status(http::StatusCode::SERVICE_UNAVAILABLE);
}

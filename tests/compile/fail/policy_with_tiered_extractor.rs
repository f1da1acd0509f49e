//! An extractor that names tiers takes its policies from a table of tiers.
use std::time::Duration;
use http::Request;
use tower_sliding_window::{tiered_key_fn, Policy, SlidingWindowLayer};

fn main() {
    let by_tier = tiered_key_fn(|req: &Request<()>| {
        Some(("free", req.headers().get("x-api-key")?.as_bytes().to_vec()))
    });
    let _ = SlidingWindowLayer::builder(by_tier).policy(Policy::per(1, Duration::from_secs(1)).unwrap());
}

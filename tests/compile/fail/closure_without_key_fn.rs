//! A closure keys requests only once wrapped with `key_fn`.
use std::time::Duration;
use http::Request;
use tower_sliding_window::{Policy, SlidingWindowLayer};

fn main() {
    let by_user = |req: &Request<()>| req.headers().get("x-user").map(|v| v.as_bytes().to_vec());
    let _ = SlidingWindowLayer::new(Policy::per(1, Duration::from_secs(1)).unwrap(), by_user);
}

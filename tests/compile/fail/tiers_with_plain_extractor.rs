//! A layer of tiers needs an extractor that names each request's tier.
use tower_sliding_window::{PeerIp, SlidingWindowLayer, Tiers};

fn main() {
    let tiers = Tiers::builder().limited("free", ["100/min".parse().unwrap()]).build().unwrap();
    let _ = SlidingWindowLayer::builder(PeerIp::new()).tiers(tiers);
}

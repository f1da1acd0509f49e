//! Layers named in a struct with one or two type parameters.
use std::time::Duration;
use tower_sliding_window::layer::RedisLayer;
use tower_sliding_window::redis::RedisStore;
use tower_sliding_window::{ClientIp, GlobalKey, HeaderKey, PeerIp, Policy, SlidingWindowLayer};

#[allow(dead_code)]
struct Limits {
    per_api_key: SlidingWindowLayer<HeaderKey>,
    per_peer: SlidingWindowLayer<PeerIp>,
    per_client: SlidingWindowLayer<ClientIp>,
    global: SlidingWindowLayer<GlobalKey>,
    fleet: SlidingWindowLayer<PeerIp, RedisStore>,
    fleet_alias: RedisLayer<PeerIp>,
}

fn main() -> Result<(), tower_sliding_window::ConfigError> {
    // The key type is inferred from the extractor.
    let per_api_key = SlidingWindowLayer::new(
        Policy::per(10, Duration::from_secs(1))?,
        HeaderKey::named("x-api-key")?,
    )?;
    let _: SlidingWindowLayer<HeaderKey> = per_api_key;
    Ok(())
}

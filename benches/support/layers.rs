//! The two layers `benches/layer.rs` and `benches/profile.rs` compare, with the
//! same settings (`limit` per hour, keyed by one global key or by the peer's
//! IP), the service they wrap and the loop that sends requests through them.

use axum::body::Body;
use axum::extract::ConnectInfo;
use governor::middleware::NoOpMiddleware;
use std::convert::Infallible;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::{Service, ServiceExt};
use tower_governor::{
    governor::GovernorConfigBuilder,
    key_extractor::{GlobalKeyExtractor, KeyExtractor, PeerIpKeyExtractor},
    GovernorLayer,
};
use tower_sliding_window::extract::Untiered;
use tower_sliding_window::{
    GlobalKey, KeyExtractor as OurExtractor, PeerIp, Policy, SlidingWindowLayer,
};

/// How both layers key requests.
#[derive(Clone, Copy)]
pub enum Keys {
    /// One key for every request (`GlobalKey`, `GlobalKeyExtractor`).
    Global,
    /// The peer's IP from axum's `ConnectInfo` (`PeerIp`, `PeerIpKeyExtractor`,
    /// tower_governor's default); every request comes from 127.0.0.1.
    PeerIp,
}

pub fn ours(limit: u32) -> SlidingWindowLayer<GlobalKey> {
    ours_with(limit, GlobalKey)
}

pub fn ours_with<X: OurExtractor<Req, Tiering = Untiered>>(
    limit: u32,
    keys: X,
) -> SlidingWindowLayer<X> {
    SlidingWindowLayer::builder(keys)
        .policy(Policy::per(limit, Duration::from_secs(3600)).unwrap())
        .build()
        .unwrap()
}

pub fn ours_peer_ip(limit: u32) -> SlidingWindowLayer<PeerIp> {
    ours_with(limit, PeerIp::new())
}

/// Every request under one key of a `u8`, in a layer of policies.
pub type OneKey = tower_sliding_window::extract::KeyFn<fn(&Req) -> Option<u8>, u8>;

/// Every request in tier "paid" under one key, in a layer of four tiers.
pub type OneKeyInTier =
    tower_sliding_window::extract::TieredKeyFn<fn(&Req) -> Option<(&'static str, u8)>, u8>;

pub fn ours_one_key(limit: u32) -> SlidingWindowLayer<OneKey> {
    {
        let extractor: OneKey = tower_sliding_window::key_fn(|_: &Req| Some(0u8));
        ours_with(limit, extractor)
    }
}

/// The same policy as `ours_one_key` as the third of four tiers: the request
/// loads the table, finds its tier by name, and is decided as above.
pub fn ours_tiered(limit: u32) -> SlidingWindowLayer<OneKeyInTier> {
    let policy = Policy::per(limit, Duration::from_secs(3600)).unwrap();
    let tiers = tower_sliding_window::Tiers::builder()
        .limited("anonymous", [policy.clone()])
        .limited("free", [policy.clone()])
        .limited("paid", [policy])
        .unlimited("internal")
        .build()
        .unwrap();
    let extractor: OneKeyInTier =
        tower_sliding_window::tiered_key_fn(|_: &Req| Some(("paid", 0u8)));
    SlidingWindowLayer::builder(extractor)
        .tiers(tiers)
        .build()
        .unwrap()
}

/// A burst of `limit`; for `u32::MAX` (every request passes) one more per
/// nanosecond, else one more per hour. (A burst of `u32::MAX` refilled hourly, as
/// in `benches/http.rs`, starts rejecting after about a million requests, well
/// within one criterion run.)
pub fn governor(limit: u32) -> GovernorLayer<GlobalKeyExtractor, NoOpMiddleware, Body> {
    governor_with(limit, GlobalKeyExtractor)
}

pub fn governor_peer_ip(limit: u32) -> GovernorLayer<PeerIpKeyExtractor, NoOpMiddleware, Body> {
    governor_with(limit, PeerIpKeyExtractor)
}

fn governor_with<X: KeyExtractor>(limit: u32, keys: X) -> GovernorLayer<X, NoOpMiddleware, Body> {
    let mut config = GovernorConfigBuilder::default();
    if limit == u32::MAX {
        config.per_nanosecond(1);
    } else {
        config.per_second(3600);
    }
    let config = config
        .burst_size(limit)
        .key_extractor(keys)
        .finish()
        .unwrap();
    GovernorLayer::new(Arc::new(config))
}

pub type Req = http::Request<Body>;
pub type Res = http::Response<Body>;

/// The wrapped service: an empty 200 at once.
pub fn inner() -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone {
    inner_of::<0>()
}

/// The same service as a type of its own, for the peer-IP arms: sharing one
/// response future type with the global-key arms made the compiler stop
/// inlining our layer's `poll` into the loops (13 more instructions per
/// request through ours, callgrind).
pub fn inner_peer_ip() -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone
{
    inner_of::<1>()
}

fn inner_of<const ARM: u8>(
) -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(|_req: Req| async { Ok::<_, Infallible>(http::Response::new(Body::empty())) })
}

/// An axum app with one route (`GET /` → "Hello, world!"), as `benches/http.rs`
/// serves: the inner service a layer wraps in a real server, whose `call` the
/// compiler does not inline into the layer's.
pub fn router() -> axum::Router {
    async fn hello() -> &'static str {
        "Hello, world!"
    }
    axum::Router::new().route("/", axum::routing::get(hello))
}

/// A single-threaded runtime, as the requests run one after another.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A request as a server hands it to the layers: for `Keys::PeerIp` with the
/// peer's address in axum's `ConnectInfo` (inserting it costs every arm the same).
fn request(keys: Keys) -> Req {
    let mut req = http::Request::new(Body::empty());
    if let Keys::PeerIp = keys {
        let peer: SocketAddr = ([127, 0, 0, 1], 40_000).into();
        req.extensions_mut().insert(ConnectInfo(peer));
    }
    req
}

/// Time `iters` requests through `svc`, one after another.
pub fn run<S>(rt: &tokio::runtime::Runtime, svc: S, keys: Keys, iters: u64) -> Duration
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    // A loop per kind of request, each with its construction inline: one
    // shared `request(keys)` call cost every arm about 50 instructions more per
    // request (callgrind, no layer: 297 against 348).
    match keys {
        Keys::Global => run_with(rt, svc, iters, || request(Keys::Global)),
        Keys::PeerIp => run_with(rt, svc, iters, || request(Keys::PeerIp)),
    }
}

fn run_with<S, R>(rt: &tokio::runtime::Runtime, mut svc: S, iters: u64, request: R) -> Duration
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
    R: Fn() -> Req,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let response = svc.ready().await.unwrap().call(request()).await.unwrap();
            black_box(response);
        }
        start.elapsed()
    })
}

//! The two layers `benches/layer.rs` and `benches/profile.rs` compare, with the
//! same settings (one global key, `limit` per hour), the service they wrap and
//! the loop that sends requests through them.

use axum::body::Body;
use governor::middleware::NoOpMiddleware;
use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::{Service, ServiceExt};
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

pub type Req = http::Request<Body>;
pub type Res = http::Response<Body>;

/// The wrapped service: an empty 200 at once.
pub fn inner() -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(|_req: Req| async { Ok::<_, Infallible>(http::Response::new(Body::empty())) })
}

/// A single-threaded runtime, as the requests run one after another.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Time `iters` requests through `svc`, one after another.
pub fn run<S>(rt: &tokio::runtime::Runtime, mut svc: S, iters: u64) -> Duration
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let response = svc
                .ready()
                .await
                .unwrap()
                .call(http::Request::new(Body::empty()))
                .await
                .unwrap();
            black_box(response);
        }
        start.elapsed()
    })
}

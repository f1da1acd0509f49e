//! A keyed, lock-free sliding-window rate limiter that never admits more than its
//! limit in any window.
//!
//! The core [`Limiter`] works on its own: `check(&key)` returns a [`Decision`]
//! with everything rate-limit headers need.
//!
//! ```
//! use std::time::Duration;
//! use tower_sliding_window::{Limiter, Policy};
//!
//! let limiter = Limiter::new(Policy::per(100, Duration::from_secs(60)).unwrap()).unwrap();
//! let decision = limiter.check(&"api-key-1");
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 99);
//! ```
//!
//! # The tower layer
//!
//! [`SlidingWindowLayer`] puts the limiter in front of any tower service: axum,
//! hyper, tonic, or a service of your own request type. Its limiters are created
//! when the layer is built, so every clone and every connection shares them.
//!
//! ```
//! use std::time::Duration;
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_sliding_window::{Policy, SlidingWindowLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 2 requests per minute per API key.
//! let api_key = |req: &Request<Body>| {
//!     req.headers().get("x-api-key").map(|v| v.as_bytes().to_vec())
//! };
//! let layer = SlidingWindowLayer::new(Policy::per(2, Duration::from_secs(60))?, api_key)?;
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//!
//! let call = || {
//!     let req = Request::get("/").header("x-api-key", "k1").body(Body::empty()).unwrap();
//!     app.clone().oneshot(req)
//! };
//! assert_eq!(call().await?.status(), StatusCode::OK);
//! assert_eq!(call().await?.status(), StatusCode::OK);
//! let limited = call().await?;
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! // Seconds until a request fits again (strict mode: a window plus one bucket).
//! assert_eq!(limited.headers()["retry-after"], "64");
//! assert_eq!(limited.headers()["ratelimit"], r#""default";r=0;t=64"#);
//! # Ok(()) }
//! ```
//!
//! Over the limit, an HTTP request gets 429 with `Retry-After` and the IETF
//! `RateLimit` / `RateLimit-Policy` fields; a gRPC request gets a trailers-only
//! `grpc-status: 8` (RESOURCE_EXHAUSTED); a request of any other type, through
//! [`reject_with_errors`](SlidingWindowLayerBuilder::reject_with_errors), gets a
//! [`RateLimited`] error. See [`SlidingWindowLayerBuilder`] for several policies,
//! request costs, exemptions, dry runs and remote [`Store`]s.
//!
//! Instead of rejecting, a request over the limit can wait its turn in its
//! response future, FIFO per key and bounded ([`OnLimit::Wait`]), or a global
//! limit can hold back `poll_ready` ([`OnLimit::Backpressure`]). The queues
//! work without tower too: [`WaitQueues`] and [`Backpressure`].
//!
//! # The precision guarantee
//!
//! In [`Precision::Strict`] mode (the default), **no interval of length `window`
//! ever holds more than `limit` admitted units**, under any interleaving of
//! concurrent checks. A window is cut into N buckets and a check counts the N + 1
//! buckets the last window touches, so at saturation it admits at least
//! N/(N+1) of what an exact sliding log would (94% with the default 15 buckets).
//! GCRA and fixed-window limiters let up to 2 × limit through in some window.
//!
//! # Time
//!
//! Decisions use a [`Clock`]. A [`Limiter`]'s default, [`AutoClock`], follows
//! tokio's clock when built inside a paused tokio runtime (so tests run on paused
//! time) and otherwise reads the cheapest monotonic clock fine enough for the
//! policy. The tower layer's limiters use it too, on tokio's clock when the layer
//! waits (its waits are tokio timers). [`ManualClock`] is set by hand;
//! [`CoarseClock`] is opt-in.
//!
//! # Feature flags
//!
//! - `redis`: `RedisStore`, a [`Store`] in Redis shared by a fleet of instances,
//!   with the same strict guarantee (one Lua script per decision on Redis' own
//!   clock, hash-tagged keys that expire by themselves, a timeout with an explicit
//!   fail-open / fail-closed choice, and a local deny cache). Give it to
//!   [`SlidingWindowLayerBuilder::store`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backpressure;
mod clock;
mod decision;
mod error;
mod extract;
pub mod future;
mod layer;
mod limiter;
mod mode;
mod policy;
#[cfg(feature = "redis")]
mod redis_store;
mod response;
mod ring;
mod service;
mod stats;
mod store;
mod sync;
mod wait;
mod waiting;

pub use backpressure::Backpressure;
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub use clock::CoarseClock;
pub use clock::{AutoClock, Clock, ManualClock, TimeSource, TokioClock};
pub use decision::{Decision, Outcome};
pub use error::{ConfigError, KeyMissing, RateLimited};
pub use extract::{
    ClientIp, GlobalKey, HeaderKey, IpNet, IpNetParseError, KeyExtractor, PeerIp, ProxyHeader,
};
pub use layer::{
    Exemption, LayerStats, MissingKey, NoExemption, OnLimit, RequestCost, SlidingWindowLayer,
    SlidingWindowLayerBuilder, UnitCost, MAX_POLICIES,
};
pub use limiter::{Limiter, LimiterBuilder};
pub use mode::{
    DefaultResponse, ErrorRejection, HttpRejection, ModeConfig, RejectResponse, RejectionMode,
};
pub use policy::{Policy, PolicyBuilder, Precision};
pub use response::RateLimitHeaders;
pub use service::SlidingWindow;
pub use stats::{KeyUsage, Stats};
pub use store::{Store, StoreError, StoreErrorKind};
pub use wait::{Acquire, WaitConfig, WaitQueues, WaitRejectReason, WaitRejected, WaitStats};
#[doc(hidden)]
pub use wait::{LocalStore, WindowSnapshot};

/// The `redis` crate this store is built on (feature `redis`), for
/// [`RedisStoreBuilder::client`].
#[cfg(feature = "redis")]
pub use ::redis;
#[cfg(feature = "redis")]
pub use redis_store::{
    AsyncConnection, AsyncConnectionHandle, FailurePolicy, RedisFuture, RedisKey, RedisStore,
    RedisStoreBuilder, RedisStoreStats,
};

//! A keyed sliding-window rate limiter for tower, axum, hyper and tonic that
//! never admits more than its limit in any window: a lock-free ring per key,
//! keys in partitions behind read-write locks.
//!
//! # The tower layer
//!
//! [`SlidingWindowLayer`] puts the limiter in front of any tower service: axum,
//! hyper, tonic, or a service of your own request type. Each request yields a
//! key (a [ready extractor](extract) or your closure, [`key_fn`]); each key has
//! its own window. The limiters are created when the layer is built, so every
//! clone and every connection shares them.
//!
//! ```
//! use std::time::Duration;
//! use axum::{body::Body, routing::get, Router};
//! use http::{Request, StatusCode};
//! use tower::ServiceExt;
//! use tower_sliding_window::{HeaderKey, Policy, SlidingWindowLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 2 requests per minute per API key.
//! let layer = SlidingWindowLayer::new(
//!     Policy::per(2, Duration::from_secs(60))?,
//!     HeaderKey::named("x-api-key")?,
//! )?;
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
//! // Seconds until a request fits again, rounded up: the first request leaves
//! // the window a minute after it was admitted (strict mode: to a step of
//! // its bucket, 1/65 536 of it).
//! assert_eq!(limited.headers()["retry-after"], "61");
//! assert_eq!(limited.headers()["ratelimit"], r#""default";r=0;t=61"#);
//! # Ok(()) }
//! ```
//!
//! Over the limit, an HTTP request gets 429 with `Retry-After` and the IETF
//! `RateLimit` / `RateLimit-Policy` fields; a gRPC request gets a trailers-only
//! `grpc-status: 8` (RESOURCE_EXHAUSTED); a request of any other type, through
//! [`reject_with_errors`](SlidingWindowLayerBuilder::reject_with_errors), gets a
//! [`RateLimited`] error. See [`SlidingWindowLayerBuilder`] for several policies,
//! request costs, exemptions, dry runs and remote [`Store`]s, and the
//! [guide] for naming the layer's types, ordering it with other middleware
//! and writing a store of your own.
//!
//! Instead of rejecting, a request over the limit can wait its turn in its
//! response future, FIFO per key and bounded ([`OnLimit::Wait`]), or a global
//! limit can hold back `poll_ready`
//! ([`backpressure`](SlidingWindowLayerBuilder::backpressure)). The queues
//! work without tower too: [`wait::WaitQueues`] and [`wait::Backpressure`].
//!
//! A request can also count what its response says: reserved at admission,
//! settled after the response ([`count_if`](SlidingWindowLayerBuilder::count_if)
//! for failed logins only, [`settle`](SlidingWindowLayerBuilder::settle) and
//! the [`Settlement`] handle for costs known later, such as tokens; see the
//! guide's [settling](guide::settling) chapter).
//!
//! # The limiter on its own
//!
//! The core [`Limiter`] works without tower: `check(&key)` returns a
//! [`Decision`] with everything rate-limit headers need.
//!
//! ```
//! use std::time::Duration;
//! use tower_sliding_window::{Limiter, Policy};
//!
//! let limiter = Limiter::new(Policy::per(100, Duration::from_secs(60))?)?;
//! let decision = limiter.check(&"api-key-1");
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 99);
//! # Ok::<(), tower_sliding_window::ConfigError>(())
//! ```
//!
//! # The precision guarantee
//!
//! In [`Precision::Strict`] mode (the default), **no interval of length `window`
//! ever holds more than `limit` admitted units**, under any interleaving of
//! concurrent checks. GCRA and fixed-window limiters let up to 2 × limit
//! through in some window.
//!
//! A window is cut into N buckets (7 by default), each holding its units and
//! the instant of the newest of them; a check counts the N + 1 buckets the
//! last window touches, the oldest only until its newest admission has left
//! the window. A unit therefore counts for one window after its bucket's
//! newest admission: a client that sends its whole quota in one burst and
//! the next one window later is admitted when an exact sliding log would
//! admit it, and a client that retries at `Retry-After` (or waits in
//! [`OnLimit::Wait`]) gets what an exact log gives. What is left of the
//! price falls on clients that give up on a denial: requests sent early in a
//! bucket wait for its newest. [`Precision::Interpolated`] admits closer to
//! an exact log for them, without the guarantee.
//!
//! # Time
//!
//! Decisions use a [`Clock`](clock::Clock). A [`Limiter`]'s default,
//! [`AutoClock`](clock::AutoClock), follows tokio's clock when built inside a
//! paused tokio runtime (so tests run on paused time) and otherwise reads the
//! cheapest monotonic clock fine enough for the policy. The tower layer's
//! limiters use it too, on tokio's clock when the layer waits (its waits are
//! tokio timers). [`ManualClock`] is set by hand.
//!
//! # Modules
//!
//! The common types are at the root; the rest is grouped by concern:
//! [`extract`] (keys, costs, exemptions), [`layer`] (rejection modes, the
//! response future, the builder's states), [`store`] (where counts live, the
//! in-memory [`Limiter`] and its stats), [`wait`] (waiting queues and
//! backpressure), [`clock`], [`redis`] (feature `redis`), and
//! the [guide].
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `redis` | off | [`RedisStore`], a [`Store`] in Redis shared by a fleet of instances, with the same strict guarantee (one Lua script per decision on Redis' own clock, hash-tagged keys that expire by themselves, a timeout with an explicit fail-open / fail-closed choice, a circuit breaker that answers at once while Redis is down, and a local deny cache) |
//! | `redis-tls` | off | `redis`, and Redis over TLS: `rediss://` URLs, through the `redis` crate's rustls support (ring, with webpki-roots' trust anchors; a private CA through [`RedisStoreBuilder::client`](redis::RedisStoreBuilder::client)) |
//! | `axum` | off | [`PeerIp`] and [`ClientIp`] read axum 0.8's `ConnectInfo<SocketAddr>` extension (without it they read a plain `SocketAddr` extension) |
//! | `serde` | off | [`Policy`] and [`Tiers`] deserialize from configuration (TOML, YAML, JSON, ...) |
//! | `metrics` | off | decision counters, tracked keys, wait times and Redis round trips through the `metrics` facade ([guide](guide::observability)) |

// `unsafe` in the crate: one call, the one that hands freed table memory
// back to glibc's malloc (`trim.rs`), with its SAFETY note; it runs only in
// the background sweeper and `Limiter::evict_idle`, never in a check. The
// keys' tables sit behind std's read-write locks, in safe code.
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
mod decision;
mod error;
pub mod extract;
pub mod guide;
pub mod layer;
mod limiter;
mod log;
mod metrics;
mod partition;
mod policy;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod ring;
mod rule;
mod stats;
pub mod store;
mod sync;
mod table;
mod tier;
mod trim;
pub mod wait;

#[cfg(all(test, not(tsw_loom)))]
mod tests;

pub use clock::ManualClock;
pub use decision::{Decision, Outcome};
pub use error::ConfigError;
pub use extract::{key_fn, tiered_key_fn, ClientIp, GlobalKey, HeaderKey, KeyExtractor, PeerIp};
pub use layer::{
    MissingKey, OnLimit, RateLimited, Settlement, SlidingWindow, SlidingWindowLayer,
    SlidingWindowLayerBuilder, Unsettled,
};
pub use limiter::Limiter;
pub use policy::{Policy, PolicyBuilder, PolicyParseError, Precision};
pub use store::{Store, StoreError, StoreErrorKind};
pub use tier::{TierLimits, Tiers, TiersBuilder};
pub use wait::WaitConfig;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{FailurePolicy, RedisStore};

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
//! Decisions use a [`Clock`]: [`TokioClock`] (the default) follows tokio's clock, so
//! tests run on paused time; [`ManualClock`] is set by hand.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backpressure;
mod clock;
mod decision;
mod error;
mod extract;
mod limiter;
mod policy;
mod ring;
mod stats;
mod store;
mod sync;
mod wait;

pub use backpressure::Backpressure;
pub use clock::{Clock, ManualClock, TokioClock};
pub use decision::{Decision, Outcome};
pub use error::ConfigError;
pub use extract::{
    ClientIp, GlobalKey, HeaderKey, IpNet, IpNetParseError, KeyExtractor, PeerIp, ProxyHeader,
};
pub use limiter::{Limiter, LimiterBuilder};
pub use policy::{Policy, PolicyBuilder, Precision};
pub use stats::{KeyUsage, Stats};
pub use store::{Store, StoreError};
pub use wait::{Acquire, WaitConfig, WaitQueues, WaitRejectReason, WaitRejected, WaitStats};
#[doc(hidden)]
pub use wait::{LocalStore, WindowSnapshot};

//! Configuration errors, reported when a policy, limiter or layer is built.

use std::fmt;
use std::time::Duration;

/// Why a configuration was rejected.
///
/// Every invalid setting is caught when the policy, limiter or layer is built,
/// so a running limiter never panics on its configuration.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{ConfigError, Policy};
///
/// let err = Policy::builder().limit(0).window(Duration::from_secs(1)).build().unwrap_err();
/// assert_eq!(err, ConfigError::ZeroLimit);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `limit` was 0: nothing could ever pass.
    ZeroLimit,
    /// `window` was zero or never set.
    ZeroWindow,
    /// `buckets` was 0.
    ZeroBuckets,
    /// More buckets than [`Policy::MAX_BUCKETS`](crate::Policy::MAX_BUCKETS).
    TooManyBuckets {
        /// The number asked for.
        buckets: u32,
        /// The largest number accepted.
        max: u32,
    },
    /// A bucket (window / buckets) is narrower than the clock can tell apart.
    BucketBelowClockResolution {
        /// The bucket width the policy asked for.
        bucket: Duration,
        /// The clock's resolution.
        resolution: Duration,
    },
    /// The window does not fit the 64-bit nanosecond time line the slot tags are cut from.
    WindowTooLong {
        /// The window asked for.
        window: Duration,
        /// The longest window accepted.
        max: Duration,
    },
    /// `max_keys` was 0: no key could ever be tracked.
    ZeroMaxKeys,
    /// A layer or store setting was inconsistent; the message says which.
    Invalid(&'static str),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroLimit => f.write_str("rate limit must be at least 1"),
            ConfigError::ZeroWindow => f.write_str("window must be longer than zero"),
            ConfigError::ZeroBuckets => f.write_str("a window needs at least one bucket"),
            ConfigError::TooManyBuckets { buckets, max } => {
                write!(f, "{buckets} buckets requested, at most {max} are supported")
            }
            ConfigError::BucketBelowClockResolution { bucket, resolution } => write!(
                f,
                "bucket width {bucket:?} is below the clock's resolution {resolution:?}; use fewer buckets or a longer window"
            ),
            ConfigError::WindowTooLong { window, max } => {
                write!(f, "window {window:?} is longer than the supported maximum {max:?}")
            }
            ConfigError::ZeroMaxKeys => f.write_str("max_keys must be at least 1"),
            ConfigError::Invalid(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A request the layer rejected because a policy's limit was reached: the error
/// value a non-HTTP service sees (boxed in tower's [`BoxError`](tower::BoxError)
/// convention; downcast to get it back).
///
/// ```
/// use std::time::Duration;
/// use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
/// use tower_sliding_window::{GlobalKey, Policy, RateLimited, SlidingWindowLayer};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = SlidingWindowLayer::builder(GlobalKey)
///     .policy(Policy::per(1, Duration::from_secs(60)).unwrap())
///     .reject_with_errors()
///     .build()
///     .unwrap();
/// let mut svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|n: u32| async move { Ok::<_, BoxError>(n * 2) });
///
/// assert_eq!(svc.ready().await.unwrap().call(21).await.unwrap(), 42);
/// let err = svc.ready().await.unwrap().call(21).await.unwrap_err();
/// let limited = err.downcast_ref::<RateLimited>().unwrap();
/// assert_eq!(limited.policy_name(), "default");
/// assert!(limited.retry_after().unwrap() > Duration::ZERO);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimited {
    decision: crate::Decision,
    policy_name: std::sync::Arc<str>,
}

impl RateLimited {
    pub(crate) fn new(decision: crate::Decision, policy_name: std::sync::Arc<str>) -> Self {
        RateLimited {
            decision,
            policy_name,
        }
    }

    /// The denying policy's decision (limit, remaining, retry and reset times).
    pub fn decision(&self) -> &crate::Decision {
        &self.decision
    }

    /// The name of the policy that denied the request ([`Policy::name`](crate::Policy::name)).
    pub fn policy_name(&self) -> &str {
        &self.policy_name
    }

    /// How long until the request could pass; `None` when its cost exceeds the
    /// limit, so no wait helps.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision.retry_after()
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.decision.retry_after() {
            Some(wait) => write!(
                f,
                "rate limit of policy \"{}\" exceeded; retry after {wait:?}",
                self.policy_name
            ),
            None => write!(
                f,
                "request cost exceeds the limit of policy \"{}\"",
                self.policy_name
            ),
        }
    }
}

impl std::error::Error for RateLimited {}

/// A request had no rate-limit key and the layer is set to
/// [`MissingKey::Reject`](crate::MissingKey::Reject): the error value a non-HTTP
/// service sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyMissing;

impl fmt::Display for KeyMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request has no rate-limit key")
    }
}

impl std::error::Error for KeyMissing {}

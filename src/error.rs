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

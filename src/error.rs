//! Configuration errors, reported when a policy, limiter, extractor, layer or
//! store is built.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// Why a configuration was rejected.
///
/// Every invalid setting is caught when the policy, limiter, extractor, layer
/// or store is built, so a running limiter never panics on its configuration.
/// Each mistake has its own variant to match on (a setting that must not be
/// zero: [`Zero`](ConfigError::Zero), naming it); `Display` says what to change.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{ConfigError, Policy};
///
/// let err = Policy::builder().limit(0).window(Duration::from_secs(1)).build().unwrap_err();
/// assert!(matches!(err, ConfigError::Zero { setting: "limit" }));
/// assert_eq!(err.to_string(), "rate limit must be at least 1");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting that must be above zero was zero (a window: zero or never
    /// set). `setting` names it: a policy's `"limit"`, `"window"` and
    /// `"buckets"`, a bounded wait's `"max_queue"` (to never wait, reject
    /// instead), a header key's `"max_len"`, and the Redis store's
    /// `"timeout"`, its circuit breaker's `"cool_down"` (turn the breaker off
    /// with `CircuitBreaker::OFF` instead) and its leases' `"lease_share"`
    /// (`Leases::with_share`) and `"lease_keys"` (`Leases::with_keys`; leave
    /// leases off instead).
    Zero {
        /// The setting: one of the names above.
        setting: &'static str,
    },
    /// More buckets than [`Policy::MAX_BUCKETS`](crate::Policy::MAX_BUCKETS).
    TooManyBuckets {
        /// The number asked for.
        buckets: u32,
        /// The largest number accepted.
        max: u32,
    },
    /// The window is too short for its buckets: a bucket (window / buckets)
    /// is narrower than the clock (or the store) can tell apart.
    BucketBelowClockResolution {
        /// The bucket width the policy asked for.
        bucket: Duration,
        /// The clock's (or the store's) resolution.
        resolution: Duration,
    },
    /// The window does not fit the time line the slot tags are cut from (the
    /// clock's 64-bit nanoseconds, or the Redis store's microseconds).
    WindowTooLong {
        /// The window asked for.
        window: Duration,
        /// The longest window accepted.
        max: Duration,
    },
    /// A layer was built without a policy.
    NoPolicy,
    /// A layer was given more policies than it decides at once.
    TooManyPolicies {
        /// The number given.
        count: usize,
        /// The most accepted ([`MAX_POLICIES`](crate::layer::MAX_POLICIES)).
        max: usize,
    },
    /// Two policies of one layer share a name; their `RateLimit` header
    /// fields could not be told apart.
    DuplicatePolicyName {
        /// The shared name.
        name: String,
    },
    /// A policy name that is empty, longer than
    /// [`Policy::MAX_NAME_LEN`](crate::Policy::MAX_NAME_LEN) or holds
    /// something other than visible ASCII without `"`, `\`, `{` and `}` (it goes
    /// as it is into headers, bodies, metric labels and Redis keys).
    InvalidPolicyName {
        /// The name.
        name: String,
    },
    /// A rejection status that is not a client or server error (4xx or 5xx).
    InvalidStatus {
        /// The status given.
        status: http::StatusCode,
    },
    /// A gRPC status code outside 1..=16 (0 is OK, which a rejection is not).
    InvalidGrpcCode {
        /// The code given.
        code: u8,
    },
    /// HTTP rejection settings (`status`, `grpc_status`, the header options,
    /// `reject_with`) or settlements, which read HTTP responses (`count_if`,
    /// `settle`, `settle_later`, `settle_on_error`, `settle_on_cancel`), were
    /// set and then `reject_with_errors` made the layer one of any request
    /// type, which would silently ignore them.
    HttpSettingsIgnored,
    /// An IP prefix length longer than the address (32 bits for IPv4, 128
    /// for IPv6).
    PrefixTooLong {
        /// The length given.
        prefix_len: u8,
        /// The address's length in bits.
        max: u8,
    },
    /// An IPv4-mapped IPv6 network (`::ffff:a.b.c.d/n`) with a prefix below
    /// 96, which would mask the mapping away; write the IPv4 network instead.
    MappedPrefixTooShort {
        /// The length given.
        prefix_len: u8,
    },
    /// A header name that is not a valid HTTP header name.
    InvalidHeaderName {
        /// The name given.
        name: String,
    },
    /// A store that must run on tokio (the Redis store), or a limiter that
    /// sweeps idle keys from a tokio task
    /// ([`sweep_idle`](crate::store::LimiterBuilder::sweep_idle)), was built
    /// outside a tokio runtime.
    NoRuntime,
    /// A Redis store was given no Redis to talk to (no URL, client or
    /// connection).
    NoRedis,
    /// A Redis store was given both a URL or client and a connection.
    RedisConnectionConflict,
    /// The Redis URL could not be parsed or names a feature not compiled in;
    /// the source says why. The URL itself is not kept: it may hold a
    /// password.
    InvalidRedisUrl {
        /// The `redis` crate's error.
        source: Box<dyn Error + Send + Sync>,
    },
    /// A `rediss://` (TLS) URL, in a build without this crate's `redis-tls`
    /// feature.
    RedisTlsNotEnabled,
    /// An interpolated policy too large for the Redis script's arithmetic
    /// (Lua numbers are doubles): (limit + 1) × bucket width in µs must stay
    /// below 2^53. Use a lower limit, narrower buckets or strict precision.
    InterpolationOutOfRange,
    /// A Redis key prefix containing `{` or `}`: the key's hash tag follows
    /// the prefix. The default prefix holds the policy name; set one.
    InvalidRedisPrefix {
        /// The prefix.
        prefix: String,
    },
    /// A table of tiers without any tier, or a layer keyed by a tiered
    /// extractor built without its table.
    NoTiers,
    /// A tier name that breaks the rule of policy names (see
    /// [`InvalidPolicyName`](ConfigError::InvalidPolicyName)).
    InvalidTierName {
        /// The name.
        name: String,
    },
    /// Two tiers of one table share a name.
    DuplicateTier {
        /// The shared name.
        name: String,
    },
    /// A limited tier without any policy (make it unlimited or denied).
    TierWithoutPolicies {
        /// The tier's name.
        tier: String,
    },
    /// A store was asked to change its policy at run time and cannot
    /// ([`Store::reconfigured`](crate::Store::reconfigured) is not
    /// implemented for it).
    PolicyFixed,
    /// A setting a layer of tiers does not support (a fallback key), or a
    /// change of tiers on a layer of policies.
    NotWithTiers {
        /// The setting.
        setting: &'static str,
    },
    /// A change of one tier names a tier the table does not have (a typo, or
    /// a tier to add: [`add_tier`](crate::layer::TierHandle::add_tier)).
    UnknownTier {
        /// The name.
        name: String,
    },
    /// The tier that requests of an unknown tier go to is not in the table.
    UnknownFallbackTier {
        /// Its name.
        name: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Zero { setting } => match zero_message(setting) {
                Some(message) => f.write_str(message),
                None => write!(f, "{setting} must be above zero"),
            },
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
            ConfigError::NoPolicy => f.write_str("a layer needs at least one policy"),
            ConfigError::TooManyPolicies { count, max } => {
                write!(f, "{count} policies given, a layer accepts at most {max}")
            }
            ConfigError::DuplicatePolicyName { name } => write!(
                f,
                "two policies of one layer are named {name:?}; give each a distinct name"
            ),
            ConfigError::InvalidPolicyName { name } => write!(
                f,
                "policy name {} must be {NAME_RULE}",
                Shown(name)
            ),
            ConfigError::InvalidStatus { status } => {
                write!(f, "rejection status {status} is not a 4xx or 5xx status")
            }
            ConfigError::InvalidGrpcCode { code } => write!(
                f,
                "gRPC rejection code {code} is not in 1..=16 (8 is RESOURCE_EXHAUSTED)"
            ),
            ConfigError::HttpSettingsIgnored => f.write_str(
                "status(), grpc_status(), the header options and reject_with() shape HTTP \
                 rejections, and count_if(), settle() and the other settlements read HTTP \
                 responses; after reject_with_errors() they would be ignored",
            ),
            ConfigError::PrefixTooLong { prefix_len, max } => {
                write!(f, "prefix length {prefix_len} is longer than the address ({max} bits)")
            }
            ConfigError::MappedPrefixTooShort { prefix_len } => write!(
                f,
                "an IPv4-mapped network (::ffff:a.b.c.d/n) needs a prefix of 96..=128, not \
                 {prefix_len}; write the IPv4 network (a.b.c.d/(n - 96)) instead"
            ),
            ConfigError::InvalidHeaderName { name } => {
                write!(f, "{name:?} is not a valid header name")
            }
            ConfigError::NoRuntime => f.write_str(
                "build inside a tokio runtime: a Redis store's connection and a limiter's idle-key \
                 sweeper (sweep_idle) run there",
            ),
            ConfigError::NoRedis => f.write_str(
                "the Redis store needs a Redis to talk to: call .url(), .client() or .connection()",
            ),
            ConfigError::RedisConnectionConflict => f.write_str(
                "the Redis store takes either a URL or client, or a connection, not both",
            ),
            ConfigError::InvalidRedisUrl { source } => write!(f, "invalid Redis URL: {source}"),
            ConfigError::RedisTlsNotEnabled => f.write_str(
                "a rediss:// (TLS) URL needs the tower-sliding-window feature `redis-tls`",
            ),
            ConfigError::NoTiers => f.write_str("a table of tiers needs at least one tier"),
            ConfigError::InvalidTierName { name } => {
                write!(f, "tier name {} must be {NAME_RULE}", Shown(name))
            }
            ConfigError::DuplicateTier { name } => {
                write!(f, "two tiers are named {}; give each a distinct name", Shown(name))
            }
            ConfigError::TierWithoutPolicies { tier } => write!(
                f,
                "tier {tier:?} is limited but has no policy; give it one, or make it unlimited or denied"
            ),
            ConfigError::PolicyFixed => {
                f.write_str("this store cannot change its policy at run time")
            }
            ConfigError::NotWithTiers { setting } => {
                write!(f, "{setting} is not supported by a layer of tiers")
            }
            ConfigError::UnknownTier { name } => write!(
                f,
                "the table has no tier named {}; add a tier with add_tier",
                Shown(name)
            ),
            ConfigError::UnknownFallbackTier { name } => {
                write!(f, "the fallback tier {name:?} is not in the table of tiers")
            }
            ConfigError::InterpolationOutOfRange => f.write_str(
                "interpolated precision on Redis needs (limit + 1) × bucket width in µs below \
                 2^53; use a lower limit, narrower buckets or strict precision",
            ),
            ConfigError::InvalidRedisPrefix { prefix } => write!(
                f,
                "Redis key prefix {prefix:?} contains '{{' or '}}' (the policy name is part of \
                 the default prefix; set .prefix())"
            ),
        }
    }
}

// Each setting's `Zero`, its name spelled once: the builders return these,
// and `zero_message` gives each its own message.
#[allow(non_upper_case_globals)]
impl ConfigError {
    pub(crate) const ZeroLimit: ConfigError = ConfigError::Zero { setting: "limit" };
    pub(crate) const ZeroWindow: ConfigError = ConfigError::Zero { setting: "window" };
    pub(crate) const ZeroBuckets: ConfigError = ConfigError::Zero { setting: "buckets" };
    pub(crate) const ZeroMaxQueue: ConfigError = ConfigError::Zero {
        setting: "max_queue",
    };
    pub(crate) const ZeroMaxLen: ConfigError = ConfigError::Zero { setting: "max_len" };
    pub(crate) const ZeroMaxKeys: ConfigError = ConfigError::Zero {
        setting: "max_keys",
    };
    pub(crate) const ZeroSweepPeriod: ConfigError = ConfigError::Zero {
        setting: "sweep_period",
    };
    #[cfg(feature = "redis")]
    pub(crate) const ZeroTimeout: ConfigError = ConfigError::Zero { setting: "timeout" };
    #[cfg(feature = "redis")]
    pub(crate) const ZeroCoolDown: ConfigError = ConfigError::Zero {
        setting: "cool_down",
    };
    #[cfg(feature = "redis")]
    pub(crate) const ZeroLeaseShare: ConfigError = ConfigError::Zero {
        setting: "lease_share",
    };
    #[cfg(feature = "redis")]
    pub(crate) const ZeroLeaseKeys: ConfigError = ConfigError::Zero {
        setting: "lease_keys",
    };
}

/// The message of a zero `setting`: what it must be, and what to do instead
/// where zero reads as "off".
fn zero_message(setting: &str) -> Option<&'static str> {
    Some(match setting {
        "limit" => "rate limit must be at least 1",
        "window" => "window must be longer than zero",
        "buckets" => "a window needs at least one bucket",
        "max_queue" => "max_queue must be at least 1 (to never wait, reject instead)",
        "max_len" => "a header key's max_len must be at least 1",
        "max_keys" => "max_keys must be at least 1",
        "sweep_period" => "the idle-key sweep's period must be longer than zero",
        "timeout" => "the store's timeout must be longer than zero",
        "cool_down" => {
            "the circuit breaker's cool-down must be longer than zero (CircuitBreaker::OFF turns it off)"
        }
        "lease_share" => {
            "a lease's share must be at least 1 (a grant takes at most 1/share of what the window has left)"
        }
        "lease_keys" => "leases must follow at least one key (leave leases off instead)",
        _ => return None,
    })
}

/// What a policy or tier name may be, for messages.
const NAME_RULE: &str = "1 to 64 visible ASCII characters other than '\"', '\\', '{' and '}' \
     (names go as they are into headers, bodies, metric labels and Redis keys)";

/// A name as a message quotes it: debug-escaped, and cut short when long, so
/// that a mebibyte of name makes a short message.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 80;
        match self.0.char_indices().nth(SHOWN) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => write!(f, "{:?}... ({} bytes)", &self.0[..end], self.0.len()),
        }
    }
}

impl Error for ConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ConfigError::InvalidRedisUrl { source } => Some(&**source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_zero_setting_has_its_own_message() {
        let zeros = [
            ConfigError::ZeroLimit,
            ConfigError::ZeroWindow,
            ConfigError::ZeroBuckets,
            ConfigError::ZeroMaxQueue,
            ConfigError::ZeroMaxLen,
            ConfigError::ZeroMaxKeys,
            ConfigError::ZeroSweepPeriod,
            #[cfg(feature = "redis")]
            ConfigError::ZeroTimeout,
            #[cfg(feature = "redis")]
            ConfigError::ZeroCoolDown,
            #[cfg(feature = "redis")]
            ConfigError::ZeroLeaseShare,
            #[cfg(feature = "redis")]
            ConfigError::ZeroLeaseKeys,
        ];
        for zero in zeros {
            let ConfigError::Zero { setting } = zero else {
                panic!("{zero:?} is not a zero setting");
            };
            assert!(zero_message(setting).is_some(), "{setting} has no message");
        }
    }
}

//! What a limit is: `limit` units per `window`, cut into `buckets`.

use crate::error::ConfigError;
use std::error::Error;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How the sliding window is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Precision {
    /// Count every bucket the last window touches (N + 1 of them), the oldest
    /// only until its newest admission has left the window.
    ///
    /// **Guarantee:** no interval of length `window` ever holds more than `limit`
    /// admitted units. A unit counts until one window after its bucket's
    /// newest admission (to 1/65 536 of a bucket): a client that sends its
    /// whole limit at `t` and again at `t + window` is admitted then, as an
    /// exact sliding log admits it, and `retry_after` says exactly when a
    /// cost fits. Requests sent early in a bucket wait for its newest, so a
    /// client that gives up on a denial (instead of retrying at
    /// `retry_after`) can get less than an exact log; more buckets narrow
    /// that.
    #[default]
    Strict,
    /// Cloudflare's sliding-window counter: the oldest bucket is weighted by the part
    /// of it still inside the window.
    ///
    /// Closer to an exact sliding log at saturation, but it assumes the oldest
    /// bucket's units were spread evenly over it. When they were bunched at its end,
    /// an interval of length `window` can hold `limit` plus nearly all of the oldest
    /// bucket's count: the bound is `limit + oldest - 1`, so **up to `2 × limit - 1`**
    /// in the worst case (a full bucket at the very end of the oldest slot, then a
    /// burst at the very end of the newest). Checks stalled for most of a
    /// window as they count can, while they finish, let others past that by
    /// their own cost (see the guide's algorithm chapter).
    ///
    /// Typically far less: on Poisson traffic from 0.9× to 10× the limit (15
    /// buckets, limit 100), 0.6–8% of windows held more than `limit`, the mean
    /// excess was at most 0.1% of the limit and the worst window 6% over, while it
    /// admitted 99–100% of what an exact sliding log admits (strict never
    /// over; `tests/limiter_model.rs`).
    /// Cloudflare measured 0.003% wrong decisions over 400M requests with this estimate.
    ///
    /// It costs a little more per check: besides what a strict check reads
    /// (the sum of the older buckets kept beside the head, and the current
    /// bucket), it reads the oldest bucket to weigh it, and a denial whose
    /// cost would not fit before the oldest bucket has left reads the whole
    /// ring to say when it will. Choose it where admitting close to an exact
    /// log matters more than a hard bound.
    Interpolated,
}

/// A validated rate-limit policy: `limit` units per `window`, cut into `buckets`.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{Policy, Precision};
///
/// let policy = Policy::builder()
///     .limit(100)
///     .window(Duration::from_secs(60))
///     .build()
///     .unwrap();
/// assert_eq!(policy.buckets(), Policy::DEFAULT_BUCKETS);
/// assert_eq!(policy.precision(), Precision::Strict);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    limit: u32,
    window: Duration,
    buckets: u32,
    precision: Precision,
    name: String,
}

impl Policy {
    /// The default number of buckets.
    ///
    /// 7 buckets make a ring of 8 counters, each with its newest admission's
    /// instant (64 bytes, one cache line; indexed by a mask), about 116 bytes
    /// a tracked key. A bucket's newest instant makes strict mode exact at
    /// the window's edge whatever the count; more buckets only help clients
    /// that give up on a denial (see `benches/README.md`).
    pub const DEFAULT_BUCKETS: u32 = 7;
    /// The most buckets a window may be cut into.
    pub const MAX_BUCKETS: u32 = 4096;
    /// The longest window accepted (2^62 ns, about 146 years): slot arithmetic
    /// stays inside the clock's 64-bit nanosecond range with room to spare.
    pub const MAX_WINDOW: Duration = Duration::from_nanos(1 << 62);
    /// The name a policy has unless it is given one.
    pub const DEFAULT_NAME: &'static str = "default";
    /// The longest name a policy or a [tier](crate::Tiers) may have, in bytes.
    pub const MAX_NAME_LEN: usize = 64;

    /// Start building a policy.
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder::default()
    }

    /// Shorthand for `limit` per `window` with the defaults (7 buckets, strict).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_sliding_window::Policy;
    /// let p = Policy::per(10, Duration::from_secs(1)).unwrap();
    /// assert_eq!(p.limit(), 10);
    /// ```
    pub fn per(limit: u32, window: Duration) -> Result<Policy, ConfigError> {
        Policy::builder().limit(limit).window(window).build()
    }

    /// Units admitted per window.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Number of buckets (sub-windows) the window is cut into.
    pub fn buckets(&self) -> u32 {
        self.buckets
    }

    /// Width of one bucket in nanoseconds: `ceil(window / buckets)`, so N buckets
    /// always cover at least the whole window.
    pub fn bucket_width(&self) -> Duration {
        Duration::from_nanos(self.bucket_nanos())
    }

    pub(crate) fn bucket_nanos(&self) -> u64 {
        (self.window.as_nanos() as u64).div_ceil(self.buckets as u64)
    }

    /// The precision mode.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The policy's name, used in `RateLimit-Policy` headers (default `"default"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same policy under another name. The name is checked where the
    /// policy is used (a layer's or a table's `build`), as
    /// [`PolicyBuilder::name`] says.
    pub fn with_name(mut self, name: impl Into<String>) -> Policy {
        self.name = name.into();
        self
    }
}

/// Parses the notation people write limits in: `"100/min"`, `"10/s"`,
/// `"5000/h"`, `"100 per 30s"`, `"20 per 1m30s"`.
///
/// The form is `<limit>/<window>` or `<limit> per <window>`:
///
/// - the limit is a whole number of ASCII digits, which `_` may group
///   between digits as in Rust and TOML (`1_000`); no sign;
/// - the window is a unit alone (`min`) or one or more terms of a count and
///   a unit (`30s`, `1h30m`, `2 days`), each unit at most once and the
///   largest first. Units: `ms`, `s`/`sec`/`second(s)`,
///   `m`/`min`/`minute(s)`, `h`/`hr`/`hour(s)`, `d`/`day(s)`.
///
/// Case does not matter, and ASCII spaces and tabs may stand around the
/// parts; other characters (a Unicode space, a `+`) are errors that say
/// what was expected. The policy gets the defaults
/// ([`Policy::DEFAULT_BUCKETS`] buckets, strict precision, the name
/// `"default"`); use [`Policy::builder`] to change those.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{Policy, PolicyParseError};
///
/// let p: Policy = "100/min".parse().unwrap();
/// assert_eq!((p.limit(), p.window()), (100, Duration::from_secs(60)));
///
/// let p: Policy = "100 per 30s".parse().unwrap();
/// assert_eq!((p.limit(), p.window()), (100, Duration::from_secs(30)));
///
/// let err = "100/fortnight".parse::<Policy>().unwrap_err();
/// assert!(matches!(err, PolicyParseError::Window { .. }));
/// assert!(err.to_string().contains("fortnight"));
///
/// // A unit without its count stands alone: "min min" is not 2 minutes.
/// let err = "1/min min".parse::<Policy>().unwrap_err();
/// assert!(matches!(err, PolicyParseError::Window { .. }));
/// ```
impl FromStr for Policy {
    type Err = PolicyParseError;

    fn from_str(text: &str) -> Result<Policy, PolicyParseError> {
        let (limit, window) =
            split_notation(text).map_err(|expected| PolicyParseError::Syntax {
                text: text.to_owned(),
                expected,
            })?;
        let limit = parse_limit(limit).map_err(|expected| PolicyParseError::Limit {
            text: limit.to_owned(),
            expected,
        })?;
        let window = parse_window(window).map_err(|expected| PolicyParseError::Window {
            text: window.to_owned(),
            expected,
        })?;
        Policy::per(limit, window).map_err(PolicyParseError::Invalid)
    }
}

/// With the `serde` feature a policy deserializes from its [text
/// notation](#impl-FromStr-for-Policy) (`"100/min"`) or from a table whose
/// `limit` and `window` are required (`window` in the notation's units,
/// `"30s"`, `"1h30m"`) and `buckets`, `precision` (`"strict"` or
/// `"interpolated"`) and `name` optional; it is validated as
/// [`PolicyBuilder::build`] validates.
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
impl<'de> serde::Deserialize<'de> for Policy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Policy, D::Error> {
        use serde::de::{self, MapAccess, Visitor};
        use serde::Deserialize as _;

        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Table {
            limit: u32,
            window: String,
            buckets: Option<u32>,
            precision: Option<PrecisionName>,
            name: Option<String>,
        }

        #[derive(serde::Deserialize)]
        #[serde(rename_all = "lowercase")]
        enum PrecisionName {
            Strict,
            Interpolated,
        }

        struct PolicyVisitor;

        impl<'de> Visitor<'de> for PolicyVisitor {
            type Value = Policy;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate limit such as \"100/min\", or a table with limit and window")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Policy, E> {
                text.parse().map_err(E::custom)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Policy, A::Error> {
                let t = Table::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let window = parse_window(&t.window).map_err(|expected| {
                    de::Error::custom(PolicyParseError::Window {
                        text: t.window.clone(),
                        expected,
                    })
                })?;
                let mut builder = Policy::builder().limit(t.limit).window(window);
                if let Some(buckets) = t.buckets {
                    builder = builder.buckets(buckets);
                }
                if let Some(precision) = t.precision {
                    builder = builder.precision(match precision {
                        PrecisionName::Strict => Precision::Strict,
                        PrecisionName::Interpolated => Precision::Interpolated,
                    });
                }
                if let Some(name) = t.name {
                    builder = builder.name(name);
                }
                builder.build().map_err(de::Error::custom)
            }
        }

        deserializer.deserialize_any(PolicyVisitor)
    }
}

/// Spaces the notation allows around its parts: ASCII ones only, so that a
/// look-alike (a no-break space, an em space) is an error rather than a
/// separator the reader cannot see.
fn is_space(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn trim_spaces(text: &str) -> &str {
    text.trim_matches(is_space)
}

const NOTATION: &str = "`<limit>/<window>` or `<limit> per <window>`, \
     with ASCII spaces between the parts (\"100/min\", \"100 per 30s\")";

/// `"<limit>/<window>"` or `"<limit> per <window>"`, each part trimmed and non-empty.
fn split_notation(text: &str) -> Result<(&str, &str), &'static str> {
    let text = trim_spaces(text);
    let (limit, window) = match text.split_once('/') {
        Some(parts) => parts,
        None => {
            // "per" stands alone between spaces: "100 permin" and
            // "100\u{a0}per 30s" are not the notation.
            let (limit, rest) = text.split_once(is_space).ok_or(NOTATION)?;
            let rest = rest.trim_start_matches(is_space);
            let word = rest
                .get(..3)
                .filter(|w| w.eq_ignore_ascii_case("per"))
                .ok_or(NOTATION)?;
            let window = rest[word.len()..].strip_prefix(is_space).ok_or(NOTATION)?;
            (limit, window)
        }
    };
    let (limit, window) = (trim_spaces(limit), trim_spaces(window));
    if limit.is_empty() || window.is_empty() {
        return Err(NOTATION);
    }
    Ok((limit, window))
}

/// ASCII digits, grouped by `_` between digits (`1_000`), as in Rust and TOML.
fn parse_limit(text: &str) -> Result<u32, &'static str> {
    const DIGITS: &str = "a whole number of ASCII digits, without a sign, \
         which `_` may group between digits (\"1_000\")";
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let between_digits = || {
            i > 0
                && i + 1 < bytes.len()
                && bytes[i - 1].is_ascii_digit()
                && bytes[i + 1].is_ascii_digit()
        };
        if !(b.is_ascii_digit() || b == b'_' && between_digits()) {
            return Err(DIGITS);
        }
    }
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    digits
        .parse::<u32>()
        .map_err(|_| "a whole number no larger than 4294967295")
}

/// A unit alone (`"min"`), or `[count]unit` terms with each count given, each
/// unit once and the largest first: `"30s"`, `"1h30m"`, `"2 days"`.
fn parse_window(text: &str) -> Result<Duration, &'static str> {
    const TERMS: &str = "a unit alone (\"min\") or terms of a count and a unit, \
         the largest unit first (\"30s\", \"1h30m\"); units ms, s, min, h, d";
    const COUNTED: &str = "a unit without a count stands alone (\"min\"); \
         with several terms each has its count (\"1h30m\", not \"h 30m\")";
    const ORDER: &str = "each unit at most once, the largest first (\"1h30m\", not \"30m1h\")";
    let mut rest = trim_spaces(text);
    let mut total = Duration::ZERO;
    let mut terms = 0;
    let mut bare = false;
    let mut last_unit = u64::MAX;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let count = match digits {
            0 => None,
            n => Some(rest[..n].parse::<u64>().map_err(|_| "a shorter window")?),
        };
        rest = rest[digits..].trim_start_matches(is_space);
        let letters = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        if letters == 0 {
            return Err(TERMS);
        }
        let unit = unit_nanos(&rest[..letters]).ok_or(TERMS)?;
        rest = rest[letters..].trim_start_matches(is_space);
        terms += 1;
        bare |= count.is_none();
        if bare && terms > 1 {
            return Err(COUNTED);
        }
        if unit >= last_unit {
            return Err(ORDER);
        }
        last_unit = unit;
        let nanos = count
            .unwrap_or(1)
            .checked_mul(unit)
            .ok_or("a shorter window")?;
        total = total
            .checked_add(Duration::from_nanos(nanos))
            .ok_or("a shorter window")?;
    }
    if terms == 0 {
        return Err(TERMS);
    }
    Ok(total)
}

fn unit_nanos(unit: &str) -> Option<u64> {
    const SECOND: u64 = 1_000_000_000;
    let unit = unit.to_ascii_lowercase();
    Some(match unit.as_str() {
        "ms" | "millis" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => SECOND,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * SECOND,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3600 * SECOND,
        "d" | "day" | "days" => 86_400 * SECOND,
        _ => return None,
    })
}

/// True for a policy or tier name that can be written as it is wherever names
/// go: 1 to [`Policy::MAX_NAME_LEN`] visible ASCII characters other than `"`
/// and `\` (escaped in a structured-field string or JSON) and `{` and `}` (a
/// Redis Cluster hash tag).
pub(crate) fn is_valid_name(name: &str) -> bool {
    (1..=Policy::MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'{' | b'}'))
}

/// Why a policy's text notation was rejected; see [`Policy`]'s `FromStr`.
///
/// Each variant keeps the part of the text at fault, so the message can
/// point at it.
#[derive(Debug)]
#[non_exhaustive]
pub enum PolicyParseError {
    /// The text is not `<limit>/<window>` or `<limit> per <window>`.
    Syntax {
        /// The whole text.
        text: String,
        /// What the notation expects.
        expected: &'static str,
    },
    /// The limit is not a whole number of ASCII digits that fits in 32 bits.
    Limit {
        /// The limit part.
        text: String,
        /// What a limit is written as.
        expected: &'static str,
    },
    /// The window is not a unit alone or a sum of `<count><unit>` terms with
    /// known units, each once and the largest first, or it overflows.
    Window {
        /// The window part.
        text: String,
        /// What a window is written as.
        expected: &'static str,
    },
    /// The notation parsed but the policy is invalid (a zero limit or
    /// window, a window too long, ...).
    Invalid(ConfigError),
}

impl fmt::Display for PolicyParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyParseError::Syntax { text, expected } => {
                write!(f, "{text:?} is not a rate limit: expected {expected}")
            }
            PolicyParseError::Limit { text, expected } => {
                write!(f, "limit {text:?} is not valid: expected {expected}")
            }
            PolicyParseError::Window { text, expected } => {
                write!(f, "window {text:?} is not valid: expected {expected}")
            }
            PolicyParseError::Invalid(err) => write!(f, "invalid rate limit: {err}"),
        }
    }
}

impl Error for PolicyParseError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            PolicyParseError::Invalid(err) => Some(err),
            _ => None,
        }
    }
}

/// Builder for [`Policy`]; [`build`](PolicyBuilder::build) validates.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` makes the policy"]
pub struct PolicyBuilder {
    limit: u32,
    window: Duration,
    buckets: u32,
    precision: Precision,
    name: String,
}

impl Default for PolicyBuilder {
    fn default() -> Self {
        PolicyBuilder {
            limit: 0,
            window: Duration::ZERO,
            buckets: Policy::DEFAULT_BUCKETS,
            precision: Precision::Strict,
            name: Policy::DEFAULT_NAME.to_owned(),
        }
    }
}

impl PolicyBuilder {
    /// Units admitted per window (required, at least 1).
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// The window length (required, non-zero).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Number of buckets (default [`Policy::DEFAULT_BUCKETS`]).
    pub fn buckets(mut self, buckets: u32) -> Self {
        self.buckets = buckets;
        self
    }

    /// Precision mode (default [`Precision::Strict`]).
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// A name for headers such as `RateLimit-Policy` (default `"default"`).
    ///
    /// A name goes as it is into the `RateLimit` and `RateLimit-Policy`
    /// fields (as a structured-field string), problem-details bodies, metric
    /// labels, log events and the Redis store's default key prefix, so it is
    /// checked rather than escaped: 1 to [`Policy::MAX_NAME_LEN`] visible
    /// ASCII characters other than `"`, `\`, `{` and `}` (no spaces, no
    /// quotes or backslashes to escape, no braces that would move a Redis
    /// Cluster hash tag). Anything else is [`ConfigError::InvalidPolicyName`]
    /// from [`build`](Self::build).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{ConfigError, Policy};
    ///
    /// let policy = |name: &str| Policy::builder().name(name).limit(1).window(Duration::from_secs(1)).build();
    /// assert!(policy("per-ip:10/s").is_ok());
    /// for bad in ["", "a \"quoted\" name", "{x}", "naïve", &"x".repeat(65)] {
    ///     assert!(matches!(policy(bad), Err(ConfigError::InvalidPolicyName { .. })));
    /// }
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<Policy, ConfigError> {
        if self.limit == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        if self.window.is_zero() {
            return Err(ConfigError::ZeroWindow);
        }
        if self.buckets == 0 {
            return Err(ConfigError::ZeroBuckets);
        }
        if self.buckets > Policy::MAX_BUCKETS {
            return Err(ConfigError::TooManyBuckets {
                buckets: self.buckets,
                max: Policy::MAX_BUCKETS,
            });
        }
        if self.window > Policy::MAX_WINDOW {
            return Err(ConfigError::WindowTooLong {
                window: self.window,
                max: Policy::MAX_WINDOW,
            });
        }
        if self.window.as_nanos() < self.buckets as u128 {
            return Err(ConfigError::BucketBelowClockResolution {
                bucket: self.window / self.buckets,
                resolution: Duration::from_nanos(1),
            });
        }
        if !is_valid_name(&self.name) {
            return Err(ConfigError::InvalidPolicyName { name: self.name });
        }
        Ok(Policy {
            limit: self.limit,
            window: self.window,
            buckets: self.buckets,
            precision: self.precision,
            name: self.name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_each_invalid_setting_with_its_own_error() {
        let ok = || Policy::builder().limit(5).window(Duration::from_secs(1));
        assert!(matches!(
            ok().limit(0).build(),
            Err(ConfigError::Zero { setting: "limit" })
        ));
        assert!(matches!(
            ok().window(Duration::ZERO).build(),
            Err(ConfigError::Zero { setting: "window" })
        ));
        assert!(matches!(
            ok().buckets(0).build(),
            Err(ConfigError::Zero { setting: "buckets" })
        ));
        assert!(matches!(
            ok().buckets(Policy::MAX_BUCKETS + 1).build(),
            Err(ConfigError::TooManyBuckets { .. })
        ));
        assert!(matches!(
            ok().window(Duration::from_secs(u64::MAX)).build(),
            Err(ConfigError::WindowTooLong { .. })
        ));
        assert!(matches!(
            ok().window(Duration::from_nanos(10)).buckets(11).build(),
            Err(ConfigError::BucketBelowClockResolution { .. })
        ));
        assert!(ok().build().is_ok());
    }

    #[test]
    fn names_are_checked_not_escaped() {
        let named = |name: &str| {
            Policy::builder()
                .name(name)
                .limit(1)
                .window(Duration::from_secs(1))
                .build()
        };
        let mebibyte = "n".repeat(1 << 20);
        let longest = "n".repeat(Policy::MAX_NAME_LEN);
        for bad in [
            "",
            "\"",
            "say \"hi\"",
            "back\\slash",
            "{x}",
            "a{b",
            "spaced name",
            "tab\there",
            "naïve",
            "\u{7f}",
            &mebibyte,
            &longest[1..].replace('n', "é"),
        ] {
            let err = named(bad).expect_err(bad);
            assert!(matches!(&err, ConfigError::InvalidPolicyName { name } if name == bad));
            // The message shows a long name cut short, not a mebibyte of it.
            assert!(
                err.to_string().len() < 400,
                "{} bytes",
                err.to_string().len()
            );
        }
        for good in [
            longest.as_str(),
            "per-ip",
            "10/1s",
            "a.b:c_d+e@f%",
            "default",
        ] {
            assert_eq!(named(good).unwrap().name(), good);
        }
    }

    #[test]
    fn parses_the_notation_people_write() {
        let cases: &[(&str, u32, u64)] = &[
            ("100/min", 100, 60),
            ("10/s", 10, 1),
            ("5000/h", 5000, 3600),
            ("100 per 30s", 100, 30),
            ("  20 / minute ", 20, 60),
            ("7 PER 2 Hours", 7, 7200),
            ("1/d", 1, 86_400),
            ("3 per 1h30m", 3, 5400),
            ("3/1h 30m", 3, 5400),
            ("4/15sec", 4, 15),
        ];
        for &(text, limit, secs) in cases {
            let p: Policy = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(p.limit(), limit, "{text}");
            assert_eq!(p.window(), Duration::from_secs(secs), "{text}");
            assert_eq!(p.buckets(), Policy::DEFAULT_BUCKETS);
        }
        let p: Policy = "50/250ms".parse().unwrap();
        assert_eq!(p.window(), Duration::from_millis(250));
    }

    #[test]
    fn names_the_part_at_fault() {
        let err = |text: &str| text.parse::<Policy>().unwrap_err();
        for text in [
            "",
            "100",
            "per 30s",
            "/min",
            "100/",
            "100 permin",
            "100 each min",
        ] {
            assert!(
                matches!(err(text), PolicyParseError::Syntax { .. }),
                "{text:?}: {:?}",
                err(text)
            );
        }
        for text in ["ten/min", "-1/min", "1.5/s", "4294967296/s"] {
            assert!(
                matches!(err(text), PolicyParseError::Limit { .. }),
                "{text:?}: {:?}",
                err(text)
            );
        }
        for text in [
            "1/fortnight",
            "1/30",
            "1/1.5s",
            "1/s-",
            "1/99999999999999999999s",
        ] {
            assert!(
                matches!(err(text), PolicyParseError::Window { .. }),
                "{text:?}: {:?}",
                err(text)
            );
        }
        assert!(matches!(
            err("0/min"),
            PolicyParseError::Invalid(ConfigError::Zero { setting: "limit" })
        ));
        assert!(matches!(
            err("1/0s"),
            PolicyParseError::Invalid(ConfigError::Zero { setting: "window" })
        ));
        assert!(matches!(
            err("1/60000d"),
            PolicyParseError::Invalid(ConfigError::WindowTooLong { .. })
        ));
        assert!(err("1/fortnight").to_string().contains("\"fortnight\""));
        assert!(err("0/min").source().is_some());
    }

    #[test]
    fn refuses_what_reads_as_a_limit_but_is_not_one() {
        let err = |text: &str| {
            text.parse::<Policy>()
                .expect_err(&format!("{text:?} parsed"))
        };
        // A unit without a count stands alone: these are not 2 ms, 3 min, 2 s.
        for text in ["1/ms ms", "1/min min min", "1/sec s", "1/h 30m", "1/s 1s"] {
            let e = err(text);
            assert!(
                matches!(e, PolicyParseError::Window { .. }),
                "{text:?}: {e:?}"
            );
            assert!(e.to_string().contains("expected"), "{e}");
        }
        // Each unit once, the largest first.
        for text in ["1/30m1h", "1/1m1m", "1/1s1ms1s", "1/1m 1min"] {
            assert!(
                matches!(err(text), PolicyParseError::Window { .. }),
                "{text:?}"
            );
        }
        // Digits, no sign, `_` only between digits.
        for text in [
            "+1/s",
            "1__/min",
            "_1_/min",
            "1__000/min",
            "1_/s",
            "_1/s",
            "+1 per s",
        ] {
            let e = err(text);
            assert!(
                matches!(e, PolicyParseError::Limit { .. }),
                "{text:?}: {e:?}"
            );
            assert!(e.to_string().contains("digits"), "{e}");
        }
        // ASCII spaces only: a Unicode space around `per` (or the slash, or
        // the ends) is not a separator.
        for space in ['\u{a0}', '\u{2003}', '\u{3000}', '\u{202f}', '\u{85}'] {
            for text in [
                format!("100{space}per 30s"),
                format!("100 per{space}30s"),
                format!("100{space}per{space}30s"),
                format!("100/{space}min"),
                format!("100{space}/min"),
                format!("{space}100/min"),
                format!("100/min{space}"),
                format!("100/1h{space}30m"),
            ] {
                let e = err(&text);
                assert!(
                    !matches!(e, PolicyParseError::Invalid(_)),
                    "{text:?}: {e:?}"
                );
            }
        }
        // What the notation still takes.
        for (text, limit, secs) in [
            ("1_000/min", 1000, 60),
            ("1_0_0 per\t2 days", 100, 172_800),
            ("\t5 PER 1h 30m 15s ", 5, 5415),
            ("3/1d1h1m1s", 3, 90_061),
        ] {
            let p: Policy = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(
                (p.limit(), p.window()),
                (limit, Duration::from_secs(secs)),
                "{text:?}"
            );
        }
        let p: Policy = "1/1s500ms".parse().unwrap();
        assert_eq!(p.window(), Duration::from_millis(1500));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Text near the notation: digits, units, separators, signs and
        /// Unicode spaces, in any order.
        fn near_notation() -> impl Strategy<Value = String> {
            let piece = prop::sample::select(vec![
                "1",
                "0",
                "42",
                "4294967295",
                "4294967296",
                "_",
                "/",
                " ",
                "\t",
                "per",
                "PER",
                "ms",
                "s",
                "sec",
                "m",
                "min",
                "h",
                "hours",
                "d",
                "+",
                "-",
                ".",
                "\u{a0}",
                "\u{2003}",
                "é",
                "99999999999999999999",
            ]);
            prop::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
        }

        /// A window in whole milliseconds written as terms, largest first.
        fn written(window_ms: u64) -> String {
            let units = [
                (86_400_000, "d"),
                (3_600_000, "h"),
                (60_000, "min"),
                (1000, "s"),
                (1, "ms"),
            ];
            let mut rest = window_ms;
            let mut out = String::new();
            for (size, unit) in units {
                if rest >= size {
                    out.push_str(&format!("{}{unit}", rest / size));
                    rest %= size;
                }
            }
            out
        }

        /// `n` with its digits grouped by three, as `1_000_000`.
        fn grouped(n: u32) -> String {
            let digits = n.to_string();
            let mut out = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i) % 3 == 0 {
                    out.push('_');
                }
                out.push(c);
            }
            out
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn any_text_parses_or_is_an_error_never_a_panic(text in any::<String>()) {
                let _ = text.parse::<Policy>();
            }

            #[test]
            fn text_near_the_notation_parses_or_is_an_error_never_a_panic(text in near_notation()) {
                if let Err(e) = text.parse::<Policy>() {
                    // Every error says something, naming what was expected.
                    prop_assert!(!e.to_string().is_empty());
                }
            }

            #[test]
            fn a_written_policy_reads_back_as_written(
                limit in 1..=u32::MAX,
                window_ms in 1..=100 * 86_400_000u64,
                per in any::<bool>(),
                group in any::<bool>(),
            ) {
                let limit_text = if group { grouped(limit) } else { limit.to_string() };
                let text = if per {
                    format!("{limit_text} per {}", written(window_ms))
                } else {
                    format!("{limit_text}/{}", written(window_ms))
                };
                let p: Policy = text.parse().map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
                prop_assert_eq!(p.limit(), limit);
                prop_assert_eq!(p.window(), Duration::from_millis(window_ms));
            }
        }
    }

    #[test]
    fn buckets_cover_at_least_the_whole_window() {
        let p = Policy::builder()
            .limit(1)
            .window(Duration::from_nanos(1000))
            .buckets(3)
            .build()
            .unwrap();
        assert_eq!(p.bucket_nanos(), 334);
        assert!(p.bucket_nanos() * 3 >= 1000);
    }
}

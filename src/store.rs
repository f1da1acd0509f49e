//! Where counts live: the in-memory [`Limiter`] (the default) or a shared store
//! such as Redis. The tower layer works with either through [`Store`].

pub use crate::limiter::{Limiter, LimiterBuilder};
pub use crate::stats::{KeyUsage, LimiterStats};

use crate::clock::Clock;
use crate::decision::Decision;

use crate::error::ConfigError;
use crate::policy::Policy;
use std::error::Error;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// A place that decides and counts for keys of type `K` under one [`Policy`].
///
/// The in-memory [`Limiter`] answers with a ready future: no allocation, no
/// boxing, no await point on its path. A remote store returns a real future.
pub trait Store<K>: Send + Sync + 'static {
    /// The decision in flight.
    type Future: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Check `cost` units for `key`, counting them if they fit.
    fn check_n(&self, key: &K, cost: u32) -> Self::Future;

    /// Decide at once when the store can do so without waiting (the in-memory
    /// limiter always can; a remote store might answer from a local deny cache).
    ///
    /// `None` means "ask [`check_n`](Store::check_n)": nothing was counted. The
    /// tower layer tries this first, so a store that answers here costs the
    /// request no allocation and no extra state.
    fn check_now(&self, key: &K, cost: u32) -> Option<Result<Decision, StoreError>> {
        let _ = (key, cost);
        None
    }

    /// Give back what an allowed `decision` counted (best effort).
    fn undo(&self, key: &K, decision: &Decision);

    /// Count `units` for `key` at once, whether or not they fit, past the
    /// limit too: the excess of a request admitted with a smaller cost than
    /// it turned out to have (see the [guide](crate::guide::settling)). The
    /// key's checks are then denied until its window is back under the limit.
    ///
    /// Returns what was counted, as an allowed decision (its
    /// [`cost`](Decision::cost) the units counted) that
    /// [`undo`](Store::undo) gives back, so that a later, lower settlement
    /// can take the charge back; `None` when nothing was counted. Like
    /// `undo`, it is called from synchronous code (a response body's end, a
    /// handler): a remote store counts in a task of its own and answers at
    /// once.
    ///
    /// The default counts nothing and answers `None`: a store that cannot
    /// count past its limit. The tower layer then keeps the reservation as it
    /// is, reports the units in its `uncharged` metric and logs it at WARN
    /// (at most once a second). The in-memory [`Limiter`] counts exactly
    /// ([`Limiter::charge`]).
    fn charge(&self, key: &K, units: u32) -> Option<Decision> {
        let _ = (key, units);
        None
    }

    /// The policy this store enforces.
    fn policy(&self) -> &Policy;

    /// A store that enforces `policy` from now on over this store's counts:
    /// what was admitted before keeps counting against the new policy, so
    /// raising a limit gives room at once and lowering it denies until the
    /// units already admitted have left the window. The new store replaces
    /// this one; this one stays usable (a check in flight finishes under the
    /// old policy) and undoes its own decisions.
    ///
    /// A change of window or buckets cannot keep the counts as they are: they
    /// are carried over conservatively (units are moved later in time, never
    /// earlier), so nothing admitted before the change is forgotten while it
    /// is inside one old window of the change. The guide's tiers chapter
    /// states the exact guarantee.
    ///
    /// The default answers [`ConfigError::PolicyFixed`]: a store that cannot
    /// change its policy.
    fn reconfigured(&self, policy: Policy) -> Result<Self, ConfigError>
    where
        Self: Sized,
    {
        let _ = policy;
        Err(ConfigError::PolicyFixed)
    }
}

/// A store could not decide: it is down, slow past its timeout, or answered with
/// an error, and it is configured to fail closed.
///
/// [`kind`](StoreError::kind) says what went wrong, to match on;
/// [`source`](std::error::Error::source) holds the underlying error when there
/// is one (the `redis` crate's, say).
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{StoreError, StoreErrorKind};
///
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let error = StoreError::new(StoreErrorKind::ConnectionRefused, Duration::from_secs(1))
///     .with_source(refused);
/// assert_eq!(error.kind(), StoreErrorKind::ConnectionRefused);
/// assert!(std::error::Error::source(&error).is_some());
/// ```
#[derive(Debug, Clone)]
pub struct StoreError {
    kind: StoreErrorKind,
    retry_after: Duration,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

/// What kind of failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store did not answer within its timeout.
    Timeout,
    /// Nothing accepted the connection (no server listening at the address).
    ConnectionRefused,
    /// The connection failed otherwise: dropped, reset, unreachable, or a
    /// name that did not resolve.
    Connection,
    /// The store refused the credentials or the command (`AUTH`, `NOPERM`).
    Unauthorized,
    /// The store is out of memory (Redis' `OOM` at `maxmemory`).
    OutOfMemory,
    /// The store is up but cannot serve now: loading its data, a read-only
    /// replica, a cluster that is down or failing over.
    Unavailable,
    /// The decision script failed, or answered something it never answers.
    Script,
    /// Anything else; the source says what.
    Other,
}

impl StoreErrorKind {
    /// The kind in snake case, as metrics label it.
    #[cfg_attr(not(all(feature = "metrics", feature = "redis")), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::ConnectionRefused => "connection_refused",
            StoreErrorKind::Connection => "connection",
            StoreErrorKind::Unauthorized => "unauthorized",
            StoreErrorKind::OutOfMemory => "out_of_memory",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Script => "script",
            StoreErrorKind::Other => "other",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "no answer within the timeout",
            StoreErrorKind::ConnectionRefused => "connection refused",
            StoreErrorKind::Connection => "connection failed",
            StoreErrorKind::Unauthorized => "not authorized",
            StoreErrorKind::OutOfMemory => "out of memory",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Script => "decision script failed",
            StoreErrorKind::Other => "error",
        }
    }
}

impl StoreError {
    /// A failure of `kind`, suggesting clients retry after `retry_after`.
    pub fn new(kind: StoreErrorKind, retry_after: Duration) -> Self {
        StoreError {
            kind,
            retry_after,
            source: None,
        }
    }

    /// The same failure, caused by `source` (an error value, or a message as a
    /// `String` or `&str`).
    pub fn with_source(mut self, source: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// The same failure, suggesting clients retry after `retry_after`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// How long a client should wait before retrying.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate-limit store unavailable: {}", self.kind.describe())?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

impl<K, C> Store<K> for Limiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    type Future = Ready<Result<Decision, StoreError>>;

    #[inline]
    fn check_n(&self, key: &K, cost: u32) -> Self::Future {
        ready(Ok(Limiter::check_n(self, key, cost)))
    }

    #[inline]
    fn check_now(&self, key: &K, cost: u32) -> Option<Result<Decision, StoreError>> {
        Some(Ok(Limiter::check_n(self, key, cost)))
    }

    fn undo(&self, key: &K, decision: &Decision) {
        Limiter::undo(self, key, decision)
    }

    fn charge(&self, key: &K, units: u32) -> Option<Decision> {
        Limiter::charge(self, key, units)
    }

    fn policy(&self) -> &Policy {
        Limiter::policy(self)
    }

    fn reconfigured(&self, policy: Policy) -> Result<Self, ConfigError> {
        Limiter::reconfigured(self, policy)
    }
}

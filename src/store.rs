//! Where counts live: the in-memory [`Limiter`] (the default) or a shared store
//! such as Redis. The tower layer works with either through [`Store`].

use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::policy::Policy;
use crate::wait::LocalStore;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::hash::Hash;
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

    /// The policy this store enforces.
    fn policy(&self) -> &Policy;

    /// The store as one that decides in-process, when it is one (the in-memory
    /// [`Limiter`]): the tower layer's waiting modes need it.
    #[doc(hidden)]
    fn local(&self) -> Option<&dyn LocalStore<K>> {
        None
    }
}

/// A store could not decide: it is down, slow past its timeout, or answered with
/// an error, and it is configured to fail closed.
#[derive(Debug, Clone)]
pub struct StoreError {
    message: String,
    retry_after: Duration,
}

impl StoreError {
    /// A failure with a message and a suggested wait before retrying.
    pub fn new(message: impl Into<String>, retry_after: Duration) -> Self {
        StoreError {
            message: message.into(),
            retry_after,
        }
    }

    /// How long a client should wait before retrying.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate-limit store unavailable: {}", self.message)
    }
}

impl std::error::Error for StoreError {}

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

    fn policy(&self) -> &Policy {
        Limiter::policy(self)
    }

    fn local(&self) -> Option<&dyn LocalStore<K>> {
        Some(self)
    }
}

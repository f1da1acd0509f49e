//! The answer to one check: what was decided and what a client needs to know next.

use crate::clock::saturating_nanos;
use std::time::Duration;

/// What the limiter decided for one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The units were admitted (and counted, unless this was a peek).
    Allowed,
    /// Over the limit now; [`Decision::retry_after`] says when this cost could pass.
    Denied,
    /// The cost is larger than the limit: it can never pass, so waiting is pointless.
    CostExceedsLimit,
}

/// A decision with everything rate-limit headers need, computed exactly from
/// the ring's slot tags.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{Limiter, ManualClock, Policy};
///
/// let limiter = Limiter::builder(Policy::per(2, Duration::from_secs(1)).unwrap())
///     .clock(ManualClock::new())
///     .build()
///     .unwrap();
/// assert!(limiter.check(&"alice").is_allowed());
/// let second = limiter.check(&"alice");
/// assert!(second.is_allowed());
/// assert_eq!(second.remaining(), 0);
/// let third = limiter.check(&"alice");
/// assert!(!third.is_allowed());
/// assert!(third.retry_after().unwrap() > Duration::ZERO);
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
#[must_use = "a decision says whether the units were admitted"]
pub struct Decision {
    pub(crate) outcome: Outcome,
    pub(crate) limit: u32,
    pub(crate) remaining: u32,
    /// Nanoseconds, turned into a `Duration` only when asked: most checks are
    /// never asked, and the conversion is not free on the hot path.
    pub(crate) retry_after_ns: u64,
    pub(crate) reset_ns: u64,
    /// Where the units were recorded, so an admitted decision can be undone.
    pub(crate) slot: u64,
    pub(crate) cost: u32,
    /// Counted in the limiter's shared overflow ring (the key was not tracked).
    pub(crate) overflow: bool,
    /// Allowed without consulting the store (a store that failed open).
    pub(crate) unchecked: bool,
    /// The incarnation of the key that counted the units, in a store that
    /// can lose a key and create it again (Redis): an undo gives units back
    /// only to the incarnation that counted them. 0 in memory.
    pub(crate) incarnation: u64,
}

impl Decision {
    /// What was decided.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// True when the units were admitted.
    pub fn is_allowed(&self) -> bool {
        self.outcome == Outcome::Allowed
    }

    /// The policy's limit per window.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Units still available in the current window after this decision.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// How long until this same cost could pass: zero when allowed, `None` when the
    /// cost exceeds the limit and can never pass.
    ///
    /// For a key the limiter tracks, exact: the cost passes then (if nothing
    /// else is counted for the key meanwhile) and not a nanosecond before. A
    /// decision of the overflow ring ([`is_overflow`](Self::is_overflow))
    /// tells when the overflow ring will have room:
    /// the key may pass earlier, once a tracked key goes idle and the key gets
    /// a ring of its own.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.outcome {
            Outcome::CostExceedsLimit => None,
            _ => Some(Duration::from_nanos(self.retry_after_ns)),
        }
    }

    /// How long until the window fully drains (every counted unit has expired).
    pub fn reset(&self) -> Duration {
        Duration::from_nanos(self.reset_ns)
    }

    pub(crate) fn cost_exceeds_limit(limit: u32, remaining: u32, reset: Duration) -> Decision {
        Decision {
            outcome: Outcome::CostExceedsLimit,
            limit,
            remaining,
            retry_after_ns: 0,
            reset_ns: saturating_nanos(reset),
            slot: 0,
            cost: 0,
            overflow: false,
            unchecked: false,
            incarnation: 0,
        }
    }

    /// A decision made without consulting a store: allowed, reporting `limit`
    /// as remaining, and [`is_unchecked`](Decision::is_unchecked). Used by stores
    /// that fail open and by tests.
    pub fn allow_unchecked(limit: u32) -> Decision {
        Decision {
            outcome: Outcome::Allowed,
            limit,
            remaining: limit,
            retry_after_ns: 0,
            reset_ns: 0,
            slot: 0,
            cost: 0,
            overflow: false,
            unchecked: true,
            incarnation: 0,
        }
    }

    /// Build a decision from parts (for [`Store`](crate::Store) implementations).
    pub fn from_parts(
        outcome: Outcome,
        limit: u32,
        remaining: u32,
        retry_after: Duration,
        reset: Duration,
    ) -> Decision {
        Decision {
            outcome,
            limit,
            remaining,
            retry_after_ns: saturating_nanos(retry_after),
            reset_ns: saturating_nanos(reset),
            slot: 0,
            cost: 0,
            overflow: false,
            unchecked: false,
            incarnation: 0,
        }
    }

    /// The bucket slot (clock time / bucket width) the units were counted in,
    /// for tests that verify the window guarantee slot by slot.
    #[cfg(all(test, not(tsw_loom)))]
    pub(crate) fn recorded_slot(&self) -> u64 {
        self.slot
    }

    /// True when the request was let through without a decision: the store could
    /// not be reached and is configured to fail open. `remaining` and `reset` then
    /// say nothing about the key: the tower layer then reports another policy's
    /// rate-limit fields, or none.
    pub fn is_unchecked(&self) -> bool {
        self.unchecked
    }

    /// True when the limiter was at `max_keys` and the key, not tracked, was
    /// decided by the shared overflow ring (see [`Limiter`](crate::Limiter)).
    pub fn is_overflow(&self) -> bool {
        self.overflow
    }

    /// The units this decision counted (0 unless allowed by a consuming check).
    pub fn cost(&self) -> u32 {
        self.cost
    }
}

/// [`Decision::retry_after`] for `Debug`: the wait as a duration, or `None` for
/// a cost that can never pass (not `0ns`, which would read as "retry now").
struct RetryAfter(Option<Duration>);

impl std::fmt::Debug for RetryAfter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(wait) => wait.fmt(f),
            None => f.write_str("None"),
        }
    }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("retry_after", &RetryAfter(self.retry_after()))
            .field("reset", &self.reset())
            .field("slot", &self.slot)
            .field("cost", &self.cost)
            .field("overflow", &self.overflow)
            .field("unchecked", &self.unchecked)
            .finish()
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_the_times_as_durations() {
        let d = Decision::from_parts(
            Outcome::Denied,
            5,
            0,
            Duration::from_millis(1500),
            Duration::from_secs(2),
        );
        let shown = format!("{d:?}");
        assert!(
            shown.contains("retry_after: 1.5s") && shown.contains("reset: 2s"),
            "{shown}"
        );
    }
}

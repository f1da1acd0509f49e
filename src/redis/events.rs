//! Where the store reports what it did: each event once, here, which feeds
//! the counters behind [`RedisStore::stats`](super::RedisStore::stats), the
//! metrics recorder ([`RedisMetrics`], feature `metrics`) and, for a Redis
//! that could not decide, a warning throttled to one a second.

use super::metrics::{CallStarted, RedisMetrics};
use super::{BreakerState, FailurePolicy, RedisStoreStats};
use crate::log::Throttle;
use crate::stats::bump;
use crate::store::{StoreError, StoreErrorKind};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[derive(Default)]
struct Counters {
    decisions: AtomicU64,
    round_trips: AtomicU64,
    deny_cache_hits: AtomicU64,
    failures: AtomicU64,
    timeouts: AtomicU64,
    failed_open: AtomicU64,
    undos: AtomicU64,
    lease_decisions: AtomicU64,
    lease_grants: AtomicU64,
    lease_units_granted: AtomicU64,
    lease_units_admitted: AtomicU64,
    lease_units_undone: AtomicU64,
    lease_units_handed_back: AtomicU64,
    lease_units_refused: AtomicU64,
    lease_units_unreturned: AtomicU64,
    fallback_decisions: AtomicU64,
}

/// A store's events. The counters and the warnings' pace are shared with the
/// stores it was reconfigured from or into (they are about Redis, not the
/// policy); the metrics are labelled with the policy's name.
pub(super) struct Events {
    counters: Arc<Counters>,
    warnings: Arc<Throttle>,
    metrics: Arc<RedisMetrics>,
}

impl Events {
    pub(super) fn new(policy: &str) -> Events {
        Events {
            counters: Arc::default(),
            warnings: Arc::new(Throttle::default()),
            metrics: Arc::new(RedisMetrics::new(policy)),
        }
    }

    /// The events of a store reconfigured from this one to the policy named
    /// `policy`: the same counters, and the same metrics under the same
    /// name; under another, the breaker's first `opens` openings (reported
    /// under the old name) are not reported again.
    pub(super) fn reconfigured(&self, same_name: bool, policy: &str, opens: u64) -> Events {
        let metrics = if same_name {
            self.metrics.clone()
        } else {
            let metrics = RedisMetrics::new(policy);
            metrics.skip_opens(opens);
            Arc::new(metrics)
        };
        Events {
            counters: self.counters.clone(),
            warnings: self.warnings.clone(),
            metrics,
        }
    }

    /// The counters as [`RedisStoreStats`], with the parts kept elsewhere.
    pub(super) fn stats(
        &self,
        breaker: BreakerState,
        breaker_counts: [u64; 3],
        deny_cache_len: usize,
    ) -> RedisStoreStats {
        let c = &*self.counters;
        let [breaker_opens, breaker_probes, breaker_answered] = breaker_counts;
        RedisStoreStats {
            decisions: c.decisions.load(Relaxed),
            round_trips: c.round_trips.load(Relaxed),
            deny_cache_hits: c.deny_cache_hits.load(Relaxed),
            failures: c.failures.load(Relaxed),
            timeouts: c.timeouts.load(Relaxed),
            failed_open: c.failed_open.load(Relaxed),
            breaker,
            breaker_opens,
            breaker_probes,
            breaker_answered,
            undos: c.undos.load(Relaxed),
            deny_cache_len,
            lease_decisions: c.lease_decisions.load(Relaxed),
            lease_grants: c.lease_grants.load(Relaxed),
            lease_units_granted: c.lease_units_granted.load(Relaxed),
            lease_units_admitted: c.lease_units_admitted.load(Relaxed),
            lease_units_undone: c.lease_units_undone.load(Relaxed),
            lease_units_handed_back: c.lease_units_handed_back.load(Relaxed),
            lease_units_refused: c.lease_units_refused.load(Relaxed),
            lease_units_unreturned: c.lease_units_unreturned.load(Relaxed),
            fallback_decisions: c.fallback_decisions.load(Relaxed),
        }
    }

    /// A check asked of the store.
    pub(super) fn asked(&self) {
        bump(&self.counters.decisions);
    }

    /// A script sent to Redis; [`answered`](Self::answered) when it came back
    /// (or timed out).
    pub(super) fn call_started(&self) -> CallStarted {
        bump(&self.counters.round_trips);
        self.metrics.call_started()
    }

    pub(super) fn answered(&self, started: CallStarted) {
        self.metrics.call_ended(started);
    }

    /// A check decided (by Redis, a lease, or locally).
    pub(super) fn decided(&self, allowed: bool) {
        self.metrics.decided(allowed);
    }

    /// A check the deny cache denied.
    pub(super) fn deny_cache_hit(&self) {
        bump(&self.counters.deny_cache_hits);
        self.metrics.deny_cache_hit();
        self.metrics.decided(false);
    }

    /// A check let through unchecked (failing open), or refused with an
    /// error (failing closed).
    pub(super) fn failed(&self, open: bool) {
        self.metrics.failed(open);
        if open {
            bump(&self.counters.failed_open);
        }
    }

    /// A check decided by the fallback limiter.
    pub(super) fn fallback(&self, allowed: bool) {
        bump(&self.counters.fallback_decisions);
        self.metrics.fallback(allowed);
    }

    /// An undo sent to Redis.
    pub(super) fn undo(&self) {
        bump(&self.counters.undos);
    }

    /// A call that failed as `error`; warned about, at most once a second
    /// (a Redis outage under load must not turn into a flood of log lines),
    /// with where the breaker stands and what the failure policy does.
    pub(super) fn failure(
        &self,
        error: &StoreError,
        breaker: BreakerState,
        policy: &FailurePolicy,
    ) {
        let c = &self.counters;
        bump(&c.failures);
        if error.kind() == StoreErrorKind::Timeout {
            bump(&c.timeouts);
        }
        self.metrics.error(error.kind());
        if let Some(held_back) = self.warnings.admit() {
            tracing::warn!(
                failures_since_last_warning = held_back + 1,
                failures = c.failures.load(Relaxed),
                timeouts = c.timeouts.load(Relaxed),
                failed_open = c.failed_open.load(Relaxed),
                breaker = ?breaker,
                policy = ?policy,
                kind = ?error.kind(),
                "Redis could not decide: {error}"
            );
        }
    }

    /// An undo that could not be sent (no runtime to send it on).
    pub(super) fn undo_not_sent(&self) {
        bump(&self.counters.failures);
    }

    /// The breaker's state and openings, after it may have changed.
    pub(super) fn breaker(&self, state: BreakerState, opens: u64) {
        self.metrics.breaker(state, opens);
    }

    /// A check of `cost` units admitted from a lease.
    pub(super) fn lease_decision(&self, cost: u32) {
        let c = &self.counters;
        bump(&c.lease_decisions);
        c.lease_units_admitted.fetch_add(u64::from(cost), Relaxed);
        self.metrics.lease_decision();
        self.metrics.decided(true);
    }

    /// A reply that granted `extra` units beyond the check's cost.
    pub(super) fn lease_granted(&self, extra: u32) {
        let c = &self.counters;
        bump(&c.lease_grants);
        c.lease_units_granted.fetch_add(u64::from(extra), Relaxed);
        self.metrics.lease_granted(extra);
    }

    /// Units of an undone decision back into the grant that counted them.
    pub(super) fn lease_undone(&self, units: u32) {
        self.counters
            .lease_units_undone
            .fetch_add(u64::from(units), Relaxed);
    }

    /// A hand-back Redis answered: `taken` units lowered, `refused` not.
    pub(super) fn handed_back(&self, taken: u32, refused: u32) {
        let c = &self.counters;
        c.lease_units_handed_back
            .fetch_add(u64::from(taken), Relaxed);
        c.lease_units_refused.fetch_add(u64::from(refused), Relaxed);
        self.metrics.lease_handed_back(taken, refused);
    }

    /// Units of a grant that will not be handed back.
    pub(super) fn unreturned(&self, units: u32) {
        self.counters
            .lease_units_unreturned
            .fetch_add(u64::from(units), Relaxed);
        self.metrics.lease_unreturned(units);
    }
}

//! What the Redis store reports through the `metrics` facade (feature
//! `metrics`): its decisions, failures by cause, round trips, deny-cache hits
//! and circuit breaker. Without the feature the type is empty and every
//! method does nothing, so the call sites need no `cfg`.
//!
//! Off the in-memory hot path: each decision costs a round trip (or is a
//! rarer local answer), next to which a counter increment is nothing.

#[cfg(feature = "metrics")]
pub(crate) use self::on::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use self::off::*;

#[cfg(feature = "metrics")]
mod on {
    use crate::metrics::DECISIONS;
    use crate::redis::BreakerState;
    use crate::StoreErrorKind;
    use ::metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// Failures of a remote store, by cause.
    const STORE_ERRORS: &str = "tower_sliding_window_store_errors_total";
    /// The Redis store's calls to Redis, answered or timed out.
    const REDIS_ROUND_TRIP: &str = "tower_sliding_window_redis_round_trip_seconds";
    /// Redis decisions the local deny cache answered.
    const REDIS_DENY_CACHE_HITS: &str = "tower_sliding_window_redis_deny_cache_hits_total";
    /// Times the Redis store's circuit breaker opened from closed.
    const REDIS_BREAKER_OPENS: &str = "tower_sliding_window_redis_breaker_opens_total";
    /// Where the breaker stands: 0 closed, 1 open, 2 half-open.
    const REDIS_BREAKER_STATE: &str = "tower_sliding_window_redis_breaker_state";
    /// Checks admitted from a lease, each a round trip saved.
    const REDIS_LEASE_DECISIONS: &str = "tower_sliding_window_redis_lease_decisions_total";
    /// Grants received: replies that counted units beyond the check's cost.
    const REDIS_LEASE_GRANTS: &str = "tower_sliding_window_redis_lease_grants_total";
    /// Units of leases, by `kind`: `granted`, `handed_back`, `refused` (handed
    /// back, but Redis no longer counted them there), `unreturned` (a
    /// hand-back that failed or was never sent).
    const REDIS_LEASE_UNITS: &str = "tower_sliding_window_redis_lease_units_total";

    /// When a call to Redis was sent.
    pub(crate) struct CallStarted(std::time::Instant);

    /// A Redis store's decisions, failures, round trips and breaker.
    pub(crate) struct RedisMetrics {
        allowed: Counter,
        denied: Counter,
        failed_open: Counter,
        failed_closed: Counter,
        /// Indexed by [`kind_index`].
        errors: [Counter; 8],
        round_trip: Histogram,
        deny_cache_hits: Counter,
        breaker_opens: Counter,
        breaker_state: Gauge,
        fallback_allowed: Counter,
        fallback_denied: Counter,
        lease_decisions: Counter,
        lease_grants: Counter,
        lease_units_granted: Counter,
        lease_units_handed_back: Counter,
        lease_units_refused: Counter,
        lease_units_unreturned: Counter,
        /// Breaker openings already handed to the recorder.
        flushed_opens: AtomicU64,
    }

    const KINDS: [StoreErrorKind; 8] = {
        use StoreErrorKind::*;
        [
            Timeout,
            ConnectionRefused,
            Connection,
            Unauthorized,
            OutOfMemory,
            Unavailable,
            Script,
            Other,
        ]
    };

    fn kind_index(kind: StoreErrorKind) -> usize {
        KINDS
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(KINDS.len() - 1)
    }

    impl RedisMetrics {
        pub(crate) fn new(policy: &str) -> Self {
            let decisions = |outcome: &'static str| counter!(DECISIONS, "policy" => policy.to_owned(), "store" => "redis", "outcome" => outcome);
            RedisMetrics {
                allowed: decisions("allowed"),
                denied: decisions("denied"),
                failed_open: decisions("failed_open"),
                failed_closed: decisions("failed_closed"),
                errors: KINDS.map(|kind| {
                    counter!(STORE_ERRORS, "policy" => policy.to_owned(), "store" => "redis", "kind" => kind.label())
                }),
                round_trip: histogram!(REDIS_ROUND_TRIP, "policy" => policy.to_owned()),
                deny_cache_hits: counter!(REDIS_DENY_CACHE_HITS, "policy" => policy.to_owned()),
                breaker_opens: counter!(REDIS_BREAKER_OPENS, "policy" => policy.to_owned()),
                breaker_state: gauge!(REDIS_BREAKER_STATE, "policy" => policy.to_owned()),
                fallback_allowed: decisions("fallback_allowed"),
                fallback_denied: decisions("fallback_denied"),
                lease_decisions: counter!(REDIS_LEASE_DECISIONS, "policy" => policy.to_owned()),
                lease_grants: counter!(REDIS_LEASE_GRANTS, "policy" => policy.to_owned()),
                lease_units_granted: counter!(REDIS_LEASE_UNITS, "policy" => policy.to_owned(), "kind" => "granted"),
                lease_units_handed_back: counter!(REDIS_LEASE_UNITS, "policy" => policy.to_owned(), "kind" => "handed_back"),
                lease_units_refused: counter!(REDIS_LEASE_UNITS, "policy" => policy.to_owned(), "kind" => "refused"),
                lease_units_unreturned: counter!(REDIS_LEASE_UNITS, "policy" => policy.to_owned(), "kind" => "unreturned"),
                flushed_opens: AtomicU64::new(0),
            }
        }

        /// A decision the store made (by Redis or locally).
        pub(crate) fn decided(&self, allowed: bool) {
            if allowed { &self.allowed } else { &self.denied }.increment(1);
        }

        /// A decision the store could not make, answered per the failure policy.
        pub(crate) fn failed(&self, open: bool) {
            if open {
                &self.failed_open
            } else {
                &self.failed_closed
            }
            .increment(1);
        }

        pub(crate) fn error(&self, kind: StoreErrorKind) {
            self.errors[kind_index(kind)].increment(1);
        }

        /// A decision of the fallback limiter.
        pub(crate) fn fallback(&self, allowed: bool) {
            if allowed {
                &self.fallback_allowed
            } else {
                &self.fallback_denied
            }
            .increment(1);
        }

        pub(crate) fn lease_decision(&self) {
            self.lease_decisions.increment(1);
        }

        pub(crate) fn lease_granted(&self, units: u32) {
            self.lease_grants.increment(1);
            self.lease_units_granted.increment(u64::from(units));
        }

        /// A hand-back Redis answered: `taken` units lowered, `refused` not.
        pub(crate) fn lease_handed_back(&self, taken: u32, refused: u32) {
            self.lease_units_handed_back.increment(u64::from(taken));
            self.lease_units_refused.increment(u64::from(refused));
        }

        pub(crate) fn lease_unreturned(&self, units: u32) {
            self.lease_units_unreturned.increment(u64::from(units));
        }

        pub(crate) fn deny_cache_hit(&self) {
            self.deny_cache_hits.increment(1);
        }

        pub(crate) fn call_started(&self) -> CallStarted {
            CallStarted(std::time::Instant::now())
        }

        pub(crate) fn call_ended(&self, started: CallStarted) {
            self.round_trip.record(started.0.elapsed().as_secs_f64());
        }

        /// The breaker's state and openings, after it may have changed.
        pub(crate) fn breaker(&self, state: BreakerState, opens: u64) {
            self.breaker_state.set(match state {
                BreakerState::Open => 1.0,
                BreakerState::HalfOpen => 2.0,
                _ => 0.0,
            });
            let before = self.flushed_opens.fetch_max(opens, Relaxed);
            if opens > before {
                self.breaker_opens.increment(opens - before);
            }
        }

        /// The breaker's first `opens` openings were reported elsewhere (by
        /// the store this one was reconfigured from, under its name).
        pub(crate) fn skip_opens(&self, opens: u64) {
            self.flushed_opens.fetch_max(opens, Relaxed);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod off {
    use crate::redis::BreakerState;
    use crate::StoreErrorKind;

    pub(crate) struct CallStarted;

    pub(crate) struct RedisMetrics;

    impl RedisMetrics {
        #[inline(always)]
        pub(crate) fn new(_policy: &str) -> Self {
            RedisMetrics
        }

        #[inline(always)]
        pub(crate) fn decided(&self, _allowed: bool) {}

        #[inline(always)]
        pub(crate) fn failed(&self, _open: bool) {}

        #[inline(always)]
        pub(crate) fn error(&self, _kind: StoreErrorKind) {}

        #[inline(always)]
        pub(crate) fn fallback(&self, _allowed: bool) {}

        #[inline(always)]
        pub(crate) fn lease_decision(&self) {}

        #[inline(always)]
        pub(crate) fn lease_granted(&self, _units: u32) {}

        #[inline(always)]
        pub(crate) fn lease_handed_back(&self, _taken: u32, _refused: u32) {}

        #[inline(always)]
        pub(crate) fn lease_unreturned(&self, _units: u32) {}

        #[inline(always)]
        pub(crate) fn deny_cache_hit(&self) {}

        #[inline(always)]
        pub(crate) fn call_started(&self) -> CallStarted {
            CallStarted
        }

        #[inline(always)]
        pub(crate) fn call_ended(&self, _started: CallStarted) {}

        #[inline(always)]
        pub(crate) fn breaker(&self, _state: BreakerState, _opens: u64) {}

        #[inline(always)]
        pub(crate) fn skip_opens(&self, _opens: u64) {}
    }
}

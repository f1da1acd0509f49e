//! What the crate reports through the `metrics` facade (feature `metrics`).
//! Without the feature every type here is empty and every method does
//! nothing, so the call sites need no `cfg` and compile to nothing.
//!
//! Handles are registered once, when a limiter, layer or store is built, with
//! whatever recorder is installed then: install the recorder first. Labels
//! are bounded (policy names, outcomes, store kinds), never a key.
//!
//! The hot path pays nothing for the counts of allowed and denied checks: the
//! limiter keeps them in its striped counters anyway, and hands the increase
//! to the recorder once per bucket width (the sweep step every limiter runs),
//! and whenever its stats are read.

#[cfg(feature = "metrics")]
pub(crate) use self::on::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use self::off::*;

#[cfg(feature = "metrics")]
mod on {
    /// Checks of a policy's store, by outcome: `allowed`, `denied`, and for a
    /// store that could not decide, `failed_open` or `failed_closed`.
    pub(crate) const DECISIONS: &str = "tower_sliding_window_decisions_total";
    /// Checks the shared overflow ring decided (the limiter at `max_keys`).
    pub(crate) const OVERFLOW_DECISIONS: &str = "tower_sliding_window_overflow_decisions_total";
    /// Keys an in-memory limiter tracks.
    pub(crate) const KEYS: &str = "tower_sliding_window_keys";
    /// What a layer did with requests besides deciding them: `exempt`,
    /// `missing_key`, `dry_run_denied`, `waited`, `wait_rejected`.
    pub(crate) const REQUESTS: &str = "tower_sliding_window_requests_total";
    /// How long admitted requests waited for their turn.
    pub(crate) const WAIT_SECONDS: &str = "tower_sliding_window_wait_seconds";
    /// Failures of a remote store, by cause.
    #[cfg(feature = "redis")]
    pub(crate) const STORE_ERRORS: &str = "tower_sliding_window_store_errors_total";
    /// The Redis store's calls to Redis, answered or timed out.
    #[cfg(feature = "redis")]
    pub(crate) const REDIS_ROUND_TRIP: &str = "tower_sliding_window_redis_round_trip_seconds";
    /// Redis decisions the local deny cache answered.
    #[cfg(feature = "redis")]
    pub(crate) const REDIS_DENY_CACHE_HITS: &str =
        "tower_sliding_window_redis_deny_cache_hits_total";
    /// Times the Redis store's circuit breaker opened from closed.
    #[cfg(feature = "redis")]
    pub(crate) const REDIS_BREAKER_OPENS: &str = "tower_sliding_window_redis_breaker_opens_total";
    /// Where the breaker stands: 0 closed, 1 open, 2 half-open.
    #[cfg(feature = "redis")]
    pub(crate) const REDIS_BREAKER_STATE: &str = "tower_sliding_window_redis_breaker_state";

    use ::metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// When a request started to wait.
    pub(crate) struct WaitStarted(tokio::time::Instant);

    /// When a call to a remote store was sent.
    #[cfg(feature = "redis")]
    pub(crate) struct CallStarted(std::time::Instant);

    /// A Redis store's decisions, failures, round trips and breaker. Off the
    /// in-memory hot path: each decision costs a round trip (or is a rarer
    /// local answer), next to which a counter increment is nothing.
    #[cfg(feature = "redis")]
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
        /// Breaker openings already handed to the recorder.
        flushed_opens: AtomicU64,
    }

    #[cfg(feature = "redis")]
    const KINDS: [crate::StoreErrorKind; 8] = {
        use crate::StoreErrorKind::*;
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

    #[cfg(feature = "redis")]
    fn kind_index(kind: crate::StoreErrorKind) -> usize {
        KINDS
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(KINDS.len() - 1)
    }

    #[cfg(feature = "redis")]
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

        pub(crate) fn error(&self, kind: crate::StoreErrorKind) {
            self.errors[kind_index(kind)].increment(1);
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
        pub(crate) fn breaker(&self, state: crate::redis::BreakerState, opens: u64) {
            use crate::redis::BreakerState;
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

    /// An in-memory limiter's checks, handed over from its own counters.
    pub(crate) struct LimiterMetrics {
        allowed: Counter,
        denied: Counter,
        overflow: Counter,
        keys: Gauge,
        /// The totals already handed to the recorder: admitted, rejected,
        /// overflowed. Raised with `fetch_max`, so that two threads flushing
        /// at once hand each increase over once.
        flushed: [AtomicU64; 3],
    }

    impl LimiterMetrics {
        pub(crate) fn new(policy: &str) -> Self {
            let labels = |outcome: &'static str| {
                [
                    ("policy", policy.to_owned()),
                    ("store", "memory".to_owned()),
                    ("outcome", outcome.to_owned()),
                ]
            };
            LimiterMetrics {
                allowed: counter!(DECISIONS, &labels("allowed")),
                denied: counter!(DECISIONS, &labels("denied")),
                overflow: counter!(OVERFLOW_DECISIONS, "policy" => policy.to_owned()),
                keys: gauge!(KEYS, "policy" => policy.to_owned()),
                flushed: Default::default(),
            }
        }

        /// Hand the increase of each total since the last flush to the recorder.
        pub(crate) fn flush(&self, admitted: u64, rejected: u64, overflowed: u64, keys: usize) {
            let counters = [&self.allowed, &self.denied, &self.overflow];
            for ((total, flushed), counter) in [admitted, rejected, overflowed]
                .into_iter()
                .zip(&self.flushed)
                .zip(counters)
            {
                let before = flushed.fetch_max(total, Relaxed);
                if total > before {
                    counter.increment(total - before);
                }
            }
            self.keys.set(keys as f64);
        }
    }

    /// What a layer did with requests besides deciding them.
    pub(crate) struct LayerMetrics {
        exempt: Counter,
        missing_key: Counter,
        unknown_tier: Counter,
        tier_denied: Counter,
        dry_run_denied: Counter,
        waited: Counter,
        wait_rejected: Counter,
        wait: Histogram,
    }

    impl LayerMetrics {
        /// A layer's label is its policy's name, or its policies' names
        /// joined by `+`.
        pub(crate) fn new<'a>(names: impl Iterator<Item = &'a str>) -> Self {
            let label = names.collect::<Vec<_>>().join("+");
            let outcome = |outcome: &'static str| counter!(REQUESTS, "policy" => label.clone(), "outcome" => outcome);
            LayerMetrics {
                exempt: outcome("exempt"),
                missing_key: outcome("missing_key"),
                unknown_tier: outcome("unknown_tier"),
                tier_denied: outcome("tier_denied"),
                dry_run_denied: outcome("dry_run_denied"),
                waited: outcome("waited"),
                wait_rejected: outcome("wait_rejected"),
                wait: histogram!(WAIT_SECONDS, "policy" => label.clone()),
            }
        }

        pub(crate) fn exempt(&self) {
            self.exempt.increment(1);
        }

        pub(crate) fn missing_key(&self) {
            self.missing_key.increment(1);
        }

        pub(crate) fn unknown_tier(&self) {
            self.unknown_tier.increment(1);
        }

        pub(crate) fn tier_denied(&self) {
            self.tier_denied.increment(1);
        }

        pub(crate) fn dry_run_denied(&self) {
            self.dry_run_denied.increment(1);
        }

        /// When a request starts to wait.
        pub(crate) fn wait_started(&self) -> WaitStarted {
            WaitStarted(tokio::time::Instant::now())
        }

        /// A request admitted after waiting since `started`.
        pub(crate) fn waited(&self, started: WaitStarted) {
            self.waited.increment(1);
            self.wait.record(started.0.elapsed().as_secs_f64());
        }

        pub(crate) fn wait_rejected(&self) {
            self.wait_rejected.increment(1);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod off {
    pub(crate) struct WaitStarted;

    #[cfg(feature = "redis")]
    pub(crate) struct CallStarted;

    #[cfg(feature = "redis")]
    pub(crate) struct RedisMetrics;

    #[cfg(feature = "redis")]
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
        pub(crate) fn error(&self, _kind: crate::StoreErrorKind) {}

        #[inline(always)]
        pub(crate) fn deny_cache_hit(&self) {}

        #[inline(always)]
        pub(crate) fn call_started(&self) -> CallStarted {
            CallStarted
        }

        #[inline(always)]
        pub(crate) fn call_ended(&self, _started: CallStarted) {}

        #[inline(always)]
        pub(crate) fn breaker(&self, _state: crate::redis::BreakerState, _opens: u64) {}

        #[inline(always)]
        pub(crate) fn skip_opens(&self, _opens: u64) {}
    }

    pub(crate) struct LimiterMetrics;

    impl LimiterMetrics {
        #[inline(always)]
        pub(crate) fn new(_policy: &str) -> Self {
            LimiterMetrics
        }

        #[inline(always)]
        pub(crate) fn flush(&self, _admitted: u64, _rejected: u64, _overflowed: u64, _keys: usize) {
        }
    }

    pub(crate) struct LayerMetrics;

    impl LayerMetrics {
        #[inline(always)]
        pub(crate) fn new<'a>(_names: impl Iterator<Item = &'a str>) -> Self {
            LayerMetrics
        }

        #[inline(always)]
        pub(crate) fn exempt(&self) {}

        #[inline(always)]
        pub(crate) fn missing_key(&self) {}

        #[inline(always)]
        pub(crate) fn unknown_tier(&self) {}

        #[inline(always)]
        pub(crate) fn tier_denied(&self) {}

        #[inline(always)]
        pub(crate) fn dry_run_denied(&self) {}

        #[inline(always)]
        pub(crate) fn wait_started(&self) -> WaitStarted {
            WaitStarted
        }

        #[inline(always)]
        pub(crate) fn waited(&self, _started: WaitStarted) {}

        #[inline(always)]
        pub(crate) fn wait_rejected(&self) {}
    }
}

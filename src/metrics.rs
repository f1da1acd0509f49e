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
    /// store that could not decide, `failed_open` or `failed_closed`. The
    /// Redis store's own metrics are in `redis::metrics`.
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
    /// Units settlements changed after the response, by policy and outcome:
    /// `given_back` (the request did not count, or cost less than
    /// reserved), `charged` (it cost more), `uncharged` (it cost more, but
    /// the store could not count past its limit).
    pub(crate) const SETTLED_UNITS: &str = "tower_sliding_window_settled_units_total";
    use ::metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// When a request started to wait.
    pub(crate) struct WaitStarted(tokio::time::Instant);

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

    /// One policy's settlements, registered at the first one (a layer that
    /// never settles shows none of these series).
    pub(crate) struct SettleMetrics {
        policy: Box<str>,
        counters: std::sync::OnceLock<[Counter; 3]>,
    }

    impl SettleMetrics {
        pub(crate) fn new(policy: &str) -> Self {
            SettleMetrics {
                policy: policy.into(),
                counters: std::sync::OnceLock::new(),
            }
        }

        fn add(&self, which: usize, units: u32) {
            let counters = self.counters.get_or_init(|| {
                ["given_back", "charged", "uncharged"].map(|outcome| {
                    counter!(SETTLED_UNITS, "policy" => self.policy.to_string(), "outcome" => outcome)
                })
            });
            counters[which].increment(u64::from(units));
        }

        pub(crate) fn given_back(&self, units: u32) {
            self.add(0, units);
        }

        pub(crate) fn charged(&self, units: u32) {
            self.add(1, units);
        }

        pub(crate) fn uncharged(&self, units: u32) {
            self.add(2, units);
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
        /// A layer of policies: labelled by its policy's name, or its
        /// policies' names joined by `+`.
        pub(crate) fn policies<'a>(names: impl Iterator<Item = &'a str>) -> Self {
            Self::labelled(names.collect::<Vec<_>>().join("+"))
        }

        /// A layer of tiers: labelled `tiers`, whatever its tiers (a table
        /// may hold many, and it changes at run time).
        pub(crate) fn tiers() -> Self {
            Self::labelled("tiers".to_owned())
        }

        fn labelled(label: String) -> Self {
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

    pub(crate) struct SettleMetrics;

    impl SettleMetrics {
        #[inline(always)]
        pub(crate) fn new(_policy: &str) -> Self {
            SettleMetrics
        }

        #[inline(always)]
        pub(crate) fn given_back(&self, _units: u32) {}

        #[inline(always)]
        pub(crate) fn charged(&self, _units: u32) {}

        #[inline(always)]
        pub(crate) fn uncharged(&self, _units: u32) {}
    }

    pub(crate) struct LayerMetrics;

    impl LayerMetrics {
        #[inline(always)]
        pub(crate) fn policies<'a>(_names: impl Iterator<Item = &'a str>) -> Self {
            LayerMetrics
        }

        #[inline(always)]
        pub(crate) fn tiers() -> Self {
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

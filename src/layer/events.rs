//! Where the layer reports what it did with a request besides deciding it:
//! each event once, here, which feeds the layer's counters
//! ([`SlidingWindowLayer::stats`](super::SlidingWindowLayer::stats)), the
//! metrics recorder (feature `metrics`) and the log, where an event that can
//! repeat with every request is let through at most once a second with the
//! count held back.

use super::LayerStats;
use crate::log::LayerLogs;
use crate::metrics::{LayerMetrics, WaitStarted};
use crate::stats::bump;
use crate::store::StoreError;
use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tracing::field::display;

#[derive(Debug, Default)]
struct Counters {
    dry_run_rejections: AtomicU64,
    key_missing: AtomicU64,
    store_errors: AtomicU64,
    unknown_tier: AtomicU64,
}

/// A layer's events. `key` arguments are the request's key as the layer logs
/// it, `None` unless the layer logs keys.
pub(crate) struct LayerEvents {
    counters: Counters,
    metrics: LayerMetrics,
    logs: LayerLogs,
}

impl LayerEvents {
    pub(crate) fn new(metrics: LayerMetrics) -> LayerEvents {
        LayerEvents {
            counters: Counters::default(),
            metrics,
            logs: LayerLogs::default(),
        }
    }

    pub(crate) fn stats(&self) -> LayerStats {
        let c = &self.counters;
        LayerStats {
            dry_run_rejections: c.dry_run_rejections.load(Relaxed),
            key_missing: c.key_missing.load(Relaxed),
            store_errors: c.store_errors.load(Relaxed),
            unknown_tier: c.unknown_tier.load(Relaxed),
        }
    }

    /// A request forwarded without a decision: exempt, or of an unlimited
    /// tier.
    pub(crate) fn exempt(&self) {
        self.metrics.exempt();
    }

    /// A request without a key (its `MissingKey` outcome follows).
    pub(crate) fn missing_key(&self) {
        self.metrics.missing_key();
    }

    /// A request without a key rejected (or, in a dry run, that would be).
    pub(crate) fn key_missing_rejected(&self, dry_run: bool) {
        bump(&self.counters.key_missing);
        if !dry_run {
            tracing::debug!("rate limit: request has no key, rejected");
        } else if let Some(held) = self.logs.no_key_dry_run.admit() {
            tracing::info!(
                held_back = held,
                "rate limit (dry run): request has no key, would reject"
            );
        }
    }

    /// A request over `policy`'s limit rejected (or, in a dry run, that would
    /// be).
    pub(crate) fn limited(
        &self,
        policy: &str,
        limit: u32,
        retry_after: Option<Duration>,
        key: Option<&dyn Display>,
        dry_run: bool,
    ) {
        let retry_ms = retry_after.map(|w| w.as_millis() as u64);
        let key = key.map(display);
        if !dry_run {
            tracing::debug!(policy = %policy, limit, retry_after_ms = ?retry_ms, key, "rate limit: rejected");
            return;
        }
        bump(&self.counters.dry_run_rejections);
        self.metrics.dry_run_denied();
        if let Some(held) = self.logs.dry_run.admit() {
            tracing::info!(policy = %policy, limit, retry_after_ms = ?retry_ms, key, held_back = held, "rate limit (dry run): would reject");
        }
    }

    /// A request of a denied tier rejected (or, in a dry run, that would be).
    pub(crate) fn tier_denied(&self, tier: &str, dry_run: bool) {
        self.metrics.tier_denied();
        if !dry_run {
            tracing::debug!(tier = %tier, "rate limit: rejected, tier denied");
            return;
        }
        bump(&self.counters.dry_run_rejections);
        self.metrics.dry_run_denied();
        if let Some(held) = self.logs.dry_run.admit() {
            tracing::info!(
                tier = %tier,
                held_back = held,
                "rate limit (dry run): would reject, tier denied"
            );
        }
    }

    /// `policy`'s store could not decide a request.
    pub(crate) fn store_down(&self, policy: &str, error: &StoreError, dry_run: bool) {
        bump(&self.counters.store_errors);
        if let Some(held) = self.logs.store_down.admit() {
            tracing::warn!(policy = %policy, %error, kind = ?error.kind(), dry_run, held_back = held, "rate limit: store could not decide");
        }
    }

    /// A request the layer failed to decide (a bug).
    pub(crate) fn undecided(&self) {
        if let Some(held) = self.logs.undecided.admit() {
            tracing::error!(
                held_back = held,
                "rate limit: a request was left undecided; rejected (please report this bug)"
            );
        }
    }

    /// A request of a tier the table does not have.
    pub(crate) fn unknown_tier(&self, key: Option<&dyn Display>, dry_run: bool) {
        bump(&self.counters.unknown_tier);
        self.metrics.unknown_tier();
        if let Some(held) = self.logs.unknown_tier.admit() {
            let key = key.map(display);
            tracing::warn!(
                key,
                dry_run,
                held_back = held,
                "rate limit: request of a tier the table does not have"
            );
        }
    }

    /// A settlement's excess of `units` that `policy`'s store could not
    /// charge (the settled-units metric is the policy's own).
    pub(crate) fn uncharged(&self, policy: &str, key: Option<&dyn Display>, units: u32) {
        if let Some(held) = self.logs.uncharged.admit() {
            let key = key.map(display);
            tracing::warn!(policy = %policy, key, units, held_back = held, "rate limit: an excess could not be charged (the store counts no units past its limit)");
        }
    }

    /// A request starts to wait for its turn.
    pub(crate) fn wait_started(&self) -> WaitStarted {
        self.metrics.wait_started()
    }

    /// A waiting request's turn came.
    pub(crate) fn waited(&self, started: WaitStarted) {
        self.metrics.waited(started);
    }

    /// A request that would have waited too long, or found the queue full.
    pub(crate) fn wait_rejected(&self) {
        self.metrics.wait_rejected();
    }
}

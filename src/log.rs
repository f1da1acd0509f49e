//! Log events that can repeat once per request (a store that is down, a dry
//! run under attack) let through at most once per interval, with the number
//! held back since: an outage or a flood must not become a flood of log lines.
//! The totals are in the stats and metrics, not in the log.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::Instant;

/// How often a repeating event is logged at most.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Lets one event through per interval, without a lock: the first caller to
/// find the interval over wins a compare-and-swap; the very first call is let
/// through. Time is tokio's (the real clock outside a paused runtime), so
/// tests on paused time see the interval pass when they advance it.
pub(crate) struct Throttle {
    origin: Instant,
    interval_ms: u64,
    /// Milliseconds since `origin` before which no event is let through.
    next_ms: AtomicU64,
    /// Events held back since the last one let through.
    held: AtomicU64,
}

impl Throttle {
    pub(crate) fn new(interval: Duration) -> Throttle {
        Throttle {
            origin: Instant::now(),
            interval_ms: interval.as_millis() as u64,
            next_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when this event is to be logged, `n` the events held back
    /// since the last one logged; `None` when it is held back.
    pub(crate) fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`admit`](Self::admit) at `now` (for callers that have read the clock;
    /// the Redis store paces its sweeps and connection replacements so).
    pub(crate) fn admit_at(&self, now: Instant) -> Option<u64> {
        let now_ms = now.saturating_duration_since(self.origin).as_millis() as u64;
        let next = self.next_ms.load(Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(next, now_ms + self.interval_ms, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.held.swap(0, Relaxed));
        }
        self.held.fetch_add(1, Relaxed);
        None
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(LOG_INTERVAL)
    }
}

/// A layer's repeating log events, each throttled on its own.
#[derive(Default)]
pub(crate) struct LayerLogs {
    /// A store could not decide (`warn`).
    pub(crate) store_down: Throttle,
    /// A dry run would have rejected a request (`info`).
    pub(crate) dry_run: Throttle,
    /// A request had no key in a dry run (`info`).
    pub(crate) no_key_dry_run: Throttle,
    /// A request was left undecided, a bug (`error`).
    pub(crate) undecided: Throttle,
    /// A request named a tier the table does not have (`warn`).
    pub(crate) unknown_tier: Throttle,
    /// A settlement's excess that the store could not charge (`warn`).
    pub(crate) uncharged: Throttle,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_event_per_interval_with_the_count_held_back() {
        let throttle = Throttle::new(Duration::from_secs(1));
        assert_eq!(throttle.admit(), Some(0), "the first is logged");
        for _ in 0..9 {
            assert_eq!(throttle.admit(), None);
        }
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(throttle.admit(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(throttle.admit(), Some(10), "ten were held back");
        assert_eq!(throttle.admit(), None);
    }
}

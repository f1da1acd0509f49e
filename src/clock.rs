//! Time sources. Decisions only ever use a monotonic clock, never wall time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A monotonic time source in nanoseconds since the clock's own origin.
///
/// The limiter only needs differences, so the origin is arbitrary. A clock that
/// steps backwards (a [`ManualClock`] set back, say) is tolerated: each key's
/// time is held at the newest slot it has seen until the clock passes it again
/// (a key evicted while idle restarts no earlier than the sweep that evicted it),
/// so nothing counted is ever forgotten early and nothing underflows.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's origin.
    fn now_nanos(&self) -> u64;

    /// The smallest step the clock can tell apart. A policy whose bucket is
    /// narrower than this is rejected when the limiter is built.
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
}

/// Follows tokio's clock, so `#[tokio::test(start_paused = true)]` and
/// `tokio::time::advance` drive the limiter, and waits computed from its
/// decisions line up with tokio timers.
///
/// Outside a paused runtime this is `std::time::Instant` (`CLOCK_MONOTONIC`).
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }

    /// The tokio instant that `nanos` (a reading of this clock) stands for.
    pub fn instant_at(&self, nanos: u64) -> tokio::time::Instant {
        self.origin + Duration::from_nanos(nanos)
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        tokio::time::Instant::now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }
}

/// A clock set by hand, for tests and simulations. Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let handle = clock.clone();
/// handle.advance(Duration::from_millis(5));
/// assert_eq!(clock.now_nanos(), 5_000_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        ManualClock::default()
    }

    /// Move time forward (saturating at the end of the 64-bit range).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Set the time, forwards or backwards.
    pub fn set(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for Arc<C> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }

    fn resolution(&self) -> Duration {
        (**self).resolution()
    }
}

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

/// `CLOCK_MONOTONIC_COARSE`: the time of the kernel's last tick, read from the
/// vDSO without touching the TSC. About a quarter of the cost of
/// `Instant::now` on the benchmark machine (see `benches/clock.rs`), at the price
/// of a resolution of one kernel tick (typically 1–4 ms; [`Clock::resolution`]
/// reports it, and a policy whose bucket is narrower is rejected at build time).
///
/// Unlike [`TokioClock`] it does not follow tokio's paused clock, so tests that
/// drive time with `tokio::time::advance` should keep the default. Decisions are
/// exact in this clock's time, which lags real time by less than one tick.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{CoarseClock, Limiter, Policy};
///
/// let limiter = Limiter::builder(Policy::per(100, Duration::from_secs(1)).unwrap())
///     .clock(CoarseClock::new())
///     .build()
///     .unwrap();
/// assert!(limiter.check(&"client").is_allowed());
/// ```
#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
#[derive(Debug, Clone, Copy)]
pub struct CoarseClock {
    origin: u64,
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
impl CoarseClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        CoarseClock {
            origin: coarse_nanos(),
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
impl Default for CoarseClock {
    fn default() -> Self {
        CoarseClock::new()
    }
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
#[inline]
fn coarse_nanos() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
impl Clock for CoarseClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        coarse_nanos().saturating_sub(self.origin)
    }

    fn resolution(&self) -> Duration {
        let r = rustix::time::clock_getres(rustix::time::ClockId::MonotonicCoarse);
        Duration::new(
            r.tv_sec.max(0) as u64,
            r.tv_nsec.clamp(0, 999_999_999) as u32,
        )
        .max(Duration::from_nanos(1))
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

#[cfg(all(
    test,
    not(tsw_loom),
    any(target_os = "linux", target_os = "android", target_os = "freebsd")
))]
mod tests {
    use super::*;

    #[test]
    fn coarse_clock_never_goes_back_and_reports_its_tick() {
        let clock = CoarseClock::new();
        let mut last = clock.now_nanos();
        for _ in 0..1000 {
            let now = clock.now_nanos();
            assert!(now >= last);
            last = now;
        }
        let tick = clock.resolution();
        assert!(tick > Duration::ZERO && tick < Duration::from_secs(1));
    }

    #[test]
    fn coarse_clock_rejects_buckets_below_its_tick() {
        let policy = crate::Policy::per(10, Duration::from_nanos(15)).unwrap();
        let built: Result<crate::Limiter<u8, _>, _> = crate::Limiter::builder(policy)
            .clock(CoarseClock::new())
            .build();
        assert!(matches!(
            built,
            Err(crate::ConfigError::BucketBelowClockResolution { .. })
        ));
    }
}

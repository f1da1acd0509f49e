//! Time sources. Decisions only ever use a monotonic clock, never wall time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A monotonic time source in nanoseconds since the clock's own origin.
///
/// The limiter only needs differences, so the origin is arbitrary, within one
/// bound: readings past 2^60 bucket widths are held there (see
/// [`Limiter`](crate::Limiter)), so an origin as distant as the Unix epoch
/// needs buckets of some nanoseconds at least. A clock that
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

/// A duration in whole nanoseconds, saturating (u64 nanoseconds span 584 years).
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
        // Saturating: a paused clock can be advanced past the 584 years a u64
        // of nanoseconds spans, and a wrapped reading would step back by all of them.
        saturating_nanos(tokio::time::Instant::now().saturating_duration_since(self.origin))
    }
}

/// Where an [`AutoClock`] reads the time, chosen once when it is built: what
/// the tests check of the choice.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeSource {
    /// tokio's clock ([`TokioClock`]): the clock was built inside a tokio runtime
    /// whose time is paused, so tests drive it with `tokio::time::advance`; or
    /// it belongs to a waiting tower layer's limiter (`OnLimit::Wait`,
    /// `OnLimit::Backpressure`), whose waits are tokio timers.
    Tokio,
    /// `CLOCK_MONOTONIC_COARSE` ([`CoarseClock`]): a few nanoseconds a read.
    Coarse,
    /// `std::time::Instant` (`CLOCK_MONOTONIC`): for buckets too narrow for the
    /// coarse clock's tick, or where it does not exist.
    Precise,
}

/// The default clock of [`Limiter`](crate::Limiter): the cheapest monotonic
/// source that is exact enough for the policy, chosen once when it is built.
///
/// - Built inside a tokio runtime whose clock is **paused** (as in
///   `#[tokio::test(start_paused = true)]`), it follows tokio's clock, like
///   [`TokioClock`], so tests drive the limiter with `tokio::time::advance`.
/// - Otherwise it reads `CLOCK_MONOTONIC_COARSE` (see [`CoarseClock`]), which
///   costs a fraction of `Instant::now`, while reading the clock is a large
///   part of a check. Decisions are exact in that clock's time, which lags
///   real time by less than one kernel tick.
/// - If the policy's bucket is narrower than [`COARSE_TICKS_PER_BUCKET`](Self::COARSE_TICKS_PER_BUCKET)
///   coarse ticks (or the platform has no coarse clock), it reads
///   `std::time::Instant`, so no policy is rejected for the clock's resolution.
///
/// The choice is made once: a runtime paused after the clock was built is not
/// followed (build the limiter after pausing, or pass a [`TokioClock`]). The
/// tower layer's limiters use it too, on tokio's clock when the layer waits.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::{AutoClock, Clock};
///
/// // Not inside a paused runtime: a 100 µs bucket is read from the precise
/// // clock, which tells its buckets apart.
/// let narrow = AutoClock::for_bucket(Duration::from_micros(100));
/// assert!(narrow.resolution() <= Duration::from_micros(100));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct AutoClock {
    inner: AutoInner,
}

#[derive(Debug, Clone, Copy)]
enum AutoInner {
    Tokio(TokioClock),
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    Coarse(CoarseClock),
    Precise(std::time::Instant),
}

impl AutoClock {
    /// The coarse clock is used only when a bucket spans at least this many of
    /// its ticks, so a reading's lag (under one tick) is a small part of a bucket.
    pub const COARSE_TICKS_PER_BUCKET: u32 = 4;

    /// The clock for a policy whose bucket is `bucket` wide
    /// ([`Policy::bucket_width`](crate::Policy::bucket_width)).
    pub fn for_bucket(bucket: Duration) -> Self {
        let inner = if tokio_clock_is_paused() {
            AutoInner::Tokio(TokioClock::new())
        } else {
            Self::outside_paused_tokio(bucket)
        };
        AutoClock { inner }
    }

    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    fn outside_paused_tokio(bucket: Duration) -> AutoInner {
        let coarse = CoarseClock::new();
        if bucket >= coarse.resolution() * Self::COARSE_TICKS_PER_BUCKET {
            AutoInner::Coarse(coarse)
        } else {
            AutoInner::Precise(std::time::Instant::now())
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
    fn outside_paused_tokio(_bucket: Duration) -> AutoInner {
        AutoInner::Precise(std::time::Instant::now())
    }

    /// tokio's clock, whether or not it is paused: for limiters whose waits are
    /// tokio timers.
    pub(crate) fn tokio() -> Self {
        AutoClock {
            inner: AutoInner::Tokio(TokioClock::new()),
        }
    }

    /// Where this clock reads the time.
    #[cfg(test)]
    pub(crate) fn source(&self) -> TimeSource {
        match self.inner {
            AutoInner::Tokio(_) => TimeSource::Tokio,
            #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
            AutoInner::Coarse(_) => TimeSource::Coarse,
            AutoInner::Precise(_) => TimeSource::Precise,
        }
    }
}

impl AutoClock {
    /// The sources other than the coarse clock, out of line: they cost tens of
    /// nanoseconds anyway, and kept inline they made the whole reading a call.
    #[inline(never)]
    fn now_nanos_other(&self) -> u64 {
        match &self.inner {
            #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
            AutoInner::Coarse(c) => c.now_nanos(),
            AutoInner::Precise(origin) => saturating_nanos(origin.elapsed()),
            AutoInner::Tokio(c) => c.now_nanos(),
        }
    }
}

impl Clock for AutoClock {
    #[inline(always)]
    fn now_nanos(&self) -> u64 {
        match &self.inner {
            #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
            AutoInner::Coarse(c) => c.now_nanos(),
            _ => self.now_nanos_other(),
        }
    }

    fn resolution(&self) -> Duration {
        match &self.inner {
            #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
            AutoInner::Coarse(c) => c.resolution(),
            AutoInner::Precise(_) | AutoInner::Tokio(_) => Duration::from_nanos(1),
        }
    }
}

/// Whether this thread runs inside a tokio runtime whose clock is paused. tokio
/// has no query for it, so watch: while `std`'s clock moves on by a microsecond,
/// a running tokio clock (which reads the same `CLOCK_MONOTONIC`) moves too, and a
/// paused one cannot (it only moves by `advance` or when the runtime is idle).
fn tokio_clock_is_paused() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        return false;
    }
    let tokio_before = tokio::time::Instant::now();
    let std_before = std::time::Instant::now();
    while std_before.elapsed() < Duration::from_micros(1) {
        std::hint::spin_loop();
    }
    tokio::time::Instant::now() == tokio_before
}

/// `CLOCK_MONOTONIC_COARSE`: the time of the kernel's last tick, read from the
/// vDSO without touching the TSC: a fraction of the cost of `Instant::now`
/// (`benches/clock.rs` compares them), at the price of a resolution of one
/// kernel tick (typically 1–4 ms; [`Clock::resolution`]
/// reports it, and a policy whose bucket is narrower is rejected at build time).
///
/// Unlike [`TokioClock`] it does not follow tokio's paused clock, so tests that
/// drive time with `tokio::time::advance` should use [`TokioClock`] or the default
/// [`AutoClock`] (which uses this clock outside a paused runtime). Decisions are
/// exact in this clock's time, which lags real time by less than one tick.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::CoarseClock;
/// use tower_sliding_window::{Limiter, Policy};
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
/// use tower_sliding_window::clock::{Clock, ManualClock};
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
        let by = saturating_nanos(by);
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

    const YEAR: Duration = Duration::from_secs(365 * 86_400);

    /// A paused tokio clock can be advanced past the 584 years a u64 of nanoseconds
    /// spans. The reading must then saturate, as `ManualClock` does and as the
    /// limiter's docs promise ("the limiter then sees time stand still instead of
    /// wrapping"), not wrap round to a few days and step back by 584 years.
    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_past_the_u64_range_stands_still_instead_of_wrapping() {
        let tokio_clock = TokioClock::new();
        let auto = AutoClock::for_bucket(Duration::from_secs(1));
        assert_eq!(auto.source(), TimeSource::Tokio);
        let limiter =
            crate::Limiter::builder(crate::Policy::per(1, Duration::from_secs(1)).unwrap())
                .clock(tokio_clock)
                .build::<u8>()
                .unwrap();

        tokio::time::advance(YEAR * 584).await;
        let (tokio_before, auto_before) = (tokio_clock.now_nanos(), auto.now_nanos());
        assert!(limiter.check(&1).is_allowed());
        assert!(!limiter.check(&1).is_allowed());

        tokio::time::advance(YEAR).await;
        assert!(
            tokio_clock.now_nanos() >= tokio_before,
            "TokioClock went back from {tokio_before} to {}",
            tokio_clock.now_nanos()
        );
        assert!(
            auto.now_nanos() >= auto_before,
            "AutoClock went back from {auto_before} to {}",
            auto.now_nanos()
        );
        // A year after the key's only unit its 1 s window has long passed: the
        // limiter, holding time at the end of its range, lets it through again.
        let d = limiter.check(&1);
        assert!(d.is_allowed(), "{d:?}");
    }

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

    #[tokio::test(start_paused = true)]
    async fn auto_clock_follows_a_paused_tokio_clock() {
        let clock = AutoClock::for_bucket(Duration::from_secs(1));
        assert_eq!(clock.source(), TimeSource::Tokio);
        let before = clock.now_nanos();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.now_nanos() - before, 5_000_000_000);
    }

    #[tokio::test]
    async fn auto_clock_in_a_running_tokio_clock_reads_the_coarse_clock() {
        let clock = AutoClock::for_bucket(Duration::from_secs(1));
        assert_eq!(clock.source(), TimeSource::Coarse);
    }

    #[test]
    fn auto_clock_never_rejects_a_policy_for_resolution() {
        let tick = CoarseClock::new().resolution();
        let wide = AutoClock::for_bucket(tick * AutoClock::COARSE_TICKS_PER_BUCKET);
        assert_eq!(wide.source(), TimeSource::Coarse);
        let narrow = AutoClock::for_bucket(
            tick * AutoClock::COARSE_TICKS_PER_BUCKET - Duration::from_nanos(1),
        );
        assert_eq!(narrow.source(), TimeSource::Precise);
        // The default builder picks the clock from the policy: a 15 ns bucket builds.
        let policy = crate::Policy::per(10, Duration::from_nanos(15)).unwrap();
        let built: Result<crate::Limiter<u8>, _> = crate::Limiter::builder(policy).build();
        assert_eq!(built.unwrap().clock().source(), TimeSource::Precise);
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

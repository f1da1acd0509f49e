//! The Redis store's circuit breaker: after a run of failures, or a timeout
//! during which Redis decided nothing, it stops asking Redis for a cool-down
//! and the store answers at once, as its
//! [`FailurePolicy`](super::FailurePolicy) says; then one probe finds out
//! whether Redis is back.

use crate::store::{StoreError, StoreErrorKind};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// When a [`RedisStore`](super::RedisStore) stops asking Redis, and for how
/// long: its circuit breaker, given to
/// [`RedisStoreBuilder::circuit_breaker`](super::RedisStoreBuilder::circuit_breaker).
///
/// The breaker **opens** after [`failures`](CircuitBreaker::failures) failed
/// calls in a row (connection refused or dropped, timeouts, error replies),
/// or at once when a call times out and Redis decided no call at all while it
/// waited: Redis (or the link to it) has then been silent for a whole
/// timeout, a stall that every call in flight waits out. Counting failures in
/// a row alone would see a stall late wherever few calls reach Redis (the
/// deny cache answers an over-limit key locally, and each call that does go
/// waits the timeout), so a stall is told by the silence instead: it opens
/// within one timeout of the first call that meets it.
/// While open, for a cool-down the store asks Redis nothing and answers every
/// decision at once as its [`FailurePolicy`](super::FailurePolicy) says
/// (unchecked, or a [`StoreError`] of the failure that opened it). When the
/// cool-down ends it is **half-open**: exactly one decision goes to Redis as a
/// probe while the others are still answered at once. A probe that Redis
/// decides **closes** it and resets the cool-down; a failed one opens it
/// again with the cool-down doubled, up to
/// [`max_cool_down`](CircuitBreaker::max_cool_down).
///
/// The default ([`CircuitBreaker::default`]): open after 5 failures in a row
/// (or a silent timeout), cool down 100 ms, doubling up to 2 s.
/// - 5: a restart that drops the calls in flight, or a timeout while Redis
///   goes on deciding other calls (one slow call), does not open it, while a
///   Redis that refuses connections takes 5 failures of a few microseconds
///   each. A silent timeout opens it whatever this number: every call that
///   waited through it failed too, and the next ones would wait as long.
/// - 100 ms: a short blip is probed again soon, so decisions resume within
///   about 100 ms of Redis' return.
/// - Doubling to 2 s: how long decisions stay unchecked (or refused) after
///   Redis returns is bounded by the cool-down in force, while a probe costs
///   one decision at most the timeout; 2 s keeps the first small and still
///   cuts a fleet's probes of a Redis that stays away to one per instance
///   every 2 s.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::redis::CircuitBreaker;
///
/// let breaker = CircuitBreaker::new(3, Duration::from_millis(50), Duration::from_secs(1));
/// assert_eq!(breaker.failures(), 3);
/// assert!(CircuitBreaker::OFF.is_off());
/// assert_eq!(CircuitBreaker::default().max_cool_down(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    failures: u32,
    cool_down: Duration,
    max_cool_down: Duration,
}

impl CircuitBreaker {
    /// Failures in a row that open the breaker by default: 5.
    pub const DEFAULT_FAILURES: u32 = 5;
    /// The first cool-down by default: 100 ms.
    pub const DEFAULT_COOL_DOWN: Duration = Duration::from_millis(100);
    /// The longest cool-down by default: 2 s.
    pub const DEFAULT_MAX_COOL_DOWN: Duration = Duration::from_secs(2);

    /// No breaker: every decision asks Redis and pays for its failure (at
    /// most the timeout).
    pub const OFF: CircuitBreaker = CircuitBreaker {
        failures: 0,
        cool_down: Duration::ZERO,
        max_cool_down: Duration::ZERO,
    };

    /// Open after `failures` failed calls in a row, or at a call's timeout
    /// during which Redis decided nothing (0 turns the breaker off), for
    /// `cool_down` at first, doubling after each failed probe up to
    /// `max_cool_down` (a maximum below `cool_down` means no doubling).
    /// [`build`](super::RedisStoreBuilder::build) rejects a zero `cool_down`.
    pub const fn new(failures: u32, cool_down: Duration, max_cool_down: Duration) -> Self {
        CircuitBreaker {
            failures,
            cool_down,
            max_cool_down,
        }
    }

    /// Failed calls in a row that open the breaker (0: off); a silent timeout
    /// opens it sooner.
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    /// The first cool-down after the breaker opens.
    pub const fn cool_down(&self) -> Duration {
        self.cool_down
    }

    /// The longest cool-down, reached by doubling after failed probes.
    pub const fn max_cool_down(&self) -> Duration {
        self.max_cool_down
    }

    /// Whether this is no breaker at all.
    pub const fn is_off(&self) -> bool {
        self.failures == 0
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker::new(
            CircuitBreaker::DEFAULT_FAILURES,
            CircuitBreaker::DEFAULT_COOL_DOWN,
            CircuitBreaker::DEFAULT_MAX_COOL_DOWN,
        )
    }
}

/// Where a [`RedisStore`](super::RedisStore)'s circuit breaker stands, in
/// [`RedisStoreStats::breaker`](super::RedisStoreStats::breaker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum BreakerState {
    /// Decisions go to Redis.
    #[default]
    Closed,
    /// Redis failed: decisions are answered at once, per the failure policy,
    /// until the cool-down ends.
    Open,
    /// The cool-down has ended and one probe is on its way to Redis; the
    /// other decisions are still answered at once.
    HalfOpen,
    /// The store has no breaker ([`CircuitBreaker::OFF`]).
    Off,
}

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const STATE_BITS: u32 = 2;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
/// How stale the time of the last success may be: a timeout is silent only
/// if no call succeeded after it was sent, so a success recorded this much
/// early can only make a silent timeout of one that was nearly so.
const SUCCESS_RESOLUTION_US: u64 = 100;

/// What the breaker says about a decision.
pub(crate) enum Admit {
    /// Closed: ask Redis.
    Ask,
    /// This decision is the half-open probe: ask Redis, and report the
    /// outcome through [`Probe`].
    Probe,
    /// Open: answer at once. The cool-down has this long to go.
    Refuse { remaining: Duration },
}

/// The breaker's state machine. The closed state costs a decision one atomic
/// load; everything else is off that path.
pub(crate) struct Breaker {
    threshold: u32,
    base_us: u64,
    max_us: u64,
    origin: Instant,
    /// The state in the low bits and, while open, the end of the cool-down
    /// (µs since `origin`) above them: one word, so that whoever sees "open"
    /// sees its deadline too.
    word: AtomicU64,
    /// Failed decisions since the last success.
    in_a_row: AtomicU32,
    /// When Redis last decided a call, in µs since `origin` (written at most
    /// once per [`SUCCESS_RESOLUTION_US`], so that a store under load does
    /// not write this line on every decision).
    last_success_us: AtomicU64,
    /// The cool-down of the current (or last) opening, in µs.
    cool_down_us: AtomicU64,
    /// When it last opened from closed, in µs since `origin`.
    opened_at_us: AtomicU64,
    /// The failure that opened it (or failed the last probe).
    cause: RwLock<Option<StoreError>>,
    pub(crate) opens: AtomicU64,
    pub(crate) probes: AtomicU64,
    pub(crate) answered: AtomicU64,
}

impl Breaker {
    /// `None` for [`CircuitBreaker::OFF`].
    pub(crate) fn new(settings: CircuitBreaker) -> Option<Breaker> {
        if settings.is_off() {
            return None;
        }
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX >> STATE_BITS);
        let base_us = micros(settings.cool_down).max(1);
        Some(Breaker {
            threshold: settings.failures,
            base_us,
            max_us: micros(settings.max_cool_down).max(base_us),
            origin: Instant::now(),
            word: AtomicU64::new(CLOSED),
            in_a_row: AtomicU32::new(0),
            last_success_us: AtomicU64::new(0),
            cool_down_us: AtomicU64::new(base_us),
            opened_at_us: AtomicU64::new(0),
            cause: RwLock::new(None),
            opens: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            answered: AtomicU64::new(0),
        })
    }

    fn now_us(&self) -> u64 {
        self.us(Instant::now())
    }

    /// `at` in µs since `origin` (0 before it).
    fn us(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_micros())
            .unwrap_or(u64::MAX >> STATE_BITS)
    }

    /// May this decision ask Redis? With `may_probe` false (a caller that
    /// cannot wait for Redis), a decision that would be the probe is told to
    /// ask without claiming the probe.
    #[inline]
    pub(crate) fn admit(&self, may_probe: bool) -> Admit {
        let word = self.word.load(Ordering::Acquire);
        if word == CLOSED {
            return Admit::Ask;
        }
        self.admit_open(word, may_probe)
    }

    #[cold]
    fn admit_open(&self, word: u64, may_probe: bool) -> Admit {
        let now = self.now_us();
        let until = word >> STATE_BITS;
        if word & STATE_MASK == OPEN && now >= until {
            if !may_probe {
                return Admit::Ask;
            }
            // One caller wins the probe; the others are answered at once.
            if self
                .word
                .compare_exchange(word, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.probes.fetch_add(1, Ordering::Relaxed);
                tracing::info!("Redis circuit breaker half-open: one decision probes Redis");
                return Admit::Probe;
            }
        }
        let remaining = if word & STATE_MASK == OPEN {
            Duration::from_micros(until.saturating_sub(now))
        } else {
            Duration::ZERO
        };
        Admit::Refuse { remaining }
    }

    /// The failure that opened the breaker, for a decision it answers.
    pub(crate) fn cause(&self) -> Option<StoreError> {
        self.cause.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_cause(&self, error: &StoreError) {
        *self.cause.write().unwrap_or_else(|e| e.into_inner()) = Some(error.clone());
    }

    pub(crate) fn state(&self) -> BreakerState {
        match self.word.load(Ordering::Acquire) & STATE_MASK {
            CLOSED => BreakerState::Closed,
            HALF_OPEN => BreakerState::HalfOpen,
            _ => BreakerState::Open,
        }
    }

    /// Redis decided a call that was not the probe.
    #[inline]
    pub(crate) fn succeeded(&self) {
        // Read first: a store under load must not write these lines on every decision.
        if self.in_a_row.load(Ordering::Relaxed) != 0 {
            self.in_a_row.store(0, Ordering::Relaxed);
        }
        self.note_success(self.now_us());
    }

    fn note_success(&self, now: u64) {
        if now >= self.last_success_us.load(Ordering::Relaxed) + SUCCESS_RESOLUTION_US {
            self.last_success_us.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// A call that was not the probe, sent at `sent`, failed with `error`.
    /// Failures of calls sent before the breaker opened change nothing while
    /// it is open. Whether it was a silent timeout (Redis decided no call
    /// while it waited).
    pub(crate) fn failed(&self, error: &StoreError, sent: Instant) -> bool {
        let in_a_row = self
            .in_a_row
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        // A timeout during which Redis decided nothing: a stall, not one slow call.
        let silent = error.kind() == StoreErrorKind::Timeout
            && self.last_success_us.load(Ordering::Relaxed) < self.us(sent);
        if (in_a_row < self.threshold && !silent) || self.word.load(Ordering::Acquire) != CLOSED {
            return silent;
        }
        // Before the state: whoever sees it open finds this cause.
        self.set_cause(error);
        let now = self.now_us();
        let cool_down = self.base_us;
        let open = OPEN | (now + cool_down) << STATE_BITS;
        if self
            .word
            .compare_exchange(CLOSED, open, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.cool_down_us.store(cool_down, Ordering::Relaxed);
            self.opened_at_us.store(now, Ordering::Relaxed);
            self.opens.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                kind = ?error.kind(),
                failures_in_a_row = in_a_row,
                silent_timeout = silent,
                cool_down = ?Duration::from_micros(cool_down),
                "Redis circuit breaker opened: decisions answered without Redis for the cool-down: {error}"
            );
        }
        silent
    }

    /// The probe's outcome: `None` when Redis decided it, else its failure.
    /// Only the probe's owner calls this, once, so no other transition races it.
    fn probed(&self, failure: Option<&StoreError>) {
        let now = self.now_us();
        match failure {
            None => {
                self.in_a_row.store(0, Ordering::Relaxed);
                self.note_success(now);
                self.cool_down_us.store(self.base_us, Ordering::Relaxed);
                self.word.store(CLOSED, Ordering::Release);
                let opened_at = self.opened_at_us.load(Ordering::Relaxed);
                tracing::info!(
                    open_for = ?Duration::from_micros(now.saturating_sub(opened_at)),
                    "Redis circuit breaker closed: Redis decided the probe"
                );
            }
            Some(error) => {
                self.set_cause(error);
                let cool_down = self
                    .cool_down_us
                    .load(Ordering::Relaxed)
                    .saturating_mul(2)
                    .min(self.max_us);
                self.cool_down_us.store(cool_down, Ordering::Relaxed);
                self.word
                    .store(OPEN | (now + cool_down) << STATE_BITS, Ordering::Release);
                tracing::warn!(
                    kind = ?error.kind(),
                    cool_down = ?Duration::from_micros(cool_down),
                    "Redis circuit breaker open again: the probe failed: {error}"
                );
            }
        }
    }

    /// The probe was dropped before Redis answered (its request went away):
    /// open with the cool-down over, so that the next decision probes.
    fn abandoned(&self) {
        let now = self.now_us();
        let _ = self.word.compare_exchange(
            HALF_OPEN,
            OPEN | now << STATE_BITS,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// The half-open probe in flight: reports its outcome once, or, dropped
/// without one, lets the next decision probe.
pub(crate) struct Probe<'a> {
    breaker: Option<&'a Breaker>,
}

impl<'a> Probe<'a> {
    pub(crate) fn new(breaker: &'a Breaker) -> Probe<'a> {
        Probe {
            breaker: Some(breaker),
        }
    }

    /// `None` when Redis decided the probe, else its failure.
    pub(crate) fn finish(mut self, failure: Option<&StoreError>) {
        if let Some(breaker) = self.breaker.take() {
            breaker.probed(failure);
        }
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker.take() {
            breaker.abandoned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> StoreError {
        StoreError::new(StoreErrorKind::ConnectionRefused, Duration::from_secs(1))
            .with_source("refused")
    }

    fn breaker(failures: u32, cool_down_ms: u64, max_ms: u64) -> Breaker {
        Breaker::new(CircuitBreaker::new(
            failures,
            Duration::from_millis(cool_down_ms),
            Duration::from_millis(max_ms),
        ))
        .expect("on")
    }

    /// Wait (bounded) until the open breaker lets a probe through.
    fn wait_for_probe(b: &Breaker) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Admit::Probe = b.admit(true) {
                return Instant::now();
            }
            assert!(Instant::now() < deadline, "no probe within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn off_is_no_breaker() {
        assert!(Breaker::new(CircuitBreaker::OFF).is_none());
        assert!(Breaker::new(CircuitBreaker::new(
            0,
            Duration::from_secs(1),
            Duration::from_secs(1)
        ))
        .is_none());
    }

    #[test]
    fn opens_after_the_run_and_a_success_breaks_the_run() {
        let b = breaker(3, 10_000, 10_000);
        assert!(!b.failed(&refused(), Instant::now()));
        assert!(!b.failed(&refused(), Instant::now()));
        b.succeeded();
        assert!(!b.failed(&refused(), Instant::now()));
        assert!(!b.failed(&refused(), Instant::now()));
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(matches!(b.admit(true), Admit::Ask));
        assert!(!b.failed(&refused(), Instant::now()));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.opens.load(Ordering::Relaxed), 1);
        match b.admit(true) {
            Admit::Refuse { remaining } => {
                assert!(remaining > Duration::from_secs(9), "{remaining:?}")
            }
            _ => panic!("an open breaker with 10 s to go must refuse"),
        }
        assert_eq!(
            b.cause().map(|e| e.kind()),
            Some(StoreErrorKind::ConnectionRefused)
        );
        // Late failures of decisions sent before it opened change nothing.
        b.failed(
            &StoreError::new(StoreErrorKind::Timeout, Duration::ZERO),
            Instant::now(),
        );
        assert_eq!(b.opens.load(Ordering::Relaxed), 1);
        assert_eq!(
            b.cause().map(|e| e.kind()),
            Some(StoreErrorKind::ConnectionRefused)
        );
    }

    #[test]
    fn a_timeout_during_which_redis_decided_nothing_opens_at_once() {
        let b = breaker(5, 10_000, 10_000);
        let timeout = StoreError::new(StoreErrorKind::Timeout, Duration::ZERO);
        // Sent, then Redis decided another call while it waited: one slow call.
        let sent = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
        b.succeeded();
        assert!(!b.failed(&timeout, sent));
        assert_eq!(b.state(), BreakerState::Closed);
        // Other failures that come back at once are counted in a row only.
        assert!(!b.failed(&refused(), Instant::now()));
        assert_eq!(b.state(), BreakerState::Closed);
        // Sent after the last success, timed out with no success since: silent.
        std::thread::sleep(Duration::from_millis(1));
        assert!(b.failed(&timeout, Instant::now()));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.opens.load(Ordering::Relaxed), 1);
        assert_eq!(b.cause().map(|e| e.kind()), Some(StoreErrorKind::Timeout));
    }

    #[test]
    fn a_silent_timeout_opens_even_a_breaker_of_many_failures() {
        let b = breaker(u32::MAX, 10_000, 10_000);
        let timeout = StoreError::new(StoreErrorKind::Timeout, Duration::ZERO);
        for _ in 0..100 {
            assert!(!b.failed(&refused(), Instant::now()));
        }
        assert_eq!(b.state(), BreakerState::Closed);
        b.failed(&timeout, Instant::now());
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn one_probe_then_closed_or_open_again_with_a_doubled_cool_down() {
        let b = breaker(1, 20, 50);
        let opened = Instant::now();
        assert!(!b.failed(&refused(), Instant::now()));
        // The clock is read in whole µs: allow a rounding below the cool-down.
        let probed = wait_for_probe(&b);
        assert!(probed - opened >= Duration::from_millis(19));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        // Exactly one probe: the others are answered at once, even for a caller
        // that could not probe.
        assert!(matches!(b.admit(true), Admit::Refuse { .. }));
        assert!(matches!(b.admit(false), Admit::Refuse { .. }));
        let timeout = StoreError::new(StoreErrorKind::Timeout, Duration::ZERO);
        let reopened = Instant::now();
        Probe::new(&b).finish(Some(&timeout));
        assert_eq!(b.state(), BreakerState::Open);
        assert_eq!(b.cause().map(|e| e.kind()), Some(StoreErrorKind::Timeout));
        assert_eq!(b.cool_down_us.load(Ordering::Relaxed), 40_000);
        assert!(wait_for_probe(&b) - reopened >= Duration::from_millis(39));
        Probe::new(&b).finish(Some(&timeout));
        // Doubled again, up to the maximum.
        assert_eq!(b.cool_down_us.load(Ordering::Relaxed), 50_000);
        wait_for_probe(&b);
        Probe::new(&b).finish(None);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.probes.load(Ordering::Relaxed), 3);
        // Closed resets the cool-down and the run.
        assert_eq!(b.cool_down_us.load(Ordering::Relaxed), 20_000);
        assert!(matches!(b.admit(true), Admit::Ask));
    }

    #[test]
    fn a_caller_that_cannot_probe_leaves_the_probe_to_the_next() {
        let b = breaker(1, 1, 1);
        assert!(!b.failed(&refused(), Instant::now()));
        std::thread::sleep(Duration::from_millis(5));
        assert!(matches!(b.admit(false), Admit::Ask));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(matches!(b.admit(true), Admit::Probe));
    }

    #[test]
    fn a_dropped_probe_lets_the_next_decision_probe() {
        let b = breaker(1, 1, 1000);
        assert!(!b.failed(&refused(), Instant::now()));
        wait_for_probe(&b);
        drop(Probe::new(&b));
        assert_eq!(b.state(), BreakerState::Open);
        assert!(matches!(b.admit(true), Admit::Probe));
    }
}

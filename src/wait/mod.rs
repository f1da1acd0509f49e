//! Bounded, fair waiting per key: a request over the limit queues behind the
//! key's earlier waiters and is admitted at the instant the policy allows.
//!
//! # How a key's queue runs
//!
//! Each key with waiters owns a FIFO queue (an entry in a concurrent map, removed
//! as soon as the queue is empty, so an idle key costs nothing). A request for a
//! key without waiters is a plain [`Limiter::check_n`]; a request that finds
//! waiters queues behind them even if its own cost would fit (no overtaking;
//! a request of cost 0 takes nothing from them and passes at once).
//!
//! Only the **head** of a queue (the oldest waiter not yet admitted) holds a
//! timer: it checks the limiter, and when denied sleeps until the decision's
//! `retry_after`, the exact instant its cost fits (with [`TokioClock`](crate::clock::TokioClock), the
//! limiter and the timer read the same clock). When it fits, the head admits
//! itself and every following waiter that fits at the same instant, in order, and
//! wakes them; the next waiter still over the limit becomes the head and arms its
//! own timer. So a waiter registers **at most one timer** (none when it is
//! admitted in a batch behind another head), and nothing ever polls in a loop.
//!
//! # The bound, decided at once
//!
//! With a `max_wait`, the queue keeps a forecast: a replay of the ring's strict
//! rule into the future, starting from the key's bucket counts and admitting every
//! queued cost in order as early as the policy allows. A newcomer's admission time
//! is the forecast's next step, so a request whose wait would exceed `max_wait` is
//! rejected **at once** (like Go's `WaitN`), with a [`Decision`] whose
//! `retry_after` is that wait; so is a request that finds `max_queue` waiters.
//!
//! **Exactness.** In [`Precision::Strict`](crate::Precision::Strict) mode, when the
//! queue is the key's only user (every request for the key goes through it), the
//! forecast is the admission instant the queue then produces: exactly on tokio's
//! paused clock when bucket boundaries fall on whole milliseconds (tokio's timers
//! round a deadline up to the next millisecond); on a running clock a waiter is
//! admitted when its timer fires, at most tokio's 1 ms timer resolution (plus
//! scheduling delay) later.
//! The forecast is amortised O(1) per request (O(N) for N buckets); it is rebuilt
//! from the ring, O(queue + N), after a cancellation or when an admission strays
//! from it (checks for the key from outside the queue, a late timer). In
//! [`Precision::Interpolated`](crate::Precision::Interpolated) mode the forecast
//! is the strict one, an upper bound (interpolation only ever admits earlier);
//! a newcomer with nobody ahead is held to `max_wait` by its exact wait. A
//! waiter whose turn comes later than its bound anyway (outside traffic) is
//! rejected when it reaches the head of its queue.
//!
//! # Several policies
//!
//! The tower layer's waiting modes ([`OnLimit::Wait`](crate::OnLimit::Wait)) wait
//! on all of a layer's policies at once, all-or-nothing: the forecast replays each
//! policy's window and admits a request at the earliest instant all of them
//! allow, and the head sleeps until the longest of the policies' waits.
//!
//! # Requirements and memory
//!
//! Waits are tokio timers, so they are exact when the limiter's clock is tokio's
//! ([`TokioClock`](crate::clock::TokioClock), as a waiting tower layer uses; [`AutoClock`]
//! in a paused runtime). With another monotonic clock a wait is measured as a
//! duration from that clock's reading, so it is never early; a clock that lags
//! (the coarse one) can make the head wake up to one of its ticks late, or check
//! once more and sleep again. As with any future, a waiter must be polled
//! for its queue to move: the head is the only waiter with a timer. A waiting
//! key costs one map entry holding its waiters (at most `max_queue`) and, with a
//! `max_wait`, a forecast of at most N + 1 buckets per policy; the entry is
//! removed when its last waiter leaves.
//!
//! # Cancellation
//!
//! Dropping an [`Acquire`] before its turn removes it from the queue (waking the
//! next head when it was the head); dropping it after it was admitted but before
//! it was polled gives its units back with [`Limiter::undo`], and the head is
//! woken to use them.

mod backpressure;
mod forecast;
mod queue;

pub use backpressure::Backpressure;

pub(crate) use forecast::fingerprint;
pub(crate) use queue::{release, release_unused, Denied, Gate, Queues, Reservation, Waiter};

use crate::clock::{AutoClock, Clock};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::ring::WindowSnapshot;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// How long, and behind how many others, a request may wait for its turn.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::WaitConfig;
///
/// let config = WaitConfig::bounded(Duration::from_secs(2), 64).unwrap();
/// assert_eq!(config.max_wait(), Some(Duration::from_secs(2)));
/// assert!(WaitConfig::bounded(Duration::from_secs(2), 0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitConfig {
    max_wait: Option<Duration>,
    max_queue: Option<usize>,
}

impl WaitConfig {
    /// Wait at most `max_wait`, behind at most `max_queue - 1` other waiters of
    /// the same key. `max_queue` must be at least 1. A `max_wait` too long to
    /// add to an `Instant` (say `Duration::MAX`) means no bound on the wait.
    pub fn bounded(max_wait: Duration, max_queue: usize) -> Result<WaitConfig, ConfigError> {
        if max_queue == 0 {
            return Err(ConfigError::ZeroMaxQueue);
        }
        Ok(WaitConfig {
            max_wait: Some(max_wait),
            max_queue: Some(max_queue),
        })
    }

    /// Wait as long as it takes, behind any number of waiters: for backpressure,
    /// where each waiter is a caller's own task and the caller bounds their number.
    pub fn unbounded() -> WaitConfig {
        WaitConfig {
            max_wait: None,
            max_queue: None,
        }
    }

    /// The longest wait accepted, if bounded.
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    /// The most waiters per key, if bounded.
    pub fn max_queue(&self) -> Option<usize> {
        self.max_queue
    }
}

/// Why a request was turned away instead of waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitRejectReason {
    /// The key already had `max_queue` waiters.
    QueueFull,
    /// Its turn would come later than `max_wait` from its arrival.
    WaitTooLong,
    /// Its cost is above the limit: it could never pass.
    CostExceedsLimit,
}

/// A request turned away at once rather than after waiting; `decision` is what
/// to report (its `retry_after` is the forecast wait when one was computed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitRejected {
    /// Why.
    pub reason: WaitRejectReason,
    /// The denial to report (headers, `Retry-After`).
    pub decision: Decision,
    /// Which of the gate's policies denied it (the tower layer names it in
    /// its response).
    pub(crate) policy: usize,
}

impl fmt::Display for WaitRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            WaitRejectReason::QueueFull => {
                f.write_str("rate limited: wait queue for this key is full")
            }
            WaitRejectReason::WaitTooLong => write!(
                f,
                "rate limited: the wait ({:?}) would exceed the maximum",
                self.decision.retry_after().unwrap_or_default()
            ),
            WaitRejectReason::CostExceedsLimit => {
                f.write_str("rate limited: the request costs more than the limit")
            }
        }
    }
}

impl std::error::Error for WaitRejected {}

/// Totals of the wait path, for tests, benchmarks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitStats {
    /// Admitted on arrival, without waiting.
    pub admitted_at_once: u64,
    /// Admitted after waiting in a queue.
    pub admitted_after_wait: u64,
    /// Turned away because the key's queue was full.
    pub rejected_queue_full: u64,
    /// Turned away because the wait would exceed `max_wait` (at arrival, or later
    /// when outside traffic delayed the turn).
    pub rejected_wait_too_long: u64,
    /// Waiters dropped before their turn.
    pub cancelled: u64,
    /// Admissions given back unused: waiters dropped before they were polled,
    /// or polled only after their units had left the window (they wait again,
    /// and their next admission counts again in `admitted_after_wait`).
    pub undone: u64,
    /// Timers (`tokio::time::Sleep`) created: at most one per waiter.
    pub timers_created: u64,
    /// Timers moved to another deadline (outside traffic or cancellations only).
    pub timers_reset: u64,
    /// Keys with a queue right now.
    pub keys_waiting: usize,
}

/// The waiting queues of one limiter: FIFO per key, bounded by a [`WaitConfig`].
///
/// Share it in an `Arc`; [`acquire`](WaitQueues::acquire) returns a future that
/// resolves when the request's turn has come.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_sliding_window::wait::WaitQueues;
/// use tower_sliding_window::{Limiter, Policy, WaitConfig};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 2 per 1.5 s.
/// let limiter = Arc::new(Limiter::new(Policy::per(2, Duration::from_millis(1500)).unwrap()).unwrap());
/// let queues = Arc::new(WaitQueues::new(limiter, WaitConfig::bounded(Duration::from_secs(5), 16).unwrap()));
///
/// let start = tokio::time::Instant::now();
/// queues.acquire("alice", 1).await.unwrap();
/// queues.acquire("alice", 1).await.unwrap();
/// // The third waits until the first units leave the window, 1.5 s after them
/// // (to a step of their bucket), at the timer's next millisecond.
/// let third = queues.acquire("alice", 1);
/// assert_eq!(third.expected_admission(), Some(start + Duration::from_millis(1501)));
/// third.await.unwrap();
/// assert_eq!(tokio::time::Instant::now(), start + Duration::from_millis(1501));
/// # }
/// ```
pub struct WaitQueues<K, C = AutoClock> {
    limiter: Arc<Limiter<K, C>>,
    queues: Queues<K, Decision>,
}

impl<K, C> WaitQueues<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// Queues in front of `limiter`, bounded by `config`.
    pub fn new(limiter: Arc<Limiter<K, C>>, config: WaitConfig) -> Self {
        WaitQueues {
            limiter,
            queues: Queues::new(config),
        }
    }

    /// The limiter the queues admit through.
    pub fn limiter(&self) -> &Arc<Limiter<K, C>> {
        &self.limiter
    }

    /// The bounds.
    pub fn config(&self) -> WaitConfig {
        self.queues.config()
    }

    /// Totals so far.
    pub fn stats(&self) -> WaitStats {
        self.queues.stats()
    }

    /// Ask for `cost` units of `key`. The request joins the key's queue now (so
    /// arrival order is the order of `acquire` calls), or is admitted or rejected
    /// now; the returned future resolves to the admitted [`Decision`] when its
    /// turn comes. Dropping the future cancels the request.
    pub fn acquire(self: &Arc<Self>, key: K, cost: u32) -> Acquire<K, C> {
        Acquire {
            waiter: Waiter::new(Arc::clone(self), key, cost),
        }
    }

    /// Give back the units of an admitted `decision` for `key` (a request admitted
    /// but never sent) and let the key's waiters use them at once.
    pub fn release(&self, key: &K, decision: &Decision) {
        release(self, key, decision)
    }
}

impl<K, C> Gate<K> for WaitQueues<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    type Admitted = Decision;

    fn queues(&self) -> &Queues<K, Decision> {
        &self.queues
    }

    fn try_admit(&self, key: &K, cost: u32) -> Result<Decision, Denied> {
        let decision = self.limiter.check_n(key, cost);
        if decision.is_allowed() {
            Ok(decision)
        } else {
            Err(Denied {
                policy: 0,
                decision,
                gave_back: false,
            })
        }
    }

    fn give_back(&self, key: &K, admitted: &Decision) {
        self.limiter.undo(key, admitted)
    }

    fn fingerprint(&self, admitted: &Decision) -> u64 {
        fingerprint(std::iter::once(admitted.slot))
    }

    fn is_current(&self, admitted: &Decision) -> bool {
        self.limiter.is_current(admitted)
    }

    fn spend(&self, key: &K, admitted: &Decision) -> bool {
        self.limiter.spend(key, admitted)
    }

    fn windows(&self, key: &K) -> Vec<WindowSnapshot> {
        vec![self.limiter.window_snapshot(key)]
    }
}

impl<K, C> fmt::Debug for WaitQueues<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitQueues")
            .field("config", &self.config())
            .field("keys_waiting", &self.stats().keys_waiting)
            .finish_non_exhaustive()
    }
}

/// A request's place in its key's queue; resolves to the admitted [`Decision`],
/// or to a [`WaitRejected`] decided at once. Dropping it before it resolves
/// leaves the queue and gives back any units it was admitted with.
#[must_use = "a waiter does nothing unless polled, and leaves its queue when dropped"]
pub struct Acquire<K, C = AutoClock>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    waiter: Waiter<K, WaitQueues<K, C>, Decision>,
}

impl<K, C> Acquire<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    /// The instant the forecast admits this request (see the module docs for how
    /// exact it is): `None` when it was decided on arrival or the wait is unbounded.
    pub fn expected_admission(&self) -> Option<Instant> {
        self.waiter.expected_admission()
    }

    /// True while the request waits in its queue.
    pub fn is_waiting(&self) -> bool {
        self.waiter.is_waiting()
    }

    /// The key waited for.
    pub fn key(&self) -> &K {
        self.waiter.key()
    }
}

impl<K, C> Future for Acquire<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    type Output = Result<Decision, WaitRejected>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.waiter).poll(cx)
    }
}

impl<K, C> fmt::Debug for Acquire<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Debug + 'static,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("key", self.key())
            .field("waiting", &self.is_waiting())
            .field("expected_admission", &self.expected_admission())
            .finish()
    }
}

//! Bounded, fair waiting per key: a request over the limit queues behind the
//! key's earlier waiters and is admitted at the instant the policy allows.
//!
//! # How a key's queue runs
//!
//! Each key with waiters owns a FIFO queue (an entry in a concurrent map, removed
//! as soon as the queue is empty, so an idle key costs nothing). A request for a
//! key without waiters is a plain [`Limiter::check_n`]; a request that finds
//! waiters queues behind them even if its own cost would fit (no overtaking).
//!
//! Only the **head** of a queue (the oldest waiter not yet admitted) holds a
//! timer: it checks the limiter, and when denied sleeps until the decision's
//! `retry_after`, the exact instant its cost fits ([`TokioClock`] follows tokio's
//! clock, so the limiter and the timer agree). When it fits, the head admits
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
//! round a deadline up to the next millisecond); on a running clock a waiter is admitted when its timer
//! fires, at most tokio's 1 ms timer resolution (plus scheduling delay) later.
//! The forecast is amortised O(1) per request (O(N) for N buckets); it is rebuilt
//! from the ring, O(queue + N), after a cancellation or when an admission strays
//! from it (checks for the key from outside the queue, a late timer). In
//! [`Precision::Interpolated`](crate::Precision::Interpolated) mode the forecast
//! is the strict one, an upper bound. A waiter whose turn comes later than its
//! bound anyway (outside traffic) is rejected when it reaches the head of its
//! queue.
//!
//! # Cancellation
//!
//! Dropping an [`Acquire`] before its turn removes it from the queue (waking the
//! next head when it was the head); dropping it after it was admitted but before
//! it was polled gives its units back with [`Limiter::undo`], and the head is
//! woken to use them.

use crate::clock::{Clock, TokioClock};
use crate::decision::{Decision, Outcome};
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::ring::Geometry;
use dashmap::DashMap;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

type Hasher = foldhash::fast::RandomState;

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
    /// the same key. `max_queue` must be at least 1.
    pub fn bounded(max_wait: Duration, max_queue: usize) -> Result<WaitConfig, ConfigError> {
        if max_queue == 0 {
            return Err(ConfigError::Invalid(
                "max_queue must be at least 1 (to never wait, reject instead)",
            ));
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
pub struct WaitRejected {
    /// Why.
    pub reason: WaitRejectReason,
    /// The denial to report (headers, `Retry-After`).
    pub decision: Decision,
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
    /// Admitted waiters dropped before they were polled (their units given back).
    pub undone: u64,
    /// Timers (`tokio::time::Sleep`) created: at most one per waiter.
    pub timers_created: u64,
    /// Timers moved to another deadline (outside traffic or cancellations only).
    pub timers_reset: u64,
    /// Keys with a queue right now.
    pub keys_waiting: usize,
}

#[derive(Default)]
struct Counters {
    admitted_at_once: AtomicU64,
    admitted_after_wait: AtomicU64,
    rejected_queue_full: AtomicU64,
    rejected_wait_too_long: AtomicU64,
    cancelled: AtomicU64,
    undone: AtomicU64,
    timers_created: AtomicU64,
    timers_reset: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

/// The waiting queues of one limiter: FIFO per key, bounded by a [`WaitConfig`].
///
/// Share it in an `Arc`; [`acquire`](WaitQueues::acquire) returns a future that
/// resolves when the request's turn has come.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_sliding_window::{Limiter, Policy, WaitConfig, WaitQueues};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 2 per 1.5 s in 15 buckets of 100 ms.
/// let limiter = Arc::new(Limiter::new(Policy::per(2, Duration::from_millis(1500)).unwrap()).unwrap());
/// let queues = Arc::new(WaitQueues::new(limiter, WaitConfig::bounded(Duration::from_secs(5), 16).unwrap()));
///
/// let start = tokio::time::Instant::now();
/// queues.acquire("alice", 1).await.unwrap();
/// queues.acquire("alice", 1).await.unwrap();
/// // The third waits until the first units leave the window: 1.5 s plus one bucket.
/// let third = queues.acquire("alice", 1);
/// assert_eq!(third.expected_admission(), Some(start + Duration::from_millis(1600)));
/// third.await.unwrap();
/// assert_eq!(tokio::time::Instant::now(), start + Duration::from_millis(1600));
/// # }
/// ```
pub struct WaitQueues<K, C = TokioClock> {
    limiter: Arc<Limiter<K, C>>,
    config: WaitConfig,
    queues: DashMap<K, KeyQueue, Hasher>,
    counters: Counters,
}

/// One key's waiters, oldest first. Admitted entries that their futures have not
/// yet collected form a prefix of the waiting order (admission is FIFO), but may
/// linger anywhere until polled; `entries` is sorted by id.
#[derive(Default)]
struct KeyQueue {
    entries: VecDeque<Entry>,
    next_id: u64,
    /// Entries in `State::Waiting`.
    waiting: usize,
    forecast: Option<Forecast>,
}

struct Entry {
    id: u64,
    cost: u32,
    state: State,
    waker: Option<Waker>,
    /// The slot the forecast admits this waiter in, to notice when reality strays.
    forecast_slot: Option<u64>,
    /// Past this instant the waiter is rejected rather than admitted.
    give_up_at: Option<Instant>,
}

#[derive(Clone, Copy)]
enum State {
    Waiting,
    Admitted(Decision),
}

impl KeyQueue {
    fn position(&self, id: u64) -> Option<usize> {
        self.entries.binary_search_by_key(&id, |e| e.id).ok()
    }

    fn head(&self) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| matches!(e.state, State::Waiting))
    }

    /// Take the head's waker, so it runs the queue again (units freed, or the
    /// former head left).
    fn head_waker(&mut self) -> Option<Waker> {
        let h = self.head()?;
        self.entries[h].waker.take()
    }
}

/// The ring's strict rule replayed into the future: what the key's window will
/// hold once every queued waiter has been admitted, in order, as early as allowed.
struct Forecast {
    /// Slot and clock time (ns) of the latest forecast admission.
    slot: u64,
    at: u64,
    /// Non-empty buckets still in the window at `slot`, oldest first: (slot, units).
    buckets: VecDeque<(u64, u64)>,
    used: u64,
}

impl Forecast {
    fn from_counts(slot: u64, counts: &[u64], now: u64) -> Forecast {
        let buckets: VecDeque<(u64, u64)> = counts
            .iter()
            .enumerate()
            .rev()
            .filter(|&(_, &c)| c > 0)
            .map(|(age, &c)| (slot - (age as u64).min(slot), c))
            .collect();
        Forecast {
            slot,
            at: now,
            used: buckets.iter().map(|b| b.1).sum(),
            buckets,
        }
    }

    /// When `cost` more units would be admitted (slot, clock ns), no earlier than
    /// `now` and than the forecast's latest admission. Nothing is changed.
    fn next(&self, g: &Geometry, cost: u32, now: u64) -> (u64, u64) {
        let (n, limit) = (g.buckets(), g.limit() as u64);
        let now_slot = g.slot(now);
        let (mut slot, mut at) = if now_slot > self.slot {
            (now_slot, now)
        } else {
            (self.slot, self.at.max(now))
        };
        let mut used = self.used;
        let mut live = self.buckets.iter();
        let mut oldest = live.next();
        loop {
            while let Some(&(x, c)) = oldest {
                if x + n >= slot {
                    break;
                }
                used -= c;
                oldest = live.next();
            }
            match oldest {
                Some(&(x, _)) if used + cost as u64 > limit => {
                    // Wait for the oldest bucket to leave the window.
                    slot = x + n + 1;
                    at = slot.saturating_mul(g.width());
                }
                _ => return (slot, at),
            }
        }
    }

    /// Record `cost` units admitted at `slot` (from [`Forecast::next`]).
    fn commit(&mut self, g: &Geometry, cost: u32, (slot, at): (u64, u64)) {
        let n = g.buckets();
        while let Some(&(x, c)) = self.buckets.front() {
            if x + n >= slot {
                break;
            }
            self.used -= c;
            self.buckets.pop_front();
        }
        match self.buckets.back_mut() {
            Some((x, c)) if *x == slot => *c += cost as u64,
            _ => self.buckets.push_back((slot, cost as u64)),
        }
        self.used += cost as u64;
        self.slot = slot;
        self.at = at;
    }
}

/// What one poll of a waiter found.
enum Step {
    Ready(Result<Decision, WaitRejected>),
    Pending,
    SleepUntil(Instant),
}

impl<K, C> WaitQueues<K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Queues in front of `limiter`, bounded by `config`.
    pub fn new(limiter: Arc<Limiter<K, C>>, config: WaitConfig) -> Self {
        WaitQueues {
            limiter,
            config,
            queues: DashMap::with_hasher(Hasher::default()),
            counters: Counters::default(),
        }
    }

    /// The limiter the queues admit through.
    pub fn limiter(&self) -> &Arc<Limiter<K, C>> {
        &self.limiter
    }

    /// The bounds.
    pub fn config(&self) -> WaitConfig {
        self.config
    }

    /// Totals so far.
    pub fn stats(&self) -> WaitStats {
        let c = &self.counters;
        WaitStats {
            admitted_at_once: c.admitted_at_once.load(Relaxed),
            admitted_after_wait: c.admitted_after_wait.load(Relaxed),
            rejected_queue_full: c.rejected_queue_full.load(Relaxed),
            rejected_wait_too_long: c.rejected_wait_too_long.load(Relaxed),
            cancelled: c.cancelled.load(Relaxed),
            undone: c.undone.load(Relaxed),
            timers_created: c.timers_created.load(Relaxed),
            timers_reset: c.timers_reset.load(Relaxed),
            keys_waiting: self.queues.len(),
        }
    }

    /// Ask for `cost` units of `key`. The request joins the key's queue now (so
    /// arrival order is the order of `acquire` calls), or is admitted or rejected
    /// now; the returned future resolves to the admitted [`Decision`] when its
    /// turn comes. Dropping the future cancels the request.
    pub fn acquire(self: &Arc<Self>, key: K, cost: u32) -> Acquire<K, C> {
        let state = self.enqueue(&key, cost);
        Acquire {
            queues: Arc::clone(self),
            key,
            state,
        }
    }

    /// Give back the units of an admitted `decision` for `key` (a request admitted
    /// but never sent) and let the key's waiters use them at once.
    pub fn release(&self, key: &K, decision: &Decision) {
        self.limiter.undo(key, decision);
        let wake = self.queues.get_mut(key).and_then(|mut q| {
            q.forecast = None;
            q.head_waker()
        });
        if let Some(w) = wake {
            w.wake();
        }
    }

    fn enqueue(&self, key: &K, cost: u32) -> AcquireState {
        // Fast path: no queue for this key, so a plain check decides.
        if !self.queues.contains_key(key) {
            let d = self.limiter.check_n(key, cost);
            if d.outcome() != Outcome::Denied {
                return self.decided(d);
            }
        }
        let g = *self.limiter.geometry();
        let mut q = self.queues.entry(key.clone()).or_default();
        if q.waiting == 0 {
            // Re-check under the queue's lock: a head may have just left.
            let d = self.limiter.check_n(key, cost);
            if d.outcome() != Outcome::Denied {
                drop(q);
                self.remove_if_idle(key);
                return self.decided(d);
            }
            q.forecast = None;
        } else if cost > g.limit() {
            let d = self.limiter.peek(key, cost);
            return self.decided(d);
        }
        let now = Instant::now();
        let now_nanos = self.limiter.clock().now_nanos();
        let mut expected = None;
        if let Some(max_wait) = self.config.max_wait {
            let next = self
                .forecast(key, &mut q, now_nanos)
                .next(&g, cost, now_nanos);
            let wait = Duration::from_nanos(next.1.saturating_sub(now_nanos));
            if q.waiting >= self.config.max_queue.unwrap_or(usize::MAX) {
                bump(&self.counters.rejected_queue_full);
                return self.rejected(key, cost, WaitRejectReason::QueueFull, wait);
            }
            if wait > max_wait {
                bump(&self.counters.rejected_wait_too_long);
                drop(q);
                self.remove_if_idle(key);
                return self.rejected(key, cost, WaitRejectReason::WaitTooLong, wait);
            }
            if let Some(forecast) = q.forecast.as_mut() {
                forecast.commit(&g, cost, next);
            }
            expected = Some((now + wait, next.0));
        } else if q.waiting >= self.config.max_queue.unwrap_or(usize::MAX) {
            bump(&self.counters.rejected_queue_full);
            let wait = self
                .limiter
                .peek(key, cost)
                .retry_after()
                .unwrap_or_default();
            return self.rejected(key, cost, WaitRejectReason::QueueFull, wait);
        }
        let id = q.next_id;
        q.next_id += 1;
        q.waiting += 1;
        q.entries.push_back(Entry {
            id,
            cost,
            state: State::Waiting,
            waker: None,
            forecast_slot: expected.map(|e| e.1),
            give_up_at: self.config.max_wait.map(|m| now + m),
        });
        AcquireState::Waiting {
            id,
            sleep: None,
            expected: expected.map(|e| e.0),
        }
    }

    /// The queue's forecast, rebuilt from the ring and the waiters when invalid.
    fn forecast<'q>(&self, key: &K, q: &'q mut KeyQueue, now: u64) -> &'q Forecast {
        let g = self.limiter.geometry();
        q.forecast.get_or_insert_with(|| {
            let (slot, counts) = self.limiter.counts_by_age(key, now);
            let mut f = Forecast::from_counts(slot, &counts, now);
            for e in q.entries.iter_mut() {
                if matches!(e.state, State::Waiting) {
                    let next = f.next(g, e.cost, now);
                    f.commit(g, e.cost, next);
                    e.forecast_slot = Some(next.0);
                }
            }
            f
        })
    }

    /// A request decided on arrival: admitted, or a cost that can never pass.
    fn decided(&self, d: Decision) -> AcquireState {
        if d.is_allowed() {
            bump(&self.counters.admitted_at_once);
            AcquireState::Done(Ok(d))
        } else {
            AcquireState::Done(Err(WaitRejected {
                reason: WaitRejectReason::CostExceedsLimit,
                decision: d,
            }))
        }
    }

    fn rejected(
        &self,
        key: &K,
        cost: u32,
        reason: WaitRejectReason,
        wait: Duration,
    ) -> AcquireState {
        let mut decision = self.limiter.peek(key, cost);
        decision.outcome = Outcome::Denied;
        decision.retry_after = wait.max(Duration::from_nanos(1));
        AcquireState::Done(Err(WaitRejected { reason, decision }))
    }

    fn remove_if_idle(&self, key: &K) {
        self.queues.remove_if(key, |_, q| q.entries.is_empty());
    }

    /// Poll waiter `id` of `key`: collect its admission, or, at the head, admit
    /// everyone who fits now and say until when to sleep.
    fn poll_waiter(&self, key: &K, id: u64, cx: &mut Context<'_>) -> Step {
        let mut wake: Vec<Waker> = Vec::new();
        let step = match self.queues.get_mut(key) {
            Some(mut q) => self.step(key, &mut q, id, cx, &mut wake),
            None => Step::Ready(Err(self.lost(key))),
        };
        if matches!(step, Step::Ready(_)) {
            self.remove_if_idle(key);
        }
        for w in wake {
            w.wake();
        }
        step
    }

    fn step(
        &self,
        key: &K,
        q: &mut KeyQueue,
        id: u64,
        cx: &mut Context<'_>,
        wake: &mut Vec<Waker>,
    ) -> Step {
        let Some(i) = q.position(id) else {
            return Step::Ready(Err(self.lost(key)));
        };
        match q.entries[i].state {
            State::Admitted(d) => {
                q.entries.remove(i);
                return Step::Ready(Ok(d));
            }
            State::Waiting => {}
        }
        if q.head() != Some(i) {
            set_waker(&mut q.entries[i].waker, cx);
            return Step::Pending;
        }
        let denial = self.pump(key, q, id, wake);
        if let State::Admitted(d) = q.entries[i].state {
            q.entries.remove(i);
            return Step::Ready(Ok(d));
        }
        let Some(d) = denial else {
            // Unreachable: the head was neither admitted nor denied.
            return Step::Ready(Err(self.lost(key)));
        };
        let now = Instant::now();
        let (deadline, give_up) = match d.retry_after() {
            Some(wait) => {
                let deadline = now + wait;
                let late = q.entries[i].give_up_at.is_some_and(|g| deadline > g);
                (deadline, late.then_some(WaitRejectReason::WaitTooLong))
            }
            None => (now, Some(WaitRejectReason::CostExceedsLimit)),
        };
        if let Some(reason) = give_up {
            // Its turn would come too late after all (outside traffic): give up now.
            if reason == WaitRejectReason::WaitTooLong {
                bump(&self.counters.rejected_wait_too_long);
            }
            q.entries.remove(i);
            q.waiting -= 1;
            q.forecast = None;
            wake.extend(q.head_waker());
            return Step::Ready(Err(WaitRejected {
                reason,
                decision: d,
            }));
        }
        set_waker(&mut q.entries[i].waker, cx);
        Step::SleepUntil(deadline)
    }

    /// Admit waiting entries in order while they fit; the first that does not is
    /// the head, and its denial is returned. Wakes whoever must act (except `me`).
    fn pump(&self, key: &K, q: &mut KeyQueue, me: u64, wake: &mut Vec<Waker>) -> Option<Decision> {
        let KeyQueue {
            entries,
            waiting,
            forecast,
            ..
        } = q;
        for e in entries.iter_mut() {
            if !matches!(e.state, State::Waiting) {
                continue;
            }
            let d = self.limiter.check_n(key, e.cost);
            if e.id != me {
                wake.extend(e.waker.take());
            }
            if !d.is_allowed() {
                return Some(d);
            }
            if e.forecast_slot.is_some_and(|s| s != d.slot) {
                *forecast = None;
            }
            e.state = State::Admitted(d);
            *waiting -= 1;
            bump(&self.counters.admitted_after_wait);
        }
        *forecast = None;
        None
    }

    /// Remove waiter `id` (its future was dropped), giving back admitted units.
    fn cancel(&self, key: &K, id: u64) {
        let mut wake = None;
        if let Some(mut q) = self.queues.get_mut(key) {
            if let Some(i) = q.position(id) {
                let was_head = q.head() == Some(i);
                let entry = q.entries.remove(i);
                match entry.map(|e| e.state) {
                    Some(State::Admitted(d)) => {
                        self.limiter.undo(key, &d);
                        bump(&self.counters.undone);
                        q.forecast = None;
                        wake = q.head_waker();
                    }
                    Some(State::Waiting) => {
                        bump(&self.counters.cancelled);
                        q.waiting -= 1;
                        q.forecast = None;
                        if was_head {
                            wake = q.head_waker();
                        }
                    }
                    _ => {}
                }
            }
        }
        self.remove_if_idle(key);
        if let Some(w) = wake {
            w.wake();
        }
    }

    /// A waiter whose queue entry is gone: cannot happen while the queue's
    /// invariants hold; answered with a rejection rather than a panic.
    fn lost(&self, key: &K) -> WaitRejected {
        let mut decision = self.limiter.peek(key, 1);
        decision.outcome = Outcome::Denied;
        WaitRejected {
            reason: WaitRejectReason::WaitTooLong,
            decision,
        }
    }
}

impl<K: Hash + Eq, C> fmt::Debug for WaitQueues<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitQueues")
            .field("config", &self.config)
            .field("keys_waiting", &self.queues.len())
            .finish_non_exhaustive()
    }
}

fn set_waker(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

enum AcquireState {
    Done(Result<Decision, WaitRejected>),
    Waiting {
        id: u64,
        /// Armed only while this waiter is the head and over the limit.
        sleep: Option<Pin<Box<Sleep>>>,
        expected: Option<Instant>,
    },
}

/// A request's place in its key's queue; resolves to the admitted [`Decision`],
/// or to a [`WaitRejected`] decided at once. Dropping it before it resolves
/// leaves the queue and gives back any units it was admitted with.
#[must_use = "a waiter does nothing unless polled, and leaves its queue when dropped"]
pub struct Acquire<K, C = TokioClock>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    queues: Arc<WaitQueues<K, C>>,
    key: K,
    state: AcquireState,
}

impl<K: Hash + Eq + Clone, C: Clock> Acquire<K, C> {
    /// The instant the forecast admits this request (see the module docs for how
    /// exact it is): `None` when it was decided on arrival or the wait is unbounded.
    pub fn expected_admission(&self) -> Option<Instant> {
        match self.state {
            AcquireState::Waiting { expected, .. } => expected,
            AcquireState::Done(_) => None,
        }
    }

    /// The outcome when it was decided on arrival.
    pub(crate) fn decided(&self) -> Option<Result<Decision, WaitRejected>> {
        match self.state {
            AcquireState::Done(result) => Some(result),
            AcquireState::Waiting { .. } => None,
        }
    }

    /// True while the request waits in its queue.
    pub fn is_waiting(&self) -> bool {
        matches!(self.state, AcquireState::Waiting { .. })
    }

    /// The key waited for.
    pub fn key(&self) -> &K {
        &self.key
    }
}

// No field is structurally pinned: the timer is boxed.
impl<K: Hash + Eq + Clone, C: Clock> Unpin for Acquire<K, C> {}

impl<K: Hash + Eq + Clone, C: Clock> Future for Acquire<K, C> {
    type Output = Result<Decision, WaitRejected>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            let (id, sleep) = match &mut this.state {
                AcquireState::Done(result) => return Poll::Ready(*result),
                AcquireState::Waiting { id, sleep, .. } => (*id, sleep),
            };
            match this.queues.poll_waiter(&this.key, id, cx) {
                Step::Ready(result) => {
                    this.state = AcquireState::Done(result);
                    return Poll::Ready(result);
                }
                Step::Pending => return Poll::Pending,
                Step::SleepUntil(deadline) => {
                    let timer = match sleep {
                        Some(timer) => {
                            if timer.deadline() != deadline {
                                bump(&this.queues.counters.timers_reset);
                                timer.as_mut().reset(deadline);
                            }
                            timer
                        }
                        None => {
                            bump(&this.queues.counters.timers_created);
                            sleep.insert(Box::pin(tokio::time::sleep_until(deadline)))
                        }
                    };
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

impl<K: Hash + Eq + Clone, C: Clock> Drop for Acquire<K, C> {
    fn drop(&mut self) {
        if let AcquireState::Waiting { id, .. } = self.state {
            self.queues.cancel(&self.key, id);
        }
    }
}

impl<K: Hash + Eq + Clone + fmt::Debug, C: Clock> fmt::Debug for Acquire<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("key", &self.key)
            .field("waiting", &self.is_waiting())
            .field("expected_admission", &self.expected_admission())
            .finish()
    }
}

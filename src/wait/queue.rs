//! The per-key FIFO queues and the waiter future, generic over the [`Gate`] they
//! admit through (one limiter, or the layer's policies all-or-nothing).
//!
//! Invariants, per key, under the map's shard lock:
//! - `entries` is sorted by id (arrival order); `waiting` counts the entries in
//!   `State::Waiting`; admitted entries not yet collected precede every waiting
//!   one (admission is FIFO) but may linger until their future is polled.
//! - The head (first waiting entry) is the only one that runs the queue: it
//!   checks the gate, admits every entry that fits in order, and sleeps until
//!   its own cost fits. Whoever removes or frees something wakes the head.
//! - A key's entry is removed from the map as soon as `entries` is empty.

use super::forecast::Forecast;
use super::{WaitConfig, WaitRejectReason, WaitRejected, WaitStats};
use crate::decision::Decision;
use crate::ring::WindowSnapshot;
use crate::stats::bump;
use dashmap::DashMap;
use std::collections::VecDeque;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

type Hasher = foldhash::fast::RandomState;

/// What a queue admits through.
pub(crate) trait Gate<K>: Send + Sync + 'static {
    /// What an admission holds: the decisions to report and to give back.
    type Admitted: Copy + Send + Sync + 'static;

    /// The queues of this gate.
    fn queues(&self) -> &Queues<K, Self::Admitted>;

    /// Check every policy now, all-or-nothing: the admission, or the denial that
    /// holds the request back longest.
    fn try_admit(&self, key: &K, cost: u32) -> Result<Self::Admitted, Denied>;

    /// Give back what an admission counted.
    fn give_back(&self, key: &K, admitted: &Self::Admitted);

    /// [`fingerprint`](super::forecast::fingerprint) of the slots `admitted` was
    /// recorded in, policy by policy.
    fn fingerprint(&self, admitted: &Self::Admitted) -> u64;

    /// True while `admitted` was recorded in the current bucket of every policy.
    fn is_current(&self, admitted: &Self::Admitted) -> bool;

    /// [`is_current`](Self::is_current), and if so `admitted` is spent now:
    /// each policy's bucket keeps now as its newest admission, so that a
    /// window holding the instant it is spent at counts it (it may have been
    /// admitted earlier in the bucket).
    fn spend(&self, key: &K, admitted: &Self::Admitted) -> bool;

    /// Each policy's window for `key` now, in policy order.
    fn windows(&self, key: &K) -> Vec<WindowSnapshot>;
}

/// A denial from the gate: which policy, and its decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Denied {
    pub(crate) policy: usize,
    pub(crate) decision: Decision,
    /// Units were counted under some policies and given back (all-or-nothing):
    /// a check that ran meanwhile may have been denied for them.
    pub(crate) gave_back: bool,
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

/// The queues of one gate: FIFO per key, bounded by a [`WaitConfig`]. `A` is
/// what an admission holds.
pub(crate) struct Queues<K, A> {
    config: WaitConfig,
    map: DashMap<K, KeyQueue<A>, Hasher>,
    counters: Counters,
}

struct KeyQueue<A> {
    entries: VecDeque<Entry<A>>,
    next_id: u64,
    waiting: usize,
    forecast: Option<Forecast>,
}

impl<A> Default for KeyQueue<A> {
    fn default() -> Self {
        KeyQueue {
            entries: VecDeque::new(),
            // Room below for a renewed admission to wait ahead of everyone.
            next_id: 1 << 62,
            waiting: 0,
            forecast: None,
        }
    }
}

struct Entry<A> {
    id: u64,
    cost: u32,
    state: State<A>,
    waker: Option<Waker>,
    /// Fingerprint of the slots the forecast admits this waiter in.
    forecast: Option<u64>,
    /// The waiter's bound, `max_wait` after its arrival. It is held against
    /// forecasts, not the clock: a waiter whose turn, forecast when it is
    /// denied as the head, would come after it is rejected then; a waiter that
    /// fits when its queue moves is admitted, even past this instant when the
    /// queue moved late (a head, or the waiter itself, polled late).
    give_up_at: Option<Instant>,
    /// When the head's cost fits, as of its last denial: the head sleeps until
    /// then without checking again. Cleared by anything that frees units.
    fits_at: Option<Instant>,
}

impl<A> Entry<A> {
    /// A waiter of `cost` joining at `now`: it gives up `max_wait` later.
    fn waiting(id: u64, cost: u32, config: WaitConfig, now: Instant) -> Self {
        Entry {
            id,
            cost,
            state: State::Waiting,
            waker: None,
            forecast: None,
            give_up_at: config.max_wait.and_then(|m| now.checked_add(m)),
            fits_at: None,
        }
    }
}

#[derive(Clone, Copy)]
enum State<A> {
    Waiting,
    Admitted(A),
}

impl<A> KeyQueue<A> {
    fn position(&self, id: u64) -> Option<usize> {
        self.entries.binary_search_by_key(&id, |e| e.id).ok()
    }

    fn head(&self) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| matches!(e.state, State::Waiting))
    }

    /// The head's waker, so it runs the queue again (units freed, or the former
    /// head left).
    fn head_waker(&mut self) -> Option<Waker> {
        let h = self.head()?;
        self.entries[h].fits_at = None;
        self.entries[h].waker.take()
    }
}

/// What one poll of a waiter found.
enum Step<A> {
    Ready(Result<A, WaitRejected>),
    Pending,
    SleepUntil(Instant),
}

impl<K: Hash + Eq + Clone, A: Copy> Queues<K, A> {
    pub(crate) fn new(config: WaitConfig) -> Self {
        Queues {
            config,
            map: DashMap::with_hasher(Hasher::default()),
            counters: Counters::default(),
        }
    }

    pub(crate) fn config(&self) -> WaitConfig {
        self.config
    }

    pub(crate) fn stats(&self) -> WaitStats {
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
            keys_waiting: self.map.len(),
        }
    }

    fn remove_if_idle(&self, key: &K) {
        self.map.remove_if(key, |_, q| q.entries.is_empty());
    }
}

/// Give back an admission and let the key's waiters use it at once.
pub(crate) fn release<K: Hash + Eq + Clone, G: Gate<K>>(gate: &G, key: &K, admitted: &G::Admitted) {
    gate.give_back(key, admitted);
    freed(gate.queues(), key);
}

/// Units of `key` were given back: the head checks again (its last denial may
/// have counted them) and the forecast is rebuilt.
fn freed<K: Hash + Eq + Clone, A: Copy>(queues: &Queues<K, A>, key: &K) {
    let wake = queues.map.get_mut(key).and_then(|mut q| {
        q.forecast = None;
        q.head_waker()
    });
    if let Some(w) = wake {
        w.wake();
    }
}

/// [`release`] an admission that was never used (counted in `WaitStats::undone`).
pub(crate) fn release_unused<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    admitted: &G::Admitted,
) {
    release(gate, key, admitted);
    bump(&gate.queues().counters.undone);
}

fn forecast<'q, K, G: Gate<K>>(
    gate: &G,
    key: &K,
    q: &'q mut KeyQueue<G::Admitted>,
    now: Instant,
) -> &'q mut Forecast {
    q.forecast.get_or_insert_with(|| {
        // Rebuild: the windows as they are, then every waiter in order.
        let mut f = Forecast::new(gate.windows(key), now);
        for e in q.entries.iter_mut() {
            if matches!(e.state, State::Waiting) {
                if f.too_costly(e.cost).is_some() {
                    e.forecast = None;
                    continue;
                }
                let next = f.next(e.cost, now);
                f.commit(e.cost, next);
                e.forecast = Some(next.fingerprint);
            }
        }
        f
    })
}

/// A request's place in its key's queue, generic over the gate; `A` is the
/// gate's `Admitted`. No bounds on the type itself, so services can hold one
/// without repeating the gate's bounds: the drop hook is a plain function
/// pointer chosen in [`Waiter::new`].
pub(crate) struct Waiter<K, G, A> {
    gate: Arc<G>,
    key: K,
    state: WaiterState<A>,
    cancel: fn(&G, &K, u64),
    /// Gives back an admission decided on arrival (or on renewal) but never
    /// delivered: the future was dropped before it resolved.
    unused: fn(&G, &K, &A),
    /// The outcome was returned by `poll` (or taken by [`Waiter::take_decided`]).
    delivered: bool,
}

enum WaiterState<A> {
    Done(Result<A, WaitRejected>),
    Waiting {
        id: u64,
        /// Armed only while this waiter is the head and over the limit.
        sleep: Option<Pin<Box<Sleep>>>,
        expected: Option<Instant>,
    },
}

impl<K: Hash + Eq + Clone, G: Gate<K, Admitted = A>, A: Copy> Waiter<K, G, A> {
    /// Join `key`'s queue now (arrival order is the order of these calls), or be
    /// admitted or rejected now.
    pub(crate) fn new(gate: Arc<G>, key: K, cost: u32) -> Self {
        let state = enqueue(&*gate, &key, cost);
        Waiter {
            gate,
            key,
            state,
            cancel: cancel::<K, G>,
            unused: release_unused::<K, G>,
            delivered: false,
        }
    }
}

impl<K: Hash + Eq + Clone, G: Gate<K, Admitted = A>, A: Copy> Waiter<K, G, A> {
    /// Renew `admitted`, an admission spent too late (its bucket has passed):
    /// give its units back and take them again now, or wait for them at the
    /// head of the queue. Admitted before every waiter of the key, the request
    /// keeps its place ahead of them (no `max_queue` check; its `max_wait`
    /// counts from now).
    pub(crate) fn renew(gate: Arc<G>, key: K, cost: u32, admitted: &A) -> Self {
        let state = rejoin(&*gate, &key, cost, admitted);
        Waiter {
            gate,
            key,
            state,
            cancel: cancel::<K, G>,
            unused: release_unused::<K, G>,
            delivered: false,
        }
    }
}

impl<K, G, A: Copy> Waiter<K, G, A> {
    pub(crate) fn expected_admission(&self) -> Option<Instant> {
        match self.state {
            WaiterState::Waiting { expected, .. } => expected,
            WaiterState::Done(_) => None,
        }
    }

    pub(crate) fn is_waiting(&self) -> bool {
        matches!(self.state, WaiterState::Waiting { .. })
    }

    /// The outcome, once decided (on arrival or since), taken by the caller:
    /// an admission is then the caller's to use, and no longer given back when
    /// the waiter is dropped.
    pub(crate) fn take_decided(&mut self) -> Option<Result<A, WaitRejected>> {
        match &self.state {
            WaiterState::Done(result) => {
                self.delivered = true;
                Some(*result)
            }
            WaiterState::Waiting { .. } => None,
        }
    }

    pub(crate) fn key(&self) -> &K {
        &self.key
    }
}

fn decided<K, G: Gate<K>>(
    gate: &G,
    result: Result<G::Admitted, Denied>,
) -> WaiterState<G::Admitted> {
    match result {
        Ok(admitted) => {
            bump(&gate.queues().counters.admitted_at_once);
            WaiterState::Done(Ok(admitted))
        }
        Err(denied) => WaiterState::Done(Err(WaitRejected {
            reason: WaitRejectReason::CostExceedsLimit,
            policy: denied.policy,
            decision: denied.decision,
        })),
    }
}

fn enqueue<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    cost: u32,
) -> WaiterState<G::Admitted> {
    let queues = gate.queues();
    // Fast path: no queue for this key, so a plain check decides; so does a
    // cost of 0, which takes nothing from the waiters it would queue behind.
    let mut denial = None;
    if cost == 0 || !queues.map.contains_key(key) {
        match gate.try_admit(key, cost) {
            Err(d) if d.decision.retry_after().is_some() => denial = Some(d),
            result => {
                if let Err(Denied {
                    gave_back: true, ..
                }) = result
                {
                    freed(queues, key);
                }
                return decided(gate, result);
            }
        }
    }
    let mut q = queues.map.entry(key.clone()).or_default();
    let outcome = join(gate, key, cost, &mut q, denial);
    drop(q);
    // Checked outside the key's lock, this request may have held units that
    // the head was denied for meanwhile: they are back, so it checks again.
    if denial.is_some_and(|d| d.gave_back) {
        freed(queues, key);
    }
    match outcome {
        Joined::Waiting { id, expected } => WaiterState::Waiting {
            id,
            sleep: None,
            expected,
        },
        Joined::Decided(result) => {
            queues.remove_if_idle(key);
            match result {
                Ok(admitted) => decided(gate, Ok(admitted)),
                Err(Ok(denied)) => decided(gate, Err(denied)),
                Err(Err(rejection)) => WaiterState::Done(Err(rejection)),
            }
        }
    }
}

/// [`Waiter::renew`]: give back and take again under the key's lock (no waiter
/// takes the units in between), or wait at the front of the queue.
fn rejoin<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    cost: u32,
    admitted: &G::Admitted,
) -> WaiterState<G::Admitted> {
    let queues = gate.queues();
    let mut q = queues.map.entry(key.clone()).or_default();
    gate.give_back(key, admitted);
    bump(&queues.counters.undone);
    q.forecast = None;
    let denied = match gate.try_admit(key, cost) {
        Ok(admitted) => {
            drop(q);
            queues.remove_if_idle(key);
            // Not an arrival: an undone admission's next one counts again as
            // admitted after waiting (as in `step`), not as admitted at once.
            bump(&queues.counters.admitted_after_wait);
            return WaiterState::Done(Ok(admitted));
        }
        Err(denied) => denied,
    };
    let Some(wait) = denied.decision.retry_after() else {
        drop(q);
        queues.remove_if_idle(key);
        return decided(gate, Err(denied));
    };
    let now = Instant::now();
    // Ids stay sorted: below the front's, or the next one in an empty queue.
    let id = match q.entries.front() {
        Some(front) => front.id - 1,
        None => {
            q.next_id += 1;
            q.next_id - 1
        }
    };
    // The former head, if any, finds it is no longer the head when it wakes.
    q.waiting += 1;
    q.entries.push_front(Entry {
        fits_at: Some(now + wait),
        ..Entry::waiting(id, cost, queues.config, now)
    });
    WaiterState::Waiting {
        id,
        sleep: None,
        expected: None,
    }
}

enum Joined<A> {
    Waiting {
        id: u64,
        expected: Option<Instant>,
    },
    /// Admitted; or a cost above a limit (`Err(Ok)`); or turned away (`Err(Err)`).
    Decided(Result<A, Result<Denied, WaitRejected>>),
}

/// Join `key`'s queue `q` (its lock held), or decide at once.
fn join<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    cost: u32,
    q: &mut KeyQueue<G::Admitted>,
    mut denial: Option<Denied>,
) -> Joined<G::Admitted> {
    let counters = &gate.queues().counters;
    let config = gate.queues().config;
    if q.waiting == 0 {
        // Nobody to queue behind: check again, under the key's lock. The fast
        // path's check ran outside it, and units given back since (a release,
        // another request's all-or-nothing check) would wake no head: a head
        // sleeping on that denial could wait for units that are free.
        match gate.try_admit(key, cost) {
            Err(d) if d.decision.retry_after().is_some() => denial = Some(d),
            Ok(admitted) => return Joined::Decided(Ok(admitted)),
            Err(d) => return Joined::Decided(Err(Ok(d))),
        }
        q.forecast = None;
    }
    let now = Instant::now();
    let head = q.waiting == 0;
    let full = q.waiting >= config.max_queue.unwrap_or(usize::MAX);
    let mut expected = None;
    let mut fingerprint = None;
    if let Some(max_wait) = config.max_wait {
        let forecast = forecast(gate, key, q, now);
        if let Some(policy) = forecast.too_costly(cost) {
            let decision = forecast.denial(policy, cost, now, Duration::ZERO);
            return Joined::Decided(Err(Ok(Denied {
                policy,
                decision,
                gave_back: false,
            })));
        }
        let next = forecast.next(cost, now);
        let mut wait = forecast.instant(next).saturating_duration_since(now);
        if head {
            // The strict forecast is an upper bound for an interpolated policy;
            // with nobody ahead, the wait is known exactly.
            wait = wait.min(forecast.earliest(cost, now).saturating_duration_since(now));
        }
        let reason = if full {
            Some(WaitRejectReason::QueueFull)
        } else if wait > max_wait {
            Some(WaitRejectReason::WaitTooLong)
        } else {
            None
        };
        if let Some(reason) = reason {
            bump(match reason {
                WaitRejectReason::QueueFull => &counters.rejected_queue_full,
                _ => &counters.rejected_wait_too_long,
            });
            let (policy, mut decision) = match denial {
                Some(d) => (d.policy, d.decision),
                None => (next.binding, forecast.denial(next.binding, cost, now, wait)),
            };
            decision.retry_after_ns = crate::clock::saturating_nanos(wait).max(1);
            return Joined::Decided(Err(Err(WaitRejected {
                reason,
                policy,
                decision,
            })));
        }
        forecast.commit(cost, next);
        expected = Some(forecast.instant(next));
        fingerprint = Some(next.fingerprint);
    } else if full {
        bump(&counters.rejected_queue_full);
        // Unbounded waits keep no forecast: report the arrival's own denial, or
        // a bare one.
        let d = denial.unwrap_or(Denied {
            policy: 0,
            gave_back: false,
            decision: Decision::from_parts(
                crate::decision::Outcome::Denied,
                0,
                0,
                Duration::from_nanos(1),
                Duration::ZERO,
            ),
        });
        return Joined::Decided(Err(Err(WaitRejected {
            reason: WaitRejectReason::QueueFull,
            policy: d.policy,
            decision: d.decision,
        })));
    }
    let id = q.next_id;
    q.next_id += 1;
    q.waiting += 1;
    q.entries.push_back(Entry {
        forecast: fingerprint,
        // As head at once, it sleeps on its arrival's denial without checking again.
        fits_at: denial
            .filter(|_| head)
            .and_then(|d| d.decision.retry_after())
            .map(|wait| now + wait),
        ..Entry::waiting(id, cost, config, now)
    });
    Joined::Waiting { id, expected }
}

/// Poll waiter `id` of `key`: collect its admission, or, at the head, admit
/// everyone who fits now and say until when to sleep.
fn poll_waiter<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    id: u64,
    cx: &mut Context<'_>,
) -> Step<G::Admitted> {
    let queues = gate.queues();
    let mut wake: Vec<Waker> = Vec::new();
    let step = match queues.map.get_mut(key) {
        Some(mut q) => step(gate, key, &mut q, id, cx, &mut wake),
        None => Step::Ready(Err(lost())),
    };
    if matches!(step, Step::Ready(_)) {
        queues.remove_if_idle(key);
    }
    for w in wake {
        w.wake();
    }
    step
}

fn step<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    q: &mut KeyQueue<G::Admitted>,
    id: u64,
    cx: &mut Context<'_>,
    wake: &mut Vec<Waker>,
) -> Step<G::Admitted> {
    let Some(i) = q.position(id) else {
        return Step::Ready(Err(lost()));
    };
    if let State::Admitted(admitted) = q.entries[i].state {
        if gate.spend(key, &admitted) {
            q.entries.remove(i);
            return Step::Ready(Ok(admitted));
        }
        // Admitted with a batch, but collected after its units left the window:
        // forwarded now, it would count in no window. Give them back and wait
        // again in its place, as a stale backpressure reservation is renewed.
        gate.give_back(key, &admitted);
        bump(&gate.queues().counters.undone);
        let e = &mut q.entries[i];
        e.state = State::Waiting;
        e.fits_at = None;
        q.waiting += 1;
        q.forecast = None;
        // A head ahead of it (a renewed request, an earlier waiter) sleeps on a
        // denial that counted these units: it checks again, as after `freed`.
        if q.head() != Some(i) {
            wake.extend(q.head_waker());
        }
    }
    if q.head() != Some(i) {
        set_waker(&mut q.entries[i].waker, cx);
        return Step::Pending;
    }
    // Nothing freed since the last denial: keep sleeping without checking.
    let e = &mut q.entries[i];
    let now = Instant::now();
    if let Some(fits_at) = e.fits_at {
        if fits_at > now && e.give_up_at.is_none_or(|g| fits_at <= g) {
            set_waker(&mut e.waker, cx);
            return Step::SleepUntil(fits_at);
        }
    }
    let denial = pump(gate, key, q, id, wake);
    if let State::Admitted(admitted) = q.entries[i].state {
        q.entries.remove(i);
        return Step::Ready(Ok(admitted));
    }
    let Some(denied) = denial else {
        // Unreachable: the head was neither admitted nor denied.
        return Step::Ready(Err(lost()));
    };
    let (deadline, give_up) = match denied.decision.retry_after() {
        Some(wait) => {
            let deadline = now + wait;
            let late = q.entries[i].give_up_at.is_some_and(|g| deadline > g);
            (deadline, late.then_some(WaitRejectReason::WaitTooLong))
        }
        None => (now, Some(WaitRejectReason::CostExceedsLimit)),
    };
    if let Some(reason) = give_up {
        // Its turn would come too late after all (traffic from outside the
        // queue), or never: give up now rather than later.
        if reason == WaitRejectReason::WaitTooLong {
            bump(&gate.queues().counters.rejected_wait_too_long);
        }
        q.entries.remove(i);
        q.waiting -= 1;
        q.forecast = None;
        wake.extend(q.head_waker());
        return Step::Ready(Err(WaitRejected {
            reason,
            policy: denied.policy,
            decision: denied.decision,
        }));
    }
    set_waker(&mut q.entries[i].waker, cx);
    Step::SleepUntil(deadline)
}

/// Admit waiting entries in order while they fit; the first that does not is
/// the head, and its denial is returned. Wakes whoever must act (except `me`).
fn pump<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    q: &mut KeyQueue<G::Admitted>,
    me: u64,
    wake: &mut Vec<Waker>,
) -> Option<Denied> {
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
        let result = gate.try_admit(key, e.cost);
        if e.id != me {
            wake.extend(e.waker.take());
        }
        let admitted = match result {
            Ok(admitted) => admitted,
            Err(denied) => {
                e.fits_at = denied.decision.retry_after().map(|w| Instant::now() + w);
                return Some(denied);
            }
        };
        if e.forecast != Some(gate.fingerprint(&admitted)) {
            *forecast = None; // reality strayed from the forecast: rebuild it
        }
        e.state = State::Admitted(admitted);
        *waiting -= 1;
        bump(&gate.queues().counters.admitted_after_wait);
    }
    *forecast = None;
    None
}

/// Renew a stale reservation: admit `cost` units of `key` now if nobody waits
/// for the key and they fit (counted, as every renewal, as admitted after
/// waiting); nothing joins the queue (and nothing is counted as cancelled)
/// otherwise.
fn admit_now<K: Hash + Eq + Clone, G: Gate<K>>(
    gate: &G,
    key: &K,
    cost: u32,
) -> Option<G::Admitted> {
    let queues = gate.queues();
    let result = match queues.map.get(key) {
        Some(q) if q.waiting > 0 => return None,
        // Under the key's lock, so no waiter can join in between.
        Some(_q) => gate.try_admit(key, cost),
        None => gate.try_admit(key, cost),
    };
    match result {
        Ok(admitted) => {
            bump(&queues.counters.admitted_after_wait);
            Some(admitted)
        }
        Err(denied) => {
            if denied.gave_back {
                freed(queues, key);
            }
            None
        }
    }
}

/// Remove waiter `id` (its future was dropped), giving back admitted units.
fn cancel<K: Hash + Eq + Clone, G: Gate<K>>(gate: &G, key: &K, id: u64) {
    let queues = gate.queues();
    let mut wake = None;
    if let Some(mut q) = queues.map.get_mut(key) {
        if let Some(i) = q.position(id) {
            let was_head = q.head() == Some(i);
            match q.entries.remove(i).map(|e| e.state) {
                Some(State::Admitted(admitted)) => {
                    gate.give_back(key, &admitted);
                    bump(&queues.counters.undone);
                    q.forecast = None;
                    wake = q.head_waker();
                }
                Some(State::Waiting) => {
                    bump(&queues.counters.cancelled);
                    q.waiting -= 1;
                    q.forecast = None;
                    if was_head {
                        wake = q.head_waker();
                    }
                }
                None => {}
            }
        }
    }
    queues.remove_if_idle(key);
    if let Some(w) = wake {
        w.wake();
    }
}

/// A waiter whose queue entry is gone: cannot happen while the invariants
/// hold; answered with a rejection rather than a panic.
fn lost() -> WaitRejected {
    debug_assert!(false, "a waiter's queue entry is gone");
    WaitRejected {
        reason: WaitRejectReason::WaitTooLong,
        policy: 0,
        decision: Decision::from_parts(
            crate::decision::Outcome::Denied,
            0,
            0,
            Duration::from_nanos(1),
            Duration::ZERO,
        ),
    }
}

fn set_waker(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

// No field is structurally pinned: the timer is boxed.
impl<K, G, A> Unpin for Waiter<K, G, A> {}

impl<K: Hash + Eq + Clone, G: Gate<K, Admitted = A>, A: Copy> Future for Waiter<K, G, A> {
    type Output = Result<A, WaitRejected>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            let (id, sleep) = match &mut this.state {
                WaiterState::Done(result) => {
                    this.delivered = true;
                    return Poll::Ready(*result);
                }
                WaiterState::Waiting { id, sleep, .. } => (*id, sleep),
            };
            match poll_waiter(&*this.gate, &this.key, id, cx) {
                Step::Ready(result) => {
                    this.delivered = true;
                    this.state = WaiterState::Done(result);
                    return Poll::Ready(result);
                }
                Step::Pending => return Poll::Pending,
                Step::SleepUntil(deadline) => {
                    let counters = &this.gate.queues().counters;
                    let timer = match sleep {
                        Some(timer) => {
                            if timer.deadline() != deadline {
                                bump(&counters.timers_reset);
                                timer.as_mut().reset(deadline);
                            }
                            timer
                        }
                        None => {
                            bump(&counters.timers_created);
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

impl<K, G, A> Drop for Waiter<K, G, A> {
    fn drop(&mut self) {
        match &self.state {
            WaiterState::Waiting { id, .. } => (self.cancel)(&self.gate, &self.key, *id),
            // Admitted on arrival but dropped before it resolved: the request
            // is cancelled, so its units go back (as a waiter's admitted in a
            // batch and dropped before it was polled).
            WaiterState::Done(Ok(admitted)) if !self.delivered => {
                (self.unused)(&self.gate, &self.key, admitted)
            }
            WaiterState::Done(_) => {}
        }
    }
}

/// Readiness against a gate: a reserved admission held for the next use, or a
/// place in the queue while waiting for one. The primitive behind `poll_ready`.
/// Like [`Waiter`], the type has no bounds; its drop hook is set in `new`.
pub(crate) struct Reservation<K, G, A> {
    gate: Arc<G>,
    key: K,
    state: ReservationState<K, G, A>,
    release: fn(&G, &K, &A),
}

enum ReservationState<K, G, A> {
    Idle,
    Waiting(Waiter<K, G, A>),
    Reserved(A),
}

impl<K: Hash + Eq + Clone, G: Gate<K, Admitted = A>, A: Copy> Reservation<K, G, A> {
    pub(crate) fn new(gate: Arc<G>, key: K) -> Self {
        Reservation {
            gate,
            key,
            state: ReservationState::Idle,
            release: release::<K, G>,
        }
    }

    /// Ready once one unit is reserved.
    pub(crate) fn poll_reserve(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WaitRejected>> {
        loop {
            match &mut self.state {
                ReservationState::Reserved(_) => return Poll::Ready(Ok(())),
                ReservationState::Idle => {
                    let waiter = Waiter::new(Arc::clone(&self.gate), self.key.clone(), 1);
                    self.state = ReservationState::Waiting(waiter);
                }
                ReservationState::Waiting(waiter) => match Pin::new(waiter).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(admitted)) => self.state = ReservationState::Reserved(admitted),
                    Poll::Ready(Err(rejection)) => {
                        self.state = ReservationState::Idle;
                        return Poll::Ready(Err(rejection));
                    }
                },
            }
        }
    }

    /// Renew a reservation recorded in a bucket that has passed (its holder
    /// was not ready to spend it in time): give it back and take a unit again
    /// now, ahead of every waiter, or wait for one at the front of the queue.
    /// True when it was stale (the reservation is then polled again).
    pub(crate) fn renew_if_stale(&mut self) -> bool {
        let ReservationState::Reserved(admitted) = &self.state else {
            return false;
        };
        let admitted = *admitted;
        if self.gate.is_current(&admitted) {
            return false;
        }
        let waiter = Waiter::renew(Arc::clone(&self.gate), self.key.clone(), 1, &admitted);
        self.state = ReservationState::Waiting(waiter);
        true
    }

    /// Spend the reservation. One recorded in an earlier bucket is renewed
    /// first (spending it later could put more than the limit in some window):
    /// given back, and a unit taken now, unless others wait or none is free.
    pub(crate) fn take(&mut self) -> Option<A> {
        let ReservationState::Reserved(admitted) =
            std::mem::replace(&mut self.state, ReservationState::Idle)
        else {
            return None;
        };
        if self.gate.spend(&self.key, &admitted) {
            return Some(admitted);
        }
        release_unused(&*self.gate, &self.key, &admitted);
        admit_now(&*self.gate, &self.key, 1)
    }
}

impl<K, G, A> Reservation<K, G, A> {
    pub(crate) fn gate(&self) -> &Arc<G> {
        &self.gate
    }

    pub(crate) fn is_reserved(&self) -> bool {
        matches!(self.state, ReservationState::Reserved(_))
    }

    /// Give the reservation back unused (the holder will not call).
    pub(crate) fn cancel(&mut self) {
        if let ReservationState::Reserved(admitted) =
            std::mem::replace(&mut self.state, ReservationState::Idle)
        {
            (self.release)(&self.gate, &self.key, &admitted);
        }
    }
}

impl<K: Clone, G, A> Clone for Reservation<K, G, A> {
    /// A clone shares the gate and its queue but starts without a reservation.
    fn clone(&self) -> Self {
        Reservation {
            gate: Arc::clone(&self.gate),
            key: self.key.clone(),
            state: ReservationState::Idle,
            release: self.release,
        }
    }
}

impl<K, G, A> Drop for Reservation<K, G, A> {
    fn drop(&mut self) {
        self.cancel();
    }
}

//! The two limiters the limiter benches compare, built the same way for each
//! bench: ours (`Limiter`) and governor's keyed limiter, behind one `Check` trait,
//! and the timed loops that drive them from one or more threads.

// Each bench that includes this file uses only part of it.
#![allow(dead_code)]

use crate::support::{Cursor, Keys};
use governor::clock::{DefaultClock, FakeRelativeClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};
use tower_sliding_window::clock::{Clock, CoarseClock, TokioClock};
use tower_sliding_window::{Limiter, ManualClock, Policy};

/// Keys in the round-robin workloads.
pub const KEYS: u64 = 100_000;

/// What both limiters are asked: one check of one unit for a key.
pub trait Check: Sync {
    fn check(&self, key: &u64) -> bool;
}

impl<C: Clock> Check for Limiter<u64, C> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        Limiter::check(self, key).is_allowed()
    }
}

/// Governor's keyed limiter on u64 keys, the hasher `S` and the clock `C`,
/// without middleware.
pub type Governor<S, C> = RateLimiter<
    u64,
    DashMapStateStore<u64, S>,
    C,
    NoOpMiddleware<<C as governor::clock::Clock>::Instant>,
>;

/// Governor's keyed limiter on any hasher: its default (std's SipHash,
/// `DefaultKeyedRateLimiter`) or ours (foldhash, [`governor_foldhash`]); on
/// any clock (its default, or the fake one of [`Passes`]).
impl<S, C> Check for Governor<S, C>
where
    S: BuildHasher + Clone + Send + Sync,
    C: governor::clock::Clock + Sync,
    C::Instant: Sync,
{
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.check_key(key).is_ok()
    }
}

/// A contender whose denials also read how long to wait, as a layer must for
/// `Retry-After`: ours has it in the decision; governor's `NotUntil` works it
/// out from a reading of governor's clock, as tower_governor does.
pub struct WithWait<L>(pub L);

impl<C: Clock> Check for WithWait<Limiter<u64, C>> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        let decision = self.0.check(key);
        black_box(decision.retry_after());
        decision.is_allowed()
    }
}

impl<S, C> Check for WithWait<Governor<S, C>>
where
    S: BuildHasher + Clone + Send + Sync,
    C: governor::clock::Clock + Sync,
    C::Instant: Sync,
{
    #[inline]
    fn check(&self, key: &u64) -> bool {
        match self.0.check_key(key) {
            Ok(()) => true,
            Err(not_until) => {
                let now = governor::clock::Clock::now(self.0.clock());
                black_box(not_until.wait_time_from(now));
                false
            }
        }
    }
}

/// A contender on a fake clock that moves on `step` after every [`KEYS`]
/// checks. Over 100k keys checked round-robin, a step of one bucket width
/// ([`PASS_STEP`]) makes every check its key's first in a new bucket, as for
/// clients that send less than a request a bucket; a step longer than a
/// window, a check of a key idle since its last. The count is this thread's
/// (a load and a store, no locked instruction): one thread only.
pub struct Passes<L> {
    limiter: L,
    advance: Box<dyn Fn() + Sync>,
    left: AtomicU64,
}

/// The bucket width of [`Load::AllowedCompact`]'s policy (1 s in 16).
pub const PASS_STEP: Duration = Duration::from_micros(62_500);

impl<L: Check> Check for Passes<L> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        let left = self.left.load(Relaxed);
        if left == 0 {
            (self.advance)();
            self.left.store(KEYS - 1, Relaxed);
        } else {
            self.left.store(left - 1, Relaxed);
        }
        self.limiter.check(key)
    }
}

impl<L> Passes<L> {
    fn new(limiter: L, advance: impl Fn() + Sync + 'static) -> Passes<L> {
        Passes {
            limiter,
            advance: Box::new(advance),
            left: AtomicU64::new(KEYS),
        }
    }
}

/// Ours on a `ManualClock` moved on a bucket width every pass ([`Passes`]).
pub fn ours_passes(load: Load) -> Passes<Limiter<u64, ManualClock>> {
    ours_passes_by(load, PASS_STEP)
}

/// Ours on a `ManualClock` moved on `step` every pass.
pub fn ours_passes_by(load: Load, step: Duration) -> Passes<Limiter<u64, ManualClock>> {
    let clock = ManualClock::new();
    let limiter = ours_on(load, clock.clone());
    Passes::new(limiter, move || clock.advance(step))
}

/// Governor on its fake clock, moved on as [`ours_passes`]'s.
pub fn governor_passes(load: Load) -> Passes<Governor<RandomState, FakeRelativeClock>> {
    governor_passes_by(load, PASS_STEP)
}

/// [`governor_on_fake_clock`] moved on `step` every pass.
pub fn governor_passes_by(
    load: Load,
    step: Duration,
) -> Passes<Governor<RandomState, FakeRelativeClock>> {
    let limiter = governor_on_fake_clock(load);
    let clock = limiter.clock().clone();
    Passes::new(limiter, move || clock.advance(step))
}

/// Governor's keyed limiter (std's hasher) on its `FakeRelativeClock`, which
/// moves only when told.
pub fn governor_on_fake_clock(load: Load) -> Governor<RandomState, FakeRelativeClock> {
    RateLimiter::dashmap_with_clock(quota(load), FakeRelativeClock::default())
}

#[derive(Clone, Copy)]
pub enum Load {
    /// A limit far above the request rate (1e9 per second): every check is
    /// admitted and counted.
    Allowed,
    /// A limit above the request rate of any one of 100k keys that a 16-bit
    /// count holds (65 535 a second): compact rings, as most per-key limits
    /// get. Not for a hot key, which it would deny.
    AllowedCompact,
    /// 1 per hour: after the first check every check is denied (the path a flood
    /// of over-limit requests takes).
    Denied,
}

fn policy(load: Load) -> Policy {
    let (limit, window) = match load {
        Load::Allowed => (1_000_000_000, Duration::from_secs(1)),
        Load::AllowedCompact => (65_535, Duration::from_secs(1)),
        Load::Denied => (1, Duration::from_secs(3600)),
    };
    Policy::builder()
        .limit(limit)
        .window(window)
        .buckets(buckets())
        .build()
        .unwrap()
}

/// Buckets per window: the default, or `BENCH_BUCKETS` to measure another
/// count (`BENCH_BUCKETS=15 cargo bench --bench paired`).
pub fn buckets() -> u32 {
    std::env::var("BENCH_BUCKETS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(Policy::DEFAULT_BUCKETS)
}

/// Ours on its default clock.
pub fn ours(load: Load) -> Limiter<u64> {
    Limiter::builder(policy(load))
        .max_keys(2 * KEYS as usize)
        .build()
        .unwrap()
}

/// Ours on `TokioClock`.
pub fn ours_tokio(load: Load) -> Limiter<u64, TokioClock> {
    ours_on(load, TokioClock::new())
}

/// Ours on the given clock.
pub fn ours_on<C: Clock>(load: Load, clock: C) -> Limiter<u64, C> {
    Limiter::builder(policy(load))
        .clock(clock)
        .max_keys(2 * KEYS as usize)
        .build()
        .unwrap()
}

pub fn quota(load: Load) -> Quota {
    match load {
        Load::Allowed => Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
        Load::AllowedCompact => Quota::per_second(NonZeroU32::new(65_535).unwrap()),
        Load::Denied => Quota::per_hour(NonZeroU32::new(1).unwrap()),
    }
}

/// Governor as `RateLimiter::keyed` builds it: its default clock (quanta) and
/// std's default hasher (SipHash-1-3).
pub fn governor(load: Load) -> DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(quota(load))
}

/// A control: governor on the hasher ours uses (foldhash, its quality
/// variant), its clock unchanged.
/// Hashing a u64 with SipHash is about half of governor's default check.
pub fn governor_foldhash(load: Load) -> Governor<foldhash::quality::RandomState, DefaultClock> {
    RateLimiter::dashmap_with_clock_and_hasher(
        quota(load),
        DefaultClock::default(),
        Default::default(),
    )
}

/// Track every key the workload uses before measuring, in key order, also
/// for a workload that then checks them in a random order: a map that lays
/// keys out in the order they came (ours does) is then read in an order
/// unrelated to its layout, as when many clients' requests arrive.
pub fn warm<L: Check>(l: &L, keys: Keys, threads: u64) {
    let keys = match keys {
        Keys::OwnRangeShuffled(n) => Keys::OwnRange(n),
        keys => keys,
    };
    for t in 0..threads {
        let mut cursor = Cursor::new(keys, t);
        for _ in 0..cursor.len {
            l.check(&cursor.next_key());
        }
    }
}

/// `iters` checks on this thread.
#[inline]
pub fn run_one<L: Check>(l: &L, keys: Keys, iters: u64) -> Duration {
    let mut cursor = Cursor::new(keys, 0);
    let start = Instant::now();
    for _ in 0..iters {
        black_box(l.check(black_box(&cursor.next_key())));
    }
    start.elapsed()
}

/// [`run_one`], each check's key depending on the previous check's result
/// (a bit of it the optimiser cannot see is always 0), so that the processor
/// cannot start a check before the one before it has ended: one check at a
/// time, as a server's checks come with a request's work between them, where
/// `run_one` lets the lookups of several checks overlap.
#[inline]
pub fn run_one_dependent<L: Check>(l: &L, keys: Keys, iters: u64) -> Duration {
    let mut cursor = Cursor::new(keys, 0);
    let mut previous = 0u64;
    let start = Instant::now();
    for _ in 0..iters {
        let key = cursor.next_key() + (previous >> 63);
        previous = black_box(u64::from(l.check(&key)));
    }
    start.elapsed()
}

/// `threads` threads each run `iters` checks on their own keys, started together.
pub fn run_parallel<L: Check>(l: &L, threads: u64, keys: Keys, iters: u64) -> Duration {
    crate::support::run_threads(threads, keys, iters, |key| l.check(key))
}

/// The least a keyed sliding-window check can cost: the coarse clock read,
/// a lookup in a map no other thread writes (std's `HashMap` on foldhash, as
/// ours hashes, filled before the run with the keys the workloads use, so it
/// needs no synchronisation at all), a read of the key's window (a head word
/// and 16 buckets, summed: 32-bit buckets as a compact ring's for a limit a
/// 16-bit count holds, 64-bit as a wide ring's for a larger one) and one
/// compare-and-swap on the bucket the time chooses, as a strict check's
/// admission needs. No tags, no decision, no stats, no eviction: any
/// limiter's map, which others write meanwhile, costs more.
///
/// Without the read of the window this is a few instructions: at 100k keys
/// the processor then runs several checks' lookups at once, their cache
/// misses overlapping, which no check of a window can match.
pub struct Floor<W> {
    map: HashMap<u64, (AtomicU64, [W; 16]), foldhash::fast::RandomState>,
    clock: CoarseClock,
}

/// A bucket word of the floor: a compact ring's or a wide one's.
pub trait FloorWord: Default + Sync {
    fn bump(&self) -> bool;
    fn get(&self) -> u64;
}

/// The same two operations on either width.
macro_rules! floor_word {
    ($($atomic:ty),*) => {$(
        impl FloorWord for $atomic {
            #[inline]
            fn bump(&self) -> bool {
                let old = self.load(SeqCst);
                self.compare_exchange(old, old + 1, SeqCst, SeqCst).is_ok()
            }
            #[inline]
            fn get(&self) -> u64 {
                u64::from(self.load(SeqCst))
            }
        }
    )*};
}

floor_word!(AtomicU32, AtomicU64);

impl<W: FloorWord> Floor<W> {
    pub fn new(_: Load) -> Floor<W> {
        let mut map = HashMap::with_hasher(Default::default());
        for k in 0..=KEYS {
            map.insert(k, Default::default());
        }
        Floor {
            map,
            clock: CoarseClock::new(),
        }
    }
}

impl<W: FloorWord> Check for Floor<W> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        let now = self.clock.now_nanos();
        let Some((head, ring)) = self.map.get(key) else {
            return false;
        };
        let used: u64 = head.load(SeqCst) + ring.iter().map(W::get).sum::<u64>();
        used < u64::MAX && ring[(now >> 26) as usize % 16].bump()
    }
}

//! The keyed limiter: a map from key to [`Ring`](crate::ring::Ring), cut
//! into partitions of inline tables, with idle keys evicted on the request
//! path and a hard cap on how many keys are tracked.

use crate::clock::{saturating_nanos, AutoClock, Clock};
use crate::decision::{Decision, Outcome};
use crate::error::ConfigError;
use crate::metrics::LimiterMetrics;
use crate::partition::{Partition, Slot, Writing};
use crate::policy::Policy;
use crate::ring::{
    bucket_count_max, peek_empty, Compact, Geometry, Head, OwnedRing, Ring, Wide, WindowSnapshot,
};
use crate::stats::{Counters, KeyUsage, LimiterStats};
use crate::table::MAX_CAPACITY;
use crate::trim;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::{Interval, MissedTickBehavior};

/// foldhash's quality variant, not its fast one: the tables probe linearly
/// from a home taken from the hash's low bits, and the fast variant's hash
/// of consecutive integers (ids, addresses of one range) is a near-linear
/// sequence in those bits. For some of its per-process seeds that sequence
/// packs homes into long runs (2048 consecutive keys in 5120 slots: up to 35
/// probes a lookup where a random spread takes 1.33); the quality variant's
/// one more folded multiply breaks it, whatever the seed.
type Hasher = foldhash::quality::RandomState;

/// [`Hasher`] with a seed of the test's choosing, for the tests of its spread.
#[cfg(all(test, not(tsw_loom)))]
pub(crate) fn seeded_hasher(shared_seed: u64) -> foldhash::quality::SeedableRandomState {
    let shared = Box::leak(Box::new(foldhash::SharedSeed::from_u64(shared_seed)));
    foldhash::quality::SeedableRandomState::with_seed(shared_seed, shared)
}

/// A key to look up, with its hash. A check hashes its key once: the hash
/// picks the partition (bits 48..56), the overflow mark (bits 32..42), the
/// key's home slot in the partition's table (the low 32 bits) and its tag
/// there (the top 7).
struct Lookup<'k, K> {
    hash: u64,
    key: &'k K,
}

/// Where the partition index starts in a key's hash (see `Lookup`).
const PARTITION_SHIFT: u32 = 48;

/// Entries per partition the map is sized for: one eviction step sweeps one
/// partition, so this bounds the work a single request can be asked to do, up
/// to `MAX_PARTITIONS` partitions (a cap of 1M keys). Beyond, a partition holds
/// a 256th of the cap.
const KEYS_PER_PARTITION: usize = 4096;
const MAX_PARTITIONS: usize = 256;
/// The highest cap (about 2^32 keys, some 400 GB of them): a partition's
/// share of it stays at half the most keys a table can hold, far beyond
/// what uneven partitions can add, so a table never has to grow past that.
const MAX_KEYS: usize = MAX_PARTITIONS * (MAX_CAPACITY / 2);
/// Groups of keys with their own overflow mark (8 KB per limiter). A key that
/// shares its group's mark with one the overflow ring counted starts its ring
/// as a copy of the overflow ring: more groups, fewer such keys.
const OVERFLOW_MARKS: usize = 1024;

/// A keyed sliding-window rate limiter, usable on its own or behind the tower layer.
///
/// Each key owns a lock-free ring of sub-window counters (see [`Policy`] and
/// [`Precision`](crate::Precision) for the guarantee). Keys are created on first
/// use and dropped once idle (all their buckets expired), by the limiter itself:
/// one check per bucket width sweeps one partition of the map, so no request ever
/// pays for a full sweep. Checks alone leave idle keys in place once traffic
/// stops: after a flood of one-off keys, the last of them waits for as many
/// later bucket widths with a check as there are partitions (up to 256).
/// [`LimiterBuilder::sweep_idle`] adds a tokio task that sweeps every
/// partition once per bucket width, so idle keys are gone within a window and
/// a bucket of their last use, with no traffic at all. A key type with one
/// value (zero-sized, such as `()`, the key of [`GlobalKey`](crate::GlobalKey))
/// has one ring, outside the map, for the limiter's life: its check neither
/// hashes nor looks up, and it counts as one tracked key from the start.
///
/// **At `max_keys`:** the first check in each bucket width for a key that is not
/// yet tracked sweeps one partition for idle keys (the rest of a flood of new
/// keys pays no sweep); if the limiter is still full, the key shares one
/// overflow ring (same policy) with every other untracked key. Tracked keys are
/// never evicted while they hold counts in the window, so flooding the limiter with
/// new keys can never erase, and so reset, a heavy user's count. The flood only
/// competes with itself (and with other new keys) in the overflow ring. Once room
/// frees up, new keys are tracked again. A key the overflow ring counted within
/// the last window (or one sharing its mark: one of 1024, by hash) starts its
/// own ring as a copy of the overflow ring's counts, so it never sheds units
/// still in its window; that copy over-counts (the other keys' units too) for at
/// most one window.
///
/// **Memory:** keys live in a few large tables, each key's ring inline, with
/// no allocation per key: about 98 bytes of heap per tracked u64 key (107
/// for an `IpAddr`) with the default 15 buckets and a limit up to 65 535
/// (94 MiB for 1M keys), twice the bucket bytes for larger limits, and a few
/// KiB for an empty limiter. Tables shrink as their keys are dropped, and go
/// back to the allocator whole; under glibc's malloc the limiter then asks
/// for the memory to go back to the system too, so RSS falls after a flood
/// without help from the application. The [memory guide](crate::guide::memory)
/// has figures and what we recommend.
///
/// **Time:** by default a limiter reads an [`AutoClock`], chosen when it is built:
/// tokio's clock inside a paused tokio runtime (tests drive it with
/// `tokio::time::advance`), otherwise the coarse monotonic clock (a few
/// nanoseconds a read; reading the precise clock was the largest single cost of a
/// check), or the precise one when the policy's buckets are too narrow for it.
/// [`LimiterBuilder::clock`] picks another ([`TokioClock`](crate::clock::TokioClock),
/// [`ManualClock`](crate::ManualClock), or any [`Clock`]). A reading later than
/// 2^60 bucket widths after the clock's origin (or within a few windows of the
/// end of the u64 nanosecond range) is held there, and the limiter then sees
/// time stand still instead of wrapping. The crate's clocks start near zero,
/// so only a hand-set clock gets that far; a custom clock counting from a
/// distant origin (the Unix epoch: 2^60 widths of 1 ns are already behind it)
/// needs buckets wide enough, or an origin of its own.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{Limiter, ManualClock, Policy};
///
/// let clock = ManualClock::new();
/// let limiter = Limiter::builder(Policy::per(2, Duration::from_secs(1)).unwrap())
///     .clock(clock.clone())
///     .build()
///     .unwrap();
///
/// assert!(limiter.check(&"10.0.0.1").is_allowed());
/// assert!(limiter.check(&"10.0.0.1").is_allowed());
/// assert!(!limiter.check(&"10.0.0.1").is_allowed());
/// assert!(limiter.check(&"10.0.0.2").is_allowed()); // keys are independent
///
/// clock.advance(Duration::from_millis(1100)); // one window plus one bucket
/// assert!(limiter.check(&"10.0.0.1").is_allowed());
/// ```
pub struct Limiter<K, C = AutoClock> {
    state: Shared<K, C>,
    /// The policy this handle enforces, as the ring computes with it. Handles
    /// made by [`reconfigured`](Limiter::reconfigured) with the same window and
    /// buckets share `state` and differ only here (limit, precision, name), so a
    /// check reads its limit from the handle, not from the shared state.
    geometry: Geometry,
    policy: Policy,
    /// The background sweeper ([`LimiterBuilder::sweep_idle`]), shared by the
    /// handles sharing `state` and aborted when the last of them drops, so that
    /// it ends at once; it holds the state only weakly in any case.
    sweeper: Option<Arc<Sweeper>>,
}

/// A limiter's state, in the layout its rings take: compact where the
/// policy fits it (see `ring::layout`), else wide.
enum Shared<K, C> {
    Compact(Arc<State<K, C, Compact>>),
    Wide(Arc<State<K, C, Wide>>),
}

impl<K, C> Clone for Shared<K, C> {
    fn clone(&self) -> Self {
        match self {
            Shared::Compact(state) => Shared::Compact(Arc::clone(state)),
            Shared::Wide(state) => Shared::Wide(Arc::clone(state)),
        }
    }
}

impl<K, C> From<Arc<State<K, C, Compact>>> for Shared<K, C> {
    fn from(state: Arc<State<K, C, Compact>>) -> Self {
        Shared::Compact(state)
    }
}

impl<K, C> From<Arc<State<K, C, Wide>>> for Shared<K, C> {
    fn from(state: Arc<State<K, C, Wide>>) -> Self {
        Shared::Wide(state)
    }
}

/// `$body` with `$state` bound to the state behind `$shared`, in whichever
/// layout it is (the body is compiled once for each).
macro_rules! with_state {
    ($shared:expr, $state:ident => $body:expr) => {
        match $shared {
            Shared::Compact($state) => $body,
            Shared::Wide($state) => $body,
        }
    };
}

/// Aborts the background sweeper task when dropped.
struct Sweeper(AbortHandle);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A limiter's keys, rings and settings, behind the [`Limiter`] handle, its
/// rings in layout `H`.
struct State<K, C, H: Head> {
    /// The window and buckets of every handle on this state (their limit and
    /// precision may differ: those are the handle's). Only the shape is read
    /// here: slots, spans, idleness. Decisions take the handle's geometry.
    shape: Geometry,
    /// Shared, not cloned: a limiter with a new window and buckets gets a new
    /// state, on the same clock, and `Clock` is not `Clone`.
    clock: Arc<C>,
    /// Where and how often the background sweeper runs, for the state a
    /// change of window or buckets makes.
    sweep: Option<SweepPlan>,
    hasher: Hasher,
    partitions: Box<[Partition<K, H>]>,
    overflow: OwnedRing<H>,
    /// The one ring of a key type with a single value (zero-sized: the global
    /// key `()`), kept outside the map: its check neither hashes nor looks up.
    /// Never swept, as there is no other key to make room for.
    single: Option<OwnedRing<H>>,
    max_keys: usize,
    keys: AtomicUsize,
    /// Start (in clock nanoseconds) of the slot at which the next sweep step is
    /// due: kept in nanoseconds so the per-check test needs no division.
    next_sweep_at: AtomicU64,
    /// Like `next_sweep_at`, for the sweep a new key makes at the cap.
    full_sweep_at: AtomicU64,
    /// `first_in_bucket` fires while `now - due` (mod 2^64) is below this:
    /// `now` at or past `due`, or more than a span (N + 1 buckets, plus the
    /// bucket `due` runs ahead) before it, where the clock was set back. The
    /// sweep is then due at once, not once the clock has caught up again.
    /// (`Geometry::hold` keeps `now` below `2^64 - (N + 2) widths`, so the two
    /// ranges never meet.)
    due_or_set_back: u64,
    sweep_cursor: AtomicUsize,
    /// The newest clock reading any sweep (or rebuild) judged idleness at. A
    /// ring created after its key was evicted starts no earlier, so a check that
    /// read the clock before the eviction (or a clock that stepped back) is never
    /// recorded in a span beside the evicted units, which the new ring cannot see.
    swept_at: AtomicU64,
    /// Per group of keys (by hash), the first slot at which every unit the
    /// overflow ring admitted for them has left the window. A key created before
    /// then starts as a copy of the overflow ring.
    overflow_marks: Box<[AtomicU64]>,
    evicted: AtomicU64,
    overflowed: AtomicU64,
    counters: Counters,
    /// The same counts, handed to the `metrics` recorder once per bucket width.
    metrics: LimiterMetrics,
    /// Rounds the background sweeper has finished, for tests to wait on.
    #[cfg(test)]
    sweeper_rounds: AtomicU64,
    /// Run once where a check at the cap stalls before it takes the writer's
    /// lock, for the tests of that interleaving.
    #[cfg(test)]
    stall_at_cap: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

#[derive(Clone)]
struct SweepPlan {
    runtime: tokio::runtime::Handle,
    every: Duration,
}

/// Builder for [`Limiter`]: the clock, the key cap and the background sweeper.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` makes the limiter"]
pub struct LimiterBuilder<C> {
    policy: Policy,
    clock: C,
    max_keys: usize,
    sweep_every: Option<Duration>,
}

impl<C> LimiterBuilder<C> {
    /// Use another clock (a [`ManualClock`](crate::ManualClock) in tests, say).
    pub fn clock<C2: Clock>(self, clock: C2) -> LimiterBuilder<C2> {
        LimiterBuilder {
            policy: self.policy,
            clock,
            max_keys: self.max_keys,
            sweep_every: self.sweep_every,
        }
    }

    /// The most keys tracked at once (default [`Limiter::DEFAULT_MAX_KEYS`]).
    /// A cap above 4 294 967 040 (about 2^32 keys, some 400 GB of memory) is
    /// taken as that.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Also sweep idle keys from a tokio task, once every bucket width (the
    /// policy's window / buckets), with or without traffic: see
    /// [`sweep_idle_every`](Self::sweep_idle_every), which this calls with the
    /// bucket width. Off by default.
    ///
    /// Checks sweep by themselves, one partition per bucket width, so they
    /// keep up with a steady stream of keys; but keys left by a flood with no
    /// traffic after it stay until later checks (or [`Limiter::evict_idle`])
    /// reach them. With this, a key is gone within a window and a bucket of its
    /// last check (plus tokio's 1 ms timer tick, and the coarse clock's tick
    /// where the limiter reads it), whatever the traffic.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{Limiter, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_sliding_window::ConfigError> {
    /// // Inside a tokio runtime: the sweeper is a task on it.
    /// let limiter: Limiter<String> =
    ///     Limiter::builder(Policy::per(100, Duration::from_secs(60))?)
    ///         .sweep_idle()
    ///         .build()?;
    /// # let _ = limiter;
    /// # Ok(()) }
    /// ```
    pub fn sweep_idle(self) -> Self {
        let every = self.policy.bucket_width();
        self.sweep_idle_every(every)
    }

    /// Also sweep idle keys from a tokio task, once every `every` (off by
    /// default; [`sweep_idle`](Self::sweep_idle) picks the bucket width).
    ///
    /// [`build`](Self::build) spawns the task on the current tokio runtime, so
    /// it must be called inside one, with time enabled (as in `#[tokio::main]`
    /// and `#[tokio::test]`); outside one it returns
    /// [`ConfigError::NoRuntime`], and a zero `every` is
    /// [`ConfigError::ZeroSweepPeriod`]. The task holds the limiter's state
    /// only weakly: it never keeps the limiter alive, and it ends when the
    /// limiter is dropped (a layer's limiters: when the layer and every
    /// service made from it are dropped).
    ///
    /// Each round visits every partition of the map in turn (as
    /// [`Limiter::evict_idle`] does) and yields to the runtime between
    /// partitions, so a round never holds a worker for longer than one
    /// partition's sweep (about 1/256 of the keys at a cap of 1M; fewer keys
    /// per partition at lower caps). A round visits every tracked key, idle or
    /// not, so its cost grows with the keys tracked: at one round per bucket of
    /// 66.7 ms, about 1% of a core with 100 000 keys and over half a core with
    /// 1M (see the [memory guide](crate::guide::memory)); a cap of millions
    /// wants a longer period. A sweep never evicts a key that holds units in
    /// its window.
    ///
    /// **Time:** rounds fall on tokio's clock, every `every`; whether a key is
    /// idle is judged by the limiter's clock, read at each partition. The two
    /// agree for the default [`AutoClock`] (on tokio's clock in a paused
    /// runtime, so `tokio::time::advance` drives both) and for the monotonic
    /// clocks, and rounds are then aligned to the limiter's buckets, so a round
    /// falls just as keys turn idle. With a
    /// [`ManualClock`](crate::ManualClock) (or any clock that does not follow
    /// tokio's), rounds still run every `every` of tokio time, and evict only
    /// the keys idle by the reading of the limiter's clock.
    pub fn sweep_idle_every(mut self, every: Duration) -> Self {
        self.sweep_every = Some(every);
        self
    }

    /// Validate against the clock and build; with a sweeper, spawn it on the
    /// current tokio runtime ([`sweep_idle_every`](Self::sweep_idle_every)).
    ///
    /// Keys are `Send + Sync + 'static`, as a sweeper task needs them (and as
    /// a tower layer's do).
    pub fn build<K: Hash + Eq + Clone + Send + Sync + 'static>(
        self,
    ) -> Result<Limiter<K, C>, ConfigError>
    where
        C: Clock,
    {
        let sweep = match self.sweep_every {
            None => None,
            Some(every) if every.is_zero() => return Err(ConfigError::ZeroSweepPeriod),
            Some(every) => Some(SweepPlan {
                runtime: tokio::runtime::Handle::try_current()
                    .map_err(|_| ConfigError::NoRuntime)?,
                every,
            }),
        };
        check_resolution(&self.policy, &self.clock)?;
        if self.max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let (state, sweeper) = start(
            Geometry::new(&self.policy),
            &self.policy,
            Arc::new(self.clock),
            self.max_keys,
            sweep,
            None,
        );
        Ok(Limiter {
            state,
            geometry: Geometry::new(&self.policy),
            policy: self.policy,
            sweeper,
        })
    }
}

/// A state as `start` makes it, with its sweeper if it has one.
type Started<K, C> = (Shared<K, C>, Option<Arc<Sweeper>>);

/// A new state for `geometry` in the layout it fits, holding the counts of
/// `from` if given (carried over: see [`Limiter::reconfigured`]), and its
/// sweeper if `sweep` asks for one.
fn start<K, C>(
    geometry: Geometry,
    policy: &Policy,
    clock: Arc<C>,
    max_keys: usize,
    sweep: Option<SweepPlan>,
    from: Option<&Shared<K, C>>,
) -> Started<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    fn make<K, C, H>(
        geometry: Geometry,
        policy: &Policy,
        clock: Arc<C>,
        max_keys: usize,
        sweep: Option<SweepPlan>,
        from: Option<&Shared<K, C>>,
    ) -> Result<Started<K, C>, CountTooLarge>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        C: Clock,
        H: Head,
        Shared<K, C>: From<Arc<State<K, C, H>>>,
    {
        let shape = geometry.for_head::<H>();
        let reading = clock.now_nanos();
        let now = shape.hold(reading);
        let mut state = State::new(shape, policy, clock, max_keys, sweep.clone(), now);
        if let Some(from) = from {
            with_state!(from, old => state.carry_over(old, reading))?;
        }
        let state = Arc::new(state);
        let sweeper = state.spawn_sweeper(now);
        Ok((state.into(), sweeper))
    }
    if geometry.fits_compact() {
        if let Ok(made) = make::<K, C, Compact>(
            geometry,
            policy,
            Arc::clone(&clock),
            max_keys,
            sweep.clone(),
            from,
        ) {
            return made;
        }
        // A carried count a compact bucket cannot hold: held at its largest,
        // it would be safe only while this limit is in force, and a later
        // change to a higher limit would carry the held count, not the true
        // one. Wide rings hold any count a limit can reach.
    }
    make::<K, C, Wide>(geometry, policy, clock, max_keys, sweep, from).unwrap_or_else(
        |CountTooLarge| unreachable!("a wide bucket holds any count a limit reaches"),
    )
}

/// A count carried into a ring whose buckets cannot hold it (see `start`).
#[derive(Debug)]
struct CountTooLarge;

/// A policy's buckets must be at least as wide as the clock's resolution.
fn check_resolution<C: Clock>(policy: &Policy, clock: &C) -> Result<(), ConfigError> {
    let resolution = clock.resolution();
    if policy.bucket_width() < resolution {
        return Err(ConfigError::BucketBelowClockResolution {
            bucket: policy.bucket_width(),
            resolution,
        });
    }
    Ok(())
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock, H: Head> State<K, C, H> {
    /// An empty state of `shape` (a policy's geometry, for `H`) entered at `now`.
    fn new(
        shape: Geometry,
        policy: &Policy,
        clock: Arc<C>,
        max_keys: usize,
        sweep: Option<SweepPlan>,
        now: u64,
    ) -> State<K, C, H> {
        let max_keys = max_keys.min(MAX_KEYS);
        let next_sweep_at = next_slot_start(now, shape.width());
        let single = (std::mem::size_of::<K>() == 0).then(|| OwnedRing::new(&shape, now));
        let partitions = if single.is_some() {
            1
        } else {
            (max_keys / KEYS_PER_PARTITION)
                .next_power_of_two()
                .clamp(1, MAX_PARTITIONS)
        };
        State {
            overflow: OwnedRing::new(&shape, now),
            shape,
            hasher: Hasher::default(),
            partitions: (0..partitions)
                .map(|_| Partition::new(shape.ring_len()))
                .collect(),
            keys: AtomicUsize::new(single.is_some().into()),
            single,
            max_keys,
            next_sweep_at: AtomicU64::new(next_sweep_at),
            full_sweep_at: AtomicU64::new(0),
            due_or_set_back: ((shape.span_slots() + 1) * shape.width()).wrapping_neg(),
            sweep_cursor: AtomicUsize::new(0),
            swept_at: AtomicU64::new(now),
            overflow_marks: (0..OVERFLOW_MARKS).map(|_| AtomicU64::new(0)).collect(),
            evicted: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            counters: Counters::default(),
            metrics: LimiterMetrics::new(policy.name()),
            clock,
            sweep,
            #[cfg(test)]
            sweeper_rounds: AtomicU64::new(0),
            #[cfg(test)]
            stall_at_cap: std::sync::Mutex::new(None),
        }
    }

    /// Spawn the background sweeper of `self.sweep` (none for a key type with
    /// one value: it has no map to sweep), `now` being the clock's reading.
    fn spawn_sweeper(self: &Arc<Self>, now: u64) -> Option<Arc<Sweeper>> {
        let plan = self.sweep.as_ref().filter(|_| self.single.is_none())?;
        // In the runtime's context: a runtime without timers panics here, not
        // in the task (and `reconfigured` may run outside the runtime).
        let _context = plan.runtime.enter();
        // The first round at the next multiple of `every` on the limiter's
        // clock: with a period of a bucket width, rounds fall where keys
        // turn idle, not up to a period after. A clock that reads in
        // steps (the coarse one) gets there up to a step late: the
        // rounds wait that much more. (A period past the 584 years of u64
        // nanoseconds is held there, so that no tokio instant overflows.)
        let every_ns = saturating_nanos(plan.every);
        let step = self
            .clock
            .resolution()
            .saturating_sub(Duration::from_nanos(1));
        let first = Duration::from_nanos(every_ns - now % every_ns) + step;
        let mut rounds = tokio::time::interval_at(
            tokio::time::Instant::now() + first,
            Duration::from_nanos(every_ns),
        );
        // A late round (a slow sweep, a busy runtime) keeps the alignment.
        rounds.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let task = plan.runtime.spawn(sweep_idle(Arc::downgrade(self), rounds));
        Some(Arc::new(Sweeper(task.abort_handle())))
    }
}

/// The background sweeper: each round sweeps every partition with keys,
/// yielding between them. It upgrades its `Weak` for one partition at a time,
/// so it never holds the state while it waits, and returns once the state is
/// gone.
async fn sweep_idle<K, C, H>(state: Weak<State<K, C, H>>, mut rounds: Interval)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
    H: Head,
{
    loop {
        rounds.tick().await;
        let Some(partitions) = state.upgrade().map(|state| state.partitions.len()) else {
            return;
        };
        for p in 0..partitions {
            let Some(state) = state.upgrade() else {
                return;
            };
            // An empty partition costs nothing to skip.
            let swept = !state.partitions[p].is_empty();
            if swept {
                state.sweep_partition(p, state.now());
            }
            let last = p + 1 == partitions;
            if last {
                #[cfg(feature = "metrics")]
                let _ = state.stats(); // hands the counts to the metrics recorder
                #[cfg(test)]
                state.sweeper_rounds.fetch_add(1, SeqCst);
            }
            drop(state);
            // Before yielding: the round's memory goes back as it ends.
            trim::trim_off_worker_if(if last {
                trim::TRIM_AFTER_ROUND
            } else {
                trim::TRIM_AFTER
            })
            .await;
            if swept {
                tokio::task::yield_now().await;
            }
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Limiter<K, AutoClock> {
    /// A limiter on the default clock ([`AutoClock`]) with the default key cap.
    pub fn new(policy: Policy) -> Result<Self, ConfigError> {
        Limiter::builder(policy).build()
    }
}

impl Limiter<(), AutoClock> {
    /// Start building a limiter for `policy`, on the default clock: an
    /// [`AutoClock`] chosen for the policy's bucket width (tokio's clock when built
    /// inside a paused tokio runtime; otherwise a cheap coarse monotonic clock, or
    /// the precise one for narrow buckets).
    pub fn builder(policy: Policy) -> LimiterBuilder<AutoClock> {
        LimiterBuilder {
            clock: AutoClock::for_bucket(policy.bucket_width()),
            policy,
            max_keys: Limiter::DEFAULT_MAX_KEYS,
            sweep_every: None,
        }
    }

    /// Default cap on tracked keys: 100 000 (about 11 MiB with small keys and the
    /// default policy).
    pub const DEFAULT_MAX_KEYS: usize = 100_000;
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// A limiter that enforces `policy` from now on over this limiter's counts
    /// (what [`Store::reconfigured`](crate::Store::reconfigured) does for the
    /// in-memory store). This limiter stays usable: a check in flight finishes
    /// under the old policy, and [`undo`](Self::undo) still gives back its own
    /// decisions.
    ///
    /// **Same window and buckets** (the limit, precision or name may differ):
    /// both limiters share the keys, rings and key cap; only the limit they
    /// compare with differs. Raising the limit gives room at once; lowering it
    /// denies until the units already admitted leave the window. An undo on
    /// either limiter frees room for both. They share the stats, the sweeps
    /// and the background sweeper, which ends with the last of them. One
    /// exception: a limit raised past 65 535 from one at or below it needs
    /// wider rings (see the [memory guide](crate::guide::memory)), so the
    /// counts are carried as below.
    ///
    /// **Another window or bucket count:** the rings cannot be kept. Every
    /// key's counts still in the old window are carried into a new map at once
    /// (a walk over the tracked keys): the units of each old bucket go to the
    /// new bucket holding that old bucket's last instant, or the current one if
    /// that instant is later, so each unit is moved later in time, never
    /// earlier; units whose new bucket has already left the new window are
    /// dropped (they were admitted before it too). The overflow ring is carried
    /// the same way. Counts are carried whole: where a carried bucket holds
    /// more than the compact rings of a limit up to 65 535 can (units
    /// admitted under a higher limit), the new limiter takes wide rings, so a
    /// later change back to a higher limit still counts every unit. The new limiter has stats of its own, starting from zero,
    /// and a sweeper of its own when this one has one (every new bucket width
    /// if this one's swept every bucket width, else at the same period, on the
    /// same runtime). Checks and undos on this limiter after the call no longer
    /// reach the new one.
    ///
    /// **Guarantee** (strict precision): after a change at time `c` from
    /// `L1` per `W1` to `L2` per `W2`, every check at `t ≥ c` by the new limiter
    /// admits only if the units it counts, plus its cost, fit in `L2`; the units
    /// counted are every unit the new limiter admitted, and every unit admitted
    /// before `c` at a true time `τ > c − W1` (those the old policy still
    /// remembered), each at a time no earlier than its true one, and so counted
    /// while it is within `W2` of `t`. Hence in no interval of length `W2`
    /// after `c` does the new limiter admit past `L2` over those units. Across
    /// several changes the same holds change by change: a unit forgotten by one
    /// change stays forgotten. A check in flight across the change (or on this
    /// limiter after it) may be decided under the old policy, and with a new
    /// window or buckets its units may be missed by the new limiter.
    ///
    /// The one error is [`ConfigError::BucketBelowClockResolution`], as
    /// [`LimiterBuilder::build`] answers it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{Limiter, ManualClock, Policy};
    ///
    /// let clock = ManualClock::new();
    /// let two = Limiter::builder(Policy::per(2, Duration::from_secs(1)).unwrap())
    ///     .clock(clock.clone())
    ///     .build()
    ///     .unwrap();
    /// assert!(two.check_n(&"user", 2).is_allowed());
    /// assert!(!two.check(&"user").is_allowed());
    ///
    /// // A raised limit gives room at once, over the same counts.
    /// let three = two.reconfigured(Policy::per(3, Duration::from_secs(1)).unwrap()).unwrap();
    /// assert!(three.check(&"user").is_allowed());
    /// assert!(!three.check(&"user").is_allowed());
    ///
    /// // A longer window keeps the counts: still full.
    /// let longer = three.reconfigured(Policy::per(3, Duration::from_secs(2)).unwrap()).unwrap();
    /// clock.advance(Duration::from_millis(1500));
    /// assert!(!longer.check(&"user").is_allowed());
    /// ```
    pub fn reconfigured(&self, policy: Policy) -> Result<Limiter<K, C>, ConfigError> {
        let clock = with_state!(&self.state, state => Arc::clone(&state.clock));
        check_resolution(&policy, &*clock)?;
        let geometry = Geometry::new(&policy);
        let same_shape =
            policy.window() == self.policy.window() && policy.buckets() == self.policy.buckets();
        let rings_hold_it = match &self.state {
            Shared::Compact(_) => geometry.fits_compact(),
            Shared::Wide(_) => true,
        };
        if same_shape && rings_hold_it {
            // The same rings serve: only the limit (and precision, name) differ,
            // and those are the handle's.
            return Ok(Limiter {
                state: self.state.clone(),
                geometry,
                policy,
                sweeper: self.sweeper.clone(),
            });
        }
        let (sweep, max_keys) = with_state!(&self.state, state => {
            let sweep = state.sweep.as_ref().map(|plan| SweepPlan {
                runtime: plan.runtime.clone(),
                // A sweeper per bucket width follows the buckets.
                every: if plan.every == self.policy.bucket_width() {
                    policy.bucket_width()
                } else {
                    plan.every
                },
            });
            (sweep, state.max_keys)
        });
        let (state, sweeper) = start(geometry, &policy, clock, max_keys, sweep, Some(&self.state));
        Ok(Limiter {
            state,
            geometry,
            policy,
            sweeper,
        })
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock, H: Head> State<K, C, H> {
    /// Fill this new state (of another window, bucket count or layout, not
    /// yet shared) with `old`'s counts as of the clock's `reading`: see
    /// [`Limiter::reconfigured`].
    ///
    /// `old` may be in use meanwhile: its rings are only read (a plain read,
    /// as a copy of the overflow ring is), so a unit counted or undone there
    /// during the walk may or may not be carried. The new rings are seeded
    /// before this state is published, so they need no concurrency argument.
    ///
    /// `Err` if a carried bucket's count is more than `H`'s buckets hold and
    /// less than a limit could be (see `start`): no state is made then.
    fn carry_over<H1: Head>(
        &mut self,
        old: &State<K, C, H1>,
        reading: u64,
    ) -> Result<(), CountTooLarge> {
        let now = self.shape.hold(reading);
        let old_now = old.shape.hold(reading);
        let old_shape = &old.shape;
        // The same hashes: a key's overflow mark (picked by hash) then carries
        // over to the same group.
        self.hasher = old.hasher.clone();
        if let (Some(single), Some(old_single)) = (&mut self.single, &old.single) {
            if let Some((s, counts)) =
                carried::<H1, H>(&self.shape, old_shape, old_single.ring(), old_now, now)?
            {
                *single = OwnedRing::seeded(&self.shape, s, &counts);
            }
        }
        if let Some((s, counts)) =
            carried::<H1, H>(&self.shape, old_shape, old.overflow.ring(), old_now, now)?
        {
            self.overflow = OwnedRing::seeded(&self.shape, s, &counts);
            // The groups whose units the old overflow ring still holds: a key
            // of theirs created here starts as a copy of the new overflow
            // ring, which holds them no later than now.
            let until = self.shape.slot(now) + self.shape.span_slots();
            for (new, old) in self.overflow_marks.iter().zip(old.overflow_marks.iter()) {
                if old_shape.slot(old_now) < old.load(SeqCst) {
                    new.store(until, SeqCst);
                }
            }
        }
        // A key evicted there restarts here no earlier than there (see `swept_at`).
        let swept = self.shape.hold(old.swept_at.load(SeqCst));
        self.swept_at.store(now.max(swept), SeqCst);
        let mut tracked = 0;
        let mut too_large = None;
        for partition in old.partitions.iter() {
            partition.for_each(|key, ring| {
                let carried = carried::<H1, H>(&self.shape, old_shape, ring, old_now, now);
                let Some((s, counts)) = carried.unwrap_or_else(|e| {
                    too_large = Some(e);
                    None
                }) else {
                    return;
                };
                let key = self.lookup(key);
                let mut writing = self.partition(&key).write();
                if writing.find(key.hash, key.key) == Slot::Absent {
                    let init = (&self.shape, s, &counts[..]);
                    // Every ring inserted here holds units: none is idle.
                    let hasher = &self.hasher;
                    writing.insert(key.hash, key.key.clone(), init, now, hasher, &self.swept_at);
                    tracked += 1;
                }
            });
        }
        self.keys.fetch_add(tracked, Relaxed);
        too_large.map_or(Ok(()), Err)
    }
}

/// The counts of `ring` (of shape `old`, read at `old_now`) carried into
/// shape `g` at `now`, as a slot and counts by age: each old bucket's units
/// at the new slot of its last instant, or of `now` if that is later; left out
/// if that slot has left the span at `now`. `None` if nothing is left.
///
/// `Err` if a count is more than a bucket of layout `H2` holds while a limit
/// could be higher: held, it would read lower than the units it stands for
/// under that limit. (A count held at the wide layout's largest still reads
/// at or above any limit, so it denies as the units would.)
fn carried<H1: Head, H2: Head>(
    g: &Geometry,
    old: &Geometry,
    ring: Ring<'_, H1>,
    old_now: u64,
    now: u64,
) -> Result<Option<(u64, Vec<u64>)>, CountTooLarge> {
    let (old_slot, old_counts) = ring.counts_by_age(old, old_now);
    let s = g.slot(now);
    let mut counts = vec![0u64; g.span_slots() as usize];
    for (age, &units) in (0..).zip(old_counts.iter()) {
        if units == 0 || age > old_slot {
            continue;
        }
        let last = (old_slot - age + 1)
            .saturating_mul(old.width())
            .saturating_sub(1);
        // At or before `now`, so no later than slot `s`.
        let new_age = s - g.slot(last.min(now));
        if let Some(c) = counts.get_mut(new_age as usize) {
            *c += units;
        }
    }
    let most = bucket_count_max::<H2>();
    if most < u64::from(u32::MAX) && counts.iter().any(|&c| c > most) {
        return Err(CountTooLarge);
    }
    Ok(counts.iter().any(|&c| c > 0).then_some((s, counts)))
}

impl<K: Hash + Eq + Clone, C: Clock> Limiter<K, C> {
    /// Check one unit for `key`, counting it if it fits.
    #[inline]
    pub fn check(&self, key: &K) -> Decision {
        self.check_n(key, 1)
    }

    /// Check `cost` units for `key`, counting them if they fit. A cost above the
    /// limit is [`Outcome::CostExceedsLimit`](crate::Outcome::CostExceedsLimit):
    /// it can never pass, so it is not a wait.
    #[inline]
    pub fn check_n(&self, key: &K, cost: u32) -> Decision {
        with_state!(&self.state, state => state.check_n(&self.geometry, key, cost))
    }

    /// What `check_n(key, cost)` would decide now, without counting anything.
    ///
    /// One difference, at `max_keys`: a check of an untracked key may first
    /// sweep a partition for idle keys (see [`Limiter`]) and, if that makes
    /// room, track the key; `peek` changes nothing, so it reports what the
    /// overflow ring would decide.
    pub fn peek(&self, key: &K, cost: u32) -> Decision {
        with_state!(&self.state, state => state.peek(&self.geometry, key, cost))
    }

    /// Give back the units an allowed `decision` for `key` counted: for a request
    /// that was admitted but then not sent (another policy denied it, a waiter was
    /// cancelled, a reservation went unused). Safe to call late: units whose bucket
    /// has already expired are simply gone.
    ///
    /// Units given back free room at once. A check racing the undo may still
    /// count them (the safe side); so does a key's own ring that started as a
    /// copy of the overflow ring after an overflow decision it now undoes (the
    /// units go back to the overflow ring; the copy keeps them for up to a
    /// window), and a ring being moved to a rebuilt table as the undo runs.
    ///
    /// Undo a decision **once**, and only for the key it was made for. A
    /// [`Decision`] is a plain value (`Copy`) and carries no record of having been
    /// undone: giving the same units back twice frees room that other requests
    /// still hold, and then more than the limit can pass in a window (for an
    /// overflow decision, room other keys in the shared overflow ring hold).
    pub fn undo(&self, key: &K, decision: &Decision) {
        with_state!(&self.state, state => state.undo(key, decision))
    }

    /// The key's usage right now (nothing counted).
    pub fn usage(&self, key: &K) -> KeyUsage {
        let d = self.peek(key, 0);
        KeyUsage {
            used: d.limit() - d.remaining(),
            remaining: d.remaining(),
            limit: d.limit(),
            reset: d.reset(),
        }
    }

    /// Limiter-wide totals. With the `metrics` feature, reading them also hands
    /// the counts since the last flush to the recorder (as the limiter does
    /// once per bucket width).
    pub fn stats(&self) -> LimiterStats {
        with_state!(&self.state, state => state.stats())
    }

    /// The policy this limiter enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        with_state!(&self.state, state => &state.clock)
    }

    /// Sweep every partition for idle keys now, returning how many were
    /// dropped. Never needed for correctness (an idle key's ring counts
    /// nothing), and checks sweep by themselves; useful before reading stats,
    /// or to drop the keys a flood left on a schedule of your own (which
    /// [`LimiterBuilder::sweep_idle`] does from a tokio task). A partition
    /// left with few keys is rebuilt smaller, and the memory of its old table
    /// goes back to the allocator in a few large blocks.
    pub fn evict_idle(&self) -> usize {
        with_state!(&self.state, state => state.evict_idle())
    }

    /// The key's window now, bucket by bucket, for the wait queue's forecast.
    /// Nothing is counted.
    ///
    /// A key without a ring is read as [`peek`](Self::peek) reads it: at the
    /// cap (or while its group's overflow mark says its new ring would start
    /// as a copy) the overflow ring's window is the one its checks meet; else
    /// an empty window starting no earlier than the latest sweep.
    pub(crate) fn window_snapshot(&self, key: &K) -> WindowSnapshot {
        with_state!(&self.state, state => state.window_snapshot(&self.geometry, key))
    }

    /// True while an admitted `decision` was counted in the current bucket, so
    /// spending it now keeps the window guarantee for the instant it is spent.
    pub(crate) fn is_current(&self, decision: &Decision) -> bool {
        with_state!(&self.state, state => state.is_current(decision))
    }
}

impl<K: Hash + Eq + Clone, C: Clock, H: Head> State<K, C, H> {
    /// Inline: into [`Limiter::check_n`], so the handle's geometry is read at
    /// an offset from the handle, not kept as one more pointer through the
    /// check.
    #[inline]
    fn check_n(&self, g: &Geometry, key: &K, cost: u32) -> Decision {
        let now = self.now();
        let decision = self.decide(g, key, cost, now);
        self.counters.record(decision.is_allowed());
        self.maybe_sweep(now);
        decision
    }

    fn peek(&self, g: &Geometry, key: &K, cost: u32) -> Decision {
        let now = self.now();
        let fits = if cost > g.limit() { 0 } else { cost };
        let decision = self.with_ring(key, |ring| match ring {
            Ok(ring) => ring.peek(g, now, fits),
            Err(key) => self.peek_untracked(g, key, now, fits),
        });
        if cost > g.limit() {
            let mut exceeds =
                Decision::cost_exceeds_limit(g.limit(), decision.remaining(), decision.reset());
            exceeds.overflow = decision.overflow;
            exceeds
        } else {
            decision
        }
    }

    fn undo(&self, key: &K, decision: &Decision) {
        // Undo reads only the shape (the slot's age), not the limit.
        let g = &self.shape;
        if decision.overflow {
            self.overflow.ring().undo(g, decision);
        } else {
            self.with_ring(key, |ring| {
                if let Ok(ring) = ring {
                    ring.undo(g, decision);
                }
            });
        }
    }

    fn stats(&self) -> LimiterStats {
        let (admitted, rejected) = self.counters.totals();
        let stats = LimiterStats {
            admitted,
            rejected,
            keys_tracked: self.keys.load(Relaxed),
            keys_evicted: self.evicted.load(Relaxed),
            overflowed: self.overflowed.load(Relaxed),
        };
        self.metrics
            .flush(admitted, rejected, stats.overflowed, stats.keys_tracked);
        stats
    }

    fn evict_idle(&self) -> usize {
        let now = self.now();
        let dropped = (0..self.partitions.len())
            .map(|p| self.sweep_partition(p, now))
            .sum();
        trim::trim_if(trim::TRIM_AFTER_ROUND);
        dropped
    }

    fn window_snapshot(&self, g: &Geometry, key: &K) -> WindowSnapshot {
        let now = self.now();
        let (slot, counts) = self.with_ring(key, |ring| match ring {
            Ok(ring) => ring.counts_by_age(g, now),
            Err(key) => {
                let start = now.max(self.swept_at.load(SeqCst));
                if self.keys.load(Relaxed) >= self.max_keys
                    || g.slot(start) < self.overflow_mark(key).load(SeqCst)
                {
                    self.overflow.ring().counts_by_age(g, start)
                } else {
                    (g.slot(start), vec![0; g.buckets() as usize + 1])
                }
            }
        });
        WindowSnapshot {
            geometry: *g,
            now,
            slot,
            counts,
        }
    }

    fn is_current(&self, decision: &Decision) -> bool {
        decision.slot >= self.shape.slot(self.now())
    }

    /// The clock's reading, held where the slot arithmetic ends ([`Geometry::hold`]).
    #[inline]
    fn now(&self) -> u64 {
        self.shape.hold(self.clock.now_nanos())
    }

    /// The single ring, for a zero-sized key type (a constant `None` for others).
    #[inline(always)]
    fn single(&self) -> Option<Ring<'_, H>> {
        if std::mem::size_of::<K>() == 0 {
            self.single.as_ref().map(OwnedRing::ring)
        } else {
            None
        }
    }

    /// Calls `f` with `key`'s ring, or without one, with the key to look up.
    fn with_ring<R>(&self, key: &K, f: impl FnOnce(Result<Ring<'_, H>, &Lookup<'_, K>>) -> R) -> R {
        if let Some(ring) = self.single() {
            return f(Ok(ring));
        }
        let key = self.lookup(key);
        self.partition(&key)
            .with_ring(key.hash, key.key, |ring| match ring {
                Some(ring) => f(Ok(ring)),
                None => f(Err(&key)),
            })
    }

    /// `key` with its hash, to look up.
    #[inline]
    fn lookup<'k>(&self, key: &'k K) -> Lookup<'k, K> {
        Lookup {
            hash: self.hasher.hash_one(key),
            key,
        }
    }

    #[inline]
    fn partition(&self, key: &Lookup<'_, K>) -> &Partition<K, H> {
        let index = (key.hash >> PARTITION_SHIFT) as usize;
        &self.partitions[index & (self.partitions.len() - 1)]
    }

    /// The common case inline (a tracked key whose ring decides at once); every
    /// other case out of line, so the common one carries none of their weight.
    #[inline(always)]
    fn decide(&self, g: &Geometry, key: &K, cost: u32, now: u64) -> Decision {
        if let Some(ring) = self.single() {
            if cost > g.limit() {
                return self.peek(g, key, cost);
            }
            return ring.acquire(g, now, cost);
        }
        let key = self.lookup(key);
        if cost <= g.limit() {
            let table = self.partition(&key).table_or_sealed();
            if let Some(i) = table.find(key.hash, key.key) {
                if let Some(decision) = table.ring(i).try_acquire(g, now, cost) {
                    return decision;
                }
            }
        }
        self.decide_rest(g, key, cost, now)
    }

    /// [`decide`](Self::decide) in full: costs above the limit, new keys,
    /// retired rings (dropped, or moving to a rebuilt table), the cap and the
    /// overflow ring.
    #[inline(never)]
    fn decide_rest(&self, g: &Geometry, key: Lookup<'_, K>, cost: u32, now: u64) -> Decision {
        if cost > g.limit() {
            return self.peek(g, key.key, cost);
        }
        let partition = self.partition(&key);
        loop {
            {
                let table = partition.table();
                if let Some(i) = table.find(key.hash, key.key) {
                    if let Some(decision) = table.ring(i).try_acquire(g, now, cost) {
                        return decision;
                    }
                    // Retired: dropped by a sweep, or being moved by a rebuild.
                    // Once the writer is done, a moved ring is in the table.
                    drop(table);
                    if let Slot::Live(_) = partition.write().find(key.hash, key.key) {
                        continue;
                    }
                }
            }
            if !self.reserve_key(now) {
                break;
            }
            let mut writing = partition.write();
            let slot = writing.find(key.hash, key.key);
            if let Slot::Live(_) = slot {
                // Another check tracked it first: give the reservation back.
                self.keys.fetch_sub(1, Relaxed);
                continue;
            }
            // A sweep publishes `swept_at` before it retires a ring, and under
            // the writer's lock, so this reads the newest relevant one.
            let start = now.max(self.swept_at.load(SeqCst));
            // While the overflow ring may hold this key's units, an empty ring
            // would let the key through twice: start from a copy of the overflow
            // ring's counts, taken after the mark was read, so it holds them.
            let (s, counts) = if g.slot(start) < self.overflow_mark(&key).load(SeqCst) {
                self.overflow.ring().counts_by_age(g, start)
            } else {
                (g.slot(start), Vec::new())
            };
            match slot {
                Slot::Retired(i) => writing.revive(i, g, s, &counts),
                _ => {
                    let init = (g, s, &counts[..]);
                    let (hasher, swept_at) = (&self.hasher, &self.swept_at);
                    let dropped =
                        writing.insert(key.hash, key.key.clone(), init, now, hasher, swept_at);
                    self.count_evicted(dropped);
                }
            }
        }
        self.overflowed.fetch_add(1, Relaxed);
        self.decide_at_cap(g, &key, cost, now)
    }

    /// A check of `key`, untracked, at the cap: decided by the overflow ring,
    /// unless the key has got a ring of its own meanwhile.
    ///
    /// Under the partition's writer lock, which every change of the key's
    /// place in the table (a new ring, a sweep) also holds: the key's ring
    /// cannot appear, take units and be swept between the look for it and
    /// the overflow ring's decision, and the key's overflow mark is raised
    /// before any later ring of the key reads it (so that ring starts as a
    /// copy holding these units). A check that stalled (a clock read long
    /// ago) records no earlier than the latest sweep, read under the lock,
    /// so its units never share a span with those of a ring the sweep
    /// dropped. A denial counts nothing, so it needs no lock.
    #[cold]
    fn decide_at_cap(&self, g: &Geometry, key: &Lookup<'_, K>, cost: u32, now: u64) -> Decision {
        let at = now.max(self.swept_at.load(SeqCst));
        let peeked = self.overflow.ring().peek(g, at, cost);
        if !peeked.is_allowed() {
            return overflow_decision(peeked, at, now);
        }
        #[cfg(test)]
        if let Some(stall) = self.stall_at_cap.lock().unwrap().take() {
            stall();
        }
        let writing = self.partition(key).write();
        if let Slot::Live(i) = writing.find(key.hash, key.key) {
            // Tracked meanwhile: the key's own ring decides, and it cannot
            // be retired while the lock is held.
            return writing.ring(i).acquire(g, now, cost);
        }
        let at = now.max(self.swept_at.load(SeqCst));
        let d = overflow_decision(self.overflow.ring().acquire(g, at, cost), at, now);
        // A check of cost 0 counted nothing for the key: no mark, no copy later.
        if d.is_allowed() && cost > 0 {
            self.overflow_mark(key)
                .fetch_max(d.slot + g.span_slots(), SeqCst);
        }
        drop(writing);
        d
    }

    /// Count `dropped` keys as evicted.
    fn count_evicted(&self, dropped: usize) {
        if dropped > 0 {
            self.keys.fetch_sub(dropped, Relaxed);
            self.evicted.fetch_add(dropped as u64, Relaxed);
        }
    }

    /// Reserve room for one more key. At the cap, the first new key in each
    /// bucket width sweeps one partition for idle keys and tries again; the
    /// others go straight to the overflow ring, so a flood of new keys does not
    /// buy a sweep per request (no ring turns idle until a bucket passes anyway).
    fn reserve_key(&self, now: u64) -> bool {
        if self.try_reserve_key() {
            return true;
        }
        if self.first_in_bucket(&self.full_sweep_at, now) {
            self.sweep_step(now);
            return self.try_reserve_key();
        }
        false
    }

    fn try_reserve_key(&self) -> bool {
        // Only below the cap, so `keys` never reads above it (an add then a
        // take-back would, and could cost a racing key the last place).
        self.keys
            .fetch_update(Relaxed, Relaxed, |n| (n < self.max_keys).then_some(n + 1))
            .is_ok()
    }

    /// [`peek`](Self::peek) for a key without a ring: what
    /// [`decide_rest`](Self::decide_rest) would decide, without counting or
    /// tracking. A new ring starts no earlier than the latest sweep; at the cap
    /// the check counts in the overflow ring at that start, its times measured
    /// from `now`.
    fn peek_untracked(&self, g: &Geometry, key: &Lookup<'_, K>, now: u64, cost: u32) -> Decision {
        let start = now.max(self.swept_at.load(SeqCst));
        if self.keys.load(Relaxed) >= self.max_keys {
            overflow_decision(self.overflow.ring().peek(g, start, cost), start, now)
        } else if g.slot(start) < self.overflow_mark(key).load(SeqCst) {
            self.overflow.copy(g, start).ring().peek(g, now, cost)
        } else {
            peek_empty(g, g.slot(start), now, cost)
        }
    }

    /// The overflow mark of `key`'s group (see `overflow_marks`).
    fn overflow_mark(&self, key: &Lookup<'_, K>) -> &AtomicU64 {
        &self.overflow_marks[(key.hash >> 32) as usize % OVERFLOW_MARKS]
    }

    /// Once per bucket width, the first check to notice sweeps one partition.
    #[inline]
    fn maybe_sweep(&self, now: u64) {
        if self.first_in_bucket(&self.next_sweep_at, now) {
            self.sweep_step(now);
        }
    }

    /// True for the first caller at or after the instant `due` holds, which
    /// moves it on to the start of the next slot: once per bucket width.
    /// `now >= due` is `slot(now) >= due's slot` without the division. Also
    /// for the first caller after the clock was set back more than a span:
    /// else no sweep would run until the clock passed `due` again, and keys
    /// idle by the clock's reading would stay (at the cap, new keys would
    /// overflow) for as long as the clock was set back.
    #[inline]
    fn first_in_bucket(&self, due: &AtomicU64, now: u64) -> bool {
        let at = due.load(Relaxed);
        now.wrapping_sub(at) < self.due_or_set_back
            && due
                .compare_exchange(
                    at,
                    next_slot_start(now, self.shape.width()),
                    Relaxed,
                    Relaxed,
                )
                .is_ok()
    }

    /// One partition's sweep, for a check: a partition whose writer is busy
    /// (adding a key, rebuilding) is left to the next step, so that a check
    /// never waits for another key's writer to sweep.
    fn sweep_step(&self, now: u64) {
        let p = self.sweep_cursor.fetch_add(1, Relaxed) % self.partitions.len();
        if let Some(writing) = self.partitions[p].try_write() {
            self.sweep_with(writing, now);
        }
        #[cfg(feature = "metrics")]
        let _ = self.stats(); // hands the counts to the metrics recorder
    }

    fn sweep_partition(&self, p: usize, now: u64) -> usize {
        self.sweep_with(self.partitions[p].write(), now)
    }

    /// Sweep the partition `writing` holds the lock of.
    fn sweep_with(&self, mut writing: Writing<'_, K, H>, now: u64) -> usize {
        // Before any ring is retired: a check that then finds its key retired or
        // gone starts the new ring no earlier than this.
        self.swept_at.fetch_max(now, SeqCst);
        // A ring retired here may still be in use by a check that found it
        // before; that check then fails and looks again (see `ring`).
        let dropped = writing.sweep(&self.shape, now, &self.hasher);
        self.count_evicted(dropped);
        dropped
    }
}

impl<K, C, H: Head> Drop for State<K, C, H> {
    /// The tables go back to the allocator; their bytes count towards the
    /// next trim (see `trim`).
    fn drop(&mut self) {
        let bytes = self.partitions.iter().map(Partition::bytes).sum();
        self.partitions = Box::new([]);
        // Counted for the next trim (a sweeper's round, or `evict_idle`):
        // a limiter may be dropped on a request's path.
        trim::given_up(bytes);
    }
}

/// A decision of the overflow ring, made at `at` (no earlier than the latest
/// sweep), as of the clock's reading `now`: its times count from `at`, a
/// decision's from `now`.
fn overflow_decision(mut d: Decision, at: u64, now: u64) -> Decision {
    let ahead = at - now;
    if d.outcome() == Outcome::Denied {
        d.retry_after_ns = d.retry_after_ns.saturating_add(ahead);
    }
    d.reset_ns = d.reset_ns.saturating_add(ahead);
    d.overflow = true;
    d
}

/// Where the slot after the one holding `now` begins (saturating at the end of time).
fn next_slot_start(now: u64, bucket_nanos: u64) -> u64 {
    (now / bucket_nanos + 1).saturating_mul(bucket_nanos)
}

impl<K, C> std::fmt::Debug for Limiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (max_keys, keys) =
            with_state!(&self.state, state => (state.max_keys, state.keys.load(Relaxed)));
        f.debug_struct("Limiter")
            .field("policy", &self.policy)
            .field("max_keys", &max_keys)
            .field("keys_tracked", &keys)
            .finish_non_exhaustive()
    }
}
#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;
    use crate::clock::saturating_nanos;
    use crate::{ManualClock, Outcome};
    use std::time::Duration;

    fn limiter(limit: u32, max_keys: usize) -> (Limiter<u64, ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        let limiter = Limiter::builder(Policy::per(limit, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .max_keys(max_keys)
            .build()
            .unwrap();
        (limiter, clock)
    }

    #[test]
    fn a_tracked_key_takes_at_most_128_bytes_of_table_as_the_map_grows() {
        // The tables' arrays (index, keys and heads, buckets), summed
        // over the partitions, per tracked key, for the default policy and
        // u64 keys and IP addresses (17 bytes: the address extractors' key),
        // at key counts that fall anywhere in the tables' growth.
        fn per_key<K: Hash + Eq + Clone + Send + Sync + 'static>(key: impl Fn(u64) -> K) {
            let policy = Policy::per(100, Duration::from_secs(1)).unwrap();
            let l: Limiter<K, ManualClock> = Limiter::builder(policy)
                .clock(ManualClock::new())
                .max_keys(1 << 20)
                .build()
                .unwrap();
            let mut n = 0;
            for target in [30_000u64, 61_000, 97_000, 140_000, 211_000, 300_000] {
                while n < target {
                    assert!(l.check(&key(n)).is_allowed());
                    n += 1;
                }
                let bytes: usize = l
                    .compact()
                    .partitions
                    .iter()
                    .map(|p| p.table().bytes())
                    .sum();
                let each = bytes as f64 / n as f64;
                assert!(each <= 128.0, "{each:.1} bytes a key at {n} keys");
            }
        }
        per_key(|k| k);
        per_key(|k| std::net::IpAddr::from((k as u128).to_be_bytes()));
    }

    #[test]
    fn keys_are_found_while_their_tables_are_rebuilt_under_them() {
        // One partition (a cap of 10 000), grown by a new key at a time from
        // room for 8 keys to thousands: every rebuild moves the keys already
        // there, which must keep their counts.
        let (l, clock) = limiter(3, 10_000);
        assert_eq!(l.compact().partitions.len(), 2);
        for k in 0..6_000u64 {
            assert!(l.check(&k).is_allowed());
            if k % 97 == 0 {
                for old in (0..k).step_by(61) {
                    assert_eq!(
                        l.usage(&old).used,
                        1 + (old % 97 == 0) as u32,
                        "key {old} at {k}"
                    );
                }
                assert!(l.check(&k).is_allowed());
            }
        }
        // Then all go idle but one, and the sweeps hand the tables back.
        let room_before: usize = l
            .compact()
            .partitions
            .iter()
            .map(|p| p.table().capacity())
            .sum();
        clock.advance(Duration::from_millis(1200));
        assert!(l.check(&5).is_allowed());
        l.evict_idle();
        assert_eq!(l.stats().keys_evicted, 5_999);
        let room: usize = l
            .compact()
            .partitions
            .iter()
            .map(|p| p.table().capacity())
            .sum();
        assert!(
            room <= 16 && room_before >= 6_000,
            "room for {room_before} keys, then {room}"
        );
        assert_eq!(l.usage(&5).used, 1);
        assert_eq!(l.stats().keys_tracked, 1);
    }

    #[test]
    fn a_limit_above_65_535_takes_wide_rings_and_keeps_its_counts_when_raised_to_it() {
        let clock = ManualClock::new();
        let policy = |limit| Policy::per(limit, Duration::from_secs(1)).unwrap();
        let compact: Limiter<u64, ManualClock> = Limiter::builder(policy(65_535))
            .clock(clock.clone())
            .build()
            .unwrap();
        assert!(matches!(compact.state, Shared::Compact(_)));
        assert!(compact.check_n(&1, 65_535).is_allowed());
        let wide = compact.reconfigured(policy(70_000)).unwrap();
        assert!(matches!(wide.state, Shared::Wide(_)));
        assert_eq!(wide.usage(&1).used, 65_535);
        assert!(wide.check_n(&1, 4_465).is_allowed());
        assert!(!wide.check(&1).is_allowed());
        // Lowered again, the wide rings serve as they are.
        let lower = wide.reconfigured(policy(100)).unwrap();
        assert!(matches!(lower.state, Shared::Wide(_)));
        assert!(!lower.check(&1).is_allowed());
    }

    #[test]
    fn a_key_type_with_one_value_has_one_ring_outside_the_map() {
        let clock = ManualClock::new();
        let l: Limiter<(), ManualClock> =
            Limiter::builder(Policy::per(2, Duration::from_secs(1)).unwrap())
                .clock(clock.clone())
                .build()
                .unwrap();
        assert_eq!(l.compact().partitions.len(), 1);
        assert_eq!(l.stats().keys_tracked, 1);
        assert!(l.check(&()).is_allowed());
        let second = l.check(&());
        assert!(second.is_allowed());
        assert!(!l.check(&()).is_allowed());
        assert!(!l.peek(&(), 1).is_allowed());
        assert_eq!(l.check_n(&(), 3).outcome(), Outcome::CostExceedsLimit);
        l.undo(&(), &second);
        assert_eq!(l.usage(&()).used, 1);
        assert!(l.check(&()).is_allowed());
        assert!(l.compact().partitions[0].is_empty());
        // Idle for a minute: no sweep drops it, and its window has emptied.
        clock.advance(Duration::from_secs(60));
        assert_eq!(l.evict_idle(), 0);
        assert_eq!(l.stats().keys_tracked, 1);
        assert_eq!(l.usage(&()).used, 0);
        assert!(l.check(&()).is_allowed());
        let stats = l.stats();
        assert_eq!((stats.admitted, stats.rejected), (4, 2));
    }

    #[test]
    fn each_key_is_found_in_its_partition_by_the_one_hash() {
        // 256 partitions: the hash picks the partition and, passed on, the
        // map's slot; every key must be found again, and only its own units.
        let (l, _) = limiter(3, 1 << 20);
        assert_eq!(l.compact().partitions.len(), MAX_PARTITIONS);
        let keys = 0..20_000u64;
        for k in keys.clone() {
            for _ in 0..=(k % 3) {
                let _ = l.check(&k);
            }
        }
        assert_eq!(l.stats().keys_tracked, 20_000);
        let used = l
            .compact()
            .partitions
            .iter()
            .filter(|p| !p.is_empty())
            .count();
        assert!(used > MAX_PARTITIONS * 9 / 10, "{used} partitions in use");
        for k in keys {
            assert_eq!(l.usage(&k).used, (k % 3 + 1) as u32, "key {k}");
        }
    }

    #[test]
    fn cost_above_limit_can_never_pass() {
        let (l, _) = limiter(5, 10);
        let d = l.check_n(&1, 6);
        assert_eq!(d.outcome(), Outcome::CostExceedsLimit);
        assert_eq!(d.retry_after(), None);
        assert_eq!(d.remaining(), 5);
        assert_eq!(l.usage(&1).used, 0);
    }

    #[test]
    fn idle_keys_are_evicted_by_the_limiter_itself() {
        let (l, clock) = limiter(5, 100_000);
        for k in 0..10_000 {
            assert!(l.check(&k).is_allowed());
        }
        assert_eq!(l.stats().keys_tracked, 10_000);
        clock.advance(Duration::from_secs(2));
        // Only one hot key keeps checking; each bucket width it sweeps one partition.
        for _ in 0..l.compact().partitions.len() {
            clock.advance(Duration::from_millis(70));
            let _ = l.check(&u64::MAX);
        }
        let stats = l.stats();
        assert_eq!(stats.keys_tracked, 1);
        assert_eq!(stats.keys_evicted, 10_000);
    }

    #[test]
    fn at_max_keys_a_flood_cannot_reset_a_tracked_key() {
        let (l, clock) = limiter(3, 8);
        for _ in 0..3 {
            assert!(l.check(&0).is_allowed());
        }
        assert!(!l.check(&0).is_allowed());
        for k in 1..1000 {
            let _ = l.check(&k);
            clock.advance(Duration::from_micros(100));
        }
        assert!(l.stats().keys_tracked <= 8);
        assert!(l.stats().overflowed > 0);
        // The heavy user is still over its limit.
        assert!(!l.check(&0).is_allowed());
    }

    #[test]
    fn at_max_keys_idle_keys_make_room() {
        let (l, clock) = limiter(3, 4);
        for k in 0..4 {
            let _ = l.check(&k);
        }
        clock.advance(Duration::from_secs(3));
        let _ = l.check(&100);
        assert_eq!(l.stats().overflowed, 0);
        assert!(l.usage(&100).used == 1);
    }

    #[test]
    fn stats_count_admissions_and_rejections() {
        let (l, _) = limiter(2, 10);
        for _ in 0..5 {
            let _ = l.check(&7);
        }
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.keys_tracked), (2, 3, 1));
        let u = l.usage(&7);
        assert_eq!((u.used, u.remaining, u.limit), (2, 0, 2));
    }

    #[test]
    fn clock_going_backwards_after_eviction_never_recounts_a_window() {
        let (l, clock) = limiter(2, 10);
        clock.set(10_000_000_000);
        let full = l.check_n(&1, 2);
        assert!(full.is_allowed());
        // The key goes idle and is evicted at 13 s...
        clock.set(13_000_000_000);
        assert_eq!(l.evict_idle(), 1);
        // ...then the clock steps back to 10.5 s, half a window after the burst.
        // The key's memory is gone, but the limiter has seen 13 s: the new ring is
        // held there, so its units are never counted in a span beside the burst.
        clock.set(10_500_000_000);
        let d = l.check_n(&1, 2);
        assert!(d.is_allowed());
        assert!(
            d.recorded_slot() > full.recorded_slot() + 15,
            "recorded at slot {} beside the burst at slot {}",
            d.recorded_slot(),
            full.recorded_slot()
        );
        assert!(!l.check(&1).is_allowed());
    }

    #[test]
    fn a_key_leaving_the_overflow_ring_keeps_its_window() {
        let (l, clock) = limiter(3, 1);
        assert!(l.check(&1).is_allowed());
        // At the cap, key 2 shares the overflow ring and uses its whole limit.
        clock.set(500_000_000);
        for _ in 0..3 {
            assert!(l.check(&2).is_allowed());
        }
        assert_eq!(l.stats().overflowed, 3);
        // Key 1 goes idle and makes room, but key 2's units are still in the
        // window: its own ring starts as a copy of the overflow ring.
        clock.set(1_200_000_000);
        assert!(!l.check(&2).is_allowed());
        assert_eq!(l.stats().keys_tracked, 1);
        assert_eq!(l.usage(&2).used, 3);
        clock.set(2_600_000_000);
        assert!(l.check(&2).is_allowed());
        assert_eq!(l.usage(&2).used, 1);
    }

    #[test]
    fn a_cap_reached_once_does_not_send_later_keys_to_the_overflow_ring() {
        let (l, clock) = limiter(10, 2);
        for k in 0..3 {
            assert!(l.check(&k).is_allowed());
        }
        assert_eq!(l.stats().overflowed, 1);
        // A new key every 0.9 s for a minute: each finds room once the old ones
        // are swept, however recently the overflow ring admitted something.
        for key in 1_000..1_066 {
            clock.advance(Duration::from_millis(900));
            assert!(l.check(&key).is_allowed());
            l.evict_idle();
        }
        // Only the first, while keys 0 and 1 were still in their window.
        assert_eq!(l.stats().overflowed, 2);
        // Once the last of them is idle, two users get their own limits, not
        // one shared one.
        clock.advance(Duration::from_secs(2));
        l.evict_idle();
        for user in [7, 8] {
            assert_eq!((0..10).filter(|_| l.check(&user).is_allowed()).count(), 10);
            assert!(!l.check(&user).is_allowed());
        }
    }

    #[test]
    fn peek_reports_what_the_check_would() {
        let (l, clock) = limiter(5, 10);
        clock.set(200_000_000);
        // A fresh key, then one with older units in the window.
        for _ in 0..2 {
            let peeked = l.peek(&1, 2);
            let checked = l.check_n(&1, 2);
            assert_eq!(peeked.outcome(), checked.outcome());
            assert_eq!(peeked.remaining(), checked.remaining());
            assert_eq!(peeked.reset(), checked.reset());
            clock.set(700_000_000);
        }
    }

    #[test]
    fn keys_in_the_overflow_ring_are_peeked_there() {
        let (l, clock) = limiter(3, 1);
        assert!(l.check(&1).is_allowed());
        clock.set(500_000_000);
        for _ in 0..3 {
            assert!(l.check(&2).is_allowed());
        }
        // Key 2 is untracked, but its units are in the overflow ring.
        let peeked = l.peek(&2, 1);
        assert_eq!(peeked.outcome(), Outcome::Denied);
        assert_eq!(l.usage(&2).used, 3);
        assert_eq!(l.check(&2).outcome(), peeked.outcome());
    }

    #[test]
    fn a_flood_of_new_keys_at_the_cap_sweeps_once_per_bucket() {
        let (l, clock) = limiter(1_000, 1);
        assert!(l.check(&0).is_allowed());
        clock.set(100_000_000);
        let sweeps_before = l.compact().sweep_cursor.load(Relaxed);
        for key in 1..=1_000 {
            let _ = l.check(&key);
        }
        // One sweep for the new bucket (`maybe_sweep`) and one by the first new
        // key at the cap, not one per new key.
        assert!(l.compact().sweep_cursor.load(Relaxed) - sweeps_before <= 2);
        assert_eq!(l.stats().overflowed, 1_000);
        // In the next bucket, the first new key may sweep again.
        clock.set(200_000_000);
        let before = l.compact().sweep_cursor.load(Relaxed);
        let _ = l.check(&5_000);
        let _ = l.check(&5_001);
        assert_eq!(l.compact().sweep_cursor.load(Relaxed) - before, 2);
    }

    #[test]
    fn a_clock_past_the_slot_range_is_held_not_wrapped() {
        // 1 ns buckets: the flag bits of a slot would be reached at 2^61 ns.
        let clock = ManualClock::new();
        let policy = Policy::builder()
            .limit(2)
            .window(Duration::from_nanos(16))
            .buckets(16)
            .build()
            .unwrap();
        let l: Limiter<u64, ManualClock> = Limiter::builder(policy)
            .clock(clock.clone())
            .build()
            .unwrap();
        clock.set(1 << 61);
        let d = l.check(&1);
        assert!(d.is_allowed());
        assert!(
            d.reset() > Duration::ZERO,
            "an admitted unit is in the window"
        );
        assert!(l.check(&1).is_allowed());
        assert!(!l.check(&1).is_allowed());
        // Later readings are held at the same instant: the window stays full.
        for now in [u64::MAX - 5, u64::MAX] {
            clock.set(now);
            let d = l.check(&1);
            assert_eq!(d.outcome(), Outcome::Denied, "time stands still at {now}");
            assert!(d.retry_after().is_some_and(|w| w > Duration::ZERO));
        }
        assert_eq!(l.stats().keys_tracked, 1);
    }

    #[test]
    fn peek_reports_without_counting_or_tracking() {
        let (l, _) = limiter(3, 10);
        let d = l.peek(&1, 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 2);
        let too_big = l.peek(&1, 4);
        assert_eq!(too_big.outcome(), Outcome::CostExceedsLimit);
        assert_eq!(too_big.retry_after(), None);
        assert_eq!(l.stats(), LimiterStats::default());
        assert!(l.check_n(&1, 3).is_allowed());
        let d = l.peek(&1, 1);
        assert_eq!(d.outcome(), Outcome::Denied);
        assert_eq!(d.remaining(), 0);
        assert_eq!(l.usage(&1).used, 3);
        assert_eq!((l.stats().admitted, l.stats().rejected), (1, 0));
    }

    #[test]
    fn cost_above_limit_counts_as_rejected_and_tracks_nothing() {
        let (l, _) = limiter(5, 10);
        assert_eq!(l.check_n(&1, 6).outcome(), Outcome::CostExceedsLimit);
        let s = l.stats();
        assert_eq!((s.admitted, s.rejected, s.keys_tracked), (0, 1, 0));
        // A cost of exactly the limit passes on an empty window.
        assert!(l.check_n(&1, 5).is_allowed());
    }

    #[test]
    fn undo_gives_units_back_to_the_key_or_the_overflow_ring() {
        let (l, _) = limiter(2, 1);
        let tracked = l.check_n(&1, 2);
        assert!(!l.check(&1).is_allowed());
        l.undo(&1, &tracked);
        assert_eq!(l.usage(&1).used, 0);
        // Key 2 is not tracked (cap of 1): its units live in the overflow ring.
        let overflowed = l.check_n(&2, 2);
        assert!(overflowed.is_allowed());
        assert!(!l.check(&3).is_allowed(), "the overflow ring is shared");
        l.undo(&2, &overflowed);
        assert!(l.check(&3).is_allowed());
    }

    #[test]
    fn reset_is_the_time_until_the_youngest_unit_leaves() {
        let (l, clock) = limiter(2, 10);
        // 1 s window in 15 buckets of 66.67 ms: a unit in slot 0 is counted through
        // slot 15, so it leaves at 16 * 66_666_667 ns.
        let d = l.check(&1);
        assert_eq!(d.reset(), Duration::from_nanos(16 * 66_666_667));
        clock.set(500_000_000);
        let d = l.check(&1);
        let slot = 500_000_000 / 66_666_667;
        assert_eq!(
            d.reset(),
            Duration::from_nanos((slot + 16) * 66_666_667 - 500_000_000)
        );
        assert_eq!(l.usage(&9).reset, Duration::ZERO);
    }

    #[test]
    fn zero_max_keys_is_rejected() {
        let r: Result<Limiter<u8, _>, _> =
            Limiter::builder(Policy::per(1, Duration::from_secs(1)).unwrap())
                .max_keys(0)
                .build();
        assert!(matches!(r.unwrap_err(), ConfigError::ZeroMaxKeys));
    }

    #[test]
    fn a_cap_above_the_highest_is_taken_as_the_highest() {
        let l: Limiter<u64, _> = Limiter::builder(Policy::per(1, Duration::from_secs(1)).unwrap())
            .max_keys(usize::MAX)
            .build()
            .unwrap();
        with_state!(&l.state, state => {
            assert_eq!(state.max_keys, MAX_KEYS);
            // Each partition's share, even twice over, fits a table.
            assert!(MAX_KEYS / state.partitions.len() * 2 <= MAX_CAPACITY);
        });
        assert!(l.check(&7).is_allowed());
        assert!(!l.check(&7).is_allowed());
    }

    #[test]
    fn a_key_evicted_then_counted_in_the_overflow_ring_restarts_no_earlier_than_the_sweep() {
        let (l, clock) = limiter(2, 1);
        let secs = |s: f64| (s * 1e9) as u64;
        clock.set(secs(10.0));
        let burst = l.check_n(&1, 2);
        assert!(burst.is_allowed());
        clock.set(secs(13.0));
        assert_eq!(l.evict_idle(), 1);
        // Key 2 takes the only place.
        assert!(l.check(&2).is_allowed());
        // The clock steps back to half a window after key 1's burst: in the
        // overflow ring its units count from the sweep on, not beside the burst.
        clock.set(secs(10.5));
        let again = l.check_n(&1, 2);
        assert!(again.is_allowed());
        assert!(again.recorded_slot() >= l.geometry.slot(secs(13.0)));
        // Times still count from the clock's reading.
        assert!(again.reset() > Duration::from_millis(2500), "{again:?}");
        assert!(!l.check(&1).is_allowed());
    }

    #[test]
    fn units_undone_from_an_older_bucket_are_free_at_once_and_denials_stay_exact() {
        let (l, clock) = limiter(2, 10);
        let first = l.check(&1);
        clock.advance(l.policy().bucket_width());
        assert!(l.check(&1).is_allowed());
        l.undo(&1, &first);
        assert!(l.peek(&1, 1).is_allowed());
        assert!(l.check(&1).is_allowed());
        let denied = l.check(&1);
        assert_eq!(denied.outcome(), Outcome::Denied);
        let wait = denied.retry_after().unwrap();
        let start = clock.now_nanos();
        clock.set(start + saturating_nanos(wait) - 1);
        assert!(!l.peek(&1, 1).is_allowed(), "{denied:?}");
        clock.set(start + saturating_nanos(wait));
        assert!(l.peek(&1, 1).is_allowed(), "{denied:?}");
    }

    #[test]
    fn an_undo_more_than_a_window_late_gives_back_nothing_even_2_pow_32_slots_on() {
        let clock = ManualClock::new();
        let policy = Policy::builder()
            .limit(1)
            .window(Duration::from_micros(15))
            .buckets(15)
            .build()
            .unwrap();
        let l = Limiter::builder(policy)
            .clock(clock.clone())
            .build()
            .unwrap();
        let old = l.check(&1);
        assert!(old.is_allowed());
        // 2^32 one-microsecond slots on, the same bucket holds the same tag.
        clock.set((1u64 << 32) * 1_000);
        assert!(l.check(&1).is_allowed());
        l.undo(&1, &old);
        assert!(!l.check(&1).is_allowed());
    }

    #[test]
    fn a_zero_cost_check_in_the_overflow_ring_does_not_mark_the_key() {
        let (l, clock) = limiter(3, 1);
        assert!(l.check(&1).is_allowed());
        clock.set(500_000_000);
        assert!(l.check_n(&2, 3).is_allowed());
        // Another untracked key only asks (cost 0): nothing is counted for it.
        let key = (3..)
            .find(|k| {
                let mark = |k| l.compact().overflow_mark(&l.compact().lookup(k));
                !std::ptr::eq(mark(k), mark(&2))
            })
            .unwrap();
        assert!(l.check_n(&key, 0).is_allowed());
        // Key 1 goes idle and makes room: the key gets a ring of its own, empty.
        clock.set(1_200_000_000);
        assert_eq!(l.evict_idle(), 1);
        let d = l.check(&key);
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(l.usage(&key).used, 1);
    }

    #[test]
    fn peek_of_a_key_restarting_after_a_sweep_reports_the_checks_times() {
        // As in clock_going_backwards_after_eviction_never_recounts_a_window: the
        // key's new ring starts at the sweep (13 s), not at the clock (10.5 s).
        for max_keys in [10, 1] {
            let (l, clock) = limiter(2, max_keys);
            clock.set(10_000_000_000);
            assert!(l.check_n(&1, 2).is_allowed());
            clock.set(13_000_000_000);
            assert_eq!(l.evict_idle(), 1);
            if max_keys == 1 {
                assert!(l.check(&2).is_allowed(), "key 2 takes the only place");
            }
            clock.set(10_500_000_000);
            let peeked = l.peek(&1, 2);
            let checked = l.check_n(&1, 2);
            assert_eq!(peeked.outcome(), checked.outcome());
            assert_eq!(peeked.remaining(), checked.remaining());
            assert_eq!(peeked.reset(), checked.reset(), "max_keys {max_keys}");
        }
    }

    #[test]
    fn a_check_stalled_at_the_cap_is_never_admitted_beside_a_ring_swept_meanwhile() {
        // Limit 3 per 1 s in 15 buckets, room for one key. Key 1 holds it.
        let (l, clock) = limiter(3, 1);
        assert!(l.check(&1).is_allowed());
        // At 0.5 s key 2 finds the limiter full; its check stalls before it
        // takes the writer's lock. Meanwhile key 1 goes idle, key 2 gets a
        // ring of its own and uses its whole limit at 1.2 s, and that ring is
        // swept once idle, at 2.4 s.
        clock.set(500_000_000);
        let own = Arc::new(std::sync::Mutex::new(None));
        let (l2, clock2, own2) = (
            l.reconfigured(l.policy().clone()).unwrap(),
            clock.clone(),
            Arc::clone(&own),
        );
        *l.compact().stall_at_cap.lock().unwrap() = Some(Box::new(move || {
            clock2.set(1_200_000_000);
            let d = l2.check_n(&2, 3);
            assert!(d.is_allowed() && !d.is_overflow(), "{d:?}");
            *own2.lock().unwrap() = Some(d);
            clock2.set(2_400_000_000);
            assert_eq!(l2.evict_idle(), 1);
        }));
        let stalled = l.check_n(&2, 3);
        let own = own.lock().unwrap().expect("the stall ran");
        // Key 2's units: 3 in its own ring, and 3 more only where no window
        // holds both (a unit recorded at slot x counts through x + 15).
        let span = l.compact().shape.span_slots();
        assert!(
            !stalled.is_allowed() || stalled.recorded_slot() >= own.recorded_slot() + span,
            "admitted at slot {} beside 3 units at slot {}",
            stalled.recorded_slot(),
            own.recorded_slot()
        );
    }

    #[test]
    fn an_overflow_decision_says_so_and_passes_by_its_retry_after() {
        let (l, clock) = limiter(1, 1);
        let tracked = l.check(&1);
        assert!(tracked.is_allowed() && !tracked.is_overflow());
        clock.set(500_000_000);
        let first = l.check(&2);
        assert!(first.is_allowed() && first.is_overflow());
        clock.set(600_000_000);
        let denied = l.check(&3);
        assert!(!denied.is_allowed() && denied.is_overflow());
        assert_eq!(l.peek(&3, 1).retry_after(), denied.retry_after());
        // An upper bound: by then the overflow ring has room (the key may pass
        // earlier, once key 1 is idle and a sweep makes room for it).
        let wait = crate::clock::saturating_nanos(denied.retry_after().unwrap());
        clock.set(600_000_000 + wait);
        assert!(l.check(&3).is_allowed());
        // A cost that can never pass reports the overflow ring's window too.
        let never = l.check_n(&4, 2);
        assert_eq!(never.outcome(), Outcome::CostExceedsLimit);
        assert!(never.is_overflow(), "{never:?}");
    }
}

#[cfg(all(test, not(tsw_loom)))]
impl<K: Hash + Eq + Clone, C> Limiter<K, C> {
    /// Where each partition's table is now (a new address after a rebuild).
    pub(crate) fn table_addresses(&self) -> Vec<usize> {
        with_state!(&self.state, state => state
            .partitions
            .iter()
            .map(|p| std::ptr::from_ref::<crate::table::Table<_, _>>(&p.table()) as usize)
            .collect())
    }
}

#[cfg(test)]
impl<K, C> Limiter<K, C> {
    /// The state of a limiter whose rings are compact (as the tests' are).
    #[cfg(not(tsw_loom))]
    fn compact(&self) -> &State<K, C, Compact> {
        match &self.state {
            Shared::Compact(state) => state,
            Shared::Wide(_) => panic!("a limiter of wide rings"),
        }
    }

    /// Rounds the background sweeper has finished.
    pub(crate) fn sweeper_rounds(&self) -> u64 {
        with_state!(&self.state, state => state.sweeper_rounds.load(SeqCst))
    }

    /// Yield to the runtime until the sweeper has finished `rounds` rounds in
    /// all. Yielding does not move paused time: the rounds waited for ran at
    /// the instant the test advanced to.
    pub(crate) async fn sweeper_finished(&self, rounds: u64) {
        for _ in 0..100_000 {
            if self.sweeper_rounds() >= rounds {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!(
            "the sweeper finished {} of {rounds} rounds",
            self.sweeper_rounds()
        );
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod sweeper_tests {
    use super::*;
    use crate::ManualClock;
    use tokio::time::{advance, Instant};

    /// 1 s in 10 buckets of 100 ms: bucket starts fall on tokio's 1 ms ticks.
    fn policy(limit: u32) -> Policy {
        Policy::builder()
            .limit(limit)
            .window(Duration::from_secs(1))
            .buckets(10)
            .build()
            .unwrap()
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_idle_keys_is_gone_within_a_window_and_a_bucket_without_traffic() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        assert_eq!(l.clock().source(), crate::clock::TimeSource::Tokio);
        let start = Instant::now();
        for k in 0..100_000 {
            assert!(l.check(&k).is_allowed());
        }
        assert_eq!(l.stats().keys_tracked, 100_000);
        // Every unit counts through slot 10 (up to 1.1 s): a round within it
        // keeps every key.
        advance(Duration::from_millis(1099)).await;
        l.sweeper_finished(1).await;
        assert_eq!(l.stats().keys_tracked, 100_000);
        // The round at 1.1 s, the start of slot 11, drops them all.
        advance(Duration::from_millis(1)).await;
        l.sweeper_finished(2).await;
        let stats = l.stats();
        assert_eq!((stats.keys_tracked, stats.keys_evicted), (0, 100_000));
        assert_eq!(start.elapsed(), Duration::from_millis(1100));
        assert!(l.compact().partitions.iter().all(|p| p.is_empty()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_used_just_before_a_round_keeps_its_count() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        for k in 0..1_000 {
            let _ = l.check(&k);
        }
        // Half a bucket before the round that drops the flood, key 7 000 uses
        // its whole limit.
        advance(Duration::from_millis(1050)).await;
        assert!(l.check_n(&7_000, 3).is_allowed());
        let rounds = l.sweeper_rounds();
        advance(Duration::from_millis(50)).await;
        l.sweeper_finished(rounds + 1).await;
        assert_eq!(l.stats().keys_tracked, 1);
        assert_eq!(l.usage(&7_000).used, 3);
        assert!(!l.peek(&7_000, 1).is_allowed());
        // It goes once its units have left the window: at the start of slot 21.
        let rounds = l.sweeper_rounds();
        advance(Duration::from_millis(999)).await;
        l.sweeper_finished(rounds + 1).await;
        assert_eq!(l.stats().keys_tracked, 1);
        advance(Duration::from_millis(1)).await;
        l.sweeper_finished(rounds + 2).await;
        assert_eq!(l.stats().keys_tracked, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_holds_the_limiter_weakly_and_ends_with_it() {
        let l: Limiter<Arc<u64>> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        assert_eq!(alive_tasks(), 1);
        let key = Arc::new(7);
        assert!(l.check(&key).is_allowed());
        assert_eq!(Arc::strong_count(&key), 2, "the map holds a clone");
        advance(Duration::from_millis(250)).await;
        l.sweeper_finished(1).await;
        // The sweeper waits for its next round holding no strong reference:
        // dropping the limiter drops its keys at once.
        drop(l);
        assert_eq!(Arc::strong_count(&key), 1);
        for _ in 0..100 {
            if alive_tasks() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(alive_tasks(), 0);
    }

    async fn alive_tasks_settle_at(expected: usize) {
        for _ in 0..100 {
            if alive_tasks() == expected {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(alive_tasks(), expected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconfigured_limiter_shares_the_sweeper_until_the_last_handle_drops() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        let raised = l.reconfigured(policy(5)).unwrap();
        assert_eq!(alive_tasks(), 1, "one map, one sweeper");
        for k in 0..100 {
            assert!(raised.check(&k).is_allowed());
        }
        drop(l);
        alive_tasks_settle_at(1).await;
        // It still sweeps the shared map for the handle left.
        advance(Duration::from_millis(1100)).await;
        raised.sweeper_finished(1).await;
        while raised.stats().keys_tracked > 0 {
            let rounds = raised.sweeper_rounds();
            advance(Duration::from_millis(100)).await;
            raised.sweeper_finished(rounds + 1).await;
        }
        assert_eq!(raised.stats().keys_evicted, 100);
        drop(raised);
        alive_tasks_settle_at(0).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_window_gets_a_sweeper_of_its_own_per_new_bucket() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        for k in 0..100 {
            assert!(l.check(&k).is_allowed());
        }
        // 2 s in 4 buckets of 500 ms: the units of slot 0 (100 ms buckets)
        // are moved to the first 500 ms bucket, counted through slot 4.
        let longer = Policy::builder()
            .limit(3)
            .window(Duration::from_secs(2))
            .buckets(4)
            .build()
            .unwrap();
        let longer = l.reconfigured(longer).unwrap();
        assert_eq!(longer.stats().keys_tracked, 100);
        drop(l);
        alive_tasks_settle_at(1).await;
        // Rounds every 500 ms, not every 100 ms.
        advance(Duration::from_millis(499)).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(longer.sweeper_rounds(), 0);
        advance(Duration::from_millis(1)).await;
        longer.sweeper_finished(1).await;
        for round in 2..=4 {
            advance(Duration::from_millis(500)).await;
            longer.sweeper_finished(round).await;
        }
        assert_eq!(longer.stats().keys_tracked, 100);
        // The round at 2.5 s, the start of slot 5, drops them all.
        advance(Duration::from_millis(500)).await;
        longer.sweeper_finished(5).await;
        assert_eq!(longer.stats().keys_tracked, 0);
        drop(longer);
        alive_tasks_settle_at(0).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_type_with_one_value_has_no_sweeper() {
        let l: Limiter<()> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        assert!(l.check(&()).is_allowed());
        assert_eq!(alive_tasks(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_manual_clock_rounds_follow_tokio_and_idleness_the_clock() {
        let clock = ManualClock::new();
        let l: Limiter<u64, ManualClock> = Limiter::builder(policy(3))
            .clock(clock.clone())
            .sweep_idle_every(Duration::from_millis(100))
            .build()
            .unwrap();
        for k in 0..1_000 {
            let _ = l.check(&k);
        }
        // A minute of tokio time, in rounds every 100 ms: the limiter's clock
        // has not moved, so no key is idle.
        for round in 1..=600 {
            advance(Duration::from_millis(100)).await;
            l.sweeper_finished(round).await;
        }
        assert_eq!(l.stats().keys_tracked, 1_000);
        // Once the limiter's clock has moved past the keys' window, the next
        // round drops them.
        clock.advance(Duration::from_millis(1100));
        assert_eq!(l.stats().keys_tracked, 1_000);
        advance(Duration::from_millis(100)).await;
        l.sweeper_finished(601).await;
        assert_eq!(l.stats().keys_tracked, 0);
    }

    #[test]
    fn a_sweeper_outside_a_runtime_is_a_config_error() {
        let built: Result<Limiter<u64>, _> = Limiter::builder(policy(3)).sweep_idle().build();
        assert!(matches!(built, Err(ConfigError::NoRuntime)));
        // Without a sweeper, no runtime is needed.
        let built: Result<Limiter<u64>, _> = Limiter::builder(policy(3)).build();
        assert!(built.is_ok());
    }

    #[tokio::test]
    async fn a_zero_sweep_period_is_a_config_error() {
        let built: Result<Limiter<u64>, _> = Limiter::builder(policy(3))
            .sweep_idle_every(Duration::ZERO)
            .build();
        assert!(matches!(built, Err(ConfigError::ZeroSweepPeriod)));
    }
}

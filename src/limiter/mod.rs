//! The keyed limiter: a map from key to [`Ring`](crate::ring::Ring), cut
//! into partitions of inline tables, with idle keys evicted on the request
//! path and a hard cap on how many keys are tracked.
//!
//! This module holds the [`Limiter`] handle, its builder and a change of
//! policy; below it, each depending only on those listed before it: `state`
//! (the keys, rings and settings behind a handle), `sweep` (dropping idle
//! keys), `overflow` (the shared ring at the cap), `carry` (counts carried
//! into a new state), `check` (a check, start to end).

mod state;

mod sweep;

mod overflow;

mod carry;

mod check;

use crate::clock::{AutoClock, Clock};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::ring::{Compact, Geometry, Head, Wide, WindowSnapshot};
use crate::stats::{KeyUsage, LimiterStats};
#[cfg(all(test, not(tsw_loom)))]
pub(crate) use state::KEYS_PER_PARTITION;
use state::{State, SweepPlan};
use std::hash::Hash;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use sweep::Sweeper;

/// A keyed sliding-window rate limiter, usable on its own or behind the tower layer.
///
/// Each key owns a lock-free ring of sub-window counters (see [`Policy`] and
/// [`Precision`](crate::Precision) for the guarantee); the keys live in
/// partitions, each behind a read-write lock: a check of a tracked key takes
/// its partition's reader lock (such checks never wait for each other) and
/// decides on the ring's atomics; adding a key, dropping idle keys and
/// shrinking a partition's table take its writer lock, which a check of that
/// partition waits for. Keys are created on first
/// use and dropped once idle (all their buckets expired), by the limiter itself:
/// now and then a check sweeps one partition of the map (at most 1024 keys of
/// the cap), often enough for checks to go round every partition in 32 bucket
/// widths, so no request ever pays for a full sweep. Checks alone leave idle
/// keys in place once traffic stops: after a flood of one-off keys, the last
/// of them waits for later checks to come round to its partition.
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
/// **Memory:** keys live in tables, a partition's each, with each key's ring
/// inline and no allocation per key: about 116 bytes of heap per tracked
/// u64 or `IpAddr` key with the default 7 buckets and a limit up to 65 535
/// (111 MiB for 1M keys, the tables' spare room included); under a
/// KiB for a limiter that has not tracked a key yet, and about 20 KiB more
/// at the default cap once it has (its partitions). A key dropped as idle
/// leaves its place to the next new key; tables shrink when the sweeper (or
/// `evict_idle`) finds few keys left, and go back to the allocator whole; with
/// [`LimiterBuilder::sweep_idle`] (or [`evict_idle`](Limiter::evict_idle))
/// under glibc's malloc the limiter then asks for the memory to go back to
/// the system too, so RSS falls after a flood. The
/// [memory guide](crate::guide::memory) has what we recommend.
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
/// policy fits it (see `ring::layout`), else wide. Code over it matches with
/// an arm per layout, the two arms alike but each compiled for its own
/// layout: a check pays one branch, no dynamic dispatch.
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

impl<K, C> Shared<K, C> {
    /// The clock, the same in either layout.
    fn clock(&self) -> &Arc<C> {
        match self {
            Shared::Compact(state) => &state.clock,
            Shared::Wide(state) => &state.clock,
        }
    }
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
    /// A cap above 2^32 keys (some 400 GB of memory) is taken as that.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Also sweep idle keys from a tokio task, once every bucket width (the
    /// policy's window / buckets), with or without traffic: see
    /// [`sweep_idle_every`](Self::sweep_idle_every), which this calls with the
    /// bucket width. Off by default.
    ///
    /// Checks sweep by themselves, a partition at a time, so they keep up
    /// with a steady stream of keys; but keys left by a flood with no traffic
    /// after it stay until later checks (or [`Limiter::evict_idle`]) reach
    /// them. With this, a key is gone within a window and a bucket of its
    /// last check (plus tokio's 1 ms timer tick, and the coarse clock's tick
    /// where the limiter reads it), whatever the traffic; and under glibc's
    /// malloc the memory of the tables it drops goes back to the system (the
    /// [memory guide](crate::guide::memory)).
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
    /// [`ConfigError::Zero`]. The task holds the limiter's state
    /// only weakly: it never keeps the limiter alive, and it ends when the
    /// limiter is dropped (a layer's limiters: when the layer and every
    /// service made from it are dropped).
    ///
    /// Each round visits every partition of the map in turn (as
    /// [`Limiter::evict_idle`] does) and yields to the runtime between
    /// partitions, so a round never holds a worker for longer than one
    /// partition's sweep (at most 1024 keys of the cap). A round visits every
    /// tracked key, idle or not, so its cost grows with the keys tracked: a
    /// cap of millions with narrow buckets wants a longer period. A sweep
    /// never evicts a key that holds units in its window.
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
    ) -> Result<Started<K, C>, carry::CountTooLarge>
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
            match from {
                Shared::Compact(old) => state.carry_over(old, reading)?,
                Shared::Wide(old) => state.carry_over(old, reading)?,
            }
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
        |carry::CountTooLarge| unreachable!("a wide bucket holds any count a limit reaches"),
    )
}

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
        let clock = Arc::clone(self.state.clock());
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
        let (sweep, max_keys) = match &self.state {
            Shared::Compact(state) => (state.sweep.as_ref(), state.max_keys),
            Shared::Wide(state) => (state.sweep.as_ref(), state.max_keys),
        };
        let sweep = sweep.map(|plan| SweepPlan {
            runtime: plan.runtime.clone(),
            // A sweeper per bucket width follows the buckets.
            every: if plan.every == self.policy.bucket_width() {
                policy.bucket_width()
            } else {
                plan.every
            },
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
        match &self.state {
            Shared::Compact(state) => state.check_n(&self.geometry, key, cost),
            Shared::Wide(state) => state.check_n(&self.geometry, key, cost),
        }
    }

    /// What `check_n(key, cost)` would decide now, without counting anything.
    ///
    /// One difference, at `max_keys`: a check of an untracked key may first
    /// sweep a partition for idle keys (see [`Limiter`]) and, if that makes
    /// room, track the key; `peek` changes nothing, so it reports what the
    /// overflow ring would decide.
    pub fn peek(&self, key: &K, cost: u32) -> Decision {
        match &self.state {
            Shared::Compact(state) => state.peek(&self.geometry, key, cost),
            Shared::Wide(state) => state.peek(&self.geometry, key, cost),
        }
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
        match &self.state {
            Shared::Compact(state) => state.undo(key, decision),
            Shared::Wide(state) => state.undo(key, decision),
        }
    }

    /// Count `units` for `key` now, whether or not they fit: the excess of a
    /// request that turned out to cost more than it was admitted with (see
    /// [`Store::charge`](crate::Store::charge)). The key's window may then
    /// hold more than the limit, and its checks are denied until enough units
    /// have left it; nothing else changes.
    ///
    /// Returns what was counted, as an allowed decision that
    /// [`undo`](Self::undo) gives back exactly (its
    /// [`cost`](Decision::cost) is the units counted, its
    /// [`remaining`](Decision::remaining) what the window has left after
    /// them). `None` when nothing was counted: `units` of zero, or a bucket
    /// already holding as many units as it can (more than any limit: the key
    /// is denied until that bucket leaves the window either way).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{Limiter, ManualClock, Policy};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::builder(Policy::per(10, Duration::from_secs(1)).unwrap())
    ///     .clock(clock.clone())
    ///     .build()
    ///     .unwrap();
    /// // Admitted with an estimate of 4; the response says it cost 25.
    /// assert!(limiter.check_n(&"key", 4).is_allowed());
    /// let excess = limiter.charge(&"key", 21).unwrap();
    /// assert_eq!((excess.cost(), excess.remaining()), (21, 0));
    /// assert!(!limiter.check(&"key").is_allowed());
    /// // Denied until those units have left the window.
    /// clock.advance(Duration::from_millis(1100));
    /// assert!(limiter.check_n(&"key", 10).is_allowed());
    /// ```
    pub fn charge(&self, key: &K, units: u32) -> Option<Decision> {
        match &self.state {
            Shared::Compact(state) => state.charge(&self.geometry, key, units),
            Shared::Wide(state) => state.charge(&self.geometry, key, units),
        }
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
        match &self.state {
            Shared::Compact(state) => state.stats(),
            Shared::Wide(state) => state.stats(),
        }
    }

    /// The policy this limiter enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        self.state.clock()
    }

    /// Sweep every partition for idle keys now, returning how many were
    /// dropped. Never needed for correctness (an idle key's ring counts
    /// nothing), and checks sweep by themselves; useful before reading stats,
    /// or to drop the keys a flood left on a schedule of your own (which
    /// [`LimiterBuilder::sweep_idle`] does from a tokio task). A partition
    /// left with few keys is rebuilt smaller, and the memory of its old table
    /// goes back to the allocator in a few large blocks.
    pub fn evict_idle(&self) -> usize {
        match &self.state {
            Shared::Compact(state) => state.evict_idle(),
            Shared::Wide(state) => state.evict_idle(),
        }
    }

    /// The key's window now, bucket by bucket, for the wait queue's forecast.
    /// Nothing is counted.
    ///
    /// A key without a ring is read as [`peek`](Self::peek) reads it: at the
    /// cap (or while its group's overflow mark says its new ring would start
    /// as a copy) the overflow ring's window is the one its checks meet; else
    /// an empty window starting no earlier than the latest sweep.
    pub(crate) fn window_snapshot(&self, key: &K) -> WindowSnapshot {
        match &self.state {
            Shared::Compact(state) => state.window_snapshot(&self.geometry, key),
            Shared::Wide(state) => state.window_snapshot(&self.geometry, key),
        }
    }

    /// True while an admitted `decision` was counted in the current bucket, so
    /// spending it now keeps the window guarantee for the instant it is spent.
    pub(crate) fn is_current(&self, decision: &Decision) -> bool {
        match &self.state {
            Shared::Compact(state) => state.is_current(decision),
            Shared::Wide(state) => state.is_current(decision),
        }
    }

    /// [`is_current`](Self::is_current), and if so the admitted `decision`
    /// for `key` is spent now: its bucket keeps now as its newest admission,
    /// so that its units count in every window holding the instant they are
    /// spent at, not only the instant they were admitted at.
    pub(crate) fn spend(&self, key: &K, decision: &Decision) -> bool {
        match &self.state {
            Shared::Compact(state) => state.spend(key, decision),
            Shared::Wide(state) => state.spend(key, decision),
        }
    }
}

impl<K, C> std::fmt::Debug for Limiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (max_keys, keys) = match &self.state {
            Shared::Compact(state) => (state.max_keys, state.keys.load(Relaxed)),
            Shared::Wide(state) => (state.max_keys, state.keys.load(Relaxed)),
        };
        f.debug_struct("Limiter")
            .field("policy", &self.policy)
            .field("max_keys", &max_keys)
            .field("keys_tracked", &keys)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(tsw_loom)))]
impl<K: Hash + Eq + Clone, C> Limiter<K, C> {
    /// Where each partition's rings are now (a new address once they grow
    /// or are compacted).
    pub(crate) fn table_addresses(&self) -> Vec<usize> {
        match &self.state {
            Shared::Compact(state) => state
                .partitions()
                .iter()
                .map(|p| p.read().rings_address())
                .collect(),
            Shared::Wide(state) => state
                .partitions()
                .iter()
                .map(|p| p.read().rings_address())
                .collect(),
        }
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

    /// The latest sweep's instant: a check at the cap decides on the
    /// overflow ring no earlier.
    #[cfg(test)]
    pub(crate) fn swept_at(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        match &self.state {
            Shared::Compact(state) => state.swept_at.load(SeqCst),
            Shared::Wide(state) => state.swept_at.load(SeqCst),
        }
    }

    /// Rounds the background sweeper has finished.
    pub(crate) fn sweeper_rounds(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        match &self.state {
            Shared::Compact(state) => state.sweeper_rounds.load(SeqCst),
            Shared::Wide(state) => state.sweeper_rounds.load(SeqCst),
        }
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
mod tests;

//! A [`Store`] in Redis, shared by a fleet of instances (feature `redis`).
//!
//! One atomic Lua script per decision (`check.lua`, loaded once and run with
//! `EVALSHA`, reloaded on `NOSCRIPT`) keeps the same ring semantics as the
//! in-memory limiter: in strict mode no interval of length `window` ever holds
//! more than `limit` admitted units across all instances. Time comes from Redis'
//! own `TIME`, so instances whose clocks disagree still agree on the window.
//!
//! Each key is one string, `prefix{key}`: the hash tag keeps a key's data in
//! one Redis Cluster slot, and it expires by itself (`SET … PX`) once its units
//! have left the window, so Redis memory tracks the keys active in the last
//! window. Its value is packed (`struct.pack` in the script): the geometry its
//! slots are numbered in (bucket width and count), the newest slot entered,
//! the slot at which it was last converted from another bucket width (after
//! [`RedisStore::reconfigured`] changed the window or buckets), the key's
//! incarnation (the microsecond it was created: a key Redis lost and created
//! again is another, and units counted in one are never given back to the
//! other), then one record per slot holding units inside the window, newest
//! first. A decision
//! reads it with one `GET` and writes it with one `SET` (with `TIME`, three
//! commands, as a GCRA script's). The limit is in none of it (nor in the
//! default prefix): it is the script's argument, so a change of limit keeps
//! the counts as they are. An undo runs the same script, handing units back
//! to their slot. Redis 5 or later (or Valkey): the script writes after
//! reading `TIME`, which needs effects replication, the default since 5.
//!
//! The connection is the `redis` crate's
//! [`ConnectionManager`](::redis::aio::ConnectionManager): one multiplexed
//! connection (concurrent decisions are pipelined on it, no pool to size) that
//! reconnects when it drops. It makes one connection attempt at a time, so a
//! refused connection fails the decision at once with its cause instead of
//! holding it until the timeout; the next decision tries again. After 3
//! timeouts in a row, or at a timeout during which Redis decided nothing
//! (when the circuit breaker is on), the store replaces it, since a
//! connection gone silent without closing is not one the manager notices.
//! [`RedisStoreBuilder::connection`] takes any other `redis` crate async
//! connection instead, such as a cluster connection for Redis Cluster.

mod breaker;
mod connection;
mod deny_cache;
mod key;
mod lease;
mod metrics;

pub use breaker::{BreakerState, CircuitBreaker};
pub use key::RedisKey;
pub use lease::Leases;

/// The `redis` crate this store is built on, for
/// [`RedisStoreBuilder::client`] and [`RedisStoreBuilder::connection`].
pub use ::redis;

use self::metrics::RedisMetrics;
use crate::decision::{Decision, Outcome};
use crate::error::ConfigError;
use crate::policy::{Policy, Precision};
use crate::stats::bump;
use crate::store::Limiter;
use crate::store::{Store, StoreError, StoreErrorKind};
use ::redis::aio::ConnectionManagerConfig;
use ::redis::{Client, FromRedisValue, RedisError, Script, ScriptInvocation};
use breaker::{Admit, Breaker, Probe};
pub use connection::{AsyncConnection, AsyncConnectionHandle};
use connection::{Connection, Failure};
use deny_cache::DenyCache;
pub(crate) use lease::Counted;
use lease::{Ask, LeaseTable, Leased, Reply, Tick};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

const CHECK_SCRIPT: &str = include_str!("check.lua");

/// Lua numbers are doubles: every product the script forms must stay below 2^53.
const LUA_EXACT: u128 = 1 << 53;
/// How long the background task started by `build` keeps trying to connect.
const BACKGROUND_WARM_UP: Duration = Duration::from_secs(10);
/// Pauses between the warm-up's connection attempts: short at first, so a
/// Redis that starts with the app is found at once, then doubling.
const WARM_UP_MIN_PAUSE: Duration = Duration::from_millis(10);
const WARM_UP_MAX_PAUSE: Duration = Duration::from_millis(200);
/// At most one failure warning per this interval (the counters keep the total).
const WARN_INTERVAL: Duration = Duration::from_secs(1);
/// Lets one caller through per interval, without a lock: the first to find the
/// interval over wins a compare-and-swap; the very first call is let through.
struct Every {
    interval_ms: u64,
    origin: Instant,
    /// Milliseconds since `origin` before which no one is let through.
    next_ms: AtomicU64,
}

impl Every {
    fn new(interval: Duration) -> Every {
        Every {
            interval_ms: interval.as_millis() as u64,
            origin: Instant::now(),
            next_ms: AtomicU64::new(0),
        }
    }

    /// Whether the caller at `now` is the one let through.
    fn due(&self, now: Instant) -> bool {
        let now_ms = now.saturating_duration_since(self.origin).as_millis() as u64;
        let next = self.next_ms.load(Relaxed);
        now_ms >= next
            && self
                .next_ms
                .compare_exchange(next, now_ms + self.interval_ms, Relaxed, Relaxed)
                .is_ok()
    }
}

/// What a [`RedisStore`] does when Redis is down, slower than the timeout, or
/// answers with an error. There is no default: the choice is the operator's.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::{FailurePolicy, Policy};
///
/// // The fleet's 600 a minute is 200 a minute on each of three instances
/// // while Redis is away.
/// let per_instance = Policy::per(200, Duration::from_secs(60)).unwrap();
/// let failure = FailurePolicy::Fallback(per_instance);
/// assert_ne!(failure, FailurePolicy::Closed);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through ([`Decision::is_unchecked`]), with a rate-limited
    /// `tracing` warning and the `failed_open` counter. Availability over the limit.
    Open,
    /// Refuse to decide: the check returns a [`StoreError`] carrying a
    /// `Retry-After` suggestion (while the circuit breaker is open, at least
    /// the rest of its cool-down), which the layer answers with 503.
    Closed,
    /// Decide in an in-memory [`Limiter`] of this policy, on this instance
    /// alone: a **per-instance** limit (say, the fleet's limit divided by its
    /// number of instances), with the usual denials and headers, while Redis
    /// fails and the circuit breaker is open. Redis decides again as soon as
    /// it answers (the breaker's next probe). What the fallback admits is not
    /// counted in Redis: a window that spans the outage's end may hold, on top
    /// of the fleet's limit, what each instance's fallback admitted in it.
    /// The limiter is built with the store (its policy is checked as
    /// [`Limiter::new`] checks one) and shared by the stores
    /// [`reconfigured`](RedisStore::reconfigured) from it.
    Fallback(Policy),
}

/// Counters since the store was built. Reading them is a few relaxed loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RedisStoreStats {
    /// Checks asked of the store (every `check_n` call).
    pub decisions: u64,
    /// Decision scripts sent to Redis (one per check not answered locally).
    pub round_trips: u64,
    /// Checks denied by the local deny cache, without a round trip.
    pub deny_cache_hits: u64,
    /// Checks and undos sent to Redis that failed: Redis down, an error reply,
    /// or the timeout (the decisions the open circuit breaker answers are not
    /// among them: see `breaker_answered`).
    pub failures: u64,
    /// Of those, the ones that hit the timeout.
    pub timeouts: u64,
    /// Checks let through unchecked because Redis failed or the circuit
    /// breaker was open, and the policy is [`FailurePolicy::Open`].
    pub failed_open: u64,
    /// Where the circuit breaker stands now.
    pub breaker: BreakerState,
    /// Times the circuit breaker opened from closed, after a run of failures
    /// or a silent timeout (a failed probe that opens it again is not
    /// counted here).
    pub breaker_opens: u64,
    /// Probes sent to Redis by the half-open breaker.
    pub breaker_probes: u64,
    /// Checks the open (or half-open) breaker answered at once, per the
    /// failure policy, without asking Redis.
    pub breaker_answered: u64,
    /// Undos sent to Redis.
    pub undos: u64,
    /// Keys in the local deny cache right now.
    pub deny_cache_len: usize,
    /// Checks admitted from a lease, without a round trip: the round trips
    /// that leases saved ([`RedisStoreBuilder::leases`]).
    pub lease_decisions: u64,
    /// Replies that granted units beyond the check's cost.
    pub lease_grants: u64,
    /// Units granted beyond the checks' costs, in all.
    ///
    /// Every unit a grant held ends in one of the counts below, so that,
    /// once [`shutdown`](RedisStore::shutdown) has returned (nothing held),
    /// granted and undone units together equal the units admitted, handed
    /// back, refused and unreturned together; before it, the difference is
    /// what this instance holds now.
    pub lease_units_granted: u64,
    /// Units admitted from leases (the lease decisions' costs).
    pub lease_units_admitted: u64,
    /// Units of undone decisions that went back into the grant they were
    /// counted in, to be admitted again or handed back.
    pub lease_units_undone: u64,
    /// Units handed back unused (a grant's leftovers at the end of its
    /// bucket, in a check's own call when the grant ran short, at a change of
    /// policy or at shutdown) that Redis took back: lowered in the slot and
    /// incarnation of the key that counted them.
    pub lease_units_handed_back: u64,
    /// Units handed back that Redis refused, since it no longer counted them
    /// where the grant did: the key was lost (expired, flushed, a restart
    /// without persistence) and created again, converted to another window
    /// or bucket count, or the grant's slot had left the window.
    pub lease_units_refused: u64,
    /// Units never handed back: Redis failed or timed out on the hand-back,
    /// or the circuit breaker was open. They stay counted in Redis until
    /// their slot leaves the window (the fleet admits less meanwhile).
    pub lease_units_unreturned: u64,
    /// Checks decided by the fallback limiter ([`FailurePolicy::Fallback`]).
    pub fallback_decisions: u64,
}

#[derive(Default)]
struct Counters {
    decisions: AtomicU64,
    round_trips: AtomicU64,
    deny_cache_hits: AtomicU64,
    failures: AtomicU64,
    timeouts: AtomicU64,
    failed_open: AtomicU64,
    undos: AtomicU64,
    lease_decisions: AtomicU64,
    lease_grants: AtomicU64,
    lease_units_granted: AtomicU64,
    lease_units_admitted: AtomicU64,
    lease_units_undone: AtomicU64,
    lease_units_handed_back: AtomicU64,
    lease_units_refused: AtomicU64,
    lease_units_unreturned: AtomicU64,
    fallback_decisions: AtomicU64,
    /// `failures` when the last warning was logged.
    warned_failures: AtomicU64,
}

/// What the script answered: the decision, the units it counted (its cost,
/// and a lease's), how long its slot lasted then, and how many of the units
/// handed back in the call it lowered.
struct Answer {
    decision: Decision,
    granted: u32,
    valid: Duration,
    handed_back: u32,
}

/// A lease's part of a call: units a second expected of the key here, and
/// units this instance still holds of it.
#[derive(Clone, Copy)]
struct LeaseArgs {
    rate: f64,
    have: u32,
}

/// Bit 63 of a decision's slot: decided by the fallback limiter (its slots,
/// from the local clock, stay far below it; Redis' below 2^52).
const FALLBACK_SLOT: u64 = 1 << 63;

/// A sliding-window [`Store`] in Redis, shared by every instance that points at
/// the same Redis and prefix. Cloning is cheap; clones share the connection,
/// counters and deny cache.
///
/// Decisions need a tokio runtime (the connection and the timeout run on it) and
/// real time: under a paused tokio clock the timeout would fire at once.
///
/// **Time** is Redis' own `TIME` (wall clock, read inside the script), so the
/// instances' clocks do not matter. If Redis' clock steps back, a key is held at
/// the newest slot it has entered, as the in-memory ring does, for as long as the
/// key exists; a key that has already expired has nothing left to protect.
///
/// **Failures:** each decision waits at most the [timeout](RedisStoreBuilder::timeout),
/// connecting included; then, or when Redis is down or answers an error, the
/// [`FailurePolicy`] decides. A refused connection (nothing listening) fails at
/// once, as [`StoreErrorKind::ConnectionRefused`], rather than at the timeout.
/// A decision that timed out may still be counted by Redis when it gets to it
/// (the safe side).
///
/// **Circuit breaker:** after 5 failed calls in a row (by default), or at
/// once when a call times out and Redis decided no call while it waited (a
/// stall, seen within a timeout of the first call it holds), the
/// store stops asking Redis for a cool-down of 100 ms, doubling after each
/// failed probe up to 2 s, and answers every decision at once as the
/// [`FailurePolicy`] says: unchecked, or a [`StoreError`] with the kind and
/// source of the failure that opened it and a `Retry-After` of at least the
/// rest of the cool-down. Then one decision probes Redis; if Redis decides it,
/// the breaker closes. So a Redis that is down or stalled costs a decision
/// well under a millisecond instead of the timeout, and decisions resume within
/// one cool-down of its return. While it is closed it costs a decision one
/// atomic load. [`CircuitBreaker`] has the details and settings;
/// [`stats`](RedisStore::stats) its state, openings, probes and answers.
///
/// **Leases** (opt-in, [`RedisStoreBuilder::leases`]): a check that goes to
/// Redis may ask for more units than its cost, counted in Redis at once in
/// the bucket that holds Redis' time; this instance admits further checks of
/// the key from them without a round trip until that bucket ends (measured
/// here from when the request was sent, shortened by the
/// [clock tolerance](Leases::with_clock_tolerance_ppm)), and
/// hands back what is left. Every unit admitted anywhere is thus counted in
/// Redis in the bucket that holds its admission, and the strict check on
/// Redis bounds every window of the fleet: the guide's
/// [fleet chapter](crate::guide::fleet) states the guarantee and proves it.
/// A hot key costs a small fraction of a round trip per decision; a cold key
/// (a request now and then) still costs one. Call
/// [`shutdown`](RedisStore::shutdown) when an instance stops, so that its
/// units go back to the fleet at once.
///
/// **Local deny cache:** when Redis denies `cost` units of a key with
/// `retry_after` R, this instance denies that key (for the same `cost`)
/// locally until R has passed, measured from when the request was sent, so an
/// abusive client costs Redis nothing while it stays blocked. It only denies
/// what Redis would deny: a key's count can only drop as its buckets expire,
/// and R is exactly when enough of them have for `cost` to fit (counts added
/// by other instances meanwhile only make the denial longer). The exceptions,
/// each outlasted by at most R (the safe side): an undo on another instance
/// (this instance's own undos drop the key from its cache), and Redis losing
/// the key's count (a restart without persistence, a key reset because its
/// newest slot was more than a window ahead). Memory is bounded by
/// [`deny_cache`](RedisStoreBuilder::deny_cache) entries; expired ones are swept
/// when it is full.
///
/// ```no_run
/// use std::time::Duration;
/// use tower_sliding_window::{FailurePolicy, Policy, RedisStore, Store};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder(
///     Policy::per(100, Duration::from_secs(60))?,
///     FailurePolicy::Open,
/// )
/// .url("redis://127.0.0.1:6379")
/// .timeout(Duration::from_millis(50))
/// .build()?;
///
/// let decision = store.check_n(&"api-key-1", 1).await?;
/// assert!(decision.is_allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    /// Dropped with the last clone: the store's leases are handed back.
    _owner: Arc<Owner>,
}

/// The handles' share of a store: when the last is dropped, the leases are
/// handed back in the background (the tasks that renew them hold the store's
/// state, not this).
struct Owner(Arc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        if self.0.leases.as_ref().is_some_and(LeaseTable::is_open) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let inner = self.0.clone();
                runtime.spawn(async move { inner.close_leases().await });
            }
        }
    }
}

impl RedisStore {
    fn from_inner(inner: Inner) -> RedisStore {
        let inner = Arc::new(inner);
        RedisStore {
            _owner: Arc::new(Owner(inner.clone())),
            inner,
        }
    }
}

/// One store's state. The connection, the breaker, the counters and the
/// warnings' pace are shared with the stores it was reconfigured from or into
/// (they are about Redis, not the policy); the deny cache is its own.
struct Inner {
    policy: Policy,
    limit: u32,
    buckets: u32,
    width_us: u64,
    interpolated: bool,
    prefix: Vec<u8>,
    conn: Arc<Connection>,
    check: Script,
    timeout: Duration,
    failure: FailurePolicy,
    closed_retry_after: Duration,
    deny_cache: Option<DenyCache>,
    deny_cache_capacity: usize,
    counters: Arc<Counters>,
    warnings: Arc<Every>,
    breaker: Option<Arc<Breaker>>,
    metrics: Arc<RedisMetrics>,
    /// This store's leases (`None`: off); each store has its own.
    leases: Option<LeaseTable>,
    lease_settings: Option<Leases>,
    /// The limiter of [`FailurePolicy::Fallback`], shared with the stores
    /// reconfigured from this one.
    fallback: Option<Arc<Limiter<Vec<u8>>>>,
}

/// Builder for [`RedisStore`]; [`build`](RedisStoreBuilder::build) validates.
#[must_use = "a builder does nothing until `build` makes the store"]
pub struct RedisStoreBuilder {
    policy: Policy,
    failure: FailurePolicy,
    client: Option<Result<Client, RedisError>>,
    /// The URL given to `url` asks for TLS (`rediss://`).
    tls_url: bool,
    connection: Option<Connection>,
    prefix: Option<String>,
    timeout: Duration,
    closed_retry_after: Duration,
    deny_cache_capacity: usize,
    connect_timeout: Duration,
    breaker: CircuitBreaker,
    leases: Option<Leases>,
}

impl RedisStore {
    /// Default per-call timeout: 50 ms.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
    /// Default `Retry-After` suggested when failing closed: 1 s.
    pub const DEFAULT_CLOSED_RETRY_AFTER: Duration = Duration::from_secs(1);
    /// Default deny-cache capacity: 10 000 keys.
    pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 10_000;

    /// Start building a store for `policy`, failing open or closed as `failure` says.
    pub fn builder(policy: Policy, failure: FailurePolicy) -> RedisStoreBuilder {
        RedisStoreBuilder {
            policy,
            failure,
            client: None,
            tls_url: false,
            connection: None,
            prefix: None,
            timeout: RedisStore::DEFAULT_TIMEOUT,
            closed_retry_after: RedisStore::DEFAULT_CLOSED_RETRY_AFTER,
            deny_cache_capacity: RedisStore::DEFAULT_DENY_CACHE_CAPACITY,
            connect_timeout: Duration::from_secs(1),
            breaker: CircuitBreaker::default(),
            leases: None,
        }
    }

    /// Counters since the store was built.
    pub fn stats(&self) -> RedisStoreStats {
        let c = &self.inner.counters;
        let breaker = self.inner.breaker.as_deref();
        RedisStoreStats {
            decisions: c.decisions.load(Relaxed),
            round_trips: c.round_trips.load(Relaxed),
            deny_cache_hits: c.deny_cache_hits.load(Relaxed),
            failures: c.failures.load(Relaxed),
            timeouts: c.timeouts.load(Relaxed),
            failed_open: c.failed_open.load(Relaxed),
            breaker: self.breaker_state(),
            breaker_opens: breaker.map_or(0, |b| b.opens.load(Relaxed)),
            breaker_probes: breaker.map_or(0, |b| b.probes.load(Relaxed)),
            breaker_answered: breaker.map_or(0, |b| b.answered.load(Relaxed)),
            undos: c.undos.load(Relaxed),
            deny_cache_len: self.inner.deny_cache.as_ref().map_or(0, DenyCache::len),
            lease_decisions: c.lease_decisions.load(Relaxed),
            lease_grants: c.lease_grants.load(Relaxed),
            lease_units_granted: c.lease_units_granted.load(Relaxed),
            lease_units_admitted: c.lease_units_admitted.load(Relaxed),
            lease_units_undone: c.lease_units_undone.load(Relaxed),
            lease_units_handed_back: c.lease_units_handed_back.load(Relaxed),
            lease_units_refused: c.lease_units_refused.load(Relaxed),
            lease_units_unreturned: c.lease_units_unreturned.load(Relaxed),
            fallback_decisions: c.fallback_decisions.load(Relaxed),
        }
    }

    /// Where the circuit breaker stands (also in [`stats`](RedisStore::stats)).
    pub fn breaker_state(&self) -> BreakerState {
        self.inner
            .breaker
            .as_deref()
            .map_or(BreakerState::Off, Breaker::state)
    }

    /// A store that enforces `policy` from now on over this store's counts in
    /// Redis (see [`Store::reconfigured`]), for a change of tier or of limits
    /// at run time without a restart.
    ///
    /// The new store uses the same keys (this store's prefix, whatever the
    /// new policy's name), the same connection and circuit breaker, the same
    /// timeout, failure policy and counters ([`stats`](RedisStore::stats)
    /// goes on from this store's). Its deny cache is its own and starts empty:
    /// a denial cached under the old limit must not outlive a raised one.
    /// This store stays usable: a check in flight finishes under the old
    /// policy, and its undos still give back what it counted (unless the new
    /// store has checked the key meanwhile under another window or bucket
    /// count: then they give nothing back, the safe side).
    ///
    /// With [leases](RedisStoreBuilder::leases), the change voids this
    /// store's grants before it returns: this store admits nothing more from
    /// them and leases no more, so that no unit granted under the old policy
    /// is admitted here after the change. The units it held are handed back
    /// (in the background, in the old geometry: nothing is given back to a
    /// key the new store has already converted). The new store leases
    /// afresh, under the new policy. Other instances still on the old policy
    /// keep their grants until their buckets end: a key converted meanwhile
    /// keeps counting their units until then (see the guide's
    /// [fleet chapter](crate::guide::fleet)).
    ///
    /// A change of limit (or precision) keeps the counts as they are: raising
    /// the limit gives room at once, lowering it denies until enough admitted
    /// units have left the window. A change of window or bucket count is
    /// applied to each key by its first check under the new policy, in the
    /// same script run: at the same bucket width the buckets stand as they
    /// are; at another width each old bucket's units move to the new bucket
    /// holding the old one's last instant (at most the current one), so units
    /// only ever move later in time, and those already out of the new window
    /// are dropped. Either way the key's expiry then covers the longer of the
    /// two windows.
    ///
    /// **Guarantee** (strict precision): after a change at time `c` from limit
    /// `L1` over `W1` to `L2` over `W2`, every admission at `t ≥ c` is checked
    /// against `L2` over the new window `(t − W2, t]`, counting all units
    /// admitted after `c` and every unit admitted before `c` that was still
    /// remembered at `c` (inside `(c − W1, c]`), each at a time no earlier
    /// than its true one. Its limits: a key no check reaches from `c` until its
    /// old expiry (one `W1` after its newest units) loses its units then, as
    /// it would have without the change, so with `W2 > W1` an idle key's units
    /// count for `W1` only; the usual exceptions of a store (a clock stepping
    /// back, Redis losing the key) apply; and the keys are shared, so an
    /// instance of the fleet still on the old geometry converts a key back at
    /// its next check (conservatively, units moving later again): reconfigure
    /// every instance.
    ///
    /// Errors as [`RedisStoreBuilder::build`] does for a policy the script
    /// cannot decide exactly (a bucket below 1 µs, a window too long, an
    /// interpolated limit too large).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_sliding_window::{FailurePolicy, Policy, RedisStore, Store};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let free = RedisStore::builder(
    ///     Policy::per(100, Duration::from_secs(60))?,
    ///     FailurePolicy::Open,
    /// )
    /// .url("redis://127.0.0.1:6379")
    /// .build()?;
    /// assert!(free.check_n(&"api-key-1", 1).await?.is_allowed());
    ///
    /// // The customer upgrades: 1 000 a minute from now on, counting the
    /// // requests of the last minute.
    /// let paid = free.reconfigured(Policy::per(1_000, Duration::from_secs(60))?)?;
    /// assert_eq!(paid.redis_key(&"api-key-1"), free.redis_key(&"api-key-1"));
    /// assert_eq!(paid.check_n(&"api-key-1", 1).await?.remaining(), 998);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reconfigured(&self, policy: Policy) -> Result<RedisStore, ConfigError> {
        let old = &self.inner;
        let geometry = Geometry::of(&policy)?;
        let metrics = if policy.name() == old.policy.name() {
            old.metrics.clone()
        } else {
            // Under the new name; the breaker's past openings were reported
            // under the old one.
            let metrics = RedisMetrics::new(policy.name());
            if let Some(breaker) = &old.breaker {
                metrics.skip_opens(breaker.opens.load(Relaxed));
            }
            Arc::new(metrics)
        };
        let inner = Inner {
            deny_cache: new_deny_cache(old.deny_cache_capacity, &policy),
            deny_cache_capacity: old.deny_cache_capacity,
            limit: policy.limit(),
            buckets: geometry.buckets,
            width_us: geometry.width_us,
            interpolated: geometry.interpolated,
            policy,
            prefix: old.prefix.clone(),
            conn: old.conn.clone(),
            check: Script::new(CHECK_SCRIPT),
            timeout: old.timeout,
            failure: old.failure.clone(),
            closed_retry_after: old.closed_retry_after,
            counters: old.counters.clone(),
            warnings: old.warnings.clone(),
            breaker: old.breaker.clone(),
            metrics,
            leases: old
                .lease_settings
                .map(|l| LeaseTable::new(l, Duration::from_micros(geometry.width_us))),
            lease_settings: old.lease_settings,
            fallback: old.fallback.clone(),
        };
        // Voided now: no check of the old store admits from a grant once the
        // new store exists. Handed back in the background.
        if let Some(table) = &old.leases {
            let held = table.close();
            if !held.is_empty() {
                old.spawn_hand_backs(held);
            }
        }
        Ok(RedisStore::from_inner(inner))
    }

    /// Hand back every unit this store's leases hold and lease no more (the
    /// store goes on deciding, each check with a round trip); returns once
    /// Redis has answered each hand-back (or its timeout passed). Call it
    /// before an instance stops, so that the fleet gets the units back at
    /// once: dropping the last clone of the store does the same in the
    /// background, and an instance that dies without either loses its
    /// leftovers to the fleet until their bucket leaves the window.
    pub async fn shutdown(&self) {
        self.inner.close_leases().await;
    }

    /// The Redis key that holds `key`'s counts: `prefix{key}`.
    pub fn redis_key<K: RedisKey + ?Sized>(&self, key: &K) -> Vec<u8> {
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        self.inner.full_key(&user)
    }

    /// Wait (up to the timeout) until Redis answers and the decision scripts are
    /// loaded, trying again every few milliseconds while the connection fails.
    /// Optional: the first decision loads them too; useful at startup to find
    /// out early whether Redis is reachable. The error is the last connection
    /// failure (say, refused) when there was one.
    pub async fn warm_up(&self) -> Result<(), StoreError> {
        self.inner.load_scripts(self.inner.timeout).await
    }

    /// Decide at a given Redis time instead of Redis' `TIME`, bypassing the deny
    /// cache and the failure policy. For tests that compare the script with the
    /// in-memory ring decision by decision.
    #[cfg(all(test, not(tsw_loom)))]
    pub(crate) async fn check_at<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        cost: u32,
        now: Duration,
    ) -> Result<Decision, String> {
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        let now_us = u64::try_from(now.as_micros()).map_err(|e| e.to_string())?;
        match self.inner.run_check(&user, cost, Some(now_us)).await {
            Ok(d) => Ok(d),
            Err(e) => Err(e.into_error(Duration::ZERO).to_string()),
        }
    }
}

/// What one run of the script at an injected time answered (for tests that
/// play an instance's lease by hand).
#[cfg(all(test, not(tsw_loom)))]
#[derive(Debug)]
pub(crate) struct ScriptAnswer {
    pub(crate) decision: Decision,
    /// Units counted: the cost and a lease's extra units.
    pub(crate) granted: u32,
    /// How long the decision's slot lasted.
    pub(crate) valid: Duration,
    /// Units of the hand-back that Redis lowered.
    pub(crate) handed_back: u32,
}

#[cfg(all(test, not(tsw_loom)))]
impl RedisStore {
    /// One run of the script at Redis time `now`: a check of `cost` units of
    /// `key`, asking for a lease of `rate` units a second while this instance
    /// holds `have` (a rate of 0 asks for none), after handing `back` back.
    pub(crate) async fn script_at<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        cost: u32,
        now: Duration,
        rate: f64,
        have: u32,
        back: Option<Counted>,
    ) -> Result<ScriptAnswer, String> {
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        let now_us = u64::try_from(now.as_micros()).map_err(|e| e.to_string())?;
        let lease = Some(LeaseArgs { rate, have });
        match self
            .inner
            .call(&user, cost, Some(now_us), lease, back)
            .await
        {
            Ok(a) => Ok(ScriptAnswer {
                decision: a.decision,
                granted: a.granted,
                valid: a.valid,
                handed_back: a.handed_back,
            }),
            Err(e) => Err(e.into_error(Duration::ZERO).to_string()),
        }
    }
}

impl RedisStore {
    /// [`Store::undo`], awaited instead of fired and forgotten (for tests).
    #[cfg(all(test, not(tsw_loom)))]
    pub(crate) async fn undo_now<K: RedisKey + ?Sized>(&self, key: &K, decision: &Decision) {
        if let Some((user, back)) = self.inner.undo_target(key, decision) {
            self.inner.run_undo(user, back, None).await;
        }
    }

    /// [`Store::undo`] at a given Redis time, awaited (for tests that decide
    /// at injected times: the script hands units back only to slots inside
    /// the window of its time).
    #[cfg(all(test, not(tsw_loom)))]
    pub(crate) async fn undo_at<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        decision: &Decision,
        now: Duration,
    ) {
        if let Some((user, back)) = self.inner.undo_target(key, decision) {
            let now_us = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
            self.inner.run_undo(user, back, Some(now_us)).await;
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("policy", &self.inner.policy)
            .field("prefix", &String::from_utf8_lossy(&self.inner.prefix))
            .field("timeout", &self.inner.timeout)
            .field("failure", &self.inner.failure)
            .field("breaker", &self.breaker_state())
            .field("leases", &self.inner.lease_settings)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RedisStoreBuilder {
    /// The settings, without the client or connection (a URL may hold a
    /// password).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("policy", &self.policy)
            .field("failure", &self.failure)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("closed_retry_after", &self.closed_retry_after)
            .field("deny_cache_capacity", &self.deny_cache_capacity)
            .field("connect_timeout", &self.connect_timeout)
            .field("circuit_breaker", &self.breaker)
            .field("leases", &self.leases)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The Redis to use, as a URL (`redis://host:port/db`, or
    /// `rediss://host:port/db` over TLS, which needs this crate's `redis-tls`
    /// feature and trusts the [webpki roots](https://docs.rs/webpki-roots):
    /// for a private CA or a client certificate, give a
    /// [`client`](RedisStoreBuilder::client) instead). An invalid URL is
    /// reported by [`build`](RedisStoreBuilder::build):
    /// [`ConfigError::InvalidRedisUrl`], or [`ConfigError::RedisTlsNotEnabled`]
    /// for a `rediss://` URL without the `redis-tls` feature.
    pub fn url(mut self, url: &str) -> Self {
        self.client = Some(Client::open(url));
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        self.tls_url =
            scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys");
        self
    }

    /// The Redis to use, as a `redis` crate client. Over TLS (feature
    /// `redis-tls`) with a private CA or a client certificate, build it with
    /// `redis::Client::build_with_tls` and `redis::TlsCertificates`.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(Ok(client));
        self
    }

    /// Decide over a connection of your own instead of a managed one: any cloneable
    /// `redis` crate async connection. For Redis Cluster, enable the `redis`
    /// crate's `cluster-async` feature in your own `Cargo.toml` and pass a
    /// `redis::cluster_async::ClusterConnection`: every key's data lives under one
    /// hash tag, so each script touches one slot. Reconnecting is then that
    /// connection's business (the cluster connection does it; a bare
    /// `MultiplexedConnection` does not).
    pub fn connection<C>(mut self, connection: C) -> Self
    where
        C: AsyncConnection + Clone + Send + Sync + 'static,
    {
        self.connection = Some(Connection::Custom(Box::new(connection)));
        self
    }

    /// Prefix of every Redis key (default
    /// `tsw:<policy name>:<window µs>:<buckets>:`, the window with three
    /// decimals when it is not a whole number of µs, so policies of other
    /// geometries never share a key; two layers whose policies differ in none
    /// of these, say two routes on the default name with other limits, or a
    /// strict and an interpolated policy, do share one: name them). The limit
    /// is not in it, so a store built afresh with another limit keeps the
    /// counts; a [`reconfigured`](RedisStore::reconfigured) store keeps its
    /// prefix whatever the new policy. It must not contain `{` or `}`: the
    /// key's hash tag follows it. A custom prefix kept across a change of
    /// bucket width meets the old slots: the key records its geometry, and
    /// the first check under another
    /// width converts its counts as [`RedisStore::reconfigured`] describes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Longest wait for Redis per decision, connecting included (default 50 ms).
    /// Past it the [`FailurePolicy`] decides. A decision that timed out may still
    /// be counted by Redis later (the safe side).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The `Retry-After` suggested by a [`StoreError`] when failing closed (default 1 s).
    pub fn closed_retry_after(mut self, retry_after: Duration) -> Self {
        self.closed_retry_after = retry_after;
        self
    }

    /// How many over-limit keys the local deny cache remembers (default
    /// [`RedisStore::DEFAULT_DENY_CACHE_CAPACITY`]; 0 turns it off).
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache_capacity = capacity;
        self
    }

    /// When to stop asking Redis after failures, and for how long (default
    /// [`CircuitBreaker::default`]: open after 5 failures in a row or a
    /// timeout during which Redis decided nothing, cool down 100 ms doubling
    /// up to 2 s; [`CircuitBreaker::OFF`] turns it off). While
    /// it is open, decisions are answered at once per the [`FailurePolicy`]:
    /// see [`CircuitBreaker`].
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Timeout of one connection attempt (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Lease units to this instance (off by default): a check that goes to
    /// Redis may ask for more units than its cost, which this instance then
    /// admits without a round trip until the bucket they were counted in
    /// ends; see [`Leases`] for how much, and [`RedisStore`] for the
    /// guarantee. A hot key costs a small fraction of a round trip per
    /// decision; a cold key (a request now and then) still costs one.
    pub fn leases(mut self, leases: Leases) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Validate and build. Must run inside a tokio runtime; connects lazily (and
    /// starts connecting at once in the background), so it succeeds while Redis
    /// is down.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime);
        }
        let client = match (self.client, self.connection.is_some()) {
            (Some(_), true) => return Err(ConfigError::RedisConnectionConflict),
            (Some(Ok(client)), false) => Some(client),
            (Some(Err(_)), false) if self.tls_url && !cfg!(feature = "redis-tls") => {
                return Err(ConfigError::RedisTlsNotEnabled)
            }
            (Some(Err(e)), false) => {
                return Err(ConfigError::InvalidRedisUrl {
                    source: Box::new(e),
                })
            }
            (None, true) => None,
            (None, false) => return Err(ConfigError::NoRedis),
        };
        if self.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if !self.breaker.is_off() && self.breaker.cool_down().is_zero() {
            return Err(ConfigError::ZeroCoolDown);
        }
        if let Some(leases) = self.leases {
            if leases.share() == 0 {
                return Err(ConfigError::ZeroLeaseShare);
            }
            if leases.keys() == 0 {
                return Err(ConfigError::ZeroLeaseKeys);
            }
        }
        let fallback = match &self.failure {
            FailurePolicy::Fallback(policy) => Some(Arc::new(Limiter::new(policy.clone())?)),
            _ => None,
        };
        let policy = self.policy;
        let geometry = Geometry::of(&policy)?;
        let buckets = geometry.buckets;
        let prefix = match self.prefix {
            Some(prefix) => prefix,
            None => {
                // The window in µs, with its nanoseconds when it has any: windows
                // a fraction of a µs apart can round to other bucket widths.
                let window = policy.window();
                let sub_us = window.subsec_nanos() % 1000;
                let fraction = if sub_us == 0 {
                    String::new()
                } else {
                    format!(".{sub_us:03}")
                };
                // Not the limit: a store built with another limit (an
                // instance restarted after a change of tier) keeps the keys.
                format!(
                    "tsw:{}:{}{}:{}:",
                    policy.name(),
                    window.as_micros(),
                    fraction,
                    buckets
                )
            }
        };
        if prefix.contains(['{', '}']) {
            return Err(ConfigError::InvalidRedisPrefix { prefix });
        }
        let conn = match (client, self.connection) {
            (Some(client), _) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    // The store's own timeout bounds every call. The crate's
                    // default (500 ms) would cut a longer timeout short, and as
                    // an error reply it would not count toward replacing a
                    // connection gone silent.
                    .set_response_timeout(None)
                    // One attempt per connection: the manager's own retry loop
                    // would hold every decision until the timeout while Redis is
                    // away and hide why (a refused connection read as a
                    // timeout). A failed attempt is retried by the next
                    // decision (see `invoke`).
                    .set_number_of_retries(0)
                    // Pipelined decisions from many concurrent requests queue here.
                    .set_pipeline_buffer_size(1024);
                Connection::managed(client, config).map_err(|e| ConfigError::InvalidRedisUrl {
                    source: Box::new(e),
                })?
            }
            (None, Some(connection)) => connection,
            (None, None) => return Err(ConfigError::NoRedis),
        };
        let metrics = Arc::new(RedisMetrics::new(policy.name()));
        let inner = Inner {
            deny_cache: new_deny_cache(self.deny_cache_capacity, &policy),
            deny_cache_capacity: self.deny_cache_capacity,
            limit: policy.limit(),
            buckets: geometry.buckets,
            width_us: geometry.width_us,
            interpolated: geometry.interpolated,
            policy,
            prefix: prefix.into_bytes(),
            conn: Arc::new(conn),
            check: Script::new(CHECK_SCRIPT),
            timeout: self.timeout,
            failure: self.failure,
            closed_retry_after: self.closed_retry_after,
            counters: Arc::default(),
            warnings: Arc::new(Every::new(WARN_INTERVAL)),
            breaker: Breaker::new(self.breaker).map(Arc::new),
            metrics,
            leases: self
                .leases
                .map(|l| LeaseTable::new(l, Duration::from_micros(geometry.width_us))),
            lease_settings: self.leases,
            fallback,
        };
        let store = RedisStore::from_inner(inner);
        // Connect and load the scripts now, in the background, so the first request
        // does not pay for it (the lazy connection only progresses while awaited).
        let warm = store.inner.clone();
        tokio::spawn(async move {
            let _ = warm.load_scripts(BACKGROUND_WARM_UP).await;
        });
        Ok(store)
    }
}

/// How a policy's buckets are numbered in Redis, validated.
struct Geometry {
    /// The bucket width in whole microseconds, rounded up: N buckets still
    /// cover the whole window.
    width_us: u64,
    buckets: u32,
    interpolated: bool,
}

impl Geometry {
    /// The geometry of `policy`, if the script can decide it exactly.
    fn of(policy: &Policy) -> Result<Geometry, ConfigError> {
        // Redis' TIME has microsecond resolution.
        let resolution = Duration::from_micros(1);
        if policy.bucket_width() < resolution {
            return Err(ConfigError::BucketBelowClockResolution {
                bucket: policy.bucket_width(),
                resolution,
            });
        }
        let width_us = policy.bucket_nanos().div_ceil(1000);
        let buckets = policy.buckets();
        let span_us = width_us as u128 * (buckets as u128 + 1);
        // Slot times are microseconds since 1970 (about 2^51 today) plus a span.
        if span_us >= 1 << 52 {
            let max_width_us = ((1u64 << 52) - 1) / (u64::from(buckets) + 1);
            return Err(ConfigError::WindowTooLong {
                window: policy.window(),
                max: Duration::from_micros(max_width_us * u64::from(buckets)),
            });
        }
        let interpolated = policy.precision() == Precision::Interpolated;
        if interpolated && (policy.limit() as u128 + 1) * width_us as u128 >= LUA_EXACT {
            return Err(ConfigError::InterpolationOutOfRange);
        }
        Ok(Geometry {
            width_us,
            buckets,
            interpolated,
        })
    }
}

/// A deny cache for `policy` (`None` for capacity 0).
fn new_deny_cache(capacity: usize, policy: &Policy) -> Option<DenyCache> {
    (capacity > 0).then(|| {
        DenyCache::new(
            capacity,
            policy.limit(),
            policy.window() + policy.bucket_width(),
        )
    })
}

impl Inner {
    /// A decision that needs no round trip: a cost that can never pass, or a
    /// deny-cache hit.
    fn local_answer(&self, user: &[u8], cost: u32) -> Option<Decision> {
        if cost > self.limit {
            // It can never pass: no need to ask Redis (remaining and reset unknown).
            self.metrics.decided(false);
            return Some(Decision::cost_exceeds_limit(
                self.limit,
                self.limit,
                Duration::ZERO,
            ));
        }
        let d = self
            .deny_cache
            .as_ref()?
            .check(user, cost, Instant::now())?;
        bump(&self.counters.deny_cache_hits);
        self.metrics.deny_cache_hit();
        self.metrics.decided(false);
        Some(d)
    }

    fn full_key(&self, user: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + user.len() + 2);
        key.extend_from_slice(&self.prefix);
        key.push(b'{');
        key.extend_from_slice(user);
        key.push(b'}');
        key
    }

    /// Load the script, trying again while the connection fails, until
    /// `timeout`.
    async fn load_scripts(&self, timeout: Duration) -> Result<(), StoreError> {
        let mut last_connection_error = None;
        let load = async {
            let mut pause = WARM_UP_MIN_PAUSE;
            loop {
                let mut conn = self.conn.handle();
                let loaded = self.check.load_async(&mut conn);
                match loaded.await {
                    Err(e) if e.is_io_error() => {
                        last_connection_error = Some(e);
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(WARM_UP_MAX_PAUSE);
                    }
                    done => return done,
                }
            }
        };
        let failure = match tokio::time::timeout(timeout, load).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => Failure::Redis(e),
            Err(_) => last_connection_error.map_or(Failure::Timeout, Failure::Redis),
        };
        Err(failure.into_error(self.closed_retry_after))
    }

    /// One decision script in Redis, bounded by the timeout; failures are reported
    /// as they are (the failure policy is applied by the caller).
    #[cfg(all(test, not(tsw_loom)))]
    async fn run_check(
        &self,
        user: &[u8],
        cost: u32,
        now_us: Option<u64>,
    ) -> Result<Decision, Failure> {
        self.call(user, cost, now_us, None, None)
            .await
            .map(|answer| answer.decision)
    }

    /// One run of the script: a check of `cost` units (asking for a lease's
    /// extra units too, with `lease`), with `back` units handed back first,
    /// at `now_us` or Redis' time.
    async fn call(
        &self,
        user: &[u8],
        cost: u32,
        now_us: Option<u64>,
        lease: Option<LeaseArgs>,
        back: Option<Counted>,
    ) -> Result<Answer, Failure> {
        bump(&self.counters.round_trips);
        let mut invocation = self.check.prepare_invoke();
        invocation
            .key(self.full_key(user))
            .arg(self.limit)
            .arg(self.buckets)
            .arg(self.width_us)
            .arg(cost)
            .arg(u8::from(self.interpolated));
        if now_us.is_some() || lease.is_some() || back.is_some() {
            match now_us {
                Some(now_us) => invocation.arg(now_us),
                None => invocation.arg(""),
            };
        }
        if lease.is_some() || back.is_some() {
            let lease = lease.unwrap_or(LeaseArgs { rate: 0.0, have: 0 });
            let share = self.leases.as_ref().map_or(1, LeaseTable::share);
            // Units a second, to the millisecond unit: whole digits for Lua.
            let rate = format!("{:.3}", lease.rate);
            invocation.arg(rate).arg(lease.have).arg(share);
        }
        if let Some(back) = back {
            invocation
                .arg(back.units)
                .arg(back.slot)
                .arg(back.incarnation);
        }
        let reply: Vec<i64> = self.invoke(&invocation).await?;
        self.parse(&reply, cost).ok_or(Failure::Reply)
    }

    /// One script call within the timeout, telling the connection whether it
    /// was answered (for its replacement after timeouts in a row).
    async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Failure> {
        let call = async {
            let mut conn = self.conn.handle();
            // `invoke_async` sends EVALSHA and, on NOSCRIPT, SCRIPT LOAD + EVALSHA.
            match invocation.invoke_async(&mut conn).await {
                // Refused means nothing was sent. The managed connection makes
                // a new attempt only when a request finds the last one failed,
                // and that one may date from before Redis returned: try once
                // more on the attempt this failure has just started.
                Err(e) if e.is_connection_refusal() && self.conn.is_managed() => {
                    invocation.invoke_async(&mut conn).await
                }
                reply => reply,
            }
        };
        let started = self.metrics.call_started();
        let reply = tokio::time::timeout(self.timeout, call).await;
        self.metrics.call_ended(started);
        match reply {
            Ok(reply) => {
                self.conn.answered();
                reply.map_err(Failure::Redis)
            }
            Err(_) => {
                self.conn.timed_out();
                Err(Failure::Timeout)
            }
        }
    }

    /// `{allowed, remaining, retry_after_us, reset_us, slot, granted,
    /// valid_us, incarnation, handed_back}` into an answer.
    fn parse(&self, reply: &[i64], cost: u32) -> Option<Answer> {
        let &[allowed, remaining, retry_us, reset_us, slot, granted, valid_us, incarnation, handed_back] =
            reply
        else {
            return None;
        };
        let micros = |v: i64| u64::try_from(v).ok().map(Duration::from_micros);
        let outcome = match allowed {
            1 => Outcome::Allowed,
            0 => Outcome::Denied,
            _ => return None,
        };
        let mut d = Decision::from_parts(
            outcome,
            self.limit,
            u32::try_from(remaining).ok()?,
            micros(retry_us)?,
            micros(reset_us)?,
        );
        d.slot = u64::try_from(slot).ok()?;
        d.incarnation = u64::try_from(incarnation).ok()?;
        if outcome == Outcome::Allowed {
            d.cost = cost;
        }
        Some(Answer {
            decision: d,
            granted: u32::try_from(granted).ok()?,
            valid: micros(valid_us)?,
            handed_back: u32::try_from(handed_back).ok()?,
        })
    }

    /// A remote decision for a request: the script (with a lease's part when
    /// `ask` has one), the deny cache fed with its denials, the circuit
    /// breaker told how it went (`probe`: this decision is the half-open
    /// breaker's probe), and the failure policy applied to its failures.
    async fn decide(
        self: Arc<Self>,
        user: Vec<u8>,
        cost: u32,
        probe: bool,
        ask: Option<(u64, Ask)>,
    ) -> Result<Decision, StoreError> {
        // Dropped with the future before Redis answers, it lets the next decision probe.
        let probe = probe
            .then(|| self.breaker.as_deref().map(Probe::new))
            .flatten();
        // Likewise, it lets the next check of the key ask for a grant.
        let fetch = ask
            .filter(|(_, ask)| ask.rate > 0.0)
            .and_then(|(hash, _)| Some(Fetch::new(self.leases.as_ref()?, &user, hash)));
        let sent = Instant::now();
        let generation = self.deny_cache.as_ref().map(|c| c.generation(&user));
        let (lease, back) = match ask {
            Some((_, ask)) => (
                (ask.rate > 0.0).then_some(LeaseArgs {
                    rate: ask.rate,
                    have: ask.have,
                }),
                ask.back,
            ),
            None => (None, None),
        };
        match self.call(&user, cost, None, lease, back).await {
            Ok(answer) => {
                self.redis_answered(probe);
                if let Some(back) = back {
                    self.handed_back(&user, back, answer.handed_back);
                }
                let mut decision = answer.decision;
                if let (Some(()), Some((hash, _))) = (fetch.map(Fetch::done), ask) {
                    let extra = answer.granted.saturating_sub(cost);
                    let received = Instant::now();
                    self.merged(&user, hash, &answer, extra, sent, received, false);
                    // The units this instance now holds are this key's to use.
                    decision.remaining = decision.remaining.saturating_add(extra);
                }
                self.metrics.decided(decision.is_allowed());
                if let (Some(cache), Some(generation), Outcome::Denied) =
                    (&self.deny_cache, generation, decision.outcome())
                {
                    cache.insert(user.into_boxed_slice(), sent, generation, cost, &decision);
                }
                Ok(decision)
            }
            Err(failure) => {
                if let Some(back) = back {
                    self.unreturned(back.units);
                }
                let error = self.note_failure(failure, probe, sent);
                self.apply_policy(&user, cost, error)
            }
        }
    }

    /// The failure policy's answer to a decision Redis could not make.
    fn apply_policy(
        &self,
        user: &Vec<u8>,
        cost: u32,
        error: StoreError,
    ) -> Result<Decision, StoreError> {
        match &self.failure {
            FailurePolicy::Open => {
                self.metrics.failed(true);
                bump(&self.counters.failed_open);
                Ok(Decision::allow_unchecked(self.limit))
            }
            FailurePolicy::Closed => {
                self.metrics.failed(false);
                Err(error)
            }
            FailurePolicy::Fallback(_) => Ok(self.fallback_decision(user, cost)),
        }
    }

    /// A decision of the fallback limiter, its slot marked as such.
    fn fallback_decision(&self, user: &Vec<u8>, cost: u32) -> Decision {
        let Some(limiter) = &self.fallback else {
            return Decision::allow_unchecked(self.limit);
        };
        let mut d = limiter.check_n(user, cost);
        d.slot |= FALLBACK_SLOT;
        bump(&self.counters.fallback_decisions);
        self.metrics.fallback(d.is_allowed());
        d
    }

    /// The open breaker's answer, at once: the failure policy applied to the
    /// failure that opened it. Failing closed, `Retry-After` is at least the
    /// rest of the cool-down.
    #[cold]
    fn breaker_answer(
        &self,
        user: &Vec<u8>,
        cost: u32,
        breaker: &Breaker,
        remaining: Duration,
    ) -> Result<Decision, StoreError> {
        bump(&breaker.answered);
        match &self.failure {
            FailurePolicy::Open => {
                self.metrics.failed(true);
                bump(&self.counters.failed_open);
                Ok(Decision::allow_unchecked(self.limit))
            }
            FailurePolicy::Closed => {
                self.metrics.failed(false);
                let retry_after = self.closed_retry_after.max(remaining);
                Err(match breaker.cause() {
                    Some(cause) => cause.with_retry_after(retry_after),
                    None => StoreError::new(StoreErrorKind::Other, retry_after)
                        .with_source("the Redis circuit breaker is open"),
                })
            }
            FailurePolicy::Fallback(_) => Ok(self.fallback_decision(user, cost)),
        }
    }

    /// Redis answered a call: the breaker's run of failures ends, and a probe
    /// closes it.
    fn redis_answered(&self, probe: Option<Probe<'_>>) {
        match (probe, &self.breaker) {
            (Some(probe), _) => {
                probe.finish(None);
                self.breaker_changed();
            }
            (None, Some(breaker)) => breaker.succeeded(),
            (None, None) => {}
        }
    }

    /// Count a failure of a call sent at `sent`, tell the breaker (a failed
    /// probe opens it again), and warn, at most once per [`WARN_INTERVAL`]: a
    /// Redis outage under load must not turn into a flood of log lines.
    fn note_failure(
        &self,
        failure: Failure,
        probe: Option<Probe<'_>>,
        sent: Instant,
    ) -> StoreError {
        let error = failure.into_error(self.closed_retry_after);
        bump(&self.counters.failures);
        if error.kind() == StoreErrorKind::Timeout {
            bump(&self.counters.timeouts);
        }
        self.metrics.error(error.kind());
        match (probe, &self.breaker) {
            (Some(probe), _) => probe.finish(Some(&error)),
            (None, Some(breaker)) => {
                if breaker.failed(&error, sent) {
                    // Nothing came back on the connection for a whole timeout:
                    // it may be one gone silent, which the breaker's probes
                    // would otherwise keep waiting on.
                    self.conn.stalled();
                }
            }
            (None, None) => {}
        }
        self.breaker_changed();
        if self.warnings.due(Instant::now()) {
            let failures = self.counters.failures.load(Relaxed);
            let since_last_warning =
                failures.saturating_sub(self.counters.warned_failures.swap(failures, Relaxed));
            tracing::warn!(
                failures_since_last_warning = since_last_warning,
                failures,
                timeouts = self.counters.timeouts.load(Relaxed),
                failed_open = self.counters.failed_open.load(Relaxed),
                breaker = ?self.breaker.as_deref().map_or(BreakerState::Off, Breaker::state),
                policy = ?self.failure,
                kind = ?error.kind(),
                "Redis could not decide: {error}"
            );
        }
        error
    }

    /// Hand the breaker's state and openings to the metrics recorder.
    fn breaker_changed(&self) {
        if let Some(breaker) = &self.breaker {
            self.metrics
                .breaker(breaker.state(), breaker.opens.load(Relaxed));
        }
    }

    /// Whether calls go to Redis now (no breaker, or a closed one).
    fn redis_in_use(&self) -> bool {
        self.breaker
            .as_deref()
            .is_none_or(|b| b.state() == BreakerState::Closed)
    }

    /// A check admitted from a lease, or (`Err`) what its call to Redis asks
    /// for besides its cost: `None` without leases.
    fn leased(self: &Arc<Self>, user: &[u8], cost: u32) -> Result<Decision, Option<(u64, Ask)>> {
        let Some(table) = &self.leases else {
            return Err(None);
        };
        if cost == 0 {
            return Err(None);
        }
        let hash = table.hash(user);
        match table.take(user, hash, cost) {
            Ok(leased) => Ok(self.lease_decision(user, hash, cost, leased)),
            Err(ask) => Err(Some((hash, ask))),
        }
    }

    /// A check admitted from a lease, if it can be: nothing done otherwise.
    fn leased_now(self: &Arc<Self>, user: &[u8], cost: u32) -> Option<Decision> {
        let table = self.leases.as_ref()?;
        if cost == 0 {
            return None;
        }
        let hash = table.hash(user);
        let leased = table.take_held(user, hash, cost)?;
        Some(self.lease_decision(user, hash, cost, leased))
    }

    /// The decision of a check admitted from a lease (and its refill started).
    fn lease_decision(
        self: &Arc<Self>,
        user: &[u8],
        hash: u64,
        cost: u32,
        leased: Leased,
    ) -> Decision {
        bump(&self.counters.lease_decisions);
        self.counters
            .lease_units_admitted
            .fetch_add(u64::from(cost), Relaxed);
        self.metrics.lease_decision();
        self.metrics.decided(true);
        if let Some(rate) = leased.refill {
            self.spawn_refill(user.to_vec(), hash, rate);
        }
        let mut d = Decision::from_parts(
            Outcome::Allowed,
            self.limit,
            leased.remaining,
            Duration::ZERO,
            leased.reset,
        );
        d.slot = leased.slot;
        d.incarnation = leased.incarnation;
        d.cost = cost;
        d
    }

    /// A check that will not go to Redis after all (the breaker answers it):
    /// undo what [`leased`](Self::leased) set up for its call.
    fn lease_not_asked(&self, user: &[u8], ask: Option<(u64, Ask)>) {
        let (Some(table), Some((hash, ask))) = (&self.leases, ask) else {
            return;
        };
        if ask.rate > 0.0 {
            table.fetch_abandoned(user, hash);
        }
        if let Some(back) = ask.back {
            // Still this instance's to use if the grant is in force; else
            // they stay counted in Redis until their slot leaves the window.
            if !table.give_back(user, back) {
                self.unreturned(back.units);
            }
        }
    }

    /// Merge a reply that asked for a grant into the lease table, and start
    /// what that leaves to do: hand-backs, a renewal task. The time to renew
    /// the grant now held, if any.
    #[allow(clippy::too_many_arguments)]
    fn merged(
        self: &Arc<Self>,
        user: &[u8],
        hash: u64,
        answer: &Answer,
        extra: u32,
        sent: Instant,
        received: Instant,
        ticker: bool,
    ) -> Option<Instant> {
        let table = self.leases.as_ref()?;
        let reply = Reply {
            slot: answer.decision.slot,
            incarnation: answer.decision.incarnation,
            extra,
            valid: answer.valid,
            sent,
            received,
            remaining: answer.decision.remaining,
            reset: answer.decision.reset(),
        };
        if extra > 0 {
            bump(&self.counters.lease_grants);
            self.counters
                .lease_units_granted
                .fetch_add(u64::from(extra), Relaxed);
            self.metrics.lease_granted(extra);
        }
        let merged = table.granted(user, hash, reply, ticker);
        if !merged.back.is_empty() {
            let held = merged.back.into_iter().map(|b| (user.into(), b));
            self.spawn_hand_backs(held.collect());
        }
        if let Some(at) = merged.tick {
            self.spawn_renewals(user.to_vec(), hash, at);
        }
        merged.renew_at
    }

    /// Fetch more units of a key whose grant runs low, in the background.
    fn spawn_refill(self: &Arc<Self>, user: Vec<u8>, hash: u64, rate: f64) {
        let Some(table) = &self.leases else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            table.fetch_abandoned(&user, hash);
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move {
            let Some(table) = &inner.leases else { return };
            if !inner.redis_in_use() {
                table.fetch_abandoned(&user, hash);
                return;
            }
            let fetch = Fetch::new(table, &user, hash);
            let have = table.have(&user, hash);
            let sent = Instant::now();
            let lease = LeaseArgs { rate, have };
            match inner.call(&user, 0, None, Some(lease), None).await {
                Ok(answer) => {
                    inner.redis_answered(None);
                    fetch.done();
                    let received = Instant::now();
                    let extra = answer.granted;
                    inner.merged(&user, hash, &answer, extra, sent, received, false);
                }
                Err(failure) => {
                    inner.note_failure(failure, None, sent);
                }
            }
        });
    }

    /// The task that follows a key's grants: when a grant's bucket has ended,
    /// it hands back what is left and, while the key stays busy here, fetches
    /// the next bucket's grant in the same call, so that a steady hot key
    /// never waits for one.
    fn spawn_renewals(self: &Arc<Self>, user: Vec<u8>, hash: u64, at: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move {
            let Some(table) = &inner.leases else { return };
            let mut at = at;
            loop {
                tokio::time::sleep_until(at.into()).await;
                match table.tick(&user, hash) {
                    Tick::Wait(next) => at = next,
                    Tick::End { back } => {
                        if let Some(back) = back {
                            inner.hand_back(&user, back).await;
                        }
                        return;
                    }
                    Tick::Renew { back, rate } => {
                        let fetch = Fetch::new(table, &user, hash);
                        if !inner.redis_in_use() {
                            table.renewal_failed(&user, hash);
                            if let Some(back) = back {
                                inner.unreturned(back.units);
                            }
                            return;
                        }
                        let sent = Instant::now();
                        let lease = LeaseArgs { rate, have: 0 };
                        match inner.call(&user, 0, None, Some(lease), back).await {
                            Ok(answer) => {
                                inner.redis_answered(None);
                                fetch.done();
                                if let Some(back) = back {
                                    inner.handed_back(&user, back, answer.handed_back);
                                }
                                let received = Instant::now();
                                let extra = answer.granted;
                                match inner
                                    .merged(&user, hash, &answer, extra, sent, received, true)
                                {
                                    Some(next) => at = next,
                                    None => return,
                                }
                            }
                            Err(failure) => {
                                inner.note_failure(failure, None, sent);
                                table.renewal_failed(&user, hash);
                                if let Some(back) = back {
                                    inner.unreturned(back.units);
                                }
                                return;
                            }
                        }
                    }
                }
            }
        });
    }

    /// Hand units back to Redis, in the background, concurrently.
    fn spawn_hand_backs(self: &Arc<Self>, held: Vec<(Box<[u8]>, Counted)>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            for (_, back) in held {
                self.unreturned(back.units);
            }
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move { inner.hand_back_all(held).await });
    }

    /// Hand units back to Redis, concurrently; returns once Redis has
    /// answered each (or its timeout passed).
    async fn hand_back_all(self: &Arc<Self>, held: Vec<(Box<[u8]>, Counted)>) {
        let mut hand_backs = tokio::task::JoinSet::new();
        for (user, back) in held {
            let inner = self.clone();
            hand_backs.spawn(async move { inner.hand_back(&user, back).await });
        }
        while hand_backs.join_next().await.is_some() {}
    }

    /// Hand a lease's unused units back to Redis.
    async fn hand_back(&self, user: &[u8], back: Counted) {
        if !self.redis_in_use() {
            self.unreturned(back.units);
            return;
        }
        let sent = Instant::now();
        match self.call(user, 0, None, None, Some(back)).await {
            Ok(answer) => {
                self.redis_answered(None);
                self.handed_back(user, back, answer.handed_back);
            }
            Err(failure) => {
                self.unreturned(back.units);
                self.note_failure(failure, None, sent);
            }
        }
    }

    /// Redis answered a hand-back of `back`, lowering `taken` of its units:
    /// count them (the rest were refused), and drop a denial of the key this
    /// instance may have cached meanwhile.
    fn handed_back(&self, user: &[u8], back: Counted, taken: u32) {
        let taken = taken.min(back.units);
        let c = &self.counters;
        c.lease_units_handed_back
            .fetch_add(u64::from(taken), Relaxed);
        c.lease_units_refused
            .fetch_add(u64::from(back.units - taken), Relaxed);
        self.metrics.lease_handed_back(taken, back.units - taken);
        if taken > 0 {
            if let Some(cache) = &self.deny_cache {
                cache.remove(user);
            }
        }
    }

    /// Units of a grant that will not be handed back.
    fn unreturned(&self, units: u32) {
        self.counters
            .lease_units_unreturned
            .fetch_add(u64::from(units), Relaxed);
        self.metrics.lease_unreturned(units);
    }

    /// Stop leasing and hand back every unit held, concurrently.
    async fn close_leases(self: &Arc<Self>) {
        let Some(table) = &self.leases else { return };
        self.hand_back_all(table.close()).await;
    }

    /// What an undo of `decision` gives back (nothing unless it counted units), after
    /// dropping the key from the local deny cache.
    fn undo_target<K: RedisKey + ?Sized>(
        &self,
        key: &K,
        decision: &Decision,
    ) -> Option<(Vec<u8>, Counted)> {
        if !decision.is_allowed() || decision.cost == 0 || decision.is_unchecked() {
            return None;
        }
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        if decision.slot & FALLBACK_SLOT != 0 {
            // Decided by the fallback limiter: undone there.
            if let Some(limiter) = &self.fallback {
                let mut local = *decision;
                local.slot &= !FALLBACK_SLOT;
                limiter.undo(&user, &local);
            }
            return None;
        }
        if let Some(cache) = &self.deny_cache {
            cache.remove(&user);
        }
        let back = Counted {
            slot: decision.slot,
            incarnation: decision.incarnation,
            units: decision.cost,
        };
        // Back into this instance's grant while it is in force.
        if let Some(table) = &self.leases {
            if table.give_back(&user, back) {
                self.counters
                    .lease_units_undone
                    .fetch_add(u64::from(back.units), Relaxed);
                return None;
            }
        }
        Some((user, back))
    }

    /// Give units back (at `now_us` or Redis' time).
    async fn run_undo(&self, user: Vec<u8>, back: Counted, now_us: Option<u64>) {
        bump(&self.counters.undos);
        let sent = Instant::now();
        match self.call(&user, 0, now_us, None, Some(back)).await {
            Ok(_) => self.redis_answered(None),
            Err(failure) => {
                self.note_failure(failure, None, sent);
            }
        }
        // A check sent before the undo reached Redis may have been denied and
        // cached meanwhile: the units are back now, so forget it again.
        if let Some(cache) = &self.deny_cache {
            cache.remove(&user);
        }
    }
}

/// A request for a key's grant in flight: dropped before its reply was
/// merged (the request went away, or it failed), it lets the next check of
/// the key ask again.
struct Fetch<'a> {
    table: Option<&'a LeaseTable>,
    user: &'a [u8],
    hash: u64,
}

impl<'a> Fetch<'a> {
    fn new(table: &'a LeaseTable, user: &'a [u8], hash: u64) -> Fetch<'a> {
        Fetch {
            table: Some(table),
            user,
            hash,
        }
    }

    /// The reply is about to be merged (which ends the fetch).
    fn done(mut self) {
        self.table = None;
    }
}

impl Drop for Fetch<'_> {
    fn drop(&mut self) {
        if let Some(table) = self.table {
            table.fetch_abandoned(self.user, self.hash);
        }
    }
}

impl<K: RedisKey + Send + Sync + 'static> Store<K> for RedisStore {
    type Future = RedisFuture;

    fn check_n(&self, key: &K, cost: u32) -> RedisFuture {
        let inner = &self.inner;
        bump(&inner.counters.decisions);
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        if let Some(d) = inner.local_answer(&user, cost) {
            return RedisFuture::ready(Ok(d));
        }
        let ask = match inner.leased(&user, cost) {
            Ok(d) => return RedisFuture::ready(Ok(d)),
            Err(ask) => ask,
        };
        let probe = match inner.breaker.as_deref().map(|b| (b, b.admit(true))) {
            None | Some((_, Admit::Ask)) => false,
            Some((_, Admit::Probe)) => {
                inner.breaker_changed();
                true
            }
            Some((breaker, Admit::Refuse { remaining })) => {
                inner.lease_not_asked(&user, ask);
                return RedisFuture::ready(inner.breaker_answer(&user, cost, breaker, remaining));
            }
        };
        RedisFuture {
            state: State::Remote(Box::pin(inner.clone().decide(user, cost, probe, ask))),
        }
    }

    /// Answers without Redis when it can: a cost above the limit, a key the
    /// deny cache knows is over its limit, units of a lease, or any key while
    /// the circuit breaker is open (per the failure policy). `None` otherwise
    /// (nothing counted).
    fn check_now(&self, key: &K, cost: u32) -> Option<Result<Decision, StoreError>> {
        let inner = &self.inner;
        let mut user = Vec::new();
        key.write_redis_key(&mut user);
        let answer = match inner.local_answer(&user, cost) {
            Some(d) => Ok(d),
            None => match inner.leased_now(&user, cost) {
                Some(d) => Ok(d),
                None => match inner.breaker.as_deref().map(|b| (b, b.admit(false))) {
                    Some((breaker, Admit::Refuse { remaining })) => {
                        inner.breaker_answer(&user, cost, breaker, remaining)
                    }
                    _ => return None,
                },
            },
        };
        bump(&inner.counters.decisions);
        Some(answer)
    }

    /// Give the units back: into this instance's grant while it is in force,
    /// into the fallback limiter for its decisions, else in Redis, in a
    /// background task (fire and forget), dropping the key from the local deny
    /// cache. While the circuit breaker is not closed the units stay counted
    /// in Redis (the safe side).
    fn undo(&self, key: &K, decision: &Decision) {
        let Some((user, back)) = self.inner.undo_target(key, decision) else {
            return;
        };
        if !self.inner.redis_in_use() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            bump(&self.inner.counters.failures);
            return;
        };
        let inner = self.inner.clone();
        runtime.spawn(async move { inner.run_undo(user, back, None).await });
    }

    fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// See [`RedisStore::reconfigured`].
    fn reconfigured(&self, policy: Policy) -> Result<Self, ConfigError> {
        RedisStore::reconfigured(self, policy)
    }
}
type RemoteDecision = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

/// A [`RedisStore`] decision in flight: ready at once when answered locally (a
/// cost above the limit, a deny-cache hit), otherwise one round trip to Redis.
#[must_use = "futures do nothing unless polled"]
pub struct RedisFuture {
    state: State,
}

enum State {
    Ready(Option<Result<Decision, StoreError>>),
    Remote(RemoteDecision),
}

impl RedisFuture {
    fn ready(result: Result<Decision, StoreError>) -> RedisFuture {
        RedisFuture {
            state: State::Ready(Some(result)),
        }
    }
}

impl Future for RedisFuture {
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            State::Ready(result) => Poll::Ready(result.take().unwrap_or_else(|| {
                Err(StoreError::new(StoreErrorKind::Other, Duration::ZERO)
                    .with_source("decision polled after completion"))
            })),
            State::Remote(future) => future.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for RedisFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Ready(_) => "ready",
            State::Remote(_) => "remote",
        };
        f.debug_struct("RedisFuture")
            .field("state", &state)
            .finish()
    }
}

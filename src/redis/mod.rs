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
mod builder;
mod connection;
mod deny_cache;
mod events;
mod key;
mod lease;
mod leasing;
mod metrics;
mod script;
mod store;
pub use breaker::{BreakerState, CircuitBreaker};
pub use builder::RedisStoreBuilder;
pub use key::RedisKey;
pub use lease::Leases;
pub use store::RedisFuture;

/// The `redis` crate this store is built on, for
/// [`RedisStoreBuilder::client`] and [`RedisStoreBuilder::connection`].
pub use ::redis;

use crate::decision::{Decision, Outcome};
use crate::error::ConfigError;
use crate::policy::{Policy, Precision};
use crate::stats::bump;
use crate::store::Limiter;
use crate::store::{Store, StoreError, StoreErrorKind};
use ::redis::aio::ConnectionManagerConfig;
use ::redis::{Client, FromRedisValue, RedisError, Script, ScriptInvocation};
use breaker::{Admit, Breaker, Probe};
use builder::{new_deny_cache, Geometry};
pub use connection::AsyncConnection;
use connection::{Connection, Failure};
use deny_cache::DenyCache;
use events::Events;
pub(crate) use lease::Counted;
use lease::{Ask, LeaseTable, Leased, Reply, Tick};
use leasing::Fetch;
use script::{Answer, LeaseArgs, CHECK_SCRIPT};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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

/// Bit 63 of a decision's slot: decided by the fallback limiter (its slots,
/// from the local clock, stay far below it; Redis' below 2^52).
const FALLBACK_SLOT: u64 = 1 << 63;
/// Bit 62 of a decision's slot: a charge, counted in the background at a
/// slot Redis chose; it is not taken back.
const CHARGED_SLOT: u64 = 1 << 62;

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
    events: Events,
    breaker: Option<Arc<Breaker>>,
    /// This store's leases (`None`: off); each store has its own.
    leases: Option<LeaseTable>,
    lease_settings: Option<Leases>,
    /// The limiter of [`FailurePolicy::Fallback`], shared with the stores
    /// reconfigured from this one.
    fallback: Option<Arc<Limiter<Vec<u8>>>>,
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
        RedisStoreBuilder::new(policy, failure)
    }

    /// Counters since the store was built.
    pub fn stats(&self) -> RedisStoreStats {
        let breaker = self.inner.breaker.as_deref();
        let counts = breaker.map_or([0; 3], |b| {
            [&b.opens, &b.probes, &b.answered].map(|c| c.load(Relaxed))
        });
        let deny_cache_len = self.inner.deny_cache.as_ref().map_or(0, DenyCache::len);
        self.inner
            .events
            .stats(self.breaker_state(), counts, deny_cache_len)
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
        let opens = old.breaker.as_ref().map_or(0, |b| b.opens.load(Relaxed));
        let same_name = policy.name() == old.policy.name();
        let events = old.events.reconfigured(same_name, policy.name(), opens);
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
            events,
            breaker: old.breaker.clone(),
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

//! The Redis store against a real Redis (`REDIS_URL`, default 127.0.0.1:6379):
//! the fleet-wide limit, costs, expiry, key names, the deny cache, and the same
//! decisions as the in-memory ring. Skips visibly where no Redis answers, unless
//! `REQUIRE_REDIS=1`.
#![cfg(feature = "redis")]

mod redis_support;

use redis_support::*;
use std::time::Duration;
use tower_sliding_window::redis::{self, AsyncCommands};
use tower_sliding_window::{
    ConfigError, FailurePolicy, Limiter, ManualClock, Outcome, Policy, Precision, RedisStore, Store,
};

fn policy(limit: u32, window: Duration, buckets: u32) -> Policy {
    Policy::builder()
        .limit(limit)
        .window(window)
        .buckets(buckets)
        .build()
        .unwrap()
}

/// A store on its own connection to the shared Redis.
fn store(policy: Policy, prefix: &str) -> RedisStore {
    RedisStore::builder(policy, FailurePolicy::Closed)
        .url(&redis_url())
        // Generous: these tests check semantics, not latency, on a shared machine.
        .timeout(Duration::from_secs(2))
        .prefix(prefix)
        .build()
        .unwrap()
}

/// `p` in memory, on a manual clock.
fn in_memory(p: Policy) -> (Limiter<u64, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(p).clock(clock.clone()).build().unwrap();
    (limiter, clock)
}

/// `p` on both sides of a decision-by-decision comparison: in memory on a
/// manual clock, and in Redis with no deny cache (it would answer locally).
fn compared_sides(p: Policy, test: &str) -> (Limiter<u64, ManualClock>, ManualClock, RedisStore) {
    let (limiter, clock) = in_memory(p.clone());
    let redis = RedisStore::builder(p, FailurePolicy::Closed)
        .url(&redis_url())
        .timeout(Duration::from_secs(2))
        .prefix(unique_prefix(test))
        .deny_cache(0)
        .build()
        .expect("the Redis store accepts every policy the builder does");
    (limiter, clock, redis)
}

#[tokio::test]
async fn two_stores_on_separate_connections_admit_exactly_the_limit_together() {
    let test = "two_stores_on_separate_connections_admit_exactly_the_limit_together";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let prefix = unique_prefix(test);
    let p = policy(20, Duration::from_secs(10), 10);
    let (a, b) = (store(p.clone(), &prefix), store(p, &prefix));
    // 60 concurrent checks, alternating between the instances.
    let checks = (0..60).map(|i| {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(async move { s.check_n(&"shared", 1).await.unwrap() })
    });
    let mut allowed = 0;
    for check in checks {
        allowed += check.await.unwrap().is_allowed() as u32;
    }
    assert_eq!(allowed, 20);
    // Both instances keep denying, the deny cache included.
    assert!(!a.check_n(&"shared", 1).await.unwrap().is_allowed());
    assert!(!b.check_n(&"shared", 1).await.unwrap().is_allowed());
    // Another key is independent.
    assert!(a.check_n(&"other", 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn costs_count_as_units_and_oversized_costs_skip_redis() {
    let test = "costs_count_as_units_and_oversized_costs_skip_redis";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let s = store(
        policy(10, Duration::from_secs(10), 10),
        &unique_prefix(test),
    );
    let d = s.check_n(&"k", 7).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!((d.remaining(), d.cost()), (3, 7));
    let d = s.check_n(&"k", 4).await.unwrap();
    assert_eq!(d.outcome(), Outcome::Denied);
    assert_eq!(d.remaining(), 3);
    // A smaller cost is not answered by the deny cache: it still fits.
    let d = s.check_n(&"k", 3).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);

    let trips = s.stats().round_trips;
    let d = s.check_n(&"k", 11).await.unwrap();
    assert_eq!(d.outcome(), Outcome::CostExceedsLimit);
    assert_eq!(d.retry_after(), None);
    assert_eq!(
        s.stats().round_trips,
        trips,
        "no round trip for a cost above the limit"
    );
}

#[tokio::test]
async fn denials_report_the_exact_time_until_the_units_expire() {
    let test = "denials_report_the_exact_time_until_the_units_expire";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let window = Duration::from_secs(10);
    let s = store(policy(2, window, 10), &unique_prefix(test));
    let first = s.check_n(&"k", 2).await.unwrap();
    assert!(first.is_allowed());
    let d = s.check_n(&"k", 1).await.unwrap();
    assert_eq!(d.outcome(), Outcome::Denied);
    // Both units sit in one slot: the cost fits exactly when that slot leaves the
    // span of N + 1 buckets, which is also when the window drains.
    let retry = d.retry_after().unwrap();
    assert_eq!(retry, d.reset());
    let bucket = Duration::from_secs(1);
    assert!(
        retry > window - bucket && retry <= window + bucket,
        "{retry:?}"
    );
    assert!(first.reset() >= retry);
}

#[tokio::test]
async fn idle_keys_expire_by_themselves() {
    let test = "idle_keys_expire_by_themselves";
    let Some(mut conn) = shared_redis(test).await else {
        return;
    };
    // 200 ms window in 4 buckets of 50 ms: a key is idle 250 ms after its last unit.
    let s = store(
        policy(5, Duration::from_millis(200), 4),
        &unique_prefix(test),
    );
    assert!(s.check_n(&"k", 1).await.unwrap().is_allowed());
    let key = s.redis_key(&"k");
    let pttl: i64 = conn.pttl(&key).await.unwrap();
    assert!(pttl > 0 && pttl <= 250, "PTTL {pttl} ms");
    // Bounded wait for Redis to drop it (it expires after at most 250 ms).
    let mut exists = true;
    for _ in 0..100 {
        exists = conn.exists(&key).await.unwrap();
        if !exists {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!exists, "idle key still present");
}

#[tokio::test]
async fn expiry_moves_with_the_newest_slot() {
    let test = "expiry_moves_with_the_newest_slot";
    let Some(mut conn) = shared_redis(test).await else {
        return;
    };
    let s = store(
        policy(100, Duration::from_millis(200), 4),
        &unique_prefix(test),
    );
    let key = s.redis_key(&"k");
    let expires_at = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let key = key.clone();
        async move {
            redis::cmd("PEXPIRETIME")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await
                .unwrap()
        }
    };
    assert!(s.check_n(&"k", 1).await.unwrap().is_allowed());
    let first = expires_at(&mut conn).await;
    assert!(first > 0, "the key has an expiry");
    // More units never shorten it.
    assert!(s.check_n(&"k", 1).await.unwrap().is_allowed());
    assert!(expires_at(&mut conn).await >= first);
    // Units in a later slot (50 ms buckets) keep the key until they expire too.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(s.check_n(&"k", 1).await.unwrap().is_allowed());
    let later = expires_at(&mut conn).await;
    assert!(later >= first + 49, "{later} vs {first}");
}

#[tokio::test]
async fn stale_buckets_are_deleted_from_a_busy_key() {
    let test = "stale_buckets_are_deleted_from_a_busy_key";
    let Some(mut conn) = shared_redis(test).await else {
        return;
    };
    let s = store(
        policy(1000, Duration::from_millis(40), 4),
        &unique_prefix(test),
    );
    let key = s.redis_key(&"k");
    // Keep the key busy across many 10 ms slots; its hash never holds more than
    // the newest-slot field plus the N + 1 slots of one span.
    for _ in 0..30 {
        assert!(s.check_n(&"k", 1).await.unwrap().is_allowed());
        let fields: usize = conn.hlen(&key).await.unwrap();
        assert!(fields <= 1 + 5, "{fields} fields");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

#[tokio::test]
async fn keys_are_the_prefix_and_a_hash_tag_around_the_key() {
    let test = "keys_are_the_prefix_and_a_hash_tag_around_the_key";
    let Some(mut conn) = shared_redis(test).await else {
        return;
    };
    let prefix = unique_prefix(test);
    let s = store(policy(5, Duration::from_secs(10), 10), &prefix);
    let ip: std::net::IpAddr = "2001:db8::1".parse().unwrap();
    assert!(s.check_n(&ip, 1).await.unwrap().is_allowed());
    assert!(s.check_n(&(), 1).await.unwrap().is_allowed());
    let ip_key = format!("{prefix}{{2001:db8::1}}");
    assert_eq!(s.redis_key(&ip), ip_key.as_bytes());
    assert_eq!(s.redis_key(&()), format!("{prefix}{{}}").as_bytes());
    // The data really lives under those names, one key each.
    let found: Vec<String> = conn.keys(format!("{prefix}*")).await.unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.contains(&ip_key));
    // Cluster hashes only the part between the first '{' and the next '}':
    // the prefix holds no brace, so that part is exactly the user's key.
    assert_eq!(hash_tag(ip_key.as_bytes()), b"2001:db8::1");

    // A prefix with a brace would move the hash tag: rejected at build.
    let err = RedisStore::builder(policy(5, Duration::from_secs(1), 10), FailurePolicy::Open)
        .url(&redis_url())
        .prefix("rl:{tenant}:")
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::InvalidRedisPrefix { .. }),
        "{err:?}"
    );
}

/// The bytes Redis Cluster hashes for `key` (its hash tag, if any).
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[tokio::test]
async fn deny_cache_answers_an_over_limit_key_without_a_round_trip() {
    let test = "deny_cache_answers_an_over_limit_key_without_a_round_trip";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let s = store(policy(3, Duration::from_secs(10), 10), &unique_prefix(test));
    for _ in 0..3 {
        assert!(s.check_n(&"abuser", 1).await.unwrap().is_allowed());
    }
    let first_denial = s.check_n(&"abuser", 1).await.unwrap();
    assert_eq!(first_denial.outcome(), Outcome::Denied);
    let before = s.stats();
    for _ in 0..50 {
        let d = s.check_n(&"abuser", 1).await.unwrap();
        assert_eq!(d.outcome(), Outcome::Denied);
        let retry = d.retry_after().unwrap();
        assert!(retry > Duration::ZERO && retry <= first_denial.retry_after().unwrap());
    }
    let after = s.stats();
    assert_eq!(after.round_trips, before.round_trips);
    assert_eq!(after.deny_cache_hits, before.deny_cache_hits + 50);
    assert_eq!(after.decisions, before.decisions + 50);
    assert_eq!(after.deny_cache_len, 1);
    // Other keys still go to Redis.
    assert!(s.check_n(&"someone-else", 1).await.unwrap().is_allowed());
    assert_eq!(s.stats().round_trips, after.round_trips + 1);
}

#[tokio::test]
async fn undo_gives_units_back_and_clears_the_deny_cache() {
    let test = "undo_gives_units_back_and_clears_the_deny_cache";
    let Some(mut conn) = shared_redis(test).await else {
        return;
    };
    let s = store(policy(2, Duration::from_secs(10), 10), &unique_prefix(test));
    let first = s.check_n(&"k", 2).await.unwrap();
    assert!(first.is_allowed());
    assert!(!s.check_n(&"k", 1).await.unwrap().is_allowed());
    s.undo_now(&"k", &first).await;
    let d = s.check_n(&"k", 2).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    // Undoing a denial or twice is harmless: the count never goes below zero.
    let denied = s.check_n(&"k", 1).await.unwrap();
    s.undo_now(&"k", &denied).await;
    s.undo_now(&"k", &d).await;
    s.undo_now(&"k", &d).await;
    assert_eq!(s.check_n(&"k", 2).await.unwrap().remaining(), 0);
    // The fire-and-forget path (Store::undo) reaches Redis too: on a key of its
    // own, so the slot it gives back to holds the units being undone.
    let fresh = s.check_n(&"fresh", 1).await.unwrap();
    assert!(fresh.is_allowed());
    let (key, field) = (s.redis_key(&"fresh"), fresh.recorded_slot().to_string());
    let counted: Option<String> = conn.hget(&key, &field).await.unwrap();
    assert_eq!(counted.as_deref(), Some("1"));
    let before = s.stats().undos;
    Store::undo(&s, &"fresh", &fresh);
    // Bounded wait until Redis has applied it (the script deletes the emptied field).
    let mut applied = false;
    for _ in 0..400 {
        let v: Option<String> = conn.hget(&key, &field).await.unwrap();
        if v.is_none() {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(applied, "the fire-and-forget undo never reached Redis");
    assert_eq!(s.stats().undos, before + 1);
}

/// Run `trace` through the in-memory limiter (manual clock) and through Redis at
/// the same injected times: the script must decide exactly as the ring does.
/// What a comparison trace exercises. The two are kept apart because the
/// in-memory limiter, after evicting an idle key, starts its new ring no earlier
/// than the newest time any sweep saw (its keys share one clock), while Redis
/// holds each key at its own newest slot only while the key exists.
#[derive(Clone, Copy, PartialEq)]
enum Trace {
    /// Three keys, gaps of over a window (idle keys, stale buckets), time only forwards.
    KeysAndGaps,
    /// One busy key (never idle) whose clock now and then steps back.
    ClockSteppingBack,
}

async fn compare_with_the_ring(test: &str, precision: Precision, trace: Trace) {
    let Some(_) = shared_redis(test).await else {
        return;
    };
    // 10 buckets of 3 s (whole microseconds, so both sides cut the same slots).
    // The trace runs on injected time, but Redis expires keys on its own clock:
    // a window far longer than the test takes keeps every key alive meanwhile.
    let p = Policy::builder()
        .limit(12)
        .window(Duration::from_secs(30))
        .buckets(10)
        .precision(precision)
        .build()
        .unwrap();
    let (limiter, clock, redis) = compared_sides(p, test);

    let mut rng = Rng::new(0x5eed);
    // Start well away from zero, like Redis' TIME.
    let mut now = Duration::from_secs(1_000);
    let mut allowed = 0;
    for step in 0..1500 {
        match (rng.below(20), trace) {
            (0..=9, _) => {}
            (10..=16, _) => now += Duration::from_micros(rng.below(1_500_000)),
            (17 | 18, _) => now += Duration::from_micros(rng.below(12_000_000)),
            (_, Trace::KeysAndGaps) => now += Duration::from_secs(40),
            (_, Trace::ClockSteppingBack) => now -= Duration::from_micros(rng.below(5_000_000)),
        }
        clock.set(now.as_nanos() as u64);
        let key = match trace {
            Trace::KeysAndGaps => rng.below(3),
            Trace::ClockSteppingBack => 0,
        };
        let cost = 1 + rng.below(5) as u32;
        let mem = limiter.check_n(&key, cost);
        let red = redis.check_at(&key, cost, now).await.unwrap();
        let ctx = format!("step {step} at {now:?}, key {key}, cost {cost}");
        assert_eq!(red.outcome(), mem.outcome(), "{ctx}");
        assert_eq!(red.remaining(), mem.remaining(), "{ctx}");
        assert_eq!(red.reset(), mem.reset(), "{ctx}");
        assert_eq!(red.recorded_slot(), mem.recorded_slot(), "{ctx}");
        let (r, m) = (red.retry_after().unwrap(), mem.retry_after().unwrap());
        match precision {
            Precision::Strict => assert_eq!(r, m, "{ctx}"),
            // The interpolated wait is a fraction of a bucket: µs vs ns rounding.
            _ => assert!(
                r.max(m) - r.min(m) <= Duration::from_micros(1),
                "{ctx}: {r:?} vs {m:?}"
            ),
        }
        // Give some admissions back on both sides.
        if mem.is_allowed() && rng.below(10) == 0 {
            limiter.undo(&key, &mem);
            redis.undo_now(&key, &red).await;
        }
        allowed += mem.is_allowed() as u32;
    }
    assert!(
        allowed > 100 && allowed < 1400,
        "a trace that saturates: {allowed}"
    );
}

#[tokio::test]
async fn script_decides_exactly_as_the_ring_in_strict_mode() {
    compare_with_the_ring(
        "script_decides_exactly_as_the_ring_in_strict_mode",
        Precision::Strict,
        Trace::KeysAndGaps,
    )
    .await;
}

#[tokio::test]
async fn script_holds_a_clock_stepping_back_at_the_newest_slot_as_the_ring_does() {
    compare_with_the_ring(
        "script_holds_a_clock_stepping_back_at_the_newest_slot_as_the_ring_does",
        Precision::Strict,
        Trace::ClockSteppingBack,
    )
    .await;
}

#[tokio::test]
async fn script_decides_as_the_ring_in_interpolated_mode() {
    compare_with_the_ring(
        "script_decides_as_the_ring_in_interpolated_mode",
        Precision::Interpolated,
        Trace::KeysAndGaps,
    )
    .await;
}

#[tokio::test]
async fn same_trace_never_admits_more_than_the_limit_per_window_in_memory_or_in_redis() {
    let test = "same_trace_never_admits_more_than_the_limit_per_window_in_memory_or_in_redis";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let (limit, buckets) = (8, 4);
    let p = policy(limit, Duration::from_millis(200), buckets);
    let trace = bursty_trace(7, 400, 2, 3, p.bucket_width());

    // In memory, on a manual clock.
    let (limiter, clock) = in_memory(p.clone());
    let mut mem: Vec<Vec<Admitted>> = vec![Vec::new(); 2];
    for step in &trace {
        clock.advance(step.gap);
        let d = Store::check_n(&limiter, &step.key, step.cost)
            .await
            .unwrap();
        if d.is_allowed() {
            mem[step.key as usize].push(Admitted {
                slot: d.recorded_slot(),
                cost: d.cost(),
            });
        }
    }

    // In Redis, on Redis' clock, through two instances (the deny cache on).
    let prefix = unique_prefix(test);
    let stores = [store(p.clone(), &prefix), store(p, &prefix)];
    let mut red: Vec<Vec<Admitted>> = vec![Vec::new(); 2];
    for (i, step) in trace.iter().enumerate() {
        if !step.gap.is_zero() {
            tokio::time::sleep(step.gap).await;
        }
        let d = stores[i % 2].check_n(&step.key, step.cost).await.unwrap();
        if d.is_allowed() {
            red[step.key as usize].push(Admitted {
                slot: d.recorded_slot(),
                cost: d.cost(),
            });
        }
    }

    for key in 0..2 {
        assert_no_span_over_limit(&mem[key], buckets, limit, "in memory");
        assert_no_span_over_limit(&red[key], buckets, limit, "in Redis");
        assert!(!mem[key].is_empty() && !red[key].is_empty());
    }
}

#[tokio::test]
async fn a_connection_of_your_own_works_like_the_managed_one() {
    let test = "a_connection_of_your_own_works_like_the_managed_one";
    let Some(conn) = shared_redis(test).await else {
        return;
    };
    let prefix = unique_prefix(test);
    let p = policy(3, Duration::from_secs(10), 10);
    // A bare multiplexed connection (a cluster connection plugs in the same way).
    let own = RedisStore::builder(p.clone(), FailurePolicy::Closed)
        .connection(conn.clone())
        .timeout(Duration::from_secs(2))
        .prefix(&prefix)
        .build()
        .unwrap();
    let managed = store(p.clone(), &prefix);
    for s in [&own, &managed, &own] {
        assert!(s.check_n(&"k", 1).await.unwrap().is_allowed());
    }
    assert!(!own.check_n(&"k", 1).await.unwrap().is_allowed());
    assert!(!managed.check_n(&"k", 1).await.unwrap().is_allowed());
    // One or the other, not both.
    let err = RedisStore::builder(p, FailurePolicy::Closed)
        .url(&redis_url())
        .connection(conn)
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::RedisConnectionConflict));
}

#[tokio::test]
async fn invalid_settings_are_rejected_at_build() {
    let p = || policy(5, Duration::from_secs(1), 10);
    let build = |b: tower_sliding_window::RedisStoreBuilder| b.build().unwrap_err();
    let open = || RedisStore::builder(p(), FailurePolicy::Open);
    assert!(matches!(build(open()), ConfigError::NoRedis), "no URL");
    let bad_url = build(open().url("nope://"));
    assert!(matches!(bad_url, ConfigError::InvalidRedisUrl { .. }));
    // The redis crate's reason is kept as the source.
    assert!(std::error::Error::source(&bad_url).is_some(), "{bad_url:?}");
    assert!(matches!(
        build(open().url(&redis_url()).timeout(Duration::ZERO)),
        ConfigError::ZeroTimeout
    ));
    let tiny = RedisStore::builder(
        policy(5, Duration::from_nanos(5_000), 10),
        FailurePolicy::Open,
    );
    assert!(matches!(
        build(tiny.url(&redis_url())),
        ConfigError::BucketBelowClockResolution { .. }
    ));
    // A policy name with a brace would break the default prefix's hash tag.
    let named = Policy::builder()
        .limit(5)
        .window(Duration::from_secs(1))
        .name("a{b}")
        .build()
        .unwrap();
    let err = build(RedisStore::builder(named, FailurePolicy::Open).url(&redis_url()));
    assert!(matches!(err, ConfigError::InvalidRedisPrefix { .. }));
}

#[test]
fn building_outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let err = RedisStore::builder(policy(5, Duration::from_secs(1), 10), FailurePolicy::Open)
        .url(&redis_url())
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::NoRuntime));
}

#[allow(dead_code)]
fn assert_store_bounds() {
    fn is_store<S: Store<String> + Store<std::net::IpAddr> + Store<()> + Clone>() {}
    is_store::<RedisStore>();
    let _ = redis::Client::open("redis://127.0.0.1");
}

#[tokio::test]
async fn check_now_answers_only_what_needs_no_round_trip() {
    let test = "check_now_answers_only_what_needs_no_round_trip";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let s = store(policy(2, Duration::from_secs(10), 10), &unique_prefix(test));
    let key = "k".to_owned();
    // A fresh key needs Redis: nothing is decided or counted here.
    assert!(s.check_now(&key, 1).is_none());
    assert_eq!(
        s.check_now(&key, 3).unwrap().unwrap().outcome(),
        Outcome::CostExceedsLimit
    );
    assert!(s.check_n(&key, 2).await.unwrap().is_allowed());
    assert!(s.check_now(&key, 1).is_none(), "not known to be over yet");
    assert!(!s.check_n(&key, 1).await.unwrap().is_allowed());
    let cached = s.check_now(&key, 1).unwrap().unwrap();
    assert_eq!(cached.outcome(), Outcome::Denied);
    assert_eq!(s.stats().round_trips, 2);
}

/// An axum-style service behind the layer with a Redis store, keyed by `x-user`.
fn limited_service(
    store: RedisStore,
) -> impl tower::Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    use tower_sliding_window::SlidingWindowLayer;
    let by_user = |req: &http::Request<String>| {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let layer = SlidingWindowLayer::builder(by_user)
        .store(store)
        .build()
        .unwrap();
    tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_req: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new("ok".to_owned()))
        })
}

#[tokio::test]
async fn the_layer_enforces_a_redis_store_shared_by_two_instances() {
    use tower::ServiceExt;
    let test = "the_layer_enforces_a_redis_store_shared_by_two_instances";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let prefix = unique_prefix(test);
    let p = policy(3, Duration::from_secs(10), 10);
    let instances = [
        limited_service(store(p.clone(), &prefix)),
        limited_service(store(p, &prefix)),
    ];
    let request = || {
        http::Request::builder()
            .header("x-user", "ada")
            .body(String::new())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for i in 0..6 {
        let response = instances[i % 2].clone().oneshot(request()).await.unwrap();
        if response.status() == http::StatusCode::TOO_MANY_REQUESTS {
            let retry: u64 = response.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((10..=11).contains(&retry), "Retry-After {retry}");
        }
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
}

#[tokio::test]
async fn a_prefix_kept_across_a_change_of_bucket_width_starts_keys_afresh() {
    let test = "a_prefix_kept_across_a_change_of_bucket_width_starts_keys_afresh";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let prefix = unique_prefix(test);
    // The old deploy: 100 ms buckets. Its slot numbers are 100 times those of
    // the new deploy's 10 s buckets, under the same key.
    let old = store(policy(5, Duration::from_secs(1), 10), &prefix);
    assert!(old.check_n(&"alice", 1).await.unwrap().is_allowed());
    let new = store(policy(5, Duration::from_secs(100), 10), &prefix);
    let first = new.check_n(&"alice", 1).await.unwrap();
    assert!(first.is_allowed(), "held years ahead: {first:?}");
    for _ in 0..4 {
        assert!(new.check_n(&"alice", 1).await.unwrap().is_allowed());
    }
    let denied = new.check_n(&"alice", 1).await.unwrap();
    assert_eq!(denied.outcome(), Outcome::Denied);
    assert!(
        denied.retry_after().unwrap() <= Duration::from_secs(110),
        "{denied:?}"
    );
}

#[tokio::test]
async fn a_fire_and_forget_undo_leaves_no_denial_in_the_deny_cache() {
    let test = "a_fire_and_forget_undo_leaves_no_denial_in_the_deny_cache";
    let Some(mut conn) = shared_redis(test).await else {
        return;
    };
    let s = store(policy(2, Duration::from_secs(10), 10), &unique_prefix(test));
    let key = s.redis_key(&"k");
    let first = s.check_n(&"k", 2).await.unwrap();
    assert!(first.is_allowed());
    let field = first.recorded_slot().to_string();
    // The layer gives the units back (another policy denied the request, as
    // `Store::undo` does: fire and forget) and the client retries at once: this
    // check may reach Redis before the undo does, and be denied then.
    Store::undo(&s, &"k", &first);
    let raced = s.check_n(&"k", 1).await.unwrap();
    // Bounded wait until Redis has applied the undo (the slot no longer holds 2).
    let mut applied = false;
    for _ in 0..400 {
        let v: Option<String> = conn.hget(&key, &field).await.unwrap();
        if v.as_deref() != Some("2") {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(applied, "the undo reached Redis");
    // The units are back in Redis: at most one unit (`raced`) is counted, so
    // one more fits. This instance's own undo must not leave it denied locally.
    let after = s.check_n(&"k", 1).await.unwrap();
    assert!(
        after.is_allowed(),
        "denied by the deny cache after this instance's own undo: raced {raced:?}, after {after:?}, stats {:?}",
        s.stats()
    );
}

#[tokio::test]
async fn interpolated_script_stays_exact_for_every_policy_the_builder_accepts() {
    let test = "interpolated_script_stays_exact_for_every_policy_the_builder_accepts";
    let Some(mut conn) = shared_redis(test).await else {
        return;
    };
    // (limit + 1) × bucket width in µs is just below 2^53, which the builder
    // accepts; but a check forms (used + cost) × width, and in interpolated mode
    // `used` may exceed `limit` (the oldest bucket is only partly counted).
    let (limit, cost, width_us, elapsed_us) = (1u32 << 20, 123u32, 8_589_926_067u64, 1_007_615u64);
    let p = Policy::builder()
        .limit(limit)
        .window(Duration::from_micros(width_us))
        .buckets(1)
        .precision(Precision::Interpolated)
        .build()
        .unwrap();
    let (limiter, clock, redis) = compared_sides(p, test);
    // The whole limit in one slot, then `cost` units early in the next slot:
    // exactly, (limit + cost) × w − limit × elapsed = limit × w + 1 µs·unit, over.
    let slot = 2u64;
    for (at, cost) in [
        (slot * width_us + 1, limit),
        ((slot + 1) * width_us + elapsed_us, cost),
    ] {
        let now = Duration::from_micros(at);
        clock.set(now.as_nanos() as u64);
        let mem = limiter.check_n(&0, cost);
        let red = redis.check_at(&0u64, cost, now).await.unwrap();
        assert_eq!(
            red.outcome(),
            mem.outcome(),
            "cost {cost} at {now:?}: {red:?} vs {mem:?}"
        );
    }
    let _: () = conn.del(redis.redis_key(&0u64)).await.unwrap();
}

/// The default prefix keeps policies of other geometries apart, also when their
/// windows differ by less than a microsecond but their buckets (rounded up to
/// whole µs) do not: 1 s buckets and 1.000001 s buckets under one key would
/// each find the other's slots "more than a window ahead" and wipe them.
#[tokio::test]
async fn default_prefixes_of_other_bucket_widths_never_share_a_key() {
    let test = "default_prefixes_of_other_bucket_widths_never_share_a_key";
    let Some(_) = shared_redis(test).await else {
        return;
    };
    let build = |window: Duration| {
        RedisStore::builder(policy(2, window, 15), FailurePolicy::Closed)
            .url(&redis_url())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    // 15 buckets of 1 000 000 µs, and of 1 000 001 µs (1 000 000 067 ns rounded up).
    let a = build(Duration::from_secs(15));
    let b = build(Duration::from_nanos(15_000_000_999));
    // A key no other test uses (the default prefix is shared by every run).
    let key = unique_prefix(test);
    assert!(a.check_n(&key, 2).await.unwrap().is_allowed());
    assert!(b.check_n(&key, 1).await.unwrap().is_allowed());
    let d = a.check_n(&key, 1).await.unwrap();
    assert!(
        !d.is_allowed(),
        "a third unit within a's 15 s window of limit 2 ({:?} and {:?}): {d:?}",
        String::from_utf8_lossy(&a.redis_key(&key)),
        String::from_utf8_lossy(&b.redis_key(&key)),
    );
}

/// Distinct keys of one type write distinct bytes (`RedisKey`'s contract):
/// `SocketAddr`s that differ only in their IPv6 flow label are distinct keys
/// in memory, so they must not share one count in Redis.
#[test]
fn socket_addresses_that_differ_in_flow_info_write_distinct_keys() {
    use std::net::{SocketAddr, SocketAddrV6};
    use tower_sliding_window::RedisKey;
    let bytes = |k: &SocketAddr| {
        let mut out = Vec::new();
        k.write_redis_key(&mut out);
        out
    };
    let ip = "2001:db8::1".parse().unwrap();
    let plain = SocketAddr::V6(SocketAddrV6::new(ip, 443, 0, 0));
    let labelled = SocketAddr::V6(SocketAddrV6::new(ip, 443, 7, 0));
    assert_ne!(plain, labelled);
    assert_ne!(bytes(&plain), bytes(&labelled));
    // The common case keeps its Display form.
    assert_eq!(bytes(&plain), b"[2001:db8::1]:443");
}

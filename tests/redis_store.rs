//! The Redis store against a real Redis (`REDIS_URL`, default 127.0.0.1:6379):
//! the fleet-wide limit, costs, expiry, key names, the deny cache, and the same
//! decisions as the in-memory ring. The tests that need Redis are `#[ignore]`d:
//! run them with `-- --include-ignored` where one answers.
#![cfg(feature = "redis")]

mod redis_support;

use redis::AsyncCommands;
use redis_support::*;
use std::time::Duration;
use tower_sliding_window::{ConfigError, FailurePolicy, Outcome, Policy, RedisStore, Store};

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

/// With `REQUIRE_REDIS=1` (CI) the ignored Redis tests below must be run.
#[test]
fn redis_tests_are_included_where_redis_is_required() {
    assert_included_where_required();
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn two_stores_on_separate_connections_admit_exactly_the_limit_together() {
    let test = "two_stores_on_separate_connections_admit_exactly_the_limit_together";
    shared_redis(test).await;
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn costs_count_as_units_and_oversized_costs_skip_redis() {
    let test = "costs_count_as_units_and_oversized_costs_skip_redis";
    shared_redis(test).await;
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn denials_report_the_exact_time_until_the_units_expire() {
    let test = "denials_report_the_exact_time_until_the_units_expire";
    shared_redis(test).await;
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn idle_keys_expire_by_themselves() {
    let test = "idle_keys_expire_by_themselves";
    let mut conn = shared_redis(test).await;
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn expiry_moves_with_the_newest_slot() {
    let test = "expiry_moves_with_the_newest_slot";
    let mut conn = shared_redis(test).await;
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn stale_buckets_are_deleted_from_a_busy_key() {
    let test = "stale_buckets_are_deleted_from_a_busy_key";
    let mut conn = shared_redis(test).await;
    let s = store(
        policy(1000, Duration::from_millis(40), 4),
        &unique_prefix(test),
    );
    let key = s.redis_key(&"k");
    // Keep the key busy across many 10 ms slots; it never holds more than the
    // N + 1 slots of one span.
    for _ in 0..30 {
        assert!(s.check_n(&"k", 1).await.unwrap().is_allowed());
        let slots = PackedKey::read(&mut conn, &key).await.unwrap().slots;
        assert!(slots.len() <= 5, "{slots:?}");
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn keys_are_the_prefix_and_a_hash_tag_around_the_key() {
    let test = "keys_are_the_prefix_and_a_hash_tag_around_the_key";
    let mut conn = shared_redis(test).await;
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn deny_cache_answers_an_over_limit_key_without_a_round_trip() {
    let test = "deny_cache_answers_an_over_limit_key_without_a_round_trip";
    shared_redis(test).await;
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_connection_of_your_own_works_like_the_managed_one() {
    let test = "a_connection_of_your_own_works_like_the_managed_one";
    let conn = shared_redis(test).await;
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
    let build = |b: tower_sliding_window::redis::RedisStoreBuilder| b.build().unwrap_err();
    let open = || RedisStore::builder(p(), FailurePolicy::Open);
    assert!(matches!(build(open()), ConfigError::NoRedis), "no URL");
    let bad_url = build(open().url("nope://"));
    assert!(matches!(bad_url, ConfigError::InvalidRedisUrl { .. }));
    // The redis crate's reason is kept as the source.
    assert!(std::error::Error::source(&bad_url).is_some(), "{bad_url:?}");
    assert!(matches!(
        build(open().url(&redis_url()).timeout(Duration::ZERO)),
        ConfigError::Zero { setting: "timeout" }
    ));
    let tiny = RedisStore::builder(
        policy(5, Duration::from_nanos(5_000), 10),
        FailurePolicy::Open,
    );
    assert!(matches!(
        build(tiny.url(&redis_url())),
        ConfigError::BucketBelowClockResolution { .. }
    ));
    // A policy name with a brace would break the default prefix's hash tag
    // (the policy's own build refuses it; `with_name` does not check).
    let named = Policy::builder()
        .limit(5)
        .window(Duration::from_secs(1))
        .build()
        .unwrap()
        .with_name("a{b}");
    let err = build(RedisStore::builder(named, FailurePolicy::Open).url(&redis_url()));
    assert!(matches!(err, ConfigError::InvalidRedisPrefix { .. }));
}

/// Without the `redis-tls` feature a `rediss://` URL is refused at build,
/// naming the feature (this runs in builds without it, such as
/// `cargo test --features redis`; tests/redis_tls.rs covers builds with it).
#[cfg(not(feature = "redis-tls"))]
#[tokio::test]
async fn a_rediss_url_names_the_feature_it_needs() {
    for url in ["rediss://127.0.0.1:6380", "REDISS://127.0.0.1:6380/0"] {
        let err = RedisStore::builder(policy(5, Duration::from_secs(1), 10), FailurePolicy::Open)
            .url(url)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, ConfigError::RedisTlsNotEnabled),
            "{url}: {err:?}"
        );
        assert!(err.to_string().contains("redis-tls"), "{err}");
    }
}

/// With the `redis-tls` feature a `rediss://` URL builds (connecting is
/// tests/redis_tls.rs' business).
#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn a_rediss_url_builds_with_the_tls_feature() {
    RedisStore::builder(policy(5, Duration::from_secs(1), 10), FailurePolicy::Open)
        .url("rediss://127.0.0.1:6380")
        .build()
        .unwrap();
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn check_now_answers_only_what_needs_no_round_trip() {
    let test = "check_now_answers_only_what_needs_no_round_trip";
    shared_redis(test).await;
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
    use tower_sliding_window::{key_fn, SlidingWindowLayer};
    let by_user = key_fn(|req: &http::Request<String>| {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
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
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn the_layer_enforces_a_redis_store_shared_by_two_instances() {
    use tower::ServiceExt;
    let test = "the_layer_enforces_a_redis_store_shared_by_two_instances";
    shared_redis(test).await;
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

/// A prefix kept across a change of bucket width (a redeploy with another
/// window): the old deploy's slot numbers are 100 times the new one's, under
/// the same key. The key records its width, so the new deploy converts the
/// counts (moved later in time, never earlier) instead of holding the key
/// years ahead or forgetting them.
#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_prefix_kept_across_a_change_of_bucket_width_converts_the_counts() {
    let test = "a_prefix_kept_across_a_change_of_bucket_width_converts_the_counts";
    shared_redis(test).await;
    let prefix = unique_prefix(test);
    // The old deploy: 100 ms buckets; the new one: 10 s buckets.
    let old = store(policy(5, Duration::from_secs(1), 10), &prefix);
    assert!(old.check_n(&"alice", 1).await.unwrap().is_allowed());
    let new = store(policy(5, Duration::from_secs(100), 10), &prefix);
    for _ in 0..4 {
        let d = new.check_n(&"alice", 1).await.unwrap();
        assert!(d.is_allowed(), "held years ahead: {d:?}");
    }
    let denied = new.check_n(&"alice", 1).await.unwrap();
    assert_eq!(denied.outcome(), Outcome::Denied, "the old unit counts");
    assert!(
        denied.retry_after().unwrap() <= Duration::from_secs(110),
        "{denied:?}"
    );
}

/// The default prefix keeps policies of other geometries apart, also when their
/// windows differ by less than a microsecond but their buckets (rounded up to
/// whole µs) do not: 1 s buckets and 1.000001 s buckets under one key would
/// each find the other's slots "more than a window ahead" and wipe them.
#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn default_prefixes_of_other_bucket_widths_never_share_a_key() {
    let test = "default_prefixes_of_other_bucket_widths_never_share_a_key";
    shared_redis(test).await;
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
    use tower_sliding_window::redis::RedisKey;
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

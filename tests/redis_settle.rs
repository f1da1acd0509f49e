//! Settlement on the Redis store: give-backs through `Store::undo` (in Redis
//! while the slot is inside the window, into a lease's grant while it is in
//! force), and excesses charged past the limit (`RedisStore`'s
//! `Store::charge`, in the background).
//! `#[ignore]`d: run with `-- --include-ignored` where Redis answers.
#![cfg(feature = "redis")]

mod redis_support;

use http::{Request, Response, StatusCode};
use redis_support::*;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_sliding_window::redis::Leases;
use tower_sliding_window::{key_fn, FailurePolicy, Policy, RedisStore, SlidingWindowLayer};

/// With `REQUIRE_REDIS=1` (CI) the ignored Redis tests below must be run.
#[test]
fn redis_tests_are_included_where_redis_is_required() {
    assert_included_where_required();
}

fn store(url: &str, policy: Policy, prefix: &str, leases: bool) -> RedisStore {
    let builder = RedisStore::builder(policy, FailurePolicy::Closed)
        .url(url)
        .timeout(Duration::from_secs(2))
        .prefix(prefix);
    if leases {
        builder.leases(Leases::new()).build().unwrap()
    } else {
        builder.build().unwrap()
    }
}

fn user(req: &Request<String>) -> Option<String> {
    req.headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn attempt(password: &str) -> Request<String> {
    Request::builder()
        .header("x-user", "ada")
        .body(password.to_owned())
        .unwrap()
}

/// Read `key` until it holds `units` (an undo reaches Redis in a task of
/// its own), failing after two seconds.
async fn until_units(conn: &mut ::redis::aio::MultiplexedConnection, key: &[u8], units: u64) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let now = PackedKey::units_of(conn, key).await;
        if now == units {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{now} units in Redis, not {units}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL: run with -- --include-ignored"]
async fn failed_logins_count_in_redis_and_successes_are_given_back() {
    let test = "failed_logins_count_in_redis_and_successes_are_given_back";
    let mut conn = shared_redis(test).await;
    let prefix = unique_prefix(test);
    let redis = store(
        &redis_url(),
        Policy::per(3, Duration::from_secs(60)).unwrap(),
        &prefix,
        false,
    );
    let key = redis.redis_key(&"ada".to_owned());
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(redis)
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let login =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<String>| async move {
                let status = if req.body() == "right" { 204 } else { 401 };
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(status)
                        .body(String::new())
                        .unwrap(),
                )
            }));
    for _ in 0..10 {
        let ok = login.clone().oneshot(attempt("right")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::NO_CONTENT);
        until_units(&mut conn, &key, 0).await;
    }
    for _ in 0..3 {
        let failed = login.clone().oneshot(attempt("wrong")).await.unwrap();
        assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    }
    until_units(&mut conn, &key, 3).await;
    let refused = login.clone().oneshot(attempt("right")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL: run with -- --include-ignored"]
async fn a_partial_settlement_gives_back_the_difference_and_an_excess_is_charged() {
    let test = "a_partial_settlement_gives_back_the_difference_and_an_excess_is_charged";
    let mut conn = shared_redis(test).await;
    let prefix = unique_prefix(test);
    let redis = store(
        &redis_url(),
        Policy::per(100, Duration::from_secs(60)).unwrap(),
        &prefix,
        false,
    );
    let key = redis.redis_key(&"ada".to_owned());
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .cost(|_: &Request<String>| 10)
        .store(redis)
        .settle(|_, headers| headers.get("x-used")?.to_str().ok()?.parse().ok())
        .build()
        .unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<String>| async move {
                let used = req.body().clone();
                let response = Response::builder().header("x-used", used);
                Ok::<_, Infallible>(response.body(String::new()).unwrap())
            }));
    assert_eq!(
        svc.clone().oneshot(attempt("4")).await.unwrap().status(),
        StatusCode::OK
    );
    until_units(&mut conn, &key, 4).await;
    // 25 used of 10 reserved: the 15 more are charged.
    assert_eq!(
        svc.clone().oneshot(attempt("25")).await.unwrap().status(),
        StatusCode::OK
    );
    until_units(&mut conn, &key, 29).await;
}

/// An excess charged past the limit, on an instance holding a grant of the
/// key: the grant goes back with the charge, and every instance is denied
/// until the window is back under the limit.
#[tokio::test]
#[ignore = "needs Redis at REDIS_URL: run with -- --include-ignored"]
async fn an_excess_charged_past_the_limit_denies_the_key_everywhere() {
    let test = "an_excess_charged_past_the_limit_denies_the_key_everywhere";
    let mut conn = shared_redis(test).await;
    let prefix = unique_prefix(test);
    let p = Policy::per(50, Duration::from_secs(60)).unwrap();
    let leased = store(&redis_url(), p.clone(), &prefix, true);
    let other = store(&redis_url(), p, &prefix, false);
    let key = leased.redis_key(&"ada".to_owned());
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(leased.clone())
        .settle(|_, headers| headers.get("x-used")?.to_str().ok()?.parse().ok())
        .build()
        .unwrap();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<String>| async move {
                let used = req.body().clone();
                let response = Response::builder().header("x-used", used);
                Ok::<_, Infallible>(response.body(String::new()).unwrap())
            }));
    // A busy key: this instance holds a grant of it.
    for _ in 0..10 {
        assert_eq!(
            svc.clone().oneshot(attempt("1")).await.unwrap().status(),
            StatusCode::OK
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // One request used 60 units: 59 more are charged, past the limit of 50.
    assert_eq!(
        svc.clone().oneshot(attempt("60")).await.unwrap().status(),
        StatusCode::OK
    );
    // 10 + 1 reserved + 59 charged; the grant this instance held is back.
    until_units(&mut conn, &key, 70).await;
    let stats = leased.stats();
    assert_eq!(
        stats.lease_units_granted,
        stats.lease_units_admitted + stats.lease_units_handed_back,
        "the grant went back with the charge: {stats:?}"
    );
    // Denied here and on the other instance.
    let denied = svc.clone().oneshot(attempt("1")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    use tower_sliding_window::Store;
    let d = other.check_n(&"ada".to_owned(), 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
}

#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn two_hundred_concurrent_failed_logins_on_leases_admit_at_most_five() {
    let test = "two_hundred_concurrent_failed_logins_on_leases_admit_at_most_five";
    let server = RedisServer::start(test).await;
    let prefix = unique_prefix(test);
    // 5 failed logins per 2 s (two buckets of 1 s).
    let policy = Policy::builder()
        .limit(5)
        .window(Duration::from_secs(2))
        .buckets(2)
        .build()
        .unwrap();
    let redis = store(&server.url(), policy, &prefix, true);
    redis.warm_up().await.unwrap();
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(redis)
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let failures = Arc::new(AtomicU32::new(0));
    let login = ServiceBuilder::new().layer(layer).service(service_fn({
        let failures = failures.clone();
        move |req: Request<String>| {
            let failures = failures.clone();
            async move {
                if req.body() == "right" {
                    return Ok::<_, Infallible>(Response::new(String::new()));
                }
                failures.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(Response::builder().status(401).body(String::new()).unwrap())
            }
        }
    }));
    // Successes first: each is given back (into the lease while it is in
    // force), so more than five pass.
    for _ in 0..10 {
        let ok = login.clone().oneshot(attempt("right")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let started = Instant::now();
    let guesses: Vec<_> = (0..200)
        .map(|_| tokio::spawn(login.clone().oneshot(attempt("wrong"))))
        .collect();
    let mut statuses = Vec::new();
    for guess in guesses {
        statuses.push(guess.await.unwrap().unwrap().status());
    }
    let elapsed = started.elapsed();
    let admitted = failures.load(SeqCst);
    // All within one window: at most the limit reached the handler.
    assert!(
        elapsed < Duration::from_secs(1),
        "{elapsed:?}: not one window"
    );
    assert!(admitted <= 5, "{admitted} failed logins admitted");
    assert!(admitted >= 1);
    assert_eq!(
        statuses
            .iter()
            .filter(|&&s| s == StatusCode::UNAUTHORIZED)
            .count() as u32,
        admitted
    );
    assert!(statuses
        .iter()
        .all(|&s| s == StatusCode::UNAUTHORIZED || s == StatusCode::TOO_MANY_REQUESTS));
    // Once the failures have left the span (the window and a bucket after
    // the last of them, on Redis' clock, this host's), successes pass again.
    tokio::time::sleep_until((started + Duration::from_secs(3) + elapsed).into()).await;
    for _ in 0..10 {
        let ok = login.clone().oneshot(attempt("right")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
}

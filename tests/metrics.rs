//! The values the layer and its limiters report through the `metrics` facade,
//! read back through `metrics-util`'s debugging recorder after a scripted
//! sequence of requests on tokio's paused clock.

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use std::convert::Infallible;
use std::time::Duration;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::extract::Untiered;
use tower_sliding_window::{
    key_fn, tiered_key_fn, KeyExtractor, OnLimit, Policy, SlidingWindowLayer, Tiers, WaitConfig,
};

fn policy(name: &str, limit: u32, window_ms: u64) -> Policy {
    Policy::builder()
        .name(name)
        .limit(limit)
        .window(Duration::from_millis(window_ms))
        .build()
        .unwrap()
}

fn by_user() -> impl KeyExtractor<Request<String>, Key = String, Tiering = Untiered> + Clone {
    key_fn(|req: &Request<String>| {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    })
}

fn request(user: Option<&str>, path: &str) -> Request<String> {
    let mut req = Request::builder().uri(path);
    if let Some(user) = user {
        req = req.header("x-user", user);
    }
    req.body(String::new()).unwrap()
}

fn ok_service(
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(|_req: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    })
}

/// One snapshot of the recorder. Taking one drains it (counters restart at
/// zero, histograms empty), so each check reads one snapshot.
struct Snapshot(Vec<(CompositeKey, DebugValue)>);

impl Snapshot {
    fn take(snapshotter: &Snapshotter) -> Snapshot {
        let all = snapshotter.snapshot().into_vec();
        Snapshot(all.into_iter().map(|(k, _, _, v)| (k, v)).collect())
    }

    /// The value of metric `name` of `kind` with exactly these labels.
    fn value(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut wanted = labels.to_vec();
        wanted.sort();
        self.0
            .iter()
            .find(|(key, _)| {
                let k = key.key();
                let mut found: Vec<(&str, &str)> =
                    k.labels().map(|l| (l.key(), l.value())).collect();
                found.sort();
                key.kind() == kind && k.name() == name && found == wanted
            })
            .map(|(_, value)| value)
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.value(MetricKind::Counter, name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("counter {name} {labels:?}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn decisions_exemptions_missing_keys_and_dry_runs_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let layer = SlidingWindowLayer::builder(by_user())
        .policy(policy("api", 2, 1500))
        .exempt(|req: &Request<String>| req.uri().path() == "/health")
        .build()
        .unwrap();
    let dry = SlidingWindowLayer::builder(by_user())
        .policy(policy("dry", 1, 1500))
        .dry_run(true)
        .build()
        .unwrap();
    let api = ServiceBuilder::new()
        .layer(layer.clone())
        .service(ok_service());
    let dry_svc = ServiceBuilder::new()
        .layer(dry.clone())
        .service(ok_service());

    let mut statuses = Vec::new();
    for req in [
        request(Some("ada"), "/"),
        request(Some("ada"), "/"),
        request(Some("ada"), "/"),
        request(None, "/health"),
        request(None, "/"),
    ] {
        statuses.push(api.clone().oneshot(req).await.unwrap().status());
    }
    use StatusCode as S;
    assert_eq!(
        statuses,
        [S::OK, S::OK, S::TOO_MANY_REQUESTS, S::OK, S::BAD_REQUEST]
    );
    for _ in 0..3 {
        let response = dry_svc
            .clone()
            .oneshot(request(Some("bob"), "/"))
            .await
            .unwrap();
        assert_eq!(response.status(), S::OK, "a dry run forwards");
    }
    // Counts of allowed and denied checks reach the recorder once per bucket
    // width, or when the stats are read.
    let _ = layer.stores().next().unwrap().stats();
    let _ = dry.stores().next().unwrap().stats();

    let snap = Snapshot::take(&snapshotter);
    let checks = |snap: &Snapshot, policy, outcome| {
        snap.counter(
            "tower_sliding_window_decisions_total",
            &[
                ("policy", policy),
                ("store", "memory"),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(checks(&snap, "api", "allowed"), 2);
    assert_eq!(checks(&snap, "api", "denied"), 1);
    assert_eq!(checks(&snap, "dry", "allowed"), 1);
    assert_eq!(checks(&snap, "dry", "denied"), 2);
    let requests = |policy, outcome| {
        snap.counter(
            "tower_sliding_window_requests_total",
            &[("policy", policy), ("outcome", outcome)],
        )
    };
    assert_eq!(requests("api", "exempt"), 1);
    assert_eq!(requests("api", "missing_key"), 1);
    assert_eq!(requests("api", "dry_run_denied"), 0);
    assert_eq!(requests("dry", "dry_run_denied"), 2);
    assert_eq!(
        snap.value(
            MetricKind::Gauge,
            "tower_sliding_window_keys",
            &[("policy", "api")]
        ),
        Some(&DebugValue::Gauge(1.0.into()))
    );

    // A bucket later, the next check hands over its counts by itself.
    tokio::time::advance(Duration::from_millis(100)).await;
    let response = api
        .clone()
        .oneshot(request(Some("eve"), "/"))
        .await
        .unwrap();
    assert_eq!(response.status(), S::OK);
    let later = Snapshot::take(&snapshotter);
    assert_eq!(checks(&later, "api", "allowed"), 1, "one more since");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn waits_and_requests_turned_away_are_counted_with_the_time_waited() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    // 1 per 1.5 s; wait up to 2 s behind at most one other.
    let layer = SlidingWindowLayer::builder(by_user())
        .policy(policy("queue", 1, 1500))
        .on_limit(OnLimit::Wait(
            WaitConfig::bounded(Duration::from_secs(2), 1).unwrap(),
        ))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(ok_service());
    let first = svc
        .clone()
        .oneshot(request(Some("ada"), "/"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The second waits for the first unit to leave, 1.5 s after it (to a
    // step of its bucket), and passes at the timer's next millisecond:
    // 1.501 s. The third finds the queue full and is turned away at once.
    let (second, third) = tokio::join!(
        svc.clone().oneshot(request(Some("ada"), "/")),
        svc.clone().oneshot(request(Some("ada"), "/")),
    );
    assert_eq!(second.unwrap().status(), StatusCode::OK);
    assert_eq!(third.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);

    let snap = Snapshot::take(&snapshotter);
    let requests = |outcome| {
        snap.counter(
            "tower_sliding_window_requests_total",
            &[("policy", "queue"), ("outcome", outcome)],
        )
    };
    assert_eq!(requests("waited"), 1);
    assert_eq!(requests("wait_rejected"), 1);
    let waits = snap.value(
        MetricKind::Histogram,
        "tower_sliding_window_wait_seconds",
        &[("policy", "queue")],
    );
    assert_eq!(waits, Some(&DebugValue::Histogram(vec![1.501.into()])));
}

#[tokio::test(flavor = "current_thread")]
async fn a_layer_of_several_policies_labels_its_requests_with_their_names() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let layer = SlidingWindowLayer::builder(by_user())
        .policy(policy("burst", 10, 1000))
        .policy(policy("hourly", 100, 3_600_000))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(ok_service());
    let response = svc.oneshot(request(None, "/")).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let missing = Snapshot::take(&snapshotter).counter(
        "tower_sliding_window_requests_total",
        &[("policy", "burst+hourly"), ("outcome", "missing_key")],
    );
    assert_eq!(missing, 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_layer_of_tiers_counts_unlimited_denied_and_unknown_tiers() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let tiers = Tiers::builder()
        .limited("free", [policy("free", 1, 60_000)])
        .unlimited("internal")
        .denied("suspended")
        .build()
        .unwrap();
    // The tier is the path, the key the user.
    let by_tier = tiered_key_fn(|req: &Request<String>| {
        let tier = req.uri().path().trim_start_matches('/').to_owned();
        Some((tier, req.headers().get("x-user")?.to_str().ok()?.to_owned()))
    });
    let layer = SlidingWindowLayer::builder(by_tier)
        .tiers(tiers)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service(ok_service());
    let status = |path: &'static str| {
        let svc = svc.clone();
        async move {
            svc.oneshot(request(Some("ada"), path))
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(status("/free").await, StatusCode::OK);
    assert_eq!(status("/free").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("/internal").await, StatusCode::OK);
    assert_eq!(status("/suspended").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("/gold").await, StatusCode::INTERNAL_SERVER_ERROR);
    let snapshot = Snapshot::take(&snapshotter);
    let requests = |outcome| {
        snapshot.counter(
            "tower_sliding_window_requests_total",
            &[("policy", "tiers"), ("outcome", outcome)],
        )
    };
    assert_eq!(requests("exempt"), 1);
    assert_eq!(requests("tier_denied"), 1);
    assert_eq!(requests("unknown_tier"), 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_keys_gauge_follows_the_background_sweeper() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let limiter = tower_sliding_window::Limiter::builder(policy("swept", 5, 1000))
        .sweep_idle()
        .build::<u32>()
        .unwrap();
    for key in 0..10 {
        assert!(limiter.check(&key).is_allowed());
    }
    let keys = |snap: &Snapshot| match snap.value(
        MetricKind::Gauge,
        "tower_sliding_window_keys",
        &[("policy", "swept")],
    ) {
        Some(DebugValue::Gauge(keys)) => keys.into_inner(),
        other => panic!("keys: {other:?}"),
    };
    // The first rounds, within the window, keep every key.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(keys(&Snapshot::take(&snapshotter)), 10.0);
    // With no check at all, the rounds after the window drop them and say so.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(keys(&Snapshot::take(&snapshotter)), 0.0);
}

#[cfg(feature = "redis")]
mod redis_support;

/// A store with nothing to talk to: every decision fails as a refused
/// connection until the breaker opens, then the breaker answers. No Redis
/// needed.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "current_thread")]
async fn a_redis_store_that_cannot_decide_counts_failures_by_cause_and_its_breaker() {
    use tower_sliding_window::redis::CircuitBreaker;
    use tower_sliding_window::{FailurePolicy, RedisStore, Store};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let url = format!("redis://127.0.0.1:{}", redis_support::free_port());
    let store = RedisStore::builder(policy("fleet", 5, 1000), FailurePolicy::Open)
        .url(&url)
        .circuit_breaker(CircuitBreaker::new(
            3,
            Duration::from_secs(60),
            Duration::from_secs(60),
        ))
        .build()
        .unwrap();
    for _ in 0..8 {
        let decision = store.check_n(&"k", 1).await.unwrap();
        assert!(decision.is_allowed() && decision.is_unchecked());
    }
    let snap = Snapshot::take(&snapshotter);
    let labels = |outcome| {
        [
            ("policy", "fleet"),
            ("store", "redis"),
            ("outcome", outcome),
        ]
    };
    let decisions =
        |outcome| snap.counter("tower_sliding_window_decisions_total", &labels(outcome));
    assert_eq!(decisions("failed_open"), 8);
    assert_eq!(decisions("allowed"), 0);
    // Three calls reached for Redis and were refused; the open breaker
    // answered the other five at once.
    let errors = |kind| {
        snap.counter(
            "tower_sliding_window_store_errors_total",
            &[("policy", "fleet"), ("store", "redis"), ("kind", kind)],
        )
    };
    assert_eq!(errors("connection_refused"), 3);
    assert_eq!(errors("timeout"), 0);
    let fleet = [("policy", "fleet")];
    assert_eq!(
        snap.counter("tower_sliding_window_redis_breaker_opens_total", &fleet),
        1
    );
    assert_eq!(
        snap.value(
            MetricKind::Gauge,
            "tower_sliding_window_redis_breaker_state",
            &fleet
        ),
        Some(&DebugValue::Gauge(1.0.into()))
    );
    match snap.value(
        MetricKind::Histogram,
        "tower_sliding_window_redis_round_trip_seconds",
        &fleet,
    ) {
        Some(DebugValue::Histogram(calls)) => assert_eq!(calls.len(), 3),
        other => panic!("round trips: {other:?}"),
    }
}

/// With `REQUIRE_REDIS=1` (CI) the ignored Redis test below must be run.
#[cfg(feature = "redis")]
#[test]
fn redis_tests_are_included_where_redis_is_required() {
    redis_support::assert_included_where_required();
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "current_thread")]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_redis_store_counts_its_decisions_round_trips_and_deny_cache_hits() {
    use tower_sliding_window::{FailurePolicy, RedisStore, Store};

    let test = "a_redis_store_counts_its_decisions_round_trips_and_deny_cache_hits";
    redis_support::shared_redis(test).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let store = RedisStore::builder(policy("shared", 2, 60_000), FailurePolicy::Closed)
        .url(&redis_support::redis_url())
        .prefix(redis_support::unique_prefix(test))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut allowed = Vec::new();
    for _ in 0..4 {
        allowed.push(store.check_n(&"k", 1).await.unwrap().is_allowed());
    }
    // The third is denied by Redis, the fourth by the local deny cache.
    assert_eq!(allowed, [true, true, false, false]);
    let snap = Snapshot::take(&snapshotter);
    let labels = |outcome| {
        [
            ("policy", "shared"),
            ("store", "redis"),
            ("outcome", outcome),
        ]
    };
    let decisions =
        |outcome| snap.counter("tower_sliding_window_decisions_total", &labels(outcome));
    assert_eq!((decisions("allowed"), decisions("denied")), (2, 2));
    assert_eq!(decisions("failed_closed"), 0);
    let shared = [("policy", "shared")];
    assert_eq!(
        snap.counter("tower_sliding_window_redis_deny_cache_hits_total", &shared),
        1
    );
    match snap.value(
        MetricKind::Histogram,
        "tower_sliding_window_redis_round_trip_seconds",
        &shared,
    ) {
        Some(DebugValue::Histogram(calls)) => assert_eq!(calls.len(), 3),
        other => panic!("round trips: {other:?}"),
    }
}

/// The fallback limiter's decisions (no Redis needed: nothing listening).
#[cfg(feature = "redis")]
#[tokio::test(flavor = "current_thread")]
async fn a_redis_store_counts_the_fallback_limiters_decisions() {
    use tower_sliding_window::{FailurePolicy, RedisStore, Store};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let url = format!("redis://127.0.0.1:{}", redis_support::free_port());
    let store = RedisStore::builder(
        policy("fleet", 50, 1000),
        FailurePolicy::Fallback(policy("local", 3, 60_000)),
    )
    .url(&url)
    .build()
    .unwrap();
    for _ in 0..5 {
        let d = store.check_n(&"k", 1).await.unwrap();
        assert!(!d.is_unchecked());
    }
    let snap = Snapshot::take(&snapshotter);
    let decisions = |outcome| {
        snap.counter(
            "tower_sliding_window_decisions_total",
            &[
                ("policy", "fleet"),
                ("store", "redis"),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(
        (decisions("fallback_allowed"), decisions("fallback_denied")),
        (3, 2)
    );
    assert_eq!(store.stats().fallback_decisions, 5);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "current_thread")]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_redis_store_counts_its_leases() {
    use tower_sliding_window::redis::Leases;
    use tower_sliding_window::{FailurePolicy, RedisStore, Store};

    let test = "a_redis_store_counts_its_leases";
    redis_support::shared_redis(test).await;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let store = RedisStore::builder(policy("leased", 1000, 60_000), FailurePolicy::Closed)
        .url(&redis_support::redis_url())
        .prefix(redis_support::unique_prefix(test))
        .timeout(Duration::from_secs(2))
        .leases(Leases::new())
        .build()
        .unwrap();
    for _ in 0..40 {
        assert!(store.check_n(&"k", 1).await.unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    store.shutdown().await;
    let stats = store.stats();
    assert!(stats.lease_decisions > 0, "{stats:?}");
    assert!(stats.lease_units_handed_back > 0, "{stats:?}");
    let snap = Snapshot::take(&snapshotter);
    let leased = [("policy", "leased")];
    let units = |kind| {
        snap.counter(
            "tower_sliding_window_redis_lease_units_total",
            &[("policy", "leased"), ("kind", kind)],
        )
    };
    assert_eq!(
        snap.counter("tower_sliding_window_redis_lease_decisions_total", &leased),
        stats.lease_decisions
    );
    assert_eq!(
        snap.counter("tower_sliding_window_redis_lease_grants_total", &leased),
        stats.lease_grants
    );
    assert_eq!(units("granted"), stats.lease_units_granted);
    assert_eq!(units("handed_back"), stats.lease_units_handed_back);
    assert_eq!(units("refused"), stats.lease_units_refused);
    assert_eq!(units("unreturned"), stats.lease_units_unreturned);
    // Every unit granted was admitted or handed back.
    assert_eq!(
        stats.lease_units_granted,
        stats.lease_units_admitted + stats.lease_units_handed_back
    );
    assert_eq!(
        snap.counter(
            "tower_sliding_window_decisions_total",
            &[
                ("policy", "leased"),
                ("store", "redis"),
                ("outcome", "allowed")
            ],
        ),
        40
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn settlements_report_units_given_back_and_charged_by_policy() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&recorder);

    let layer = SlidingWindowLayer::builder(by_user())
        .cost(|_: &Request<String>| 10)
        .policies([
            policy("minute", 100, 60_000),
            policy("hour", 1000, 3_600_000),
        ])
        .settle(|_, headers| headers.get("x-used")?.to_str().ok()?.parse().ok())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(tower::service_fn(|req: Request<String>| async move {
            let used = req.body().clone();
            let response = Response::builder().header("x-used", used);
            Ok::<_, Infallible>(response.body(String::new()).unwrap())
        }));
    for used in ["4", "25", "10"] {
        let mut req = request(Some("ada"), "/");
        *req.body_mut() = used.to_owned();
        assert_eq!(
            svc.clone().oneshot(req).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let snapshot = Snapshot::take(&snapshotter);
    let units = "tower_sliding_window_settled_units_total";
    for policy in ["minute", "hour"] {
        let given_back = [("policy", policy), ("outcome", "given_back")];
        let charged = [("policy", policy), ("outcome", "charged")];
        assert_eq!(snapshot.counter(units, &given_back), 6, "{policy}");
        assert_eq!(snapshot.counter(units, &charged), 15, "{policy}");
        let uncharged = [("policy", policy), ("outcome", "uncharged")];
        assert_eq!(snapshot.counter(units, &uncharged), 0, "{policy}");
    }
}

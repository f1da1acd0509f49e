//! The values the layer and its limiters report through the `metrics` facade,
//! read back through `metrics-util`'s debugging recorder after a scripted
//! sequence of requests on tokio's paused clock.

use http::{Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use std::convert::Infallible;
use std::time::Duration;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::{key_fn, KeyExtractor, OnLimit, Policy, SlidingWindowLayer, WaitConfig};

fn policy(name: &str, limit: u32, window_ms: u64) -> Policy {
    Policy::builder()
        .name(name)
        .limit(limit)
        .window(Duration::from_millis(window_ms))
        .build()
        .unwrap()
}

fn by_user() -> impl KeyExtractor<Request<String>, Key = String> + Clone {
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

    // 1 per 1.5 s in 15 buckets of 100 ms; wait up to 2 s behind at most one other.
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
    // The second waits for the first unit to leave (1.6 s); the third finds
    // the queue full and is turned away at once.
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
    assert_eq!(waits, Some(&DebugValue::Histogram(vec![1.6.into()])));
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

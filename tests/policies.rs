//! Layer behaviour in-process, on tokio's paused clock: several policies,
//! cost, exemption, dry run, error mode, remote stores (key logging: tests/logging.rs).

use http::{Request, Response, StatusCode};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::layer::KeyMissing;
use tower_sliding_window::{
    key_fn, Decision, GlobalKey, Limiter, MissingKey, Policy, RateLimited, SlidingWindowLayer,
    Store, StoreError,
};

mod layer_support;
use layer_support::*;

#[tokio::test(start_paused = true)]
async fn a_request_denied_by_one_policy_consumes_nothing_from_the_others() {
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("burst", 1, Duration::from_secs(1)))
        .policy(policy("minute", 3, Duration::from_secs(60)))
        .headers_on_allowed(true)
        .build()
        .unwrap();
    let minute = layer.clone();
    let mut svc = layer.layer(ok_service());

    // Allowed: burst has 0/1 left, minute 2/3; the header reports the closer one.
    let (s, rate) = status(&mut svc, request("u")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(rate.unwrap().starts_with("\"burst\";r=0;"));

    // Denied by burst: minute must not count it.
    for _ in 0..5 {
        assert_eq!(
            status(&mut svc, request("u")).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    let usage = minute.stores().nth(1).unwrap().usage(&"u".to_owned());
    assert_eq!(usage.used, 1);

    for expected_minute_remaining in [1, 0] {
        tokio::time::advance(Duration::from_millis(1100)).await;
        let (s, rate) = status(&mut svc, request("u")).await;
        assert_eq!(s, StatusCode::OK);
        // burst 0/1 and minute 0/3 tie at ratio 0 at the end; either is closest.
        let rate = rate.unwrap();
        assert!(
            rate.contains(";r=0;") || rate.contains(&format!(";r={expected_minute_remaining};"))
        );
    }

    // Now the minute policy denies, with the longer wait reported.
    tokio::time::advance(Duration::from_millis(1100)).await;
    let response = svc.ready().await.unwrap().call(request("u")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers()["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"minute\";r=0;"));
    let retry: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 50, "reports the minute policy's wait, got {retry}");
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"burst\";q=1;w=1, \"minute\";q=3;w=60"
    );
}

#[tokio::test(start_paused = true)]
async fn sub_second_waits_round_up_to_one_second() {
    let layer = SlidingWindowLayer::new(policy("p", 1, Duration::from_secs(1)), GlobalKey).unwrap();
    let mut svc = layer.layer(ok_service());
    assert_eq!(status(&mut svc, request("a")).await.0, StatusCode::OK);
    tokio::time::advance(Duration::from_millis(950)).await;
    let response = svc.ready().await.unwrap().call(request("a")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
}

#[tokio::test(start_paused = true)]
async fn cost_exemption_and_cost_above_the_limit() {
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("units", 10, Duration::from_secs(60)))
        .headers_on_allowed(true)
        .cost(|req: &Request<Body>| {
            req.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .exempt(|req: &Request<Body>| req.headers().contains_key("x-internal"))
        .build()
        .unwrap();
    let stats = layer.clone();
    let mut svc = layer.layer(ok_service());
    let with = |cost: &str| {
        let mut req = request("u");
        req.headers_mut().insert("x-cost", cost.parse().unwrap());
        req
    };

    let (s, rate) = status(&mut svc, with("7")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(rate.unwrap().contains(";r=3;"));
    assert_eq!(
        status(&mut svc, with("4")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Exempt requests pass uncounted and without headers.
    let mut internal = with("100");
    internal
        .headers_mut()
        .insert("x-internal", "1".parse().unwrap());
    assert_eq!(status(&mut svc, internal).await, (StatusCode::OK, None));
    assert_eq!(status(&mut svc, with("3")).await.0, StatusCode::OK);

    // A cost above the limit can never pass: no Retry-After.
    let response = svc.ready().await.unwrap().call(with("11")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!response.headers().contains_key("retry-after"));
    assert!(response.headers().contains_key("ratelimit"));
    let counted = stats.stores().next().unwrap().usage(&"u".to_owned());
    assert_eq!(counted.used, 10);
}

#[tokio::test(start_paused = true)]
async fn dry_run_decides_and_counts_but_never_blocks() {
    // No headers_on_allowed: a dry run sets the headers by itself.
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("trial", 2, Duration::from_secs(60)))
        .dry_run(true)
        .build()
        .unwrap();
    let stats = layer.clone();
    let mut svc = layer.layer(ok_service());
    let mut rates = Vec::new();
    for _ in 0..5 {
        let (s, rate) = status(&mut svc, request("u")).await;
        assert_eq!(s, StatusCode::OK);
        rates.push(rate.expect("a dry run sets RateLimit on every response"));
    }
    assert!(rates[0].starts_with("\"trial\";r=1;"), "{}", rates[0]);
    assert!(rates[4].contains(";r=0;"), "headers still tell the truth");
    assert_eq!(stats.stats().dry_run_rejections, 3);
    let limiter = stats.stores().next().unwrap().stats();
    assert_eq!((limiter.admitted, limiter.rejected), (2, 3));
}

#[tokio::test(start_paused = true)]
async fn dry_run_forwards_requests_without_a_key_and_counts_them() {
    // The default MissingKey::Reject would answer 400 (the key closure's
    // missing-key status); a dry run only counts it.
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("trial", 2, Duration::from_secs(60)))
        .dry_run(true)
        .build()
        .unwrap();
    let stats = layer.clone();
    let mut svc = layer.layer(ok_service());
    let keyless = Request::builder().body(String::new()).unwrap();
    let (s, rate) = status(&mut svc, keyless).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(rate, None, "no key, no count to report");
    assert_eq!(stats.stats().key_missing, 1);

    // Enforcing, the same request is rejected. Every rate-limit field is on,
    // so their absence below is the layer's choice.
    let enforcing = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("trial", 2, Duration::from_secs(60)))
        .headers_on_allowed(true)
        .legacy_headers(true)
        .build()
        .unwrap();
    let mut svc = enforcing.layer(ok_service());
    let keyless = Request::builder().body(String::new()).unwrap();
    let response = svc.ready().await.unwrap().call(keyless).await.unwrap();
    // A request without a key is not throttled: no 429, no wait to report.
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    for name in [
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(
            !response.headers().contains_key(name),
            "{name}: {response:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn missing_key_can_be_allowed_or_use_a_fallback_key() {
    let allow = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("p", 1, Duration::from_secs(60)))
        .missing_key(MissingKey::Allow)
        .build()
        .unwrap();
    let mut svc = allow.layer(ok_service());
    let anonymous = || Request::new(String::new());
    for _ in 0..3 {
        assert_eq!(status(&mut svc, anonymous()).await, (StatusCode::OK, None));
    }

    let fallback = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("p", 1, Duration::from_secs(60)))
        .missing_key(MissingKey::Fallback("anonymous".to_owned()))
        .build()
        .unwrap();
    let mut svc = fallback.layer(ok_service());
    assert_eq!(status(&mut svc, anonymous()).await.0, StatusCode::OK);
    assert_eq!(
        status(&mut svc, anonymous()).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(&mut svc, request("named")).await.0, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn call_without_poll_ready_does_not_panic() {
    let layer = SlidingWindowLayer::new(policy("p", 1, Duration::from_secs(1)), GlobalKey).unwrap();
    let mut svc = layer.layer(ok_service());
    assert_eq!(
        svc.call(request("a")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        svc.call(request("a")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn non_http_requests_get_downcastable_error_values() {
    let layer = SlidingWindowLayer::builder(key_fn(|job: &(Option<u32>, &'static str)| job.0))
        .policy(policy("jobs", 1, Duration::from_secs(10)))
        .reject_with_errors()
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(
        |job: (Option<u32>, &'static str)| async move {
            if job.1 == "fail" {
                Err::<&str, BoxError>("inner failure".into())
            } else {
                Ok(job.1)
            }
        },
    );
    let mut call = |job| svc.call(job);
    assert_eq!(call((Some(1), "a")).await.unwrap(), "a");
    let err = call((Some(1), "b")).await.unwrap_err();
    let limited = err.downcast_ref::<RateLimited>().expect("RateLimited");
    assert_eq!(limited.policy_name(), "jobs");
    assert_eq!(limited.decision().remaining(), 0);
    assert!(limited.to_string().contains("retry after"));
    let err = call((None, "c")).await.unwrap_err();
    assert!(err.is::<KeyMissing>());
    let err = call((Some(2), "fail")).await.unwrap_err();
    assert_eq!(err.to_string(), "inner failure");
}

/// A cost above the limit can never pass (`retry_after()` is `None`): the
/// error's and the decision's `Debug`, which users log, must not say it could
/// be retried at once (`retry_after: 0ns`).
#[tokio::test(start_paused = true)]
async fn a_cost_above_the_limit_is_not_logged_as_retry_now() {
    let layer = SlidingWindowLayer::builder(key_fn(|job: &(u32, u32)| Some(job.0)))
        .policy(policy("jobs", 2, Duration::from_secs(10)))
        .cost(|job: &(u32, u32)| job.1)
        .reject_with_errors()
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_job: (u32, u32)| async move { Ok::<_, BoxError>(()) });
    let err = svc.ready().await.unwrap().call((1, 3)).await.unwrap_err();
    let limited = err.downcast_ref::<RateLimited>().expect("RateLimited");
    assert_eq!(limited.retry_after(), None);
    assert_eq!(
        err.to_string(),
        "request cost exceeds the limit of policy \"jobs\""
    );
    for shown in [format!("{err:?}"), format!("{:?}", limited.decision())] {
        assert!(shown.contains("retry_after: None"), "{shown}");
        assert!(!shown.contains("retry_after: 0ns"), "{shown}");
    }
    // A denial that can pass later still shows its wait as a duration.
    svc.ready().await.unwrap().call((1, 2)).await.unwrap();
    let err = svc.ready().await.unwrap().call((1, 1)).await.unwrap_err();
    let limited = err.downcast_ref::<RateLimited>().expect("RateLimited");
    let wait = limited.retry_after().unwrap();
    assert!(
        format!("{err:?}").contains(&format!("retry_after: {wait:?}")),
        "{err:?}"
    );
}

/// Error values and `Debug` output never hold the key (a client IP, an API
/// key) without `log_keys`.
#[tokio::test(start_paused = true)]
async fn error_values_and_debug_output_never_hold_the_key() {
    const KEY: &str = "sk-live-SECRET-203.0.113.77";
    let check = |shown: String| assert!(!shown.contains("SECRET"), "key leaked: {shown}");
    let layer = SlidingWindowLayer::builder(key_fn(|key: &String| Some(key.clone())))
        .policy(policy("keys", 1, Duration::from_secs(10)))
        .reject_with_errors()
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service_fn(|key: String| async move { Ok::<_, BoxError>(key) });
    svc.ready().await.unwrap().call(KEY.into()).await.unwrap();
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(KEY.into())
        .await
        .unwrap_err();
    let limited = err.downcast_ref::<RateLimited>().expect("RateLimited");
    check(format!(
        "{err} {err:?} {:?} {layer:?} {svc:?}",
        limited.decision()
    ));

    let limiter = Arc::new(Limiter::new(policy("keys", 1, Duration::from_secs(10))).unwrap());
    let _ = limiter.check(&KEY.to_string());
    let queues = Arc::new(tower_sliding_window::wait::WaitQueues::new(
        limiter.clone(),
        tower_sliding_window::WaitConfig::bounded(Duration::from_secs(1), 1).unwrap(),
    ));
    let rejected = queues.acquire(KEY.to_string(), 1).await.unwrap_err();
    check(format!("{limiter:?} {queues:?} {rejected} {rejected:?}"));
}

/// A store that answers later (like a remote one), wrapping a limiter, and
/// counting how many times it was asked.
#[derive(Clone)]
struct SlowStore {
    limiter: Arc<Limiter<String>>,
    asked: Arc<AtomicUsize>,
    down: bool,
    hang: bool,
    /// Down, but failing open: every check is allowed unchecked.
    fails_open: bool,
}

impl SlowStore {
    fn new(policy: Policy, down: bool) -> Self {
        SlowStore {
            limiter: Arc::new(Limiter::new(policy).unwrap()),
            asked: Arc::default(),
            down,
            hang: false,
            fails_open: false,
        }
    }
}

impl Store<String> for SlowStore {
    type Future = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

    fn check_n(&self, key: &String, cost: u32) -> Self::Future {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let (limiter, key, down, hang) = (self.limiter.clone(), key.clone(), self.down, self.hang);
        let open = self
            .fails_open
            .then(|| Decision::allow_unchecked(limiter.policy().limit()));
        Box::pin(async move {
            tokio::task::yield_now().await;
            if hang {
                std::future::pending::<()>().await;
            }
            if let Some(unchecked) = open {
                Ok(unchecked)
            } else if down {
                Err(StoreError::new(
                    tower_sliding_window::StoreErrorKind::ConnectionRefused,
                    Duration::from_millis(1500),
                ))
            } else {
                Ok(limiter.check_n(&key, cost))
            }
        })
    }

    fn undo(&self, key: &String, decision: &Decision) {
        self.limiter.undo(key, decision)
    }

    fn policy(&self) -> &Policy {
        self.limiter.policy()
    }
}

#[tokio::test(start_paused = true)]
async fn remote_stores_are_awaited_and_combined() {
    let a = SlowStore::new(policy("a", 2, Duration::from_secs(60)), false);
    let b = SlowStore::new(policy("b", 3, Duration::from_secs(60)), false);
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(a.clone())
        .store(b.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(ok_service());
    assert_eq!(status(&mut svc, request("u")).await.0, StatusCode::OK);
    assert_eq!(status(&mut svc, request("u")).await.0, StatusCode::OK);
    let (s, rate) = status(&mut svc, request("u")).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert!(rate.unwrap().starts_with("\"a\";r=0"));
    // b admitted the third request, then gave it back.
    assert_eq!(b.limiter.usage(&"u".to_owned()).used, 2);
    assert_eq!(a.asked.load(Ordering::Relaxed), 3);
}

/// A store that failed open knows nothing about the key: its `r=L;t=0` would
/// tell the client it has its whole quota. Headers report a policy that was
/// checked, or none.
#[tokio::test(start_paused = true)]
async fn a_store_that_fails_open_puts_no_rate_limit_fields_on_the_response() {
    let down = || {
        let mut store = SlowStore::new(policy("down", 5, Duration::from_secs(60)), true);
        store.fails_open = true;
        store
    };
    let alone = SlidingWindowLayer::builder(key_fn(user))
        .store(down())
        .headers_on_allowed(true)
        .build()
        .unwrap();
    let mut svc = alone.layer(ok_service());
    let response = svc.ready().await.unwrap().call(request("u")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    for name in ["ratelimit", "ratelimit-policy"] {
        assert!(
            !response.headers().contains_key(name),
            "{name}: {response:?}"
        );
    }

    // Beside a checked policy, the checked one is reported, even when both
    // have their whole quota left (a tie in share: a request of cost 0).
    let up = SlowStore::new(policy("up", 3, Duration::from_secs(60)), false);
    let both = SlidingWindowLayer::builder(key_fn(user))
        .store(down())
        .store(up)
        .cost(|req: &Request<Body>| u32::from(req.headers().contains_key("x-costs")))
        .headers_on_allowed(true)
        .build()
        .unwrap();
    let mut svc = both.layer(ok_service());
    let free = status(&mut svc, request("u")).await;
    assert_eq!(free, (StatusCode::OK, Some("\"up\";r=3;t=0".to_owned())));
    let mut costly = request("u");
    costly
        .headers_mut()
        .insert("x-costs", http::HeaderValue::from_static("1"));
    let costly = status(&mut svc, costly).await;
    // The unit leaves a minute after it, to a step of its bucket: 61 s in
    // whole seconds.
    assert_eq!(costly, (StatusCode::OK, Some("\"up\";r=2;t=61".to_owned())));
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_stores_decide_gives_its_units_back() {
    let quick = SlowStore::new(policy("quick", 5, Duration::from_secs(60)), false);
    let mut stuck = SlowStore::new(policy("stuck", 5, Duration::from_secs(60)), false);
    stuck.hang = true;
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(quick.clone())
        .store(stuck)
        .build()
        .unwrap();
    let mut svc = layer.layer(ok_service());
    let call = svc.ready().await.unwrap().call(request("u"));
    // The caller gives up (a client timeout, a closed connection).
    assert!(tokio::time::timeout(Duration::from_secs(1), call)
        .await
        .is_err());
    assert_eq!(quick.asked.load(Ordering::Relaxed), 1);
    assert_eq!(quick.limiter.usage(&"u".to_owned()).used, 0);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_cannot_decide_fails_closed_with_503() {
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(SlowStore::new(
            policy("down", 5, Duration::from_secs(60)),
            true,
        ))
        .build()
        .unwrap();
    let stats = layer.clone();
    let mut svc = layer.layer(ok_service());
    let response = svc.ready().await.unwrap().call(request("u")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(stats.stats().store_errors, 1);

    let mut grpc = request("u");
    grpc.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    let response = svc.ready().await.unwrap().call(grpc).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["grpc-status"], "14");
}

#[tokio::test(start_paused = true)]
async fn a_store_down_answer_leaves_out_the_retry_fields_the_layer_turned_off() {
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(SlowStore::new(
            policy("down", 5, Duration::from_secs(60)),
            true,
        ))
        .retry_after_header(false)
        .grpc_retry_pushback(false)
        .build()
        .unwrap();
    let mut svc = layer.layer(ok_service());
    let response = svc.ready().await.unwrap().call(request("u")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().get("retry-after").is_none());

    let mut grpc = request("u");
    grpc.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    let response = svc.ready().await.unwrap().call(grpc).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert!(response.headers().get("grpc-retry-pushback-ms").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_never_pass_the_tighter_policy_and_leave_no_stray_counts() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("tight", 7, Duration::from_secs(3600)))
        .policy(policy("loose", 1000, Duration::from_secs(3600)))
        .build()
        .unwrap();
    let stores = layer.clone();
    let svc = layer.layer(ok_service());
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request("u")).await.unwrap().status() })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        if task.await.unwrap() == StatusCode::OK {
            ok += 1;
        }
    }
    // Racing checks may both be denied near the limit (the safe side), never both admitted.
    assert!((1..=7).contains(&ok), "{ok} admitted");
    // Every denied request gave its unit back to the loose policy.
    let loose = stores.stores().nth(1).unwrap().usage(&());
    assert_eq!(loose.used, ok);
}

#[tokio::test(start_paused = true)]
async fn a_rejection_hook_that_sets_no_status_answers_with_the_layers() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("p", 1, Duration::from_secs(60)))
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .reject_with(|_: &RateLimited| Response::new("slow down".to_owned()))
        .build()
        .unwrap();
    let mut svc = layer.layer(ok_service());
    assert_eq!(status(&mut svc, request("u")).await.0, StatusCode::OK);
    let limited = svc.ready().await.unwrap().call(request("u")).await.unwrap();
    assert_eq!(limited.body(), "slow down");
    assert_eq!(limited.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(limited.headers().contains_key("retry-after"));

    // A 1xx cannot be a final response (hyper would not send it): the layer's too.
    let informational = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("p", 1, Duration::from_secs(60)))
        .reject_with(|_: &RateLimited| {
            let mut response = Response::new(String::new());
            *response.status_mut() = StatusCode::CONTINUE;
            response
        })
        .build()
        .unwrap();
    let mut svc = informational.layer(ok_service());
    assert_eq!(status(&mut svc, request("u")).await.0, StatusCode::OK);
    let limited = svc.ready().await.unwrap().call(request("u")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The one store type of a layer that mixes an in-memory limit with a remote
/// one (every store of a layer has one type): the local one answers through
/// `check_now`, the remote one only through `check_n`.
enum LocalOrRemote {
    Local(Box<Limiter<String>>),
    Remote(SlowStore),
}

impl Store<String> for LocalOrRemote {
    type Future = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

    fn check_n(&self, key: &String, cost: u32) -> Self::Future {
        match self {
            LocalOrRemote::Local(l) => Box::pin(std::future::ready(Ok(l.check_n(key, cost)))),
            LocalOrRemote::Remote(r) => r.check_n(key, cost),
        }
    }

    fn check_now(&self, key: &String, cost: u32) -> Option<Result<Decision, StoreError>> {
        match self {
            LocalOrRemote::Local(l) => Some(Ok(l.check_n(key, cost))),
            LocalOrRemote::Remote(_) => None,
        }
    }

    fn undo(&self, key: &String, decision: &Decision) {
        match self {
            LocalOrRemote::Local(l) => l.undo(key, decision),
            LocalOrRemote::Remote(r) => r.undo(key, decision),
        }
    }

    fn policy(&self) -> &Policy {
        match self {
            LocalOrRemote::Local(l) => l.policy(),
            LocalOrRemote::Remote(r) => r.policy(),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_response_future_dropped_before_its_first_poll_gives_its_units_back() {
    let remote = SlowStore::new(policy("remote", 5, Duration::from_secs(60)), false);
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(LocalOrRemote::Local(Box::new(
            Limiter::new(policy("local", 5, Duration::from_secs(60))).unwrap(),
        )))
        .store(LocalOrRemote::Remote(remote.clone()))
        .build()
        .unwrap();
    let stores = layer.clone();
    let mut svc = layer.layer(ok_service());
    // The local policy admits (and counts) at once inside `call`; the remote
    // one is asked in the response future. The caller drops that future
    // before polling it (a `select!` whose other branch won, a closed connection).
    let call = svc.ready().await.unwrap().call(request("u"));
    drop(call);
    let LocalOrRemote::Local(local) = stores.stores().next().unwrap() else {
        unreachable!()
    };
    assert_eq!(remote.asked.load(Ordering::Relaxed), 0);
    assert_eq!(
        local.usage(&"u".to_owned()).used,
        0,
        "the request never ran: the local policy must not keep its unit"
    );

    // Polled to the end, the same request is admitted and counted once by each.
    assert_eq!(status(&mut svc, request("u")).await.0, StatusCode::OK);
    assert_eq!(local.usage(&"u".to_owned()).used, 1);
    assert_eq!(remote.limiter.usage(&"u".to_owned()).used, 1);
}

#[test]
fn max_keys_zero_with_policies_is_a_configuration_error() {
    // `max_keys` beside `store()` no longer compiles (a store keeps its own
    // cap); with `policy()` it applies, and 0 is still reported.
    let zero = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("p", 5, Duration::from_secs(60)))
        .max_keys(0)
        .build();
    assert!(matches!(
        zero.unwrap_err(),
        tower_sliding_window::ConfigError::Zero {
            setting: "max_keys"
        }
    ));
}

#[test]
fn a_clock_applies_to_policies_in_either_order() {
    // `clock()` beside `store()` no longer compiles (a store keeps its own
    // clock). With policy() it applies, in either order: the limiters read
    // the clock given.
    let p = || policy("p", 1, Duration::from_secs(60));
    for (order, clock, layer) in [
        {
            let clock = tower_sliding_window::ManualClock::new();
            let layer = SlidingWindowLayer::builder(key_fn(user))
                .clock(clock.clone())
                .policy(p())
                .build();
            ("clock before policy", clock, layer)
        },
        {
            let clock = tower_sliding_window::ManualClock::new();
            let layer = SlidingWindowLayer::builder(key_fn(user))
                .policy(p())
                .clock(clock.clone())
                .build();
            ("clock after policy", clock, layer)
        },
    ] {
        let layer = layer.unwrap();
        let limiter = layer.stores().next().unwrap();
        let key = "u".to_owned();
        assert!(limiter.check(&key).is_allowed(), "{order}");
        assert!(!limiter.check(&key).is_allowed(), "{order}");
        // Only the manual clock moving lets the key through again.
        clock.advance(Duration::from_secs(65));
        assert!(
            limiter.check(&key).is_allowed(),
            "{order}: the clock was not used"
        );
    }
    // A store alone still builds.
    let store: Limiter<String, _> = Limiter::builder(p())
        .clock(tower_sliding_window::ManualClock::new())
        .build()
        .unwrap();
    assert!(SlidingWindowLayer::builder(key_fn(user))
        .store(store)
        .build()
        .is_ok());
}

#[test]
fn http_rejection_settings_before_reject_with_errors_are_a_configuration_error_not_ignored() {
    // In error mode a rejection is an error value: no status, no gRPC code, no
    // headers, no hook. Set before `reject_with_errors()` (the HTTP settings are
    // not callable after it) they would be dropped without a word, even an
    // invalid status or gRPC code that build() otherwise rejects.
    type UserKey =
        tower_sliding_window::extract::KeyFn<fn(&Request<Body>) -> Option<String>, String>;
    type Builder = tower_sliding_window::SlidingWindowLayerBuilder<
        UserKey,
        tower_sliding_window::layer::InMemory,
    >;
    let builder = || -> Builder {
        SlidingWindowLayer::builder(key_fn(user as fn(&Request<Body>) -> Option<String>))
            .policy(policy("p", 1, Duration::from_secs(60)))
    };
    let settings: Vec<(&str, Builder)> = vec![
        (
            "status(503)",
            builder().status(StatusCode::SERVICE_UNAVAILABLE),
        ),
        ("status(200)", builder().status(StatusCode::OK)),
        ("grpc_status(0)", builder().grpc_status(0)),
        ("grpc_status(14)", builder().grpc_status(14)),
        (
            "grpc_retry_pushback(false)",
            builder().grpc_retry_pushback(false),
        ),
        ("ietf_headers(false)", builder().ietf_headers(false)),
        (
            "retry_after_header(false)",
            builder().retry_after_header(false),
        ),
        ("legacy_headers(true)", builder().legacy_headers(true)),
        (
            "headers_on_allowed(true)",
            builder().headers_on_allowed(true),
        ),
    ];
    for (setting, builder) in settings {
        let layer = builder.reject_with_errors().build();
        assert!(
            matches!(
                layer,
                Err(tower_sliding_window::ConfigError::HttpSettingsIgnored)
            ),
            "{setting} before reject_with_errors() was accepted and ignored"
        );
    }
    let hooked = builder()
        .reject_with(|_: &RateLimited| Response::new(String::from("slow down")))
        .reject_with_errors()
        .build();
    assert!(
        matches!(
            hooked,
            Err(tower_sliding_window::ConfigError::HttpSettingsIgnored)
        ),
        "reject_with() before reject_with_errors() was accepted and ignored"
    );
    // Error mode alone still builds.
    assert!(builder().reject_with_errors().build().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_builder_can_be_held_across_an_await_in_a_spawned_task() {
    // Building a layer while a store connects (an `.await` with the builder
    // alive) in a spawned task needs the builder to be `Send`.
    fn send_sync<T: Send + Sync>(value: T) -> T {
        value
    }
    let built = tokio::spawn(async {
        let builder = send_sync(SlidingWindowLayer::builder(GlobalKey).dry_run(false));
        tokio::time::sleep(Duration::from_millis(10)).await; // a store connecting
        builder
            .store(Limiter::<()>::new(policy("p", 1, Duration::from_secs(60))).unwrap())
            .build()
            .map(|layer| layer.stores().len())
    })
    .await
    .unwrap();
    assert_eq!(built.unwrap(), 1);

    // A builder of in-memory limiters (its clock factory inside) too.
    let built = tokio::spawn(async {
        let builder = send_sync(
            SlidingWindowLayer::builder(GlobalKey)
                .on_limit(tower_sliding_window::OnLimit::Reject)
                .policy(policy("p", 1, Duration::from_secs(60))),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        builder
            .policy(policy("q", 5, Duration::from_secs(60)))
            .build()
            .map(|layer| layer.stores().len())
    })
    .await
    .unwrap();
    assert_eq!(built.unwrap(), 2);
}

/// A herd of clients denied at one instant is told to come back over the
/// spread, never before its cost fits: `Retry-After` (and `t`, and the gRPC
/// pushback) only ever grow, by at most the spread.
#[tokio::test(start_paused = true)]
async fn a_retry_after_spread_spreads_a_herd_and_never_shortens_a_wait() {
    let herd = |spread: Duration| {
        SlidingWindowLayer::builder(key_fn(user))
            .policy(policy("p", 1, Duration::from_secs(60)))
            .retry_after_spread(spread)
            .build()
            .unwrap()
            .layer(ok_service())
    };
    let retry_after = |response: &Response<Body>| -> u64 {
        response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    // Without a spread: one admitted, and every denial says 61 s (the
    // admission leaves a window of 60 s after it, to a step of its bucket,
    // rounded up to whole seconds).
    let mut exact = herd(Duration::ZERO);
    assert_eq!(status(&mut exact, request("a")).await.0, StatusCode::OK);
    let denied = exact
        .ready()
        .await
        .unwrap()
        .call(request("a"))
        .await
        .unwrap();
    assert_eq!(retry_after(&denied), 61);

    let mut spread = herd(Duration::from_secs(10));
    assert_eq!(status(&mut spread, request("a")).await.0, StatusCode::OK);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..500 {
        let response = spread
            .ready()
            .await
            .unwrap()
            .call(request("a"))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let wait = retry_after(&response);
        assert!((61..=71).contains(&wait), "Retry-After {wait}");
        let field = response.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert_eq!(field, format!("\"p\";r=0;t={wait}"), "t is Retry-After");
        seen.insert(wait);
    }
    assert!(seen.len() >= 9, "a herd of 500 came back at {seen:?}");

    // gRPC clients get the same spread in their pushback.
    let grpc = || {
        Request::builder()
            .header("x-user", "a")
            .header("content-type", "application/grpc")
            .body(String::new())
            .unwrap()
    };
    let pushback = |response: &Response<Body>| -> u64 {
        response.headers()["grpc-retry-pushback-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let exact_ms = pushback(&exact.ready().await.unwrap().call(grpc()).await.unwrap());
    for _ in 0..50 {
        let ms = pushback(&spread.ready().await.unwrap().call(grpc()).await.unwrap());
        assert!(
            (exact_ms..=exact_ms + 10_000).contains(&ms),
            "{ms} against {exact_ms}"
        );
    }
}

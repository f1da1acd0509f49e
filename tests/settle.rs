//! Reserve at admission, settle after the response: `count_if`, `settle` and
//! the `Settlement` handle, through the layer (tower services on a
//! `ManualClock`) and through axum servers on 127.0.0.1.

mod layer_support;

use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use hyper_util::rt::TokioIo;
use layer_support::{policy, request, user, Body as StringBody};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::{
    key_fn, ConfigError, Limiter, ManualClock, OnLimit, Policy, Settlement, SlidingWindowLayer,
    Store, Tiers, Unsettled, WaitConfig,
};

const MINUTE: Duration = Duration::from_secs(60);

/// A service answering with the status in the request's `x-status` header
/// (200 without one) and the headers `x-set-*` name (`x-set-x-used: 7`
/// answers `x-used: 7`).
fn echo() -> impl Service<
    Request<StringBody>,
    Response = Response<StringBody>,
    Error = Infallible,
    Future: Send,
> + Clone {
    service_fn(|req: Request<StringBody>| async move {
        let status = req
            .headers()
            .get("x-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(200);
        let mut response = Response::builder().status(status);
        for (name, value) in req.headers() {
            if let Some(set) = name.as_str().strip_prefix("x-set-") {
                response = response.header(set, value);
            }
        }
        Ok::<_, Infallible>(response.body(String::new()).unwrap())
    })
}

fn with(user_name: &str, headers: &[(&str, &str)]) -> Request<StringBody> {
    let mut req = request(user_name);
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        req.headers_mut()
            .insert(name, http::HeaderValue::from_str(value).unwrap());
    }
    req
}

type Layer<X> = SlidingWindowLayer<X, Limiter<String, ManualClock>>;

/// The units policy `i` of `layer` counts for `key`.
fn used_by<X: tower_sliding_window::extract::Keyed<Key = String>>(
    layer: &Layer<X>,
    i: usize,
    key: &str,
) -> u32 {
    layer.stores().nth(i).unwrap().usage(&key.to_owned()).used
}

fn tokens_used(_: StatusCode, headers: &HeaderMap) -> Option<u32> {
    headers.get("x-used")?.to_str().ok()?.parse().ok()
}

#[tokio::test]
async fn count_if_gives_back_the_responses_that_do_not_count() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("failures", 2, MINUTE))
        .clock(clock.clone())
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(echo());
    // Successes never count: many more than the limit pass.
    for _ in 0..10 {
        let response = svc.clone().oneshot(with("ada", &[])).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(used_by(&layer, 0, "ada"), 0);
    // Failures count, up to the limit.
    for _ in 0..2 {
        let response = svc
            .clone()
            .oneshot(with("ada", &[("x-status", "401")]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(used_by(&layer, 0, "ada"), 2);
    let refused = svc.clone().oneshot(with("ada", &[])).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Once the failures have left the window, successes pass again.
    clock.advance(MINUTE + Duration::from_secs(4));
    let response = svc.clone().oneshot(with("ada", &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn concurrent_requests_are_reserved_before_any_response() {
    // Ten requests in flight at once against a limit of 3: three reach the
    // service, whatever their responses will say.
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("failures", 3, MINUTE))
        .clock(clock)
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let gate = Arc::new(tokio::sync::Notify::new());
    let reached = Arc::new(AtomicU32::new(0));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn({
            let (gate, reached) = (gate.clone(), reached.clone());
            move |_req: Request<StringBody>| {
                let (gate, reached) = (gate.clone(), reached.clone());
                async move {
                    reached.fetch_add(1, SeqCst);
                    gate.notified().await;
                    let response = Response::builder().status(401).body(String::new());
                    Ok::<_, Infallible>(response.unwrap())
                }
            }
        }));
    let calls: Vec<_> = (0..10)
        .map(|_| tokio::spawn(svc.clone().oneshot(request("mallory"))))
        .collect();
    while reached.load(SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    gate.notify_waiters();
    let mut statuses = Vec::new();
    for call in calls {
        let status = call.await.unwrap().unwrap().status();
        statuses.push(status);
        gate.notify_waiters();
    }
    let admitted = statuses
        .iter()
        .filter(|&&s| s == StatusCode::UNAUTHORIZED)
        .count();
    assert_eq!(admitted, 3, "{statuses:?}");
    assert_eq!(reached.load(SeqCst), 3);
}

#[tokio::test]
async fn settle_gives_back_what_a_request_did_not_use_and_charges_its_excess() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .cost(|_: &Request<StringBody>| 10)
        .policy(policy("tokens", 100, MINUTE))
        .clock(clock.clone())
        .settle(tokens_used)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(echo());
    let call = |used_header: Option<&str>| {
        let headers: Vec<(&str, &str)> = used_header
            .map(|u| ("x-set-x-used", u))
            .into_iter()
            .collect();
        svc.clone().oneshot(with("k", &headers))
    };
    // Used 4 of the 10 reserved: 6 given back.
    assert_eq!(call(Some("4")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(used_by(&layer, 0, "k"), 4);
    // No usage header: the reservation stands.
    assert_eq!(call(None).await.unwrap().status(), StatusCode::OK);
    assert_eq!(used_by(&layer, 0, "k"), 14);
    // Used 120: 110 more charged, past the limit.
    assert_eq!(call(Some("120")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        layer
            .stores()
            .next()
            .unwrap()
            .peek(&"k".to_owned(), 0)
            .remaining(),
        0
    );
    let refused = call(Some("1")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Denied until the window is back under the limit: the 134 units all
    // leave one window after they were counted.
    clock.advance(MINUTE - Duration::from_secs(1));
    assert_eq!(
        call(Some("1")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(5));
    assert_eq!(call(Some("1")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(used_by(&layer, 0, "k"), 1);
}

#[tokio::test]
async fn every_policy_of_a_layer_is_settled() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .cost(|_: &Request<StringBody>| 5)
        .policies([
            policy("minute", 50, MINUTE),
            policy("hour", 200, 60 * MINUTE),
        ])
        .clock(clock)
        .settle(tokens_used)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(echo());
    let response = svc
        .clone()
        .oneshot(with("k", &[("x-set-x-used", "2")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!((used_by(&layer, 0, "k"), used_by(&layer, 1, "k")), (2, 2));
    let response = svc
        .clone()
        .oneshot(with("k", &[("x-set-x-used", "30")]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!((used_by(&layer, 0, "k"), used_by(&layer, 1, "k")), (32, 32));
}

#[tokio::test]
async fn the_handle_settles_from_the_handler_and_has_the_last_word() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .cost(|_: &Request<StringBody>| 10)
        .policy(policy("units", 100, MINUTE))
        .clock(clock)
        .count_if(|status, _| status.is_client_error())
        .settle_later()
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|req: Request<StringBody>| async move {
            let settlement = req.extensions().get::<Settlement>().unwrap().clone();
            assert_eq!(settlement.reserved(), 10);
            match req.headers().get("x-handle").map(|v| v.to_str().unwrap()) {
                Some("give-back") => settlement.give_back(),
                Some(n) => settlement.settle(n.parse().unwrap()),
                None => drop(settlement),
            }
            // A response that `count_if` would give back.
            Ok::<_, Infallible>(Response::builder().status(200).body(String::new()).unwrap())
        }));
    // The handle spoke (3): count_if (which would give all back) is not asked.
    svc.clone()
        .oneshot(with("k", &[("x-handle", "3")]))
        .await
        .unwrap();
    assert_eq!(used_by(&layer, 0, "k"), 3);
    // The handle charged 25 (15 past the reservation).
    svc.clone()
        .oneshot(with("k", &[("x-handle", "25")]))
        .await
        .unwrap();
    assert_eq!(used_by(&layer, 0, "k"), 28);
    svc.clone()
        .oneshot(with("k", &[("x-handle", "give-back")]))
        .await
        .unwrap();
    assert_eq!(used_by(&layer, 0, "k"), 28);
    // Dropped without a word: count_if decides (a 200: not counted).
    svc.clone().oneshot(with("k", &[])).await.unwrap();
    assert_eq!(used_by(&layer, 0, "k"), 28);
}

#[tokio::test]
async fn a_handle_after_the_response_replaces_what_the_response_settled() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .cost(|_: &Request<StringBody>| 10)
        .policy(policy("units", 100, MINUTE))
        .clock(clock)
        .settle(tokens_used)
        .settle_later()
        .build()
        .unwrap();
    let kept = Arc::new(std::sync::Mutex::new(None::<Settlement>));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn({
            let kept = kept.clone();
            move |req: Request<StringBody>| {
                *kept.lock().unwrap() = req.extensions().get::<Settlement>().cloned();
                async {
                    let response = Response::builder()
                        .header("x-used", "40")
                        .body(String::new());
                    Ok::<_, Infallible>(response.unwrap())
                }
            }
        }));
    svc.clone().oneshot(request("k")).await.unwrap();
    assert_eq!(used_by(&layer, 0, "k"), 40, "the response charged 30");
    let settlement = kept.lock().unwrap().take().unwrap();
    settlement.settle(12);
    assert_eq!(
        used_by(&layer, 0, "k"),
        12,
        "the charge and 18 of the reservation back"
    );
    settlement.settle(50);
    assert_eq!(used_by(&layer, 0, "k"), 50);
    settlement.give_back();
    assert_eq!(used_by(&layer, 0, "k"), 0);
}

#[tokio::test]
async fn errors_and_cancellations_keep_the_reservation_unless_told_otherwise() {
    let failing = service_fn(|req: Request<StringBody>| async move {
        if req.headers().contains_key("x-fail") {
            return Err::<Response<StringBody>, _>("inner failure");
        }
        std::future::pending::<()>().await;
        unreachable!()
    });
    for (unsettled, left) in [(Unsettled::Keep, 3), (Unsettled::GiveBack, 0)] {
        let layer = SlidingWindowLayer::builder(key_fn(user))
            .policy(policy("units", 10, MINUTE))
            .clock(ManualClock::new())
            .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
            .settle_on_error(unsettled)
            .settle_on_cancel(unsettled)
            .build()
            .unwrap();
        let svc = ServiceBuilder::new().layer(layer.clone()).service(failing);
        assert!(svc
            .clone()
            .oneshot(with("k", &[("x-fail", "1")]))
            .await
            .is_err());
        // Polled once, then dropped before any response.
        let mut svc2 = svc.clone();
        let future = svc2.ready().await.unwrap().call(request("k"));
        let mut future = Box::pin(future);
        assert!(futures_poll_once(future.as_mut()).is_pending());
        drop(future);
        // Called, and its response future dropped unpolled.
        drop(svc2.ready().await.unwrap().call(request("k")));
        assert_eq!(used_by(&layer, 0, "k"), left, "{unsettled:?}");
    }
}

fn futures_poll_once<F: std::future::Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    let waker = std::task::Waker::noop();
    future.poll(&mut Context::from_waker(waker))
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_reserved_when_admitted_and_settled_after_its_response() {
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("failures", 1, Duration::from_secs(1)))
        .on_limit(OnLimit::Wait(
            WaitConfig::bounded(Duration::from_secs(5), 8).unwrap(),
        ))
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(echo());
    let start = tokio::time::Instant::now();
    // A failure, then a success that waits for the failure to leave the
    // window, then another success that does not wait at all (the first
    // success gave its unit back).
    let failure = svc
        .clone()
        .oneshot(with("k", &[("x-status", "401")]))
        .await
        .unwrap();
    assert_eq!(failure.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        svc.clone().oneshot(request("k")).await.unwrap().status(),
        StatusCode::OK
    );
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert_eq!(
        svc.clone().oneshot(request("k")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(start.elapsed(), waited);
}

#[tokio::test]
async fn a_layer_of_tiers_settles_with_the_requests_tier() {
    let tiers = Tiers::builder()
        .limited("free", [Policy::per(2, MINUTE).unwrap()])
        .build()
        .unwrap();
    let by_tier = tower_sliding_window::tiered_key_fn(|req: &Request<StringBody>| {
        Some(("free".to_owned(), user(req)?))
    });
    let layer = SlidingWindowLayer::builder(by_tier)
        .tiers(tiers)
        .clock(ManualClock::new())
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(echo());
    for _ in 0..5 {
        assert_eq!(
            svc.clone().oneshot(request("k")).await.unwrap().status(),
            StatusCode::OK
        );
    }
    for _ in 0..2 {
        let failed = svc
            .clone()
            .oneshot(with("k", &[("x-status", "401")]))
            .await
            .unwrap();
        assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    }
    let refused = svc.clone().oneshot(request("k")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn settlement_needs_http_mode() {
    let built = SlidingWindowLayer::builder(key_fn(user))
        .policy(Policy::per(1, MINUTE).unwrap())
        .count_if(|_, _| true)
        .reject_with_errors()
        .build();
    assert!(matches!(built, Err(ConfigError::HttpSettingsIgnored)));
}

// Through axum, on 127.0.0.1.

fn caller(req: &Request<Body>) -> Option<String> {
    req.headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn post_to(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response<Bytes> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder().method("POST").uri(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req
        .body(http_body_util::Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn axum_counts_failed_logins_by_status() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(caller))
        .policy(policy("failed-logins", 3, Duration::from_secs(900)))
        .clock(clock.clone())
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/login",
            post(|body: String| async move {
                if body == "hunter2" {
                    StatusCode::NO_CONTENT
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer.clone());
    let addr = layer_support::serve(app).await;
    let login = |password: &'static str| post_to(addr, "/login", &[("x-user", "ada")], password);
    for _ in 0..6 {
        assert_eq!(login("hunter2").await.status(), StatusCode::NO_CONTENT);
    }
    for _ in 0..3 {
        assert_eq!(login("guess").await.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        login("hunter2").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(960));
    assert_eq!(login("hunter2").await.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn axum_settles_from_a_usage_header() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(caller))
        .cost(|_: &Request<Body>| 100)
        .policy(policy("tokens", 1000, MINUTE))
        .clock(clock)
        .settle(tokens_used)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/complete",
            post(|body: String| async move { ([("x-used", body)], "done") }),
        )
        .layer(layer.clone());
    let addr = layer_support::serve(app).await;
    let complete =
        |tokens: &'static str| post_to(addr, "/complete", &[("x-user", "key-1")], tokens);
    assert_eq!(complete("30").await.status(), StatusCode::OK);
    assert_eq!(used_by(&layer, 0, "key-1"), 30);
    assert_eq!(complete("900").await.status(), StatusCode::OK);
    assert_eq!(used_by(&layer, 0, "key-1"), 930);
    assert_eq!(complete("1").await.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A body of `chunks` frames of `tokens` each that settles the request at
/// its end with the tokens it sent.
struct Metered {
    left: u32,
    tokens: u32,
    sent: u32,
    settlement: Option<Settlement>,
}

impl hyper::body::Body for Metered {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            if let Some(settlement) = self.settlement.take() {
                settlement.settle(self.sent);
            }
            return Poll::Ready(None);
        }
        self.left -= 1;
        self.sent += self.tokens;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"token ")))))
    }
}

#[tokio::test]
async fn axum_a_streamed_body_settles_at_its_end() {
    let clock = ManualClock::new();
    let layer = SlidingWindowLayer::builder(key_fn(caller))
        .cost(|_: &Request<Body>| 50)
        .policy(policy("tokens", 1000, MINUTE))
        .clock(clock)
        .settle_later()
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/stream",
            post(
                |Extension(settlement): Extension<Settlement>, body: String| async move {
                    let chunks = body.parse().unwrap_or(0);
                    Body::new(Metered {
                        left: chunks,
                        tokens: 7,
                        sent: 0,
                        settlement: Some(settlement),
                    })
                },
            ),
        )
        .layer(layer.clone());
    let addr = layer_support::serve(app).await;
    let response = post_to(addr, "/stream", &[("x-user", "key-1")], "20").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.body().len(), 20 * 6);
    // The body ended (the client read it all): settled to 140, 90 past the
    // reservation of 50.
    assert_eq!(used_by(&layer, 0, "key-1"), 140);
    let response = post_to(addr, "/stream", &[("x-user", "key-1")], "2").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(used_by(&layer, 0, "key-1"), 154);
}

#[test]
fn a_store_on_the_default_charge_counts_nothing() {
    struct Plain(Limiter<String, ManualClock>);
    impl Store<String> for Plain {
        type Future = <Limiter<String, ManualClock> as Store<String>>::Future;
        fn check_n(&self, key: &String, cost: u32) -> Self::Future {
            Store::check_n(&self.0, key, cost)
        }
        fn undo(&self, key: &String, decision: &tower_sliding_window::Decision) {
            self.0.undo(key, decision)
        }
        fn policy(&self) -> &Policy {
            self.0.policy()
        }
    }
    let plain = Plain(
        Limiter::builder(Policy::per(5, MINUTE).unwrap())
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    assert!(plain.charge(&"k".to_owned(), 3).is_none());
    assert_eq!(plain.0.usage(&"k".to_owned()).used, 0);
}

/// The most of `times` in any interval of length `window`.
fn most_in_any_window(times: &mut [tokio::time::Instant], window: Duration) -> usize {
    times.sort();
    let (mut most, mut first) = (0, 0);
    for last in 0..times.len() {
        while times[last] - times[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

#[tokio::test(start_paused = true)]
async fn two_hundred_concurrent_failed_logins_admit_five_and_never_lock_out_a_success_for_long() {
    const LIMIT: u32 = 5;
    const WINDOW: Duration = Duration::from_secs(60);
    // 15 buckets of 4 s: a unit leaves the span at most a bucket after W.
    const SPAN: Duration = Duration::from_secs(64);
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("failed-logins", LIMIT, WINDOW))
        .clock(tower_sliding_window::clock::TokioClock::new())
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let svc = ServiceBuilder::new().layer(layer).service(service_fn({
        let failures = failures.clone();
        move |req: Request<StringBody>| {
            let failures = failures.clone();
            async move {
                if req.body() == "right" {
                    return Ok::<_, Infallible>(Response::new(String::new()));
                }
                failures.lock().unwrap().push(tokio::time::Instant::now());
                // Checking a password hash takes a while: the request stays
                // in flight while the others arrive.
                tokio::time::sleep(Duration::from_millis(250)).await;
                let response = Response::builder().status(401).body(String::new());
                Ok(response.unwrap())
            }
        }
    }));
    // (time, refused) of every success, and when each failure reached the
    // handler.
    let mut successes = Vec::new();
    let start = tokio::time::Instant::now();
    for round in 0..4u32 {
        // 200 wrong passwords at once, successes interleaved with them.
        let mut calls = Vec::new();
        for i in 0..220 {
            let password = if i % 11 == 5 { "right" } else { "wrong" };
            let req = Request::builder()
                .header("x-user", "ada")
                .body(password.to_owned())
                .unwrap();
            let call = svc.clone().oneshot(req);
            calls.push((password, tokio::spawn(call)));
        }
        for (password, call) in calls {
            let status = call.await.unwrap().unwrap().status();
            if password == "right" {
                successes.push((
                    tokio::time::Instant::now(),
                    status == StatusCode::TOO_MANY_REQUESTS,
                ));
            } else {
                assert_ne!(status, StatusCode::OK);
            }
        }
        // Successes one by one as time passes, across the failures' window.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(4) + Duration::from_millis(round.into()))
                .await;
            let right = Request::builder()
                .header("x-user", "ada")
                .body("right".to_owned())
                .unwrap();
            let status = svc.clone().oneshot(right).await.unwrap().status();
            successes.push((
                tokio::time::Instant::now(),
                status == StatusCode::TOO_MANY_REQUESTS,
            ));
        }
    }
    let mut failed = failures.lock().unwrap().clone();
    assert_eq!(
        failed.len(),
        4 * LIMIT as usize,
        "five per round, each round a window apart"
    );
    assert_eq!(most_in_any_window(&mut failed, WINDOW), LIMIT as usize);
    // A success is refused only while failures admitted within the span
    // fill it; once they have left, never.
    for &(at, refused) in &successes {
        let recent = failed.iter().filter(|&&f| f <= at && at - f < SPAN).count();
        if recent == 0 {
            assert!(
                !refused,
                "a success at {:?} was refused with no failure in the window",
                at - start
            );
        }
        if refused {
            assert_eq!(recent, LIMIT as usize, "refused at {:?}", at - start);
        }
    }
    assert!(
        successes.iter().any(|&(_, refused)| refused),
        "the failures did lock the key for a while"
    );
    // Each round, the successes after the failures' span (64 s of 80).
    assert!(successes.iter().filter(|&&(_, refused)| !refused).count() >= 4 * 4);
}

#[tokio::test]
async fn a_dry_run_settles_what_it_admits_and_nothing_else() {
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .policy(policy("failures", 2, MINUTE))
        .clock(ManualClock::new())
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        .dry_run(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(echo());
    // Successes are given back; failures count, up to the limit.
    for _ in 0..3 {
        let ok = svc.clone().oneshot(with("k", &[])).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    assert_eq!(used_by(&layer, 0, "k"), 0);
    // Four failures: two counted, two would-be rejections forwarded, which
    // counted nothing and settle nothing.
    for _ in 0..4 {
        let failed = svc
            .clone()
            .oneshot(with("k", &[("x-status", "401")]))
            .await
            .unwrap();
        assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(used_by(&layer, 0, "k"), 2);
    assert_eq!(layer.stats().dry_run_rejections, 2);
}

//! The layer's waiting modes on tokio's paused clock: `OnLimit::Wait` (keyed, in
//! the response future) and `OnLimit::Backpressure` (global, in `poll_ready`).
//! Policies of 1.5 s use 15 buckets of 100 ms, so that every bucket boundary
//! is a whole millisecond.

use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::extract::KeyFn;
use tower_sliding_window::{
    key_fn, ConfigError, GlobalKey, MissingKey, OnLimit, Policy, SlidingWindowLayer, WaitConfig,
};

/// A unit counted at a whole millisecond leaves a window of 1.5 s 1.5 s
/// later, to a step of its 100 ms bucket (1.526 µs): a request waiting for
/// it passes at the timer's next millisecond, this many after it.
const TURN: u64 = 1501;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `limit` per `window_ms`, in 15 buckets.
fn per(limit: u32, window_ms: u64) -> Policy {
    Policy::builder()
        .limit(limit)
        .window(ms(window_ms))
        .buckets(15)
        .build()
        .unwrap()
}

fn named(name: &str, limit: u32, window_ms: u64) -> Policy {
    per(limit, window_ms).with_name(name)
}

type Served = Arc<Mutex<Vec<(String, Instant)>>>;

/// An inner service that logs (key header, instant) of each request it serves.
fn inner(
    served: &Served,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    let served = served.clone();
    service_fn(move |req: Request<()>| {
        let key = req
            .headers()
            .get("x-key")
            .map_or("", |v| v.to_str().unwrap())
            .to_owned();
        served.lock().unwrap().push((key, Instant::now()));
        async { Ok::<_, Infallible>(Response::new(String::new())) }
    })
}

fn request(key: &str) -> Request<()> {
    Request::builder().header("x-key", key).body(()).unwrap()
}

fn by_key(req: &Request<()>) -> Option<String> {
    req.headers()
        .get("x-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

type ByKey = KeyFn<fn(&Request<()>) -> Option<String>, String>;

fn keyed() -> ByKey {
    key_fn(by_key as fn(&Request<()>) -> Option<String>)
}

/// A layer keyed by `x-key` that waits up to 10 s, behind up to 15 others.
fn waiting(limit: u32) -> SlidingWindowLayer<ByKey> {
    SlidingWindowLayer::builder(keyed())
        .policy(per(limit, 1500))
        .on_limit(OnLimit::Wait(WaitConfig::bounded(ms(10_000), 16).unwrap()))
        .build()
        .unwrap()
}

/// A global limit of `limit` per 1.5 s, held back in `poll_ready`.
fn backpressured(limit: u32) -> SlidingWindowLayer<GlobalKey> {
    SlidingWindowLayer::builder(GlobalKey)
        .policy(per(limit, 1500))
        .backpressure()
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn waiting_requests_are_served_in_turn_and_a_too_long_wait_is_rejected_at_once() {
    let start = Instant::now();
    let layer = SlidingWindowLayer::builder(keyed())
        .policy(per(2, 1500))
        .on_limit(OnLimit::Wait(WaitConfig::bounded(ms(2000), 16).unwrap()))
        .build()
        .unwrap();
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));

    let mut calls = Vec::new();
    for _ in 0..5 {
        // `call` joins the queue: arrival order is call order.
        let mut svc = svc.clone();
        let response = svc.ready().await.unwrap().call(request("a"));
        calls.push(tokio::spawn(async move {
            let response = response.await.unwrap();
            (response.status(), Instant::now(), response)
        }));
    }
    let other = svc.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another key is not held back"
    );

    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.unwrap());
    }
    let statuses: Vec<StatusCode> = results.iter().map(|r| r.0).collect();
    assert_eq!(statuses[..4], [StatusCode::OK; 4]);
    // Its turn would come two turns on (3.002 s), past max_wait: 429 at once,
    // saying when.
    let (status, at, rejected) = &results[4];
    assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(*at, start);
    assert_eq!(rejected.headers()["retry-after"], "4");

    let served = served.lock().unwrap().clone();
    let a: Vec<Instant> = served.iter().filter(|s| s.0 == "a").map(|s| s.1).collect();
    assert_eq!(a, [0, 0, TURN, TURN].map(|t| start + ms(t)));
    let stats = layer.wait_stats();
    assert_eq!(
        (stats.admitted_after_wait, stats.rejected_wait_too_long),
        (2, 1)
    );
    assert_eq!(stats.timers_created, 1);
    assert_eq!(stats.keys_waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_while_waiting_lets_the_next_one_in_earlier() {
    let start = Instant::now();
    let layer = waiting(1);
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    svc.clone().oneshot(request("a")).await.unwrap();
    // Queued for 1.501 s and 3.002 s.
    let first = tokio::spawn(svc.clone().oneshot(request("a")));
    tokio::task::yield_now().await;
    let second = tokio::spawn(svc.clone().oneshot(request("a")));
    tokio::task::yield_now().await;
    tokio::time::advance(ms(100)).await;
    first.abort(); // the client went away
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(served.lock().unwrap()[1].1, start + ms(TURN));
    assert_eq!(layer.wait_stats().cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn several_policies_admit_a_waiter_when_all_of_them_allow() {
    let start = Instant::now();
    let layer = SlidingWindowLayer::builder(keyed())
        .policy(named("burst", 2, 300))
        .policy(named("steady", 3, 1500))
        .on_limit(OnLimit::Wait(WaitConfig::bounded(ms(60_000), 16).unwrap()))
        .build()
        .unwrap();
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    let calls: Vec<_> = (0..7)
        .map(|_| {
            let mut svc = svc.clone();
            svc.call(request("k"))
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().status(), StatusCode::OK);
    }
    let at: Vec<Instant> = served.lock().unwrap().iter().map(|s| s.1).collect();
    // "burst" frees its units 300 ms after they were counted, "steady"
    // 1.5 s after (each to a step of its bucket): each request passes when
    // both allow it, at the timer's next millisecond.
    assert_eq!(
        at,
        [0, 0, 301, 1501, 1501, 1802, 3002].map(|t| start + ms(t))
    );
    for limiter in layer.stores() {
        assert!(limiter.usage(&"k".to_owned()).used <= limiter.policy().limit());
    }
}

#[tokio::test(start_paused = true)]
async fn every_clone_of_a_backpressured_service_makes_progress() {
    let start = Instant::now();
    let layer = backpressured(2);
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let mut svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..2 {
                let response = svc
                    .ready()
                    .await
                    .unwrap()
                    .call(request(&i.to_string()))
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let served = served.lock().unwrap().clone();
    assert_eq!(served.len(), 12, "every waiter progressed");
    for (n, (_, at)) in served.iter().enumerate() {
        assert_eq!(*at, start + ms(n as u64 / 2 * TURN), "two per turn");
    }
    for i in 0..6 {
        let key = i.to_string();
        assert_eq!(served.iter().filter(|s| s.0 == key).count(), 2);
    }
    let stats = layer.wait_stats();
    assert!(stats.timers_created <= stats.admitted_after_wait);
}

#[tokio::test(start_paused = true)]
async fn a_reservation_not_used_by_call_is_given_back() {
    let layer = backpressured(1);
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    let limiter = layer.stores().next().unwrap();

    let mut ready = svc.clone();
    ready.ready().await.unwrap();
    assert_eq!(limiter.usage(&()).used, 1, "poll_ready reserved the unit");

    // A clone of a ready service starts without a reservation: the window is full.
    let mut clone = ready.clone();
    let pending = poll_fn(|cx| Poll::Ready(clone.poll_ready(cx).is_pending())).await;
    assert!(pending);

    drop(ready); // never called
    assert_eq!(limiter.usage(&()).used, 0, "the unit is back");
    // The waiting clone takes it at once.
    let start = Instant::now();
    let response = clone
        .ready()
        .await
        .unwrap()
        .call(request("x"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(Instant::now(), start);
    assert_eq!(limiter.usage(&()).used, 1);
}

#[tokio::test(start_paused = true)]
async fn call_without_poll_ready_waits_its_turn_instead_of_panicking() {
    let start = Instant::now();
    let layer = backpressured(1);
    let served = Served::default();
    let mut svc = ServiceBuilder::new().layer(layer).service(inner(&served));
    let a = svc.call(request("1"));
    let b = svc.call(request("2"));
    assert_eq!(a.await.unwrap().status(), StatusCode::OK);
    assert_eq!(b.await.unwrap().status(), StatusCode::OK);
    let at: Vec<Instant> = served.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(at, [start, start + ms(TURN)]);
}

#[test]
fn a_wait_queue_of_no_place_is_a_configuration_error() {
    // Backpressure on a keyed layer, or waiting with a remote store, does not
    // compile (tests/compile/fail).
    let no_queue = WaitConfig::bounded(ms(100), 0);
    assert!(matches!(
        no_queue,
        Err(ConfigError::Zero {
            setting: "max_queue"
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_never_holds_a_request_back() {
    let layer = SlidingWindowLayer::builder(keyed())
        .policy(per(1, 1500))
        .on_limit(OnLimit::Wait(WaitConfig::bounded(ms(10_000), 16).unwrap()))
        .dry_run(true)
        .build()
        .unwrap();
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    let start = Instant::now();
    for _ in 0..3 {
        let response = svc.clone().oneshot(request("a")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(Instant::now(), start, "nothing waited");
    assert_eq!(layer.stats().dry_run_rejections, 2);
    assert_eq!(layer.wait_stats().admitted_after_wait, 0);
}

/// In an axum app, where every request reaches the layer through a fresh clone
/// (`oneshot`), backpressure still serves every request in turn.
#[tokio::test(start_paused = true)]
async fn an_axum_app_with_backpressure_serves_every_request_in_turn() {
    use axum::{body::Body, routing::get, Router};
    let start = Instant::now();
    let layer = backpressured(2);
    let served = Served::default();
    let log = served.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push((String::new(), Instant::now()));
                    "ok"
                }
            }),
        )
        .layer(layer);
    let calls: Vec<_> = (0..5)
        .map(|_| {
            tokio::spawn(
                app.clone()
                    .oneshot(Request::get("/").body(Body::empty()).unwrap()),
            )
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    let at: Vec<Instant> = served.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(at, [0, 0, TURN, TURN, 2 * TURN].map(|t| start + ms(t)));
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_holds_none_of_the_inner_services_capacity() {
    let layer = waiting(1);
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(inner(&served));
    svc.clone().oneshot(request("a")).await.unwrap();
    // a's second request waits for its turn (1.501 s)...
    let start = Instant::now();
    let waiting = tokio::spawn(svc.clone().oneshot(request("a")));
    tokio::task::yield_now().await;
    // ...while b, within its own limit, gets the one inner slot at once.
    let b = svc.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    assert_eq!(Instant::now() - start, Duration::ZERO);
    assert_eq!(waiting.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(Instant::now() - start, ms(TURN));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_admitted_with_a_batch_but_polled_late_waits_again() {
    let start = Instant::now();
    let layer = waiting(2);
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    for _ in 0..2 {
        svc.clone().oneshot(request("a")).await.unwrap();
    }
    let mut s1 = svc.clone();
    s1.ready().await.unwrap();
    let f1 = s1.call(request("a"));
    let mut s2 = svc.clone();
    s2.ready().await.unwrap();
    let f2 = s2.call(request("a")); // queued behind f1, both due at 1.501 s
    tokio::spawn(f1).await.unwrap().unwrap(); // the head admits both at 1.501 s
                                              // f2 is not polled until its units have left the window...
    tokio::time::sleep_until(start + ms(2 * TURN)).await;
    for _ in 0..2 {
        let r = svc.clone().oneshot(request("a")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    // ...so it waits for a unit of its own rather than going through now.
    assert_eq!(f2.await.unwrap().status(), StatusCode::OK);
    let stats = layer.wait_stats();
    assert_eq!(stats.undone, 1);
    assert_eq!(stats.admitted_after_wait, 3);
    let at: Vec<Duration> = served.lock().unwrap().iter().map(|s| s.1 - start).collect();
    assert_eq!(at.len(), 6);
    for (i, t) in at.iter().enumerate() {
        let in_window = at[i..].iter().filter(|u| **u - *t < ms(1500)).count();
        assert!(
            in_window <= 2,
            "{in_window} forwarded within 1.5 s of {t:?}: {at:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_max_wait_too_long_for_an_instant_means_no_bound() {
    let layer = SlidingWindowLayer::builder(keyed())
        .policy(per(1, 1500))
        .on_limit(OnLimit::Wait(
            WaitConfig::bounded(Duration::MAX, 16).unwrap(),
        ))
        .build()
        .unwrap();
    let served = Served::default();
    let svc = ServiceBuilder::new().layer(layer).service(inner(&served));
    svc.clone().oneshot(request("a")).await.unwrap();
    let start = Instant::now();
    let second = tokio::spawn(svc.clone().oneshot(request("a")));
    let r = second.await.expect("call must not panic").unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(Instant::now() - start, ms(TURN));
}

#[tokio::test(start_paused = true)]
async fn backpressure_gives_back_the_unit_an_exempt_request_was_readied_with() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(per(1, 1500))
        .backpressure()
        .exempt(|req: &Request<()>| req.headers().contains_key("x-health"))
        .build()
        .unwrap();
    let served = Served::default();
    let mut svc = ServiceBuilder::new().layer(layer).service(inner(&served));
    svc.ready().await.unwrap().call(request("a")).await.unwrap();
    // poll_ready cannot see that the next request is exempt: it waits for a unit...
    let start = Instant::now();
    let health = Request::builder().header("x-health", "1").body(()).unwrap();
    svc.ready().await.unwrap().call(health).await.unwrap();
    assert_eq!(Instant::now() - start, ms(TURN));
    // ...which the exempt call gives back, so another clone takes it at once.
    let ready_at = Instant::now();
    svc.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(Instant::now() - ready_at, Duration::ZERO);
    assert_eq!(served.lock().unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_reused_service_over_a_concurrency_limit_serves_its_waiting_request() {
    let layer = waiting(1);
    let served = Served::default();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(inner(&served));
    let start = Instant::now();
    for _ in 0..2 {
        // One instance, ready then call: the second request waits for its turn
        // and then needs the permit the readied instance would otherwise keep.
        let call = svc.ready().await.unwrap().call(request("a"));
        let response = tokio::time::timeout(ms(5000), call).await.expect("hung");
        assert_eq!(response.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(Instant::now() - start, ms(TURN));
}

/// Like `inner`, but a request with `x-hold-until-ms: T` answers only at
/// `start + T` (holding a `ConcurrencyLimit` permit until then).
fn holding_inner(
    served: &Served,
    start: Instant,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    let served = served.clone();
    service_fn(move |req: Request<()>| {
        let key = req
            .headers()
            .get("x-key")
            .map_or("", |v| v.to_str().unwrap())
            .to_owned();
        let hold = req
            .headers()
            .get("x-hold-until-ms")
            .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
        served.lock().unwrap().push((key, Instant::now()));
        async move {
            if let Some(t) = hold {
                tokio::time::sleep_until(start + ms(t)).await;
            }
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    })
}

fn holding(key: &str, until_ms: u64) -> Request<()> {
    Request::builder()
        .header("x-key", key)
        .header("x-hold-until-ms", until_ms.to_string())
        .body(())
        .unwrap()
}

/// `layer` in front of [`holding_inner`], which takes one request at a time
/// (`concurrency_limit(1)`): a request admitted after waiting may be sent
/// later, when another key's request lets the inner service go.
fn one_at_a_time(
    layer: SlidingWindowLayer<ByKey>,
    served: &Served,
    start: Instant,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(holding_inner(served, start))
}

/// 1 per 1.5 s, the inner service one request at a time: key a's first
/// request at 0; its second waits for its turn (1.501 s) while key b's
/// request, sent at `b_at` ms, holds the inner service until `b_until` ms;
/// a's third is sent at `third_at` ms. Every request is served; the instants
/// a's requests were forwarded at.
async fn a_second_request_held_by_b(b_at: u64, b_until: u64, third_at: u64) -> Vec<Duration> {
    let start = Instant::now();
    let served = Served::default();
    let svc = one_at_a_time(waiting(1), &served, start);
    svc.clone().oneshot(request("a")).await.unwrap();
    let second = tokio::spawn(svc.clone().oneshot(request("a")));
    tokio::time::sleep_until(start + ms(b_at)).await;
    let slow = tokio::spawn(svc.clone().oneshot(holding("b", b_until)));
    tokio::time::sleep_until(start + ms(third_at)).await;
    let third = tokio::spawn(svc.clone().oneshot(request("a")));
    for call in [second, slow, third] {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    times_of(&served, "a", start)
}

#[tokio::test(start_paused = true)]
async fn a_request_admitted_after_waiting_but_forwarded_late_keeps_the_window() {
    // b holds the inner service from 100 ms until 3 s; a's third request
    // arrives after the second was admitted (its turn: 3.002 s).
    let at = a_second_request_held_by_b(100, 3000, 1700).await;
    assert_eq!(at.len(), 3);
    for (i, t) in at.iter().enumerate() {
        let in_window = at[i..].iter().filter(|u| **u - *t < ms(1500)).count();
        assert!(
            in_window <= 1,
            "{in_window} requests of key a forwarded within 1.5 s of {t:?}: {at:?}"
        );
    }
}

/// A request admitted after waiting but sent later in the same bucket (the
/// inner service was busy) counts from when it was sent: the next request
/// waits a window from then, not from its admission.
#[tokio::test(start_paused = true)]
async fn a_request_sent_later_in_the_bucket_it_was_admitted_in_counts_from_its_sending() {
    // b holds the inner service from 1.4 s to 1.55 s: a's second request is
    // sent at 1.55 s, in its bucket (1.5 s to 1.6 s). a's third, sent at
    // 1.6 s, waits for the second's unit to leave: a window after it was
    // sent, at the timer's next millisecond (3.051 s); counted from its
    // admission it would pass at 3.002 s, 1.452 s after the second was sent.
    let at = a_second_request_held_by_b(1400, 1550, 1600).await;
    assert_eq!(at, [ms(0), ms(1550), ms(3051)]);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_after_its_turn_but_before_it_was_sent_gives_its_unit_back() {
    // 1 per 1.5 s. The inner service takes one request at a time.
    let start = Instant::now();
    let served = Served::default();
    let layer = waiting(1);
    let svc = one_at_a_time(layer.clone(), &served, start);
    // a's first request, at 0.
    svc.clone().oneshot(request("a")).await.unwrap();
    // a's second request is admitted at 1.501 s, then waits for the inner
    // service...
    let second = tokio::spawn(tokio::time::timeout(
        ms(2000),
        svc.clone().oneshot(request("a")),
    ));
    tokio::task::yield_now().await;
    // ...which another key's request holds from 100 ms to 2.1 s; a's client
    // gives up at 2 s, before its request was ever sent.
    tokio::time::sleep_until(start + ms(100)).await;
    let slow = tokio::spawn(svc.clone().oneshot(holding("b", 2100)));
    assert!(
        second.await.unwrap().is_err(),
        "the second request cannot have been served"
    );
    // The second request never reached the inner service: its unit is free again,
    // so a third one is admitted at once and served when the inner service frees.
    let third = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
    let a = times_of(&served, "a", start);
    assert_eq!(a, [ms(0), ms(2100)], "{:?}", layer.wait_stats());
}

#[tokio::test(start_paused = true)]
async fn backpressure_gives_back_the_unit_a_request_without_key_was_readied_with() {
    // A global limit (key `()`) whose extractor finds no key on some requests;
    // those are forwarded uncounted (MissingKey::Allow).
    let layer = SlidingWindowLayer::builder(key_fn(|req: &Request<()>| {
        (!req.headers().contains_key("x-anonymous")).then_some(())
    }))
    .policy(per(1, 1500))
    .backpressure()
    .missing_key(MissingKey::Allow)
    .build()
    .unwrap();
    let served = Served::default();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    let limiter = layer.stores().next().unwrap();
    // poll_ready reserves the only unit; the request turns out to have no key.
    let anonymous = Request::builder()
        .header("x-anonymous", "1")
        .body(())
        .unwrap();
    let response = svc.ready().await.unwrap().call(anonymous).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Forwarded uncounted: nothing stays counted for it, and another clone is
    // served at once.
    assert_eq!(limiter.usage(&()).used, 0, "the unit is back");
    let start = Instant::now();
    svc.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(Instant::now() - start, Duration::ZERO);
}

/// An inner service each of whose clones must connect before it is ready: a
/// fresh clone's first `poll_ready` takes 300 ms (three of the layer's buckets).
struct Connecting {
    served: Served,
    connected: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Clone for Connecting {
    fn clone(&self) -> Self {
        Connecting {
            served: self.served.clone(),
            connected: None, // a new connection
        }
    }
}

impl Service<Request<()>> for Connecting {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        let connected = self
            .connected
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(ms(300))));
        std::future::Future::poll(connected.as_mut(), cx).map(Ok)
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        let id = req.headers()["x-id"].to_str().unwrap().to_owned();
        self.served.lock().unwrap().push((id, Instant::now()));
        std::future::ready(Ok(Response::new(String::new())))
    }
}

fn connecting(served: &Served) -> Connecting {
    Connecting {
        served: served.clone(),
        connected: None,
    }
}

/// A response, or the timeout that came first.
type Answer = Result<Result<Response<String>, Infallible>, tokio::time::error::Elapsed>;

/// Requests `ids` of key `a`, sent at once, each answered within 30 s or
/// reported as timed out.
fn send_in_order<S>(svc: &S, ids: &[&str]) -> Vec<tokio::task::JoinHandle<Answer>>
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    ids.iter()
        .map(|id| {
            let req = Request::builder()
                .header("x-key", "a")
                .header("x-id", *id)
                .body(())
                .unwrap();
            tokio::spawn(tokio::time::timeout(ms(30_000), svc.clone().oneshot(req)))
        })
        .collect()
}

/// When each request reached the inner service (by the name it logged), from `start`.
fn served_at(served: &Served, start: Instant) -> Vec<(String, Duration)> {
    let log = served.lock().unwrap();
    log.iter().map(|s| (s.0.clone(), s.1 - start)).collect()
}

/// When `key`'s requests reached the inner service, from `start`.
fn times_of(served: &Served, key: &str, start: Instant) -> Vec<Duration> {
    let log = served.lock().unwrap();
    log.iter()
        .filter(|s| s.0 == key)
        .map(|s| s.1 - start)
        .collect()
}

/// `(name, milliseconds)` pairs as [`served_at`] reports them.
fn expected_at(pairs: &[(&str, u64)]) -> Vec<(String, Duration)> {
    pairs
        .iter()
        .map(|&(id, t)| (id.to_owned(), ms(t)))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn requests_whose_inner_service_is_ready_only_after_their_bucket_are_all_served_in_order() {
    // 1 per 1.5 s in 100 ms buckets; every clone of the inner service takes
    // 300 ms to be ready, so each waiter is ready only after its bucket.
    let start = Instant::now();
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(waiting(1))
        .service(connecting(&served));
    for call in send_in_order(&svc, &["a1", "a2", "a3"]) {
        let response = call.await.unwrap().unwrap_or_else(|_| {
            let at = served_at(&served, start);
            panic!("not served within 30 s; served: {at:?}")
        });
        assert_eq!(response.unwrap().status(), StatusCode::OK);
    }
    // a1 at 0.3 s (admitted again when ready); a2 admitted a turn after that,
    // at 1.801 s, ready (and admitted again at once, its unit given back) at
    // 2.101 s; a3 then waits for a2's unit: admitted a turn later, at 3.602 s,
    // ready and admitted again at 3.902 s.
    assert_eq!(
        served_at(&served, start),
        expected_at(&[("a1", 300), ("a2", 2101), ("a3", 3902)])
    );
}

#[tokio::test(start_paused = true)]
async fn requests_whose_inner_service_is_ready_only_after_their_window_are_all_served() {
    // 1 per 150 ms in 10 ms buckets: a unit leaves the window 150 ms after it
    // was counted (to a step of its bucket: a waiter passes at the timer's
    // next millisecond), before a fresh clone of the inner service is ready
    // (300 ms).
    let start = Instant::now();
    let served = Served::default();
    let layer = SlidingWindowLayer::builder(keyed())
        .policy(per(1, 150))
        .on_limit(OnLimit::Wait(WaitConfig::bounded(ms(10_000), 16).unwrap()))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(connecting(&served));
    let mut outcomes = Vec::new();
    for call in send_in_order(&svc, &["a1", "a2", "a3"]) {
        outcomes.push(call.await.unwrap().is_ok());
    }
    let at = served_at(&served, start);
    // Neither served nor rejected (max_wait is 10 s) within 30 s: a2 and a3 take
    // each other's unit while their fresh clones connect, forever.
    assert_eq!(
        outcomes,
        [true, true, true],
        "answered within 30 s; served: {at:?}; {:?}",
        layer.wait_stats()
    );
    // a1 at 0.3 s (counted again then); a2 admitted at 0.451 s, ready at
    // 0.751 s and renewed, waits for a3's unit (admitted at 0.602 s) to
    // leave: 0.753 s; a3 ready at 0.902 s, renewed, waits for a2's unit:
    // 0.904 s.
    assert_eq!(at, expected_at(&[("a1", 300), ("a2", 753), ("a3", 904)]));
}

#[tokio::test(start_paused = true)]
async fn a_renewed_admission_is_not_counted_as_admitted_on_arrival() {
    // As above: 1 per 1.5 s, every clone of the inner service ready after 300 ms.
    // a1 is admitted on arrival; a2 and a3 wait, are admitted, and are renewed
    // at once when their inner service is ready after their bucket.
    let layer = waiting(1);
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(connecting(&served));
    for call in send_in_order(&svc, &["a1", "a2", "a3"]) {
        let response = call.await.unwrap().expect("answered within 30 s");
        assert_eq!(response.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(served.lock().unwrap().len(), 3);
    let stats = layer.wait_stats();
    // WaitStats: admitted_at_once is "admitted on arrival, without waiting"; an
    // undone admission's "next admission counts again in admitted_after_wait".
    assert_eq!(
        (
            stats.admitted_at_once,
            stats.admitted_after_wait,
            stats.undone
        ),
        (1, 4, 2),
        "{stats:?}"
    );
}

/// Two policies, one interpolated: with nobody ahead, a request waits for the
/// instant both admit it (the interpolated one 10 ms on, the strict one 21 ms
/// on), not for the interpolated policy's strict forecast (1.1 s, past max_wait).
#[tokio::test(start_paused = true)]
async fn an_interpolated_policy_waits_with_a_strict_one_for_the_instant_both_admit() {
    let start = Instant::now();
    let interpolated = Policy::builder()
        .name("interpolated")
        .limit(10)
        .window(ms(1000))
        .buckets(10)
        .precision(tower_sliding_window::Precision::Interpolated)
        .build()
        .unwrap();
    // 5 per 200 ms in 20 ms buckets.
    let strict = Policy::builder()
        .name("strict")
        .limit(5)
        .window(ms(200))
        .buckets(10)
        .build()
        .unwrap();
    let layer = SlidingWindowLayer::builder(keyed())
        .policy(interpolated)
        .policy(strict)
        .on_limit(OnLimit::Wait(WaitConfig::bounded(ms(50), 16).unwrap()))
        .build()
        .unwrap();
    let key = "k".to_owned();
    let stores: Vec<_> = layer.stores().collect();
    assert!(stores[0].check_n(&key, 10).is_allowed());
    tokio::time::sleep_until(start + ms(820)).await;
    // Strictly, these leave 200 ms after they were counted, to a step of
    // their bucket: a waiter for them passes at 1.021 s.
    assert!(stores[1].check_n(&key, 5).is_allowed());
    tokio::time::sleep_until(start + ms(1000)).await;

    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner(&served));
    let response = svc.oneshot(request("k")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(served.lock().unwrap()[0].1, start + ms(1021));
    assert_eq!(layer.wait_stats().rejected_wait_too_long, 0);
}

/// A renewed request waits at the front of its key's queue, denied for the
/// units of a request admitted in a batch behind it but not yet polled. When
/// that request is polled after its bucket, it gives its unit back and waits
/// again: the renewed request ahead of it must be woken for the unit now, not
/// sleep until its denial said.
#[tokio::test(start_paused = true)]
async fn a_renewed_request_is_woken_for_the_unit_a_request_polled_late_gives_back() {
    // 3 per 150 ms in 10 ms buckets (units leave 150 ms after the newest
    // counted in their bucket, to a step of it: 153 ns); every clone of the
    // inner service is ready 300 ms after its first poll_ready. The cost is
    // in `x-cost` (1 without it).
    let start = Instant::now();
    let served = Served::default();
    let layer = SlidingWindowLayer::builder(keyed())
        .policy(per(3, 150))
        .cost(|req: &Request<()>| {
            req.headers()
                .get("x-cost")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        })
        .on_limit(OnLimit::Wait(WaitConfig::bounded(ms(10_000), 16).unwrap()))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(connecting(&served));
    let req = |id: &str, cost: u32| {
        Request::builder()
            .header("x-key", "a")
            .header("x-id", id)
            .header("x-cost", cost.to_string())
            .body(())
            .unwrap()
    };
    let at = |t: u64| start + ms(t);
    let limiter = layer.stores().next().unwrap();
    let key = "a".to_owned();

    // `b`'s service is readied first (0.3 s); `b` is sent later.
    let mut svc_b = svc.clone();
    svc_b.ready().await.unwrap();
    // `r` (cost 1) and `h` (cost 2), sent now, join the queue once their
    // services are ready, at 0.6 s; `b` (cost 1) joins behind them at 0.605 s.
    let r = tokio::spawn(svc.clone().oneshot(req("r", 1)));
    let h = tokio::spawn(svc.clone().oneshot(req("h", 2)));
    // Outside traffic: 2 units at 0.5 s (they leave at 0.65 s), 1 at 0.55 s
    // (it leaves at 0.7 s).
    tokio::time::sleep_until(at(500)).await;
    assert!(limiter.check_n(&key, 2).is_allowed());
    tokio::time::sleep_until(at(550)).await;
    assert!(limiter.check_n(&key, 1).is_allowed());
    tokio::time::sleep_until(at(605)).await;
    let mut b = svc_b.call(req("b", 1));
    // `r` is admitted at 0.651 s (the timer's next millisecond); 1 unit more
    // in its bucket, at 0.655 s (the bucket then leaves at 0.805 s), keeps `h`
    // waiting until then: `h` admits itself and `b` at 0.806 s, but `b` is
    // not polled.
    tokio::time::sleep_until(at(655)).await;
    assert!(limiter.check_n(&key, 1).is_allowed());
    // `r` is ready only after its bucket, at 0.951 s: its unit has left the
    // window, which h's and b's units fill until 0.956 s. Renewed, it waits at
    // the front of the queue, ahead of `b`, for 0.957 s.
    tokio::time::sleep_until(at(955)).await;
    assert!(served_at(&served, start).is_empty());
    // Polled at last, `b` gives back its unit and waits again, behind `r`.
    let polled =
        poll_fn(|cx| Poll::Ready(std::future::Future::poll(std::pin::Pin::new(&mut b), cx))).await;
    assert!(polled.is_pending(), "b waits again");
    let b = tokio::spawn(b);
    for call in [r, h, b] {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    // `r` takes b's unit at once (0.955 s); `b` is admitted at 0.957 s (h's
    // units gone), in r's bucket, which then leaves at 1.107 s. `h`, ready at
    // 1.106 s, renews when it has: 1.108 s. `b`, ready at 1.257 s, renews at
    // once (h's 2 units and its own fit).
    assert_eq!(
        served_at(&served, start),
        expected_at(&[("r", 955), ("h", 1108), ("b", 1257)]),
        "{:?}",
        layer.wait_stats()
    );
}

#[tokio::test(start_paused = true)]
async fn backpressure_ready_after_the_reserved_units_bucket_still_serves_the_next_call_in_turn() {
    // A global 2 per 1.5 s; the inner service takes one request at a time.
    let start = Instant::now();
    let layer = backpressured(2);
    let served = Served::default();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .concurrency_limit(1)
        .service(holding_inner(&served, start));
    // `a` takes the first unit and holds the inner service until 250 ms.
    let a = tokio::spawn(svc.clone().oneshot(holding("a", 250)));
    tokio::task::yield_now().await;
    // `b`'s poll_ready reserves the second unit at once, then waits for the
    // inner service: Ready at 250 ms, after the unit's bucket (100 ms).
    let mut b = svc.clone();
    let b_ready = tokio::spawn(async move {
        b.ready().await.unwrap();
        (b, Instant::now())
    });
    tokio::task::yield_now().await;
    // `c` asks after `b` reserved its unit: the window is full, it waits.
    let c = tokio::spawn(svc.clone().oneshot(request("c")));
    tokio::task::yield_now().await;
    let (mut b, ready_at) = b_ready.await.unwrap();
    assert_eq!(ready_at - start, ms(250));
    // Ready means a unit is reserved for the next call: `b` goes through now
    // (a's unit and b's fit the window), in its turn, ahead of `c`.
    let response = b.call(request("b")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    for call in [a, c] {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(
        served_at(&served, start),
        expected_at(&[("a", 0), ("b", 250), ("c", TURN)]),
        "{:?}",
        layer.wait_stats()
    );
    // The renewed unit took the place of the stale one: never more than the
    // limit in a window.
    let at: Vec<Duration> = served_at(&served, start).into_iter().map(|s| s.1).collect();
    for (i, t) in at.iter().enumerate() {
        let in_window = at[i..].iter().filter(|u| **u - *t < ms(1500)).count();
        assert!(in_window <= 2, "{in_window} within 1.5 s of {t:?}: {at:?}");
    }
}

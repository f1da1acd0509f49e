//! Property: the layer's `OnLimit::Wait` over two policies, under random
//! arrivals, keys and cancellations (paused clock). Every policy's guarantee
//! holds for the requests the inner service sees, keys are served in arrival
//! order, nobody waits past `max_wait`, and a rejection always comes at once,
//! never after waiting (the joint forecast is exact).

use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{sleep_until, Instant};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_sliding_window::{key_fn, OnLimit, Policy, SlidingWindowLayer, WaitConfig};

#[derive(Debug, Clone)]
struct Arrival {
    at_ms: u64,
    key: u8,
    cancel_at_ms: Option<u64>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (0u64..1500, 0u8..2, prop::option::weighted(0.25, 0u64..10)).prop_map(|(at_ms, key, cancel)| {
        Arrival {
            at_ms,
            key,
            cancel_at_ms: cancel.map(|k| (at_ms / 20 + k) * 20),
        }
    })
}

fn policy(name: &str, limit: u32, window_ms: u64, buckets: u32) -> Policy {
    Policy::builder()
        .name(name)
        .limit(limit)
        .window(Duration::from_millis(window_ms))
        .buckets(buckets)
        .build()
        .unwrap()
}

/// (index, key, arrival, served-at) of served requests; (index, arrival,
/// answered-at) of rejected ones.
type Run = (
    Vec<(usize, u8, Instant, Instant)>,
    Vec<(usize, Instant, Instant)>,
);

async fn run(
    short: (u32, u64),
    long: (u32, u64),
    max_wait: Duration,
    arrivals: Vec<Arrival>,
) -> Run {
    let start = Instant::now();
    let layer = SlidingWindowLayer::builder(key_fn(|req: &Request<usize>| {
        req.headers().get("x-key").map(|v| v.as_bytes().to_vec())
    }))
    // 20 ms and 100 ms buckets: boundaries on whole milliseconds.
    .policy(policy("short", short.0, short.1, (short.1 / 20) as u32))
    .policy(policy("long", long.0, long.1, (long.1 / 100) as u32))
    .on_limit(OnLimit::Wait(WaitConfig::bounded(max_wait, 8).unwrap()))
    .build()
    .unwrap();
    let served: Arc<Mutex<Vec<(usize, Instant)>>> = Default::default();
    let log = served.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |req: Request<usize>| {
            log.lock().unwrap().push((*req.body(), Instant::now()));
            async { Ok::<_, Infallible>(Response::new(String::new())) }
        }));
    let rejected: Arc<Mutex<Vec<(usize, Instant, Instant)>>> = Default::default();
    let mut tasks = Vec::new();
    let mut keys = Vec::new();
    for (i, a) in arrivals.into_iter().enumerate() {
        sleep_until(start + Duration::from_millis(a.at_ms)).await;
        let arrived = Instant::now();
        keys.push((a.key, arrived));
        let req = Request::builder()
            .header("x-key", a.key.to_string())
            .body(i)
            .unwrap();
        let response = svc.clone().oneshot(req);
        let rejected = rejected.clone();
        tasks.push(tokio::spawn(async move {
            let response = match a.cancel_at_ms {
                Some(ms) => tokio::select! {
                    biased;
                    _ = sleep_until(start + Duration::from_millis(ms)) => return,
                    r = response => r,
                },
                None => response.await,
            };
            if response.unwrap().status() == StatusCode::TOO_MANY_REQUESTS {
                rejected.lock().unwrap().push((i, arrived, Instant::now()));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let served = served
        .lock()
        .unwrap()
        .iter()
        .map(|&(i, at)| (i, keys[i].0, keys[i].1, at))
        .collect();
    let rejected = rejected.lock().unwrap().clone();
    (served, rejected)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn waiting_on_two_policies_keeps_both_and_rejects_only_at_once(
        short_limit in 1u32..4,
        long_limit in 2u32..8,
        max_wait_ms in 0u64..1500,
        arrivals in prop::collection::vec(arrival(), 1..40),
    ) {
        let mut arrivals = arrivals;
        arrivals.sort_by_key(|a| a.at_ms);
        let (short, long) = ((short_limit, 200), (long_limit, 600));
        let max_wait = Duration::from_millis(max_wait_ms);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (served, rejected) = rt.block_on(run(short, long, max_wait, arrivals));

        for &(limit, window_ms) in &[short, long] {
            let window = Duration::from_millis(window_ms);
            for a in &served {
                let n = served
                    .iter()
                    .filter(|b| b.1 == a.1 && b.3 >= a.3 && b.3 <= a.3 + window)
                    .count() as u32;
                prop_assert!(n <= limit, "{n} requests of key {} in {window:?}", a.1);
            }
        }
        for a in &served {
            prop_assert!(a.3 - a.2 <= max_wait, "waited past max_wait");
            for b in &served {
                if b.1 == a.1 && b.0 > a.0 {
                    prop_assert!(b.3 >= a.3, "request {} overtook {}", b.0, a.0);
                }
            }
        }
        for r in &rejected {
            prop_assert_eq!(r.1, r.2, "request {} was rejected after waiting", r.0);
        }
    }
}

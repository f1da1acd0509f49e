//! Property: the layer's `OnLimit::Wait` over two or three policies with
//! different windows and bucket counts, against a reference model (paused
//! clock, strict precision, boundaries on whole milliseconds).
//!
//! The model replays every policy's strict rule (a bucket's units count until
//! its newest admission has left the window) and the queue's FIFO rule: a
//! request is admitted, all-or-nothing, at the timer's first millisecond at
//! which every policy allows it, and no earlier than the request before it. A
//! request checked on arrival and denied by one policy is given back by the
//! others, whose buckets keep its instant as their newest admission. When
//! every request is awaited (or its response future dropped at once), each
//! outcome is checked exactly: cost 0 passes at once, a cost above any limit
//! is rejected at once, a request is rejected (at once) only when it finds
//! `max_queue` waiters or its wait would exceed `max_wait`, and every other
//! request reaches the inner service exactly at the model's instant. A
//! response future dropped at once must leave no units counted unless its
//! request was forwarded on arrival.
//!
//! Cases with cancellations at random instants, response futures left unpolled
//! for a while, and an inner service that is not ready for a while (so that
//! admissions go stale and are renewed) are checked against what must survive
//! them: no policy ever sees more than its limit in any window of the inner
//! service's calls, FIFO among requests polled throughout (without outages),
//! nobody waits past `max_wait` and nobody is rejected after waiting (without
//! late polls or outages), no queue is left behind, and nothing hangs.

use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{sleep_until, Instant, Sleep};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::{key_fn, OnLimit, Policy, SlidingWindowLayer, WaitConfig};

mod wait_model;
use wait_model::{drive, earliest, ms_since, Action, Geo};

#[derive(Debug, Clone)]
struct Arrival {
    at_ms: u64,
    key: u8,
    cost: u32,
    action: Action,
}

/// The inner service: logs (request index, instant) of each call; not ready
/// during the outages.
struct Inner {
    start: Instant,
    log: Arc<Mutex<Vec<(usize, u64)>>>,
    outages: Arc<Vec<(u64, u64)>>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Clone for Inner {
    fn clone(&self) -> Self {
        Inner {
            start: self.start,
            log: self.log.clone(),
            outages: self.outages.clone(),
            sleep: None,
        }
    }
}

impl Service<Request<usize>> for Inner {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        loop {
            let now = ms_since(self.start, Instant::now());
            let Some(&(_, to)) = self.outages.iter().find(|&&(a, b)| a <= now && now < b) else {
                return Poll::Ready(Ok(()));
            };
            let until = self.start + Duration::from_millis(to);
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
            sleep.as_mut().reset(until);
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn call(&mut self, req: Request<usize>) -> Self::Future {
        let now = ms_since(self.start, Instant::now());
        self.log.lock().unwrap().push((*req.body(), now));
        std::future::ready(Ok(Response::new(String::new())))
    }
}

#[derive(Debug, Clone, Copy)]
enum Fin {
    /// The response future resolved (at this instant) with this status.
    Answered(u64, StatusCode),
    Cancelled,
    Dropped,
}

#[derive(Debug, Clone, Copy)]
struct Obs {
    arrived: u64,
    fin: Fin,
}

async fn run(
    geos: &[Geo],
    max_wait_ms: u64,
    max_queue: usize,
    outages: Vec<(u64, u64)>,
    arrivals: &[Arrival],
) -> (Vec<Obs>, Vec<(usize, u64)>, usize) {
    let start = Instant::now();
    let policies = geos.iter().enumerate().map(|(i, g)| {
        Policy::builder()
            .name(format!("p{i}"))
            .limit(g.limit)
            .window(Duration::from_millis(g.width * g.n))
            .buckets(g.n as u32)
            .build()
            .unwrap()
    });
    let layer = SlidingWindowLayer::builder(key_fn(|req: &Request<usize>| {
        req.headers().get("x-key").map(|v| v.as_bytes().to_vec())
    }))
    .policies(policies)
    .cost(|req: &Request<usize>| {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
    .on_limit(OnLimit::Wait(
        WaitConfig::bounded(Duration::from_millis(max_wait_ms), max_queue).unwrap(),
    ))
    .build()
    .unwrap();
    let served: Arc<Mutex<Vec<(usize, u64)>>> = Default::default();
    let inner = Inner {
        start,
        log: served.clone(),
        outages: Arc::new(outages),
        sleep: None,
    };
    let svc = ServiceBuilder::new().layer(layer.clone()).service(inner);
    let log: Arc<Mutex<Vec<Option<Obs>>>> = Arc::new(Mutex::new(vec![None; arrivals.len()]));
    let mut tasks = Vec::new();
    for (i, a) in arrivals.iter().cloned().enumerate() {
        sleep_until(start + Duration::from_millis(a.at_ms)).await;
        let req = Request::builder()
            .header("x-key", a.key.to_string())
            .header("x-cost", a.cost.to_string())
            .body(i)
            .unwrap();
        let mut s = svc.clone();
        s.ready().await.unwrap();
        let arrived = ms_since(start, Instant::now());
        let mut response = s.call(req);
        if a.action == Action::DropAtOnce {
            drop(response);
            log.lock().unwrap()[i] = Some(Obs {
                arrived,
                fin: Fin::Dropped,
            });
            continue;
        }
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let response = drive(&mut response, a.action, start).await;
            let fin = match response {
                Some(r) => Fin::Answered(ms_since(start, Instant::now()), r.unwrap().status()),
                None => Fin::Cancelled,
            };
            log.lock().unwrap()[i] = Some(Obs { arrived, fin });
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let obs = log.lock().unwrap().iter().map(|o| o.unwrap()).collect();
    let served = served.lock().unwrap().clone();
    (obs, served, layer.wait_stats().keys_waiting)
}

fn check_model(
    geos: &[Geo],
    max_wait_ms: u64,
    max_queue: usize,
    arrivals: &[Arrival],
    obs: &[Obs],
    served: &[(usize, u64)],
) -> Result<(), TestCaseError> {
    let min_limit = geos.iter().map(|g| g.limit).min().unwrap();
    // Per key and policy: (instant, cost) of admissions; per key: the latest
    // admission, and instants of queued ones.
    let mut records: [Vec<Vec<(u64, u32)>>; 2] = std::array::from_fn(|_| vec![vec![]; geos.len()]);
    let mut last: [u64; 2] = [0; 2];
    let mut queued: [Vec<u64>; 2] = Default::default();
    for (i, (a, o)) in arrivals.iter().zip(obs).enumerate() {
        let t = a.at_ms;
        prop_assert_eq!(o.arrived, t);
        let k = a.key as usize;
        let served_at = served.iter().find(|s| s.0 == i).map(|s| s.1);
        let ctx = format!("request {i} {a:?}: {o:?}, served at {served_at:?}");
        let dropped = a.action == Action::DropAtOnce;
        if a.cost == 0 {
            prop_assert_eq!(served_at, Some(t), "cost 0 passes at once: {}", ctx);
            continue;
        }
        let strict = queued[k].iter().filter(|&&q| q > t).count();
        // With nobody waiting, a request is checked on arrival against every
        // policy; denied by one, it is given back by the others, whose
        // buckets keep its instant as their newest admission (a record of no
        // units). A waiter admitted at the same instant records it anyway.
        if strict == 0 && served_at != Some(t) {
            for (g, records) in geos.iter().zip(records[k].iter_mut()) {
                if g.fits(records, t, a.cost) {
                    records.push((t, 0));
                }
            }
        }
        if a.cost > min_limit {
            prop_assert_eq!(served_at, None, "{}", ctx);
            if !dropped {
                prop_assert!(
                    matches!(o.fin, Fin::Answered(at, StatusCode::TOO_MANY_REQUESTS) if at == t),
                    "a cost above a limit is rejected at once: {}",
                    ctx
                );
            }
            continue;
        }
        let tie = queued[k].iter().filter(|&&q| q == t).count();
        let by_policy: Vec<&[(u64, u32)]> = records[k].iter().map(Vec::as_slice).collect();
        let pred = earliest(geos, &by_policy, t.max(last[k]), a.cost);
        let full_surely = strict >= max_queue;
        let full_maybe = strict + tie >= max_queue;
        let too_long = pred - t > max_wait_ms;
        let at_once = pred == t && strict == 0;
        match served_at {
            Some(at) => {
                prop_assert!(
                    !full_surely && !too_long,
                    "served though over a bound: {}",
                    ctx
                );
                prop_assert_eq!(at, pred, "served at the model's instant: {}", ctx);
                if dropped {
                    prop_assert!(at_once, "a dropped waiter was served: {}", ctx);
                } else {
                    prop_assert!(matches!(o.fin, Fin::Answered(_, StatusCode::OK)), "{}", ctx);
                }
                for records in &mut records[k] {
                    records.push((pred, a.cost));
                }
                last[k] = pred;
                if !(at_once && (tie == 0 || dropped)) {
                    // Could have queued (ties: the queue's order decides).
                    queued[k].push(pred);
                }
            }
            None if dropped => {
                prop_assert!(
                    !at_once || tie > 0 || full_maybe,
                    "not forwarded on arrival: {}",
                    ctx
                );
            }
            None => {
                prop_assert!(
                    full_maybe || too_long,
                    "rejected though within the bounds (wait {} ms, {strict}+{tie} waiters): {ctx}",
                    pred - t
                );
                prop_assert!(
                    matches!(o.fin, Fin::Answered(at, StatusCode::TOO_MANY_REQUESTS) if at == t),
                    "rejected at once: {}",
                    ctx
                );
            }
        }
    }
    Ok(())
}

fn arrival(disturb: bool) -> impl Strategy<Value = Arrival> {
    (
        0u64..1200,
        0u8..2,
        prop_oneof![2 => Just(0u32), 16 => 1u32..3, 4 => 3u32..5, 1 => 5u32..8],
        0u8..100,
        0u64..10,
        0u64..300,
    )
        .prop_map(move |(at_ms, key, cost, pick, k, len)| {
            let action = match pick {
                0..=7 => Action::DropAtOnce,
                8..=27 if disturb => Action::CancelAt((at_ms / 10 + k) * 10),
                28..=37 if disturb => {
                    let from = (at_ms / 10 + k) * 10;
                    Action::Pause(from, from + len)
                }
                _ => Action::Await,
            };
            Arrival {
                at_ms,
                key,
                cost,
                action,
            }
        })
}

fn geo() -> impl Strategy<Value = Geo> {
    (
        1u32..6,
        prop_oneof![Just(10u64), Just(20), Just(50), Just(100)],
        1u64..6,
    )
        .prop_map(|(limit, width, n)| Geo { limit, width, n })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn waiting_layer_follows_the_model(
        geos in prop::collection::vec(geo(), 2..4),
        max_wait_ms in 0u64..1200,
        max_queue in 1usize..8,
        (disturb, arrivals, outages) in any::<bool>().prop_flat_map(|d| {
            (
                Just(d),
                prop::collection::vec(arrival(d), 1..40),
                if d {
                    prop::collection::vec((0u64..1500, 1u64..400), 0..3).boxed()
                } else {
                    Just(Vec::new()).boxed()
                },
            )
        }),
    ) {
        let _ = disturb;
        let mut arrivals = arrivals;
        arrivals.sort_by_key(|a| a.at_ms);
        let outages: Vec<(u64, u64)> = outages.into_iter().map(|(a, len)| (a, a + len)).collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (obs, served, keys_waiting) = rt
            .block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(3600),
                    run(&geos, max_wait_ms, max_queue, outages.clone(), &arrivals),
                )
                .await
            })
            .map_err(|_| TestCaseError::fail("a request hung"))?;
        prop_assert_eq!(keys_waiting, 0, "no queue left behind");

        // Every policy's guarantee for what the inner service sees.
        let key_of = |i: usize| arrivals[i].key;
        for g in &geos {
            let window = g.width * g.n;
            for &(i, at) in &served {
                let units: u64 = served
                    .iter()
                    .filter(|&&(j, bt)| key_of(j) == key_of(i) && bt >= at && bt <= at + window)
                    .map(|&(j, _)| arrivals[j].cost as u64)
                    .sum();
                prop_assert!(units <= g.limit as u64, "{units} units of key {} in [{at}, +{window}] ms", key_of(i));
            }
        }
        let undisturbed_timing = outages.is_empty()
            && !arrivals.iter().any(|a| matches!(a.action, Action::Pause(..)));
        let steady = |a: &Arrival| !matches!(a.action, Action::Pause(..)) && a.cost > 0;
        if outages.is_empty() {
            for &(i, at) in &served {
                for &(j, bt) in &served {
                    if key_of(i) == key_of(j) && i < j && steady(&arrivals[i]) && steady(&arrivals[j]) {
                        prop_assert!(bt >= at, "request {j} overtook {i}");
                    }
                }
            }
        }
        if undisturbed_timing {
            for &(i, at) in &served {
                prop_assert!(at - obs[i].arrived <= max_wait_ms, "request {i} waited past max_wait");
            }
            for (i, o) in obs.iter().enumerate() {
                if let Fin::Answered(at, StatusCode::TOO_MANY_REQUESTS) = o.fin {
                    prop_assert_eq!(at, o.arrived, "request {} rejected after waiting", i);
                }
            }
        }
        let undisturbed = undisturbed_timing
            && arrivals.iter().all(|a| matches!(a.action, Action::Await | Action::DropAtOnce));
        if undisturbed {
            check_model(&geos, max_wait_ms, max_queue, &arrivals, &obs, &served)?;
        }
    }
}

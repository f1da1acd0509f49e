//! Property: waiting never breaks the core's guarantee. Under random arrivals,
//! keys, costs and cancellations (on tokio's paused clock), the admitted requests
//! of a key never hold more than the limit in any window, are admitted in arrival
//! order, never later than the forecast given on arrival (so never past
//! `max_wait`), and each waiter registers at most one timer.

use crate::wait::{WaitQueues, WaitStats};
use crate::{Limiter, Policy, WaitConfig};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{sleep_until, Instant};

const WINDOW_MS: u64 = 300;
const BUCKETS: u64 = 3; // 100 ms buckets: boundaries on whole milliseconds

#[derive(Debug, Clone)]
struct Request {
    at_ms: u64,
    key: u8,
    cost: u32,
    cancel_at_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct Admission {
    index: usize,
    key: u8,
    cost: u32,
    arrived: Instant,
    at: Instant,
    expected: Option<Instant>,
    slot: u64,
}

fn request() -> impl Strategy<Value = Request> {
    (
        0u64..2000,
        0u8..3,
        1u32..5,
        prop::option::weighted(0.3, 0u64..15),
    )
        .prop_map(|(at_ms, key, cost, cancel)| Request {
            at_ms,
            key,
            cost,
            // On a bucket boundary, where admissions happen, so that some waiters
            // are cancelled right after being admitted, before they are polled.
            cancel_at_ms: cancel.map(|k| (at_ms / 100 + k) * 100),
        })
}

async fn run(
    limit: u32,
    config: WaitConfig,
    requests: Vec<Request>,
) -> (Vec<Admission>, WaitStats, u64) {
    let start = Instant::now();
    let policy = Policy::builder()
        .limit(limit)
        .window(Duration::from_millis(WINDOW_MS))
        .buckets(BUCKETS as u32)
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let queues = Arc::new(WaitQueues::new(limiter, config));
    let log: Arc<Mutex<Vec<Admission>>> = Default::default();
    let mut tasks = Vec::new();
    let mut waited = 0;
    for (index, r) in requests.into_iter().enumerate() {
        sleep_until(start + Duration::from_millis(r.at_ms)).await;
        let arrived = Instant::now();
        let waiter = queues.acquire(r.key, r.cost);
        waited += waiter.is_waiting() as u64;
        let expected = waiter.expected_admission();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let result = match r.cancel_at_ms {
                Some(ms) => tokio::select! {
                    biased;
                    _ = sleep_until(start + Duration::from_millis(ms)) => None,
                    result = waiter => Some(result),
                },
                None => Some(waiter.await),
            };
            if let Some(Ok(decision)) = result {
                log.lock().unwrap().push(Admission {
                    index,
                    key: r.key,
                    cost: r.cost,
                    arrived,
                    at: Instant::now(),
                    expected,
                    slot: decision.recorded_slot(),
                });
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let admitted = log.lock().unwrap().clone();
    (admitted, queues.stats(), waited)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn waiting_keeps_every_window_within_the_limit(
        limit in 1u32..6,
        max_queue in 1usize..10,
        max_wait_ms in 0u64..2500,
        mut requests in prop::collection::vec(request(), 1..60),
    ) {
        requests.sort_by_key(|r| r.at_ms);
        let cancels = requests.iter().any(|r| r.cancel_at_ms.is_some());
        let max_wait = Duration::from_millis(max_wait_ms);
        let config = WaitConfig::bounded(max_wait, max_queue).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let (admitted, stats, waited) = rt.block_on(run(limit, config, requests));
        let window = Duration::from_millis(WINDOW_MS);

        for a in &admitted {
            let same_key = admitted.iter().filter(|b| b.key == a.key);
            // Any interval of length W starting at an admission.
            let in_window: u32 = same_key
                .clone()
                .filter(|b| b.at >= a.at && b.at < a.at + window)
                .map(|b| b.cost)
                .sum();
            prop_assert!(in_window <= limit, "{in_window} units in [{:?}, +W)", a.at);
            // Over recorded slots: N consecutive buckets hold <= L (the
            // oldest of N + 1 counts until its newest admission has left).
            let in_span: u32 = same_key
                .clone()
                .filter(|b| b.slot <= a.slot && b.slot + BUCKETS > a.slot)
                .map(|b| b.cost)
                .sum();
            prop_assert!(in_span <= limit);
            // Arrival order within a key.
            for b in same_key {
                if b.index > a.index {
                    prop_assert!(b.at >= a.at, "request {} overtook {}", b.index, a.index);
                }
            }
            // Never later than promised on arrival, so never past max_wait.
            prop_assert!(a.at - a.arrived <= max_wait);
            if let Some(expected) = a.expected {
                prop_assert!(a.at <= expected, "admitted after its forecast");
                if !cancels {
                    prop_assert_eq!(a.at, expected, "the forecast is exact");
                }
            }
        }
        prop_assert!(stats.timers_created <= waited, "{stats:?}, {waited} waited");
        if !cancels {
            prop_assert_eq!(stats.timers_reset, 0);
        }
        prop_assert_eq!(stats.keys_waiting, 0, "no queue left behind");
    }
}

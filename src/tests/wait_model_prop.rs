//! Property: `WaitQueues` against a reference model of its documented
//! behaviour (paused clock, strict precision, bucket boundaries on whole
//! milliseconds).
//!
//! The model replays the ring's strict rule (a bucket's units count until its
//! newest admission has left the window) and the queue's FIFO rule (a request
//! is admitted no earlier than the request before it, at the timer's first
//! millisecond at which its cost fits).
//! When every request is awaited (or dropped at once, which must change
//! nothing), each outcome is checked against it exactly:
//! - cost 0 passes at once; a cost above the limit is rejected at once;
//! - a request that finds `max_queue` waiters is rejected at once
//!   (`QueueFull`), and only then;
//! - a request whose forecast wait exceeds `max_wait` is rejected at once
//!   (`WaitTooLong`) with that wait as `retry_after`, and only then;
//! - every other request is admitted exactly at the model's instant, which is
//!   also its `expected_admission` (exactness), and admitted at once only when
//!   its cost fits on arrival and nobody waits.
//!
//! Cases with cancellations at random instants (on bucket boundaries, so some
//! hit a waiter admitted in a batch before it is polled) and with waiters left
//! unpolled for a while (late polls) are checked against the invariants that
//! must survive them: never more than the limit in any window (on the instants
//! the decisions are collected and on the recorded slots), a collected decision
//! always counts in the current bucket, FIFO among the waiters that were polled
//! throughout, no admission after its forecast or past `max_wait` and no
//! rejection after waiting (without late polls), at most one timer per waiter,
//! no queue left behind, and nothing hangs.

use crate::{
    wait::{WaitQueues, WaitRejectReason, WaitRejected},
    Limiter, Policy, WaitConfig,
};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{sleep_until, Instant};

#[path = "../../tests/wait_model/mod.rs"]
mod wait_model;
use wait_model::{drive, earliest, fits, ms_since, Action, Geo};

#[derive(Debug, Clone)]
struct Req {
    at_ms: u64,
    key: u8,
    cost: u32,
    action: Action,
}

#[derive(Debug, Clone, Copy)]
enum MaxWait {
    Ms(u64),
    Max,
    Unbounded,
}

#[derive(Debug, Clone, Copy)]
enum Fin {
    Admitted { at: u64, slot: u64 },
    Rejected { at: u64, rejected: WaitRejected },
    Cancelled,
    Dropped,
}

#[derive(Debug, Clone, Copy)]
struct Obs {
    arrived: u64,
    waiting: bool,
    expected: Option<u64>,
    fin: Fin,
}

fn request(disturb: bool) -> impl Strategy<Value = Req> {
    (
        0u64..1500,
        0u8..3,
        prop_oneof![3 => Just(0u32), 20 => 1u32..4, 6 => 4u32..7, 2 => 7u32..9],
        0u8..100,
        0u64..12,
        0u64..400,
        any::<bool>(),
    )
        .prop_map(move |(at_ms, key, cost, pick, k, len, on_boundary)| {
            let action = match pick {
                0..=7 => Action::DropAtOnce,
                8..=29 if disturb => {
                    // Often on a 50 ms boundary (every geometry below has one
                    // there), where batches are admitted.
                    let ms = if on_boundary {
                        (at_ms / 50 + k) * 50
                    } else {
                        at_ms + k * 37
                    };
                    Action::CancelAt(ms)
                }
                30..=44 if disturb => {
                    let from = (at_ms / 50 + k) * 50;
                    Action::Pause(from, from + len)
                }
                _ => Action::Await,
            };
            Req {
                at_ms,
                key,
                cost,
                action,
            }
        })
}

async fn run(
    limit: u32,
    width_ms: u64,
    buckets: u64,
    config: WaitConfig,
    requests: &[Req],
) -> (Vec<Obs>, crate::wait::WaitStats, u64) {
    let start = Instant::now();
    let policy = Policy::builder()
        .limit(limit)
        .window(Duration::from_millis(width_ms * buckets))
        .buckets(buckets as u32)
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let queues = Arc::new(WaitQueues::new(limiter, config));
    let log: Arc<Mutex<Vec<Option<Obs>>>> = Arc::new(Mutex::new(vec![None; requests.len()]));
    let mut tasks = Vec::new();
    let mut waited = 0;
    for (i, r) in requests.iter().cloned().enumerate() {
        sleep_until(start + Duration::from_millis(r.at_ms)).await;
        let arrived = ms_since(start, Instant::now());
        let mut waiter = queues.acquire(r.key, r.cost);
        let waiting = waiter.is_waiting();
        waited += waiting as u64;
        let expected = waiter.expected_admission().map(|t| ms_since(start, t));
        let obs = Obs {
            arrived,
            waiting,
            expected,
            fin: Fin::Dropped,
        };
        if r.action == Action::DropAtOnce {
            drop(waiter);
            log.lock().unwrap()[i] = Some(obs);
            continue;
        }
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let result = drive(&mut waiter, r.action, start).await;
            let now = ms_since(start, Instant::now());
            let fin = match result {
                None => Fin::Cancelled,
                Some(Ok(d)) => Fin::Admitted {
                    at: now,
                    slot: d.recorded_slot(),
                },
                Some(Err(rejected)) => Fin::Rejected { at: now, rejected },
            };
            drop(waiter);
            log.lock().unwrap()[i] = Some(Obs { fin, ..obs });
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let log = log.lock().unwrap().iter().map(|o| o.unwrap()).collect();
    (log, queues.stats(), waited)
}

/// The reference model of one key: admissions (done or promised), in order.
#[derive(Default)]
struct KeyModel {
    /// (instant ms, cost) of every admission, in FIFO order.
    records: Vec<(u64, u32)>,
    /// Admission instants of requests that queued on arrival.
    queued: Vec<u64>,
}

fn check_model(
    geo: &Geo,
    max_wait: MaxWait,
    max_queue: Option<usize>,
    requests: &[Req],
    obs: &[Obs],
) -> Result<(), TestCaseError> {
    let mut keys: [KeyModel; 3] = Default::default();
    for (i, (r, o)) in requests.iter().zip(obs).enumerate() {
        if r.action == Action::DropAtOnce {
            // Admitted on arrival and dropped unpolled: its units go back at
            // once, but its bucket keeps its instant as the newest admission
            // (a bucket's newest offset never moves earlier): a record of no
            // units. Any other drop leaves no trace.
            let m = &mut keys[r.key as usize];
            let t = r.at_ms;
            let nobody_waits = m.queued.iter().all(|&a| a < t);
            let at_once = r.cost > 0
                && r.cost <= geo.limit
                && nobody_waits
                && fits(std::slice::from_ref(geo), &[&m.records], t, r.cost);
            if at_once && !o.waiting {
                m.records.push((t, 0));
            }
            continue;
        }
        let t = r.at_ms;
        prop_assert_eq!(o.arrived, t);
        let m = &mut keys[r.key as usize];
        let ctx = format!("request {i} {r:?}: {o:?}");
        if r.cost == 0 {
            prop_assert!(
                matches!(o.fin, Fin::Admitted { at, .. } if at == t) && !o.waiting,
                "cost 0 passes at once: {}",
                ctx
            );
            continue;
        }
        if r.cost > geo.limit {
            match o.fin {
                Fin::Rejected { at, rejected } => {
                    prop_assert_eq!(
                        rejected.reason,
                        WaitRejectReason::CostExceedsLimit,
                        "{}",
                        ctx
                    );
                    if !matches!(max_wait, MaxWait::Unbounded) {
                        prop_assert!(at == t && !o.waiting, "rejected at once: {}", ctx);
                    }
                }
                _ => prop_assert!(false, "a cost above the limit passed: {}", ctx),
            }
            continue;
        }
        let strict = m.queued.iter().filter(|&&a| a > t).count();
        let tie = m.queued.iter().filter(|&&a| a == t).count();
        let last = m.records.last().map_or(0, |r| r.0);
        let pred = earliest(
            std::slice::from_ref(geo),
            &[&m.records],
            t.max(last),
            r.cost,
        );
        let wait = Duration::from_millis(pred - t);
        let (full_surely, full_maybe) = match max_queue {
            Some(q) => (strict >= q, strict + tie >= q),
            None => (false, false),
        };
        let too_long = match max_wait {
            MaxWait::Ms(ms) => wait > Duration::from_millis(ms),
            _ => false,
        };
        let bounded = !matches!(max_wait, MaxWait::Unbounded);
        match o.fin {
            Fin::Rejected { at, rejected } => {
                prop_assert!(at == t && !o.waiting, "rejected at once: {}", ctx);
                let retry = rejected.decision.retry_after();
                match rejected.reason {
                    WaitRejectReason::QueueFull => {
                        prop_assert!(
                            full_maybe,
                            "QueueFull with {strict} (+{tie}) waiters: {ctx}"
                        );
                        if bounded {
                            prop_assert_eq!(
                                retry,
                                Some(wait.max(Duration::from_nanos(1))),
                                "{}",
                                ctx
                            );
                        }
                    }
                    WaitRejectReason::WaitTooLong => {
                        prop_assert!(!full_surely, "should have been QueueFull: {}", ctx);
                        prop_assert!(too_long, "WaitTooLong but the wait is {wait:?}: {ctx}");
                        prop_assert_eq!(retry, Some(wait), "{}", ctx);
                    }
                    WaitRejectReason::CostExceedsLimit => {
                        prop_assert!(false, "CostExceedsLimit: {}", ctx)
                    }
                }
            }
            Fin::Admitted { at, slot } => {
                prop_assert!(!full_surely, "admitted past a full queue: {}", ctx);
                prop_assert!(
                    !too_long,
                    "admitted though its wait {wait:?} is too long: {ctx}"
                );
                prop_assert_eq!(at, pred, "admission instant vs the model: {}", ctx);
                prop_assert_eq!(slot, geo.slot(pred), "{}", ctx);
                if o.waiting {
                    let expected = if bounded { Some(pred) } else { None };
                    prop_assert_eq!(o.expected, expected, "the forecast: {}", ctx);
                    prop_assert!(strict + tie > 0 || pred > t, "waited needlessly: {}", ctx);
                } else {
                    prop_assert!(strict == 0 && pred == t, "admitted at once: {}", ctx);
                }
                m.records.push((pred, r.cost));
                if o.waiting {
                    m.queued.push(pred);
                }
            }
            Fin::Cancelled | Fin::Dropped => prop_assert!(false, "{}", ctx),
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn check_invariants(
    geo: &Geo,
    max_wait: MaxWait,
    requests: &[Req],
    obs: &[Obs],
    stats: &crate::wait::WaitStats,
    waited: u64,
) -> Result<(), TestCaseError> {
    let paused = |r: &Req| matches!(r.action, Action::Pause(..));
    let any_pause = requests.iter().any(paused);
    let window_ms = geo.width * geo.n;
    let admitted: Vec<(usize, &Req, u64, u64, &Obs)> = requests
        .iter()
        .zip(obs)
        .enumerate()
        .filter_map(|(i, (r, o))| match o.fin {
            // One admitted on arrival is admitted then ("admitted ... now"),
            // however late it is polled; a waiter when it is collected.
            Fin::Admitted { at, slot } => {
                Some((i, r, if o.waiting { at } else { o.arrived }, slot, o))
            }
            _ => None,
        })
        .collect();
    for &(i, r, at, slot, o) in &admitted {
        // A decision counts in the bucket it is admitted (a waiter: collected) in.
        prop_assert_eq!(
            slot,
            geo.slot(at),
            "request {} collected outside its bucket",
            i
        );
        let same_key = admitted.iter().filter(|b| b.1.key == r.key);
        // A waiter collected late was admitted between the start of its
        // bucket (and its arrival) and its collection: count the units that
        // lie in one window whatever their instants in those ranges.
        let earliest = |b: &(usize, &Req, u64, u64, &Obs)| b.4.arrived.max(b.3 * geo.width);
        let from = earliest(&(i, r, at, slot, o));
        let in_window: u64 = same_key
            .clone()
            .filter(|b| earliest(b) >= from && b.2 < from + window_ms)
            .map(|b| b.1.cost as u64)
            .sum();
        prop_assert!(
            in_window <= geo.limit as u64,
            "{in_window} units in [{from}, +W)"
        );
        // N consecutive buckets (the oldest of N + 1 counts until its
        // newest admission has left).
        let in_span: u64 = same_key
            .clone()
            .filter(|b| b.3 <= slot && b.3 + geo.n > slot)
            .map(|b| b.1.cost as u64)
            .sum();
        prop_assert!(
            in_span <= geo.limit as u64,
            "{in_span} units in slots up to {slot}"
        );
        if r.cost > 0 && !paused(r) {
            for b in same_key {
                if b.0 > i && b.1.cost > 0 && !paused(b.1) {
                    prop_assert!(b.2 >= at, "request {} overtook {}", b.0, i);
                }
            }
        }
        if !any_pause {
            if let MaxWait::Ms(ms) = max_wait {
                prop_assert!(at - o.arrived <= ms, "request {i} waited past max_wait");
            }
            if let Some(expected) = o.expected {
                prop_assert!(at <= expected, "request {i} admitted after its forecast");
            }
        }
    }
    if !any_pause && !matches!(max_wait, MaxWait::Unbounded) {
        for (i, o) in obs.iter().enumerate() {
            if let Fin::Rejected { at, .. } = o.fin {
                prop_assert_eq!(at, o.arrived, "request {} rejected after waiting", i);
            }
        }
    }
    prop_assert!(stats.timers_created <= waited, "{stats:?}, {waited} waited");
    prop_assert_eq!(stats.keys_waiting, 0, "no queue left behind");
    Ok(())
}

fn case(
    limit: u32,
    width_ms: u64,
    buckets: u64,
    max_wait: MaxWait,
    max_queue: usize,
    mut requests: Vec<Req>,
) -> Result<(), TestCaseError> {
    requests.sort_by_key(|r| r.at_ms);
    let config = match max_wait {
        MaxWait::Ms(ms) => WaitConfig::bounded(Duration::from_millis(ms), max_queue).unwrap(),
        MaxWait::Max => WaitConfig::bounded(Duration::MAX, max_queue).unwrap(),
        MaxWait::Unbounded => WaitConfig::unbounded(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let (obs, stats, waited) = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(3600),
                run(limit, width_ms, buckets, config, &requests),
            )
            .await
        })
        .map_err(|_| TestCaseError::fail("a waiter hung"))?;
    let geo = Geo {
        limit,
        width: width_ms,
        n: buckets,
    };
    check_invariants(&geo, max_wait, &requests, &obs, &stats, waited)?;
    let undisturbed = requests
        .iter()
        .all(|r| matches!(r.action, Action::Await | Action::DropAtOnce));
    if undisturbed {
        let max_queue = (!matches!(max_wait, MaxWait::Unbounded)).then_some(max_queue);
        check_model(&geo, max_wait, max_queue, &requests, &obs)?;
        prop_assert_eq!(stats.timers_reset, 0);
    }
    Ok(())
}

fn max_wait() -> impl Strategy<Value = MaxWait> {
    prop_oneof![
        8 => (0u64..1500).prop_map(MaxWait::Ms),
        1 => Just(MaxWait::Max),
        1 => Just(MaxWait::Unbounded),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn wait_queues_follow_the_model(
        limit in 1u32..7,
        // Bucket widths of 50 or 100 ms, 1 to 5 buckets.
        width_ms in prop_oneof![Just(50u64), Just(100u64)],
        buckets in 1u64..6,
        max_wait in max_wait(),
        max_queue in 1usize..8,
        (disturb, requests) in any::<bool>().prop_flat_map(|d| {
            (Just(d), prop::collection::vec(request(d), 1..50))
        }),
    ) {
        let _ = disturb;
        case(limit, width_ms, buckets, max_wait, max_queue, requests)?;
    }
}

//! Keyed waiting and global backpressure on tokio's paused clock.
//!
//! Policies use 100 ms buckets (1.5 s / 15 or 300 ms / 3) so that every bucket
//! boundary falls on a whole millisecond, where tokio's timers fire exactly.

use crate::{
    wait::{Backpressure, WaitQueues, WaitRejectReason},
    Limiter, Policy, WaitConfig,
};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{advance, sleep_until, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn queues<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    limit: u32,
    max_wait: Duration,
    max_queue: usize,
) -> Arc<WaitQueues<K>> {
    let policy = Policy::per(limit, Duration::from_millis(1500)).unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    Arc::new(WaitQueues::new(
        limiter,
        WaitConfig::bounded(max_wait, max_queue).unwrap(),
    ))
}

type Log = Arc<Mutex<Vec<(usize, Instant)>>>;

/// Queue `n` requests of cost 1 for `key` now, each in its own task, logging
/// (arrival index, admission instant).
fn spawn_waiters(q: &Arc<WaitQueues<u32>>, key: u32, n: usize, log: &Log) -> Vec<Instant> {
    let mut expected = Vec::new();
    for i in 0..n {
        let waiter = q.acquire(key, 1);
        expected.push(waiter.expected_admission().unwrap_or_else(Instant::now));
        let log = log.clone();
        tokio::spawn(async move {
            let _ = waiter.await.unwrap();
            log.lock().unwrap().push((i, Instant::now()));
        });
    }
    expected
}

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_at_the_allowed_instants_in_arrival_order() {
    let start = Instant::now();
    let q = queues(3, Duration::from_secs(60), 100);
    let log: Log = Default::default();
    let expected = spawn_waiters(&q, 7, 10, &log);
    sleep_until(start + Duration::from_secs(10)).await;

    // 3 per 1.5 s in 100 ms buckets: units leave the window 1.5 s after their
    // admission (to a step of the bucket, 1.5 µs), and the timer fires at the
    // next millisecond, so batches of 3 pass every 1.501 s.
    let at = |t: u64| start + ms(t);
    let want = [0, 0, 0, 1501, 1501, 1501, 3002, 3002, 3002, 4503].map(at);
    let log = log.lock().unwrap().clone();
    let order: Vec<usize> = log.iter().map(|e| e.0).collect();
    let instants: Vec<Instant> = log.iter().map(|e| e.1).collect();
    assert_eq!(order, (0..10).collect::<Vec<_>>(), "arrival order");
    assert_eq!(instants, want, "admission instants");
    assert_eq!(expected, want, "the forecast is exact");

    let stats = q.stats();
    assert_eq!(stats.admitted_at_once, 3);
    assert_eq!(stats.admitted_after_wait, 7);
    // One timer per batch: 3 for 7 waiters, none reset, no queue left behind.
    assert_eq!((stats.timers_created, stats.timers_reset), (3, 0));
    assert_eq!(stats.keys_waiting, 0);
}

/// A request of cost 0 takes nothing from the waiters ahead of it: it passes at
/// once, as it would in reject mode, instead of queueing behind them.
#[tokio::test(start_paused = true)]
async fn a_request_of_cost_zero_does_not_queue_behind_waiters() {
    let start = Instant::now();
    let q = queues::<u32>(1, Duration::from_secs(10), 100);
    assert!(q.acquire(1, 1).await.unwrap().is_allowed());
    let waiting = q.acquire(1, 1);
    assert!(waiting.is_waiting());
    let free = q.acquire(1, 0);
    assert!(
        !free.is_waiting(),
        "expected at {:?}",
        free.expected_admission()
    );
    assert!(free.await.unwrap().is_allowed());
    assert_eq!(Instant::now(), start);
    assert!(waiting.await.unwrap().is_allowed());
    assert_eq!(Instant::now(), start + ms(1501));
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_wait_would_exceed_the_bound_is_rejected_at_once() {
    let start = Instant::now();
    let q = queues::<u32>(2, Duration::from_millis(1600), 100);
    let now = q.acquire(1, 2).await.unwrap();
    assert!(now.is_allowed());
    // Exactly the bound: accepted.
    let third = q.acquire(1, 1);
    let fourth = q.acquire(1, 1);
    assert_eq!(third.expected_admission(), Some(start + ms(1501)));
    assert_eq!(fourth.expected_admission(), Some(start + ms(1501)));
    // Its turn would come at 3.002 s: rejected now, saying when.
    let fifth = q.acquire(1, 1);
    assert!(!fifth.is_waiting());
    let rejected = fifth.await.unwrap_err();
    assert_eq!(rejected.reason, WaitRejectReason::WaitTooLong);
    assert_eq!(rejected.decision.retry_after(), Some(ms(3002)));
    assert!(!rejected.decision.is_allowed());
    assert_eq!(Instant::now(), start, "no time passed");

    // A cost above the limit can never pass.
    let huge = q.acquire(1, 3).await.unwrap_err();
    assert_eq!(huge.reason, WaitRejectReason::CostExceedsLimit);

    // The waiters within the bound are admitted on time.
    let (a, b) = tokio::join!(third, fourth);
    assert!(a.unwrap().is_allowed() && b.unwrap().is_allowed());
    assert_eq!(Instant::now(), start + ms(1501));
    assert_eq!(q.stats().rejected_wait_too_long, 1);
}

#[tokio::test(start_paused = true)]
async fn at_max_keys_the_forecast_reads_the_overflow_ring_that_decides_the_key() {
    // Room for one key: key 1 takes it, so key 2 is counted in the overflow ring.
    let start = Instant::now();
    let policy = Policy::per(2, Duration::from_millis(1500)).unwrap();
    let limiter = Arc::new(Limiter::builder(policy).max_keys(1).build().unwrap());
    assert!(limiter.check(&1u32).is_allowed());
    let q = Arc::new(WaitQueues::new(
        limiter,
        WaitConfig::bounded(Duration::from_millis(1600), 100).unwrap(),
    ));
    let now = q.acquire(2, 2).await.unwrap();
    assert!(now.is_allowed() && now.is_overflow());
    // As for a tracked key: the first units leave the window at 1.501 s...
    let third = q.acquire(2, 1);
    let fourth = q.acquire(2, 1);
    assert_eq!(third.expected_admission(), Some(start + ms(1501)));
    assert_eq!(fourth.expected_admission(), Some(start + ms(1501)));
    // ...so a fifth's turn would come at 3.002 s: rejected now, saying when.
    let fifth = q.acquire(2, 1);
    assert!(
        !fifth.is_waiting(),
        "queued, expected at {:?}",
        fifth.expected_admission().map(|at| at - start)
    );
    let rejected = fifth.await.unwrap_err();
    assert_eq!(rejected.reason, WaitRejectReason::WaitTooLong);
    assert_eq!(rejected.decision.retry_after(), Some(ms(3002)));
    assert_eq!(Instant::now(), start, "no time passed");

    let (a, b) = tokio::join!(third, fourth);
    assert!(a.unwrap().is_allowed() && b.unwrap().is_allowed());
    assert_eq!(Instant::now(), start + ms(1501));
}

#[tokio::test(start_paused = true)]
async fn a_request_that_finds_the_queue_full_is_rejected_at_once() {
    let q = queues::<&str>(1, Duration::from_secs(60), 2);
    let _ = q.acquire("k", 1).await.unwrap();
    let w1 = q.acquire("k", 1);
    let w2 = q.acquire("k", 1);
    assert!(w1.is_waiting() && w2.is_waiting());
    let full = q.acquire("k", 1).await.unwrap_err();
    assert_eq!(full.reason, WaitRejectReason::QueueFull);
    // retry_after tells when its turn would have come (behind w1 and w2).
    assert_eq!(full.decision.retry_after(), Some(ms(4503)));
    // Another key is unaffected.
    assert!(q.acquire("other", 1).await.unwrap().is_allowed());
    assert_eq!(q.stats().rejected_queue_full, 1);
    drop((w1, w2));
    assert_eq!(q.stats().keys_waiting, 0, "cancelled queue is freed");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_head_lets_the_next_waiter_in_earlier() {
    let start = Instant::now();
    let q = queues::<u32>(2, Duration::from_secs(60), 100);
    let _ = q.acquire(1, 2).await.unwrap();
    let big = q.acquire(1, 2); // 1.501 s, taking both units
    let small = q.acquire(1, 1); // behind it: 3.002 s
    assert_eq!(small.expected_admission(), Some(start + ms(3002)));
    let small = tokio::spawn(async move {
        let _ = small.await.unwrap();
        Instant::now()
    });
    let big = tokio::spawn(big);
    advance(ms(500)).await;
    big.abort(); // a client gone, a timeout above: the head is dropped
    assert!(big.await.unwrap_err().is_cancelled());
    assert_eq!(small.await.unwrap(), start + ms(1501));
    let stats = q.stats();
    assert_eq!((stats.cancelled, stats.keys_waiting), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn an_admitted_waiter_dropped_before_its_turn_is_used_gives_its_unit_back() {
    let start = Instant::now();
    let q = queues::<u32>(2, Duration::from_secs(60), 100);
    let limiter = q.limiter().clone();
    let _ = q.acquire(1, 2).await.unwrap();
    let a = q.acquire(1, 1);
    let b = q.acquire(1, 1); // admitted with `a` at 1.501 s, but never polled
    let c = q.acquire(1, 1); // 3.002 s
    assert_eq!(c.expected_admission(), Some(start + ms(3002)));
    let a = tokio::spawn(a);
    let c = tokio::spawn(async move {
        let _ = c.await.unwrap();
        Instant::now()
    });
    sleep_until(start + ms(1502)).await;
    assert!(a.await.unwrap().unwrap().is_allowed());
    assert_eq!(limiter.usage(&1).used, 2, "a and b admitted");
    drop(b);
    assert_eq!(
        c.await.unwrap(),
        start + ms(1502),
        "c takes b's unit at once"
    );
    assert_eq!(limiter.usage(&1).used, 2);
    assert_eq!(q.stats().undone, 1);
}

/// An `Acquire` admitted on arrival but dropped before it was ever polled (say
/// the other branch of a `select!` won first) cancels its request: "dropping
/// it before it resolves ... gives back any units it was admitted with".
#[tokio::test(start_paused = true)]
async fn a_request_admitted_on_arrival_but_dropped_unpolled_gives_its_units_back() {
    let q = queues::<u32>(2, Duration::from_secs(60), 100);
    let unpolled = q.acquire(1, 2);
    assert!(!unpolled.is_waiting(), "admitted on arrival");
    drop(unpolled);
    assert_eq!(q.limiter().usage(&1).used, 0, "its units are back");
    let next = q.acquire(1, 2);
    assert!(!next.is_waiting(), "the next one is admitted at once");
    assert!(next.await.unwrap().is_allowed());
    assert_eq!(q.stats().undone, 1);
    // One that resolved keeps its units when dropped.
    assert_eq!(q.limiter().usage(&1).used, 2);
}

#[tokio::test(start_paused = true)]
async fn many_keys_waiting_at_once_do_not_interfere() {
    let start = Instant::now();
    let q = queues(2, Duration::from_secs(60), 100);
    let logs: Vec<Log> = (0..50).map(|_| Log::default()).collect();
    for (key, log) in logs.iter().enumerate() {
        spawn_waiters(&q, key as u32, 5, log);
    }
    sleep_until(start + Duration::from_secs(10)).await;
    let want: Vec<(usize, Instant)> = [0, 0, 1501, 1501, 3002]
        .iter()
        .enumerate()
        .map(|(i, &t)| (i, start + ms(t)))
        .collect();
    for log in &logs {
        assert_eq!(*log.lock().unwrap(), want);
    }
    let stats = q.stats();
    assert_eq!(stats.timers_created, 50 * 2);
    assert_eq!(stats.keys_waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn a_reservation_dropped_unused_gives_the_unit_back() {
    let policy = Policy::per(1, Duration::from_millis(1500)).unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let mut ready = Backpressure::new(limiter.clone());
    poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap();
    assert!(ready.is_reserved());
    assert_eq!(limiter.usage(&()).used, 1);

    // A clone starts without a reservation, and the window is full.
    let mut clone = ready.clone();
    assert!(!clone.is_reserved());
    let pending = poll_fn(|cx| std::task::Poll::Ready(clone.poll_reserve(cx).is_pending())).await;
    assert!(pending);

    drop(ready);
    assert_eq!(limiter.usage(&()).used, 0, "the unused unit is back");
    // The clone (the head, woken by the freed unit) gets it without waiting.
    let start = Instant::now();
    poll_fn(|cx| clone.poll_reserve(cx)).await.unwrap();
    assert_eq!(Instant::now(), start);
    assert!(clone.take().unwrap().is_allowed());
    assert!(clone.take().is_none(), "a reservation is spent once");
}

#[tokio::test(start_paused = true)]
async fn every_clone_waiting_on_a_global_limit_is_served_in_turn() {
    let start = Instant::now();
    let policy = Policy::per(2, Duration::from_millis(1500)).unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let service = Backpressure::new(limiter);
    let log: Log = Default::default();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let mut ready = service.clone();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..2 {
                poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap();
                assert!(ready.take().is_some());
                log.lock().unwrap().push((i, Instant::now()));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 12, "every waiter progressed");
    // Two per 1.501 s, never more.
    for (n, (_, at)) in log.iter().enumerate() {
        assert_eq!(*at, start + ms((n as u64 / 2) * 1501));
    }
    // Every task had both its turns.
    for i in 0..6 {
        assert_eq!(log.iter().filter(|e| e.0 == i).count(), 2);
    }
    let stats = service.queue().stats();
    assert!(stats.timers_created <= stats.admitted_after_wait);
}

#[tokio::test(start_paused = true)]
async fn a_reservation_kept_past_its_bucket_is_renewed_before_use() {
    let policy = Policy::per(2, Duration::from_millis(1500)).unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let mut ready = Backpressure::new(limiter.clone());
    poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap();
    advance(ms(250)).await;
    let unit = ready.take().unwrap();
    // Buckets of 1.5 s / 7 (214.3 ms): 250 ms lies in the second.
    assert_eq!(
        unit.recorded_slot(),
        1,
        "counted again in the bucket it is spent in"
    );
    assert_eq!(limiter.usage(&()).used, 1, "the old unit was given back");
    // WaitStats: an undone admission's "next admission counts again in
    // admitted_after_wait", not as admitted on arrival.
    let stats = ready.queue().stats();
    assert_eq!(
        (
            stats.admitted_at_once,
            stats.admitted_after_wait,
            stats.undone
        ),
        (1, 1, 1),
        "{stats:?}"
    );
}

/// Real threads and a running clock: no deadlock, nobody stranded, and the
/// admitted units never exceed the limit in any N consecutive buckets (a
/// window always covers them; the oldest of N + 1 counts until its newest
/// admission has left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_waiters_on_real_threads_stay_within_the_limit() {
    let policy = Policy::builder()
        .limit(10)
        .window(Duration::from_millis(100))
        .buckets(10)
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let q = Arc::new(WaitQueues::new(
        limiter,
        WaitConfig::bounded(Duration::from_secs(5), 1000).unwrap(),
    ));
    let slots = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let (q, slots) = (q.clone(), slots.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..15u64 {
                // Some waiters give up early: cancellation races with admission.
                let waiter = q.acquire(0u8, 1 + (i % 2) as u32);
                let patience = Duration::from_millis(if (t + i) % 7 == 0 { 5 } else { 5_000 });
                if let Ok(Ok(d)) = tokio::time::timeout(patience, waiter).await {
                    slots.lock().unwrap().push((d.recorded_slot(), d.cost()));
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let slots = slots.lock().unwrap().clone();
    assert!(slots.len() > 30);
    for &(x, _) in &slots {
        let span: u32 = slots
            .iter()
            .filter(|(y, _)| *y <= x && y + 9 >= x)
            .map(|(_, c)| c)
            .sum();
        assert!(
            span <= 10,
            "{span} units in the 10 buckets ending at slot {x}"
        );
    }
    assert_eq!(q.stats().keys_waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn renewing_a_stale_reservation_behind_a_waiter_cancels_no_waiter() {
    // 1 per 1.5 s: `ready` reserves the unit at 0; `other` waits for it from 100 ms.
    let policy = Policy::per(1, Duration::from_millis(1500)).unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let mut ready = Backpressure::new(limiter.clone());
    poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap();
    advance(ms(100)).await;
    let mut other = ready.clone();
    let waiting = tokio::spawn(async move {
        poll_fn(|cx| other.poll_reserve(cx)).await.unwrap();
        other.take().is_some()
    });
    tokio::task::yield_now().await;
    advance(ms(150)).await;
    // Spent at 250 ms, past its bucket (1.5 s / 7: 214.3 ms), the reservation
    // is stale: it is given back, and with a waiter ahead it is not renewed.
    assert!(ready.take().is_none());
    assert!(waiting.await.unwrap(), "the waiter got the unit given back");
    let stats = ready.queue().stats();
    // No waiter was dropped before its turn: nobody cancelled anything.
    assert_eq!(stats.cancelled, 0, "{stats:?}");
}

/// An interpolated policy admits earlier than the strict forecast: with nobody
/// ahead, a request is not turned away for a wait it will not have.
#[tokio::test(start_paused = true)]
async fn an_interpolated_policy_is_not_rejected_for_the_strict_forecasts_wait() {
    let start = Instant::now();
    // 10 per second in 100 ms buckets, the oldest weighted by its overlap.
    let policy = Policy::builder()
        .limit(10)
        .window(ms(1000))
        .buckets(10)
        .precision(crate::Precision::Interpolated)
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(policy).unwrap());
    let q = Arc::new(WaitQueues::new(
        limiter.clone(),
        WaitConfig::bounded(ms(50), 16).unwrap(),
    ));
    for _ in 0..10 {
        assert!(limiter.check(&7).is_allowed());
    }
    sleep_until(start + ms(1000)).await;
    // The full bucket of slot 0 is weighted by the part of it still in the
    // window: one unit fits 10 ms on (strictly, only at 1.1 s).
    assert_eq!(limiter.peek(&7, 1).retry_after(), Some(ms(10)));
    let waiter = q.acquire(7, 1);
    assert!(waiter.is_waiting(), "{:?}", q.stats());
    assert!(waiter.await.unwrap().is_allowed());
    assert_eq!(Instant::now(), start + ms(1010));
    assert_eq!(q.stats().rejected_wait_too_long, 0);

    // A longer wait is still turned away at once, saying how long: 6 units
    // fit once 7 of the 10 have left, at 1.07 s.
    assert_eq!(limiter.peek(&7, 6).retry_after(), Some(ms(60)));
    let rejected = q.acquire(7, 6).await.unwrap_err();
    assert_eq!(rejected.reason, WaitRejectReason::WaitTooLong);
    assert_eq!(rejected.decision.retry_after(), Some(ms(60)));
    assert_eq!(Instant::now(), start + ms(1010));
}

/// Two waiters admitted in batches but polled only later, when the first one's
/// units have left the window and the second one's have not. The first, polled
/// first, waits again and becomes the head: denied (the window holds the second
/// one's unit), it sleeps until that unit leaves (4.503 s). The second, polled
/// next, gives that unit back: the head must be woken for it and admitted now,
/// not when its denial said.
#[tokio::test(start_paused = true)]
async fn a_head_is_woken_for_the_units_a_later_waiter_polled_late_gives_back() {
    let start = Instant::now();
    let q = queues::<u32>(2, Duration::from_secs(60), 100);
    let at = |t: u64| start + ms(t);
    let _ = q.acquire(1, 2).await.unwrap();
    // h1 admits itself and e1 at 1.501 s; h2 admits itself and e2 at 3.002 s.
    let h1 = tokio::spawn(q.acquire(1, 1));
    let e1 = q.acquire(1, 1);
    let h2 = tokio::spawn(q.acquire(1, 1));
    let mut e2 = q.acquire(1, 1);
    assert_eq!(e1.expected_admission(), Some(at(1501)));
    assert_eq!(e2.expected_admission(), Some(at(3002)));
    assert!(h1.await.unwrap().unwrap().is_allowed());
    assert!(h2.await.unwrap().unwrap().is_allowed());
    assert_eq!(Instant::now(), at(3002));

    // e1's unit (1.501 s) has left the window; e2's (3.002 s) is in it, with h2's.
    sleep_until(at(3300)).await;
    let e1 = tokio::spawn(async move {
        let _ = e1.await.unwrap();
        Instant::now()
    });
    tokio::task::yield_now().await; // e1 waits again, at the head, denied
    let polled = poll_fn(|cx| std::task::Poll::Ready(Pin::new(&mut e2).poll(cx))).await;
    assert!(polled.is_pending(), "e2 waits again behind e1");
    assert_eq!(q.limiter().usage(&1).used, 1, "e2's unit is back");
    let e2 = tokio::spawn(async move {
        let _ = e2.await.unwrap();
        Instant::now()
    });
    // e1 takes e2's unit now; e2 waits for h2's to leave (4.503 s).
    assert_eq!(e1.await.unwrap() - start, ms(3300), "e1 takes e2's unit");
    assert_eq!(e2.await.unwrap() - start, ms(4503));
    assert_eq!(q.stats().undone, 2);
}

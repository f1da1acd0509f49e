//! The wait path: cost per admitted waiter and timers per waiter, against a naive
//! "check, sleep retry_after, check again" loop (what a caller without a queue
//! does), in the same run. Time is tokio's paused clock, so the figures are the
//! CPU cost of queueing, timers and wake-ups, not the waits themselves.
//!
//! `cargo bench --bench wait` (add `-- --quick` for a short run).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_sliding_window::wait::WaitQueues;
use tower_sliding_window::{Limiter, Policy, WaitConfig};

struct Run {
    nanos_per_waiter: f64,
    timers_per_waiter: f64,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn limiter(limit: u32) -> Arc<Limiter<u32>> {
    // 100 ms buckets.
    Arc::new(Limiter::new(Policy::per(limit, Duration::from_millis(1500)).unwrap()).unwrap())
}

/// `keys` × `per_key` requests arrive at once; each waits in the key's queue.
fn queued(keys: u32, per_key: u32, limit: u32) -> Run {
    let rt = runtime();
    rt.block_on(async {
        let queues = Arc::new(WaitQueues::new(
            limiter(limit),
            WaitConfig::bounded(Duration::from_secs(3600), per_key as usize).unwrap(),
        ));
        let started = Instant::now();
        let mut tasks = Vec::with_capacity((keys * per_key) as usize);
        for _ in 0..per_key {
            for key in 0..keys {
                let waiter = queues.acquire(key, 1);
                tasks.push(tokio::spawn(waiter));
            }
        }
        for t in tasks {
            assert!(t.await.unwrap().unwrap().is_allowed());
        }
        let elapsed = started.elapsed();
        let stats = queues.stats();
        let n = (keys * per_key) as f64;
        assert_eq!(stats.admitted_at_once + stats.admitted_after_wait, n as u64);
        Run {
            nanos_per_waiter: elapsed.as_nanos() as f64 / n,
            timers_per_waiter: stats.timers_created as f64 / stats.admitted_after_wait as f64,
        }
    })
}

/// The same load, each request retrying on its own: check, sleep `retry_after`.
fn naive(keys: u32, per_key: u32, limit: u32) -> Run {
    let rt = runtime();
    rt.block_on(async {
        let limiter = limiter(limit);
        let sleeps = Arc::new(AtomicU64::new(0));
        let waited = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::with_capacity((keys * per_key) as usize);
        for _ in 0..per_key {
            for key in 0..keys {
                let (limiter, sleeps, waited) = (limiter.clone(), sleeps.clone(), waited.clone());
                tasks.push(tokio::spawn(async move {
                    let mut first = true;
                    loop {
                        let d = limiter.check_n(&key, 1);
                        if d.is_allowed() {
                            return;
                        }
                        if first {
                            waited.fetch_add(1, Relaxed);
                            first = false;
                        }
                        sleeps.fetch_add(1, Relaxed);
                        tokio::time::sleep(d.retry_after().unwrap()).await;
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let elapsed = started.elapsed();
        let n = (keys * per_key) as f64;
        Run {
            nanos_per_waiter: elapsed.as_nanos() as f64 / n,
            timers_per_waiter: sleeps.load(Relaxed) as f64 / waited.load(Relaxed) as f64,
        }
    })
}

/// A hand-rolled FIFO for comparison: tokio's fair `Semaphore`, refilled with
/// `limit` permits per key every 1.6 s by one timer task (a fixed window, with no
/// sliding-window guarantee and no bound on the wait).
fn semaphore(keys: u32, per_key: u32, limit: u32) -> f64 {
    let rt = runtime();
    rt.block_on(async {
        let sems: Vec<Arc<tokio::sync::Semaphore>> = (0..keys)
            .map(|_| Arc::new(tokio::sync::Semaphore::new(limit as usize)))
            .collect();
        let refill = {
            let sems = sems.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(1600)).await;
                    for s in &sems {
                        s.add_permits(limit as usize);
                    }
                }
            })
        };
        let started = Instant::now();
        let mut tasks = Vec::with_capacity((keys * per_key) as usize);
        for _ in 0..per_key {
            for sem in &sems {
                let sem = sem.clone();
                tasks.push(tokio::spawn(async move {
                    sem.acquire().await.unwrap().forget();
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let elapsed = started.elapsed();
        refill.abort();
        elapsed.as_nanos() as f64 / (keys * per_key) as f64
    })
}

/// The floor: the same number of tasks, each admitted by one `check_n` (no wait).
fn spawned_checks(keys: u32, per_key: u32) -> f64 {
    let rt = runtime();
    rt.block_on(async {
        let limiter = limiter(u32::MAX / 2);
        let started = Instant::now();
        let mut tasks = Vec::with_capacity((keys * per_key) as usize);
        for _ in 0..per_key {
            for key in 0..keys {
                let limiter = limiter.clone();
                tasks.push(tokio::spawn(async move {
                    assert!(limiter.check_n(&key, 1).is_allowed());
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        started.elapsed().as_nanos() as f64 / (keys * per_key) as f64
    })
}

/// `acquire` on a key without waiters (admitted at once) against a bare `check_n`.
fn fast_path(iters: u32) -> (f64, f64) {
    let rt = runtime();
    rt.block_on(async {
        let limit = u32::MAX / 2;
        let queues = Arc::new(WaitQueues::new(
            limiter(limit),
            WaitConfig::bounded(Duration::from_secs(1), 16).unwrap(),
        ));
        let bare = limiter(limit);
        let started = Instant::now();
        for i in 0..iters {
            let _ = std::hint::black_box(bare.check_n(&(i % 64), 1));
        }
        let check = started.elapsed().as_nanos() as f64 / iters as f64;
        let started = Instant::now();
        for i in 0..iters {
            let a = queues.acquire(i % 64, 1);
            let _ = std::hint::black_box(a.await.unwrap());
        }
        let acquire = started.elapsed().as_nanos() as f64 / iters as f64;
        (check, acquire)
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if std::env::args().any(|a| a == "--profile-queue") {
        // For `perf record`: the queued scenario alone.
        for _ in 0..20 {
            queued(1, 2_000, 1);
        }
        return;
    }
    let reps = if quick { 3 } else { 7 };
    println!("wait path (paused tokio clock; median of {reps} runs)");
    println!(
        "{:<34} {:>14} {:>14} {:>9}",
        "scenario", "ns/waiter", "timers/waiter", "vs naive"
    );
    for (keys, per_key, limit) in [(1, 2_000, 50), (100, 40, 5), (1, 2_000, 1)] {
        let q: Vec<Run> = (0..reps).map(|_| queued(keys, per_key, limit)).collect();
        let n: Vec<Run> = (0..reps).map(|_| naive(keys, per_key, limit)).collect();
        let (qt, nt) = (
            median(q.iter().map(|r| r.nanos_per_waiter).collect()),
            median(n.iter().map(|r| r.nanos_per_waiter).collect()),
        );
        let floor = median((0..reps).map(|_| spawned_checks(keys, per_key)).collect());
        let sem = median((0..reps).map(|_| semaphore(keys, per_key, limit)).collect());
        let name = format!("{keys} key(s) x {per_key}, limit {limit}");
        println!(
            "{:<34} {:>14.0} {:>14.3} {:>8.2}x",
            format!("queue: {name}"),
            qt,
            q[0].timers_per_waiter,
            qt / nt
        );
        println!(
            "{:<34} {:>14.0} {:>14.3} {:>9}",
            format!("naive: {name}"),
            nt,
            n[0].timers_per_waiter,
            "1.00x"
        );
        println!(
            "{:<34} {:>14.0} {:>14} {:>8.2}x",
            "tokio Semaphore refilled by a timer",
            sem,
            "-",
            sem / nt
        );
        println!(
            "{:<34} {:>14.0} {:>14} {:>8.2}x   (queue overhead over this floor: {:.0} ns/waiter)",
            "floor: spawn + one check_n",
            floor,
            "-",
            floor / nt,
            qt - floor
        );
    }
    let iters = if quick { 100_000 } else { 1_000_000 };
    let runs: Vec<(f64, f64)> = (0..reps).map(|_| fast_path(iters)).collect();
    let check = median(runs.iter().map(|r| r.0).collect());
    let acquire = median(runs.iter().map(|r| r.1).collect());
    println!(
        "no waiters: check_n {check:.0} ns, acquire+await {acquire:.0} ns ({:.2}x)",
        acquire / check
    );
}

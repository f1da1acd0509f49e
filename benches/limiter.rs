//! Ours (`Limiter::check`) against governor's keyed limiter (`check_key`), in the
//! same run, on the same workloads. Each group holds one workload; its two
//! functions are `ours` and `governor`, so criterion's report reads as a table.
//!
//! Run: `cargo bench --bench limiter`, then `python3 benches/table.py` for the
//! ratios (ours / governor time; 2-thread / 1-thread throughput).
//!
//! Both limiters run on their default clocks (ours: `AutoClock`, which outside a
//! paused tokio runtime reads `CLOCK_MONOTONIC_COARSE`; governor: quanta) and their
//! default hashers, with `u64` keys; `ours_tokio` is ours on `TokioClock` (the tower
//! layer's clock).
//! - `*_allowed`: a limit far above the request rate (1e9 per second), so every
//!   check is admitted and counted.
//! - `*_denied`: 1 per hour, so after the first check every check is denied (the
//!   path a flood of over-limit requests takes).

mod support;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use support::{Cursor, Keys};
use tower_sliding_window::{Clock, Limiter, Policy, TokioClock};

/// Keys in the round-robin workloads.
const KEYS: u64 = 100_000;
const THREADS: u64 = 2;

/// What both limiters are asked: one check of one unit for a key.
trait Check: Sync {
    fn check(&self, key: &u64) -> bool;
}

impl<C: Clock> Check for Limiter<u64, C> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        Limiter::check(self, key).is_allowed()
    }
}

impl Check for DefaultKeyedRateLimiter<u64> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.check_key(key).is_ok()
    }
}

#[derive(Clone, Copy)]
enum Load {
    Allowed,
    Denied,
}

fn policy(load: Load) -> Policy {
    match load {
        Load::Allowed => Policy::per(1_000_000_000, Duration::from_secs(1)),
        Load::Denied => Policy::per(1, Duration::from_secs(3600)),
    }
    .unwrap()
}

/// Ours on its default clock.
fn ours(load: Load) -> Limiter<u64> {
    Limiter::builder(policy(load))
        .max_keys(2 * KEYS as usize)
        .build()
        .unwrap()
}

/// Ours on `TokioClock` (what the tower layer uses).
fn ours_tokio(load: Load) -> Limiter<u64, TokioClock> {
    Limiter::builder(policy(load))
        .clock(TokioClock::new())
        .max_keys(2 * KEYS as usize)
        .build()
        .unwrap()
}

fn governor(load: Load) -> DefaultKeyedRateLimiter<u64> {
    let quota = match load {
        Load::Allowed => Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
        Load::Denied => Quota::per_hour(NonZeroU32::new(1).unwrap()),
    };
    RateLimiter::keyed(quota)
}

/// Track every key the workload uses before measuring.
fn warm<L: Check>(l: &L, keys: Keys, threads: u64) {
    for t in 0..threads {
        let mut cursor = Cursor::new(keys, t);
        for _ in 0..cursor.len {
            l.check(&cursor.next_key());
        }
    }
}

/// `threads` threads each run `iters` checks, started together; the time is the
/// slowest thread's, so throughput = threads × iters / time.
fn run_parallel<L: Check>(l: &L, threads: u64, keys: Keys, iters: u64) -> Duration {
    let barrier = Barrier::new(threads as usize);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut cursor = Cursor::new(keys, t);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(l.check(black_box(&cursor.next_key())));
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

fn bench_single<L: Check>(group: &mut BenchmarkGroup<'_, WallTime>, id: &str, l: &L, keys: Keys) {
    warm(l, keys, 1);
    group.bench_function(id, |b| {
        let mut cursor = Cursor::new(keys, 0);
        b.iter(|| black_box(l.check(black_box(&cursor.next_key()))))
    });
}

fn single_thread(c: &mut Criterion, name: &str, load: Load, keys: Keys) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    bench_single(&mut group, "ours", &ours(load), keys);
    bench_single(&mut group, "ours_tokio", &ours_tokio(load), keys);
    bench_single(&mut group, "governor", &governor(load), keys);
    group.finish();
}

fn bench_multi<L: Check>(group: &mut BenchmarkGroup<'_, WallTime>, id: &str, l: &L, keys: Keys) {
    warm(l, keys, THREADS);
    group.bench_function(id, |b| {
        b.iter_custom(|iters| run_parallel(l, THREADS, keys, iters))
    });
}

fn multi_thread(c: &mut Criterion, name: &str, load: Load, keys: Keys) {
    let mut group = c.benchmark_group(name);
    // One iteration = one check on each thread: criterion's throughput is the total.
    group.throughput(Throughput::Elements(THREADS));
    bench_multi(&mut group, "ours", &ours(load), keys);
    bench_multi(&mut group, "ours_tokio", &ours_tokio(load), keys);
    bench_multi(&mut group, "governor", &governor(load), keys);
    group.finish();
}

fn workloads(c: &mut Criterion) {
    single_thread(c, "1t_hot_key_allowed", Load::Allowed, Keys::One);
    single_thread(c, "1t_hot_key_denied", Load::Denied, Keys::One);
    single_thread(
        c,
        "1t_100k_keys_allowed",
        Load::Allowed,
        Keys::OwnRange(KEYS),
    );
    single_thread(c, "1t_100k_keys_denied", Load::Denied, Keys::OwnRange(KEYS));
    multi_thread(c, "2t_one_key_allowed", Load::Allowed, Keys::One);
    multi_thread(c, "2t_one_key_denied", Load::Denied, Keys::One);
    multi_thread(c, "2t_own_key_allowed", Load::Allowed, Keys::OwnKey);
    multi_thread(
        c,
        "2t_own_50k_keys_allowed",
        Load::Allowed,
        Keys::OwnRange(KEYS / THREADS),
    );
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .nresamples(10_000)
        .without_plots()
        .noise_threshold(0.05)
}

criterion_group! {
    name = benches;
    config = config();
    targets = workloads
}
criterion_main!(benches);

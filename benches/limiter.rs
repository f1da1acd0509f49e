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

#[path = "support/limiters.rs"]
mod limiters;
mod support;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use limiters::{governor, ours, ours_tokio, run_parallel, warm, Check, Load, KEYS};
use std::hint::black_box;
use std::time::Duration;
use support::{Cursor, Keys};

const THREADS: u64 = 2;

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
    single_thread(
        c,
        "1t_100k_keys_random_allowed",
        Load::Allowed,
        Keys::OwnRangeShuffled(KEYS),
    );
    single_thread(
        c,
        "1t_100k_keys_random_denied",
        Load::Denied,
        Keys::OwnRangeShuffled(KEYS),
    );
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

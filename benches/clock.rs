//! Does reading the clock dominate a check? The cost of each monotonic source, and
//! one hot-key check on a clock that costs nothing (`ManualClock`, one atomic load)
//! against the real ones, with governor's keyed check on its real and fake clocks
//! alongside.
//!
//! Run: `cargo bench --bench clock`.

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;
use tower_sliding_window::clock::{Clock, CoarseClock, TokioClock};
use tower_sliding_window::{Limiter, ManualClock, Policy};

fn clock_reads(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock_read");
    let tokio_clock = TokioClock::new();
    group.bench_function("TokioClock::now_nanos", |b| {
        b.iter(|| black_box(tokio_clock.now_nanos()))
    });
    group.bench_function("std::time::Instant::now", |b| {
        b.iter(|| black_box(std::time::Instant::now()))
    });
    let quanta_clock = quanta::Clock::new();
    group.bench_function("quanta::Clock::raw+delta (governor)", |b| {
        b.iter(|| {
            let raw = quanta_clock.raw();
            black_box(quanta_clock.delta_as_nanos(0, raw))
        })
    });
    group.bench_function("quanta::Instant::now", |b| {
        b.iter(|| black_box(quanta::Instant::now()))
    });
    group.bench_function("CLOCK_MONOTONIC (rustix)", |b| {
        b.iter(|| {
            black_box(rustix::time::clock_gettime(
                rustix::time::ClockId::Monotonic,
            ))
        })
    });
    group.bench_function("CLOCK_MONOTONIC_COARSE (rustix)", |b| {
        b.iter(|| {
            black_box(rustix::time::clock_gettime(
                rustix::time::ClockId::MonotonicCoarse,
            ))
        })
    });
    let coarse = CoarseClock::new();
    group.bench_function("CoarseClock::now_nanos", |b| {
        b.iter(|| black_box(coarse.now_nanos()))
    });
    let manual = ManualClock::new();
    group.bench_function("ManualClock::now_nanos", |b| {
        b.iter(|| black_box(manual.now_nanos()))
    });
    group.finish();
}

fn policy() -> Policy {
    Policy::per(1_000_000_000, Duration::from_secs(1)).unwrap()
}

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap())
}

fn bench_ours<C: Clock>(group: &mut BenchmarkGroup<'_, WallTime>, id: &str, clock: C) {
    let limiter: Limiter<u64, C> = Limiter::builder(policy()).clock(clock).build().unwrap();
    let _ = limiter.check(&0);
    group.bench_function(id, |b| b.iter(|| black_box(limiter.check(black_box(&0)))));
}

fn checks(c: &mut Criterion) {
    let mut group = c.benchmark_group("check_hot_key_by_clock");
    bench_ours(&mut group, "ours/ManualClock", ManualClock::new());
    bench_ours(&mut group, "ours/TokioClock", TokioClock::new());
    bench_ours(&mut group, "ours/CoarseClock", CoarseClock::new());
    let real = RateLimiter::keyed(quota());
    real.check_key(&0u64).unwrap();
    group.bench_function("governor/QuantaClock", |b| {
        b.iter(|| black_box(real.check_key(black_box(&0u64)).is_ok()))
    });
    let fake = RateLimiter::dashmap_with_clock(quota(), FakeRelativeClock::default());
    fake.check_key(&0u64).unwrap();
    group.bench_function("governor/FakeRelativeClock", |b| {
        b.iter(|| black_box(fake.check_key(black_box(&0u64)).is_ok()))
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .nresamples(10_000)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = clock_reads, checks
}
criterion_main!(benches);

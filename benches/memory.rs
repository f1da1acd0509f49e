//! Memory for 1M tracked keys. First the process's RSS on the system allocator
//! (glibc's malloc on Linux) with a background sweeper (`support/rss.rs`;
//! `benches/memory_mimalloc.rs` does the same on mimalloc), while this process
//! has allocated nothing else yet. Then ours against governor's keyed limiter,
//! counted by a global allocator wrapper (bytes requested from the allocator,
//! not RSS), whether the 1M idle keys are given back without user code, and
//! what a sweep of every partition costs.
//!
//! Run: `cargo bench --bench memory`.

#[path = "support/rss.rs"]
mod rss;

use cap::Cap;
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use std::alloc::System;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};
use tower_sliding_window::{Limiter, ManualClock, Policy};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

const KEYS: u64 = 1_000_000;
const WINDOW: Duration = Duration::from_secs(1);
const LIMIT: u32 = 100;
/// The key that keeps checking after the others went idle.
const HOT: u64 = u64::MAX;
/// Give up if reclamation takes more slots than this.
const MAX_SLOTS: u64 = 100_000;

fn heap() -> usize {
    ALLOCATOR.allocated()
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn ours() {
    let clock = ManualClock::new();
    let base = heap();
    let limiter: Limiter<u64, ManualClock> = Limiter::builder(Policy::per(LIMIT, WINDOW).unwrap())
        .clock(clock.clone())
        .max_keys(1 << 20)
        .build()
        .unwrap();
    let empty = heap() - base;
    for k in 0..KEYS {
        let _ = limiter.check(&k);
    }
    let full = heap() - base;
    assert_eq!(limiter.stats().keys_tracked, KEYS as usize);
    println!(
        "ours      1M keys: {:7.1} MiB, {:6.1} bytes per tracked key (empty limiter {:.2} MiB)",
        mib(full),
        (full - empty) as f64 / KEYS as f64,
        mib(empty)
    );

    // Every key goes idle; one hot key keeps checking, once per bucket width.
    let bucket = limiter.policy().bucket_width();
    clock.advance(WINDOW + bucket);
    let mut slots = 0u64;
    let mut times = Vec::new();
    while limiter.stats().keys_tracked > 1 && slots < MAX_SLOTS {
        clock.advance(bucket);
        let t = Instant::now();
        let _ = limiter.check(&HOT);
        times.push(t.elapsed());
        slots += 1;
    }
    times.sort();
    let spent: Duration = times.iter().sum();
    let after = heap() - base;
    let stats = limiter.stats();
    println!(
        "ours      reclaimed by itself: keys_tracked {} (evicted {}) after {} checks of one hot key, \
         one per bucket width ({} slots = {:.1} s of clock time for a {:?} window)",
        stats.keys_tracked,
        stats.keys_evicted,
        slots,
        slots,
        slots as f64 * bucket.as_secs_f64(),
        WINDOW
    );
    println!(
        "ours      heap after reclamation: {:.2} MiB ({} bytes); a sweeping check (one \
         partition, ~{} keys): median {:?}, slowest {:?}, all {} checks {:?}",
        mib(after),
        after,
        KEYS / slots.max(1),
        times.get(times.len() / 2).copied().unwrap_or_default(),
        times.last().copied().unwrap_or_default(),
        slots,
        spent
    );
}

fn governor() {
    let clock = FakeRelativeClock::default();
    let base = heap();
    let limiter = RateLimiter::dashmap_with_clock(
        Quota::per_second(NonZeroU32::new(LIMIT).unwrap()),
        clock.clone(),
    );
    let empty = heap() - base;
    for k in 0..KEYS {
        let _ = limiter.check_key(&k);
    }
    let full = heap() - base;
    println!(
        "governor  1M keys: {:7.1} MiB, {:6.1} bytes per tracked key (empty limiter {:.2} MiB)",
        mib(full),
        (full - empty) as f64 / KEYS as f64,
        mib(empty)
    );

    // The same idle period and hot-key traffic: nothing is given back.
    let bucket = WINDOW / Policy::DEFAULT_BUCKETS;
    clock.advance(WINDOW + bucket);
    for _ in 0..256 {
        clock.advance(bucket);
        let _ = limiter.check_key(&HOT);
    }
    println!(
        "governor  after the same hot-key traffic: len {} , heap {:.1} MiB (nothing reclaimed)",
        limiter.len(),
        mib(heap() - base)
    );
    let t = Instant::now();
    limiter.retain_recent();
    let retain = t.elapsed();
    println!(
        "governor  after user calls retain_recent(): len {}, heap {:.1} MiB ({:?})",
        limiter.len(),
        mib(heap() - base),
        retain
    );
    let t = Instant::now();
    limiter.shrink_to_fit();
    let shrink = t.elapsed();
    let after = heap() - base;
    println!(
        "governor  after user calls shrink_to_fit(): heap {:.2} MiB ({} bytes) ({:?})",
        mib(after),
        after,
        shrink
    );
}

/// A sweep of every partition (a background sweeper's round) while every key
/// is in its window, so nothing is evicted: what a round costs at each size.
fn rounds() {
    for keys in [10_000u64, 100_000, 1_000_000] {
        let limiter: Limiter<u64, ManualClock> =
            Limiter::builder(Policy::per(LIMIT, WINDOW).unwrap())
                .clock(ManualClock::new())
                .max_keys((keys as usize).max(Limiter::DEFAULT_MAX_KEYS))
                .build()
                .unwrap();
        for k in 0..keys {
            let _ = limiter.check(&k);
        }
        let mut times: Vec<Duration> = (0..7)
            .map(|_| {
                let t = Instant::now();
                assert_eq!(limiter.evict_idle(), 0);
                t.elapsed()
            })
            .collect();
        times.sort();
        let median = times[times.len() / 2];
        let bucket = limiter.policy().bucket_width();
        println!(
            "ours      a round over {keys:>9} keys in their window: median {median:.2?} \
             ({:.1} ns a key; {:.1}% of one core at one round per bucket width, {bucket:.1?})",
            median.as_nanos() as f64 / keys as f64,
            100.0 * median.as_secs_f64() / bucket.as_secs_f64()
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    // RSS first, before anything else has touched the heap.
    rss::run("system", heap);
    ours();
    governor();
    rounds();
}

//! Memory for 1M tracked keys, ours against governor's keyed limiter in one
//! run. First the process's RSS on the system allocator (glibc's malloc on
//! Linux) with a background sweeper (`support/rss.rs`;
//! `benches/memory_mimalloc.rs` does the same on mimalloc), while this process
//! has allocated nothing else yet. Then, counted by a global allocator wrapper
//! (bytes requested from the allocator, not RSS): heap per tracked key for
//! each key type and ring width, the time a flood of 1M new keys takes, the
//! time to drop 1M idle keys in bulk (ours `evict_idle()` against governor's
//! `retain_recent()`, alternated), the keys given back by checks alone, and
//! what a sweep of every partition costs.
//!
//! Run: `cargo bench --bench memory`.

#[path = "support/rss.rs"]
mod rss;

use cap::Cap;
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use std::alloc::System;
use std::hash::Hash;
use std::net::IpAddr;
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
/// Bulk evictions timed for each contender, alternated.
const EVICTIONS: usize = 5;

fn heap() -> usize {
    ALLOCATOR.allocated()
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// A u64 id, and an address as the IP extractors key it (17 bytes).
fn ip(k: u64) -> IpAddr {
    IpAddr::from(((k as u128) << 64).to_be_bytes())
}

fn ours_with<K: Hash + Eq + Clone + Send + Sync + 'static>(
    policy: Policy,
) -> (Limiter<K, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(policy)
        .clock(clock.clone())
        .max_keys(1 << 20)
        .build()
        .unwrap();
    (limiter, clock)
}

/// Heap per tracked key, and the time a flood of new keys takes to insert.
fn per_key<K: Hash + Eq + Clone + Send + Sync + 'static>(
    name: &str,
    policy: Policy,
    key: impl Fn(u64) -> K,
) {
    let base = heap();
    let (limiter, _clock) = ours_with::<K>(policy);
    let empty = heap() - base;
    let start = Instant::now();
    for k in 0..KEYS {
        let _ = limiter.check(&key(k));
    }
    let flood = start.elapsed();
    let full = heap() - base;
    assert_eq!(limiter.stats().keys_tracked, KEYS as usize);
    println!(
        "ours      {name:<34} {:6.1} bytes per tracked key ({:6.1} MiB for 1M; empty limiter \
         {:.2} MiB); 1M new keys in {flood:.2?}",
        (full - empty) as f64 / KEYS as f64,
        mib(full),
        mib(empty),
    );
}

fn governor_per_key<K: Hash + Eq + Clone>(name: &str, key: impl Fn(u64) -> K) {
    let base = heap();
    let limiter = RateLimiter::dashmap_with_clock(
        Quota::per_second(NonZeroU32::new(LIMIT).unwrap()),
        FakeRelativeClock::default(),
    );
    let start = Instant::now();
    for k in 0..KEYS {
        let _ = limiter.check_key(&key(k));
    }
    let flood = start.elapsed();
    let full = heap() - base;
    println!(
        "governor  {name:<34} {:6.1} bytes per tracked key ({:6.1} MiB for 1M); 1M new keys in \
         {flood:.2?}",
        full as f64 / KEYS as f64,
        mib(full),
    );
}

/// Bulk eviction of 1M idle keys: ours `evict_idle()` (and the heap it
/// leaves), governor's `retain_recent()` then `shrink_to_fit()`; each timed
/// `EVICTIONS` times on a fresh flood, the two alternated.
fn eviction() {
    let mut ours_times = Vec::new();
    let mut ours_after = 0;
    let mut governor_times = Vec::new();
    let mut shrink_times = Vec::new();
    for _ in 0..EVICTIONS {
        let base = heap();
        let (limiter, clock) = ours_with::<u64>(Policy::per(LIMIT, WINDOW).unwrap());
        for k in 0..KEYS {
            let _ = limiter.check(&k);
        }
        clock.advance(2 * WINDOW);
        let start = Instant::now();
        let dropped = limiter.evict_idle();
        ours_times.push(start.elapsed());
        assert_eq!(dropped, KEYS as usize);
        ours_after = heap() - base;
        drop(limiter);

        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::dashmap_with_clock(
            Quota::per_second(NonZeroU32::new(LIMIT).unwrap()),
            clock.clone(),
        );
        for k in 0..KEYS {
            let _ = limiter.check_key(&k);
        }
        clock.advance(WINDOW * 2);
        let start = Instant::now();
        limiter.retain_recent();
        governor_times.push(start.elapsed());
        assert_eq!(limiter.len(), 0);
        let start = Instant::now();
        limiter.shrink_to_fit();
        shrink_times.push(start.elapsed());
    }
    let (ours, governor) = (median(ours_times), median(governor_times));
    println!(
        "ours      evict_idle() of 1M idle keys: median {ours:.2?} of {EVICTIONS}; heap after \
         {:.2} MiB (the limiter's small tables)",
        mib(ours_after)
    );
    println!(
        "governor  retain_recent() of 1M idle keys: median {governor:.2?} of {EVICTIONS}; then \
         shrink_to_fit() {:.2?}",
        median(shrink_times)
    );
    println!(
        "ratio     evict_idle / retain_recent: {:.2}x",
        ours.as_secs_f64() / governor.as_secs_f64()
    );
}

/// Every key goes idle; one hot key keeps checking, once per bucket width,
/// and each such check sweeps one partition.
fn reclaimed_by_checks() {
    let base = heap();
    let (limiter, clock) = ours_with::<u64>(Policy::per(LIMIT, WINDOW).unwrap());
    for k in 0..KEYS {
        let _ = limiter.check(&k);
    }
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
        "ours      reclaimed by checks alone: keys_tracked {} (evicted {}) after {} checks of one \
         hot key, one per bucket width ({:.1} s of clock time for a {:?} window); heap after \
         {:.2} MiB; a sweeping check (one partition, ~{} keys): median {:?}, slowest {:?}, all \
         {:?}",
        stats.keys_tracked,
        stats.keys_evicted,
        slots,
        slots as f64 * bucket.as_secs_f64(),
        WINDOW,
        mib(after),
        KEYS / slots.max(1),
        times.get(times.len() / 2).copied().unwrap_or_default(),
        times.last().copied().unwrap_or_default(),
        spent
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
        let times: Vec<Duration> = (0..7)
            .map(|_| {
                let t = Instant::now();
                assert_eq!(limiter.evict_idle(), 0);
                t.elapsed()
            })
            .collect();
        let median = median(times);
        let bucket = limiter.policy().bucket_width();
        println!(
            "ours      a round over {keys:>9} keys in their window: median {median:.2?} \
             ({:.1} ns a key; {:.2}% of one core at one round per bucket width, {bucket:.1?})",
            median.as_nanos() as f64 / keys as f64,
            100.0 * median.as_secs_f64() / bucket.as_secs_f64()
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    // RSS first, before anything else has touched the heap.
    rss::run("system", heap);
    let per = |limit| Policy::per(limit, WINDOW).unwrap();
    per_key("u64 keys (compact ring)", per(LIMIT), |k| k);
    per_key("IpAddr keys (compact ring)", per(LIMIT), ip);
    per_key("u64 keys, limit 100 000 (wide ring)", per(100_000), |k| k);
    let buckets = |n| {
        Policy::builder()
            .limit(LIMIT)
            .window(WINDOW)
            .buckets(n)
            .build()
            .unwrap()
    };
    // The default's neighbours, for the choice of the default.
    for n in [10, 15, 16, 20, 31] {
        per_key(
            &format!("u64 keys, {n} buckets (compact)"),
            buckets(n),
            |k| k,
        );
    }
    governor_per_key("u64 keys", |k| k);
    governor_per_key("IpAddr keys", ip);
    eviction();
    reclaimed_by_checks();
    rounds();
}

//! The memory of a flood of keys goes back to the system once the keys are
//! idle and dropped, with the system allocator and the background sweeper
//! (no other call from the user), twice in a row, since glibc serves the
//! second flood's tables from its heap (see `src/trim.rs`); the second time
//! `Limiter::evict_idle` may finish the sweep.
//! Measured as the process's resident set, so this file holds one test, run
//! in a process of its own.
//!
//! Linux with glibc only: other allocators return memory in their own time.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::time::Duration;
use tower_sliding_window::{Limiter, Policy};

/// VmRSS in `/proc/self/status`, in bytes.
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

const MIB: usize = 1 << 20;

/// Let the sweeper (and the trim it hands to tokio's blocking pool) run until
/// `done()`, a bucket of paused time at a time; at most 10 s of real time.
async fn until(done: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() && std::time::Instant::now() < deadline {
        tokio::time::advance(Duration::from_millis(100)).await;
        // The blocking pool runs on threads of its own: give it a moment.
        tokio::task::spawn_blocking(|| ()).await.unwrap();
    }
    done()
}

#[tokio::test(start_paused = true)]
async fn the_memory_of_a_flood_goes_back_to_the_system_once_its_keys_are_dropped_twice() {
    let limiter: Limiter<u64> = Limiter::builder(Policy::per(100, Duration::from_secs(1)).unwrap())
        .max_keys(1 << 20)
        .sweep_idle()
        .build()
        .unwrap();
    let base = rss();
    for round in 0..2u64 {
        for k in 0..400_000 {
            let _ = limiter.check(&(round << 32 | k));
        }
        let flooded = rss();
        assert!(
            flooded > base + 30 * MIB,
            "the tables are resident: {base} -> {flooded}"
        );
        let swept = if round == 0 {
            // The sweeper drops the keys once idle and trims after its round.
            assert!(until(|| limiter.stats().keys_tracked == 0).await);
            until(|| rss() < base + 4 * MIB).await;
            rss()
        } else {
            // Whatever the sweeper has not dropped yet, evict_idle does
            // (and trims).
            tokio::time::advance(Duration::from_secs(2)).await;
            limiter.evict_idle();
            assert_eq!(limiter.stats().keys_tracked, 0);
            rss()
        };
        assert!(
            swept < base + 4 * MIB,
            "round {round}: RSS {} MiB before, {} MiB flooded, {} MiB swept",
            base / MIB,
            flooded / MIB,
            swept / MIB
        );
    }
    drop(limiter);
    assert!(rss() < base + 4 * MIB);
}

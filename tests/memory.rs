//! The memory of a flood of keys goes back to the system once the keys are
//! idle and dropped, with the system allocator and no call from the user:
//! twice in a row, since glibc serves the second flood's tables from its heap
//! (see `src/trim.rs`). Measured as the process's resident set, so this file
//! holds one test, run in a process of its own.
//!
//! Linux with glibc only: other allocators return memory in their own time.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::time::Duration;
use tower_sliding_window::{Limiter, ManualClock, Policy};

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

#[test]
fn the_memory_of_a_flood_goes_back_to_the_system_once_its_keys_are_dropped_twice() {
    let clock = ManualClock::new();
    let limiter: Limiter<u64, ManualClock> =
        Limiter::builder(Policy::per(100, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .max_keys(1 << 20)
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
        clock.advance(Duration::from_secs(2));
        assert_eq!(limiter.evict_idle(), 400_000);
        let swept = rss();
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

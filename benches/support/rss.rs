//! Memory as an operator sees it: the process's resident set (VmRSS) while a
//! limiter with a background sweeper tracks 1M keys, once they have gone idle
//! and been swept with no traffic at all, after a second flood, and once the
//! limiter is dropped: at once, after a quiet second, and once traffic (small
//! allocations) resumes. The bench calls nothing of the allocator's: what it
//! gives back by itself, or when the limiter asks (`malloc_trim` under glibc
//! after large evictions, see `src/trim.rs`), is what shows.
//! `benches/memory.rs` runs it on the system allocator,
//! `benches/memory_mimalloc.rs` on mimalloc.
//!
//! Time is tokio's, paused: the limiter's default clock follows it, and the
//! sweeper runs when the bench advances it. Wall times are the CPU the work
//! takes (one thread).

use std::time::{Duration, Instant};
use tower_sliding_window::{Limiter, Policy};

const KEYS: u64 = 1_000_000;
const WINDOW: Duration = Duration::from_secs(1);

/// The resident set in bytes (VmRSS in `/proc/self/status`; 0 where there is
/// no procfs).
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Let the sweeper run until the limiter tracks no key, then let it end its
/// round, whose memory it hands back on tokio's blocking pool: until the
/// resident set stops falling (at most a second). Yielding does not move
/// paused time, so the keys went at the instant the bench advanced to.
async fn swept(limiter: &Limiter<u64>) -> Duration {
    let start = Instant::now();
    for _ in 0..1_000_000 {
        if limiter.stats().keys_tracked == 0 {
            let took = start.elapsed();
            let mut last = rss();
            for _ in 0..100 {
                for _ in 0..100 {
                    tokio::task::yield_now().await;
                }
                std::thread::sleep(Duration::from_millis(10));
                let now = rss();
                if now >= last {
                    break;
                }
                last = now;
            }
            return took;
        }
        tokio::task::yield_now().await;
    }
    panic!("{} keys still tracked", limiter.stats().keys_tracked);
}

/// A quiet second: no traffic, no allocation. An allocator that purges freed
/// pages from a background thread (jemalloc's, when enabled) does so now;
/// one that purges in the course of later calls, once a delay has passed
/// (mimalloc: 10 ms for a page, 100 ms for its arenas), waits for them.
fn quiet() {
    std::thread::sleep(Duration::from_secs(1));
}

/// Traffic resumes: 200 ms of a server's small allocations, 10 000 short
/// strings made and dropped every 20 ms.
fn traffic() {
    for _ in 0..10 {
        let strings: Vec<String> = (0..10_000).map(|i| "x".repeat(16 + i % 200)).collect();
        std::hint::black_box(strings);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Check one unit for each of `keys`, as a flood of new keys does.
fn flood(limiter: &Limiter<u64>, keys: std::ops::Range<u64>) -> Duration {
    let start = Instant::now();
    for k in keys {
        let _ = limiter.check(&k);
    }
    start.elapsed()
}

/// Print the RSS (and the heap the allocator was asked for, from `heap`) at
/// each step, labelled with `allocator`.
pub fn run(allocator: &str, heap: impl Fn() -> usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    // RSS against the baseline (before the limiter) plus the live heap: how
    // close the process comes to holding only what it uses.
    let baseline = rss();
    let show = |step: &str| {
        let (now, live) = (rss(), heap());
        println!(
            "{allocator:<8} {step:<44} RSS {:7.1} MiB   heap {:7.1} MiB   RSS / (baseline + heap) \
             {:5.2}",
            mib(now),
            mib(live),
            now as f64 / (baseline + live) as f64
        );
    };
    runtime.block_on(async {
        show("before the limiter");
        let limiter: Limiter<u64> = Limiter::builder(Policy::per(100, WINDOW).unwrap())
            .max_keys(1 << 20)
            .sweep_idle()
            .build()
            .unwrap();
        let bucket = limiter.policy().bucket_width();
        show("empty limiter (max_keys 2^20)");
        let inserted = flood(&limiter, 0..KEYS);
        assert_eq!(limiter.stats().keys_tracked, KEYS as usize);
        show("1M keys tracked");

        // No traffic: the round at the start of the bucket in which the keys
        // turn idle (a window and a bucket after the flood, on tokio's next
        // 1 ms tick) drops them.
        tokio::time::advance(WINDOW + bucket + Duration::from_millis(1)).await;
        let round = swept(&limiter).await;
        show("swept by the sweeper, no traffic");
        quiet();
        show("  then a quiet second");
        traffic();
        show("  then traffic resumes (200 ms)");

        let again = flood(&limiter, KEYS..2 * KEYS);
        show("a second flood of 1M new keys");
        tokio::time::advance(WINDOW + bucket + Duration::from_millis(1)).await;
        swept(&limiter).await;
        show("swept again");
        quiet();
        traffic();
        show("  then a quiet second and traffic");
        drop(limiter);
        show("limiter dropped");
        quiet();
        traffic();
        show("  then a quiet second and traffic");
        println!(
            "{allocator:<8} 1M keys inserted in {inserted:.2?} (again {again:.2?}); the round \
             that dropped them took {round:.2?}"
        );
    });
}

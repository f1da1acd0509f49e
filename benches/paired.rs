//! Ours against governor with their runs interleaved: the ratios of
//! `benches/limiter.rs`, robust to a machine whose speed drifts.
//!
//! criterion times each limiter for seconds, one after the other; on a shared
//! VM one limiter's figure can come from a slower minute than the other's (the
//! same check was seen at 40 ns and at 70 ns a quarter of an hour apart). Here
//! each round runs a short chunk of each contender back to back, in alternating
//! order, and the ratio is taken within the round; the table gives the median
//! round and the 10th–90th percentile range.
//!
//! Run: `cargo bench --bench paired` (about a minute). Contenders and workloads are
//! those of `benches/limiter.rs` (`support/limiters.rs`): ours on its default
//! clock, governor's keyed limiter on its own; u64 keys. Each on its default
//! hasher (ours foldhash, governor std's SipHash), and a second table repeats
//! the single-thread rows against governor on foldhash, the same hasher.
//! Last, the machine's own reads at random by working-set size, which tell
//! how much of each contender's tables at 100k keys it keeps close.

#[path = "support/limiters.rs"]
mod limiters;
mod support;

use limiters::{
    governor, governor_foldhash, governor_passes, ours, ours_on, ours_passes, run_one,
    run_one_dependent, run_parallel, warm, Check, Floor, Load, WithWait, KEYS,
};
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::{Duration, Instant};
use support::Keys;
use tower_sliding_window::ManualClock;

const ROUNDS: usize = 41;
/// Checks per thread in one chunk: tens of milliseconds, several passes over
/// 100k keys, so the caches a chunk starts with matter little.
const CHUNK: u64 = 400_000;

/// How one thread runs a chunk's checks.
#[derive(Clone, Copy)]
enum Timing {
    /// One after another, the processor free to overlap them (`run_one`).
    BackToBack,
    /// Each waiting for the one before it (`run_one_dependent`).
    OneAtATime,
}

/// One chunk: the wall time per check on each thread.
fn chunk<L: Check>(l: &L, threads: u64, keys: Keys) -> f64 {
    if threads == 1 {
        chunk_one(l, keys, Timing::BackToBack)
    } else {
        per_check(run_parallel(l, threads, keys, CHUNK))
    }
}

/// One chunk on this thread, timed as `timing` says: the time per check.
fn chunk_one<L: Check>(l: &L, keys: Keys, timing: Timing) -> f64 {
    per_check(match timing {
        Timing::BackToBack => run_one(l, keys, CHUNK),
        Timing::OneAtATime => run_one_dependent(l, keys, CHUNK),
    })
}

fn per_check(chunk: Duration) -> f64 {
    chunk.as_nanos() as f64 / CHUNK as f64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Median, 10th and 90th percentile.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (
        percentile(&v, 0.5),
        percentile(&v, 0.1),
        percentile(&v, 0.9),
    )
}

/// `a` and `b` in alternating order, `ROUNDS` times; returns each round's pair.
fn rounds(mut a: impl FnMut() -> f64, mut b: impl FnMut() -> f64) -> Vec<(f64, f64)> {
    (0..ROUNDS)
        .map(|r| {
            if r % 2 == 0 {
                let x = a();
                (x, b())
            } else {
                let y = b();
                (a(), y)
            }
        })
        .collect()
}

/// One row: `ours` (or another contender) against `gov` on one workload.
fn versus<O: Check, G: Check>(
    name: &str,
    load: Load,
    keys: Keys,
    target: &str,
    ours: fn(Load) -> O,
    gov: fn(Load) -> G,
) {
    versus_timed(name, load, keys, target, ours, gov, Timing::BackToBack);
}

/// [`versus`], each chunk timed as `timing` says.
fn versus_timed<O: Check, G: Check>(
    name: &str,
    load: Load,
    keys: Keys,
    target: &str,
    ours: fn(Load) -> O,
    gov: fn(Load) -> G,
    timing: Timing,
) {
    let (o, g) = (ours(load), gov(load));
    warm(&o, keys, 1);
    warm(&g, keys, 1);
    let pairs = rounds(
        || chunk_one(&o, keys, timing),
        || chunk_one(&g, keys, timing),
    );
    let (ours_ns, ..) = spread(pairs.iter().map(|p| p.0).collect());
    let (gov_ns, ..) = spread(pairs.iter().map(|p| p.1).collect());
    let (ratio, lo, hi) = spread(pairs.iter().map(|p| p.0 / p.1).collect());
    println!(
        "| {name} | {ours_ns:.1} ns | {gov_ns:.1} ns | {ratio:.2}× | {lo:.2}–{hi:.2} | {target} |"
    );
}

/// Throughput of `threads` threads on `many` keys against one thread on `one`,
/// for one limiter, interleaved the same way.
fn scaling<L: Check>(l: &L, one: Keys, many: Keys) -> (f64, f64, f64) {
    warm(l, one, 1);
    warm(l, many, 2);
    let pairs = rounds(|| chunk(l, 1, one), || chunk(l, 2, many));
    // Same checks per thread in both chunks: 2 threads do twice the work.
    spread(pairs.iter().map(|(t1, t2)| 2.0 * t1 / t2).collect())
}

fn scaling_row(name: &str, one: Keys, many: Keys, target: &str) {
    let (o, olo, ohi) = scaling(&ours(Load::Allowed), one, many);
    let (g, glo, ghi) = scaling(&governor(Load::Allowed), one, many);
    println!("| {name} | {o:.2}× ({olo:.2}–{ohi:.2}) | {g:.2}× ({glo:.2}–{ghi:.2}) | {target} |");
}

/// Two threads on two keys created one after another, against one thread, at
/// each ring position in turn: a `ManualClock` steps one bucket width between
/// measurements. Neighbouring rings that shared a cache line showed as a
/// collapse at a few positions (2 threads at 0.8× one thread's throughput).
fn scaling_by_position() {
    let clock = ManualClock::new();
    let l = ours_on(Load::Allowed, clock.clone());
    warm(&l, Keys::OwnKey, 2);
    let width = l.policy().bucket_width();
    let mut by_width: Vec<f64> = (0..32)
        .map(|_| {
            clock.advance(width);
            // Three pairs per width, so one slow chunk does not pass for a
            // collapse: the median of three.
            let (median, ..) = spread(
                (0..3)
                    .map(|_| 2.0 * chunk(&l, 1, Keys::OwnKey) / chunk(&l, 2, Keys::OwnKey))
                    .collect(),
            );
            median
        })
        .collect();
    by_width.sort_by(|a, b| a.total_cmp(b));
    println!(
        "| each its own key, keys created in a row, at 32 successive bucket widths \
         (`ManualClock`; median of 3 per width): lowest width, median width | {:.2}×, {:.2}× | – | |",
        by_width[0],
        percentile(&by_width, 0.5)
    );
}

/// The single-thread workloads: name, load, keys, target. 100k keys twice:
/// in the order they were first checked (a map that lays keys out in that
/// order, as ours and an allocator boxing entries one by one do, is then
/// read front to back, and the hardware prefetcher hides some of its
/// misses), and in a random order, unrelated to that one (see `warm`).
const SINGLE_THREAD: [(&str, Load, Keys, &str); 8] = [
    (
        "1 thread, hot key, allowed",
        Load::Allowed,
        Keys::One,
        "≤ 0.5×",
    ),
    ("1 thread, hot key, denied", Load::Denied, Keys::One, ""),
    (
        "1 thread, 100k keys, allowed",
        Load::Allowed,
        Keys::OwnRange(KEYS),
        "≤ 0.6×",
    ),
    (
        "1 thread, 100k keys, allowed, compact rings",
        Load::AllowedCompact,
        Keys::OwnRange(KEYS),
        "",
    ),
    (
        "1 thread, 100k keys, denied",
        Load::Denied,
        Keys::OwnRange(KEYS),
        "",
    ),
    (
        "1 thread, 100k keys in random order, allowed",
        Load::Allowed,
        Keys::OwnRangeShuffled(KEYS),
        "",
    ),
    (
        "1 thread, 100k keys in random order, allowed, compact rings",
        Load::AllowedCompact,
        Keys::OwnRangeShuffled(KEYS),
        "",
    ),
    (
        "1 thread, 100k keys in random order, denied",
        Load::Denied,
        Keys::OwnRangeShuffled(KEYS),
        "",
    ),
];

/// One table of the single-thread workloads whose load `keep` accepts,
/// `ours` against `gov`, headed `gov_name`; the targets (ratios to
/// governor's default) only where `targets`.
fn single_thread_table<O: Check, G: Check>(
    gov_name: &str,
    ours: fn(Load) -> O,
    gov: fn(Load) -> G,
    keep: fn(Load) -> bool,
    targets: bool,
) {
    println!(
        "| workload | ours | {gov_name} | ours / governor, median round | 10th–90th pct | target |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, load, keys, target) in SINGLE_THREAD {
        if keep(load) {
            versus(
                name,
                load,
                keys,
                if targets { target } else { "" },
                ours,
                gov,
            );
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; filters are not supported here.
    single_thread_table("governor", ours, governor, |_| true, true);
    println!();
    println!(
        "Denials with the wait read, as a layer reads it for `Retry-After` (governor's from a \
         reading of its clock):"
    );
    println!();
    single_thread_table(
        "governor",
        |load| WithWait(ours(load)),
        |load| WithWait(governor(load)),
        |load| matches!(load, Load::Denied),
        false,
    );
    println!();
    println!(
        "Keys that come back in a later bucket: both on fake clocks, moved on a bucket width \
         (1/16 s) after each pass over the 100k keys, so every check is its key's first in a \
         new bucket, as for clients that send less than a request a bucket:"
    );
    println!();
    println!(
        "| workload | ours | governor | ours / governor, median round | 10th–90th pct | target |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, keys) in [
        (
            "1 thread, 100k keys, each check a new bucket",
            Keys::OwnRange(KEYS),
        ),
        (
            "1 thread, 100k keys in random order, each check a new bucket",
            Keys::OwnRangeShuffled(KEYS),
        ),
    ] {
        versus(
            name,
            Load::AllowedCompact,
            keys,
            "",
            ours_passes,
            governor_passes,
        );
    }
    println!();
    println!(
        "One check at a time: each check's key depends on the previous check's result, so no \
         check starts before the one before it has ended, as a server's checks come with a \
         request's work between them (in the rows above the processor overlaps several \
         checks' lookups, and a shorter check overlaps more). Compact rings (65 535 a second):"
    );
    println!();
    println!(
        "| workload | first | second | first / second, median round | 10th–90th pct | target |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (keys, order) in [
        (Keys::OwnRange(KEYS), "100k keys"),
        (Keys::OwnRangeShuffled(KEYS), "100k keys in random order"),
    ] {
        let load = Load::AllowedCompact;
        let (floor, timing) = (Floor::<AtomicU32>::new, Timing::OneAtATime);
        let row = |contenders: &str| format!("{order}: {contenders}");
        versus_timed(
            &row("ours, governor"),
            load,
            keys,
            "",
            ours,
            governor,
            timing,
        );
        versus_timed(
            &row("floor, governor"),
            load,
            keys,
            "",
            floor,
            governor,
            timing,
        );
        versus_timed(&row("ours, floor"), load, keys, "", ours, floor, timing);
    }
    println!();
    println!("The same against governor on foldhash (ours' hasher; its default is SipHash):");
    println!();
    single_thread_table(
        "governor, foldhash",
        ours,
        governor_foldhash,
        |_| true,
        false,
    );
    println!();
    println!(
        "The floor: a lookup in a map no thread writes (std HashMap, foldhash), a coarse clock \
         read, a read of the value's head and 16 buckets (64-bit for the rows ours runs on wide \
         rings, 32-bit for compact) and one CAS in it, nothing else (no keyed sliding-window \
         check could do less), against governor's default:"
    );
    println!();
    println!(
        "| workload | floor | governor | floor / governor, median round | 10th–90th pct | target |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, load, keys, target) in SINGLE_THREAD {
        match load {
            Load::Allowed => versus(name, load, keys, target, Floor::<AtomicU64>::new, governor),
            Load::AllowedCompact => {
                versus(name, load, keys, target, Floor::<AtomicU32>::new, governor)
            }
            Load::Denied => {}
        }
    }
    println!();
    println!(
        "Ours against the floor, the same rows (how far ours is from the least any check costs):"
    );
    println!();
    println!("| workload | ours | floor | ours / floor, median round | 10th–90th pct | target |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, load, keys, _) in SINGLE_THREAD {
        match load {
            Load::Allowed => versus(name, load, keys, "", ours, Floor::<AtomicU64>::new),
            Load::AllowedCompact => versus(name, load, keys, "", ours, Floor::<AtomicU32>::new),
            Load::Denied => {}
        }
    }
    println!();
    println!("| 2 threads against 1, throughput | ours | governor | target |");
    println!("|---|---:|---:|---:|");
    scaling_row(
        "each its own key, against one hot key",
        Keys::One,
        Keys::OwnKey,
        "≥ 1.8×",
    );
    scaling_by_position();
    scaling_row(
        "each its own 50k keys, against 100k keys",
        Keys::OwnRange(KEYS),
        Keys::OwnRange(KEYS / 2),
        "",
    );
    scaling_row(
        "each its own 50k keys in random order, against 100k keys",
        Keys::OwnRangeShuffled(KEYS),
        Keys::OwnRangeShuffled(KEYS / 2),
        "",
    );
    println!();
    random_reads_table();
}

/// The machine's memory as a check at 100k keys meets it: the time of one
/// read at random in working sets of several sizes, each read's address
/// taken from the one before (no overlap), median of 5. Where the time
/// jumps is how much the fastest levels hold: a contender whose tables at
/// 100k keys fit below it reads them at that level's speed.
fn random_reads_table() {
    println!(
        "Reads at random, each waiting for the one before, in a working set of each size \
         (how much this machine keeps close; at 100k keys ours' tables take about 10 MiB \
         with compact rings and 17 MiB with wide ones, governor's about 2 MiB):"
    );
    println!();
    println!("| working set | one read, median of 5 | 10th–90th pct |");
    println!("|---:|---:|---:|");
    for mib in [1, 2, 4, 8, 16, 64] {
        let lines = mib * 1024 * 1024 / 64;
        // One cycle through every line in a random order: each line holds
        // the index of the next.
        let order = support::shuffled(lines, mib);
        let mut next = vec![[0u64; 8]; lines as usize];
        for (w, &line) in order.iter().enumerate() {
            next[line as usize][0] = order[(w + 1) % order.len()];
        }
        let read = |reads: u64| {
            let mut p = 0;
            let start = Instant::now();
            for _ in 0..reads {
                p = next[p as usize][0];
            }
            black_box(p);
            start.elapsed().as_nanos() as f64 / reads as f64
        };
        read(lines);
        let (median, low, high) = spread((0..5).map(|_| read(1_000_000)).collect());
        println!("| {mib} MiB | {median:.0} ns | {low:.0}–{high:.0} |");
    }
}

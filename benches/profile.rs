//! A fixed number of checks of one workload, for instruction-level profiling
//! (`valgrind --tool=callgrind`), where wall-clock benches are too noisy:
//!
//! ```text
//! cargo bench --bench profile --no-run
//! valgrind --tool=callgrind target/release/deps/profile-* ours-hot 1000000
//! ```
//!
//! Workloads: `{ours,governor}-{hot,100k}[-denied]`, `ours-hot-tokio`,
//! `ours-hot-auto` (the default clock),
//! `ours-hot-interpolated[-compact|-denied]` (`Precision::Interpolated`,
//! wide rings, compact, or over the limit; the clock moved on 30 µs a
//! check),
//! `ours-100k[-compact][-random]` (a
//! limit of 65 535 a second, compact rings; keys in a random order, as
//! `paired`), `governor-100k-random`, `governor-hot-denied-wait` (each
//! denial's wait read too, as ours has it), `floor-100k[-compact][-random]`
//! (`paired`'s floor), `layer-{none,ours,governor}[-rejected]`
//! `layer-{none,ours,governor}-peer-ip`, `layer-{none,ours,governor}-router`,
//! `layer-ours-one-key` and `layer-ours-tiers` (one key, one policy, in a
//! layer of policies and as a tier)
//! (requests through the tower layers, as in `benches/layer.rs`), `nothing`;
//! `{ours,governor}-100k-new-bucket` (100k keys at 65 535 a second, the
//! clock moved on a bucket width, 1/16 s, after each pass over them: every
//! check is its key's first in a new bucket, as for clients that send less
//! than one request a bucket), `ours-100k-wide-new-bucket` (the same at
//! 1e9 a second, wide rings) and `{ours,governor}-100k-idle` (moved on 2 s,
//! more than a window: every check finds its key idle);
//! `ours-evict N`: N times, 1M keys checked then dropped by `evict_idle`
//! (for `perf record`, where the kernel's share shows).
//! Ours runs on `ManualClock` and governor on `FakeRelativeClock` (time does not
//! move but where said), except `ours-hot-tokio`, so the clock's share can be
//! told apart.

#[path = "support/layers.rs"]
mod layers;
#[path = "support/limiters.rs"]
mod limiters;
// Its cursors only.
#[allow(dead_code)]
mod support;

use layers::{inner, Keys};
use limiters::{governor_on_fake_clock, Check, Floor, Load, Passes, WithWait, KEYS, PASS_STEP};
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;
use support::Cursor;
use tower::Layer;
use tower_sliding_window::clock::{AutoClock, Clock, TokioClock};
use tower_sliding_window::{Limiter, ManualClock, Policy, Precision};

/// `keys` keys in the order they were first checked, or in a random order
/// unrelated to it (`support::Keys::OwnRangeShuffled`, as `paired`).
fn cursor(keys: u64, random: bool) -> Cursor {
    Cursor::new(
        if random {
            support::Keys::OwnRangeShuffled(keys)
        } else {
            support::Keys::OwnRange(keys)
        },
        0,
    )
}

/// `keys` keys checked once in order, then `iters` checks of them, each
/// check's whole result kept (`black_box`), so none of it is optimised away.
fn run<R>(keys: u64, random: bool, iters: u64, check: impl Fn(&u64) -> R) {
    for k in 0..keys {
        check(&k);
    }
    let mut cursor = cursor(keys, random);
    for _ in 0..iters {
        black_box(check(black_box(&cursor.next_key())));
    }
}

/// A step longer than a window: every check of `passes` finds its key idle.
const IDLE_STEP: Duration = Duration::from_secs(2);

/// `iters` checks of 100k keys in order through `l` (`limiters::Passes`: its
/// fake clock moves on after each pass).
fn passes<L: Check>(l: Passes<L>, iters: u64) {
    run(KEYS, false, iters, |k| l.check(k));
}

/// Ours as `paired` builds it (`limiters::ours_on`), on `clock`.
fn ours<C: Clock>(clock: C, load: Load, keys: u64, random: bool, iters: u64) {
    let l = limiters::ours_on(load, clock);
    run(keys, random, iters, |k| l.check(k));
}

/// Ours on one hot key with `Precision::Interpolated`, the clock moved on
/// 30 µs after each check (33 333 checks a second): at `limit` a second of
/// 1e9 (wide rings) or 65 535 (compact) every check is allowed, with units
/// in the oldest bucket to weigh, and one check in about 2 000 is its key's
/// first in a bucket; at 100, all but one check in 300 is denied.
fn ours_interpolated(limit: u32, iters: u64) {
    let policy = Policy::builder()
        .limit(limit)
        .window(Duration::from_secs(1))
        .precision(Precision::Interpolated)
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let l = Limiter::builder(policy)
        .clock(clock.clone())
        .build()
        .unwrap();
    run(1, false, iters, |k| {
        let d = l.check(k);
        clock.advance(Duration::from_micros(30));
        d
    });
}

/// `rounds` times: 1M keys checked, then dropped in bulk by `evict_idle`.
fn ours_evict(rounds: u64) {
    let clock = ManualClock::new();
    for _ in 0..rounds {
        let l: Limiter<u64, ManualClock> =
            Limiter::builder(Policy::per(100, Duration::from_secs(1)).unwrap())
                .clock(clock.clone())
                .max_keys(1 << 20)
                .build()
                .unwrap();
        for k in 0..1_000_000 {
            let _ = l.check(&k);
        }
        clock.advance(Duration::from_secs(2));
        assert_eq!(black_box(l.evict_idle()), 1_000_000);
    }
}

fn governor(load: Load, keys: u64, random: bool, iters: u64) {
    let l = governor_on_fake_clock(load);
    run(keys, random, iters, |k| l.check_key(k));
}

/// [`governor`], each denial's wait read as well (`limiters::WithWait`: a
/// layer's `Retry-After`; ours has it in every decision).
fn governor_wait(load: Load, keys: u64, random: bool, iters: u64) {
    let l = WithWait(governor_on_fake_clock(load));
    run(keys, random, iters, |k| l.check(k));
}

/// The floor of `paired` (`limiters::Floor`): a lookup in a map no thread
/// writes, a read of a window of `W` buckets and one CAS.
fn floor<W: limiters::FloorWord>(keys: u64, random: bool, iters: u64) {
    let l = Floor::<W>::new(Load::Allowed);
    run(keys, random, iters, |k| l.check(k));
}

/// `iters` requests through `svc`, one after another (as in `benches/layer.rs`).
fn layer<S>(svc: S, keys: Keys, iters: u64)
where
    S: tower::Service<layers::Req, Response = layers::Res>,
    S::Error: std::fmt::Debug,
{
    layers::run(&layers::runtime(), svc, keys, iters);
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let workload = args.first().map(String::as_str).unwrap_or("nothing");
    let iters = args
        .get(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let compact = Load::AllowedCompact;
    match workload {
        "ours-hot" => ours(ManualClock::new(), Load::Allowed, 1, false, iters),
        "ours-hot-denied" => ours(ManualClock::new(), Load::Denied, 1, false, iters),
        "ours-hot-tokio" => ours(TokioClock::new(), Load::Allowed, 1, false, iters),
        "ours-hot-auto" => ours(
            AutoClock::for_bucket(Duration::from_millis(66)),
            Load::Allowed,
            1,
            false,
            iters,
        ),
        "ours-hot-interpolated" => ours_interpolated(1_000_000_000, iters),
        "ours-hot-interpolated-compact" => ours_interpolated(65_535, iters),
        "ours-hot-interpolated-denied" => ours_interpolated(100, iters),
        "ours-100k" => ours(ManualClock::new(), Load::Allowed, KEYS, false, iters),
        "ours-100k-compact" => ours(ManualClock::new(), Load::AllowedCompact, KEYS, false, iters),
        "ours-100k-denied" => ours(ManualClock::new(), Load::Denied, KEYS, false, iters),
        "ours-100k-random" => ours(ManualClock::new(), Load::Allowed, KEYS, true, iters),
        "ours-100k-compact-random" => {
            ours(ManualClock::new(), Load::AllowedCompact, KEYS, true, iters)
        }
        "ours-evict" => ours_evict(iters),
        "ours-100k-new-bucket" => passes(limiters::ours_passes_by(compact, PASS_STEP), iters),
        "ours-100k-wide-new-bucket" => {
            passes(limiters::ours_passes_by(Load::Allowed, PASS_STEP), iters)
        }
        "ours-100k-idle" => passes(limiters::ours_passes_by(compact, IDLE_STEP), iters),
        "governor-100k-new-bucket" => {
            passes(limiters::governor_passes_by(compact, PASS_STEP), iters)
        }
        "governor-100k-idle" => passes(limiters::governor_passes_by(compact, IDLE_STEP), iters),
        "governor-hot" => governor(Load::Allowed, 1, false, iters),
        "governor-hot-denied" => governor(Load::Denied, 1, false, iters),
        "governor-hot-denied-wait" => governor_wait(Load::Denied, 1, false, iters),
        "governor-100k" => governor(Load::Allowed, KEYS, false, iters),
        "governor-100k-denied" => governor(Load::Denied, KEYS, false, iters),
        "governor-100k-random" => governor(Load::Allowed, KEYS, true, iters),
        "floor-100k" => floor::<AtomicU64>(KEYS, false, iters),
        "floor-100k-random" => floor::<AtomicU64>(KEYS, true, iters),
        "floor-100k-compact" => floor::<AtomicU32>(KEYS, false, iters),
        "floor-100k-compact-random" => floor::<AtomicU32>(KEYS, true, iters),
        "layer-none" => layer(inner(), Keys::Global, iters),
        "layer-ours" => layer(layers::ours(u32::MAX).layer(inner()), Keys::Global, iters),
        "layer-ours-rejected" => layer(layers::ours(1).layer(inner()), Keys::Global, iters),
        "layer-governor" => layer(
            layers::governor(u32::MAX).layer(inner()),
            Keys::Global,
            iters,
        ),
        "layer-governor-rejected" => layer(layers::governor(1).layer(inner()), Keys::Global, iters),
        "layer-ours-one-key" => layer(
            layers::ours_one_key(u32::MAX).layer(inner()),
            Keys::Global,
            iters,
        ),
        "layer-ours-tiers" => layer(
            layers::ours_tiered(u32::MAX).layer(inner()),
            Keys::Global,
            iters,
        ),
        "layer-none-peer-ip" => layer(layers::inner_peer_ip(), Keys::PeerIp, iters),
        "layer-ours-peer-ip" => layer(
            layers::ours_peer_ip(u32::MAX).layer(layers::inner_peer_ip()),
            Keys::PeerIp,
            iters,
        ),
        "layer-governor-peer-ip" => layer(
            layers::governor_peer_ip(u32::MAX).layer(layers::inner_peer_ip()),
            Keys::PeerIp,
            iters,
        ),
        "layer-none-router" => layer(layers::router(), Keys::Global, iters),
        "layer-ours-router" => layer(
            layers::ours(u32::MAX).layer(layers::router()),
            Keys::Global,
            iters,
        ),
        "layer-governor-router" => layer(
            layers::governor(u32::MAX).layer(layers::router()),
            Keys::Global,
            iters,
        ),
        "nothing" => {}
        other => eprintln!("unknown workload {other}"),
    }
}

//! `Limiter::reconfigured` against the guarantee its docs state, on a
//! `ManualClock`: after a change at `c` from `(L1, W1)` to `(L2, W2)`, every
//! admission at `t >= c` fits `L2` over the units admitted since `c` and the
//! units admitted before it that the old policy still remembered (true time
//! `τ > c - W1`), each counted while its true time is within `W2` of `t`.
//! Recursively: a unit forgotten by one change stays forgotten.
//!
//! Plus one plain test per case: a raised limit, a lowered one, a longer
//! window, a shorter one.

use crate::{Limiter, ManualClock, Policy, Store};
use proptest::prelude::*;
use std::time::Duration;

const KEYS: u8 = 3;
const MS: u64 = 1_000_000;

/// A strict policy of `limit` per `window_ms`, in `buckets` buckets.
fn policy(limit: u32, window_ms: u64, buckets: u32) -> Policy {
    Policy::builder()
        .limit(limit)
        .window(Duration::from_millis(window_ms))
        .buckets(buckets)
        .build()
        .expect("valid policy")
}

/// The last nanosecond of the first step (1/2^16) of a bucket `width` ns
/// wide: a unit admitted at a bucket's start counts as admitted then.
fn step_end(width: u64) -> u64 {
    width.div_ceil(1 << 16) - 1
}

fn limiter(p: Policy, max_keys: usize) -> (Limiter<u8, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(p)
        .clock(clock.clone())
        .max_keys(max_keys)
        .build()
        .expect("valid limiter");
    (limiter, clock)
}

/// One admission's units as the model keeps them.
#[derive(Debug)]
struct Unit {
    key: u8,
    /// How many units.
    n: u64,
    /// The clock's reading when they were admitted (ns).
    at: u64,
    /// Forgotten by a change: admitted at or before `c - W_old`.
    forgotten: bool,
}

#[derive(Debug, Clone)]
enum Op {
    /// Move the clock on by this many nanoseconds.
    Advance(u64),
    Check {
        key: u8,
        cost: u32,
    },
    /// Replace the limiter by `reconfigured(policy(limit, window_ms, buckets))`.
    Reconfigure {
        limit: u32,
        window_ms: u64,
        buckets: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1..5_000u64).prop_map(Op::Advance),
        3 => (1..400u64).prop_map(|ms| Op::Advance(ms * MS)),
        8 => (0..KEYS, 1..=3u32).prop_map(|(key, cost)| Op::Check { key, cost }),
        // Costs that fill a limit on either side of what a compact ring
        // holds (65 535), as often as small ones.
        4 => (0..KEYS, 1..=140_000u32).prop_map(|(key, cost)| Op::Check { key, cost }),
        1 => (limit(), 100..=2_000u64, 1..=16u32).prop_map(|(limit, window_ms, buckets)| {
            Op::Reconfigure { limit, window_ms, buckets }
        }),
    ]
}

/// Limits small, around 65 535 (the most a compact ring's bucket holds) and
/// well above it: changes between them move counts between ring layouts.
fn limit() -> impl Strategy<Value = u32> {
    prop_oneof![1..=20u32, 65_530..=65_540u32, 65_536..=140_000u32]
}

fn first_policy() -> impl Strategy<Value = Policy> {
    (limit(), 100..=2_000u64, 1..=16u32).prop_map(|(l, w, n)| policy(l, w, n))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every admission fits the current limit over the units the guarantee
    /// says are remembered; and once nothing was admitted or changed for a
    /// whole span of the current policy, a cost within the limit passes (the
    /// carried units never linger past that).
    #[test]
    fn admissions_fit_the_current_limit_over_every_unit_remembered_across_changes(
        first in first_policy(),
        max_keys in prop_oneof![Just(1usize), Just(2), Just(100_000)],
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let (mut current, clock) = limiter(first, max_keys);
        let mut units: Vec<Unit> = Vec::new();
        let mut t = 0u64;
        // The latest admission (of any key: at the cap, untracked keys share
        // the overflow ring) or change.
        let mut last_event = 0u64;
        for op in &ops {
            match *op {
                Op::Advance(ns) => {
                    t += ns;
                    clock.set(t);
                }
                Op::Reconfigure { limit, window_ms, buckets } => {
                    let old_window = current.policy().window().as_nanos() as u64;
                    for u in &mut units {
                        if u.at + old_window <= t {
                            u.forgotten = true;
                        }
                    }
                    current = current
                        .reconfigured(policy(limit, window_ms, buckets))
                        .expect("valid change");
                    last_event = t;
                }
                Op::Check { key, cost } => {
                    let p = current.policy();
                    let (limit, window) = (p.limit() as u64, p.window().as_nanos() as u64);
                    let span = (p.buckets() as u64 + 1) * p.bucket_width().as_nanos() as u64;
                    let quiet = t >= last_event + span;
                    let d = current.check_n(&key, cost);
                    if d.is_allowed() {
                        units.push(Unit { key, n: cost.into(), at: t, forgotten: false });
                        last_event = t;
                        let remembered: u64 = units
                            .iter()
                            .filter(|u| u.key == key && !u.forgotten && u.at + window > t)
                            .map(|u| u.n)
                            .sum();
                        prop_assert!(
                            remembered <= limit,
                            "key {} at {}: {} units remembered, limit {}", key, t, remembered, limit
                        );
                    } else {
                        prop_assert!(
                            !(quiet && cost as u64 <= limit),
                            "key {} at {}: denied after a quiet span: {:?}", key, t, d
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_raised_limit_gives_room_at_once_and_the_old_limiter_undoes_into_it() {
    let (two, _clock) = limiter(policy(2, 1000, 10), 100);
    let first = two.check(&1);
    assert!(first.is_allowed() && two.check(&1).is_allowed());
    assert!(!two.check(&1).is_allowed());
    let four = two.reconfigured(policy(4, 1000, 10)).unwrap();
    assert_eq!(four.usage(&1).used, 2);
    assert!(four.check(&1).is_allowed());
    assert!(four.check(&1).is_allowed());
    assert!(!four.check(&1).is_allowed());
    // The old limiter shares the counts under its own limit.
    assert!(!two.check(&1).is_allowed());
    two.undo(&1, &first);
    assert!(four.check(&1).is_allowed());
    assert!(!four.check(&1).is_allowed());
}

#[test]
fn a_lowered_limit_denies_until_the_units_admitted_leave_the_window() {
    let (ten, clock) = limiter(policy(10, 1000, 10), 100);
    assert!(ten.check_n(&1, 10).is_allowed());
    clock.set(100 * MS);
    let five = ten.reconfigured(policy(5, 1000, 10)).unwrap();
    assert!(!five.check(&1).is_allowed());
    // The units admitted at 0 leave one window later, to a step of the
    // 100 ms bucket.
    let leaves = 1000 * MS + step_end(100 * MS);
    clock.set(leaves - 1);
    assert!(!five.check(&1).is_allowed());
    clock.set(leaves);
    assert!(five.check_n(&1, 5).is_allowed());
    assert!(!five.check(&1).is_allowed());
}

#[test]
fn a_longer_window_keeps_the_counts_of_the_old_one() {
    let (short, clock) = limiter(policy(10, 1000, 10), 100);
    assert!(short.check_n(&1, 10).is_allowed());
    clock.set(500 * MS);
    let long = short.reconfigured(policy(10, 2000, 10)).unwrap();
    assert_eq!(long.usage(&1).used, 10);
    // The old policy would free them one second after 0; the new one counts
    // them at their newest instant as the old bucket kept it (its first
    // step, 1 525 ns), in the first step of the 200 ms bucket holding it:
    // they leave two seconds after that step's last nanosecond.
    assert_eq!(step_end(100 * MS), 1_525);
    clock.set(1500 * MS);
    assert!(!long.check(&1).is_allowed());
    let leaves = 2000 * MS + step_end(200 * MS);
    clock.set(leaves - 1);
    assert!(!long.check(&1).is_allowed());
    clock.set(leaves);
    assert!(long.check_n(&1, 10).is_allowed());
}

#[test]
fn a_shorter_window_drops_units_it_no_longer_covers_and_keeps_the_rest() {
    let (long, clock) = limiter(policy(10, 1000, 10), 100);
    assert!(long.check_n(&1, 5).is_allowed());
    clock.set(300 * MS);
    assert!(long.check_n(&1, 5).is_allowed());
    clock.set(600 * MS);
    let short = long.reconfigured(policy(5, 500, 5)).unwrap();
    // The units of 0 ms are 600 ms old, out of the new window: dropped. Those
    // of 300 ms, the first step of their 100 ms bucket, count until half a
    // second after it.
    assert_eq!(short.usage(&1).used, 5);
    assert!(!short.check(&1).is_allowed());
    let leaves = 800 * MS + step_end(100 * MS);
    clock.set(leaves - 1);
    assert!(!short.check(&1).is_allowed());
    clock.set(leaves);
    assert!(short.check_n(&1, 5).is_allowed());
    assert!(!short.check(&1).is_allowed());
}

#[test]
fn units_in_the_overflow_ring_and_a_single_ring_are_carried_too() {
    // At a cap of one key, key 2's units live in the shared overflow ring.
    let (l, clock) = limiter(policy(3, 1000, 10), 1);
    assert!(l.check_n(&1, 3).is_allowed());
    let overflowed = l.check_n(&2, 3);
    assert!(overflowed.is_allowed() && overflowed.is_overflow());
    clock.set(500 * MS);
    let l = l.reconfigured(policy(3, 2000, 4)).unwrap();
    assert!(!l.check(&1).is_allowed());
    assert!(!l.check(&2).is_allowed());

    let clock = ManualClock::new();
    let global: Limiter<(), ManualClock> = Limiter::builder(policy(2, 1000, 10))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(global.check_n(&(), 2).is_allowed());
    let global = global.reconfigured(policy(2, 500, 5)).unwrap();
    assert!(!global.check(&()).is_allowed());
    clock.set(600 * MS);
    assert!(global.check(&()).is_allowed());
}

#[test]
fn a_key_counted_by_the_overflow_ring_keeps_its_units_in_a_ring_of_its_own() {
    // At a cap of one key, key 2's units live in the overflow ring.
    let (l, clock) = limiter(policy(3, 1000, 10), 1);
    assert!(l.check(&1).is_allowed());
    clock.set(500 * MS);
    assert!(l.check_n(&2, 3).is_overflow());
    // Key 1 is idle by 1.15 s, so the new limiter tracks nobody, and key 2
    // gets a ring of its own: a copy of the carried overflow ring, as its
    // overflow mark (picked by its hash) says.
    clock.set(1150 * MS);
    let l = l.reconfigured(policy(3, 1000, 5)).unwrap();
    assert_eq!(l.stats().keys_tracked, 0);
    assert!(!l.check(&2).is_allowed());
    assert_eq!(l.stats().keys_tracked, 1);
}

#[test]
fn the_store_trait_reconfigures_the_limiter() {
    let (l, _clock) = limiter(policy(1, 1000, 10), 100);
    assert!(l.check(&1).is_allowed());
    let two = Store::reconfigured(&l, policy(2, 1000, 10)).unwrap();
    assert_eq!(Store::policy(&two).limit(), 2);
    assert!(two.check(&1).is_allowed());
}

#[test]
fn a_bucket_below_the_clocks_resolution_is_refused() {
    /// A clock that tells apart only whole milliseconds.
    struct Millis;
    impl crate::clock::Clock for Millis {
        fn now_nanos(&self) -> u64 {
            0
        }
        fn resolution(&self) -> Duration {
            Duration::from_millis(1)
        }
    }
    let l: Limiter<u8, _> = Limiter::builder(policy(1, 1000, 10))
        .clock(Millis)
        .build()
        .unwrap();
    let narrow = Policy::builder()
        .limit(1)
        .window(Duration::from_micros(10))
        .buckets(10)
        .build()
        .unwrap();
    assert!(matches!(
        l.reconfigured(narrow),
        Err(crate::ConfigError::BucketBelowClockResolution { .. })
    ));
}

#[test]
fn changes_racing_checks_and_undos_on_the_old_limiter_are_safe() {
    // No panic, and the key cap holds, while other threads check and undo on
    // the limiter being carried over (its map changing under the walk; 81
    // keys at a cap of 64, so the overflow ring is in use too).
    let (first, clock) = limiter(policy(5, 1000, 10), 64);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for worker in 0..2u8 {
            let (first, clock, stop) = (&first, &clock, &stop);
            scope.spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let key = (i % 80) as u8 + worker;
                    let d = first.check(&key);
                    if i % 3 == 0 {
                        first.undo(&key, &d);
                    }
                    if i % 50 == 0 {
                        clock.advance(Duration::from_millis(7));
                    }
                    i += 1;
                }
            });
        }
        let mut current = first.reconfigured(policy(5, 1000, 10)).unwrap();
        for round in 0..200u32 {
            let next = policy(
                1 + round % 7,
                100 + u64::from(round % 5) * 300,
                1 + round % 16,
            );
            // From the raced limiter (another window each time), then on.
            let carried = first.reconfigured(next.clone()).unwrap();
            assert!(carried.stats().keys_tracked <= 64);
            current = current.reconfigured(next).unwrap();
            let _ = current.check(&(round as u8));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

#[test]
fn a_count_above_what_a_compact_ring_holds_survives_a_change_through_one() {
    // 100 000 units at one instant, then a change to a limit a compact ring
    // takes (another window: the rings are rebuilt), then back: no time
    // passes, so every unit is still in the window and must still count.
    let (wide, _clock) = limiter(policy(100_000, 60_000, 15), 100);
    assert!(wide.check_n(&1, 100_000).is_allowed());
    let narrow = wide.reconfigured(policy(100, 1_000, 15)).unwrap();
    assert!(!narrow.check(&1).is_allowed());
    let back = narrow.reconfigured(policy(100_000, 60_000, 15)).unwrap();
    assert_eq!(back.usage(&1).used, 100_000);
    assert!(!back.check_n(&1, 34_465).is_allowed());
    assert!(!back.check(&1).is_allowed());
}

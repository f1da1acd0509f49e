//! The limiter's tests, on a `ManualClock` (and on paused tokio time for
//! the background sweeper).

use super::state::MAX_KEYS;
use super::*;
use crate::clock::saturating_nanos;
use crate::{ManualClock, Outcome};
use std::time::Duration;

fn limiter(limit: u32, max_keys: usize) -> (Limiter<u64, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(Policy::per(limit, Duration::from_secs(1)).unwrap())
        .clock(clock.clone())
        .max_keys(max_keys)
        .build()
        .unwrap();
    (limiter, clock)
}

#[test]
fn a_tracked_key_takes_at_most_128_bytes_of_table_as_the_map_grows() {
    // The tables' arrays (index, keys and heads, buckets), summed
    // over the partitions, per tracked key, for the default policy and
    // u64 keys and IP addresses (17 bytes: the address extractors' key),
    // at key counts that fall anywhere in the tables' growth.
    fn per_key<K: Hash + Eq + Clone + Send + Sync + 'static>(key: impl Fn(u64) -> K) {
        let policy = Policy::per(100, Duration::from_secs(1)).unwrap();
        let l: Limiter<K, ManualClock> = Limiter::builder(policy)
            .clock(ManualClock::new())
            .max_keys(1 << 20)
            .build()
            .unwrap();
        let mut n = 0;
        for target in [30_000u64, 61_000, 97_000, 140_000, 211_000, 300_000] {
            while n < target {
                assert!(l.check(&key(n)).is_allowed());
                n += 1;
            }
            let bytes: usize = l.compact().partitions().iter().map(|p| p.bytes()).sum();
            let each = bytes as f64 / n as f64;
            assert!(each <= 128.0, "{each:.1} bytes a key at {n} keys");
        }
    }
    per_key(|k| k);
    per_key(|k| std::net::IpAddr::from((k as u128).to_be_bytes()));
}

#[test]
fn keys_are_found_while_their_tables_are_rebuilt_under_them() {
    // 16 partitions (a cap of 10 000), each grown by a new key at a time
    // from room for 8 keys to hundreds: every rebuild moves the keys
    // already there, which must keep their counts.
    let (l, clock) = limiter(3, 10_000);
    assert_eq!(l.compact().partition_count, 16);
    for k in 0..6_000u64 {
        assert!(l.check(&k).is_allowed());
        if k % 97 == 0 {
            for old in (0..k).step_by(61) {
                assert_eq!(
                    l.usage(&old).used,
                    1 + (old % 97 == 0) as u32,
                    "key {old} at {k}"
                );
            }
            assert!(l.check(&k).is_allowed());
        }
    }
    // Then all go idle but one, and the sweeps hand the tables back.
    let room_before: usize = l
        .compact()
        .partitions()
        .iter()
        .map(|p| p.read().capacity())
        .sum();
    clock.advance(Duration::from_millis(1200));
    assert!(l.check(&5).is_allowed());
    l.evict_idle();
    assert_eq!(l.stats().keys_evicted, 5_999);
    let room: usize = l
        .compact()
        .partitions()
        .iter()
        .map(|p| p.read().capacity())
        .sum();
    assert!(
        room <= 16 && room_before >= 6_000,
        "room for {room_before} keys, then {room}"
    );
    assert_eq!(l.usage(&5).used, 1);
    assert_eq!(l.stats().keys_tracked, 1);
}

#[test]
fn a_limit_above_65_535_takes_wide_rings_and_keeps_its_counts_when_raised_to_it() {
    let clock = ManualClock::new();
    let policy = |limit| Policy::per(limit, Duration::from_secs(1)).unwrap();
    let compact: Limiter<u64, ManualClock> = Limiter::builder(policy(65_535))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(matches!(compact.state, Shared::Compact(_)));
    assert!(compact.check_n(&1, 65_535).is_allowed());
    let wide = compact.reconfigured(policy(70_000)).unwrap();
    assert!(matches!(wide.state, Shared::Wide(_)));
    assert_eq!(wide.usage(&1).used, 65_535);
    assert!(wide.check_n(&1, 4_465).is_allowed());
    assert!(!wide.check(&1).is_allowed());
    // Lowered again, the wide rings serve as they are.
    let lower = wide.reconfigured(policy(100)).unwrap();
    assert!(matches!(lower.state, Shared::Wide(_)));
    assert!(!lower.check(&1).is_allowed());
}

#[test]
fn a_key_type_with_one_value_has_one_ring_outside_the_map() {
    let clock = ManualClock::new();
    let l: Limiter<(), ManualClock> =
        Limiter::builder(Policy::per(2, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
    assert_eq!(l.compact().partition_count, 1);
    assert_eq!(l.stats().keys_tracked, 1);
    assert!(l.check(&()).is_allowed());
    let second = l.check(&());
    assert!(second.is_allowed());
    assert!(!l.check(&()).is_allowed());
    assert!(!l.peek(&(), 1).is_allowed());
    assert_eq!(l.check_n(&(), 3).outcome(), Outcome::CostExceedsLimit);
    l.undo(&(), &second);
    assert_eq!(l.usage(&()).used, 1);
    assert!(l.check(&()).is_allowed());
    assert!(l.compact().partitions().iter().all(|p| p.is_empty()));
    // Idle for a minute: no sweep drops it, and its window has emptied.
    clock.advance(Duration::from_secs(60));
    assert_eq!(l.evict_idle(), 0);
    assert_eq!(l.stats().keys_tracked, 1);
    assert_eq!(l.usage(&()).used, 0);
    assert!(l.check(&()).is_allowed());
    let stats = l.stats();
    assert_eq!((stats.admitted, stats.rejected), (4, 2));
}

#[test]
fn each_key_is_found_in_its_partition_by_the_one_hash() {
    // 1024 partitions: the hash picks the partition and, passed on, the
    // map's slot; every key must be found again, and only its own units.
    let (l, _) = limiter(3, 1 << 20);
    let partitions = (1 << 20) / crate::limiter::KEYS_PER_PARTITION;
    assert_eq!(l.compact().partition_count, partitions);
    let keys = 0..20_000u64;
    for k in keys.clone() {
        for _ in 0..=(k % 3) {
            let _ = l.check(&k);
        }
    }
    assert_eq!(l.stats().keys_tracked, 20_000);
    let used = l
        .compact()
        .partitions()
        .iter()
        .filter(|p| !p.is_empty())
        .count();
    assert!(used > partitions * 9 / 10, "{used} partitions in use");
    for k in keys {
        assert_eq!(l.usage(&k).used, (k % 3 + 1) as u32, "key {k}");
    }
}

#[test]
fn cost_above_limit_can_never_pass() {
    let (l, _) = limiter(5, 10);
    let d = l.check_n(&1, 6);
    assert_eq!(d.outcome(), Outcome::CostExceedsLimit);
    assert_eq!(d.retry_after(), None);
    assert_eq!(d.remaining(), 5);
    assert_eq!(l.usage(&1).used, 0);
}

#[test]
fn idle_keys_are_evicted_by_the_limiter_itself() {
    let (l, clock) = limiter(5, 100_000);
    for k in 0..10_000 {
        assert!(l.check(&k).is_allowed());
    }
    assert_eq!(l.stats().keys_tracked, 10_000);
    clock.advance(Duration::from_secs(2));
    // Only one hot key keeps checking; each bucket width it sweeps one partition.
    for _ in 0..l.compact().partitions().len() {
        clock.advance(Duration::from_millis(70));
        let _ = l.check(&u64::MAX);
    }
    let stats = l.stats();
    assert_eq!(stats.keys_tracked, 1);
    assert_eq!(stats.keys_evicted, 10_000);
}

#[test]
fn checks_alone_go_round_many_partitions_in_32_bucket_widths() {
    // A cap of 1M keys: 1024 partitions, each swept by one check, 32 a
    // bucket width (a bucket of 1 s / 15).
    let (l, clock) = limiter(5, 1 << 20);
    for k in 0..20_000 {
        assert!(l.check(&k).is_allowed());
    }
    clock.advance(Duration::from_secs(2));
    let width = l.policy().bucket_width();
    let start = clock.now_nanos();
    // A hot key's traffic, a check every millisecond.
    while l.stats().keys_tracked > 1 {
        clock.advance(Duration::from_millis(1));
        let _ = l.check(&u64::MAX);
        let elapsed = Duration::from_nanos(clock.now_nanos() - start);
        assert!(elapsed <= width * 33, "{:?} after {elapsed:?}", l.stats());
    }
    assert_eq!(l.stats().keys_evicted, 20_000);
    // Checks leave the arrays to new keys: freeing memory is the sweeper's
    // and evict_idle's (no request waits for the allocator's work).
    let bytes = || -> usize { l.compact().partitions().iter().map(|p| p.bytes()).sum() };
    assert!(bytes() > 20_000 * 90, "{} bytes", bytes());
    assert_eq!(l.evict_idle(), 0);
    assert!(bytes() < 20_000, "{} bytes", bytes());
}

#[test]
fn at_max_keys_a_flood_cannot_reset_a_tracked_key() {
    let (l, clock) = limiter(3, 8);
    for _ in 0..3 {
        assert!(l.check(&0).is_allowed());
    }
    assert!(!l.check(&0).is_allowed());
    for k in 1..1000 {
        let _ = l.check(&k);
        clock.advance(Duration::from_micros(100));
    }
    assert!(l.stats().keys_tracked <= 8);
    assert!(l.stats().overflowed > 0);
    // The heavy user is still over its limit.
    assert!(!l.check(&0).is_allowed());
}

#[test]
fn at_max_keys_idle_keys_make_room() {
    let (l, clock) = limiter(3, 4);
    for k in 0..4 {
        let _ = l.check(&k);
    }
    clock.advance(Duration::from_secs(3));
    let _ = l.check(&100);
    assert_eq!(l.stats().overflowed, 0);
    assert!(l.usage(&100).used == 1);
}

#[test]
fn stats_count_admissions_and_rejections() {
    let (l, _) = limiter(2, 10);
    for _ in 0..5 {
        let _ = l.check(&7);
    }
    let s = l.stats();
    assert_eq!((s.admitted, s.rejected, s.keys_tracked), (2, 3, 1));
    let u = l.usage(&7);
    assert_eq!((u.used, u.remaining, u.limit), (2, 0, 2));
}

#[test]
fn clock_going_backwards_after_eviction_never_recounts_a_window() {
    let (l, clock) = limiter(2, 10);
    clock.set(10_000_000_000);
    let full = l.check_n(&1, 2);
    assert!(full.is_allowed());
    // The key goes idle and is evicted at 13 s...
    clock.set(13_000_000_000);
    assert_eq!(l.evict_idle(), 1);
    // ...then the clock steps back to 10.5 s, half a window after the burst.
    // The key's memory is gone, but the limiter has seen 13 s: the new ring is
    // held there, so its units are never counted in a span beside the burst.
    clock.set(10_500_000_000);
    let d = l.check_n(&1, 2);
    assert!(d.is_allowed());
    assert!(
        d.recorded_slot() > full.recorded_slot() + 15,
        "recorded at slot {} beside the burst at slot {}",
        d.recorded_slot(),
        full.recorded_slot()
    );
    assert!(!l.check(&1).is_allowed());
}

#[test]
fn a_key_leaving_the_overflow_ring_keeps_its_window() {
    let (l, clock) = limiter(3, 1);
    assert!(l.check(&1).is_allowed());
    // At the cap, key 2 shares the overflow ring and uses its whole limit.
    clock.set(500_000_000);
    for _ in 0..3 {
        assert!(l.check(&2).is_allowed());
    }
    assert_eq!(l.stats().overflowed, 3);
    // Key 1 goes idle and makes room, but key 2's units are still in the
    // window: its own ring starts as a copy of the overflow ring.
    clock.set(1_200_000_000);
    assert!(!l.check(&2).is_allowed());
    assert_eq!(l.stats().keys_tracked, 1);
    assert_eq!(l.usage(&2).used, 3);
    clock.set(2_600_000_000);
    assert!(l.check(&2).is_allowed());
    assert_eq!(l.usage(&2).used, 1);
}

#[test]
fn a_cap_reached_once_does_not_send_later_keys_to_the_overflow_ring() {
    let (l, clock) = limiter(10, 2);
    for k in 0..3 {
        assert!(l.check(&k).is_allowed());
    }
    assert_eq!(l.stats().overflowed, 1);
    // A new key every 0.9 s for a minute: each finds room once the old ones
    // are swept, however recently the overflow ring admitted something.
    for key in 1_000..1_066 {
        clock.advance(Duration::from_millis(900));
        assert!(l.check(&key).is_allowed());
        l.evict_idle();
    }
    // Only the first, while keys 0 and 1 were still in their window.
    assert_eq!(l.stats().overflowed, 2);
    // Once the last of them is idle, two users get their own limits, not
    // one shared one.
    clock.advance(Duration::from_secs(2));
    l.evict_idle();
    for user in [7, 8] {
        assert_eq!((0..10).filter(|_| l.check(&user).is_allowed()).count(), 10);
        assert!(!l.check(&user).is_allowed());
    }
}

#[test]
fn peek_reports_what_the_check_would() {
    let (l, clock) = limiter(5, 10);
    clock.set(200_000_000);
    // A fresh key, then one with older units in the window.
    for _ in 0..2 {
        let peeked = l.peek(&1, 2);
        let checked = l.check_n(&1, 2);
        assert_eq!(peeked.outcome(), checked.outcome());
        assert_eq!(peeked.remaining(), checked.remaining());
        assert_eq!(peeked.reset(), checked.reset());
        clock.set(700_000_000);
    }
}

#[test]
fn keys_in_the_overflow_ring_are_peeked_there() {
    let (l, clock) = limiter(3, 1);
    assert!(l.check(&1).is_allowed());
    clock.set(500_000_000);
    for _ in 0..3 {
        assert!(l.check(&2).is_allowed());
    }
    // Key 2 is untracked, but its units are in the overflow ring.
    let peeked = l.peek(&2, 1);
    assert_eq!(peeked.outcome(), Outcome::Denied);
    assert_eq!(l.usage(&2).used, 3);
    assert_eq!(l.check(&2).outcome(), peeked.outcome());
}

#[test]
fn a_flood_of_new_keys_at_the_cap_sweeps_once_per_bucket() {
    let (l, clock) = limiter(1_000, 1);
    assert!(l.check(&0).is_allowed());
    clock.set(100_000_000);
    let sweeps_before = l.compact().sweep_cursor.load(Relaxed);
    for key in 1..=1_000 {
        let _ = l.check(&key);
    }
    // One sweep for the new bucket (`maybe_sweep`) and one by the first new
    // key at the cap, not one per new key.
    assert!(l.compact().sweep_cursor.load(Relaxed) - sweeps_before <= 2);
    assert_eq!(l.stats().overflowed, 1_000);
    // In the next bucket, the first new key may sweep again.
    clock.set(200_000_000);
    let before = l.compact().sweep_cursor.load(Relaxed);
    let _ = l.check(&5_000);
    let _ = l.check(&5_001);
    assert_eq!(l.compact().sweep_cursor.load(Relaxed) - before, 2);
}

#[test]
fn a_clock_past_the_slot_range_is_held_not_wrapped() {
    // 1 ns buckets: the flag bits of a slot would be reached at 2^61 ns.
    let clock = ManualClock::new();
    let policy = Policy::builder()
        .limit(2)
        .window(Duration::from_nanos(16))
        .buckets(16)
        .build()
        .unwrap();
    let l: Limiter<u64, ManualClock> = Limiter::builder(policy)
        .clock(clock.clone())
        .build()
        .unwrap();
    clock.set(1 << 61);
    let d = l.check(&1);
    assert!(d.is_allowed());
    assert!(
        d.reset() > Duration::ZERO,
        "an admitted unit is in the window"
    );
    assert!(l.check(&1).is_allowed());
    assert!(!l.check(&1).is_allowed());
    // Later readings are held at the same instant: the window stays full.
    for now in [u64::MAX - 5, u64::MAX] {
        clock.set(now);
        let d = l.check(&1);
        assert_eq!(d.outcome(), Outcome::Denied, "time stands still at {now}");
        assert!(d.retry_after().is_some_and(|w| w > Duration::ZERO));
    }
    assert_eq!(l.stats().keys_tracked, 1);
}

#[test]
fn peek_reports_without_counting_or_tracking() {
    let (l, _) = limiter(3, 10);
    let d = l.peek(&1, 1);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 2);
    let too_big = l.peek(&1, 4);
    assert_eq!(too_big.outcome(), Outcome::CostExceedsLimit);
    assert_eq!(too_big.retry_after(), None);
    assert_eq!(l.stats(), LimiterStats::default());
    assert!(l.check_n(&1, 3).is_allowed());
    let d = l.peek(&1, 1);
    assert_eq!(d.outcome(), Outcome::Denied);
    assert_eq!(d.remaining(), 0);
    assert_eq!(l.usage(&1).used, 3);
    assert_eq!((l.stats().admitted, l.stats().rejected), (1, 0));
}

#[test]
fn cost_above_limit_counts_as_rejected_and_tracks_nothing() {
    let (l, _) = limiter(5, 10);
    assert_eq!(l.check_n(&1, 6).outcome(), Outcome::CostExceedsLimit);
    let s = l.stats();
    assert_eq!((s.admitted, s.rejected, s.keys_tracked), (0, 1, 0));
    // A cost of exactly the limit passes on an empty window.
    assert!(l.check_n(&1, 5).is_allowed());
}

#[test]
fn undo_gives_units_back_to_the_key_or_the_overflow_ring() {
    let (l, _) = limiter(2, 1);
    let tracked = l.check_n(&1, 2);
    assert!(!l.check(&1).is_allowed());
    l.undo(&1, &tracked);
    assert_eq!(l.usage(&1).used, 0);
    // Key 2 is not tracked (cap of 1): its units live in the overflow ring.
    let overflowed = l.check_n(&2, 2);
    assert!(overflowed.is_allowed());
    assert!(!l.check(&3).is_allowed(), "the overflow ring is shared");
    l.undo(&2, &overflowed);
    assert!(l.check(&3).is_allowed());
}

#[test]
fn reset_is_the_time_until_the_youngest_unit_leaves() {
    let (l, clock) = limiter(2, 10);
    // A unit leaves the window one window (1 s) after its admission, to a
    // step of its bucket (1/65 536 of the bucket's width).
    let step = 1_000_000_000 / u64::from(Policy::DEFAULT_BUCKETS) / 65_536 + 1;
    let leaves_in = |d: Decision| {
        let reset = d.reset().as_nanos() as u64;
        assert!(
            (1_000_000_000..=1_000_000_000 + step).contains(&reset),
            "{d:?}"
        );
        reset
    };
    leaves_in(l.check(&1));
    clock.set(500_000_000);
    let reset = leaves_in(l.check(&1));
    // The first unit has left by then; the second leaves after that.
    clock.set(500_000_000 + reset - 1);
    assert_eq!(l.usage(&1).used, 1);
    assert_eq!(l.usage(&1).reset, Duration::from_nanos(1));
    assert_eq!(l.usage(&9).reset, Duration::ZERO);
}

#[test]
fn zero_max_keys_is_rejected() {
    let r: Result<Limiter<u8, _>, _> =
        Limiter::builder(Policy::per(1, Duration::from_secs(1)).unwrap())
            .max_keys(0)
            .build();
    assert!(matches!(
        r.unwrap_err(),
        ConfigError::Zero {
            setting: "max_keys"
        }
    ));
}

#[test]
fn a_cap_above_the_highest_is_taken_as_the_highest() {
    let l: Limiter<u64, _> = Limiter::builder(Policy::per(1, Duration::from_secs(1)).unwrap())
        .max_keys(usize::MAX)
        .build()
        .unwrap();
    assert_eq!(l.compact().max_keys, MAX_KEYS);
    assert!(l.check(&7).is_allowed());
    assert!(!l.check(&7).is_allowed());
}

#[test]
fn a_key_evicted_then_counted_in_the_overflow_ring_restarts_no_earlier_than_the_sweep() {
    let (l, clock) = limiter(2, 1);
    let secs = |s: f64| (s * 1e9) as u64;
    clock.set(secs(10.0));
    let burst = l.check_n(&1, 2);
    assert!(burst.is_allowed());
    clock.set(secs(13.0));
    assert_eq!(l.evict_idle(), 1);
    // Key 2 takes the only place.
    assert!(l.check(&2).is_allowed());
    // The clock steps back to half a window after key 1's burst: in the
    // overflow ring its units count from the sweep on, not beside the burst.
    clock.set(secs(10.5));
    let again = l.check_n(&1, 2);
    assert!(again.is_allowed());
    assert!(again.recorded_slot() >= l.geometry.slot(secs(13.0)));
    // Times still count from the clock's reading.
    assert!(again.reset() > Duration::from_millis(2500), "{again:?}");
    assert!(!l.check(&1).is_allowed());
}

#[test]
fn units_undone_from_an_older_bucket_are_free_at_once_and_denials_stay_exact() {
    let (l, clock) = limiter(2, 10);
    let first = l.check(&1);
    clock.advance(l.policy().bucket_width());
    assert!(l.check(&1).is_allowed());
    l.undo(&1, &first);
    assert!(l.peek(&1, 1).is_allowed());
    assert!(l.check(&1).is_allowed());
    let denied = l.check(&1);
    assert_eq!(denied.outcome(), Outcome::Denied);
    let wait = denied.retry_after().unwrap();
    let start = clock.now_nanos();
    clock.set(start + saturating_nanos(wait) - 1);
    assert!(!l.peek(&1, 1).is_allowed(), "{denied:?}");
    clock.set(start + saturating_nanos(wait));
    assert!(l.peek(&1, 1).is_allowed(), "{denied:?}");
}

#[test]
fn an_undo_more_than_a_window_late_gives_back_nothing_even_2_pow_32_slots_on() {
    let clock = ManualClock::new();
    let policy = Policy::builder()
        .limit(1)
        .window(Duration::from_micros(15))
        .buckets(15)
        .build()
        .unwrap();
    let l = Limiter::builder(policy)
        .clock(clock.clone())
        .build()
        .unwrap();
    let old = l.check(&1);
    assert!(old.is_allowed());
    // 2^32 one-microsecond slots on, the same bucket holds the same tag.
    clock.set((1u64 << 32) * 1_000);
    assert!(l.check(&1).is_allowed());
    l.undo(&1, &old);
    assert!(!l.check(&1).is_allowed());
}

#[test]
fn a_zero_cost_check_in_the_overflow_ring_does_not_mark_the_key() {
    let (l, clock) = limiter(3, 1);
    assert!(l.check(&1).is_allowed());
    clock.set(500_000_000);
    assert!(l.check_n(&2, 3).is_allowed());
    // Another untracked key only asks (cost 0): nothing is counted for it.
    let key = (3..)
        .find(|k| {
            let group = |k| super::overflow::mark_group(l.compact().lookup(k).hash);
            group(k) != group(&2)
        })
        .unwrap();
    assert!(l.check_n(&key, 0).is_allowed());
    // Key 1 goes idle and makes room: the key gets a ring of its own, empty.
    clock.set(1_200_000_000);
    assert_eq!(l.evict_idle(), 1);
    let d = l.check(&key);
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(l.usage(&key).used, 1);
}

#[test]
fn peek_of_a_key_restarting_after_a_sweep_reports_the_checks_times() {
    // As in clock_going_backwards_after_eviction_never_recounts_a_window: the
    // key's new ring starts at the sweep (13 s), not at the clock (10.5 s).
    for max_keys in [10, 1] {
        let (l, clock) = limiter(2, max_keys);
        clock.set(10_000_000_000);
        assert!(l.check_n(&1, 2).is_allowed());
        clock.set(13_000_000_000);
        assert_eq!(l.evict_idle(), 1);
        if max_keys == 1 {
            assert!(l.check(&2).is_allowed(), "key 2 takes the only place");
        }
        clock.set(10_500_000_000);
        let peeked = l.peek(&1, 2);
        let checked = l.check_n(&1, 2);
        assert_eq!(peeked.outcome(), checked.outcome());
        assert_eq!(peeked.remaining(), checked.remaining());
        assert_eq!(peeked.reset(), checked.reset(), "max_keys {max_keys}");
    }
}

#[test]
fn a_check_stalled_at_the_cap_is_never_admitted_beside_a_ring_swept_meanwhile() {
    // Limit 3 per 1 s in 15 buckets, room for one key. Key 1 holds it.
    let (l, clock) = limiter(3, 1);
    assert!(l.check(&1).is_allowed());
    // At 0.5 s key 2 finds the limiter full; its check stalls before it
    // takes the writer's lock. Meanwhile key 1 goes idle, key 2 gets a
    // ring of its own and uses its whole limit at 1.2 s, and that ring is
    // swept once idle, at 2.4 s.
    clock.set(500_000_000);
    let own = Arc::new(std::sync::Mutex::new(None));
    let (l2, clock2, own2) = (
        l.reconfigured(l.policy().clone()).unwrap(),
        clock.clone(),
        Arc::clone(&own),
    );
    *l.compact().stall_at_cap.lock().unwrap() = Some(Box::new(move || {
        clock2.set(1_200_000_000);
        let d = l2.check_n(&2, 3);
        assert!(d.is_allowed() && !d.is_overflow(), "{d:?}");
        *own2.lock().unwrap() = Some(d);
        clock2.set(2_400_000_000);
        assert_eq!(l2.evict_idle(), 1);
    }));
    let stalled = l.check_n(&2, 3);
    let own = own.lock().unwrap().expect("the stall ran");
    // Key 2's units: 3 in its own ring, and 3 more only where no window
    // holds both (a unit recorded at slot x counts through x + 15).
    let span = l.compact().shape.span_slots();
    assert!(
        !stalled.is_allowed() || stalled.recorded_slot() >= own.recorded_slot() + span,
        "admitted at slot {} beside 3 units at slot {}",
        stalled.recorded_slot(),
        own.recorded_slot()
    );
}

#[test]
fn an_overflow_decision_says_so_and_passes_by_its_retry_after() {
    let (l, clock) = limiter(1, 1);
    let tracked = l.check(&1);
    assert!(tracked.is_allowed() && !tracked.is_overflow());
    clock.set(500_000_000);
    let first = l.check(&2);
    assert!(first.is_allowed() && first.is_overflow());
    clock.set(600_000_000);
    let denied = l.check(&3);
    assert!(!denied.is_allowed() && denied.is_overflow());
    assert_eq!(l.peek(&3, 1).retry_after(), denied.retry_after());
    // An upper bound: by then the overflow ring has room (the key may pass
    // earlier, once key 1 is idle and a sweep makes room for it).
    let wait = crate::clock::saturating_nanos(denied.retry_after().unwrap());
    clock.set(600_000_000 + wait);
    assert!(l.check(&3).is_allowed());
    // A cost that can never pass reports the overflow ring's window too.
    let never = l.check_n(&4, 2);
    assert_eq!(never.outcome(), Outcome::CostExceedsLimit);
    assert!(never.is_overflow(), "{never:?}");
}

mod sweeper {
    use super::*;
    use crate::ManualClock;
    use tokio::time::{advance, Instant};

    /// 1 s in 10 buckets of 100 ms: bucket starts fall on tokio's 1 ms ticks.
    fn policy(limit: u32) -> Policy {
        Policy::builder()
            .limit(limit)
            .window(Duration::from_secs(1))
            .buckets(10)
            .build()
            .unwrap()
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_idle_keys_is_gone_within_a_window_and_a_bucket_without_traffic() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        assert_eq!(l.clock().source(), crate::clock::TimeSource::Tokio);
        let start = Instant::now();
        for k in 0..100_000 {
            assert!(l.check(&k).is_allowed());
        }
        assert_eq!(l.stats().keys_tracked, 100_000);
        // Every unit counts through slot 10 (up to 1.1 s): a round within it
        // keeps every key.
        advance(Duration::from_millis(1099)).await;
        l.sweeper_finished(1).await;
        assert_eq!(l.stats().keys_tracked, 100_000);
        // The round at 1.1 s, the start of slot 11, drops them all.
        advance(Duration::from_millis(1)).await;
        l.sweeper_finished(2).await;
        let stats = l.stats();
        assert_eq!((stats.keys_tracked, stats.keys_evicted), (0, 100_000));
        assert_eq!(start.elapsed(), Duration::from_millis(1100));
        assert!(l.compact().partitions().iter().all(|p| p.is_empty()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_used_just_before_a_round_keeps_its_count() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        for k in 0..1_000 {
            let _ = l.check(&k);
        }
        // Half a bucket before the round that drops the flood, key 7 000 uses
        // its whole limit.
        advance(Duration::from_millis(1050)).await;
        assert!(l.check_n(&7_000, 3).is_allowed());
        let rounds = l.sweeper_rounds();
        advance(Duration::from_millis(50)).await;
        l.sweeper_finished(rounds + 1).await;
        assert_eq!(l.stats().keys_tracked, 1);
        assert_eq!(l.usage(&7_000).used, 3);
        assert!(!l.peek(&7_000, 1).is_allowed());
        // It goes once its units have left the window: at the start of slot 21.
        let rounds = l.sweeper_rounds();
        advance(Duration::from_millis(999)).await;
        l.sweeper_finished(rounds + 1).await;
        assert_eq!(l.stats().keys_tracked, 1);
        advance(Duration::from_millis(1)).await;
        l.sweeper_finished(rounds + 2).await;
        assert_eq!(l.stats().keys_tracked, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_holds_the_limiter_weakly_and_ends_with_it() {
        let l: Limiter<Arc<u64>> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        assert_eq!(alive_tasks(), 1);
        let key = Arc::new(7);
        assert!(l.check(&key).is_allowed());
        assert_eq!(Arc::strong_count(&key), 2, "the map holds a clone");
        advance(Duration::from_millis(250)).await;
        l.sweeper_finished(1).await;
        // The sweeper waits for its next round holding no strong reference:
        // dropping the limiter drops its keys at once.
        drop(l);
        assert_eq!(Arc::strong_count(&key), 1);
        for _ in 0..100 {
            if alive_tasks() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(alive_tasks(), 0);
    }

    async fn alive_tasks_settle_at(expected: usize) {
        for _ in 0..100 {
            if alive_tasks() == expected {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(alive_tasks(), expected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconfigured_limiter_shares_the_sweeper_until_the_last_handle_drops() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        let raised = l.reconfigured(policy(5)).unwrap();
        assert_eq!(alive_tasks(), 1, "one map, one sweeper");
        for k in 0..100 {
            assert!(raised.check(&k).is_allowed());
        }
        drop(l);
        alive_tasks_settle_at(1).await;
        // It still sweeps the shared map for the handle left.
        advance(Duration::from_millis(1100)).await;
        raised.sweeper_finished(1).await;
        while raised.stats().keys_tracked > 0 {
            let rounds = raised.sweeper_rounds();
            advance(Duration::from_millis(100)).await;
            raised.sweeper_finished(rounds + 1).await;
        }
        assert_eq!(raised.stats().keys_evicted, 100);
        drop(raised);
        alive_tasks_settle_at(0).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_window_gets_a_sweeper_of_its_own_per_new_bucket() {
        let l: Limiter<u64> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        for k in 0..100 {
            assert!(l.check(&k).is_allowed());
        }
        // 2 s in 4 buckets of 500 ms: the units of slot 0 (100 ms buckets)
        // are moved to the first 500 ms bucket, counted through slot 4.
        let longer = Policy::builder()
            .limit(3)
            .window(Duration::from_secs(2))
            .buckets(4)
            .build()
            .unwrap();
        let longer = l.reconfigured(longer).unwrap();
        assert_eq!(longer.stats().keys_tracked, 100);
        drop(l);
        alive_tasks_settle_at(1).await;
        // Rounds every 500 ms, not every 100 ms.
        advance(Duration::from_millis(499)).await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(longer.sweeper_rounds(), 0);
        advance(Duration::from_millis(1)).await;
        longer.sweeper_finished(1).await;
        for round in 2..=4 {
            advance(Duration::from_millis(500)).await;
            longer.sweeper_finished(round).await;
        }
        assert_eq!(longer.stats().keys_tracked, 100);
        // The round at 2.5 s, the start of slot 5, drops them all.
        advance(Duration::from_millis(500)).await;
        longer.sweeper_finished(5).await;
        assert_eq!(longer.stats().keys_tracked, 0);
        drop(longer);
        alive_tasks_settle_at(0).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_type_with_one_value_has_no_sweeper() {
        let l: Limiter<()> = Limiter::builder(policy(3)).sweep_idle().build().unwrap();
        assert!(l.check(&()).is_allowed());
        assert_eq!(alive_tasks(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn with_a_manual_clock_rounds_follow_tokio_and_idleness_the_clock() {
        let clock = ManualClock::new();
        let l: Limiter<u64, ManualClock> = Limiter::builder(policy(3))
            .clock(clock.clone())
            .sweep_idle_every(Duration::from_millis(100))
            .build()
            .unwrap();
        for k in 0..1_000 {
            let _ = l.check(&k);
        }
        // A minute of tokio time, in rounds every 100 ms: the limiter's clock
        // has not moved, so no key is idle.
        for round in 1..=600 {
            advance(Duration::from_millis(100)).await;
            l.sweeper_finished(round).await;
        }
        assert_eq!(l.stats().keys_tracked, 1_000);
        // Once the limiter's clock has moved past the keys' window, the next
        // round drops them.
        clock.advance(Duration::from_millis(1100));
        assert_eq!(l.stats().keys_tracked, 1_000);
        advance(Duration::from_millis(100)).await;
        l.sweeper_finished(601).await;
        assert_eq!(l.stats().keys_tracked, 0);
    }

    #[test]
    fn a_sweeper_outside_a_runtime_is_a_config_error() {
        let built: Result<Limiter<u64>, _> = Limiter::builder(policy(3)).sweep_idle().build();
        assert!(matches!(built, Err(ConfigError::NoRuntime)));
        // Without a sweeper, no runtime is needed.
        let built: Result<Limiter<u64>, _> = Limiter::builder(policy(3)).build();
        assert!(built.is_ok());
    }

    #[tokio::test]
    async fn a_zero_sweep_period_is_a_config_error() {
        let built: Result<Limiter<u64>, _> = Limiter::builder(policy(3))
            .sweep_idle_every(Duration::ZERO)
            .build();
        assert!(matches!(
            built,
            Err(ConfigError::Zero {
                setting: "sweep_period"
            })
        ));
    }
}

#[test]
fn a_charge_counts_past_the_limit_for_tracked_untracked_and_overflow_keys() {
    let (l, clock) = limiter(3, 1);
    // Tracked: admitted with 1, charged 4 more.
    assert!(l.check(&1).is_allowed());
    let excess = l.charge(&1, 4).unwrap();
    assert_eq!((excess.cost(), excess.remaining()), (4, 0));
    assert!(!l.check(&1).is_allowed());
    assert_eq!(l.usage(&1).used, 3, "usage reports at most the limit");
    // At the cap (one key): key 2 is charged in the overflow ring, which
    // then denies the keys it decides until the charge leaves.
    let overflowed = l.charge(&2, 5).unwrap();
    assert!(overflowed.is_overflow());
    assert!(!l.check(&3).is_allowed());
    // Undo gives each charge back where it was counted.
    l.undo(&2, &overflowed);
    assert!(l.check(&3).is_allowed());
    l.undo(&1, &excess);
    assert!(l.check_n(&1, 2).is_allowed());
    assert!(!l.check(&1).is_allowed());
    // A charge for a key without a ring makes one.
    clock.advance(Duration::from_secs(2));
    assert_eq!(l.evict_idle(), 1);
    let fresh = l.charge(&9, 3).unwrap();
    assert!(!fresh.is_overflow());
    assert!(!l.check(&9).is_allowed());
    clock.advance(Duration::from_millis(1100));
    assert!(l.check_n(&9, 3).is_allowed());
}

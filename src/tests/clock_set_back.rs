//! The limiter evicts idle keys by itself, a partition at a time, also
//! after its clock is set back (a `ManualClock`, or any custom `Clock` that is
//! not monotonic, which the `Clock` docs say is tolerated).

use crate::{Limiter, ManualClock, Policy};
use std::time::Duration;

/// The keys a partition is sized for.
const PARTITION: usize = crate::limiter::KEYS_PER_PARTITION;
const HOUR: u64 = 3_600_000_000_000;

/// A limiter of 10 per second holding `max_keys` keys, each checked once at 0.
fn full(max_keys: usize) -> (Limiter<u64, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(Policy::per(10, Duration::from_secs(1)).unwrap())
        .clock(clock.clone())
        .max_keys(max_keys)
        .build()
        .unwrap();
    for key in 0..max_keys as u64 {
        assert!(limiter.check(&key).is_allowed());
    }
    (limiter, clock)
}

#[test]
fn idle_keys_are_still_evicted_by_the_limiter_after_the_clock_is_set_back() {
    // Two partitions, full.
    const MAX_KEYS: usize = 2 * PARTITION;
    let (limiter, clock) = full(MAX_KEYS);
    // One check an hour on sweeps one partition: the other's keys stay.
    clock.set(HOUR);
    assert!(limiter.check(&0).is_allowed());
    assert!(limiter.stats().keys_tracked > MAX_KEYS / 4);
    // The clock is set back to 10 s, where every key but 0 has been idle for
    // 10 s. Ordinary traffic, one check per bucket width, sweeps them out: the
    // hot key and key 0 (held at the hour) are all that stay.
    clock.set(10_000_000_000);
    for _ in 0..8 {
        clock.advance(limiter.policy().bucket_width());
        let _ = limiter.check(&u64::MAX);
    }
    let stats = limiter.stats();
    assert_eq!(stats.keys_tracked, 2, "{stats:?}");
    assert_eq!(stats.keys_evicted, MAX_KEYS as u64 - 1);
    // A key evicted after the set-back restarts no earlier than the hour, so
    // its units never share a window with any it held before.
    let width = limiter.policy().bucket_width().as_nanos() as u64;
    let d = limiter.check_n(&1, 10);
    assert!(d.is_allowed());
    assert!(d.recorded_slot() >= HOUR / width, "{d:?}");
    assert!(!limiter.check(&1).is_allowed());
}

#[test]
fn at_the_cap_keys_idle_since_before_a_set_back_make_room_for_new_ones() {
    // Four partitions, full.
    const MAX_KEYS: usize = 4 * PARTITION;
    let (limiter, clock) = full(MAX_KEYS);
    // An hour on, a new key finds the limiter full: it sweeps one partition
    // for room (and its check, the bucket's first, one more). The other two
    // partitions' keys stay.
    clock.set(HOUR);
    assert!(limiter.check(&u64::MAX).is_allowed());
    assert!(limiter.stats().keys_tracked > MAX_KEYS / 4);
    clock.set(10_000_000_000);
    // As many new users as there are places for beside that key, 64 per
    // bucket width: none may be sent to the shared overflow ring while keys
    // idle since before the set-back hold places.
    let width = limiter.policy().bucket_width();
    for user in 0..(MAX_KEYS - 1) as u64 {
        if user % 64 == 0 {
            clock.advance(width);
        }
        let _ = limiter.check(&(1_000_000 + user));
    }
    let stats = limiter.stats();
    assert_eq!(stats.overflowed, 0, "{stats:?}");
    assert_eq!(stats.keys_tracked, MAX_KEYS, "{stats:?}");
}

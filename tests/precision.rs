//! Strict mode's precision, pinned to the nanosecond: what it costs to count
//! whole buckets rather than an exact sliding log.

use std::time::Duration;
use tower_sliding_window::{Limiter, ManualClock, Policy};

fn as_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// A burst of L fills the window. One window and half a bucket later, an exact
/// sliding log would admit again: the burst is older than W. Strict mode counts
/// every bucket the last window touches, and the burst's bucket still straddles
/// the window's start, so it waits until that bucket leaves, one window and one
/// bucket after it began, and says so.
#[test]
fn a_burst_one_window_later_waits_for_the_straddling_bucket() {
    const LIMIT: u32 = 100;
    let policy = Policy::builder()
        .limit(LIMIT)
        .window(Duration::from_secs(60))
        .buckets(15)
        .build()
        .unwrap();
    let window = as_nanos(policy.window());
    let bucket = as_nanos(policy.bucket_width());
    // 60 s in 15 buckets of 4 s: the window is whole buckets, so t + W starts
    // a bucket too, and the burst's bucket leaves the count exactly at t + W + w.
    assert_eq!(bucket * u64::from(policy.buckets()), window);

    let clock = ManualClock::new();
    let limiter = Limiter::builder(policy)
        .clock(clock.clone())
        .build()
        .unwrap();
    let key = "client";
    let burst = |at: u64| {
        clock.set(at);
        (0..LIMIT).map(|_| limiter.check(&key)).collect::<Vec<_>>()
    };

    // t: the start of a bucket, some buckets after the clock's origin.
    let t = 10 * bucket;
    assert!(burst(t).iter().all(|d| d.is_allowed()));

    let fits_at = t + window + bucket;
    let half_a_bucket_later = t + window + bucket / 2;
    for denied in burst(half_a_bucket_later) {
        assert!(!denied.is_allowed());
        assert_eq!(
            denied.retry_after(),
            Some(Duration::from_nanos(fits_at - half_a_bucket_later))
        );
    }

    // Not a nanosecond early.
    let just_before = burst(fits_at - 1);
    assert!(!just_before[0].is_allowed());
    assert_eq!(just_before[0].retry_after(), Some(Duration::from_nanos(1)));

    let admitted = burst(fits_at);
    assert!(admitted.iter().all(|d| d.is_allowed()));
    assert_eq!(admitted.last().unwrap().remaining(), 0);
    assert!(!limiter.check(&key).is_allowed());
}

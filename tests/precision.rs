//! Strict mode's precision, pinned to the nanosecond: what it costs to keep
//! each bucket's newest admission to a step of the bucket (1/65 536 of its
//! width) rather than an exact sliding log.

use std::time::Duration;
use tower_sliding_window::{Limiter, ManualClock, Policy};

fn as_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// A burst of L fills the window. An exact sliding log admits again once the
/// burst is no longer inside the window, one window after it. Strict mode
/// keeps the burst's instant as its bucket's newest offset, rounded down to a
/// step of the bucket, and frees the bucket when that step's last nanosecond
/// leaves the window: a burst sent one window later waits that step, not a
/// whole bucket, and says so.
#[test]
fn a_burst_one_window_later_waits_at_most_a_step_of_the_bucket() {
    const LIMIT: u32 = 100;
    let policy = Policy::builder()
        .limit(LIMIT)
        .window(Duration::from_secs(60))
        .buckets(15)
        .build()
        .unwrap();
    let window = as_nanos(policy.window());
    let bucket = as_nanos(policy.bucket_width());
    assert_eq!(bucket * u64::from(policy.buckets()), window);
    // Buckets of 4 s: a step is 4 s / 2^16 = 61 035.156 25 ns. A burst at a
    // bucket's start lies in its first step, whose last whole nanosecond is
    // 61 035 ns in.
    let step_end = bucket.div_ceil(1 << 16) - 1;
    assert_eq!(step_end, 61_035);

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

    // Free one window and one step after the burst, where whole buckets
    // would wait until t + W + 4 s.
    let fits_at = t + window + step_end;
    let one_window_later = t + window;
    for denied in burst(one_window_later) {
        assert!(!denied.is_allowed());
        assert_eq!(
            denied.retry_after(),
            Some(Duration::from_nanos(fits_at - one_window_later))
        );
        assert_eq!(denied.reset(), Duration::from_nanos(step_end));
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

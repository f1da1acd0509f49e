//! The guide's mapping from tower_governor's GCRA settings to "L per W"
//! (`guide::migrating`), checked against governor itself on manual clocks:
//! `burst_size` B with a `period` T becomes B per B × T, which admits the
//! same first burst and, unlike the token bucket, never more than B in any
//! interval of B × T.

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;
use std::time::Duration;
use tower_sliding_window::{Limiter, ManualClock, Policy};

/// The most admissions in any interval of `window` among `times` (sorted).
fn most_in_any(window: Duration, times: &[Duration]) -> usize {
    let mut start = 0;
    let mut most = 0;
    for (end, &t) in times.iter().enumerate() {
        while t - times[start] >= window {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

#[test]
fn burst_and_period_become_burst_per_burst_times_period() {
    // tower_governor's default: one every 500 ms, bursts of 8.
    let (period, burst) = (Duration::from_millis(500), 8);
    let ours: Policy = "8 per 4s".parse().unwrap();
    assert_eq!(ours.window(), period * burst);
    assert_eq!(ours.limit(), burst);

    let gcra_clock = FakeRelativeClock::default();
    let gcra = RateLimiter::direct_with_clock(
        Quota::with_period(period)
            .unwrap()
            .allow_burst(NonZeroU32::new(burst).unwrap()),
        gcra_clock.clone(),
    );
    let clock = ManualClock::new();
    let window = Limiter::builder(ours.clone())
        .clock(clock.clone())
        .build()
        .unwrap();

    // A client asking 10 times at once, then every 50 ms for a minute.
    let step = Duration::from_millis(50);
    let (mut gcra_admitted, mut ours_admitted) = (Vec::new(), Vec::new());
    let mut now = Duration::ZERO;
    while now < Duration::from_secs(60) {
        let asks = if now.is_zero() { 10 } else { 1 };
        for _ in 0..asks {
            if gcra.check().is_ok() {
                gcra_admitted.push(now);
            }
            if window.check(&()).is_allowed() {
                ours_admitted.push(now);
            }
        }
        gcra_clock.advance(step);
        clock.advance(step);
        now += step;
    }

    // The same first burst, at once, and no more.
    let at_once = |admitted: &[Duration]| admitted.iter().filter(|t| t.is_zero()).count();
    assert_eq!(at_once(&gcra_admitted), 8);
    assert_eq!(at_once(&ours_admitted), 8);
    // The token bucket lets nearly two bursts through within one window;
    // the sliding window never more than one.
    assert_eq!(most_in_any(ours.window(), &gcra_admitted), 15);
    assert_eq!(most_in_any(ours.window(), &ours_admitted), 8);
    // Over the minute, the same rate give or take the burst and strict
    // mode's bucket (a unit counts for up to 4 s and 267 ms).
    let (g, o) = (gcra_admitted.len(), ours_admitted.len());
    assert!((8 * 60 / 4 - 8..=8 * 60 / 4 + 8).contains(&g), "{g}");
    assert!(o >= 8 * 60 * 15 / (4 * 16) - 8 && o <= g, "{o} against {g}");
}

//! Property tests of the limiter against exact models written here:
//!
//! - `SlidingLog`: an exact sliding log (admit at `t` when the units admitted in
//!   `(t - W, t]` plus the cost fit). The reference a ring approximates.
//! - `SpanModel`: the ring's own rule, stated naively (strict: the units recorded in
//!   slots `s-N ..= s`, the oldest only until its newest admission has left the
//!   window; interpolated: the oldest weighted by its overlap with the window).
//!   Single-threaded on a monotonic clock the limiter must agree with it exactly,
//!   decision by decision and field by field.
//!
//! Time is driven by a `ManualClock`, so every clock reading is exact.

use super::Rng;
use crate::rule::{newest_into, offset_multiplier, offset_of};
use crate::{Decision, Limiter, ManualClock, Outcome, Policy, Precision};
use proptest::prelude::*;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

const KEYS: u8 = 3;

/// A policy in nanoseconds: `limit` per `window`, `n` buckets of `width = ceil(window / n)`.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    n: u64,
    limit: u64,
    window: u64,
    width: u64,
    precision: Precision,
}

impl Geometry {
    fn new(n: u32, limit: u32, window: u64, precision: Precision) -> Geometry {
        Geometry {
            n: n as u64,
            limit: limit as u64,
            window,
            width: window.div_ceil(n as u64),
            precision,
        }
    }

    fn limiter(&self) -> (Limiter<u8, ManualClock>, ManualClock) {
        self.limiter_tracking(Limiter::<()>::DEFAULT_MAX_KEYS)
    }

    /// A limiter of this policy that tracks at most `max_keys` keys.
    fn limiter_tracking(&self, max_keys: usize) -> (Limiter<u8, ManualClock>, ManualClock) {
        let policy = Policy::builder()
            .limit(self.limit as u32)
            .window(Duration::from_nanos(self.window))
            .buckets(self.n as u32)
            .precision(self.precision)
            .build()
            .expect("valid policy");
        let clock = ManualClock::new();
        let limiter = Limiter::builder(policy)
            .clock(clock.clone())
            .max_keys(max_keys)
            .build()
            .expect("valid limiter");
        (limiter, clock)
    }

    fn slot(&self, t: u64) -> u64 {
        t / self.width
    }

    /// The newest offset of a unit admitted at `t` in its slot (interpolated
    /// mode weighs whole slots: their ends).
    fn offset(&self, t: u64) -> u16 {
        match self.precision {
            Precision::Strict => {
                offset_of(t % self.width, self.width, offset_multiplier(self.width))
            }
            _ => u16::MAX,
        }
    }

    /// When the units of slot `x`, the newest at `offset`, have all left the
    /// window of N buckets.
    fn leaves(&self, x: u64, offset: u16) -> u64 {
        (x + self.n) * self.width + newest_into(offset, self.width)
    }
}

/// An exact sliding log for one key.
struct SlidingLog {
    window: u64,
    limit: u64,
    log: VecDeque<(u64, u64)>,
    used: u64,
}

impl SlidingLog {
    fn new(g: &Geometry) -> SlidingLog {
        SlidingLog {
            window: g.window,
            limit: g.limit,
            log: VecDeque::new(),
            used: 0,
        }
    }

    fn check(&mut self, t: u64, cost: u64) -> bool {
        while let Some(&(u, c)) = self.log.front() {
            if u + self.window > t {
                break;
            }
            self.log.pop_front();
            self.used -= c;
        }
        if self.used + cost > self.limit {
            return false;
        }
        self.log.push_back((t, cost));
        self.used += cost;
        true
    }
}

/// The ring's rule for one key, stated naively over a map of slot -> units
/// and the newest offset of their admissions.
struct SpanModel {
    g: Geometry,
    slots: BTreeMap<u64, (u64, u16)>,
}

/// What the model expects of one check.
#[derive(Debug, PartialEq, Eq)]
struct Expected {
    outcome: Outcome,
    remaining: u64,
    retry_after: Option<u64>,
    reset: u64,
}

impl SpanModel {
    fn new(g: Geometry) -> SpanModel {
        SpanModel {
            g,
            slots: BTreeMap::new(),
        }
    }

    fn units(&self, slots: std::ops::RangeInclusive<u64>) -> u64 {
        self.slots.range(slots).map(|(_, (c, _))| c).sum()
    }

    /// The window's usage at `t` in units of 1/width (exact integers): strict counts
    /// slots `s-N ..= s`, `s-N` only until its newest admission has left the window;
    /// interpolated weighs slot `s-N` by `(width - elapsed) / width`.
    fn weighted(&self, t: u64, extra: u64) -> u128 {
        let (n, w) = (self.g.n, self.g.width);
        let s = self.g.slot(t);
        let total = (self.units(s.saturating_sub(n)..=s) + extra) as u128 * w as u128;
        match self.g.precision {
            Precision::Strict if s >= n => match self.slots.get(&(s - n)) {
                Some(&(units, newest)) if t >= self.g.leaves(s - n, newest) => {
                    total - units as u128 * w as u128
                }
                _ => total,
            },
            Precision::Strict => total,
            _ => {
                let oldest = if s >= n { self.units(s - n..=s - n) } else { 0 };
                total - oldest as u128 * (t - s * w) as u128
            }
        }
    }

    fn fits(&self, t: u64, cost: u64) -> bool {
        self.weighted(t, cost) <= self.g.limit as u128 * self.g.width as u128
    }

    fn remaining(&self, t: u64) -> u64 {
        let budget = self.g.limit as u128 * self.g.width as u128;
        (budget.saturating_sub(self.weighted(t, 0)) / self.g.width as u128) as u64
    }

    /// Time from `t` until the youngest counted unit leaves the window.
    fn reset(&self, t: u64) -> u64 {
        let n = self.g.n;
        let s = self.g.slot(t);
        // A bucket emptied by undos keeps its newest offset, as the ring's does.
        let youngest = self.slots.range(s.saturating_sub(n)..=s).rev();
        match youngest.into_iter().find(|(_, (c, _))| *c > 0) {
            Some((&y, &(_, newest))) => self.g.leaves(y, newest).saturating_sub(t),
            None => 0,
        }
    }

    /// Count `cost > 0` units admitted at `t`.
    fn record(&mut self, t: u64, cost: u64) {
        if cost == 0 {
            return;
        }
        let (units, newest) = self.slots.entry(self.g.slot(t)).or_insert((0, 0));
        *units += cost;
        *newest = (*newest).max(self.g.offset(t));
    }

    /// The earliest time `u > t` at which `cost` fits if nothing else is admitted,
    /// found by brute force over every nanosecond a decision can change at.
    fn next_fit(&self, t: u64, cost: u64) -> u64 {
        let w = self.g.width;
        let s = self.g.slot(t);
        for slot in s..=s + self.g.n + 1 {
            let start = (slot * w).max(t + 1);
            let end = (slot + 1) * w;
            if !self.fits(end - 1, cost) {
                continue; // Within a slot usage only falls, so the slot's last instant decides.
            }
            // Binary search the first instant of the slot where it fits.
            let (mut lo, mut hi) = (start, end - 1);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if self.fits(mid, cost) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            return lo;
        }
        panic!("cost {cost} never fits after {t}");
    }

    fn check(&mut self, t: u64, cost: u64) -> Expected {
        if self.fits(t, cost) {
            // An admission that fits with the oldest bucket counted reports
            // the room left counting it too (a check reads the oldest bucket
            // only when it needs its room).
            let s = self.g.slot(t);
            let counting_oldest = self.units(s.saturating_sub(self.g.n)..=s) + cost;
            self.record(t, cost);
            let remaining = match self.g.precision {
                Precision::Strict if cost > 0 && counting_oldest <= self.g.limit => {
                    self.g.limit - counting_oldest
                }
                _ => self.remaining(t),
            };
            Expected {
                outcome: Outcome::Allowed,
                remaining,
                retry_after: Some(0),
                reset: self.reset(t),
            }
        } else {
            Expected {
                outcome: Outcome::Denied,
                remaining: self.remaining(t),
                retry_after: Some(self.next_fit(t, cost) - t),
                reset: self.reset(t),
            }
        }
    }
}

/// A denial's `retry_after` `r` at `t` is exact: the same cost of `key` fits
/// (by `peek`, which counts nothing) at `t + r` and not 1 ns earlier. Leaves
/// the clock at `t`.
fn retry_after_is_exact(
    limiter: &Limiter<u8, ManualClock>,
    clock: &ManualClock,
    key: u8,
    cost: u32,
    t: u64,
    r: u64,
) -> Result<(), TestCaseError> {
    clock.set(t + r);
    prop_assert!(
        limiter.peek(&key, cost).is_allowed(),
        "not allowed {} ns after {}",
        r,
        t
    );
    if r > 1 {
        clock.set(t + r - 1);
        prop_assert!(
            !limiter.peek(&key, cost).is_allowed(),
            "allowed before {} ns after {}",
            r,
            t
        );
    }
    clock.set(t);
    Ok(())
}

fn observed(d: &Decision) -> Expected {
    Expected {
        outcome: d.outcome(),
        remaining: d.remaining() as u64,
        retry_after: d.retry_after().map(|r| r.as_nanos() as u64),
        reset: d.reset().as_nanos() as u64,
    }
}

/// The most units of `admitted` (instant, units; any order) in any window
/// `(t - len, t]`: the strict guarantee, over the instants the limiter counts
/// its admissions at ([`effective`]).
fn max_in_any_window(admitted: &[(u64, u64)], len: u64) -> u64 {
    admitted
        .iter()
        .map(|&(end, _)| {
            let inside = admitted.iter().filter(|&&(t, _)| t <= end && t + len > end);
            inside.map(|&(_, c)| c).sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// The instant an admission at clock reading `t` counts at: the reading, or
/// the start of the slot it was counted in when the clock read behind the
/// key's newest slot; on the overflow ring, no earlier than the latest sweep.
fn effective(g: &Geometry, limiter: &Limiter<u8, ManualClock>, t: u64, d: &Decision) -> u64 {
    let t = if d.is_overflow() {
        t.max(limiter.swept_at())
    } else {
        t
    };
    t.max(d.recorded_slot() * g.width)
}

/// One arrival: a gap since the previous one (thousandths of a window plus a few
/// nanoseconds), a key, and a cost seed.
#[derive(Debug, Clone)]
struct Arrival {
    gap_permille: u64,
    jitter: u64,
    key: u8,
    cost_seed: u32,
    /// When the previous check was denied, arrive exactly when it said to retry.
    retry: bool,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    let gap = prop_oneof![
        3 => Just(0u64),
        12 => 0..150u64,   // within a bucket or a few
        3 => 150..1500u64, // up to one and a half windows
        1 => 1500..6000u64 // idle for several windows
    ];
    let cost = prop_oneof![3 => Just(0u32), 1 => any::<u32>()];
    (gap, 0..4u64, 0..KEYS, cost, prop::bool::weighted(0.2)).prop_map(
        |(gap_permille, jitter, key, cost_seed, retry)| Arrival {
            gap_permille,
            jitter,
            key,
            cost_seed,
            retry,
        },
    )
}

/// N, L and W (nanoseconds, so bucket widths from 1 ns up and windows that do not
/// divide evenly are both exercised). N up to 20 covers rings kept inline (N <=
/// 15) and boxed.
fn geometry(precision: Precision) -> impl Strategy<Value = Geometry> {
    (prop_oneof![1..=8u32, 16..=20u32], 1..=12u32, 1..=2_000u64).prop_map(
        move |(n, limit, per_bucket)| {
            let window = n as u64 * per_bucket - (per_bucket - 1).min(n as u64 / 2);
            Geometry::new(n, limit, window, precision)
        },
    )
}

/// Run `trace` through the limiter and the models; check every decision against
/// the span model and return, per key, the admitted (time, cost) and the recorded
/// slots.
struct Run {
    admitted: Vec<Vec<(u64, u64)>>,
    recorded: Vec<BTreeMap<u64, u64>>,
}

fn run(g: Geometry, trace: &[Arrival]) -> Result<Run, TestCaseError> {
    let (limiter, clock) = g.limiter();
    let mut models: Vec<SpanModel> = (0..KEYS).map(|_| SpanModel::new(g)).collect();
    let mut run = Run {
        admitted: vec![Vec::new(); KEYS as usize],
        recorded: vec![BTreeMap::new(); KEYS as usize],
    };
    let mut t = 0u64;
    let mut last_denial: Option<(u8, u64)> = None;
    for a in trace {
        t = match (a.retry, last_denial) {
            (true, Some((_, at))) => at,
            _ => t + g.window * a.gap_permille / 1000 + a.jitter,
        };
        let key = match (a.retry, last_denial) {
            (true, Some((key, _))) => key,
            _ => a.key,
        };
        let cost = 1 + (a.cost_seed as u64 % g.limit);
        clock.set(t);
        let d = limiter.check_n(&key, cost as u32);
        let model = &mut models[key as usize];
        let expected = model.check(t, cost);
        prop_assert_eq!(
            observed(&d),
            expected,
            "check at {} of {} for key {}",
            t,
            cost,
            key
        );
        last_denial = None;
        if d.is_allowed() {
            prop_assert_eq!(d.recorded_slot(), g.slot(t));
            prop_assert_eq!(d.cost() as u64, cost);
            run.admitted[key as usize].push((t, cost));
            *run.recorded[key as usize]
                .entry(d.recorded_slot())
                .or_default() += cost;
        } else {
            let r = d.retry_after().unwrap().as_nanos() as u64;
            // Exact: at `t + r` the same cost fits, one nanosecond earlier it does not.
            retry_after_is_exact(&limiter, &clock, key, cost as u32, t, r)?;
            last_denial = Some((key, t + r));
        }
    }
    Ok(run)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// (a) + (c): strict mode never holds more than L units in any interval of
    /// length W, in time and in recorded slots, and every decision's fields match
    /// the model: outcome, remaining, reset, and a retry_after that is exact.
    #[test]
    fn strict_never_admits_more_than_limit_in_any_window(
        g in geometry(Precision::Strict),
        trace in prop::collection::vec(arrival(), 1..300),
    ) {
        let run = run(g, &trace)?;
        for key in 0..KEYS as usize {
            let worst = max_in_any_window(&run.admitted[key], g.window);
            prop_assert!(worst <= g.limit, "{} units in one window", worst);
        }
    }

    /// (c) for interpolated mode: decisions match the weighted model exactly,
    /// retry_after included; (d) no window holds more than L plus the count of
    /// the bucket it starts in, so never 2L.
    #[test]
    fn interpolated_matches_its_model_and_stays_under_twice_the_limit(
        g in geometry(Precision::Interpolated),
        trace in prop::collection::vec(arrival(), 1..300),
    ) {
        let run = run(g, &trace)?;
        for key in 0..KEYS as usize {
            let admitted = &run.admitted[key];
            let recorded = &run.recorded[key];
            let mut end = 0;
            let mut sum = 0;
            for (i, &(t, _)) in admitted.iter().enumerate() {
                while end < admitted.len() && admitted[end].0 < t + g.window {
                    sum += admitted[end].1;
                    end += 1;
                }
                let first_bucket = recorded.get(&g.slot(t)).copied().unwrap_or(0);
                prop_assert!(sum <= g.limit + first_bucket, "{} in [{}, +W)", sum, t);
                prop_assert!(sum < 2 * g.limit, "{} in [{}, +W)", sum, t);
                sum -= admitted[i].1;
            }
        }
    }
}

/// A saturating trace: arrivals from 0 to `slots * width` with gaps of at most
/// `width / (L + 1)`, so every bucket sees more than L arrivals.
fn saturating() -> impl Strategy<Value = (Geometry, Vec<u64>)> {
    (1..=8u32, 1..=10u32, 0..=1u64, 0..4u64).prop_flat_map(|(n, limit, uneven, scale)| {
        let min_width = limit as u64 + 1;
        let width = min_width << scale;
        // A window that N divides, or (uneven) one just over N - 1 buckets.
        let window = n as u64 * width - uneven * (width - 1).min(n as u64 - 1);
        let g = Geometry::new(n, limit, window, Precision::Strict);
        let slots = 20 * (n as u64 + 1);
        let max_gap = g.width / (limit as u64 + 1);
        let gaps =
            prop::collection::vec(1..=max_gap, (slots * g.width) as usize / max_gap as usize);
        (Just(g), gaps).prop_map(move |(g, gaps)| {
            let end = slots * g.width;
            let mut t = 0;
            let mut times = vec![0];
            for gap in gaps.into_iter().cycle() {
                t += gap;
                if t >= end {
                    break;
                }
                times.push(t);
            }
            (g, times)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// (b) At saturation the ring admits at least W / ((N+1)·width) of what the
    /// exact log admits (N/(N+1) when N divides W), less an additive L:
    ///
    /// Every bucket sees more than L arrivals, so in each slot x the ring fills up
    /// to exactly L units in slots x-N ..= x; its admissions repeat with period
    /// N + 1 and over S = T / width slots total L·ceil(S/(N+1)) ≥ L·T/((N+1)·width).
    /// The exact log never holds more than L in a window, so over [0, T) it admits
    /// at most L·ceil(T/W) ≤ L·T/W + L. Multiplying the latter by W/((N+1)·width)
    /// ≤ N/(N+1) < 1 leaves an edge term under L: the log's last, partial window.
    #[test]
    fn strict_admits_at_least_n_over_n_plus_one_of_the_exact_log_at_saturation(
        (g, times) in saturating(),
    ) {
        let (limiter, clock) = g.limiter();
        let mut log = SlidingLog::new(&g);
        let (mut ring_units, mut log_units) = (0u64, 0u64);
        let mut admitted = Vec::new();
        for &t in &times {
            clock.set(t);
            let d = limiter.check(&0);
            if d.is_allowed() {
                ring_units += 1;
                admitted.push((t, 1));
            }
            log_units += log.check(t, 1) as u64;
        }
        prop_assert!(max_in_any_window(&admitted, g.window) <= g.limit);
        // (ring + L) · (N+1) · width ≥ log · W
        let lhs = (ring_units + g.limit) as u128 * (g.n + 1) as u128 * g.width as u128;
        let rhs = log_units as u128 * g.window as u128;
        prop_assert!(
            lhs >= rhs,
            "ring {} vs exact log {} (N = {}, L = {}, W = {}, width = {})",
            ring_units, log_units, g.n, g.limit, g.window, g.width
        );
        // At least what a bucket counted until its whole slot has left admits
        // (exactly L per N + 1 slots): with its newest offset it frees sooner.
        let slots = times.last().unwrap() / g.width + 1;
        prop_assert!(ring_units >= g.limit * slots.div_ceil(g.n + 1));
    }
}

/// The true worst case of interpolated mode: the oldest bucket's units bunched at
/// its very end are weighted as if spread over it, so an interval of length W can
/// hold L plus nearly all of that bucket: 2L - 1.
#[test]
fn interpolated_can_admit_nearly_twice_the_limit_when_the_oldest_bucket_is_bunched() {
    let g = Geometry::new(10, 100, 1_000_000, Precision::Interpolated); // 100 µs buckets
    let (limiter, clock) = g.limiter();
    let last_of_slot_0 = g.width - 1;
    clock.set(last_of_slot_0);
    assert!(limiter.check_n(&0, 100).is_allowed());
    // At the last instant of slot N, slot 0 weighs 1/width of its 100 units.
    let last_of_slot_n = (g.n + 1) * g.width - 1;
    clock.set(last_of_slot_n);
    let mut admitted = 0;
    while limiter.check(&0).is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 99);
    // Both bursts lie within [width - 1, width - 1 + W]: 199 units, not 100.
    assert_eq!(last_of_slot_n - last_of_slot_0, g.window);
}

/// (d) How far interpolated mode overshoots on Poisson traffic: for windows starting
/// at every admission, the share over L, the mean excess and the worst; and what
/// each mode admits against the exact log. Printed for the README and the
/// `Precision::Interpolated` docs (`--nocapture` to see them); asserted against the
/// proven bounds only (strict: never over; interpolated: under 2L).
#[test]
fn excess_over_the_limit_and_utilisation_on_poisson_traffic() {
    for precision in [Precision::Interpolated, Precision::Strict] {
        let g = Geometry::new(15, 100, 1_500_000_000, precision); // 100 ms buckets
        println!("{precision:?}, N = 15, L = 100, Poisson arrivals at a multiple of L per W:");
        for (load, seed) in [
            (0.9, 1u64),
            (1.0, 2),
            (1.5, 3),
            (2.0, 4),
            (4.0, 5),
            (10.0, 6),
        ] {
            let (limiter, clock) = g.limiter();
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
            let mean_gap = g.window as f64 / (g.limit as f64 * load);
            let mut t = 0;
            let mut admitted = Vec::new();
            let mut log = SlidingLog::new(&g);
            let mut log_units = 0;
            while t < 60 * g.window {
                t += rng.exp(mean_gap);
                clock.set(t);
                if limiter.check(&0).is_allowed() {
                    admitted.push(t);
                }
                log_units += log.check(t, 1) as u64;
            }
            let (mut over, mut excess_sum, mut worst) = (0u64, 0u64, 0u64);
            let mut end = 0;
            for (i, &t) in admitted.iter().enumerate() {
                while end < admitted.len() && admitted[end] < t + g.window {
                    end += 1;
                }
                let excess = ((end - i) as u64).saturating_sub(g.limit);
                over += (excess > 0) as u64;
                excess_sum += excess;
                worst = worst.max(excess);
            }
            let windows = admitted.len() as f64;
            println!(
                "  {load:>4}x: {:.2}% of windows over L, mean excess {:.3}% of L, worst +{worst} ({:.0}% of L); admitted {:.1}% of the exact log",
                100.0 * over as f64 / windows,
                100.0 * excess_sum as f64 / windows / g.limit as f64,
                100.0 * worst as f64 / g.limit as f64,
                100.0 * admitted.len() as f64 / log_units as f64,
            );
            match precision {
                Precision::Strict => assert_eq!(worst, 0),
                _ => assert!(worst < g.limit, "worst excess {worst} reaches L"),
            }
        }
    }
}

/// One step of a trace that also evicts, caps the keys and turns the clock back.
#[derive(Debug, Clone)]
enum Step {
    /// Check `cost` (0..=L) for `key` after `gap_permille` thousandths of a window.
    Check {
        gap_permille: u64,
        key: u8,
        cost: u64,
    },
    /// The clock steps back by this many thousandths of a window.
    Back(u64),
    /// A sweep of every idle key, as the limiter runs on its own.
    Evict,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..2_000u64, 0..KEYS + 3, 0..=12u64).prop_map(|(gap_permille, key, cost)| {
            Step::Check { gap_permille, key, cost }
        }),
        1 => (0..3_000u64).prop_map(Step::Back),
        1 => Just(Step::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Strict mode holds per key when keys are evicted and come back, when a cap
    /// of 1-3 keys sends the rest to the shared overflow ring, and when the clock
    /// steps back: no key's units recorded in any N + 1 consecutive slots exceed
    /// L, every denial's retry_after is exact, and every check is counted.
    #[test]
    fn strict_holds_across_evictions_the_key_cap_and_a_clock_stepping_back(
        g in geometry(Precision::Strict),
        max_keys in 1..=3usize,
        trace in prop::collection::vec(step(), 1..300),
    ) {
        let (limiter, clock) = g.limiter_tracking(max_keys);
        let mut admitted: Vec<Vec<(u64, u64)>> = vec![Vec::new(); KEYS as usize + 3];
        let mut t = 10 * g.window;
        let mut checks = 0;
        for s in &trace {
            let (key, cost) = match *s {
                Step::Check { gap_permille, key, cost } => {
                    t += g.window * gap_permille / 1000;
                    (key, cost.min(g.limit) as u32)
                }
                Step::Back(permille) => {
                    t = t.saturating_sub(g.window * permille / 1000);
                    continue;
                }
                Step::Evict => {
                    limiter.evict_idle();
                    continue;
                }
            };
            clock.set(t);
            let d = limiter.check_n(&key, cost);
            checks += 1;
            if d.is_allowed() {
                admitted[key as usize].push((effective(&g, &limiter, t, &d), d.cost() as u64));
                let worst = max_in_any_window(&admitted[key as usize], g.window);
                prop_assert!(worst <= g.limit, "key {}: {} units in one window", key, worst);
            } else {
                prop_assert_eq!(d.outcome(), Outcome::Denied);
                let r = d.retry_after().unwrap().as_nanos() as u64;
                retry_after_is_exact(&limiter, &clock, key, cost, t, r)?;
            }
        }
        let stats = limiter.stats();
        prop_assert_eq!(stats.admitted + stats.rejected, checks);
        clock.set(t + 100 * g.window);
        limiter.evict_idle();
        prop_assert_eq!(limiter.stats().keys_tracked, 0);
    }
}

/// Cases for the edge properties: `default`, or `EDGE_CASES` for a longer hunt.
fn edge_cases(default: u32) -> u32 {
    std::env::var("EDGE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Geometries at the ring's edges: 1, 2 and 15 buckets (rings of 2, 3 and 16,
/// inline), 16-17 (boxed, positions by division), 63-65 (the stack array of a
/// denial and the allocation beyond it) and 127-130; bucket widths from 1 ns;
/// limits from 1 to `u32::MAX`; strict or interpolated.
fn edge_geometry() -> impl Strategy<Value = Geometry> {
    let n = prop_oneof![
        Just(1u32),
        Just(2),
        Just(15),
        16..=17u32,
        63..=65u32,
        127..=130u32
    ];
    let limit = prop_oneof![
        2 => 1..=12u32,
        1 => Just(u32::MAX),
        1 => (u32::MAX - 3)..=u32::MAX,
        1 => (1u32 << 31)..=(1 << 31) + 2,
    ];
    let per_bucket = prop_oneof![Just(1u64), 1..=3u64, 1..=2_000u64];
    let precision = prop_oneof![Just(Precision::Strict), Just(Precision::Interpolated)];
    (n, limit, per_bucket, 0..2u64, precision).prop_map(
        |(n, limit, per_bucket, uneven, precision)| {
            let window = n as u64 * per_bucket - uneven * (per_bucket - 1).min(n as u64 / 2);
            Geometry::new(n, limit, window, precision)
        },
    )
}

/// One step of an edge trace on one key.
#[derive(Debug, Clone)]
enum EdgeStep {
    /// Check (consuming) after `gap` nanoseconds; the cost is picked from `cost`.
    Check { gap: Gap, cost: Cost },
    /// Undo the `back`-th latest decision (allowed or not) after `gap`.
    Undo { gap: Gap, back: usize },
    /// Peek and read usage after `gap`.
    Peek { gap: Gap, cost: Cost },
}

#[derive(Debug, Clone, Copy)]
enum Gap {
    None,
    /// Thousandths of a window, plus a few nanoseconds.
    Permille(u64, u64),
    /// Whole slots, for idle keys: about 2^31 or 2^32 slots, give or take.
    Slots(u64),
}

#[derive(Debug, Clone, Copy)]
enum Cost {
    Zero,
    One,
    Limit,
    LimitMinus(u32),
    Half,
    Any(u32),
    AboveLimit,
}

fn edge_step() -> impl Strategy<Value = EdgeStep> {
    let gap = prop_oneof![
        3 => Just(Gap::None),
        8 => (0..150u64, 0..4u64).prop_map(|(p, j)| Gap::Permille(p, j)),
        3 => (150..1_500u64, 0..4u64).prop_map(|(p, j)| Gap::Permille(p, j)),
        1 => prop_oneof![
            (1u64 << 30) - 2..=(1 << 30) + 2,
            (1u64 << 31) - 2..=(1 << 31) + 2,
            (1u64 << 32) - 2..=(1 << 32) + 2,
            (1u64 << 32) - 140..=(1 << 32) + 140,
        ]
        .prop_map(Gap::Slots),
    ];
    let cost = prop_oneof![
        2 => Just(Cost::Zero),
        4 => Just(Cost::One),
        2 => Just(Cost::Limit),
        2 => (1..4u32).prop_map(Cost::LimitMinus),
        2 => Just(Cost::Half),
        3 => any::<u32>().prop_map(Cost::Any),
        1 => Just(Cost::AboveLimit),
    ];
    prop_oneof![
        6 => (gap.clone(), cost.clone()).prop_map(|(gap, cost)| EdgeStep::Check { gap, cost }),
        1 => (gap.clone(), 0..4usize).prop_map(|(gap, back)| EdgeStep::Undo { gap, back }),
        1 => (gap, cost).prop_map(|(gap, cost)| EdgeStep::Peek { gap, cost }),
    ]
}

impl Geometry {
    fn advance(&self, t: u64, gap: Gap) -> u64 {
        self.try_advance(t, gap).expect("within the clock's range")
    }

    /// `t` after `gap`, or `None` past the last instant the limiter takes as
    /// is (2^60 widths, or N + 2 widths before the end of the u64 range).
    fn try_advance(&self, t: u64, gap: Gap) -> Option<u64> {
        let (t, w) = (t as u128, self.width as u128);
        let next = match gap {
            Gap::None => t,
            Gap::Permille(p, j) => t + self.window as u128 * p as u128 / 1000 + j as u128,
            Gap::Slots(s) => t + s as u128 * w,
        };
        (next <= self.last_instant() as u128).then_some(next as u64)
    }

    fn last_instant(&self) -> u64 {
        let w = self.width as u128;
        (((1u128 << 60) - 1) * w).min(u64::MAX as u128 - (self.n as u128 + 2) * w) as u64
    }

    fn cost(&self, cost: Cost) -> u64 {
        let l = self.limit;
        match cost {
            Cost::Zero => 0,
            Cost::One => 1,
            Cost::Limit => l,
            Cost::LimitMinus(k) => l.saturating_sub(k as u64),
            Cost::Half => l / 2 + 1,
            Cost::Any(x) => x as u64 % (l + 1),
            Cost::AboveLimit => {
                if l == u32::MAX as u64 {
                    l
                } else {
                    l + 1
                }
            }
        }
    }
}

impl SpanModel {
    /// What a check of `cost` (0 ..= L) expects at `t`, counting it when it fits;
    /// a check of cost 0 counts nothing and reports the window as it is.
    fn check_any(&mut self, t: u64, cost: u64) -> Expected {
        self.check(t, cost)
    }

    /// What a peek of `cost` expects at `t`.
    fn peek(&self, t: u64, cost: u64) -> Expected {
        if cost > self.g.limit {
            return Expected {
                outcome: Outcome::CostExceedsLimit,
                remaining: self.remaining(t),
                retry_after: None,
                reset: self.reset(t),
            };
        }
        if self.fits(t, cost) {
            let s = self.g.slot(t);
            let newest = self.slots.get(&s).map_or(0, |&(_, o)| o);
            Expected {
                outcome: Outcome::Allowed,
                remaining: self.remaining(t).saturating_sub(cost),
                retry_after: Some(0),
                reset: if cost > 0 {
                    self.g.leaves(s, newest.max(self.g.offset(t))) - t
                } else {
                    self.reset(t)
                },
            }
        } else {
            Expected {
                outcome: Outcome::Denied,
                remaining: self.remaining(t),
                retry_after: Some(self.next_fit(t, cost) - t),
                reset: self.reset(t),
            }
        }
    }
}

/// Run an edge trace on one key against the span model, decision by decision
/// and field by field, every denial's retry_after checked to the nanosecond.
fn run_edges(g: Geometry, trace: &[EdgeStep]) -> Result<(), TestCaseError> {
    let (limiter, clock) = g.limiter();
    let mut model = SpanModel::new(g);
    let mut t = 0u64;
    let mut decisions: Vec<Decision> = Vec::new();
    // Each admission's instant and units, by its index in `decisions`; `None`
    // once a decision is undone twice (its second undo takes another
    // admission's units, which this no longer follows).
    let mut admitted = Some(BTreeMap::new());
    // The newest slot any consuming check entered: an undo of units older than
    // a window before it finds nothing.
    let mut newest = 0u64;
    for (i, step) in trace.iter().enumerate() {
        match *step {
            EdgeStep::Check { gap, cost } => {
                // A gap past the end of the clock's range is skipped.
                t = g.try_advance(t, gap).unwrap_or(t);
                let cost = g.cost(cost);
                clock.set(t);
                let d = limiter.check_n(&0, cost as u32);
                let expected = if cost > g.limit {
                    model.peek(t, cost)
                } else {
                    newest = g.slot(t);
                    model.check_any(t, cost)
                };
                prop_assert_eq!(
                    observed(&d),
                    expected,
                    "step {}: check at {} of {}",
                    i,
                    t,
                    cost
                );
                if d.is_allowed() {
                    prop_assert_eq!(d.recorded_slot(), g.slot(t));
                    prop_assert_eq!(d.cost() as u64, cost);
                    if let Some(admitted) = admitted.as_mut() {
                        admitted.insert(decisions.len(), (t, cost));
                        if g.precision == Precision::Strict {
                            let units: Vec<(u64, u64)> = admitted.values().copied().collect();
                            prop_assert!(max_in_any_window(&units, g.window) <= g.limit);
                        }
                    }
                } else if d.outcome() == Outcome::Denied {
                    let r = d.retry_after().unwrap().as_nanos() as u64;
                    if t + r > g.last_instant() {
                        // The limiter's time stands still there (documented).
                        return Ok(());
                    }
                    retry_after_is_exact(&limiter, &clock, 0, cost as u32, t, r)?;
                }
                decisions.push(d);
            }
            EdgeStep::Undo { gap, back } => {
                // A gap past the end of the clock's range is skipped.
                t = g.try_advance(t, gap).unwrap_or(t);
                clock.set(t);
                let Some(d) = decisions.iter().rev().nth(back).copied() else {
                    continue;
                };
                limiter.undo(&0, &d);
                if d.is_allowed() && d.cost() > 0 && newest - d.recorded_slot() <= g.n {
                    let (units, _) = model.slots.entry(d.recorded_slot()).or_default();
                    *units = units.saturating_sub(d.cost() as u64);
                    let index = decisions.len() - 1 - back;
                    match admitted.as_mut().and_then(|a| a.remove(&index)) {
                        Some(_) => {}
                        None => admitted = None,
                    }
                }
            }
            EdgeStep::Peek { gap, cost } => {
                // A gap past the end of the clock's range is skipped.
                t = g.try_advance(t, gap).unwrap_or(t);
                let cost = g.cost(cost);
                clock.set(t);
                let d = limiter.peek(&0, cost as u32);
                prop_assert_eq!(
                    observed(&d),
                    model.peek(t, cost),
                    "step {}: peek at {} of {}",
                    i,
                    t,
                    cost
                );
                let u = limiter.usage(&0);
                let e = model.peek(t, 0);
                prop_assert_eq!(
                    (u.remaining as u64, u.reset.as_nanos() as u64),
                    (e.remaining, e.reset),
                    "step {}: usage at {}",
                    i,
                    t
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(edge_cases(256)))]

    /// Every field of every decision matches the span model at the ring's edges
    /// (geometries, limits up to u32::MAX, costs 0 ..= L and above, undo, keys
    /// idle for about 2^30, 2^31 and 2^32 slots), strict and interpolated.
    #[test]
    fn edges_match_the_span_model(
        g in edge_geometry(),
        trace in prop::collection::vec(edge_step(), 1..200),
    ) {
        run_edges(g, &trace)?;
    }
}

/// The span model of one key behind a limiter that tracks one key (so every
/// sweep step sweeps it), on a clock that may step back: a check runs at the
/// key's newest slot when the clock is behind it, as of the slot's first
/// instant, and its times count from the clock's reading.
struct HeldModel {
    span: SpanModel,
    /// The key's ring: its newest slot, or `None` once a sweep dropped it.
    newest: Option<u64>,
    swept_at: u64,
    next_sweep_at: u64,
}

impl HeldModel {
    fn new(g: Geometry) -> HeldModel {
        HeldModel {
            span: SpanModel::new(g),
            newest: None,
            swept_at: 0,
            next_sweep_at: g.width,
        }
    }

    /// The slot a check at `t` runs at, and the instant it is evaluated at.
    fn at(&self, t: u64) -> (u64, u64) {
        let g = &self.span.g;
        let s = match self.newest {
            Some(newest) => g.slot(t).max(newest),
            None => g.slot(t.max(self.swept_at)),
        };
        (s, t.max(s * g.width))
    }

    fn shift(e: Expected, by: u64) -> Expected {
        Expected {
            retry_after: e.retry_after.map(|r| if r > 0 { r + by } else { 0 }),
            reset: if e.reset > 0 { e.reset + by } else { 0 },
            ..e
        }
    }

    fn check(&mut self, t: u64, cost: u64) -> Expected {
        let e = if cost > self.span.g.limit {
            self.peek(t, cost)
        } else {
            let (s, te) = self.at(t);
            self.newest = Some(s);
            HeldModel::shift(self.span.check_any(te, cost), te - t)
        };
        // The limiter's sweep, once per bucket width.
        if t >= self.next_sweep_at {
            self.next_sweep_at = (t / self.span.g.width + 1) * self.span.g.width;
            self.swept_at = self.swept_at.max(t);
            if let Some(newest) = self.newest {
                if self.span.g.slot(t).saturating_sub(newest) > self.span.g.n {
                    self.newest = None;
                }
            }
        }
        e
    }

    fn peek(&self, t: u64, cost: u64) -> Expected {
        let (_, te) = self.at(t);
        HeldModel::shift(self.span.peek(te, cost), te - t)
    }

    fn undo(&mut self, d: &Decision) {
        if let Some(newest) = self.newest {
            if d.is_allowed()
                && d.cost() > 0
                && newest.saturating_sub(d.recorded_slot()) <= self.span.g.n
            {
                // The newest offset stays, as the ring keeps it.
                if let Some((units, _)) = self.span.slots.get_mut(&d.recorded_slot()) {
                    *units = units.saturating_sub(d.cost() as u64);
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum HeldStep {
    Edge(EdgeStep),
    /// The clock steps back by this many thousandths of a window.
    Back(u64),
}

fn held_step() -> impl Strategy<Value = HeldStep> {
    prop_oneof![
        6 => edge_step().prop_map(HeldStep::Edge),
        1 => prop_oneof![0..1_200u64, 900..3_000u64].prop_map(HeldStep::Back),
    ]
}

fn run_held(g: Geometry, trace: &[HeldStep]) -> Result<(), TestCaseError> {
    let (limiter, clock) = g.limiter_tracking(1);
    let mut model = HeldModel::new(g);
    let mut t = 0u64;
    let mut decisions: Vec<Decision> = Vec::new();
    for (i, step) in trace.iter().enumerate() {
        let step = match step {
            HeldStep::Back(permille) => {
                t = t.saturating_sub(g.window * permille / 1000);
                continue;
            }
            HeldStep::Edge(step) => step,
        };
        match *step {
            EdgeStep::Check { gap, cost } => {
                t = g.advance(t, gap);
                let cost = g.cost(cost);
                clock.set(t);
                let d = limiter.check_n(&0, cost as u32);
                let expected = model.check(t, cost);
                prop_assert_eq!(
                    observed(&d),
                    expected,
                    "step {}: check at {} of {}",
                    i,
                    t,
                    cost
                );
                if d.outcome() == Outcome::Denied {
                    // Peeks sweep nothing: the model's state stands.
                    let r = d.retry_after().unwrap().as_nanos() as u64;
                    retry_after_is_exact(&limiter, &clock, 0, cost as u32, t, r)?;
                }
                decisions.push(d);
            }
            EdgeStep::Undo { gap, back } => {
                t = g.advance(t, gap);
                clock.set(t);
                let Some(d) = decisions.iter().rev().nth(back).copied() else {
                    continue;
                };
                limiter.undo(&0, &d);
                model.undo(&d);
            }
            EdgeStep::Peek { gap, cost } => {
                t = g.advance(t, gap);
                let cost = g.cost(cost);
                clock.set(t);
                let d = limiter.peek(&0, cost as u32);
                prop_assert_eq!(
                    observed(&d),
                    model.peek(t, cost),
                    "step {}: peek at {} of {}",
                    i,
                    t,
                    cost
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(edge_cases(256)))]

    /// As `edges_match_the_span_model`, with a clock that steps back, by up to
    /// three windows: a check is held at its key's newest slot.
    #[test]
    fn edges_with_a_clock_stepping_back_match_the_held_model(
        g in edge_geometry(),
        trace in prop::collection::vec(held_step(), 1..200),
    ) {
        run_held(g, &trace)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(edge_cases(256)))]

    /// The key-cap / eviction / clock-back trace at the edge geometries.
    #[test]
    fn edges_across_evictions_the_key_cap_and_a_clock_stepping_back(
        g in edge_geometry(),
        max_keys in 1..=3usize,
        trace in prop::collection::vec((step(), any::<u32>(), 0..3u8), 1..300),
    ) {
        let (limiter, clock) = g.limiter_tracking(max_keys);
        let mut admitted: Vec<Vec<(u64, u64)>> = vec![Vec::new(); KEYS as usize + 3];
        // Each decision, with where its units are in `admitted`.
        let mut decisions: Vec<(u8, Decision, usize)> = Vec::new();
        let mut t = 10 * g.window;
        for (s, seed, kind) in &trace {
            let (key, cost) = match *s {
                Step::Check { gap_permille, key, cost } => {
                    t += g.window * gap_permille / 1000;
                    let cost = match kind {
                        0 => cost.min(g.limit),
                        1 => g.limit,
                        _ => *seed as u64 % (g.limit + 1),
                    };
                    (key, cost as u32)
                }
                Step::Back(permille) => {
                    t = t.saturating_sub(g.window * permille / 1000);
                    continue;
                }
                Step::Evict => {
                    if *kind == 0 {
                        // Each decision once: undoing one twice gives back units
                        // another key holds in the overflow ring (documented).
                        let i = decisions.len().checked_sub(1 + *seed as usize % 3);
                        if let Some((key, d, at)) = i.map(|i| decisions.remove(i)) {
                            clock.set(t);
                            limiter.undo(&key, &d);
                            if d.is_allowed() {
                                // An undone decision no longer holds units.
                                admitted[key as usize][at].1 = 0;
                            }
                        }
                    } else {
                        limiter.evict_idle();
                    }
                    continue;
                }
            };
            clock.set(t);
            let d = limiter.check_n(&key, cost);
            decisions.push((key, d, admitted[key as usize].len()));
            if d.is_allowed() {
                admitted[key as usize].push((effective(&g, &limiter, t, &d), d.cost() as u64));
                if g.precision == Precision::Strict {
                    let worst = max_in_any_window(&admitted[key as usize], g.window);
                    prop_assert!(worst <= g.limit, "key {}: {} units in one window", key, worst);
                }
            } else {
                prop_assert_eq!(d.outcome(), Outcome::Denied);
                let r = d.retry_after().unwrap().as_nanos() as u64;
                retry_after_is_exact(&limiter, &clock, key, cost, t, r)?;
            }
        }
        clock.set(t + 100 * g.window);
        limiter.evict_idle();
        prop_assert_eq!(limiter.stats().keys_tracked, 0);
    }
}

/// Windows up to `Policy::MAX_WINDOW` and up to `Policy::MAX_BUCKETS` buckets.
fn huge_geometry() -> impl Strategy<Value = Geometry> {
    let n = prop_oneof![
        Just(1u32),
        Just(2),
        Just(3),
        Just(15),
        Just(16),
        Just(4095),
        Just(4096)
    ];
    let window = prop_oneof![
        Just(1u64 << 62),
        (1u64 << 61)..=(1 << 62),
        (1u64 << 40)..=(1 << 41),
        4096..=10_000u64,
    ];
    let limit = prop_oneof![1..=5u32, Just(u32::MAX)];
    (n, window, limit, any::<bool>()).prop_map(|(n, window, limit, interpolated)| {
        let precision = if interpolated {
            Precision::Interpolated
        } else {
            Precision::Strict
        };
        Geometry::new(n, limit, window, precision)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(edge_cases(32)))]

    /// The span model at the largest windows and bucket counts a policy takes.
    #[test]
    fn huge_geometries_match_the_span_model(
        g in huge_geometry(),
        trace in prop::collection::vec(edge_step(), 1..60),
    ) {
        run_edges(g, &trace)?;
    }
}

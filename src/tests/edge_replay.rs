//! Request traces replayed through the sliding-window rule (`crate::rule`)
//! and an exact sliding log, at nanosecond resolution with sub-millisecond
//! jitter, each at 8 clock phases: what strict mode admits of what the exact
//! log admits, with a bucket's newest-admission offset and without (a bucket
//! counted until its whole slot has left the window, the rule before
//! offsets), for 7, 10, 15, 16 and 20 buckets, for a client that retries a
//! denied request when it fits and for one that drops it.
//! Every replay also checks that no window holds more than the limit, and
//! that a denial's wait is when the cost fits. `#[ignore]`d: `cargo test --release
//! --lib edge_replay -- --ignored --nocapture` prints the table.

use super::Rng;
use crate::rule::{Bucket, Rule};

const LIMIT: u64 = 100;
const WINDOW: u64 = 60_000_000_000;
/// Clock phases, and windows of Poisson traffic: the measurement's in a
/// release build; a debug build (`--include-ignored` in CI) replays a
/// shorter run, which checks the same invariants.
const PHASES: u64 = if cfg!(debug_assertions) { 1 } else { 8 };
const POISSON_WINDOWS: u64 = if cfg!(debug_assertions) { 4 } else { 40 };

/// A request: its instant (ns) and cost.
type Trace = Vec<(u64, u64)>;

/// Sub-millisecond jitter.
fn jitter(rng: &mut Rng) -> u64 {
    rng.below(1_000_000)
}

/// `LIMIT` units in a burst, then again one window later, `rounds` times.
fn edge_bursts(rng: &mut Rng, rounds: u64) -> Trace {
    let mut t = 1_000_000_000 + rng.below(WINDOW);
    let mut out = Vec::new();
    for _ in 0..rounds {
        for _ in 0..LIMIT {
            out.push((t + jitter(rng), 1));
        }
        t += WINDOW;
    }
    out
}

/// `LIMIT` units at one instant, then again a window and 0.1 ms later,
/// `rounds` times.
fn instant_bursts(rng: &mut Rng, rounds: u64) -> Trace {
    let mut t = 1_000_000_000 + rng.below(WINDOW);
    let mut out = Vec::new();
    for _ in 0..rounds {
        out.extend((0..LIMIT).map(|_| (t, 1)));
        t += WINDOW + 100_000;
    }
    out
}

/// Bursts of `size` at random gaps of `min_gap ..` a few windows.
fn bursts(rng: &mut Rng, size: u64, min_gap: u64, count: u64) -> Trace {
    let mut t = 1_000_000_000;
    let mut out = Vec::new();
    for _ in 0..count {
        for _ in 0..size {
            out.push((t + jitter(rng), 1));
        }
        t += min_gap + rng.below(2 * WINDOW);
    }
    out
}

/// Poisson arrivals at `times` the limit's rate, costs 1 or `1..=max_cost`.
fn poisson(rng: &mut Rng, times: f64, max_cost: u64, windows: u64) -> Trace {
    let mean = WINDOW as f64 / (LIMIT as f64 * times) * (1 + max_cost) as f64 / 2.0;
    let mut t = 1_000_000_000;
    let mut out = Vec::new();
    while t < windows * WINDOW {
        t += rng.exp(mean).max(1);
        out.push((t, 1 + rng.below(max_cost)));
    }
    out
}

/// Busy stretches of twice the rate between idle gaps.
fn idle_gaps(rng: &mut Rng) -> Trace {
    let mut out = Vec::new();
    let mut t = 1_000_000_000;
    for _ in 0..6 {
        let end = t + WINDOW / 2 + rng.below(WINDOW);
        while t < end {
            t += rng.exp(WINDOW as f64 / (2.0 * LIMIT as f64)).max(1);
            out.push((t, 1));
        }
        t += WINDOW / 4 + rng.below(3 * WINDOW);
    }
    out
}

fn traces() -> Vec<(&'static str, Trace)> {
    let mut rng = Rng(0x5eed_ed9e);
    vec![
        ("bursts at a window's edge", edge_bursts(&mut rng, 8)),
        ("instant bursts a window apart", instant_bursts(&mut rng, 8)),
        (
            "bursts a window apart, half",
            bursts(&mut rng, LIMIT / 2, WINDOW, 12),
        ),
        ("bursts after gaps", bursts(&mut rng, LIMIT, WINDOW / 3, 12)),
        ("poisson 0.5x", poisson(&mut rng, 0.5, 1, POISSON_WINDOWS)),
        ("poisson 1x", poisson(&mut rng, 1.0, 1, POISSON_WINDOWS)),
        ("poisson 2x", poisson(&mut rng, 2.0, 1, POISSON_WINDOWS)),
        ("poisson 5x", poisson(&mut rng, 5.0, 1, POISSON_WINDOWS)),
        (
            "weighted costs 2x",
            poisson(&mut rng, 2.0, 5, POISSON_WINDOWS),
        ),
        ("idle gaps", idle_gaps(&mut rng)),
    ]
}

/// A limiter under replay: whether `cost` fits at `now` (and, if it does
/// not, when it will), and the admission's record.
trait Replayed {
    /// `Ok(())` admitted (and recorded), `Err(at)` fits from `at` on.
    fn offer(&mut self, now: u64, cost: u64) -> Result<(), u64>;
}

/// An exact sliding log.
#[derive(Default)]
struct ExactLog(Vec<(u64, u64)>);

impl Replayed for ExactLog {
    fn offer(&mut self, now: u64, cost: u64) -> Result<(), u64> {
        self.0.retain(|&(at, _)| at + WINDOW > now);
        let mut used: u64 = self.0.iter().map(|&(_, c)| c).sum();
        if used + cost <= LIMIT {
            self.0.push((now, cost));
            return Ok(());
        }
        // Entries leave in admission order.
        for &(at, c) in &self.0 {
            used -= c;
            if used + cost <= LIMIT {
                return Err(at + WINDOW);
            }
        }
        unreachable!("an empty window fits any cost up to the limit")
    }
}

/// The rule, with newest offsets or without, and a log of what it admitted
/// to check every window against the limit.
struct Strict {
    rule: Rule,
    buckets: Vec<Bucket>,
    log: ExactLog,
}

impl Strict {
    fn new(buckets: u64, offsets: bool) -> Strict {
        Strict {
            rule: Rule {
                buckets,
                width: WINDOW.div_ceil(buckets),
                limit: LIMIT,
                whole_slots: !offsets,
            },
            buckets: Vec::new(),
            log: ExactLog::default(),
        }
    }
}

impl Replayed for Strict {
    fn offer(&mut self, now: u64, cost: u64) -> Result<(), u64> {
        let v = self.rule.check(&self.buckets, now, cost);
        if !v.allowed {
            let at = now + v.retry_after.expect("costs stay below the limit");
            assert!(self.rule.check(&self.buckets, at, cost).allowed);
            return Err(at);
        }
        self.rule.record(&mut self.buckets, now, cost);
        // The exact log of what was admitted takes it too: no window over L.
        assert!(
            self.log.offer(now, cost).is_ok(),
            "a window over the limit at {now}"
        );
        Ok(())
    }
}

/// What a client does with a denial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// Gives the request up.
    Drops,
    /// Sends it again when the limiter says it fits (its `Retry-After`, or
    /// the layer's wait); a request still waiting when the trace's last
    /// request arrives is not counted.
    Retries,
}

/// Units `limiter` admits of `trace` shifted by `phase`.
fn replay(limiter: &mut impl Replayed, trace: &Trace, phase: u64, client: Client) -> u64 {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let horizon = trace.iter().map(|&(t, _)| t).max().unwrap_or(0) + phase + WINDOW;
    // (instant, arrival order, cost): retries keep their arrival order
    // among requests due at the same instant.
    let mut due: BinaryHeap<Reverse<(u64, usize, u64)>> = trace
        .iter()
        .enumerate()
        .map(|(i, &(t, cost))| Reverse((t + phase, i, cost)))
        .collect();
    let mut admitted = 0;
    while let Some(Reverse((t, i, cost))) = due.pop() {
        match limiter.offer(t, cost) {
            Ok(()) => admitted += cost,
            Err(at) if client == Client::Retries && at <= horizon => {
                due.push(Reverse((at, i, cost)));
            }
            Err(_) => {}
        }
    }
    admitted
}

#[test]
#[ignore = "a measurement (seconds in a release build): run with --ignored --nocapture"]
fn strict_with_offsets_against_an_exact_log() {
    let traces = traces();
    println!("| client | buckets | offsets | worst trace | mean | worst trace's name |");
    println!("|---|---:|---|---:|---:|---|");
    for client in [Client::Retries, Client::Drops] {
        for buckets in [7, 10, 15, 16, 20] {
            for offsets in [true, false] {
                let mut worst = (f64::MAX, "");
                let mut sum = 0.0;
                let mut runs = 0.0;
                for (name, trace) in &traces {
                    for phase in 0..PHASES {
                        let phase = phase * WINDOW / buckets / PHASES;
                        let exact = replay(&mut ExactLog::default(), trace, phase, client);
                        let ours = replay(&mut Strict::new(buckets, offsets), trace, phase, client);
                        let ratio = ours as f64 / exact as f64;

                        if ratio < worst.0 {
                            worst = (ratio, name);
                        }
                        sum += ratio;
                        runs += 1.0;
                    }
                }
                println!(
                    "| {client:?} | {buckets} | {} | {:.3} | {:.3} | {} |",
                    if offsets { "newest offset" } else { "none" },
                    worst.0,
                    sum / runs,
                    worst.1
                );
            }
        }
    }
}

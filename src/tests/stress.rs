//! Threads hammering two keys while a driver steps a `ManualClock`: every
//! admission is recorded with the slot it was counted in and the clock's
//! readings around it, and no window may ever hold more than the limit for a
//! key. While one key idles, the
//! other key's checks sweep the limiter, so keys are dropped and tracked again under
//! the workers. Bounded by check counts, not time.

use super::Rng;
use crate::clock::Clock;
use crate::{Limiter, ManualClock, Policy};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

const THREADS: usize = 3;
const KEYS: u64 = 2;
const CHECKS_PER_THREAD: usize = 20_000;
const LIMIT: u64 = 8;
const BUCKETS: u64 = 4;
const WIDTH: u64 = 1_000; // ns
/// The driver moves the clock once per this many checks (all threads together).
const CHECKS_PER_STEP: usize = 3;

/// Raises `flag` if the thread holding it panics, so that threads spinning on
/// its progress fail instead of waiting for it forever.
struct PanicAlarm<'a>(&'a AtomicBool);

impl Drop for PanicAlarm<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, SeqCst);
        }
    }
}

/// Yield until `ready()`; panic if another thread raised `alarm`.
fn spin_until(alarm: &AtomicBool, ready: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        assert!(!alarm.load(SeqCst), "another thread panicked");
        spins = spins.wrapping_add(1);
        if spins % 64 == 0 {
            thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// One check as a worker saw it.
#[derive(Debug, Clone, Copy)]
struct Record {
    key: u8,
    slot: u64,
    /// The clock's readings before and after: the check's instant lies
    /// between them (or, behind its slot, at the slot's start).
    lo: u64,
    hi: u64,
    cost: u64,
    allowed: bool,
    /// Denied, yet a peek right after, at the same slot, showed room for the cost.
    room_after: bool,
    /// Not a check: units charged past the limit (`Limiter::charge`).
    charged: bool,
}

/// The next clock step: mostly within a bucket, sometimes across one or several,
/// rarely past a whole window (the ring goes idle and is reset, or dropped by a
/// sweep and replaced, under the workers).
fn step(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=74 => rng.below(WIDTH / 4),
        75..=94 => WIDTH + rng.below(WIDTH),
        95..=98 => 2 * WIDTH + rng.below(BUCKETS * WIDTH),
        _ => (BUCKETS + 1) * WIDTH + rng.below(3 * BUCKETS * WIDTH),
    }
}

/// `LIMIT` units per `BUCKETS` buckets of `width` ns.
fn policy(width: u64) -> Policy {
    Policy::builder()
        .limit(LIMIT as u32)
        .window(Duration::from_nanos(BUCKETS * width))
        .buckets(BUCKETS as u32)
        .build()
        .unwrap()
}

/// Run the threads; `cost` picks each check's cost from a per-thread generator.
fn hammer(seed: u64, cost: fn(&mut Rng) -> u64) -> (Vec<Record>, Limiter<u8, ManualClock>) {
    // One partition: every sweep step visits both keys.
    hammer_keys(seed, cost, KEYS, 4, false)
}

/// [`hammer`] on `keys` keys, drawn evenly, with room for `max_keys`.
fn hammer_keys(
    seed: u64,
    cost: fn(&mut Rng) -> u64,
    keys: u64,
    max_keys: usize,
    charges: bool,
) -> (Vec<Record>, Limiter<u8, ManualClock>) {
    let clock = ManualClock::new();
    let limiter = Arc::new(
        Limiter::builder(policy(WIDTH))
            .clock(clock.clone())
            .max_keys(max_keys)
            .build::<u8>()
            .unwrap(),
    );
    // `done` counts finished checks, `steps` clock steps. Workers run only while
    // done < (steps + 1) * CHECKS_PER_STEP, so time and checks advance together.
    let done = Arc::new(AtomicUsize::new(0));
    let steps = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let alarm = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let (limiter, done, start) = (limiter.clone(), done.clone(), start.clone());
            let (steps, alarm, clock) = (steps.clone(), alarm.clone(), clock.clone());
            thread::spawn(move || {
                let _alarm = PanicAlarm(&alarm);
                let mut rng = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let mut records = Vec::with_capacity(CHECKS_PER_THREAD);
                start.wait();
                for _ in 0..CHECKS_PER_THREAD {
                    spin_until(&alarm, || {
                        done.load(SeqCst) < (steps.load(SeqCst) + 1) * CHECKS_PER_STEP
                    });
                    let c = cost(&mut rng);
                    // Of two keys, mostly key 0, so that key 1 often idles
                    // for a window; of more, any.
                    let key = if keys == KEYS {
                        (rng.below(8 * KEYS) / (8 * KEYS - 1)) as u8
                    } else {
                        rng.below(keys) as u8
                    };
                    let lo = clock.now_nanos();
                    // One operation in eight a charge, when asked for.
                    if charges && rng.below(8) == 0 {
                        if let Some(d) = limiter.charge(&key, c as u32) {
                            records.push(Record {
                                key,
                                slot: d.recorded_slot(),
                                lo,
                                hi: clock.now_nanos(),
                                cost: u64::from(d.cost()),
                                allowed: false,
                                room_after: false,
                                charged: true,
                            });
                        }
                        done.fetch_add(1, SeqCst);
                        continue;
                    }
                    let d = limiter.check_n(&key, c as u32);
                    let hi = clock.now_nanos();
                    let room_after = !d.is_allowed() && {
                        let p = limiter.peek(&key, c as u32);
                        p.is_allowed() && p.recorded_slot() == d.recorded_slot()
                    };
                    records.push(Record {
                        key,
                        slot: d.recorded_slot(),
                        lo,
                        hi,
                        cost: c,
                        allowed: d.is_allowed(),
                        room_after,
                        charged: false,
                    });
                    done.fetch_add(1, SeqCst);
                }
                records
            })
        })
        .collect();
    let driver = {
        let (clock, done, start) = (clock.clone(), done.clone(), start.clone());
        let (steps, alarm) = (steps.clone(), alarm.clone());
        thread::spawn(move || {
            let _alarm = PanicAlarm(&alarm);
            let mut rng = Rng(seed);
            let total = THREADS * CHECKS_PER_THREAD;
            start.wait();
            for k in 1.. {
                spin_until(&alarm, || {
                    done.load(SeqCst) >= (k * CHECKS_PER_STEP).min(total)
                });
                if k * CHECKS_PER_STEP >= total {
                    break;
                }
                clock.advance(Duration::from_nanos(step(&mut rng)));
                steps.store(k, SeqCst);
            }
        })
    };
    let records = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    driver.join().unwrap();
    let limiter = Arc::try_unwrap(limiter).unwrap();
    (records, limiter)
}

/// Units per slot of the records that pass `filter`.
fn per_slot(records: &[Record], filter: impl Fn(&Record) -> bool) -> BTreeMap<u64, u64> {
    let mut slots = BTreeMap::new();
    for r in records.iter().filter(|r| filter(r)) {
        *slots.entry(r.slot).or_insert(0) += r.cost;
    }
    slots
}

fn span(slots: &BTreeMap<u64, u64>, x: u64) -> u64 {
    slots
        .range(x.saturating_sub(BUCKETS)..=x)
        .map(|(_, c)| c)
        .sum()
}

/// No window of any of keys `0..keys` holds more than the limit, as far as
/// the clock's readings around each check tell: the units whose instants lie
/// certainly within one window (the earliest the first can be, to the latest
/// the others can be, less than a window) are at most the limit. A check's
/// instant lies between the readings around it, or at the start of its slot
/// when that is later (the clock behind the key's newest slot).
fn assert_no_window_over_limit(records: &[Record], width: u64, keys: u64) {
    let window = BUCKETS * width;
    for key in 0..keys as u8 {
        let mut admitted: Vec<(u64, u64, u64)> = records
            .iter()
            .filter(|r| r.allowed && r.key == key)
            .map(|r| {
                let start = r.slot * width;
                (r.lo.max(start), r.hi.max(start), r.cost)
            })
            .collect();
        admitted.sort_unstable();
        for (i, &(from, _, _)) in admitted.iter().enumerate() {
            let units: u64 = admitted[i..]
                .iter()
                .take_while(|&&(lo, _, _)| lo < from + window)
                .filter(|&&(_, hi, _)| hi < from + window)
                .map(|&(_, _, cost)| cost)
                .sum();
            assert!(
                units <= LIMIT,
                "{units} units admitted for key {key} within one window from {from}"
            );
        }
    }
}

#[test]
fn racing_checks_on_two_keys_never_admit_more_than_limit_in_any_span() {
    let (records, limiter) = hammer(0x5eed, |_| 1);
    assert_no_window_over_limit(&records, WIDTH, KEYS);

    let allowed = records.iter().filter(|r| r.allowed).count() as u64;
    let denied = records.len() as u64 - allowed;
    let stats = limiter.stats();
    assert_eq!((stats.admitted, stats.rejected), (allowed, denied));
    assert!(allowed > 0);
    // The clock's jumps past a window let sweeps drop the key's ring under
    // the workers, who then start new ones: the spans above cross rings.
    assert!(stats.keys_evicted > 0, "{stats:?}");

    // Spurious denials, two ways. (1) Denied while room remained: a peek right
    // after, at the same slot, had room. Admitted units never leave a slot's span
    // while time stays in that slot, so the denial's sum must have included
    // tentative units of racing checks that were then taken back: racing checks
    // both denied. A lower bound (a later check may take the room first).
    // (2) Capacity lost: a denial at slot x while slot x's span ended with room to
    // spare; with cost 1 that is min(denied, L - final span) per slot.
    let denied_with_room = records.iter().filter(|r| r.room_after).count();
    let lost: u64 = (0..KEYS as u8)
        .map(|key| {
            let admitted = per_slot(&records, |r| r.allowed && r.key == key);
            let denials = per_slot(&records, |r| !r.allowed && r.key == key);
            denials
                .iter()
                .map(|(&x, &d)| d.min(LIMIT.saturating_sub(span(&admitted, x))))
                .sum::<u64>()
        })
        .sum();
    println!(
        "stress: {THREADS} threads x {CHECKS_PER_THREAD} checks on {KEYS} keys, L = {LIMIT}, N = {BUCKETS}: \
         {allowed} admitted, {denied} denied, {} rings dropped; denied while room remained: {denied_with_room} \
         ({:.3}% of denials, {:.3}% of checks); capacity lost at slot granularity: {lost} units",
        stats.keys_evicted,
        100.0 * denied_with_room as f64 / denied.max(1) as f64,
        100.0 * denied_with_room as f64 / records.len() as f64,
    );
}

#[test]
fn racing_checks_and_charges_never_admit_past_the_limit_and_lose_no_charge() {
    let (records, limiter) = hammer_keys(0xc4a7, |rng| 1 + rng.below(3), KEYS, 4, true);
    // Charges only ever deny more: admissions stay within the limit.
    assert_no_window_over_limit(&records, WIDTH, KEYS);
    assert!(records.iter().any(|r| r.charged) && records.iter().any(|r| r.allowed));
    // Every unit admitted or charged, and none other, is in the rings: the
    // final window holds exactly what the records put there.
    for key in 0..KEYS as u8 {
        let held = per_slot(&records, |r| (r.allowed || r.charged) && r.key == key);
        // The oldest bucket of the span counts until its newest admission
        // has left the window: the room is between the two.
        let now = limiter.peek(&key, 0);
        let s = now.recorded_slot();
        let at_most = LIMIT.saturating_sub(span(&held, s) - held.get(&(s - BUCKETS)).unwrap_or(&0));
        let at_least = LIMIT.saturating_sub(span(&held, s));
        let remaining = u64::from(now.remaining());
        assert!(
            (at_least..=at_most).contains(&remaining),
            "key {key}: {remaining}"
        );
    }
}

#[test]
fn racing_checks_of_mixed_cost_never_admit_more_than_limit_in_any_span() {
    let (records, _) = hammer(0xc057, |rng| 1 + rng.below(3));
    assert_no_window_over_limit(&records, WIDTH, KEYS);
    assert!(records.iter().any(|r| r.allowed));
}

#[test]
fn racing_checks_at_the_key_cap_never_admit_more_than_limit_in_any_span() {
    // Six keys with room for two: most checks meet the cap, are decided by
    // the overflow ring, and move into rings of their own as others idle.
    let (records, limiter) = hammer_keys(0xca9, |rng| 1 + rng.below(3), 6, 2, false);
    assert_no_window_over_limit(&records, WIDTH, 6);
    let stats = limiter.stats();
    assert!(stats.overflowed > 0 && stats.keys_evicted > 0, "{stats:?}");
}

/// Two threads race for the last unit, round after round: both finish a round,
/// wait for each other, and check again at once. Exactly one must pass. Two
/// passing would break the limit (asserted never to happen); neither passing is
/// the protocol's price under contention (both added, both saw the other's
/// unit, both took theirs back): counted and printed.
fn race_for_the_last_unit(name: &str, same_key_next_window: bool) {
    const ROUNDS: u64 = 20_000;
    let width = Duration::from_millis(100);
    let clock = ManualClock::new();
    let limiter: Limiter<u64, ManualClock> =
        Limiter::builder(Policy::per(1, width * BUCKETS as u32).unwrap())
            .clock(clock.clone())
            .max_keys(2 * ROUNDS as usize)
            .build()
            .unwrap();
    let passed: Vec<AtomicUsize> = (0..ROUNDS).map(|_| AtomicUsize::new(0)).collect();
    let (done, ready) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let alarm = AtomicBool::new(false);
    let wait_for =
        |counter: &AtomicUsize, value: usize| spin_until(&alarm, || counter.load(SeqCst) >= value);
    thread::scope(|s| {
        for t in 0..2 {
            let (clock, limiter, passed) = (&clock, &limiter, &passed);
            let (done, ready, wait_for, alarm) = (&done, &ready, &wait_for, &alarm);
            s.spawn(move || {
                let _alarm = PanicAlarm(alarm);
                for r in 0..ROUNDS {
                    if t == 0 && same_key_next_window {
                        // One bucket past the last round's window: the key's old
                        // unit has left and both checks race into a new slot.
                        clock.advance(width * (BUCKETS as u32 + 1));
                    }
                    if t == 0 {
                        ready.store(r as usize + 1, SeqCst);
                    }
                    wait_for(ready, r as usize + 1);
                    let key = if same_key_next_window { 0 } else { r };
                    if limiter.check(&key).is_allowed() {
                        passed[r as usize].fetch_add(1, SeqCst);
                    }
                    done.fetch_add(1, SeqCst);
                    wait_for(done, 2 * (r as usize + 1));
                }
            });
        }
    });
    let count = |n| passed.iter().filter(|p| p.load(SeqCst) == n).count();
    let (neither, one, both) = (count(0), count(1), count(2));
    println!(
        "{name}: {ROUNDS} races for the last unit: one passed {one}, neither passed \
         {neither} ({:.3}%), both passed {both}",
        100.0 * neither as f64 / ROUNDS as f64
    );
    assert_eq!(both, 0, "over-admission");
    assert_eq!(one + neither, ROUNDS as usize);
    assert!(one > 0);
}

#[test]
fn two_checks_racing_for_the_last_unit_of_a_new_key() {
    race_for_the_last_unit("new key", false);
}

#[test]
fn two_checks_racing_for_the_last_unit_in_a_new_window() {
    race_for_the_last_unit("same key, new window", true);
}

/// Two threads creating new keys at a cap of one, while a third reads the
/// stats: `keys_tracked` never reads above `max_keys`.
///
/// The workers go on until the reader has read the stats `READS` times, so
/// that they are still running at every one of those reads however the
/// threads are scheduled (a reader that waited for them to finish could be
/// descheduled until they had, and read nothing).
#[test]
fn keys_tracked_never_reads_above_the_cap() {
    const CHECKS: u64 = 100_000;
    const READS: usize = 100_000;
    let limiter: Arc<Limiter<u64, ManualClock>> = Arc::new(
        Limiter::builder(Policy::per(10, Duration::from_secs(1)).unwrap())
            .clock(ManualClock::new())
            .max_keys(1)
            .build()
            .unwrap(),
    );
    assert!(limiter.check(&0).is_allowed());
    let read_enough = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let (limiter, read_enough) = (Arc::clone(&limiter), Arc::clone(&read_enough));
            thread::spawn(move || {
                let mut k = 0;
                while k < CHECKS || !read_enough.load(SeqCst) {
                    let _ = limiter.check(&(1 + t + 2 * k));
                    k += 1;
                }
            })
        })
        .collect();
    let (mut lowest, mut highest) = (usize::MAX, 0);
    for _ in 0..READS {
        let tracked = limiter.stats().keys_tracked;
        (lowest, highest) = (lowest.min(tracked), highest.max(tracked));
    }
    read_enough.store(true, SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    // Key 0 never idles (the clock stands still), so it holds the one place.
    assert_eq!((lowest, highest), (1, 1));
}

#[test]
fn rings_moved_by_table_rebuilds_under_racing_checks_never_over_admit() {
    // Buckets of 1 µs take wide rings, of 20 µs compact ones.
    for width in [WIDTH, 20 * WIDTH] {
        moved_under_racing_checks(width);
    }
}

fn moved_under_racing_checks(width: u64) {
    const WATCHED: u64 = 4;
    // Checks per worker: at least this many, and on until the flood has seen
    // `MIN_REBUILDS` rebuilds (how many a run makes depends on the threads'
    // timing), but never more than 10 times as many.
    const CHECKS: usize = 100_000;
    const MIN_REBUILDS: usize = 60;
    let clock = ManualClock::new();
    // A cap under two partitions' worth: one partition, so every rebuild
    // moves every key.
    let limiter: Limiter<u64, ManualClock> = Limiter::builder(policy(width))
        .clock(clock.clone())
        .max_keys(2 * crate::limiter::KEYS_PER_PARTITION - 1)
        .build()
        .unwrap();
    let _ = limiter.check(&0);
    assert_eq!(limiter.table_addresses().len(), 1);
    let done = AtomicUsize::new(0);
    let seen = AtomicUsize::new(0);
    let finished = AtomicBool::new(false);
    let alarm = AtomicBool::new(false);
    // The two workers, the flood and this thread, which steps the clock.
    let start = Barrier::new(4);
    let (records, rebuilds) = thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (limiter, done, seen, alarm, start) = (&limiter, &done, &seen, &alarm, &start);
                let clock = &clock;
                s.spawn(move || {
                    let _alarm = PanicAlarm(alarm);
                    let mut rng = Rng(0x7ab1e ^ (t + 1));
                    start.wait();
                    (0..10 * CHECKS)
                        .take_while(|&n| n < CHECKS || seen.load(SeqCst) < MIN_REBUILDS)
                        .map(|_| {
                            let key = rng.below(WATCHED);
                            let lo = clock.now_nanos();
                            let d = limiter.check(&key);
                            let hi = clock.now_nanos();
                            done.fetch_add(1, SeqCst);
                            Record {
                                key: key as u8,
                                slot: d.recorded_slot(),
                                lo,
                                hi,
                                cost: 1,
                                allowed: d.is_allowed(),
                                room_after: false,
                                charged: false,
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let flood = {
            let (limiter, finished, seen, alarm, start) =
                (&limiter, &finished, &seen, &alarm, &start);
            s.spawn(move || {
                let _alarm = PanicAlarm(alarm);
                // Rebuilds seen: the table's address changed since the last
                // look (a lower bound: a new table may reuse an old address).
                let (mut rebuilds, mut last) = (0, limiter.table_addresses());
                let mut look = |rebuilds: &mut usize| {
                    let now = limiter.table_addresses();
                    *rebuilds += usize::from(now != last);
                    seen.store(*rebuilds, SeqCst);
                    last = now;
                };
                let mut key = 1_000u64;
                start.wait();
                while !finished.load(SeqCst) {
                    // Below the cap, so that the watched keys always have
                    // room for rings of their own (at the cap they would
                    // share the overflow ring, which the flood fills).
                    if limiter.stats().keys_tracked < 3_000 {
                        for _ in 0..50 {
                            let _ = limiter.check(&key);
                            key += 1;
                        }
                    }
                    look(&mut rebuilds);
                    limiter.evict_idle();
                    look(&mut rebuilds);
                }
                rebuilds
            })
        };
        // The clock: a step every 40 checks of the watched keys, mostly within
        // a bucket, sometimes past a window (the flood's keys and idle watched
        // keys are then swept). Never backwards: the windows are checked on
        // the readings around each check, which bound its own only then.
        let mut rng = Rng(0xc10c);
        let mut reading = 0;
        start.wait();
        while workers.iter().any(|w| !w.is_finished()) {
            assert!(!alarm.load(SeqCst), "a thread panicked");
            let due = done.load(SeqCst) / 40;
            let next = (due as u64 * WIDTH / 3 + step(&mut rng) / 8) * (width / WIDTH);
            reading = next.max(reading);
            clock.set(reading);
            thread::yield_now();
        }
        let records: Vec<Record> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        finished.store(true, SeqCst);
        (records, flood.join().unwrap())
    });
    assert_no_window_over_limit(&records, width, WATCHED);
    let allowed = records.iter().filter(|r| r.allowed).count();
    let stats = limiter.stats();
    println!(
        "moves under racing checks, buckets of {width} ns: {} checks of {WATCHED} watched \
         keys, {allowed} admitted; at least {rebuilds} moves; {} keys evicted",
        records.len(),
        stats.keys_evicted,
    );
    assert!(allowed > 0);
    assert!(rebuilds >= MIN_REBUILDS, "{rebuilds} rebuilds");
    assert!(stats.keys_evicted > 1_000, "{stats:?}");
}

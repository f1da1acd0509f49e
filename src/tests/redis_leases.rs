//! Leases against a private `redis-server` (on this host, so Redis' `TIME`
//! and `SystemTime` read the same clock): random request streams on three
//! instances, with random changes of policy (window, bucket count, limit)
//! mid-stream on each instance at its own time, as in a rolling deploy.
//! Their merged admissions are checked window by window against the limit,
//! each lease admission checked to fall inside the bucket it was counted in,
//! the lease counters checked to add up once every instance has handed its
//! leftovers back, and, where no policy changed, Redis' counts checked to
//! hold exactly the units admitted. The tests are `#[ignore]`d like the
//! other Redis tests: run them with `--include-ignored`.

use super::redis_support::*;
use crate::redis::Leases;
use crate::{FailurePolicy, Policy, RedisStore, Store};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since 1970 on the system clock, which Redis' `TIME` reads too.
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One instance's stream: per step, a pause, a key (of 2) and a cost, and
/// now and then a change to another policy (an index into the run's three).
#[derive(Debug, Clone)]
struct Step {
    pause_ms: u64,
    key: u8,
    cost: u32,
    change: Option<usize>,
}

fn stream() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![6 => Just(0u64), 3 => 1..=4u64, 1 => 5..=40u64],
        0..2u8,
        prop_oneof![4 => Just(1u32), 1 => 2..=3u32],
        prop_oneof![97 => Just(None), 3 => (0..3usize).prop_map(Some)],
    )
        .prop_map(|(pause_ms, key, cost, change)| Step {
            pause_ms,
            key,
            cost,
            change,
        });
    prop::collection::vec(step, 150..400)
}

/// A policy of the run: `limit` per `buckets` buckets of `width_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    limit: u32,
    buckets: u32,
    width_ms: u64,
}

impl Shape {
    fn policy(&self) -> Policy {
        Policy::builder()
            .limit(self.limit)
            .window(Duration::from_millis(
                self.width_ms * u64::from(self.buckets),
            ))
            .buckets(self.buckets)
            .build()
            .unwrap()
    }

    fn window_us(&self) -> u64 {
        self.width_ms * 1000 * u64::from(self.buckets)
    }
}

fn shape() -> impl Strategy<Value = Shape> {
    (5..=40u32, 2..=6u32, 40..=120u64).prop_map(|(limit, buckets, width_ms)| Shape {
        limit,
        buckets,
        width_ms,
    })
}

/// One admission: its key, slot and cost, the policy it was decided under
/// (for a lease, the one its grant was counted under), whether a lease
/// admitted it, and the wall clock just before and after the check.
#[derive(Debug, Clone, Copy)]
struct Admission {
    key: u8,
    slot: u64,
    cost: u32,
    shape: usize,
    leased: bool,
    before_us: u64,
    after_us: u64,
}

/// What one instance did: its admissions, the policies it changed to (wall
/// clock, index), and every store it used (the last one current).
struct Run {
    admitted: Vec<Admission>,
    changes: Vec<(u64, usize)>,
    used: Vec<RedisStore>,
}

/// Run one instance's stream from `shapes[0]`.
async fn run_stream(mut store: RedisStore, shapes: [Shape; 3], steps: Vec<Step>) -> Run {
    let mut out = Vec::new();
    let mut shape = 0;
    let mut changes = vec![(0, 0)];
    let mut used = Vec::new();
    for step in steps {
        if step.pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(step.pause_ms)).await;
        }
        if let Some(to) = step.change.filter(|&to| to != shape) {
            let next = store.reconfigured(shapes[to].policy()).unwrap();
            used.push(std::mem::replace(&mut store, next));
            shape = to;
            changes.push((wall_us(), to));
        }
        let leased_before = store.stats().lease_decisions;
        let before_us = wall_us();
        let d = store.check_n(&step.key, step.cost).await.unwrap();
        let after_us = wall_us();
        if d.is_allowed() {
            out.push(Admission {
                key: step.key,
                slot: d.recorded_slot(),
                cost: d.cost(),
                shape,
                leased: store.stats().lease_decisions > leased_before,
                before_us,
                after_us,
            });
        }
    }
    used.push(store);
    Run {
        admitted: out,
        changes,
        used,
    }
}

/// The shortest window of the policies any instance used from `from` to
/// `to` (wall clock): a unit admitted at `from` is remembered by the key at
/// least that long, whatever geometries its checks converted it to. A policy
/// is in use until 20 ms after the change from it: a check or a refill of
/// the old store may still be on its way to Redis.
fn shortest_window(changes: &[Vec<(u64, usize)>], shapes: &[Shape; 3], from: u64, to: u64) -> u64 {
    let mut shortest = u64::MAX;
    for timeline in changes {
        for (i, &(at, shape)) in timeline.iter().enumerate() {
            let until = timeline
                .get(i + 1)
                .map_or(u64::MAX, |&(next, _)| next + 20_000);
            if at <= to && until >= from {
                shortest = shortest.min(shapes[shape].window_us());
            }
        }
    }
    shortest
}

/// Units of `admitted` certainly inside the window of `a`'s policy that ends
/// at `a` (their checks ran after the window's start and ended before `a`'s
/// began) and certainly still remembered by the key then (admitted less than
/// the shortest window in use since before), and `a`'s own.
fn certainly_in_window(
    admitted: &[Admission],
    a: &Admission,
    window_us: u64,
    remembered: impl Fn(&Admission) -> u64,
) -> u32 {
    let start = a.after_us.saturating_sub(window_us);
    let others: u32 = admitted
        .iter()
        .filter(|b| b.key == a.key && b.before_us > start && b.after_us <= a.before_us)
        // `a` itself (a lease's check can begin and end in one microsecond).
        .filter(|b| !std::ptr::eq(*b, a))
        .filter(|b| a.after_us - b.before_us < remembered(b))
        .map(|b| b.cost)
        .sum();
    others + a.cost
}

/// Whether every admission that may lie in the window of `a`'s policy ending
/// at `a` was decided under that policy.
fn window_of_one_policy(admitted: &[Admission], a: &Admission, window_us: u64) -> bool {
    let start = a.before_us.saturating_sub(window_us);
    admitted
        .iter()
        .filter(|b| b.key == a.key && b.after_us > start && b.before_us <= a.after_us)
        .all(|b| b.shape == a.shape)
}

async fn three_instances(
    shapes: [Shape; 3],
    share: u32,
    streams: [Vec<Step>; 3],
) -> Result<(), TestCaseError> {
    let test = "three_instances_never_admit_more_than_the_limit_in_any_window";
    let server = RedisServer::start(test).await;
    let policy = shapes[0].policy();
    let prefix = unique_prefix(test);
    let stores: Vec<RedisStore> = (0..3)
        .map(|_| {
            RedisStore::builder(policy.clone(), FailurePolicy::Closed)
                .url(&server.url())
                .timeout(Duration::from_secs(2))
                .prefix(&prefix)
                .leases(Leases::new().with_share(share))
                .build()
                .unwrap()
        })
        .collect();
    for store in &stores {
        store.warm_up().await.unwrap();
    }
    let changes = streams.iter().flatten().any(|s| s.change.is_some());
    let runs: Vec<_> = stores
        .iter()
        .cloned()
        .zip(streams)
        .map(|(store, steps)| tokio::spawn(run_stream(store, shapes, steps)))
        .collect();
    let mut admitted = Vec::new();
    let mut used = Vec::new();
    let mut timelines = Vec::new();
    for run in runs {
        let run = run.await.unwrap();
        admitted.extend(run.admitted);
        used.push(run.used);
        timelines.push(run.changes);
    }

    // Through the changes: a check decided by the script admits only while
    // its own policy's window ending at it holds at most its limit, counting
    // every unit admitted anywhere (from grants of any policy too) that the
    // key still remembers (a unit is remembered for the shortest window in
    // use since it was admitted: `RedisStore::reconfigured` states it); any
    // admission whose window holds admissions of its own policy only, a
    // lease's included, likewise.
    for a in &admitted {
        let shape = shapes[a.shape];
        if a.leased && !window_of_one_policy(&admitted, a, shape.window_us()) {
            continue;
        }
        let remembered =
            |b: &Admission| shortest_window(&timelines, &shapes, b.before_us, a.after_us);
        let held = certainly_in_window(&admitted, a, shape.window_us(), remembered);
        prop_assert!(
            held <= shape.limit,
            "{held} units in the window of {shape:?} ending at {a:?}"
        );
    }
    // Each admission happened inside the slot it was counted in: a lease's
    // before its bucket ended on Redis' clock, Redis' own while it ran.
    for a in &admitted {
        let width_us = shapes[a.shape].width_ms * 1000;
        let (start, end) = (a.slot * width_us, (a.slot + 1) * width_us);
        prop_assert!(
            a.after_us >= start && a.before_us < end,
            "{a:?} outside its slot [{start}, {end}) µs"
        );
    }
    let leased = admitted.iter().filter(|a| a.leased).count();

    // Every unit held is handed back, and the counters say where each went
    // (bounded wait for the hand-backs of grants voided by a change, which
    // run in the background).
    for store in used.iter().flatten() {
        store.shutdown().await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for instance in &used {
        // The stores of one instance share its counters.
        let current = instance.last().unwrap();
        loop {
            let s = current.stats();
            let out = s.lease_units_admitted
                + s.lease_units_handed_back
                + s.lease_units_refused
                + s.lease_units_unreturned;
            if s.lease_units_granted + s.lease_units_undone == out {
                prop_assert_eq!(s.lease_units_unreturned, 0, "{:?}", s);
                if !changes {
                    prop_assert_eq!(s.lease_units_refused, 0, "{:?}", s);
                }
                break;
            }
            prop_assert!(Instant::now() < deadline, "{:?}", s);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let stats: Vec<_> = used.iter().map(|u| u.last().unwrap().stats()).collect();
    let granted: u64 = stats.iter().map(|s| s.lease_units_granted).sum();
    let refused: u64 = stats.iter().map(|s| s.lease_units_refused).sum();
    eprintln!(
        "{shapes:?}, share 1/{share}, changes: {changes}: {} admissions, {leased} from \
         leases, {granted} units granted, {refused} refused",
        admitted.len()
    );
    if changes {
        // Counts moved by conversions: the window checks above stand for
        // the slot by slot ones below.
        return Ok(());
    }

    // Without a change, every span of N + 1 slots, which covers any window,
    // holds at most L units.
    let (limit, buckets) = (shapes[0].limit, shapes[0].buckets);
    for key in 0..2u8 {
        let mine: Vec<Admitted> = admitted
            .iter()
            .filter(|a| a.key == key)
            .map(|a| Admitted {
                slot: a.slot,
                cost: a.cost,
            })
            .collect();
        assert_no_span_over_limit(&mine, buckets, limit, &format!("key {key}"));
    }
    let mut conn = server.conn().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    for key in 0..2u8 {
        let redis_key = stores[0].redis_key(&key);
        let mut per_slot = BTreeMap::<u64, u32>::new();
        for a in admitted.iter().filter(|a| a.key == key) {
            *per_slot.entry(a.slot).or_default() += a.cost;
        }
        loop {
            let counted = PackedKey::read(&mut conn, &redis_key)
                .await
                .map(|k| k.slots)
                .unwrap_or_default();
            let wrong: Vec<_> = counted
                .iter()
                .filter(|&&(slot, c)| per_slot.get(&slot) != Some(&c))
                .collect();
            if wrong.is_empty() {
                break;
            }
            prop_assert!(
                Instant::now() < deadline,
                "key {key}: Redis counts {wrong:?}, admitted {per_slot:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    #[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
    fn three_instances_never_admit_more_than_the_limit_in_any_window(
        shapes in [shape(), shape(), shape()],
        share in 1..=4u32,
        rolling in any::<bool>(),
        a in stream(),
        b in stream(),
        c in stream(),
    ) {
        // Half the runs keep one policy throughout.
        let mut streams = [a, b, c];
        if !rolling {
            streams.iter_mut().flatten().for_each(|s| s.change = None);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(three_instances(shapes, share, streams))?;
    }
}

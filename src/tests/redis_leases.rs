//! Leases against a private `redis-server` (on this host, so Redis' `TIME`
//! and `SystemTime` read the same clock): random request streams on three
//! instances, whose merged admissions are checked window by window against
//! the limit, each lease admission checked to fall inside the bucket it was
//! counted in, and Redis' counts checked to hold exactly the units admitted
//! once every instance has handed its leftovers back. The tests are
//! `#[ignore]`d like the other Redis tests: run them with `--include-ignored`.

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

/// One instance's stream: per step, a pause, a key (of 2) and a cost.
#[derive(Debug, Clone)]
struct Step {
    pause_ms: u64,
    key: u8,
    cost: u32,
}

fn stream() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![6 => Just(0u64), 3 => 1..=4u64, 1 => 5..=40u64],
        0..2u8,
        prop_oneof![4 => Just(1u32), 1 => 2..=3u32],
    )
        .prop_map(|(pause_ms, key, cost)| Step {
            pause_ms,
            key,
            cost,
        });
    prop::collection::vec(step, 150..400)
}

/// One admission: its key, slot and cost, whether a lease admitted it, and
/// the wall clock just before and after the check.
#[derive(Debug, Clone, Copy)]
struct Admission {
    key: u8,
    slot: u64,
    cost: u32,
    leased: bool,
    before_us: u64,
    after_us: u64,
}

/// Run one instance's stream; its admissions.
async fn run_stream(store: RedisStore, steps: Vec<Step>) -> Vec<Admission> {
    let mut out = Vec::new();
    for step in steps {
        if step.pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(step.pause_ms)).await;
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
                leased: store.stats().lease_decisions > leased_before,
                before_us,
                after_us,
            });
        }
    }
    out
}

async fn three_instances(
    limit: u32,
    buckets: u32,
    width_ms: u64,
    share: u32,
    streams: [Vec<Step>; 3],
) -> Result<(), TestCaseError> {
    let test = "three_instances_never_admit_more_than_the_limit_in_any_window";
    let server = RedisServer::start(test).await;
    let policy = Policy::builder()
        .limit(limit)
        .window(Duration::from_millis(width_ms * u64::from(buckets)))
        .buckets(buckets)
        .build()
        .unwrap();
    let width_us = width_ms * 1000;
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
    let runs: Vec<_> = stores
        .iter()
        .cloned()
        .zip(streams)
        .map(|(store, steps)| tokio::spawn(run_stream(store, steps)))
        .collect();
    let mut admitted = Vec::new();
    for run in runs {
        admitted.extend(run.await.unwrap());
    }

    // Every span of N + 1 slots, which covers any window, holds at most L units.
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
    // Each admission happened inside the slot it was counted in: a lease's
    // before its bucket ended on Redis' clock, Redis' own while it ran.
    for a in &admitted {
        let (start, end) = (a.slot * width_us, (a.slot + 1) * width_us);
        prop_assert!(
            a.after_us >= start && a.before_us < end,
            "{a:?} outside its slot [{start}, {end}) µs"
        );
    }
    let leased = admitted.iter().filter(|a| a.leased).count();

    // Every unit held is handed back: then Redis counts, slot by slot, exactly
    // the units admitted (bounded wait for hand-backs still on their way).
    for store in &stores {
        store.shutdown().await;
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
    let stats: Vec<_> = stores.iter().map(RedisStore::stats).collect();
    let granted: u64 = stats.iter().map(|s| s.lease_units_granted).sum();
    eprintln!(
        "L {limit}, {buckets} buckets of {width_ms} ms, share 1/{share}: {} admissions, \
         {leased} from leases, {granted} units granted",
        admitted.len()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    #[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
    fn three_instances_never_admit_more_than_the_limit_in_any_window(
        limit in 5..=40u32,
        buckets in 2..=6u32,
        width_ms in 40..=120u64,
        share in 1..=4u32,
        a in stream(),
        b in stream(),
        c in stream(),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(three_instances(limit, buckets, width_ms, share, [a, b, c]))?;
    }
}

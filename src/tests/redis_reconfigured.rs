//! `RedisStore::reconfigured` against a real Redis, at injected Redis times:
//! raised and lowered limits, changes of bucket width converted in the
//! script, the old store's undos, and a model of the guarantee under random
//! sequences of checks and changes. The tests are `#[ignore]`d like those of
//! `redis_script`: run them with `-- --include-ignored` where Redis answers.

use super::redis_script::{policy, store};
use super::redis_support::*;
use crate::{Policy, Store};
use ::redis::AsyncCommands;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Units counted in `key`, whatever their slots.
async fn counted(conn: &mut ::redis::aio::MultiplexedConnection, key: &[u8]) -> u64 {
    PackedKey::units_of(conn, key).await
}

/// No Redis needed: the store connects lazily.
#[tokio::test]
async fn a_reconfigured_store_keeps_the_keys_and_rejects_what_build_rejects() {
    let old = store(
        policy(5, Duration::from_secs(10), 10),
        &unique_prefix("a_reconfigured_store_keeps_the_keys_and_rejects_what_build_rejects"),
    );
    let renamed = Policy::builder()
        .limit(50)
        .window(Duration::from_secs(60))
        .name("paid")
        .build()
        .unwrap();
    let new = Store::<&str>::reconfigured(&old, renamed).unwrap();
    assert_eq!(new.redis_key(&"k"), old.redis_key(&"k"));
    assert_eq!(Store::<&str>::policy(&new).name(), "paid");
    // Buckets of 100 ns: below Redis' microsecond clock.
    let too_fine = policy(5, Duration::from_micros(100), 1_000);
    let err = old.reconfigured(too_fine).unwrap_err();
    assert!(
        matches!(err, crate::ConfigError::BucketBelowClockResolution { .. }),
        "{err:?}"
    );
}

/// The geometry `key` is numbered in: bucket width in µs, and bucket count.
async fn geometry_of(conn: &mut ::redis::aio::MultiplexedConnection, key: &[u8]) -> (u64, u32) {
    let k = PackedKey::read(conn, key).await.expect("the key exists");
    (k.width_us, k.buckets)
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_raised_limit_gives_room_at_once_over_the_same_counts() {
    let test = "a_raised_limit_gives_room_at_once_over_the_same_counts";
    shared_redis(test).await;
    let old = store(policy(3, Duration::from_secs(30), 10), &unique_prefix(test));
    let at = secs(1_000.0);
    for _ in 0..3 {
        assert!(old.check_at(&"k", 1, at).await.unwrap().is_allowed());
    }
    assert!(!old.check_at(&"k", 1, at).await.unwrap().is_allowed());

    let new = old
        .reconfigured(policy(5, Duration::from_secs(30), 10))
        .unwrap();
    assert_eq!(new.redis_key(&"k"), old.redis_key(&"k"));
    assert_eq!(Store::<&str>::policy(&new).limit(), 5);
    let d = new.check_at(&"k", 2, at).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0, "the 3 units before the change count");
    assert!(!new.check_at(&"k", 1, at).await.unwrap().is_allowed());
}

/// On Redis' clock, through the deny cache: the old store's cached denial
/// stays with it, the new store asks Redis.
#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_denial_cached_under_the_old_limit_does_not_outlive_a_raised_one() {
    let test = "a_denial_cached_under_the_old_limit_does_not_outlive_a_raised_one";
    shared_redis(test).await;
    // A window far longer than the test: nothing leaves it meanwhile.
    let old = store(
        policy(2, Duration::from_secs(600), 10),
        &unique_prefix(test),
    );
    assert!(old.check_n(&"k", 2).await.unwrap().is_allowed());
    assert!(!old.check_n(&"k", 1).await.unwrap().is_allowed());
    assert_eq!(old.stats().deny_cache_len, 1);
    let new = old
        .reconfigured(policy(4, Duration::from_secs(600), 10))
        .unwrap();
    assert_eq!(new.stats().deny_cache_len, 0);
    let d = new.check_n(&"k", 2).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert!(!new.check_n(&"k", 1).await.unwrap().is_allowed());
    // One round trip per decision, counted on the shared counters.
    let stats = new.stats();
    assert_eq!(stats.round_trips, 4, "{stats:?}");
    assert_eq!(stats.decisions, 4, "{stats:?}");
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_lowered_limit_denies_until_the_units_already_admitted_leave_the_window() {
    let test = "a_lowered_limit_denies_until_the_units_already_admitted_leave_the_window";
    shared_redis(test).await;
    // 10 buckets of 1 s.
    let old = store(policy(5, Duration::from_secs(10), 10), &unique_prefix(test));
    assert!(old
        .check_at(&"k", 4, secs(1_000.5))
        .await
        .unwrap()
        .is_allowed());
    assert!(old
        .check_at(&"k", 1, secs(1_003.5))
        .await
        .unwrap()
        .is_allowed());
    let new = old
        .reconfigured(policy(2, Duration::from_secs(10), 10))
        .unwrap();
    // The 4 units admitted at 1000.5 s leave 10 s after them, to a step of
    // their 1 s bucket (15.26 µs: at 1010.500015258 s); the one of 1003.5 s
    // still counts.
    let us = Duration::from_micros;
    for t in [us(1_004_000_000), us(1_008_000_000), us(1_010_500_015)] {
        let d = new.check_at(&"k", 1, t).await.unwrap();
        assert!(!d.is_allowed(), "at {t:?}: {d:?}");
    }
    let d = new.check_at(&"k", 1, us(1_010_500_016)).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    // The unit of 1003.5 s leaves at 1013.500015258 s.
    assert!(!new
        .check_at(&"k", 1, us(1_013_500_015))
        .await
        .unwrap()
        .is_allowed());
    assert!(new
        .check_at(&"k", 1, us(1_013_500_016))
        .await
        .unwrap()
        .is_allowed());
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_change_of_bucket_width_keeps_the_counts_moved_later_never_earlier() {
    let test = "a_change_of_bucket_width_keeps_the_counts_moved_later_never_earlier";
    let mut conn = shared_redis(test).await;
    // 10 buckets of 1 s, then 4 buckets of 5 s (a longer window).
    let old = store(policy(4, Duration::from_secs(10), 10), &unique_prefix(test));
    let key = old.redis_key(&"k");
    assert!(old
        .check_at(&"k", 3, secs(1_000.5))
        .await
        .unwrap()
        .is_allowed());
    assert!(old
        .check_at(&"k", 1, secs(1_001.2))
        .await
        .unwrap()
        .is_allowed());
    assert_eq!(geometry_of(&mut conn, &key).await, (1_000_000, 10));

    let longer = old
        .reconfigured(policy(4, Duration::from_secs(20), 4))
        .unwrap();
    let d = longer.check_at(&"k", 1, secs(1_002.0)).await.unwrap();
    assert!(!d.is_allowed(), "the 4 units carried over: {d:?}");
    assert_eq!(geometry_of(&mut conn, &key).await, (5_000_000, 4));
    let converted = PackedKey::read(&mut conn, &key).await.unwrap().converted;
    assert_eq!(converted, Some(200));
    assert_eq!(counted(&mut conn, &key).await, 4);
    // Slots 1000 and 1001 (ending at 1000.999999 s and 1001.999999 s) both
    // went to 5 s slot 200, counted until slot 205 begins at 1025 s: later
    // than their true times plus 20 s, never earlier.
    assert!(!longer
        .check_at(&"k", 1, secs(1_024.999))
        .await
        .unwrap()
        .is_allowed());
    let d = longer.check_at(&"k", 4, secs(1_025.0)).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");

    // Back to a shorter window, 2 buckets of 2 s: the 4 units at 5 s slot 205
    // (last instant 1029.999999 s) go to the 2 s slot holding that instant,
    // 514, ahead of the current one (513 at 1026 s: an instance still on the
    // old policy may admit units of a grant of slot 205 until 1030 s), and
    // count until slot 517 begins.
    let shorter = longer
        .reconfigured(policy(4, Duration::from_secs(4), 2))
        .unwrap();
    assert!(!shorter
        .check_at(&"k", 1, secs(1_026.0))
        .await
        .unwrap()
        .is_allowed());
    let d = shorter.check_at(&"k", 1, secs(1_031.999)).await.unwrap();
    assert!(!d.is_allowed());
    // The exact wait: the units count as admitted at the last instant of
    // slot 516 (a moved bucket's newest admission is its slot's end), and
    // leave 4 s after it, a nanosecond before slot 517 begins.
    assert_eq!(d.retry_after(), Some(Duration::from_nanos(2_000_999_999)));
    assert!(!shorter
        .check_at(&"k", 1, secs(1_033.999))
        .await
        .unwrap()
        .is_allowed());
    assert!(shorter
        .check_at(&"k", 4, secs(1_034.0))
        .await
        .unwrap()
        .is_allowed());

    // Units already out of the new window are dropped with their slots.
    let a = store(policy(3, Duration::from_secs(60), 6), &unique_prefix(test));
    assert!(a
        .check_at(&"k", 3, secs(1_000.0))
        .await
        .unwrap()
        .is_allowed());
    let b = a
        .reconfigured(policy(3, Duration::from_secs(3), 3))
        .unwrap();
    // The 10 s slot 100 ends at 1009.999999 s, out of the 3 s window at 1013 s.
    assert!(b
        .check_at(&"k", 3, secs(1_013.0))
        .await
        .unwrap()
        .is_allowed());
    assert_eq!(counted(&mut conn, &b.redis_key(&"k")).await, 3);
}

/// A longer window of the same bucket width keeps the slots as they are, and
/// the key's expiry grows to the new window even while every check is denied
/// (a denial sets no expiry of its own).
#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn more_buckets_of_the_same_width_keep_the_key_for_the_longer_window() {
    let test = "more_buckets_of_the_same_width_keep_the_key_for_the_longer_window";
    let mut conn = shared_redis(test).await;
    let old = store(policy(2, Duration::from_secs(10), 10), &unique_prefix(test));
    let key = old.redis_key(&"k");
    assert!(old
        .check_at(&"k", 2, secs(1_000.5))
        .await
        .unwrap()
        .is_allowed());
    // Slot 1000's units leave the 10 s window 10 s after them; the key lives
    // until slot 1011 begins: 10.5 s on.
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!((10_000..=10_500).contains(&ttl), "{ttl} ms");
    let longer = old
        .reconfigured(policy(2, Duration::from_secs(20), 20))
        .unwrap();
    assert!(!longer
        .check_at(&"k", 1, secs(1_001.0))
        .await
        .unwrap()
        .is_allowed());
    // Until slot 1021 begins, 20 s after the denial.
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!((19_500..=20_000).contains(&ttl), "{ttl} ms");
    assert_eq!(geometry_of(&mut conn, &key).await, (1_000_000, 20));
    assert_eq!(counted(&mut conn, &key).await, 2);
    // The slots stand, with their newest offsets: the units admitted at
    // 1000.5 s leave 20 s after them (to a step of the bucket, 15.26 µs).
    assert!(!longer
        .check_at(&"k", 1, Duration::from_micros(1_020_500_015))
        .await
        .unwrap()
        .is_allowed());
    assert!(longer
        .check_at(&"k", 2, Duration::from_micros(1_020_500_016))
        .await
        .unwrap()
        .is_allowed());
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn the_old_store_undoes_its_decisions_unless_their_key_changed_width() {
    let test = "the_old_store_undoes_its_decisions_unless_their_key_changed_width";
    let mut conn = shared_redis(test).await;
    let old = store(policy(3, Duration::from_secs(30), 10), &unique_prefix(test));

    // A change of limit: the old store's undo gives its units back to the
    // counts the new store decides over.
    let at = secs(1_000.0);
    let first = old.check_at(&"a", 3, at).await.unwrap();
    assert!(first.is_allowed());
    let new = old
        .reconfigured(policy(4, Duration::from_secs(30), 10))
        .unwrap();
    assert_eq!(new.check_at(&"a", 1, at).await.unwrap().remaining(), 0);
    old.undo_at(&"a", &first, at).await;
    assert_eq!(counted(&mut conn, &old.redis_key(&"a")).await, 1);
    let d = new.check_at(&"a", 3, at).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");

    // A change of width: once the new store has converted the key, the old
    // store's undo gives nothing back (its slot no longer means what it did).
    let wider = old
        .reconfigured(policy(3, Duration::from_secs(30), 3))
        .unwrap();
    let before = old.check_at(&"b", 2, at).await.unwrap();
    assert!(before.is_allowed());
    let after = wider.check_at(&"b", 1, at).await.unwrap();
    assert!(after.is_allowed());
    let key = old.redis_key(&"b");
    assert_eq!(counted(&mut conn, &key).await, 3);
    old.undo_at(&"b", &before, at).await;
    assert_eq!(counted(&mut conn, &key).await, 3, "nothing given back");
    // The old store's own check converts the key back, conservatively; a
    // decision the new store made before that is no longer undone either.
    assert!(!old.check_at(&"b", 1, at).await.unwrap().is_allowed());
    wider.undo_at(&"b", &after, at).await;
    assert_eq!(counted(&mut conn, &key).await, 3);

    // A key not yet converted: the old store's undo still works.
    let c = old.check_at(&"c", 2, at).await.unwrap();
    old.undo_at(&"c", &c, at).await;
    assert_eq!(counted(&mut conn, &old.redis_key(&"c")).await, 0);
    // And the new store's own undos after its conversion do (a later slot).
    let later = secs(1_020.0);
    assert!(wider.check_at(&"c", 1, at).await.unwrap().is_allowed());
    let mine = wider.check_at(&"c", 2, later).await.unwrap();
    wider.undo_at(&"c", &mine, later).await;
    assert_eq!(counted(&mut conn, &wider.redis_key(&"c")).await, 1);
}

/// A key that holds another type of value (a key of an older version of the
/// store, or of another application under the same prefix) is reported as a
/// script error, never overwritten.
#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_key_of_another_type_is_reported_not_overwritten() {
    let test = "a_key_of_another_type_is_reported_not_overwritten";
    let mut conn = shared_redis(test).await;
    let s = store(policy(3, Duration::from_secs(10), 10), &unique_prefix(test));
    let key = s.redis_key(&"k");
    let _: () = conn
        .hset_multiple(&key, &[("t", "1000"), ("1000", "2")])
        .await
        .unwrap();
    let _: () = conn.pexpire(&key, 60_000).await.unwrap();
    let e = s.check_at(&"k", 1, secs(1_000.5)).await.unwrap_err();
    assert!(e.contains("WRONGTYPE"), "{e}");
    let fields: HashMap<String, String> = conn.hgetall(&key).await.unwrap();
    assert_eq!(fields.len(), 2, "{fields:?}");
}

/// One step of a random trace.
#[derive(Debug, Clone)]
enum Op {
    /// Move the clock forward by this many ms.
    Advance(u64),
    /// Check `cost` units of key `key`.
    Check { key: u8, cost: u32 },
    /// Reconfigure to a strict policy (limit, bucket width in ms, buckets).
    Change(u32, u64, u32),
    /// Reconfigure to another limit and bucket count at the same bucket width.
    SameWidth(u32, u32),
}

/// Strict policies of whole-millisecond buckets, at least 2 s wide so that a
/// key's real expiry (a window of Redis' own clock) outlasts a case.
fn geometry() -> impl Strategy<Value = (u32, u64, u32)> {
    (1..=6u32, 2_000..=6_000u64, 1..=4u32)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..=3_000u64).prop_map(Op::Advance),
        1 => (0..=30_000u64).prop_map(Op::Advance),
        5 => (0..2u8, 1..=3u32).prop_map(|(key, cost)| Op::Check { key, cost }),
        1 => geometry().prop_map(|(l, w, n)| Op::Change(l, w, n)),
        1 => geometry().prop_map(|(l, _, n)| Op::SameWidth(l, n)),
    ]
}

/// A unit (or a few) admitted at `at` µs; `forgotten` once a change found it
/// outside the window of the policy it was counted under.
struct Unit {
    at: u64,
    cost: u32,
    forgotten: bool,
}

/// The guarantee of `RedisStore::reconfigured`: each admission at `t` fits
/// the current limit over the current window, counting every unit not
/// forgotten at a change (forgotten: at least one old window older than it).
async fn run_trace(first: (u32, u64, u32), ops: Vec<Op>) -> Result<(), TestCaseError> {
    let test = "random_changes_never_forget_a_remembered_unit";
    let make = |(limit, width_ms, buckets): (u32, u64, u32)| {
        policy(
            limit,
            Duration::from_millis(width_ms * buckets as u64),
            buckets,
        )
    };
    let mut current = make(first);
    let mut width_ms = first.1;
    let mut s = store(current.clone(), &unique_prefix(test));
    let mut now = 1_000_000_000u64; // µs, well away from zero
    let mut units: [Vec<Unit>; 2] = [Vec::new(), Vec::new()];
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance(ms) => now += ms * 1_000,
            Op::Change(..) | Op::SameWidth(..) => {
                let window = current.window().as_micros() as u64;
                for unit in units.iter_mut().flatten() {
                    if unit.at + window <= now {
                        unit.forgotten = true;
                    }
                }
                let (limit, buckets) = match *op {
                    Op::Change(l, w, n) => {
                        width_ms = w;
                        (l, n)
                    }
                    Op::SameWidth(l, n) => (l, n),
                    _ => unreachable!(),
                };
                current = make((limit, width_ms, buckets));
                s = s.reconfigured(current.clone()).unwrap();
            }
            Op::Check { key, cost } => {
                let d = s
                    .check_at(&key, cost, Duration::from_micros(now))
                    .await
                    .map_err(TestCaseError::fail)?;
                if !d.is_allowed() {
                    continue;
                }
                let mine = &mut units[key as usize];
                mine.push(Unit {
                    at: now,
                    cost,
                    forgotten: false,
                });
                let window = current.window().as_micros() as u64;
                let in_window: u32 = mine
                    .iter()
                    .filter(|u| !u.forgotten && u.at + window > now)
                    .map(|u| u.cost)
                    .sum();
                prop_assert!(
                    in_window <= current.limit(),
                    "step {step}: {in_window} units in the window of {current:?} at {now} µs after {ops:?}"
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    #[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
    fn random_changes_never_forget_a_remembered_unit(
        first in geometry(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            shared_redis("random_changes_never_forget_a_remembered_unit").await;
            run_trace(first, ops).await
        })?;
    }
}

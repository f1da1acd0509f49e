//! The Redis store's decision script against the in-memory ring, decision by
//! decision at injected Redis times, and the slots its undos give back to: it
//! reads what the public API does not show (the slot a decision was counted
//! in, a decision at a chosen time, an undo awaited). Runs against a real
//! Redis (`REDIS_URL`, default 127.0.0.1:6379), so the tests are `#[ignore]`d:
//! run them with `-- --include-ignored` where one answers.

use super::redis_support::*;
use crate::rule::{Bucket, Rule};
use crate::{FailurePolicy, Limiter, ManualClock, Policy, Precision, RedisStore, Store};
use ::redis::AsyncCommands;
use std::time::Duration;

/// A strict policy of the default name (shared with `redis_reconfigured`).
pub(super) fn policy(limit: u32, window: Duration, buckets: u32) -> Policy {
    Policy::builder()
        .limit(limit)
        .window(window)
        .buckets(buckets)
        .build()
        .unwrap()
}

/// A store on its own connection to the shared Redis.
pub(super) fn store(policy: Policy, prefix: &str) -> RedisStore {
    RedisStore::builder(policy, FailurePolicy::Closed)
        .url(&redis_url())
        // Generous: these tests check semantics, not latency, on a shared machine.
        .timeout(Duration::from_secs(2))
        .prefix(prefix)
        .build()
        .unwrap()
}

/// `p` in memory, on a manual clock.
fn in_memory(p: Policy) -> (Limiter<u64, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = Limiter::builder(p).clock(clock.clone()).build().unwrap();
    (limiter, clock)
}

/// `p` on both sides of a decision-by-decision comparison: in memory on a
/// manual clock, and in Redis with no deny cache (it would answer locally).
fn compared_sides(p: Policy, test: &str) -> (Limiter<u64, ManualClock>, ManualClock, RedisStore) {
    let (limiter, clock) = in_memory(p.clone());
    let redis = RedisStore::builder(p, FailurePolicy::Closed)
        .url(&redis_url())
        .timeout(Duration::from_secs(2))
        .prefix(unique_prefix(test))
        .deny_cache(0)
        .build()
        .expect("the Redis store accepts every policy the builder does");
    (limiter, clock, redis)
}

/// With `REQUIRE_REDIS=1` (CI) the ignored Redis tests below must be run.
#[test]
fn redis_tests_are_included_where_redis_is_required() {
    assert_included_where_required();
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn undo_gives_units_back_and_clears_the_deny_cache() {
    let test = "undo_gives_units_back_and_clears_the_deny_cache";
    let mut conn = shared_redis(test).await;
    let s = store(policy(2, Duration::from_secs(10), 10), &unique_prefix(test));
    let first = s.check_n(&"k", 2).await.unwrap();
    assert!(first.is_allowed());
    assert!(!s.check_n(&"k", 1).await.unwrap().is_allowed());
    s.undo_now(&"k", &first).await;
    let d = s.check_n(&"k", 2).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    // Undoing a denial or twice is harmless: the count never goes below zero.
    let denied = s.check_n(&"k", 1).await.unwrap();
    s.undo_now(&"k", &denied).await;
    s.undo_now(&"k", &d).await;
    s.undo_now(&"k", &d).await;
    assert_eq!(s.check_n(&"k", 2).await.unwrap().remaining(), 0);
    // The fire-and-forget path (Store::undo) reaches Redis too: on a key of its
    // own, so the slot it gives back to holds the units being undone.
    let fresh = s.check_n(&"fresh", 1).await.unwrap();
    assert!(fresh.is_allowed());
    let (key, slot) = (s.redis_key(&"fresh"), fresh.recorded_slot());
    let counted = PackedKey::read(&mut conn, &key).await.unwrap();
    assert_eq!(counted.at(slot), Some(1));
    let before = s.stats().undos;
    Store::undo(&s, &"fresh", &fresh);
    // Bounded wait until Redis has applied it (the script deletes a key left
    // with no units).
    let mut applied = false;
    for _ in 0..400 {
        if PackedKey::read(&mut conn, &key).await.is_none() {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(applied, "the fire-and-forget undo never reached Redis");
    assert_eq!(s.stats().undos, before + 1);
}

/// Run `trace` through the in-memory limiter (manual clock) and through Redis at
/// the same injected times: the script must decide exactly as the ring does,
/// and in strict mode with time only going forward, both as the rule states
/// it (`crate::rule`): admitted or not, the wait and the reset.
/// What a comparison trace exercises. The two are kept apart because the
/// in-memory limiter, after evicting an idle key, starts its new ring no earlier
/// than the newest time any sweep saw (its keys share one clock), while Redis
/// holds each key at its own newest slot only while the key exists.
#[derive(Clone, Copy, PartialEq)]
enum Trace {
    /// Three keys, gaps of over a window (idle keys, stale buckets), time only forwards.
    KeysAndGaps,
    /// One busy key (never idle) whose clock now and then steps back.
    ClockSteppingBack,
}

async fn compare_with_the_ring(test: &str, precision: Precision, trace: Trace) {
    shared_redis(test).await;
    // 10 buckets of 3 s (whole microseconds, so both sides cut the same slots).
    // The trace runs on injected time, but Redis expires keys on its own clock:
    // a window far longer than the test takes keeps every key alive meanwhile.
    let p = Policy::builder()
        .limit(12)
        .window(Duration::from_secs(30))
        .buckets(10)
        .precision(precision)
        .build()
        .unwrap();
    let (limiter, clock, redis) = compared_sides(p, test);

    let rule = (precision == Precision::Strict && trace == Trace::KeysAndGaps).then_some(Rule {
        buckets: 10,
        width: 3_000_000_000,
        limit: 12,
        whole_slots: false,
    });
    let mut rule_buckets: [Vec<Bucket>; 3] = Default::default();

    let mut rng = Rng::new(0x5eed);
    // Start well away from zero, like Redis' TIME.
    let mut now = Duration::from_secs(1_000);
    let mut allowed = 0;
    for step in 0..1500 {
        match (rng.below(20), trace) {
            (0..=9, _) => {}
            (10..=16, _) => now += Duration::from_micros(rng.below(1_500_000)),
            (17 | 18, _) => now += Duration::from_micros(rng.below(12_000_000)),
            (_, Trace::KeysAndGaps) => now += Duration::from_secs(40),
            (_, Trace::ClockSteppingBack) => now -= Duration::from_micros(rng.below(5_000_000)),
        }
        clock.set(now.as_nanos() as u64);
        let key = match trace {
            Trace::KeysAndGaps => rng.below(3),
            Trace::ClockSteppingBack => 0,
        };
        let cost = 1 + rng.below(5) as u32;
        let mem = limiter.check_n(&key, cost);
        let red = redis.check_at(&key, cost, now).await.unwrap();
        let ctx = format!("step {step} at {now:?}, key {key}, cost {cost}");
        assert_eq!(red.outcome(), mem.outcome(), "{ctx}");
        assert_eq!(red.remaining(), mem.remaining(), "{ctx}");
        assert_eq!(red.reset(), mem.reset(), "{ctx}");
        assert_eq!(red.recorded_slot(), mem.recorded_slot(), "{ctx}");
        let (r, m) = (red.retry_after().unwrap(), mem.retry_after().unwrap());
        match precision {
            Precision::Strict => assert_eq!(r, m, "{ctx}"),
            // The interpolated wait is a fraction of a bucket: µs vs ns rounding.
            _ => assert!(
                r.max(m) - r.min(m) <= Duration::from_micros(1),
                "{ctx}: {r:?} vs {m:?}"
            ),
        }
        let t = now.as_nanos() as u64;
        if let Some(rule) = &rule {
            let buckets = &mut rule_buckets[key as usize];
            let v = rule.check(buckets, t, u64::from(cost));
            assert_eq!(v.allowed, mem.is_allowed(), "{ctx}: the rule");
            assert_eq!(
                Some(v.retry_after.unwrap() as u128),
                Some(r.as_nanos()),
                "{ctx}: the rule"
            );
            assert_eq!(v.reset as u128, red.reset().as_nanos(), "{ctx}: the rule");
            if v.allowed {
                rule.record(buckets, t, u64::from(cost));
            }
        }
        // Give some admissions back on both sides.
        if mem.is_allowed() && rng.below(10) == 0 {
            limiter.undo(&key, &mem);
            redis.undo_at(&key, &red, now).await;
            if let Some(rule) = &rule {
                // The units leave their bucket; its newest instant stays.
                let slot = rule.slot(t);
                let b = rule_buckets[key as usize]
                    .iter_mut()
                    .find(|b| b.slot == slot)
                    .unwrap();
                b.units -= u64::from(cost);
            }
        }
        allowed += mem.is_allowed() as u32;
    }
    assert!(
        allowed > 100 && allowed < 1400,
        "a trace that saturates: {allowed}"
    );
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn script_decides_exactly_as_the_ring_in_strict_mode() {
    compare_with_the_ring(
        "script_decides_exactly_as_the_ring_in_strict_mode",
        Precision::Strict,
        Trace::KeysAndGaps,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn script_holds_a_clock_stepping_back_at_the_newest_slot_as_the_ring_does() {
    compare_with_the_ring(
        "script_holds_a_clock_stepping_back_at_the_newest_slot_as_the_ring_does",
        Precision::Strict,
        Trace::ClockSteppingBack,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn script_decides_as_the_ring_in_interpolated_mode() {
    compare_with_the_ring(
        "script_decides_as_the_ring_in_interpolated_mode",
        Precision::Interpolated,
        Trace::KeysAndGaps,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn same_trace_never_admits_more_than_the_limit_per_window_in_memory_or_in_redis() {
    let test = "same_trace_never_admits_more_than_the_limit_per_window_in_memory_or_in_redis";
    shared_redis(test).await;
    let (limit, buckets) = (8, 4);
    let p = policy(limit, Duration::from_millis(200), buckets);
    let trace = bursty_trace(7, 400, 2, 3, p.bucket_width());

    // In memory, on a manual clock.
    let (limiter, clock) = in_memory(p.clone());
    let mut mem: Vec<Vec<Admitted>> = vec![Vec::new(); 2];
    for step in &trace {
        clock.advance(step.gap);
        let d = Store::check_n(&limiter, &step.key, step.cost)
            .await
            .unwrap();
        if d.is_allowed() {
            mem[step.key as usize].push(Admitted {
                slot: d.recorded_slot(),
                cost: d.cost(),
            });
        }
    }

    // In Redis, on Redis' clock, through two instances (the deny cache on).
    let prefix = unique_prefix(test);
    let stores = [store(p.clone(), &prefix), store(p, &prefix)];
    let mut red: Vec<Vec<Admitted>> = vec![Vec::new(); 2];
    for (i, step) in trace.iter().enumerate() {
        if !step.gap.is_zero() {
            tokio::time::sleep(step.gap).await;
        }
        let d = stores[i % 2].check_n(&step.key, step.cost).await.unwrap();
        if d.is_allowed() {
            red[step.key as usize].push(Admitted {
                slot: d.recorded_slot(),
                cost: d.cost(),
            });
        }
    }

    for key in 0..2 {
        assert_no_span_over_limit(&mem[key], buckets, limit, "in memory");
        assert_no_span_over_limit(&red[key], buckets, limit, "in Redis");
        assert!(!mem[key].is_empty() && !red[key].is_empty());
    }
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_fire_and_forget_undo_leaves_no_denial_in_the_deny_cache() {
    let test = "a_fire_and_forget_undo_leaves_no_denial_in_the_deny_cache";
    let mut conn = shared_redis(test).await;
    let s = store(policy(2, Duration::from_secs(10), 10), &unique_prefix(test));
    let key = s.redis_key(&"k");
    let first = s.check_n(&"k", 2).await.unwrap();
    assert!(first.is_allowed());
    let slot = first.recorded_slot();
    // The layer gives the units back (another policy denied the request, as
    // `Store::undo` does: fire and forget) and the client retries at once: this
    // check may reach Redis before the undo does, and be denied then.
    Store::undo(&s, &"k", &first);
    let raced = s.check_n(&"k", 1).await.unwrap();
    // Bounded wait until the undo has run to its end here: Redis has applied
    // it (the slot no longer holds 2) and its reply has come back, whereupon
    // the store drops a denial of the key cached meanwhile (Redis may apply
    // the undo a moment before this instance hears of it, and until then a
    // cached denial stands: the safe side). `raced`'s denial, if it was
    // cached, is then gone, and none of a check sent before the undo ended
    // may be cached after it: the cache is empty.
    let mut done = false;
    for _ in 0..400 {
        let v = PackedKey::read(&mut conn, &key)
            .await
            .and_then(|k| k.at(slot));
        if v != Some(2) && s.stats().deny_cache_len == 0 {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        done,
        "the undo reached Redis, and its reply left no denial cached: raced {raced:?}, stats {:?}",
        s.stats()
    );
    // The units are back in Redis: at most one unit (`raced`) is counted, so
    // one more fits. This instance's own undo must not leave it denied locally.
    let after = s.check_n(&"k", 1).await.unwrap();
    assert!(
        after.is_allowed(),
        "denied by the deny cache after this instance's own undo: raced {raced:?}, after {after:?}, stats {:?}",
        s.stats()
    );
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn interpolated_script_stays_exact_for_every_policy_the_builder_accepts() {
    let test = "interpolated_script_stays_exact_for_every_policy_the_builder_accepts";
    let mut conn = shared_redis(test).await;
    // (limit + 1) × bucket width in µs is just below 2^53, which the builder
    // accepts; but a check forms (used + cost) × width, and in interpolated mode
    // `used` may exceed `limit` (the oldest bucket is only partly counted).
    let (limit, cost, width_us, elapsed_us) = (1u32 << 20, 123u32, 8_589_926_067u64, 1_007_615u64);
    let p = Policy::builder()
        .limit(limit)
        .window(Duration::from_micros(width_us))
        .buckets(1)
        .precision(Precision::Interpolated)
        .build()
        .unwrap();
    let (limiter, clock, redis) = compared_sides(p, test);
    // The whole limit in one slot, then `cost` units early in the next slot:
    // exactly, (limit + cost) × w − limit × elapsed = limit × w + 1 µs·unit, over.
    let slot = 2u64;
    for (at, cost) in [
        (slot * width_us + 1, limit),
        ((slot + 1) * width_us + elapsed_us, cost),
    ] {
        let now = Duration::from_micros(at);
        clock.set(now.as_nanos() as u64);
        let mem = limiter.check_n(&0, cost);
        let red = redis.check_at(&0u64, cost, now).await.unwrap();
        assert_eq!(
            red.outcome(),
            mem.outcome(),
            "cost {cost} at {now:?}: {red:?} vs {mem:?}"
        );
    }
    let _: () = conn.del(redis.redis_key(&0u64)).await.unwrap();
}

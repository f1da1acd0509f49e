//! Leases (`RedisStoreBuilder::leases`) against private `redis-server`s on
//! ephemeral loopback ports: a grant's leftovers come back when its bucket
//! ends (and its units are no longer admitted), an instance that dies holding
//! a grant costs the fleet exactly its unreturned units, a change of policy
//! voids the old store's grants, and an undo of a leased decision goes back
//! into the grant; one instance holds at most its share of what is left;
//! Redis losing a key refuses the hand-backs of the grants it counted; and
//! the lease counters add up exactly on three instances. The property test
//! over random streams on three instances
//! is in the crate (`src/tests/redis_leases.rs`): it reads the slot each
//! decision was counted in. `#[ignore]`d: run with `-- --include-ignored`.
#![cfg(feature = "redis")]

mod redis_support;

use redis_support::*;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tower_sliding_window::redis::Leases;
use tower_sliding_window::{FailurePolicy, Policy, RedisStore, Store};

/// With `REQUIRE_REDIS=1` (CI) the ignored Redis tests below must be run.
#[test]
fn redis_tests_are_included_where_redis_is_required() {
    assert_included_where_required();
}

/// `limit` per `buckets` buckets of `width`, strict.
fn policy(limit: u32, width: Duration, buckets: u32) -> Policy {
    Policy::builder()
        .limit(limit)
        .window(width * buckets)
        .buckets(buckets)
        .build()
        .unwrap()
}

fn store(url: &str, policy: Policy, prefix: &str, leases: bool) -> RedisStore {
    let builder = RedisStore::builder(policy, FailurePolicy::Closed)
        .url(url)
        .timeout(Duration::from_secs(2))
        .prefix(prefix);
    if leases {
        builder.leases(Leases::new()).build().unwrap()
    } else {
        builder.build().unwrap()
    }
}

/// Wait until the wall clock (Redis' too: same host) is `into` past the start
/// of a bucket of `width`, so that a scenario shorter than the rest of the
/// bucket sees no bucket end.
async fn early_in_a_bucket(width: Duration, into: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let width_ns = width.as_nanos();
    let offset = Duration::from_nanos((now.as_nanos() % width_ns) as u64);
    let wait = if offset <= into {
        into - offset
    } else {
        width - offset + into
    };
    tokio::time::sleep(wait).await;
}

/// `checks` checks of `key`, 2 ms apart: a hot key. The admitted count.
async fn hot(store: &RedisStore, key: &'static str, checks: u32) -> u32 {
    let mut allowed = 0;
    for _ in 0..checks {
        allowed += store.check_n(&key, 1).await.unwrap().is_allowed() as u32;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    allowed
}

/// Units a store holds in grants now: granted beyond the checks' costs (and
/// undone into a grant), less those admitted from leases, handed back,
/// refused or never returned.
fn held(store: &RedisStore) -> u64 {
    let s = store.stats();
    s.lease_units_granted + s.lease_units_undone
        - s.lease_units_admitted
        - s.lease_units_handed_back
        - s.lease_units_refused
        - s.lease_units_unreturned
}

/// Check `key` through `store` (no leases) until denied; the units admitted.
async fn take_the_rest(store: &RedisStore, key: &'static str) -> u32 {
    let mut n = 0;
    while store.check_n(&key, 1).await.unwrap().is_allowed() {
        n += 1;
        assert!(n <= 10_000, "never denied");
    }
    n
}

#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn a_grants_leftovers_come_back_when_its_bucket_ends() {
    let test = "a_grants_leftovers_come_back_when_its_bucket_ends";
    let server = RedisServer::start(test).await;
    let prefix = unique_prefix(test);
    // 2 buckets of 1 s: a window of 2 s.
    let width = Duration::from_secs(1);
    let p = policy(200, width, 2);
    let leased = store(&server.url(), p.clone(), &prefix, true);
    let other = store(&server.url(), p, &prefix, false);
    leased.warm_up().await.unwrap();
    let mut conn = server.conn().await;
    let key = leased.redis_key(&"k");

    early_in_a_bucket(width, Duration::from_millis(50)).await;
    let admitted = hot(&leased, "k", 60).await;
    assert_eq!(admitted, 60);
    // Wait out any refill in flight: then Redis counts what was admitted
    // and what the instance holds.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let holding = held(&leased);
    let stats = leased.stats();
    assert!(stats.lease_decisions > 30, "{stats:?}");
    assert!(holding > 0, "a hot key holds units: {stats:?}");
    assert_eq!(
        PackedKey::units_of(&mut conn, &key).await,
        u64::from(admitted) + holding
    );

    // The bucket ends; the key is quiet: the renewal task hands the rest back
    // (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(3);
    while leased.stats().lease_units_handed_back < holding {
        assert!(Instant::now() < deadline, "{:?}", leased.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(leased.stats().lease_units_handed_back, holding);
    assert_eq!(
        PackedKey::units_of(&mut conn, &key).await,
        u64::from(admitted)
    );
    // The grant expired with its bucket: the next check asks Redis.
    let before = leased.stats();
    assert!(leased.check_n(&"k", 1).await.unwrap().is_allowed());
    let after = leased.stats();
    assert_eq!(after.lease_decisions, before.lease_decisions);
    assert_eq!(after.round_trips, before.round_trips + 1);
    // Another instance finds every unit neither admitted nor held (that check
    // may have asked for a new grant: the key was busy a bucket ago).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rest = u64::from(take_the_rest(&other, "k").await);
    assert_eq!(rest, 200 - u64::from(admitted) - 1 - held(&leased));
}

/// An instance that dies holding a grant: its runtime shut down and its store
/// never dropped (nothing of it runs again, nothing is handed back). The
/// fleet loses exactly the units it held, and only those; an instance that
/// shuts down hands them back.
#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn an_instance_that_dies_mid_grant_loses_only_its_unreturned_units() {
    let test = "an_instance_that_dies_mid_grant_loses_only_its_unreturned_units";
    let server = RedisServer::start(test).await;
    // 2 buckets of 2 s: the scenario, well inside one bucket, sees no end.
    let width = Duration::from_secs(2);
    let p = policy(500, width, 2);
    let mut conn = server.conn().await;
    for dies in [true, false] {
        let prefix = unique_prefix(test);
        let other = store(&server.url(), p.clone(), &prefix, false);
        early_in_a_bucket(width, Duration::from_millis(50)).await;
        let (url, p2, prefix2) = (server.url(), p.clone(), prefix.clone());
        // The instance, on a runtime of its own.
        let (admitted, holding) = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let (admitted, holding, instance) = runtime.block_on(async {
                let s = store(&url, p2, &prefix2, true);
                s.warm_up().await.unwrap();
                let admitted = hot(&s, "k", 100).await;
                // Let refills in flight land.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let holding = held(&s);
                if !dies {
                    s.shutdown().await;
                }
                (admitted, holding, s)
            });
            if dies {
                std::mem::forget(instance);
            } else {
                drop(instance);
            }
            drop(runtime);
            (admitted, holding)
        })
        .join()
        .unwrap();
        assert_eq!(admitted, 100);
        assert!(holding > 0, "the instance held units");
        let counted = PackedKey::units_of(&mut conn, &other.redis_key(&"k")).await;
        let rest = take_the_rest(&other, "k").await;
        eprintln!(
            "dies: {dies}: admitted {admitted}, held {holding}, counted {counted}, rest {rest}"
        );
        if dies {
            assert_eq!(counted, 100 + holding);
            assert_eq!(u64::from(rest), 500 - 100 - holding);
        } else {
            assert_eq!(counted, 100);
            assert_eq!(rest, 400);
        }
    }
}

/// `reconfigured` voids the old store's grants: the units it held go back,
/// it admits from them no more, and the new store decides over the units
/// admitted, under its own limit.
#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn a_change_of_policy_voids_the_outstanding_grants() {
    let test = "a_change_of_policy_voids_the_outstanding_grants";
    let server = RedisServer::start(test).await;
    let width = Duration::from_secs(2);
    let old = store(
        &server.url(),
        policy(500, width, 2),
        &unique_prefix(test),
        true,
    );
    old.warm_up().await.unwrap();
    let mut conn = server.conn().await;
    let key = old.redis_key(&"k");
    early_in_a_bucket(width, Duration::from_millis(50)).await;
    assert_eq!(hot(&old, "k", 50).await, 50);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let holding = held(&old);
    assert!(holding > 0, "{:?}", old.stats());

    // Down to 60 in the window: 10 more than the 50 admitted.
    let new = old.reconfigured(policy(60, width, 2)).unwrap();
    // Bounded wait until the old grant is back.
    let deadline = Instant::now() + Duration::from_secs(3);
    while PackedKey::units_of(&mut conn, &key).await != 50 {
        assert!(Instant::now() < deadline, "{:?}", old.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(old.stats().lease_units_handed_back, holding);
    // The old store no longer admits from a grant: each check is a round trip.
    let before = old.stats();
    assert!(old.check_n(&"k", 1).await.unwrap().is_allowed());
    assert_eq!(old.stats().lease_decisions, before.lease_decisions);
    // The new store: 60 less the 51 admitted, leases or not.
    let mut allowed = 0;
    for _ in 0..30 {
        allowed += new.check_n(&"k", 1).await.unwrap().is_allowed() as u32;
    }
    assert_eq!(allowed, 9);
}

/// An undo of a decision a lease admitted puts its units back into the grant:
/// no round trip; handed back with the rest at shutdown, they are not counted.
#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn an_undo_of_a_leased_decision_goes_back_into_the_grant() {
    let test = "an_undo_of_a_leased_decision_goes_back_into_the_grant";
    let server = RedisServer::start(test).await;
    let width = Duration::from_secs(2);
    let s = store(
        &server.url(),
        policy(500, width, 2),
        &unique_prefix(test),
        true,
    );
    s.warm_up().await.unwrap();
    let mut conn = server.conn().await;
    early_in_a_bucket(width, Duration::from_millis(50)).await;
    assert_eq!(hot(&s, "k", 30).await, 30);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = s.stats();
    let d = s.check_n(&"k", 1).await.unwrap();
    assert!(d.is_allowed());
    let leased = s.stats();
    assert_eq!(
        leased.lease_decisions,
        before.lease_decisions + 1,
        "{leased:?}"
    );
    Store::undo(&s, &"k", &d);
    let after = s.stats();
    assert_eq!(
        (after.undos, after.round_trips),
        (leased.undos, leased.round_trips)
    );
    s.shutdown().await;
    assert_eq!(PackedKey::units_of(&mut conn, &s.redis_key(&"k")).await, 30);
}

/// What one instance holds unused of a key, its grants together, stays at
/// most 1/share of what the window has left: a hot instance's refills do not
/// add up to most of the window, and an instance arriving later finds the
/// rest.
#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn one_hot_instance_holds_at_most_its_share_of_what_the_window_has_left() {
    let test = "one_hot_instance_holds_at_most_its_share_of_what_the_window_has_left";
    let server = RedisServer::start(test).await;
    let prefix = unique_prefix(test);
    // 100 per 8 s in 2 buckets of 4 s: no bucket ends during the scenario.
    let width = Duration::from_secs(4);
    let p = policy(100, width, 2);
    let hot_one = store(&server.url(), p.clone(), &prefix, true);
    let later = store(&server.url(), p, &prefix, true);
    hot_one.warm_up().await.unwrap();
    later.warm_up().await.unwrap();
    early_in_a_bucket(width, Duration::from_millis(20)).await;
    let admitted = hot(&hot_one, "k", 12).await;
    assert_eq!(admitted, 12);
    // Let refills in flight land.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let holding = held(&hot_one);
    let stats = hot_one.stats();
    assert!(stats.lease_grants >= 1, "the hot key was leased: {stats:?}");
    // At most a quarter (the default share) of the 88 left.
    assert!(holding <= (100 - 12) / 4, "holds {holding}: {stats:?}");
    let rest = take_the_rest(&later, "k").await;
    assert_eq!(u64::from(rest), 100 - 12 - holding);
    assert!(rest >= 66, "{rest}");
}

/// Redis loses every key while an instance holds a grant: the fleet then
/// admits at most the limit plus what the instance held unused at the loss,
/// and the grant's leftovers, handed back when its bucket ends, are refused
/// (the key is another incarnation) and reported as such.
#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn a_grant_outstanding_when_redis_loses_the_key_is_refused_when_handed_back() {
    let test = "a_grant_outstanding_when_redis_loses_the_key_is_refused_when_handed_back";
    let server = RedisServer::start(test).await;
    let prefix = unique_prefix(test);
    // 100 per 2 s in 2 buckets of 1 s.
    let width = Duration::from_secs(1);
    let p = policy(100, width, 2);
    let b = store(&server.url(), p.clone(), &prefix, true);
    let a = store(&server.url(), p.clone(), &prefix, false);
    let c = store(&server.url(), p, &prefix, false);
    for s in [&b, &a, &c] {
        s.warm_up().await.unwrap();
    }
    let mut conn = server.conn().await;
    early_in_a_bucket(width, Duration::from_millis(20)).await;
    assert_eq!(hot(&b, "k", 12).await, 12);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let held_at_loss = held(&b);
    assert!(held_at_loss > 0, "{:?}", b.stats());
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();

    // After the loss: A fills the fresh key; B admits from its grant.
    let mut after_loss = u64::from(take_the_rest(&a, "k").await);
    assert_eq!(after_loss, 100);
    let before = b.stats();
    let mut from_grant = 0;
    while b.stats().lease_decisions == before.lease_decisions + from_grant {
        if !b.check_n(&"k", 1).await.unwrap().is_allowed() {
            break;
        }
        from_grant += 1;
        after_loss += 1;
        assert!(from_grant <= held_at_loss);
    }
    assert!(from_grant > 0, "B admitted from its grant after the loss");
    let left = held(&b);

    // The bucket ends: B's renewal hands the rest back; Redis refuses it.
    let deadline = Instant::now() + Duration::from_secs(3);
    while held(&b) > 0 {
        assert!(Instant::now() < deadline, "{:?}", b.stats());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = b.stats();
    assert_eq!(stats.lease_units_refused, left, "{stats:?}");
    assert_eq!(
        stats.lease_units_handed_back,
        before.lease_units_handed_back
    );
    // C finds the fresh key still full (A's units are in the window).
    after_loss += u64::from(take_the_rest(&c, "k").await);
    assert!(
        after_loss <= 100 + held_at_loss,
        "{after_loss} admitted after the loss, {held_at_loss} held"
    );
    b.shutdown().await;
}

/// Every unit a grant held is accounted for, exactly: on three instances
/// with hot keys over two buckets and undos of leased decisions, once each
/// has shut down, units granted (and undone into a grant) equal units
/// admitted from leases plus units handed back; none refused or lost; and
/// Redis counts exactly the units admitted.
#[tokio::test]
#[ignore = "starts redis-server (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn lease_counters_add_up_exactly_on_three_instances() {
    let test = "lease_counters_add_up_exactly_on_three_instances";
    let server = RedisServer::start(test).await;
    let prefix = unique_prefix(test);
    // 1000 per 1.2 s in 3 buckets of 400 ms.
    let width = Duration::from_millis(400);
    let p = policy(1000, width, 3);
    let stores: Vec<RedisStore> = (0..3)
        .map(|_| store(&server.url(), p.clone(), &prefix, true))
        .collect();
    for s in &stores {
        s.warm_up().await.unwrap();
    }
    early_in_a_bucket(width, Duration::from_millis(20)).await;
    let runs: Vec<_> = stores
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, s)| {
            tokio::spawn(async move {
                let mut admitted = 0u64;
                // About 600 ms: into the next bucket, through a renewal.
                for n in 0..200u32 {
                    let key = if n % 4 == 0 {
                        "shared"
                    } else {
                        ["a", "b", "c"][i]
                    };
                    let d = s.check_n(&key, 1).await.unwrap();
                    if d.is_allowed() {
                        admitted += 1;
                        if n % 25 == 0 {
                            Store::undo(&s, &key, &d);
                            admitted -= 1;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for run in runs {
        admitted += run.await.unwrap();
    }
    for s in &stores {
        s.shutdown().await;
    }
    let mut leased = 0;
    for s in &stores {
        let st = s.stats();
        assert!(st.lease_units_admitted > 0, "{st:?}");
        assert_eq!(
            (st.lease_units_refused, st.lease_units_unreturned),
            (0, 0),
            "{st:?}"
        );
        assert_eq!(
            st.lease_units_granted + st.lease_units_undone,
            st.lease_units_admitted + st.lease_units_handed_back,
            "{st:?}"
        );
        leased += st.lease_units_admitted;
    }
    assert!(leased > admitted / 2, "{leased} of {admitted} from leases");
    // Undos that did not go into a grant are fired and forgotten: wait for
    // them (bounded), then Redis counts exactly what was admitted.
    let mut conn = server.conn().await;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let mut counted = 0;
        for key in ["shared", "a", "b", "c"] {
            counted += PackedKey::units_of(&mut conn, &stores[0].redis_key(&key)).await;
        }
        if counted == admitted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Redis counts {counted}, admitted {admitted}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

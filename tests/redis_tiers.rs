//! A layer of tiers whose policies live in Redis (`REDIS_URL`, default
//! 127.0.0.1:6379): two instances of an app share each tier's counts, tiers
//! do not share theirs, and a limit raised on one instance keeps the counts.
//! The tests that need Redis are `#[ignore]`d: run them with
//! `-- --include-ignored` where one answers.
#![cfg(feature = "redis")]

mod redis_support;

use http::{Request, Response};
use redis_support::*;
use std::convert::Infallible;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_sliding_window::extract::TieredKeyFn;
use tower_sliding_window::{
    tiered_key_fn, FailurePolicy, RedisStore, SlidingWindowLayer, Store, TierLimits, Tiers,
};

type ByTier = TieredKeyFn<fn(&Request<()>) -> Option<(String, String)>, String>;

/// Tier from `x-tier`, key from `x-user`.
fn by_tier() -> ByTier {
    fn tier_and_user(req: &Request<()>) -> Option<(String, String)> {
        let header = |name| Some(req.headers().get(name)?.to_str().ok()?.to_owned());
        Some((header("x-tier")?, header("x-user")?))
    }
    tiered_key_fn(tier_and_user as fn(&Request<()>) -> Option<(String, String)>)
}

/// One app instance: its own layer (and connections), the tiers' stores
/// under `prefix`, one key space per tier and policy.
fn instance(tiers: &Tiers, prefix: &str) -> SlidingWindowLayer<ByTier, RedisStore> {
    let prefix = prefix.to_owned();
    SlidingWindowLayer::builder(by_tier())
        .tier_stores(tiers.clone(), move |tier, policy| {
            RedisStore::builder(policy.clone(), FailurePolicy::Closed)
                .url(&redis_url())
                .timeout(Duration::from_secs(2))
                .prefix(format!("{prefix}{tier}:{}:", policy.name()))
                .build()
        })
        .build()
        .unwrap()
}

async fn statuses(
    layer: &SlidingWindowLayer<ByTier, RedisStore>,
    tier: &str,
    user: &str,
    n: usize,
) -> Vec<u16> {
    let svc = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    let mut out = Vec::new();
    for _ in 0..n {
        let req = Request::builder()
            .header("x-tier", tier)
            .header("x-user", user)
            .body(())
            .unwrap();
        out.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
    }
    out
}

fn table(free_limit: u32) -> Tiers {
    Tiers::builder()
        .limited("free", [format!("{free_limit}/min").parse().unwrap()])
        .limited("paid", ["3/min".parse().unwrap()])
        .denied("suspended")
        .build()
        .unwrap()
}

#[test]
fn redis_tests_are_included_where_redis_is_required() {
    assert_included_where_required();
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn instances_share_each_tiers_counts_and_tiers_keep_their_own() {
    let test = "instances_share_each_tiers_counts_and_tiers_keep_their_own";
    shared_redis(test).await;
    let prefix = unique_prefix(test);
    let (a, b) = (instance(&table(2), &prefix), instance(&table(2), &prefix));

    assert_eq!(statuses(&a, "free", "ada", 1).await, [200]);
    assert_eq!(statuses(&b, "free", "ada", 2).await, [200, 429]);
    // The same user in another tier is counted apart, on both instances.
    assert_eq!(statuses(&b, "paid", "ada", 2).await, [200, 200]);
    assert_eq!(statuses(&a, "paid", "ada", 2).await, [200, 429]);
    assert_eq!(statuses(&a, "suspended", "ada", 1).await, [429]);
}

#[tokio::test]
#[ignore = "needs Redis at REDIS_URL (default 127.0.0.1:6379): run with -- --include-ignored"]
async fn a_limit_raised_on_an_instance_keeps_the_fleets_counts() {
    let test = "a_limit_raised_on_an_instance_keeps_the_fleets_counts";
    shared_redis(test).await;
    let prefix = unique_prefix(test);
    let (a, b) = (instance(&table(2), &prefix), instance(&table(2), &prefix));
    assert_eq!(statuses(&a, "free", "ada", 1).await, [200]);
    assert_eq!(statuses(&b, "free", "ada", 2).await, [200, 429]);

    // Raised to 4 on instance a: the 2 admitted by the fleet still count.
    a.set_tier("free", TierLimits::Limited(vec!["4/min".parse().unwrap()]))
        .unwrap();
    assert_eq!(statuses(&a, "free", "ada", 3).await, [200, 200, 429]);
    // Instance b, not yet told, still holds the old limit over the same counts.
    assert_eq!(statuses(&b, "free", "ada", 1).await, [429]);
    let free = a.tier_stores("free").unwrap();
    let store: &RedisStore = free.iter().next().unwrap();
    assert_eq!(Store::<String>::policy(store).limit(), 4);
    assert_eq!(statuses(&a, "paid", "ada", 3).await, [200; 3]);
}

//! `set_tier` against the guarantee of `guide::tiers`, through a real layer of
//! tiers (in-memory stores) on tokio's paused clock, each request's cost read
//! from a header: after a change at `c` from `(L1, W1)` to `(L2, W2)`, every
//! request admitted at `t >= c` fits `L2` over the units admitted since `c` and
//! the units admitted before it that the old policy still remembered (true
//! time `τ > c - W1`), each counted while its true time is within `W2` of `t`.
//! Recursively: a unit forgotten by one change stays forgotten.
//!
//! Limits and costs fall on both sides of 65 535 (the most a compact ring's
//! bucket holds), and changes vary the window and bucket count, so counts move
//! between ring layouts and shapes. `src/tests/reconfigure_model.rs` holds the
//! same oracle for `Limiter::reconfigured`.

mod layer_support;

use http::{Request, StatusCode};
use layer_support::{ok_service, Body};
use proptest::prelude::*;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_sliding_window::{tiered_key_fn, Policy, SlidingWindowLayer, TierLimits, Tiers};

/// Two tiers, each with its own counts and its own changes.
const TIERS: [&str; 2] = ["bulk", "burst"];
const KEYS: u8 = 2;
const MS: u64 = 1_000_000;

/// A strict policy of `limit` per `window_ms`, in `buckets` buckets, with the
/// default name: a tier names it after itself, so a change keeps its counts.
fn policy(limit: u32, window_ms: u64, buckets: u32) -> Policy {
    Policy::builder()
        .limit(limit)
        .window(Duration::from_millis(window_ms))
        .buckets(buckets)
        .build()
        .expect("valid policy")
}

/// Tier from `x-tier`, key from `x-user`.
fn tier_and_user(req: &Request<Body>) -> Option<(String, String)> {
    let header = |name| Some(req.headers().get(name)?.to_str().ok()?.to_owned());
    Some((header("x-tier")?, header("x-user")?))
}

/// What the `x-cost` header says.
fn cost_of(req: &Request<Body>) -> u32 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("every request names its cost")
}

/// One admission's units as the model keeps them.
#[derive(Debug)]
struct Unit {
    key: u8,
    n: u64,
    /// The paused clock's reading when they were admitted (ns).
    at: u64,
    /// Forgotten by a change: admitted at or before `c - W_old`.
    forgotten: bool,
}

/// One tier as the model sees it.
struct Model {
    policy: Policy,
    units: Vec<Unit>,
    /// The tier's latest change.
    changed: u64,
    /// Each key's latest admission.
    admitted: [u64; KEYS as usize],
    /// The latest admission of any key of the tier.
    any_admitted: u64,
}

#[derive(Debug, Clone)]
enum Op {
    /// Move the paused clock on by this many nanoseconds.
    Advance(u64),
    Request {
        tier: usize,
        key: u8,
        cost: u32,
    },
    /// `set_tier(TIERS[tier], Limited(vec![policy(limit, window_ms, buckets)]))`.
    SetTier {
        tier: usize,
        limit: u32,
        window_ms: u64,
        buckets: u32,
    },
}

/// Limits small, around 65 535 and well above it.
fn limit() -> impl Strategy<Value = u32> {
    prop_oneof![1..=20u32, 65_530..=65_540u32, 65_536..=140_000u32]
}

fn shape() -> impl Strategy<Value = (u64, u32)> {
    (100..=2_000u64, 1..=16u32)
}

fn op() -> impl Strategy<Value = Op> {
    let tier = 0..TIERS.len();
    prop_oneof![
        2 => (1..5_000u64).prop_map(Op::Advance),
        3 => (1..400u64).prop_map(|ms| Op::Advance(ms * MS)),
        // Long enough, now and then, for a quiet span.
        1 => (1_000..3_000u64).prop_map(|ms| Op::Advance(ms * MS)),
        6 => (tier.clone(), 0..KEYS, 1..=3u32)
            .prop_map(|(tier, key, cost)| Op::Request { tier, key, cost }),
        // Costs that fill a limit on either side of 65 535, about as often as small ones.
        5 => (tier.clone(), 0..KEYS, 1..=140_000u32)
            .prop_map(|(tier, key, cost)| Op::Request { tier, key, cost }),
        3 => (tier, limit(), shape()).prop_map(|(tier, limit, (window_ms, buckets))| {
            Op::SetTier { tier, limit, window_ms, buckets }
        }),
    ]
}

fn first_policy() -> impl Strategy<Value = Policy> {
    (limit(), shape()).prop_map(|(l, (w, n))| policy(l, w, n))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every admission fits its tier's current limit over the units the
    /// guarantee says are remembered; and once a key saw no admission and
    /// its tier no change for a whole span of the current policy (all of the
    /// tier's keys, where they share the overflow ring at a cap of one key),
    /// a cost within the limit passes.
    #[test]
    fn set_tier_admits_within_the_current_limit_over_every_unit_remembered(
        first in [first_policy(), first_policy()],
        max_keys in prop_oneof![Just(1usize), Just(1_000)],
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let mut table = Tiers::builder();
            for (name, p) in TIERS.iter().zip(&first) {
                table = table.limited(*name, [p.clone()]);
            }
            // Built inside the paused runtime: the limiters read tokio's clock.
            let layer = SlidingWindowLayer::builder(tiered_key_fn(tier_and_user))
                .tiers(table.build().expect("valid table"))
                .max_keys(max_keys)
                .cost(cost_of)
                .build()
                .expect("valid layer");
            let service = layer.layer(ok_service());
            let start = tokio::time::Instant::now();
            let now = || start.elapsed().as_nanos() as u64;
            let mut models: Vec<Model> = first
                .iter()
                .map(|p| Model {
                    policy: p.clone(),
                    units: Vec::new(),
                    changed: 0,
                    admitted: [0; KEYS as usize],
                    any_admitted: 0,
                })
                .collect();
            for op in &ops {
                match *op {
                    Op::Advance(ns) => tokio::time::advance(Duration::from_nanos(ns)).await,
                    Op::SetTier { tier, limit, window_ms, buckets } => {
                        let t = now();
                        let model = &mut models[tier];
                        let old_window = model.policy.window().as_nanos() as u64;
                        for u in &mut model.units {
                            if u.at + old_window <= t {
                                u.forgotten = true;
                            }
                        }
                        model.policy = policy(limit, window_ms, buckets);
                        model.changed = t;
                        layer
                            .set_tier(TIERS[tier], TierLimits::Limited(vec![model.policy.clone()]))
                            .expect("a known tier");
                    }
                    Op::Request { tier, key, cost } => {
                        let t = now();
                        let model = &mut models[tier];
                        let p = &model.policy;
                        let (limit, window) = (u64::from(p.limit()), p.window().as_nanos() as u64);
                        let width = p.bucket_width().as_nanos() as u64;
                        let span = (u64::from(p.buckets()) + 1) * width;
                        let last = if max_keys == 1 {
                            model.any_admitted
                        } else {
                            model.admitted[usize::from(key)]
                        };
                        let quiet = t >= model.changed.max(last) + span;
                        let req = Request::builder()
                            .header("x-tier", TIERS[tier])
                            .header("x-user", key.to_string())
                            .header("x-cost", cost.to_string())
                            .body(Body::new())
                            .expect("a request");
                        let response = service.clone().oneshot(req).await.expect("infallible");
                        let status = response.status();
                        prop_assert_eq!(now(), t, "the clock moved during a request");
                        if status == StatusCode::OK {
                            model.units.push(Unit { key, n: cost.into(), at: t, forgotten: false });
                            model.admitted[usize::from(key)] = t;
                            model.any_admitted = t;
                            let remembered: u64 = model
                                .units
                                .iter()
                                .filter(|u| u.key == key && !u.forgotten && u.at + window > t)
                                .map(|u| u.n)
                                .sum();
                            prop_assert!(
                                remembered <= limit,
                                "{} key {} at {} ns: {} units remembered, limit {}",
                                TIERS[tier], key, t, remembered, limit
                            );
                        } else {
                            prop_assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                            prop_assert!(
                                !(quiet && u64::from(cost) <= limit),
                                "{} key {} at {} ns: cost {} denied after a quiet span, limit {}",
                                TIERS[tier], key, t, cost, limit
                            );
                        }
                    }
                }
            }
            Ok(())
        })?;
    }
}

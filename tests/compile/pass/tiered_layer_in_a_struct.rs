//! A layer of tiers keyed by a closure shared behind an `Arc`, kept in a
//! struct with the handle that changes its table; a boxed closure keys one
//! too. Every type can be named, and the handle names no extractor.
use std::sync::Arc;
use axum::body::Body;
use http::Request;
use tower_sliding_window::extract::{SharedTieredKeyFn, TieredKeyFn};
use tower_sliding_window::layer::TierHandle;
use tower_sliding_window::{tiered_key_fn, SlidingWindowLayer, TierLimits, Tiers};

type Req = Request<Body>;
type TierFn = Arc<dyn Fn(&Req) -> Option<(&'static str, String)> + Send + Sync>;
type ByTier = SharedTieredKeyFn<Req, &'static str, String>;
type Boxed = TieredKeyFn<Box<dyn Fn(&Req) -> Option<(String, u64)> + Send + Sync>, u64>;

#[derive(Clone)]
struct AppState {
    limits: SlidingWindowLayer<ByTier>,
    admin: TierHandle<String>,
}

struct Other {
    _by_tenant: SlidingWindowLayer<Boxed>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tiers = Tiers::builder()
        .limited("free", ["100/min".parse()?])
        .limited("paid", ["5000/min".parse()?])
        .build()?;
    let shared: TierFn = Arc::new(|req: &Req| {
        let key = req.headers().get("x-api-key")?.to_str().ok()?;
        Some((if key.starts_with("paid_") { "paid" } else { "free" }, key.to_owned()))
    });
    let limits = SlidingWindowLayer::builder(tiered_key_fn(shared))
        .tiers(tiers.clone())
        .build()?;
    let state = AppState {
        admin: limits.tier_handle(),
        limits,
    };
    let copy = state.clone();
    copy.admin.set_tier("free", TierLimits::Limited(vec!["200/min".parse()?]))?;
    let _ = state.limits;

    let boxed: Boxed = tiered_key_fn(Box::new(|req: &Req| {
        let tenant: u64 = req.headers().get("x-tenant")?.to_str().ok()?.parse().ok()?;
        Some(("free".to_owned(), tenant))
    }) as Box<dyn Fn(&Req) -> Option<(String, u64)> + Send + Sync>);
    let other = Other {
        _by_tenant: SlidingWindowLayer::builder(boxed).tiers(tiers).build()?,
    };
    let _ = other;
    Ok(())
}

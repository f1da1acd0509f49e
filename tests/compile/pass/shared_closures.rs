//! Closures shared behind an Arc as extractor, cost, exemption and rejection
//! response: every type can be named.
use std::sync::Arc;
use std::time::Duration;
use axum::body::Body;
use http::{Request, Response};
use tower_sliding_window::extract::{SharedCostFn, SharedExemptFn, SharedKeyFn, WithCost, WithExemption};
use tower_sliding_window::layer::{CustomResponse, HttpRejection};
use tower_sliding_window::{Limiter, Policy, RateLimited, SlidingWindowLayer};

type Req = Request<Body>;
type Key = SharedKeyFn<Req, String>;
type Hook = Arc<dyn Fn(&RateLimited) -> Response<Body> + Send + Sync>;
type Limited = SlidingWindowLayer<
    WithExemption<WithCost<Key, SharedCostFn<Req>>, SharedExemptFn<Req>>,
    Limiter<String>,
    HttpRejection<CustomResponse<Hook>>,
>;

fn main() -> Result<(), tower_sliding_window::ConfigError> {
    let key: Key = Arc::new(|req: &Req| {
        req.headers().get("x-user")?.to_str().ok().map(str::to_owned)
    });
    let cost: SharedCostFn<Req> = Arc::new(|req: &Req| if req.method() == "POST" { 5 } else { 1 });
    let exempt: SharedExemptFn<Req> = Arc::new(|req: &Req| req.uri().path() == "/health");
    let hook: Hook = Arc::new(|_: &RateLimited| Response::new(Body::from("slow down")));
    let layer: Limited = SlidingWindowLayer::builder(key)
        .policy(Policy::per(100, Duration::from_secs(60))?)
        .cost(cost)
        .exempt(exempt)
        .reject_with(hook)
        .build()?;
    let router: axum::Router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello" }))
        .layer(layer);
    let _ = router;
    Ok(())
}

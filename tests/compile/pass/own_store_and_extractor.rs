//! A store and an extractor of your own, and the service type named.
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::time::Duration;
use http::{Request, Response};
use tower::service_fn;
use tower_sliding_window::extract::{KeyExtractor, Keyed, Untiered};
use tower_sliding_window::{
    Decision, Limiter, Policy, SlidingWindow, SlidingWindowLayer, Store, StoreError,
};

/// Keys by tenant; uploads cost 10.
struct ByTenant;

impl Keyed for ByTenant {
    type Key = u64;
    type Tiering = Untiered;
}

impl<B> KeyExtractor<Request<B>> for ByTenant {
    fn extract(&self, req: &Request<B>) -> Option<u64> {
        req.headers().get("x-tenant")?.to_str().ok()?.parse().ok()
    }

    fn cost(&self, req: &Request<B>) -> u32 {
        if req.uri().path().starts_with("/upload") { 10 } else { 1 }
    }
}

/// A store that delegates to a limiter (a real one would ask elsewhere).
struct Delegating(Limiter<u64>);

impl Store<u64> for Delegating {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check_n(&self, key: &u64, cost: u32) -> Self::Future {
        ready(Ok(self.0.check_n(key, cost)))
    }

    fn undo(&self, key: &u64, decision: &Decision) {
        self.0.undo(key, decision)
    }

    fn policy(&self) -> &Policy {
        self.0.policy()
    }
}

type Handler = tower::util::ServiceFn<fn(Request<String>) -> Ready<Result<Response<String>, Infallible>>>;

#[allow(dead_code)]
struct App {
    service: SlidingWindow<Handler, ByTenant, Delegating>,
}

fn handle(_req: Request<String>) -> Ready<Result<Response<String>, Infallible>> {
    ready(Ok(Response::new(String::new())))
}

fn main() -> Result<(), tower_sliding_window::ConfigError> {
    let store = Delegating(Limiter::new(Policy::per(10, Duration::from_secs(1))?)?);
    let layer: SlidingWindowLayer<ByTenant, Delegating> =
        SlidingWindowLayer::builder(ByTenant).store(store).build()?;
    let app = App {
        service: SlidingWindow::new(service_fn(handle as fn(_) -> _), layer),
    };
    let _ = app;
    Ok(())
}

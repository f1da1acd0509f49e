//! Helpers shared by the layer test binaries (tests/policies.rs, tests/logging.rs):
//! a string-bodied service, requests keyed by an `x-user` header, and a call that
//! returns the status and the `RateLimit` field.
#![allow(dead_code)]

use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::time::Duration;
use tower::{service_fn, Service, ServiceExt};
use tower_sliding_window::Policy;

pub fn policy(name: &str, limit: u32, window: Duration) -> Policy {
    Policy::builder()
        .name(name)
        .limit(limit)
        .window(window)
        .build()
        .unwrap()
}

pub type Body = String;

pub fn ok_service(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new("ok".to_owned())) })
}

pub fn request(user: &str) -> Request<Body> {
    Request::builder()
        .header("x-user", user)
        .body(String::new())
        .unwrap()
}

pub fn user(req: &Request<Body>) -> Option<String> {
    req.headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

pub async fn status<S>(svc: &mut S, req: Request<Body>) -> (StatusCode, Option<String>)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let response = svc.ready().await.unwrap().call(req).await.unwrap();
    let rate = response
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), rate)
}

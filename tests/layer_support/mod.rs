//! Helpers shared by the layer test binaries (tests/policies.rs, tests/logging.rs,
//! tests/http.rs, tests/extract_http.rs): a policy, a string-bodied service,
//! requests keyed by an `x-user` header, a call that returns the status and the
//! `RateLimit` field, and an axum app served on 127.0.0.1.
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

/// Serve `app` on an ephemeral 127.0.0.1 port with `axum::serve` (which clones
/// the router's services for every accepted connection), with the peer address
/// as `ConnectInfo`.
pub async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

//! The layer in front of a tonic gRPC server on 127.0.0.1, called by a tonic
//! client: over the limit, the client sees RESOURCE_EXHAUSTED (not UNAVAILABLE,
//! which is what a bare HTTP 429 would turn into).

use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower_sliding_window::{key_fn, Policy, SlidingWindowLayer};

async fn serve(layer_limit: u32) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    // Key: the gRPC method path, so one method's flood does not starve another.
    let by_method =
        key_fn(|req: &http::Request<tonic::body::Body>| Some(req.uri().path().to_owned()));
    let policy = Policy::builder()
        .name("grpc")
        .limit(layer_limit)
        .window(Duration::from_secs(60))
        .build()
        .unwrap();
    let layer = SlidingWindowLayer::builder(by_method)
        .policy(policy)
        .headers_on_allowed(true)
        .build()
        .unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

#[tokio::test]
async fn over_the_limit_is_resource_exhausted_for_a_tonic_client() {
    let addr = serve(2).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let check = || Request::new(HealthCheckRequest::default());

    for _ in 0..2 {
        let response = client.check(check()).await.unwrap();
        // Allowed responses carry the rate-limit fields as metadata.
        assert!(response.metadata().get("ratelimit").is_some());
    }
    let status = client.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("rate limit exceeded for policy \"grpc\""),
        "{}",
        status.message()
    );
    let pushback: i64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pushback >= 1);
    // The message names the same wait, rounded up as the pushback is.
    assert!(
        status
            .message()
            .ends_with(&format!("; retry after {pushback} ms")),
        "{} against {pushback}",
        status.message()
    );
    assert!(status.metadata().get("retry-after").is_some());
}

/// A health service behind a limit of `limit` failed calls a minute: a call
/// counts only if the server answered it with an error, which tonic sends as
/// a trailers-only response (its `grpc-status` among the headers).
async fn serve_counting_failures(limit: u32) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let by_method =
        key_fn(|req: &http::Request<tonic::body::Body>| Some(req.uri().path().to_owned()));
    let layer = SlidingWindowLayer::builder(by_method)
        .policy(Policy::per(limit, Duration::from_secs(60)).unwrap())
        .count_if(|_, headers| headers.get("grpc-status").is_some_and(|code| code != "0"))
        .build()
        .unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

#[tokio::test]
async fn only_calls_answered_with_an_error_grpc_status_count() {
    let addr = serve_counting_failures(2).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let check = |service: &str| {
        Request::new(HealthCheckRequest {
            service: service.to_owned(),
        })
    };
    // The server's own health ("") is SERVING: OK, whose status travels in
    // the trailers after the message. These do not count.
    for _ in 0..5 {
        client.check(check("")).await.unwrap();
    }
    // An unknown service is NOT_FOUND, trailers-only: these count.
    for _ in 0..2 {
        let status = client.check(check("unknown")).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}

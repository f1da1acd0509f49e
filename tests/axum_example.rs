//! The flagship `axum` example, attacked as a client would attack it, over
//! real HTTP on 127.0.0.1: no sequence of anonymous requests and invented API
//! keys gets more through than the IP's limit, and invented keys never reach
//! the per-client limiter; valid keys keep their own limit.

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod example;

use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

/// The example's app on an ephemeral port, and a client for it.
async fn serve() -> (SocketAddr, HttpClient) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = example::app().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let client = Client::builder(TokioExecutor::new()).build_http();
    (addr, client)
}

async fn get(client: &HttpClient, addr: SocketAddr, key: Option<&str>) -> StatusCode {
    let mut req = Request::get(format!("http://{addr}/"));
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    let res = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    res.status()
}

#[tokio::test]
async fn invented_keys_do_not_escape_the_ip_limit() {
    let (addr, client) = serve().await;
    for i in 0..20 {
        assert_eq!(
            get(&client, addr, None).await,
            StatusCode::OK,
            "anonymous {i}"
        );
    }
    assert_eq!(
        get(&client, addr, None).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A fresh invented key per request, as a client that wants to escape its
    // IP's limit would send: every one is still counted against the IP.
    for i in 0..50 {
        let invented = format!("k-invented-{i}");
        let status = get(&client, addr, Some(&invented)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "invented key {i}");
    }
    // A valid key is its own client, unaffected by the IP's exhaustion.
    assert_eq!(
        get(&client, addr, Some("k-alice-3f9c2a")).await,
        StatusCode::OK
    );
}

#[tokio::test]
async fn invented_keys_are_refused_and_counted_against_the_ip() {
    let (addr, client) = serve().await;
    for i in 0..20 {
        let invented = format!("k-invented-{i}");
        let status = get(&client, addr, Some(&invented)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "invented key {i}");
    }
    // The invented keys used up the IP's limit: anonymous requests are limited.
    assert_eq!(
        get(&client, addr, None).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get(&client, addr, Some("k-invented-x")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn each_valid_key_has_a_limit_of_its_own() {
    let (addr, client) = serve().await;
    for i in 0..100 {
        let status = get(&client, addr, Some("k-alice-3f9c2a")).await;
        assert_eq!(status, StatusCode::OK, "alice {i}");
    }
    assert_eq!(
        get(&client, addr, Some("k-alice-3f9c2a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get(&client, addr, Some("k-bob-81d0e7")).await,
        StatusCode::OK
    );
    assert_eq!(
        get(&client, addr, None).await,
        StatusCode::OK,
        "the IP's own limit is untouched"
    );
}

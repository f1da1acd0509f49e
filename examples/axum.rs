//! An axum server limited per client: by API key when the request carries one
//! (100 per minute), otherwise by peer IP (20 per minute; IPv6 grouped by /64).
//! Served on 127.0.0.1:3000 until Ctrl-C; try
//! `curl -i localhost:3000/` and `curl -i -H 'x-api-key: k1' localhost:3000/`.
//! Run it with `cargo run --example axum`.

use axum::{body::Body, routing::get, Router};
use http::Request;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tower_sliding_window::{key_fn, HeaderKey, KeyExtractor, PeerIp, Policy, SlidingWindowLayer};

/// Who a request is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Client {
    ApiKey(String),
    Ip(IpAddr),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter("tower_sliding_window=debug,info")
        .init();

    let api_key = HeaderKey::named("x-api-key")?;
    let peer_ip = PeerIp::new();
    let by_key = SlidingWindowLayer::builder({
        let api_key = api_key.clone();
        key_fn(move |req: &Request<Body>| api_key.extract(req).map(Client::ApiKey))
    })
    .policy(
        Policy::builder()
            .name("api-key")
            .limit(100)
            .window(Duration::from_secs(60))
            .build()?,
    )
    // Requests without an API key are not this layer's business.
    .missing_key(tower_sliding_window::MissingKey::Allow)
    // API clients get their remaining budget on every response.
    .headers_on_allowed(true)
    .build()?;
    let by_ip = SlidingWindowLayer::builder(key_fn(move |req: &Request<Body>| {
        if api_key.extract(req).is_some() {
            return None; // counted by key instead
        }
        peer_ip.extract(req).map(Client::Ip)
    }))
    .policy(
        Policy::builder()
            .name("anonymous")
            .limit(20)
            .window(Duration::from_secs(60))
            .build()?,
    )
    .missing_key(tower_sliding_window::MissingKey::Allow)
    .build()?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(by_key)
        .layer(by_ip);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "listening on http://{} (Ctrl-C to stop)",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

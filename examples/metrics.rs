//! Metrics for a dashboard: an axum app limited per client IP, with the
//! limiter's metrics served at `/metrics` in the Prometheus text format by
//! `metrics-exporter-prometheus`. The example starts the app on 127.0.0.1,
//! sends a burst of requests, scrapes `/metrics` once and prints what the
//! crate reported.
//!
//! Run it with `cargo run --example metrics` (the crate's `metrics` feature;
//! in your own `Cargo.toml`: `features = ["metrics", "axum"]`).

use axum::{routing::get, Router};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use std::net::SocketAddr;
use std::time::Duration;
use tower_sliding_window::{PeerIp, Policy, SlidingWindowLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The recorder first: the layer registers its metrics when it is built.
    let prometheus = PrometheusBuilder::new().install_recorder()?;

    let policy = Policy::builder()
        .name("per-ip")
        .limit(5)
        .window(Duration::from_secs(10))
        .build()?;
    let limit = SlidingWindowLayer::new(policy, PeerIp::new())?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limit.clone());
    // Beside the app, not behind its limit: a scrape is never throttled.
    let scrape = Router::new().route(
        "/metrics",
        get(move || {
            let (prometheus, limit) = (prometheus.clone(), limit.clone());
            async move {
                // Counts of allowed and denied checks reach the recorder once per
                // bucket width; reading the limiter's stats hands over the rest.
                for limiter in limit.stores() {
                    let _ = limiter.stats();
                }
                prometheus.render()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.merge(scrape)
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    for _ in 0..8 {
        let res = client.get(format!("http://{addr}/").parse()?).await?;
        res.into_body().collect().await?;
    }
    let res = client
        .get(format!("http://{addr}/metrics").parse()?)
        .await?;
    let body = res.into_body().collect().await?.to_bytes();
    println!("8 requests against a limit of 5 per 10 s; GET /metrics says:\n");
    for line in String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with("tower_sliding_window_") && !l.contains(" 0"))
    {
        println!("  {line}");
    }
    Ok(())
}

//! Two axum instances sharing one Redis: the fleet admits the limit per window
//! in total, not the limit per instance.
//!
//! Both servers run on ephemeral 127.0.0.1 ports, each with its own
//! [`RedisStore`] (its own connection), limited to 10 requests per 2 s per API
//! key. A client alternates between them: 10 requests pass across the two, the
//! rest get 429, and once the window has moved on requests pass again.
//!
//! Run it with `cargo run --example redis_fleet` (Redis at `REDIS_URL`, default
//! redis://127.0.0.1:6379). The crate's `redis` feature provides the store; the
//! examples build with it on. In your own `Cargo.toml`:
//! `tower-sliding-window = { version = "0.1", features = ["redis"] }`.

use axum::{routing::get, Router};
use http::Request;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tower_sliding_window::{key_fn, FailurePolicy, Policy, RedisStore, SlidingWindowLayer};

/// The API keys the fleet issued: only these are counted, each under its own
/// limit. A key a client makes up is answered 401 and never reaches Redis.
const API_KEYS: [&str; 2] = ["k-alice", "k-bob"];

const LIMIT: u32 = 10;
const WINDOW: Duration = Duration::from_secs(2);

/// One instance of the service: its own store (and Redis connection), one layer.
async fn start_instance(
    name: &'static str,
    redis_url: &str,
    prefix: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let policy = Policy::builder()
        .name("per-key")
        .limit(LIMIT)
        .window(WINDOW)
        .buckets(4)
        .build()?;
    let store = RedisStore::builder(policy, FailurePolicy::Closed)
        .url(redis_url)
        .prefix(prefix)
        .build()?;
    // Fail at startup, not on the first request, when Redis is not there.
    store
        .warm_up()
        .await
        .map_err(|e| format!("{name}: {e} (is Redis running at {redis_url}?)"))?;
    let issued_key = key_fn(|req: &Request<axum::body::Body>| {
        let key = req.headers().get("x-api-key")?.to_str().ok()?;
        API_KEYS.into_iter().find(|issued| *issued == key)
    });
    let layer = SlidingWindowLayer::builder(issued_key)
        .store(store)
        .missing_key_status(http::StatusCode::UNAUTHORIZED)
        .headers_on_allowed(true)
        .build()?;
    let app = Router::new()
        .route(
            "/",
            get(move || async move { format!("hello from {name}\n") }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("{name} stopped: {e}");
        }
    });
    Ok(url)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    // A prefix of this run's own, so reruns start from an empty window.
    let prefix = format!("tsw-example:{}:", std::process::id());
    let instances = [
        ("A", start_instance("A", &redis_url, &prefix).await?),
        ("B", start_instance("B", &redis_url, &prefix).await?),
    ];
    println!(
        "instances A at {} and B at {}, sharing {redis_url}",
        instances[0].1, instances[1].1
    );
    println!("policy: {LIMIT} requests per {WINDOW:?} per API key, for the whole fleet\n");

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut admitted = 0;
    let mut retry_after = WINDOW;
    for i in 0..24 {
        let (name, url) = &instances[i % 2];
        let req = Request::get(url.as_str())
            .header("x-api-key", "k-alice")
            .body(Empty::new())?;
        let res = client.request(req).await?;
        let status = res.status();
        let header = |h: &str| {
            res.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        };
        println!(
            "request {i:>2} -> {name}: {status}  RateLimit: {}  Retry-After: {}",
            header("ratelimit"),
            header("retry-after")
        );
        if status.is_success() {
            admitted += 1;
        } else if let Ok(secs) = header("retry-after").parse::<u64>() {
            retry_after = Duration::from_secs(secs);
        }
    }
    println!(
        "\nthe fleet admitted {admitted} of 24 requests in one window (limit {LIMIT}; \
         two per-process limiters would have admitted {})",
        2 * LIMIT
    );

    println!("\nwaiting {retry_after:?} (Retry-After) for the window to move on...");
    tokio::time::sleep(retry_after).await;
    for (i, (name, url)) in instances.iter().enumerate() {
        let req = Request::get(url.as_str())
            .header("x-api-key", "k-alice")
            .body(Empty::new())?;
        let res = client.request(req).await?;
        println!("request {} -> {name}: {}", 24 + i, res.status());
    }
    Ok(())
}

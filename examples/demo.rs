//! The 30-second tour: an axum server on 127.0.0.1 limited to 5 requests per
//! 10 seconds per API key, a burst of requests from a hyper client, and a table
//! of what came back. Run it with `cargo run --example demo`.

use axum::{routing::get, Router};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tower_sliding_window::{HeaderKey, Policy, SlidingWindowLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::builder()
        .name("demo")
        .limit(5)
        .window(Duration::from_secs(10))
        .build()?;
    let layer = SlidingWindowLayer::builder(HeaderKey::named("x-api-key")?)
        .policy(policy)
        .legacy_headers(true)
        // Show the count going down on 200s too (429s always carry the fields).
        .headers_on_allowed(true)
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer.clone());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("axum on http://{addr}, limit: 5 requests per 10 s per x-api-key\n");

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    println!(
        "{:>2}  {:<6} {:>6}  {:<22} {:<28} {:>11}",
        "#", "key", "status", "RateLimit", "RateLimit-Policy", "Retry-After"
    );
    let burst = (1..=7)
        .map(|i| (i, "alice"))
        .chain((8..=9).map(|i| (i, "bob")));
    for (i, key) in burst {
        let req = http::Request::get(format!("http://{addr}/"))
            .header("x-api-key", key)
            .body(Empty::new())?;
        let res = client.request(req).await?;
        let header = |name: &str| {
            res.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        };
        println!(
            "{:>2}  {:<6} {:>6}  {:<22} {:<28} {:>11}",
            i,
            key,
            res.status().as_u16(),
            header("ratelimit"),
            header("ratelimit-policy"),
            header("retry-after"),
        );
        res.into_body().collect().await?;
    }

    let limiter = layer.stores().next().expect("one policy");
    println!("\nlimiter stats: {:?}", limiter.stats());
    println!("alice got 5 of 7 (then 429 with Retry-After); bob's key is counted separately.");
    Ok(())
}

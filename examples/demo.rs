//! The 30-second tour: an axum server on 127.0.0.1 limited to 5 requests per
//! 10 seconds per API key, a burst of requests from a hyper client, and a table
//! of what came back. Run it with `cargo run --example demo`.
//!
//! Only keys the server issued are counted: a key the client makes up would
//! otherwise be a fresh limit of its own. A request without an issued key gets
//! 401 (the layer's missing-key answer, which is never a 429).

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tower_sliding_window::{key_fn, Policy, SlidingWindowLayer};

/// The API keys this server issued. A real server looks them up in its database.
const API_KEYS: [&str; 2] = ["k-alice", "k-bob"];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::builder()
        .name("demo")
        .limit(5)
        .window(Duration::from_secs(10))
        .build()?;
    let issued_key = key_fn(|req: &Request<Body>| {
        let key = req.headers().get("x-api-key")?.to_str().ok()?;
        API_KEYS.into_iter().find(|issued| *issued == key)
    });
    let layer = SlidingWindowLayer::builder(issued_key)
        .policy(policy)
        .missing_key_status(StatusCode::UNAUTHORIZED)
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
        "{:>2}  {:<9} {:>6}  {:<22} {:<28} {:>11}",
        "#", "key", "status", "RateLimit", "RateLimit-Policy", "Retry-After"
    );
    let burst = (1..=7)
        .map(|i| (i, "k-alice"))
        .chain((8..=9).map(|i| (i, "k-bob")))
        .chain([(10, "k-made-up")]);
    for (i, key) in burst {
        let req = Request::get(format!("http://{addr}/"))
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
            "{:>2}  {:<9} {:>6}  {:<22} {:<28} {:>11}",
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
    println!("alice got 5 of 7 (then 429 with Retry-After); bob's key is counted separately;");
    println!("a key the server never issued gets 401 and no limit of its own.");
    Ok(())
}

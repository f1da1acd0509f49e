//! A client that stays under an upstream's quota by waiting instead of being
//! rejected.
//!
//! A local axum server enforces 5 requests per 500 ms (reject mode: 429). The
//! client is a hyper-util client wrapped in `SlidingWindowLayer`, first with
//! `OnLimit::Wait` (15 requests fired at once wait their turn inside their
//! response futures), then with `backpressure()` (4 workers sharing clones of
//! one service, held back in `poll_ready`). The run prints every status and
//! ends with zero 429s; the same burst without the layer gets 10 of them.
//!
//! `cargo run --example client`
//!
//! The client's window is the server's plus a margin: the server frees a unit
//! a window after it counted it (to a step of its bucket, 1/65 536 of it),
//! but it counts each request when the request reaches it, later than the
//! client did, by a delay that varies with timers and the network; the client
//! spaces its batches by a window plus more than that delay.

use axum::{routing::get, Router};
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::{GlobalKey, OnLimit, Policy, SlidingWindowLayer, WaitConfig};

const QUOTA: u32 = 5;
const WINDOW: Duration = Duration::from_millis(500);
/// The client's window: the server's and a margin for timers and the network.
const CLIENT_WINDOW: Duration = Duration::from_millis(600);
const REQUESTS: usize = 3 * QUOTA as usize;

/// The upstream: 5 requests per 500 ms for everyone, 429 beyond.
async fn upstream() -> Result<SocketAddr, BoxError> {
    let layer = SlidingWindowLayer::new(Policy::per(QUOTA, WINDOW)?, GlobalKey)?;
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

fn get_request(addr: SocketAddr) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}/"))
        .body(Empty::new())
        .expect("a valid request")
}

#[derive(Default)]
struct Tally {
    ok: usize,
    too_many: usize,
    other: usize,
}

impl Tally {
    fn add(&mut self, status: StatusCode) {
        match status {
            StatusCode::OK => self.ok += 1,
            StatusCode::TOO_MANY_REQUESTS => self.too_many += 1,
            _ => self.other += 1,
        }
    }
}

/// Print each response as it comes: elapsed time, status.
fn report(label: &str, start: Instant, n: usize, status: StatusCode) {
    println!(
        "  {label} #{n:>2}  at {:>5} ms  -> {status}",
        start.elapsed().as_millis()
    );
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();

    // 1. Wait: every request joins the queue when called and is sent at its turn.
    let addr = upstream().await?;
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(Policy::per(QUOTA, CLIENT_WINDOW)?)
        .on_limit(OnLimit::Wait(WaitConfig::bounded(
            Duration::from_secs(5),
            64,
        )?))
        .reject_with_errors()
        .build()?;
    let svc = ServiceBuilder::new().layer(layer).service(client.clone());
    println!("OnLimit::Wait: {REQUESTS} requests at once, quota {QUOTA} per {WINDOW:?}");
    let start = Instant::now();
    let mut calls = Vec::new();
    for n in 0..REQUESTS {
        let mut svc = svc.clone();
        let response = svc.ready().await?.call(get_request(addr));
        calls.push(tokio::spawn(async move {
            let status = response.await.map(|r| r.status());
            (n, status)
        }));
    }
    let mut waited = Tally::default();
    for call in calls {
        let (n, status) = call.await?;
        let status = status?;
        report("wait", start, n, status);
        waited.add(status);
    }

    // 2. Backpressure: four workers share one limit through clones of a service;
    // `ready()` holds each back until a unit is free.
    let addr = upstream().await?;
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(Policy::per(QUOTA, CLIENT_WINDOW)?)
        .backpressure()
        .reject_with_errors()
        .build()?;
    let svc = ServiceBuilder::new().layer(layer).service(client.clone());
    println!("backpressure(): 4 workers, {REQUESTS} requests in all");
    let start = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..4 {
        let mut svc = svc.clone();
        workers.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for n in (worker..REQUESTS).step_by(4) {
                let response = svc.ready().await?.call(get_request(addr)).await?;
                report("bp  ", start, n, response.status());
                statuses.push(response.status());
            }
            Ok::<_, BoxError>(statuses)
        }));
    }
    let mut backpressured = Tally::default();
    for worker in workers {
        for status in worker.await?? {
            backpressured.add(status);
        }
    }

    // 3. The same burst without the layer.
    let addr = upstream().await?;
    let mut bare = Tally::default();
    let burst: Vec<_> = (0..REQUESTS)
        .map(|_| client.clone().oneshot(get_request(addr)))
        .collect();
    for response in burst {
        bare.add(response.await?.status());
    }

    println!();
    for (label, t) in [
        ("with OnLimit::Wait        ", &waited),
        ("with backpressure()       ", &backpressured),
        ("without the layer         ", &bare),
    ] {
        println!(
            "{label}: {} x 200, {} x 429, {} other",
            t.ok, t.too_many, t.other
        );
    }
    if waited.too_many + backpressured.too_many + waited.other + backpressured.other > 0 {
        return Err("the limited client was rejected by the upstream".into());
    }
    Ok(())
}

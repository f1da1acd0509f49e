//! Three axum instances sharing one Redis, with leases: the fleet admits the
//! limit per window in total, not per instance, and a busy API key costs a
//! small fraction of a round trip per request.
//!
//! The servers run on ephemeral 127.0.0.1 ports, each with its own
//! [`RedisStore`] (its own connection), 500 requests per 2 s per API key for
//! the whole fleet. Three clients, one per instance, send a busy key's
//! requests for 4 s, a little faster than the limit; a fourth sends a quiet
//! key's now and then. The example prints the decisions, the round trips to
//! Redis, and the most requests admitted in any 2 s window.
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower_sliding_window::redis::Leases;
use tower_sliding_window::{key_fn, FailurePolicy, Policy, RedisStore, SlidingWindowLayer};

/// The API keys the fleet issued: only these are counted, each under its own
/// limit. A key a client makes up is answered 401 and never reaches Redis.
const API_KEYS: [&str; 2] = ["k-busy", "k-quiet"];

const INSTANCES: usize = 3;
const LIMIT: u32 = 500;
const WINDOW: Duration = Duration::from_secs(2);
/// Each busy client's pace: three of them send 600 requests per window.
const BUSY_EVERY: Duration = Duration::from_millis(10);
const RUN: Duration = Duration::from_secs(4);

/// When the fleet's handlers ran for the busy key: the requests it admitted.
type Admissions = Arc<Mutex<Vec<Instant>>>;

/// One instance of the service: its own store (and Redis connection), one layer.
async fn start_instance(
    name: &'static str,
    store: RedisStore,
    admitted: Admissions,
) -> Result<String, Box<dyn std::error::Error>> {
    let issued_key = key_fn(|req: &Request<axum::body::Body>| {
        let key = req.headers().get("x-api-key")?.to_str().ok()?;
        API_KEYS.into_iter().find(|issued| *issued == key)
    });
    let layer = SlidingWindowLayer::builder(issued_key)
        .store(store)
        .missing_key_status(http::StatusCode::UNAUTHORIZED)
        .build()?;
    let app = Router::new()
        .route(
            "/",
            get(move |headers: http::HeaderMap| async move {
                if headers.get("x-api-key").is_some_and(|k| k == "k-busy") {
                    admitted
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Instant::now());
                }
                format!("hello from {name}\n")
            }),
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

/// The store of one instance: the fleet's limit, leases on, and while Redis
/// is away a third of the limit on each instance.
async fn store(redis_url: &str, prefix: &str) -> Result<RedisStore, Box<dyn std::error::Error>> {
    let policy = Policy::builder()
        .name("per-key")
        .limit(LIMIT)
        .window(WINDOW)
        .buckets(4)
        .build()?;
    let per_instance = Policy::builder()
        .name("per-key")
        .limit(LIMIT / INSTANCES as u32)
        .window(WINDOW)
        .buckets(4)
        .build()?;
    let store = RedisStore::builder(policy, FailurePolicy::Fallback(per_instance))
        .url(redis_url)
        .prefix(prefix)
        .leases(Leases::new())
        .build()?;
    // Fail at startup, not on the first request, when Redis is not there.
    store
        .warm_up()
        .await
        .map_err(|e| format!("{e} (is Redis running at {redis_url}?)"))?;
    Ok(store)
}

/// Send `key`'s requests to `url` every `every` until `RUN` has passed; the
/// statuses counted: (admitted, rejected).
async fn client(url: String, key: &'static str, every: Duration) -> (u32, u32) {
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut admitted, mut rejected) = (0, 0);
    let start = Instant::now();
    while start.elapsed() < RUN {
        tick.tick().await;
        let Ok(req) = Request::get(url.as_str())
            .header("x-api-key", key)
            .body(Empty::new())
        else {
            continue;
        };
        match http.request(req).await {
            Ok(res) if res.status().is_success() => admitted += 1,
            Ok(_) => rejected += 1,
            Err(e) => eprintln!("request failed: {e}"),
        }
    }
    (admitted, rejected)
}

/// The most instants in any window of length `window`.
fn most_in_any_window(mut at: Vec<Instant>, window: Duration) -> usize {
    at.sort_unstable();
    let mut most = 0;
    let mut first = 0;
    for (last, t) in at.iter().enumerate() {
        while *t - at[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    // A prefix of this run's own, so reruns start from an empty window.
    let prefix = format!("tsw-example:{}:", std::process::id());
    let admitted = Admissions::default();
    let mut stores = Vec::new();
    let mut urls = Vec::new();
    for name in ["A", "B", "C"] {
        let store = store(&redis_url, &prefix).await?;
        urls.push(start_instance(name, store.clone(), admitted.clone()).await?);
        stores.push(store);
    }
    println!(
        "instances A, B and C at {}, sharing {redis_url}",
        urls.join(", ")
    );
    println!(
        "policy: {LIMIT} requests per {WINDOW:?} per API key for the whole fleet, \
         leases on\n"
    );

    let busy: Vec<_> = urls
        .iter()
        .map(|url| tokio::spawn(client(url.clone(), "k-busy", BUSY_EVERY)))
        .collect();
    let quiet = tokio::spawn(client(
        urls[0].clone(),
        "k-quiet",
        Duration::from_millis(700),
    ));
    let (mut busy_admitted, mut busy_rejected) = (0, 0);
    for client in busy {
        let (a, r) = client.await?;
        busy_admitted += a;
        busy_rejected += r;
    }
    let (quiet_admitted, quiet_rejected) = quiet.await?;

    // Hand the units the instances still hold back to the fleet, as an
    // instance does when it stops.
    for store in &stores {
        store.shutdown().await;
    }
    let stats: Vec<_> = stores.iter().map(RedisStore::stats).collect();
    let decisions: u64 = stats.iter().map(|s| s.decisions).sum();
    let round_trips: u64 = stats.iter().map(|s| s.round_trips).sum();
    let leased: u64 = stats.iter().map(|s| s.lease_decisions).sum();
    let denied_locally: u64 = stats.iter().map(|s| s.deny_cache_hits).sum();
    let handed_back: u64 = stats.iter().map(|s| s.lease_units_handed_back).sum();
    let admissions = admitted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let most = most_in_any_window(admissions, WINDOW);

    println!(
        "k-busy:  {} requests in {RUN:?}, {busy_admitted} admitted, {busy_rejected} rejected (429)",
        busy_admitted + busy_rejected
    );
    println!(
        "k-quiet: {} requests, {quiet_admitted} admitted (a key this quiet is never leased)",
        quiet_admitted + quiet_rejected
    );
    println!(
        "\n{decisions} decisions, {round_trips} round trips to Redis ({:.3} per decision): \
         {leased} admitted from leases, {denied_locally} denied by the local deny cache, \
         {handed_back} leased units handed back",
        round_trips as f64 / decisions.max(1) as f64
    );
    println!(
        "the most k-busy requests admitted in any {WINDOW:?} window: {most} (limit {LIMIT}; \
         three per-process limiters would have admitted up to {})",
        INSTANCES as u32 * LIMIT
    );
    Ok(())
}

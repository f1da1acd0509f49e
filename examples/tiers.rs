//! Limits per client tier, read from a TOML file and changed while a client
//! runs: an axum server on 127.0.0.1 keys callers without an API key by IP
//! (tier `anonymous`), callers with a key the server issued by that key (in
//! the key's tier), lets the internal tier through uncounted and turns away a
//! suspended key. A hyper client sends a few rounds of requests, the `free`
//! limit is raised halfway, and a table of what came back is printed. Run it
//! with `cargo run --example tiers --features serde`.
//!
//! The tier comes from the server's own table of issued keys, never from the
//! request: a client that could name its tier could name the unlimited one.

use axum::extract::ConnectInfo;
use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::{IpAddr, SocketAddr};
use tower_sliding_window::{tiered_key_fn, SlidingWindowLayer, TierLimits, Tiers};

/// The API keys this server issued, with their tiers. A real server looks
/// them up in its database.
const API_KEYS: [(&str, &str); 4] = [
    ("k-free", "free"),
    ("k-paid", "paid"),
    ("k-ci", "internal"),
    ("k-banned", "suspended"),
];

/// Who is counted: an issued API key, or the address of a caller without one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Caller {
    Key(&'static str),
    Ip(IpAddr),
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tiers.toml");
    let tiers: Tiers = toml::from_str(&std::fs::read_to_string(path)?)?;

    let by_tier = tiered_key_fn(|req: &Request<Body>| {
        match req.headers().get("x-api-key") {
            // An unknown key is not a free pass into a tier of its own: no key,
            // so the request is answered 401 below.
            Some(presented) => API_KEYS
                .into_iter()
                .find(|(issued, _)| presented.as_bytes() == issued.as_bytes())
                .map(|(key, tier)| (tier, Caller::Key(key))),
            // The peer address axum saw (behind a proxy, use ClientIp's logic instead).
            None => {
                let ConnectInfo(peer) = req.extensions().get::<ConnectInfo<SocketAddr>>()?;
                Some(("anonymous", Caller::Ip(peer.ip())))
            }
        }
    });
    let layer = SlidingWindowLayer::builder(by_tier)
        .tiers(tiers)
        .missing_key_status(StatusCode::UNAUTHORIZED)
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer.clone());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    println!("axum on http://{addr}, tiers from examples/tiers.toml:");
    for (name, limits) in layer.tiers().iter().flat_map(Tiers::iter) {
        println!("  {name:<10} {}", describe(limits));
    }

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let callers = [
        ("anonymous", None),
        ("free", Some("k-free")),
        ("paid", Some("k-paid")),
        ("internal", Some("k-ci")),
        ("suspended", Some("k-banned")),
        ("made-up", Some("k-guess")),
    ];
    println!("\n{:<11} {:<8} statuses of 8 requests", "caller", "round");
    for round in 1..=2 {
        if round == 2 {
            // Raised while the counts of round 1 still stand: room at once for
            // 3 more, not 8.
            layer.set_tier("free", TierLimits::Limited(vec!["8 per 10s".parse()?]))?;
            println!("-- free raised to 8 per 10s");
        }
        for (name, key) in callers {
            let mut statuses = Vec::new();
            for _ in 0..8 {
                let mut req = Request::get(format!("http://{addr}/"));
                if let Some(key) = key {
                    req = req.header("x-api-key", key);
                }
                let response = client.request(req.body(Empty::new())?).await?;
                statuses.push(response.status().as_u16().to_string());
            }
            println!("{name:<11} {round:<8} {}", statuses.join(" "));
        }
    }
    Ok(())
}

/// A tier's limits in one line.
fn describe(limits: &TierLimits) -> String {
    match limits {
        TierLimits::Limited(policies) => policies
            .iter()
            .map(|p| format!("{} per {:?} ({})", p.limit(), p.window(), p.name()))
            .collect::<Vec<_>>()
            .join(" and "),
        TierLimits::Unlimited => "unlimited".to_owned(),
        TierLimits::Denied => "denied".to_owned(),
        other => format!("{other:?}"),
    }
}

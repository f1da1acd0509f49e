//! Limits per client tier, read from a TOML file and changed while a client
//! runs: an axum server on 127.0.0.1 keys callers without an API key by
//! their address (tier `anonymous`), callers with a key the server issued by
//! that key (in the key's tier), lets the internal tier through uncounted and
//! turns away a suspended key. A hyper client sends a few rounds of
//! requests, the `free` limit is raised halfway through a `TierHandle`, as an
//! admin endpoint would, and a table of what came back is printed. Run it
//! with `cargo run --example tiers --features serde`.
//!
//! The tier comes from the server's own table of issued keys, never from the
//! request: a client that could name its tier could name the unlimited one.
//!
//! Anonymous callers are keyed by `ClientIp`, as a layer of policies would
//! key them: the address a trusted proxy saw, read from `X-Forwarded-For`
//! from the right (so a client cannot pick its key by sending the header
//! itself), with IPv6 addresses grouped by /64 (one subscriber's whole
//! network is one caller). Here the proxy is taken to run on this host
//! (127.0.0.1), and the client plays it by sending `X-Forwarded-For`; in
//! production, trust your load balancers' networks instead.

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::{IpAddr, SocketAddr};
use tower_sliding_window::{tiered_key_fn, ClientIp, SlidingWindowLayer, TierLimits, Tiers};

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

    // The reverse proxy in front of this server (see the top of the file).
    let client_ip = ClientIp::trusting(["127.0.0.1".parse()?]);
    let by_tier = tiered_key_fn(move |req: &Request<Body>| {
        match req.headers().get("x-api-key") {
            // An unknown key is not a free pass into a tier of its own: no key,
            // so the request is answered 401 below.
            Some(presented) => API_KEYS
                .into_iter()
                .find(|(issued, _)| presented.as_bytes() == issued.as_bytes())
                .map(|(key, tier)| (tier, Caller::Key(key))),
            // The client behind the trusted proxy, IPv6 by /64.
            None => Some(("anonymous", Caller::Ip(client_ip.key_of(req)?))),
        }
    });
    let layer = SlidingWindowLayer::builder(by_tier)
        .tiers(tiers)
        .missing_key_status(StatusCode::UNAUTHORIZED)
        .build()?;
    // What an admin endpoint would hold to change limits.
    let admin = layer.tier_handle();
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
    // Each caller: its name, its API key, and the address the proxy saw
    // (what `X-Forwarded-For` ends with).
    let callers = [
        ("anon v6 ::a", None, Some("2001:db8:1:2::a")),
        // The same /64 as ::a: one subscriber, one count (none left).
        ("anon v6 ::b", None, Some("2001:db8:1:2::b")),
        // Claims another address in front; the proxy's entry, on the
        // right, is what counts: still 2001:db8:1:2::/64.
        ("anon spoof", None, Some("203.0.113.99, 2001:db8:1:2::c")),
        ("anon v4", None, Some("198.51.100.7")),
        ("free", Some("k-free"), None),
        ("paid", Some("k-paid"), None),
        ("internal", Some("k-ci"), None),
        ("suspended", Some("k-banned"), None),
        ("made-up", Some("k-guess"), None),
    ];
    println!("\n{:<12} {:<6} statuses of 8 requests", "caller", "round");
    for round in 1..=2 {
        if round == 2 {
            // Raised while the counts of round 1 still stand: room at once for
            // 3 more, not 8.
            admin.set_tier("free", TierLimits::Limited(vec!["8 per 10s".parse()?]))?;
            println!("-- free raised to 8 per 10s");
        }
        for (name, key, forwarded_for) in callers {
            let mut statuses = Vec::new();
            for _ in 0..8 {
                let mut req = Request::get(format!("http://{addr}/"));
                if let Some(key) = key {
                    req = req.header("x-api-key", key);
                }
                if let Some(forwarded_for) = forwarded_for {
                    req = req.header("x-forwarded-for", forwarded_for);
                }
                let response = client.request(req.body(Empty::new())?).await?;
                statuses.push(response.status().as_u16().to_string());
            }
            println!("{name:<12} {round:<6} {}", statuses.join(" "));
        }
    }
    // A typo in a change is an error, not a new tier.
    let typo = admin.set_tier("fre", TierLimits::Unlimited);
    println!("\nset_tier(\"fre\", ..): {}", typo.unwrap_err());
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

//! An axum API limited per client, safe to copy: a valid API key gets 100
//! requests a minute of its own; everyone else, including anyone sending a key
//! the server does not know, shares the limit of their IP address (20 a
//! minute; IPv6 grouped by /64).
//!
//! The order matters. A key the client sends is only a claim: limiting by it
//! before checking it would let any client skip its IP's limit by inventing a
//! key, and fill the per-key limiter with invented ones. So, from the outside
//! in:
//!
//! 1. `per_ip` counts every request by IP, except those with a valid key: an
//!    invented key is counted against the caller's IP like no key at all.
//! 2. `authenticate` answers 401 to an unknown key, and tells the handler
//!    (and the next layer) which client a valid key belongs to.
//! 3. `per_client` counts authenticated requests by client.
//!
//! Served on 127.0.0.1:3000 until Ctrl-C. Run it with
//! `cargo run --example axum`, then try
//! `curl -i localhost:3000/`, `curl -i -H 'x-api-key: k-alice-3f9c2a' localhost:3000/`
//! and `curl -i -H 'x-api-key: invented' localhost:3000/`.

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{routing::get, Extension, Router};
use std::net::SocketAddr;
use std::time::Duration;
use tower_sliding_window::{key_fn, ConfigError, MissingKey, PeerIp, Policy, SlidingWindowLayer};

/// The API keys this server accepts, and whose they are. A real server looks
/// them up in its database (and compares them in constant time).
const API_KEYS: &[(&str, &str)] = &[("k-alice-3f9c2a", "alice"), ("k-bob-81d0e7", "bob")];

/// The client a valid API key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Client(&'static str);

/// The client of the request's `x-api-key`, if it is a key this server issued.
fn client_of<B>(req: &http::Request<B>) -> Option<Client> {
    let key = req.headers().get("x-api-key")?.as_bytes();
    API_KEYS
        .iter()
        .find(|(known, _)| known.as_bytes() == key)
        .map(|&(_, client)| Client(client))
}

/// 401 for a key this server did not issue; a valid key's client is recorded
/// for the handler and the per-client limit. No key at all: anonymous.
async fn authenticate(mut req: Request, next: Next) -> Response {
    match (req.headers().contains_key("x-api-key"), client_of(&req)) {
        (true, None) => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, r#"ApiKey realm="api""#)],
            "unknown API key\n",
        )
            .into_response(),
        (_, client) => {
            if let Some(client) = client {
                req.extensions_mut().insert(client);
            }
            next.run(req).await
        }
    }
}

async fn hello(client: Option<Extension<Client>>) -> String {
    match client {
        Some(Extension(Client(name))) => format!("hello, {name}\n"),
        None => "hello, anonymous\n".to_owned(),
    }
}

/// The app with its limits: what `main` serves (and what the example's test
/// attacks).
pub fn app() -> Result<Router, ConfigError> {
    let per_ip = SlidingWindowLayer::builder(PeerIp::new())
        .policy(
            Policy::builder()
                .name("per-ip")
                .limit(20)
                .window(Duration::from_secs(60))
                .build()?,
        )
        // Only a valid key skips the IP's limit; an invented one is counted.
        .exempt(|req: &Request| client_of(req).is_some())
        .build()?;
    let per_client = SlidingWindowLayer::builder(key_fn(|req: &Request| {
        req.extensions().get::<Client>().copied()
    }))
    .policy(
        Policy::builder()
            .name("per-client")
            .limit(100)
            .window(Duration::from_secs(60))
            .build()?,
    )
    // Anonymous requests carry no client: the IP limit counted them already.
    .missing_key(MissingKey::Allow)
    // Clients get their remaining budget on every response.
    .headers_on_allowed(true)
    .build()?;
    // The last layer added runs first.
    Ok(Router::new()
        .route("/", get(hello))
        .layer(per_client)
        .layer(middleware::from_fn(authenticate))
        .layer(per_ip))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info,tower_sliding_window=info".into()),
        )
        .init();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "listening on http://{} (Ctrl-C to stop)",
        listener.local_addr()?
    );
    // PeerIp reads the ConnectInfo this records (crate feature `axum`).
    axum::serve(
        listener,
        app()?.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

//! A login endpoint that limits failed attempts, not logins: at most 5 wrong
//! passwords per client IP and user name in any window, while successful
//! logins cost nothing.
//!
//! Counting only failures after the response would be unsafe: a hundred
//! wrong passwords sent at once would all be checked before any of them was
//! counted. So each attempt reserves its unit when it is admitted, and
//! `count_if` gives the unit back when the response says the login
//! succeeded. Concurrent attempts meet the limit as if they came one after
//! another.
//!
//! The example serves `POST /users/{name}/login` (the password in the body)
//! on 127.0.0.1, behind what stands for a load balancer: the server trusts
//! 127.0.0.1 to report the client's address in `X-Forwarded-For`. An
//! attacker at 203.0.113.66 sends 200 wrong passwords for `ada` at once, and
//! 200 more a window later; meanwhile `ada`, at 198.51.100.20, logs in 12
//! times. It prints what reached the handler and ends with the line
//! `failed logins admitted in any window: <n> (limit 5); legitimate logins refused: <m>`
//! (n at most 5, m zero).
//!
//! `cargo run --example login`
//!
//! In production the window is 15 minutes; it is two seconds here so that
//! the demo ends in seconds (`app` takes it).

use axum::extract::{Path, State};
use axum::routing::post;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower::BoxError;
use tower_sliding_window::{key_fn, ClientIp, ConfigError, Policy, SlidingWindowLayer};

/// Failed logins allowed per client IP and user name in any window.
const FAILED_LOGINS: u32 = 5;

/// The login route, behind its limit: at most `FAILED_LOGINS` failed logins
/// per (client IP, user name) in any `window`; a login that succeeds gives
/// its unit back.
fn app(window: Duration, seen: Seen) -> Result<Router, ConfigError> {
    // The proxies allowed to name the client in X-Forwarded-For: your load
    // balancer's addresses. Requests that do not come through it are keyed
    // by their peer address.
    let client_ip = ClientIp::trusting(["127.0.0.1/32".parse().expect("a network")]);
    let by_ip_and_user = key_fn(move |req: &Request<axum::body::Body>| {
        let ip = client_ip.key_of(req)?;
        let user = user_in(req.uri().path())?;
        Some((ip, user.to_owned()))
    });
    let failed_logins = SlidingWindowLayer::builder(by_ip_and_user)
        .policy(
            Policy::builder()
                .name("failed-logins")
                .limit(FAILED_LOGINS)
                .window(window)
                .build()?,
        )
        // Count the attempt only if the password was wrong.
        .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
        // A cap on the keys tracked, so that a flood of invented user names
        // cannot take the server's memory.
        .max_keys(100_000)
        .build()?;
    Ok(Router::new()
        .route("/users/{user}/login", post(login))
        .with_state(seen)
        .layer(failed_logins))
}

/// The user name of `/users/{name}/login`.
fn user_in(path: &str) -> Option<&str> {
    let name = path.strip_prefix("/users/")?.strip_suffix("/login")?;
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

/// What the handler saw: when each wrong password reached it.
#[derive(Clone, Default)]
struct Seen {
    failures: Arc<Mutex<Vec<Instant>>>,
}

/// Checks the password. A real server compares a salted hash (argon2,
/// scrypt) it stores for the user.
async fn login(State(seen): State<Seen>, Path(user): Path<String>, password: String) -> StatusCode {
    let right =
        user == "ada" && constant_time_eq(password.as_bytes(), b"correct horse battery staple");
    if right {
        StatusCode::NO_CONTENT
    } else {
        seen.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Instant::now());
        StatusCode::UNAUTHORIZED
    }
}

/// Byte strings compared in time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The most `times` that fall in any interval of length `window`.
fn most_in_any_window(times: &mut [Instant], window: Duration) -> usize {
    times.sort();
    let mut most = 0;
    let mut first = 0;
    for last in 0..times.len() {
        while times[last] - times[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// One login attempt from `client` (as the load balancer reports it).
async fn attempt(
    http: &HttpClient,
    addr: SocketAddr,
    client: IpAddr,
    user: &str,
    password: &str,
) -> Result<StatusCode, BoxError> {
    let req = Request::post(format!("http://{addr}/users/{user}/login"))
        .header("x-forwarded-for", client.to_string())
        .body(Full::new(Bytes::from(password.to_owned())))?;
    Ok(http.request(req).await?.status())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let window = Duration::from_secs(2);
    let seen = Seen::default();
    let app = app(window, seen.clone())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    let http: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let attacker: IpAddr = "203.0.113.66".parse()?;
    let ada: IpAddr = "198.51.100.20".parse()?;
    let mut refused = 0;
    for wave in 1..=2 {
        let started = Instant::now();
        // 200 wrong passwords at once...
        let guesses: Vec<_> = (0..200)
            .map(|i| {
                let http = http.clone();
                tokio::spawn(async move {
                    attempt(&http, addr, attacker, "ada", &format!("guess-{i}")).await
                })
            })
            .collect();
        // ...while ada logs in, six times in this window (twelve in all,
        // more than the limit).
        for _ in 0..6 {
            let status = attempt(&http, addr, ada, "ada", "correct horse battery staple").await?;
            if status != StatusCode::NO_CONTENT {
                refused += 1;
            }
        }
        let mut statuses = std::collections::BTreeMap::new();
        for guess in guesses {
            *statuses.entry(guess.await??.as_u16()).or_insert(0) += 1;
        }
        println!("wave {wave}: the attacker's 200 guesses got {statuses:?}");
        // The next wave once this one's failures have left the window.
        tokio::time::sleep_until(started + window + Duration::from_millis(300)).await;
    }
    let mut failures = seen
        .failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    println!("wrong passwords the handler checked: {}", failures.len());
    let n = most_in_any_window(&mut failures, window);
    println!("failed logins admitted in any window: {n} (limit {FAILED_LOGINS}); legitimate logins refused: {refused}");
    Ok(())
}

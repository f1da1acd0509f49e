//! A token budget per API key, as an LLM gateway keeps one: 10 000 tokens a
//! minute per key, where a request's tokens are known only when its response
//! (or the end of its stream) arrives.
//!
//! Each request reserves an estimate when it is admitted (its `max-tokens`,
//! capped), so concurrent requests cannot overrun the budget together. Then
//! it settles at what it used:
//!
//! - `POST /v1/complete` answers at once with an `x-tokens-used` header:
//!   the layer's `settle` reads it, gives back what the estimate left unused,
//!   or charges what the request used beyond it;
//! - `POST /v1/stream` streams its answer: the body holds the request's
//!   `Settlement` and settles at its end with the tokens it sent (or, if the
//!   client goes away first, with those sent until then).
//!
//! A key that used more than its estimate is charged the excess at once and
//! denied until its window is back under the budget.
//!
//! `cargo run --example tokens`

use axum::body::Body;
use axum::extract::Extension;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::BoxError;
use tower_sliding_window::{key_fn, Policy, Settlement, SlidingWindowLayer};

/// Tokens per API key per minute.
const BUDGET: u32 = 10_000;
/// The estimate of a request that names no `max-tokens`.
const DEFAULT_ESTIMATE: u32 = 1_000;

fn header_u32(headers: &HeaderMap, name: &str) -> Option<u32> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// The gateway's routes.
fn routes() -> Router {
    Router::new()
        .route("/v1/complete", post(complete))
        .route("/v1/stream", post(stream))
}

/// An answer at once: the prompt's words stand for the tokens used.
async fn complete(prompt: String) -> Response {
    let used = 40 * prompt.split_whitespace().count() as u32;
    ([("x-tokens-used", used.to_string())], "an answer\n").into_response()
}

/// A streamed answer of `chunks` chunks (the body), 250 tokens each.
async fn stream(Extension(settlement): Extension<Settlement>, chunks: String) -> Response {
    let chunks = chunks.trim().parse().unwrap_or(4);
    Body::new(Metered {
        chunks,
        tokens_per_chunk: 250,
        sent: 0,
        settlement: Some(settlement),
    })
    .into_response()
}

/// A body that counts the tokens it sends and settles the request when it
/// ends, or when it is dropped before (the client went away).
struct Metered {
    chunks: u32,
    tokens_per_chunk: u32,
    sent: u32,
    settlement: Option<Settlement>,
}

impl Metered {
    fn settle(&mut self) {
        if let Some(settlement) = self.settlement.take() {
            settlement.settle(self.sent);
        }
    }
}

impl hyper::body::Body for Metered {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.chunks == 0 {
            self.settle();
            return Poll::Ready(None);
        }
        self.chunks -= 1;
        self.sent = self.sent.saturating_add(self.tokens_per_chunk);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"tokens ")))))
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.settle();
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, String>;

/// One request; its status and the tokens the gateway's response reported.
async fn call(
    http: &HttpClient,
    addr: SocketAddr,
    path: &str,
    max_tokens: u32,
    body: &str,
) -> Result<StatusCode, BoxError> {
    let req = Request::post(format!("http://{addr}{path}"))
        .header("x-api-key", "key-1")
        .header("max-tokens", max_tokens.to_string())
        .body(body.to_owned())?;
    let response = http.request(req).await?;
    let status = response.status();
    // Read the body to its end: a streamed answer settles there.
    response.into_body().collect().await?;
    Ok(status)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // A real gateway checks the key first (see the `axum` example) and keys
    // the budget by the account it belongs to.
    let by_api_key = key_fn(|req: &Request<Body>| {
        req.headers()
            .get("x-api-key")
            .map(|v| v.as_bytes().to_vec())
    });
    let budget = SlidingWindowLayer::builder(by_api_key)
        // The estimate: what the request may use at most. Capped at the
        // budget: a cost above the limit could never pass.
        .cost(|req: &Request<Body>| {
            header_u32(req.headers(), "max-tokens")
                .unwrap_or(DEFAULT_ESTIMATE)
                .clamp(1, BUDGET)
        })
        .policy(
            Policy::builder()
                .name("tokens")
                .limit(BUDGET)
                .window(Duration::from_secs(60))
                .build()?,
        )
        // The response says what the request used...
        .settle(|_, headers| header_u32(headers, "x-tokens-used"))
        // ...or the streamed body does, at its end.
        .settle_later()
        .build()?;
    let app = routes().layer(budget.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let remaining = || {
        budget
            .stores()
            .map(|store| store.peek(&b"key-1".to_vec(), 0).remaining())
            .min()
            .unwrap_or(0)
    };

    // (route, max-tokens, body, what happens)
    let steps = [
        (
            "/v1/complete",
            2_000,
            "a prompt of six short words",
            "used 240 of 2000 reserved",
        ),
        (
            "/v1/stream",
            3_000,
            "8",
            "streamed 8 x 250 of 3000 reserved",
        ),
        (
            "/v1/stream",
            1_000,
            "40",
            "streamed 40 x 250: 9000 charged past 1000 reserved",
        ),
        (
            "/v1/complete",
            4_000,
            "one more",
            "over budget until the window moves on",
        ),
        ("/v1/complete", 10, "hi", "even a small one"),
    ];
    for (path, max_tokens, body, what) in steps {
        let status = call(&http, addr, path, max_tokens, body).await?;
        println!(
            "{path:<13} max-tokens {max_tokens:>5}: {status} ({what}); {} of {BUDGET} left",
            remaining()
        );
    }
    Ok(())
}

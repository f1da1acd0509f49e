//! A plain hyper 1 server (no axum) with the layer keyed by peer IP. hyper
//! hands us each connection's address, which we put into the request's
//! extensions as a `SocketAddr`: that is where `PeerIp` looks.
//! Serves on 127.0.0.1, sends a few requests to itself and exits.
//! Run it with `cargo run --example hyper`.

use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tower::{service_fn, Layer, ServiceExt};
use tower_sliding_window::{PeerIp, Policy, SlidingWindowLayer};

async fn hello(_req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::from("hello\n")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layer = SlidingWindowLayer::builder(PeerIp::new())
        .policy(Policy::per(3, Duration::from_secs(5))?)
        .headers_on_allowed(true)
        .build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;

    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            // The same layer (and so the same limiter) for every connection.
            let service = layer.layer(service_fn(hello));
            let service = service.map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert::<SocketAddr>(peer);
                req
            });
            tokio::spawn(async move {
                let io = TokioIo::new(stream);
                let _ = http1::Builder::new()
                    .serve_connection(io, TowerToHyperService::new(service))
                    .await;
            });
        }
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for i in 1..=5 {
        let res = client.get(format!("http://{addr}/").parse()?).await?;
        println!(
            "request {i}: {} ratelimit={:?} retry-after={:?}",
            res.status(),
            res.headers().get("ratelimit"),
            res.headers().get("retry-after")
        );
        res.into_body().collect().await?;
    }
    Ok(())
}

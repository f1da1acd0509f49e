//! A gRPC server (tonic's health service) behind the layer, limited to 3 calls
//! per 10 seconds per method, and a tonic client that sees RESOURCE_EXHAUSTED
//! (not the UNAVAILABLE a bare HTTP 429 would become).
//! Run it with `cargo run --example tonic`.

use std::time::Duration;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower_sliding_window::{key_fn, MissingKey, Policy, SlidingWindowLayer};

/// The methods this server serves. The key is one of these, never the path
/// as the client wrote it: an invented path would otherwise be a key of its
/// own, and a flood of them would fill the limiter's keys.
const METHODS: [&str; 2] = [
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
];

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_reporter, health) = tonic_health::server::health_reporter();

    // Key: the gRPC method, so one method's flood does not starve another.
    let by_method = key_fn(|req: &http::Request<tonic::body::Body>| {
        let path = req.uri().path();
        METHODS.into_iter().find(|method| *method == path)
    });
    let policy = Policy::builder()
        .name("health")
        .limit(3)
        .window(Duration::from_secs(10))
        .build()?;
    let layer = SlidingWindowLayer::builder(by_method)
        .policy(policy)
        // Other paths are no method of ours: tonic answers them UNIMPLEMENTED.
        .missing_key(MissingKey::Allow)
        .headers_on_allowed(true) // as metadata on OK responses too
        .build()?;
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );

    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for i in 1..=5 {
        match client.check(HealthCheckRequest::default()).await {
            Ok(res) => println!(
                "call {i}: OK {:?}, ratelimit={:?}",
                res.get_ref().status(),
                res.metadata().get("ratelimit")
            ),
            Err(status) => println!(
                "call {i}: {:?}: {} (grpc-retry-pushback-ms={:?})",
                status.code(),
                status.message(),
                status.metadata().get("grpc-retry-pushback-ms")
            ),
        }
    }
    Ok(())
}

//! The tower layer's own cost per request, in-process and without a network:
//! `ready` + `call` + await on a wrapped service that answers at once, with no
//! layer, with this crate's layer and with tower_governor's, all in one run.
//! The HTTP benchmark (`benches/http.rs`) measures the same layers behind a
//! real server, where a request costs microseconds and these tens of
//! nanoseconds sit inside its noise; this one isolates them.
//!
//! Run: `cargo bench --bench layer`.
//!
//! - `*_allowed`: every request passes (a limit no run reaches).
//! - `*_rejected`: every request but the first is rejected (1 per hour): ours
//!   answers a 429 with `Retry-After`, `RateLimit` and `RateLimit-Policy`,
//!   tower_governor a 429 with its own headers.

#[path = "support/layers.rs"]
mod layers;

use axum::body::Body;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use layers::{governor, ours};
use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};
use tower::{Layer, Service, ServiceExt};

type Req = http::Request<Body>;
type Res = http::Response<Body>;

/// The wrapped service: an empty 200 at once.
fn inner() -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone {
    tower::service_fn(|_req: Req| async { Ok::<_, Infallible>(http::Response::new(Body::empty())) })
}

/// Time `iters` requests through `svc`, one after another.
fn run<S>(rt: &tokio::runtime::Runtime, mut svc: S, iters: u64) -> Duration
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let response = svc
                .ready()
                .await
                .unwrap()
                .call(http::Request::new(Body::empty()))
                .await
                .unwrap();
            black_box(response);
        }
        start.elapsed()
    })
}

fn layers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (name, limit) in [("layer_allowed", u32::MAX), ("layer_rejected", 1)] {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(1));
        group.bench_function("none", |b| b.iter_custom(|n| run(&rt, inner(), n)));
        // Built inside the runtime, as in a server.
        let layer = rt.block_on(async { ours(limit) });
        group.bench_function("ours", |b| {
            b.iter_custom(|n| run(&rt, layer.layer(inner()), n))
        });
        let layer = governor(limit);
        group.bench_function("tower_governor", |b| {
            b.iter_custom(|n| run(&rt, layer.layer(inner()), n))
        });
        group.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = layers
}
criterion_main!(benches);

//! The tower layer's own cost per request, in-process and without a network:
//! `ready` + `call` + await on a wrapped service that answers at once, with no
//! layer, with this crate's layer and with tower_governor's, all in one run.
//! The HTTP benchmark (`benches/http.rs`) measures the same layers behind a
//! real server, where a request costs microseconds and these tens of
//! nanoseconds sit inside its noise; this one isolates them.
//!
//! Run: `cargo bench --bench layer`; with `--features metrics` the same with
//! a Prometheus recorder installed, to compare the two.
//!
//! - `*_allowed`: every request passes (a limit no run reaches).
//! - `*_rejected`: every request but the first is rejected (1 per hour): ours
//!   answers a 429 with `Retry-After`, `RateLimit` and `RateLimit-Policy`,
//!   tower_governor a 429 with its own headers.
//!
//! Both layers key by one global key, except in `layer_allowed_peer_ip`: there
//! each request carries axum's `ConnectInfo` (127.0.0.1) and both key by the
//! peer's IP (tower_governor's default extractor), so each hashes an address.
//!
//! `layer_allowed_tiers`: the cost of tiers. One key (a `u8`) under a limit no
//! run reaches, in a layer of one policy (`policies`) and as the third of four
//! tiers with the same policy (`tiers`): the difference is loading the table
//! and finding the tier by name.
//!
//! `layer_allowed_router` wraps an axum `Router` with one route instead of a
//! service that answers at once (each request is routed, its handler runs and
//! its body is built): the layers as they sit in front of an app, where the
//! app's `call` is not inlined into theirs.

#[path = "support/layers.rs"]
mod layers;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use layers::{
    governor, governor_peer_ip, inner, inner_peer_ip, ours, ours_peer_ip, router, run, runtime,
    Keys,
};
use std::time::Duration;
use tower::Layer;

fn layers(c: &mut Criterion) {
    // With the `metrics` feature, as an app would run it: a recorder installed
    // before the layers are built (`cargo bench --bench layer --features metrics`).
    #[cfg(feature = "metrics")]
    let _prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the first recorder");
    let rt = runtime();
    for (name, limit) in [("layer_allowed", u32::MAX), ("layer_rejected", 1)] {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(1));
        let keys = Keys::Global;
        group.bench_function("none", |b| b.iter_custom(|n| run(&rt, inner(), keys, n)));
        // Built inside the runtime, as in a server.
        let layer = rt.block_on(async { ours(limit) });
        group.bench_function("ours", |b| {
            b.iter_custom(|n| run(&rt, layer.layer(inner()), keys, n))
        });
        let layer = governor(limit);
        group.bench_function("tower_governor", |b| {
            b.iter_custom(|n| run(&rt, layer.layer(inner()), keys, n))
        });
        group.finish();
    }
    let mut group = c.benchmark_group("layer_allowed_peer_ip");
    group.throughput(Throughput::Elements(1));
    let keys = Keys::PeerIp;
    group.bench_function("none", |b| {
        b.iter_custom(|n| run(&rt, inner_peer_ip(), keys, n))
    });
    let layer = rt.block_on(async { ours_peer_ip(u32::MAX) });
    group.bench_function("ours", |b| {
        b.iter_custom(|n| run(&rt, layer.layer(inner_peer_ip()), keys, n))
    });
    let layer = governor_peer_ip(u32::MAX);
    group.bench_function("tower_governor", |b| {
        b.iter_custom(|n| run(&rt, layer.layer(inner_peer_ip()), keys, n))
    });
    group.finish();

    let mut group = c.benchmark_group("layer_allowed_tiers");
    group.throughput(Throughput::Elements(1));
    let keys = Keys::Global;
    group.bench_function("none", |b| b.iter_custom(|n| run(&rt, inner(), keys, n)));
    let layer = rt.block_on(async { layers::ours_one_key(u32::MAX) });
    group.bench_function("policies", |b| {
        b.iter_custom(|n| run(&rt, layer.layer(inner()), keys, n))
    });
    let layer = rt.block_on(async { layers::ours_tiered(u32::MAX) });
    group.bench_function("tiers", |b| {
        b.iter_custom(|n| run(&rt, layer.layer(inner()), keys, n))
    });
    group.finish();

    let mut group = c.benchmark_group("layer_allowed_router");
    group.throughput(Throughput::Elements(1));
    let keys = Keys::Global;
    group.bench_function("none", |b| b.iter_custom(|n| run(&rt, router(), keys, n)));
    let layer = rt.block_on(async { ours(u32::MAX) });
    group.bench_function("ours", |b| {
        b.iter_custom(|n| run(&rt, layer.layer(router()), keys, n))
    });
    let layer = governor(u32::MAX);
    group.bench_function("tower_governor", |b| {
        b.iter_custom(|n| run(&rt, layer.layer(router()), keys, n))
    });
    group.finish();
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

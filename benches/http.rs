//! End-to-end HTTP benchmark: an axum hello-world server in this process, loaded
//! over loopback by hyper clients with bounded concurrency and duration.
//!
//! Arms, all in one run so the ratios are fair on a noisy machine:
//! no limiter; this crate with every request allowed; this crate with nearly
//! every request rejected; tower_governor with the same two settings; each
//! limiter both routed (`Router::layer`) and in front of the router; and ours
//! rejecting with no rate-limit headers, to tell the headers' cost (building
//! them, and the client parsing them) from the rest of a rejection. Every arm
//! runs beside its own no-limiter run, and each ratio is to that neighbour.
//!
//! ```sh
//! cargo bench --bench http        # 15 rounds, 0.5 s per run, 32 connections (~3 min)
//! HTTP_BENCH_MS=1000 HTTP_BENCH_CONNS=64 HTTP_BENCH_ROUNDS=30 cargo bench --bench http
//! HTTP_BENCH_ARMS='routed, ~all;again' cargo bench --bench http  # only the matching arms
//! ```

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::{routing::get, Router, ServiceExt};
use governor::middleware::NoOpMiddleware;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::{Layer, Service};
use tower_governor::{
    governor::GovernorConfigBuilder, key_extractor::GlobalKeyExtractor, GovernorLayer,
};
use tower_sliding_window::{GlobalKey, Policy, SlidingWindowLayer};

async fn hello() -> &'static str {
    "Hello, world!"
}

struct Outcome {
    label: &'static str,
    requests: u64,
    ok: u64,
    limited: u64,
    secs: f64,
    p50: Duration,
    p99: Duration,
}

impl Outcome {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.secs
    }
}

async fn serve<S>(app: S) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(
            listener,
            ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(app),
        )
        .await
        .unwrap();
    });
    (addr, task)
}

async fn load<S>(label: &'static str, app: S, conns: usize, duration: Duration) -> Outcome
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    let (addr, server) = serve(app).await;
    let uri: hyper::Uri = format!("http://{addr}/").parse().unwrap();
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let uri = uri.clone();
            tokio::spawn(async move {
                // One client per worker: one keep-alive connection each.
                let client = Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(1)
                    .build_http::<Empty<Bytes>>();
                let (mut ok, mut limited) = (0u64, 0u64);
                let mut latencies = Vec::with_capacity(1 << 16);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let res = client.get(uri.clone()).await.expect("request failed");
                    let status = res.status();
                    let _ = res.into_body().collect().await;
                    latencies.push(t.elapsed());
                    if status.is_success() {
                        ok += 1;
                    } else {
                        limited += 1;
                    }
                }
                (ok, limited, latencies)
            })
        })
        .collect();
    let (mut ok, mut limited, mut latencies) = (0, 0, Vec::new());
    for w in workers {
        let (o, l, lat) = w.await.unwrap();
        ok += o;
        limited += l;
        latencies.extend(lat);
    }
    let secs = started.elapsed().as_secs_f64();
    server.abort();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    Outcome {
        label,
        requests: ok + limited,
        ok,
        limited,
        secs,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

fn app() -> Router {
    Router::new().route("/", get(hello))
}

fn governor(burst: u32) -> GovernorLayer<GlobalKeyExtractor, NoOpMiddleware, Body> {
    let config = GovernorConfigBuilder::default()
        .per_second(3600)
        .burst_size(burst)
        .key_extractor(GlobalKeyExtractor)
        .finish()
        .unwrap();
    GovernorLayer::new(Arc::new(config))
}

fn sliding(limit: u32, headers_on_allowed: bool) -> SlidingWindowLayer<GlobalKey> {
    let policy = Policy::per(limit, Duration::from_secs(3600)).unwrap();
    SlidingWindowLayer::builder(GlobalKey)
        .policy(policy)
        .headers_on_allowed(headers_on_allowed)
        .build()
        .unwrap()
}

type Run = Pin<Box<dyn Future<Output = Outcome>>>;
type Arm = (&'static str, fn(&'static str, usize, Duration) -> Run);

/// A setting from the environment, or its default.
fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let conns: usize = setting("HTTP_BENCH_CONNS", 32);
    // Short arms: a pair (arm, baseline) runs within about a second, faster than
    // the machine's speed drifts, so the pair's ratio cancels the drift.
    let duration = Duration::from_millis(setting("HTTP_BENCH_MS", 500));
    let rounds: usize = setting("HTTP_BENCH_ROUNDS", 15);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // "routed": `Router::layer`, the limiter runs after routing, around the handler.
    // "outer": the limiter wraps the whole router, so a rejection skips routing.
    let arms: [Arm; 12] = [
        ("no limiter", |l, c, d| Box::pin(load(l, app(), c, d))),
        ("sliding-window, routed, all allowed", |l, c, d| {
            Box::pin(load(l, app().layer(sliding(u32::MAX, false)), c, d))
        }),
        (
            "sliding-window, routed, all allowed, headers on 200s",
            |l, c, d| Box::pin(load(l, app().layer(sliding(u32::MAX, true)), c, d)),
        ),
        ("sliding-window, routed, ~all rejected", |l, c, d| {
            Box::pin(load(l, app().layer(sliding(10, false)), c, d))
        }),
        ("tower_governor, routed, all allowed", |l, c, d| {
            Box::pin(load(l, app().layer(governor(u32::MAX)), c, d))
        }),
        ("tower_governor, routed, ~all rejected", |l, c, d| {
            Box::pin(load(l, app().layer(governor(10)), c, d))
        }),
        ("sliding-window, outer, all allowed", |l, c, d| {
            Box::pin(load(l, sliding(u32::MAX, false).layer(app()), c, d))
        }),
        ("sliding-window, outer, ~all rejected", |l, c, d| {
            Box::pin(load(l, sliding(10, false).layer(app()), c, d))
        }),
        ("tower_governor, outer, all allowed", |l, c, d| {
            Box::pin(load(l, governor(u32::MAX).layer(app()), c, d))
        }),
        ("tower_governor, outer, ~all rejected", |l, c, d| {
            Box::pin(load(l, governor(10).layer(app()), c, d))
        }),
        (
            "sliding-window, routed, ~all rejected, no rate-limit headers",
            |l, c, d| {
                let layer = SlidingWindowLayer::builder(GlobalKey)
                    .policy(Policy::per(10, Duration::from_secs(3600)).unwrap())
                    .ietf_headers(false)
                    .retry_after_header(false)
                    .build()
                    .unwrap();
                Box::pin(load(l, app().layer(layer), c, d))
            },
        ),
        ("no limiter (again)", |l, c, d| {
            Box::pin(load(l, app(), c, d))
        }),
    ];
    // `HTTP_BENCH_ARMS='rejected;governor'` keeps the arms whose label contains one of
    // the words (for profiling one path); the no-limiter baseline always runs.
    let only: Vec<String> = std::env::var("HTTP_BENCH_ARMS")
        .map(|s| s.split(';').map(str::to_owned).collect())
        .unwrap_or_default();
    let arms: Vec<_> = arms
        .into_iter()
        .enumerate()
        .filter(|(i, (label, _))| {
            *i == 0 || only.is_empty() || only.iter().any(|w| label.contains(w.as_str()))
        })
        .map(|(_, arm)| arm)
        .collect();
    rt.block_on(async {
        // Warm up sockets and allocator.
        load("warm-up", app(), conns, Duration::from_millis(500)).await;
        // Every arm runs right beside its own no-limiter run (before it in even
        // rounds, after it in odd ones), arms in an order rotated each round. Each
        // ratio is taken to that neighbouring baseline and the median over rounds
        // is reported: short, adjacent pairs cancel the machine's drift in speed.
        let (base_label, base_run) = arms[0];
        let mut runs: Vec<Vec<Outcome>> = arms.iter().map(|_| Vec::new()).collect();
        let mut ratios: Vec<Vec<f64>> = arms.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for k in 0..arms.len() - 1 {
                let i = 1 + (k + round) % (arms.len() - 1);
                let (label, run) = arms[i];
                let (base, arm) = if round % 2 == 0 {
                    let base = base_run(base_label, conns, duration).await;
                    (base, run(label, conns, duration).await)
                } else {
                    let arm = run(label, conns, duration).await;
                    (base_run(base_label, conns, duration).await, arm)
                };
                ratios[i].push(arm.rps() / base.rps());
                ratios[0].push(1.0);
                runs[0].push(base);
                runs[i].push(arm);
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "\n{conns} connections, {duration:?} per arm, {rounds} interleaved rounds, loopback, server and load in one process"
        );
        println!("ratio: median over rounds of (arm / the no-limiter run beside it), with the lowest and highest round\n");
        println!("| arm | requests/s | vs no limiter | rounds' range | p50 | p99 | 2xx | 429 |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for (r, ratios) in runs.iter().zip(ratios) {
            let (lo, hi) = ratios
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let rps = median(r.iter().map(Outcome::rps).collect());
            let o = r
                .iter()
                .min_by(|a, b| (a.rps() - rps).abs().total_cmp(&(b.rps() - rps).abs()))
                .expect("at least one round");
            println!(
                "| {} | {:.0} | {:.3}× | {:.2}–{:.2} | {:.0?} | {:.0?} | {} | {} |",
                o.label,
                rps,
                median(ratios),
                lo,
                hi,
                o.p50,
                o.p99,
                o.ok,
                o.limited
            );
        }
    });
}

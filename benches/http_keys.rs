//! Many client keys, end to end: an axum hello-world server keyed by 100 000
//! distinct API keys, each of which comes back after it went idle, with this
//! crate's `SlidingWindowLayer`, with tower_governor and with no limiter, all
//! in one run, side by side.
//!
//! **Server and client apart.** Each arm's server runs in a child process (the
//! bench re-executes itself with `HTTP_KEYS_SERVE=<arm>`; the child prints its
//! 127.0.0.1 ephemeral port on stdout and exits when its stdin closes), and
//! the client (hyper, bounded connections, bounded time) runs in this
//! process. The server's CPU is read before and after each load, so a
//! request's server CPU is apart from the client's: the sum of its threads'
//! time on a CPU (`/proc/<pid>/task/*/schedstat`, in nanoseconds), or where
//! a thread ended in between, utime + stime from `/proc/<pid>/stat` (in
//! clock ticks of 10 ms, which count every thread the process had). The two still share the machine's cores,
//! so requests per second move with the client's work too; the CPU figure does
//! not.
//!
//! **Keys.** Every request carries an `x-api-key` header; the client takes the
//! keys in rotation over 100 000 values (`client-000000` to `client-099999`),
//! each arm with its own rotation that carries on from one run to the next.
//! Ours keys by the header with [`HeaderKey`]; tower_governor has no header
//! extractor of its own, so the bench gives it one that does what `HeaderKey`
//! does (the one value of the header, non-empty, at most 256 bytes of visible
//! ASCII, copied into a `String`). Both then hash and store the same
//! `String` key after the same checks: what differs is the limiter. (Keying by
//! `X-Forwarded-For` would not be the same work for both: `ClientIp` reads the
//! proxy chain from the right past trusted proxies and groups IPv6 by /64,
//! tower_governor's `SmartIpKeyExtractor` takes the leftmost address.)
//!
//! **Every key idle when it comes back.** The policy is 5 requests in half a
//! second: ours `Policy::per(5, 500 ms)` (7 buckets of 71.4 ms);
//! tower_governor the same rate and burst (`per_millisecond(100)`,
//! `burst_size(5)`). A key comes back once the other 99 999 have been sent,
//! about a second later or more at the rates this machine serves (each run
//! prints the interval, and warns when it falls under the window and a
//! bucket), so every visit finds its key
//! idle, every request is allowed (each run prints any other status), and the
//! limiters track keys that come and go. Each limiter is set up as its docs
//! advise for many keys: ours as the memory guide's example
//! (`max_keys(200_000)`, room for every key, and `sweep_idle()`, a tokio task
//! that drops idle keys every bucket width); tower_governor with the cleanup
//! its README shows, a thread calling `retain_recent()` periodically, here
//! every window (the README's example waits 60 s, longer than the bench; a
//! key is idle to governor 100 ms after its request). Both limiters wrap the
//! router (`Router::layer`), as in their READMEs; neither sets rate-limit
//! headers on allowed responses (the default of both).
//!
//! **Method: side by side.** The three servers run at the same time, each
//! driven by its own load generator: the servers pinned to the first CPU,
//! the client (all three generators) to the second (`taskset`; unpinned,
//! with a notice, where it or a second CPU is missing). The machine's swings
//! then hit every arm alike: loads run one after another swing by ±12% on a
//! shared 2-vCPU machine, side by side they agree within 3%. With the
//! servers sharing one CPU, each gets the time the scheduler gives it, so
//! requests per second follow the server's CPU per request. Before the
//! rounds, each arm runs once unmeasured, so that every key has been seen
//! once; the ratios are taken within a round and the median over rounds is
//! reported. "Server CPU per request" is taken over each load; the second
//! figure, "with the cleanup", over a load and the time until the next
//! round's, which includes dropping the keys the load left (ours' sweeper
//! task, governor's `retain_recent` thread).
//!
//! ```sh
//! cargo bench --bench http_keys    # 21 rounds, 2 s per round, 32 connections per arm (~1.5 min)
//! HTTP_KEYS_BENCH_MS=3000 HTTP_KEYS_BENCH_ROUNDS=30 HTTP_KEYS_BENCH_CONNS=64 cargo bench --bench http_keys
//! ```
//!
//! The bench prints the servers' process ids, for a profiler to attach to
//! (`perf record -p <pid>` while the rounds run).

use axum::{routing::get, Router};
use governor::middleware::NoOpMiddleware;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_governor::{
    governor::GovernorConfigBuilder, key_extractor::KeyExtractor, GovernorError, GovernorLayer,
};
use tower_sliding_window::{HeaderKey, Policy, SlidingWindowLayer};

/// Distinct client keys.
const KEYS: usize = 100_000;
/// The header that carries a request's key.
const HEADER: &str = "x-api-key";
/// Requests a key may make per window.
const LIMIT: u32 = 5;
/// Half a second: at the rates a 2-core machine serves with the three
/// servers sharing one CPU (20 000 to 40 000 requests a second each), a key
/// comes back 2.5 s or more later, idle.
const WINDOW: Duration = Duration::from_millis(500);
/// A key is idle once a window and a bucket have passed since its last request.
const IDLE_AFTER: Duration = Duration::from_millis(572);
/// Which arm a child process serves.
const SERVE_ENV: &str = "HTTP_KEYS_SERVE";
/// The longest a request may take before the bench gives up on the server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arm {
    Ours,
    Governor,
    None,
}

const ARMS: [Arm; 3] = [Arm::Ours, Arm::Governor, Arm::None];

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Ours => "ours",
            Arm::Governor => "governor",
            Arm::None => "none",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Arm::Ours => "sliding-window",
            Arm::Governor => "tower_governor",
            Arm::None => "no limiter",
        }
    }

    fn from_name(name: &str) -> Option<Arm> {
        ARMS.into_iter().find(|arm| arm.name() == name)
    }
}

// ---- The server, in a child process ----

async fn hello() -> &'static str {
    "Hello, world!"
}

/// tower_governor keyed by the `x-api-key` header, with the checks and the
/// copy `HeaderKey` makes.
#[derive(Clone, Copy)]
struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        let mut values = req.headers().get_all(HEADER).iter();
        let value = values.next().ok_or(GovernorError::UnableToExtractKey)?;
        if values.next().is_some() {
            return Err(GovernorError::UnableToExtractKey);
        }
        let bytes = value.as_bytes();
        if bytes.is_empty()
            || bytes.len() > HeaderKey::DEFAULT_MAX_LEN
            || !bytes.iter().all(u8::is_ascii_graphic)
        {
            return Err(GovernorError::UnableToExtractKey);
        }
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| GovernorError::UnableToExtractKey)
    }
}

fn app(arm: Arm) -> Router {
    let router = Router::new().route("/", get(hello));
    match arm {
        Arm::Ours => router.layer(
            SlidingWindowLayer::builder(HeaderKey::named(HEADER).unwrap())
                .policy(Policy::per(LIMIT, WINDOW).unwrap())
                .max_keys(200_000)
                .sweep_idle()
                .build()
                .unwrap(),
        ),
        Arm::Governor => {
            let config = GovernorConfigBuilder::default()
                .per_millisecond(WINDOW.as_millis() as u64 / u64::from(LIMIT))
                .burst_size(LIMIT)
                .key_extractor(ApiKey)
                .finish()
                .unwrap();
            // The cleanup tower_governor's README shows: a thread that drops
            // the keys whose state is back to a fresh one.
            let limiter = config.limiter().clone();
            std::thread::spawn(move || loop {
                std::thread::sleep(WINDOW);
                limiter.retain_recent();
            });
            let layer: GovernorLayer<ApiKey, NoOpMiddleware, axum::body::Body> =
                GovernorLayer::new(Arc::new(config));
            router.layer(layer)
        }
        Arm::None => router,
    }
}

/// Serve `arm` on an ephemeral loopback port, printed on stdout, until stdin closes.
fn serve(arm: Arm) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Inside the runtime: ours' sweeper is a task on it.
        let app = app(arm);
        let mut out = std::io::stdout();
        writeln!(out, "{port}").unwrap();
        out.flush().unwrap();
        // The parent closes stdin when it is done (or gone): end then.
        std::thread::spawn(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        });
        axum::serve(listener, app).await.unwrap();
    });
}

// ---- The client, in this process ----

/// A server child: its port, and its stdin, whose closing ends it.
struct Server {
    arm: Arm,
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
}

impl Server {
    /// Start `arm`'s server, pinned to `cpu` when given.
    fn start(arm: Arm, cpu: Option<usize>) -> Server {
        let exe = std::env::current_exe().expect("the bench's own path");
        let mut command = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpu.to_string()).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        let mut child = command
            .env(SERVE_ENV, arm.name())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a server child");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("the server's port");
        let port = line.trim().parse().expect("a port number");
        let stdin = child.stdin.take();
        Server {
            arm,
            child,
            stdin,
            port,
        }
    }

    /// The CPU the server has used so far.
    fn cpu(&self) -> Cpu {
        let pid = self.child.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .expect("the server's /proc/<pid>/stat");
        // Fields after the command name, which ends at the last ')': state is
        // field 3, utime 14 and stime 15, in clock ticks (USER_HZ, 100 on Linux).
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        let mut threads = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads") {
            let task = task.unwrap();
            let tid: u32 = task.file_name().to_string_lossy().parse().unwrap();
            // A thread that has just ended has no schedstat: it is then missing.
            if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
                if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
                    threads.push((tid, ns));
                }
            }
        }
        Cpu {
            secs: ticks as f64 / 100.0,
            threads,
        }
    }
}

/// How many CPU figures came from utime + stime, not schedstat.
static TICK_FALLBACKS: AtomicUsize = AtomicUsize::new(0);

/// A process's CPU time: utime + stime (in 10 ms ticks, every thread it ever
/// had), and each live thread's time on a CPU in nanoseconds (schedstat).
struct Cpu {
    secs: f64,
    threads: Vec<(u32, u64)>,
}

impl Cpu {
    /// Seconds of CPU from `self` to `later`: to the nanosecond from the
    /// threads' schedstat when every thread seen in `self` is still there, else
    /// (a thread ended between the two, its time no longer listed) from
    /// utime + stime.
    fn until(&self, later: &Cpu) -> f64 {
        let before: u64 = self.threads.iter().map(|t| t.1).sum();
        let after: u64 = later.threads.iter().map(|t| t.1).sum();
        let kept = self
            .threads
            .iter()
            .all(|(tid, _)| later.threads.iter().any(|(t, _)| t == tid));
        if kept && after >= before {
            (after - before) as f64 / 1e9
        } else {
            TICK_FALLBACKS.fetch_add(1, Relaxed);
            later.secs - self.secs
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(100));
            if !matches!(self.child.try_wait(), Ok(Some(_))) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

/// One load on one server.
struct Run {
    ok: u64,
    other: u64,
    secs: f64,
    /// Server CPU over the load, in seconds.
    cpu: f64,
    /// Server CPU from the load's start to the start of the arm's next load.
    cpu_with_cleanup: Option<f64>,
}

impl Run {
    fn requests(&self) -> u64 {
        self.ok + self.other
    }

    fn rps(&self) -> f64 {
        self.requests() as f64 / self.secs
    }

    fn cpu_per_request(&self) -> f64 {
        self.cpu / self.requests() as f64
    }

    fn cpu_with_cleanup_per_request(&self) -> Option<f64> {
        self.cpu_with_cleanup.map(|c| c / self.requests() as f64)
    }
}

/// `conns` keep-alive connections send requests to `port` for `duration`,
/// each with the next key of `cursor`'s rotation.
async fn load(
    port: u16,
    keys: &Arc<Vec<HeaderValue>>,
    cursor: &Arc<AtomicUsize>,
    conns: usize,
    duration: Duration,
) -> (u64, u64, f64) {
    let uri: hyper::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..conns)
        .map(|_| {
            let (uri, keys, cursor) = (uri.clone(), Arc::clone(keys), Arc::clone(cursor));
            tokio::spawn(async move {
                // One client per worker: one keep-alive connection each.
                let client = Client::builder(TokioExecutor::new())
                    .pool_max_idle_per_host(1)
                    .build_http::<Empty<Bytes>>();
                let (mut ok, mut other) = (0u64, 0u64);
                while Instant::now() < deadline {
                    let key = keys[cursor.fetch_add(1, Relaxed) % KEYS].clone();
                    let req = Request::get(uri.clone())
                        .header(HEADER, key)
                        .body(Empty::new())
                        .unwrap();
                    let res = tokio::time::timeout(REQUEST_TIMEOUT, async {
                        let res = client.request(req).await.expect("request failed");
                        let status = res.status();
                        let _ = res.into_body().collect().await;
                        status
                    })
                    .await
                    .expect("the server did not answer within the timeout");
                    if res.is_success() {
                        ok += 1;
                    } else {
                        other += 1;
                    }
                }
                (ok, other)
            })
        })
        .collect();
    let (mut ok, mut other) = (0, 0);
    for w in workers {
        let (o, x) = w.await.unwrap();
        ok += o;
        other += x;
    }
    (ok, other, started.elapsed().as_secs_f64())
}

/// The CPU the servers share; the client runs on the other.
const SERVER_CPU: usize = 0;
const CLIENT_CPU: usize = 1;

/// Pin this process (the client: its threads start after this) to
/// `CLIENT_CPU`, when the machine has two CPUs and `taskset` runs.
fn pin_client() -> bool {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpus >= 2
        && Command::new("taskset")
            .args([
                "-p",
                "-c",
                &CLIENT_CPU.to_string(),
                &std::process::id().to_string(),
            ])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// A setting from the environment, or its default.
fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of `v` with its 10th and 90th percentiles: on a shared
/// machine a round's lowest and highest are a neighbour's doing.
fn spread(v: &[f64]) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    format!("{:.3} ({:.2}–{:.2})", at(0.5), at(0.1), at(0.9))
}

fn main() {
    if let Ok(name) = std::env::var(SERVE_ENV) {
        let arm = Arm::from_name(&name).unwrap_or_else(|| panic!("no arm named {name:?}"));
        return serve(arm);
    }
    let conns: usize = setting("HTTP_KEYS_BENCH_CONNS", 32);
    let duration = Duration::from_millis(setting("HTTP_KEYS_BENCH_MS", 2000));
    let rounds: usize = setting("HTTP_KEYS_BENCH_ROUNDS", 21).max(1);

    let keys: Arc<Vec<HeaderValue>> = Arc::new(
        (0..KEYS)
            .map(|i| HeaderValue::from_str(&format!("client-{i:06}")).unwrap())
            .collect(),
    );
    let pinned = pin_client();
    if !pinned {
        println!("NOTICE: not pinned (taskset or a second CPU missing): servers and client share every CPU");
    }
    let servers: Vec<Server> = ARMS
        .into_iter()
        .map(|arm| Server::start(arm, pinned.then_some(SERVER_CPU)))
        .collect();
    let cursors: Vec<Arc<AtomicUsize>> = ARMS.iter().map(|_| Arc::default()).collect();
    println!(
        "servers: {}",
        servers
            .iter()
            .map(|s| format!("{} pid {}", s.arm.name(), s.child.id()))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // runs[arm][round]
    let mut runs: Vec<Vec<Run>> = ARMS.iter().map(|_| Vec::new()).collect();
    // Each arm's CPU at the start of its latest load, for the figure with the cleanup.
    let mut last_start: Vec<Option<Cpu>> = ARMS.iter().map(|_| None).collect();
    rt.block_on(async {
        // The three loads at once, one per server.
        let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
        let (keys, cursors) = (&keys, &cursors);
        let loads = |duration| {
            let ports = ports.clone();
            async move {
                let (o, g, n) = tokio::join!(
                    load(ports[0], keys, &cursors[0], conns, duration),
                    load(ports[1], keys, &cursors[1], conns, duration),
                    load(ports[2], keys, &cursors[2], conns, duration),
                );
                [o, g, n]
            }
        };
        // Every key seen once by every server, unmeasured.
        let mut seen = [0u64; 3];
        while seen.iter().any(|&s| s < KEYS as u64) {
            for (i, (ok, other, _)) in loads(duration).await.into_iter().enumerate() {
                seen[i] += ok + other;
            }
        }
        for round in 0..rounds {
            let before: Vec<Cpu> = servers.iter().map(Server::cpu).collect();
            for i in 0..ARMS.len() {
                if let (Some(start), Some(prev)) = (&last_start[i], runs[i].last_mut()) {
                    prev.cpu_with_cleanup = Some(start.until(&before[i]));
                }
            }
            let results = loads(duration).await;
            for (i, (before, (ok, other, secs))) in before.into_iter().zip(results).enumerate() {
                let cpu = before.until(&servers[i].cpu());
                last_start[i] = Some(before);
                runs[i].push(Run {
                    ok,
                    other,
                    secs,
                    cpu,
                    cpu_with_cleanup: None,
                });
            }
            print_round(round, &runs);
        }
    });

    let rounds_with = |f: &dyn Fn(&Run, &Run) -> f64, a: usize, b: usize| -> Vec<f64> {
        runs[a].iter().zip(&runs[b]).map(|(x, y)| f(x, y)).collect()
    };
    let rps = |x: &Run, y: &Run| x.rps() / y.rps();
    let cpu = |x: &Run, y: &Run| x.cpu_per_request() / y.cpu_per_request();
    let cpu_cleanup = |x: &Run, y: &Run| match (
        x.cpu_with_cleanup_per_request(),
        y.cpu_with_cleanup_per_request(),
    ) {
        (Some(a), Some(b)) => a / b,
        _ => f64::NAN,
    };
    let cleanup_rounds = |a: usize, b: usize| -> Vec<f64> {
        rounds_with(&cpu_cleanup, a, b)
            .into_iter()
            .filter(|x| !x.is_nan())
            .collect()
    };
    let (ours, gov, none) = (0, 1, 2);

    println!(
        "\n{KEYS} keys in rotation, {conns} connections, {duration:?} per run, {rounds} rounds, \
         loopback, the servers side by side {}",
        if pinned {
            "on one CPU, the client on the other"
        } else {
            "unpinned"
        }
    );
    println!("median over rounds (10th–90th percentile of rounds)\n");
    println!("| arm | requests/s | server CPU per request | with the cleanup | a key comes back after | other than 2xx |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, arm) in ARMS.iter().enumerate() {
        let r = &runs[i];
        let rps = median(r.iter().map(Run::rps).collect());
        println!(
            "| {} | {:.0} | {:.1} µs | {} | {:.2} s | {} |",
            arm.label(),
            rps,
            median(r.iter().map(|x| x.cpu_per_request() * 1e6).collect()),
            {
                let c: Vec<f64> = r
                    .iter()
                    .filter_map(Run::cpu_with_cleanup_per_request)
                    .map(|c| c * 1e6)
                    .collect();
                if c.is_empty() {
                    "–".to_owned()
                } else {
                    format!("{:.1} µs", median(c))
                }
            },
            KEYS as f64 / rps,
            r.iter().map(|x| x.other).sum::<u64>(),
        );
    }
    println!();
    println!("| ratio | requests/s | server CPU per request | with the cleanup |");
    println!("|---|---:|---:|---:|");
    for (label, a, b) in [
        ("ours / governor", ours, gov),
        ("ours / none", ours, none),
        ("governor / none", gov, none),
    ] {
        let c = cleanup_rounds(a, b);
        println!(
            "| {label} | {} | {} | {} |",
            spread(&rounds_with(&rps, a, b)),
            spread(&rounds_with(&cpu, a, b)),
            if c.is_empty() {
                "–".to_owned()
            } else {
                spread(&c)
            },
        );
    }
    let med = |f: &dyn Fn(&Run, &Run) -> f64, a, b| median(rounds_with(f, a, b));
    println!(
        "\nmany keys: ours/governor rps {:.3} (median of {rounds} rounds), server CPU per request {:.3}; \
         ours/none rps {:.3}, CPU {:.3}; governor/none rps {:.3}, CPU {:.3}",
        med(&rps, ours, gov),
        med(&cpu, ours, gov),
        med(&rps, ours, none),
        med(&cpu, ours, none),
        med(&rps, gov, none),
        med(&cpu, gov, none),
    );
    let fallbacks = TICK_FALLBACKS.load(Relaxed);
    if fallbacks > 0 {
        println!(
            "({fallbacks} CPU figures from utime + stime, in 10 ms ticks: a server thread ended)"
        );
    }
    let rejected: u64 = runs.iter().flatten().map(|r| r.other).sum();
    if rejected > 0 {
        println!("WARNING: {rejected} responses other than 2xx: not every request was allowed");
    }
    drop(servers);
}

/// One line per round: each arm's rate and CPU per request, and the round's ratios.
fn print_round(round: usize, runs: &[Vec<Run>]) {
    let last = |i: usize| runs[i].last().expect("a run this round");
    let (o, g, n) = (last(0), last(1), last(2));
    let mut line = format!(
        "round {:>2}: rps ours {:.0}, governor {:.0}, none {:.0}; CPU/request ours {:.1} µs, governor {:.1} µs, none {:.1} µs; \
         ours/governor rps {:.3}, CPU {:.3}",
        round + 1,
        o.rps(),
        g.rps(),
        n.rps(),
        o.cpu_per_request() * 1e6,
        g.cpu_per_request() * 1e6,
        n.cpu_per_request() * 1e6,
        o.rps() / g.rps(),
        o.cpu_per_request() / g.cpu_per_request(),
    );
    for (run, arm) in [o, g, n].into_iter().zip(ARMS) {
        let back = Duration::from_secs_f64(KEYS as f64 / run.rps());
        if back < IDLE_AFTER {
            line += &format!(
                "; WARNING: {} keys came back after {back:.2?}, within their window",
                arm.name()
            );
        }
        if run.other > 0 {
            line += &format!("; {}: {} responses other than 2xx", arm.name(), run.other);
        }
    }
    println!("{line}");
}

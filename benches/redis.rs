//! The Redis store under load: decisions per second and latency with 1, 16 and 64
//! concurrent callers, and an abusive key with and without the local deny cache.
//! Round trips per decision are counted by Redis itself (`INFO commandstats`,
//! EVALSHA calls before and after each row). Then decisions during an outage
//! (a Redis that accepts connections and never answers, and nothing
//! listening), with the circuit breaker on and off.
//!
//! Runs against a private `redis-server` (or `$REDIS_SERVER_BIN`, e.g.
//! `valkey-server`) on an ephemeral port when the binary is
//! installed (so no other client's commands pollute the counts), else against
//! `REDIS_URL` (default redis://127.0.0.1:6379); skips with a notice when neither
//! answers.
//!
//! ```text
//! cargo bench --features redis --bench redis
//! ```

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_sliding_window::redis::redis::{self, aio::MultiplexedConnection};
use tower_sliding_window::redis::CircuitBreaker;
use tower_sliding_window::{FailurePolicy, Policy, RedisStore, Store};

const ROW_DURATION: Duration = Duration::from_secs(2);
/// Each outage row: long enough for the breaker's first probes (100 and
/// 200 ms cool-downs), short because with the breaker off every decision
/// waits out the timeout.
const OUTAGE_ROW_DURATION: Duration = Duration::from_secs(1);
const OUTAGE_CALLERS: usize = 16;
const CALLERS: [usize; 3] = [1, 16, 64];
const SLOW_LINK: &str = "distinct keys, 1 ms link each way";

struct Row {
    scenario: &'static str,
    callers: usize,
    decisions: u64,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    evalsha_per_decision: f64,
    store_round_trips_per_decision: f64,
    allowed_share: f64,
    /// CPU time per decision: Redis' own (INFO cpu) and this process'.
    redis_cpu_us: f64,
    client_cpu_us: f64,
}

/// One section of `INFO` (empty when Redis does not answer).
async fn info(conn: &mut MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap_or_default()
}

/// CPU seconds (user + system) Redis has used.
async fn redis_cpu(conn: &mut MultiplexedConnection) -> f64 {
    info(conn, "cpu")
        .await
        .lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys").then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// CPU seconds (user + system) this process has used (Linux; 0 elsewhere).
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at field 3.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15, in clock ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// Counters sampled before a row.
struct Sample {
    evalsha: u64,
    redis_cpu: f64,
    own_cpu: f64,
}

async fn sample(admin: &mut MultiplexedConnection) -> Sample {
    Sample {
        evalsha: evalsha_calls(admin).await,
        redis_cpu: redis_cpu(admin).await,
        own_cpu: own_cpu(),
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn connect(url: &str) -> Option<MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    let attempt = async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .ok()?;
        Some(conn)
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
}

/// The server binary to start: `redis-server`, or `$REDIS_SERVER_BIN`
/// (`REDIS_SERVER_BIN=valkey-server` measures Valkey).
fn server_binary() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into())
}

/// A private redis-server, or `None` when the binary is missing.
async fn private_server() -> Option<(Server, String)> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new(server_binary())
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = Server(child);
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if connect(&url).await.is_some() {
            return Some((server, url));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

async fn evalsha_calls(conn: &mut MultiplexedConnection) -> u64 {
    info(conn, "commandstats")
        .await
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

fn store(url: &str, policy: Policy, deny_cache: bool, prefix: &str) -> RedisStore {
    RedisStore::builder(policy, FailurePolicy::Closed)
        .url(url)
        // Generous: a bench must measure, not fail open.
        .timeout(Duration::from_secs(2))
        .deny_cache(if deny_cache {
            RedisStore::DEFAULT_DENY_CACHE_CAPACITY
        } else {
            0
        })
        .prefix(prefix)
        .build()
        .expect("store builds")
}

/// `callers` tasks checking as fast as they can for [`ROW_DURATION`]; `abusive`
/// sends every check to one over-limit key, otherwise keys spread over 10 000.
async fn row(
    scenario: &'static str,
    url: &str,
    admin: &mut MultiplexedConnection,
    callers: usize,
    abusive: bool,
    deny_cache: bool,
) -> Row {
    let policy = if abusive {
        Policy::per(100, Duration::from_secs(60)).unwrap()
    } else {
        Policy::per(1_000_000, Duration::from_secs(60)).unwrap()
    };
    let prefix = format!("tswbench:{scenario}:{callers}:");
    let store = store(url, policy, deny_cache, &prefix);
    store.warm_up().await.expect("Redis answers");
    if abusive {
        // Push the key over its limit before measuring.
        for _ in 0..101 {
            let _ = store.check_n(&"abuser".to_owned(), 1).await;
        }
    }
    let stats_before = store.stats();
    let before = sample(admin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let store = store.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(100_000);
                let mut allowed = 0u64;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = if abusive {
                        "abuser".to_owned()
                    } else {
                        format!("user-{}", (caller as u64 * 7919 + i) % 10_000)
                    };
                    i += 1;
                    let t = Instant::now();
                    let d = store.check_n(&key, 1).await.expect("decision");
                    latencies.push(t.elapsed());
                    allowed += d.is_allowed() as u64;
                }
                (latencies, allowed)
            })
        })
        .collect();
    tokio::time::sleep(ROW_DURATION).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    let mut allowed = 0;
    for task in tasks {
        let (l, a) = task.await.expect("caller task");
        latencies.extend(l);
        allowed += a;
    }
    let elapsed = started.elapsed();
    let after = sample(admin).await;
    let evalsha = after.evalsha - before.evalsha;
    let stats = store.stats();
    latencies.sort_unstable();
    let decisions = latencies.len() as u64;
    let pct = |p: f64| latencies[((decisions as f64 - 1.0) * p) as usize];
    Row {
        scenario,
        callers,
        decisions,
        per_sec: decisions as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        evalsha_per_decision: evalsha as f64 / decisions as f64,
        store_round_trips_per_decision: (stats.round_trips - stats_before.round_trips) as f64
            / decisions as f64,
        allowed_share: allowed as f64 / decisions as f64,
        redis_cpu_us: (after.redis_cpu - before.redis_cpu) * 1e6 / decisions as f64,
        client_cpu_us: (after.own_cpu - before.own_cpu) * 1e6 / decisions as f64,
    }
}

/// The peer: the same script through a bare `redis` crate multiplexed connection
/// (no store, no timeout, no deny cache), the ceiling any client reaches here.
async fn raw_row(url: &str, admin: &mut MultiplexedConnection, callers: usize) -> Row {
    let client = redis::Client::open(url).expect("url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let script = redis::Script::new(include_str!("../src/redis/check.lua"));
    let before = sample(admin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (mut conn, script, stop) = (conn.clone(), script.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(100_000);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!(
                        "tswbench:raw:{{user-{}}}",
                        (caller as u64 * 7919 + i) % 10_000
                    );
                    i += 1;
                    let t = Instant::now();
                    let reply: Vec<i64> = script
                        .key(key)
                        .arg(1_000_000)
                        .arg(15)
                        .arg(4_000_000)
                        .arg(1)
                        .arg(0)
                        .invoke_async(&mut conn)
                        .await
                        .expect("script");
                    latencies.push(t.elapsed());
                    assert_eq!(reply[0], 1);
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(ROW_DURATION).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("caller task"));
    }
    let elapsed = started.elapsed();
    let after = sample(admin).await;
    let evalsha = after.evalsha - before.evalsha;
    latencies.sort_unstable();
    let decisions = latencies.len() as u64;
    let pct = |p: f64| latencies[((decisions as f64 - 1.0) * p) as usize];
    Row {
        scenario: "peer: bare redis-crate EVALSHA",
        callers,
        decisions,
        per_sec: decisions as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        evalsha_per_decision: evalsha as f64 / decisions as f64,
        store_round_trips_per_decision: 1.0,
        allowed_share: 1.0,
        redis_cpu_us: (after.redis_cpu - before.redis_cpu) * 1e6 / decisions as f64,
        client_cpu_us: (after.own_cpu - before.own_cpu) * 1e6 / decisions as f64,
    }
}

/// A loopback TCP proxy that holds every chunk for `delay` in each direction,
/// emulating a network link (tokio's timer rounds the delay up to whole
/// milliseconds). Order is kept and chunks in flight overlap, as on a real link,
/// so a pipelining client keeps many requests in flight.
async fn delay_proxy(upstream: String, delay: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind proxy");
    let addr = listener.local_addr().expect("proxy addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(delayed_pipe(client_read, server_write, delay));
            tokio::spawn(delayed_pipe(server_read, client_write, delay));
        }
    });
    format!("redis://{addr}")
}

async fn delayed_pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0
            || tx
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
        {
            break;
        }
    }
}

/// A loopback address that accepts connections and never answers (reads and
/// drops what it is sent, keeps the socket open): a stalled or partitioned
/// Redis, where every request waits out the timeout.
async fn black_hole() -> String {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind black hole");
    let addr = listener.local_addr().expect("black hole addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                while let Ok(1..) = socket.read(&mut buf).await {}
                std::future::pending::<()>().await;
            });
        }
    });
    format!("redis://{addr}")
}

/// An address nothing listens on (bound once, then released).
fn nothing_listening() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port();
    format!("redis://127.0.0.1:{port}")
}

struct OutageRow {
    outage: &'static str,
    breaker: bool,
    decisions: u64,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// Decision scripts the store sent toward Redis (each failed).
    sent: u64,
}

/// [`OUTAGE_CALLERS`] tasks deciding distinct keys as fast as they can for
/// [`OUTAGE_ROW_DURATION`] against a Redis that is away, failing open with
/// the default timeout (50 ms), the default breaker or none.
async fn outage_row(outage: &'static str, url: &str, breaker: bool) -> OutageRow {
    let store = RedisStore::builder(
        Policy::per(1_000_000, Duration::from_secs(60)).unwrap(),
        FailurePolicy::Open,
    )
    .url(url)
    .circuit_breaker(if breaker {
        CircuitBreaker::default()
    } else {
        CircuitBreaker::OFF
    })
    .prefix(format!("tswbench:outage:{breaker}:"))
    .build()
    .expect("store builds");
    let started = Instant::now();
    let tasks: Vec<_> = (0..OUTAGE_CALLERS)
        .map(|caller| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 20);
                let mut i = 0u64;
                // Each caller stops by itself: an open breaker answers at once,
                // so these loops only yield when asked to.
                while started.elapsed() < OUTAGE_ROW_DURATION {
                    let key = format!("user-{}", (caller as u64 * 7919 + i) % 10_000);
                    i += 1;
                    let t = Instant::now();
                    let d = store.check_n(&key, 1).await.expect("failing open");
                    latencies.push(t.elapsed());
                    assert!(d.is_allowed());
                    if i % 256 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("caller task"));
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let decisions = latencies.len() as u64;
    let pct = |p: f64| latencies[((decisions as f64 - 1.0) * p) as usize];
    OutageRow {
        outage,
        breaker,
        decisions,
        per_sec: decisions as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        sent: store.stats().round_trips,
    }
}

async fn outage_rows() {
    let stalled = black_hole().await;
    let refused = nothing_listening();
    let mut rows = Vec::new();
    for (outage, url) in [
        ("stalled (accepts, never answers)", &stalled),
        ("nothing listening (refused)", &refused),
    ] {
        for breaker in [true, false] {
            rows.push(outage_row(outage, url, breaker).await);
        }
    }
    println!(
        "\nDuring an outage: {OUTAGE_CALLERS} callers failing open, timeout 50 ms, \
         {OUTAGE_ROW_DURATION:?} per row\n"
    );
    println!("| outage | circuit breaker | decisions/s | p50 | p99 | sent to Redis |");
    println!("|---|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {} | {} | {} of {} |",
            r.outage,
            if r.breaker { "default" } else { "off" },
            r.per_sec,
            fine(r.p50),
            fine(r.p99),
            r.sent,
            r.decisions
        );
    }
    let per_sec = |outage: &str, breaker: bool| {
        rows.iter()
            .find(|r| r.outage.starts_with(outage) && r.breaker == breaker)
            .map_or(0.0, |r| r.per_sec)
    };
    println!(
        "\nstalled Redis, breaker on / off: {:.0}×",
        per_sec("stalled", true) / per_sec("stalled", false)
    );
}

/// A latency in ns below a microsecond (the open breaker's answers), else in µs.
fn fine(d: Duration) -> String {
    if d < Duration::from_micros(1) {
        format!("{} ns", d.as_nanos())
    } else {
        us(d)
    }
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

async fn run() {
    let (_server, url) = match private_server().await {
        Some((server, url)) => (Some(server), url),
        None => (
            None,
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
        ),
    };
    let Some(mut admin) = connect(&url).await else {
        eprintln!("SKIPPED: benches/redis.rs: no redis-server binary and no Redis at {url}");
        // The outage rows need no Redis.
        outage_rows().await;
        return;
    };
    let where_ = if _server.is_some() {
        format!("a private {}", server_binary())
    } else {
        url.clone()
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "Redis store benchmark against {where_}, {ROW_DURATION:?} per row, {cores} cores, load average {}\n",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );

    let mut rows = Vec::new();
    for callers in CALLERS {
        rows.push(row("distinct keys", &url, &mut admin, callers, false, true).await);
    }
    for callers in CALLERS {
        rows.push(raw_row(&url, &mut admin, callers).await);
    }
    let upstream = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let slow_url = delay_proxy(upstream, Duration::from_millis(1)).await;
    for callers in CALLERS {
        rows.push(row(SLOW_LINK, &slow_url, &mut admin, callers, false, true).await);
    }
    for callers in CALLERS {
        rows.push(
            row(
                "abusive key, no deny cache",
                &url,
                &mut admin,
                callers,
                true,
                false,
            )
            .await,
        );
    }
    for callers in CALLERS {
        rows.push(
            row(
                "abusive key, deny cache",
                &url,
                &mut admin,
                callers,
                true,
                true,
            )
            .await,
        );
    }

    println!(
        "| scenario | callers | decisions/s | p50 | p99 | EVALSHA per decision | Redis CPU per decision | client CPU per decision | allowed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {} | {} | {:.3} | {:.1} µs | {:.1} µs | {:.1}% |",
            r.scenario,
            r.callers,
            r.per_sec,
            us(r.p50),
            us(r.p99),
            r.evalsha_per_decision,
            r.redis_cpu_us,
            r.client_cpu_us,
            r.allowed_share * 100.0
        );
        // The store's own count must agree with Redis' (nothing else runs there).
        if _server.is_some() && r.decisions > 0 {
            let diff = (r.evalsha_per_decision - r.store_round_trips_per_decision).abs();
            if diff > 0.01 {
                println!(
                    "  (store counted {:.3} round trips per decision)",
                    r.store_round_trips_per_decision
                );
            }
        }
    }
    let per_sec = |scenario: &str, callers: usize| {
        rows.iter()
            .find(|r| r.scenario == scenario && r.callers == callers)
            .map_or(0.0, |r| r.per_sec)
    };
    let ratio = per_sec("distinct keys", 64) / per_sec("distinct keys", 1);
    println!("\nthroughput 64 callers / 1 caller (distinct keys): {ratio:.1}× (target ≥ 5×)");
    println!(
        "same over the emulated 1 ms link: {:.1}×",
        per_sec(SLOW_LINK, 64) / per_sec(SLOW_LINK, 1)
    );
    let peer = "peer: bare redis-crate EVALSHA";
    println!(
        "same for the bare client: {:.1}×; store / bare client at 64 callers: {:.2}",
        per_sec(peer, 64) / per_sec(peer, 1),
        per_sec("distinct keys", 64) / per_sec(peer, 64)
    );
    let cache_gain =
        per_sec("abusive key, deny cache", 64) / per_sec("abusive key, no deny cache", 64);
    println!("abusive key at 64 callers, deny cache on / off: {cache_gain:.1}×");

    outage_rows().await;
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run());
}

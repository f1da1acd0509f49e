//! The Redis store under load: decisions per second and latency with 1, 16 and 64
//! concurrent callers on 100 000 distinct keys, and an abusive key with and
//! without the local deny cache. Round trips per decision are counted by Redis
//! itself (`INFO commandstats`, EVALSHA calls before and after each row), and
//! Redis' CPU per decision from `INFO cpu`. Then decisions during an outage
//! (a Redis that accepts connections and never answers, and nothing
//! listening), with the circuit breaker on and off. Last, leases: a hot key
//! under its limit (5 000 a minute; three instances, 50 requests a second
//! each) and over it, and 100 000 distinct keys, with leases on and off,
//! beside a GCRA Lua script and the floor of any script (`support/gcra.lua`,
//! `support/floor.lua`); the run ends with one line on the hot key.
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
use tower_sliding_window::redis::{CircuitBreaker, Leases};
use tower_sliding_window::{FailurePolicy, Policy, RedisStore, Store};

const ROW_DURATION: Duration = Duration::from_secs(2);
/// Each outage row: long enough for the breaker's first probes (100 and
/// 200 ms cool-downs), short because with the breaker off every decision
/// waits out the timeout.
const OUTAGE_ROW_DURATION: Duration = Duration::from_secs(1);
const OUTAGE_CALLERS: usize = 16;
const CALLERS: [usize; 3] = [1, 16, 64];
const SLOW_LINK: &str = "distinct keys, 1 ms link each way";
/// Keys the distinct-key rows spread over.
const DISTINCT_KEYS: u64 = 100_000;
/// The hot key's policy and pace: 5 000 a minute, three instances checking
/// 50 times a second each, for long enough that the ramp-up of leases is a
/// small part of the row but the key stays under its limit (3 000 decisions).
const HOT_LIMIT: u32 = 5_000;
const HOT_WINDOW: Duration = Duration::from_secs(60);
const HOT_INSTANCES: usize = 3;
const HOT_EVERY: Duration = Duration::from_millis(20);
const HOT_ROW_DURATION: Duration = Duration::from_secs(20);
/// The peer on the hot key: its figures per decision need no long row.
const HOT_PEER_DURATION: Duration = Duration::from_secs(5);
/// The hot key over its limit: the same pace against 500 per 6 s (15
/// buckets of 400 ms), three times what the limit admits.
const OVER_LIMIT: u32 = 500;
const OVER_WINDOW: Duration = Duration::from_secs(6);
const OVER_ROW_DURATION: Duration = Duration::from_secs(15);
const GCRA_SCRIPT: &str = include_str!("support/gcra.lua");
const FLOOR_SCRIPT: &str = include_str!("support/floor.lua");
const CHECK_SCRIPT: &str = include_str!("../src/redis/check.lua");
/// Rounds of the distinct-key arms, in turn: the machine's speed drifts.
const DISTINCT_ROUNDS: usize = 3;

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

fn store(url: &str, policy: Policy, deny_cache: bool, leases: bool, prefix: &str) -> RedisStore {
    let builder = RedisStore::builder(policy, FailurePolicy::Closed)
        .url(url)
        // Generous: a bench must measure, not fail open.
        .timeout(Duration::from_secs(2))
        .deny_cache(if deny_cache {
            RedisStore::DEFAULT_DENY_CACHE_CAPACITY
        } else {
            0
        })
        .prefix(prefix);
    if leases {
        builder.leases(Leases::new()).build().expect("store builds")
    } else {
        builder.build().expect("store builds")
    }
}

/// `callers` tasks checking as fast as they can for [`ROW_DURATION`]; `abusive`
/// sends every check to one over-limit key, otherwise keys spread over
/// [`DISTINCT_KEYS`].
async fn row(
    scenario: &'static str,
    url: &str,
    admin: &mut MultiplexedConnection,
    callers: usize,
    abusive: bool,
    deny_cache: bool,
    leases: bool,
) -> Row {
    let policy = if abusive {
        Policy::per(100, Duration::from_secs(60)).unwrap()
    } else {
        Policy::per(1_000_000, Duration::from_secs(60)).unwrap()
    };
    let prefix = format!("tswbench:{scenario}:{callers}:");
    let store = store(url, policy, deny_cache, leases, &prefix);
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
                        format!("user-{}", (caller as u64 * 7919 + i) % DISTINCT_KEYS)
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

/// A script run through a bare `redis` crate multiplexed connection (no
/// store, no timeout, no deny cache): the store's own script (the ceiling any
/// client of it reaches here), a GCRA script, or the floor of any script.
#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Ours,
    Gcra,
    Floor,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Ours => "peer: bare redis-crate EVALSHA",
            Peer::Gcra => "peer: GCRA script",
            Peer::Floor => "floor: TIME, GET, SET PX",
        }
    }

    fn script(self) -> redis::Script {
        redis::Script::new(match self {
            Peer::Ours => CHECK_SCRIPT,
            Peer::Gcra => GCRA_SCRIPT,
            Peer::Floor => FLOOR_SCRIPT,
        })
    }

    /// One decision of `key`: the policy of the distinct-key rows (a million
    /// a minute), or `limit` per `window` for the hot key.
    fn invocation(
        self,
        script: &redis::Script,
        key: String,
        limit: u32,
        window: Duration,
    ) -> redis::ScriptInvocation<'_> {
        let mut invocation = script.key(key);
        match self {
            // 15 buckets of the window, strict.
            Peer::Ours => invocation
                .arg(limit)
                .arg(15)
                .arg(window.as_micros() as u64 / 15)
                .arg(1)
                .arg(0),
            Peer::Gcra => invocation.arg(limit).arg(window.as_micros() as u64).arg(1),
            Peer::Floor => &mut invocation,
        };
        invocation
    }
}

/// `callers` tasks running `peer`'s script on distinct keys as fast as they can.
async fn raw_row(url: &str, admin: &mut MultiplexedConnection, callers: usize, peer: Peer) -> Row {
    let client = redis::Client::open(url).expect("url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let script = peer.script();
    let before = sample(admin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tag = match peer {
        Peer::Ours => "raw",
        Peer::Gcra => "gcra",
        Peer::Floor => "floor",
    };
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (mut conn, script, stop) = (conn.clone(), script.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(100_000);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Keys as long as the store's (a prefix, a hash tag).
                    let key = format!(
                        "tswbench:{tag}:{callers}:{{user-{}}}",
                        (caller as u64 * 7919 + i) % DISTINCT_KEYS
                    );
                    i += 1;
                    let t = Instant::now();
                    let reply: Vec<i64> = peer
                        .invocation(&script, key, 1_000_000, Duration::from_secs(60))
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
        scenario: peer.name(),
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
                    let key = format!("user-{}", (caller as u64 * 7919 + i) % DISTINCT_KEYS);
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
        rows.push(
            row(
                "distinct keys",
                &url,
                &mut admin,
                callers,
                false,
                true,
                false,
            )
            .await,
        );
    }
    for callers in CALLERS {
        rows.push(raw_row(&url, &mut admin, callers, Peer::Ours).await);
    }
    let upstream = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let slow_url = delay_proxy(upstream, Duration::from_millis(1)).await;
    for callers in CALLERS {
        rows.push(
            row(
                SLOW_LINK, &slow_url, &mut admin, callers, false, true, false,
            )
            .await,
        );
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
                false,
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
    lease_rows(&url, &mut admin, _server.is_some()).await;
}

/// One arm on the hot key: decisions, what Redis did for them, and what was
/// admitted.
struct HotRow {
    arm: &'static str,
    decisions: u64,
    per_sec: f64,
    round_trips: u64,
    /// Redis' CPU time per decision, its idle rate taken out.
    redis_cpu_us: f64,
    admitted: u64,
    /// Admissions after which the window ending there held more than the limit.
    windows_over: u64,
    p50: Duration,
    p99: Duration,
}

/// Microseconds since 1970 on the system clock (Redis' `TIME` reads it too
/// when Redis runs on this host).
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Redis' CPU seconds per second of doing nothing (its timers), measured
/// over `span`.
async fn idle_cpu_rate(admin: &mut MultiplexedConnection, span: Duration) -> f64 {
    let before = redis_cpu(admin).await;
    tokio::time::sleep(span).await;
    (redis_cpu(admin).await - before) / span.as_secs_f64()
}

/// Admissions (wall µs, sorted) after which the window of `window` ending
/// there holds more than `limit`.
fn windows_over(mut admitted: Vec<u64>, window: Duration, limit: u32) -> u64 {
    admitted.sort_unstable();
    let window_us = window.as_micros() as u64;
    let mut first = 0;
    let mut over = 0;
    for (last, &t) in admitted.iter().enumerate() {
        while t - admitted[first] >= window_us {
            first += 1;
        }
        over += u64::from(last + 1 - first > limit as usize);
    }
    over
}

/// What runs on the hot key: the store (leases on or off), or a peer's script
/// on a bare connection of each instance.
#[derive(Clone, Copy)]
enum HotArm {
    Store { leases: bool },
    Script(Peer),
}

/// [`HOT_INSTANCES`] instances, each checking `key` every [`HOT_EVERY`] for
/// `duration`, under `limit` per `window`.
#[allow(clippy::too_many_arguments)]
async fn hot_row(
    arm_name: &'static str,
    arm: HotArm,
    url: &str,
    admin: &mut MultiplexedConnection,
    idle_rate: f64,
    limit: u32,
    window: Duration,
    duration: Duration,
) -> HotRow {
    let prefix = format!("tswbench:hot:{}:{arm_name}:", std::process::id());
    let policy = Policy::per(limit, window).unwrap();
    let mut stores = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..HOT_INSTANCES {
        match arm {
            HotArm::Store { leases } => {
                let s = store(url, policy.clone(), true, leases, &prefix);
                s.warm_up().await.expect("Redis answers");
                stores.push(s);
            }
            HotArm::Script(_) => {
                let client = redis::Client::open(url).expect("url");
                conns.push(
                    client
                        .get_multiplexed_async_connection()
                        .await
                        .expect("connect"),
                );
            }
        }
    }
    let before = sample(admin).await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..HOT_INSTANCES)
        .map(|i| {
            let store = stores.get(i).cloned();
            let conn = conns.get(i).cloned();
            let key = format!("{prefix}{{hot}}");
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(HOT_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                // The instances' checks interleave, as a fleet's would.
                tokio::time::sleep(HOT_EVERY * i as u32 / HOT_INSTANCES as u32).await;
                let mut latencies = Vec::new();
                let mut admitted = Vec::new();
                let (mut conn, script) = (
                    conn,
                    match arm {
                        HotArm::Script(peer) => Some((peer, peer.script())),
                        HotArm::Store { .. } => None,
                    },
                );
                while started.elapsed() < duration {
                    tick.tick().await;
                    let t = Instant::now();
                    let allowed = match (&store, &mut conn, &script) {
                        (Some(store), _, _) => store
                            .check_n(&"hot", 1)
                            .await
                            .expect("decision")
                            .is_allowed(),
                        (None, Some(conn), Some((peer, script))) => {
                            let reply: Vec<i64> = peer
                                .invocation(script, key.clone(), limit, window)
                                .invoke_async(conn)
                                .await
                                .expect("script");
                            reply[0] == 1
                        }
                        _ => unreachable!("a store or a script"),
                    };
                    latencies.push(t.elapsed());
                    if allowed {
                        admitted.push(wall_us());
                    }
                }
                (latencies, admitted)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut admitted = Vec::new();
    for task in tasks {
        let (l, a) = task.await.expect("hot task");
        latencies.extend(l);
        admitted.extend(a);
    }
    let elapsed = started.elapsed();
    let after = sample(admin).await;
    for s in &stores {
        s.shutdown().await;
    }
    latencies.sort_unstable();
    let decisions = latencies.len() as u64;
    let pct = |p: f64| latencies[((decisions as f64 - 1.0) * p) as usize];
    let busy_cpu =
        (after.redis_cpu - before.redis_cpu - idle_rate * elapsed.as_secs_f64()).max(0.0);
    HotRow {
        arm: arm_name,
        decisions,
        per_sec: decisions as f64 / elapsed.as_secs_f64(),
        round_trips: after.evalsha - before.evalsha,
        redis_cpu_us: busy_cpu * 1e6 / decisions as f64,
        admitted: admitted.len() as u64,
        windows_over: windows_over(admitted, window, limit),
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

fn print_hot_rows(rows: &[HotRow]) {
    println!(
        "| arm | decisions | decisions/s | round trips per decision | Redis CPU per decision | p50 | p99 | admitted | windows over L |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.4} | {:.2} µs | {} | {} | {} | {} |",
            r.arm,
            r.decisions,
            r.per_sec,
            r.round_trips as f64 / r.decisions as f64,
            r.redis_cpu_us,
            fine(r.p50),
            fine(r.p99),
            r.admitted,
            r.windows_over
        );
    }
}

/// Leases on the hot key (under its limit and over it) and on distinct keys,
/// beside a GCRA script and the floor; the run's last line.
async fn lease_rows(url: &str, admin: &mut MultiplexedConnection, private: bool) {
    let idle_rate = idle_cpu_rate(admin, Duration::from_secs(2)).await;
    println!(
        "\nLeases. A hot key under its limit ({HOT_LIMIT} per {HOT_WINDOW:?}): {HOT_INSTANCES} \
         instances (a store and a connection each) checking every {HOT_EVERY:?}, \
         {HOT_ROW_DURATION:?} per store arm, {HOT_PEER_DURATION:?} for the peer; Redis' idle \
         CPU ({:.0} µs a second, measured first) taken out\n",
        idle_rate * 1e6
    );
    let under = [
        hot_row(
            "store, leases off",
            HotArm::Store { leases: false },
            url,
            admin,
            idle_rate,
            HOT_LIMIT,
            HOT_WINDOW,
            HOT_ROW_DURATION,
        )
        .await,
        hot_row(
            "store, leases on",
            HotArm::Store { leases: true },
            url,
            admin,
            idle_rate,
            HOT_LIMIT,
            HOT_WINDOW,
            HOT_ROW_DURATION,
        )
        .await,
        hot_row(
            "GCRA script",
            HotArm::Script(Peer::Gcra),
            url,
            admin,
            idle_rate,
            HOT_LIMIT,
            HOT_WINDOW,
            HOT_PEER_DURATION,
        )
        .await,
    ];
    print_hot_rows(&under);

    println!(
        "\nThe same pace over its limit ({OVER_LIMIT} per {OVER_WINDOW:?}, 15 buckets: three \
         times what it admits), {OVER_ROW_DURATION:?} per arm\n"
    );
    let over = [
        hot_row(
            "store, leases off",
            HotArm::Store { leases: false },
            url,
            admin,
            idle_rate,
            OVER_LIMIT,
            OVER_WINDOW,
            OVER_ROW_DURATION,
        )
        .await,
        hot_row(
            "store, leases on",
            HotArm::Store { leases: true },
            url,
            admin,
            idle_rate,
            OVER_LIMIT,
            OVER_WINDOW,
            OVER_ROW_DURATION,
        )
        .await,
    ];
    print_hot_rows(&over);

    println!(
        "\n{DISTINCT_KEYS} distinct keys, 64 callers, {ROW_DURATION:?} per row; scripts on a \
         bare connection beside the store; {DISTINCT_ROUNDS} rounds of the five arms in turn, \
         the median of each figure\n"
    );
    let mut rounds: Vec<Vec<Row>> = Vec::new();
    for _ in 0..DISTINCT_ROUNDS {
        rounds.push(vec![
            row("store, leases off", url, admin, 64, false, true, false).await,
            row("store, leases on", url, admin, 64, false, true, true).await,
            raw_row(url, admin, 64, Peer::Ours).await,
            raw_row(url, admin, 64, Peer::Gcra).await,
            raw_row(url, admin, 64, Peer::Floor).await,
        ]);
    }
    let median = |arm: usize, figure: fn(&Row) -> f64| {
        let mut values: Vec<f64> = rounds.iter().map(|r| figure(&r[arm])).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!("| arm | decisions/s | round trips per decision | Redis CPU per decision | client CPU per decision |");
    println!("|---|---:|---:|---:|---:|");
    for (arm, r) in rounds[0].iter().enumerate() {
        let round_trips = if private {
            median(arm, |r| r.evalsha_per_decision)
        } else {
            median(arm, |r| r.store_round_trips_per_decision)
        };
        println!(
            "| {} | {:.0} | {:.3} | {:.1} µs | {:.1} µs |",
            r.scenario,
            median(arm, |r| r.per_sec),
            round_trips,
            median(arm, |r| r.redis_cpu_us),
            median(arm, |r| r.client_cpu_us)
        );
    }
    // Ratios within each round (the arms of a round ran within seconds of
    // each other), then their median and range.
    let ratio = |a: usize, b: usize, figure: fn(&Row) -> f64| {
        let mut values: Vec<f64> = rounds
            .iter()
            .map(|r| figure(&r[a]) / figure(&r[b]))
            .collect();
        values.sort_by(f64::total_cmp);
        format!(
            "{:.2}× ({:.2}–{:.2})",
            values[values.len() / 2],
            values[0],
            values[values.len() - 1]
        )
    };
    let cpu = |r: &Row| r.redis_cpu_us;
    println!(
        "\nRedis CPU per decision on distinct keys, median of the rounds' ratios (range): \
         our script / GCRA {}, the floor / GCRA {}, our script / the floor {}; the store / GCRA \
         {} (leases off), {} (on); decisions per second, store / GCRA {} (leases off)",
        ratio(2, 3, cpu),
        ratio(4, 3, cpu),
        ratio(2, 4, cpu),
        ratio(0, 3, cpu),
        ratio(1, 3, cpu),
        ratio(0, 3, |r| r.per_sec)
    );
    let (off, on, gcra) = (&under[0], &under[1], &under[2]);
    println!(
        "hot key under its limit, Redis CPU per decision: leases on / off {:.3}×, on / GCRA {:.3}×",
        on.redis_cpu_us / off.redis_cpu_us,
        on.redis_cpu_us / gcra.redis_cpu_us
    );
    // The share of its decisions each arm admitted: the arms' decisions
    // differ by a few, as their timers do.
    let admitted_share = |on: &HotRow, off: &HotRow| {
        (on.admitted as f64 / on.decisions as f64) * 100.0
            / (off.admitted as f64 / off.decisions as f64)
    };
    println!(
        "hot key over its limit: leases on admitted {:.1}% of the store without leases, {:.3} round trips per decision against {:.3}",
        admitted_share(&over[1], &over[0]),
        over[1].round_trips as f64 / over[1].decisions as f64,
        over[0].round_trips as f64 / over[0].decisions as f64
    );
    println!(
        "leases: {} decisions, {} round trips ({:.4} per decision), windows over L: {}, admitted {:.1}% of the store without leases",
        on.decisions,
        on.round_trips,
        on.round_trips as f64 / on.decisions as f64,
        on.windows_over,
        admitted_share(on, off)
    );
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run());
}

//! Helpers shared by the Redis test binaries: finding the shared Redis,
//! starting a private `redis-server`, unique key prefixes, and the
//! strict-window check both stores are held to.
//!
//! The tests that need Redis are `#[ignore = "..."]`d: a plain `cargo test`
//! passes without Redis and its summary counts them as ignored. Run them with
//! `cargo test --all-features -- --include-ignored`; asked for, a test whose
//! Redis (or `redis-server`) is missing fails, never passes silently.
//! `REQUIRE_REDIS=1` (set by `.ci/run`) also fails a run that leaves them out:
//! see [`assert_included_where_required`].
#![allow(dead_code)]

use ::redis;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn require_redis() -> bool {
    std::env::var("REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

/// Fail the calling test, which needs what is missing. It runs only because it
/// was asked for (`--include-ignored`), so a missing Redis is a failure here.
pub fn unavailable(test: &str, why: &str) -> ! {
    panic!(
        "{test} cannot run: {why}. The Redis tests are #[ignore]d; run them \
         (-- --include-ignored) where a Redis answers at REDIS_URL (default \
         redis://127.0.0.1:6379) and redis-server (or $REDIS_SERVER_BIN) and \
         redis-cli are installed"
    )
}

/// The body of one plain (not ignored) test in each Redis test binary: with
/// `REQUIRE_REDIS=1` the binary must run its ignored tests, so that CI cannot
/// pass with every Redis test left out. libtest tells a test nothing of the
/// run, so this reads the binary's arguments (as `cargo test` passes them).
pub fn assert_included_where_required() {
    let included = std::env::args().any(|a| a == "--include-ignored" || a == "--ignored");
    assert!(
        included || !require_redis(),
        "REQUIRE_REDIS=1, but the Redis tests are #[ignore]d and this run leaves \
         them out: run `cargo test --all-features -- --include-ignored`"
    );
}

/// A plain connection to the shared Redis; fails the test when none answers.
pub async fn shared_redis(test: &str) -> redis::aio::MultiplexedConnection {
    let url = redis_url();
    match connect(&url, Duration::from_secs(2)).await {
        Ok(conn) => conn,
        Err(e) => unavailable(test, &format!("no Redis answers at {url} ({e})")),
    }
}

pub async fn connect(
    url: &str,
    within: Duration,
) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let attempt = async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok::<_, redis::RedisError>(conn)
    };
    match tokio::time::timeout(within, attempt).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    }
}

/// A key prefix no other test (or test run) uses.
pub fn unique_prefix(test: &str) -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("tswtest:{test}:{}:{:x}:", std::process::id(), h.finish())
}

/// A port nothing listens on (bound once, then released).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// A private `redis-server` (or `$REDIS_SERVER_BIN`, e.g. `valkey-server`) on an
/// ephemeral loopback port, never the shared one: fault tests kill, pause and
/// flush it. Killed on drop.
pub struct RedisServer {
    pub port: u16,
    extra_args: Vec<String>,
    child: Option<Child>,
    /// `port` is a TLS port (`--tls-port`) and the plain one is off.
    tls: bool,
}

impl RedisServer {
    /// Start one; fails the test when it cannot (no `redis-server`, say).
    pub async fn start(test: &str) -> RedisServer {
        RedisServer::start_with(test, free_port(), Vec::new()).await
    }

    /// Start one on `port` with extra `redis-server` arguments.
    pub async fn start_with(test: &str, port: u16, extra_args: Vec<String>) -> RedisServer {
        match RedisServer::try_start_with(port, extra_args).await {
            Ok(server) => server,
            Err(e) => unavailable(test, &e),
        }
    }

    /// [`start_with`](Self::start_with), reporting a failure instead of skipping.
    pub async fn try_start_with(port: u16, extra_args: Vec<String>) -> Result<RedisServer, String> {
        let mut server = RedisServer {
            port,
            extra_args,
            child: None,
            tls: false,
        };
        match server.spawn().await {
            Ok(()) => Ok(server),
            Err(e) => Err(format!("cannot start a private Redis: {e}")),
        }
    }

    /// One that serves TLS only, on an ephemeral `--tls-port` (`--port 0`),
    /// with `tls_args` (`--tls-cert-file` and the like); ready once that port
    /// accepts connections. Fails the test when it cannot start, saying why
    /// (a `redis-server` built without TLS exits at once).
    pub async fn start_tls(test: &str, tls_args: Vec<String>) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            extra_args: tls_args,
            child: None,
            tls: true,
        };
        if let Err(e) = server.spawn().await {
            panic!(
                "{test}: cannot start a private TLS redis-server: {e}. Is it built with \
                 TLS (`redis-server --tls-port 0 --port 0` starts, or says it is not)?"
            );
        }
        server
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Whether it answers: PING on a plain port; a TLS port accepting a
    /// connection (the handshake is what the test itself checks).
    async fn ready(&self) -> Result<(), String> {
        if !self.tls {
            return connect(&self.url(), Duration::from_millis(500))
                .await
                .map(drop);
        }
        tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    async fn spawn(&mut self) -> Result<(), String> {
        // `REDIS_SERVER_BIN=valkey-server` runs the fault tests on Valkey.
        let binary = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
        let port = self.port.to_string();
        let ports = if self.tls {
            vec!["--port", "0", "--tls-port", &port]
        } else {
            vec!["--port", &port]
        };
        let child = Command::new(&binary)
            .args(ports)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {binary}: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("{binary} exited at once: {status}"));
            }
            match self.ready().await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("not answering after 5 s: {e}"))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Kill it (SIGKILL, which ends a paused one too) and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stall it: `SIGSTOP`. The kernel still accepts connections and buffers
    /// what clients send; nothing is answered until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Let a paused server go on: `SIGCONT`.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("the private redis-server runs");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }

    /// Start it again on the same port; returns once it answers.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn()
            .await
            .expect("redis-server restarts on its port");
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        connect(&self.url(), Duration::from_secs(2))
            .await
            .expect("private redis-server answers")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A key of the Redis store as its script packs it: a header `<BdI4ddd`
/// (format 3, bucket width in µs, bucket count, newest slot entered, slot of
/// the last conversion or -1, the key's incarnation), then one record
/// `<dI4H` (slot, units, newest admission's offset) per slot holding units,
/// newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedKey {
    pub width_us: u64,
    pub buckets: u32,
    pub newest: u64,
    pub converted: Option<u64>,
    pub incarnation: u64,
    pub slots: Vec<(u64, u32)>,
    /// Each record's newest offset, in the order of `slots`.
    pub offsets: Vec<u16>,
}

impl PackedKey {
    pub fn unpack(bytes: &[u8]) -> PackedKey {
        let f64_at = |i: usize| f64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let u16_at = |i: usize| u16::from_le_bytes(bytes[i..i + 2].try_into().unwrap());
        assert_eq!(bytes[0], 3, "format 3: {bytes:?}");
        assert_eq!((bytes.len() - 37) % 14, 0, "whole records: {bytes:?}");
        let converted = f64_at(21);
        PackedKey {
            width_us: f64_at(1) as u64,
            buckets: u32_at(9),
            newest: f64_at(13) as u64,
            converted: (converted >= 0.0).then_some(converted as u64),
            incarnation: f64_at(29) as u64,
            slots: (37..bytes.len())
                .step_by(14)
                .map(|i| (f64_at(i) as u64, u32_at(i + 8)))
                .collect(),
            offsets: (37..bytes.len())
                .step_by(14)
                .map(|i| u16_at(i + 12))
                .collect(),
        }
    }

    /// Every unit counted, whatever its slot.
    pub fn units(&self) -> u64 {
        self.slots.iter().map(|&(_, c)| u64::from(c)).sum()
    }

    /// The units counted at `slot`.
    pub fn at(&self, slot: u64) -> Option<u32> {
        self.slots
            .iter()
            .find(|&&(s, _)| s == slot)
            .map(|&(_, c)| c)
    }

    /// `key` as it is in Redis now (`None`: no such key).
    pub async fn read(
        conn: &mut redis::aio::MultiplexedConnection,
        key: &[u8],
    ) -> Option<PackedKey> {
        let bytes: Option<Vec<u8>> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
        bytes.map(|b| PackedKey::unpack(&b))
    }

    /// The units `key` holds now (0 for no key).
    pub async fn units_of(conn: &mut redis::aio::MultiplexedConnection, key: &[u8]) -> u64 {
        PackedKey::read(conn, key).await.map_or(0, |k| k.units())
    }
}

/// One admitted check: the slot it was recorded in and its cost.
#[derive(Debug, Clone, Copy)]
pub struct Admitted {
    pub slot: u64,
    pub cost: u32,
}

/// The strict guarantee, slot by slot: every N consecutive slots (which a
/// window always covers; the oldest of the N + 1 it touches counts until its
/// newest admission has left) hold at most `limit` units.
pub fn assert_no_span_over_limit(admitted: &[Admitted], buckets: u32, limit: u32, who: &str) {
    let mut per_slot = std::collections::BTreeMap::<u64, u64>::new();
    for a in admitted {
        *per_slot.entry(a.slot).or_default() += a.cost as u64;
    }
    for &end in per_slot.keys() {
        let start = (end + 1).saturating_sub(buckets as u64);
        let total: u64 = per_slot.range(start..=end).map(|(_, c)| c).sum();
        assert!(
            total <= limit as u64,
            "{who}: {total} units admitted in slots {start}..={end}, limit {limit}"
        );
    }
}

/// A small deterministic generator for traces (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One step of a trace: wait `gap`, then check `cost` units for key `key`.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub gap: Duration,
    pub key: u64,
    pub cost: u32,
}

/// A bursty trace over `keys` keys: mostly back-to-back checks, some short
/// pauses and a few pauses of about a bucket, costs 1..=max_cost.
pub fn bursty_trace(
    seed: u64,
    steps: usize,
    keys: u64,
    max_cost: u32,
    bucket: Duration,
) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    (0..steps)
        .map(|_| {
            let gap = match rng.below(10) {
                0..=5 => Duration::ZERO,
                6..=8 => bucket / 8,
                _ => bucket,
            };
            Step {
                gap,
                key: rng.below(keys),
                cost: 1 + rng.below(max_cost as u64) as u32,
            }
        })
        .collect()
}

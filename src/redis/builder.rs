//! [`RedisStoreBuilder`]: the store's settings, checked once, and the
//! connection, deny cache, breaker and leases they make.

use super::*;

/// Builder for [`RedisStore`]; [`build`](RedisStoreBuilder::build) validates.
#[must_use = "a builder does nothing until `build` makes the store"]
pub struct RedisStoreBuilder {
    policy: Policy,
    failure: FailurePolicy,
    client: Option<Result<Client, RedisError>>,
    /// The URL given to `url` asks for TLS (`rediss://`).
    tls_url: bool,
    connection: Option<Connection>,
    prefix: Option<String>,
    timeout: Duration,
    closed_retry_after: Duration,
    deny_cache_capacity: usize,
    connect_timeout: Duration,
    breaker: CircuitBreaker,
    leases: Option<Leases>,
}

impl fmt::Debug for RedisStoreBuilder {
    /// The settings, without the client or connection (a URL may hold a
    /// password).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("policy", &self.policy)
            .field("failure", &self.failure)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("closed_retry_after", &self.closed_retry_after)
            .field("deny_cache_capacity", &self.deny_cache_capacity)
            .field("connect_timeout", &self.connect_timeout)
            .field("circuit_breaker", &self.breaker)
            .field("leases", &self.leases)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The defaults, for [`RedisStore::builder`].
    pub(super) fn new(policy: Policy, failure: FailurePolicy) -> RedisStoreBuilder {
        RedisStoreBuilder {
            policy,
            failure,
            client: None,
            tls_url: false,
            connection: None,
            prefix: None,
            timeout: RedisStore::DEFAULT_TIMEOUT,
            closed_retry_after: RedisStore::DEFAULT_CLOSED_RETRY_AFTER,
            deny_cache_capacity: RedisStore::DEFAULT_DENY_CACHE_CAPACITY,
            connect_timeout: Duration::from_secs(1),
            breaker: CircuitBreaker::default(),
            leases: None,
        }
    }

    /// The Redis to use, as a URL (`redis://host:port/db`, or
    /// `rediss://host:port/db` over TLS, which needs this crate's `redis-tls`
    /// feature and trusts the [webpki roots](https://docs.rs/webpki-roots):
    /// for a private CA or a client certificate, give a
    /// [`client`](RedisStoreBuilder::client) instead). An invalid URL is
    /// reported by [`build`](RedisStoreBuilder::build):
    /// [`ConfigError::InvalidRedisUrl`], or [`ConfigError::RedisTlsNotEnabled`]
    /// for a `rediss://` URL without the `redis-tls` feature.
    pub fn url(mut self, url: &str) -> Self {
        self.client = Some(Client::open(url));
        let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
        self.tls_url =
            scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys");
        self
    }

    /// The Redis to use, as a `redis` crate client. Over TLS (feature
    /// `redis-tls`) with a private CA or a client certificate, build it with
    /// `redis::Client::build_with_tls` and `redis::TlsCertificates`.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(Ok(client));
        self
    }

    /// Decide over a connection of your own instead of a managed one: any cloneable
    /// `redis` crate async connection. For Redis Cluster, enable the `redis`
    /// crate's `cluster-async` feature in your own `Cargo.toml` and pass a
    /// `redis::cluster_async::ClusterConnection`: every key's data lives under one
    /// hash tag, so each script touches one slot. Reconnecting is then that
    /// connection's business (the cluster connection does it; a bare
    /// `MultiplexedConnection` does not).
    pub fn connection<C>(mut self, connection: C) -> Self
    where
        C: AsyncConnection + Clone + Send + Sync + 'static,
    {
        self.connection = Some(Connection::Custom(Box::new(connection)));
        self
    }

    /// Prefix of every Redis key (default
    /// `tsw:<policy name>:<window µs>:<buckets>:`, the window with three
    /// decimals when it is not a whole number of µs, so policies of other
    /// geometries never share a key; two layers whose policies differ in none
    /// of these, say two routes on the default name with other limits, or a
    /// strict and an interpolated policy, do share one: name them). The limit
    /// is not in it, so a store built afresh with another limit keeps the
    /// counts; a [`reconfigured`](RedisStore::reconfigured) store keeps its
    /// prefix whatever the new policy. It must not contain `{` or `}`: the
    /// key's hash tag follows it. A custom prefix kept across a change of
    /// bucket width meets the old slots: the key records its geometry, and
    /// the first check under another
    /// width converts its counts as [`RedisStore::reconfigured`] describes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Longest wait for Redis per decision, connecting included (default 50 ms).
    /// Past it the [`FailurePolicy`] decides. A decision that timed out may still
    /// be counted by Redis later (the safe side).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The `Retry-After` suggested by a [`StoreError`] when failing closed (default 1 s).
    pub fn closed_retry_after(mut self, retry_after: Duration) -> Self {
        self.closed_retry_after = retry_after;
        self
    }

    /// How many over-limit keys the local deny cache remembers (default
    /// [`RedisStore::DEFAULT_DENY_CACHE_CAPACITY`]; 0 turns it off).
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache_capacity = capacity;
        self
    }

    /// When to stop asking Redis after failures, and for how long (default
    /// [`CircuitBreaker::default`]: open after 5 failures in a row or a
    /// timeout during which Redis decided nothing, cool down 100 ms doubling
    /// up to 2 s; [`CircuitBreaker::OFF`] turns it off). While
    /// it is open, decisions are answered at once per the [`FailurePolicy`]:
    /// see [`CircuitBreaker`].
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Timeout of one connection attempt (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Lease units to this instance (off by default): a check that goes to
    /// Redis may ask for more units than its cost, which this instance then
    /// admits without a round trip until the bucket they were counted in
    /// ends; see [`Leases`] for how much, and [`RedisStore`] for the
    /// guarantee. A hot key costs a small fraction of a round trip per
    /// decision; a cold key (a request now and then) still costs one.
    pub fn leases(mut self, leases: Leases) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Validate and build. Must run inside a tokio runtime; connects lazily (and
    /// starts connecting at once in the background), so it succeeds while Redis
    /// is down.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime);
        }
        let client = match (self.client, self.connection.is_some()) {
            (Some(_), true) => return Err(ConfigError::RedisConnectionConflict),
            (Some(Ok(client)), false) => Some(client),
            (Some(Err(_)), false) if self.tls_url && !cfg!(feature = "redis-tls") => {
                return Err(ConfigError::RedisTlsNotEnabled)
            }
            (Some(Err(e)), false) => {
                return Err(ConfigError::InvalidRedisUrl {
                    source: Box::new(e),
                })
            }
            (None, true) => None,
            (None, false) => return Err(ConfigError::NoRedis),
        };
        if self.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if !self.breaker.is_off() && self.breaker.cool_down().is_zero() {
            return Err(ConfigError::ZeroCoolDown);
        }
        if let Some(leases) = self.leases {
            if leases.share() == 0 {
                return Err(ConfigError::ZeroLeaseShare);
            }
            if leases.keys() == 0 {
                return Err(ConfigError::ZeroLeaseKeys);
            }
        }
        let fallback = match &self.failure {
            FailurePolicy::Fallback(policy) => Some(Arc::new(Limiter::new(policy.clone())?)),
            _ => None,
        };
        let policy = self.policy;
        let geometry = Geometry::of(&policy)?;
        let buckets = geometry.buckets;
        let prefix = match self.prefix {
            Some(prefix) => prefix,
            None => {
                // The window in µs, with its nanoseconds when it has any: windows
                // a fraction of a µs apart can round to other bucket widths.
                let window = policy.window();
                let sub_us = window.subsec_nanos() % 1000;
                let fraction = if sub_us == 0 {
                    String::new()
                } else {
                    format!(".{sub_us:03}")
                };
                // Not the limit: a store built with another limit (an
                // instance restarted after a change of tier) keeps the keys.
                format!(
                    "tsw:{}:{}{}:{}:",
                    policy.name(),
                    window.as_micros(),
                    fraction,
                    buckets
                )
            }
        };
        if prefix.contains(['{', '}']) {
            return Err(ConfigError::InvalidRedisPrefix { prefix });
        }
        let conn = match (client, self.connection) {
            (Some(client), _) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    // The store's own timeout bounds every call. The crate's
                    // default (500 ms) would cut a longer timeout short, and as
                    // an error reply it would not count toward replacing a
                    // connection gone silent.
                    .set_response_timeout(None)
                    // One attempt per connection: the manager's own retry loop
                    // would hold every decision until the timeout while Redis is
                    // away and hide why (a refused connection read as a
                    // timeout). A failed attempt is retried by the next
                    // decision (see `invoke`).
                    .set_number_of_retries(0)
                    // Pipelined decisions from many concurrent requests queue here.
                    .set_pipeline_buffer_size(1024);
                Connection::managed(client, config).map_err(|e| ConfigError::InvalidRedisUrl {
                    source: Box::new(e),
                })?
            }
            (None, Some(connection)) => connection,
            (None, None) => return Err(ConfigError::NoRedis),
        };
        let events = Events::new(policy.name());
        let inner = Inner {
            deny_cache: new_deny_cache(self.deny_cache_capacity, &policy),
            deny_cache_capacity: self.deny_cache_capacity,
            limit: policy.limit(),
            buckets: geometry.buckets,
            width_us: geometry.width_us,
            interpolated: geometry.interpolated,
            policy,
            prefix: prefix.into_bytes(),
            conn: Arc::new(conn),
            check: Script::new(CHECK_SCRIPT),
            timeout: self.timeout,
            failure: self.failure,
            closed_retry_after: self.closed_retry_after,
            events,
            breaker: Breaker::new(self.breaker).map(Arc::new),
            leases: self
                .leases
                .map(|l| LeaseTable::new(l, Duration::from_micros(geometry.width_us))),
            lease_settings: self.leases,
            fallback,
        };
        let store = RedisStore::from_inner(inner);
        // Connect and load the scripts now, in the background, so the first request
        // does not pay for it (the lazy connection only progresses while awaited).
        let warm = store.inner.clone();
        tokio::spawn(async move {
            let _ = warm.load_scripts(BACKGROUND_WARM_UP).await;
        });
        Ok(store)
    }
}

/// How a policy's buckets are numbered in Redis, validated.
pub(super) struct Geometry {
    /// The bucket width in whole microseconds, rounded up: N buckets still
    /// cover the whole window.
    pub(super) width_us: u64,
    pub(super) buckets: u32,
    pub(super) interpolated: bool,
}

impl Geometry {
    /// The geometry of `policy`, if the script can decide it exactly.
    pub(super) fn of(policy: &Policy) -> Result<Geometry, ConfigError> {
        // Redis' TIME has microsecond resolution.
        let resolution = Duration::from_micros(1);
        if policy.bucket_width() < resolution {
            return Err(ConfigError::BucketBelowClockResolution {
                bucket: policy.bucket_width(),
                resolution,
            });
        }
        let width_us = policy.bucket_nanos().div_ceil(1000);
        let buckets = policy.buckets();
        let span_us = width_us as u128 * (buckets as u128 + 1);
        // Slot times are microseconds since 1970 (about 2^51 today) plus a span.
        if span_us >= 1 << 52 {
            let max_width_us = ((1u64 << 52) - 1) / (u64::from(buckets) + 1);
            return Err(ConfigError::WindowTooLong {
                window: policy.window(),
                max: Duration::from_micros(max_width_us * u64::from(buckets)),
            });
        }
        let interpolated = policy.precision() == Precision::Interpolated;
        if interpolated && (policy.limit() as u128 + 1) * width_us as u128 >= LUA_EXACT {
            return Err(ConfigError::InterpolationOutOfRange);
        }
        Ok(Geometry {
            width_us,
            buckets,
            interpolated,
        })
    }
}

/// A deny cache for `policy` (`None` for capacity 0).
pub(super) fn new_deny_cache(capacity: usize, policy: &Policy) -> Option<DenyCache> {
    (capacity > 0).then(|| {
        DenyCache::new(
            capacity,
            policy.limit(),
            policy.window() + policy.bucket_width(),
        )
    })
}

/// Lua numbers are doubles: every product the script forms must stay below 2^53.
pub(super) const LUA_EXACT: u128 = 1 << 53;

/// How long the background task started by `build` keeps trying to connect.
pub(super) const BACKGROUND_WARM_UP: Duration = Duration::from_secs(10);

//! The layer: configuration, validated once in [`SlidingWindowLayerBuilder::build`],
//! and the shared limiters every clone and every service use.

use crate::clock::{AutoClock, Clock};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::mode::{ErrorRejection, HttpRejection};
use crate::policy::Policy;
use crate::response::{self, PolicyName, Report};
use crate::service::SlidingWindow;
use crate::store::Store;
use http::HeaderValue;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tower_layer::Layer;

/// What the layer does when a request is over a limit.
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_sliding_window::{OnLimit, Policy, SlidingWindowLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let by_user = |req: &Request<String>| req.headers().get("x-user").map(|v| v.as_bytes().to_vec());
/// // 1 request per 1.5 s per user (15 buckets of 100 ms); wait up to 2 s for a turn.
/// let layer = SlidingWindowLayer::builder(by_user)
///     .policy(Policy::per(1, Duration::from_millis(1500))?)
///     .on_limit(OnLimit::Wait { max_wait: Duration::from_secs(2), max_queue: 8 })
///     .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
///
/// let req = || Request::builder().header("x-user", "ada").body(String::new()).unwrap();
/// let start = tokio::time::Instant::now();
/// assert_eq!(svc.clone().oneshot(req()).await?.status(), StatusCode::OK);
/// // The second waits until the first leaves the window (1.5 s plus a bucket)...
/// assert_eq!(svc.clone().oneshot(req()).await?.status(), StatusCode::OK);
/// assert_eq!(start.elapsed(), Duration::from_millis(1600));
/// // ...and one whose turn would come after more than 2 s is rejected at once.
/// let (second, third) = (svc.clone().oneshot(req()), svc.clone().oneshot(req()));
/// let (second, third) = tokio::join!(second, third);
/// assert_eq!(second?.status(), StatusCode::OK);
/// assert_eq!(third?.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLimit {
    /// Answer at once: 429 / gRPC RESOURCE_EXHAUSTED (HTTP mode) or a
    /// [`RateLimited`](crate::RateLimited) error (error mode).
    #[default]
    Reject,
    /// Hold the request in its response future until its turn, FIFO per key, and
    /// forward it at the instant the policies allow. A request whose turn would
    /// come later than `max_wait` after its arrival, or that finds `max_queue`
    /// requests of its key already waiting, is rejected at once (as with
    /// `Reject`, its `Retry-After` telling when its turn would have come).
    /// Dropping the response future (a client gone, a timeout) leaves the queue
    /// and gives back any units it was admitted with. While a request waits,
    /// the inner service is not held: it is readied and called once the request
    /// is admitted, so a waiting key never takes capacity (a `ConcurrencyLimit`
    /// permit, a `Buffer` slot) from other keys. Until the inner service is
    /// ready the request is not sent: dropped then, it gives its units back;
    /// ready only after its admission's bucket has passed, it gives them back
    /// and asks again, ahead of the requests that arrived after it (waiting
    /// once more, at the head of its key's queue and up to `max_wait`, if it
    /// must; this short wait keeps the readied inner service, since a fresh
    /// one could again be ready too late), so it never reaches the inner
    /// service outside a window that counts it.
    /// In-memory limiters only.
    Wait {
        /// The longest a request may wait for its turn; a duration too long to
        /// add to an `Instant` (say `Duration::MAX`) means no bound.
        max_wait: std::time::Duration,
        /// The most requests of one key waiting at once (at least 1).
        max_queue: usize,
    },
    /// For a global limit ([`GlobalKey`](crate::GlobalKey)): `poll_ready` returns
    /// `Pending` while the window is full and reserves a unit when ready, which
    /// the next `call` spends (a clone, or a service dropped without calling,
    /// gives it back). Every clone waiting on the limit is served in turn. A
    /// unit reserved while the inner service was not ready yet, and whose
    /// bucket passed before it was (a saturated `ConcurrencyLimit` below), is
    /// renewed before `poll_ready` returns `Ready`: at once, or by waiting at
    /// the front of the queue, ahead of the clones that asked after it. A
    /// `call` without a reservation (no `poll_ready`, or a request costing more
    /// than one unit) waits for its turn in its response future instead.
    /// `poll_ready` cannot see the request, so an [exempt](SlidingWindowLayerBuilder::exempt)
    /// request too waits there for a unit; its `call` gives the unit back unused.
    /// A keyed layer cannot use it (`poll_ready` sees no request, so no key):
    /// building one is a [`ConfigError`]. In-memory limiters only.
    ///
    /// Clones wait in one queue, in turn, and the one at its head keeps the
    /// queue's timer: a clone whose `poll_ready` returned `Pending` must be
    /// polled again or dropped. One kept but no longer polled (say
    /// `timeout(d, svc.ready())` that expired, with `svc` kept for later) holds
    /// the head, and the clones behind it wait until it is polled or dropped.
    Backpressure,
}

impl OnLimit {
    /// Whether a layer holds requests back (a dry run never does).
    #[inline]
    pub(crate) fn waits(self, dry_run: bool) -> bool {
        !dry_run && self != OnLimit::Reject
    }
}

/// What a request whose extractor returned `None` gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MissingKey<K> {
    /// Forward it, uncounted and without rate-limit headers.
    Allow,
    /// Reject it: the rejection status with no rate-limit headers (HTTP mode) or
    /// a [`KeyMissing`](crate::KeyMissing) error (error mode). The default, so a
    /// misconfigured extractor (say, peer IP without `ConnectInfo`) fails loudly
    /// instead of silently disabling the limit.
    #[default]
    Reject,
    /// Count it under this shared key.
    Fallback(K),
}

/// The units a request costs. Closures `Fn(&Req) -> u32` implement it; the
/// default is [`UnitCost`].
pub trait RequestCost<Req>: Clone + Send + Sync + 'static {
    /// Units this request consumes.
    fn cost(&self, req: &Req) -> u32;
}

impl<Req, F> RequestCost<Req> for F
where
    F: Fn(&Req) -> u32 + Clone + Send + Sync + 'static,
{
    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        self(req)
    }
}

/// Every request costs one unit.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnitCost;

impl<Req> RequestCost<Req> for UnitCost {
    #[inline]
    fn cost(&self, _req: &Req) -> u32 {
        1
    }
}

/// Requests that bypass the limit entirely (an allowlist). Closures
/// `Fn(&Req) -> bool` implement it; the default is [`NoExemption`].
pub trait Exemption<Req>: Clone + Send + Sync + 'static {
    /// True when `req` is not limited (not counted, no headers).
    fn is_exempt(&self, req: &Req) -> bool;
}

impl<Req, F> Exemption<Req> for F
where
    F: Fn(&Req) -> bool + Clone + Send + Sync + 'static,
{
    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        self(req)
    }
}

/// No request is exempt.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoExemption;

impl<Req> Exemption<Req> for NoExemption {
    #[inline]
    fn is_exempt(&self, _req: &Req) -> bool {
        false
    }
}

type KeyFormatter<K> = Arc<dyn Fn(&K, &mut fmt::Formatter<'_>) -> fmt::Result + Send + Sync>;
/// Builds the in-memory limiters from the policies, `max_keys` and whether the
/// layer waits (`OnLimit::Wait` / `Backpressure`).
/// `Send + Sync`, so a builder can be held across an `.await` in a spawned task
/// (while a store connects, say).
type StoreFactory<St> =
    Box<dyn FnOnce(Vec<Policy>, usize, bool) -> Result<Vec<St>, ConfigError> + Send + Sync>;

/// Counters the layer keeps beyond the stores' own [`Stats`](crate::Stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerStats {
    /// Requests a dry run would have rejected (they were forwarded).
    pub dry_run_rejections: u64,
    /// Requests without a key that were rejected (in a dry run: forwarded).
    pub key_missing: u64,
    /// Requests answered 503 / UNAVAILABLE (with
    /// [`reject_with_errors`](SlidingWindowLayerBuilder::reject_with_errors): a
    /// [`StoreError`](crate::StoreError) value) because a store could not decide
    /// (in a dry run: forwarded).
    pub store_errors: u64,
}

#[derive(Default)]
pub(crate) struct LayerCounters {
    pub(crate) dry_run_rejections: AtomicU64,
    pub(crate) key_missing: AtomicU64,
    pub(crate) store_errors: AtomicU64,
}

/// One policy as the layer sees it: its store and its precomputed names.
pub(crate) struct Limit<St> {
    pub(crate) store: St,
    pub(crate) name: PolicyName,
    pub(crate) quoted_name: Box<str>,
}

/// Everything the services share: built once in `build()`.
pub(crate) struct Shared<K, X, St, M, Co, Ex> {
    pub(crate) extractor: X,
    pub(crate) limits: Box<[Limit<St>]>,
    pub(crate) policy_header: HeaderValue,
    pub(crate) mode: M,
    pub(crate) cost: Co,
    pub(crate) exempt: Ex,
    pub(crate) missing_key: MissingKey<K>,
    pub(crate) on_limit: OnLimit,
    pub(crate) dry_run: bool,
    pub(crate) key_formatter: Option<KeyFormatter<K>>,
    pub(crate) counters: LayerCounters,
    /// The wait queues of `OnLimit::Wait` and `OnLimit::Backpressure`.
    pub(crate) wait: crate::waiting::LayerQueues<K>,
    /// The key `poll_ready` reserves a unit of: the global limit's `()` under
    /// `OnLimit::Backpressure` (not in a dry run); `None` otherwise.
    pub(crate) reserve_key: Option<K>,
}

impl<K, X, St, M, Co, Ex> Shared<K, X, St, M, Co, Ex> {
    /// What a response reports for policy `i`'s `decision`.
    pub(crate) fn report(&self, i: usize, decision: Decision) -> Report<'_> {
        Report {
            decision,
            quoted_name: &self.limits[i].quoted_name,
            policy_header: &self.policy_header,
        }
    }

    /// `key` for log events: only when the user opted in.
    pub(crate) fn loggable_key<'a>(&'a self, key: &'a K) -> Option<LoggedKey<'a, K>> {
        self.key_formatter
            .as_ref()
            .map(|format| LoggedKey { key, format })
    }
}

/// A key formatted with the user's formatter, for `tracing` fields.
pub(crate) struct LoggedKey<'a, K> {
    key: &'a K,
    format: &'a KeyFormatter<K>,
}

impl<K> fmt::Display for LoggedKey<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.format)(self.key, f)
    }
}

/// A tower [`Layer`] that rate-limits requests with a sliding window per key.
///
/// Built once, with [`new`](SlidingWindowLayer::new) or
/// [`builder`](SlidingWindowLayer::builder); the limiters are created then.
/// Clones of the layer and every service it makes share them, so the limit holds
/// across connections, though `axum::serve` and hyper clone the service for
/// each connection (and a stack built per connection calls [`Layer::layer`]
/// each time).
///
/// The type parameters are inferred: `K` is the key type, `X` the extractor,
/// `St` the store (the in-memory [`Limiter`] by default), `M` the rejection mode
/// ([`HttpRejection`] or [`ErrorRejection`]), `Co` the cost and `Ex` the exemption.
pub struct SlidingWindowLayer<
    K,
    X,
    St = Limiter<K, AutoClock>,
    M = HttpRejection,
    Co = crate::layer::UnitCost,
    Ex = crate::layer::NoExemption,
> {
    pub(crate) shared: Arc<Shared<K, X, St, M, Co, Ex>>,
}

impl<K, X, St, M, Co, Ex> Clone for SlidingWindowLayer<K, X, St, M, Co, Ex> {
    fn clone(&self) -> Self {
        SlidingWindowLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, X, St, M, Co, Ex> fmt::Debug for SlidingWindowLayer<K, X, St, M, Co, Ex> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindowLayer")
            .field("policies", &self.shared.limits.len())
            .field("on_limit", &self.shared.on_limit)
            .field("dry_run", &self.shared.dry_run)
            .finish_non_exhaustive()
    }
}

impl<K, X> SlidingWindowLayer<K, X>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: Clone + Send + Sync + 'static,
{
    /// One policy per key from `extractor`, in-memory, answering over-limit HTTP
    /// requests with 429 (gRPC: RESOURCE_EXHAUSTED) and rate-limit headers.
    ///
    /// The key type `K` is inferred from the extractor once the layer wraps a
    /// service; name it (`SlidingWindowLayer::<MyKey, _>::new`) if nothing else
    /// pins it down.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use http::{Request, Response, StatusCode};
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tower_sliding_window::{Policy, SlidingWindowLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let by_user = |req: &Request<String>| {
    ///     req.headers().get("x-user").map(|v| v.as_bytes().to_vec())
    /// };
    /// let layer = SlidingWindowLayer::new(Policy::per(1, Duration::from_secs(60))?, by_user)?;
    /// let svc = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
    ///
    /// let req = || Request::builder().header("x-user", "ada").body(String::new()).unwrap();
    /// assert_eq!(svc.clone().oneshot(req()).await?.status(), StatusCode::OK);
    /// let limited = svc.clone().oneshot(req()).await?;
    /// assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    /// // Whole seconds, rounded up: at most a window plus one bucket (60 s / 15).
    /// assert_eq!(limited.headers()["retry-after"], "64");
    /// # Ok(()) }
    /// ```
    pub fn new(policy: Policy, extractor: X) -> Result<Self, ConfigError> {
        SlidingWindowLayer::builder(extractor)
            .policy(policy)
            .build()
    }

    /// Start configuring a layer that keys requests with `extractor`.
    pub fn builder(extractor: X) -> SlidingWindowLayerBuilder<K, X> {
        SlidingWindowLayerBuilder {
            common: Common {
                extractor,
                policies: Vec::new(),
                max_keys: None,
                missing_key: MissingKey::Reject,
                on_limit: OnLimit::Reject,
                dry_run: false,
                key_formatter: None,
                clock: false,
                http_rejection: false,
                error: None,
            },
            stores: Vec::new(),
            factory: Some(Box::new(|policies, max_keys, waits| {
                policies
                    .into_iter()
                    .map(|p| {
                        // A waiting layer sleeps on tokio timers, so its limiters
                        // read tokio's clock and a wait ends when the window allows.
                        let clock = if waits {
                            AutoClock::tokio()
                        } else {
                            AutoClock::for_bucket(p.bucket_width())
                        };
                        Limiter::builder(p).clock(clock).max_keys(max_keys).build()
                    })
                    .collect()
            })),
            mode: HttpRejection::default(),
            cost: UnitCost,
            exempt: NoExemption,
        }
    }
}

impl<K, X, St, M, Co, Ex> SlidingWindowLayer<K, X, St, M, Co, Ex> {
    /// The layer's stores, one per policy, in the order they were added: read
    /// their counters (for the in-memory [`Limiter`], [`Limiter::stats`] and
    /// [`Limiter::usage`]). With several policies, a store's `admitted` also
    /// counts requests another policy denied (their units were given back).
    pub fn stores(&self) -> impl ExactSizeIterator<Item = &St> + '_ {
        self.shared.limits.iter().map(|l| &l.store)
    }

    /// The layer's own counters (dry-run rejections, missing keys, store errors).
    pub fn stats(&self) -> LayerStats {
        let c = &self.shared.counters;
        LayerStats {
            dry_run_rejections: c.dry_run_rejections.load(Relaxed),
            key_missing: c.key_missing.load(Relaxed),
            store_errors: c.store_errors.load(Relaxed),
        }
    }
}

impl<S, K, X, St, M, Co, Ex> Layer<S> for SlidingWindowLayer<K, X, St, M, Co, Ex> {
    type Service = SlidingWindow<S, K, X, St, M, Co, Ex>;

    fn layer(&self, inner: S) -> Self::Service {
        SlidingWindow::new(inner, self.clone())
    }
}

/// Builder for [`SlidingWindowLayer`]; [`build`](Self::build) validates everything.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use tower_sliding_window::{MissingKey, Policy, SlidingWindowLayer};
///
/// let per_user = |req: &http::Request<()>| {
///     req.headers().get("x-api-key").map(|v| v.as_bytes().to_vec())
/// };
/// let layer = SlidingWindowLayer::builder(per_user)
///     .policy(Policy::builder().name("burst").limit(10).window(Duration::from_secs(1)).build()?)
///     .policy(Policy::builder().name("hourly").limit(1000).window(Duration::from_secs(3600)).build()?)
///     .missing_key(MissingKey::Fallback(b"anonymous".to_vec()))
///     .cost(|req: &http::Request<()>| if req.method() == "POST" { 5 } else { 1 })
///     .status(StatusCode::SERVICE_UNAVAILABLE)
///     .legacy_headers(true)
///     .build()?;
/// assert_eq!(layer.stores().len(), 2);
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
pub struct SlidingWindowLayerBuilder<
    K,
    X,
    St = Limiter<K, AutoClock>,
    M = HttpRejection,
    Co = UnitCost,
    Ex = NoExemption,
> {
    common: Common<K, X>,
    stores: Vec<St>,
    factory: Option<StoreFactory<St>>,
    mode: M,
    cost: Co,
    exempt: Ex,
}

/// The builder settings that do not change its type.
struct Common<K, X> {
    extractor: X,
    policies: Vec<Policy>,
    /// Set by `max_keys()`; only limiters built from `policy()` use it.
    max_keys: Option<usize>,
    missing_key: MissingKey<K>,
    on_limit: OnLimit,
    dry_run: bool,
    key_formatter: Option<KeyFormatter<K>>,
    /// Set by `clock()`; only limiters built from `policy()` use it.
    clock: bool,
    /// Set by the HTTP rejection settings (`status()`, `grpc_status()`, the
    /// header options, `reject_with()`), which `reject_with_errors()` has none of.
    http_rejection: bool,
    /// A mistake found while configuring, reported by `build()`.
    error: Option<ConfigError>,
}

impl<K, X, St, M, Co, Ex> fmt::Debug for SlidingWindowLayerBuilder<K, X, St, M, Co, Ex> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindowLayerBuilder")
            .field("policies", &self.common.policies)
            .field("stores", &self.stores.len())
            .field("dry_run", &self.common.dry_run)
            .finish_non_exhaustive()
    }
}

/// The most policies one layer accepts: decisions for all of them are kept on
/// the stack while a request is decided.
pub const MAX_POLICIES: usize = 8;

impl<K, X, St, M, Co, Ex> SlidingWindowLayerBuilder<K, X, St, M, Co, Ex> {
    /// What a request without a key gets (default [`MissingKey::Reject`]).
    pub fn missing_key(mut self, missing_key: MissingKey<K>) -> Self {
        self.common.missing_key = missing_key;
        self
    }

    /// What happens to a request over the limit (default [`OnLimit::Reject`]).
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.common.on_limit = on_limit;
        self
    }

    /// Decide, count and set headers, but never reject: would-be rejections are
    /// forwarded, logged at INFO and counted in [`LayerStats::dry_run_rejections`].
    /// For rolling out a new limit safely. A request one policy would deny
    /// consumes nothing from the others, exactly as when enforcing.
    ///
    /// In HTTP mode every forwarded response that was decided carries the
    /// rate-limit headers (as with [`headers_on_allowed(true)`](Self::headers_on_allowed)):
    /// a would-be rejection shows the remaining units that its cost did not fit
    /// (`r=0` with unit costs) and its `t`. A request whose store could not
    /// answer has no decision to report: it is forwarded without them, and
    /// counted in [`LayerStats::store_errors`] as it would be when enforcing.
    /// A request without a key is forwarded too, whatever [`MissingKey`] says
    /// (and counted in [`LayerStats::key_missing`]), so a misconfigured
    /// extractor shows in the stats and logs before it blocks anyone.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.common.dry_run = dry_run;
        self
    }

    /// Log keys in rejection events, formatted with `Debug`. Off by default: keys
    /// are often personal data (IP addresses, API keys).
    pub fn log_keys(self) -> Self
    where
        K: fmt::Debug,
    {
        self.log_keys_with(|key: &K, f: &mut fmt::Formatter<'_>| fmt::Debug::fmt(key, f))
    }

    /// Log keys in rejection events, formatted by `format` (hash or truncate them,
    /// say). Off by default.
    pub fn log_keys_with<F>(mut self, format: F) -> Self
    where
        F: Fn(&K, &mut fmt::Formatter<'_>) -> fmt::Result + Send + Sync + 'static,
    {
        self.common.key_formatter = Some(Arc::new(format));
        self
    }

    /// The units a request costs (default 1 per request): any
    /// `Fn(&Req) -> u32` or [`RequestCost`].
    pub fn cost<Co2>(self, cost: Co2) -> SlidingWindowLayerBuilder<K, X, St, M, Co2, Ex> {
        let (stores, factory, mode, exempt) = (self.stores, self.factory, self.mode, self.exempt);
        SlidingWindowLayerBuilder {
            common: self.common,
            stores,
            factory,
            mode,
            cost,
            exempt,
        }
    }

    /// Requests for which `exempt` is true bypass the limit (not counted, no
    /// headers): health checks, an allowlist of internal callers. Any
    /// `Fn(&Req) -> bool` or [`Exemption`]. Under [`OnLimit::Backpressure`] they
    /// still wait in `poll_ready`, which cannot see the request.
    pub fn exempt<Ex2>(self, exempt: Ex2) -> SlidingWindowLayerBuilder<K, X, St, M, Co, Ex2> {
        let (stores, factory, mode, cost) = (self.stores, self.factory, self.mode, self.cost);
        SlidingWindowLayerBuilder {
            common: self.common,
            stores,
            factory,
            mode,
            cost,
            exempt,
        }
    }

    /// Decide with `store` for one more policy (its own [`Store::policy`]), such
    /// as a Redis store shared by a fleet, or a [`Limiter`] you built yourself
    /// (with your own clock, say) and want to read elsewhere. Every store of a
    /// layer has one type, and stores do not mix with [`policy`](Self::policy).
    pub fn store<St2>(self, store: St2) -> SlidingWindowLayerBuilder<K, X, St2, M, Co, Ex>
    where
        St: 'static,
        St2: 'static,
    {
        let mut common = self.common;
        if common.clock {
            common.error.get_or_insert(ConfigError::Invalid(
                "clock() configures the in-memory limiters built from policy(); \
                 a store given with store() keeps its own clock",
            ));
        }
        // Stores given before this one carry over when they have the same type.
        let had_stores = !self.stores.is_empty();
        let previous: Box<dyn std::any::Any> = Box::new(self.stores);
        let mut stores = match previous.downcast::<Vec<St2>>() {
            Ok(same_type) => *same_type,
            Err(_) => {
                if had_stores {
                    common.error.get_or_insert(ConfigError::Invalid(
                        "all stores of one layer must have the same type",
                    ));
                }
                Vec::new()
            }
        };
        stores.push(store);
        SlidingWindowLayerBuilder {
            common,
            stores,
            factory: None,
            mode: self.mode,
            cost: self.cost,
            exempt: self.exempt,
        }
    }

    /// Reject with error values instead of HTTP responses: for request types that
    /// are not `http::Request`. The service's error becomes
    /// [`BoxError`](tower::BoxError), holding a [`RateLimited`](crate::RateLimited),
    /// a [`KeyMissing`](crate::KeyMissing) or a [`StoreError`](crate::StoreError).
    /// The HTTP rejection settings ([`status`](Self::status),
    /// [`grpc_status`](Self::grpc_status), the header options,
    /// [`reject_with`](Self::reject_with)) have no meaning then: set before it,
    /// they are a [`ConfigError`] from [`build`](Self::build).
    pub fn reject_with_errors(self) -> SlidingWindowLayerBuilder<K, X, St, ErrorRejection, Co, Ex> {
        let (stores, factory, cost, exempt) = (self.stores, self.factory, self.cost, self.exempt);
        let mut common = self.common;
        if common.http_rejection {
            common.error.get_or_insert(ConfigError::HttpSettingsIgnored);
        }
        SlidingWindowLayerBuilder {
            common,
            stores,
            factory,
            mode: ErrorRejection,
            cost,
            exempt,
        }
    }

    /// Validate the configuration and create the limiters (or take the stores).
    ///
    /// Errors: no policy, more than [`MAX_POLICIES`], stores mixed with
    /// [`policy`](Self::policy), [`max_keys`](Self::max_keys) without
    /// [`policy`](Self::policy) (stores keep their own cap), [`clock`](Self::clock)
    /// beside a store (stores keep their own clock), HTTP rejection settings
    /// followed by [`reject_with_errors`](Self::reject_with_errors), a policy name that
    /// is not printable ASCII or is used twice, a rejection status that is not 4xx/5xx, a gRPC code outside
    /// 1..=16, any limiter configuration error, and for the waiting modes of
    /// [`OnLimit`]: a store that is not in-memory, `max_queue` 0, or
    /// `Backpressure` on a keyed layer.
    pub fn build(self) -> Result<SlidingWindowLayer<K, X, St, M, Co, Ex>, ConfigError>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
        St: Store<K>,
        M: crate::mode::ModeConfig,
    {
        let common = self.common;
        if let Some(error) = common.error {
            return Err(error);
        }
        let mut mode = self.mode;
        mode.validate()?;
        if common.dry_run {
            mode.headers_on_every_response();
        }
        let mut stores = self.stores;
        if common.policies.is_empty() && common.max_keys.is_some() {
            return Err(ConfigError::Invalid(
                "max_keys() configures the in-memory limiters built from policy(); \
                 a store given with store() keeps its own cap",
            ));
        }
        if !common.policies.is_empty() {
            let factory = self.factory.ok_or(ConfigError::Invalid(
                "policy() builds in-memory limiters and cannot be mixed with store(); \
                 give every policy as a store instead",
            ))?;
            let waits = common.on_limit.waits(common.dry_run);
            stores.extend(factory(
                common.policies,
                common.max_keys.unwrap_or(Limiter::DEFAULT_MAX_KEYS),
                waits,
            )?);
        }
        if stores.is_empty() {
            return Err(ConfigError::NoPolicy);
        }
        if stores.len() > MAX_POLICIES {
            return Err(ConfigError::TooManyPolicies {
                count: stores.len(),
                max: MAX_POLICIES,
            });
        }
        let mut limits: Vec<Limit<St>> = Vec::with_capacity(stores.len());
        for store in stores {
            let name = store.policy().name();
            if !response::is_valid_policy_name(name) {
                return Err(ConfigError::InvalidPolicyName {
                    name: name.to_owned(),
                });
            }
            if limits.iter().any(|l| &*l.name == name) {
                return Err(ConfigError::DuplicatePolicyName {
                    name: name.to_owned(),
                });
            }
            limits.push(Limit {
                name: Arc::from(name),
                quoted_name: response::quoted(name).into_boxed_str(),
                store,
            });
        }
        let policy_header = response::policy_header(limits.iter().map(|l| l.store.policy()));
        let (wait, global_key) = crate::waiting::configure(common.on_limit, &limits)?;
        let reserve_key =
            global_key.filter(|_| common.on_limit == OnLimit::Backpressure && !common.dry_run);
        Ok(SlidingWindowLayer {
            shared: Arc::new(Shared {
                extractor: common.extractor,
                limits: limits.into_boxed_slice(),
                policy_header,
                mode,
                cost: self.cost,
                exempt: self.exempt,
                missing_key: common.missing_key,
                on_limit: common.on_limit,
                dry_run: common.dry_run,
                key_formatter: common.key_formatter,
                counters: LayerCounters::default(),
                wait,
                reserve_key,
            }),
        })
    }
}

impl<K, X, C, M, Co, Ex> SlidingWindowLayerBuilder<K, X, Limiter<K, C>, M, Co, Ex>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + Clone,
{
    /// Add a policy, enforced by an in-memory [`Limiter`] created in
    /// [`build`](Self::build). Several policies are decided all-or-nothing.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.common.policies.push(policy);
        self
    }

    /// The most keys each in-memory limiter tracks (default
    /// [`Limiter::DEFAULT_MAX_KEYS`]; see [`Limiter`] for what happens at the cap).
    /// Only for limiters built from [`policy`](Self::policy): a store given with
    /// `store()` keeps its own cap, and setting this beside one is a
    /// [`ConfigError`] from [`build`](Self::build).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.common.max_keys = Some(max_keys);
        self
    }

    /// The clock of the in-memory limiters. The default is an [`AutoClock`] per
    /// policy: tokio's clock when the layer is built in a paused runtime (tests
    /// drive it with `tokio::time::advance`) or when it waits
    /// ([`OnLimit::Wait`], [`OnLimit::Backpressure`]: its waits are tokio timers);
    /// otherwise the cheapest monotonic clock fine enough for the policy's bucket.
    /// Only for limiters built from [`policy`](Self::policy): a store given with
    /// `store()` keeps its own clock, and setting this beside one (before or
    /// after it) is a [`ConfigError`] from [`build`](Self::build).
    pub fn clock<C2: Clock + Clone>(
        self,
        clock: C2,
    ) -> SlidingWindowLayerBuilder<K, X, Limiter<K, C2>, M, Co, Ex> {
        let factory: StoreFactory<Limiter<K, C2>> = Box::new(move |policies, max_keys, _| {
            policies
                .into_iter()
                .map(|p| {
                    Limiter::builder(p)
                        .clock(clock.clone())
                        .max_keys(max_keys)
                        .build()
                })
                .collect()
        });
        let mut common = self.common;
        common.clock = true;
        if !self.stores.is_empty() {
            common.error.get_or_insert(ConfigError::Invalid(
                "clock() configures in-memory limiters and cannot follow store()",
            ));
        }
        SlidingWindowLayerBuilder {
            common,
            stores: Vec::new(),
            factory: Some(factory),
            mode: self.mode,
            cost: self.cost,
            exempt: self.exempt,
        }
    }
}

impl<K, X, H, St, Co, Ex> SlidingWindowLayerBuilder<K, X, St, HttpRejection<H>, Co, Ex> {
    /// The status of a rate-limited plain HTTP response (default 429; some
    /// stacks use 503). Must be 4xx or 5xx. Also the status of a
    /// [`reject_with`](Self::reject_with) response that sets none of its own.
    pub fn status(mut self, status: http::StatusCode) -> Self {
        self.mode.options.status = status;
        self.common.http_rejection = true;
        self
    }

    /// The gRPC status code for a rate-limited gRPC request (default 8,
    /// RESOURCE_EXHAUSTED). Must be 1..=16.
    pub fn grpc_status(mut self, code: u8) -> Self {
        self.mode.options.grpc_status = code;
        self.common.http_rejection = true;
        self
    }

    /// Send `grpc-retry-pushback-ms` on gRPC rejections (default on; `-1`,
    /// "do not retry", when the cost exceeds the limit).
    pub fn grpc_retry_pushback(mut self, on: bool) -> Self {
        self.mode.options.grpc_retry_pushback = on;
        self.common.http_rejection = true;
        self
    }

    /// The IETF `RateLimit-Policy` and `RateLimit` fields (default on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.mode.options.ietf = on;
        self.common.http_rejection = true;
        self
    }

    /// `Retry-After` on rejections (default on).
    pub fn retry_after_header(mut self, on: bool) -> Self {
        self.mode.options.retry_after = on;
        self.common.http_rejection = true;
        self
    }

    /// Legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default off).
    /// `X-RateLimit-Reset` is the number of seconds until the window drains,
    /// rounded up, not an epoch timestamp.
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.mode.options.legacy = on;
        self.common.http_rejection = true;
        self
    }

    /// Rate-limit headers on allowed responses too (default off). They let a
    /// client pace itself before it meets a 429, at the cost of two header
    /// lines on every response (about 3% of a hello-world server's throughput,
    /// see the README's HTTP benchmark).
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.mode.options.on_allowed = on;
        self.common.http_rejection = true;
        self
    }

    /// Build the response for a rate-limited (non-gRPC) request yourself, say
    /// with a JSON body. The configured rate-limit headers are added afterwards
    /// unless the response already has them. The hook's status is kept unless
    /// it is a success (`Response::new` leaves 200) or a 1xx (never a final
    /// response): a rejection then gets the
    /// layer's [`status`](Self::status), 429 by default. gRPC requests keep the
    /// gRPC rejection. The hook returns the inner service's response type: in
    /// axum, an `axum::response::Response`, say
    /// `(StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response()` (the
    /// example below serves a `String` body). The response body must still
    /// implement `Default`: the answers to a missing key, a store that is down
    /// and gRPC requests are built with an empty body (with a body type that
    /// has no default, such as `Either`, map the inner service's body to a
    /// boxed one first).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{GlobalKey, Policy, RateLimited, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::builder(GlobalKey)
    ///     .policy(Policy::per(5, Duration::from_secs(1)).unwrap())
    ///     .reject_with(|limited: &RateLimited| {
    ///         http::Response::builder()
    ///             .status(429)
    ///             .header("content-type", "application/json")
    ///             .body(format!(r#"{{"error":"slow down","policy":"{}"}}"#, limited.policy_name()))
    ///             .unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _: tower_sliding_window::SlidingWindowLayer<(), _, _, _> = layer;
    /// ```
    pub fn reject_with<H2>(
        self,
        hook: H2,
    ) -> SlidingWindowLayerBuilder<K, X, St, HttpRejection<H2>, Co, Ex> {
        let mut common = self.common;
        common.http_rejection = true;
        SlidingWindowLayerBuilder {
            common,
            stores: self.stores,
            factory: self.factory,
            mode: HttpRejection {
                options: self.mode.options,
                hook,
            },
            cost: self.cost,
            exempt: self.exempt,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn per_second(n: u32) -> Policy {
        Policy::per(n, Duration::from_secs(1)).unwrap()
    }

    type Req = http::Request<()>;

    fn key(_: &Req) -> Option<u8> {
        Some(1)
    }

    #[test]
    fn build_rejects_invalid_configuration_with_errors() {
        let no_policy = SlidingWindowLayer::<u8, _>::builder(key).build();
        assert!(matches!(no_policy, Err(ConfigError::NoPolicy)));

        let bad_status = SlidingWindowLayer::<u8, _>::builder(key)
            .policy(per_second(1))
            .status(http::StatusCode::OK)
            .build();
        assert!(matches!(bad_status, Err(ConfigError::InvalidStatus { .. })));

        let bad_code = SlidingWindowLayer::<u8, _>::builder(key)
            .policy(per_second(1))
            .grpc_status(0)
            .build();
        assert!(matches!(
            bad_code,
            Err(ConfigError::InvalidGrpcCode { code: 0 })
        ));

        let twice = SlidingWindowLayer::<u8, _>::builder(key)
            .policy(per_second(1))
            .policy(per_second(2))
            .build();
        assert!(matches!(
            twice,
            Err(ConfigError::DuplicatePolicyName { .. })
        ));

        let bad_name = SlidingWindowLayer::<u8, _>::builder(key)
            .policy(
                Policy::builder()
                    .name("ünïcode")
                    .limit(1)
                    .window(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            )
            .build();
        assert!(matches!(
            bad_name,
            Err(ConfigError::InvalidPolicyName { .. })
        ));

        let too_many =
            (0..=MAX_POLICIES).fold(SlidingWindowLayer::<u8, _>::builder(key), |b, i| {
                b.policy(
                    Policy::builder()
                        .name(format!("p{i}"))
                        .limit(1)
                        .window(Duration::from_secs(1))
                        .build()
                        .unwrap(),
                )
            });
        assert!(matches!(
            too_many.build(),
            Err(ConfigError::TooManyPolicies { count: 9, max: 8 })
        ));

        let mixed = SlidingWindowLayer::<u8, _>::builder(key)
            .policy(per_second(1))
            .store(Limiter::<u8>::new(per_second(2)).unwrap())
            .build();
        assert!(matches!(mixed, Err(ConfigError::Invalid(_))));

        let manual = Limiter::builder(per_second(3))
            .clock(crate::ManualClock::new())
            .build()
            .unwrap();
        let two_types = SlidingWindowLayer::<u8, _>::builder(key)
            .store(Limiter::<u8>::new(per_second(2)).unwrap())
            .store(manual)
            .build();
        assert!(matches!(two_types, Err(ConfigError::Invalid(_))));

        let zero_keys = SlidingWindowLayer::<u8, _>::builder(key)
            .policy(per_second(1))
            .max_keys(0)
            .build();
        assert!(matches!(zero_keys.unwrap_err(), ConfigError::ZeroMaxKeys));
    }

    #[test]
    fn clones_share_one_set_of_limiters() {
        let layer: SlidingWindowLayer<u8, _> = SlidingWindowLayer::new(per_second(5), key).unwrap();
        let clone = layer.clone();
        assert!(Arc::ptr_eq(&layer.shared, &clone.shared));
        let a: *const Limiter<u8, AutoClock> = layer.stores().next().unwrap();
        let b: *const Limiter<u8, AutoClock> = clone.stores().next().unwrap();
        assert_eq!(a, b);
    }

    fn source<X>(layer: &SlidingWindowLayer<u8, X>) -> crate::TimeSource {
        layer.stores().next().unwrap().clock().source()
    }

    #[tokio::test]
    async fn rejecting_layers_read_the_cheap_clock_and_waiting_ones_tokio_time() {
        let rejecting = SlidingWindowLayer::new(per_second(5), key).unwrap();
        assert_ne!(source(&rejecting), crate::TimeSource::Tokio);

        let waiting = SlidingWindowLayer::<u8, _>::builder(key)
            .policy(per_second(5))
            .on_limit(OnLimit::Wait {
                max_wait: std::time::Duration::from_secs(1),
                max_queue: 4,
            })
            .build()
            .unwrap();
        assert_eq!(source(&waiting), crate::TimeSource::Tokio);
    }

    #[tokio::test(start_paused = true)]
    async fn layers_built_on_paused_time_follow_it() {
        let rejecting = SlidingWindowLayer::new(per_second(5), key).unwrap();
        assert_eq!(source(&rejecting), crate::TimeSource::Tokio);
    }
}

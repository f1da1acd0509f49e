//! The layer and the state every clone and service shares: built once, in
//! [`build`](crate::SlidingWindowLayerBuilder), behind one `Arc`.

use super::events::LayerEvents;
use super::local::{AsLocal, LayerQueues};
use super::settle::SettleConfig;
use super::tiers::TierHandle;
pub(crate) use super::tiers::{Policies, TierState};
use crate::error::ConfigError;
use crate::extract::{KeyOf, Keyed, NamesTiers};
use crate::limiter::Limiter;
use crate::store::Store;
use crate::tier::{TierLimits, Tiers};
use crate::wait::{WaitConfig, WaitStats};
use std::fmt;

use std::sync::Arc;

use super::rejection::HttpRejection;

pub use crate::tier::MAX_POLICIES;

/// What the layer does when a request is over a limit.
///
/// For a global limit, the layer can also hold back `poll_ready` instead:
/// see [`backpressure`](crate::SlidingWindowLayerBuilder::backpressure).
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_sliding_window::{key_fn, OnLimit, Policy, SlidingWindowLayer, WaitConfig};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let by_user = key_fn(|req: &Request<String>| req.headers().get("x-user").map(|v| v.as_bytes().to_vec()));
/// // 1 request per 1.5 s per user; wait up to 2 s for a turn, behind at most
/// // 7 others.
/// let layer = SlidingWindowLayer::builder(by_user)
///     .policy(Policy::per(1, Duration::from_millis(1500))?)
///     .on_limit(OnLimit::Wait(WaitConfig::bounded(Duration::from_secs(2), 8)?))
///     .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
///
/// let req = || Request::builder().header("x-user", "ada").body(String::new()).unwrap();
/// let start = tokio::time::Instant::now();
/// assert_eq!(svc.clone().oneshot(req()).await?.status(), StatusCode::OK);
/// // The second waits until the first leaves the window, 1.5 s after it (to a
/// // step of its bucket), and passes at the timer's next millisecond...
/// assert_eq!(svc.clone().oneshot(req()).await?.status(), StatusCode::OK);
/// assert_eq!(start.elapsed(), Duration::from_millis(1501));
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
    /// Hold the request in its response future until its turn, FIFO per key,
    /// and forward it at the instant the policies allow, within the
    /// [`WaitConfig`]'s bounds. A request whose turn would come later than
    /// `max_wait` after its arrival, or that finds `max_queue` requests of its
    /// key already waiting, is rejected at once (as with `Reject`, its
    /// `Retry-After` telling when its turn would have come).
    /// [`WaitConfig::unbounded`] waits as long as it takes behind any number of
    /// requests: only where the callers themselves are bounded.
    ///
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
    ///
    /// Only the in-memory limiters of
    /// [`policy`](crate::SlidingWindowLayerBuilder::policy) can wait: a remote
    /// store cannot tell when a unit frees.
    Wait(WaitConfig),
}

/// How a layer holds back requests over the limit (a dry run never does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    Reject,
    Wait(WaitConfig),
    /// `poll_ready` is `Pending` until a unit of the global key is reserved.
    Backpressure,
}

impl Hold {
    /// The bounds of the layer's wait queues (unbounded when it never waits).
    pub(crate) fn wait_config(self) -> WaitConfig {
        match self {
            Hold::Wait(config) => config,
            Hold::Reject | Hold::Backpressure => WaitConfig::unbounded(),
        }
    }
}

/// What a request whose extractor returned `None` gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey<K> {
    /// Forward it, uncounted and without rate-limit headers.
    Allow,
    /// Reject it: with the extractor's
    /// [`missing_key_status`](crate::extract::Keyed::missing_key_status) (400 Bad
    /// Request, or 500 for the address extractors, whose missing key is a
    /// server misconfiguration) or the layer's
    /// [`missing_key_status`](crate::SlidingWindowLayerBuilder::missing_key_status),
    /// and no rate-limit headers (HTTP mode); a
    /// [`KeyMissing`](crate::layer::KeyMissing) error (error mode). Never 429:
    /// a request without a key is not throttled, and waiting will not help it.
    /// The default, so a misconfigured extractor (say, peer IP without
    /// `ConnectInfo`) fails loudly instead of silently disabling the limit.
    #[default]
    Reject,
    /// Count it under this shared key.
    Fallback(K),
}

/// Counters the layer keeps beyond the stores' own stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LayerStats {
    /// Requests a dry run would have rejected (they were forwarded).
    pub dry_run_rejections: u64,
    /// Requests without a key that were rejected (in a dry run: forwarded).
    pub key_missing: u64,
    /// Requests answered 503 / UNAVAILABLE (with
    /// [`reject_with_errors`](crate::SlidingWindowLayerBuilder::reject_with_errors): a
    /// [`StoreError`](crate::StoreError) value) because a store could not decide
    /// (in a dry run: forwarded).
    pub store_errors: u64,
    /// Requests of a layer of tiers whose tier is not in the table (without a
    /// [fallback tier](crate::SlidingWindowLayerBuilder::unknown_tier_fallback):
    /// rejected, 500; in a dry run: forwarded).
    pub unknown_tier: u64,
}

pub(crate) type KeyFormatter<K> =
    Arc<dyn Fn(&K, &mut fmt::Formatter<'_>) -> fmt::Result + Send + Sync>;

/// Everything the services share: built once in `build()`.
pub(crate) struct Shared<X: Keyed, St, M> {
    pub(crate) extractor: X,
    /// The layer's policies; none in a layer of tiers, whose policies are
    /// its tiers'.
    pub(crate) policies: Arc<Policies<St>>,
    /// The tiers of a layer of tiers.
    pub(crate) tiers: Option<TierState<St>>,
    pub(crate) mode: M,
    pub(crate) missing_key: MissingKey<KeyOf<X>>,
    /// The status a request without a key is rejected with: the layer's, or
    /// else the extractor's.
    pub(crate) missing_key_status: http::StatusCode,
    pub(crate) hold: Hold,
    pub(crate) dry_run: bool,
    pub(crate) key_formatter: Option<KeyFormatter<KeyOf<X>>>,
    /// What the layer does besides deciding: counters, metrics, logs.
    pub(crate) events: LayerEvents,
    /// The wait queues of `OnLimit::Wait` and backpressure.
    pub(crate) wait: LayerQueues<KeyOf<X>>,
    /// How the waiting modes reach a store as an in-memory limiter: set by the
    /// builder of in-memory limiters, the only stores that can wait.
    pub(crate) local: Option<AsLocal<St, KeyOf<X>>>,
    /// The key `poll_ready` reserves a unit of: the global limit's `()` under
    /// backpressure (not in a dry run); `None` otherwise.
    pub(crate) reserve_key: Option<KeyOf<X>>,
    /// How admitted requests settle after their response: `None` when they
    /// do not (their units stay counted as admitted).
    pub(crate) settle: Option<SettleConfig>,
}

impl<X: Keyed, St, M> Shared<X, St, M> {
    /// `key` for log events: only when the user opted in.
    pub(crate) fn loggable_key<'a>(&'a self, key: &'a KeyOf<X>) -> Option<LoggedKey<'a, KeyOf<X>>> {
        self.key_formatter
            .as_ref()
            .map(|format| LoggedKey { key, format })
    }

    /// True when admitted requests settle after their response.
    #[inline(always)]
    pub(crate) fn settles(&self) -> bool {
        self.settle.is_some()
    }

    /// True when over-limit requests wait rather than being rejected. A dry
    /// run never holds anything back.
    #[inline]
    pub(crate) fn waits(&self) -> bool {
        !self.dry_run && self.hold != Hold::Reject
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

/// A tower [`Layer`](tower_layer::Layer) that rate-limits requests with a
/// sliding window per key.
///
/// Built once, with [`new`](SlidingWindowLayer::new) or
/// [`builder`](SlidingWindowLayer::builder); the limiters are created then.
/// Clones of the layer and every service it makes share them, so the limit holds
/// across connections, though `axum::serve` and hyper clone the service for
/// each connection (and a stack built per connection calls
/// [`Layer::layer`](tower_layer::Layer::layer) each time).
///
/// The type parameters: `X` is the [key extractor](crate::extract) (with its
/// cost and exemption, if any), `St` the store of each policy (by default the
/// in-memory [`Limiter`] of `X`'s key), `M` how rejections are delivered
/// ([`HttpRejection`] by default, or
/// [`ErrorRejection`](crate::layer::ErrorRejection)). A layer stored in a
/// struct names what it needs:
///
/// ```
/// use tower_sliding_window::{HeaderKey, PeerIp, SlidingWindowLayer};
///
/// struct Limits {
///     per_api_key: SlidingWindowLayer<HeaderKey>,
///     per_ip: SlidingWindowLayer<PeerIp>,
/// }
/// ```
///
/// # Requirements on the inner service
///
/// With the in-memory limiters rejecting at once (the default) a request is
/// decided inside `call`, but the service type also serves the paths that
/// decide later (a request waiting its turn, a remote store's answer): they
/// move the inner service readied by `poll_ready` into the response future and
/// leave a clone behind. So the inner service must be `Clone + Send +
/// 'static` with a `Send + 'static` future, and the request `Send + 'static`,
/// as axum, hyper and tonic services and requests are. Wrap a service that is
/// not `Clone` in tower's `Buffer` first (see the [guide](crate::guide)).
pub struct SlidingWindowLayer<X: Keyed, St = Limiter<KeyOf<X>>, M = HttpRejection> {
    pub(crate) shared: Arc<Shared<X, St, M>>,
}

impl<X: Keyed, St, M> Clone for SlidingWindowLayer<X, St, M> {
    fn clone(&self) -> Self {
        SlidingWindowLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<X: Keyed, St, M> fmt::Debug for SlidingWindowLayer<X, St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .shared
            .policies
            .limits
            .iter()
            .map(|l| &*l.name)
            .collect();
        let tiers: Option<Vec<String>> = self
            .shared
            .tiers
            .as_ref()
            .map(|t| t.config().iter().map(|(name, _)| name.to_owned()).collect());
        f.debug_struct("SlidingWindowLayer")
            .field("policies", &names)
            .field("tiers", &tiers)
            .field("hold", &self.shared.hold)
            .field("dry_run", &self.shared.dry_run)
            .finish_non_exhaustive()
    }
}

impl<X: Keyed, St: Store<KeyOf<X>>, M> SlidingWindowLayer<X, St, M>
where
    X::Tiering: NamesTiers,
{
    /// A handle that changes this layer's table of tiers, and that clones
    /// and stores without naming the extractor's type: for an admin endpoint
    /// (see [`TierHandle`]). The layer's own `set_tiers`, `set_tier` and
    /// `add_tier` do the same.
    pub fn tier_handle(&self) -> TierHandle<KeyOf<X>, St> {
        TierHandle::new(self.shared.tiers.clone())
    }

    /// Replace the table of tiers while requests flow; each request is decided
    /// by the table in force when it arrived. A policy whose tier had a
    /// policy of the same name before keeps that store's counts: its store is
    /// [reconfigured](Store::reconfigured), so raising a limit gives room at
    /// once and lowering it denies until the units already admitted have left
    /// the window (a change of window or buckets carries the counts over
    /// conservatively; the [tiers chapter](crate::guide::tiers) states the
    /// guarantee). A tier left as it was keeps its stores untouched, and one
    /// made unlimited or denied keeps them to resume from when limited again;
    /// a new tier or policy starts empty. Policies are matched by name (a
    /// default name goes by the policy's position in its tier), so give a
    /// policy a [name](crate::PolicyBuilder::name) of its own to keep its
    /// counts when the tier's other policies change other than at the end.
    ///
    /// Errors, with nothing changed: a store that cannot change its policy
    /// ([`ConfigError::PolicyFixed`]), a fallback tier missing from `tiers`,
    /// or a store that could not be made.
    pub fn set_tiers(&self, tiers: &Tiers) -> Result<(), ConfigError> {
        self.tier_handle().set_tiers(tiers)
    }

    /// Add one tier after the others: one the table already has is
    /// [`ConfigError::DuplicateTier`], and nothing changes. A new tier starts
    /// empty.
    pub fn add_tier(&self, tier: &str, limits: TierLimits) -> Result<(), ConfigError> {
        self.tier_handle().add_tier(tier, limits)
    }

    /// Change one tier, keeping the others: see [`set_tiers`](Self::set_tiers)
    /// for what the change keeps. The table must have the tier: a name it
    /// lacks (a typo, say) is [`ConfigError::UnknownTier`] and changes
    /// nothing; add a tier with [`add_tier`](Self::add_tier).
    ///
    /// ```
    /// use http::{Request, StatusCode};
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_sliding_window::{tiered_key_fn, SlidingWindowLayer, TierLimits, Tiers};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let tiers = Tiers::builder().limited("free", ["1/min".parse()?]).build()?;
    /// let layer = SlidingWindowLayer::builder(tiered_key_fn(|_: &Request<()>| Some(("free", "ada"))))
    ///     .tiers(tiers)
    ///     .build()?;
    /// let svc = layer.layer(service_fn(|_req: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
    /// }));
    /// let mut statuses = Vec::new();
    /// for _ in 0..2 {
    ///     statuses.push(svc.clone().oneshot(Request::new(())).await?.status());
    /// }
    /// assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    ///
    /// // Raised while the first request still counts: room for one more.
    /// layer.set_tier("free", TierLimits::Limited(vec!["2/min".parse()?]))?;
    /// statuses.clear();
    /// for _ in 0..2 {
    ///     statuses.push(svc.clone().oneshot(Request::new(())).await?.status());
    /// }
    /// assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    ///
    /// // A typo changes nothing.
    /// let typo = layer.set_tier("fre", TierLimits::Unlimited).unwrap_err();
    /// assert!(matches!(typo, tower_sliding_window::ConfigError::UnknownTier { .. }));
    /// # Ok(()) }
    /// ```
    pub fn set_tier(&self, tier: &str, limits: TierLimits) -> Result<(), ConfigError> {
        self.tier_handle().set_tier(tier, limits)
    }
}

/// The stores of one tier of a layer, from
/// [`SlidingWindowLayer::tier_stores`].
pub struct TierStores<St> {
    policies: Arc<Policies<St>>,
}

impl<St> TierStores<St> {
    /// The stores, one per policy of the tier, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &St> + '_ {
        self.policies.limits.iter().map(|l| &l.store)
    }
}

impl<St> fmt::Debug for TierStores<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.policies.limits.iter().map(|l| &*l.name).collect();
        f.debug_struct("TierStores")
            .field("policies", &names)
            .finish()
    }
}

impl<X: Keyed, St, M> SlidingWindowLayer<X, St, M> {
    /// The layer's stores, one per policy, in the order they were added: read
    /// their counters (for the in-memory [`Limiter`], [`Limiter::stats`] and
    /// [`Limiter::usage`]). With several policies, a store's `admitted` also
    /// counts requests another policy denied (their units were given back).
    /// None for a layer of tiers: see [`tier_stores`](Self::tier_stores).
    pub fn stores(&self) -> impl ExactSizeIterator<Item = &St> + '_ {
        self.shared.policies.limits.iter().map(|l| &l.store)
    }

    /// The layer's own counters (dry-run rejections, missing keys, store errors).
    pub fn stats(&self) -> LayerStats {
        self.shared.events.stats()
    }

    /// The table of tiers in force (`None` for a layer of policies).
    pub fn tiers(&self) -> Option<Tiers> {
        self.shared.tiers.as_ref().map(TierState::config)
    }

    /// The stores of limited tier `tier` now, one per policy, to read their
    /// counters; `None` for a tier that is not limited or not in the table,
    /// or a layer of policies. A later change of the tier leaves these as
    /// they are (they stay usable) and puts new stores in the layer.
    pub fn tier_stores(&self, tier: &str) -> Option<TierStores<St>> {
        let policies = self.shared.tiers.as_ref()?.policies(tier)?;
        Some(TierStores { policies })
    }

    /// Totals of the waiting modes: admissions at once and after a wait,
    /// rejections by reason, cancellations, timers (all zero in reject mode).
    pub fn wait_stats(&self) -> WaitStats {
        self.shared.wait.stats()
    }
}

//! Building a layer: its settings, checked once in `build`, and where its
//! counts live.
//!
//! A builder starts [`Unset`]: no policy yet. [`policy`](SlidingWindowLayerBuilder::policy)
//! (and the settings of in-memory limiters: `max_keys`, `clock`, waiting,
//! `sweep_idle`) makes it [`InMemory`]; [`store`](SlidingWindowLayerBuilder::store) makes it
//! [`Stores`]. The two do not mix, and settings that only in-memory limiters
//! have (a clock, a key cap, waiting, sweeping) do not exist on a builder of stores: a
//! mistake there does not compile, rather than failing when the layer is built.

use super::events::LayerEvents;
use super::local::{AsLocal, LayerQueues, LocalStore};
use super::rejection::{CustomResponse, ErrorRejection, HttpRejection, ModeConfig, ProblemDetails};
use super::settle::{SettleConfig, Unsettled};
use super::shared::{Hold, KeyFormatter, MissingKey, OnLimit, Shared, SlidingWindowLayer};
use super::tiers::{Policies, StoreFactory, TierState};
use crate::clock::{AutoClock, Clock};
use crate::error::ConfigError;
use crate::extract::{
    Exemption, GlobalExtractor, KeyExtractor, KeyOf, Keyed, KeysAlone, NamesTiers, RequestCost,
    Tiering, WithCost, WithExemption,
};
use crate::limiter::Limiter;
use crate::metrics::LayerMetrics;
use crate::policy::Policy;
use crate::store::Store;
use crate::tier::Tiers;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A builder with no policy yet: give it [`policy`](SlidingWindowLayerBuilder::policy)s
/// or [`store`](SlidingWindowLayerBuilder::store)s.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct Unset;

/// Builds the clock of each in-memory limiter: from its policy and whether the
/// layer waits. `Send + Sync`, so a builder can be held across an `.await` in a
/// spawned task (while a store connects, say).
type ClockFactory<C> = Box<dyn Fn(&Policy, bool) -> C + Send + Sync>;

/// A builder of in-memory limiters, one per [`Policy`], reading clock `C`.
pub struct InMemory<C = AutoClock> {
    policies: Vec<Policy>,
    tiers: Option<Tiers>,
    max_keys: usize,
    clock: ClockFactory<C>,
    hold: Hold,
    sweep: Option<Sweep>,
}

/// How often each in-memory limiter sweeps idle keys in the background.
#[derive(Debug, Clone, Copy)]
enum Sweep {
    /// Every bucket width of its own policy.
    EveryBucket,
    Every(Duration),
}

impl<C> fmt::Debug for InMemory<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemory")
            .field("policies", &self.policies)
            .field("tiers", &self.tiers)
            .field("max_keys", &self.max_keys)
            .field("clock", &std::any::type_name::<C>())
            .field("hold", &self.hold)
            .field("sweep", &self.sweep)
            .finish()
    }
}

impl Default for InMemory {
    fn default() -> Self {
        InMemory {
            policies: Vec::new(),
            tiers: None,
            max_keys: Limiter::<(), AutoClock>::DEFAULT_MAX_KEYS,
            clock: Box::new(|policy, waits| {
                // A waiting layer sleeps on tokio timers, so its limiters read
                // tokio's clock and a wait ends when the window allows.
                if waits {
                    AutoClock::tokio()
                } else {
                    AutoClock::for_bucket(policy.bucket_width())
                }
            }),
            hold: Hold::Reject,
            sweep: None,
        }
    }
}

/// Where counts live, as far as the settings of in-memory limiters go: not
/// chosen yet ([`Unset`]) or [`InMemory`] limiters. Sealed: a builder given
/// [`Stores`] takes none of those settings (each store keeps its own).
pub trait InMemoryOrUnset: sealed::Sealed {
    /// The in-memory limiters' clock.
    type Clock;
    #[doc(hidden)]
    fn into_in_memory(self) -> InMemory<Self::Clock>;
}

impl InMemoryOrUnset for Unset {
    type Clock = AutoClock;
    fn into_in_memory(self) -> InMemory {
        InMemory::default()
    }
}

impl<C> InMemoryOrUnset for InMemory<C> {
    type Clock = C;
    fn into_in_memory(self) -> InMemory<C> {
        self
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Unset {}
    impl<C> Sealed for super::InMemory<C> {}
}

/// A builder of stores given one by one, all of type `St`.
#[derive(Debug)]
pub struct Stores<St> {
    stores: Vec<St>,
}

/// The builder settings that do not change with where counts live.
struct Settings<K> {
    missing_key: MissingKey<K>,
    dry_run: bool,
    key_formatter: Option<KeyFormatter<K>>,
    /// The key `poll_ready` reserves a unit of under backpressure: the
    /// global key, set by `backpressure()`.
    reserve_key: Option<K>,
    /// Set by the HTTP rejection settings (`status()`, `grpc_status()`, the
    /// header options, `reject_with()`), which `reject_with_errors()` has none of.
    http_rejection: bool,
    /// A layer of tiers: the tier that requests of a tier the table lacks
    /// are decided by.
    unknown_tier_fallback: Option<Box<str>>,
    /// How admitted requests settle after their response (HTTP mode).
    settle: Option<SettleConfig>,
    /// A mistake found while configuring, reported by `build()`.
    error: Option<ConfigError>,
}

/// A builder of stores for a table of tiers, made by a factory, all of type
/// `St`.
pub struct TieredStores<St> {
    tiers: Tiers,
    factory: StoreFactory<St>,
}

impl<St> fmt::Debug for TieredStores<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TieredStores")
            .field("tiers", &self.tiers)
            .finish_non_exhaustive()
    }
}

/// Where a layer's counts live, as `finish` takes them.
enum Counts<St> {
    /// One set of policies for every request.
    Policies(Vec<St>),
    /// A table of tiers, and how to make the store of a policy.
    Tiers(Tiers, StoreFactory<St>),
}

/// Builder for [`SlidingWindowLayer`]; [`build`](Self::build) validates
/// everything.
///
/// `X` is the key extractor (with its cost and exemption), `Place` where the
/// counts will live ([`Unset`], [`InMemory`] limiters or given [`Stores`]),
/// `M` how rejections are delivered.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, StatusCode};
/// use tower_sliding_window::{HeaderKey, MissingKey, Policy, SlidingWindowLayer};
///
/// let layer = SlidingWindowLayer::builder(HeaderKey::named("x-api-key")?)
///     .policy(Policy::builder().name("burst").limit(10).window(Duration::from_secs(1)).build()?)
///     .policy(Policy::builder().name("hourly").limit(1000).window(Duration::from_secs(3600)).build()?)
///     .missing_key(MissingKey::Fallback("anonymous".to_owned()))
///     .cost(|req: &Request<()>| if req.method() == "POST" { 5 } else { 1 })
///     .status(StatusCode::SERVICE_UNAVAILABLE)
///     .legacy_headers(true)
///     .build()?;
/// assert_eq!(layer.stores().len(), 2);
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build` makes the layer"]
pub struct SlidingWindowLayerBuilder<X: Keyed, Place = Unset, M = HttpRejection> {
    extractor: X,
    stores: Place,
    mode: M,
    settings: Settings<KeyOf<X>>,
}

impl<X: Keyed, Place: fmt::Debug, M: fmt::Debug> fmt::Debug
    for SlidingWindowLayerBuilder<X, Place, M>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindowLayerBuilder")
            .field("stores", &self.stores)
            .field("mode", &self.mode)
            .field("dry_run", &self.settings.dry_run)
            .finish_non_exhaustive()
    }
}

impl<X: Keyed> SlidingWindowLayer<X> {
    /// One in-memory policy per key from `extractor`, answering over-limit
    /// HTTP requests with 429 (gRPC: RESOURCE_EXHAUSTED) and rate-limit headers.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use http::{Request, Response, StatusCode};
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tower_sliding_window::{HeaderKey, Policy, SlidingWindowLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = SlidingWindowLayer::new(
    ///     Policy::per(1, Duration::from_secs(60))?,
    ///     HeaderKey::named("x-user")?,
    /// )?;
    /// let svc = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
    ///
    /// let req = || Request::builder().header("x-user", "ada").body(String::new()).unwrap();
    /// assert_eq!(svc.clone().oneshot(req()).await?.status(), StatusCode::OK);
    /// let limited = svc.clone().oneshot(req()).await?;
    /// assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    /// // Whole seconds, rounded up: a window after the first request, to a
    /// // step of its bucket.
    /// assert_eq!(limited.headers()["retry-after"], "61");
    /// # Ok(()) }
    /// ```
    pub fn new(policy: Policy, extractor: X) -> Result<Self, ConfigError>
    where
        X::Tiering: KeysAlone,
    {
        SlidingWindowLayer::builder(extractor)
            .policy(policy)
            .build()
    }

    /// Start configuring a layer that keys requests with `extractor`.
    pub fn builder(extractor: X) -> SlidingWindowLayerBuilder<X> {
        SlidingWindowLayerBuilder {
            extractor,
            stores: Unset,
            mode: HttpRejection::default(),
            settings: Settings {
                missing_key: MissingKey::Reject,
                dry_run: false,
                key_formatter: None,
                reserve_key: None,
                http_rejection: false,
                unknown_tier_fallback: None,
                settle: None,
                error: None,
            },
        }
    }
}

impl<X: Keyed, Place, M> SlidingWindowLayerBuilder<X, Place, M> {
    /// Where counts live, and the builder of the other settings, which
    /// `finish` takes.
    fn take_stores(self) -> (Place, SlidingWindowLayerBuilder<X, Unset, M>) {
        let SlidingWindowLayerBuilder {
            extractor,
            stores,
            mode,
            settings,
        } = self;
        let rest = SlidingWindowLayerBuilder {
            extractor,
            stores: Unset,
            mode,
            settings,
        };
        (stores, rest)
    }

    /// The same settings, with counts living in `stores`.
    fn with_stores<Place2>(self, stores: Place2) -> SlidingWindowLayerBuilder<X, Place2, M> {
        SlidingWindowLayerBuilder {
            extractor: self.extractor,
            stores,
            mode: self.mode,
            settings: self.settings,
        }
    }

    /// What a request without a key gets (default [`MissingKey::Reject`]).
    pub fn missing_key(mut self, missing_key: MissingKey<KeyOf<X>>) -> Self {
        self.settings.missing_key = missing_key;
        self
    }

    /// Decide, count and set headers, but never reject: would-be rejections are
    /// forwarded, logged at INFO and counted in
    /// [`LayerStats::dry_run_rejections`](crate::layer::LayerStats::dry_run_rejections).
    /// For rolling out a new limit safely. A request one policy would deny
    /// consumes nothing from the others, exactly as when enforcing; nothing
    /// waits.
    ///
    /// In HTTP mode every forwarded response that was decided carries the
    /// rate-limit headers (as with [`headers_on_allowed(true)`](Self::headers_on_allowed)):
    /// a would-be rejection shows the remaining units that its cost did not fit
    /// (`r=0` with unit costs) and its `t`. A request whose store could not
    /// answer has no decision to report: it is forwarded without them, and
    /// counted in `store_errors` as it would be when enforcing. A request
    /// without a key is forwarded too, whatever [`MissingKey`] says (and
    /// counted in `key_missing`), so a misconfigured extractor shows in the
    /// stats and logs before it blocks anyone.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.settings.dry_run = dry_run;
        self
    }

    /// Log keys in rejection events, formatted with `Debug`. Off by default: keys
    /// are often personal data (IP addresses, API keys).
    pub fn log_keys(self) -> Self
    where
        KeyOf<X>: fmt::Debug,
    {
        self.log_keys_with(|key: &KeyOf<X>, f: &mut fmt::Formatter<'_>| fmt::Debug::fmt(key, f))
    }

    /// Log keys in rejection events, formatted by `format` (hash or truncate them,
    /// say). Off by default.
    pub fn log_keys_with<F>(mut self, format: F) -> Self
    where
        F: Fn(&KeyOf<X>, &mut fmt::Formatter<'_>) -> fmt::Result + Send + Sync + 'static,
    {
        self.settings.key_formatter = Some(Arc::new(format));
        self
    }

    /// The units a request costs (default 1 per request): a closure
    /// `Fn(&Req) -> u32`, boxed or shared in an `Arc`, or a [`RequestCost`].
    /// It wraps the extractor ([`WithCost`]), so the layer's type still has
    /// one extractor parameter.
    pub fn cost<Req, C>(self, cost: C) -> SlidingWindowLayerBuilder<WithCost<X, C>, Place, M>
    where
        X: KeyExtractor<Req>,
        C: RequestCost<Req>,
    {
        SlidingWindowLayerBuilder {
            extractor: WithCost::new(self.extractor, cost),
            stores: self.stores,
            mode: self.mode,
            settings: self.settings,
        }
    }

    /// Requests for which `exempt` is true bypass the limit (not counted, no
    /// headers): health checks, an allowlist of internal callers. A closure
    /// `Fn(&Req) -> bool`, boxed or shared in an `Arc`, or an [`Exemption`];
    /// it wraps the extractor ([`WithExemption`]). Under
    /// [backpressure](Self::backpressure) they still wait in `poll_ready`,
    /// which cannot see the request.
    pub fn exempt<Req, E>(
        self,
        exempt: E,
    ) -> SlidingWindowLayerBuilder<WithExemption<X, E>, Place, M>
    where
        X: KeyExtractor<Req>,
        E: Exemption<Req>,
    {
        SlidingWindowLayerBuilder {
            extractor: WithExemption::new(self.extractor, exempt),
            stores: self.stores,
            mode: self.mode,
            settings: self.settings,
        }
    }

    /// Reject with error values instead of HTTP responses: for request types that
    /// are not `http::Request`. The service's error becomes
    /// [`BoxError`](tower::BoxError), holding a [`RateLimited`](crate::RateLimited),
    /// a [`KeyMissing`](crate::layer::KeyMissing) or a [`StoreError`](crate::StoreError).
    /// The HTTP rejection settings ([`status`](Self::status),
    /// [`grpc_status`](Self::grpc_status), the header options,
    /// [`reject_with`](Self::reject_with)) have no meaning then: set before it,
    /// they are a [`ConfigError::HttpSettingsIgnored`] from `build`.
    pub fn reject_with_errors(mut self) -> SlidingWindowLayerBuilder<X, Place, ErrorRejection> {
        if self.settings.http_rejection {
            self.settings
                .error
                .get_or_insert(ConfigError::HttpSettingsIgnored);
        }
        SlidingWindowLayerBuilder {
            extractor: self.extractor,
            stores: self.stores,
            mode: ErrorRejection,
            settings: self.settings,
        }
    }

    /// A layer of tiers: decide requests whose tier the table does not have
    /// (the extractor named a tier that is not, or no longer, in it) by tier
    /// `tier` instead of rejecting them with 500. `tier` must be in the table
    /// (checked by `build` and by every change of the table).
    pub fn unknown_tier_fallback(mut self, tier: impl Into<String>) -> Self
    where
        X::Tiering: NamesTiers,
    {
        self.settings.unknown_tier_fallback = Some(tier.into().into_boxed_str());
        self
    }

    /// Everything `build` checks beside the stores, and the layer around them.
    fn finish<St>(
        self,
        counts: Counts<St>,
        hold: Hold,
        local: Option<AsLocal<St, KeyOf<X>>>,
    ) -> Result<SlidingWindowLayer<X, St, M>, ConfigError>
    where
        St: Store<KeyOf<X>>,
        M: ModeConfig,
    {
        let SlidingWindowLayerBuilder {
            extractor,
            mut mode,
            settings,
            ..
        } = self;
        if let Some(error) = settings.error {
            return Err(error);
        }
        mode.validate()?;
        if settings.dry_run {
            mode.headers_on_every_response();
        }
        let (policies, tiers, metrics) = match counts {
            // The builder's methods keep tiers and an extractor of keys alone
            // apart at compile time; a tiered extractor can still reach here
            // without its table (`max_keys` then `build`).
            Counts::Policies(_) if <X::Tiering as Tiering>::NAMES_TIERS => {
                return Err(ConfigError::NoTiers)
            }
            Counts::Policies(stores) => {
                let policies = Policies::new(stores)?;
                let metrics = LayerMetrics::policies(policies.limits.iter().map(|l| &*l.name));
                (policies, None, metrics)
            }
            Counts::Tiers(tiers, factory) => {
                // A layer of tiers never waits: `on_limit` and `backpressure`
                // take extractors of keys alone.
                debug_assert_eq!(hold, Hold::Reject);
                if matches!(settings.missing_key, MissingKey::Fallback(_)) {
                    return Err(ConfigError::NotWithTiers {
                        setting: "MissingKey::Fallback (name a tier and key for such requests in the extractor)",
                    });
                }
                let metrics = LayerMetrics::tiers();
                let state =
                    TierState::new(&tiers, factory, settings.unknown_tier_fallback.clone())?;
                (Policies::none(), Some(state), metrics)
            }
        };
        let reserve_key = settings
            .reserve_key
            .filter(|_| hold == Hold::Backpressure && !settings.dry_run);
        Ok(SlidingWindowLayer {
            shared: Arc::new(Shared {
                missing_key_status: mode
                    .missing_key_status()
                    .unwrap_or_else(|| extractor.missing_key_status()),
                extractor,
                policies: Arc::new(policies),
                tiers,
                mode,
                missing_key: settings.missing_key,
                hold,
                dry_run: settings.dry_run,
                key_formatter: settings.key_formatter,
                events: LayerEvents::new(metrics),
                wait: LayerQueues::new(hold.wait_config()),
                local,
                reserve_key,
                settle: settings.settle,
            }),
        })
    }
}

/// Where counts live is not chosen yet.
impl<X: Keyed, M> SlidingWindowLayerBuilder<X, Unset, M> {
    /// Decide each request by the policies of its tier, each in a store that
    /// `factory` makes from the tier's name and the policy (at `build`, and
    /// for a tier or policy that a change of the table adds): Redis stores
    /// sharing one connection, say. A change of a policy's limit or window
    /// reconfigures its store ([`Store::reconfigured`]), keeping its counts.
    pub fn tier_stores<St, F>(
        self,
        tiers: Tiers,
        factory: F,
    ) -> SlidingWindowLayerBuilder<X, TieredStores<St>, M>
    where
        X::Tiering: NamesTiers,
        St: Store<KeyOf<X>>,
        F: Fn(&str, &Policy) -> Result<St, ConfigError> + Send + Sync + 'static,
    {
        self.with_stores(TieredStores {
            tiers,
            factory: Box::new(factory),
        })
    }

    /// Decide with `store` for one more policy (its own [`Store::policy`]),
    /// such as a Redis store shared by a fleet. Every store of a layer has one
    /// type; stores do not mix with [`policy`](Self::policy), and the
    /// settings of in-memory limiters (a clock, a key cap, waiting) do not
    /// apply to them: each store keeps its own.
    pub fn store<St: Store<KeyOf<X>>>(
        self,
        store: St,
    ) -> SlidingWindowLayerBuilder<X, Stores<St>, M>
    where
        X::Tiering: KeysAlone,
    {
        self.with_stores(Stores {
            stores: vec![store],
        })
    }
}

/// The settings of in-memory limiters, one per policy: on a builder whose
/// counts have no place yet ([`Unset`]) they make it one of [`InMemory`]
/// limiters; a builder given [`Stores`] takes none of them.
impl<X: Keyed, Place: InMemoryOrUnset, M> SlidingWindowLayerBuilder<X, Place, M> {
    /// This builder, as one of in-memory limiters.
    fn in_memory(self) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M> {
        let b = SlidingWindowLayerBuilder {
            extractor: self.extractor,
            stores: (),
            mode: self.mode,
            settings: self.settings,
        };
        b.with_stores(self.stores.into_in_memory())
    }

    /// Decide each request by the policies of its tier, from a table of
    /// [`Tiers`], in in-memory [`Limiter`]s (one per policy of each limited
    /// tier, so a key's counts in one tier never touch another's): the builder
    /// becomes one of [`InMemory`] limiters, whose settings (`max_keys`, a
    /// clock, sweeping) apply to every tier's limiters. The extractor names
    /// each request's tier along with its key ([`tiered_key_fn`](crate::tiered_key_fn)).
    /// Change the table at run time with
    /// [`SlidingWindowLayer::set_tiers`]. A layer of tiers rejects at once
    /// (it does not wait) and has no fallback key.
    ///
    /// ```
    /// use http::Request;
    /// use tower_sliding_window::{tiered_key_fn, SlidingWindowLayer, Tiers};
    ///
    /// let tiers = Tiers::builder()
    ///     .limited("anonymous", ["20/min".parse()?])
    ///     .limited("paid", ["5000/min".parse()?])
    ///     .unlimited("internal")
    ///     .build()?;
    /// let layer = SlidingWindowLayer::builder(tiered_key_fn(|req: &Request<()>| {
    ///     let key = req.headers().get("x-api-key")?.to_str().ok()?;
    ///     Some((if key.starts_with("int_") { "internal" } else { "paid" }, key.to_owned()))
    /// }))
    /// .tiers(tiers)
    /// .build()?;
    /// assert_eq!(layer.tier_stores("paid").unwrap().iter().len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tiers(self, tiers: Tiers) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M>
    where
        X::Tiering: NamesTiers,
    {
        let mut b = self.in_memory();
        b.stores.tiers = Some(tiers);
        b
    }

    /// Add a policy, enforced by an in-memory [`Limiter`] created in
    /// [`build`](Self::build). Several policies are decided all-or-nothing.
    pub fn policy(self, policy: Policy) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M>
    where
        X::Tiering: KeysAlone,
    {
        let mut b = self.in_memory();
        b.stores.policies.push(policy);
        b
    }

    /// Add several policies at once, as [`policy`](Self::policy) does one by
    /// one: a builder's type changes with its first policy, so a list built
    /// at run time goes in here rather than through a loop of `policy`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{GlobalKey, Policy, SlidingWindowLayer};
    ///
    /// let limits = [(10, 1), (100, 60), (1000, 3600)];
    /// let policies = limits.iter().map(|&(limit, secs)| {
    ///     Policy::builder()
    ///         .name(format!("{limit}/{secs}s"))
    ///         .limit(limit)
    ///         .window(Duration::from_secs(secs))
    ///         .build()
    /// });
    /// let layer = SlidingWindowLayer::builder(GlobalKey)
    ///     .policies(policies.collect::<Result<Vec<_>, _>>()?)
    ///     .build()?;
    /// assert_eq!(layer.stores().len(), 3);
    /// # Ok::<(), tower_sliding_window::ConfigError>(())
    /// ```
    pub fn policies(
        self,
        policies: impl IntoIterator<Item = Policy>,
    ) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M>
    where
        X::Tiering: KeysAlone,
    {
        let mut b = self.in_memory();
        b.stores.policies.extend(policies);
        b
    }

    /// The most keys each in-memory limiter tracks (default
    /// [`Limiter::DEFAULT_MAX_KEYS`]; see [`Limiter`] for what happens at the cap).
    pub fn max_keys(
        self,
        max_keys: usize,
    ) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M> {
        let mut b = self.in_memory();
        b.stores.max_keys = max_keys;
        b
    }

    /// Also sweep idle keys from a tokio task (off by default): each
    /// in-memory limiter once every bucket width of its policy. Checks sweep
    /// by themselves, but only while traffic lasts, and never hand memory
    /// back; with this, keys left by a flood are gone within a window and a
    /// bucket with no traffic at all, and the memory of the tables they leave
    /// goes back to the system (see the [memory guide](crate::guide::memory)).
    /// See
    /// [`LimiterBuilder::sweep_idle_every`](crate::store::LimiterBuilder::sweep_idle_every)
    /// for the cost, the clocks and when the task ends (when the layer and
    /// every service made from it are dropped).
    ///
    /// [`build`](Self::build) spawns one task per policy on the current tokio
    /// runtime: build the layer inside one (in `#[tokio::main]`, say); outside
    /// one, `build` returns [`ConfigError::NoRuntime`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{PeerIp, Policy, SlidingWindowLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_sliding_window::ConfigError> {
    /// let layer = SlidingWindowLayer::builder(PeerIp::new())
    ///     .policy(Policy::per(100, Duration::from_secs(60))?)
    ///     .sweep_idle()
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn sweep_idle(self) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M> {
        let mut b = self.in_memory();
        b.stores.sweep = Some(Sweep::EveryBucket);
        b
    }

    /// Also sweep idle keys from a tokio task, every `every` for every
    /// in-memory limiter, rather than every bucket width as
    /// [`sweep_idle`](Self::sweep_idle) does: a longer period costs less
    /// with millions of keys, and keys then stay up to that much longer. A
    /// zero `every` is [`ConfigError::Zero`].
    pub fn sweep_idle_every(
        self,
        every: Duration,
    ) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M> {
        let mut b = self.in_memory();
        b.stores.sweep = Some(Sweep::Every(every));
        b
    }

    /// The clock of the in-memory limiters. The default is an [`AutoClock`] per
    /// policy: tokio's clock when the layer is built in a paused runtime (tests
    /// drive it with `tokio::time::advance`) or when it waits
    /// ([`OnLimit::Wait`], [backpressure](Self::backpressure): its waits are
    /// tokio timers); otherwise the cheapest monotonic clock fine enough for
    /// the policy's bucket.
    pub fn clock<C2: Clock + Clone>(
        self,
        clock: C2,
    ) -> SlidingWindowLayerBuilder<X, InMemory<C2>, M> {
        let b = self.in_memory();
        let InMemory {
            policies,
            tiers,
            max_keys,
            hold,
            sweep,
            ..
        } = b.stores;
        let stores = InMemory {
            policies,
            tiers,
            max_keys,
            clock: Box::new(move |_: &Policy, _| clock.clone()),
            hold,
            sweep,
        };
        SlidingWindowLayerBuilder {
            extractor: b.extractor,
            stores,
            mode: b.mode,
            settings: b.settings,
        }
    }

    /// What happens to a request over the limit (default [`OnLimit::Reject`]).
    pub fn on_limit(
        self,
        on_limit: OnLimit,
    ) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M>
    where
        X::Tiering: KeysAlone,
    {
        let mut b = self.in_memory();
        b.stores.hold = match on_limit {
            OnLimit::Reject => Hold::Reject,
            OnLimit::Wait(config) => Hold::Wait(config),
        };
        b
    }

    /// For a global limit ([`GlobalKey`](crate::GlobalKey)): `poll_ready`
    /// returns `Pending` while the window is full and reserves a unit when
    /// ready, which the next `call` spends (a clone, or a service dropped
    /// without calling, gives it back). Every clone waiting on the limit is
    /// served in turn. A unit reserved while the inner service was not ready
    /// yet, and whose bucket passed before it was (a saturated
    /// `ConcurrencyLimit` below), is renewed before `poll_ready` returns
    /// `Ready`: at once, or by waiting at the front of the queue, ahead of the
    /// clones that asked after it. A `call` without a reservation (no
    /// `poll_ready`, or a request costing more than one unit) waits for its
    /// turn in its response future instead, as with [`OnLimit::Wait`] unbounded.
    /// `poll_ready` cannot see the request, so an [exempt](Self::exempt)
    /// request too waits there for a unit; its `call` gives the unit back
    /// unused.
    ///
    /// Only a global limit can hold back `poll_ready`, which sees no request
    /// and so no key: for a keyed limit, use [`OnLimit::Wait`]. Clones wait in
    /// one queue, in turn, and the one at its head keeps the queue's timer: a
    /// clone whose `poll_ready` returned `Pending` must be polled again or
    /// dropped. One kept but no longer polled (say `timeout(d, svc.ready())`
    /// that expired, with `svc` kept for later) holds the head, and the clones
    /// behind it wait until it is polled or dropped.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{GlobalKey, Policy, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::builder(GlobalKey)
    ///     .policy(Policy::per(100, Duration::from_secs(1))?)
    ///     .backpressure()
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_sliding_window::ConfigError>(())
    /// ```
    pub fn backpressure(self) -> SlidingWindowLayerBuilder<X, InMemory<Place::Clock>, M>
    where
        X: GlobalExtractor,
    {
        let mut b = self.in_memory();
        b.stores.hold = Hold::Backpressure;
        b.settings.reserve_key = Some(());
        b
    }
}

/// In-memory limiters, one per policy.
impl<X: Keyed, C, M> SlidingWindowLayerBuilder<X, InMemory<C>, M> {
    /// Validate the configuration and create the limiters.
    ///
    /// Errors: no policy, more than [`MAX_POLICIES`](crate::layer::MAX_POLICIES), a policy name that is
    /// not [valid](crate::PolicyBuilder::name) or is used twice, a rejection status that is not
    /// 4xx/5xx, a gRPC code outside 1..=16, HTTP rejection settings followed
    /// by [`reject_with_errors`](Self::reject_with_errors), and any limiter
    /// configuration error (`max_keys` 0, a bucket below the clock's
    /// resolution, a sweep period of zero, or a sweeper outside a tokio runtime).
    #[allow(clippy::type_complexity)] // the layer type, spelled out for the reader
    pub fn build(self) -> Result<SlidingWindowLayer<X, Limiter<KeyOf<X>, C>, M>, ConfigError>
    where
        C: Clock,
        M: ModeConfig,
    {
        let (stores, builder) = self.take_stores();
        let InMemory {
            policies,
            tiers,
            max_keys,
            clock,
            hold,
            sweep,
        } = stores;
        let waits = !builder.settings.dry_run && hold != Hold::Reject;
        let make = move |policy: &Policy, waits: bool| {
            let limiter = Limiter::builder(policy.clone())
                .clock(clock(policy, waits))
                .max_keys(max_keys);
            match sweep {
                None => limiter,
                Some(Sweep::EveryBucket) => limiter.sweep_idle(),
                Some(Sweep::Every(every)) => limiter.sweep_idle_every(every),
            }
            .build::<KeyOf<X>>()
        };
        let counts = match tiers {
            None => Counts::Policies(
                policies
                    .iter()
                    .map(|policy| make(policy, waits))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            // `policy` and `tiers` take extractors of different kinds, so a
            // builder never has both; a layer of tiers never waits.
            Some(tiers) => Counts::Tiers(tiers, Box::new(move |_, policy| make(policy, false))),
        };
        builder.finish(counts, hold, Some(as_local::<KeyOf<X>, C>))
    }
}

/// The in-memory limiter as the waiting modes reach it.
fn as_local<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static, C: Clock>(
    limiter: &Limiter<K, C>,
) -> &dyn LocalStore<K> {
    limiter
}

/// Stores given one by one.
impl<X: Keyed, St: Store<KeyOf<X>>, M> SlidingWindowLayerBuilder<X, Stores<St>, M> {
    /// Decide with `store` for one more policy; every store of a layer has
    /// one type.
    pub fn store(mut self, store: St) -> Self {
        self.stores.stores.push(store);
        self
    }

    /// Decide with each of `stores` for one more policy.
    pub fn stores(mut self, stores: impl IntoIterator<Item = St>) -> Self {
        self.stores.stores.extend(stores);
        self
    }

    /// Validate the configuration and take the stores.
    ///
    /// Errors: more than [`MAX_POLICIES`](crate::layer::MAX_POLICIES), a policy name that is not
    /// [valid](crate::PolicyBuilder::name) or is used twice, a rejection status that is not
    /// 4xx/5xx, a gRPC code outside 1..=16, and HTTP rejection settings
    /// followed by [`reject_with_errors`](Self::reject_with_errors).
    pub fn build(self) -> Result<SlidingWindowLayer<X, St, M>, ConfigError>
    where
        M: ModeConfig,
    {
        let (stores, builder) = self.take_stores();
        builder.finish(Counts::Policies(stores.stores), Hold::Reject, None)
    }
}

/// Stores for a table of tiers.
impl<X: Keyed, St: Store<KeyOf<X>>, M> SlidingWindowLayerBuilder<X, TieredStores<St>, M> {
    /// Validate the configuration and make every tier's stores.
    ///
    /// Errors: those of [`Stores`]' `build` for each tier's stores, an
    /// extractor that does not name tiers, a fallback tier not in the table,
    /// and any error of the factory.
    pub fn build(self) -> Result<SlidingWindowLayer<X, St, M>, ConfigError>
    where
        M: ModeConfig,
    {
        let (stores, builder) = self.take_stores();
        let counts = Counts::Tiers(stores.tiers, stores.factory);
        builder.finish(counts, Hold::Reject, None)
    }
}

#[cfg(all(test, not(tsw_loom)))]
impl<X: Keyed, St: Store<KeyOf<X>>, M: ModeConfig> SlidingWindowLayerBuilder<X, Stores<St>, M> {
    /// A layer of these stores that waits, as only in-memory limiters can:
    /// for tests whose stores wrap a limiter (`local` reaches it).
    pub(crate) fn build_waiting(
        self,
        config: crate::wait::WaitConfig,
        local: AsLocal<St, KeyOf<X>>,
    ) -> Result<SlidingWindowLayer<X, St, M>, ConfigError> {
        let (stores, builder) = self.take_stores();
        builder.finish(
            Counts::Policies(stores.stores),
            Hold::Wait(config),
            Some(local),
        )
    }
}

/// HTTP responses.
impl<X: Keyed, Place, R> SlidingWindowLayerBuilder<X, Place, HttpRejection<R>> {
    /// The same settings and header options, answering rejections with
    /// `response` (an HTTP rejection setting, as the header options are).
    fn with_response<R2>(
        self,
        response: R2,
    ) -> SlidingWindowLayerBuilder<X, Place, HttpRejection<R2>> {
        let SlidingWindowLayerBuilder {
            extractor,
            stores,
            mode,
            mut settings,
        } = self;
        settings.http_rejection = true;
        SlidingWindowLayerBuilder {
            extractor,
            stores,
            mode: HttpRejection {
                options: mode.options,
                response,
            },
            settings,
        }
    }

    /// The settings of settlement, made on first use.
    fn settle_config(&mut self) -> &mut SettleConfig {
        self.settings.http_rejection = true;
        self.settings
            .settle
            .get_or_insert_with(SettleConfig::default)
    }

    /// Count a request only if its response says so: `count_if(status,
    /// headers)` false gives back every unit the request counted. Reserve at
    /// admission, settle after the response: the units are counted when the
    /// request is admitted, so concurrent requests never pass the limit
    /// together (a hundred wrong passwords at once meet the limit as one
    /// after another would), and given back when the response arrives. The
    /// body is not read: the predicate sees the status and headers only,
    /// whatever the body type.
    ///
    /// For gRPC, a status other than OK that tonic answers before any message
    /// (a trailers-only response, as interceptors and most errors are) has
    /// its `grpc-status` among these headers: `headers.get("grpc-status")`
    /// reads it (`"16"` for UNAUTHENTICATED). A status sent after messages is
    /// in the trailers, which the layer does not read: settle those from the
    /// handler with the [`Settlement`](crate::Settlement) handle ([`settle_later`](Self::settle_later)).
    ///
    /// With [`settle`](Self::settle) too, `count_if` is asked first: a
    /// response that does not count settles to 0, one that counts to what
    /// `settle` says. Settlements read HTTP responses: a layer that then
    /// [`reject_with_errors`](Self::reject_with_errors) is a
    /// [`ConfigError::HttpSettingsIgnored`] from `build`. See the [guide](crate::guide::settling) for what a window
    /// holds, cancellation, errors and the handle.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use http::{Request, Response, StatusCode};
    /// use tower::{service_fn, ServiceBuilder, ServiceExt};
    /// use tower_sliding_window::{key_fn, Policy, SlidingWindowLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let by_user = key_fn(|req: &Request<String>| req.headers().get("x-user").map(|v| v.as_bytes().to_vec()));
    /// // At most 2 failed logins per user in 15 minutes; successes are free.
    /// let layer = SlidingWindowLayer::builder(by_user)
    ///     .policy(Policy::per(2, Duration::from_secs(15 * 60))?)
    ///     .count_if(|status, _| status == StatusCode::UNAUTHORIZED)
    ///     .build()?;
    /// let login = ServiceBuilder::new().layer(layer).service(service_fn(|req: Request<String>| async move {
    ///     let status = if req.body() == "right" { StatusCode::OK } else { StatusCode::UNAUTHORIZED };
    ///     Ok::<_, Infallible>(Response::builder().status(status).body(String::new()).unwrap())
    /// }));
    /// let attempt = |password: &str| Request::builder().header("x-user", "ada").body(password.to_owned()).unwrap();
    /// for _ in 0..5 {
    ///     assert_eq!(login.clone().oneshot(attempt("right")).await?.status(), StatusCode::OK);
    /// }
    /// assert_eq!(login.clone().oneshot(attempt("wrong")).await?.status(), StatusCode::UNAUTHORIZED);
    /// assert_eq!(login.clone().oneshot(attempt("wrong")).await?.status(), StatusCode::UNAUTHORIZED);
    /// assert_eq!(login.clone().oneshot(attempt("right")).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok(()) }
    /// ```
    pub fn count_if<F>(mut self, count_if: F) -> Self
    where
        F: Fn(http::StatusCode, &http::HeaderMap) -> bool + Send + Sync + 'static,
    {
        self.settle_config().count_if = Some(Arc::new(count_if));
        self
    }

    /// Settle a request at the cost its response says: `settle(status,
    /// headers)` returns the units it really cost, or `None` to keep what it
    /// was admitted with (its [`cost`](Self::cost), an estimate). Less than
    /// reserved: the difference is given back. More: the excess is charged to
    /// the key at once, past the limit if need be, and the key is denied
    /// until its window is back under the limit. The body is not read.
    ///
    /// What a window can hold when excesses are charged is in the
    /// [guide](crate::guide::settling): the limit, plus the excesses of
    /// requests that were in flight. A store that cannot count past its
    /// limit (one on the [`Store::charge`] default) gives back but does not
    /// charge; the Redis store charges in the background.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use http::{Request, Response, StatusCode};
    /// use tower::{service_fn, ServiceBuilder, ServiceExt};
    /// use tower_sliding_window::{key_fn, Policy, SlidingWindowLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let by_key = key_fn(|req: &Request<String>| req.headers().get("x-api-key").map(|v| v.as_bytes().to_vec()));
    /// // 1000 tokens a minute per API key; each request reserves 100.
    /// let layer = SlidingWindowLayer::builder(by_key)
    ///     .cost(|_: &Request<String>| 100)
    ///     .policy(Policy::per(1000, Duration::from_secs(60))?)
    ///     .settle(|_, headers| headers.get("x-tokens-used")?.to_str().ok()?.parse().ok())
    ///     .build()?;
    /// let api = ServiceBuilder::new().layer(layer.clone()).service(service_fn(|_: Request<String>| async {
    ///     Ok::<_, Infallible>(Response::builder().header("x-tokens-used", "950").body(String::new()).unwrap())
    /// }));
    /// let req = || Request::builder().header("x-api-key", "k1").body(String::new()).unwrap();
    /// assert_eq!(api.clone().oneshot(req()).await?.status(), StatusCode::OK);
    /// // 950 counted: the next reservation of 100 does not fit.
    /// assert_eq!(layer.stores().next().unwrap().usage(&b"k1".to_vec()).used, 950);
    /// assert_eq!(api.clone().oneshot(req()).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok(()) }
    /// ```
    pub fn settle<F>(mut self, settle: F) -> Self
    where
        F: Fn(http::StatusCode, &http::HeaderMap) -> Option<u32> + Send + Sync + 'static,
    {
        self.settle_config().settle = Some(Arc::new(settle));
        self
    }

    /// Put a [`Settlement`](crate::Settlement) in the extensions of every admitted request, for
    /// a handler (or a response body at its end) to settle the request when
    /// it knows the cost: settle to `n` units, or give all back. A handle
    /// dropped without a word keeps what the request counts. Once the handle
    /// has settled, [`count_if`](Self::count_if) and [`settle`](Self::settle)
    /// no longer apply to the request (see [`Settlement`](crate::Settlement)).
    pub fn settle_later(mut self) -> Self {
        self.settle_config().handle = true;
        self
    }

    /// What a request counts when the inner service fails (answers an error,
    /// not a response): [`Unsettled::Keep`] by default, or give it all back.
    /// An HTTP error status is a response, which [`count_if`](Self::count_if)
    /// and [`settle`](Self::settle) read; this is for the service's `Err`.
    pub fn settle_on_error(mut self, unsettled: Unsettled) -> Self {
        self.settle_config().on_error = unsettled;
        self
    }

    /// What a request counts when its response future is dropped before the
    /// response (the client went away, a timeout above the layer):
    /// [`Unsettled::Keep`] by default, or give it all back. Keeping is the safe
    /// side: the handler may have done the work (checked the password) before
    /// the caller left.
    pub fn settle_on_cancel(mut self, unsettled: Unsettled) -> Self {
        self.settle_config().on_cancel = unsettled;
        self
    }

    /// The status of a rate-limited plain HTTP response (default 429; some
    /// stacks use 503). Must be 4xx or 5xx. Also the status of a
    /// [`reject_with`](Self::reject_with) response that sets none of its own.
    pub fn status(mut self, status: http::StatusCode) -> Self {
        self.mode.options.status = status;
        self.settings.http_rejection = true;
        self
    }

    /// The status of a request without a key under [`MissingKey::Reject`]
    /// (default: the extractor's
    /// [`missing_key_status`](crate::extract::Keyed::missing_key_status), 400,
    /// or 500 for the address extractors). Must be 4xx or 5xx. A gRPC request
    /// gets the code this status stands for (see [`HttpRejection`]).
    pub fn missing_key_status(mut self, status: http::StatusCode) -> Self {
        self.mode.options.missing_key_status = Some(status);
        self.settings.http_rejection = true;
        self
    }

    /// The gRPC status code for a rate-limited gRPC request (default 8,
    /// RESOURCE_EXHAUSTED). Must be 1..=16.
    pub fn grpc_status(mut self, code: u8) -> Self {
        self.mode.options.grpc_status = code;
        self.settings.http_rejection = true;
        self
    }

    /// Send `grpc-retry-pushback-ms` on gRPC rejections (default on; `-1`,
    /// "do not retry", when the cost exceeds the limit).
    pub fn grpc_retry_pushback(mut self, on: bool) -> Self {
        self.mode.options.grpc_retry_pushback = on;
        self.settings.http_rejection = true;
        self
    }

    /// The IETF `RateLimit-Policy` and `RateLimit` fields (default on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.mode.options.ietf = on;
        self.settings.http_rejection = true;
        self
    }

    /// `Retry-After` on rejections (default on).
    pub fn retry_after_header(mut self, on: bool) -> Self {
        self.mode.options.retry_after = on;
        self.settings.http_rejection = true;
        self
    }

    /// Lengthen the wait a rejection reports (`Retry-After`, the `RateLimit`
    /// field's `t`, `grpc-retry-pushback-ms`) by a random part of `spread`
    /// (default none). Clients denied in the same bucket are otherwise told
    /// the same `Retry-After` and, if they obey it, come back together and
    /// are denied together again; with a spread of S they come back over S
    /// (in whole seconds: over S + 1 distinct `Retry-After` values). The wait
    /// is only ever lengthened: no client is told to come back before its
    /// cost fits. The limiter's own decision, and the
    /// [`RateLimited`](crate::RateLimited) of error mode, keep the exact wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{GlobalKey, Policy, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::builder(GlobalKey)
    ///     .policy(Policy::per(100, Duration::from_secs(60))?)
    ///     .retry_after_spread(Duration::from_secs(10))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_sliding_window::ConfigError>(())
    /// ```
    pub fn retry_after_spread(mut self, spread: std::time::Duration) -> Self {
        self.mode.options.retry_after_spread = spread;
        self.settings.http_rejection = true;
        self
    }

    /// Legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default off).
    /// `X-RateLimit-Reset` is the number of seconds until the window drains,
    /// rounded up, not an epoch timestamp.
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.mode.options.legacy = on;
        self.settings.http_rejection = true;
        self
    }

    /// Rate-limit headers on allowed responses too (default off). They let a
    /// client pace itself before it meets a 429, at the cost of two header
    /// lines on every response and an allocation per allowed request.
    pub fn headers_on_allowed(mut self, on: bool) -> Self {
        self.mode.options.on_allowed = on;
        self.settings.http_rejection = true;
        self
    }

    /// Build the response for a rate-limited (non-gRPC) request yourself, say
    /// with a JSON body: any `Fn(&RateLimited) -> http::Response<B>`, boxed or
    /// shared in an `Arc`, or a [`RejectResponse`](super::RejectResponse). The configured rate-limit
    /// headers are added afterwards unless the response already has them. The
    /// hook's status is kept unless it is a success (`Response::new` leaves
    /// 200) or a 1xx (never a final response): a rejection then gets the
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
    ///     .policy(Policy::per(5, Duration::from_secs(1))?)
    ///     .reject_with(|limited: &RateLimited| {
    ///         http::Response::builder()
    ///             .status(429)
    ///             .header("content-type", "application/json")
    ///             .body(format!(r#"{{"error":"slow down","policy":"{}"}}"#, limited.policy_name()))
    ///             .unwrap()
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_sliding_window::ConfigError>(())
    /// ```
    pub fn reject_with<F>(
        self,
        hook: F,
    ) -> SlidingWindowLayerBuilder<X, Place, HttpRejection<CustomResponse<F>>>
    where
        F: Send + Sync + 'static,
    {
        self.with_response(CustomResponse(hook))
    }

    /// Answer plain HTTP rejections with an RFC 9457 problem-details body
    /// (`application/problem+json`, with its `Content-Length`) instead of an
    /// empty one (the default): the IETF RateLimit draft's `quota-exceeded`
    /// problem type, its `violated-policies` naming every policy that
    /// denied, over a limit; `temporary-reduced-capacity` when a store that
    /// cannot decide fails closed (503). See [`ProblemDetails`] for the
    /// document. The headers are the same as without it; gRPC rejections and
    /// the answers to a missing key are unchanged. It replaces a
    /// [`reject_with`](Self::reject_with) hook set before it (and one set
    /// after replaces it).
    ///
    /// The body is built per rejection (one allocation), and the inner
    /// service's body type must convert from a `String`, as axum's `Body`,
    /// `String` and http-body-util's `Full<Bytes>` do.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::body::Body;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::BodyExt;
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_sliding_window::{GlobalKey, Policy, SlidingWindowLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = SlidingWindowLayer::builder(GlobalKey)
    ///     .policy(Policy::builder().name("hourly").limit(1).window(Duration::from_secs(3600)).build()?)
    ///     .problem_details()
    ///     .build()?;
    /// let svc = layer.layer(service_fn(|_req: Request<Body>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new(Body::from("hello")))
    /// }));
    /// svc.clone().oneshot(Request::new(Body::empty())).await?;
    /// let limited = svc.oneshot(Request::new(Body::empty())).await?;
    /// assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(limited.headers()["content-type"], "application/problem+json");
    /// let body = limited.into_body().collect().await?.to_bytes();
    /// let body = std::str::from_utf8(&body)?;
    /// assert!(body.contains(r#""type":"https://iana.org/assignments/http-problem-types#quota-exceeded""#));
    /// assert!(body.contains(r#""violated-policies":["hourly"]"#));
    /// # Ok(()) }
    /// ```
    pub fn problem_details(
        self,
    ) -> SlidingWindowLayerBuilder<X, Place, HttpRejection<ProblemDetails>> {
        self.with_response(ProblemDetails)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::key_fn;
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
        let bad_status = SlidingWindowLayer::builder(key_fn(key))
            .policy(per_second(1))
            .status(http::StatusCode::OK)
            .build();
        assert!(matches!(bad_status, Err(ConfigError::InvalidStatus { .. })));

        let bad_missing = SlidingWindowLayer::builder(key_fn(key))
            .policy(per_second(1))
            .missing_key_status(http::StatusCode::NO_CONTENT)
            .build();
        assert!(matches!(
            bad_missing,
            Err(ConfigError::InvalidStatus { .. })
        ));

        let bad_code = SlidingWindowLayer::builder(key_fn(key))
            .policy(per_second(1))
            .grpc_status(0)
            .build();
        assert!(matches!(
            bad_code,
            Err(ConfigError::InvalidGrpcCode { code: 0 })
        ));

        let twice = SlidingWindowLayer::builder(key_fn(key))
            .policy(per_second(1))
            .policy(per_second(2))
            .build();
        assert!(matches!(
            twice,
            Err(ConfigError::DuplicatePolicyName { .. })
        ));

        let bad_name = SlidingWindowLayer::builder(key_fn(key))
            .policy(
                // Renamed after the policy's own build, which refuses the name.
                Policy::builder()
                    .limit(1)
                    .window(Duration::from_secs(1))
                    .build()
                    .unwrap()
                    .with_name("ünïcode"),
            )
            .build();
        assert!(matches!(
            bad_name,
            Err(ConfigError::InvalidPolicyName { .. })
        ));

        let too_many = (0..=crate::layer::MAX_POLICIES).fold(
            SlidingWindowLayer::builder(key_fn(key)).max_keys(10),
            |b, i| {
                b.policy(
                    Policy::builder()
                        .name(format!("p{i}"))
                        .limit(1)
                        .window(Duration::from_secs(1))
                        .build()
                        .unwrap(),
                )
            },
        );
        assert!(matches!(
            too_many.build(),
            Err(ConfigError::TooManyPolicies { count: 9, max: 8 })
        ));

        // Settings of in-memory limiters before any policy: still no policy.
        let no_policy = SlidingWindowLayer::builder(key_fn(key))
            .max_keys(10)
            .build();
        assert!(matches!(no_policy, Err(ConfigError::NoPolicy)));

        let zero_keys = SlidingWindowLayer::builder(key_fn(key))
            .policy(per_second(1))
            .max_keys(0)
            .build();
        assert!(matches!(
            zero_keys,
            Err(ConfigError::Zero {
                setting: "max_keys"
            })
        ));

        // Not inside a tokio runtime: no sweeper can be spawned.
        let no_runtime = SlidingWindowLayer::builder(key_fn(key))
            .policy(per_second(1))
            .sweep_idle()
            .build();
        assert!(matches!(no_runtime, Err(ConfigError::NoRuntime)));
    }

    #[test]
    fn clones_share_one_set_of_limiters() {
        let layer = SlidingWindowLayer::new(per_second(5), key_fn(key)).unwrap();
        let clone = layer.clone();
        assert!(Arc::ptr_eq(&layer.shared, &clone.shared));
        let a: *const Limiter<u8, AutoClock> = layer.stores().next().unwrap();
        let b: *const Limiter<u8, AutoClock> = clone.stores().next().unwrap();
        assert_eq!(a, b);
    }

    fn source<X: Keyed<Key = u8>>(layer: &SlidingWindowLayer<X>) -> crate::clock::TimeSource {
        layer.stores().next().unwrap().clock().source()
    }

    #[tokio::test]
    async fn rejecting_layers_read_the_cheap_clock_and_waiting_ones_tokio_time() {
        let rejecting = SlidingWindowLayer::new(per_second(5), key_fn(key)).unwrap();
        assert_ne!(source(&rejecting), crate::clock::TimeSource::Tokio);

        let waiting = SlidingWindowLayer::builder(key_fn(key))
            .policy(per_second(5))
            .on_limit(OnLimit::Wait(
                crate::wait::WaitConfig::bounded(Duration::from_secs(1), 4).unwrap(),
            ))
            .build()
            .unwrap();
        assert_eq!(source(&waiting), crate::clock::TimeSource::Tokio);
    }

    #[tokio::test(start_paused = true)]
    async fn layers_built_on_paused_time_follow_it() {
        let rejecting = SlidingWindowLayer::new(per_second(5), key_fn(key)).unwrap();
        assert_eq!(source(&rejecting), crate::clock::TimeSource::Tokio);
    }

    fn user(req: &Req) -> Option<u32> {
        req.headers().get("x-user")?.to_str().ok()?.parse().ok()
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    #[tokio::test(start_paused = true)]
    async fn a_layer_that_sweeps_drops_idle_keys_without_traffic_and_its_sweepers_end_with_it() {
        use tower::{Layer, ServiceExt};
        let layer = SlidingWindowLayer::builder(key_fn(user))
            .sweep_idle()
            .policy(per_second(5))
            .policy(
                Policy::builder()
                    .name("minute")
                    .limit(100)
                    .window(Duration::from_secs(60))
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        assert_eq!(alive_tasks(), 2, "one sweeper per policy");
        let svc = layer.layer(tower::service_fn(|_: Req| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        }));
        for user in 0..1_000 {
            let req = http::Request::builder()
                .header("x-user", user)
                .body(())
                .unwrap();
            let res = svc.clone().oneshot(req).await.unwrap();
            assert_eq!(res.status(), http::StatusCode::OK);
        }
        let tracked = |layer: &SlidingWindowLayer<_>| -> Vec<usize> {
            layer.stores().map(|l| l.stats().keys_tracked).collect()
        };
        assert_eq!(tracked(&layer), [1_000, 1_000]);
        // No more requests. A ring is idle once its newest slot has left the
        // span of N + 1 buckets: for the per-second keys 8 buckets of 1/7 s
        // (1142.9 ms); tokio's timer fires on the next 1 ms tick.
        let (second, minute) = (
            layer.stores().next().unwrap(),
            layer.stores().nth(1).unwrap(),
        );
        let rounds = second.sweeper_rounds();
        tokio::time::advance(Duration::from_millis(1143)).await;
        second.sweeper_finished(rounds + 1).await;
        assert_eq!(tracked(&layer), [0, 1_000]);
        // The minute's keys go a minute and a bucket (8.571 s) after their use.
        let rounds = minute.sweeper_rounds();
        tokio::time::advance(Duration::from_millis(68_572 - 1143)).await;
        minute.sweeper_finished(rounds + 1).await;
        assert_eq!(tracked(&layer), [0, 0]);

        // The service holds the layer's limiters too: the sweepers end once
        // both are gone.
        drop(layer);
        assert_eq!(alive_tasks(), 2);
        drop(svc);
        for _ in 0..100 {
            if alive_tasks() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(alive_tasks(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_period_applies_to_every_policy() {
        let layer = SlidingWindowLayer::builder(key_fn(user))
            .policy(per_second(5))
            .policy(
                Policy::builder()
                    .name("minute")
                    .limit(100)
                    .window(Duration::from_secs(60))
                    .build()
                    .unwrap(),
            )
            .sweep_idle_every(Duration::from_millis(250))
            .build()
            .unwrap();
        let rounds = || -> Vec<u64> { layer.stores().map(|l| l.sweeper_rounds()).collect() };
        for n in 1..=4 {
            tokio::time::advance(Duration::from_millis(250)).await;
            for l in layer.stores() {
                l.sweeper_finished(n).await;
            }
        }
        assert_eq!(rounds(), [4, 4]);
        let zero = SlidingWindowLayer::builder(key_fn(user))
            .policy(per_second(5))
            .sweep_idle_every(Duration::ZERO)
            .build();
        assert!(matches!(
            zero,
            Err(ConfigError::Zero {
                setting: "sweep_period"
            })
        ));
    }

    #[test]
    fn a_missing_key_gets_the_extractors_status_unless_the_layer_sets_one() {
        let status = |layer: &SlidingWindowLayer<crate::PeerIp>| layer.shared.missing_key_status;
        let by_default = SlidingWindowLayer::new(per_second(1), crate::PeerIp::new()).unwrap();
        assert_eq!(status(&by_default), http::StatusCode::INTERNAL_SERVER_ERROR);
        let set = SlidingWindowLayer::builder(crate::PeerIp::new())
            .policy(per_second(1))
            .missing_key_status(http::StatusCode::FORBIDDEN)
            .build()
            .unwrap();
        assert_eq!(status(&set), http::StatusCode::FORBIDDEN);
    }
}

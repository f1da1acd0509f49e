//! How the layer counts a request: its key, its cost, and whether it is exempt.
//!
//! A [`KeyExtractor`] pulls the rate-limit key out of a request. The ready ones
//! for `http::Request`:
//!
//! | extractor | key | no key when | default status then |
//! |---|---|---|---|
//! | [`GlobalKey`] | `()`: one limit for every request | never | — |
//! | [`PeerIp`] | the connection's IP address (IPv6 by /64) | the server recorded no peer address: a server misconfiguration, logged at WARN once a second with the fix | 500 |
//! | [`ClientIp`] | the client's IP behind trusted proxies | as [`PeerIp`] | 500 |
//! | [`HeaderKey`] | one header's value, such as an API key | the header is missing, repeated, empty, too long or not visible ASCII: the client's error | 400 |
//! | [`key_fn`] | whatever your closure returns | your closure returns `None` | 400 |
//!
//! What a request without a key gets is the layer's choice
//! ([`MissingKey`](crate::MissingKey)); when it is rejected, the status is the
//! extractor's [`missing_key_status`](Keyed::missing_key_status) unless
//! the layer sets one
//! ([`missing_key_status`](crate::SlidingWindowLayerBuilder::missing_key_status)).
//!
//! A closure becomes an extractor through [`key_fn`], as a closure becomes a
//! service through tower's `service_fn`; a shared one (`Arc<dyn Fn…>`, see
//! [`SharedKeyFn`]) is an extractor as it is. A layer of
//! [tiers](crate::guide::tiers) takes an extractor that names each request's
//! tier with its key, from a closure through [`tiered_key_fn`]; each kind
//! says which it is in [`Keyed::Tiering`], so that a layer given the other
//! does not compile. A request's cost
//! ([`RequestCost`]) and exemption ([`Exemption`]) wrap the extractor
//! ([`WithCost`], [`WithExemption`]), so a layer's type names one extractor
//! whatever it counts: `SlidingWindowLayer<HeaderKey>`, or
//! `SlidingWindowLayer<WithCost<HeaderKey, SharedCostFn<Request<Body>>>>`.
//!
//! The security notes for address keys (why the proxy chain is read from the
//! right, why a spoofed `X-Forwarded-For` cannot change the key, what IPv6
//! grouping by /64 means) are on [`ClientIp`].

use http::StatusCode;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

mod forwarded;
mod header;
mod ip;
mod net;

pub use self::forwarded::ProxyHeader;
pub use self::header::HeaderKey;
pub use self::ip::{ClientIp, PeerIp};
pub use self::net::{IpNet, IpNetParseError};
use self::sealed::TierKeyFn;
pub(crate) use self::sealed::{KeysAlone, NamesTiers};
pub use crate::tier::{TierId, TierNames};

// `Tiering` and its kinds are defined below, with `Keyed`.

/// What an extractor's keys are, whatever the request type: their type, and
/// the status a request without one gets.
///
/// A layer's type names its key through its extractor: the default store of a
/// `SlidingWindowLayer<HeaderKey>` is a `Limiter<String>` because
/// `<HeaderKey as Keyed>::Key` is `String`. Its [`Tiering`](Keyed::Tiering)
/// says which layer it keys: one of policies ([`Untiered`]) or one of tiers
/// ([`Tiered`]). Implement it beside [`KeyExtractor`] for an extractor of
/// your own.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a key extractor",
    label = "not a key extractor",
    note = "a closure keys requests once wrapped: `key_fn(|req: &Request<Body>| ...)`",
    note = "a type of your own implements `Keyed` (its key type) and `KeyExtractor<Req>`"
)]
pub trait Keyed {
    /// The key type.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// [`Untiered`] for an extractor of keys alone, which keys a layer of
    /// policies; [`Tiered`] for one that names each request's tier with its
    /// key ([`tiered_key_fn`]), which keys a layer of
    /// [`tiers`](crate::SlidingWindowLayerBuilder::tiers). A layer built
    /// with the other kind does not compile.
    type Tiering: Tiering;

    /// The status a request without a key is rejected with, unless the layer
    /// sets one: 400 Bad Request by default (the request lacks what the key is
    /// made of); 500 Internal Server Error for the address extractors, where
    /// a missing peer address means the server was set up without it.
    fn missing_key_status(&self) -> StatusCode {
        StatusCode::BAD_REQUEST
    }
}

/// Whether an extractor names each request's tier: the
/// [`Keyed::Tiering`] of an extractor, [`Untiered`] or [`Tiered`]. Sealed:
/// those two are the only kinds.
pub trait Tiering: sealed::Sealed + Send + Sync + 'static {
    /// True for [`Tiered`].
    const NAMES_TIERS: bool;
}

/// The [`Keyed::Tiering`] of an extractor of keys alone (every ready
/// extractor, [`key_fn`], your own): it keys a layer of policies.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Untiered;

/// The [`Keyed::Tiering`] of an extractor that names each request's tier
/// with its key ([`tiered_key_fn`]): it keys a layer of
/// [`tiers`](crate::SlidingWindowLayerBuilder::tiers).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Tiered;

impl Tiering for Untiered {
    const NAMES_TIERS: bool = false;
}

impl Tiering for Tiered {
    const NAMES_TIERS: bool = true;
}

// Sealed: the traits only this crate implements. Beside `Sealed` (no kind
// of `Tiering` but these two), the bounds the builder and `tiered_key_fn` put
// on an extractor: public, since they stand in public signatures and their
// messages explain a wrong extractor, but not nameable, since no user
// implements or names them.
mod sealed {
    use super::*;

    pub trait Sealed {}
    impl Sealed for Untiered {}
    impl Sealed for Tiered {}

    /// What the builder's methods of a layer of policies ask of an extractor's
    /// [`Keyed::Tiering`]: [`Untiered`], keys alone.
    #[diagnostic::on_unimplemented(
        message = "`.policy(..)`, `.store(..)` and `.on_limit(..)` need an extractor of keys alone, and this one names each request's tier (or its type does not say it does not)",
        label = "needs an extractor whose `Keyed::Tiering` is `Untiered`",
        note = "an extractor that names tiers takes its policies from a table: `.tiers(Tiers::builder().limited(\"free\", [\"100/min\".parse()?]).build()?)`",
        note = "for the same policies for every request, key with `key_fn(|req: &Request<Body>| ...)`, which names no tier",
        note = "a function that returns `impl KeyExtractor<Req>` says so: `impl KeyExtractor<Req, Tiering = Untiered>`"
    )]
    pub trait KeysAlone: Tiering {}

    impl KeysAlone for Untiered {}

    /// What the builder's methods of a layer of tiers ask of an extractor's
    /// [`Keyed::Tiering`]: [`Tiered`], naming each request's tier.
    #[diagnostic::on_unimplemented(
        message = "a layer of tiers needs an extractor that names each request's tier, and this one gives a key alone (or its type does not say it names tiers)",
        label = "needs an extractor whose `Keyed::Tiering` is `Tiered`",
        note = "name the tier with the key: `tiered_key_fn(|req: &Request<Body>| Some((tier, key)))`",
        note = "to key some tiers by address, call `ClientIp::key_of(req)` or `PeerIp::key_of(req)` in that closure"
    )]
    pub trait NamesTiers: Tiering {}

    impl NamesTiers for Tiered {}

    /// What [`tiered_key_fn`] takes: a function of the request to its tier and
    /// key, `Fn(&Req) -> Option<(T, K)>` with `T: AsRef<str>`, as a closure or
    /// function, boxed (`Box<dyn Fn ...>`) or shared (`Arc<dyn Fn ...>`, or an
    /// `Arc` of a closure).
    #[diagnostic::on_unimplemented(
        message = "`{Self}` does not name a tier and a key for requests of type `{Req}`",
        label = "not a function of the request to `Option<(tier, key)>`",
        note = "a tiered extractor is a closure `|req: &{Req}| Some((tier, key))`, boxed or in an `Arc`; the tier is any `AsRef<str>`"
    )]
    pub trait TierKeyFn<Req>: Send + Sync + 'static {
        /// The tier's name.
        type Tier: AsRef<str>;
        /// The key within the tier.
        type Key: Hash + Eq + Clone + Send + Sync + 'static;

        /// The request's tier and key, or `None` when it has no key.
        fn tier_and_key(&self, req: &Req) -> Option<(Self::Tier, Self::Key)>;
    }

    impl<Req, T, K, F> TierKeyFn<Req> for F
    where
        F: Fn(&Req) -> Option<(T, K)> + Send + Sync + 'static,
        T: AsRef<str>,
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        type Tier = T;
        type Key = K;

        #[inline]
        fn tier_and_key(&self, req: &Req) -> Option<(T, K)> {
            self(req)
        }
    }

    impl<Req, T, K, F> TierKeyFn<Req> for Arc<F>
    where
        F: Fn(&Req) -> Option<(T, K)> + Send + Sync + ?Sized + 'static,
        T: AsRef<str>,
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        type Tier = T;
        type Key = K;

        #[inline]
        fn tier_and_key(&self, req: &Req) -> Option<(T, K)> {
            (**self)(req)
        }
    }
}

/// An extractor with one key for every request (its key type is `()`), such
/// as [`GlobalKey`]: the only kind that can hold back `poll_ready`
/// ([`backpressure`](crate::SlidingWindowLayerBuilder::backpressure)), which
/// sees no request. Implemented by [`GlobalKey`], by closures keying by `()`,
/// and by the wrappers of such extractors; an extractor of your own whose key
/// type is `()` implements it with an empty `impl`.
#[diagnostic::on_unimplemented(
    message = "backpressure needs a global limit, and `{Self}` keys each request",
    label = "keys each request",
    note = "`poll_ready` sees no request, so it cannot hold back one key: for a keyed limit, wait in the response future with `.on_limit(OnLimit::Wait(..))`",
    note = "a global limit is keyed by `GlobalKey` (its key type is `()`)"
)]
pub trait GlobalExtractor: Keyed<Key = ()> {}

impl GlobalExtractor for GlobalKey {}
impl<F> GlobalExtractor for KeyFn<F, ()> {}
impl<Req: 'static> GlobalExtractor for dyn Fn(&Req) -> Option<()> + Send + Sync {}
impl<T: GlobalExtractor + ?Sized> GlobalExtractor for Arc<T> {}
impl<T: GlobalExtractor + ?Sized> GlobalExtractor for Box<T> {}
impl<X: GlobalExtractor, C> GlobalExtractor for WithCost<X, C> {}
impl<X: GlobalExtractor, E> GlobalExtractor for WithExemption<X, E> {}

/// The key type of extractor `X`.
pub type KeyOf<X> = <X as Keyed>::Key;

/// Pulls the rate-limit key out of a request, and says how the request counts.
///
/// `None` from [`extract`](KeyExtractor::extract) means the request has no key;
/// what happens then is the layer's explicit choice
/// ([`MissingKey`](crate::MissingKey)). The other methods have defaults: every
/// request costs one unit, none is exempt, and a request without a key is
/// rejected as a bad request (400; see [`Keyed::missing_key_status`]).
///
/// ```
/// use http::Request;
/// use tower_sliding_window::extract::{KeyExtractor, Keyed, Untiered};
///
/// /// Keys by tenant id; uploads cost 10 units.
/// struct ByTenant;
///
/// impl Keyed for ByTenant {
///     type Key = u64;
///     // Keys alone, for a layer of policies (`Tiered` names tiers too).
///     type Tiering = Untiered;
/// }
///
/// impl<B> KeyExtractor<Request<B>> for ByTenant {
///     fn extract(&self, req: &Request<B>) -> Option<u64> {
///         req.headers().get("x-tenant")?.to_str().ok()?.parse().ok()
///     }
///
///     fn cost(&self, req: &Request<B>) -> u32 {
///         if req.uri().path().starts_with("/upload") { 10 } else { 1 }
///     }
/// }
///
/// let req = Request::builder().uri("/upload/a").header("x-tenant", "42").body(())?;
/// assert_eq!(ByTenant.extract(&req), Some(42));
/// assert_eq!(ByTenant.cost(&req), 10);
/// # Ok::<(), http::Error>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot key requests of type `{Req}`",
    label = "not a key extractor for `{Req}`",
    note = "a closure keys requests once wrapped: `key_fn(|req: &Request<Body>| ...)`"
)]
pub trait KeyExtractor<Req>: Keyed + Send + Sync + 'static {
    /// The request's key, or `None` when it has none.
    fn extract(&self, req: &Req) -> Option<Self::Key>;

    /// The units this request consumes (default 1). A cost above a policy's
    /// limit can never pass: it is rejected at once, without a wait.
    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        let _ = req;
        1
    }

    /// True when the request bypasses the limit entirely: not counted, no
    /// rate-limit headers (default: none is exempt).
    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        let _ = req;
        false
    }

    /// The request's tier (looked up in `tiers` by name) and key, or `None`
    /// when it has no key. Extractors that [name tiers](Keyed::Tiering)
    /// implement it; the default puts every key in an unknown tier.
    #[inline]
    fn extract_tiered(&self, req: &Req, tiers: &TierNames) -> Option<(TierId, Self::Key)> {
        let _ = tiers;
        self.extract(req).map(|key| (TierId::UNKNOWN, key))
    }
}

/// A closure `Fn(&Req) -> Option<K>` as a [`KeyExtractor`], as tower's
/// `service_fn` makes a closure a service. Name the closure's argument type.
///
/// ```
/// use http::Request;
/// use tower_sliding_window::{key_fn, KeyExtractor};
///
/// let by_user = key_fn(|req: &Request<()>| {
///     req.headers().get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
/// });
/// let req = Request::builder().header("x-user", "ada").body(())?;
/// assert_eq!(by_user.extract(&req), Some("ada".to_owned()));
/// # Ok::<(), http::Error>(())
/// ```
pub fn key_fn<Req, K, F>(f: F) -> KeyFn<F, K>
where
    F: Fn(&Req) -> Option<K>,
{
    KeyFn {
        f,
        key: PhantomData,
    }
}

/// A closure as a key extractor; see [`key_fn`].
pub struct KeyFn<F, K> {
    f: F,
    // `fn() -> K`: the extractor holds no `K`, so it is `Send` and `Sync`
    // whatever `K` is.
    key: PhantomData<fn() -> K>,
}

impl<F: Clone, K> Clone for KeyFn<F, K> {
    fn clone(&self) -> Self {
        KeyFn {
            f: self.f.clone(),
            key: PhantomData,
        }
    }
}

impl<F, K> fmt::Debug for KeyFn<F, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFn")
            .field("key", &std::any::type_name::<K>())
            .finish_non_exhaustive()
    }
}

impl<F, K: Hash + Eq + Clone + Send + Sync + 'static> Keyed for KeyFn<F, K> {
    type Key = K;
    type Tiering = Untiered;
}

impl<Req, K, F> KeyExtractor<Req> for KeyFn<F, K>
where
    F: Fn(&Req) -> Option<K> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    #[inline]
    fn extract(&self, req: &Req) -> Option<K> {
        (self.f)(req)
    }
}

/// A key closure shared behind an `Arc`: a [`KeyExtractor`] whose type can be
/// named, for a layer stored in a struct.
pub type SharedKeyFn<Req, K> = Arc<dyn Fn(&Req) -> Option<K> + Send + Sync>;

impl<Req: 'static, K: Hash + Eq + Clone + Send + Sync + 'static> Keyed
    for dyn Fn(&Req) -> Option<K> + Send + Sync
{
    type Key = K;
    type Tiering = Untiered;
}

impl<Req: 'static, K: Hash + Eq + Clone + Send + Sync + 'static> KeyExtractor<Req>
    for dyn Fn(&Req) -> Option<K> + Send + Sync
{
    #[inline]
    fn extract(&self, req: &Req) -> Option<K> {
        self(req)
    }
}

/// A closure `Fn(&Req) -> Option<(T, K)>` naming each request's tier (any
/// `T: AsRef<str>`: a `&'static str`, a `String` from a lookup) along with its
/// key, for a layer of [`tiers`](crate::SlidingWindowLayerBuilder::tiers):
/// a closure or function, a boxed one, or one shared behind an `Arc`
/// ([`SharedTieredKeyFn`] names the type of a shared one, for a layer kept
/// in a struct). `None` means the request has no key; a tier the
/// table lacks is answered as the layer is configured for an unknown tier.
///
/// ```
/// use std::net::IpAddr;
/// use http::Request;
/// use tower_sliding_window::{tiered_key_fn, ClientIp};
///
/// /// Who is counted: an API key, or the address of a caller without one.
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// enum Caller {
///     Key(String),
///     Ip(IpAddr),
/// }
///
/// // Callers with an API key by the key's tier (the server's own lookup);
/// // the others by client address, IPv6 by /64, behind our proxies.
/// let client_ip = ClientIp::trusting(["10.0.0.0/8".parse()?]);
/// let by_tier = tiered_key_fn(move |req: &Request<()>| {
///     match req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
///         Some(key) if key.starts_with("paid_") => Some(("paid", Caller::Key(key.to_owned()))),
///         Some(key) => Some(("free", Caller::Key(key.to_owned()))),
///         None => Some(("anonymous", Caller::Ip(client_ip.key_of(req)?))),
///     }
/// });
/// # let _ = by_tier;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn tiered_key_fn<Req, F>(f: F) -> TieredKeyFn<F, F::Key>
where
    F: TierKeyFn<Req>,
{
    TieredKeyFn {
        f,
        key: PhantomData,
    }
}

/// A tiered extractor from a closure shared behind an `Arc`: a type that can
/// be named, for a layer of tiers kept in a struct or an app's state.
///
/// ```
/// use std::sync::Arc;
/// use axum::body::Body;
/// use http::Request;
/// use tower_sliding_window::extract::SharedTieredKeyFn;
/// use tower_sliding_window::{tiered_key_fn, SlidingWindowLayer, Tiers};
///
/// type ByTier = SharedTieredKeyFn<Request<Body>, &'static str, String>;
///
/// struct AppState {
///     limits: SlidingWindowLayer<ByTier>,
/// }
///
/// let by_tier: ByTier = tiered_key_fn(Arc::new(|req: &Request<Body>| {
///     Some(("free", req.headers().get("x-api-key")?.to_str().ok()?.to_owned()))
/// }) as Arc<dyn Fn(&Request<Body>) -> Option<(&'static str, String)> + Send + Sync>);
/// let tiers = Tiers::builder().limited("free", ["100/min".parse()?]).build()?;
/// let state = AppState {
///     limits: SlidingWindowLayer::builder(by_tier).tiers(tiers).build()?,
/// };
/// # let _ = state.limits;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type SharedTieredKeyFn<Req, T, K> =
    TieredKeyFn<Arc<dyn Fn(&Req) -> Option<(T, K)> + Send + Sync>, K>;

/// A function naming a tier and a key; see [`tiered_key_fn`].
pub struct TieredKeyFn<F, K> {
    f: F,
    key: PhantomData<fn() -> K>,
}

impl<F: Clone, K> Clone for TieredKeyFn<F, K> {
    fn clone(&self) -> Self {
        TieredKeyFn {
            f: self.f.clone(),
            key: PhantomData,
        }
    }
}

impl<F, K> fmt::Debug for TieredKeyFn<F, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TieredKeyFn")
            .field("key", &std::any::type_name::<K>())
            .finish_non_exhaustive()
    }
}

impl<F, K: Hash + Eq + Clone + Send + Sync + 'static> Keyed for TieredKeyFn<F, K> {
    type Key = K;
    type Tiering = Tiered;
}

impl<Req, K, F> KeyExtractor<Req> for TieredKeyFn<F, K>
where
    F: TierKeyFn<Req, Key = K>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// The key alone (a layer of tiers asks for both).
    #[inline]
    fn extract(&self, req: &Req) -> Option<K> {
        self.f.tier_and_key(req).map(|(_, key)| key)
    }

    #[inline]
    fn extract_tiered(&self, req: &Req, tiers: &TierNames) -> Option<(TierId, K)> {
        self.f
            .tier_and_key(req)
            .map(|(tier, key)| (tiers.find(tier.as_ref()), key))
    }
}

impl<T: Keyed + ?Sized> Keyed for Arc<T> {
    type Key = T::Key;
    type Tiering = T::Tiering;

    fn missing_key_status(&self) -> StatusCode {
        (**self).missing_key_status()
    }
}

impl<Req, T: KeyExtractor<Req> + ?Sized> KeyExtractor<Req> for Arc<T> {
    #[inline]
    fn extract(&self, req: &Req) -> Option<Self::Key> {
        (**self).extract(req)
    }

    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        (**self).cost(req)
    }

    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        (**self).is_exempt(req)
    }

    #[inline]
    fn extract_tiered(&self, req: &Req, tiers: &TierNames) -> Option<(TierId, Self::Key)> {
        (**self).extract_tiered(req, tiers)
    }
}

impl<T: Keyed + ?Sized> Keyed for Box<T> {
    type Key = T::Key;
    type Tiering = T::Tiering;

    fn missing_key_status(&self) -> StatusCode {
        (**self).missing_key_status()
    }
}

impl<Req, T: KeyExtractor<Req> + ?Sized> KeyExtractor<Req> for Box<T> {
    #[inline]
    fn extract(&self, req: &Req) -> Option<Self::Key> {
        (**self).extract(req)
    }

    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        (**self).cost(req)
    }

    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        (**self).is_exempt(req)
    }

    #[inline]
    fn extract_tiered(&self, req: &Req, tiers: &TierNames) -> Option<(TierId, Self::Key)> {
        (**self).extract_tiered(req, tiers)
    }
}

/// One key for every request: a global limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl Keyed for GlobalKey {
    type Key = ();
    type Tiering = Untiered;
}

impl<Req> KeyExtractor<Req> for GlobalKey {
    #[inline]
    fn extract(&self, _req: &Req) -> Option<()> {
        Some(())
    }
}

/// The units a request costs. Closures `Fn(&Req) -> u32`, boxed or shared in
/// an `Arc`, are costs; give one to
/// [`cost`](crate::SlidingWindowLayerBuilder::cost).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a cost of requests of type `{Req}`",
    note = "a cost is a closure `|req: &{Req}| -> u32`, boxed or in an `Arc`, or a `RequestCost` of your own"
)]
pub trait RequestCost<Req>: Send + Sync + 'static {
    /// Units this request consumes.
    fn cost(&self, req: &Req) -> u32;
}

impl<Req, F> RequestCost<Req> for F
where
    F: Fn(&Req) -> u32 + Send + Sync + 'static,
{
    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        self(req)
    }
}

impl<Req, F> RequestCost<Req> for Arc<F>
where
    F: Fn(&Req) -> u32 + Send + Sync + ?Sized + 'static,
{
    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        (**self)(req)
    }
}

/// A cost closure shared behind an `Arc`, for a layer type that can be named.
pub type SharedCostFn<Req> = Arc<dyn Fn(&Req) -> u32 + Send + Sync>;

/// Requests that bypass the limit entirely (an allowlist). Closures
/// `Fn(&Req) -> bool`, boxed or shared in an `Arc`, are exemptions; give one to
/// [`exempt`](crate::SlidingWindowLayerBuilder::exempt).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an exemption for requests of type `{Req}`",
    note = "an exemption is a closure `|req: &{Req}| -> bool`, boxed or in an `Arc`, or an `Exemption` of your own"
)]
pub trait Exemption<Req>: Send + Sync + 'static {
    /// True when `req` is not limited (not counted, no headers).
    fn is_exempt(&self, req: &Req) -> bool;
}

impl<Req, F> Exemption<Req> for F
where
    F: Fn(&Req) -> bool + Send + Sync + 'static,
{
    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        self(req)
    }
}

impl<Req, F> Exemption<Req> for Arc<F>
where
    F: Fn(&Req) -> bool + Send + Sync + ?Sized + 'static,
{
    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        (**self)(req)
    }
}

/// An exemption closure shared behind an `Arc`, for a layer type that can be
/// named.
pub type SharedExemptFn<Req> = Arc<dyn Fn(&Req) -> bool + Send + Sync>;

/// Extractor `X` whose requests cost what `C` says; made by
/// [`cost`](crate::SlidingWindowLayerBuilder::cost).
#[derive(Debug, Clone)]
pub struct WithCost<X, C> {
    extractor: X,
    cost: C,
}

impl<X, C> WithCost<X, C> {
    /// `extractor`, its requests costing what `cost` says.
    pub fn new(extractor: X, cost: C) -> Self {
        WithCost { extractor, cost }
    }
}

impl<X: Keyed, C> Keyed for WithCost<X, C> {
    type Key = X::Key;
    type Tiering = X::Tiering;

    fn missing_key_status(&self) -> StatusCode {
        self.extractor.missing_key_status()
    }
}

impl<Req, X, C> KeyExtractor<Req> for WithCost<X, C>
where
    X: KeyExtractor<Req>,
    C: RequestCost<Req>,
{
    #[inline]
    fn extract(&self, req: &Req) -> Option<Self::Key> {
        self.extractor.extract(req)
    }

    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        self.cost.cost(req)
    }

    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        self.extractor.is_exempt(req)
    }
    #[inline]
    fn extract_tiered(&self, req: &Req, tiers: &TierNames) -> Option<(TierId, Self::Key)> {
        self.extractor.extract_tiered(req, tiers)
    }
}

/// Extractor `X` with the requests `E` exempts bypassing the limit; made by
/// [`exempt`](crate::SlidingWindowLayerBuilder::exempt).
#[derive(Debug, Clone)]
pub struct WithExemption<X, E> {
    extractor: X,
    exempt: E,
}

impl<X, E> WithExemption<X, E> {
    /// `extractor`, with the requests `exempt` picks bypassing the limit.
    pub fn new(extractor: X, exempt: E) -> Self {
        WithExemption { extractor, exempt }
    }
}

impl<X: Keyed, E> Keyed for WithExemption<X, E> {
    type Key = X::Key;
    type Tiering = X::Tiering;

    fn missing_key_status(&self) -> StatusCode {
        self.extractor.missing_key_status()
    }
}

impl<Req, X, E> KeyExtractor<Req> for WithExemption<X, E>
where
    X: KeyExtractor<Req>,
    E: Exemption<Req>,
{
    #[inline]
    fn extract(&self, req: &Req) -> Option<Self::Key> {
        self.extractor.extract(req)
    }

    #[inline]
    fn cost(&self, req: &Req) -> u32 {
        self.extractor.cost(req)
    }

    #[inline]
    fn is_exempt(&self, req: &Req) -> bool {
        self.exempt.is_exempt(req) || self.extractor.is_exempt(req)
    }
    #[inline]
    fn extract_tiered(&self, req: &Req, tiers: &TierNames) -> Option<(TierId, Self::Key)> {
        self.extractor.extract_tiered(req, tiers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn user(req: &Request<()>) -> Option<String> {
        req.headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    fn request(user: &str, method: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .header("x-user", user)
            .body(())
            .unwrap()
    }

    #[test]
    fn closures_boxes_and_arcs_extract_alike() {
        let req = request("ada", "GET");
        let shared: SharedKeyFn<Request<()>, String> = Arc::new(user);
        let boxed: Box<dyn KeyExtractor<Request<()>, Key = String, Tiering = Untiered>> =
            Box::new(key_fn(user));
        assert_eq!(key_fn(user).extract(&req), Some("ada".to_owned()));
        assert_eq!(shared.extract(&req), Some("ada".to_owned()));
        assert_eq!(boxed.extract(&req), Some("ada".to_owned()));
        assert_eq!(Arc::new(GlobalKey).extract(&req), Some(()));
    }

    #[test]
    fn cost_and_exemption_wrap_the_extractor_and_keep_its_key() {
        let post_costs_5 = |req: &Request<()>| if req.method() == "POST" { 5 } else { 1 };
        let health: SharedExemptFn<Request<()>> = Arc::new(|req| req.uri().path() == "/health");
        let x = WithExemption::new(WithCost::new(key_fn(user), post_costs_5), health);
        let post = request("ada", "POST");
        assert_eq!(x.extract(&post), Some("ada".to_owned()));
        assert_eq!((x.cost(&post), x.is_exempt(&post)), (5, false));
        let health_check = Request::get("/health").body(()).unwrap();
        assert!(x.is_exempt(&health_check));
        assert_eq!(x.cost(&request("bob", "GET")), 1);
        let shared: SharedCostFn<Request<()>> = Arc::new(|_| 3);
        assert_eq!(WithCost::new(GlobalKey, shared).cost(&post), 3);
    }

    #[test]
    fn a_missing_address_is_the_servers_fault_a_missing_header_the_clients() {
        let status =
            |x: &dyn Keyed<Key = std::net::IpAddr, Tiering = Untiered>| x.missing_key_status();
        assert_eq!(status(&PeerIp::new()), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(status(&ClientIp::new()), StatusCode::INTERNAL_SERVER_ERROR);
        let header = HeaderKey::named("x-api-key").unwrap();
        assert_eq!(header.missing_key_status(), StatusCode::BAD_REQUEST);
        // Wrapping keeps the extractor's status.
        let costed = WithCost::new(PeerIp::new(), |_: &Request<()>| 2);
        assert_eq!(status(&costed), StatusCode::INTERNAL_SERVER_ERROR);
    }
}

//! The tower layer: [`SlidingWindowLayer`], the [`SlidingWindow`] service it
//! makes, and how they answer a request over the limit.
//!
//! The common types are re-exported at the crate root; this module also holds
//! the rejection modes ([`HttpRejection`], [`ErrorRejection`]), the error
//! values of error mode ([`RateLimited`], [`KeyMissing`]), the response future
//! and the builder's states.
//!
//! Inside, each file has one concern and depends only on those listed before
//! it: `response` (header values and responses), `rejection` (how a rejection
//! reaches the caller), `tiers` (the policies a request is decided by: the
//! layer's, or its tier's), `local` (the in-memory stores and wait queues the
//! waiting modes use), `shared` (the layer and its shared state), `decide`
//! (one request's all-or-nothing decision), `future`, `settle` (what an
//! admitted request counts once its response is known), `waiting` (the waiting
//! modes), `service`, `builder`.

mod response;

mod rejection;

mod tiers;

pub(crate) mod local;

mod shared;

mod decide;

mod events;
mod future;

mod settle;

pub(crate) mod waiting;

mod service;

mod builder;

pub use self::builder::{InMemory, InMemoryOrUnset, SlidingWindowLayerBuilder, Stores, Unset};
pub use self::future::ResponseFuture;
pub use self::rejection::{
    CustomResponse, DefaultResponse, ErrorRejection, HttpRejection, KeyMissing, ProblemDetails,
    RateLimited, RejectResponse,
};
pub use self::service::SlidingWindow;
pub use self::settle::{Settlement, Unsettled};
pub use self::shared::{
    LayerStats, MissingKey, OnLimit, SlidingWindowLayer, TierStores, MAX_POLICIES,
};
pub use self::tiers::TierHandle;

/// A layer whose policies live in Redis, shared by a fleet (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub type RedisLayer<X, M = HttpRejection> = SlidingWindowLayer<X, crate::redis::RedisStore, M>;

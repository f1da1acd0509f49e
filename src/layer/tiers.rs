//! The policies a request is decided by: one set for a layer of policies, or
//! one per tier for a layer of tiers, whose table can be replaced while
//! requests flow.
//!
//! A layer of tiers holds its table behind an `ArcSwap`, and each service a
//! cache of it: a request checks that its service's table is current (one
//! atomic load; a new table is loaded once per service after a change), finds
//! its tier by name, and is decided by that tier's policies. A change
//! ([`TierState::replace`]) builds a new table (each changed policy's store
//! [reconfigured](crate::Store::reconfigured) from the old one, so counts
//! carry over) and swaps it in; requests that loaded the old table finish
//! under it.

use super::rejection::Violated;
use super::response::{self, PolicyName, Report};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::metrics::SettleMetrics;
use crate::policy::Policy;
use crate::store::Store;
use crate::tier::{TierLimits, TierNames, Tiers, MAX_POLICIES};
use arc_swap::cache::Cache;
use arc_swap::ArcSwap;
use http::HeaderValue;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

/// One policy as the layer sees it: its store and its precomputed names.
pub(crate) struct Limit<St> {
    pub(crate) store: St,
    pub(crate) name: PolicyName,
    pub(crate) quoted_name: Box<str>,
    /// Units its settlements gave back and charged, for the recorder.
    pub(crate) settled: SettleMetrics,
}

/// The policies a request is decided by, all-or-nothing: the layer's, or
/// its tier's.
pub(crate) struct Policies<St> {
    pub(crate) limits: Box<[Limit<St>]>,
    /// `RateLimit-Policy`: every policy of the set.
    pub(crate) policy_header: HeaderValue,
}

impl<St> Policies<St> {
    /// None: the layer-wide set of a layer of tiers.
    pub(crate) fn none() -> Policies<St> {
        Policies {
            limits: Box::new([]),
            policy_header: HeaderValue::from_static(""),
        }
    }

    /// The policies whose `answers` denied, in order.
    pub(crate) fn violated(
        &self,
        answers: &[Option<Result<Decision, crate::store::StoreError>>],
    ) -> Violated<'_> {
        Violated::from_names(
            self.limits
                .iter()
                .zip(answers)
                .filter(|(_, answer)| matches!(answer, Some(Ok(d)) if !d.is_allowed()))
                .map(|(limit, _)| &*limit.name),
        )
    }

    /// What a response reports for policy `i`'s `decision`.
    pub(crate) fn report(&self, i: usize, decision: Decision) -> Report<'_> {
        Report {
            decision,
            quoted_name: &self.limits[i].quoted_name,
            policy_header: &self.policy_header,
        }
    }

    /// The stores, validated: at least one, at most [`MAX_POLICIES`], names
    /// valid (see [`Policy::name`](crate::PolicyBuilder::name)) and distinct.
    pub(crate) fn new<K>(stores: Vec<St>) -> Result<Policies<St>, ConfigError>
    where
        St: Store<K>,
    {
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
            if !crate::policy::is_valid_name(name) {
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
                settled: SettleMetrics::new(name),
                name: PolicyName::from(name),
                quoted_name: response::quoted(name).into_boxed_str(),
                store,
            });
        }
        let policy_header = response::policy_header(limits.iter().map(|l| l.store.policy()));
        Ok(Policies {
            limits: limits.into_boxed_slice(),
            policy_header,
        })
    }
}

/// A tier as requests meet it.
pub(crate) enum Tier<St> {
    Limited(Arc<Policies<St>>),
    Unlimited,
    /// Rejected as over a limit of zero.
    Denied(DeniedTier),
}

/// What a denied tier's rejections report.
pub(crate) struct DeniedTier {
    pub(crate) name: PolicyName,
    pub(crate) quoted_name: Box<str>,
    /// `"<tier>";q=0`.
    pub(crate) policy_header: HeaderValue,
}

impl DeniedTier {
    fn new(tier: &str) -> DeniedTier {
        let quoted_name = response::quoted(tier).into_boxed_str();
        // Tier names are visible ASCII (checked by `Tiers`), so this holds.
        let policy_header = HeaderValue::try_from(format!("{quoted_name};q=0"))
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        DeniedTier {
            name: PolicyName::from(tier),
            quoted_name,
            policy_header,
        }
    }

    /// A denial no wait helps: limit 0, no `Retry-After`.
    pub(crate) fn report(&self) -> Report<'_> {
        Report {
            decision: Decision::cost_exceeds_limit(0, 0, std::time::Duration::ZERO),
            quoted_name: &self.quoted_name,
            policy_header: &self.policy_header,
        }
    }
}

/// One version of a layer's tiers.
pub(crate) struct TierTable<St> {
    pub(crate) names: TierNames,
    tiers: Box<[Tier<St>]>,
    /// By tier, the stores of an unlimited or denied tier that was limited
    /// before: kept, counts and all, so that limiting it again resumes from
    /// them rather than from nothing.
    dormant: Box<[Option<Arc<Policies<St>>>]>,
    /// Where requests of an unknown tier go, if anywhere.
    fallback: Option<usize>,
    /// The table as configured, for `tiers()` and changes of one tier.
    config: Tiers,
}

impl<St> TierTable<St> {
    /// Tier `index` (from [`TierNames::find`]), or the fallback tier for an
    /// unknown one (`None` without a fallback).
    #[inline]
    pub(crate) fn get(&self, index: Option<usize>) -> Option<&Tier<St>> {
        self.tiers.get(index.or(self.fallback)?)
    }

    /// The limited tier called `name`.
    fn policies(&self, name: &str) -> Option<&Arc<Policies<St>>> {
        match self.tiers.get(self.names.find(name).index()?) {
            Some(Tier::Limited(policies)) => Some(policies),
            _ => None,
        }
    }

    /// The stores tier `name` counts in, or counted in before it became
    /// unlimited or denied.
    fn stores(&self, name: &str) -> Option<&Arc<Policies<St>>> {
        let at = self.names.find(name).index()?;
        match &self.tiers[at] {
            Tier::Limited(policies) => Some(policies),
            Tier::Unlimited | Tier::Denied(_) => self.dormant[at].as_ref(),
        }
    }
}

/// A service's view of the table in force: current after one atomic load.
pub(crate) type TierCache<St> = Cache<Arc<ArcSwap<TierTable<St>>>, Arc<TierTable<St>>>;

impl<St> TierState<St> {
    pub(crate) fn cache(&self) -> TierCache<St> {
        Cache::new(Arc::clone(&self.table))
    }
}

/// Builds the store of a tier's policy that had none before.
pub(crate) type StoreFactory<St> =
    Box<dyn Fn(&str, &Policy) -> Result<St, ConfigError> + Send + Sync>;

/// The tiers of a layer of tiers: cloned, the same table and the same
/// changes (a [`TierHandle`] holds a clone).
pub(crate) struct TierState<St> {
    pub(crate) table: Arc<ArcSwap<TierTable<St>>>,
    changes: Arc<Changes<St>>,
}

impl<St> Clone for TierState<St> {
    fn clone(&self) -> Self {
        TierState {
            table: Arc::clone(&self.table),
            changes: Arc::clone(&self.changes),
        }
    }
}

/// What a change of the table needs besides the table.
struct Changes<St> {
    factory: StoreFactory<St>,
    fallback: Option<Box<str>>,
    /// One change at a time: each builds on the table the last one left.
    one_at_a_time: Mutex<()>,
}

impl<St> TierState<St> {
    /// The first table, every store made by `factory`.
    pub(crate) fn new<K>(
        tiers: &Tiers,
        factory: StoreFactory<St>,
        fallback: Option<Box<str>>,
    ) -> Result<TierState<St>, ConfigError>
    where
        St: Store<K>,
    {
        let table = build_table(tiers, None, &factory, fallback.as_deref())?;
        Ok(TierState {
            table: Arc::new(ArcSwap::from_pointee(table)),
            changes: Arc::new(Changes {
                factory,
                fallback,
                one_at_a_time: Mutex::new(()),
            }),
        })
    }

    /// Replace the table by `tiers`: a policy of a tier that had one of that
    /// name gets the old store [reconfigured](Store::reconfigured) (its counts
    /// carry over), a tier unchanged keeps its stores as they are, others get
    /// new stores. Nothing changes on an error.
    pub(crate) fn replace<K>(&self, tiers: &Tiers) -> Result<(), ConfigError>
    where
        St: Store<K>,
    {
        self.change(|_| Ok(tiers.clone()))
    }

    /// Replace tier `name`, which the table must have, keeping the others.
    pub(crate) fn replace_one<K>(&self, name: &str, limits: TierLimits) -> Result<(), ConfigError>
    where
        St: Store<K>,
    {
        self.change(|current| current.replacing(name, limits))
    }

    /// Add tier `name`, which the table must not have, after the others.
    pub(crate) fn add_one<K>(&self, name: &str, limits: TierLimits) -> Result<(), ConfigError>
    where
        St: Store<K>,
    {
        self.change(|current| current.adding(name, limits))
    }

    /// Swap in the table `next` makes of the one in force, one change at a
    /// time (each builds on the table the last one left).
    fn change<K>(
        &self,
        next: impl FnOnce(&Tiers) -> Result<Tiers, ConfigError>,
    ) -> Result<(), ConfigError>
    where
        St: Store<K>,
    {
        let changes = &*self.changes;
        let _one_at_a_time = changes
            .one_at_a_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.table.load_full();
        let tiers = next(&old.config)?;
        let table = build_table(
            &tiers,
            Some(&old),
            &changes.factory,
            changes.fallback.as_deref(),
        )?;
        self.table.store(Arc::new(table));
        Ok(())
    }

    /// The table as configured now.
    pub(crate) fn config(&self) -> Tiers {
        self.table.load().config.clone()
    }

    /// The policies of limited tier `name` now.
    pub(crate) fn policies(&self, name: &str) -> Option<Arc<Policies<St>>> {
        self.table.load().policies(name).cloned()
    }
}

/// Changes a layer of tiers' table while requests flow: a handle that an
/// admin endpoint keeps, from
/// [`SlidingWindowLayer::tier_handle`](crate::SlidingWindowLayer::tier_handle).
///
/// It names the layer's key type `K` and its store `St` (the in-memory
/// [`Limiter`](crate::Limiter) of `K` unless the layer was given stores), not
/// its extractor, so it can be stored where the extractor's type (a closure's)
/// has no name. Clones share the layer's table: a change through any of them,
/// or through the layer, is seen by all, and changes are made one at a time.
///
/// ```
/// use axum::extract::{Path, State};
/// use axum::http::StatusCode;
/// use axum::{body::Body, routing::put, Router};
/// use http::Request;
/// use tower_sliding_window::layer::TierHandle;
/// use tower_sliding_window::{tiered_key_fn, SlidingWindowLayer, TierLimits, Tiers};
///
/// /// Sets a tier's limit: `PUT /admin/tiers/free` with `200/min` as the body.
/// async fn set_limit(
///     State(tiers): State<TierHandle<String>>,
///     Path(tier): Path<String>,
///     limit: String,
/// ) -> (StatusCode, String) {
///     let limits = match limit.parse() {
///         Ok(policy) => TierLimits::Limited(vec![policy]),
///         Err(err) => return (StatusCode::BAD_REQUEST, err.to_string()),
///     };
///     match tiers.set_tier(&tier, limits) {
///         Ok(()) => (StatusCode::NO_CONTENT, String::new()),
///         Err(err) => (StatusCode::BAD_REQUEST, err.to_string()),
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let tiers = Tiers::builder().limited("free", ["100/min".parse()?]).build()?;
/// let layer = SlidingWindowLayer::builder(tiered_key_fn(|req: &Request<Body>| {
///     Some(("free", req.headers().get("x-api-key")?.to_str().ok()?.to_owned()))
/// }))
/// .tiers(tiers)
/// .build()?;
/// // The admin router holds the handle; the API router holds the layer.
/// // Put the admin routes behind your operators' authentication (a layer
/// // of your auth middleware, or a listener of their own): whoever reaches
/// // them sets everyone's limits.
/// let admin: Router = Router::new()
///     .route("/admin/tiers/{tier}", put(set_limit))
///     .with_state(layer.tier_handle());
/// let api: Router = Router::new().route("/", axum::routing::get(|| async { "hi" })).layer(layer);
/// let app = api.merge(admin);
/// # let _ = app;
/// # Ok(()) }
/// ```
pub struct TierHandle<K, St = crate::Limiter<K>> {
    /// Always set: only a layer keyed by a tiered extractor, which `build`
    /// gives a table, hands out a handle.
    state: Option<TierState<St>>,
    key: PhantomData<fn() -> K>,
}

impl<K, St> Clone for TierHandle<K, St> {
    fn clone(&self) -> Self {
        TierHandle {
            state: self.state.clone(),
            key: PhantomData,
        }
    }
}

impl<K, St> fmt::Debug for TierHandle<K, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = self.tiers();
        let names: Vec<&str> = config.iter().map(|(name, _)| name).collect();
        f.debug_struct("TierHandle").field("tiers", &names).finish()
    }
}

impl<K, St> TierHandle<K, St> {
    pub(crate) fn new(state: Option<TierState<St>>) -> Self {
        debug_assert!(state.is_some(), "a handle on a layer without tiers");
        TierHandle {
            state,
            key: PhantomData,
        }
    }

    /// The table of tiers in force.
    pub fn tiers(&self) -> Tiers {
        self.state
            .as_ref()
            .map_or_else(Tiers::none, TierState::config)
    }

    fn state(&self) -> Result<&TierState<St>, ConfigError> {
        self.state.as_ref().ok_or(ConfigError::NotWithTiers {
            setting: "a change of tiers on a layer of policies",
        })
    }
}

impl<K, St: Store<K>> TierHandle<K, St> {
    /// Replace the whole table; see
    /// [`SlidingWindowLayer::set_tiers`](crate::SlidingWindowLayer::set_tiers).
    pub fn set_tiers(&self, tiers: &Tiers) -> Result<(), ConfigError> {
        self.state()?.replace(tiers)
    }

    /// Change tier `tier`, which the table must have: a name it lacks (a
    /// typo) is [`ConfigError::UnknownTier`], and nothing changes. See
    /// [`SlidingWindowLayer::set_tiers`](crate::SlidingWindowLayer::set_tiers)
    /// for what a change keeps.
    pub fn set_tier(&self, tier: &str, limits: TierLimits) -> Result<(), ConfigError> {
        self.state()?.replace_one(tier, limits)
    }

    /// Add tier `tier` after the others; one the table already has is
    /// [`ConfigError::DuplicateTier`], and nothing changes. A new tier starts
    /// empty.
    pub fn add_tier(&self, tier: &str, limits: TierLimits) -> Result<(), ConfigError> {
        self.state()?.add_one(tier, limits)
    }
}

/// A table for `tiers`, carrying over the stores of `old` where it can: a
/// tier's stores last as long as the tier stays in the table, limited or not.
fn build_table<K, St: Store<K>>(
    tiers: &Tiers,
    old: Option<&TierTable<St>>,
    factory: &StoreFactory<St>,
    fallback: Option<&str>,
) -> Result<TierTable<St>, ConfigError> {
    let mut built = Vec::with_capacity(tiers.len());
    let mut dormant = Vec::with_capacity(tiers.len());
    for (name, limits) in tiers.iter() {
        let previous = old.and_then(|old| old.stores(name));
        let (tier, kept) = match limits {
            TierLimits::Unlimited => (Tier::Unlimited, previous.cloned()),
            TierLimits::Denied => (Tier::Denied(DeniedTier::new(name)), previous.cloned()),
            TierLimits::Limited(policies) => match previous {
                // The same policies: the same stores, counts and all.
                Some(same)
                    if same
                        .limits
                        .iter()
                        .map(|l| l.store.policy())
                        .eq(policies.iter()) =>
                {
                    (Tier::Limited(Arc::clone(same)), None)
                }
                _ => {
                    let stores = policies
                        .iter()
                        .map(|policy| {
                            let kept = previous
                                .and_then(|p| p.limits.iter().find(|l| &*l.name == policy.name()));
                            match kept {
                                Some(limit) => limit.store.reconfigured(policy.clone()),
                                None => factory(name, policy),
                            }
                        })
                        .collect::<Result<Vec<St>, ConfigError>>()?;
                    (Tier::Limited(Arc::new(Policies::new(stores)?)), None)
                }
            },
        };
        built.push(tier);
        dormant.push(kept);
    }
    let names = TierNames::new(tiers.iter().map(|(name, _)| name));
    let fallback = match fallback {
        None => None,
        Some(name) => {
            Some(
                names
                    .find(name)
                    .index()
                    .ok_or_else(|| ConfigError::UnknownFallbackTier {
                        name: name.to_owned(),
                    })?,
            )
        }
    };
    Ok(TierTable {
        names,
        tiers: built.into_boxed_slice(),
        dormant: dormant.into_boxed_slice(),
        fallback,
        config: tiers.clone(),
    })
}

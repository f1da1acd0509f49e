//! Tiers: named sets of policies, one chosen per request (anonymous callers,
//! free keys, paid keys, an internal service), validated once as a table.
//!
//! A layer of tiers ([`SlidingWindowLayerBuilder::tiers`](crate::SlidingWindowLayerBuilder::tiers))
//! decides each request by its tier's policies, in that tier's own rings; the
//! table can be replaced while requests flow
//! ([`SlidingWindowLayer::set_tiers`](crate::SlidingWindowLayer::set_tiers)).
//! The guide's [tiers chapter](crate::guide::tiers) puts it together.

use crate::error::ConfigError;
use crate::policy::{is_valid_name, Policy};
use std::collections::hash_map::{Entry, HashMap};

/// The most policies one layer (or one tier) decides at once: decisions for
/// all of them are kept on the stack while a request is decided.
pub const MAX_POLICIES: usize = 8;

/// What a tier allows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TierLimits {
    /// Every policy must admit a request (all-or-nothing), in rings of this
    /// tier's own.
    Limited(Vec<Policy>),
    /// Requests are forwarded uncounted and without rate-limit headers, as an
    /// exempt request is.
    Unlimited,
    /// Every request is rejected as over a limit of zero: 429 (gRPC
    /// RESOURCE_EXHAUSTED) with `RateLimit-Policy: "<tier>";q=0`,
    /// `RateLimit: "<tier>";r=0` (no `t`: no quota is ever made available)
    /// and no `Retry-After`, since waiting will not help.
    Denied,
}

impl TierLimits {
    /// The policies of a limited tier; none for the others.
    pub fn policies(&self) -> &[Policy] {
        match self {
            TierLimits::Limited(policies) => policies,
            TierLimits::Unlimited | TierLimits::Denied => &[],
        }
    }
}

/// A validated table of tiers by name, in the order they were added (from
/// configuration, in the order the format hands them over).
///
/// Tier names, like policy names, go as they are into the rate-limit
/// headers, problem-details bodies, metric labels and Redis keys, so they are
/// checked when the table is built rather than escaped where they are
/// written: see [`TiersBuilder::build`].
///
/// Each tier is [limited](TierLimits::Limited) by one or several policies,
/// [unlimited](TierLimits::Unlimited) or [denied](TierLimits::Denied). A policy
/// left with the default name is named by its position: the first takes its
/// tier's name (`"paid"`), the others the tier's name and their position
/// (`"paid-2"`, `"paid-3"`), so a policy added at the end of a tier's list
/// renames none before it. Those names go into the `RateLimit` headers, the
/// metrics and the Redis keys, and a change of the table keeps a policy's
/// counts by its name: name policies yourself (`name = "hourly"`) where a
/// tier's list may change other than at its end.
///
/// ```
/// use tower_sliding_window::{Tiers, TierLimits};
///
/// let tiers = Tiers::builder()
///     .limited("anonymous", ["20/min".parse()?])
///     .limited("free", ["100/min".parse()?])
///     .limited("paid", ["5000/min".parse()?, "100000/d".parse()?])
///     .unlimited("internal")
///     .denied("suspended")
///     .build()?;
/// assert_eq!(tiers.get("free").unwrap().policies()[0].name(), "free");
/// assert_eq!(tiers.get("paid").unwrap().policies()[0].name(), "paid");
/// assert_eq!(tiers.get("paid").unwrap().policies()[1].name(), "paid-2");
/// assert_eq!(tiers.get("internal"), Some(&TierLimits::Unlimited));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// With the `serde` feature a table deserializes from a map of tier names,
/// each a policy in the [text notation](Policy#impl-FromStr-for-Policy), a list
/// of policies, `"unlimited"` or `"denied"` (a policy may also be a table:
/// `{ limit = 100, window = "1m", buckets = 30, precision = "strict", name =
/// "burst" }`):
///
/// ```toml
/// anonymous = "20/min"
/// free = "100/min"
/// paid = ["5000/min", { limit = 100000, window = "1d", name = "daily" }]
/// internal = "unlimited"
/// suspended = "denied"
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers {
    tiers: Vec<(String, TierLimits)>,
    /// Each tier's position by name: lookups, and the check for a name used
    /// twice, take constant time, so a table of many tiers builds and
    /// changes in time linear in its size.
    index: HashMap<Box<str>, usize>,
}

impl Tiers {
    /// Start a table.
    pub fn builder() -> TiersBuilder {
        TiersBuilder::default()
    }

    /// The tier named `name`.
    pub fn get(&self, name: &str) -> Option<&TierLimits> {
        let &at = self.index.get(name)?;
        Some(&self.tiers[at].1)
    }

    /// Every tier, in the order it was added.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &TierLimits)> + '_ {
        self.tiers
            .iter()
            .map(|(name, limits)| (name.as_str(), limits))
    }

    /// How many tiers the table holds (at least one).
    pub fn len(&self) -> usize {
        self.tiers.len()
    }

    /// Always false: a table holds at least one tier.
    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }

    /// No tier: only for a handle on a layer without tiers, which the
    /// builder's types rule out.
    pub(crate) fn none() -> Tiers {
        Tiers {
            tiers: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// This table with tier `name`, which it must have
    /// ([`ConfigError::UnknownTier`]), set to `limits`, validated as the
    /// builder validates.
    pub(crate) fn replacing(&self, name: &str, limits: TierLimits) -> Result<Tiers, ConfigError> {
        let Some(&at) = self.index.get(name) else {
            return Err(ConfigError::UnknownTier {
                name: name.to_owned(),
            });
        };
        let mut limits = Some(limits);
        let tiers = self.tiers.iter().enumerate().map(|(i, (tier, current))| {
            let replaced = if i == at { limits.take() } else { None };
            (tier.clone(), replaced.unwrap_or_else(|| current.clone()))
        });
        TiersBuilder {
            tiers: tiers.collect(),
        }
        .build()
    }

    /// This table with tier `name`, which it must not have
    /// ([`ConfigError::DuplicateTier`]), added last.
    pub(crate) fn adding(&self, name: &str, limits: TierLimits) -> Result<Tiers, ConfigError> {
        let mut tiers = self.tiers.clone();
        tiers.push((name.to_owned(), limits));
        TiersBuilder { tiers }.build()
    }
}

/// Builder for [`Tiers`]; [`build`](TiersBuilder::build) validates.
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `build` makes the table"]
pub struct TiersBuilder {
    tiers: Vec<(String, TierLimits)>,
}

impl TiersBuilder {
    /// A tier limited by `policies` (all-or-nothing).
    pub fn limited(
        self,
        name: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.tier(name, TierLimits::Limited(policies.into_iter().collect()))
    }

    /// A tier whose requests are forwarded uncounted.
    pub fn unlimited(self, name: impl Into<String>) -> Self {
        self.tier(name, TierLimits::Unlimited)
    }

    /// A tier whose requests are all rejected.
    pub fn denied(self, name: impl Into<String>) -> Self {
        self.tier(name, TierLimits::Denied)
    }

    /// A tier of any kind.
    pub fn tier(mut self, name: impl Into<String>, limits: TierLimits) -> Self {
        self.tiers.push((name.into(), limits));
        self
    }

    /// Validate the table and name its policies.
    ///
    /// Errors: no tier ([`ConfigError::NoTiers`]), a tier name that is not
    /// a valid name ([`ConfigError::InvalidTierName`]: names follow the
    /// rule of [policy names](crate::PolicyBuilder::name), 1 to
    /// [`Policy::MAX_NAME_LEN`] visible ASCII characters other than `"`,
    /// `\`, `{` and `}`), a name used twice ([`ConfigError::DuplicateTier`]), a
    /// limited tier without policies or with more than [`MAX_POLICIES`], and
    /// policy names that are not valid or are used twice in a tier.
    pub fn build(self) -> Result<Tiers, ConfigError> {
        if self.tiers.is_empty() {
            return Err(ConfigError::NoTiers);
        }
        let mut tiers: Vec<(String, TierLimits)> = Vec::with_capacity(self.tiers.len());
        let mut index = HashMap::with_capacity(self.tiers.len());
        for (name, limits) in self.tiers {
            if !is_valid_name(&name) {
                return Err(ConfigError::InvalidTierName { name });
            }
            match index.entry(Box::from(name.as_str())) {
                Entry::Occupied(_) => return Err(ConfigError::DuplicateTier { name }),
                Entry::Vacant(slot) => slot.insert(tiers.len()),
            };
            let limits = match limits {
                TierLimits::Limited(policies) => {
                    TierLimits::Limited(name_policies(&name, policies)?)
                }
                other => other,
            };
            tiers.push((name, limits));
        }
        Ok(Tiers { tiers, index })
    }
}

/// Give default-named policies their tier's name, and check the tier's list.
fn name_policies(tier: &str, policies: Vec<Policy>) -> Result<Vec<Policy>, ConfigError> {
    if policies.is_empty() {
        return Err(ConfigError::TierWithoutPolicies {
            tier: tier.to_owned(),
        });
    }
    if policies.len() > MAX_POLICIES {
        return Err(ConfigError::TooManyPolicies {
            count: policies.len(),
            max: MAX_POLICIES,
        });
    }
    let mut named: Vec<Policy> = Vec::with_capacity(policies.len());
    for (i, policy) in policies.into_iter().enumerate() {
        let policy = if policy.name() == Policy::DEFAULT_NAME {
            // The first is the tier's name whether others follow or not, so
            // that a policy added at the end renames none before it.
            let name = match i {
                0 => tier.to_owned(),
                _ => format!("{tier}-{}", i + 1),
            };
            policy.with_name(name)
        } else {
            policy
        };
        if !is_valid_name(policy.name()) {
            return Err(ConfigError::InvalidPolicyName {
                name: policy.name().to_owned(),
            });
        }
        if named.iter().any(|p| p.name() == policy.name()) {
            return Err(ConfigError::DuplicatePolicyName {
                name: policy.name().to_owned(),
            });
        }
        named.push(policy);
    }
    Ok(named)
}

/// The tiers of a layer by name, as a [tiered
/// extractor](crate::extract::KeyExtractor::extract_tiered) looks them up:
/// [`find`](TierNames::find) turns the name a request carries into the
/// [`TierId`] the layer decides it by.
#[derive(Debug, Clone, Default)]
pub struct TierNames {
    names: Box<[Box<str>]>,
    /// Beyond a few tiers, a hash lookup beats comparing names one by one.
    index: Option<std::collections::HashMap<Box<str>, u32>>,
}

/// Up to this many tiers, names are compared one by one.
const LINEAR_LOOKUP: usize = 8;

impl TierNames {
    pub(crate) fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> TierNames {
        let names: Box<[Box<str>]> = names.into_iter().map(Box::from).collect();
        let index = (names.len() > LINEAR_LOOKUP).then(|| {
            names
                .iter()
                .enumerate()
                .map(|(i, name)| (name.clone(), i as u32))
                .collect()
        });
        TierNames { names, index }
    }

    /// The tier called `name`, or [`TierId::UNKNOWN`].
    #[inline]
    pub fn find(&self, name: &str) -> TierId {
        let found = match &self.index {
            Some(index) => index.get(name).copied(),
            None => self
                .names
                .iter()
                .position(|n| same_name(n.as_bytes(), name.as_bytes()))
                .map(|i| i as u32),
        };
        TierId(found.unwrap_or(u32::MAX))
    }
}

/// `a == b` for short names, compared inline: a call to `memcmp` per tier
/// would cost more than the comparison.
#[inline]
fn same_name(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// A tier of a layer's table, found by [`TierNames::find`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierId(u32);

impl TierId {
    /// No tier of the table: the layer answers the request as configured for
    /// an unknown tier.
    pub const UNKNOWN: TierId = TierId(u32::MAX);

    pub(crate) fn index(self) -> Option<usize> {
        (self != TierId::UNKNOWN).then_some(self.0 as usize)
    }
}

#[cfg(feature = "serde")]
mod de {
    use super::{TierLimits, Tiers};
    use crate::policy::Policy;
    use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde::Deserialize;
    use std::fmt;

    /// A tier as written: a keyword, one policy, or a list of policies.
    enum Spec {
        One(Policy),
        Several(Vec<Policy>),
        Unlimited,
        Denied,
    }

    impl<'de> Deserialize<'de> for Tiers {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Tiers, D::Error> {
            struct Table;

            impl<'de> Visitor<'de> for Table {
                type Value = Tiers;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a map of tier names to a policy, a list of policies, \"unlimited\" or \"denied\"")
                }

                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tiers, A::Error> {
                    let mut builder = Tiers::builder();
                    while let Some(name) = map.next_key::<String>()? {
                        let limits = match map.next_value::<TierValue>()?.0 {
                            Spec::One(policy) => TierLimits::Limited(vec![policy]),
                            Spec::Several(policies) => TierLimits::Limited(policies),
                            Spec::Unlimited => TierLimits::Unlimited,
                            Spec::Denied => TierLimits::Denied,
                        };
                        builder = builder.tier(name, limits);
                    }
                    builder.build().map_err(de::Error::custom)
                }
            }

            deserializer.deserialize_map(Table)
        }
    }

    /// A tier's value, with a message that names what a tier may be (an
    /// untagged enum alone only says that nothing matched).
    struct TierValue(Spec);

    impl<'de> Deserialize<'de> for TierValue {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TierValue, D::Error> {
            struct Value;

            impl<'de> Visitor<'de> for Value {
                type Value = TierValue;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a policy (\"100/min\" or a table), a list of policies, \"unlimited\" or \"denied\"")
                }

                fn visit_str<E: de::Error>(self, text: &str) -> Result<TierValue, E> {
                    match text {
                        "unlimited" => Ok(TierValue(Spec::Unlimited)),
                        "denied" => Ok(TierValue(Spec::Denied)),
                        _ => text
                            .parse::<Policy>()
                            .map(|p| TierValue(Spec::One(p)))
                            .map_err(E::custom),
                    }
                }

                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TierValue, A::Error> {
                    let mut policies = Vec::new();
                    while let Some(policy) = seq.next_element::<Policy>()? {
                        policies.push(policy);
                    }
                    Ok(TierValue(Spec::Several(policies)))
                }

                fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TierValue, A::Error> {
                    Policy::deserialize(de::value::MapAccessDeserializer::new(map))
                        .map(|p| TierValue(Spec::One(p)))
                }
            }

            deserializer.deserialize_any(Value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn per_min(limit: u32) -> Policy {
        Policy::per(limit, Duration::from_secs(60)).unwrap()
    }

    #[test]
    fn names_default_policies_after_their_tier() {
        let burst = Policy::builder()
            .name("burst")
            .limit(10)
            .window(Duration::from_secs(1))
            .build()
            .unwrap();
        let tiers = Tiers::builder()
            .limited("free", [per_min(100)])
            .limited("paid", [per_min(5000), per_min(9000)])
            .limited("mixed", [burst, per_min(1)])
            .unlimited("internal")
            .denied("suspended")
            .build()
            .unwrap();
        let names = |tier| -> Vec<&str> {
            tiers
                .get(tier)
                .unwrap()
                .policies()
                .iter()
                .map(Policy::name)
                .collect()
        };
        assert_eq!(names("free"), ["free"]);
        assert_eq!(names("paid"), ["paid", "paid-2"]);
        assert_eq!(names("mixed"), ["burst", "mixed-2"]);
        assert!(names("internal").is_empty());
        assert_eq!(tiers.len(), 5);
        let order: Vec<&str> = tiers.iter().map(|(name, _)| name).collect();
        assert_eq!(order, ["free", "paid", "mixed", "internal", "suspended"]);
    }

    #[test]
    fn names_are_found_by_comparison_and_by_hash_alike() {
        for count in [1, LINEAR_LOOKUP, LINEAR_LOOKUP + 1, 40] {
            let names: Vec<String> = (0..count).map(|i| format!("tier-{i}")).collect();
            let lookup = TierNames::new(names.iter().map(String::as_str));
            assert_eq!(lookup.index.is_some(), count > LINEAR_LOOKUP);
            for (i, name) in names.iter().enumerate() {
                assert_eq!(lookup.find(name).index(), Some(i), "{name} of {count}");
            }
            for absent in ["", "tier-", "tier-400", "Tier-0", "tier-0 "] {
                assert_eq!(
                    lookup.find(absent),
                    TierId::UNKNOWN,
                    "{absent:?} of {count}"
                );
            }
        }
    }

    /// The duplicate check and the lookups take constant time: a table of
    /// 100 000 tiers builds, answers and changes in time linear in its size
    /// (checking each name against all those before it took minutes here).
    /// `benches/tiers.rs` times it.
    #[test]
    fn a_table_of_100_000_tiers_builds_and_changes_in_linear_time() {
        const TIERS: usize = 100_000;
        let name = |i: usize| format!("customer-{i:06}");
        let table = (0..TIERS)
            .fold(Tiers::builder(), |b, i| b.limited(name(i), [per_min(100)]))
            .build()
            .unwrap();
        assert_eq!(table.len(), TIERS);
        for i in (0..TIERS).step_by(997) {
            assert_eq!(table.get(&name(i)).unwrap().policies()[0].name(), name(i));
        }
        let changed = table
            .replacing(&name(TIERS - 1), TierLimits::Denied)
            .unwrap();
        assert_eq!(changed.get(&name(TIERS - 1)), Some(&TierLimits::Denied));
        assert_eq!(changed.iter().last().unwrap().0, name(TIERS - 1));
        let added = changed.adding("one-more", TierLimits::Unlimited).unwrap();
        assert_eq!(added.iter().last().unwrap().0, "one-more");
        assert!(matches!(
            added.replacing("no-such-tier", TierLimits::Denied),
            Err(ConfigError::UnknownTier { name }) if name == "no-such-tier"
        ));
        assert!(matches!(
            added.adding("one-more", TierLimits::Denied),
            Err(ConfigError::DuplicateTier { name }) if name == "one-more"
        ));
        // The name used twice is found wherever it is.
        let twice = (0..TIERS)
            .fold(Tiers::builder(), |b, i| b.unlimited(name(i)))
            .unlimited(name(TIERS / 2))
            .build();
        assert!(
            matches!(twice, Err(ConfigError::DuplicateTier { name: n }) if n == name(TIERS / 2))
        );
    }

    #[test]
    fn rejects_each_mistake_with_its_own_error() {
        let build = |b: TiersBuilder| b.build().unwrap_err();
        assert!(matches!(build(Tiers::builder()), ConfigError::NoTiers));
        let mebibyte = "t".repeat(1 << 20);
        for name in [
            "",
            "a{b}",
            "{x}",
            "\"",
            "say \"hi\"",
            "back\\slash",
            "tab\there",
            "two words",
            "é",
            &mebibyte,
        ] {
            let err = build(Tiers::builder().unlimited(name));
            assert!(
                matches!(&err, ConfigError::InvalidTierName { name: n } if n == name),
                "{name:?}"
            );
            assert!(err.to_string().len() < 400);
        }
        let longest = "t".repeat(Policy::MAX_NAME_LEN);
        assert!(Tiers::builder().unlimited(longest).build().is_ok());
        assert!(matches!(
            build(Tiers::builder().unlimited("a").denied("a")),
            ConfigError::DuplicateTier { name } if name == "a"
        ));
        assert!(matches!(
            build(Tiers::builder().limited("a", [])),
            ConfigError::TierWithoutPolicies { tier } if tier == "a"
        ));
        assert!(matches!(
            build(Tiers::builder().limited("a", vec![per_min(1); MAX_POLICIES + 1])),
            ConfigError::TooManyPolicies { .. }
        ));
        let named = |name: &str| per_min(1).with_name(name.to_owned());
        assert!(matches!(
            build(Tiers::builder().limited("a", [named("x"), named("x")])),
            ConfigError::DuplicatePolicyName { .. }
        ));
        for name in ["ü", "", "{x}", "a\"b", &"p".repeat(1 << 20)] {
            assert!(
                matches!(
                    build(Tiers::builder().limited("a", [named(name)])),
                    ConfigError::InvalidPolicyName { .. }
                ),
                "{name:?}"
            );
        }
    }
}

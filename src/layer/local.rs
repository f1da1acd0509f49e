//! What the waiting modes need of a layer's shared state: its stores as
//! in-memory limiters ([`LocalStore`]) and its wait queues. Below `shared`,
//! which holds them, and `waiting`, which uses them.

use crate::clock::Clock;
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::ring::WindowSnapshot;
use crate::tier::MAX_POLICIES;
use crate::wait::Queues;
use std::hash::Hash;

/// What waiting needs from a store: an answer without awaiting, and the
/// window's bucket counts for the forecast. Only the in-memory [`Limiter`]
/// is one; a remote store cannot tell when a unit frees.
pub(crate) trait LocalStore<K>: Send + Sync {
    /// Check `cost` units for `key` now, counting them if they fit.
    fn check_n(&self, key: &K, cost: u32) -> Decision;
    /// The key's window now, bucket by bucket (nothing counted).
    fn window_snapshot(&self, key: &K) -> WindowSnapshot;
    /// True while `decision` was counted in the current bucket.
    fn is_current(&self, decision: &Decision) -> bool;
    /// [`is_current`](Self::is_current), and if so `decision` is spent now
    /// (`Limiter::spend`).
    fn spend(&self, key: &K, decision: &Decision) -> bool;
}

impl<K, C> LocalStore<K> for Limiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
{
    fn check_n(&self, key: &K, cost: u32) -> Decision {
        Limiter::check_n(self, key, cost)
    }

    fn window_snapshot(&self, key: &K) -> WindowSnapshot {
        Limiter::window_snapshot(self, key)
    }

    fn is_current(&self, decision: &Decision) -> bool {
        Limiter::is_current(self, decision)
    }

    fn spend(&self, key: &K, decision: &Decision) -> bool {
        Limiter::spend(self, key, decision)
    }
}

/// How the waiting modes reach a layer's store as an in-memory limiter.
pub(crate) type AsLocal<St, K> = fn(&St) -> &dyn LocalStore<K>;

/// An admission through every policy of a layer: each policy's decision.
pub(crate) type Admitted = [Option<Decision>; MAX_POLICIES];

/// A layer's wait queues.
pub(crate) type LayerQueues<K> = Queues<K, Admitted>;

//! A local cache of keys known to be over their limit, so an abusive client
//! costs Redis nothing while it stays blocked.
//!
//! # Why it only denies what Redis would deny
//!
//! Redis denied `cost` units for a key at Redis time `t` with `retry_after` R: the
//! units counted in the key's span exceed `L - cost` until R has passed. Until
//! then that count can only grow (other instances add units) or stay; the only
//! way it drops is buckets leaving the span, and R is exactly when enough of them
//! have left for `cost` to fit. So until `t + R` Redis would deny `cost`. The
//! entry expires at `sent + R`, where `sent` is when the request was sent: Redis
//! ran the script after that, so `sent + R` is never later than `t + R`. Only the
//! same cost is answered from the cache: a smaller one may already fit, and for
//! a larger one (denied too) the entry cannot tell when it would fit, which a
//! decision's `retry_after` must say.
//!
//! The one way a count drops early is an undo. This instance's own undos drop the
//! key's entry, when sent and again once Redis has applied them, and a denial
//! whose check was sent before an undo of its key finished is not cached (its
//! reply may be processed after the undo, or Redis may have run it before the
//! undo); an undo on another instance is not seen here, so for at most R the
//! cache may deny units another instance gave back: the safe side, never an
//! over-admission.

use crate::decision::{Decision, Outcome};
use crate::log::Throttle;
use dashmap::DashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Undo generations, by key hash: a denial is cached only if no undo of its
/// key's stripe began or ended while its check was in flight.
const STRIPES: usize = 64;

/// How often a full cache may be swept for expired entries.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When `cost` could fit again.
    until: Instant,
    /// The cost denied until `until`.
    cost: u32,
    /// Remaining units reported by the denial that made this entry.
    remaining: u32,
    /// When the key's window drains, as reported by that denial.
    reset_at: Instant,
}

pub(crate) struct DenyCache {
    map: DashMap<Box<[u8]>, Entry, foldhash::fast::RandomState>,
    capacity: usize,
    limit: u32,
    /// The longest a denial can last (a window and a bucket): no entry outlives
    /// it, whatever a (misconfigured) store answered.
    longest: Duration,
    sweeps: Throttle,
    undos: [AtomicU64; STRIPES],
}

impl DenyCache {
    pub(crate) fn new(capacity: usize, limit: u32, longest: Duration) -> DenyCache {
        DenyCache {
            map: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            capacity,
            limit,
            longest,
            sweeps: Throttle::new(SWEEP_INTERVAL),
            undos: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn stripe(&self, key: &[u8]) -> &AtomicU64 {
        &self.undos[self.map.hasher().hash_one(key) as usize % STRIPES]
    }

    /// The undo generation of `key`, read before its check is sent and handed
    /// back to [`insert`](Self::insert).
    pub(crate) fn generation(&self, key: &[u8]) -> u64 {
        self.stripe(key).load(SeqCst)
    }

    /// A local denial for `cost` units of `key`, if one is known to hold at `now`.
    pub(crate) fn check(&self, key: &[u8], cost: u32, now: Instant) -> Option<Decision> {
        let entry = *self.map.get(key)?;
        if now >= entry.until {
            self.map.remove_if(key, |_, e| now >= e.until);
            return None;
        }
        if cost != entry.cost {
            return None;
        }
        Some(Decision::from_parts(
            Outcome::Denied,
            self.limit,
            entry.remaining,
            entry.until - now,
            entry.reset_at.saturating_duration_since(now),
        ))
    }

    /// Remember Redis' denial of `cost` units for `key`, for a request sent at
    /// `sent` when the key's undo generation was `generation`.
    pub(crate) fn insert(
        &self,
        key: Box<[u8]>,
        sent: Instant,
        generation: u64,
        cost: u32,
        denial: &Decision,
    ) {
        let Some(retry_after) = denial.retry_after() else {
            return;
        };
        let stripe = self.stripe(&key);
        if stripe.load(SeqCst) != generation {
            return;
        }
        let entry = Entry {
            until: sent + retry_after.min(self.longest),
            cost,
            remaining: denial.remaining(),
            reset_at: sent + denial.reset(),
        };
        if self.map.len() >= self.capacity && !self.map.contains_key(&key) {
            self.sweep(Instant::now());
            if self.map.len() >= self.capacity {
                // Full of live denials: this key simply keeps asking Redis.
                return;
            }
        }
        self.map.insert(key.clone(), entry);
        // An undo that began meanwhile may have missed this entry: drop it.
        if stripe.load(SeqCst) != generation {
            self.map.remove(&key);
        }
    }

    /// Forget `key` (its units were given back, so its denial may end early),
    /// and keep checks in flight from caching a denial of it.
    pub(crate) fn remove(&self, key: &[u8]) {
        self.stripe(key).fetch_add(1, SeqCst);
        self.map.remove(key);
    }

    /// Drop expired entries, at most once per [`SWEEP_INTERVAL`].
    fn sweep(&self, now: Instant) {
        if self.sweeps.admit_at(now.into()).is_none() {
            return;
        }
        self.map.retain(|_, e| now < e.until);
        if self.map.len() * 4 < self.map.capacity() {
            self.map.shrink_to_fit();
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(retry_ms: u64, remaining: u32) -> Decision {
        Decision::from_parts(
            Outcome::Denied,
            5,
            remaining,
            Duration::from_millis(retry_ms),
            Duration::from_millis(retry_ms * 2),
        )
    }

    #[test]
    fn denies_the_same_cost_until_retry_after() {
        let cache = DenyCache::new(10, 5, Duration::from_secs(60));
        let t0 = Instant::now();
        cache.insert(b"k".to_vec().into(), t0, 0, 2, &denial(100, 1));
        let hit = cache
            .check(b"k", 2, t0 + Duration::from_millis(40))
            .unwrap();
        assert_eq!(hit.outcome(), Outcome::Denied);
        assert_eq!(hit.retry_after(), Some(Duration::from_millis(60)));
        assert_eq!(hit.remaining(), 1);
        // A smaller cost may fit already, and when a larger one fits the entry
        // cannot tell: ask Redis.
        assert!(cache.check(b"k", 1, t0).is_none());
        assert!(cache.check(b"k", 3, t0).is_none());
        // Other keys are unaffected.
        assert!(cache.check(b"j", 5, t0).is_none());
        // At retry_after the entry is gone.
        assert!(cache
            .check(b"k", 2, t0 + Duration::from_millis(100))
            .is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn stays_within_capacity_and_makes_room_from_expired_entries() {
        let cache = DenyCache::new(3, 5, Duration::from_secs(60));
        let t0 = Instant::now() - Duration::from_secs(1);
        for k in 0..3u8 {
            cache.insert(vec![k].into(), t0, 0, 1, &denial(10, 0));
        }
        // All three expired long ago: a sweep makes room.
        cache.insert(vec![9].into(), Instant::now(), 0, 1, &denial(10_000, 0));
        assert_eq!(cache.len(), 1);
        for k in 10..20u8 {
            cache.insert(vec![k].into(), Instant::now(), 0, 1, &denial(10_000, 0));
        }
        assert!(cache.len() <= 3);
    }

    #[test]
    fn no_entry_outlives_the_longest_possible_denial() {
        let cache = DenyCache::new(3, 5, Duration::from_millis(200));
        let t0 = Instant::now();
        // A store answering a wait of 1000 s (another policy's data, say).
        cache.insert(b"k".to_vec().into(), t0, 0, 1, &denial(1_000_000, 0));
        let hit = cache.check(b"k", 1, t0).unwrap();
        assert_eq!(hit.retry_after(), Some(Duration::from_millis(200)));
        assert!(cache
            .check(b"k", 1, t0 + Duration::from_millis(200))
            .is_none());
    }

    #[test]
    fn remove_forgets_a_key() {
        let cache = DenyCache::new(3, 5, Duration::from_secs(60));
        let t0 = Instant::now();
        cache.insert(b"k".to_vec().into(), t0, 0, 1, &denial(1000, 0));
        cache.remove(b"k");
        assert!(cache.check(b"k", 1, t0).is_none());
    }
}

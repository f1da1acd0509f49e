//! One partition of a limiter's keys: a [`Table`] behind a read-write lock.
//!
//! Checks take the reader lock, any number at once, and decide in their
//! key's ring through its atomics (see `ring`): a check never waits for
//! another check. Adding a key, dropping idle keys and compacting the table
//! take the writer lock, so no check holds a ring while its position is
//! freed, taken by another key or moved. A check waits only for a writer of
//! its own partition, whose work is bounded by the partition's share of the
//! key cap (`limiter::state::KEYS_PER_PARTITION`).
//!
//! The lock is std's: no `unsafe` here, and none in the table.

use crate::ring::{Geometry, Head, Ring};
use crate::table::{Place, Shrink, Table};
use crate::trim;
use std::hash::Hash;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Partition<K, H: Head> {
    table: RwLock<Table<K, H>>,
}

/// A check's view of a partition's table: the reader lock, held.
pub(crate) type Reading<'p, K, H> = RwLockReadGuard<'p, Table<K, H>>;

/// The writer's lock, held, with the table it may change.
pub(crate) struct Writing<'p, K, H: Head> {
    table: RwLockWriteGuard<'p, Table<K, H>>,
}

impl<K, H: Head> Partition<K, H> {
    /// A partition of no keys, for rings of `ring_len` buckets.
    pub(crate) fn new(ring_len: usize) -> Partition<K, H> {
        Partition {
            table: RwLock::new(Table::new(ring_len)),
        }
    }

    /// The table, for a check: the reader lock. A poisoned lock is as good
    /// as any: a writer that panicked (in a key's `Hash`, `Eq` or `Clone`)
    /// left the table whole.
    #[inline]
    pub(crate) fn read(&self) -> Reading<'_, K, H> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for the writer's lock, then hold it.
    pub(crate) fn write(&self) -> Writing<'_, K, H> {
        Writing {
            table: self.table.write().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// The writer's lock if no one holds the lock: for the sweeps checks
    /// make, which leave a busy partition to the next one rather than wait.
    pub(crate) fn try_write(&self) -> Option<Writing<'_, K, H>> {
        let table = match self.table.try_write() {
            Ok(table) => table,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(Writing { table })
    }

    /// Calls `f` with each key and its ring (under the reader lock).
    pub(crate) fn for_each(&self, f: impl FnMut(&K, Ring<'_, H>)) {
        self.read().for_each(f);
    }

    /// Whether the partition holds no key.
    pub(crate) fn is_empty(&self) -> bool {
        self.read().len() == 0
    }

    /// The bytes of the table's arrays.
    pub(crate) fn bytes(&self) -> usize {
        self.read().bytes()
    }
}

impl<K: Hash + Eq, H: Head> Partition<K, H> {
    /// Calls `f` with `key`'s ring, or `None` if the key is not tracked.
    pub(crate) fn with_ring<R>(
        &self,
        hash: u64,
        key: &K,
        f: impl FnOnce(Option<Ring<'_, H>>) -> R,
    ) -> R {
        let table = self.read();
        f(table.find(hash, key).map(|i| table.ring(i)))
    }
}

impl<K: Hash + Eq, H: Head> Writing<'_, K, H> {
    /// The position of `key`, if tracked.
    pub(crate) fn find(&self, hash: u64, key: &K) -> Option<usize> {
        self.table.find(hash, key)
    }

    /// The ring at position `i`: no check can hold it while this lock is.
    pub(crate) fn ring(&self, i: usize) -> Ring<'_, H> {
        self.table.ring(i)
    }

    /// Track `key`, absent from the table, with a ring at slot `s` holding
    /// `counts` with their newest offsets ([`Ring::init`]); its position.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        key: K,
        init: (&Geometry, u64, &[u64], &[u16]),
    ) -> usize {
        let (g, s, counts, newest) = init;
        self.table
            .insert(hash, key, |ring| ring.init(g, s, counts, newest))
    }

    /// The position of `key`, found, or added with the key `owned` gives and
    /// a ring that `init` writes ([`Table::find_or_insert`]).
    pub(crate) fn find_or_insert(
        &mut self,
        hash: u64,
        key: &K,
        owned: impl FnOnce() -> K,
        init: impl FnOnce(Ring<'_, H>),
    ) -> Place {
        self.table.find_or_insert(hash, key, owned, init)
    }

    /// Drop the keys idle at `now`, compacting the table if few are left,
    /// and let go of the lock; how many. The arrays a compaction replaced
    /// are freed after the lock is let go, so that checks waiting for it do
    /// not wait for the allocator too, and count for a trim.
    pub(crate) fn sweep(mut self, g: &Geometry, now: u64, shrink: Shrink) -> usize {
        let slot = g.slot(now);
        let idle = |ring: Ring<'_, H>| ring.is_idle_at_slot(g, slot);
        let (dropped, replaced) = self.table.retain(g, shrink, idle);
        let kept = self.table.bytes();
        drop(self);
        if let Some(replaced) = replaced {
            trim::given_up(replaced.bytes().saturating_sub(kept));
        }
        dropped
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;
    use crate::ring::Compact;
    use crate::table::KeyHasher;
    use crate::Policy;
    use std::hash::BuildHasher;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_sweep_counts_the_memory_it_gives_up_for_a_trim() {
        let g = Geometry::new(&Policy::per(3, Duration::from_secs(1)).unwrap());
        let h = KeyHasher::default();
        let p: Partition<u64, Compact> = Partition::new(g.ring_len());
        for k in 0..1_000u64 {
            let mut w = p.write();
            w.insert(h.hash_one(k), k, (&g, 0, &[1], &[]));
        }
        let bytes = p.bytes();
        assert!(bytes > 80_000, "{bytes} bytes");
        let counted = trim::tests::given_up_by_this_thread();
        assert_eq!(p.write().sweep(&g, 2_000 * MS, Shrink::IfFew), 1_000);
        assert!(p.is_empty());
        assert_eq!(p.bytes(), 0);
        // The arrays, and the list of free positions the sweep made.
        let given_up = trim::tests::given_up_by_this_thread() - counted;
        assert!(
            (bytes..bytes + 8_000).contains(&given_up),
            "{given_up} of {bytes}"
        );
    }

    #[test]
    fn checks_share_the_reader_lock_and_a_writer_waits_for_them() {
        let g = Geometry::new(&Policy::per(3, Duration::from_secs(1)).unwrap());
        let h = KeyHasher::default();
        let p: Partition<u64, Compact> = Partition::new(g.ring_len());
        p.write().insert(h.hash_one(7u64), 7, (&g, 0, &[], &[]));
        let first = p.read();
        let second = p.read();
        assert!(p.try_write().is_none(), "a writer while checks read");
        let i = first.find(h.hash_one(7u64), &7).unwrap();
        assert!(first.ring(i).acquire(&g, 0, 1).is_allowed());
        assert!(second.ring(i).acquire(&g, 0, 1).is_allowed());
        drop((first, second));
        let w = p.try_write().expect("the writer once checks are done");
        assert_eq!(g.limit() - w.ring(i).peek(&g, 0, 0).remaining(), 2);
    }
}

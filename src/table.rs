//! A partition's keys and their rings: a plain map, changed only under the
//! partition's writer lock and read under its reader lock (see `partition`).
//!
//! Each key has a position: the key, 32 bits of its hash and its ring's
//! head in `entries[i]`, the ring's buckets in `lines`, `ring_len` words from
//! word `i * ring_len`. An index (hashbrown's `HashTable` of positions, by
//! those 32 bits of the keys' hashes) finds a key's position; the index grows,
//! and a sweep finds a dropped key's place in it, from the stored bits, so
//! neither hashes a key again. A key dropped as idle frees its position, which
//! the next new key takes, so keys that come and go cost no copying; the
//! arrays grow by a fifth when every position is taken, and a sweep that
//! leaves few keys compacts them (or frees them, with none left), so memory
//! follows the keys.
//!
//! Rings are only ever written through their atomics (checks under the
//! reader lock race each other there, see `ring`); everything else here
//! changes under the writer lock, when no check can hold a ring.

use crate::ring::{Geometry, Head, Line, LineOf, Ring};
use hashbrown::HashTable;
use std::hash::Hash;

/// The hasher of a limiter's keys (seeded per limiter, so that clients
/// cannot choose keys that collide): foldhash's quality variant, not its
/// fast one, whose hash of consecutive integers (ids, addresses of one
/// range) is a near-linear sequence in its low bits for some seeds.
pub(crate) type KeyHasher = foldhash::quality::RandomState;

/// Arrays with any room never have room for fewer keys than this.
pub(crate) const MIN_CAPACITY: usize = 8;

/// A key, the low 32 bits of its hash and its ring's head, at one position;
/// `None` for a free position.
#[derive(Debug)]
struct Entry<K, H> {
    key: Option<K>,
    hash: u32,
    head: H,
}

/// The index's hash of a key of `hash`: its low 32 bits (which the entry
/// keeps), spread over 64 by an odd multiplier, since hashbrown takes its
/// bucket from the low bits and its tag from the top ones.
#[inline(always)]
fn index_hash(hash: u64) -> u64 {
    u64::from(hash as u32).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Table<K, H: Head> {
    /// Positions, by the [`index_hash`] of the key there.
    index: HashTable<u32>,
    entries: Vec<Entry<K, H>>,
    /// Each position's buckets, `ring_len` words from word `i * ring_len`.
    lines: Vec<LineOf<H>>,
    /// Positions whose key was dropped, to be taken again.
    free: Vec<u32>,
    ring_len: usize,
}

/// Whether [`Table::retain`] compacts the arrays when it leaves few keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shrink {
    IfFew,
    Never,
}

/// Where [`Table::find_or_insert`] found or put a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Found(usize),
    Added(usize),
}

/// A position for a new key: a free one, else a new one at the end of the
/// arrays (grown by a fifth when full), its ring's lines zeroed.
fn take_position<K, H: Head>(
    entries: &mut Vec<Entry<K, H>>,
    lines: &mut Vec<LineOf<H>>,
    free: &mut Vec<u32>,
    ring_len: usize,
) -> usize {
    if let Some(i) = free.pop() {
        return i as usize;
    }
    let i = entries.len();
    if i == entries.capacity() {
        let more = capacity_for(i + 1) - i;
        entries.reserve_exact(more);
        let words = (i + more) * ring_len;
        lines.reserve_exact(words.div_ceil(LineOf::<H>::WORDS) - lines.len());
    }
    entries.push(Entry {
        key: None,
        hash: 0,
        head: H::new(0, None),
    });
    let words = (i + 1) * ring_len;
    lines.resize_with(words.div_ceil(LineOf::<H>::WORDS), LineOf::<H>::new);
    i
}

/// The room arrays holding `keys` keys get when they grow (none for none):
/// a fifth more, at least [`MIN_CAPACITY`].
fn capacity_for(keys: usize) -> usize {
    match keys {
        0 => 0,
        keys => (keys + keys.div_ceil(5)).max(MIN_CAPACITY),
    }
}

/// Whether arrays with room for `capacity` keys, `live` of them live, are
/// compacted by a sweep: under 3 in 10 of the room live (freed with none).
fn shrinks(live: usize, capacity: usize) -> bool {
    live * 10 < capacity * 3 && capacity_for(live) < capacity
}

impl<K, H: Head> Table<K, H> {
    /// An empty table of rings of `ring_len` buckets: no allocation.
    pub(crate) fn new(ring_len: usize) -> Table<K, H> {
        Table {
            index: HashTable::new(),
            entries: Vec::new(),
            lines: Vec::new(),
            free: Vec::new(),
            ring_len,
        }
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Positions there is room for.
    pub(crate) fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// The bytes of the table's arrays (its heap, but for the allocator's
    /// own overhead).
    pub(crate) fn bytes(&self) -> usize {
        self.index.allocation_size()
            + self.entries.capacity() * std::mem::size_of::<Entry<K, H>>()
            + self.lines.capacity() * std::mem::size_of::<LineOf<H>>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }

    /// The ring at position `i`.
    #[inline(always)]
    pub(crate) fn ring(&self, i: usize) -> Ring<'_, H> {
        Ring::new(&self.entries[i].head, &self.lines, i * self.ring_len)
    }

    /// Where the rings are (a new address once the arrays grow or are
    /// compacted), for the tests of moves under racing checks.
    #[cfg(all(test, not(tsw_loom)))]
    pub(crate) fn rings_address(&self) -> usize {
        self.lines.as_ptr() as usize
    }

    /// Calls `f` with each key and its ring.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, Ring<'_, H>)) {
        for (i, entry) in self.entries.iter().enumerate() {
            if let Some(key) = &entry.key {
                f(key, self.ring(i));
            }
        }
    }
}

impl<K: Hash + Eq, H: Head> Table<K, H> {
    /// The position of `key` (of `hash`), if the table holds it.
    #[inline(always)]
    pub(crate) fn find(&self, hash: u64, key: &K) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(index_hash(hash), |&i| {
                entries[i as usize].key.as_ref() == Some(key)
            })
            .map(|&i| i as usize)
    }

    /// Track `key` (of `hash`), which the table does not hold, with a ring
    /// that `init` writes: at a free position, else at a new one (the arrays
    /// grown by a fifth when full). Its position.
    pub(crate) fn insert(&mut self, hash: u64, key: K, init: impl FnOnce(Ring<'_, H>)) -> usize {
        let i = take_position(
            &mut self.entries,
            &mut self.lines,
            &mut self.free,
            self.ring_len,
        );
        let entries = &self.entries;
        self.index.insert_unique(index_hash(hash), i as u32, |&j| {
            index_hash(entries[j as usize].hash.into())
        });
        self.occupy(i, hash, key, init);
        i
    }

    /// The position of `key` (of `hash`), found, or added with the key
    /// `owned` gives and a ring that `init` writes, as [`insert`](Self::insert)
    /// does: one probe of the index either way.
    pub(crate) fn find_or_insert(
        &mut self,
        hash: u64,
        key: &K,
        owned: impl FnOnce() -> K,
        init: impl FnOnce(Ring<'_, H>),
    ) -> Place {
        let entries = &self.entries;
        let place = self.index.entry(
            index_hash(hash),
            |&i| entries[i as usize].key.as_ref() == Some(key),
            |&j| index_hash(entries[j as usize].hash.into()),
        );
        let vacant = match place {
            hashbrown::hash_table::Entry::Occupied(found) => {
                return Place::Found(*found.get() as usize)
            }
            hashbrown::hash_table::Entry::Vacant(vacant) => vacant,
        };
        let i = take_position(
            &mut self.entries,
            &mut self.lines,
            &mut self.free,
            self.ring_len,
        );
        vacant.insert(i as u32);
        self.occupy(i, hash, owned(), init);
        Place::Added(i)
    }

    /// Put `key` (of `hash`) at position `i`, which the index already
    /// names, with a ring that `init` writes.
    fn occupy(&mut self, i: usize, hash: u64, key: K, init: impl FnOnce(Ring<'_, H>)) {
        let entry = &mut self.entries[i];
        entry.key = Some(key);
        entry.hash = hash as u32;
        init(self.ring(i));
    }

    /// Drop the keys `idle` says are (their positions go free), then, if
    /// few keys are left, compact the arrays (free them with none left).
    /// How many were dropped, and the arrays compaction replaced, for the
    /// caller to free once it has let go of the lock (freeing large arrays
    /// may take the kernel a while). The positions are read in order, each
    /// head once: a sweep reads the arrays front to back.
    pub(crate) fn retain(
        &mut self,
        g: &Geometry,
        shrink: Shrink,
        mut idle: impl FnMut(Ring<'_, H>) -> bool,
    ) -> (usize, Option<Table<K, H>>) {
        if shrink == Shrink::IfFew {
            // When few keys would be left, copy them to new arrays straight
            // away: a read of each head, where dropping each idle key from
            // the index first would take a probe each (a flood's keys, all
            // idle at once).
            let idle_at: Vec<bool> = (0..self.entries.len())
                .map(|i| self.entries[i].key.is_some() && idle(self.ring(i)))
                .collect();
            let dropped = idle_at.iter().filter(|&&idle| idle).count();
            if shrinks(self.len() - dropped, self.capacity()) {
                for (entry, &idle) in self.entries.iter_mut().zip(&idle_at) {
                    if idle {
                        entry.key = None;
                    }
                }
                return (dropped, Some(self.compact(g)));
            }
            return self.drop_idle(g, shrink, |_, i| idle_at[i]);
        }
        self.drop_idle(g, shrink, |table, i| {
            table.entries[i].key.is_some() && idle(table.ring(i))
        })
    }

    /// [`retain`](Self::retain), dropping each key `idle` says is (given the
    /// table and a position) from the index, one at a time.
    fn drop_idle(
        &mut self,
        g: &Geometry,
        shrink: Shrink,
        mut idle: impl FnMut(&Self, usize) -> bool,
    ) -> (usize, Option<Table<K, H>>) {
        let mut dropped = 0;
        for i in 0..self.entries.len() {
            if !idle(self, i) {
                continue;
            }
            let hash = index_hash(self.entries[i].hash.into());
            if let Ok(found) = self.index.find_entry(hash, |&j| j as usize == i) {
                found.remove();
            }
            self.entries[i].key = None;
            self.free.push(i as u32);
            dropped += 1;
        }
        // Also when this sweep dropped none: a sweep that may not shrink (a
        // check's) may have dropped them.
        let few = shrinks(self.len(), self.capacity());
        let replaced = (shrink == Shrink::IfFew && few).then(|| self.compact(g));
        (dropped, replaced)
    }

    /// Move the keys to the front of arrays sized for them (a fifth more),
    /// in the order of their positions, or free the arrays with no key. The
    /// old arrays, for the caller to free once it has let go of the lock.
    fn compact(&mut self, g: &Geometry) -> Table<K, H> {
        let mut new = Table::new(self.ring_len);
        let live = self.entries.iter().filter(|e| e.key.is_some()).count();
        if live > 0 {
            let capacity = capacity_for(live);
            new.entries.reserve_exact(capacity);
            new.lines
                .reserve_exact((capacity * self.ring_len).div_ceil(LineOf::<H>::WORDS));
            new.index.reserve(capacity, |_| 0);
            for i in 0..self.entries.len() {
                if let Some(key) = self.entries[i].key.take() {
                    let hash = self.entries[i].hash;
                    let from = self.ring(i);
                    new.insert(hash.into(), key, |to| from.copy_to(g, &to));
                }
            }
        }
        std::mem::replace(self, new)
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;
    use crate::ring::Compact;
    use crate::Policy;
    use std::hash::BuildHasher;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn setup() -> (Table<u64, Compact>, Geometry, KeyHasher) {
        let g = Geometry::new(&Policy::per(3, Duration::from_secs(1)).unwrap());
        (Table::new(g.ring_len()), g, KeyHasher::default())
    }

    /// Track `k` with one unit at `now`.
    fn add(t: &mut Table<u64, Compact>, g: &Geometry, h: &KeyHasher, k: u64, now: u64) -> usize {
        let i = t.insert(h.hash_one(k), k, |ring| ring.init(g, g.slot(now), &[], &[]));
        assert!(t.ring(i).acquire(g, now, 1).is_allowed());
        i
    }

    fn used(t: &Table<u64, Compact>, g: &Geometry, h: &KeyHasher, k: u64, now: u64) -> Option<u32> {
        let i = t.find(h.hash_one(k), &k)?;
        Some(g.limit() - t.ring(i).peek(g, now, 0).remaining())
    }

    #[test]
    fn every_key_inserted_is_found_with_its_own_counts_and_no_other() {
        let (mut t, g, h) = setup();
        for k in 0..5_000u64 {
            add(&mut t, &g, &h, k, 0);
            if k % 2 == 0 {
                let i = t.find(h.hash_one(k), &k).unwrap();
                assert!(t.ring(i).acquire(&g, 0, 1).is_allowed());
            }
        }
        assert_eq!(t.len(), 5_000);
        for k in 0..5_000u64 {
            assert_eq!(
                used(&t, &g, &h, k, 0),
                Some(1 + (k % 2 == 0) as u32),
                "key {k}"
            );
        }
        assert_eq!(used(&t, &g, &h, 5_000, 0), None);
        // Grown a fifth at a time: never more than a fifth of room spare.
        assert!(
            t.capacity() * 5 <= 5_000 * 6 + 5,
            "room for {}",
            t.capacity()
        );
    }

    #[test]
    fn keys_that_come_and_go_take_the_positions_of_those_dropped() {
        let (mut t, g, h) = setup();
        for k in 0..1_000u64 {
            add(&mut t, &g, &h, k, 0);
        }
        let room = t.capacity();
        // Round after round, the keys of a window ago go idle and as many new
        // ones come: the arrays never grow.
        for round in 1..=10u64 {
            let now = round * 2_000 * MS;
            assert_eq!(
                t.retain(&g, Shrink::IfFew, |ring| ring.is_idle(&g, now)).0,
                1_000
            );
            for k in 0..1_000u64 {
                add(&mut t, &g, &h, round * 1_000 + k, now);
            }
            assert_eq!(t.capacity(), room, "round {round}");
        }
        assert_eq!(t.len(), 1_000);
        assert_eq!(used(&t, &g, &h, 10_500, 20_000 * MS), Some(1));
        assert_eq!(used(&t, &g, &h, 9_500, 20_000 * MS), None);
    }

    #[test]
    fn a_sweep_that_leaves_few_keys_compacts_them_with_their_counts_and_none_frees_all() {
        let (mut t, g, h) = setup();
        for k in 0..4_000u64 {
            add(&mut t, &g, &h, k, 0);
        }
        // Key 7 is used again 2 s later; the rest are idle at 2.5 s.
        let i = t.find(h.hash_one(7u64), &7).unwrap();
        assert!(t.ring(i).acquire(&g, 2_000 * MS, 2).is_allowed());
        let (big, bytes) = (t.capacity(), t.bytes());
        assert_eq!(
            t.retain(&g, Shrink::IfFew, |ring| ring.is_idle(&g, 2_500 * MS))
                .0,
            3_999
        );
        assert!(t.capacity() < big / 100, "room for {}", t.capacity());
        assert!(t.bytes() < bytes / 100);
        assert_eq!(used(&t, &g, &h, 7, 2_500 * MS), Some(2));
        assert_eq!(used(&t, &g, &h, 8, 2_500 * MS), None);
        // Once key 7 is idle too, the arrays go.
        assert_eq!(
            t.retain(&g, Shrink::IfFew, |ring| ring.is_idle(&g, 5_000 * MS))
                .0,
            1
        );
        assert_eq!((t.len(), t.bytes()), (0, 0));
        add(&mut t, &g, &h, 7, 5_000 * MS);
        assert_eq!(used(&t, &g, &h, 7, 5_000 * MS), Some(1));
    }

    #[test]
    fn keys_that_own_memory_are_dropped_with_their_position_or_table() {
        let g = Geometry::new(&Policy::per(3, Duration::from_secs(1)).unwrap());
        let h = KeyHasher::default();
        let mut t: Table<std::sync::Arc<u64>, Compact> = Table::new(g.ring_len());
        let keys: Vec<_> = (0..100).map(std::sync::Arc::new).collect();
        for k in &keys {
            t.insert(h.hash_one(k), k.clone(), |ring| ring.init(&g, 0, &[1], &[]));
        }
        assert!(keys.iter().all(|k| std::sync::Arc::strong_count(k) == 2));
        // The even keys are used again later; the odd ones go idle and are
        // dropped by the sweep, the rest with the table.
        for k in keys.iter().step_by(2) {
            let i = t.find(h.hash_one(k), k).unwrap();
            assert!(t.ring(i).acquire(&g, 1_500 * MS, 1).is_allowed());
        }
        assert_eq!(
            t.retain(&g, Shrink::IfFew, |ring| ring.is_idle(&g, 2_000 * MS))
                .0,
            50
        );
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(std::sync::Arc::strong_count(k), 2 - n % 2, "key {n}");
        }
        drop(t);
        assert!(keys.iter().all(|k| std::sync::Arc::strong_count(k) == 1));
    }
}

//! A partition's keys and their rings: a plain map, changed only under the
//! partition's writer lock and read under its reader lock (see `partition`).
//!
//! Each key has a position: the key and its ring's head in `entries[i]`,
//! the ring's buckets in `lines`, `ring_len` words from word `i * ring_len`.
//! An index (hashbrown's `HashTable` of positions, by the keys' hashes)
//! finds a key's position. A key dropped as idle frees its position, which
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
use std::hash::{BuildHasher, Hash};

/// The hasher of a limiter's keys (seeded per limiter, so that clients
/// cannot choose keys that collide): foldhash's quality variant, not its
/// fast one, whose hash of consecutive integers (ids, addresses of one
/// range) is a near-linear sequence in its low bits for some seeds.
pub(crate) type KeyHasher = foldhash::quality::RandomState;

/// Arrays with any room never have room for fewer keys than this.
pub(crate) const MIN_CAPACITY: usize = 8;

/// A key and its ring's head, at one position; `None` for a free position.
#[derive(Debug)]
struct Entry<K, H> {
    key: Option<K>,
    head: H,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Table<K, H: Head> {
    /// Positions, by the hash of the key there.
    index: HashTable<u32>,
    entries: Vec<Entry<K, H>>,
    /// Each position's buckets, `ring_len` words from word `i * ring_len`.
    lines: Vec<LineOf<H>>,
    /// Positions whose key was dropped, to be taken again.
    free: Vec<u32>,
    ring_len: usize,
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
            .find(hash, |&i| entries[i as usize].key.as_ref() == Some(key))
            .map(|&i| i as usize)
    }

    /// Track `key` (of `hash`), which the table does not hold, with a ring
    /// that `init` writes: at a free position, else at a new one (the arrays
    /// grown by a fifth when full). Its position.
    pub(crate) fn insert<S: BuildHasher>(
        &mut self,
        hash: u64,
        key: K,
        hasher: &S,
        init: impl FnOnce(Ring<'_, H>),
    ) -> usize {
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                let i = self.entries.len();
                if i == self.entries.capacity() {
                    let more = capacity_for(i + 1) - i;
                    self.entries.reserve_exact(more);
                    let words = (i + more) * self.ring_len;
                    let lines = words.div_ceil(LineOf::<H>::WORDS);
                    self.lines.reserve_exact(lines - self.lines.len());
                }
                self.entries.push(Entry {
                    key: None,
                    head: H::new(0, None),
                });
                let words = (i + 1) * self.ring_len;
                let lines = words.div_ceil(LineOf::<H>::WORDS);
                self.lines.resize_with(lines, LineOf::<H>::new);
                i
            }
        };
        init(self.ring(i));
        let entries = &self.entries;
        self.index.insert_unique(hash, i as u32, |&j| {
            entries[j as usize]
                .key
                .as_ref()
                .map_or(0, |key| hasher.hash_one(key))
        });
        self.entries[i].key = Some(key);
        i
    }

    /// Drop the keys `idle` says are (their positions go free), then, if
    /// few keys are left, compact the arrays (free them with none left).
    /// How many were dropped.
    pub(crate) fn retain<S: BuildHasher>(
        &mut self,
        g: &Geometry,
        hasher: &S,
        mut idle: impl FnMut(Ring<'_, H>) -> bool,
    ) -> usize {
        let (entries, lines, free, ring_len) = (
            &mut self.entries,
            &self.lines,
            &mut self.free,
            self.ring_len,
        );
        let mut dropped = 0;
        self.index.retain(|&mut i| {
            let i = i as usize;
            let ring = Ring::new(&entries[i].head, lines, i * ring_len);
            if !idle(ring) {
                return true;
            }
            entries[i].key = None;
            free.push(i as u32);
            dropped += 1;
            false
        });
        if dropped > 0 && shrinks(self.len(), self.capacity()) {
            self.compact(g, hasher);
        }
        dropped
    }

    /// Move the keys to the front of arrays sized for them (a fifth more),
    /// in the order of their positions, or free the arrays with no key.
    fn compact<S: BuildHasher>(&mut self, g: &Geometry, hasher: &S) {
        let mut new = Table::new(self.ring_len);
        let live = self.len();
        if live > 0 {
            let capacity = capacity_for(live);
            new.entries.reserve_exact(capacity);
            new.lines
                .reserve_exact((capacity * self.ring_len).div_ceil(LineOf::<H>::WORDS));
            new.index.reserve(capacity, |_| 0);
            let entries = std::mem::take(&mut self.entries);
            for (i, Entry { key, head }) in entries.into_iter().enumerate() {
                if let Some(key) = key {
                    let from = Ring::new(&head, &self.lines, i * self.ring_len);
                    let hash = hasher.hash_one(&key);
                    new.insert(hash, key, hasher, |to| from.copy_to(g, &to));
                }
            }
        }
        *self = new;
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;
    use crate::ring::Compact;
    use crate::Policy;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn setup() -> (Table<u64, Compact>, Geometry, KeyHasher) {
        let g = Geometry::new(&Policy::per(3, Duration::from_secs(1)).unwrap());
        (Table::new(g.ring_len()), g, KeyHasher::default())
    }

    /// Track `k` with one unit at `now`.
    fn add(t: &mut Table<u64, Compact>, g: &Geometry, h: &KeyHasher, k: u64, now: u64) -> usize {
        let i = t.insert(h.hash_one(k), k, h, |ring| ring.init(g, g.slot(now), &[]));
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
            assert_eq!(t.retain(&g, &h, |ring| ring.is_idle(&g, now)), 1_000);
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
        assert_eq!(t.retain(&g, &h, |ring| ring.is_idle(&g, 2_500 * MS)), 3_999);
        assert!(t.capacity() < big / 100, "room for {}", t.capacity());
        assert!(t.bytes() < bytes / 100);
        assert_eq!(used(&t, &g, &h, 7, 2_500 * MS), Some(2));
        assert_eq!(used(&t, &g, &h, 8, 2_500 * MS), None);
        // Once key 7 is idle too, the arrays go.
        assert_eq!(t.retain(&g, &h, |ring| ring.is_idle(&g, 5_000 * MS)), 1);
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
            t.insert(h.hash_one(k), k.clone(), &h, |ring| ring.init(&g, 0, &[1]));
        }
        assert!(keys.iter().all(|k| std::sync::Arc::strong_count(k) == 2));
        // The even keys are used again later; the odd ones go idle and are
        // dropped by the sweep, the rest with the table.
        for k in keys.iter().step_by(2) {
            let i = t.find(h.hash_one(k), k).unwrap();
            assert!(t.ring(i).acquire(&g, 1_500 * MS, 1).is_allowed());
        }
        assert_eq!(t.retain(&g, &h, |ring| ring.is_idle(&g, 2_000 * MS)), 50);
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(std::sync::Arc::strong_count(k), 2 - n % 2, "key {n}");
        }
        drop(t);
        assert!(keys.iter().all(|k| std::sync::Arc::strong_count(k) == 1));
    }
}

//! An open-addressing index over keys and rings held inline, in the order
//! they were added: one allocation per array, none per key.
//!
//! A table has room for `capacity` keys, at positions filled front to back:
//! position `i` holds a key and its ring's head (`entries[i]`) and the ring's
//! buckets (`ring_len` words of `lines` from `i * ring_len`). An index of
//! 32-bit slots, half as many again as the capacity, finds a key's position
//! by its hash: a full slot holds 7 bits of the key's hash and the position,
//! so a probe reads one array, most often one line of it. The large arrays
//! need no slack for probing (only the index, at 4 bytes a slot, has it),
//! and keys first seen together
//! lie together: sweeps and rebuilds read the arrays front to back, and
//! checks of keys in the order they arrived read them the same way, which the
//! hardware prefetcher serves ahead of the check.
//!
//! # Invariant
//!
//! - **Written once.** A position is filled once in a table's life, by the
//!   table's one writer (its partition's lock holder): the key is set, the
//!   ring written, `len` raised past it (`Release`), then an index slot is
//!   published with the position (`Release`). Readers reach a position by
//!   its index slot (`Acquire`) or below `len` (`Acquire`), so they see the
//!   key and the ring's words as written. Index
//!   slots are never emptied, so the slots between a key's home and its slot
//!   stay full: a probe that meets an empty slot has passed every slot the
//!   key could be in.
//! - **One position per key.** The writer fills a position only for a key
//!   the table does not hold. A position whose ring is retired is a
//!   tombstone: its key was dropped (idle), or its ring was moved to the
//!   table that replaced this one. The writer may revive a tombstone for the
//!   same key in place (`Ring::revive`); a rebuild drops the rest.
//! - **Leaving.** A ring leaves a table checks can reach only retired (see
//!   `ring`'s module docs): by a sweep, idle; by a rebuild, idle or live, a
//!   live one copied into the new table before the new table is published.
//!   A check that holds a retired ring fails its re-read of the head and
//!   looks again. A rebuild that has made the table unreachable (see
//!   `partition`) reads and copies its rings as they are.
//!
//! Memory per key, a u64 key and the compact layout: 24 bytes of key and
//! head (`OnceLock<u64>` and one word), 64 bytes of buckets, and 1.5 index
//! slots of 4 bytes.

use crate::ring::{lines_for, Bucket, Head, Line, LineOf, Ring};
use std::hash::Hash;
use std::mem::ManuallyDrop;
use std::sync::atomic::{
    AtomicU32, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::OnceLock;

/// The hasher of a limiter's keys (seeded per limiter, so that clients
/// cannot choose keys that collide).
///
/// foldhash's quality variant, not its fast one: the tables probe linearly
/// from a home taken from the hash's low bits, and the fast variant's hash
/// of consecutive integers (ids, addresses of one range) is a near-linear
/// sequence in those bits. For some of its per-process seeds that sequence
/// packs homes into long runs (2048 consecutive keys in 5120 slots: up to 35
/// probes a lookup where a random spread takes 1.33); the quality variant's
/// one more folded multiply breaks it, whatever the seed.
pub(crate) type KeyHasher = foldhash::quality::RandomState;

/// A full index slot: the top 7 bits of the key's hash above `POSITION_BITS`
/// bits of its position + 1 (never 0, the empty slot).
const POSITION_BITS: u32 = 25;
const POSITION_MASK: u32 = (1 << POSITION_BITS) - 1;
/// Tables with any room never have room for fewer keys than this.
pub(crate) const MIN_CAPACITY: usize = 8;
/// Nor for more than this (33.5M keys, about 3 GiB of table): the positions
/// an index slot holds. A limiter's cap keeps each of its tables below it
/// (see `limiter::MAX_KEYS`).
pub(crate) const MAX_CAPACITY: usize = POSITION_MASK as usize;

/// A key and its ring's head: what a check reads first at a position.
#[derive(Debug)]
struct Entry<K, H> {
    key: OnceLock<K>,
    head: H,
}

impl<K, H: Head> Entry<K, H> {
    fn empty() -> Entry<K, H> {
        Entry {
            key: OnceLock::new(),
            head: H::new(0, None),
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Table<K, H: Head> {
    /// 0 empty, else a key's [`slot`] word.
    index: Box<[AtomicU32]>,
    /// Dropped by hand (see `Drop`): for keys without drop glue, freeing a
    /// table then skips a pass over its entries.
    entries: Box<[ManuallyDrop<Entry<K, H>>]>,
    /// Each position's buckets, `ring_len` words from word `i * ring_len`.
    lines: Box<[LineOf<H>]>,
    /// Positions filled (tombstones included): `0..len`.
    len: AtomicUsize,
    ring_len: usize,
}

/// The bits of `hash` an index slot holds.
#[inline(always)]
fn tag(hash: u64) -> u32 {
    (hash >> 57) as u32
}

/// The index slot of a key of `hash` at `position`.
#[inline(always)]
fn slot(hash: u64, position: usize) -> u32 {
    tag(hash) << POSITION_BITS | (position as u32 + 1)
}

impl<K, H: Head> Drop for Table<K, H> {
    fn drop(&mut self) {
        // A key that owns nothing (an integer, an address) needs no drop,
        // and its `OnceLock`'s drop would only read each entry's state: for
        // 1M keys a pass over 24 MiB, a sixth of dropping them in bulk. The
        // rest are dropped one by one.
        if std::mem::needs_drop::<K>() {
            for entry in self.entries.iter_mut() {
                drop(ManuallyDrop::into_inner(std::mem::replace(
                    entry,
                    ManuallyDrop::new(Entry::empty()),
                )));
            }
        }
    }
}

impl<K, H: Head> Table<K, H> {
    /// The bytes of the table's arrays (its heap, but for the allocator's
    /// own overhead and the table's few words).
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.index)
            + std::mem::size_of_val(&*self.entries)
            + std::mem::size_of_val(&*self.lines)
    }
}

impl<K: Hash + Eq, H: Head> Table<K, H> {
    /// An empty table with room for at least `capacity` keys (at least
    /// [`MIN_CAPACITY`], at most [`MAX_CAPACITY`]; none for 0) with rings
    /// of `ring_len` buckets. A table of no room allocates nothing, finds
    /// nothing, and is full.
    pub(crate) fn new(capacity: usize, ring_len: usize) -> Table<K, H> {
        let capacity = match capacity {
            0 => 0,
            c => c.clamp(MIN_CAPACITY, MAX_CAPACITY),
        };
        // At most 2 index slots in 3 full: a lookup probes 2 slots on
        // average, a miss (a new key) 5, and one always ends at an empty
        // slot. (At 4 in 5, a byte a key less, a lookup probed 3 and a miss
        // 13: 4% more instructions a check and 8% a new key, in callgrind.)
        let slots = (capacity + capacity / 2).next_multiple_of(8);
        Table {
            index: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            entries: (0..capacity)
                .map(|_| ManuallyDrop::new(Entry::empty()))
                .collect(),
            lines: lines_for::<H>(capacity * ring_len),
            len: AtomicUsize::new(0),
            ring_len,
        }
    }

    /// How many keys the table has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Positions filled (tombstones included).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Acquire)
    }

    /// Where `hash` starts probing the index: its low 32 bits scaled to the
    /// index (the partition, the overflow mark and the tag use other bits).
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        (((hash & 0xFFFF_FFFF) * self.index.len() as u64) >> 32) as usize
    }

    /// The slot a probe reads after `s`: the next, wrapping round the end.
    #[inline(always)]
    fn next_slot(&self, s: usize) -> usize {
        if s + 1 == self.index.len() {
            0
        } else {
            s + 1
        }
    }

    /// The position of `key` (of `hash`), if the table holds it (its ring
    /// may be retired).
    #[inline(always)]
    pub(crate) fn find(&self, hash: u64, key: &K) -> Option<usize> {
        if self.index.is_empty() {
            return None;
        }
        let tag = tag(hash);
        let mut s = self.home(hash);
        loop {
            // Published after the key and the ring (`insert`).
            let word = self.index[s].load(Acquire);
            if word == 0 {
                return None;
            }
            if word >> POSITION_BITS == tag {
                let i = (word & POSITION_MASK) as usize - 1;
                self.touch_ring(i);
                if self.entries[i].key.get() == Some(key) {
                    return Some(i);
                }
            }
            s = self.next_slot(s);
        }
    }

    /// Start loading the lines of position `i`'s buckets, so that they
    /// arrive while the key and head are read, not after (the bucket a check
    /// writes depends on the head): two cache misses in parallel instead of
    /// one after the other, for a table larger than the caches. The first two
    /// lines only (a ring of up to 32 compact or 16 wide buckets); the load's
    /// value is not used.
    #[inline(always)]
    fn touch_ring(&self, i: usize) {
        let first = i * self.ring_len / LineOf::<H>::WORDS;
        let last = ((i + 1) * self.ring_len - 1) / LineOf::<H>::WORDS;
        // The second may be the first again: a load from cache.
        std::hint::black_box(self.lines[first].word(0).load());
        std::hint::black_box(self.lines[last.min(first + 1)].word(0).load());
    }

    /// The ring at position `i`.
    #[inline(always)]
    pub(crate) fn ring(&self, i: usize) -> Ring<'_, H> {
        Ring::new(&self.entries[i].head, &self.lines, i * self.ring_len)
    }

    /// The key at position `i` (`None` for a position not filled).
    pub(crate) fn key(&self, i: usize) -> Option<&K> {
        self.entries[i].key.get()
    }

    /// The filled positions (tombstones included), in order.
    pub(crate) fn positions(&self) -> std::ops::Range<usize> {
        0..self.len()
    }

    /// Fill the next position with `key` and a ring that `init` writes, then
    /// publish it; the position. For the table's writer only, for a key the
    /// table does not hold, with room left.
    pub(crate) fn insert(&self, hash: u64, key: K, init: impl FnOnce(Ring<'_, H>)) -> usize {
        let i = self.len.load(Relaxed);
        let set = self.entries[i].key.set(key);
        debug_assert!(set.is_ok(), "a position past len held a key");
        init(self.ring(i));
        self.len.store(i + 1, Release);
        self.index[self.empty_slot(hash)].store(slot(hash, i), Release);
        i
    }

    /// [`insert`](Self::insert) into a table no other thread holds yet (one
    /// a rebuild is filling): the key and the index slot are plain writes.
    pub(crate) fn insert_unshared(
        &mut self,
        hash: u64,
        key: K,
        init: impl FnOnce(Ring<'_, H>),
    ) -> usize {
        let i = *self.len.get_mut();
        self.entries[i].key = OnceLock::from(key);
        init(self.ring(i));
        *self.len.get_mut() = i + 1;
        let empty = self.empty_slot(hash);
        *self.index[empty].get_mut() = slot(hash, i);
        i
    }

    /// The first empty index slot from `hash`'s home on, in the order
    /// `find` probes (the index has one: it is larger than the capacity).
    fn empty_slot(&self, hash: u64) -> usize {
        let mut s = self.home(hash);
        while self.index[s].load(Relaxed) != 0 {
            s = self.next_slot(s);
        }
        s
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;
    use crate::ring::{Compact, Geometry, Wide};
    use crate::Policy;
    use std::hash::BuildHasher;
    use std::time::Duration;

    fn geometry() -> Geometry {
        Geometry::new(&Policy::per(5, Duration::from_secs(1)).unwrap())
    }

    #[test]
    fn every_key_inserted_is_found_and_no_other() {
        let g = geometry();
        let hasher = foldhash::fast::FixedState::with_seed(7);
        // Full: the index at its fullest, 2 slots in 3.
        let table: Table<u64, Compact> = Table::new(1_000, g.ring_len());
        let keys: Vec<u64> = (0..1_000).map(|k| k * 7919).collect();
        for &k in &keys {
            let hash = hasher.hash_one(k);
            assert_eq!(table.find(hash, &k), None);
            let i = table.insert(hash, k, |ring| ring.init(&g, 0, &[]));
            assert_eq!(table.find(hash, &k), Some(i));
        }
        for &k in &keys {
            let i = table.find(hasher.hash_one(k), &k).unwrap();
            assert_eq!(table.key(i), Some(&k));
        }
        for k in 1_000..3_000u64 {
            let k = k * 7919;
            assert_eq!(table.find(hasher.hash_one(k), &k), None, "{k}");
        }
        assert_eq!(table.positions(), 0..1_000);
    }

    #[test]
    fn keys_sharing_a_home_and_a_tag_are_told_apart_by_the_key() {
        let g = geometry();
        let table: Table<u64, Wide> = Table::new(16, g.ring_len());
        // One hash for all: the same home, the same tag.
        let hash = 0xF0F0_0000_0000_0003;
        for k in 0..10u64 {
            table.insert(hash, k, |ring| ring.init(&g, 0, &[k]));
        }
        for k in 0..10u64 {
            let i = table.find(hash, &k).unwrap();
            assert_eq!(table.ring(i).counts_by_age(&g, 0).1[0], k, "key {k}");
        }
        assert_eq!(table.find(hash, &10), None);
    }

    #[test]
    fn a_probe_wraps_round_the_end_of_the_index() {
        let g = geometry();
        // Room for 12 keys, 18 index slots (rounded up to 24).
        let table: Table<u64, Compact> = Table::new(12, g.ring_len());
        assert_eq!(table.index.len(), 24);
        // Home the last slot: the next keys wrap to slots 0, 1, ...
        let hash = 0xFFFF_FFFF;
        for k in 0..12u64 {
            assert_eq!(
                table.insert(hash, k, |ring| ring.init(&g, 0, &[])),
                k as usize
            );
        }
        assert_eq!(
            table.index[10].load(Relaxed),
            slot(hash, 11),
            "key 11 in slot 10"
        );
        assert_eq!(table.find(hash, &11), Some(11));
        assert_eq!(table.find(hash, &12), None, "the empty slots end it");
    }

    /// Index slots a lookup of `key` reads, its own included.
    fn probes(table: &Table<u64, Compact>, hash: u64, key: u64) -> usize {
        let position = table.find(hash, &key).unwrap();
        let mut s = table.home(hash);
        let mut probes = 1;
        while table.index[s].load(Relaxed) & POSITION_MASK != position as u32 + 1 {
            s = table.next_slot(s);
            probes += 1;
        }
        probes
    }

    /// [`KeyHasher`] with a seed of the test's choosing.
    fn seeded_hasher(shared_seed: u64) -> foldhash::quality::SeedableRandomState {
        let shared = Box::leak(Box::new(foldhash::SharedSeed::from_u64(shared_seed)));
        foldhash::quality::SeedableRandomState::with_seed(shared_seed, shared)
    }

    #[test]
    fn consecutive_keys_probe_as_few_slots_as_random_ones_whatever_the_seed() {
        // Linear probing at 2 slots in 3 full reads 2 slots a lookup on
        // average, for a hash that spreads keys at random. Consecutive
        // integers are the keys most often met (ids, one range of
        // addresses); the limiter's hasher must spread them as well under
        // every seed, not only most.
        let g = geometry();
        let keys = 4_096u64;
        for seed in 1..=64 {
            let hasher = seeded_hasher(seed);
            let table: Table<u64, Compact> = Table::new(keys as usize, g.ring_len());
            assert_eq!(table.index.len(), 6_144);
            for k in 0..keys {
                table.insert(hasher.hash_one(k), k, |ring| ring.init(&g, 0, &[]));
            }
            let total: usize = (0..keys)
                .map(|k| probes(&table, hasher.hash_one(k), k))
                .sum();
            let mean = total as f64 / keys as f64;
            assert!(mean < 2.5, "seed {seed}: {mean:.2} slots a lookup");
        }
    }

    #[test]
    fn an_index_slot_holds_the_last_position_and_the_whole_tag() {
        let hash = u64::MAX;
        let word = slot(hash, MAX_CAPACITY - 1);
        assert_eq!(word >> POSITION_BITS, tag(hash));
        assert_eq!(word & POSITION_MASK, MAX_CAPACITY as u32);
        assert_ne!(slot(0, 0), 0, "a full slot is never the empty one");
    }

    #[test]
    fn keys_lie_in_the_order_they_came() {
        let g = geometry();
        let hasher = foldhash::fast::FixedState::with_seed(7);
        let table: Table<u64, Wide> = Table::new(100, g.ring_len());
        for k in 0..100u64 {
            table.insert(hasher.hash_one(k), k * 3, |ring| ring.init(&g, 0, &[k]));
        }
        for i in table.positions() {
            assert_eq!(table.key(i), Some(&(i as u64 * 3)));
            assert_eq!(table.ring(i).counts_by_age(&g, 0).1[0], i as u64);
        }
    }

    #[test]
    fn keys_that_own_memory_are_dropped_with_their_table() {
        let g = geometry();
        let hasher = foldhash::fast::FixedState::with_seed(7);
        let owner = std::sync::Arc::new(());
        let table: Table<(u64, std::sync::Arc<()>), Compact> = Table::new(100, g.ring_len());
        for k in 0..100u64 {
            let key = (k, std::sync::Arc::clone(&owner));
            table.insert(hasher.hash_one(&key), key, |ring| ring.init(&g, 0, &[]));
        }
        assert_eq!(std::sync::Arc::strong_count(&owner), 101);
        drop(table);
        assert_eq!(std::sync::Arc::strong_count(&owner), 1);
    }

    #[test]
    fn a_u64_key_takes_88_bytes_and_its_index_slots_in_the_compact_layout() {
        // The key and head, the buckets of the default ring (the index:
        // 4 bytes a slot, 1.5 slots a key).
        assert_eq!(std::mem::size_of::<Entry<u64, Compact>>(), 24);
        assert_eq!(std::mem::size_of::<LineOf<Compact>>(), 64);
        assert_eq!(std::mem::size_of::<Entry<u64, Wide>>(), 32);
        assert_eq!(std::mem::size_of::<LineOf<Wide>>(), 64);
    }
}

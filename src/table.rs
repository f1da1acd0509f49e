//! An open-addressing table of keys and their rings, held inline: one
//! allocation per array, none per key.
//!
//! # Invariant
//!
//! - **Written once.** A slot is filled once in a table's life, by the
//!   table's one writer (its partition's lock holder): the key is set, the
//!   ring written, then the slot's control byte is published with `Release`.
//!   Readers find a slot by its control byte (`Acquire`), so they see the key
//!   and the ring's words as written. Slots are never emptied, so the slots
//!   between a key's home and its slot stay full: a probe that meets an empty
//!   slot has passed every slot the key could be in.
//! - **One slot per key.** The writer fills a slot only for a key the table
//!   does not hold. A slot whose ring is retired is a tombstone: its key was
//!   dropped (idle), or its ring was moved to the table that replaced this
//!   one. The writer may revive a tombstone for the same key in place
//!   (`Ring::revive`); a rebuild drops the rest.
//! - **Leaving.** A ring leaves a table only retired (see `ring`'s module
//!   docs): by a sweep, idle; by a rebuild, idle or live, a live one copied
//!   into the new table before the new table is published. A check that
//!   holds a retired ring fails its re-read of the head and looks again.
//!
//! Memory per slot, a u64 key and the compact layout: 1 control byte, 24
//! bytes of key and head (`OnceLock<u64>` and one word), 64 bytes of buckets.

use crate::ring::{lines_for, Bucket, Head, Line, LineOf, Ring};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::OnceLock;

/// The low byte of each of a word's 8 control bytes, and the high bit.
const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;
/// Tables with any slot never have fewer than this.
pub(crate) const MIN_SLOTS: usize = 8;

/// A key and its ring's head: what a check reads first in a slot.
#[derive(Debug)]
struct Entry<K, H> {
    key: OnceLock<K>,
    head: H,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Table<K, H: Head> {
    /// One byte a slot, 8 a word: 0 empty, else `0x80 | ` the top 7 bits of
    /// the key's hash.
    ctrl: Box<[AtomicU64]>,
    entries: Box<[Entry<K, H>]>,
    /// Each slot's buckets, `ring_len` words from word `slot * ring_len`.
    lines: Box<[LineOf<H>]>,
    ring_len: usize,
}

/// The control byte of a full slot for `hash`.
#[inline(always)]
fn tag(hash: u64) -> u64 {
    0x80 | (hash >> 57)
}

impl<K, H: Head> Table<K, H> {
    /// The bytes of the table's arrays (its heap, but for the allocator's
    /// own overhead and the table's few words).
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.ctrl)
            + std::mem::size_of_val(&*self.entries)
            + std::mem::size_of_val(&*self.lines)
    }
}

impl<K: Hash + Eq, H: Head> Table<K, H> {
    /// An empty table of at least `slots` slots (a multiple of 8, at least
    /// [`MIN_SLOTS`]; none for 0) for rings of `ring_len` buckets. A table of
    /// no slots allocates nothing, finds nothing, and is full.
    pub(crate) fn new(slots: usize, ring_len: usize) -> Table<K, H> {
        let slots = if slots == 0 {
            0
        } else {
            slots.max(MIN_SLOTS).next_multiple_of(8)
        };
        Table {
            ctrl: (0..slots / 8).map(|_| AtomicU64::new(0)).collect(),
            entries: (0..slots)
                .map(|_| Entry {
                    key: OnceLock::new(),
                    head: H::new(0, None),
                })
                .collect(),
            lines: lines_for::<H>(slots * ring_len),
            ring_len,
        }
    }

    pub(crate) fn slots(&self) -> usize {
        self.entries.len()
    }

    /// Where `hash` starts probing: its low 32 bits scaled to the table (the
    /// partition, the overflow mark and the tag use other bits).
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        (((hash & 0xFFFF_FFFF) * self.slots() as u64) >> 32) as usize
    }

    /// The slot holding `key` (of `hash`), if the table holds it (its ring
    /// may be retired).
    #[inline]
    pub(crate) fn find(&self, hash: u64, key: &K) -> Option<usize> {
        if self.ctrl.is_empty() {
            return None;
        }
        let home = self.home(hash);
        let repeated = tag(hash) * LO;
        let mut w = home / 8;
        // The first word from the home slot on; wrapping round, all of it.
        let mut valid = u64::MAX << (8 * (home % 8));
        loop {
            let bytes = self.ctrl[w].load(Acquire);
            // Bytes equal to the tag (a byte above a true match may show
            // too: the key comparison weeds it out).
            let x = bytes ^ repeated;
            let mut matches = x.wrapping_sub(LO) & !x & HI & valid;
            while matches != 0 {
                let i = w * 8 + (matches.trailing_zeros() / 8) as usize;
                self.touch_ring(i);
                if self.entries[i].key.get() == Some(key) {
                    return Some(i);
                }
                matches &= matches - 1;
            }
            if !bytes & HI & valid != 0 {
                return None;
            }
            w = if w + 1 == self.ctrl.len() { 0 } else { w + 1 };
            valid = u64::MAX;
        }
    }

    /// Start loading the lines of slot `i`'s buckets, so that they arrive
    /// while the key and head are read, not after (the bucket a check writes
    /// depends on the head): two cache misses in parallel instead of one
    /// after the other, for a table larger than the caches. The first two
    /// lines only (a ring of up to 32 compact or 16 wide buckets); the load's
    /// value is not used.
    #[inline(always)]
    fn touch_ring(&self, i: usize) {
        let first = i * self.ring_len / LineOf::<H>::WORDS;
        let last = ((i + 1) * self.ring_len - 1) / LineOf::<H>::WORDS;
        for line in first..=last.min(first + 1) {
            std::hint::black_box(self.lines[line].word(0).load());
        }
    }

    /// The ring in slot `i`.
    #[inline(always)]
    pub(crate) fn ring(&self, i: usize) -> Ring<'_, H> {
        Ring::new(&self.entries[i].head, &self.lines, i * self.ring_len)
    }

    /// The key in slot `i` (`None` for an empty slot).
    pub(crate) fn key(&self, i: usize) -> Option<&K> {
        self.entries[i].key.get()
    }

    /// The full slots (tombstones included), in order.
    pub(crate) fn full_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.ctrl.iter().enumerate().flat_map(|(w, word)| {
            let mut full = word.load(Acquire) & HI;
            std::iter::from_fn(move || {
                (full != 0).then(|| {
                    let i = w * 8 + (full.trailing_zeros() / 8) as usize;
                    full &= full - 1;
                    i
                })
            })
        })
    }

    /// Fill the first empty slot from `key`'s home with `key` and a ring that
    /// `init` writes, then publish it; the slot. For the table's writer
    /// only, for a key the table does not hold, with an empty slot left.
    pub(crate) fn insert(&self, hash: u64, key: K, init: impl FnOnce(Ring<'_, H>)) -> usize {
        let i = self.empty_slot(hash);
        let set = self.entries[i].key.set(key);
        debug_assert!(set.is_ok(), "an empty slot held a key");
        init(self.ring(i));
        let word = &self.ctrl[i / 8];
        word.store(word.load(Relaxed) | tag(hash) << (8 * (i % 8)), Release);
        i
    }

    /// [`insert`](Self::insert) into a table no other thread holds yet (one
    /// a rebuild is filling): the key and control byte are plain writes.
    pub(crate) fn insert_unshared(
        &mut self,
        hash: u64,
        key: K,
        init: impl FnOnce(Ring<'_, H>),
    ) -> usize {
        let i = self.empty_slot(hash);
        self.entries[i].key = OnceLock::from(key);
        init(self.ring(i));
        *self.ctrl[i / 8].get_mut() |= tag(hash) << (8 * (i % 8));
        i
    }

    /// The first empty slot from `hash`'s home on, in the order `find`
    /// probes (the table has one).
    fn empty_slot(&self, hash: u64) -> usize {
        let home = self.home(hash);
        let mut w = home / 8;
        let mut valid = u64::MAX << (8 * (home % 8));
        loop {
            let empty = !self.ctrl[w].load(Relaxed) & HI & valid;
            if empty != 0 {
                return w * 8 + (empty.trailing_zeros() / 8) as usize;
            }
            w = if w + 1 == self.ctrl.len() { 0 } else { w + 1 };
            valid = u64::MAX;
        }
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
        // Nearly full: 9 of 10 slots, the most the limiter fills.
        let table: Table<u64, Compact> = Table::new(1_000, g.ring_len());
        let keys: Vec<u64> = (0..900).map(|k| k * 7919).collect();
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
        for k in 900..2_000u64 {
            let k = k * 7919;
            assert_eq!(table.find(hasher.hash_one(k), &k), None, "{k}");
        }
        assert_eq!(table.full_slots().count(), 900);
    }

    #[test]
    fn keys_sharing_a_home_and_a_tag_are_told_apart_by_the_key() {
        let g = geometry();
        let table: Table<u64, Wide> = Table::new(16, g.ring_len());
        // One hash for all: the same home, the same control byte.
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
    fn a_probe_wraps_round_the_end_of_the_table() {
        let g = geometry();
        let table: Table<u64, Compact> = Table::new(8, g.ring_len());
        // Home the last slot: the next keys wrap to slots 0, 1, ...
        let hash = 0xFFFF_FFFF;
        for k in 0..7u64 {
            table.insert(hash, k, |ring| ring.init(&g, 0, &[]));
        }
        assert_eq!(table.find(hash, &6), Some(5));
        assert_eq!(table.find(hash, &7), None, "the one empty slot ends it");
    }

    #[test]
    fn a_slot_of_a_u64_key_takes_89_bytes_in_the_compact_layout() {
        // 1 control byte, the key and head, the buckets of the default ring.
        assert_eq!(std::mem::size_of::<Entry<u64, Compact>>(), 24);
        assert_eq!(std::mem::size_of::<LineOf<Compact>>(), 64);
        assert_eq!(std::mem::size_of::<Entry<u64, Wide>>(), 32);
        assert_eq!(std::mem::size_of::<LineOf<Wide>>(), 64);
    }
}

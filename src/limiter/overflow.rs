//! The shared overflow ring: what decides for keys the limiter has no room
//! for (at `max_keys`), and the marks that make a key's later ring start as a
//! copy of it while it may hold the key's units.

use super::state::{Lookup, State};
use crate::clock::Clock;
use crate::decision::{Decision, Outcome};
use crate::ring::{peek_empty, Geometry, Head};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

/// Groups of keys with their own overflow mark (8 KB per limiter). A key that
/// shares its group's mark with one the overflow ring counted starts its ring
/// as a copy of the overflow ring: more groups, fewer such keys.
pub(super) const OVERFLOW_MARKS: usize = 1024;

impl<K: Hash + Eq + Clone, C: Clock, H: Head> State<K, C, H> {
    /// A check of `key`, untracked, at the cap: decided by the overflow ring,
    /// unless the key has got a ring of its own meanwhile.
    ///
    /// Under the partition's writer lock, which every change of the key's
    /// place in the table (a new ring, a sweep) also holds: the key's ring
    /// cannot appear, take units and be swept between the look for it and
    /// the overflow ring's decision, and the key's overflow mark is raised
    /// before any later ring of the key reads it (so that ring starts as a
    /// copy holding these units). A check that stalled (a clock read long
    /// ago) records no earlier than the latest sweep, read under the lock,
    /// so its units never share a span with those of a ring the sweep
    /// dropped. A denial counts nothing, so it needs no lock.
    #[cold]
    pub(super) fn decide_at_cap(
        &self,
        g: &Geometry,
        key: &Lookup<'_, K>,
        cost: u32,
        now: u64,
    ) -> Decision {
        let at = now.max(self.swept_at.load(SeqCst));
        let peeked = self.overflow.ring().peek(g, at, cost);
        if !peeked.is_allowed() {
            return overflow_decision(peeked, at, now);
        }
        #[cfg(test)]
        if let Some(stall) = self.stall_at_cap.lock().unwrap().take() {
            stall();
        }
        let writing = self.partition_to_add(key).write();
        if let Some(i) = writing.find(key.hash, key.key) {
            // Tracked meanwhile: the key's own ring decides.
            return writing.ring(i).acquire(g, now, cost);
        }
        let at = now.max(self.swept_at.load(SeqCst));
        let d = overflow_decision(self.overflow.ring().acquire(g, at, cost), at, now);
        // A check of cost 0 counted nothing for the key: no mark, no copy later.
        if d.is_allowed() && cost > 0 {
            self.raise_overflow_mark(key, d.slot + g.span_slots());
        }
        drop(writing);
        d
    }

    /// [`peek`](Self::peek) for a key without a ring: what
    /// [`decide_rest`](Self::decide_rest) would decide, without counting or
    /// tracking. A new ring starts no earlier than the latest sweep; at the cap
    /// the check counts in the overflow ring at that start, its times measured
    /// from `now`.
    pub(super) fn peek_untracked(
        &self,
        g: &Geometry,
        key: &Lookup<'_, K>,
        now: u64,
        cost: u32,
    ) -> Decision {
        let start = now.max(self.swept_at.load(SeqCst));
        if self.keys.load(Relaxed) >= self.max_keys {
            overflow_decision(self.overflow.ring().peek(g, start, cost), start, now)
        } else if g.slot(start) < self.overflow_mark(key) {
            self.overflow.copy(g, start).ring().peek(g, now, cost)
        } else {
            peek_empty(g, g.slot(start), now, cost)
        }
    }

    /// The overflow mark of `key`'s group (see `overflow_marks`): 0 while
    /// the overflow ring has admitted nothing.
    pub(super) fn overflow_mark(&self, key: &Lookup<'_, K>) -> u64 {
        self.overflow_marks
            .get()
            .map_or(0, |marks| marks[mark_group(key.hash)].load(SeqCst))
    }

    /// Raise the overflow mark of `key`'s group to `until`.
    pub(super) fn raise_overflow_mark(&self, key: &Lookup<'_, K>, until: u64) {
        self.overflow_marks()[mark_group(key.hash)].fetch_max(until, SeqCst);
    }

    /// Every group's overflow mark, made on first use.
    pub(super) fn overflow_marks(&self) -> &[AtomicU64] {
        self.overflow_marks
            .get_or_init(|| (0..OVERFLOW_MARKS).map(|_| AtomicU64::new(0)).collect())
    }
}

/// The group of keys of `hash` that shares an overflow mark.
pub(super) fn mark_group(hash: u64) -> usize {
    (hash >> 32) as usize % OVERFLOW_MARKS
}

/// A decision of the overflow ring, made at `at` (no earlier than the latest
/// sweep), as of the clock's reading `now`: its times count from `at`, a
/// decision's from `now`.
pub(super) fn overflow_decision(mut d: Decision, at: u64, now: u64) -> Decision {
    let ahead = at - now;
    if d.outcome() == Outcome::Denied {
        d.retry_after_ns = d.retry_after_ns.saturating_add(ahead);
    }
    d.reset_ns = d.reset_ns.saturating_add(ahead);
    d.overflow = true;
    d
}

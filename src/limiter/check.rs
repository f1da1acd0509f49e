//! A check: the key's ring when it has one (the common case, inline), else
//! the slow path (a new key, the cap), and what a check
//! reads without counting (peek, the window for the wait queues).

use super::state::{Lookup, State};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::ring::{Geometry, Head, WindowSnapshot};
use crate::table::Place;
use std::hash::Hash;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};

impl<K: Hash + Eq + Clone, C: Clock, H: Head> State<K, C, H> {
    /// Inline: into [`Limiter::check_n`], so the handle's geometry is read at
    /// an offset from the handle, not kept as one more pointer through the
    /// check.
    #[inline]
    pub(super) fn check_n(&self, g: &Geometry, key: &K, cost: u32) -> Decision {
        let now = self.now();
        let decision = self.decide(g, key, cost, now);
        self.counters.record(decision.is_allowed());
        self.maybe_sweep(now);
        decision
    }

    pub(super) fn peek(&self, g: &Geometry, key: &K, cost: u32) -> Decision {
        let now = self.now();
        let fits = if cost > g.limit() { 0 } else { cost };
        let decision = self.with_ring(key, |ring| match ring {
            Ok(ring) => ring.peek(g, now, fits),
            Err(key) => self.peek_untracked(g, key, now, fits),
        });
        if cost > g.limit() {
            let mut exceeds =
                Decision::cost_exceeds_limit(g.limit(), decision.remaining(), decision.reset());
            exceeds.overflow = decision.overflow;
            exceeds
        } else {
            decision
        }
    }

    pub(super) fn undo(&self, key: &K, decision: &Decision) {
        // Undo reads only the shape (the slot's age), not the limit.
        let g = &self.shape;
        if decision.overflow {
            self.overflow.ring().undo(g, decision);
        } else {
            self.with_ring(key, |ring| {
                if let Ok(ring) = ring {
                    ring.undo(g, decision);
                }
            });
        }
    }

    pub(super) fn window_snapshot(&self, g: &Geometry, key: &K) -> WindowSnapshot {
        let now = self.now();
        let (slot, counts, newest) = self.with_ring(key, |ring| match ring {
            Ok(ring) => ring.window_by_age(g, now),
            Err(key) => {
                let start = now.max(self.swept_at.load(SeqCst));
                if self.keys.load(Relaxed) >= self.max_keys
                    || g.slot(start) < self.overflow_mark(key)
                {
                    self.overflow.ring().window_by_age(g, start)
                } else {
                    let len = g.buckets() as usize + 1;
                    (g.slot(start), vec![0; len], vec![0; len])
                }
            }
        });
        WindowSnapshot {
            geometry: *g,
            now,
            slot,
            counts,
            newest,
        }
    }

    pub(super) fn is_current(&self, decision: &Decision) -> bool {
        decision.slot >= self.shape.slot(self.now())
    }

    /// [`is_current`](Self::is_current), and if so the decision's bucket
    /// keeps now as its newest admission (`Ring::touch`): its units are spent
    /// now, and count in the window of now.
    pub(super) fn spend(&self, key: &K, decision: &Decision) -> bool {
        let g = &self.shape;
        let now = self.now();
        if decision.slot < g.slot(now) {
            return false;
        }
        if !decision.is_allowed() || decision.cost == 0 {
            return true;
        }
        if decision.overflow {
            self.overflow.ring().touch(g, decision.slot, now);
        } else {
            self.with_ring(key, |ring| {
                if let Ok(ring) = ring {
                    ring.touch(g, decision.slot, now);
                }
            });
        }
        true
    }

    /// The common case inline (a tracked key whose ring decides at once); every
    /// other case out of line, so the common one carries none of their weight.
    #[inline(always)]
    pub(super) fn decide(&self, g: &Geometry, key: &K, cost: u32, now: u64) -> Decision {
        if let Some(ring) = self.single() {
            if cost > g.limit() {
                return self.peek(g, key, cost);
            }
            return ring.acquire(g, now, cost);
        }
        let key = self.lookup(key);
        if let (true, Some(partition)) = (cost <= g.limit(), self.partition(&key)) {
            let table = partition.read();
            if let Some(i) = table.find(key.hash, key.key) {
                return table.ring(i).acquire(g, now, cost);
            }
        }
        self.decide_rest(g, key, cost, now)
    }

    /// [`decide`](Self::decide) in full: costs above the limit, new keys,
    /// the cap and the overflow ring.
    #[inline(never)]
    pub(super) fn decide_rest(
        &self,
        g: &Geometry,
        key: Lookup<'_, K>,
        cost: u32,
        now: u64,
    ) -> Decision {
        if cost > g.limit() {
            return self.peek(g, key.key, cost);
        }
        if !self.reserve_key(now) {
            self.overflowed.fetch_add(1, Relaxed);
            return self.decide_at_cap(g, &key, cost, now);
        }
        let (writing, i) = self.track(g, &key, now);
        writing.ring(i).acquire(g, now, cost)
    }

    /// Count `units` for `key` whatever its window holds (see
    /// [`Ring::charge`](crate::ring::Ring)): on its ring, made if it has none,
    /// or at the cap on the overflow ring, as a check would count.
    pub(super) fn charge(&self, g: &Geometry, key: &K, units: u32) -> Option<Decision> {
        let now = self.now();
        if let Some(ring) = self.single() {
            return ring.charge(g, now, units);
        }
        let key = self.lookup(key);
        if let Some(partition) = self.partition(&key) {
            let table = partition.read();
            if let Some(i) = table.find(key.hash, key.key) {
                return table.ring(i).charge(g, now, units);
            }
        }
        self.charge_untracked(g, key, now, units)
    }

    /// [`charge`](Self::charge) for a key without a ring (swept, or never
    /// admitted here): as [`decide_rest`](Self::decide_rest) counts.
    #[cold]
    fn charge_untracked(
        &self,
        g: &Geometry,
        key: Lookup<'_, K>,
        now: u64,
        units: u32,
    ) -> Option<Decision> {
        if units == 0 {
            return None;
        }
        if !self.reserve_key(now) {
            // Under the writer's lock, as `decide_at_cap` counts.
            let writing = self.partition_to_add(&key).write();
            if let Some(i) = writing.find(key.hash, key.key) {
                return writing.ring(i).charge(g, now, units);
            }
            let at = now.max(self.swept_at.load(SeqCst));
            let d = self.overflow.ring().charge(g, at, units)?;
            self.raise_overflow_mark(&key, d.slot + g.span_slots());
            return Some(super::overflow::overflow_decision(d, at, now));
        }
        let (writing, i) = self.track(g, &key, now);
        writing.ring(i).charge(g, now, units)
    }

    /// A ring for `key`, which had none at `now` (a place reserved for it),
    /// and the writer's lock of its partition.
    fn track<'s>(
        &'s self,
        g: &Geometry,
        key: &Lookup<'_, K>,
        now: u64,
    ) -> (crate::partition::Writing<'s, K, H>, usize) {
        // The map's copy of the key, made before the writer's lock: the key
        // type's `Clone` never holds up the partition's checks.
        let owned = key.key.clone();
        let mut writing = self.partition_to_add(key).write();
        let place = writing.find_or_insert(
            key.hash,
            key.key,
            || owned,
            |ring| {
                // A sweep publishes `swept_at` before it drops a key, under the
                // writer's lock, so this reads the newest relevant one: a key
                // dropped by a sweep restarts no earlier than the sweep, so a
                // check that read the clock before it never records beside the
                // units the dropped ring held.
                let start = now.max(self.swept_at.load(SeqCst));
                // While the overflow ring may hold this key's units, an empty
                // ring would let the key through twice: start from a copy of the
                // overflow ring's counts, taken after the mark was read, so it
                // holds them.
                if g.slot(start) < self.overflow_mark(key) {
                    let (s, counts, newest) = self.overflow.ring().window_by_age(g, start);
                    ring.init(g, s, &counts, &newest);
                } else {
                    ring.init(g, g.slot(start), &[], &[]);
                }
            },
        );
        let i = match place {
            Place::Added(i) => i,
            Place::Found(i) => {
                // Another check tracked it first: give the place back.
                self.keys.fetch_sub(1, Relaxed);
                i
            }
        };
        (writing, i)
    }
}

//! A change of window or bucket count: every key's counts carried into a
//! new state (see [`Limiter::reconfigured`](super::Limiter::reconfigured)).

use super::state::State;
use crate::clock::Clock;
use crate::ring::{bucket_count_max, Geometry, Head, OwnedRing, Ring};
use std::hash::Hash;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};

/// A ring's counts carried into another shape: the slot they are by age
/// from, the counts, and each bucket's newest offset.
pub(super) type Carried = (u64, Vec<u64>, Vec<u16>);

/// A count carried into a ring whose buckets cannot hold it (see `start`).
#[derive(Debug)]
pub(super) struct CountTooLarge;

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock, H: Head> State<K, C, H> {
    /// Fill this new state (of another window, bucket count or layout, not
    /// yet shared) with `old`'s counts as of the clock's `reading`: see
    /// [`Limiter::reconfigured`].
    ///
    /// `old` may be in use meanwhile: its rings are only read (a plain read,
    /// as a copy of the overflow ring is), so a unit counted or undone there
    /// during the walk may or may not be carried. The new rings are seeded
    /// before this state is published, so they need no concurrency argument.
    ///
    /// `Err` if a carried bucket's count is more than `H`'s buckets hold and
    /// less than a limit could be (see `start`): no state is made then.
    pub(super) fn carry_over<H1: Head>(
        &mut self,
        old: &State<K, C, H1>,
        reading: u64,
    ) -> Result<(), CountTooLarge> {
        let now = self.shape.hold(reading);
        let old_now = old.shape.hold(reading);
        let old_shape = &old.shape;
        // The same hashes: a key's overflow mark (picked by hash) then carries
        // over to the same group.
        self.hasher = old.hasher.clone();
        if let (Some(single), Some(old_single)) = (&mut self.single, &old.single) {
            if let Some((s, counts, newest)) =
                carried::<H1, H>(&self.shape, old_shape, old_single.ring(), old_now, now)?
            {
                *single = OwnedRing::seeded(&self.shape, s, &counts, &newest);
            }
        }
        if let Some((s, counts, newest)) =
            carried::<H1, H>(&self.shape, old_shape, old.overflow.ring(), old_now, now)?
        {
            self.overflow = OwnedRing::seeded(&self.shape, s, &counts, &newest);
            // The groups whose units the old overflow ring still holds: a key
            // of theirs created here starts as a copy of the new overflow
            // ring, which holds them no later than now.
            let until = self.shape.slot(now) + self.shape.span_slots();
            if let Some(old_marks) = old.overflow_marks.get() {
                for (new, old) in self.overflow_marks().iter().zip(old_marks.iter()) {
                    if old_shape.slot(old_now) < old.load(SeqCst) {
                        new.store(until, SeqCst);
                    }
                }
            }
        }
        // A key evicted there restarts here no earlier than there (see `swept_at`).
        let swept = self.shape.hold(old.swept_at.load(SeqCst));
        self.swept_at.store(now.max(swept), SeqCst);
        let mut tracked = 0;
        let mut too_large = None;
        for partition in old.partitions().iter() {
            partition.for_each(|key, ring| {
                let carried = carried::<H1, H>(&self.shape, old_shape, ring, old_now, now);
                let Some((s, counts, newest)) = carried.unwrap_or_else(|e| {
                    too_large = Some(e);
                    None
                }) else {
                    return;
                };
                let key = self.lookup(key);
                let mut writing = self.partition_to_add(&key).write();
                if writing.find(key.hash, key.key).is_none() {
                    let init = (&self.shape, s, &counts[..], &newest[..]);
                    writing.insert(key.hash, key.key.clone(), init);
                    tracked += 1;
                }
            });
        }
        self.keys.fetch_add(tracked, Relaxed);
        too_large.map_or(Ok(()), Err)
    }
}

/// The counts of `ring` (of shape `old`, read at `old_now`) carried into
/// shape `g` at `now`, as a slot, counts by age and their newest offsets:
/// each old bucket's units at the new slot of its newest admission, or of
/// `now` if that is later (then as admitted at the end of `now`'s slot), its
/// newest instant never moved earlier; left out if that slot has left the
/// span at `now`. `None` if nothing is left.
///
/// `Err` if a count is more than a bucket of layout `H2` holds while a limit
/// could be higher: held, it would read lower than the units it stands for
/// under that limit. (A count held at the wide layout's largest still reads
/// at or above any limit, so it denies as the units would.)
pub(super) fn carried<H1: Head, H2: Head>(
    g: &Geometry,
    old: &Geometry,
    ring: Ring<'_, H1>,
    old_now: u64,
    now: u64,
) -> Result<Option<Carried>, CountTooLarge> {
    let (old_slot, old_counts, old_newest) = ring.window_by_age(old, old_now);
    let s = g.slot(now);
    let mut counts = vec![0u64; g.span_slots() as usize];
    let mut newest = vec![0u16; g.span_slots() as usize];
    for (age, (&units, &offset)) in (0..).zip(old_counts.iter().zip(&old_newest)) {
        if units == 0 || age > old_slot {
            continue;
        }
        let latest = old.leaves(old_slot - age, offset) - old.buckets() * old.width();
        // At or before `now`, so no later than slot `s`.
        let (new_age, offset) = if latest <= now {
            let slot = g.slot(latest);
            (s - slot, g.offset_at(slot, latest))
        } else {
            (0, u16::MAX)
        };
        if let (Some(c), Some(o)) = (
            counts.get_mut(new_age as usize),
            newest.get_mut(new_age as usize),
        ) {
            *c += units;
            *o = (*o).max(offset);
        }
    }
    let most = bucket_count_max::<H2>();
    if most < u64::from(u32::MAX) && counts.iter().any(|&c| c > most) {
        return Err(CountTooLarge);
    }
    Ok(counts.iter().any(|&c| c > 0).then_some((s, counts, newest)))
}

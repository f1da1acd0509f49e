//! Dropping idle keys: a partition per bucket width from the checks
//! themselves, a partition at the cap for a new key, every partition from
//! the background sweeper task or `evict_idle`.

use super::state::{next_slot_start, State};
use crate::clock::{saturating_nanos, Clock};
use crate::partition::Writing;
use crate::ring::Head;
use crate::table::Shrink;
use crate::trim;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::{Interval, MissedTickBehavior};

/// Aborts the background sweeper task when dropped.
pub(super) struct Sweeper(AbortHandle);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock, H: Head> State<K, C, H> {
    /// Spawn the background sweeper of `self.sweep` (none for a key type with
    /// one value: it has no map to sweep), `now` being the clock's reading.
    pub(super) fn spawn_sweeper(self: &Arc<Self>, now: u64) -> Option<Arc<Sweeper>> {
        let plan = self.sweep.as_ref().filter(|_| self.single.is_none())?;
        // In the runtime's context: a runtime without timers panics here, not
        // in the task (and `reconfigured` may run outside the runtime).
        let _context = plan.runtime.enter();
        // The first round at the next multiple of `every` on the limiter's
        // clock: with a period of a bucket width, rounds fall where keys
        // turn idle, not up to a period after. A clock that reads in
        // steps (the coarse one) gets there up to a step late: the
        // rounds wait that much more. (A period past the 584 years of u64
        // nanoseconds is held there, so that no tokio instant overflows.)
        let every_ns = saturating_nanos(plan.every);
        let step = self
            .clock
            .resolution()
            .saturating_sub(Duration::from_nanos(1));
        let first = Duration::from_nanos(every_ns - now % every_ns) + step;
        let mut rounds = tokio::time::interval_at(
            tokio::time::Instant::now() + first,
            Duration::from_nanos(every_ns),
        );
        // A late round (a slow sweep, a busy runtime) keeps the alignment.
        rounds.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let task = plan.runtime.spawn(sweep_idle(Arc::downgrade(self), rounds));
        Some(Arc::new(Sweeper(task.abort_handle())))
    }
}

/// The background sweeper: each round sweeps every partition with keys,
/// yielding between them. It upgrades its `Weak` for one partition at a time,
/// so it never holds the state while it waits, and returns once the state is
/// gone.
pub(super) async fn sweep_idle<K, C, H>(state: Weak<State<K, C, H>>, mut rounds: Interval)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
    H: Head,
{
    loop {
        rounds.tick().await;
        let Some(partitions) = state.upgrade().map(|state| state.partitions().len()) else {
            return;
        };
        for p in 0..partitions {
            let Some(state) = state.upgrade() else {
                return;
            };
            // An empty partition costs nothing to skip.
            let swept = !state.partitions()[p].is_empty();
            if swept {
                state.sweep_partition(p, state.now());
            }
            drop(state);
            if swept {
                // Within a round, the memory of a large eviction goes back
                // as it is freed.
                trim::trim_off_worker_if(trim::TRIM_AFTER).await;
                tokio::task::yield_now().await;
            }
        }
        let Some(state) = state.upgrade() else {
            return;
        };
        #[cfg(feature = "metrics")]
        let _ = state.stats(); // hands the counts to the metrics recorder
        #[cfg(test)]
        state.sweeper_rounds.fetch_add(1, SeqCst);
        drop(state);
        // The round's memory goes back as it ends.
        trim::trim_off_worker_if(trim::TRIM_AFTER_ROUND).await;
    }
}

impl<K: Hash + Eq + Clone, C: Clock, H: Head> State<K, C, H> {
    pub(super) fn evict_idle(&self) -> usize {
        let now = self.now();
        let dropped = (0..self.partitions().len())
            .map(|p| self.sweep_partition(p, now))
            .sum();
        trim::trim_if(trim::TRIM_AFTER_ROUND);
        dropped
    }

    /// Reserve room for one more key. At the cap, the first new key in each
    /// bucket width sweeps one partition for idle keys and tries again; the
    /// others go straight to the overflow ring, so a flood of new keys does not
    /// buy a sweep per request (no ring turns idle until a bucket passes anyway).
    pub(super) fn reserve_key(&self, now: u64) -> bool {
        if self.try_reserve_key() {
            return true;
        }
        if self.first_in_bucket(&self.full_sweep_at, now) {
            self.sweep_step(now);
            return self.try_reserve_key();
        }
        false
    }

    /// Once per sweep period (a bucket width, or less with many partitions),
    /// the first check to notice sweeps one partition.
    #[inline]
    pub(super) fn maybe_sweep(&self, now: u64) {
        if self.first_in_bucket(&self.next_sweep_at, now) {
            self.sweep_step(now);
        }
    }

    /// True for the first caller at or after the instant `due` holds, which
    /// moves it on to the start of the next sweep period: once per period.
    /// `now >= due` without a division. Also
    /// for the first caller after the clock was set back more than a span:
    /// else no sweep would run until the clock passed `due` again, and keys
    /// idle by the clock's reading would stay (at the cap, new keys would
    /// overflow) for as long as the clock was set back.
    #[inline]
    pub(super) fn first_in_bucket(&self, due: &AtomicU64, now: u64) -> bool {
        let at = due.load(Relaxed);
        now.wrapping_sub(at) < self.due_or_set_back
            && due
                .compare_exchange(
                    at,
                    next_slot_start(now, self.sweep_period),
                    Relaxed,
                    Relaxed,
                )
                .is_ok()
    }

    /// One partition's sweep, for a check: a partition whose writer is busy
    /// (adding a key, rebuilding) is left to the next step, so that a check
    /// never waits for another key's writer to sweep.
    pub(super) fn sweep_step(&self, now: u64) {
        let partitions = self.partitions();
        if partitions.is_empty() {
            // No key yet: a sweep of nothing, judged at `now` all the same.
            self.swept_at.fetch_max(now, SeqCst);
        } else {
            let p = self.sweep_cursor.fetch_add(1, Relaxed) % partitions.len();
            if let Some(writing) = partitions[p].try_write() {
                // A check drops idle keys, but leaves the arrays as they are
                // (their free positions are taken again by new keys): freeing
                // memory is the sweeper's and `evict_idle`'s (see `trim`).
                self.sweep_with(writing, now, Shrink::Never);
            }
        }
        #[cfg(feature = "metrics")]
        let _ = self.stats(); // hands the counts to the metrics recorder
    }

    pub(super) fn sweep_partition(&self, p: usize, now: u64) -> usize {
        self.sweep_with(self.partitions()[p].write(), now, Shrink::IfFew)
    }

    /// Sweep the partition `writing` holds the lock of.
    pub(super) fn sweep_with(&self, writing: Writing<'_, K, H>, now: u64, shrink: Shrink) -> usize {
        // Before any key is dropped: a check that then finds its key gone
        // starts the new ring no earlier than this.
        self.swept_at.fetch_max(now, SeqCst);
        let dropped = writing.sweep(&self.shape, now, shrink);
        self.count_evicted(dropped);
        dropped
    }
}

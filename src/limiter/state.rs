//! A limiter's state: its keys in partitions of inline tables, the overflow
//! ring and marks, the sweeps' bookkeeping, counters and settings, behind the
//! [`Limiter`](super::Limiter) handle. The checks, sweeps, overflow ring and
//! carry-over of a change each add their part in a module of their own.

use crate::clock::Clock;
use crate::metrics::LimiterMetrics;
use crate::partition::Partition;
use crate::policy::Policy;
use crate::ring::{Geometry, Head, OwnedRing, Ring};
use crate::stats::{Counters, LimiterStats};
use crate::table::KeyHasher;
use crate::trim;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The hasher of a limiter's keys: see [`KeyHasher`].
pub(super) type Hasher = KeyHasher;

/// A key to look up, with its hash. A check hashes its key once: the hash
/// picks the partition (bits 48..56), the overflow mark (bits 32..42), the
/// key's home slot in the partition's table (the low 32 bits) and its tag
/// there (the top 7).
pub(super) struct Lookup<'k, K> {
    pub(super) hash: u64,
    pub(super) key: &'k K,
}

/// Where the partition index starts in a key's hash (see `Lookup`): above the
/// overflow mark's bits.
pub(super) const PARTITION_SHIFT: u32 = 42;

/// Keys per partition the map is sized for. Everything a check may be asked
/// to do beyond its own key is one partition's worth: a sweep step, the
/// partition's arrays grown, a wait for another key's writer. So this bounds
/// the slowest check (tens of microseconds), up to `MAX_PARTITIONS`
/// partitions (a cap of 4M keys). Beyond, a partition holds a 4096th of the
/// cap. A partition's arrays then stay small enough for the allocator to
/// serve from its heap (about 100 KiB), not from pages of their own, whose
/// freeing takes the kernel longer.
pub(crate) const KEYS_PER_PARTITION: usize = 1024;
pub(super) const MAX_PARTITIONS: usize = 4096;
/// Bucket widths in which checks alone go round every partition (at most
/// one partition a bucket width below that many partitions).
pub(super) const SWEEP_ROUND_BUCKETS: usize = 32;
/// The highest cap (2^32 keys, some 400 GB of them): positions are 32-bit.
pub(super) const MAX_KEYS: usize = 1 << 32;

/// A limiter's keys, rings and settings, behind the [`Limiter`] handle, its
/// rings in layout `H`.
pub(super) struct State<K, C, H: Head> {
    /// The window and buckets of every handle on this state (their limit and
    /// precision may differ: those are the handle's). Only the shape is read
    /// here: slots, spans, idleness. Decisions take the handle's geometry.
    pub(super) shape: Geometry,
    /// Shared, not cloned: a limiter with a new window and buckets gets a new
    /// state, on the same clock, and `Clock` is not `Clone`.
    pub(super) clock: Arc<C>,
    /// Where and how often the background sweeper runs, for the state a
    /// change of window or buckets makes.
    pub(super) sweep: Option<SweepPlan>,
    pub(super) hasher: Hasher,
    /// How many partitions the keys are cut into: a power of two.
    pub(super) partition_count: usize,
    /// The partitions, made at the first key (most of an empty limiter's
    /// memory otherwise: a tier nobody is in).
    pub(super) partitions: OnceLock<Box<[Partition<K, H>]>>,
    pub(super) overflow: OwnedRing<H>,
    /// The one ring of a key type with a single value (zero-sized: the global
    /// key `()`), kept outside the map: its check neither hashes nor looks up.
    /// Never swept, as there is no other key to make room for.
    pub(super) single: Option<OwnedRing<H>>,
    pub(super) max_keys: usize,
    pub(super) keys: AtomicUsize,
    /// Start (in clock nanoseconds) of the slot at which the next sweep step is
    /// due: kept in nanoseconds so the per-check test needs no division.
    pub(super) next_sweep_at: AtomicU64,
    /// How often checks sweep a partition (`next_sweep_at`, `full_sweep_at`):
    /// once per bucket width, or more often with many partitions, so that
    /// checks go round them all in [`SWEEP_ROUND_BUCKETS`] bucket widths
    /// while each sweeps only one.
    pub(super) sweep_period: u64,
    /// Like `next_sweep_at`, for the sweep a new key makes at the cap.
    pub(super) full_sweep_at: AtomicU64,
    /// `first_in_bucket` fires while `now - due` (mod 2^64) is below this:
    /// `now` at or past `due`, or more than a span (N + 1 buckets, plus the
    /// bucket `due` runs ahead) before it, where the clock was set back. The
    /// sweep is then due at once, not once the clock has caught up again.
    /// (`Geometry::hold` keeps `now` below `2^64 - (N + 2) widths`, so the two
    /// ranges never meet.)
    pub(super) due_or_set_back: u64,
    pub(super) sweep_cursor: AtomicUsize,
    /// The newest clock reading any sweep (or rebuild) judged idleness at. A
    /// ring created after its key was evicted starts no earlier, so a check that
    /// read the clock before the eviction (or a clock that stepped back) is never
    /// recorded in a span beside the evicted units, which the new ring cannot see.
    pub(super) swept_at: AtomicU64,
    /// Per group of keys (by hash), the first slot at which every unit the
    /// overflow ring admitted for them has left the window. A key created before
    /// then starts as a copy of the overflow ring. Made when the overflow ring
    /// first admits (most limiters never reach their cap).
    pub(super) overflow_marks: OnceLock<Box<[AtomicU64]>>,
    pub(super) evicted: AtomicU64,
    pub(super) overflowed: AtomicU64,
    pub(super) counters: Counters,
    /// The same counts, handed to the `metrics` recorder once per bucket width.
    pub(super) metrics: LimiterMetrics,
    /// Rounds the background sweeper has finished, for tests to wait on.
    #[cfg(test)]
    pub(super) sweeper_rounds: AtomicU64,
    /// Run once where a check at the cap stalls before it takes the writer's
    /// lock, for the tests of that interleaving.
    #[cfg(test)]
    pub(super) stall_at_cap: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

#[derive(Clone)]
pub(super) struct SweepPlan {
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) every: Duration,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock, H: Head> State<K, C, H> {
    /// An empty state of `shape` (a policy's geometry, for `H`) entered at `now`.
    pub(super) fn new(
        shape: Geometry,
        policy: &Policy,
        clock: Arc<C>,
        max_keys: usize,
        sweep: Option<SweepPlan>,
        now: u64,
    ) -> State<K, C, H> {
        let max_keys = max_keys.min(MAX_KEYS);
        let single = (std::mem::size_of::<K>() == 0).then(|| OwnedRing::new(&shape, now));
        let partition_count = if single.is_some() {
            1
        } else {
            (max_keys / KEYS_PER_PARTITION)
                .next_power_of_two()
                .clamp(1, MAX_PARTITIONS)
        };
        let sweep_period = shape.width() / (partition_count / SWEEP_ROUND_BUCKETS).max(1) as u64;
        let sweep_period = sweep_period.max(1);
        let next_sweep_at = next_slot_start(now, sweep_period);

        State {
            overflow: OwnedRing::new(&shape, now),
            shape,
            hasher: Hasher::default(),
            partition_count,
            partitions: OnceLock::new(),
            keys: AtomicUsize::new(single.is_some().into()),
            single,
            max_keys,
            next_sweep_at: AtomicU64::new(next_sweep_at),
            sweep_period,
            full_sweep_at: AtomicU64::new(0),
            due_or_set_back: ((shape.span_slots() + 1) * shape.width()).wrapping_neg(),
            sweep_cursor: AtomicUsize::new(0),
            swept_at: AtomicU64::new(now),
            overflow_marks: OnceLock::new(),
            evicted: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            counters: Counters::default(),
            metrics: LimiterMetrics::new(policy.name()),
            clock,
            sweep,
            #[cfg(test)]
            sweeper_rounds: AtomicU64::new(0),
            #[cfg(test)]
            stall_at_cap: std::sync::Mutex::new(None),
        }
    }
}

impl<K: Hash + Eq + Clone, C: Clock, H: Head> State<K, C, H> {
    /// The clock's reading, held where the slot arithmetic ends ([`Geometry::hold`]).
    #[inline]
    pub(super) fn now(&self) -> u64 {
        self.shape.hold(self.clock.now_nanos())
    }

    /// The single ring, for a zero-sized key type (a constant `None` for others).
    #[inline(always)]
    pub(super) fn single(&self) -> Option<Ring<'_, H>> {
        if std::mem::size_of::<K>() == 0 {
            self.single.as_ref().map(OwnedRing::ring)
        } else {
            None
        }
    }

    /// `key` with its hash, to look up.
    #[inline]
    pub(super) fn lookup<'k>(&self, key: &'k K) -> Lookup<'k, K> {
        Lookup {
            hash: self.hasher.hash_one(key),
            key,
        }
    }

    /// `key`'s partition, if the partitions are made (none holds a key before).
    #[inline]
    pub(super) fn partition(&self, key: &Lookup<'_, K>) -> Option<&Partition<K, H>> {
        let partitions = self.partitions.get()?;
        let index = (key.hash >> PARTITION_SHIFT) as usize;
        Some(&partitions[index & (partitions.len() - 1)])
    }

    /// `key`'s partition, the partitions made if they were not, to add the key.
    pub(super) fn partition_to_add(&self, key: &Lookup<'_, K>) -> &Partition<K, H> {
        let partitions = self.partitions.get_or_init(|| {
            (0..self.partition_count)
                .map(|_| Partition::new(self.shape.ring_len()))
                .collect()
        });
        let index = (key.hash >> PARTITION_SHIFT) as usize;
        &partitions[index & (partitions.len() - 1)]
    }

    /// Calls `f` with `key`'s ring, or without one, with the key to look up.
    pub(super) fn with_ring<R>(
        &self,
        key: &K,
        f: impl FnOnce(Result<Ring<'_, H>, &Lookup<'_, K>>) -> R,
    ) -> R {
        if let Some(ring) = self.single() {
            return f(Ok(ring));
        }
        let key = self.lookup(key);
        match self.partition(&key) {
            Some(partition) => partition.with_ring(key.hash, key.key, |ring| match ring {
                Some(ring) => f(Ok(ring)),
                None => f(Err(&key)),
            }),
            None => f(Err(&key)),
        }
    }

    pub(super) fn stats(&self) -> LimiterStats {
        let (admitted, rejected) = self.counters.totals();
        let stats = LimiterStats {
            admitted,
            rejected,
            keys_tracked: self.keys.load(Relaxed),
            keys_evicted: self.evicted.load(Relaxed),
            overflowed: self.overflowed.load(Relaxed),
        };
        self.metrics
            .flush(admitted, rejected, stats.overflowed, stats.keys_tracked);
        stats
    }

    /// Count `dropped` keys as evicted.
    pub(super) fn count_evicted(&self, dropped: usize) {
        if dropped > 0 {
            self.keys.fetch_sub(dropped, Relaxed);
            self.evicted.fetch_add(dropped as u64, Relaxed);
        }
    }

    pub(super) fn try_reserve_key(&self) -> bool {
        // Only below the cap, so `keys` never reads above it (an add then a
        // take-back would, and could cost a racing key the last place).
        self.keys
            .fetch_update(Relaxed, Relaxed, |n| (n < self.max_keys).then_some(n + 1))
            .is_ok()
    }
}

impl<K, C, H: Head> State<K, C, H> {
    /// The partitions made so far: all of them, or none.
    pub(super) fn partitions(&self) -> &[Partition<K, H>] {
        self.partitions.get().map_or(&[], |partitions| partitions)
    }
}

impl<K, C, H: Head> Drop for State<K, C, H> {
    /// The tables go back to the allocator; their bytes count towards the
    /// next trim (see `trim`).
    fn drop(&mut self) {
        let bytes = self.partitions().iter().map(Partition::bytes).sum();
        self.partitions = OnceLock::new();
        // Counted for the next trim (a sweeper's round, or `evict_idle`):
        // a limiter may be dropped on a request's path.
        trim::given_up(bytes);
    }
}

/// Where the slot after the one holding `now` begins (saturating at the end of time).
pub(super) fn next_slot_start(now: u64, bucket_nanos: u64) -> u64 {
    (now / bucket_nanos + 1).saturating_mul(bucket_nanos)
}

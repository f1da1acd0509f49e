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
use crate::table::{KeyHasher, Table, MAX_CAPACITY};
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

/// Where the partition index starts in a key's hash (see `Lookup`).
pub(super) const PARTITION_SHIFT: u32 = 48;

/// Entries per partition the map is sized for: one eviction step sweeps one
/// partition, so this bounds the work a single request can be asked to do, up
/// to `MAX_PARTITIONS` partitions (a cap of 1M keys). Beyond, a partition holds
/// a 256th of the cap.
pub(super) const KEYS_PER_PARTITION: usize = 4096;
pub(super) const MAX_PARTITIONS: usize = 256;
/// The highest cap (about 2^32 keys, some 400 GB of them): a partition's
/// share of it stays at half the most keys a table can hold, far beyond
/// what uneven partitions can add, so a table never has to grow past that.
pub(super) const MAX_KEYS: usize = MAX_PARTITIONS * (MAX_CAPACITY / 2);

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
    pub(super) partitions: Box<[Partition<K, H>]>,
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
        let next_sweep_at = next_slot_start(now, shape.width());
        let single = (std::mem::size_of::<K>() == 0).then(|| OwnedRing::new(&shape, now));
        let partitions = if single.is_some() {
            1
        } else {
            (max_keys / KEYS_PER_PARTITION)
                .next_power_of_two()
                .clamp(1, MAX_PARTITIONS)
        };
        // Tables of no room, shared by the partitions.
        let (empty, sealed) = (
            Arc::new(Table::new(0, shape.ring_len())),
            Arc::new(Table::new(0, shape.ring_len())),
        );
        State {
            overflow: OwnedRing::new(&shape, now),
            shape,
            hasher: Hasher::default(),
            partitions: (0..partitions)
                .map(|_| Partition::new(&empty, &sealed))
                .collect(),
            keys: AtomicUsize::new(single.is_some().into()),
            single,
            max_keys,
            next_sweep_at: AtomicU64::new(next_sweep_at),
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

    #[inline]
    pub(super) fn partition(&self, key: &Lookup<'_, K>) -> &Partition<K, H> {
        let index = (key.hash >> PARTITION_SHIFT) as usize;
        &self.partitions[index & (self.partitions.len() - 1)]
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
        self.partition(&key)
            .with_ring(key.hash, key.key, |ring| match ring {
                Some(ring) => f(Ok(ring)),
                None => f(Err(&key)),
            })
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

impl<K, C, H: Head> Drop for State<K, C, H> {
    /// The tables go back to the allocator; their bytes count towards the
    /// next trim (see `trim`).
    fn drop(&mut self) {
        let bytes = self.partitions.iter().map(Partition::bytes).sum();
        self.partitions = Box::new([]);
        // Counted for the next trim (a sweeper's round, or `evict_idle`):
        // a limiter may be dropped on a request's path.
        trim::given_up(bytes);
    }
}

/// Where the slot after the one holding `now` begins (saturating at the end of time).
pub(super) fn next_slot_start(now: u64, bucket_nanos: u64) -> u64 {
    (now / bucket_nanos + 1).saturating_mul(bucket_nanos)
}

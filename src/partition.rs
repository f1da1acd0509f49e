//! One partition of a limiter's keys: a [`Table`] that checks read without a
//! lock, and a writer's lock under which keys are added, idle keys dropped and
//! the table rebuilt.
//!
//! The table is published through an [`ArcSwap`]: a check loads it without a
//! lock and holds it (arc-swap's guard) until the check ends, so a table
//! replaced under a check stays allocated until that check lets it go. No
//! `unsafe` here: arc-swap keeps every guard's table alive.
//!
//! A rebuild makes a new table sized for the keys still live, copies the
//! live ones, then publishes the new table. So memory follows the keys: a
//! table is one allocation per array, and one that has emptied is handed
//! back whole.
//!
//! While it copies, no check may count in the old table, or its units would
//! be lost. A rebuild first publishes the partition's *sealed* table, which
//! holds no key and makes a check that loads it wait for the writer's lock
//! and load again, then waits a few microseconds for the checks that may
//! hold the old table to let it go: once the rebuild holds the only
//! reference (arc-swap turns every guard of a table swapped out into a
//! reference of its own), the old table is the writer's alone, and it reads
//! each ring with one plain load and copies the live ones. If a check still
//! holds it (descheduled mid-check), every ring is retired instead, with a
//! compare-and-swap each (see `table`'s invariant), as a check that holds a
//! retired ring looks again after the writer is done.
//!
//! A table replaced while checks still hold it is kept by the writer until
//! they have let it go, and freed by a later writer: a check never frees a
//! table (for keys that own memory, a pass over all of them).
//!
//! Sizes: a table is full when every position is filled (tombstones count);
//! a rebuild leaves room for a fifth more keys than it holds (at least 8); a
//! sweep that leaves under 3 keys in 10 of the room live rebuilds the table
//! smaller. Rebuilds keep the keys' order.

use crate::ring::{self, Geometry, Head, Ring};
use crate::table::{Table, MIN_CAPACITY};
use crate::trim;
use arc_swap::{ArcSwap, Guard};
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{fence, AtomicU64, Ordering::Acquire, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

/// A table swapped out, until it is let go, and the bytes the swap gave up.
/// They are counted for `trim` when it is let go, not at the swap: a table
/// a check still holds stays resident until then, and a trim before it
/// would miss its pages.
struct Replaced<K, H: Head> {
    table: Arc<Table<K, H>>,
    gives_up: usize,
}

impl<K, H: Head> Drop for Replaced<K, H> {
    fn drop(&mut self) {
        trim::given_up(self.gives_up);
    }
}

/// Whether `table`, swapped out of its `ArcSwap`, is held by no one but the
/// `ours` references the caller has. Once true it stays true (no check can
/// load it again), and every write checks made through it is visible here.
fn let_go<K, H: Head>(table: &Arc<Table<K, H>>, ours: usize) -> bool {
    // arc-swap pays every guard's debt when the table is swapped out, so a
    // guard that still holds it holds a strong count of its own.
    if Arc::strong_count(table) > ours {
        return false;
    }
    // The count read above was left by the last guard's release (a
    // decrement with `Release`): this orders its checks' writes before ours.
    fence(Acquire);
    true
}

/// How long a rebuild waits for the checks holding the old table: a check
/// takes well under a microsecond, so only one descheduled mid-check runs
/// past this, and the rebuild then retires every ring instead.
const SPINS: usize = 4096;

/// The rings a sweep samples to choose between retiring idle rings in place
/// and rebuilding the table.
const SAMPLE: usize = 16;

/// A rebuild under way: the partition's sealed table is published (checks
/// that load it wait for the writer), and the table it replaced is held
/// here. Dropped before [`publish`](Self::publish) (a panic in a key's
/// `Hash` or `Clone`), it puts that table back, so that checks do not wait
/// for good.
struct Sealing<'p, K, H: Head> {
    partition: &'p Partition<K, H>,
    old: Option<Arc<Table<K, H>>>,
}

impl<'p, K, H: Head> Sealing<'p, K, H> {
    /// Publish `partition`'s sealed table. For the writer's lock holder.
    fn new(partition: &'p Partition<K, H>) -> Self {
        let old = partition.table.swap(Arc::clone(&partition.sealed));
        Sealing {
            partition,
            old: Some(old),
        }
    }

    /// The table the sealed one replaced.
    fn old(&self) -> &Arc<Table<K, H>> {
        self.old.as_ref().expect("held until published")
    }

    /// Publish `new` in place of the sealed table; the table it replaced
    /// (checks may still hold it, unless they were waited for).
    fn publish(mut self, new: Arc<Table<K, H>>) -> Arc<Table<K, H>> {
        self.partition.table.store(new);
        self.old.take().expect("published once")
    }
}

impl<K, H: Head> Drop for Sealing<'_, K, H> {
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            self.partition.table.store(old);
        }
    }
}

/// See the module docs.
pub(crate) struct Partition<K, H: Head> {
    /// The current table.
    table: ArcSwap<Table<K, H>>,
    /// The writer's lock (adding keys, sweeping and replacing the table),
    /// with the tables replaced that a check may still hold.
    writer: Mutex<Vec<Replaced<K, H>>>,
    /// A table of no room, the table while the partition holds no key: a
    /// sweep that drops every key switches to it without allocating, so the
    /// memory it frees is not dotted with new small blocks (which would keep
    /// their pages resident under glibc, see `trim`).
    empty: Arc<Table<K, H>>,
    /// The table while a rebuild copies the old one: of no room, as `empty`,
    /// but a check that loads it waits for the writer's lock and loads
    /// again. Published only by the lock's holder, and replaced before the
    /// lock is let go (see `Sealing`), so a check that holds the lock never
    /// loads it.
    sealed: Arc<Table<K, H>>,
}

/// A check's view of a partition's table: the table stays allocated while
/// this lives.
pub(crate) struct TableRef<K, H: Head> {
    table: Guard<Arc<Table<K, H>>>,
}

impl<K, H: Head> std::ops::Deref for TableRef<K, H> {
    type Target = Table<K, H>;

    #[inline(always)]
    fn deref(&self) -> &Table<K, H> {
        &self.table
    }
}

/// Where a key stands in the current table, as its writer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// At position `.0`, in use.
    Live(usize),
    /// At position `.0`, its ring retired (the key was dropped as idle).
    Retired(usize),
    Absent,
}

/// The room a table holding `keys` keys gets when it is rebuilt (none for
/// none): a fifth more, at least [`MIN_CAPACITY`] (`Table::new`). A small
/// table grows often, but each growth copies few keys.
fn capacity_for(keys: usize) -> usize {
    keys + keys.div_ceil(5)
}

/// Whether a table with room for `capacity` keys, `live` of them live, is
/// rebuilt smaller by a sweep: under 3 in 10 of its room live.
fn shrinks(live: usize, capacity: usize) -> bool {
    capacity > MIN_CAPACITY && live * 10 < capacity * 3 && capacity_for(live) < capacity
}

impl<K, H: Head> Partition<K, H> {
    /// The table now, for a check: no lock. While a rebuild copies the
    /// table, once the rebuild is done.
    #[inline]
    pub(crate) fn table(&self) -> TableRef<K, H> {
        loop {
            let table = self.table_or_sealed();
            if !Arc::ptr_eq(&table.table, &self.sealed) {
                return table;
            }
            drop(table);
            self.wait_for_rebuild();
        }
    }

    /// The table now, or the sealed one while a rebuild copies the table:
    /// for a check's first look for its key, which the sealed table does not
    /// hold, so that a check that finds its key there pays nothing more, and
    /// one that does not looks again through [`table`](Self::table).
    #[inline(always)]
    pub(crate) fn table_or_sealed(&self) -> TableRef<K, H> {
        TableRef {
            table: self.table.load(),
        }
    }

    /// A rebuild has sealed the table: wait until its writer is done.
    #[cold]
    #[inline(never)]
    fn wait_for_rebuild(&self) {
        drop(self.writer.lock());
    }

    /// The bytes of the table's arrays.
    pub(crate) fn bytes(&self) -> usize {
        self.table().bytes()
    }
}

impl<K: Hash + Eq + Clone, H: Head> Partition<K, H> {
    /// A partition of no keys. `empty` and `sealed` are tables of no room,
    /// distinct, that the partitions of a limiter share (see the fields).
    pub(crate) fn new(empty: &Arc<Table<K, H>>, sealed: &Arc<Table<K, H>>) -> Partition<K, H> {
        debug_assert!(empty.capacity() == 0 && sealed.capacity() == 0);
        debug_assert!(!Arc::ptr_eq(empty, sealed));
        Partition {
            table: ArcSwap::new(Arc::clone(empty)),
            writer: Mutex::new(Vec::new()),
            empty: Arc::clone(empty),
            sealed: Arc::clone(sealed),
        }
    }

    /// Wait for the writer's lock, then hold it.
    pub(crate) fn write(&self) -> Writing<'_, K, H> {
        // A poisoned lock is as good as any: a panic leaves the table as a
        // whole, published or not, and the list of replaced tables a list.
        self.writing(self.writer.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The writer's lock if no one holds it: for the sweeps checks make,
    /// which leave a busy partition to the next one rather than wait for it.
    pub(crate) fn try_write(&self) -> Option<Writing<'_, K, H>> {
        let writer = match self.writer.try_lock() {
            Ok(writer) => writer,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.writing(writer))
    }

    /// The lock `replaced`, held, with the table it may change: the current
    /// one, as only the lock's holder replaces it. Frees the replaced
    /// tables that checks have let go since.
    fn writing<'p>(
        &'p self,
        mut replaced: MutexGuard<'p, Vec<Replaced<K, H>>>,
    ) -> Writing<'p, K, H> {
        replaced.retain(|old| !let_go(&old.table, 1));
        Writing {
            partition: self,
            table: self.table.load_full(),
            replaced,
        }
    }

    /// Calls `f` with `key`'s ring, or `None` if the key is not tracked. A
    /// ring found retired may be moving to a new table: the key is looked up
    /// again once the writer is done.
    pub(crate) fn with_ring<R>(
        &self,
        hash: u64,
        key: &K,
        f: impl FnOnce(Option<Ring<'_, H>>) -> R,
    ) -> R {
        let table = self.table();
        match table.find(hash, key).map(|i| table.ring(i)) {
            Some(ring) if !ring.is_retired() => f(Some(ring)),
            None => f(None),
            Some(_) => {
                drop(table);
                drop(self.write());
                let table = self.table();
                let ring = table.find(hash, key).map(|i| table.ring(i));
                f(ring.filter(|ring| !ring.is_retired()))
            }
        }
    }

    /// Calls `f` with each key and ring not retired (a plain walk: checks may
    /// run meanwhile).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, Ring<'_, H>)) {
        let table = self.table();
        for i in table.positions() {
            let ring = table.ring(i);
            if let (Some(key), false) = (table.key(i), ring.is_retired()) {
                f(key, ring);
            }
        }
    }

    /// Whether the table has no room (no key, not even a dropped one): a
    /// partition switches to that once a sweep drops its last key. No lock.
    pub(crate) fn is_empty(&self) -> bool {
        self.table().capacity() == 0
    }
}

/// The writer's lock, held, with the table it may change.
pub(crate) struct Writing<'p, K, H: Head> {
    partition: &'p Partition<K, H>,
    table: Arc<Table<K, H>>,
    replaced: MutexGuard<'p, Vec<Replaced<K, H>>>,
}

impl<K: Hash + Eq + Clone, H: Head> Writing<'_, K, H> {
    /// Where `key` stands in the current table.
    pub(crate) fn find(&self, hash: u64, key: &K) -> Slot {
        match self.table.find(hash, key) {
            None => Slot::Absent,
            Some(i) if self.table.ring(i).is_retired() => Slot::Retired(i),
            Some(i) => Slot::Live(i),
        }
    }

    /// The ring at position `i` (live while this writer holds the lock, if
    /// [`find`](Self::find) said so).
    pub(crate) fn ring(&self, i: usize) -> Ring<'_, H> {
        self.table.ring(i)
    }

    /// Bring back the retired ring at position `i` at slot `s` holding `counts`
    /// ([`Ring::revive`]).
    pub(crate) fn revive(&self, i: usize, g: &Geometry, s: u64, counts: &[u64]) {
        self.table.ring(i).revive(g, s, counts);
    }

    /// Track `key`, absent from the table, with a ring at slot `s` holding
    /// `counts`. A full table is rebuilt first, at `now`: the idle keys it
    /// drops are returned (after `swept_at` is raised to `now`, see the
    /// limiter).
    pub(crate) fn insert<S: BuildHasher>(
        &mut self,
        hash: u64,
        key: K,
        init: (&Geometry, u64, &[u64]),
        now: u64,
        hasher: &S,
        swept_at: &AtomicU64,
    ) -> usize {
        let (g, s, counts) = init;
        let mut dropped = 0;
        if self.table.len() == self.table.capacity() {
            swept_at.fetch_max(now, SeqCst);
            dropped = self.rebuild(g, now, hasher, 1);
        }
        self.table.insert(hash, key, |ring| ring.init(g, s, counts));
        dropped
    }

    /// Drop the keys idle at `now`: retire their rings in place, then, when
    /// few keys are left, rebuild the table smaller (its pass finds the
    /// retired rings with one load each); or, when a sample says few would
    /// be left, rebuild it at once. How many.
    pub(crate) fn sweep<S: BuildHasher>(&mut self, g: &Geometry, now: u64, hasher: &S) -> usize {
        if self.looks_mostly_idle(g, now) {
            // The rebuild the pass below would end with, without the pass.
            return self.rebuild(g, now, hasher, 0);
        }
        let (mut live, mut dropped) = (0, 0);
        for i in self.table.positions() {
            let ring = self.table.ring(i);
            if ring.retire(g, now) {
                dropped += 1;
            } else if !ring.is_retired() {
                live += 1;
            }
        }
        let capacity = self.table.capacity();
        if dropped > 0 && live == 0 && capacity > 0 {
            // Every ring is retired, and only this writer could bring one
            // back: the table can go without another pass over it.
            self.replace(Arc::clone(&self.partition.empty));
        } else if dropped > 0 && shrinks(live, capacity) {
            dropped += self.rebuild(g, now, hasher, 0);
        }
        dropped
    }

    /// Whether a sample of the table's rings (up to [`SAMPLE`], spread
    /// evenly) suggests that the sweep below would end in a rebuild: some
    /// idle, and none live or few enough for a smaller table. A rebuild
    /// straight away reads each ring once, where retiring the idle ones in
    /// place first costs a compare-and-swap each. A guess: either way is
    /// correct.
    fn looks_mostly_idle(&self, g: &Geometry, now: u64) -> bool {
        let (len, capacity) = (self.table.len(), self.table.capacity());
        if len == 0 {
            return false;
        }
        let step = len.div_ceil(SAMPLE);
        let samples = len.div_ceil(step);
        let (mut idle, mut live) = (0, 0);
        for i in (0..len).step_by(step) {
            let ring = self.table.ring(i);
            if ring.is_idle(g, now) {
                idle += 1;
            } else if !ring.is_retired() {
                live += 1;
                // Already too many to shrink for: a table in use, the
                // common sweep, stops after a few reads.
                if live * len * 10 >= samples * capacity * 3 {
                    return false;
                }
            }
        }
        // The sampled share of the filled positions, rounded up.
        let live = (live * len).div_ceil(samples);
        idle > 0 && (live == 0 || shrinks(live, capacity))
    }

    /// Replace the table with one sized for its live keys and `extra` more:
    /// seal, copy the live ones, publish (see the module docs). The keys
    /// found idle are dropped: how many.
    fn rebuild<S: BuildHasher>(
        &mut self,
        g: &Geometry,
        now: u64,
        hasher: &S,
        extra: usize,
    ) -> usize {
        let sealing = Sealing::new(self.partition);
        // Every check that loads the old table from now on waits; once those
        // that hold it have let it go, its rings no longer change. Ours: the
        // sealing's and this writer's.
        let old = Arc::clone(sealing.old());
        let alone = old.len() == 0
            || (0..SPINS).any(|_| {
                std::hint::spin_loop();
                let_go(&old, 3)
            });
        #[cfg(all(test, not(tsw_loom)))]
        tests::REBUILDS[usize::from(alone)].fetch_add(1, SeqCst);
        let mut live = Vec::new();
        let mut dropped = 0;
        let slot = g.slot(now);
        for i in old.positions() {
            let ring = old.ring(i);
            let state = if alone {
                ring.state_unreachable(g, slot)
            } else {
                ring.retire_to_move(g, now)
            };
            match state {
                ring::Retired::Already => {}
                ring::Retired::Idle => dropped += 1,
                ring::Retired::Live => live.push(i),
            }
        }
        let new = match live.len() + extra {
            0 => Arc::clone(&self.partition.empty),
            keys => {
                let mut new = Table::new(capacity_for(keys), g.ring_len());
                for &i in &live {
                    if let Some(key) = old.key(i) {
                        let from = old.ring(i);
                        let hash = hasher.hash_one(key);
                        new.insert_unshared(hash, key.clone(), |to| {
                            if alone {
                                from.copy_unreachable_to(g, &to);
                            } else {
                                from.copy_to(g, &to);
                            }
                        });
                    }
                }
                Arc::new(new)
            }
        };
        let gives_up = old.bytes().saturating_sub(new.bytes());
        drop(old);
        let replaced = Replaced {
            table: sealing.publish(Arc::clone(&new)),
            gives_up,
        };
        self.table = new;
        if !alone {
            self.keep_until_let_go(replaced);
        }
        // Else no check holds the old table and none can load it again: it
        // goes here, and counts for a trim as it goes.
        dropped
    }

    /// Keep `replaced` until the checks that may hold it have let it go,
    /// or drop it now if they have (or it is the partition's empty table,
    /// which the partition keeps anyway).
    fn keep_until_let_go(&mut self, replaced: Replaced<K, H>) {
        if !Arc::ptr_eq(&replaced.table, &self.partition.empty) && !let_go(&replaced.table, 1) {
            self.replaced.push(replaced);
        }
    }

    /// Publish `new` as the partition's table.
    fn replace(&mut self, new: Arc<Table<K, H>>) {
        // Memory given up (a table grown gives up none: the next growth
        // reuses what it frees), for the allocator to be asked to return.
        let gives_up = self.table.bytes().saturating_sub(new.bytes());
        let old = self.partition.table.swap(Arc::clone(&new));
        self.table = new;
        // Kept while a check may hold it: freed by a later writer.
        self.keep_until_let_go(Replaced {
            table: old,
            gives_up,
        });
    }
}

#[cfg(all(test, not(tsw_loom)))]
pub(crate) mod tests {
    use super::*;
    use crate::ring::Compact;
    use crate::Policy;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    /// Rebuilds in this test process that could not wait out the checks
    /// holding the old table (`[0]`), and that did (`[1]`).
    pub(crate) static REBUILDS: [std::sync::atomic::AtomicUsize; 2] =
        [const { std::sync::atomic::AtomicUsize::new(0) }; 2];

    /// A partition of its own tables of no room.
    pub(crate) fn partition<K: Hash + Eq + Clone, H: Head>(g: &Geometry) -> Partition<K, H> {
        let (empty, sealed) = (Table::new(0, g.ring_len()), Table::new(0, g.ring_len()));
        Partition::new(&Arc::new(empty), &Arc::new(sealed))
    }

    fn setup() -> (
        Partition<u64, Compact>,
        Geometry,
        foldhash::fast::RandomState,
    ) {
        let g = Geometry::new(&Policy::per(3, Duration::from_secs(1)).unwrap());
        (partition(&g), g, Default::default())
    }

    fn track(
        p: &Partition<u64, Compact>,
        g: &Geometry,
        h: &foldhash::fast::RandomState,
        k: u64,
        now: u64,
    ) {
        let hash = h.hash_one(k);
        let mut w = p.write();
        assert_eq!(w.find(hash, &k), Slot::Absent);
        w.insert(hash, k, (g, g.slot(now), &[]), now, h, &AtomicU64::new(0));
    }

    fn used(
        p: &Partition<u64, Compact>,
        g: &Geometry,
        h: &foldhash::fast::RandomState,
        k: u64,
        now: u64,
    ) -> Option<u32> {
        p.with_ring(h.hash_one(k), &k, |ring| {
            ring.map(|r| g.limit() - r.peek(g, now, 0).remaining())
        })
    }

    #[test]
    fn a_growing_table_keeps_every_key_and_its_counts() {
        let (p, g, h) = setup();
        for k in 0..5_000u64 {
            track(&p, &g, &h, k, 0);
            let hash = h.hash_one(k);
            let table = p.table();
            let ring = table.ring(table.find(hash, &k).unwrap());
            for _ in 0..k % 3 {
                assert!(ring.acquire(&g, 0, 1).is_allowed());
            }
        }
        for k in 0..5_000u64 {
            assert_eq!(used(&p, &g, &h, k, 0), Some((k % 3) as u32), "key {k}");
        }
        // Grown a fifth at a time, and in the order the keys came.
        let table = p.table();
        let capacity = table.capacity();
        assert!(
            capacity >= 5_000 && capacity * 5 / 6 <= 5_000,
            "room for {capacity}"
        );
        assert!(table.positions().all(|i| table.key(i) == Some(&(i as u64))));
    }

    #[test]
    fn a_table_replaced_under_a_running_check_is_freed_and_counted_for_a_trim_by_a_later_write_once_it_ends(
    ) {
        let (p, g, h) = setup();
        for k in 0..100u64 {
            track(&p, &g, &h, k, 0);
        }
        let old = Arc::downgrade(&p.write().table);
        let bytes = p.table().bytes();
        let counted = trim::tests::given_up_by_this_thread();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (leave, leave_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|scope| {
            let p = &p;
            scope.spawn(move || {
                let table = p.table();
                entered_tx.send(()).unwrap();
                leave_rx.recv().unwrap();
                assert_eq!(table.key(0), Some(&0), "still readable");
            });
            entered.recv().unwrap();
            // Every key idle: the partition switches to its empty table.
            let dropped = p.write().sweep(&g, 2_000 * MS, &h);
            let kept = old.upgrade().is_some();
            let counted_while_kept = trim::tests::given_up_by_this_thread() - counted;
            leave.send(()).unwrap();
            assert_eq!(dropped, 100);
            assert!(kept, "freed under a running check");
            assert_eq!(counted_while_kept, 0, "counted for a trim while kept");
        });
        // The next write frees it (other tests' checks, descheduled
        // mid-check, may hold it a little longer).
        let start = std::time::Instant::now();
        while old.upgrade().is_some() && start.elapsed() < std::time::Duration::from_secs(10) {
            p.write().sweep(&g, 2_000 * MS, &h);
            std::thread::yield_now();
        }
        assert!(old.upgrade().is_none(), "kept after the check ended");
        assert_eq!(
            trim::tests::given_up_by_this_thread() - counted,
            bytes,
            "counted once let go"
        );
    }

    /// Key 7 counts 1 unit at 2 s; the other 99 keys are idle at 2.5 s.
    fn one_live_key() -> (
        Partition<u64, Compact>,
        Geometry,
        foldhash::fast::RandomState,
    ) {
        let (p, g, h) = setup();
        for k in 0..100u64 {
            track(&p, &g, &h, k, 0);
        }
        let table = p.table();
        let ring = table.ring(table.find(h.hash_one(7u64), &7).unwrap());
        assert!(ring.acquire(&g, 2_000 * MS, 1).is_allowed());
        drop(table);
        (p, g, h)
    }

    #[test]
    fn a_rebuild_with_no_check_running_copies_the_old_table_and_frees_it_at_once() {
        let (p, g, h) = one_live_key();
        let old = Arc::downgrade(&p.write().table);
        let bytes = p.table().bytes();
        let counted = trim::tests::given_up_by_this_thread();
        // Few live: the sweep rebuilds at once. No check holds the table, so
        // the rebuild reads its rings as they are (no retirement) and frees
        // it before it returns, counted for a trim as it goes.
        assert_eq!(p.write().sweep(&g, 2_500 * MS, &h), 99);
        assert!(old.upgrade().is_none(), "the old table is kept");
        let counted = trim::tests::given_up_by_this_thread() - counted;
        assert_eq!(counted, bytes - p.table().bytes());
        assert_eq!(used(&p, &g, &h, 7, 2_500 * MS), Some(1));
        assert_eq!(p.table().len(), 1);
    }

    #[test]
    fn a_check_that_holds_the_old_table_through_a_rebuild_counts_in_the_new_one_or_not_at_all() {
        let (p, g, h) = one_live_key();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (leave, leave_rx) = std::sync::mpsc::channel::<()>();
        let counted_in_old = std::thread::scope(|scope| {
            let (p, g, h) = (&p, &g, &h);
            let check = scope.spawn(move || {
                let table = p.table();
                let ring = table.ring(table.find(h.hash_one(7u64), &7).unwrap());
                entered_tx.send(()).unwrap();
                leave_rx.recv().unwrap();
                // After the rebuild: its ring was retired (the rebuild could
                // not wait this check out), so nothing is counted here.
                ring.try_acquire(g, 2_400 * MS, 1)
                    .is_some_and(|d| d.is_allowed())
            });
            entered.recv().unwrap();
            assert_eq!(p.write().sweep(g, 2_500 * MS, h), 99);
            leave.send(()).unwrap();
            check.join().unwrap()
        });
        assert!(!counted_in_old, "counted in a table already copied");
        assert_eq!(used(&p, &g, &h, 7, 2_500 * MS), Some(1));
    }

    /// A u64 key whose `Clone` panics while `PANIC` is set.
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct Brittle(u64);

    static PANIC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    impl Clone for Brittle {
        fn clone(&self) -> Brittle {
            assert!(!PANIC.load(SeqCst), "clone of {self:?}");
            Brittle(self.0)
        }
    }

    #[test]
    fn a_rebuild_that_panics_puts_the_old_table_back() {
        let g = Geometry::new(&Policy::per(3, Duration::from_secs(1)).unwrap());
        let h = foldhash::fast::RandomState::default();
        let p: Partition<Brittle, Compact> = partition(&g);
        let swept_at = AtomicU64::new(0);
        let mut k = 0;
        // Insert until the table is full: the next insert rebuilds it.
        loop {
            let mut w = p.write();
            if k > 0 && w.table.len() == w.table.capacity() {
                break;
            }
            let key = Brittle(k);
            w.insert(h.hash_one(&key), key, (&g, 0, &[]), 0, &h, &swept_at);
            k += 1;
        }
        PANIC.store(true, SeqCst);
        let rebuild = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let key = Brittle(k);
            let mut w = p.write();
            w.insert(h.hash_one(&key), key, (&g, 0, &[]), 0, &h, &swept_at);
        }));
        PANIC.store(false, SeqCst);
        assert!(rebuild.is_err(), "the rebuild cloned no key");
        assert!(!Arc::ptr_eq(&p.table.load(), &p.sealed), "left sealed");
        // The keys are there, as before the rebuild (their rings retired if
        // the rebuild found a check of another test's running).
        let table = p.table();
        for k in 0..k {
            let key = Brittle(k);
            assert!(table.find(h.hash_one(&key), &key).is_some(), "key {k}");
        }
    }

    #[test]
    fn a_sweep_that_leaves_few_keys_hands_the_table_back_and_keeps_the_live_ones() {
        let (p, g, h) = setup();
        for k in 0..4_000u64 {
            track(&p, &g, &h, k, 0);
        }
        let big = p.table().capacity();
        // Key 7 is used again 2 s later; the rest are idle at 2.5 s.
        let hash = h.hash_one(7u64);
        {
            let table = p.table();
            let ring = table.ring(table.find(hash, &7).unwrap());
            assert!(ring.acquire(&g, 2_000 * MS, 2).is_allowed());
        }
        let old = p.table();
        assert_eq!(p.write().sweep(&g, 2_500 * MS, &h), 3_999);
        let capacity = p.table().capacity();
        assert!(capacity < big / 100, "room for {capacity}");
        assert_eq!(used(&p, &g, &h, 7, 2_500 * MS), Some(2));
        assert_eq!(used(&p, &g, &h, 8, 2_500 * MS), None);
        // The old table's rings are all retired: a check holding one fails.
        assert!(old.positions().all(|i| old.ring(i).is_retired()));
    }

    #[test]
    fn a_sweep_that_leaves_many_keys_retires_the_idle_ones_in_place_and_they_revive_there() {
        let (p, g, h) = setup();
        for k in 0..100u64 {
            track(&p, &g, &h, k, 0);
        }
        for k in 50..100u64 {
            let table = p.table();
            let ring = table.ring(table.find(h.hash_one(k), &k).unwrap());
            assert!(ring.acquire(&g, 1_500 * MS, 1).is_allowed());
        }
        let capacity = p.table().capacity();
        assert_eq!(p.write().sweep(&g, 2_000 * MS, &h), 50);
        assert_eq!(p.table().capacity(), capacity, "not rebuilt");
        assert_eq!(used(&p, &g, &h, 3, 2_000 * MS), None);
        let hash = h.hash_one(3u64);
        let w = p.write();
        let Slot::Retired(i) = w.find(hash, &3) else {
            panic!("key 3 is a tombstone")
        };
        w.revive(i, &g, g.slot(2_000 * MS), &[1]);
        assert_eq!(w.find(hash, &3), Slot::Live(i));
        drop(w);
        assert_eq!(used(&p, &g, &h, 3, 2_000 * MS), Some(1));
    }

    #[test]
    fn a_table_full_of_tombstones_is_purged_by_the_next_insert() {
        let (p, g, h) = setup();
        for k in 0..1_000u64 {
            track(&p, &g, &h, k, 0);
        }
        // All but key 0 went idle and were retired in place by sweeps
        // (which rebuild only below 3 live keys in 10: force in place).
        let table = p.table();
        for i in table.positions() {
            if table.key(i) != Some(&0) {
                assert!(table.ring(i).retire(&g, 3_000 * MS) || table.ring(i).is_retired());
            }
        }
        drop(table);
        let capacity = p.table().capacity();
        // New keys fill the free room, then a rebuild purges the tombstones.
        let mut k = 10_000u64;
        while p.table().capacity() == capacity {
            track(&p, &g, &h, k, 0);
            k += 1;
        }
        let table = p.table();
        assert!(
            table.capacity() < capacity / 2,
            "room for {}",
            table.capacity()
        );
        assert!(table.positions().all(|i| !table.ring(i).is_retired()));
    }
}

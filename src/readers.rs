//! Which checks may still be reading a table a writer has replaced, so that
//! its memory is freed only once none is.
//!
//! A check marks itself in a word its thread owns, with plain stores: no
//! locked instruction and, where the kernel offers `membarrier`, no fence on
//! the check's side. A reference-counted or hazard-slot guard (arc-swap's)
//! costs every check two locked instructions, about a quarter of a hot
//! check's time. The writer, which replaces a table rarely, pays instead: a
//! process-wide barrier, then a read of every thread's word.
//!
//! # Invariant
//!
//! - **A word a thread.** Each thread that checks owns a slot; only it writes
//!   the slot's word, and each write adds 1: the word is odd while the thread
//!   is inside a check (a [`Reading`] is alive), even otherwise. A slot freed
//!   by its thread's exit keeps its word when another thread takes it.
//! - **Reader:** store the odd word, a light barrier, then load the table
//!   pointer (`Acquire`); at the end, store the even word. Both stores are
//!   `Release` (a plain store on x86), so a writer that reads any later word
//!   of the thread also sees the end of every check before it.
//! - **Writer:** swap the pointer, then [`Retired::retire`]: a heavy barrier,
//!   then read every word (`Acquire`). A check whose odd word it does not see
//!   had not stored it at the barrier, so its pointer load comes after the
//!   barrier and sees the new table. A check whose odd word it sees may hold
//!   the old table: the table is kept until that word has changed (the
//!   check's `Release` store, which the writer's `Acquire` load of the new
//!   value follows).
//! - **Barriers.** With `membarrier` (Linux 4.14 on), the light barrier only
//!   keeps the compiler from reordering, and the heavy one makes every
//!   running thread of the process execute a full fence, which orders each
//!   check's odd store before its pointer load as seen by the writer.
//!   Without it (other systems, or a sandbox that forbids the call), both
//!   barriers are `SeqCst` fences: the store-fence-load pattern on both sides
//!   guarantees that at least one side sees the other's store.
//! - **A barrier that fails.** Once registered, `membarrier` fails only if
//!   something forbids it later (a seccomp filter installed afterwards);
//!   then no check can be known to have let a table go, and the writer
//!   keeps every table it retires from then on for the process's life,
//!   with one warning in the log, rather than free memory a check may read.
//! - **Threads without a slot** (a check run from a thread-local destructor,
//!   after the thread's slot was released) count themselves in one shared
//!   counter with locked increments; a table retired while that counter was
//!   above zero is kept until the writer reads it at zero.

use std::cell::Cell;
use std::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Acquire,
    Ordering::Relaxed, Ordering::Release, Ordering::SeqCst,
};
use std::sync::{Mutex, Once};

/// A thread's word, on a cache line of its own (each check writes it).
#[derive(Debug)]
#[repr(align(128))]
struct Slot {
    word: AtomicU64,
    taken: AtomicBool,
}

/// How many times a writer reads the words of running checks before it
/// leaves a replaced table for a later write to free (a few microseconds).
const SPINS: usize = 4096;

/// Every slot ever made: a slot outlives its thread, for the next thread.
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// Checks running in threads without a slot.
static WITHOUT_SLOT: AtomicUsize = AtomicUsize::new(0);

const UNKNOWN: u8 = 0;
const MEMBARRIER: u8 = 1;
const FENCES: u8 = 2;
static BARRIERS: AtomicU8 = AtomicU8::new(UNKNOWN);
/// Set once `membarrier` has failed after it was registered.
static LEAKING: AtomicBool = AtomicBool::new(false);
static INIT: Once = Once::new();

/// Choose the barriers: called before any table is published (by every
/// partition's constructor), so every check that can load a table reads the
/// choice made here.
pub(crate) fn init() {
    INIT.call_once(|| {
        // The tests run the fences on Linux too, in a child process of their
        // own (the choice is the process's).
        #[cfg(all(test, not(tsw_loom)))]
        let fences_only = std::env::var_os(tests::FENCES_ONLY).is_some();
        #[cfg(all(test, not(tsw_loom)))]
        tests::BARRIER_FAILS_SET.store(std::env::var_os(tests::BARRIER_FAILS).is_some(), Relaxed);
        #[cfg(not(all(test, not(tsw_loom))))]
        let fences_only = false;
        let barriers = if !fences_only && membarrier::register() {
            MEMBARRIER
        } else {
            FENCES
        };
        BARRIERS.store(barriers, Relaxed);
    });
}

#[inline(always)]
fn light_barrier() {
    if BARRIERS.load(Relaxed) == MEMBARRIER {
        compiler_fence(SeqCst);
    } else {
        fence(SeqCst);
    }
}

/// The writer's side: false if no barrier could be made (see `retire`).
fn heavy_barrier() -> bool {
    if BARRIERS.load(Relaxed) == MEMBARRIER {
        // Once registered, the call fails only if something (a seccomp
        // filter installed later) forbids it; then checks that fenced with
        // the compiler alone may hold anything retired from now on.
        #[cfg(all(test, not(tsw_loom)))]
        if tests::BARRIER_FAILS_SET.load(Relaxed) {
            return false;
        }
        return membarrier::barrier();
    }
    fence(SeqCst);
    true
}

/// The calling thread's slot, once it has one.
struct Local {
    slot: Cell<Option<&'static Slot>>,
}

impl Local {
    #[inline(always)]
    fn slot(&self) -> &'static Slot {
        match self.slot.get() {
            Some(slot) => slot,
            None => self.take_slot(),
        }
    }

    /// A thread's first check: a slot a thread that ended left, or a new one.
    #[cold]
    #[inline(never)]
    fn take_slot(&self) -> &'static Slot {
        let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match slots.iter().find(|s| !s.taken.load(Relaxed)) {
            Some(slot) => *slot,
            None => {
                let slot: &'static Slot = Box::leak(Box::new(Slot {
                    word: AtomicU64::new(0),
                    taken: AtomicBool::new(false),
                }));
                slots.push(slot);
                slot
            }
        };
        // Under the lock: no other thread takes it meanwhile.
        slot.taken.store(true, Relaxed);
        self.slot.set(Some(slot));
        slot
    }

    /// Whether this thread is inside a check.
    fn reading(&self) -> bool {
        self.slot
            .get()
            .is_some_and(|slot| slot.word.load(Relaxed) % 2 == 1)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.get() {
            // The word is even: the thread is in no check while it exits.
            let _slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
            slot.taken.store(false, Relaxed);
        }
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            slot: Cell::new(None),
        }
    };
}

/// A check in progress on this thread: tables it loads stay allocated until
/// it is dropped. Not `Send`: it marks its own thread.
#[derive(Debug)]
pub(crate) struct Reading {
    marked: Marked,
    _thread: std::marker::PhantomData<*const ()>,
}

#[derive(Debug)]
enum Marked {
    /// The outermost check of its thread: the slot, and the odd word stored.
    Outer(&'static Slot, u64),
    /// Inside another check of the same thread, which covers it.
    Nested,
    /// Counted in `WITHOUT_SLOT`.
    WithoutSlot,
}

impl Reading {
    /// Mark a check in progress; then load the pointers it reads (`Acquire`).
    #[inline]
    pub(crate) fn enter() -> Reading {
        let marked = LOCAL.try_with(|local| {
            let slot = local.slot();
            let word = slot.word.load(Relaxed);
            if word % 2 == 1 {
                // The outer check's mark and barrier cover this one.
                Marked::Nested
            } else {
                slot.word.store(word + 1, Release);
                light_barrier();
                Marked::Outer(slot, word + 1)
            }
        });
        let marked = match marked {
            Ok(marked) => marked,
            Err(_) => {
                WITHOUT_SLOT.fetch_add(1, SeqCst);
                Marked::WithoutSlot
            }
        };
        Reading {
            marked,
            _thread: std::marker::PhantomData,
        }
    }
}

impl Drop for Reading {
    #[inline]
    fn drop(&mut self) {
        match self.marked {
            Marked::Outer(slot, odd) => slot.word.store(odd + 1, Release),
            Marked::Nested => {}
            Marked::WithoutSlot => {
                WITHOUT_SLOT.fetch_sub(1, Release);
            }
        }
    }
}

/// Values (tables) no longer published, each kept until every check that
/// could have loaded it has ended.
#[derive(Debug)]
pub(crate) struct Retired<T> {
    waiting: Vec<Waiting<T>>,
}

#[derive(Debug)]
struct Waiting<T> {
    _value: T,
    /// The slots inside a check at the barrier, with the words they had.
    slots: Vec<(&'static Slot, u64)>,
    without_slot: bool,
}

impl<T> Waiting<T> {
    fn done(&self) -> bool {
        self.slots
            .iter()
            .all(|(slot, word)| slot.word.load(Acquire) != *word)
            && (!self.without_slot || WITHOUT_SLOT.load(Acquire) == 0)
    }

    /// Spin a few microseconds for the checks to end, unless this thread's
    /// own check is one of them: whether they have.
    fn wait(&self) -> bool {
        if LOCAL.try_with(Local::reading).unwrap_or(false) {
            return self.done();
        }
        for _ in 0..SPINS {
            if self.done() {
                return true;
            }
            std::hint::spin_loop();
        }
        self.done()
    }
}

/// The slots inside a check now, with their words, and whether a check
/// without a slot runs. For a writer, after its heavy barrier.
fn running_checks() -> (Vec<(&'static Slot, u64)>, bool) {
    let slots = SLOTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|slot| (*slot, slot.word.load(Acquire)))
        .filter(|(_, word)| word % 2 == 1)
        .collect();
    (slots, WITHOUT_SLOT.load(Acquire) > 0)
}

/// For a writer that has just swapped a pointer out: wait a few
/// microseconds for every check that may have loaded the old value to end.
/// True if they all have: no check holds the old value any more, and every
/// write those checks made through it is visible to this thread. False if
/// one still runs (or this thread is inside a check, or no barrier could be
/// made): the caller must then treat the old value as still shared.
pub(crate) fn wait_for_running_checks() -> bool {
    if !heavy_barrier() {
        return false;
    }
    let (slots, without_slot) = running_checks();
    Waiting {
        _value: (),
        slots,
        without_slot,
    }
    .wait()
}

impl<T> Default for Retired<T> {
    fn default() -> Self {
        Retired {
            waiting: Vec::new(),
        }
    }
}

impl<T> Retired<T> {
    /// Take `old`, just unpublished (the pointer to it swapped out): drop it
    /// now if no check can hold it, else once the checks that can have ended
    /// (at a later [`collect`](Self::collect)). Drops what earlier calls kept
    /// and no check holds any more.
    pub(crate) fn retire(&mut self, old: T) {
        if !heavy_barrier() {
            // No check can be known to have let go: keep the value for the
            // process's life rather than free what a check may read.
            std::mem::forget(old);
            if !LEAKING.swap(true, Relaxed) {
                tracing::warn!(
                    "membarrier failed after it was registered: tables a \
                     limiter replaces are no longer freed"
                );
            }
            return;
        }
        let (slots, without_slot) = running_checks();
        let waiting = Waiting {
            _value: old,
            slots,
            without_slot,
        };
        // A check takes well under a microsecond: wait that long for the
        // ones running to end, so that the memory goes back now rather than
        // at the partition's next write.
        if !waiting.wait() {
            self.waiting.push(waiting);
        }
        self.collect();
    }

    /// Drop the values no check holds any more.
    pub(crate) fn collect(&mut self) {
        self.waiting.retain(|waiting| !waiting.done());
    }

    /// How many values are kept.
    #[cfg(all(test, not(tsw_loom)))]
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(target_os = "linux")]
mod membarrier {
    // From linux/membarrier.h.
    const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    #[allow(unsafe_code)]
    fn call(cmd: libc::c_long) -> bool {
        // SAFETY: `membarrier(cmd, flags = 0, cpu_id = 0)` takes no pointer
        // and touches no memory of ours; an unknown or forbidden command
        // fails with an error code (ENOSYS, EINVAL, EPERM), which is read as
        // "not available". Exercised by the tests of this module.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_long,
                0 as libc::c_long,
            ) == 0
        }
    }

    /// Register the process for expedited barriers: true if they are available.
    pub(super) fn register() -> bool {
        call(CMD_REGISTER_PRIVATE_EXPEDITED)
    }

    /// A full memory barrier on every running thread of the process.
    pub(super) fn barrier() -> bool {
        call(CMD_PRIVATE_EXPEDITED)
    }
}

#[cfg(not(target_os = "linux"))]
mod membarrier {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn barrier() -> bool {
        false
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};

    /// Sets its flag when dropped.
    struct Freed(Arc<AtomicBool>);

    impl Drop for Freed {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }

    /// Collects until `freed` is set (true), or 10 s have passed (false):
    /// other tests' threads, mid-check when a value is retired, hold it
    /// until they are scheduled again.
    fn dropped_soon<T>(retired: &mut Retired<T>, freed: &AtomicBool) -> bool {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(10) {
            retired.collect();
            if freed.load(SeqCst) {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    fn value() -> (Freed, Arc<AtomicBool>) {
        let flag = Arc::new(AtomicBool::new(false));
        (Freed(Arc::clone(&flag)), flag)
    }

    #[test]
    fn on_linux_the_kernel_barrier_is_used() {
        init();
        let fences_only = std::env::var_os(FENCES_ONLY).is_some();
        if cfg!(target_os = "linux") && !fences_only {
            assert_eq!(BARRIERS.load(Relaxed), MEMBARRIER);
        } else {
            assert_eq!(BARRIERS.load(Relaxed), FENCES);
        }
    }

    /// Set in the environment of a child test process: fences on both sides.
    pub(super) const FENCES_ONLY: &str = "TSW_TEST_READERS_FENCES_ONLY";
    /// Set in the environment of a child test process: `membarrier` fails
    /// after it was registered.
    pub(super) const BARRIER_FAILS: &str = "TSW_TEST_READERS_BARRIER_FAILS";
    /// Whether [`BARRIER_FAILS`] is set, read once by `init`: a writer's
    /// barrier reads this, not the environment (a lock and a search, long
    /// enough to hide a missing barrier from the store-buffering test).
    pub(super) static BARRIER_FAILS_SET: AtomicBool = AtomicBool::new(false);

    /// Runs `tests` of this binary in a child process with `var` set: true if
    /// they all passed.
    fn in_child(var: &str, tests: &[&str]) -> bool {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .env(var, "1")
            .args(["--exact", "--test-threads=1"])
            .args(tests)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let passed = format!("{} passed", tests.len());
        output.status.success() && stdout.contains(&passed)
    }

    #[test]
    fn values_retired_after_membarrier_fails_are_kept_for_good() {
        if std::env::var_os(BARRIER_FAILS).is_none() {
            if cfg!(target_os = "linux") {
                assert!(in_child(
                    BARRIER_FAILS,
                    &["readers::tests::values_retired_after_membarrier_fails_are_kept_for_good"]
                ));
            }
            return;
        }
        // The child, with the kernel's barrier in use and failing.
        init();
        assert_eq!(BARRIERS.load(Relaxed), MEMBARRIER);
        let mut retired = Retired::default();
        let (v, freed) = value();
        retired.retire(v);
        retired.collect();
        assert!(!freed.load(SeqCst), "freed without a barrier");
        assert!(LEAKING.load(Relaxed));
    }

    #[test]
    fn with_fences_on_both_sides_racing_checks_hold_their_values_too() {
        if std::env::var_os(FENCES_ONLY).is_some() {
            return; // the child: its tests run on their own
        }
        assert!(in_child(
            FENCES_ONLY,
            &[
                "readers::tests::on_linux_the_kernel_barrier_is_used",
                "readers::tests::values_swapped_out_under_racing_checks_are_never_dropped_while_a_check_holds_them",
                "readers::tests::with_the_barriers_a_check_and_a_writer_never_both_miss_each_others_store",
            ]
        ));
    }

    #[test]
    fn a_value_no_check_of_this_thread_holds_is_dropped() {
        init();
        let mut retired = Retired::default();
        let (v, freed) = value();
        retired.retire(v);
        assert!(dropped_soon(&mut retired, &freed));
        assert_eq!(retired.len(), 0);
    }

    #[test]
    fn a_value_is_kept_while_a_check_in_another_thread_runs() {
        init();
        let (entered_tx, entered) = mpsc::channel();
        let (leave, leave_rx) = mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let reading = Reading::enter();
            entered_tx.send(()).unwrap();
            leave_rx.recv().unwrap();
            drop(reading);
        });
        entered.recv().unwrap();
        let mut retired = Retired::default();
        let (v, freed) = value();
        retired.retire(v);
        assert!(!freed.load(SeqCst), "dropped under a running check");
        retired.collect();
        assert!(!freed.load(SeqCst));
        leave.send(()).unwrap();
        reader.join().unwrap();
        assert!(
            dropped_soon(&mut retired, &freed),
            "kept after the check ended"
        );
    }

    #[test]
    fn a_value_is_kept_while_this_thread_checks_and_nested_checks_end_with_the_outer_one() {
        init();
        let outer = Reading::enter();
        let inner = Reading::enter();
        let mut retired = Retired::default();
        let (v, freed) = value();
        retired.retire(v);
        drop(inner);
        retired.collect();
        assert!(!freed.load(SeqCst), "the outer check still runs");
        drop(outer);
        assert!(dropped_soon(&mut retired, &freed));
    }

    #[test]
    fn a_check_that_started_after_the_retirement_does_not_hold_the_value() {
        init();
        let mut retired = Retired::default();
        let before = Reading::enter();
        let (v, freed) = value();
        retired.retire(v);
        drop(before);
        // A new check in this thread: the word moved on past the one seen.
        let after = Reading::enter();
        assert!(dropped_soon(&mut retired, &freed));
        drop(after);
    }

    /// Marks value `.1` of the flags dropped.
    struct Dropped(Arc<Vec<AtomicBool>>, usize);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0[self.1].store(true, SeqCst);
        }
    }

    #[test]
    fn values_swapped_out_under_racing_checks_are_never_dropped_while_a_check_holds_them() {
        init();
        const VALUES: usize = 20_000;
        // Values are indices into flags that live on: a check that finds its
        // value dropped reads a flag, not freed memory.
        let flags: Arc<Vec<AtomicBool>> =
            Arc::new((0..VALUES).map(|_| AtomicBool::new(false)).collect());
        let current = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (flags, current, done) = (flags.clone(), current.clone(), done.clone());
                let started = started.clone();
                std::thread::spawn(move || {
                    let mut checks = 0u64;
                    while !done.load(Relaxed) {
                        if checks == 1 {
                            started.fetch_add(1, SeqCst);
                        }
                        let reading = Reading::enter();
                        let i = current.load(Acquire);
                        for _ in 0..(checks % 64) {
                            std::hint::spin_loop();
                        }
                        assert!(!flags[i].load(SeqCst), "value {i} dropped under a check");
                        drop(reading);
                        checks += 1;
                    }
                    checks
                })
            })
            .collect();
        while started.load(SeqCst) < 2 {
            std::thread::yield_now();
        }
        let mut retired = Retired::default();
        for next in 1..VALUES {
            let old = current.swap(next, SeqCst);
            retired.retire(Dropped(flags.clone(), old));
        }
        done.store(true, Relaxed);
        for reader in readers {
            reader.join().unwrap();
        }
        retired.collect();
        let dropped = flags.iter().filter(|f| f.load(SeqCst)).count();
        assert_eq!(
            dropped,
            VALUES - 1,
            "every value but the current one dropped"
        );
    }

    /// Two threads' spin barrier for `round`: both leave it at about the same
    /// time (yielding after a while, for a machine busy with other tests).
    fn meet(arrived: &AtomicU64, round: u64) {
        arrived.fetch_add(1, SeqCst);
        let mut spins = 0u32;
        while arrived.load(Relaxed) < 2 * round {
            spins += 1;
            if spins % 1024 == 0 {
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
    }

    /// Litmus test of store buffering, the reordering the two barriers exist
    /// to forbid. Each round, a reader stores its mark then loads the pointer
    /// (as [`Reading::enter`] and the check's load do), while a writer swaps
    /// the pointer then loads the mark (as a replace and [`Retired::retire`]
    /// do). Both threads leave a spin barrier together, each round after its
    /// own short delay, so that their stores and loads overlap. Counts the
    /// rounds in which neither saw the other's store: with the barriers, a
    /// check that missed the new pointer whose mark the writer missed too,
    /// the outcome that would free a table under it.
    ///
    /// With fences on both sides (the child process), taking the reader's
    /// fence out makes this fail. With `membarrier`, taking the writer's
    /// barrier out makes it fail; the kernel's barrier takes microseconds,
    /// though, in which any store drains, so here the test shows the outcome
    /// absent without telling that barrier from a mere delay.
    fn store_buffering(rounds: u64, barriers: bool) -> u64 {
        let words: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
        let reader = {
            let words = Arc::clone(&words);
            std::thread::spawn(move || {
                let [mark, pointer, arrived] = &*words;
                let mut missed = Vec::new();
                for round in 1..=rounds {
                    meet(arrived, round);
                    for _ in 0..round % 7 {
                        std::hint::spin_loop();
                    }
                    mark.store(round, Release);
                    if barriers {
                        light_barrier();
                    }
                    if pointer.load(Acquire) < round {
                        missed.push(round);
                    }
                }
                missed
            })
        };
        let [mark, pointer, arrived] = &*words;
        let mut missed = Vec::new();
        for round in 1..=rounds {
            meet(arrived, round);
            for _ in 0..round % 5 {
                std::hint::spin_loop();
            }
            pointer.swap(round, SeqCst);
            if barriers {
                assert!(heavy_barrier());
            }
            if mark.load(Acquire) < round {
                missed.push(round);
            }
        }
        let reader_missed = reader.join().unwrap();
        // Both lists are in round order: count the rounds in both.
        let mut reader_missed = reader_missed.into_iter().peekable();
        missed
            .into_iter()
            .filter(|round| {
                while reader_missed.next_if(|r| r < round).is_some() {}
                reader_missed.peek() == Some(round)
            })
            .count() as u64
    }

    #[test]
    fn with_the_barriers_a_check_and_a_writer_never_both_miss_each_others_store() {
        init();
        const ROUNDS: u64 = 20_000;
        // Without barriers, the hardware shows the reordering (printed, not
        // asserted: it needs both threads on cores at once).
        let unfenced = store_buffering(ROUNDS, false);
        eprintln!("store buffering without barriers: {unfenced} of {ROUNDS} rounds");
        assert_eq!(
            store_buffering(ROUNDS, true),
            0,
            "the barriers let both miss"
        );
    }

    #[test]
    fn a_slot_freed_by_a_thread_that_ended_is_taken_again() {
        init();
        let count = || SLOTS.lock().unwrap().len();
        std::thread::spawn(|| drop(Reading::enter()))
            .join()
            .unwrap();
        let after_one = count();
        for _ in 0..4 {
            std::thread::spawn(|| drop(Reading::enter()))
                .join()
                .unwrap();
        }
        // Other tests' threads may take or free slots meanwhile: at most
        // their number more, never one a thread.
        assert!(count() <= after_one + 8, "{} slots", count());
    }
}

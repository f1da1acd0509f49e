//! Handing the memory of dropped tables back to the operating system.
//!
//! A limiter's keys live in a few large tables (see `table`), and a sweep
//! that leaves a table with few keys frees it whole. An allocator that
//! returns freed memory by itself (musl's, macOS's, jemalloc, mimalloc) then
//! does. glibc's malloc, the system allocator of most Linux servers, often
//! does not: a freed block it served from its heap stays resident unless it
//! is at the heap's top, and after it has freed one mapped block of a size it
//! serves later blocks of that size from the heap too (its mmap threshold
//! rises to the size of every mapped block freed). Measured
//! (`benches/memory_no_trim.rs`, which links a `malloc_trim` that does
//! nothing, against `benches/memory.rs`; figures in `benches/README.md`):
//! after a flood of 1M keys and a sweep of them all, the process kept 17 to
//! 43 MiB of the flood's 136 MiB without the trim, for good, and 4.2 to
//! 4.4 MiB with it; a fixed mmap threshold (glibc's tunable) did not make
//! up for it. So the crate keeps this one `unsafe` call, and the memory
//! guide names the application's alternative (a returning allocator).
//!
//! So the limiter counts the table memory it gives up (a table rebuilt
//! smaller, once no check holds the old one; a limiter dropped) and, in the
//! places a user opts into (the background sweeper's rounds, on tokio's
//! blocking pool, and [`Limiter::evict_idle`](crate::Limiter::evict_idle)),
//! once at least [`TRIM_AFTER_ROUND`] has been given up since the last time
//! (or [`TRIM_AFTER`] within a round), asks glibc to return its free memory:
//! `malloc_trim(0)`, which releases the free pages inside the heap as well as
//! at its top. It takes milliseconds on a heap of hundreds of MiB, with
//! glibc's arena locks held in turn, and runs only after large evictions. A
//! check never trims: it is process-wide work no request should wait for.
//! Elsewhere (another C library) this counts and does nothing else.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Bytes of tables given up since the last trim, by every limiter of the process.
static GIVEN_UP: AtomicUsize = AtomicUsize::new(0);

/// Within a round of sweeps, trim once this much has been given up.
pub(crate) const TRIM_AFTER: usize = 32 << 20;
/// At the end of a round (or when a limiter is dropped), trim once this much has.
pub(crate) const TRIM_AFTER_ROUND: usize = 1 << 20;

/// Count `bytes` of table memory given up.
pub(crate) fn given_up(bytes: usize) {
    GIVEN_UP.fetch_add(bytes, Relaxed);
    #[cfg(all(test, not(tsw_loom)))]
    tests::BY_THIS_THREAD.with(|n| n.set(n.get() + bytes));
}

/// If at least `at_least` bytes were given up since the last trim, ask the
/// allocator to return free memory to the system. True if it trimmed.
pub(crate) fn trim_if(at_least: usize) -> bool {
    if !take_if(&GIVEN_UP, at_least) {
        return false;
    }
    release_free_memory();
    true
}

/// [`trim_if`] on tokio's blocking pool, for the background sweeper: the
/// trim takes milliseconds on a large heap, which must not hold up the
/// tasks of the worker the sweeper runs on.
pub(crate) async fn trim_off_worker_if(at_least: usize) {
    if take_if(&GIVEN_UP, at_least) {
        // A trim that cannot run (a runtime shutting down) is skipped: the
        // memory stays with the allocator, as before any trim.
        let _ = tokio::task::spawn_blocking(release_free_memory).await;
    }
}

/// If `count` holds at least `at_least`, start it over at 0: true if this
/// call did. Only a call that trims starts the count over, so that a count
/// other threads add meanwhile is never lost.
fn take_if(count: &AtomicUsize, at_least: usize) -> bool {
    count
        .fetch_update(Relaxed, Relaxed, |n| (n >= at_least).then_some(0))
        .is_ok()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn release_free_memory() {
    // SAFETY: `malloc_trim` takes no pointer and touches no memory of ours;
    // glibc documents it as MT-Safe (it takes each arena's lock in turn) and
    // as only returning free memory to the system. The argument is the
    // padding to keep at the heap's top. It is a no-op for memory another
    // global allocator holds. Exercised by `tests/memory.rs`.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}

#[cfg(all(test, not(tsw_loom)))]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// What this thread counted: tests run side by side, each on its own
        /// thread, and every limiter dropped counts (and may trim).
        pub(crate) static BY_THIS_THREAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// The bytes this thread has counted as given up.
    pub(crate) fn given_up_by_this_thread() -> usize {
        BY_THIS_THREAD.with(std::cell::Cell::get)
    }

    #[test]
    fn a_trim_waits_until_enough_was_given_up_and_then_starts_over() {
        // On a count of its own: the process's is shared with every test
        // that drops a limiter, any of which may trim (and start it over)
        // between this test's steps.
        let count = AtomicUsize::new(0);
        count.fetch_add(TRIM_AFTER_ROUND - 1, Relaxed);
        assert!(!take_if(&count, TRIM_AFTER_ROUND), "not enough yet");
        assert_eq!(count.load(Relaxed), TRIM_AFTER_ROUND - 1, "nothing lost");
        count.fetch_add(1, Relaxed);
        assert!(take_if(&count, TRIM_AFTER_ROUND));
        assert!(!take_if(&count, TRIM_AFTER_ROUND), "the count started over");
        assert_eq!(count.load(Relaxed), 0);
    }
}

//! `benches/memory.rs`'s RSS measurement (`support/rss.rs`) on glibc's malloc
//! with the crate's `malloc_trim` calls turned into no-ops: what the process
//! keeps after a flood and a sweep if the library did not ask glibc to return
//! free memory. Beside `memory` (glibc, the trim on) and `memory_mimalloc`,
//! it is what decides whether the crate keeps the trim (`src/trim.rs`). With
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536` in the environment it
//! shows the application's own alternative: a fixed mmap threshold, so that
//! glibc maps every large block and unmaps it when freed.
//!
//! Run: `cargo bench --bench memory_no_trim` (Linux with glibc; elsewhere it
//! measures the system allocator, on which the crate does not trim anyway).

#[path = "support/rss.rs"]
mod rss;

use cap::Cap;
use std::alloc::System;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// The trims the crate asked for, none of them done.
static TRIMS: AtomicUsize = AtomicUsize::new(0);

/// This binary's own `malloc_trim`, which the crate's call (through the
/// `libc` crate) links to instead of glibc's: it counts and returns nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[unsafe(no_mangle)]
pub extern "C" fn malloc_trim(_pad: usize) -> std::os::raw::c_int {
    TRIMS.fetch_add(1, Relaxed);
    0
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    rss::run("no trim", || ALLOCATOR.allocated());
    println!(
        "no trim  the crate asked for {} trims, none done",
        TRIMS.load(Relaxed)
    );
}

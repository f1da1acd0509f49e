//! `benches/memory.rs`'s RSS measurement (`support/rss.rs`) on mimalloc, an
//! allocator that returns freed memory to the system by itself: a binary has
//! one global allocator, so it is a bench of its own.
//!
//! Run: `cargo bench --bench memory_mimalloc`.

#[path = "support/rss.rs"]
mod rss;

use cap::Cap;
use mimalloc::MiMalloc;

#[global_allocator]
static ALLOCATOR: Cap<MiMalloc> = Cap::new(MiMalloc, usize::MAX);

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported here.
    rss::run("mimalloc", || ALLOCATOR.allocated());
}

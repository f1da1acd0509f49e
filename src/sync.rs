//! The atomics the ring uses, swapped for loom's under `--cfg tsw_loom` so the
//! loom models in `ring.rs` explore every interleaving of the real code.

#[cfg(tsw_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(tsw_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

/// Back off while another thread finishes resetting an idle ring.
#[inline]
pub(crate) fn spin() {
    #[cfg(tsw_loom)]
    loom::thread::yield_now();
    #[cfg(not(tsw_loom))]
    std::hint::spin_loop();
}

//! The atomics the ring uses, swapped for loom's under `--cfg tsw_loom` so the
//! loom models in `ring` explore every interleaving of the real code.

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

/// Order a write to the ring before the reads that follow it as C11 does for
/// `SeqCst` accesses (a check's add before its count; an advance of `newest`
/// before the base's scan).
///
/// Every ring access is `SeqCst`, so in the C11 model they all fall in one total
/// order and two threads writing different cells cannot both miss each other's
/// write (store buffering is forbidden). loom treats `SeqCst` accesses as `AcqRel`
/// (loom's README, "Unsupported features"), which allows that outcome and reports
/// false over-admissions; a `SeqCst` fence, which loom does model, restores the
/// order in the models. In real builds it is a no-op: the accesses already give
/// this order (a locked RMW on x86, `stlxr`/`ldar` on AArch64), so they must stay
/// `SeqCst`.
#[inline(always)]
pub(crate) fn order_write_before_reads() {
    #[cfg(tsw_loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

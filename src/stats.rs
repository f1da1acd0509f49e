//! Limiter-wide counters, striped per thread so that leaving them on costs one
//! uncontended add per check instead of a shared cache line bouncing between cores.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

const STRIPES: usize = 16;

#[derive(Default)]
#[repr(align(128))]
struct Stripe {
    admitted: AtomicU64,
    rejected: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Counters {
    stripes: [Stripe; STRIPES],
}

/// This thread's stripe, assigned on first use. A const-initialised `Cell` keeps
/// the per-check cost to one thread-local read (no lazy-init state to test).
#[inline]
fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        let mut index = i.get();
        if index == usize::MAX {
            index = NEXT.fetch_add(1, Relaxed) % STRIPES;
            i.set(index);
        }
        index
    })
}

impl Counters {
    #[inline]
    pub(crate) fn record(&self, admitted: bool) {
        let stripe = &self.stripes[stripe_index()];
        let counter = if admitted {
            &stripe.admitted
        } else {
            &stripe.rejected
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn totals(&self) -> (u64, u64) {
        self.stripes.iter().fold((0, 0), |(a, r), s| {
            (a + s.admitted.load(Relaxed), r + s.rejected.load(Relaxed))
        })
    }
}

/// Limiter-wide totals since it was built. Reading them sums a few counters; the
/// request path pays one uncontended atomic add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Checks that were allowed.
    pub admitted: u64,
    /// Checks that were denied (including costs above the limit).
    pub rejected: u64,
    /// Keys with a ring right now.
    pub keys_tracked: usize,
    /// Idle keys dropped so far.
    pub keys_evicted: u64,
    /// Checks of untracked keys that went to the shared overflow ring because the
    /// limiter was at `max_keys` (or had just been, and the overflow ring still
    /// held units in the window).
    pub overflowed: u64,
}

/// One key's usage at the moment of reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyUsage {
    /// Units counted against the key in the current window (weighted in interpolated mode).
    pub used: u32,
    /// Units still available.
    pub remaining: u32,
    /// The policy's limit.
    pub limit: u32,
    /// Time until the window fully drains.
    pub reset: std::time::Duration,
}

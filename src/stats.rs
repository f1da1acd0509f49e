//! Limiter-wide counters, striped per thread so that leaving them on costs a
//! plain add to a cache line only this thread writes, with no atomic
//! read-modify-write and no line bouncing between cores.

use std::sync::atomic::{
    AtomicU32, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};

/// Stripes a thread can own; threads beyond these share one more stripe (32 in
/// all, the most `Default` builds for an array).
const OWNED_STRIPES: usize = 31;
const SHARED_STRIPE: usize = OWNED_STRIPES;
const ALL_OWNED: u32 = (1 << OWNED_STRIPES) - 1;

/// Bit `i` is set while a live thread owns stripe `i` (in every limiter).
static OWNED: AtomicU32 = AtomicU32::new(0);

#[derive(Default)]
#[repr(align(128))]
struct Stripe {
    admitted: AtomicU64,
    rejected: AtomicU64,
}

/// A limiter's admitted and rejected counts, a stripe per thread. The
/// stripes (4 KiB) are made at the first count, so that a limiter never
/// checked (a tier nobody is in) costs a word.
#[derive(Default)]
pub(crate) struct Counters {
    stripes: std::sync::OnceLock<Box<[Stripe; OWNED_STRIPES + 1]>>,
}

/// This thread's claim on a stripe, given back when the thread exits.
struct StripeClaim(usize);

impl StripeClaim {
    fn claim() -> StripeClaim {
        let mut taken = OWNED.load(Relaxed);
        while taken & ALL_OWNED != ALL_OWNED {
            let i = (!taken).trailing_zeros();
            // Acquire: see the last counts the stripe's previous owner stored.
            match OWNED.compare_exchange_weak(taken, taken | 1 << i, Acquire, Relaxed) {
                Ok(_) => return StripeClaim(i as usize),
                Err(now) => taken = now,
            }
        }
        StripeClaim(SHARED_STRIPE)
    }
}

impl Drop for StripeClaim {
    fn drop(&mut self) {
        if self.0 != SHARED_STRIPE {
            // Release: the next owner starts from this thread's last stores.
            OWNED.fetch_and(!(1 << self.0), Release);
        }
    }
}

/// This thread's stripe, claimed on first use.
#[inline]
fn stripe_index() -> usize {
    thread_local! {
        static CLAIM: StripeClaim = StripeClaim::claim();
    }
    // While thread-locals are being torn down, count in the shared stripe.
    CLAIM.try_with(|c| c.0).unwrap_or(SHARED_STRIPE)
}

impl Counters {
    #[inline]
    pub(crate) fn record(&self, admitted: bool) {
        let index = stripe_index();
        let stripe = &self.stripes.get_or_init(Box::default)[index];
        let counter = if admitted {
            &stripe.admitted
        } else {
            &stripe.rejected
        };
        if index == SHARED_STRIPE {
            counter.fetch_add(1, Relaxed);
        } else {
            // Only this thread writes an owned stripe, so load + store is exact.
            counter.store(counter.load(Relaxed) + 1, Relaxed);
        }
    }

    pub(crate) fn totals(&self) -> (u64, u64) {
        let Some(stripes) = self.stripes.get() else {
            return (0, 0);
        };
        stripes.iter().fold((0, 0), |(a, r), s| {
            (a + s.admitted.load(Relaxed), r + s.rejected.load(Relaxed))
        })
    }
}

/// Limiter-wide totals since it was built. Reading them sums a few counters; the
/// request path pays one plain add to a counter only its thread writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Checks that were allowed. A check given back afterwards with
    /// [`Limiter::undo`](crate::Limiter::undo) still counts: behind a layer of
    /// several policies, a request another policy denied counts here but was
    /// not forwarded (the denying policy counts it in `rejected`).
    pub admitted: u64,
    /// Checks that were denied (including costs above the limit).
    pub rejected: u64,
    /// Keys with a ring right now.
    pub keys_tracked: usize,
    /// Idle keys dropped so far.
    pub keys_evicted: u64,
    /// Checks of untracked keys (cost at most the limit, 0 included) that went
    /// to the shared overflow ring because the limiter was at `max_keys`, also
    /// when a racing check then gave the key its own ring and the units moved
    /// there. (Below the cap, a key the overflow ring counted gets a ring of
    /// its own that starts as a copy of the overflow ring; its checks are not
    /// counted here.)
    pub overflowed: u64,
}

/// One key's usage at the moment of reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_stay_exact_with_more_threads_than_stripes_and_threads_coming_and_going() {
        let counters = Counters::default();
        for _round in 0..2 {
            std::thread::scope(|s| {
                for t in 0..(OWNED_STRIPES + 9) {
                    let counters = &counters;
                    s.spawn(move || {
                        for i in 0..500 {
                            counters.record((i + t) % 3 != 0);
                        }
                    });
                }
            });
        }
        let (admitted, rejected) = counters.totals();
        assert_eq!(admitted + rejected, 2 * (OWNED_STRIPES as u64 + 9) * 500);
        let expected_rejected: u64 = (0..(OWNED_STRIPES + 9))
            .map(|t| (0..500).filter(|i| (i + t) % 3 == 0).count() as u64)
            .sum();
        assert_eq!(rejected, 2 * expected_rejected);
    }
}

/// Count one event on a counter that is only read for reporting: a relaxed add,
/// no ordering with anything else.
#[inline]
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

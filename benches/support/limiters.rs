//! The two limiters the limiter benches compare, built the same way for each
//! bench: ours (`Limiter`) and governor's keyed limiter, behind one `Check` trait,
//! and the timed loops that drive them from one or more threads.

// Each bench that includes this file uses only part of it.
#![allow(dead_code)]

use crate::support::{Cursor, Keys};
use governor::clock::DefaultClock;
use governor::state::keyed::DashMapStateStore;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::hash::BuildHasher;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};
use tower_sliding_window::clock::{Clock, TokioClock};
use tower_sliding_window::{Limiter, Policy};

/// Keys in the round-robin workloads.
pub const KEYS: u64 = 100_000;

/// What both limiters are asked: one check of one unit for a key.
pub trait Check: Sync {
    fn check(&self, key: &u64) -> bool;
}

impl<C: Clock> Check for Limiter<u64, C> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        Limiter::check(self, key).is_allowed()
    }
}

/// Governor's keyed limiter on any hasher: its default (std's SipHash,
/// `DefaultKeyedRateLimiter`) or ours (foldhash, [`governor_foldhash`]).
impl<S: BuildHasher + Clone + Send + Sync> Check
    for RateLimiter<u64, DashMapStateStore<u64, S>, DefaultClock>
{
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.check_key(key).is_ok()
    }
}

#[derive(Clone, Copy)]
pub enum Load {
    /// A limit far above the request rate (1e9 per second): every check is
    /// admitted and counted.
    Allowed,
    /// 1 per hour: after the first check every check is denied (the path a flood
    /// of over-limit requests takes).
    Denied,
}

fn policy(load: Load) -> Policy {
    match load {
        Load::Allowed => Policy::per(1_000_000_000, Duration::from_secs(1)),
        Load::Denied => Policy::per(1, Duration::from_secs(3600)),
    }
    .unwrap()
}

/// Ours on its default clock.
pub fn ours(load: Load) -> Limiter<u64> {
    Limiter::builder(policy(load))
        .max_keys(2 * KEYS as usize)
        .build()
        .unwrap()
}

/// Ours on `TokioClock`.
pub fn ours_tokio(load: Load) -> Limiter<u64, TokioClock> {
    ours_on(load, TokioClock::new())
}

/// Ours on the given clock.
pub fn ours_on<C: Clock>(load: Load, clock: C) -> Limiter<u64, C> {
    Limiter::builder(policy(load))
        .clock(clock)
        .max_keys(2 * KEYS as usize)
        .build()
        .unwrap()
}

fn quota(load: Load) -> Quota {
    match load {
        Load::Allowed => Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
        Load::Denied => Quota::per_hour(NonZeroU32::new(1).unwrap()),
    }
}

/// Governor as `RateLimiter::keyed` builds it: its default clock (quanta) and
/// std's default hasher (SipHash-1-3).
pub fn governor(load: Load) -> DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(quota(load))
}

/// A control: governor on the hasher ours uses (foldhash), its clock unchanged.
/// Hashing a u64 with SipHash is about half of governor's default check.
pub fn governor_foldhash(
    load: Load,
) -> RateLimiter<u64, DashMapStateStore<u64, foldhash::fast::RandomState>, DefaultClock> {
    RateLimiter::dashmap_with_clock_and_hasher(
        quota(load),
        DefaultClock::default(),
        Default::default(),
    )
}

/// Track every key the workload uses before measuring, in key order, also
/// for a workload that then checks them in a random order: a map that lays
/// keys out in the order they came (ours does) is then read in an order
/// unrelated to its layout, as when many clients' requests arrive.
pub fn warm<L: Check>(l: &L, keys: Keys, threads: u64) {
    let keys = match keys {
        Keys::OwnRangeShuffled(n) => Keys::OwnRange(n),
        keys => keys,
    };
    for t in 0..threads {
        let mut cursor = Cursor::new(keys, t);
        for _ in 0..cursor.len {
            l.check(&cursor.next_key());
        }
    }
}

/// `iters` checks on this thread.
#[inline]
pub fn run_one<L: Check>(l: &L, keys: Keys, iters: u64) -> Duration {
    let mut cursor = Cursor::new(keys, 0);
    let start = Instant::now();
    for _ in 0..iters {
        black_box(l.check(black_box(&cursor.next_key())));
    }
    start.elapsed()
}

/// `threads` threads each run `iters` checks on their own keys, started together.
pub fn run_parallel<L: Check>(l: &L, threads: u64, keys: Keys, iters: u64) -> Duration {
    crate::support::run_threads(threads, keys, iters, |key| l.check(key))
}

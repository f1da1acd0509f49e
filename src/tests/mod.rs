//! White-box tests of the crate's internals: the limiter and the wait queues
//! against exact models, under contention, and on a clock that steps back.
//! They read what the public API does not show (the bucket slot a decision
//! was counted in), so they live inside the crate.

mod clock_set_back;
mod edge_replay;
mod layer_hooks;
mod limiter_model;
mod reconfigure_model;
#[cfg(feature = "redis")]
mod redis_lease_changes;
#[cfg(feature = "redis")]
mod redis_leases;
#[cfg(feature = "redis")]
mod redis_reconfigured;
#[cfg(feature = "redis")]
mod redis_script;
#[cfg(feature = "redis")]
#[path = "../../tests/redis_support/mod.rs"]
mod redis_support;
mod stress;
mod wait;
mod wait_model_prop;
mod wait_prop;

/// A small deterministic generator (xorshift64*), so that a test's trace and
/// figures repeat. Seeds must not be 0.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An exponential gap with the given mean (Poisson arrivals).
    pub(crate) fn exp(&mut self, mean: f64) -> u64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-(1.0 - u).ln() * mean) as u64
    }
}

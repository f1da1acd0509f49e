//! White-box tests of the crate's internals: the limiter and the wait queues
//! against exact models, under contention, and on a clock that steps back.
//! They read what the public API does not show (the bucket slot a decision
//! was counted in), so they live inside the crate.

mod clock_set_back;
mod layer_hooks;
mod limiter_model;
mod reconfigure_model;
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

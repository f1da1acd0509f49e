//! A guide to the crate beyond the first example: one chapter per question a
//! team meets when it adopts the layer. The chapters hold no API of their own;
//! their examples are compiled and run as tests.
//!
//! - [`migrating`]: coming from `tower_governor` (its builder, extractors and
//!   GCRA settings mapped to "L per W", and what clients see change) or from
//!   tower's `RateLimit`.
//! - [`naming`]: naming and storing the layer and service types (in a struct,
//!   in axum state, behind a function), with closures, costs and stores.
//! - [`ordering`]: where the layer goes among other middleware: `Buffer`,
//!   `ConcurrencyLimit`, load shedding, axum's `route_layer`, error mode.
//! - [`custom_store`]: implementing a [`Store`](crate::Store) of your own.
//! - [`features`]: the cargo features, and what the `axum` feature reads.
//! - [`observability`]: the metrics (feature `metrics`), stats and logs.
//! - [`algorithm`]: the ring of sub-window counters, and why strict mode never
//!   admits more than the limit in any window, even under races.
//! - [`waiting`]: how the layer holds a request back instead of rejecting it.
//! - [`settling`]: counting what the response says: failed logins only,
//!   or a token budget settled from the response (reserve at admission,
//!   settle after the response), and what a window can hold then.
//! - [`tiers`]: limits per client tier, read from configuration and changed
//!   at run time, and what a change guarantees.
//! - [`fleet`]: a fleet on one Redis (feature `redis`): what happens when
//!   Redis fails, leases of busy keys' units, and why the fleet still never
//!   admits more than the limit in any window.
//! - [`memory`]: what a limiter holds, when idle keys go (`sweep_idle`), and
//!   what the process gets back from its allocator.

pub mod algorithm {
    #![doc = include_str!("algorithm.md")]
}

pub mod custom_store {
    #![doc = include_str!("custom_store.md")]
}

pub mod fleet {
    #![doc = include_str!("fleet.md")]
}

pub mod features {
    #![doc = include_str!("features.md")]
}

pub mod memory {
    #![doc = include_str!("memory.md")]
}

pub mod migrating {
    #![doc = include_str!("migrating.md")]
}

pub mod naming {
    #![doc = include_str!("naming.md")]
}

pub mod observability {
    #![doc = include_str!("observability.md")]
}

pub mod ordering {
    #![doc = include_str!("ordering.md")]
}

pub mod waiting {
    #![doc = include_str!("waiting.md")]
}

pub mod settling {
    #![doc = include_str!("settling.md")]
}

pub mod tiers {
    #![doc = include_str!("tiers.md")]
}

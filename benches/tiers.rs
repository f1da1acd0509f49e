//! Tables of many tiers: the time to validate a table, to build a layer of
//! in-memory tiers from it and to change one tier, at 10 000 and 100 000
//! tiers of one policy each, alternated over a few rounds in one run
//! (medians), and the heap each tier holds: in the table (`Tiers`) and in
//! the layer (its limiters and their table), counted by a global allocator
//! wrapper (bytes requested from the allocator, not RSS).
//!
//! The ratio of the two sizes' times says how the work grows: about 10 when
//! it is linear in the number of tiers, about 100 when quadratic.
//!
//! Run: `cargo bench --bench tiers` (a few seconds, and about 110 MiB of
//! memory while the table and the layer of 100 000 tiers stand).

use cap::Cap;
use http::Request;
use std::alloc::System;
use std::time::{Duration, Instant};
use tower_sliding_window::extract::TieredKeyFn;
use tower_sliding_window::{tiered_key_fn, Policy, SlidingWindowLayer, TierLimits, Tiers};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

const SIZES: [usize; 2] = [10_000, 100_000];
const ROUNDS: usize = 3;

type ByTier = TieredKeyFn<fn(&Request<()>) -> Option<(&'static str, u8)>, u8>;

fn heap() -> usize {
    ALLOCATOR.allocated()
}

fn name(i: usize) -> String {
    format!("customer-{i:06}")
}

#[derive(Default)]
struct Figures {
    validate: Vec<Duration>,
    layer: Vec<Duration>,
    change: Vec<Duration>,
    table_bytes: usize,
    layer_bytes: usize,
}

fn median(times: &[Duration]) -> Duration {
    let mut times = times.to_vec();
    times.sort();
    times[times.len() / 2]
}

fn measure(tiers: usize, figures: &mut Figures) {
    let policy: Policy = "100/min".parse().unwrap();
    let before = heap();
    let builder = (0..tiers).fold(Tiers::builder(), |b, i| {
        b.limited(name(i), [policy.clone()])
    });
    let start = Instant::now();
    let table = builder.build().unwrap();
    figures.validate.push(start.elapsed());
    figures.table_bytes = heap() - before;

    let extractor: ByTier = tiered_key_fn(|_: &Request<()>| Some(("customer-000000", 0u8)));
    let before = heap();
    let start = Instant::now();
    let layer = SlidingWindowLayer::builder(extractor)
        .tiers(table)
        .build()
        .unwrap();
    figures.layer.push(start.elapsed());
    figures.layer_bytes = heap() - before;

    let start = Instant::now();
    layer
        .set_tier(
            &name(tiers / 2),
            TierLimits::Limited(vec!["200/min".parse().unwrap()]),
        )
        .unwrap();
    figures.change.push(start.elapsed());
}

fn main() {
    let mut figures: Vec<Figures> = SIZES.iter().map(|_| Figures::default()).collect();
    for _ in 0..ROUNDS {
        for (&n, f) in SIZES.iter().zip(&mut figures) {
            measure(n, f);
        }
    }
    println!(
        "{:>8} {:>12} {:>12} {:>12} {:>14} {:>14}",
        "tiers", "validate", "build layer", "change one", "table B/tier", "layer B/tier"
    );
    for (n, f) in SIZES.iter().zip(&figures) {
        println!(
            "{n:>8} {:>12.2?} {:>12.2?} {:>12.2?} {:>14.0} {:>14.0}",
            median(&f.validate),
            median(&f.layer),
            median(&f.change),
            f.table_bytes as f64 / *n as f64,
            f.layer_bytes as f64 / *n as f64,
        );
    }
    let ratio = |pick: fn(&Figures) -> &[Duration]| {
        median(pick(&figures[1])).as_secs_f64() / median(pick(&figures[0])).as_secs_f64()
    };
    println!(
        "100 000 / 10 000 tiers: validate {:.1}x, build layer {:.1}x, change one {:.1}x \
         (linear: 10x, quadratic: 100x)",
        ratio(|f| &f.validate),
        ratio(|f| &f.layer),
        ratio(|f| &f.change),
    );
}

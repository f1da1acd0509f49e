use std::hint::black_box;
use std::time::{Duration, Instant};
use tower_sliding_window::{Limiter, ManualClock, Policy};

fn run(l: &Limiter<u64, ManualClock>, keys: &[u64], iters: u64) -> f64 {
    let t = std::thread::scope(|s| {
        let hs: Vec<_> = keys
            .iter()
            .map(|&k| {
                s.spawn(move || {
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(l.check(black_box(&k)).is_allowed());
                    }
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
    });
    t.as_nanos() as f64 / iters as f64
}

fn main() {
    let clock = ManualClock::new();
    let l: Limiter<u64, ManualClock> =
        Limiter::builder(Policy::per(1_000_000_000, Duration::from_secs(1)).unwrap())
            .clock(clock.clone())
            .max_keys(1000)
            .build()
            .unwrap();
    l.check(&1);
    l.check(&2);
    let width = Duration::from_nanos(62_500_000);
    clock.advance(Duration::from_nanos(1));
    for p in 0..32 {
        let one = run(&l, &[1], 2_000_000);
        let two = run(&l, &[1, 2], 2_000_000);
        println!(
            "slot {p:2}: one {one:5.1} ns, two {two:5.1} ns, scaling {:.2}x",
            2.0 * one / two
        );
        clock.advance(width);
    }
}

//! What a limiter costs before it tracks a key: a tier nobody is in, a policy
//! not yet used. Measured with a counting allocator, so this file holds one
//! test, run in a process of its own.

use cap::Cap;
use std::alloc::System;
use std::time::Duration;
use tower_sliding_window::{Limiter, Policy};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// Heap bytes each of 100 limiters that `make` builds holds.
fn bytes_each(make: impl Fn() -> Limiter<String>) -> usize {
    let before = ALLOCATOR.allocated();
    let limiters: Vec<_> = (0..100).map(|_| make()).collect();
    let each = (ALLOCATOR.allocated() - before) / limiters.len();
    drop(limiters);
    each
}

#[test]
fn an_empty_limiter_takes_a_few_kib_and_one_in_use_tens() {
    let policy = Policy::per(100, Duration::from_secs(60)).unwrap();
    let default_cap = bytes_each(|| Limiter::new(policy.clone()).unwrap());
    assert!(
        default_cap <= 4 << 10,
        "{default_cap} bytes at the default cap"
    );
    let million = bytes_each(|| {
        Limiter::builder(policy.clone())
            .max_keys(1 << 20)
            .build()
            .unwrap()
    });
    assert!(million <= 32 << 10, "{million} bytes at a cap of 1M keys");
    // Checked once: the counters, the partitions (256 at the default cap)
    // and the first key's table.
    let used = bytes_each(|| {
        let limiter = Limiter::new(policy.clone()).unwrap();
        assert!(limiter.check(&"k".to_owned()).is_allowed());
        limiter
    });
    assert!(used <= 24 << 10, "{used} bytes with one key");
    println!(
        "empty limiter: {default_cap} B (default cap), {million} B (1M keys); one key: {used} B"
    );
}

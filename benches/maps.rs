//! Map candidates for the key → ring table, on the limiter's access pattern: look
//! up an existing key and do one atomic add inside its value, a ring-sized
//! array of `AtomicU64` (`newest`, `base` and 16 buckets, the default policy's
//! `Ring`). Same hasher (foldhash) for all.
//!
//! - `dashmap`: one `DashMap`, default shard count.
//! - `dashmap_partitioned`: a partition picked by a first hash, then a 4-shard
//!   `DashMap` (second hash), so eviction can sweep one partition (what
//!   `Limiter` did on dashmap).
//! - `papaya`: `papaya::HashMap`, lock-free reads under an epoch guard. The one
//!   `Limiter` uses.
//! - `scc_hash_index`: `scc::HashIndex`, lock-free reads under an epoch guard
//!   too. It needs a `Clone` value, so the ring sits behind an `Arc`: one more
//!   allocation per key and one more pointer hop per check than the others,
//!   which keep it inline in their entry, as `Limiter` keeps its rings in papaya.
//!   Faster than papaya here, but not inside the limiter: with `Limiter` on it,
//!   a hot check took 27 ns against 21 ns on papaya (297 instructions against
//!   263; its epoch guard alone is 17), and two threads on keys created one
//!   after another ran at 1.04× one thread (benches/README.md).
//!
//! Run: `cargo bench --bench maps`.

mod support;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use dashmap::DashMap;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::{Cursor, Keys};

type Hasher = foldhash::fast::RandomState;
/// A ring's shape: `newest`, `base` and 16 buckets.
type Value = [AtomicU64; 18];

const KEYS: u64 = 100_000;
const THREADS: u64 = 2;

fn value() -> Value {
    Default::default()
}

/// Look up `key` and add one to a cell of its value; false if absent.
trait Map: Sync {
    fn insert(&self, key: u64);
    fn touch(&self, key: &u64) -> bool;
}

impl Map for DashMap<u64, Value, Hasher> {
    fn insert(&self, key: u64) {
        DashMap::insert(self, key, value());
    }

    #[inline]
    fn touch(&self, key: &u64) -> bool {
        match self.get(key) {
            Some(v) => {
                v[1].fetch_add(1, SeqCst);
                true
            }
            None => false,
        }
    }
}

struct Partitioned {
    hasher: Hasher,
    parts: Box<[DashMap<u64, Value, Hasher>]>,
}

impl Partitioned {
    fn new(parts: usize) -> Partitioned {
        Partitioned {
            hasher: Hasher::default(),
            parts: (0..parts)
                .map(|_| DashMap::with_hasher_and_shard_amount(Hasher::default(), 4))
                .collect(),
        }
    }

    #[inline]
    fn part(&self, key: &u64) -> &DashMap<u64, Value, Hasher> {
        let h = self.hasher.hash_one(key) as usize;
        &self.parts[h & (self.parts.len() - 1)]
    }
}

impl Map for Partitioned {
    fn insert(&self, key: u64) {
        self.part(&key).insert(key, value());
    }

    #[inline]
    fn touch(&self, key: &u64) -> bool {
        self.part(key).touch(key)
    }
}

impl Map for papaya::HashMap<u64, Value, Hasher> {
    fn insert(&self, key: u64) {
        self.pin().insert(key, value());
    }

    #[inline]
    fn touch(&self, key: &u64) -> bool {
        match self.pin().get(key) {
            Some(v) => {
                v[1].fetch_add(1, SeqCst);
                true
            }
            None => false,
        }
    }
}

impl Map for scc::HashIndex<u64, Arc<Value>, Hasher> {
    fn insert(&self, key: u64) {
        let _ = self.insert_sync(key, Arc::new(value()));
    }

    #[inline]
    fn touch(&self, key: &u64) -> bool {
        self.peek_with(key, |_, v| {
            v[1].fetch_add(1, SeqCst);
        })
        .is_some()
    }
}

fn run<M: Map>(m: &M, threads: u64, keys: Keys, iters: u64) -> Duration {
    support::run_threads(threads, keys, iters, |key| m.touch(key))
}

fn bench<M: Map>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    m: M,
    threads: u64,
    keys: Keys,
) {
    for k in 0..KEYS + THREADS + 1 {
        m.insert(k);
    }
    group.bench_function(id, |b| {
        if threads == 1 {
            let mut cursor = Cursor::new(keys, 0);
            b.iter(|| black_box(m.touch(black_box(&cursor.next_key()))))
        } else {
            b.iter_custom(|iters| run(&m, threads, keys, iters))
        }
    });
}

fn workload(c: &mut Criterion, name: &str, threads: u64, keys: Keys) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(threads));
    bench(
        &mut group,
        "dashmap",
        DashMap::with_hasher(Hasher::default()),
        threads,
        keys,
    );
    // The partition count `Limiter` picks for 200k max keys.
    bench(
        &mut group,
        "dashmap_partitioned",
        Partitioned::new(64),
        threads,
        keys,
    );
    bench(
        &mut group,
        "papaya",
        papaya::HashMap::with_hasher(Hasher::default()),
        threads,
        keys,
    );
    bench(
        &mut group,
        "scc_hash_index",
        scc::HashIndex::with_hasher(Hasher::default()),
        threads,
        keys,
    );
    group.finish();
}

fn maps(c: &mut Criterion) {
    workload(c, "map_1t_hot_key", 1, Keys::One);
    workload(c, "map_1t_100k_keys", 1, Keys::OwnRange(KEYS));
    workload(c, "map_2t_one_key", THREADS, Keys::One);
    workload(c, "map_2t_own_key", THREADS, Keys::OwnKey);
    workload(
        c,
        "map_2t_own_50k_keys",
        THREADS,
        Keys::OwnRange(KEYS / THREADS),
    );
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .nresamples(10_000)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = maps
}
criterion_main!(benches);

//! Map candidates for the key → ring table, on the limiter's access pattern: look
//! up an existing key and do one atomic add inside its value (a ring-sized boxed
//! slice of `AtomicU64`, as `Ring` is). Same hasher (foldhash) for all.
//!
//! - `dashmap`: one `DashMap`, default shard count.
//! - `dashmap_partitioned`: what `Limiter` does: a partition picked by a first hash,
//!   then a 4-shard `DashMap` (second hash), so eviction can sweep one partition.
//! - `papaya`: `papaya::HashMap`, lock-free reads under an epoch guard.
//!
//! Run: `cargo bench --bench maps`.

mod support;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use dashmap::DashMap;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;
use support::{Cursor, Keys};

type Hasher = foldhash::fast::RandomState;
/// A ring's shape: `newest` plus 16 buckets.
type Value = Box<[AtomicU64]>;

const KEYS: u64 = 100_000;
const THREADS: u64 = 2;

fn value() -> Value {
    (0..17).map(|_| AtomicU64::new(0)).collect()
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

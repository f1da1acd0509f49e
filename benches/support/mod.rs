//! Key workloads shared by the map and limiter benches: which keys each thread
//! touches, and the loop that runs checks on several threads at once.

/// Which keys each thread checks.
#[derive(Clone, Copy)]
pub enum Keys {
    /// Every thread the same key.
    One,
    /// Thread `t` its own key.
    OwnKey,
    /// Thread `t` round-robin over its own `n` keys, in the order they were
    /// first checked (so in the order a map may have laid them out).
    OwnRange(u64),
    /// Thread `t` round-robin over its own `n` keys in a fixed random order,
    /// as requests from many clients arrive: each check's key is unrelated
    /// to the last one's, wherever a map keeps them.
    OwnRangeShuffled(u64),
}

/// Thread `t`'s keys, in order (no division on the hot path).
pub struct Cursor {
    base: u64,
    pub len: u64,
    i: u64,
    /// The offsets from `base` in the order to check them (empty: in order).
    order: Vec<u64>,
}

impl Cursor {
    pub fn new(keys: Keys, t: u64) -> Cursor {
        let (base, len) = match keys {
            Keys::One => (0, 1),
            Keys::OwnKey => (t + 1, 1),
            Keys::OwnRange(n) | Keys::OwnRangeShuffled(n) => (t * n, n),
        };
        let order = match keys {
            Keys::OwnRangeShuffled(n) => shuffled(n, t),
            _ => Vec::new(),
        };
        Cursor {
            base,
            len,
            i: 0,
            order,
        }
    }

    #[inline]
    pub fn next_key(&mut self) -> u64 {
        let offset = self.order.get(self.i as usize).copied().unwrap_or(self.i);
        let key = self.base + offset;
        self.i += 1;
        if self.i == self.len {
            self.i = 0;
        }
        key
    }
}

/// `0..n` in a random order fixed by `seed` (Fisher-Yates on xorshift64).
pub fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..n).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15 ^ seed;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// `threads` threads each call `check` on their own keys `iters` times, started
/// together; the time is the slowest thread's, so throughput = threads × iters /
/// time.
pub fn run_threads(
    threads: u64,
    keys: Keys,
    iters: u64,
    check: impl Fn(&u64) -> bool + Sync,
) -> std::time::Duration {
    let barrier = std::sync::Barrier::new(threads as usize);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, check) = (&barrier, &check);
                s.spawn(move || {
                    let mut cursor = Cursor::new(keys, t);
                    barrier.wait();
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        std::hint::black_box(check(std::hint::black_box(&cursor.next_key())));
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

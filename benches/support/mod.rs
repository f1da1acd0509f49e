//! Key workloads shared by the map and limiter benches: which keys each thread
//! touches, and the loop that runs checks on several threads at once.

/// Which keys each thread checks.
#[derive(Clone, Copy)]
pub enum Keys {
    /// Every thread the same key.
    One,
    /// Thread `t` its own key.
    OwnKey,
    /// Thread `t` round-robin over its own `n` keys.
    OwnRange(u64),
}

/// Thread `t`'s keys, in order (no division on the hot path).
pub struct Cursor {
    base: u64,
    pub len: u64,
    i: u64,
}

impl Cursor {
    pub fn new(keys: Keys, t: u64) -> Cursor {
        let (base, len) = match keys {
            Keys::One => (0, 1),
            Keys::OwnKey => (t + 1, 1),
            Keys::OwnRange(n) => (t * n, n),
        };
        Cursor { base, len, i: 0 }
    }

    #[inline]
    pub fn next_key(&mut self) -> u64 {
        let key = self.base + self.i;
        self.i += 1;
        if self.i == self.len {
            self.i = 0;
        }
        key
    }
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

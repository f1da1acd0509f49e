//! Key workloads shared by the map and limiter benches: which keys each thread
//! touches. Each bench keeps its own timed loop, calling its own trait directly.

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

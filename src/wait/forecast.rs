//! The admission forecast: the ring's strict rule replayed into the future, so a
//! newcomer learns on arrival when its turn will come.
//!
//! Starting from each policy's bucket counts, the forecast admits every queued
//! cost in order, each as early as all policies allow and no earlier than the
//! one before it (FIFO). In strict mode a bucket's units leave a policy's
//! window when its newest admission does (`Geometry::leaves`), exactly as in
//! the ring, so with the queue as the key's only user the forecast instant is
//! the admission instant.

use crate::decision::{Decision, Outcome};
use crate::policy::Precision;
use crate::ring::{Geometry, WindowSnapshot};
use crate::rule;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// A wait ends on a tokio timer, which fires at whole milliseconds: an
/// admission that must wait is forecast at the next one, when it will happen.
const TIMER_TICK: u64 = 1_000_000;

/// `t` (ns after the forecast's base), rounded up to the timer's tick when it
/// lies after `from`, the earliest instant asked about: a request that fits at
/// once passes at once.
fn on_timer(t: u64, from: u64) -> u64 {
    if t > from {
        t.div_ceil(TIMER_TICK).saturating_mul(TIMER_TICK).max(t)
    } else {
        t
    }
}

/// One policy's forecast window, in its own clock's nanoseconds.
struct Window {
    g: Geometry,
    /// The policy clock's reading at the forecast's base instant.
    base: u64,
    /// Slot and clock time of the latest forecast admission.
    slot: u64,
    at: u64,
    /// Non-empty buckets still in the window at `slot`, oldest first: (slot,
    /// units, newest offset).
    buckets: VecDeque<(u64, u64, u16)>,
    used: u64,
}

impl Window {
    fn new(s: WindowSnapshot) -> Window {
        let buckets: VecDeque<(u64, u64, u16)> = s
            .counts
            .iter()
            .zip(&s.newest)
            .enumerate()
            .rev()
            .filter(|&(_, (&c, _))| c > 0)
            .map(|(age, (&c, &o))| (s.slot - (age as u64).min(s.slot), c, o))
            .collect();
        Window {
            g: s.geometry,
            base: s.now,
            slot: s.slot,
            at: s.now,
            used: buckets.iter().map(|b| b.1).sum(),
            buckets,
        }
    }

    /// Where a search for the next admission starts: `now`, or the latest
    /// admission when that is in `now`'s slot or later.
    fn start(&self, now: u64) -> (u64, u64) {
        let now_slot = self.g.slot(now);
        if now_slot > self.slot {
            (now_slot, now)
        } else {
            (self.slot, self.at.max(now))
        }
    }

    /// Whether the bucket of slot `x`, its newest at `newest`, still counts
    /// for a strict check at `at` run at slot `slot` (the clock behind the
    /// slot taken at its start, as the ring does).
    fn counts(&self, (x, newest): (u64, u16), slot: u64, at: u64) -> bool {
        self.g.leaves(x, newest) > at.max(slot.saturating_mul(self.g.width()))
    }

    /// The earliest (slot, clock ns) at which `cost` more units fit, no earlier
    /// than `now` and than the latest admission, by the rule's
    /// [`rule::fits_at`]. Nothing is changed.
    fn next(&self, cost: u32, now: u64) -> (u64, u64) {
        let (slot, at) = self.start(now);
        // The clock behind the slot taken at its start, as the ring does.
        let from = at.max(slot.saturating_mul(self.g.width()));
        let leaving = self
            .buckets
            .iter()
            .filter(|&&(x, _, o)| self.counts((x, o), slot, at))
            .map(|&(x, c, o)| (self.g.leaves(x, o), c));
        let used = leaving.clone().map(|(_, c)| c).sum();
        match rule::fits_at(used, self.g.limit() as u64, cost as u64, from, leaving) {
            // Wait for the bucket whose leaving makes room.
            Some(t) if t > from => (self.g.slot(t), t),
            _ => (slot, at),
        }
    }

    /// The earliest clock ns, no earlier than `now` and than the latest
    /// admission, at which `cost` more units fit by the policy's own rule: the
    /// strict [`Window::next`], or in interpolated mode possibly inside a slot,
    /// as the weight of its oldest bucket falls (as the ring's denial computes).
    fn earliest(&self, cost: u32, now: u64) -> u64 {
        if self.g.precision() == Precision::Strict {
            return self.next(cost, now).1;
        }
        let (n, limit, w) = (self.g.buckets(), self.g.limit() as u64, self.g.width());
        let (mut slot, mut at) = self.start(now);
        let mut used = self.used;
        let mut live = self.buckets.iter();
        let mut oldest = live.next();
        loop {
            while let Some(&(x, c, _)) = oldest {
                if x + n >= slot {
                    break;
                }
                used -= c;
                oldest = live.next();
            }
            let Some(&(x, c, _)) = oldest.filter(|_| used + cost as u64 > limit) else {
                return at;
            };
            if x + n > slot {
                // Counted in full until it becomes the oldest bucket.
                slot = x + n;
                at = slot.saturating_mul(w);
                continue;
            }
            // Its weight falls linearly through this slot.
            let excess = (used + cost as u64 - limit) as u128;
            if excess <= c as u128 {
                let fits = slot as u128 * w as u128 + (excess * w as u128).div_ceil(c as u128);
                if fits < (slot as u128 + 1) * w as u128 {
                    return (fits as u64).max(at);
                }
            }
            slot += 1;
            at = slot.saturating_mul(w);
        }
    }

    /// Record `cost` units admitted at (slot, at).
    fn commit(&mut self, cost: u32, (slot, at): (u64, u64)) {
        let n = self.g.buckets();
        let strict = self.g.precision() == Precision::Strict;
        while let Some(&(x, c, o)) = self.buckets.front() {
            let counts = if strict {
                self.counts((x, o), slot, at)
            } else {
                x + n >= slot
            };
            if counts {
                break;
            }
            self.used -= c;
            self.buckets.pop_front();
        }
        let offset = self.g.offset_at(slot, at);
        match self.buckets.back_mut() {
            Some((x, c, o)) if *x == slot => {
                *c += cost as u64;
                *o = (*o).max(offset);
            }
            _ => self.buckets.push_back((slot, cost as u64, offset)),
        }
        self.used += cost as u64;
        self.slot = slot;
        self.at = at;
    }

    /// A denial of `cost` to report, as of clock time `now`, telling `wait`.
    fn denial(&self, cost: u32, now: u64, wait: Duration) -> Decision {
        let (n, limit) = (self.g.buckets(), self.g.limit());
        let slot = self.g.slot(now).max(self.slot);
        let strict = self.g.precision() == Precision::Strict;
        let live = self.buckets.iter().filter(|&&(x, _, o)| {
            if strict {
                self.counts((x, o), slot, now)
            } else {
                x + n >= slot
            }
        });
        let used: u64 = live.clone().map(|b| b.1).sum();
        let remaining = (limit as u64).saturating_sub(used) as u32;
        let reset = live
            .map(|&(x, _, o)| self.g.leaves(x, o).saturating_sub(now))
            .max()
            .map_or(Duration::ZERO, Duration::from_nanos);
        if cost > limit {
            return Decision::cost_exceeds_limit(limit, remaining, reset);
        }
        Decision::from_parts(
            Outcome::Denied,
            limit,
            remaining,
            wait.max(Duration::from_nanos(1)),
            reset,
        )
    }
}

/// A forecast admission: when (nanoseconds after the forecast's base instant),
/// which policy held it back longest, and the slots it lands in (fingerprinted).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Next {
    offset: u64,
    pub(crate) binding: usize,
    pub(crate) fingerprint: u64,
}

/// The forecast of one key's queue over all its policies.
pub(crate) struct Forecast {
    base: Instant,
    windows: Vec<Window>,
}

impl Forecast {
    pub(crate) fn new(snapshots: Vec<WindowSnapshot>, base: Instant) -> Forecast {
        Forecast {
            base,
            windows: snapshots.into_iter().map(Window::new).collect(),
        }
    }

    fn offset(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// The policy whose limit `cost` exceeds, if any.
    pub(crate) fn too_costly(&self, cost: u32) -> Option<usize> {
        self.windows.iter().position(|w| cost > w.g.limit())
    }

    /// When `cost` more units would be admitted by every policy at once, no
    /// earlier than `now` and than the latest admission. `cost` must fit every
    /// limit (see [`Forecast::too_costly`]).
    pub(crate) fn next(&self, cost: u32, now: Instant) -> Next {
        let from = self.offset(now);
        let mut t = from;
        let mut binding = 0;
        // Fitting is monotone in time (units only leave), so raising `t` to the
        // latest policy's answer until all agree reaches the earliest joint time.
        loop {
            let mut latest = t;
            for (i, w) in self.windows.iter().enumerate() {
                let at = w.next(cost, w.base + t).1 - w.base;
                if at > latest {
                    latest = at;
                    binding = i;
                }
            }
            if latest == t {
                break;
            }
            t = latest;
        }
        // Units only leave as time passes: what fits at `t` fits later too.
        let t = on_timer(t, from);
        let fingerprint = fingerprint(
            self.windows
                .iter()
                .map(|w| w.g.slot(w.base + t).max(w.slot)),
        );
        Next {
            offset: t,
            binding,
            fingerprint,
        }
    }

    /// The earliest instant at which every policy admits `cost` more units by its
    /// own rule (interpolated ones possibly earlier than [`Forecast::next`]), no
    /// earlier than `now` and than the latest admission. `cost` must fit every
    /// limit.
    pub(crate) fn earliest(&self, cost: u32, now: Instant) -> Instant {
        let from = self.offset(now);
        let mut t = from;
        // Monotone in time as in `next`: an interpolated weight only falls.
        loop {
            let latest = self
                .windows
                .iter()
                .map(|w| w.earliest(cost, w.base + t) - w.base)
                .fold(t, u64::max);
            if latest == t {
                return self.base + Duration::from_nanos(on_timer(t, from));
            }
            t = latest;
        }
    }

    /// Record `cost` admitted at `next`.
    pub(crate) fn commit(&mut self, cost: u32, next: Next) {
        for w in &mut self.windows {
            let at = w.base + next.offset;
            w.commit(cost, (w.g.slot(at).max(w.slot), at));
        }
    }

    /// The instant of `next`.
    pub(crate) fn instant(&self, next: Next) -> Instant {
        self.base + Duration::from_nanos(next.offset)
    }

    /// The denial to report for `cost` from policy `policy`, telling `wait`.
    pub(crate) fn denial(
        &self,
        policy: usize,
        cost: u32,
        now: Instant,
        wait: Duration,
    ) -> Decision {
        match self.windows.get(policy).or(self.windows.last()) {
            Some(w) => w.denial(cost, w.base + self.offset(now), wait),
            None => Decision::from_parts(Outcome::Denied, 0, 0, wait, Duration::ZERO),
        }
    }
}

/// Fingerprint of the slots an admission is recorded in, one per policy: the
/// forecast and the real admission are compared through it.
pub(crate) fn fingerprint(slots: impl Iterator<Item = u64>) -> u64 {
    slots.fold(0x243F_6A88_85A3_08D3, |h, s| {
        (h ^ s).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
    })
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn empty(limit: u32, window_ms: u64, buckets: u32) -> WindowSnapshot {
        let policy = Policy::builder()
            .limit(limit)
            .window(Duration::from_millis(window_ms))
            .buckets(buckets)
            .build()
            .unwrap();
        WindowSnapshot {
            geometry: Geometry::new(&policy),
            now: 0,
            slot: 0,
            counts: vec![0; buckets as usize + 1],
            newest: vec![0; buckets as usize + 1],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn several_policies_admit_when_all_of_them_allow() {
        let base = Instant::now();
        // 2 per 300 ms and 3 per 1.5 s, both in 100 ms buckets.
        let mut f = Forecast::new(vec![empty(2, 300, 3), empty(3, 1500, 15)], base);
        let mut admitted = Vec::new();
        for _ in 0..7 {
            let next = f.next(1, base);
            f.commit(1, next);
            admitted.push((f.instant(next) - base).as_millis());
        }
        // Two at once (the short policy is full), the third when the short
        // window frees (300 ms after them, at the timer's next millisecond),
        // then the long policy binds: 1.5 s after the first three.
        assert_eq!(admitted, [0, 0, 301, 1501, 1501, 1802, 3002]);
    }

    #[tokio::test(start_paused = true)]
    async fn counted_units_leave_a_bucket_after_the_window() {
        let base = Instant::now();
        let mut s = empty(3, 300, 3);
        s.now = 250_000_000; // slot 2
        s.slot = 2;
        s.counts = vec![1, 1, 1, 0]; // slots 2, 1, 0
        s.newest = vec![0; 4]; // each admitted at its slot's start
        let g = s.geometry;
        let f = Forecast::new(vec![s], base);
        let next = f.next(2, base);
        // Slot 0's unit leaves 300 ms after it (to a step of the bucket),
        // slot 1's 300 ms after it: 2 units fit then, at the timer's next
        // millisecond (401 ms).
        assert!(g.leaves(1, 0) > 400_000_000 && g.leaves(1, 0) < 401_000_000);
        assert_eq!(f.instant(next) - base, Duration::from_millis(151));
        let d = f.denial(0, 2, base, Duration::from_millis(151));
        let reset = Duration::from_nanos(g.leaves(2, 0) - 250_000_000);
        assert_eq!((d.remaining(), d.reset()), (0, reset));
        assert_eq!(f.too_costly(4), Some(0));
    }
}

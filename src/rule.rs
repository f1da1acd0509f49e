//! The strict sliding-window rule, exact at the window's edge, stated once:
//! pure integer arithmetic on a key's buckets, no atomics, no clock.
//!
//! A policy of `limit` L per window W is cut into N buckets of width
//! w = W / N; time `t` (nanoseconds) lies in slot `t / w`. A bucket holds the
//! units admitted in its slot and the *newest* instant any of them was
//! admitted, as a 16-bit offset inside the slot (in steps of 1/2^16 of the
//! bucket, rounded down) that stands for its step's last instant
//! ([`Rule::offset`], [`Rule::newest`]). Every unit of a bucket was admitted
//! at or before that instant, so once it is no longer inside the window
//! `(now - W, now]`, no unit of the bucket is: the bucket stops counting at
//! [`Rule::leaves`] = newest + W. A check at `now` admits `cost` units when
//! the units of the buckets still counting, plus `cost`, stay at most L; no
//! interval of length W then ever holds more than L admitted units.
//!
//! Buckets leave in slot order (a bucket's newest instant lies inside its
//! slot), so the time until `cost` fits is found by walking them oldest
//! first ([`fits_at`]), and the window drains when the newest bucket
//! leaves.
//!
//! Without offsets (a bucket's newest instant taken as its slot's last
//! nanosecond, `Rule::whole_slots`) a bucket counts until its whole slot has
//! left the window, N + 1 buckets in all. The offset lets a burst sent one
//! window after another be admitted when an exact log of every admission
//! would admit it, to a step of the bucket.

/// Offsets are this many steps of a bucket's width: 16 bits.
const STEPS: u64 = 1 << 16;

/// The multiplier [`offset_of`] scales a time into a slot with, for buckets
/// `width` nanoseconds wide: 2^64 / width, rounded up, so that the offset
/// is never below `into * 2^16 / width` and takes a multiplication, not a
/// division, on a check's path. 0 for buckets of 1 ns (every instant is
/// then at offset 0).
pub(crate) fn offset_multiplier(width: u64) -> u64 {
    if width <= 1 {
        return 0;
    }
    ((1u128 << 64).div_ceil(u128::from(width))) as u64
}

/// The offset of an instant `into` nanoseconds into its slot of `width`:
/// `into * 2^16 / width` rounded down, so that [`newest_into`] of it is at or
/// after `into`. The multiplier's estimate is never below it and, for
/// buckets up to 2^48 ns (78 hours), at most one step above: one
/// multiplication and one comparison, no division.
#[inline(always)]
pub(crate) fn offset_of(into: u64, width: u64, multiplier: u64) -> u16 {
    let scaled = u128::from(into) * u128::from(STEPS);
    let mut offset = ((u128::from(into) * u128::from(multiplier)) >> 48).min(STEPS as u128 - 1);
    while offset * u128::from(width) > scaled {
        offset -= 1;
    }
    offset as u16
}

/// The latest instant into a slot of `width` that `offset` stands for:
/// every instant whose offset is at most `offset` lies at or before it.
#[inline(always)]
pub(crate) fn newest_into(offset: u16, width: u64) -> u64 {
    let step_end = (u128::from(offset) + 1) * u128::from(width);
    (step_end.div_ceil(u128::from(STEPS)) - 1) as u64
}

/// The instant the units of the bucket of slot `slot`, the newest admitted
/// at `offset`, have all left a window of `buckets` buckets of `width`: that
/// newest admission plus the window. A bucket counts until then.
#[inline(always)]
pub(crate) fn leaves(slot: u64, offset: u16, width: u64, buckets: u64) -> u64 {
    (slot + buckets) * width + newest_into(offset, width)
}

/// The earliest instant, at or after `from`, at which `cost` more units fit
/// under `limit` in a window that holds `used` units: `from` when they fit
/// already, else the instant the bucket whose leaving makes room leaves.
/// `leaving` gives the buckets that count at `from`, oldest first, as (the
/// instant the bucket leaves, its units): buckets leave in slot order, so
/// the walk stops at the first that frees enough. `None` when the buckets
/// given cannot free enough (a cost above the limit never fits).
///
/// The one answer to "when does it fit": the ring's denials, the wait
/// forecast and the models call it; the Redis script walks its records the
/// same way (its parity tests compare it with [`Rule`]).
#[inline]
pub(crate) fn fits_at(
    used: u64,
    limit: u64,
    cost: u64,
    from: u64,
    leaving: impl IntoIterator<Item = (u64, u64)>,
) -> Option<u64> {
    let target = limit.checked_sub(cost)?;
    let (mut used, mut at) = (used, from);
    let mut leaving = leaving.into_iter();
    while used > target {
        let (leaves, units) = leaving.next()?;
        used = used.saturating_sub(units);
        at = at.max(leaves);
    }
    Some(at)
}

/// A bucket as the rule reads it: its slot, its units, and the offset of its
/// newest admission inside the slot.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) slot: u64,
    pub(crate) units: u64,
    pub(crate) newest: u16,
}

/// A policy's geometry, for the rule.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    /// N: buckets per window.
    pub(crate) buckets: u64,
    /// w: a bucket's width, in nanoseconds (at least 1).
    pub(crate) width: u64,
    pub(crate) limit: u64,
    /// Count each bucket until its whole slot has left the window, whatever
    /// its offsets say (N + 1 slots: the rule before offsets, for
    /// comparison).
    pub(crate) whole_slots: bool,
}

/// What a check at an instant decides.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) allowed: bool,
    /// Units the window holds after the check (with the cost, if admitted).
    pub(crate) used: u64,
    /// Nanoseconds until `cost` fits (0 when admitted), `None` when it never
    /// does (a cost above the limit).
    pub(crate) retry_after: Option<u64>,
    /// Nanoseconds until every counted unit has left the window.
    pub(crate) reset: u64,
}

#[cfg(test)]
impl Rule {
    /// W, in nanoseconds.
    pub(crate) fn window(&self) -> u64 {
        self.buckets * self.width
    }

    pub(crate) fn slot(&self, t: u64) -> u64 {
        t / self.width
    }

    /// The offset of instant `t` inside its slot ([`offset_of`]):
    /// [`newest`](Self::newest) maps it back to an instant at or after `t`.
    pub(crate) fn offset(&self, t: u64) -> u16 {
        offset_of(t % self.width, self.width, offset_multiplier(self.width))
    }

    /// The latest instant of slot `slot` that `offset` stands for: every
    /// instant `t` of the slot with `offset(t) <= offset` is at or before it.
    pub(crate) fn newest(&self, slot: u64, offset: u16) -> u64 {
        slot * self.width + newest_into(offset, self.width)
    }

    /// The instant a bucket stops counting: its newest admission is then no
    /// longer inside the window ending at that instant.
    pub(crate) fn leaves(&self, b: &Bucket) -> u64 {
        if self.whole_slots {
            return (b.slot + 1) * self.width + self.window();
        }
        leaves(b.slot, b.newest, self.width, self.buckets)
    }

    /// Whether `b` counts in a check at `now`.
    pub(crate) fn counts(&self, b: &Bucket, now: u64) -> bool {
        b.units > 0 && self.leaves(b) > now
    }

    /// The units the buckets hold that count at `now`.
    pub(crate) fn used(&self, buckets: &[Bucket], now: u64) -> u64 {
        buckets
            .iter()
            .filter(|b| self.counts(b, now))
            .map(|b| b.units)
            .sum()
    }

    /// The earliest instant at or after `now` at which `cost` units fit,
    /// `None` when they never do. `buckets` may come in any order.
    pub(crate) fn fits_at(&self, buckets: &[Bucket], now: u64, cost: u64) -> Option<u64> {
        let mut counting: Vec<(u64, u64)> = buckets
            .iter()
            .filter(|b| self.counts(b, now))
            .map(|b| (self.leaves(b), b.units))
            .collect();
        counting.sort_unstable();
        let used = counting.iter().map(|&(_, u)| u).sum();
        fits_at(used, self.limit, cost, now, counting)
    }

    /// A check of `cost` units at `now` over `buckets` (any order).
    pub(crate) fn check(&self, buckets: &[Bucket], now: u64, cost: u64) -> Verdict {
        let used = self.used(buckets, now);
        let allowed = used + cost <= self.limit;
        let last = buckets
            .iter()
            .filter(|b| self.counts(b, now))
            .map(|b| self.leaves(b))
            .max();
        let (used, last) = if allowed && cost > 0 {
            let mine = self.leaves(&Bucket {
                slot: self.slot(now),
                units: cost,
                newest: self.offset(now),
            });
            (used + cost, Some(last.map_or(mine, |l| l.max(mine))))
        } else {
            (used, last)
        };
        Verdict {
            allowed,
            used,
            retry_after: if allowed {
                Some(0)
            } else {
                self.fits_at(buckets, now, cost).map(|at| at - now)
            },
            reset: last.map_or(0, |l| l - now),
        }
    }

    /// Count `cost` units admitted at `now` into `buckets`: the bucket of
    /// `now`'s slot, its newest offset moved later (never earlier).
    pub(crate) fn record(&self, buckets: &mut Vec<Bucket>, now: u64, cost: u64) {
        let (slot, offset) = (self.slot(now), self.offset(now));
        match buckets.iter_mut().find(|b| b.slot == slot) {
            Some(b) => {
                b.units += cost;
                b.newest = b.newest.max(offset);
            }
            None => buckets.push(Bucket {
                slot,
                units: cost,
                newest: offset,
            }),
        }
        buckets.retain(|b| self.counts(b, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(limit: u64, window_ms: u64, buckets: u64) -> Rule {
        Rule {
            buckets,
            width: window_ms * 1_000_000 / buckets,
            limit,
            whole_slots: false,
        }
    }

    #[test]
    fn an_offset_stands_for_an_instant_at_or_after_every_instant_it_rounds() {
        for width in [
            1,
            2,
            7,
            1000,
            65_535,
            65_536,
            65_537,
            1_000_000_007,
            4_000_000_000,
            (1 << 48) + 3,
            u64::MAX / 16,
        ] {
            let r = Rule {
                buckets: 10,
                width,
                limit: 1,
                whole_slots: false,
            };
            for into in [0, 1, width / 3, width / 2, width - 1]
                .into_iter()
                .filter(|&i| i < width)
            {
                let t = 5 * width + into;
                let offset = r.offset(t);
                // The offset rounded down.
                let floor = (u128::from(into) * u128::from(STEPS) / u128::from(width)) as u64;
                assert_eq!(u64::from(offset), floor, "width {width}, {into}");
                let newest = r.newest(5, offset);
                assert!(newest >= t, "width {width}, {into}: {newest} < {t}");
                assert!(newest < 6 * width, "width {width}: inside the slot");
                // Less than one step of the width after it: the offset is
                // rounded down, its step's last instant up.
                assert!(newest - t <= width / STEPS, "width {width}");
            }
        }
    }

    #[test]
    fn a_burst_one_window_after_another_is_admitted_when_the_first_has_left() {
        // 10 per second in 10 buckets; 10 units at 0.05 s.
        let r = rule(10, 1000, 10);
        let mut buckets = Vec::new();
        let t = 50_000_000;
        assert!(r.check(&buckets, t, 10).allowed);
        r.record(&mut buckets, t, 10);
        // One window later, to within the offset's rounding (a step of the
        // 100 ms bucket: 1.5 µs): admitted, where a bucket counted until its
        // whole slot had left (at 1.1 s) would deny until then.
        let leaves = r.leaves(&buckets[0]);
        assert!(leaves >= t + 1_000_000_000);
        assert!(leaves <= t + 1_000_000_000 + r.width / STEPS);
        let before = t + 1_000_000_000 - 1;
        let d = r.check(&buckets, before, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(leaves - before));
        assert_eq!(d.reset, leaves - before);
        assert!(!r.check(&buckets, leaves - 1, 10).allowed);
        assert!(r.check(&buckets, leaves, 10).allowed);
        // A cost above the limit never fits.
        assert_eq!(r.check(&buckets, before, 11).retry_after, None);
    }

    /// An exact log: every admission with its instant.
    fn log_used(log: &[(u64, u64)], now: u64, window: u64) -> u64 {
        log.iter()
            .filter(|&&(t, _)| t + window > now && t <= now)
            .map(|&(_, c)| c)
            .sum()
    }

    proptest! {
        /// Strict: checked at nanosecond instants with random gaps and
        /// costs, no interval of one window ever holds more than the limit;
        /// a denial's wait is exact (the cost fits then, not a nanosecond
        /// before).
        #[test]
        fn never_admits_more_than_the_limit_in_any_window(
            limit in 1..50u64,
            buckets in 1..25u64,
            window_ms in 1..2000u64,
            steps in prop::collection::vec((0..400_000_000u64, 1..6u64), 1..300),
        ) {
            let r = rule(limit, window_ms.max(buckets), buckets);
            let mut state = Vec::new();
            let mut log = Vec::new();
            let mut now = 1_000_000_000u64;
            for (gap, cost) in steps {
                now += gap;
                let v = r.check(&state, now, cost);
                if v.allowed {
                    r.record(&mut state, now, cost);
                    log.push((now, cost));
                    // Every window ending at an admission: at most L.
                    prop_assert!(log_used(&log, now, r.window()) <= limit);
                } else if let Some(wait) = v.retry_after {
                    prop_assert!(wait > 0);
                    prop_assert!(r.check(&state, now + wait, cost).allowed);
                    prop_assert!(!r.check(&state, now + wait - 1, cost).allowed);
                }
                // The rule never counts fewer units than the exact log.
                prop_assert!(r.used(&state, now) >= log_used(&log, now, r.window()));
            }
        }
    }
}

//! How a ring's words are packed. Every bucket is one 64-bit word: the
//! offset of its newest admission inside its slot (16 bits, see
//! `crate::rule`), a 16-bit slot tag and a 32-bit count, so that a count and
//! the offset that covers it change in one compare-and-swap. Heads come in
//! two layouts:
//!
//! - [`Compact`]: one 64-bit head word holding the newest slot (46 bits),
//!   the flags and the base count (16 bits). For limits up to 65 535 and
//!   buckets of at least 16.4 µs (2^46 of them then reach as far as the wide
//!   layout's 2^60 one-nanosecond slots: 36 years).
//! - [`Wide`]: a 64-bit newest word and a 64-bit base word of its own. Any
//!   limit, any bucket width.
//!
//! The protocol (`ring/mod.rs`) is the same for both; it reaches the words
//! through [`Bucket`] and [`Head`]. Tags are slot numbers modulo 2^`TAG_BITS`,
//! compared as signed differences: exact while every tag read is less than
//! 2^(`TAG_BITS` - 1) slots from the slot it is compared with, which the
//! protocol keeps by resetting idle rings and normalising old tags at
//! 2^(`TAG_BITS` - 2) (see the module docs of `ring`).

#[cfg(not(tsw_loom))]
use crate::sync::Ordering::Relaxed;
use crate::sync::{AtomicU64, Ordering::SeqCst};
use std::fmt::Debug;

/// Set in the head while an idle ring is reset.
pub(crate) const RESETTING: u64 = 1 << 63;
/// The head's flags (bit 62 is unused: slots stay below it).
pub(crate) const FLAGS: u64 = RESETTING;

/// One bucket: a count in the low `COUNT_BITS` of the word, a slot tag in
/// the `TAG_BITS` above, and the newest admission's offset in the 16 bits
/// above those ([`offset`]). Values travel as `u64`.
pub(crate) trait Bucket: Send + Sync + Debug + Sized + 'static {
    const TAG_BITS: u32;
    const COUNT_BITS: u32;
    /// A 64-byte line of these words.
    type Line: Line<Self>;
    fn load(&self) -> u64;
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64>;
    fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64>;
    fn swap(&self, value: u64) -> u64;
    /// A store to a word no other thread reads yet (a ring being made, in a
    /// table or storage not yet published): relaxed, as the publication
    /// (a release store, or a lock) orders it before any reader's access.
    /// Under loom a swap: loom orders a plain store only partially against
    /// the read-modify-writes that follow it, even after a publication, and
    /// would let a later compare-and-swap read the word from before the store
    /// (see `crate::sync`).
    fn store_unpublished(&self, value: u64);
}

/// A cache line of bucket words: rings live in slices of these, so that a
/// ring of 8 buckets fills exactly one line.
pub(crate) trait Line<B>: Send + Sync + Debug + Sized + 'static {
    const WORDS: usize;
    fn new() -> Self;
    fn word(&self, i: usize) -> &B;
    /// The line's words, in order.
    fn words(&self) -> &[B];
    /// Over the line's words: the counts of those whose age behind slot `s`
    /// ([`age_bits`]) lies in `from ..= from + counted - 1`, and the OR of
    /// every word's age (what `Ring::sum` takes from a ring of whole lines).
    /// The words are loaded as the word-by-word sum loads them, in order,
    /// then summed with their ages in 32 bits, which the compiler does in
    /// vector registers: shorter than word by word, in either layout.
    fn sum_ages(&self, s: u64, from: u64, counted: u64) -> (u64, u64);
}

/// Eight buckets.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Line64([AtomicU64; 8]);

impl Line<AtomicU64> for Line64 {
    const WORDS: usize = 8;
    fn new() -> Self {
        Line64(std::array::from_fn(|_| AtomicU64::new(0)))
    }
    #[inline(always)]
    fn word(&self, i: usize) -> &AtomicU64 {
        &self.0[i % Self::WORDS]
    }
    #[inline(always)]
    fn words(&self) -> &[AtomicU64] {
        &self.0
    }
    /// Ages in 32 bits (the tag fits), counts in 64. `counted` is at most
    /// `Policy::MAX_BUCKETS` + 1.
    #[inline(always)]
    fn sum_ages(&self, s: u64, from: u64, counted: u64) -> (u64, u64) {
        let cells: [u64; Self::WORDS] = std::array::from_fn(|i| self.0[i].load(SeqCst));
        let tag_mask = u32::MAX >> (32 - <AtomicU64 as Bucket>::TAG_BITS);
        let count_mask = count_max::<AtomicU64>();
        let (s, from, counted) = (s as u32, from as u32, counted as u32);
        let (mut used, mut ages) = (0u64, 0u32);
        for cell in cells {
            let tag = (cell >> <AtomicU64 as Bucket>::COUNT_BITS) as u32;
            let a = s.wrapping_sub(tag) & tag_mask;
            ages |= a;
            // A mask, not a branch (which words count follows no pattern a
            // branch predictor learns): all ones when `x = a - from`
            // (wrapping) is below `counted`. `x - counted` then wraps and
            // sets its top bit; it also does for `x` from 2^31 + `counted`
            // up (`counted` is far below 2^31), whose own top bit `& !x`
            // clears.
            let x = a.wrapping_sub(from);
            let counts = ((x.wrapping_sub(counted) & !x) as i32 >> 31) as u32;
            used += cell & count_mask & u64::from(counts);
        }
        (used, u64::from(ages))
    }
}

impl Bucket for AtomicU64 {
    const TAG_BITS: u32 = 16;
    const COUNT_BITS: u32 = 32;
    type Line = Line64;
    #[inline(always)]
    fn load(&self) -> u64 {
        AtomicU64::load(self, SeqCst)
    }
    #[inline(always)]
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        AtomicU64::compare_exchange(self, current, new, SeqCst, SeqCst)
    }
    #[inline(always)]
    fn compare_exchange_weak(&self, current: u64, new: u64) -> Result<u64, u64> {
        AtomicU64::compare_exchange_weak(self, current, new, SeqCst, SeqCst)
    }
    fn swap(&self, value: u64) -> u64 {
        AtomicU64::swap(self, value, SeqCst)
    }
    #[inline(always)]
    fn store_unpublished(&self, value: u64) {
        #[cfg(not(tsw_loom))]
        AtomicU64::store(self, value, Relaxed);
        #[cfg(tsw_loom)]
        AtomicU64::swap(self, value, SeqCst);
    }
}

/// The largest count a bucket of `B` holds.
#[inline(always)]
pub(crate) fn count_max<B: Bucket>() -> u64 {
    (1 << B::COUNT_BITS) - 1
}

/// Where a bucket word keeps its newest admission's offset.
const OFFSET_SHIFT: u32 = 48;

/// A bucket word holding `count` units for `slot` (its low `TAG_BITS`), the
/// newest of them admitted no later than the end of the slot: the offset a
/// bucket gets when nothing says its units came earlier (counts seeded or
/// carried over).
#[inline(always)]
pub(crate) fn pack<B: Bucket>(slot: u64, count: u64) -> u64 {
    pack_at::<B>(slot, count, u16::MAX)
}

/// A bucket word holding `count` units for `slot`, the newest admitted at
/// `offset` (in 1/2^16 of the slot, see `crate::rule`).
#[inline(always)]
pub(crate) fn pack_at<B: Bucket>(slot: u64, count: u64, offset: u16) -> u64 {
    let tag = (slot & ((1 << B::TAG_BITS) - 1)) << B::COUNT_BITS;
    (u64::from(offset) << OFFSET_SHIFT) | tag | count
}

/// The offset of the newest admission `cell` holds.
#[inline(always)]
pub(crate) fn offset(cell: u64) -> u16 {
    (cell >> OFFSET_SHIFT) as u16
}

#[inline(always)]
pub(crate) fn count<B: Bucket>(cell: u64) -> u64 {
    cell & count_max::<B>()
}

/// How far `cell`'s slot lies behind `s`: 0 current, > 0 older, < 0 newer.
#[inline(always)]
pub(crate) fn age<B: Bucket>(s: u64, cell: u64) -> i64 {
    let shift = 64 - B::TAG_BITS;
    ((s.wrapping_sub(cell >> B::COUNT_BITS) << shift) as i64) >> shift
}

/// [`age`] as an unsigned `TAG_BITS` number: a newer tag's negative age is
/// then at least 2^(`TAG_BITS` - 1).
#[inline(always)]
pub(crate) fn age_bits<B: Bucket>(s: u64, cell: u64) -> u64 {
    s.wrapping_sub(cell >> B::COUNT_BITS) & ((1 << B::TAG_BITS) - 1)
}

/// A stale bucket this old is rewritten to a fresh stale tag, so that no tag of
/// a ring in use ever drifts to half the tag range, where ages become ambiguous.
#[inline(always)]
pub(crate) fn normalize_age<B: Bucket>() -> u64 {
    1 << (B::TAG_BITS - 2)
}

/// A ring's head: the newest slot any consuming check has entered, the
/// flags, and the base of that slot (the units at its N older slots), or
/// "unknown". Head words travel as `u64`: the flag in bit 63, the slot
/// in the low bits, and (compact) the base in between.
pub(crate) trait Head: Send + Sync + Debug + Sized + 'static {
    type Bucket: Bucket;
    /// Slots stay at or below this (`Geometry::hold` holds the clock there).
    const MAX_SLOT: u64;
    /// A head at slot `s` holding `base` (`None`: unknown).
    fn new(s: u64, base: Option<u64>) -> Self;
    /// The head word.
    fn load(&self) -> u64;
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64>;
    /// The slot and flags of a head word, without the base: what a check
    /// compares to see whether the ring has moved on.
    fn newest(raw: u64) -> u64;
    /// The base of the slot of `raw` (a head word just loaded, no flags set),
    /// if it is known.
    fn base(&self, raw: u64) -> Option<u64>;
    /// The head word that advances the ring to slot `s`: its base pending,
    /// for the advancing thread to publish.
    fn advanced(s: u64) -> u64;
    /// Publish `base` (`None`: it does not fit, or is unknown) as the base of
    /// `s`, if the head still waits for the base of `s`.
    fn publish_base(&self, s: u64, base: Option<u64>);
    /// Mark the base of `newest` (slot and flags) unknown, if the head is
    /// still there: units it may count have been taken back.
    fn forget_base(&self, newest: u64);
    /// Set the head to slot `s` with `base`, by swaps: to end a reset (the
    /// base first, so that the swap that clears the flag comes last).
    fn set(&self, s: u64, base: Option<u64>);
    /// [`set`](Self::set) for a head no other thread reads yet (a ring being
    /// made, published later by a lock or a release store): plain stores,
    /// as [`Bucket::store_unpublished`].
    fn set_unpublished(&self, s: u64, base: Option<u64>);
}

/// The compact layout's head: `RESETTING | (unused) | base (16 bits, at 46) | slot (46 bits)`.
#[derive(Debug)]
pub(crate) struct Compact(AtomicU64);

const COMPACT_BASE_SHIFT: u32 = 46;
const COMPACT_BASE_MASK: u64 = 0xFFFF << COMPACT_BASE_SHIFT;
/// The base of a slot just entered: the advancing thread is summing it.
const PENDING: u64 = 0xFFFF;
/// A base that does not fit, or counts units since taken back.
const UNKNOWN: u64 = 0xFFFE;

impl Compact {
    #[inline(always)]
    fn word(s: u64, base: Option<u64>) -> u64 {
        let base = base.filter(|&b| b < UNKNOWN).unwrap_or(UNKNOWN);
        (base << COMPACT_BASE_SHIFT) | s
    }
}

impl Head for Compact {
    type Bucket = AtomicU64;
    const MAX_SLOT: u64 = (1 << COMPACT_BASE_SHIFT) - 1;

    fn new(s: u64, base: Option<u64>) -> Self {
        Compact(AtomicU64::new(Compact::word(s, base)))
    }
    #[inline(always)]
    fn load(&self) -> u64 {
        self.0.load(SeqCst)
    }
    #[inline(always)]
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.0.compare_exchange(current, new, SeqCst, SeqCst)
    }
    #[inline(always)]
    fn newest(raw: u64) -> u64 {
        raw & !COMPACT_BASE_MASK
    }
    #[inline(always)]
    fn base(&self, raw: u64) -> Option<u64> {
        let base = (raw & COMPACT_BASE_MASK) >> COMPACT_BASE_SHIFT;
        (base < UNKNOWN).then_some(base)
    }
    #[inline(always)]
    fn advanced(s: u64) -> u64 {
        (PENDING << COMPACT_BASE_SHIFT) | s
    }
    fn publish_base(&self, s: u64, base: Option<u64>) {
        // Only from pending: a base forgotten meanwhile stays unknown.
        let _ = self.compare_exchange(Self::advanced(s), Compact::word(s, base));
    }
    fn forget_base(&self, newest: u64) {
        let mut raw = self.load();
        while Self::newest(raw) == newest
            && (raw & COMPACT_BASE_MASK) >> COMPACT_BASE_SHIFT != UNKNOWN
        {
            match self.compare_exchange(raw, Compact::word(newest, None)) {
                Ok(_) => return,
                Err(actual) => raw = actual,
            }
        }
    }
    fn set(&self, s: u64, base: Option<u64>) {
        self.0.swap(Compact::word(s, base), SeqCst);
    }
    #[inline(always)]
    fn set_unpublished(&self, s: u64, base: Option<u64>) {
        self.0.store_unpublished(Compact::word(s, base));
    }
}

/// The wide layout's head: `newest` is `RESETTING | (unused) | slot (60 bits)`;
/// `base` is packed like a wide bucket, tagged with the slot it is the base
/// of, its count [`WIDE_NO_BASE`] when unknown.
#[derive(Debug)]
pub(crate) struct Wide {
    newest: AtomicU64,
    base: AtomicU64,
}

/// The base count meaning "unknown" in the wide layout.
const WIDE_NO_BASE: u64 = u32::MAX as u64;

impl Wide {
    #[inline(always)]
    fn base_word(s: u64, base: Option<u64>) -> u64 {
        let base = base.filter(|&b| b < WIDE_NO_BASE).unwrap_or(WIDE_NO_BASE);
        (s << 32) | base
    }

    /// How far the slot `cell` is the base of lies behind `s`, as a signed
    /// 32-bit difference (the base word keeps 32 bits of its slot, more
    /// than a bucket's tag: a base is compared with the head's slot at any
    /// distance a descheduled thread may leave between them).
    #[inline(always)]
    fn base_age(s: u64, cell: u64) -> i64 {
        i64::from(((s as u32).wrapping_sub((cell >> 32) as u32)) as i32)
    }

    #[inline(always)]
    fn base_count(cell: u64) -> u64 {
        cell & u64::from(u32::MAX)
    }
}

impl Head for Wide {
    type Bucket = AtomicU64;
    const MAX_SLOT: u64 = (1 << 60) - 1;

    fn new(s: u64, base: Option<u64>) -> Self {
        Wide {
            newest: AtomicU64::new(s),
            base: AtomicU64::new(Wide::base_word(s, base)),
        }
    }
    #[inline(always)]
    fn load(&self) -> u64 {
        self.newest.load(SeqCst)
    }
    #[inline(always)]
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.newest.compare_exchange(current, new, SeqCst, SeqCst)
    }
    #[inline(always)]
    fn newest(raw: u64) -> u64 {
        raw
    }
    #[inline(always)]
    fn base(&self, raw: u64) -> Option<u64> {
        let base = self.base.load(SeqCst);
        let c = Wide::base_count(base);
        (Wide::base_age(raw, base) == 0 && c != WIDE_NO_BASE).then_some(c)
    }
    #[inline(always)]
    fn advanced(s: u64) -> u64 {
        s
    }
    fn publish_base(&self, s: u64, base: Option<u64>) {
        // Only over the base of an older slot: a base of `s` already there
        // (one forgotten meanwhile) stays.
        let mut cell = self.base.load(SeqCst);
        while Wide::base_age(s, cell) > 0 {
            match self
                .base
                .compare_exchange_weak(cell, Wide::base_word(s, base), SeqCst, SeqCst)
            {
                Ok(_) => return,
                Err(actual) => cell = actual,
            }
        }
    }
    fn forget_base(&self, newest: u64) {
        let base = self.base.load(SeqCst);
        if Wide::base_age(newest, base) == 0 && Wide::base_count(base) != WIDE_NO_BASE {
            let _ = self
                .base
                .compare_exchange(base, Wide::base_word(newest, None), SeqCst, SeqCst);
        }
    }
    fn set(&self, s: u64, base: Option<u64>) {
        self.base.swap(Wide::base_word(s, base), SeqCst);
        self.newest.swap(s, SeqCst);
    }
    #[inline(always)]
    fn set_unpublished(&self, s: u64, base: Option<u64>) {
        self.base.store_unpublished(Wide::base_word(s, base));
        self.newest.store_unpublished(s);
    }
}

#[cfg(all(test, not(tsw_loom)))]
mod tests {
    use super::*;

    #[test]
    fn tags_compare_by_signed_16_bit_difference() {
        type B = AtomicU64;
        let cell = pack_at::<B>(65_530, 7, 123);
        assert_eq!(count::<B>(cell), 7);
        assert_eq!(offset(cell), 123);
        assert_eq!(age::<B>(65_530, cell), 0);
        // Across the 2^16 boundary: slot 65 540 is 10 slots after 65 530.
        assert_eq!(age::<B>(65_540, cell), 10);
        assert_eq!(age::<B>(65_520, cell), -10);
        assert_eq!(age_bits::<B>(65_540, cell), 10);
        assert!(
            age_bits::<B>(65_520, cell) >= 1 << 15,
            "newer reads as large"
        );
        // 2^16 slots on, the tag is the same: the protocol never lets that happen.
        assert_eq!(age::<B>(65_530 + (1 << 16), cell), 0);
        // A count of 32 bits, and the offset, leave the tag alone.
        let full = pack_at::<B>(3, u64::from(u32::MAX), u16::MAX);
        assert_eq!(count::<B>(full), u64::from(u32::MAX));
        assert_eq!(age::<B>(3, full), 0);
        assert_eq!(offset(full), u16::MAX);
        // Without an offset said, the slot's end.
        assert_eq!(offset(pack::<B>(3, 1)), u16::MAX);
    }

    #[test]
    fn the_wide_base_compares_32_bits_of_its_slot() {
        let head = Wide::new((1 << 32) - 3, Some(9));
        assert_eq!(head.base((1 << 32) - 3), Some(9));
        // 2^16 slots on (a bucket's tag would match): not this base.
        assert_eq!(head.base((1 << 32) - 3 + (1 << 16)), None);
        head.publish_base((1 << 32) + 4, Some(5));
        assert_eq!(head.base((1 << 32) + 4), Some(5));
    }

    /// `Line::sum_ages` as `Ring::sum` defines it word by word.
    fn sum_word_by_word<B: Bucket>(cells: &[u64], s: u64, from: u64, counted: u64) -> (u64, u64) {
        cells.iter().fold((0, 0), |(used, ages), &cell| {
            let a = age_bits::<B>(s, cell);
            let counts = a.wrapping_sub(from) < counted;
            (used + if counts { count::<B>(cell) } else { 0 }, ages | a)
        })
    }

    fn sums_as_words_one_by_one<B: Bucket>(line: &B::Line) {
        let mut next = crate::ring::splitmix64(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            // Slots anywhere, near the tags' wrap-around too; tags mostly
            // within a window behind, some newer, some long stale.
            let s = next() >> (next() % 64);
            let n = [1, 2, 7, 15, 63, 4096][(next() % 6) as usize];
            let from = next() % 2;
            let cells: Vec<u64> = (0..B::Line::WORDS)
                .map(|_| {
                    let back = match next() % 8 {
                        0 => next(),
                        1 => (next() % 4).wrapping_neg(),
                        _ => next() % (n + 2),
                    };
                    let offset = next() as u16;
                    pack_at::<B>(s.wrapping_sub(back), next() & count_max::<B>(), offset)
                })
                .collect();
            for (i, &cell) in cells.iter().enumerate() {
                line.word(i).swap(cell);
            }
            // The whole span, or all but its oldest bucket.
            let counted = n + 1 - from - next() % 2;
            assert_eq!(
                line.sum_ages(s, from, counted),
                sum_word_by_word::<B>(&cells, s, from, counted),
                "slot {s}, N {n}, from {from}, cells {cells:x?}"
            );
        }
    }

    #[test]
    fn a_line_sums_as_its_words_one_by_one() {
        sums_as_words_one_by_one::<AtomicU64>(&Line64::new());
    }

    #[test]
    fn the_compact_head_keeps_slot_flags_and_base_apart() {
        let head = Compact::new(Compact::MAX_SLOT, Some(65_533));
        let raw = head.load();
        assert_eq!(Compact::newest(raw), Compact::MAX_SLOT);
        assert_eq!(head.base(raw), Some(65_533));
        // A base too large to hold is unknown, as is a pending one.
        assert_eq!(
            Compact::new(5, Some(65_534)).base(5 | (UNKNOWN << 46)),
            None
        );
        let advanced = Compact::advanced(6);
        assert_eq!(Compact::newest(advanced), 6);
        assert_eq!(head.base(advanced), None);
        // The flag survives the base's bits.
        let resetting = raw | RESETTING;
        assert_eq!(Compact::newest(resetting), Compact::MAX_SLOT | RESETTING);
    }

    #[test]
    fn a_base_forgotten_before_it_is_published_stays_unknown() {
        for forget_first in [false, true] {
            let head = Compact::new(4, Some(0));
            head.compare_exchange(head.load(), Compact::advanced(5))
                .unwrap();
            if forget_first {
                head.forget_base(5);
            }
            head.publish_base(5, Some(3));
            let expected = if forget_first { None } else { Some(3) };
            assert_eq!(head.base(head.load()), expected);
            // A forget after the publish makes it unknown too.
            head.forget_base(5);
            assert_eq!(head.base(head.load()), None);
        }
    }
}

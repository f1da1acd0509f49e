//! Leases: units of a key that Redis counted for this instance ahead of use,
//! admitted here without a round trip until the bucket they were counted in
//! ends.
//!
//! # Why the fleet still never admits more than the limit
//!
//! The script counts a grant's units in the slot holding Redis' time `r` and
//! answers how long that slot lasts, `v = end - r`. The instance admits from
//! the grant only before `sent + v/(1 + ρ)`, where `sent` is when it sent the
//! request and ρ the clock tolerance: Redis ran the script after that, so on
//! Redis' clock the instance stops before the slot ends (as long as Redis'
//! clock runs at most ρ faster over one bucket). Every unit admitted from a
//! grant is therefore counted in Redis in the slot that holds its admission,
//! like a unit Redis admits itself, and the strict check every grant passed
//! bounds every window of the fleet. Units handed back were never admitted:
//! lowering their slot's count (even after the slot ended) keeps every
//! slot's count at or above what it admitted, and Redis lowers only the
//! incarnation of the key that counted them, in the geometry it counted
//! them in.
//!
//! # The table
//!
//! One entry per hash bucket of the key, found by the key's hash: bounded, no
//! sweep, no growth. An entry that holds units, or that a renewal task or a
//! request in flight will come back to, stays; any other is taken over by the
//! next key that hashes there (that key just keeps asking Redis, as a key with
//! no lease does). An entry keeps the key's bytes only while it holds a grant;
//! its rate is followed by hash alone.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a [`RedisStore`](super::RedisStore) leases units to this instance, given
/// to [`RedisStoreBuilder::leases`](super::RedisStoreBuilder::leases).
///
/// With leases, a check that goes to Redis may ask for more units than its
/// cost: as many as this instance expects to use of the key until the bucket
/// ends (its recent rate here, times the time left in the bucket), never more
/// than [`1/share`](Leases::share) of what the window has left, and none when
/// that is less than one unit (near the limit a check asks for its cost only,
/// as without leases). The units left are admitted here, one check after the
/// other, without a round trip; before they run out the next grant is fetched
/// in the background; what is left when the bucket ends is handed back.
/// [`RedisStore`](super::RedisStore) states the guarantee.
///
/// ```
/// use tower_sliding_window::redis::Leases;
///
/// let leases = Leases::new().with_share(8).with_keys(1 << 16);
/// assert_eq!((leases.share(), leases.keys()), (8, 65_536));
/// assert_eq!(Leases::default().share(), Leases::DEFAULT_SHARE);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leases {
    share: u32,
    keys: usize,
    clock_tolerance_ppm: u32,
}

impl Leases {
    /// A grant takes at most a quarter of what the window has left by default.
    pub const DEFAULT_SHARE: u32 = 4;
    /// Keys followed at once by default.
    pub const DEFAULT_KEYS: usize = 4096;
    /// How much faster Redis' clock may run than an instance's, by default:
    /// 20% (200 000 parts per million), more than two hosts whose NTP daemons
    /// slew their clocks in opposite directions at the fastest rate of
    /// ntpd's (500 ppm each) or chrony's (83 333 ppm each) defaults.
    pub const DEFAULT_CLOCK_TOLERANCE_PPM: u32 = 200_000;

    /// The default settings.
    pub const fn new() -> Leases {
        Leases {
            share: Leases::DEFAULT_SHARE,
            keys: Leases::DEFAULT_KEYS,
            clock_tolerance_ppm: Leases::DEFAULT_CLOCK_TOLERANCE_PPM,
        }
    }

    /// What one instance holds unused of a key, all its grants together, stays
    /// at most `1/share` of what the window has left after the check's own
    /// cost, its own unused units counted as left (default 4), so that one
    /// instance cannot take what the others need; 1 lets one instance hold
    /// all of it. [`build`](super::RedisStoreBuilder::build) rejects 0.
    pub const fn with_share(mut self, share: u32) -> Leases {
        self.share = share;
        self
    }

    /// See [`with_share`](Leases::with_share).
    pub const fn share(&self) -> u32 {
        self.share
    }

    /// How many keys this instance follows at once (default 4096, rounded up
    /// to a power of two): each takes an entry of about 100 bytes, and the key's
    /// bytes while it holds units. Keys that meet in an entry take turns.
    /// [`build`](super::RedisStoreBuilder::build) rejects 0.
    pub const fn with_keys(mut self, keys: usize) -> Leases {
        self.keys = keys;
        self
    }

    /// See [`with_keys`](Leases::with_keys).
    pub const fn keys(&self) -> usize {
        self.keys
    }

    /// How much faster, in parts per million, Redis' clock may run than this
    /// instance's over one bucket (default
    /// [`DEFAULT_CLOCK_TOLERANCE_PPM`](Leases::DEFAULT_CLOCK_TOLERANCE_PPM),
    /// 20%). The instance stops admitting from a grant once a bucket's time
    /// left, divided by `1 + ppm / 10⁶`, has passed here since it asked, so
    /// that the grant's bucket has not ended on Redis' clock yet: the fleet's
    /// guarantee holds as long as the clocks' rates differ by no more than
    /// this. NTP daemons slew a clock to correct it: ntpd by at most 500 ppm,
    /// chrony by up to 83 333 ppm by default (`maxslewrate`), so two hosts
    /// slewing in opposite directions differ by up to about 182 000 ppm. A
    /// larger tolerance ends grants earlier: a hot key then asks Redis for a
    /// few more, shorter grants as each bucket ends (about one more round
    /// trip per bucket for each factor of `1 + 10⁶ / ppm` between the bucket
    /// and a round trip). 0 suits instances on Redis' own host.
    pub const fn with_clock_tolerance_ppm(mut self, ppm: u32) -> Leases {
        self.clock_tolerance_ppm = ppm;
        self
    }

    /// See [`with_clock_tolerance_ppm`](Leases::with_clock_tolerance_ppm).
    pub const fn clock_tolerance_ppm(&self) -> u32 {
        self.clock_tolerance_ppm
    }

    /// How long a grant whose bucket had `valid` left on Redis' clock when
    /// the script ran may be used here, from when it was asked for.
    fn usable(&self, valid: Duration) -> Duration {
        let ns = valid.as_nanos() * 1_000_000 / (1_000_000 + u128::from(self.clock_tolerance_ppm));
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

impl Default for Leases {
    fn default() -> Leases {
        Leases::new()
    }
}

/// A grant is asked for only when this instance expects to use at least this
/// many units of the key in a bucket: a smaller one would save less than the
/// round trip its hand-back may cost.
const MIN_EXPECTED: f64 = 2.0;
/// A grant is renewed this long after its slot has ended on Redis' clock (at
/// the latest: the reply came after the script ran), so that the renewal
/// lands in the next slot. Timers fire to the millisecond.
const RENEW_GUARD: Duration = Duration::from_millis(1);

/// Units counted in Redis at `slot` of the key's `incarnation`: what a
/// hand-back or an undo gives back (Redis lowers a count only in the
/// incarnation of the key that counted the units).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    pub(crate) slot: u64,
    pub(crate) incarnation: u64,
    pub(crate) units: u32,
}

/// The units of one grant this instance still holds.
#[derive(Debug, Clone, Copy)]
struct Grant {
    slot: u64,
    incarnation: u64,
    left: u32,
    /// Admissions from the grant happen before this.
    expires: Instant,
    /// When its slot has ended in Redis: renew then.
    renew_at: Instant,
    /// What Redis had left after counting the grant, and when the key's
    /// window drains, for the decisions' headers.
    remaining: u32,
    reset_at: Instant,
}

#[derive(Debug, Default)]
struct Entry {
    hash: u64,
    /// The key, while the entry holds a grant or a task follows it.
    key: Option<Box<[u8]>>,
    grant: Option<Grant>,
    /// Units asked of this key here since `period_start`, and the rate of the
    /// period before (units a second).
    period_start: Option<Instant>,
    period_units: u64,
    prev_rate: f64,
    /// The last check of the key here.
    last_seen: Option<Instant>,
    /// A request for units is in flight (its reply will come back here).
    fetching: bool,
    /// A task renews the grant (or hands it back) when its slot ends.
    ticking: bool,
}

impl Entry {
    fn fresh(hash: u64) -> Entry {
        Entry {
            hash,
            ..Entry::default()
        }
    }

    fn is(&self, hash: u64, key: &[u8]) -> bool {
        self.hash == hash && self.key.as_deref().is_none_or(|k| k == key)
    }

    /// Whether another key may take the entry over.
    fn is_free(&self) -> bool {
        !self.fetching && !self.ticking && self.grant.is_none_or(|g| g.left == 0)
    }

    /// This key's rate here, in units a second: the greater of the last
    /// period's and the current one's, over at least `floor`.
    fn rate(&self, now: Instant, floor: Duration) -> f64 {
        let since = self.period_start.unwrap_or(now);
        let span = now.saturating_duration_since(since).max(floor);
        (self.period_units as f64 / span.as_secs_f64()).max(self.prev_rate)
    }

    fn roll(&mut self, now: Instant, floor: Duration) {
        let since = self.period_start.unwrap_or(now);
        let span = now.saturating_duration_since(since).max(floor);
        self.prev_rate = self.period_units as f64 / span.as_secs_f64();
        self.period_start = Some(now);
        self.period_units = 0;
    }

    /// The grant's units, taken away, if it has any.
    fn take_left(&mut self) -> Option<Counted> {
        let g = self.grant.as_mut()?;
        let left = std::mem::take(&mut g.left);
        (left > 0).then_some(Counted {
            slot: g.slot,
            incarnation: g.incarnation,
            units: left,
        })
    }
}

/// A check answered from a grant.
#[derive(Debug)]
pub(crate) struct Leased {
    pub(crate) slot: u64,
    pub(crate) incarnation: u64,
    /// Units the fleet had left at the grant, and this instance's rest of it.
    pub(crate) remaining: u32,
    pub(crate) reset: Duration,
    /// Fetch more in the background, at this rate.
    pub(crate) refill: Option<f64>,
}

/// What a check that goes to Redis asks for besides its cost.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ask {
    /// Units a second this instance expects of the key (0: no grant).
    pub(crate) rate: f64,
    /// Units it still holds unused of the key.
    pub(crate) have: u32,
    /// Units handed back in the same call.
    pub(crate) back: Option<Counted>,
}

/// A grant Redis answered, to be merged into the table.
pub(crate) struct Reply {
    pub(crate) slot: u64,
    pub(crate) incarnation: u64,
    /// Units beyond the check's cost.
    pub(crate) extra: u32,
    /// How long the slot lasted when the script ran.
    pub(crate) valid: Duration,
    pub(crate) sent: Instant,
    pub(crate) received: Instant,
    pub(crate) remaining: u32,
    pub(crate) reset: Duration,
}

impl Reply {
    /// The grant's extra units, to hand back.
    fn counted(&self) -> Counted {
        Counted {
            slot: self.slot,
            incarnation: self.incarnation,
            units: self.extra,
        }
    }
}

/// What the merge of a reply leaves to do.
#[derive(Debug, Default)]
pub(crate) struct Merged {
    /// Units this instance cannot hold (or no longer can use): hand them back.
    pub(crate) back: Vec<Counted>,
    /// Start a task that renews the grant at this time.
    pub(crate) tick: Option<Instant>,
    /// The grant the entry now holds is renewed then (`None`: none held).
    pub(crate) renew_at: Option<Instant>,
}

/// What the renewal task does when its time comes.
pub(crate) enum Tick {
    /// A newer grant came meanwhile: wait until it ends.
    Wait(Instant),
    /// Ask for the next slot's grant, handing back the last one's leftovers
    /// (the key was busy in the last bucket and still is).
    Renew { back: Option<Counted>, rate: f64 },
    /// The key went quiet (or leases were closed): hand back and stop.
    End { back: Option<Counted> },
}

pub(crate) struct LeaseTable {
    entries: Box<[Mutex<Entry>]>,
    hasher: foldhash::fast::RandomState,
    settings: Leases,
    share: u32,
    width: Duration,
    /// The shortest span a rate is measured over: a sixteenth of a bucket (at
    /// most 1 s), so that two requests close together are no flood.
    floor: Duration,
    open: AtomicBool,
}

impl LeaseTable {
    pub(crate) fn new(settings: Leases, width: Duration) -> LeaseTable {
        let size = settings.keys.max(1).next_power_of_two();
        LeaseTable {
            entries: (0..size).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            settings,
            share: settings.share.max(1),
            width,
            floor: (width / 16).min(Duration::from_secs(1)),
            open: AtomicBool::new(true),
        }
    }

    pub(crate) fn share(&self) -> u32 {
        self.share
    }

    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    fn entry(&self, hash: u64) -> MutexGuard<'_, Entry> {
        let i = hash as usize & (self.entries.len() - 1);
        self.entries[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether grants of `rate` are worth asking for.
    fn worth(&self, rate: f64) -> bool {
        self.open.load(Relaxed) && rate * self.width.as_secs_f64() >= MIN_EXPECTED
    }

    /// A check of `cost` units of `key`: admitted from a grant, or what to ask
    /// Redis for. The clock is read under the entry's lock, so that no check
    /// admits from a grant at an instant read before another (a renewal, a
    /// refill) replaced or handed it back.
    pub(crate) fn take(&self, key: &[u8], hash: u64, cost: u32) -> Result<Leased, Ask> {
        let mut e = self.entry(hash);
        let now = Instant::now();
        self.take_locked(&mut e, key, hash, cost, now)
    }

    /// [`take`](Self::take) at a given instant (for tests).
    #[cfg(test)]
    fn take_at(&self, key: &[u8], hash: u64, cost: u32, now: Instant) -> Result<Leased, Ask> {
        let mut e = self.entry(hash);
        self.take_locked(&mut e, key, hash, cost, now)
    }

    fn take_locked(
        &self,
        e: &mut Entry,
        key: &[u8],
        hash: u64,
        cost: u32,
        now: Instant,
    ) -> Result<Leased, Ask> {
        if !e.is(hash, key) {
            if !e.is_free() {
                return Err(Ask::default());
            }
            *e = Entry::fresh(hash);
        }
        self.keep_period(e, now);
        // The rate before this check: a first check is no sign of a busy key.
        let rate = e.rate(now, self.floor);
        e.period_units += u64::from(cost);
        e.last_seen = Some(now);
        if let Some(leased) = self.admit(e, cost, rate, now) {
            return Ok(leased);
        }
        // Not enough left for this check: the rest goes back in its call.
        let back = e.take_left();
        let lease = !e.fetching && self.worth(rate);
        e.fetching |= lease;
        Err(Ask {
            rate: if lease { rate } else { 0.0 },
            have: 0,
            back,
        })
    }

    /// [`take`](Self::take) for a caller that cannot wait for Redis: admitted
    /// from a grant, or nothing done (its `take` follows).
    pub(crate) fn take_held(&self, key: &[u8], hash: u64, cost: u32) -> Option<Leased> {
        let mut e = self.entry(hash);
        let now = Instant::now();
        if !e.is(hash, key) {
            return None;
        }
        e.grant.filter(|g| now < g.expires && g.left >= cost)?;
        self.keep_period(&mut e, now);
        let rate = e.rate(now, self.floor);
        e.period_units += u64::from(cost);
        e.last_seen = Some(now);
        self.admit(&mut e, cost, rate, now)
    }

    /// Start the entry's rate period, or a new one once it is a bucket old
    /// (so that a key long quiet and now busy is seen within a bucket).
    fn keep_period(&self, e: &mut Entry, now: Instant) {
        match e.period_start {
            None => e.period_start = Some(now),
            Some(since) if now.saturating_duration_since(since) >= self.width => {
                e.roll(now, self.floor)
            }
            Some(_) => {}
        }
    }

    /// `cost` units from the entry's grant, if it is in force and holds them.
    fn admit(&self, e: &mut Entry, cost: u32, rate: f64, now: Instant) -> Option<Leased> {
        let g = e
            .grant
            .as_mut()
            .filter(|g| now < g.expires && g.left >= cost)?;
        g.left -= cost;
        let (slot, incarnation, left, expires) = (g.slot, g.incarnation, g.left, g.expires);
        let remaining = g.remaining.saturating_add(left);
        let reset = g.reset_at.saturating_duration_since(now);
        let need = rate * expires.saturating_duration_since(now).as_secs_f64();
        let refill = !e.fetching && f64::from(left) < need / 2.0 && self.worth(rate);
        e.fetching |= refill;
        Some(Leased {
            slot,
            incarnation,
            remaining,
            reset,
            refill: refill.then_some(rate),
        })
    }

    /// The units of `key` this instance holds unused (and may still admit).
    pub(crate) fn have(&self, key: &[u8], hash: u64) -> u32 {
        let e = self.entry(hash);
        let now = Instant::now();
        match &e.grant {
            Some(g) if e.is(hash, key) && now < g.expires => g.left,
            _ => 0,
        }
    }

    /// A request that set `fetching` ended without a reply to merge.
    pub(crate) fn fetch_abandoned(&self, key: &[u8], hash: u64) {
        let mut e = self.entry(hash);
        if e.is(hash, key) {
            e.fetching = false;
        }
    }

    /// Merge Redis' answer to a request that asked for a grant (`fetching` was
    /// set for it). `ticker`: the renewal task's own request.
    pub(crate) fn granted(&self, key: &[u8], hash: u64, reply: Reply, ticker: bool) -> Merged {
        let mut merged = Merged::default();
        let mut e = self.entry(hash);
        if e.is(hash, key) {
            e.fetching = false;
        } else if reply.extra > 0 && e.is_free() {
            *e = Entry::fresh(hash);
        } else {
            if reply.extra > 0 {
                merged.back.push(reply.counted());
            }
            return merged;
        }
        if reply.extra > 0 && !self.open.load(Relaxed) {
            merged.back.push(reply.counted());
        } else if reply.extra > 0 {
            let grant = Grant {
                slot: reply.slot,
                incarnation: reply.incarnation,
                left: reply.extra,
                expires: reply.sent + self.settings.usable(reply.valid),
                renew_at: reply.received + reply.valid + RENEW_GUARD,
                remaining: reply.remaining,
                reset_at: reply.sent + reply.reset,
            };
            match e.grant.as_mut() {
                Some(g) if g.slot == grant.slot && g.incarnation == grant.incarnation => {
                    g.left += grant.left;
                    g.expires = g.expires.max(grant.expires);
                    g.renew_at = g.renew_at.max(grant.renew_at);
                    g.remaining = grant.remaining;
                    g.reset_at = grant.reset_at;
                }
                Some(g) if g.slot > grant.slot => merged.back.push(reply.counted()),
                _ => {
                    merged.back.extend(e.take_left());
                    e.grant = Some(grant);
                }
            }
            if e.key.is_none() {
                e.key = Some(key.into());
            }
        }
        merged.renew_at = e.grant.as_ref().filter(|g| g.left > 0).map(|g| g.renew_at);
        if ticker {
            e.ticking = merged.renew_at.is_some();
        } else if !e.ticking && merged.renew_at.is_some() {
            e.ticking = true;
            merged.tick = merged.renew_at;
        }
        merged
    }

    /// The renewal task's turn, at `now`.
    pub(crate) fn tick(&self, key: &[u8], hash: u64) -> Tick {
        let mut e = self.entry(hash);
        let now = Instant::now();
        self.tick_locked(&mut e, key, hash, now)
    }

    /// [`tick`](Self::tick) at a given instant (for tests).
    #[cfg(test)]
    fn tick_at(&self, key: &[u8], hash: u64, now: Instant) -> Tick {
        let mut e = self.entry(hash);
        self.tick_locked(&mut e, key, hash, now)
    }

    fn tick_locked(&self, e: &mut Entry, key: &[u8], hash: u64, now: Instant) -> Tick {
        if !e.is(hash, key) {
            return Tick::End { back: None };
        }
        if let Some(g) = &e.grant {
            if now < g.renew_at && self.open.load(Relaxed) {
                return Tick::Wait(g.renew_at);
            }
        }
        let back = e.take_left();
        e.grant = None;
        e.roll(now, self.floor);
        let rate = e.prev_rate;
        // Busy in the last bucket, and still: checked within three of its
        // intervals (a key gone quiet is not renewed on its past rate).
        let quiet_for = e
            .last_seen
            .map_or(Duration::MAX, |t| now.saturating_duration_since(t));
        let recent = quiet_for.as_secs_f64() * rate < 3.0 || quiet_for < self.floor;
        if !e.fetching && recent && self.worth(rate) {
            e.fetching = true;
            return Tick::Renew { back, rate };
        }
        e.ticking = false;
        e.key = None;
        Tick::End { back }
    }

    /// The renewal task could not ask Redis (it failed, or the breaker is
    /// open): it ends, and the next grant comes from a check's own call.
    pub(crate) fn renewal_failed(&self, key: &[u8], hash: u64) {
        let mut e = self.entry(hash);
        if e.is(hash, key) {
            e.fetching = false;
            e.ticking = false;
        }
    }

    /// Units counted at `back`'s slot and incarnation, undone (or not used
    /// after all): they go back into the grant if it is still the one in
    /// force and was counted there.
    pub(crate) fn give_back(&self, key: &[u8], back: Counted) -> bool {
        let hash = self.hash(key);
        let mut e = self.entry(hash);
        let now = Instant::now();
        if e.key.as_deref() != Some(key) || !self.open.load(Relaxed) {
            return false;
        }
        match e.grant.as_mut() {
            Some(g)
                if g.slot == back.slot && g.incarnation == back.incarnation && now < g.expires =>
            {
                g.left += back.units;
                true
            }
            _ => false,
        }
    }

    /// The units `key`'s grant holds, taken away (to be handed back).
    pub(crate) fn take_key(&self, key: &[u8]) -> Option<Counted> {
        let hash = self.hash(key);
        let mut e = self.entry(hash);
        if !e.is(hash, key) {
            return None;
        }
        e.take_left()
    }

    /// No more grants: take every unit held, to be handed back. Once this
    /// returns, no check admits from a grant of this table.
    pub(crate) fn close(&self) -> Vec<(Box<[u8]>, Counted)> {
        self.open.store(false, Relaxed);
        let mut out = Vec::new();
        for entry in self.entries.iter() {
            let mut e = entry.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(back) = e.take_left() {
                if let Some(key) = e.key.clone() {
                    out.push((key, back));
                }
            }
        }
        out
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table whose grants end 0.1% early (2 ms of the replies' 2 s).
    fn table() -> LeaseTable {
        let leases = Leases::new().with_keys(8).with_clock_tolerance_ppm(1000);
        LeaseTable::new(leases, Duration::from_secs(4))
    }

    fn counted(slot: u64, units: u32) -> Counted {
        Counted {
            slot,
            incarnation: 1,
            units,
        }
    }

    fn reply(slot: u64, extra: u32, sent: Instant) -> Reply {
        Reply {
            slot,
            incarnation: 1,
            extra,
            valid: Duration::from_secs(2),
            sent,
            received: sent + Duration::from_millis(1),
            remaining: 100,
            reset: Duration::from_secs(60),
        }
    }

    #[test]
    fn a_first_check_asks_for_its_cost_only_then_a_busy_key_asks_for_a_grant() {
        let t = table();
        let t0 = Instant::now();
        let h = t.hash(b"k");
        let ask = t.take_at(b"k", h, 1, t0).unwrap_err();
        assert_eq!(ask.rate, 0.0);
        // The second check 10 ms later: one unit over the floor of 250 ms
        // (a sixteenth of 4 s) is 4 a second: a grant is worth asking for.
        let ask = t
            .take_at(b"k", h, 1, t0 + Duration::from_millis(10))
            .unwrap_err();
        assert_eq!(ask.rate, 4.0);
        // Only one request for units at a time.
        let ask = t
            .take_at(b"k", h, 1, t0 + Duration::from_millis(20))
            .unwrap_err();
        assert_eq!(ask.rate, 0.0);
        // A key checked once in 3 s (1 s buckets): cold, no grant asked.
        let cold = LeaseTable::new(Leases::new(), Duration::from_secs(1));
        let c = cold.hash(b"c");
        for i in 0..5 {
            let ask = cold
                .take_at(b"c", c, 1, t0 + Duration::from_secs(3 * i))
                .unwrap_err();
            assert_eq!(ask.rate, 0.0, "check {i}");
        }
    }

    #[test]
    fn grants_are_admitted_until_they_expire_then_renewed_or_handed_back() {
        let t = table();
        let t0 = Instant::now();
        let h = t.hash(b"k");
        let merged = t.granted(b"k", h, reply(7, 3, t0), false);
        assert!(merged.back.is_empty());
        let tick = merged.tick.expect("a task renews the grant");
        assert!(tick > t0 + Duration::from_secs(2));
        for _ in 0..3 {
            let leased = t
                .take_at(b"k", h, 1, t0 + Duration::from_millis(5))
                .ok()
                .unwrap();
            assert_eq!(leased.slot, 7);
        }
        // Spent: the next check goes to Redis.
        assert!(t
            .take_at(b"k", h, 1, t0 + Duration::from_millis(6))
            .is_err());
        // Another key in the same table is not served from it.
        assert!(t.take_at(b"j", t.hash(b"j"), 1, t0).is_err());

        let t = table();
        t.granted(b"k", h, reply(7, 5, t0), false);
        // Expired (2 s / 1.001): not admitted, and the rest is handed back in
        // the check's own call (else the renewal task would).
        let ask = t
            .take_at(b"k", h, 1, t0 + Duration::from_millis(1999))
            .unwrap_err();
        assert_eq!(ask.back, Some(counted(7, 5)));
    }

    #[test]
    fn a_grant_ends_here_before_its_bucket_can_end_on_a_faster_clock() {
        let t0 = Instant::now();
        let usable = |ppm: u32| {
            let t = LeaseTable::new(
                Leases::new().with_clock_tolerance_ppm(ppm),
                Duration::from_secs(4),
            );
            let h = t.hash(b"k");
            t.granted(b"k", h, reply(7, 1_000_000, t0), false);
            let e = t.entry(h);
            e.grant.unwrap().expires - t0
        };
        // 2 s left on Redis' clock: used here for 2 s / 1.2, so that a Redis
        // clock running 20% faster is still inside the bucket.
        assert_eq!(
            usable(Leases::DEFAULT_CLOCK_TOLERANCE_PPM),
            Duration::from_nanos(1_666_666_666)
        );
        assert_eq!(usable(1000), Duration::from_nanos(1_998_001_998));
        assert_eq!(usable(0), Duration::from_secs(2));
        for ppm in [0, 1, 500, 1000, 83_333, 200_000, 1_000_000, u32::MAX] {
            let u = usable(ppm).as_secs_f64();
            // Redis' elapsed time over the grant's use, at the tolerated rate.
            assert!(u * (1.0 + f64::from(ppm) / 1e6) <= 2.0 + 1e-9, "{ppm}: {u}");
        }
    }

    #[test]
    fn the_renewal_task_hands_back_and_renews_a_busy_key_and_ends_for_a_quiet_one() {
        let t = table();
        let t0 = Instant::now();
        let h = t.hash(b"k");
        let merged = t.granted(b"k", h, reply(7, 50, t0), false);
        for i in 0..20 {
            t.take_at(b"k", h, 1, t0 + Duration::from_millis(i))
                .ok()
                .unwrap();
        }
        // The refill the checks started came back empty.
        t.fetch_abandoned(b"k", h);
        let at = merged.tick.unwrap();
        // Still busy as the bucket ends.
        t.take_at(b"k", h, 1, at - Duration::from_millis(10))
            .ok()
            .unwrap();
        match t.tick_at(b"k", h, at - Duration::from_millis(500)) {
            Tick::Wait(when) => assert_eq!(when, at),
            _ => panic!("too early"),
        }
        let (back, rate) = match t.tick_at(b"k", h, at) {
            Tick::Renew { back, rate } => (back, rate),
            _ => panic!("a busy key is renewed"),
        };
        assert_eq!(back, Some(counted(7, 29)));
        assert!(rate > 5.0, "{rate}");
        // The renewal brings nothing (near the limit): the task ends.
        let merged = t.granted(b"k", h, reply(8, 0, at), true);
        assert!(merged.renew_at.is_none());
        // Quiet since: the next turn ends it and forgets the key's bytes.
        let t2 = table();
        let merged = t2.granted(b"q", t2.hash(b"q"), reply(7, 4, t0), false);
        match t2.tick_at(b"q", t2.hash(b"q"), merged.tick.unwrap()) {
            Tick::End { back } => assert_eq!(back, Some(counted(7, 4))),
            _ => panic!("a quiet key is not renewed"),
        }
    }

    #[test]
    fn an_entry_holding_units_is_not_taken_over_and_closing_takes_every_unit() {
        let t = LeaseTable::new(Leases::new().with_keys(1), Duration::from_secs(4));
        let t0 = Instant::now();
        let (a, b) = (t.hash(b"a"), t.hash(b"b"));
        t.granted(b"a", a, reply(7, 5, t0), false);
        // One entry: "b" keeps asking Redis and cannot hold a grant here.
        assert_eq!(t.take_at(b"b", b, 1, t0).unwrap_err().rate, 0.0);
        let merged = t.granted(b"b", b, reply(7, 3, t0), false);
        assert_eq!(merged.back, vec![counted(7, 3)]);
        assert!(t.give_back(b"a", counted(7, 2)));
        assert!(!t.give_back(b"a", counted(6, 2)));
        // Units of another incarnation of the key were never counted in this
        // grant.
        let other = Counted {
            incarnation: 2,
            ..counted(7, 2)
        };
        assert!(!t.give_back(b"a", other));
        let held = t.close();
        assert_eq!(held.len(), 1);
        assert_eq!((&*held[0].0, held[0].1), (&b"a"[..], counted(7, 7)));
        // Closed: nothing goes back into a grant any more.
        assert!(!t.give_back(b"a", counted(7, 1)));
        // Closed: no more grants are asked for or kept.
        assert_eq!(
            t.granted(b"a", a, reply(7, 3, t0), false).back,
            vec![counted(7, 3)]
        );
    }
}

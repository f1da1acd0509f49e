//! The reference model and the request driver shared by the wait property
//! tests (`wait_model_prop.rs`, `wait_layer_model_prop.rs`).

use std::future::Future;
use std::time::Duration;
use tokio::time::{sleep_until, Instant};

/// What the test does with a request's future.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Await it to the end.
    Await,
    /// Drop it right after it was made, unpolled: must change nothing.
    DropAtOnce,
    /// Drop it at this instant (ms) if still pending then.
    CancelAt(u64),
    /// Stop polling it from the first instant to the second, then await it.
    Pause(u64, u64),
}

/// One policy's geometry, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Geo {
    pub limit: u32,
    pub width: u64,
    pub n: u64,
}

const MS: u64 = 1_000_000;

impl Geo {
    pub fn slot(&self, t: u64) -> u64 {
        t / self.width
    }

    /// The offset of the instant `t` ms in its bucket, in 1/2^16 of the
    /// bucket's width, rounded down.
    fn offset(&self, t: u64) -> u64 {
        (t % self.width) * (1 << 16) / self.width
    }

    /// The instant (ns) the units of slot `x`'s bucket, the newest admitted
    /// at `offset`, have all left the window: that admission's instant, to
    /// a step of the bucket, plus the window.
    fn leaves(&self, x: u64, offset: u64) -> u64 {
        let w = self.width * MS;
        let newest = ((offset as u128 + 1) * w as u128).div_ceil(1 << 16) as u64 - 1;
        (x + self.n) * w + newest
    }

    /// For each bucket of `records` (instant ms, cost) still counting at `t`
    /// ms: its units and when they leave (ns). A bucket counts until its
    /// newest admission has left the window.
    fn counting(&self, records: &[(u64, u32)], t: u64) -> Vec<(u64, u64)> {
        let mut buckets: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for &(rt, c) in records {
            let b = buckets.entry(self.slot(rt)).or_default();
            b.0 += c as u64;
            b.1 = b.1.max(self.offset(rt));
        }
        buckets
            .into_iter()
            .map(|(x, (units, offset))| (units, self.leaves(x, offset)))
            .filter(|&(units, leaves)| units > 0 && leaves > t * MS)
            .collect()
    }
}

impl Geo {
    /// Whether `cost` more fits this policy at `t`, given the (instant ms,
    /// cost) of every admission it counted.
    pub fn fits(&self, records: &[(u64, u32)], t: u64, cost: u32) -> bool {
        let used: u64 = self.counting(records, t).iter().map(|b| b.0).sum();
        used + cost as u64 <= self.limit as u64
    }
}

/// Whether `cost` more fits every policy at `t`, given for each policy the
/// (instant ms, cost) of every admission it counted. A record of no units
/// stands for units given back at once: their bucket keeps the instant as its
/// newest admission.
pub fn fits(geos: &[Geo], records: &[&[(u64, u32)]], t: u64, cost: u32) -> bool {
    geos.iter()
        .zip(records)
        .all(|(g, records)| g.fits(records, t, cost))
}

/// The earliest instant from `t0` at which `cost` more fits every policy:
/// when enough buckets have left, at the timer's next whole millisecond.
pub fn earliest(geos: &[Geo], records: &[&[(u64, u32)]], t0: u64, cost: u32) -> u64 {
    let mut t = t0;
    while !fits(geos, records, t, cost) {
        t = geos
            .iter()
            .zip(records)
            .flat_map(|(g, records)| g.counting(records, t))
            .map(|(_, leaves)| leaves.div_ceil(MS))
            .min()
            .unwrap();
    }
    t
}

/// Milliseconds from `start` to `t`, which must fall on a whole millisecond.
pub fn ms_since(start: Instant, t: Instant) -> u64 {
    let d = t - start;
    assert_eq!(d.subsec_nanos() % 1_000_000, 0, "instants on whole ms");
    d.as_millis() as u64
}

/// Poll `future` as `action` says (times in ms from `start`); `None` when it
/// was cancelled before it resolved. `DropAtOnce` is the caller's to handle.
pub async fn drive<F: Future + Unpin>(
    future: &mut F,
    action: Action,
    start: Instant,
) -> Option<F::Output> {
    let at = |ms: u64| start + Duration::from_millis(ms);
    match action {
        Action::CancelAt(ms) => tokio::select! {
            biased;
            _ = sleep_until(at(ms)) => None,
            output = &mut *future => Some(output),
        },
        Action::Pause(from, to) => tokio::select! {
            biased;
            _ = sleep_until(at(from)) => {
                sleep_until(at(to)).await;
                Some(future.await)
            }
            output = &mut *future => Some(output),
        },
        Action::Await | Action::DropAtOnce => Some(future.await),
    }
}

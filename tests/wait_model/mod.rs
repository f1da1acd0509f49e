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

impl Geo {
    pub fn slot(&self, t: u64) -> u64 {
        t / self.width
    }
}

/// Whether `cost` more fits every policy at `t`, given the (instant ms, cost)
/// of every admission: a unit recorded in slot `x` counts in slots `x..=x + N`.
pub fn fits(geos: &[Geo], records: &[(u64, u32)], t: u64, cost: u32) -> bool {
    geos.iter().all(|g| {
        let s = g.slot(t);
        let used: u64 = records
            .iter()
            .filter(|&&(rt, _)| g.slot(rt) + g.n >= s)
            .map(|&(_, c)| c as u64)
            .sum();
        used + cost as u64 <= g.limit as u64
    })
}

/// The earliest instant from `t0` at which `cost` more fits every policy.
pub fn earliest(geos: &[Geo], records: &[(u64, u32)], t0: u64, cost: u32) -> u64 {
    let mut t = t0;
    while !fits(geos, records, t, cost) {
        t = geos
            .iter()
            .map(|g| (g.slot(t) + 1) * g.width)
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

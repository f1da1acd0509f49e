//! Settlement against an exact model: random streams of reservations (a
//! request admitted through the layer), settlements by the request's
//! [`Settlement`] handle (give-backs, and charges past what was reserved),
//! requests leaving flight, and clock steps, under one or two policies.
//!
//! The model keeps each policy's units slot by slot, as the guide states the
//! rule: a reservation counts at its admission's slot, a charge at the slot
//! it is made in, each bucket keeping the offset of its newest reservation or
//! charge (in 1/2^16 of the bucket, rounded down), and a bucket counts until
//! that newest instant, to a step of the bucket, has left the window. A
//! give-back lowers the newest of the request's charges, then its
//! reservation, each only while its slot is inside the current span of N + 1
//! slots (the ring's buckets), and leaves the bucket's newest offset as it
//! was; so does a request one policy denies, given back by the others. Strict precision on a monotonic clock is exact, so after every step:
//!
//! - the layer admits exactly when every policy's current span plus the cost
//!   fits its limit, and each store reports the model's remaining units;
//! - the buckets counting hold at most `L` plus the units charged into them
//!   after the last admission counted in them, all of them excesses of
//!   requests in flight at that admission (the guide's guarantee);
//! - without charges (settlements never above the reservation) at most `L`.

use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::{key_fn, Limiter, ManualClock, Policy, Settlement, SlidingWindowLayer};

const WIDTH: u64 = 1_000_000; // 1 ms buckets

#[derive(Debug, Clone)]
enum Op {
    /// A request of this cost arrives.
    Reserve(u32),
    /// The in-flight request at this index (modulo) settles to a share (in
    /// 0..=8 eighths) of twice its reservation, or without charges of what
    /// it counts now.
    Settle(usize, u32),
    /// The in-flight request at this index (modulo) leaves flight.
    Finish(usize),
    /// The clock moves on by this many nanoseconds.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..=4).prop_map(Op::Reserve),
        3 => (any::<usize>(), 0u32..=8).prop_map(|(i, e)| Op::Settle(i, e)),
        1 => any::<usize>().prop_map(Op::Finish),
        3 => prop_oneof![0..WIDTH, WIDTH..4 * WIDTH, 4 * WIDTH..20 * WIDTH].prop_map(Op::Advance),
    ]
}

/// One policy's geometry: `limit` per `n` buckets of `WIDTH`.
#[derive(Debug, Clone, Copy)]
struct Shape {
    limit: u32,
    n: u64,
}

fn shape() -> impl Strategy<Value = Shape> {
    (4u32..=12, 1u64..=6).prop_map(|(limit, n)| Shape { limit, n })
}

/// One unit record: `units` at `slot`, counted by request `request`.
#[derive(Debug, Clone, Copy)]
struct Record {
    slot: u64,
    units: u64,
}

/// What one request counts under one policy.
#[derive(Debug, Clone, Default)]
struct Counted {
    reservation: Option<Record>,
    charges: Vec<Record>,
}

/// A bucket: its units, and the offset of its newest admission or charge.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    units: u64,
    newest: u64,
}

/// The offset of the instant `t` (ns) in its bucket, in 1/2^16 of the
/// bucket's width, rounded down.
fn offset(t: u64) -> u64 {
    (t % WIDTH) * (1 << 16) / WIDTH
}

/// One policy's units slot by slot, and when each was counted.
struct PolicyModel {
    shape: Shape,
    slots: BTreeMap<u64, Bucket>,
    /// The slots and step numbers of admissions, in order.
    admissions: Vec<(u64, usize)>,
    /// Charges: slot, step number, units, and the slot and step of the
    /// charging request's admission.
    charges: Vec<(u64, usize, u64, (u64, usize))>,
}

impl PolicyModel {
    /// The instant (ns) the bucket of slot `x` stops counting: its newest
    /// offset's last nanosecond plus the window.
    fn leaves(&self, x: u64, b: &Bucket) -> u64 {
        let newest = ((b.newest + 1) * WIDTH).div_ceil(1 << 16) - 1;
        (x + self.shape.n) * WIDTH + newest
    }

    /// The first slot whose bucket still counts at `t` (ns): buckets leave
    /// in slot order, so every later one counts too.
    fn first_counting(&self, t: u64) -> u64 {
        self.slots
            .iter()
            .find(|&(&x, b)| self.leaves(x, b) > t)
            .map_or(t / WIDTH + 1, |(&x, _)| x)
    }

    /// The units counting at `t` (ns).
    fn used(&self, t: u64) -> u64 {
        self.slots
            .range(self.first_counting(t)..)
            .map(|(_, b)| b.units)
            .sum()
    }

    /// Count `units` admitted or charged at `t` (ns).
    fn add(&mut self, t: u64, units: u64) {
        let b = self.slots.entry(t / WIDTH).or_default();
        b.units += units;
        b.newest = b.newest.max(offset(t));
    }

    fn in_span(&self, slot: u64, now: u64) -> bool {
        now - slot <= self.shape.n
    }

    fn take(&mut self, record: &mut Record, units: u64, now: u64) {
        if self.in_span(record.slot, now) {
            self.slots.get_mut(&record.slot).unwrap().units -= units;
        }
        record.units -= units;
    }

    /// Move `counted` to `target` units at `t` (ns; step `step`).
    fn settle(
        &mut self,
        counted: &mut Counted,
        target: u64,
        t: u64,
        step: usize,
        admitted: (u64, usize),
    ) {
        let now = t / WIDTH;
        let Some(mut reservation) = counted.reservation else {
            return;
        };
        let total = reservation.units + counted.charges.iter().map(|c| c.units).sum::<u64>();
        if target < total {
            let mut back = total - target;
            while back > 0 {
                let Some(mut last) = counted.charges.pop() else {
                    break;
                };
                let take = back.min(last.units);
                self.take(&mut last, take, now);
                if last.units > 0 {
                    counted.charges.push(last);
                }
                back -= take;
            }
            let take = back.min(reservation.units);
            self.take(&mut reservation, take, now);
            counted.reservation = Some(reservation);
        } else if target > total {
            let more = target - total;
            self.add(t, more);
            counted.charges.push(Record {
                slot: now,
                units: more,
            });
            self.charges.push((now, step, more, admitted));
        }
    }
}

struct InFlight {
    settlement: Settlement,
    reserved: u32,
    counted: Vec<Counted>,
    /// The slot and step of its admission.
    admitted: (u64, usize),
}

fn run(shapes: Vec<Shape>, ops: Vec<Op>, charges: bool) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let policies = shapes.iter().enumerate().map(|(i, s)| {
        Policy::builder()
            .name(format!("p{i}"))
            .limit(s.limit)
            .window(Duration::from_nanos(s.n * WIDTH))
            .buckets(s.n as u32)
            .build()
            .unwrap()
    });
    let layer = SlidingWindowLayer::builder(key_fn(|_: &Request<u32>| Some(0u8)))
        .cost(|req: &Request<u32>| *req.body())
        .policies(policies)
        .clock(clock.clone())
        .settle_later()
        .build()
        .unwrap();
    let handles: Arc<Mutex<Vec<Settlement>>> = Arc::default();
    let mut svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn({
            let handles = handles.clone();
            move |req: Request<u32>| {
                let settlement = req.extensions().get::<Settlement>().cloned();
                handles.lock().unwrap().extend(settlement);
                async { Ok::<_, Infallible>(Response::new(0u32)) }
            }
        }));
    let stores: Vec<&Limiter<u8, ManualClock>> = layer.stores().collect();
    let mut models: Vec<PolicyModel> = shapes
        .iter()
        .map(|&shape| PolicyModel {
            shape,
            slots: BTreeMap::new(),
            admissions: Vec::new(),
            charges: Vec::new(),
        })
        .collect();
    let mut flight: Vec<InFlight> = Vec::new();
    let mut t = 0u64;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (step, op) in ops.into_iter().enumerate() {
        let now = t / WIDTH;
        match op {
            Op::Reserve(cost) => {
                let fits_each: Vec<bool> = models
                    .iter()
                    .map(|m| m.used(t) + u64::from(cost) <= u64::from(m.shape.limit))
                    .collect();
                let fits = fits_each.iter().all(|&f| f);
                let response = runtime
                    .block_on(async { svc.ready().await?.call(Request::new(cost)).await })
                    .unwrap();
                let admitted = response.status() == StatusCode::OK;
                prop_assert_eq!(
                    admitted,
                    fits,
                    "step {}: cost {} at slot {}",
                    step,
                    cost,
                    now
                );
                if admitted {
                    let settlement = handles.lock().unwrap().pop().unwrap();
                    let mut counted = Vec::new();
                    for m in &mut models {
                        m.add(t, u64::from(cost));
                        m.admissions.push((now, step));
                        counted.push(Counted {
                            reservation: Some(Record {
                                slot: now,
                                units: u64::from(cost),
                            }),
                            charges: Vec::new(),
                        });
                    }
                    flight.push(InFlight {
                        settlement,
                        reserved: cost,
                        counted,
                        admitted: (now, step),
                    });
                } else {
                    // The policies that admitted it give the units back at
                    // once; their buckets keep its instant as their newest.
                    for (m, &fits) in models.iter_mut().zip(&fits_each) {
                        if fits {
                            m.add(t, 0);
                        }
                    }
                }
            }
            Op::Settle(i, eighths) if !flight.is_empty() => {
                let i = i % flight.len();
                let request = &mut flight[i];
                // Without charges a settlement only ever lowers the count.
                let first = &request.counted[0];
                let now_counted = first.reservation.map_or(0, |r| {
                    r.units + first.charges.iter().map(|c| c.units).sum::<u64>()
                });
                let most = if charges {
                    2 * request.reserved
                } else {
                    now_counted as u32
                };
                let target = most * eighths / 8;
                request.settlement.settle(target);
                for (m, counted) in models.iter_mut().zip(&mut request.counted) {
                    m.settle(counted, u64::from(target), t, step, request.admitted);
                }
            }
            Op::Finish(i) if !flight.is_empty() => {
                let i = i % flight.len();
                flight.swap_remove(i);
            }
            Op::Advance(by) => {
                t += by;
                clock.set(t);
            }
            _ => {}
        }
        // Every window as it is now.
        for (m, store) in models.iter().zip(&stores) {
            let limit = u64::from(m.shape.limit);
            let held = m.used(t);
            let remaining = store.peek(&0, 0).remaining();
            prop_assert_eq!(
                u64::from(remaining),
                limit.saturating_sub(held),
                "step {}",
                step
            );
            // The last admission counted now, and the charges since.
            let first = m.first_counting(t);
            let last_admission = m
                .admissions
                .iter()
                .rev()
                .find(|(slot, _)| *slot >= first)
                .map(|&(_, s)| s);
            let late: Vec<_> = m
                .charges
                .iter()
                .filter(|(slot, at, ..)| *slot >= first && last_admission.is_none_or(|a| *at > a))
                .collect();
            // Each late charge is an excess of a request admitted before the
            // last admission counted (or in a bucket no longer counted), so in
            // flight then.
            for (_, _, _, (slot, at)) in &late {
                match last_admission {
                    Some(a) => prop_assert!(*at <= a),
                    None => prop_assert!(*slot < first),
                }
            }
            let late: u64 = late.iter().map(|c| c.2).sum();
            prop_assert!(
                held <= limit + late,
                "step {}: {} units, limit {}, {} charged late",
                step,
                held,
                limit,
                late
            );
            if !charges {
                prop_assert!(
                    held <= limit,
                    "step {}: {} units without charges",
                    step,
                    held
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn give_backs_keep_every_window_within_the_limit(
        shapes in prop::collection::vec(shape(), 1..=2),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run(shapes, ops, false)?;
    }

    #[test]
    fn charges_pass_the_limit_only_by_excesses_of_requests_in_flight(
        shapes in prop::collection::vec(shape(), 1..=2),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run(shapes, ops, true)?;
    }
}

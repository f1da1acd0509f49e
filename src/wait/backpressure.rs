//! Readiness for a global (key-less) limit: the primitive behind `poll_ready`.
//!
//! A [`Backpressure`] is ready when it holds a reserved unit: an admitted
//! [`Decision`] that the next `call` spends. While the window is full it waits in
//! the limit's one FIFO queue (a [`WaitQueues`] with no bounds), so every clone
//! waiting on the same limit is woken in its turn, each through its own waker;
//! only the head of the queue holds a timer, set to the exact instant a unit
//! frees. A reservation that is never spent (the value is dropped) is given back
//! and the next waiter is woken to take it; a clone starts without one.

use crate::clock::{AutoClock, Clock};
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::wait::{Reservation, WaitConfig, WaitQueues, WaitRejected};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

/// One holder's readiness against a shared global limit.
///
/// ```
/// use std::future::poll_fn;
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_sliding_window::wait::Backpressure;
/// use tower_sliding_window::{Limiter, Policy};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 1 per 1.5 s.
/// let limiter = Arc::new(Limiter::new(Policy::per(1, Duration::from_millis(1500)).unwrap()).unwrap());
/// let mut ready = Backpressure::new(limiter);
/// poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap();
/// let unit = ready.take().unwrap(); // spent by the call
/// assert!(unit.is_allowed());
///
/// let start = tokio::time::Instant::now();
/// // Pending until the unit frees, 1.5 s after it (to a step of its bucket),
/// // at the timer's next millisecond.
/// poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap();
/// assert_eq!(tokio::time::Instant::now(), start + Duration::from_millis(1501));
/// drop(ready); // unspent: the unit is given back
/// # }
/// ```
pub struct Backpressure<C: Clock = AutoClock> {
    reservation: Reservation<(), WaitQueues<(), C>, Decision>,
}

impl<C: Clock> Backpressure<C> {
    /// Readiness against `limiter`, with its own unbounded FIFO queue. Clones
    /// share the queue.
    pub fn new(limiter: Arc<Limiter<(), C>>) -> Self {
        Backpressure::with_queue(Arc::new(WaitQueues::new(limiter, WaitConfig::unbounded())))
    }

    /// Readiness sharing an existing queue (every holder of one limit must share
    /// one queue for the FIFO order to span them all).
    pub fn with_queue(queue: Arc<WaitQueues<(), C>>) -> Self {
        Backpressure {
            reservation: Reservation::new(queue, ()),
        }
    }

    /// The queue this holder waits in.
    pub fn queue(&self) -> &Arc<WaitQueues<(), C>> {
        self.reservation.gate()
    }

    /// Ready once a unit is reserved for this holder; `Pending` (woken by a timer
    /// at the instant a unit frees, or when the holders ahead are served) until
    /// then. An error only for a queue with bounds (see [`WaitConfig`]).
    pub fn poll_reserve(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WaitRejected>> {
        self.reservation.poll_reserve(cx)
    }

    /// True when a unit is reserved.
    pub fn is_reserved(&self) -> bool {
        self.reservation.is_reserved()
    }

    /// Spend the reservation (for `call`). A unit counted in an earlier bucket is
    /// renewed first: spending it later could put more than the limit in some
    /// window, so it is given back and a unit is taken now, unless others are
    /// waiting or none is free, in which case this returns `None` and the caller
    /// must wait its turn (or reject). `None` as well without a reservation.
    pub fn take(&mut self) -> Option<Decision> {
        self.reservation.take()
    }
}

impl<C: Clock> Clone for Backpressure<C> {
    /// A clone shares the limit and its queue but starts without a reservation.
    fn clone(&self) -> Self {
        Backpressure {
            reservation: self.reservation.clone(),
        }
    }
}

impl<C: Clock> fmt::Debug for Backpressure<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backpressure")
            .field("reserved", &self.is_reserved())
            .finish_non_exhaustive()
    }
}

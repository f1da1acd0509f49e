//! Readiness for a global (key-less) limit: the primitive behind `poll_ready`.
//!
//! A [`Backpressure`] is ready when it holds a reserved unit: an admitted
//! [`Decision`] that the next `call` spends. While the window is full it waits in
//! the limit's one FIFO queue (a [`WaitQueues`] with no bounds), so every clone
//! waiting on the same limit is woken in its turn, each by its own waker; only the
//! head of the queue holds a timer, set to the exact instant a unit frees. A
//! reservation that is never spent (the value is dropped) is given back; a clone
//! starts without one.

use crate::clock::{Clock, TokioClock};
use crate::decision::Decision;
use crate::limiter::Limiter;
use crate::wait::{Acquire, WaitConfig, WaitQueues, WaitRejected};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// One holder's readiness against a shared global limit.
///
/// ```
/// use std::future::poll_fn;
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_sliding_window::{Backpressure, Limiter, Policy};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = Arc::new(Limiter::new(Policy::per(1, Duration::from_millis(1500)).unwrap()).unwrap());
/// let mut ready = Backpressure::new(limiter);
/// poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap();
/// let unit = ready.take().unwrap(); // spent by the call
/// assert!(unit.is_allowed());
///
/// let start = tokio::time::Instant::now();
/// poll_fn(|cx| ready.poll_reserve(cx)).await.unwrap(); // Pending until the unit frees
/// assert_eq!(tokio::time::Instant::now(), start + Duration::from_millis(1600));
/// drop(ready); // unspent: the unit is given back
/// # }
/// ```
pub struct Backpressure<C: Clock = TokioClock> {
    queue: Arc<WaitQueues<(), C>>,
    state: State<C>,
}

enum State<C: Clock> {
    Idle,
    Waiting(Acquire<(), C>),
    Reserved(Decision),
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
            queue,
            state: State::Idle,
        }
    }

    /// The queue this holder waits in.
    pub fn queue(&self) -> &Arc<WaitQueues<(), C>> {
        &self.queue
    }

    /// Ready once a unit is reserved for this holder; `Pending` (woken by a timer
    /// at the instant a unit frees, or when the holders ahead are served) until
    /// then. An error only for a queue with bounds (see [`WaitConfig`]).
    pub fn poll_reserve(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WaitRejected>> {
        loop {
            match &mut self.state {
                State::Reserved(_) => return Poll::Ready(Ok(())),
                State::Idle => self.state = State::Waiting(self.queue.acquire((), 1)),
                State::Waiting(waiter) => match Pin::new(waiter).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(unit)) => self.state = State::Reserved(unit),
                    Poll::Ready(Err(rejected)) => {
                        self.state = State::Idle;
                        return Poll::Ready(Err(rejected));
                    }
                },
            }
        }
    }

    /// True when a unit is reserved.
    pub fn is_reserved(&self) -> bool {
        matches!(self.state, State::Reserved(_))
    }

    /// Spend the reservation (for `call`). A unit counted in an earlier bucket is
    /// renewed first: spending it later could put more than the limit in some
    /// window, so it is given back and a unit is taken now, unless others are
    /// waiting or none is free, in which case this returns `None` and the caller
    /// must wait its turn (or reject). `None` as well without a reservation.
    pub fn take(&mut self) -> Option<Decision> {
        let State::Reserved(unit) = std::mem::replace(&mut self.state, State::Idle) else {
            return None;
        };
        let limiter = self.queue.limiter();
        let now_slot = limiter.geometry().slot(limiter.clock().now_nanos());
        if unit.slot >= now_slot {
            return Some(unit);
        }
        self.queue.release(&(), &unit);
        let renewal = self.queue.acquire((), 1);
        // Dropping a renewal that has to wait leaves the queue.
        renewal.decided().and_then(Result::ok)
    }
}

impl<C: Clock> Clone for Backpressure<C> {
    /// A clone shares the limit and its queue but starts without a reservation.
    fn clone(&self) -> Self {
        Backpressure::with_queue(Arc::clone(&self.queue))
    }
}

impl<C: Clock> Drop for Backpressure<C> {
    fn drop(&mut self) {
        if let State::Reserved(unit) = self.state {
            self.queue.release(&(), &unit);
        }
    }
}

impl<C: Clock> fmt::Debug for Backpressure<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Idle => "idle",
            State::Waiting(_) => "waiting",
            State::Reserved(_) => "reserved",
        };
        f.debug_struct("Backpressure")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

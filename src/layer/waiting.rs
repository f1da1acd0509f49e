//! The layer's waiting modes, [`OnLimit::Wait`](super::OnLimit::Wait) and
//! backpressure: the gate over a layer's policies (all-or-nothing, decided as
//! on the reject path), the unit `poll_ready` reserves, and what `call` does
//! while a request waits.
//!
//! The queues themselves are [`crate::wait`]'s; this module only adapts them
//! to the layer's shared state and its response future.

use super::decide::{act, ask_now_local, decide, give_back, queued_verdict, Action, Answers};
use super::future::{take_readied, ResponseFuture};
use super::local::{Admitted, LayerQueues};
use super::rejection::RejectionMode;
use super::service::Inner;
use super::settle::{self, Ledger};
use super::shared::{Shared, MAX_POLICIES};
use crate::decision::Decision;
use crate::extract::{KeyExtractor, KeyOf, Keyed};
use crate::ring::WindowSnapshot;
use crate::store::Store;
use crate::wait::WaitRejected;
use crate::wait::{fingerprint, release_unused, Denied, Gate, Reservation, Waiter};
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// The reservation a backpressured service holds between `poll_ready` and `call`.
pub(crate) type Ready<X, St, M> = Reservation<KeyOf<X>, Shared<X, St, M>, Admitted>;
/// Boxed in the service: axum clones a routed service for every request, and
/// inline a reservation would be most of the service's size in every mode.
pub(crate) type BoxedReady<X, St, M> = Box<Ready<X, St, M>>;

impl<X, St, M> Gate<KeyOf<X>> for Shared<X, St, M>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    type Admitted = Admitted;

    fn queues(&self) -> &LayerQueues<KeyOf<X>> {
        &self.wait
    }

    /// Every policy now, as the reject path decides; on a denial the others'
    /// units are given back and the denial with the longest wait is the one
    /// to wait on.
    fn try_admit(&self, key: &KeyOf<X>, cost: u32) -> Result<Admitted, Denied> {
        let mut answers: Answers = Default::default();
        ask_now_local(self, key, cost, &mut answers);
        let verdict = decide(&self.policies, key, &answers);
        let mut admitted: Admitted = [None; MAX_POLICIES];
        for (a, answer) in admitted.iter_mut().zip(&answers) {
            *a = match answer {
                Some(Ok(d)) => Some(*d),
                _ => None,
            };
        }
        match verdict {
            super::decide::Verdict::Allowed(_) => Ok(admitted),
            super::decide::Verdict::Limited(policy) => Err(Denied {
                policy,
                decision: admitted[policy].unwrap_or_else(|| unanswered(self)),
                gave_back: admitted.iter().any(|d| d.is_some_and(|d| d.is_allowed())),
            }),
            // Only in-memory limiters wait, and they always answer: a bug.
            _ => Err(Denied {
                policy: 0,
                decision: unanswered(self),
                gave_back: admitted.iter().any(|d| d.is_some_and(|d| d.is_allowed())),
            }),
        }
    }

    fn give_back(&self, key: &KeyOf<X>, admitted: &Admitted) {
        give_back(&self.policies, key, admitted.iter().map(Option::as_ref));
    }

    fn fingerprint(&self, admitted: &Admitted) -> u64 {
        fingerprint(
            admitted
                .iter()
                .take(self.policies.limits.len())
                .map(|d| d.map_or(0, |d| d.slot)),
        )
    }

    fn is_current(&self, admitted: &Admitted) -> bool {
        let Some(local) = self.local else {
            return false;
        };
        admitted
            .iter()
            .zip(self.policies.limits.iter())
            .all(|(d, limit)| d.is_none_or(|d| local(&limit.store).is_current(&d)))
    }

    fn spend(&self, key: &KeyOf<X>, admitted: &Admitted) -> bool {
        let Some(local) = self.local else {
            return false;
        };
        // All current first: a stale one is renewed, and none spent.
        self.is_current(admitted)
            && admitted
                .iter()
                .zip(self.policies.limits.iter())
                .all(|(d, limit)| d.is_none_or(|d| local(&limit.store).spend(key, &d)))
    }

    fn windows(&self, key: &KeyOf<X>) -> Vec<WindowSnapshot> {
        let Some(local) = self.local else {
            return Vec::new();
        };
        self.policies
            .limits
            .iter()
            .map(|limit| local(&limit.store).window_snapshot(key))
            .collect()
    }
}

/// The denial of a request the waiting gate could not check (a store that
/// is not in-memory: a bug). A cost above the limit: it is turned away at
/// once rather than queued.
fn unanswered<X: Keyed, St: Store<KeyOf<X>>, M>(shared: &Shared<X, St, M>) -> Decision {
    debug_assert!(false, "a waiting layer's store did not answer at once");
    let limit = shared
        .policies
        .limits
        .first()
        .map_or(0, |l| l.store.policy().limit());
    Decision::cost_exceeds_limit(limit, 0, std::time::Duration::ZERO)
}

/// Backpressure: `Pending` until a unit is reserved for the next call.
/// Ready at once in every other mode (no key to reserve under).
pub(crate) fn poll_reserve<X, St, M>(
    shared: &Arc<Shared<X, St, M>>,
    ready: &mut Option<BoxedReady<X, St, M>>,
    cx: &mut Context<'_>,
) -> Poll<()>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    // Set only under backpressure (not in a dry run).
    let Some(key) = &shared.reserve_key else {
        return Poll::Ready(());
    };
    let ready =
        ready.get_or_insert_with(|| Box::new(Reservation::new(Arc::clone(shared), key.clone())));
    // The queue is unbounded and a unit never exceeds a limit: no rejection.
    ready.poll_reserve(cx).map(|_| ())
}

/// Backpressure, once the inner service is ready: a reserved unit whose
/// bucket has passed meanwhile (the inner service took that long to be ready)
/// cannot be spent; it is renewed, at once or by waiting at the front of the
/// queue (it was reserved before every waiter there). True when it was stale,
/// so `poll_ready` polls the reservation again. False without a reservation.
#[inline]
pub(crate) fn renew_stale<X, St, M>(ready: &mut Option<BoxedReady<X, St, M>>) -> bool
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    match ready.as_mut() {
        Some(ready) => ready.renew_if_stale(),
        None => false,
    }
}

/// Backpressure: give back the unit `poll_ready` reserved, for a request that
/// is not counted (exempt, or without a key).
pub(crate) fn give_back_reservation<X: Keyed, St, M>(ready: &mut Option<BoxedReady<X, St, M>>) {
    if let Some(ready) = ready.as_mut() {
        ready.cancel();
    }
}

/// `call` in a waiting mode: spend the reserved unit (backpressure), or join
/// the key's queue: forward now, reject now, or wait in the response future
/// and then ready and call a clone of the inner service.
pub(crate) fn call<S, Req, X, St, M>(
    shared: &Arc<Shared<X, St, M>>,
    inner: &mut S,
    ready: &mut Option<BoxedReady<X, St, M>>,
    req: Req,
    key: KeyOf<X>,
    cost: u32,
) -> ResponseFuture<S::Future, M>
where
    S: Inner<Req>,
    Req: Send + 'static,
    X: KeyExtractor<Req>,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let reserved = match ready.as_mut() {
        // poll_ready reserved one unit; a costlier request waits for all of it.
        Some(ready) if cost == 1 => ready.take(),
        Some(ready) => {
            ready.cancel();
            None
        }
        None => None,
    };
    let mut waiter = match reserved {
        Some(admitted) => return respond_now(shared, inner, req, &key, cost, Ok(admitted)),
        None => Waiter::new(Arc::clone(shared), key.clone(), cost),
    };
    if let Some(result) = waiter.take_decided() {
        if result.is_err() {
            shared.events.wait_rejected();
        }
        return respond_now(shared, inner, req, &key, cost, result);
    }
    let started = shared.events.wait_started();
    // A clone, readied only once the request is admitted. The instance
    // poll_ready readied is dropped (a fresh clone takes its place), giving back
    // what it reserved, a ConcurrencyLimit permit or a Buffer slot: a waiting
    // request holds none of the inner service's capacity, which other keys'
    // requests (or, on a reused service, this request's own clone) need.
    drop(take_readied(inner));
    let mut inner = inner.clone();
    let shared = Arc::clone(shared);
    ResponseFuture::deciding(Box::pin(async move {
        let mut waiter = waiter;
        // The admission (or rejection), and whether the inner service failed.
        let (result, failed) = loop {
            let admitted = match (&mut waiter).await {
                Ok(admitted) => admitted,
                Err(rejection) => {
                    shared.events.wait_rejected();
                    break (Err(rejection), None);
                }
            };
            // Admitted, but not sent until the inner service is ready: if this
            // future is dropped (or the inner service fails) before the call,
            // the request never ran, so its units are given back.
            let unsent = Unsent {
                gate: &*shared,
                key: &key,
                admitted: Some(admitted),
            };
            let failed = std::future::poll_fn(|cx| inner.poll_ready(cx)).await.err();
            if failed.is_some() {
                break (Ok(unsent.release()), failed);
            }
            let admitted = unsent.disarm();
            if shared.spend(&key, &admitted) {
                shared.events.waited(started);
                break (Ok(admitted), None);
            }
            // Ready only after its bucket: sent now, the request would count in
            // no window. Renew the admission (at once, or by waiting again),
            // ahead of the key's waiters: it was admitted before any of them.
            // The readied instance is kept: at the front of the queue the wait
            // ends when units leave the window (at most one window), while a
            // fresh clone could take longer than a window to be ready, and the
            // key's waiters would take each other's units forever.
            waiter = Waiter::renew(Arc::clone(&shared), key.clone(), cost, &admitted);
        };
        let ledger = admitted_ledger(&shared, &key, cost, &result);
        let headers = match outcome::<S, Req, X, St, M>(&shared, &req, &key, result) {
            Action::Forward(headers) => headers,
            Action::Reject(output) => return output,
        };
        if let Some(e) = failed {
            // Never sent: its units were given back (`Unsent::release`).
            return M::finish(Err(e), headers);
        }
        drop(failed); // None: not held across the call (S::Error need not be Send)
        M::finish(settle::call(ledger, &mut inner, req).await, headers)
    }))
}

/// An admission not yet sent: given back if dropped before [`Unsent::disarm`].
struct Unsent<'a, K: Hash + Eq + Clone, G: Gate<K>> {
    gate: &'a G,
    key: &'a K,
    admitted: Option<G::Admitted>,
}

impl<K: Hash + Eq + Clone, G: Gate<K>> Unsent<'_, K, G> {
    fn disarm(mut self) -> G::Admitted {
        self.admitted.take().expect("disarmed once")
    }

    /// Give the units back now; the admission is still reported.
    fn release(mut self) -> G::Admitted {
        let admitted = self.admitted.take().expect("released once");
        release_unused(self.gate, self.key, &admitted);
        admitted
    }
}

impl<K: Hash + Eq + Clone, G: Gate<K>> Drop for Unsent<'_, K, G> {
    fn drop(&mut self) {
        if let Some(admitted) = self.admitted.take() {
            release_unused(self.gate, self.key, &admitted);
        }
    }
}

fn respond_now<S, Req, X, St, M>(
    shared: &Arc<Shared<X, St, M>>,
    inner: &mut S,
    req: Req,
    key: &KeyOf<X>,
    cost: u32,
    result: Result<Admitted, WaitRejected>,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    S::Future: Send + 'static,
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let ledger = admitted_ledger(shared, key, cost, &result);
    match outcome::<S, Req, X, St, M>(shared, &req, key, result) {
        Action::Forward(headers) => match ledger {
            Some(ledger) => settle::forward::<S, Req, X, St, M>(ledger, inner, req, headers),
            None => ResponseFuture::forward(inner, req, headers),
        },
        Action::Reject(output) => ResponseFuture::rejected(output),
    }
}

/// The ledger of a request the queue admitted, if the layer settles: its
/// reservation is what the waiter was admitted with.
fn admitted_ledger<X, St, M>(
    shared: &Arc<Shared<X, St, M>>,
    key: &KeyOf<X>,
    cost: u32,
    result: &Result<Admitted, WaitRejected>,
) -> Option<Arc<Ledger<X, St, M>>>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    let admitted = result.as_ref().ok()?;
    settle::ledger_for(
        shared,
        &shared.policies,
        true,
        key,
        cost,
        admitted.iter().map(Option::as_ref),
    )
}

/// What the queue decided, as the reject path would act on it: headers of the
/// policy closest to its limit, or the rejection naming the policy that binds.
fn outcome<S, Req, X, St, M>(
    shared: &Shared<X, St, M>,
    req: &Req,
    key: &KeyOf<X>,
    result: Result<Admitted, WaitRejected>,
) -> Action<M::Response, M::Error>
where
    S: Service<Req>,
    X: Keyed,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let mut answers: Answers = Default::default();
    let outcome = match &result {
        Ok(admitted) => Ok(admitted),
        Err(rejection) => Err((rejection.policy, rejection.decision)),
    };
    let verdict = queued_verdict(&shared.policies, key, outcome, &mut answers);
    act::<Req, S, X, St, M>(shared, &shared.policies, req, key, verdict, &answers)
}

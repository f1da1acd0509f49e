//! The layer's waiting modes, [`OnLimit::Wait`] and [`OnLimit::Backpressure`]:
//! the gate over a layer's policies (all-or-nothing, like the reject path), the
//! unit `poll_ready` reserves, and what `call` does while a request waits.
//!
//! The queues themselves are [`crate::wait`]'s; this module only adapts them to
//! the layer's shared state and its response future.

use crate::decision::Decision;
use crate::error::ConfigError;
use crate::extract::KeyExtractor;
use crate::future::ResponseFuture;
use crate::layer::{
    Exemption, Limit, OnLimit, RequestCost, Shared, SlidingWindowLayer, MAX_POLICIES,
};
use crate::mode::RejectionMode;
use crate::service::{act, decide, Action, Answers, SlidingWindow, Verdict};
use crate::store::Store;
use crate::wait::{
    fingerprint, release_unused, Denied, Gate, Queues, Rejection, Reservation, WaitConfig,
    WaitStats, Waiter, WindowSnapshot,
};
use std::any::Any;
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// An admission through every policy of a layer: each policy's decision.
pub(crate) type Admitted = [Option<Decision>; MAX_POLICIES];

/// A layer's wait queues.
pub(crate) type LayerQueues<K> = Queues<K, Admitted>;

/// The reservation a backpressured service holds between `poll_ready` and `call`.
pub(crate) type Ready<K, X, St, M, Co, Ex> = Reservation<K, Shared<K, X, St, M, Co, Ex>, Admitted>;
/// Boxed in the service: axum clones a routed service for every request, and
/// inline a reservation would be most of the service's size in every mode.
pub(crate) type BoxedReady<K, X, St, M, Co, Ex> = Box<Ready<K, X, St, M, Co, Ex>>;

/// The queues for `on_limit`, and the global key when there is one; checks that
/// a waiting mode can work with these stores and this key type.
pub(crate) fn configure<K, St>(
    on_limit: OnLimit,
    limits: &[Limit<St>],
) -> Result<(LayerQueues<K>, Option<K>), ConfigError>
where
    K: Hash + Eq + Clone + 'static,
    St: Store<K>,
{
    let config = match on_limit {
        OnLimit::Wait {
            max_wait,
            max_queue,
        } => WaitConfig::bounded(max_wait, max_queue)?,
        OnLimit::Reject | OnLimit::Backpressure => WaitConfig::unbounded(),
    };
    let waits = on_limit != OnLimit::Reject;
    if waits && limits.iter().any(|l| l.store.local().is_none()) {
        return Err(ConfigError::Invalid(
            "OnLimit::Wait and OnLimit::Backpressure need in-memory limiters (policy(), or \
             Limiter stores): a remote store cannot tell when a unit frees",
        ));
    }
    // A global limit is keyed by `()`: the only key `poll_ready` can know.
    let global_key = (Box::new(()) as Box<dyn Any>)
        .downcast::<K>()
        .ok()
        .map(|key| *key);
    if on_limit == OnLimit::Backpressure && global_key.is_none() {
        return Err(ConfigError::Invalid(
            "OnLimit::Backpressure needs a global limit (GlobalKey): poll_ready sees no \
             request, so it cannot hold back one key; for a keyed limit use OnLimit::Wait",
        ));
    }
    Ok((Queues::new(config), global_key))
}

/// True when over-limit requests wait rather than being rejected. A dry run
/// never holds anything back.
#[inline]
pub(crate) fn waits<K, X, St, M, Co, Ex>(shared: &Shared<K, X, St, M, Co, Ex>) -> bool {
    shared.on_limit.waits(shared.dry_run)
}

impl<K, X, St, M, Co, Ex> Gate<K> for Shared<K, X, St, M, Co, Ex>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: Send + Sync + 'static,
    St: Store<K>,
    M: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    Ex: Send + Sync + 'static,
{
    type Admitted = Admitted;

    fn queues(&self) -> &LayerQueues<K> {
        &self.wait
    }

    /// Every policy now; on a denial the others' units are given back and the
    /// denial with the longest wait is the one to wait on.
    fn try_admit(&self, key: &K, cost: u32) -> Result<Admitted, Denied> {
        let mut admitted: Admitted = [None; MAX_POLICIES];
        let mut denied: Option<Denied> = None;
        for (i, limit) in self.limits.iter().enumerate() {
            // build() only accepts in-memory stores for the waiting modes.
            let Some(local) = limit.store.local() else {
                continue;
            };
            let decision = local.check_n(key, cost);
            if decision.is_allowed() {
                admitted[i] = Some(decision);
                continue;
            }
            let longer = denied.map_or(true, |best| {
                match (decision.retry_after(), best.decision.retry_after()) {
                    (_, None) => false,
                    (None, _) => true,
                    (wait, best) => wait > best,
                }
            });
            if longer {
                denied = Some(Denied {
                    policy: i,
                    decision,
                    gave_back: false,
                });
            }
        }
        match denied {
            None => Ok(admitted),
            Some(denied) => {
                self.give_back(key, &admitted);
                Err(Denied {
                    gave_back: admitted.iter().any(Option::is_some),
                    ..denied
                })
            }
        }
    }

    fn give_back(&self, key: &K, admitted: &Admitted) {
        for (decision, limit) in admitted.iter().zip(self.limits.iter()) {
            if let Some(decision) = decision {
                limit.store.undo(key, decision);
            }
        }
    }

    fn fingerprint(&self, admitted: &Admitted) -> u64 {
        fingerprint(
            admitted
                .iter()
                .take(self.limits.len())
                .map(|d| d.map_or(0, |d| d.slot)),
        )
    }

    fn is_current(&self, admitted: &Admitted) -> bool {
        admitted
            .iter()
            .zip(self.limits.iter())
            .all(|(d, limit)| match (d, limit.store.local()) {
                (Some(d), Some(local)) => local.is_current(d),
                _ => true,
            })
    }

    fn windows(&self, key: &K) -> Vec<WindowSnapshot> {
        self.limits
            .iter()
            .filter_map(|l| l.store.local())
            .map(|local| local.window_snapshot(key))
            .collect()
    }
}

/// `OnLimit::Backpressure`: `Pending` until a unit is reserved for the next
/// call. Ready at once in every other mode (`poll_ready` only calls it under
/// backpressure).
pub(crate) fn poll_reserve<S, K, X, St, M, Co, Ex>(
    svc: &mut SlidingWindow<S, K, X, St, M, Co, Ex>,
    cx: &mut Context<'_>,
) -> Poll<()>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: Send + Sync + 'static,
    St: Store<K>,
    M: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    Ex: Send + Sync + 'static,
{
    let shared = &svc.layer.shared;
    // Set only under Backpressure (not in a dry run): every other layer is
    // ready at once.
    let Some(key) = &shared.reserve_key else {
        return Poll::Ready(());
    };
    let ready = svc
        .ready
        .get_or_insert_with(|| Box::new(Reservation::new(Arc::clone(shared), key.clone())));
    // The queue is unbounded and a unit never exceeds a limit: no rejection.
    ready.poll_reserve(cx).map(|_| ())
}

/// `OnLimit::Backpressure`, once the inner service is ready: a reserved unit
/// whose bucket has passed meanwhile (the inner service took that long to be
/// ready) cannot be spent; it is renewed, at once or by waiting at the front of
/// the queue (it was reserved before every waiter there). True when it was
/// stale, so `poll_ready` polls the reservation again. False at once in every
/// other mode (no reservation).
#[inline]
pub(crate) fn renew_stale<S, K, X, St, M, Co, Ex>(
    svc: &mut SlidingWindow<S, K, X, St, M, Co, Ex>,
) -> bool
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: Send + Sync + 'static,
    St: Store<K>,
    M: Send + Sync + 'static,
    Co: Send + Sync + 'static,
    Ex: Send + Sync + 'static,
{
    match svc.ready.as_mut() {
        Some(ready) => ready.renew_if_stale(),
        None => false,
    }
}

/// `call` in a waiting mode: spend the reserved unit (backpressure), or join the
/// key's queue: forward now, reject now, or wait in the response future and then
/// ready and call a clone of the inner service.
pub(crate) fn call<S, Req, K, X, St, M, Co, Ex>(
    svc: &mut SlidingWindow<S, K, X, St, M, Co, Ex>,
    req: Req,
    key: K,
    cost: u32,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    Req: Send + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: KeyExtractor<Req, Key = K>,
    St: Store<K>,
    M: RejectionMode<Req, S>,
    Co: RequestCost<Req>,
    Ex: Exemption<Req>,
{
    let shared = Arc::clone(&svc.layer.shared);
    let reserved = match svc.ready.as_mut() {
        // poll_ready reserved one unit; a costlier request waits for all of it.
        Some(ready) if cost == 1 => ready.take(),
        Some(ready) => {
            ready.cancel();
            None
        }
        None => None,
    };
    let mut waiter = match reserved {
        Some(admitted) => return respond_now(svc, &shared, req, &key, Ok(admitted)),
        None => Waiter::new(Arc::clone(&shared), key.clone(), cost),
    };
    if let Some(result) = waiter.take_decided() {
        return respond_now(svc, &shared, req, &key, result);
    }
    // A clone, readied only once the request is admitted. The instance
    // poll_ready readied is dropped (a fresh clone takes its place), giving back
    // what it reserved, a ConcurrencyLimit permit or a Buffer slot: a waiting
    // request holds none of the inner service's capacity, which other keys'
    // requests (or, on a reused service, this request's own clone) need.
    drop(svc.take_ready_inner());
    let mut inner = svc.inner.clone();
    ResponseFuture::deciding(Box::pin(async move {
        let mut waiter = waiter;
        // The admission (or rejection), and whether the inner service failed.
        let (result, failed) = loop {
            let admitted = match (&mut waiter).await {
                Ok(admitted) => admitted,
                Err(rejection) => break (Err(rejection), None),
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
            if shared.is_current(&admitted) {
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
        let headers = match outcome::<S, Req, K, X, St, M, Co, Ex>(&shared, &req, &key, result) {
            Action::Forward(headers) => headers,
            Action::Reject(output) => return output,
        };
        if let Some(e) = failed {
            return M::finish(Err(e), headers);
        }
        drop(failed); // None: not held across the call (S::Error need not be Send)
        M::finish(inner.call(req).await, headers)
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

fn respond_now<S, Req, K, X, St, M, Co, Ex>(
    svc: &mut SlidingWindow<S, K, X, St, M, Co, Ex>,
    shared: &Shared<K, X, St, M, Co, Ex>,
    req: Req,
    key: &K,
    result: Result<Admitted, Rejection>,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    S::Future: Send + 'static,
    St: Store<K>,
    M: RejectionMode<Req, S>,
{
    match outcome::<S, Req, K, X, St, M, Co, Ex>(shared, &req, key, result) {
        Action::Forward(headers) => svc.forward(req, headers),
        Action::Reject(output) => ResponseFuture::rejected(output),
    }
}

/// What the queue decided, as the reject path would act on it: headers of the
/// policy closest to its limit, or the rejection naming the policy that binds.
fn outcome<S, Req, K, X, St, M, Co, Ex>(
    shared: &Shared<K, X, St, M, Co, Ex>,
    req: &Req,
    key: &K,
    result: Result<Admitted, Rejection>,
) -> Action<M::Response, M::Error>
where
    S: Service<Req>,
    St: Store<K>,
    M: RejectionMode<Req, S>,
{
    let mut answers: Answers = Default::default();
    let verdict = match result {
        Ok(admitted) => {
            for (answer, decision) in answers.iter_mut().zip(admitted) {
                *answer = decision.map(Ok);
            }
            decide(shared, key, &answers)
        }
        Err(rejection) => {
            let policy = rejection.policy.min(shared.limits.len().saturating_sub(1));
            answers[policy] = Some(Ok(rejection.decision));
            Verdict::Limited(policy)
        }
    };
    act::<Req, S, K, X, St, M, Co, Ex>(shared, req, key, verdict, &answers)
}

impl<K, X, St, M, Co, Ex> SlidingWindowLayer<K, X, St, M, Co, Ex>
where
    K: Hash + Eq + Clone,
{
    /// Totals of the waiting modes: admissions at once and after a wait,
    /// rejections by reason, cancellations, timers (all zero in reject mode).
    pub fn wait_stats(&self) -> WaitStats {
        self.shared.wait.stats()
    }
}

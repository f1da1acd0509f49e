//! The service: key the request, decide with every policy, forward or reject.
//!
//! One request goes: exemption → key (or the `MissingKey` outcome) → cost →
//! every store's `check_now` → [`decide`] (all-or-nothing, picks the policy to
//! report) → [`act`] (forward with headers, or reject per [`OnLimit`]). A store
//! that cannot answer at once moves the rest into the response future
//! (`decide_later`); everything after the answers is the same code.
//!
//! The waiting modes (`OnLimit::Wait`, `OnLimit::Backpressure`) branch off
//! after the cost into [`crate::waiting`]: the request joins its key's queue
//! (which checks the same stores, all-or-nothing) and is forwarded, rejected
//! through [`act`], or waits in the response future. Backpressure also holds
//! `poll_ready` until a unit is reserved.

use crate::decision::{Decision, Outcome};
use crate::extract::KeyExtractor;
use crate::future::ResponseFuture;
use crate::layer::{
    Exemption, MissingKey, NoExemption, OnLimit, RequestCost, Shared, SlidingWindowLayer, UnitCost,
    MAX_POLICIES,
};
use crate::limiter::Limiter;
use crate::mode::{HttpRejection, Rejection, RejectionMode};
use crate::response::RateLimitHeaders;
use crate::stats::bump;
use crate::store::{Store, StoreError};
use std::fmt;
use std::future::{poll_fn, Future};
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// A service rate-limited by a [`SlidingWindowLayer`].
///
/// `poll_ready` is the inner service's (with [`OnLimit::Backpressure`], it is
/// first `Pending` until a unit is reserved for the next `call`), as tower's
/// own middleware does: backpressure from below reaches the caller. The limit
/// is decided in `call`, so a request is never counted while it waits for the
/// inner service; but while the inner service is not ready (a saturated
/// `ConcurrencyLimit` below), a request over the limit waits there for its
/// answer too. `call` never panics, even when `poll_ready` was skipped.
///
/// With the in-memory [`Limiter`] (or any store that answers through
/// [`Store::check_now`]) the decision is made inside `call`: an allowed request
/// goes straight to the inner service, a rejected one gets a ready response,
/// and nothing is allocated or boxed on either path (but with
/// [`headers_on_allowed`](crate::SlidingWindowLayerBuilder::headers_on_allowed),
/// where an allowed request's future is boxed with its headers). A store that answers later
/// is awaited in the response future; the inner service readied by
/// `poll_ready` moves into that future and a clone takes its place, which is
/// why the inner service must be `Clone` (axum, hyper and tonic services are;
/// wrap others in tower's `Buffer`). For one tonic service among several, wrap
/// it with `tonic::service::LayerExt::named_layer`, which keeps its name.
pub struct SlidingWindow<
    S,
    K,
    X,
    St = Limiter<K, crate::AutoClock>,
    M = HttpRejection,
    Co = UnitCost,
    Ex = NoExemption,
> {
    pub(crate) inner: S,
    pub(crate) layer: SlidingWindowLayer<K, X, St, M, Co, Ex>,
    /// `OnLimit::Backpressure`: the unit `poll_ready` reserved for `call`.
    pub(crate) ready: Option<crate::waiting::BoxedReady<K, X, St, M, Co, Ex>>,
}

impl<S, K, X, St, M, Co, Ex> SlidingWindow<S, K, X, St, M, Co, Ex> {
    /// Wrap `inner`, sharing `layer`'s limiters.
    pub fn new(inner: S, layer: SlidingWindowLayer<K, X, St, M, Co, Ex>) -> Self {
        SlidingWindow {
            inner,
            layer,
            ready: None,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The layer this service shares its limiters with (to read their stats).
    pub fn layer(&self) -> &SlidingWindowLayer<K, X, St, M, Co, Ex> {
        &self.layer
    }
}

impl<S: Clone, K, X, St, M, Co, Ex> Clone for SlidingWindow<S, K, X, St, M, Co, Ex> {
    fn clone(&self) -> Self {
        SlidingWindow {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
            // A clone starts without a reservation.
            ready: None,
        }
    }
}

impl<S: fmt::Debug, K, X, St, M, Co, Ex> fmt::Debug for SlidingWindow<S, K, X, St, M, Co, Ex> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindow")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

/// Backpressure: give back the unit `poll_ready` reserved, for a request that
/// is not counted (exempt, or without a key).
fn give_back_reservation<K, X, St, M, Co, Ex>(
    ready: &mut Option<crate::waiting::BoxedReady<K, X, St, M, Co, Ex>>,
) {
    if let Some(ready) = ready.as_mut() {
        ready.cancel();
    }
}

/// Each policy's answer; `None` for a store not asked (yet).
pub(crate) type Answers = [Option<Result<Decision, StoreError>>; MAX_POLICIES];

/// The all-or-nothing outcome over every policy, naming the policy to report.
pub(crate) enum Verdict {
    Allowed(usize),
    Limited(usize),
    StoreDown(usize),
}

/// What to do with the request.
// Short-lived: the headers move straight into the response future.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Action<T, E> {
    Forward(Option<RateLimitHeaders>),
    Reject(Result<T, E>),
}

impl<S, K, X, St, M, Co, Ex> SlidingWindow<S, K, X, St, M, Co, Ex> {
    /// `OnLimit::Backpressure`: ready once a unit is reserved for the next
    /// call and the inner service is ready. A unit reserved in a bucket that
    /// passed before the inner service was ready is renewed first, ahead of the
    /// waiters behind it (it was reserved before them), so that `call` spends a
    /// current one; the renewal may wait, keeping the inner service's readiness
    /// (a `ConcurrencyLimit` permit, say).
    #[inline(never)]
    fn poll_ready_reserving<Req>(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), <Self as Service<Req>>::Error>>
    where
        Self: Service<Req>,
        S: Service<Req>,
        K: Hash + Eq + Clone + Send + Sync + 'static,
        X: Send + Sync + 'static,
        St: Store<K>,
        M: RejectionMode<Req, S, Error = <Self as Service<Req>>::Error>,
        Co: Send + Sync + 'static,
        Ex: Send + Sync + 'static,
    {
        loop {
            if crate::waiting::poll_reserve(self, cx).is_pending() {
                return Poll::Pending;
            }
            if let Err(error) = std::task::ready!(self.inner.poll_ready(cx)) {
                return Poll::Ready(Err(M::map_error(error)));
            }
            if !crate::waiting::renew_stale(self) {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<S, Req, K, X, St, M, Co, Ex> Service<Req> for SlidingWindow<S, K, X, St, M, Co, Ex>
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
    type Response = M::Response;
    type Error = M::Error;
    type Future = ResponseFuture<S::Future, M>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Backpressure (the only mode with a key to reserve under, and not in a
        // dry run): ready once a unit is reserved for the next call; other
        // modes never hold a request back here.
        if self.layer.shared.reserve_key.is_some() {
            return self.poll_ready_reserving(cx);
        }
        self.inner.poll_ready(cx).map_err(M::map_error)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let shared = &*self.layer.shared;
        if shared.exempt.is_exempt(&req) {
            // Backpressure reserved a unit in poll_ready: not this request's.
            give_back_reservation(&mut self.ready);
            return ResponseFuture::forwarded(self.inner.call(req));
        }
        let key = match shared.extractor.extract(&req) {
            Some(key) => key,
            None => match &shared.missing_key {
                MissingKey::Allow => {
                    // Uncounted: the unit poll_ready reserved is not this request's.
                    give_back_reservation(&mut self.ready);
                    return ResponseFuture::forwarded(self.inner.call(req));
                }
                MissingKey::Reject => {
                    give_back_reservation(&mut self.ready);
                    bump(&shared.counters.key_missing);
                    if shared.dry_run {
                        tracing::info!("rate limit (dry run): request has no key, would reject");
                        return ResponseFuture::forwarded(self.inner.call(req));
                    }
                    tracing::debug!("rate limit: request has no key, rejected");
                    return ResponseFuture::rejected(
                        shared.mode.reject(&req, Rejection::KeyMissing),
                    );
                }
                MissingKey::Fallback(key) => key.clone(),
            },
        };
        let cost = shared.cost.cost(&req);
        if crate::waiting::waits(shared) {
            return crate::waiting::call(self, req, key, cost);
        }

        // One policy admitting the request, the common case: forward it without
        // the all-or-nothing bookkeeping below (which would decide the same).
        let mut first = None;
        if let [limit] = &shared.limits[..] {
            match limit.store.check_now(&key, cost) {
                Some(Ok(d)) if d.is_allowed() => {
                    // What `self.forward` does, written out: through that
                    // helper, as the path after `act` calls it, every allowed
                    // request took 34 instructions more (callgrind).
                    return match shared.mode.allowed_headers(|| shared.report(0, d)) {
                        None => ResponseFuture::forwarded(self.inner.call(req)),
                        Some(headers) => {
                            ResponseFuture::with_headers(self.inner.call(req), headers)
                        }
                    };
                }
                answer => first = Some(answer),
            }
        }
        let mut answers: Answers = Default::default();
        let mut waiting = false;
        let mut settled = false;
        for (answer, limit) in answers.iter_mut().zip(shared.limits.iter()) {
            match first
                .take()
                .unwrap_or_else(|| limit.store.check_now(&key, cost))
            {
                Some(result) => {
                    settled |= !matches!(result, Ok(d) if d.is_allowed());
                    *answer = Some(result);
                }
                None => waiting = true,
            }
        }
        // A store that answers later (a remote one) is only asked when no
        // immediate answer has already denied the request.
        if waiting && !settled {
            return self.decide_later(req, key, cost, answers);
        }

        let verdict = decide(shared, &key, &answers);
        match act::<Req, S, K, X, St, M, Co, Ex>(shared, &req, &key, verdict, &answers) {
            Action::Forward(headers) => self.forward(req, headers),
            Action::Reject(output) => ResponseFuture::rejected(output),
        }
    }
}

impl<S, K, X, St, M, Co, Ex> SlidingWindow<S, K, X, St, M, Co, Ex> {
    /// Call the inner service for an allowed request, adding `headers` (if
    /// any) to its response. Each case calls it on its own, so that the
    /// common one builds nothing around the inner future.
    #[inline(always)]
    pub(crate) fn forward<Req>(
        &mut self,
        req: Req,
        headers: Option<RateLimitHeaders>,
    ) -> ResponseFuture<S::Future, M>
    where
        S: Service<Req>,
        S::Future: Send + 'static,
        M: crate::mode::sealed::Finish<<S::Future as Future>::Output> + 'static,
    {
        match headers {
            None => ResponseFuture::forwarded(self.inner.call(req)),
            Some(headers) => ResponseFuture::with_headers(self.inner.call(req), headers),
        }
    }

    /// The inner service `poll_ready` readied, taken out (a fresh clone takes
    /// its place): for a response future to call later (tower's contract: the
    /// readied instance is the one called), or to drop, giving back what it
    /// reserved.
    pub(crate) fn take_ready_inner(&mut self) -> S
    where
        S: Clone,
    {
        let fresh = self.inner.clone();
        std::mem::replace(&mut self.inner, fresh)
    }

    /// The remote path: await the stores, then forward or reject. The inner
    /// service readied by `poll_ready` moves into the future (a fresh clone
    /// stays behind), so it is called exactly as tower's contract asks.
    fn decide_later<Req>(
        &mut self,
        req: Req,
        key: K,
        cost: u32,
        answers: Answers,
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
        let mut ready = self.take_ready_inner();
        // Armed from here, not from the first poll: a response future dropped
        // before it is ever polled must also give back what `check_now` admitted.
        let mut guard = UndoOnDrop {
            shared: Arc::clone(&self.layer.shared),
            key,
            answers,
            armed: true,
        };
        ResponseFuture::deciding(Box::pin(async move {
            let g = &mut guard;
            let mut pending: Vec<(usize, Pin<Box<St::Future>>)> = g
                .shared
                .limits
                .iter()
                .enumerate()
                .filter(|(i, _)| g.answers[*i].is_none())
                .map(|(i, limit)| (i, Box::pin(limit.store.check_n(&g.key, cost))))
                .collect();
            // Ask every remote store at once, not one round trip after another.
            // If the caller drops this future before every store has answered,
            // the request never ran: the guard gives back what was admitted.
            poll_fn(|cx| {
                pending.retain_mut(|(i, future)| match future.as_mut().poll(cx) {
                    Poll::Ready(answer) => {
                        g.answers[*i] = Some(answer);
                        false
                    }
                    Poll::Pending => true,
                });
                if pending.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            // From here on, `decide` owns the all-or-nothing bookkeeping.
            g.armed = false;
            let verdict = decide(&g.shared, &g.key, &g.answers);
            let headers = match act::<Req, S, K, X, St, M, Co, Ex>(
                &g.shared, &req, &g.key, verdict, &g.answers,
            ) {
                Action::Forward(headers) => headers,
                Action::Reject(output) => return output,
            };
            M::finish(ready.call(req).await, headers)
        }))
    }
}

/// Undoes the admitted answers when dropped while armed: until every store has
/// answered (from then on, `decide` owns the all-or-nothing bookkeeping).
struct UndoOnDrop<K, X, St: Store<K>, M, Co, Ex> {
    shared: Arc<Shared<K, X, St, M, Co, Ex>>,
    key: K,
    answers: Answers,
    armed: bool,
}

impl<K, X, St: Store<K>, M, Co, Ex> Drop for UndoOnDrop<K, X, St, M, Co, Ex> {
    fn drop(&mut self) {
        if self.armed {
            undo_admitted(&self.shared, &self.key, &self.answers);
        }
    }
}

/// All-or-nothing: if any policy denies (or its store fails), give back what
/// the others counted, and name the policy to report: for a denial the denying
/// one with the longest wait (a cost no wait helps counts as the longest); for
/// an admission the one with the lowest remaining share of its limit.
pub(crate) fn decide<K, X, St: Store<K>, M, Co, Ex>(
    shared: &Shared<K, X, St, M, Co, Ex>,
    key: &K,
    answers: &Answers,
) -> Verdict {
    let mut allowed: Option<(usize, Decision)> = None;
    let mut denied: Option<(usize, Decision)> = None;
    let mut failed: Option<usize> = None;
    for (i, answer) in answers.iter().enumerate() {
        match answer {
            None => {}
            Some(Err(_)) => {
                failed.get_or_insert(i);
            }
            Some(Ok(d)) if d.is_allowed() => {
                let closer = allowed.map_or(true, |(_, best)| {
                    match (d.is_unchecked(), best.is_unchecked()) {
                        // A store that failed open knows nothing of the key:
                        // report a checked policy whenever there is one.
                        (false, true) => true,
                        (true, false) => false,
                        // remaining / limit < best.remaining / best.limit, without division
                        _ => {
                            u64::from(d.remaining()) * u64::from(best.limit())
                                < u64::from(best.remaining()) * u64::from(d.limit())
                        }
                    }
                });
                if closer {
                    allowed = Some((i, *d));
                }
            }
            Some(Ok(d)) => {
                let longer = denied.map_or(true, |(_, best)| match (d.outcome(), best.outcome()) {
                    (_, Outcome::CostExceedsLimit) => false,
                    (Outcome::CostExceedsLimit, _) => true,
                    _ => d.retry_after() > best.retry_after(),
                });
                if longer {
                    denied = Some((i, *d));
                }
            }
        }
    }
    let verdict = match (denied, failed) {
        // A definite denial beats a store that could not answer.
        (Some((i, _)), _) => Verdict::Limited(i),
        (None, Some(i)) => Verdict::StoreDown(i),
        // Every policy asked allowed (a layer has at least one).
        (None, None) => return Verdict::Allowed(allowed.map_or(0, |(i, _)| i)),
    };
    undo_admitted(shared, key, answers);
    verdict
}

/// Give back every unit the answers admitted (all-or-nothing: the request
/// does not go through).
fn undo_admitted<K, X, St: Store<K>, M, Co, Ex>(
    shared: &Shared<K, X, St, M, Co, Ex>,
    key: &K,
    answers: &Answers,
) {
    for (answer, limit) in answers.iter().zip(shared.limits.iter()) {
        if let Some(Ok(d)) = answer {
            if d.is_allowed() {
                limit.store.undo(key, d);
            }
        }
    }
}

pub(crate) fn act<Req, S, K, X, St, M, Co, Ex>(
    shared: &Shared<K, X, St, M, Co, Ex>,
    req: &Req,
    key: &K,
    verdict: Verdict,
    answers: &Answers,
) -> Action<M::Response, M::Error>
where
    S: Service<Req>,
    M: RejectionMode<Req, S>,
{
    let report = |i: usize| {
        let decision = match &answers[i] {
            Some(Ok(d)) => *d,
            _ => Decision::allow_unchecked(0),
        };
        shared.report(i, decision)
    };
    match verdict {
        Verdict::Allowed(i) => Action::Forward(shared.mode.allowed_headers(|| report(i))),
        Verdict::Limited(i) => {
            let report = report(i);
            let name = &shared.limits[i].name;
            let d = &report.decision;
            let retry_ms = d.retry_after().map(|w| w.as_millis() as u64);
            if shared.dry_run {
                bump(&shared.counters.dry_run_rejections);
                match shared.loggable_key(key) {
                    Some(key) => {
                        tracing::info!(policy = %name, limit = d.limit(), retry_after_ms = ?retry_ms, %key, "rate limit (dry run): would reject")
                    }
                    None => {
                        tracing::info!(policy = %name, limit = d.limit(), retry_after_ms = ?retry_ms, "rate limit (dry run): would reject")
                    }
                }
                return Action::Forward(shared.mode.allowed_headers(|| report));
            }
            match shared.loggable_key(key) {
                Some(key) => {
                    tracing::debug!(policy = %name, limit = d.limit(), retry_after_ms = ?retry_ms, %key, "rate limit: rejected")
                }
                None => {
                    tracing::debug!(policy = %name, limit = d.limit(), retry_after_ms = ?retry_ms, "rate limit: rejected")
                }
            }
            // The waiting modes come here when their queue turns a request away.
            match shared.on_limit {
                OnLimit::Reject | OnLimit::Wait { .. } | OnLimit::Backpressure => {
                    Action::Reject(shared.mode.reject(req, Rejection::Limited(report, name)))
                }
            }
        }
        Verdict::StoreDown(i) => {
            bump(&shared.counters.store_errors);
            let Some(Err(error)) = &answers[i] else {
                return Action::Forward(None); // StoreDown always names a failed store
            };
            tracing::warn!(policy = %shared.limits[i].name, %error, dry_run = shared.dry_run, "rate limit: store could not decide");
            if shared.dry_run {
                return Action::Forward(None);
            }
            Action::Reject(shared.mode.reject(req, Rejection::StoreUnavailable(error)))
        }
    }
}

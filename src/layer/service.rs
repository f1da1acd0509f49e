//! The service: key the request, decide with every policy, forward or reject.
//!
//! One request goes, in `call`: exemption → key (or the `MissingKey`
//! outcome) → cost → `decide_now`: every store's `check_now` → [`decide`]
//! (all-or-nothing, picks the policy to report) → [`act`] (forward with
//! headers, or reject). `decide_now` borrows the request and returns what
//! to do; `call` does it, moving the request once. A store that cannot
//! answer at once moves the rest into the response future (`decide_later`);
//! everything after the answers is the same code.
//!
//! A layer of tiers first finds the request's tier and key in the table its
//! service last saw (current after one atomic load): a limited tier's
//! policies decide it as above; unlimited, denied and unknown tiers are
//! answered at once.
//!
//! The waiting modes branch off after the cost into [`super::waiting`]: the
//! request joins its key's queue (which decides over the same stores, the same
//! way) and is forwarded, rejected through [`act`], or waits in the response
//! future. Backpressure also holds `poll_ready` until a unit is reserved.

use super::decide::{act, admitted, ask_now, decide, give_back, Action, Answers, Verdict};
use super::future::{take_readied, ResponseFuture};
use super::rejection::{Rejection, RejectionMode, Violated};
use super::response::RateLimitHeaders;
use super::settle;
use super::shared::{MissingKey, Shared, SlidingWindowLayer};
use super::tiers::{DeniedTier, Policies, Tier, TierCache, TierState, TierTable};
use super::waiting::{self, BoxedReady};
use crate::decision::Decision;
use crate::extract::{KeyExtractor, KeyOf, Keyed};
use crate::limiter::Limiter;
use crate::store::{Store, StoreError};
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

use super::rejection::HttpRejection;

/// A service rate-limited by a [`SlidingWindowLayer`].
///
/// `poll_ready` is the inner service's (with
/// [backpressure](crate::SlidingWindowLayerBuilder::backpressure), it is first
/// `Pending` until a unit is reserved for the next `call`), as tower's own
/// middleware does: backpressure from below reaches the caller. The limit is
/// decided in `call`, so a request is never counted while it waits for the
/// inner service; but while the inner service is not ready (a saturated
/// `ConcurrencyLimit` below), a request over the limit waits there for its
/// answer too. `call` never panics, even when `poll_ready` was skipped.
///
/// With the in-memory [`Limiter`] (or any store that answers through
/// [`Store::check_now`]) the decision is made inside `call`: an allowed request
/// goes straight to the inner service, a rejected one gets a ready response,
/// and nothing is allocated or boxed on either path (but with
/// [`headers_on_allowed`](crate::SlidingWindowLayerBuilder::headers_on_allowed),
/// where an allowed request's future is boxed with its headers). A store that
/// answers later is awaited in the response future; the inner service readied
/// by `poll_ready` moves into that future and a clone takes its place, which is
/// why the inner service must be `Clone` (axum, hyper and tonic services are;
/// wrap others in tower's `Buffer`). For one tonic service among several, wrap
/// it with `tonic::service::LayerExt::named_layer`, which keeps its name.
pub struct SlidingWindow<S, X: Keyed, St = Limiter<KeyOf<X>>, M = HttpRejection> {
    inner: S,
    layer: SlidingWindowLayer<X, St, M>,
    /// Backpressure: the unit `poll_ready` reserved for `call`.
    ready: Option<BoxedReady<X, St, M>>,
    /// A layer of tiers: the table in force, as this service last saw it.
    tiers: Option<TierCache<St>>,
}

impl<S, X: Keyed, St, M> SlidingWindow<S, X, St, M> {
    /// Wrap `inner`, sharing `layer`'s limiters.
    pub fn new(inner: S, layer: SlidingWindowLayer<X, St, M>) -> Self {
        SlidingWindow {
            inner,
            tiers: layer.shared.tiers.as_ref().map(TierState::cache),
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
    pub fn layer(&self) -> &SlidingWindowLayer<X, St, M> {
        &self.layer
    }
}

impl<S: Clone, X: Keyed, St, M> Clone for SlidingWindow<S, X, St, M> {
    fn clone(&self) -> Self {
        SlidingWindow {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
            // A clone starts without a reservation.
            ready: None,
            tiers: self.tiers.clone(),
        }
    }
}

impl<S: fmt::Debug, X: Keyed, St, M> fmt::Debug for SlidingWindow<S, X, St, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindow")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .field(
                "reserved",
                &self.ready.as_ref().is_some_and(|r| r.is_reserved()),
            )
            .finish()
    }
}

impl<S, X: Keyed, St, M> Layer<S> for SlidingWindowLayer<X, St, M> {
    type Service = SlidingWindow<S, X, St, M>;

    fn layer(&self, inner: S) -> Self::Service {
        SlidingWindow::new(inner, self.clone())
    }
}

impl<S, X, St, M> SlidingWindow<S, X, St, M>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    /// Backpressure: ready once a unit is reserved for the next call and the
    /// inner service is ready. A unit reserved in a bucket that passed before
    /// the inner service was ready is renewed first, ahead of the waiters
    /// behind it (it was reserved before them), so that `call` spends a
    /// current one; the renewal may wait, keeping the inner service's
    /// readiness (a `ConcurrencyLimit` permit, say).
    #[inline(never)]
    fn poll_ready_reserving<Req, E>(
        &mut self,
        cx: &mut Context<'_>,
        map_error: fn(S::Error) -> E,
    ) -> Poll<Result<(), E>>
    where
        S: Service<Req>,
    {
        loop {
            if waiting::poll_reserve(&self.layer.shared, &mut self.ready, cx).is_pending() {
                return Poll::Pending;
            }
            if let Err(error) = std::task::ready!(self.inner.poll_ready(cx)) {
                return Poll::Ready(Err(map_error(error)));
            }
            if !waiting::renew_stale(&mut self.ready) {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// The inner service as the layer needs it: `call` may move the readied
/// instance, with the request, into a response future that is boxed as `Send`
/// (a store that answers later, a waiting mode), and a clone takes its place.
/// The bounds of that path, named once; the public `Service` impl spells them
/// out, as a private trait must not show in its signature.
pub(crate) trait Inner<Req>:
    Service<Req, Future: Send + 'static> + Clone + Send + 'static
{
}

impl<S, Req> Inner<Req> for S where S: Service<Req, Future: Send + 'static> + Clone + Send + 'static {}

impl<S, Req, X, St, M> Service<Req> for SlidingWindow<S, X, St, M>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    Req: Send + 'static,
    X: KeyExtractor<Req>,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
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
            return self.poll_ready_reserving::<Req, _>(cx, M::map_error);
        }
        self.inner.poll_ready(cx).map_err(M::map_error)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let layer = &self.layer.shared;
        let shared = &**layer;
        if shared.extractor.is_exempt(&req) {
            shared.events.exempt();
            // Backpressure reserved a unit in poll_ready: not this request's.
            waiting::give_back_reservation(&mut self.ready);
            return ResponseFuture::forwarded(self.inner.call(req));
        }
        let (policies, key) = match &mut self.tiers {
            // A layer of tiers: the request's tier, in the table in force
            // (as this service last saw it), picks its policies.
            Some(tiers) => match tier_of(&shared.extractor, tiers.load(), &req) {
                Ok(found) => found,
                Err(why) => return not_limited(shared, &mut self.inner, req, why),
            },
            None => match shared.extractor.extract(&req) {
                Some(key) => (&shared.policies, key),
                None => {
                    shared.events.missing_key();
                    match &shared.missing_key {
                        MissingKey::Fallback(key) => (&shared.policies, key.clone()),
                        // The request moves only here: moved in and back out,
                        // it was copied on every call.
                        _ => return without_key(shared, &mut self.inner, &mut self.ready, req),
                    }
                }
            },
        };
        let cost = shared.extractor.cost(&req);
        // A layer of tiers never waits (the builder refuses it).
        if shared.waits() {
            return waiting::call(layer, &mut self.inner, &mut self.ready, req, key, cost);
        }
        // The request is moved only in these arms, straight into the call
        // that takes it: passed by value through one more function, even an
        // inlined one, it was copied once more on every call.
        let inner = &mut self.inner;
        match decide_now::<S, Req, X, St, M>(shared, policies, &req, &key, cost) {
            Now::Admitted(admitted) if shared.settles() => {
                settle::forward_one(layer, policies, inner, req, key, cost, admitted)
            }
            Now::Admitted(admitted) => {
                match shared.mode.allowed_headers(|| policies.report(0, admitted)) {
                    None => ResponseFuture::forwarded(inner.call(req)),
                    Some(headers) => ResponseFuture::with_headers(inner.call(req), headers),
                }
            }
            Now::Act(Action::Forward(None)) => ResponseFuture::forwarded(inner.call(req)),
            Now::Act(Action::Forward(Some(headers))) => {
                ResponseFuture::with_headers(inner.call(req), headers)
            }
            Now::Act(Action::Reject(output)) => ResponseFuture::rejected(output),
            Now::Later(answers) => decide_later(layer, policies, inner, req, key, cost, answers),
            Now::SettleAll(answers, headers) => {
                settle::forward_all(layer, policies, inner, req, key, cost, &answers, headers)
            }
        }
    }
}

/// What `call` does with a request once its policies have answered at once.
enum Now<R, E> {
    /// Admitted by the layer's one policy, the common case: forward it.
    Admitted(Decision),
    /// Forward it (every policy admitted it, or a dry run) or reject it, as
    /// [`act`] says.
    Act(Action<R, E>),
    /// Some store answers later: decide in the response future, with the
    /// answers so far.
    Later(Answers),
    /// Forward it under a ledger that settles: admitted by every policy.
    SettleAll(Answers, Option<RateLimitHeaders>),
}

/// Decide a request by `policies` with the answers every store gives at
/// once, all-or-nothing ([`decide`]), and say what to do with it ([`act`]).
/// The request and key are borrowed: `call` moves them, once, into what
/// it does.
#[inline]
fn decide_now<S, Req, X, St, M>(
    shared: &Shared<X, St, M>,
    policies: &Policies<St>,
    req: &Req,
    key: &KeyOf<X>,
    cost: u32,
) -> Now<M::Response, M::Error>
where
    S: Service<Req>,
    X: Keyed,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    // One policy admitting the request, the common case: forward it without
    // the all-or-nothing bookkeeping (which would decide the same), and
    // before the answers of every policy are even set up.
    let first = match &policies.limits[..] {
        [limit] => match limit.store.check_now(key, cost) {
            Some(Ok(d)) if d.is_allowed() => return Now::Admitted(d),
            // A remote store: ask it through its future.
            None => return Now::Later(Default::default()),
            answer => answer,
        },
        _ => None,
    };
    decide_all::<S, Req, X, St, M>(shared, policies, req, key, cost, first)
}

/// [`decide_now`] past the common case, with the one policy's answer if it
/// was asked: out of line, so that the common case carries none of the
/// answers' bookkeeping.
#[inline(never)]
fn decide_all<S, Req, X, St, M>(
    shared: &Shared<X, St, M>,
    policies: &Policies<St>,
    req: &Req,
    key: &KeyOf<X>,
    cost: u32,
    first: Option<Result<Decision, StoreError>>,
) -> Now<M::Response, M::Error>
where
    S: Service<Req>,
    X: Keyed,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let mut answers: Answers = Default::default();
    answers[0] = first;
    // A store that answers later (a remote one) is only asked when no
    // immediate answer has already denied the request.
    if ask_now(policies, key, cost, &mut answers) {
        return Now::Later(answers);
    }
    let verdict = decide(policies, key, &answers);
    match act::<Req, S, X, St, M>(shared, policies, req, key, verdict, &answers) {
        Action::Forward(headers) if shared.settles() && matches!(verdict, Verdict::Allowed(_)) => {
            Now::SettleAll(answers, headers)
        }
        action => Now::Act(action),
    }
}

/// The answer to a request without a key, under `MissingKey::Allow` or
/// `Reject` (a fallback key is decided as any key).
fn without_key<S, Req, X, St, M>(
    shared: &Shared<X, St, M>,
    inner: &mut S,
    ready: &mut Option<BoxedReady<X, St, M>>,
    req: Req,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    X: Keyed,
    M: RejectionMode<Req, S>,
{
    match &shared.missing_key {
        MissingKey::Allow | MissingKey::Fallback(_) => {
            // Uncounted: the unit poll_ready reserved is not this request's.
            waiting::give_back_reservation(ready);
            ResponseFuture::forwarded(inner.call(req))
        }
        MissingKey::Reject => {
            waiting::give_back_reservation(ready);
            shared.events.key_missing_rejected(shared.dry_run);
            if shared.dry_run {
                return ResponseFuture::forwarded(inner.call(req));
            }
            let rejection = Rejection::KeyMissing(shared.missing_key_status);
            ResponseFuture::rejected(shared.mode.reject(&req, rejection))
        }
    }
}

/// A request of a layer of tiers that is not decided by policies.
enum NotLimited<'t, K> {
    NoKey,
    Unlimited,
    Denied(&'t DeniedTier),
    UnknownTier(K),
}

/// The policies of a request's tier, and its key.
type InTier<'t, St, K> = (&'t Arc<Policies<St>>, K);

/// The request's tier (in the service's table) and key: the policies it is
/// decided by, or why it is not.
#[inline]
fn tier_of<'t, Req, X: KeyExtractor<Req>, St>(
    extractor: &X,
    table: &'t TierTable<St>,
    req: &Req,
) -> Result<InTier<'t, St, KeyOf<X>>, NotLimited<'t, KeyOf<X>>> {
    let Some((tier, key)) = extractor.extract_tiered(req, &table.names) else {
        return Err(NotLimited::NoKey);
    };
    match table.get(tier.index()) {
        Some(Tier::Limited(policies)) => Ok((policies, key)),
        Some(Tier::Unlimited) => Err(NotLimited::Unlimited),
        Some(Tier::Denied(denied)) => Err(NotLimited::Denied(denied)),
        None => Err(NotLimited::UnknownTier(key)),
    }
}

/// The answer to a request of a layer of tiers that no policy decides.
fn not_limited<S, Req, X, St, M>(
    shared: &Shared<X, St, M>,
    inner: &mut S,
    req: Req,
    why: NotLimited<'_, KeyOf<X>>,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    S::Future: Send + 'static,
    X: Keyed,
    M: RejectionMode<Req, S>,
{
    match why {
        // A layer of tiers has no fallback key (`build` refuses one).
        NotLimited::NoKey => {
            shared.events.missing_key();
            without_key(shared, inner, &mut None, req)
        }
        NotLimited::Unlimited => {
            shared.events.exempt();
            ResponseFuture::forwarded(inner.call(req))
        }
        NotLimited::Denied(denied) => {
            let report = denied.report();
            shared.events.tier_denied(&denied.name, shared.dry_run);
            if shared.dry_run {
                return ResponseFuture::forward(inner, req, shared.mode.allowed_headers(|| report));
            }
            let violated = Violated::from_names([&*denied.name]);
            let rejection = Rejection::Limited(report, &denied.name, violated);
            ResponseFuture::rejected(shared.mode.reject(&req, rejection))
        }
        NotLimited::UnknownTier(key) => unknown_tier(shared, inner, req, &key),
    }
}

/// A request whose tier the table lacks, without a fallback tier: a server
/// misconfiguration (the extractor and the table disagree), so 500 like a
/// missing peer address, never a silent pass.
fn unknown_tier<S, Req, X, St, M>(
    shared: &Shared<X, St, M>,
    inner: &mut S,
    req: Req,
    key: &KeyOf<X>,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    X: Keyed,
    M: RejectionMode<Req, S>,
{
    let logged = shared.loggable_key(key);
    let logged = logged.as_ref().map(|k| k as &dyn std::fmt::Display);
    shared.events.unknown_tier(logged, shared.dry_run);
    if shared.dry_run {
        return ResponseFuture::forwarded(inner.call(req));
    }
    let rejection = Rejection::KeyMissing(http::StatusCode::INTERNAL_SERVER_ERROR);
    ResponseFuture::rejected(shared.mode.reject(&req, rejection))
}

/// The remote path: await the stores, then forward or reject. The inner
/// service readied by `poll_ready` moves into the future (a fresh clone
/// stays behind), so it is called exactly as tower's contract asks.
fn decide_later<S, Req, X, St, M>(
    layer: &Arc<Shared<X, St, M>>,
    policies: &Arc<Policies<St>>,
    inner: &mut S,
    req: Req,
    key: KeyOf<X>,
    cost: u32,
    answers: Answers,
) -> ResponseFuture<S::Future, M>
where
    S: Inner<Req>,
    Req: Send + 'static,
    X: KeyExtractor<Req>,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let mut ready = take_readied(inner);
    // Armed from here, not from the first poll: a response future dropped
    // before it is ever polled must also give back what `check_now` admitted.
    let mut guard = UndoOnDrop {
        shared: Arc::clone(layer),
        policies: Arc::clone(policies),
        key,
        answers,
        armed: true,
    };
    ResponseFuture::deciding(Box::pin(async move {
        let g = &mut guard;
        let mut pending: Vec<(usize, Pin<Box<St::Future>>)> = g
            .policies
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
        let verdict = decide(&g.policies, &g.key, &g.answers);
        let headers = match act::<Req, S, X, St, M>(
            &g.shared,
            &g.policies,
            &req,
            &g.key,
            verdict,
            &g.answers,
        ) {
            Action::Forward(headers) => headers,
            Action::Reject(output) => return output,
        };
        let allowed = matches!(verdict, Verdict::Allowed(_));
        let admitted = g.answers.iter().map(admitted);
        let ledger = settle::ledger_for(&g.shared, &g.policies, allowed, &g.key, cost, admitted);
        M::finish(settle::call(ledger, &mut ready, req).await, headers)
    }))
}

/// Undoes the admitted answers when dropped while armed: until every store has
/// answered (from then on, `decide` owns the all-or-nothing bookkeeping).
struct UndoOnDrop<X: Keyed, St: Store<KeyOf<X>>, M> {
    shared: Arc<Shared<X, St, M>>,
    policies: Arc<Policies<St>>,
    key: KeyOf<X>,
    answers: Answers,
    armed: bool,
}

impl<X: Keyed, St: Store<KeyOf<X>>, M> Drop for UndoOnDrop<X, St, M> {
    fn drop(&mut self) {
        if self.armed {
            give_back(&self.policies, &self.key, self.answers.iter().map(admitted));
        }
    }
}

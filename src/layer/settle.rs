//! Reserve at admission, settle after the response: what a layer with
//! [`count_if`](crate::SlidingWindowLayerBuilder::count_if),
//! [`settle`](crate::SlidingWindowLayerBuilder::settle) or
//! [`settle_later`](crate::SlidingWindowLayerBuilder::settle_later) does with
//! an admitted request.
//!
//! The request's units are counted when it is admitted, as always (so
//! concurrent requests never pass the limit together). A [`Ledger`] keeps,
//! policy by policy, what the request has counted: its reservation and any
//! excess charged since. A settlement to `n` units moves the count to `n`:
//! the difference is given back (from the newest charge first, then from the
//! reservation, each at the slot it raised, through [`Store::undo`]) or
//! charged ([`Store::charge`]). Whoever speaks (the response, an error, a
//! cancellation, the [`Settlement`] handle) goes through the same ledger,
//! under one lock.

use super::decide::{admitted, Answers};
use super::future::ResponseFuture;
use super::rejection::RejectionMode;
use super::response::RateLimitHeaders;
use super::shared::{Policies, Shared};
use crate::decision::Decision;
use crate::extract::{KeyOf, Keyed};
use crate::store::Store;
use http::{HeaderMap, StatusCode};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use tower_service::Service;

/// The predicate of [`count_if`](crate::SlidingWindowLayerBuilder::count_if).
pub(crate) type CountIf = Arc<dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync>;
/// The function of [`settle`](crate::SlidingWindowLayerBuilder::settle).
pub(crate) type SettleFn = Arc<dyn Fn(StatusCode, &HeaderMap) -> Option<u32> + Send + Sync>;

/// What happens to a reservation when no response settles it: the inner
/// service failed ([`settle_on_error`](crate::SlidingWindowLayerBuilder::settle_on_error)),
/// or the response future was dropped before the response
/// ([`settle_on_cancel`](crate::SlidingWindowLayerBuilder::settle_on_cancel)).
///
/// Either way a [`Settlement`] handle that speaks later still settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unsettled {
    /// The reservation stays counted (the default: the safe side, since the
    /// request may have done its work before it failed or was dropped).
    #[default]
    Keep,
    /// Every unit the request counted is given back.
    GiveBack,
}

/// Settles nothing: every reservation kept.
static KEEP_ALL: SettleConfig = SettleConfig {
    count_if: None,
    settle: None,
    handle: false,
    on_error: Unsettled::Keep,
    on_cancel: Unsettled::Keep,
};

/// What a layer settles after the response, as its builder set it.
#[derive(Clone, Default)]
pub(crate) struct SettleConfig {
    pub(crate) count_if: Option<CountIf>,
    pub(crate) settle: Option<SettleFn>,
    /// Each admitted request carries a [`Settlement`] in its extensions.
    pub(crate) handle: bool,
    pub(crate) on_error: Unsettled,
    pub(crate) on_cancel: Unsettled,
}

impl SettleConfig {
    /// The cost the response says, if it says one: 0 when `count_if` says it
    /// does not count, else what `settle` says.
    fn cost_of(&self, status: StatusCode, headers: &HeaderMap) -> Option<u32> {
        if let Some(count_if) = &self.count_if {
            if !count_if(status, headers) {
                return Some(0);
            }
        }
        self.settle
            .as_ref()
            .and_then(|settle| settle(status, headers))
    }
}

impl fmt::Debug for SettleConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleConfig")
            .field("count_if", &self.count_if.is_some())
            .field("settle", &self.settle.is_some())
            .field("handle", &self.handle)
            .field("on_error", &self.on_error)
            .field("on_cancel", &self.on_cancel)
            .finish()
    }
}

/// Who settled, for the logs.
#[derive(Debug, Clone, Copy)]
enum Source {
    Response,
    Error,
    Cancelled,
    Handle,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::Response => "response",
            Source::Error => "error",
            Source::Cancelled => "cancelled",
            Source::Handle => "handle",
        }
    }
}

/// One policy's part of a request's count.
#[derive(Default)]
struct Entry {
    /// The admission, its `cost` the units of it still counted; `None` when
    /// the policy counted nothing (a store that failed open): nothing to
    /// settle there.
    reservation: Option<Decision>,
    /// Excesses charged since, newest last, each its `cost` still counted.
    charges: Vec<Decision>,
}

struct Book {
    entries: Vec<Entry>,
    /// The handle has settled: the response's word no longer counts.
    handle_spoke: bool,
}

/// What one admitted request has counted, policy by policy, and how it
/// settles.
pub(crate) struct Ledger<X: Keyed, St, M> {
    shared: Arc<Shared<X, St, M>>,
    policies: Arc<Policies<St>>,
    key: KeyOf<X>,
    reserved: u32,
    book: Mutex<Book>,
}

impl<X, St, M> Ledger<X, St, M>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    /// The ledger of a request admitted with `cost` units by `admitted`
    /// (policy by policy).
    pub(crate) fn new<'d>(
        shared: &Arc<Shared<X, St, M>>,
        policies: &Arc<Policies<St>>,
        key: KeyOf<X>,
        cost: u32,
        admitted: impl IntoIterator<Item = Option<&'d Decision>>,
    ) -> Arc<Self> {
        let entries = admitted
            .into_iter()
            .take(policies.limits.len())
            .map(|d| Entry {
                reservation: d.filter(|d| d.is_allowed() && !d.is_unchecked()).copied(),
                charges: Vec::new(),
            })
            .collect();
        Arc::new(Ledger {
            shared: Arc::clone(shared),
            policies: Arc::clone(policies),
            key,
            reserved: cost,
            book: Mutex::new(Book {
                entries,
                handle_spoke: false,
            }),
        })
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn config(&self) -> &SettleConfig {
        // Ledgers are made only for a layer that settles: never the default.
        self.shared.settle.as_ref().unwrap_or(&KEEP_ALL)
    }

    /// The response arrived: settle as `count_if` and `settle` say, unless
    /// the handle has spoken.
    fn on_response(&self, status: StatusCode, headers: &HeaderMap) {
        let mut book = self.book();
        if book.handle_spoke {
            return;
        }
        if let Some(units) = self.config().cost_of(status, headers) {
            self.settle_to(&mut book, units, Source::Response);
        }
    }

    /// The inner service failed, or the response future was dropped first.
    fn unsettled(&self, source: Source) {
        let what = match source {
            Source::Error => self.config().on_error,
            _ => self.config().on_cancel,
        };
        let mut book = self.book();
        if what == Unsettled::GiveBack && !book.handle_spoke {
            self.settle_to(&mut book, 0, source);
        }
    }

    /// Move every policy's count for the request to `units`.
    fn settle_to(&self, book: &mut Book, units: u32, source: Source) {
        let key = &self.key;
        // The key in the events only when the layer logs keys.
        let shown = self.shared.loggable_key(key);
        let logged = shown.as_ref().map(tracing::field::display);
        for (entry, limit) in book.entries.iter_mut().zip(self.policies.limits.iter()) {
            let Entry {
                reservation: Some(reservation),
                charges,
            } = entry
            else {
                continue;
            };
            let counted = u64::from(reservation.cost)
                + charges.iter().map(|c| u64::from(c.cost)).sum::<u64>();
            let target = u64::from(units);
            if target < counted {
                // Newest first: the charges, then the reservation.
                let mut back = counted - target;
                while back > 0 {
                    let Some(last) = charges.last_mut() else {
                        break;
                    };
                    let take = back.min(u64::from(last.cost)) as u32;
                    let mut part = *last;
                    part.cost = take;
                    limit.store.undo(key, &part);
                    last.cost -= take;
                    if last.cost == 0 {
                        charges.pop();
                    }
                    back -= u64::from(take);
                }
                let take = back.min(u64::from(reservation.cost)) as u32;
                if take > 0 {
                    let mut part = *reservation;
                    part.cost = take;
                    limit.store.undo(key, &part);
                    reservation.cost -= take;
                }
                let given = (counted - target).min(u64::from(u32::MAX)) as u32;
                limit.settled.given_back(given);
                tracing::debug!(policy = %limit.name, key = logged, reserved = self.reserved, settled = units, given_back = given, by = source.as_str(), "rate limit: settled");
            } else if target > counted {
                let want = (target - counted).min(u64::from(u32::MAX)) as u32;
                let charged = limit.store.charge(key, want);
                let got = charged.map_or(0, |d| d.cost);
                if let Some(d) = charged.filter(|d| d.cost > 0) {
                    charges.push(d);
                    limit.settled.charged(got);
                }
                if got < want {
                    limit.settled.uncharged(want - got);
                    let key = shown.as_ref().map(|k| k as &dyn std::fmt::Display);
                    self.shared.events.uncharged(&limit.name, key, want - got);
                }
                tracing::debug!(policy = %limit.name, key = logged, reserved = self.reserved, settled = units, charged = got, by = source.as_str(), "rate limit: settled");
            }
        }
    }
}

/// A [`Ledger`] as the handle reaches it, whatever the layer's types.
trait Settle: Send + Sync {
    fn settle(&self, units: u32);
    fn reserved(&self) -> u32;
}

impl<X, St, M> Settle for Ledger<X, St, M>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    fn settle(&self, units: u32) {
        let mut book = self.book();
        book.handle_spoke = true;
        self.settle_to(&mut book, units, Source::Handle);
    }

    fn reserved(&self) -> u32 {
        self.reserved
    }
}

/// The settlement of one admitted request, in its extensions: for a handler,
/// or a response body at its end, that knows what the request cost.
///
/// A layer built with
/// [`settle_later`](crate::SlidingWindowLayerBuilder::settle_later) puts one
/// in the extensions of every request it admits (axum:
/// `Extension<Settlement>`; hyper and tonic: `req.extensions().get()`).
/// Clones settle the same request.
///
/// - [`settle(n)`](Self::settle) says the request cost `n` units, for every
///   policy of the layer: the difference from what it counts now is given
///   back, or charged (past the limit if need be).
/// - [`give_back`](Self::give_back) is `settle(0)`: the request does not count.
/// - Dropped without a word, it keeps what the request counts.
///
/// **When the handle and the response both speak**, the handle has the last
/// word: once it has settled, the layer's
/// [`count_if`](crate::SlidingWindowLayerBuilder::count_if) and
/// [`settle`](crate::SlidingWindowLayerBuilder::settle) are not consulted
/// for the request (nor [`settle_on_error`](crate::SlidingWindowLayerBuilder::settle_on_error)
/// and [`settle_on_cancel`](crate::SlidingWindowLayerBuilder::settle_on_cancel));
/// if it settles after them (at the end of a streamed body), its amount
/// replaces theirs. Each call replaces the one before: the request counts
/// the amount of the last.
///
/// Extensions hold one value of a type: with two layers that
/// [`settle_later`](crate::SlidingWindowLayerBuilder::settle_later) stacked,
/// the request carries the inner layer's handle, and the outer layer settles
/// by its own `count_if` and `settle` only.
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_sliding_window::{key_fn, Policy, Settlement, SlidingWindowLayer};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let by_user = key_fn(|req: &Request<String>| req.headers().get("x-user").map(|v| v.as_bytes().to_vec()));
/// // 100 units per minute, each request reserving 10.
/// let layer = SlidingWindowLayer::builder(by_user)
///     .cost(|_: &Request<String>| 10)
///     .policy(Policy::per(100, Duration::from_secs(60))?)
///     .settle_later()
///     .build()?;
/// let svc = ServiceBuilder::new()
///     .layer(layer.clone())
///     .service(service_fn(|req: Request<String>| async move {
///         // The handler knows: this one cost 3.
///         if let Some(settlement) = req.extensions().get::<Settlement>() {
///             settlement.settle(3);
///         }
///         Ok::<_, Infallible>(Response::new(String::new()))
///     }));
/// let req = || Request::builder().header("x-user", "ada").body(String::new()).unwrap();
/// assert_eq!(svc.clone().oneshot(req()).await?.status(), StatusCode::OK);
/// assert_eq!(layer.stores().next().unwrap().usage(&b"ada".to_vec()).used, 3);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Settlement {
    ledger: Arc<dyn Settle>,
}

impl Settlement {
    /// The request cost `units` units: give back or charge the difference
    /// from what it counts now, for every policy.
    pub fn settle(&self, units: u32) {
        self.ledger.settle(units);
    }

    /// The request does not count: give back every unit it counts.
    pub fn give_back(&self) {
        self.ledger.settle(0);
    }

    /// The units the request was admitted with (its cost).
    pub fn reserved(&self) -> u32 {
        self.ledger.reserved()
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("reserved", &self.reserved())
            .finish_non_exhaustive()
    }
}

/// Put the request's handle in its extensions, if the layer hands one out
/// and the mode has extensions.
pub(crate) fn attach<Req, S, X, St, M>(ledger: &Arc<Ledger<X, St, M>>, req: &mut Req)
where
    S: Service<Req>,
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    if !ledger.config().handle {
        return;
    }
    if let Some(extensions) = M::extensions(req) {
        let ledger: Arc<dyn Settle> = ledger.clone();
        extensions.insert(Settlement { ledger });
    }
}

/// Settles as the request's end says, unless defused: dropped before the
/// response (the response future was), it is a cancellation.
pub(crate) struct Pending<
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
>(Option<Arc<Ledger<X, St, M>>>);

impl<X, St, M> Pending<X, St, M>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    pub(crate) fn new(ledger: Arc<Ledger<X, St, M>>) -> Self {
        Pending(Some(ledger))
    }

    /// The inner service's outcome: settle by it.
    pub(crate) fn finish<Req, S>(mut self, output: &Result<S::Response, S::Error>)
    where
        S: Service<Req>,
        M: RejectionMode<Req, S>,
    {
        let Some(ledger) = self.0.take() else { return };
        match output {
            Ok(response) => {
                if let Some((status, headers)) = M::response_head(response) {
                    ledger.on_response(status, headers);
                }
            }
            Err(_) => ledger.unsettled(Source::Error),
        }
    }
}

impl<X, St, M> Drop for Pending<X, St, M>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    fn drop(&mut self) {
        if let Some(ledger) = self.0.take() {
            ledger.unsettled(Source::Cancelled);
        }
    }
}

/// Call `inner` with an admitted request whose reservation `ledger` holds,
/// settling after its response.
pub(crate) fn forward<S, Req, X, St, M>(
    ledger: Arc<Ledger<X, St, M>>,
    inner: &mut S,
    mut req: Req,
    headers: Option<RateLimitHeaders>,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    S::Future: Send + 'static,
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    attach::<Req, S, X, St, M>(&ledger, &mut req);
    // Armed before the first poll: a future dropped unpolled is cancelled too.
    let pending = Pending::new(ledger);
    let future = inner.call(req);
    ResponseFuture::deciding(Box::pin(async move {
        let output = future.await;
        pending.finish::<Req, S>(&output);
        M::finish(output, headers)
    }))
}

/// [`forward`] for a request one policy admitted with `admitted` at once
/// (the common case): out of line, so that a layer that does not settle
/// carries none of it on its allowed path.
#[cold]
#[inline(never)]
pub(crate) fn forward_one<S, Req, X, St, M>(
    shared: &Arc<Shared<X, St, M>>,
    policies: &Arc<Policies<St>>,
    inner: &mut S,
    req: Req,
    key: KeyOf<X>,
    cost: u32,
    admitted: Decision,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    S::Future: Send + 'static,
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let headers = shared.mode.allowed_headers(|| policies.report(0, admitted));
    let ledger = Ledger::new(shared, policies, key, cost, [Some(&admitted)]);
    forward(ledger, inner, req, headers)
}

/// [`forward`] for a request every policy admitted, their `answers` in
/// hand: out of line, as [`forward_one`].
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)] // the request and all it was decided by
pub(crate) fn forward_all<S, Req, X, St, M>(
    shared: &Arc<Shared<X, St, M>>,
    policies: &Arc<Policies<St>>,
    inner: &mut S,
    req: Req,
    key: KeyOf<X>,
    cost: u32,
    answers: &Answers,
    headers: Option<RateLimitHeaders>,
) -> ResponseFuture<S::Future, M>
where
    S: Service<Req>,
    S::Future: Send + 'static,
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let ledger = Ledger::new(shared, policies, key, cost, answers.iter().map(admitted));
    forward(ledger, inner, req, headers)
}

/// The ledger of a request admitted by `verdict`, if the layer settles and
/// the request was admitted (a dry run forwards would-be rejections, which
/// count nothing).
pub(crate) fn ledger_for<'d, X, St, M>(
    shared: &Arc<Shared<X, St, M>>,
    policies: &Arc<Policies<St>>,
    allowed: bool,
    key: &KeyOf<X>,
    cost: u32,
    admitted: impl IntoIterator<Item = Option<&'d Decision>>,
) -> Option<Arc<Ledger<X, St, M>>>
where
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: Send + Sync + 'static,
{
    (allowed && shared.settles())
        .then(|| Ledger::new(shared, policies, key.clone(), cost, admitted))
}

/// Call `inner` with `req`, settling after its response when `ledger` holds
/// its reservation: the waiting modes' and remote stores' path, already in
/// the response future.
pub(crate) async fn call<S, Req, X, St, M>(
    ledger: Option<Arc<Ledger<X, St, M>>>,
    inner: &mut S,
    mut req: Req,
) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
    X: Keyed + Send + Sync + 'static,
    St: Store<KeyOf<X>>,
    M: RejectionMode<Req, S>,
{
    let Some(ledger) = ledger else {
        return inner.call(req).await;
    };
    attach::<Req, S, X, St, M>(&ledger, &mut req);
    let pending = Pending::new(ledger);
    let output = inner.call(req).await;
    pending.finish::<Req, S>(&output);
    output
}

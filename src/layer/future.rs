//! The response future of [`SlidingWindow`](crate::SlidingWindow): one variant
//! per outcome, so the reject path allocates nothing and boxes nothing.

use super::rejection::sealed::Finish;
use super::response::RateLimitHeaders;
use pin_project_lite::pin_project;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What the layer's future resolves to for an inner future `F` under mode `M`.
type Output<F, M> = Result<
    <M as Finish<<F as Future>::Output>>::Response,
    <M as Finish<<F as Future>::Output>>::Error,
>;

/// A store answer still in flight (remote stores only), followed by the inner
/// call; or an inner future with headers to add to its response.
type Deciding<F, M> = Pin<Box<dyn Future<Output = Output<F, M>> + Send>>;

pin_project! {
    /// Response future of [`SlidingWindow`](crate::SlidingWindow).
    ///
    /// `M` is the layer's rejection mode ([`HttpRejection`](crate::HttpRejection)
    /// or [`ErrorRejection`](crate::ErrorRejection)): it turns the inner
    /// service's output into the layer's, writing headers or boxing errors, in a
    /// call the compiler can inline.
    pub struct ResponseFuture<F, M>
    where
        F: Future,
        M: Finish<F::Output>,
    {
        #[pin]
        kind: Kind<F, M>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, M>
    where
        F: Future,
        M: Finish<F::Output>,
    {
        // Allowed (or exempt), no headers to add: the inner service's future.
        Forwarded {
            #[pin]
            future: F,
            // `fn() -> M`: the future owns no `M`, so it is `Send` and `Sync`
            // whatever `M` is.
            mode: PhantomData<fn() -> M>,
        },
        // Decided at once: the rejection response or error.
        Rejected {
            output: Option<Output<F, M>>,
        },
        // A remote store is deciding, and the request waits in here; or the
        // inner service's future with headers to add to its response.
        Deciding {
            future: Deciding<F, M>,
        },
    }
}

impl<F: Future, M: Finish<F::Output>> ResponseFuture<F, M> {
    /// The inner service's future, its response passed on as it is.
    #[inline]
    pub(crate) fn forwarded(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Forwarded {
                future,
                mode: PhantomData,
            },
        }
    }

    /// The inner service's future, with headers to add to its response
    /// (`headers_on_allowed`, a dry run): the two boxed together, one
    /// allocation. Not a variant of its own: a second variant holding the
    /// inner future would make every response future larger and its poll
    /// longer, headers or not.
    #[inline(never)]
    pub(crate) fn with_headers(future: F, headers: RateLimitHeaders) -> Self
    where
        F: Send + 'static,
        M: 'static,
    {
        ResponseFuture::deciding(Box::pin(
            async move { M::finish(future.await, Some(headers)) },
        ))
    }

    /// Call `inner` (readied by `poll_ready`) for an allowed request, adding
    /// `headers` (if any) to its response.
    #[inline(always)]
    pub(crate) fn forward<S, Req>(
        inner: &mut S,
        req: Req,
        headers: Option<RateLimitHeaders>,
    ) -> Self
    where
        S: tower_service::Service<Req, Future = F>,
        F: Send + 'static,
        M: 'static,
    {
        match headers {
            None => ResponseFuture::forwarded(inner.call(req)),
            Some(headers) => ResponseFuture::with_headers(inner.call(req), headers),
        }
    }

    pub(crate) fn rejected(output: Output<F, M>) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                output: Some(output),
            },
        }
    }

    pub(crate) fn deciding(future: Deciding<F, M>) -> Self {
        ResponseFuture {
            kind: Kind::Deciding { future },
        }
    }
}

impl<F: Future, M: Finish<F::Output>> Future for ResponseFuture<F, M> {
    type Output = Output<F, M>;

    // Always: `poll` is small, and a call here in front of a service that
    // answers at once is a good part of the layer's cost.
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            // Without headers the inner output passes through as it is: polled
            // straight into the return value, not moved through `ready!` and
            // `finish`.
            KindProj::Forwarded { future, .. } => {
                future.poll(cx).map(|output| M::finish(output, None))
            }
            KindProj::Rejected { output } => Poll::Ready(
                output
                    .take()
                    .expect("ResponseFuture polled after completion"),
            ),
            KindProj::Deciding { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F: Future, M: Finish<F::Output>> std::fmt::Debug for ResponseFuture<F, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.kind {
            Kind::Forwarded { .. } => "Forwarded",
            Kind::Rejected { .. } => "Rejected",
            Kind::Deciding { .. } => "Deciding",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// The inner service `poll_ready` readied, taken out (a fresh clone takes its
/// place): for a response future to call later (tower's contract: the readied
/// instance is the one called), or to drop, giving back what it reserved.
pub(crate) fn take_readied<S: Clone>(inner: &mut S) -> S {
    let fresh = inner.clone();
    std::mem::replace(inner, fresh)
}

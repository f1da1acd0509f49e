//! The response future of [`SlidingWindow`](crate::SlidingWindow): one variant per outcome, so the reject path allocates
//! nothing and boxes nothing.

use crate::response::RateLimitHeaders;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// What turns the inner service's output into the layer's: writes headers in
/// HTTP mode, boxes errors in error mode.
type Finish<O, T, E> = fn(O, Option<RateLimitHeaders>) -> Result<T, E>;

/// A store answer still in flight (remote stores only), followed by the inner call.
type Deciding<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

pin_project! {
    /// Response future of [`SlidingWindow`](crate::SlidingWindow).
    pub struct ResponseFuture<F, T, E>
    where
        F: Future,
    {
        #[pin]
        kind: Kind<F, T, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, T, E>
    where
        F: Future,
    {
        // Allowed (or exempt): the inner service's future.
        Forwarded {
            #[pin]
            future: F,
            // Boxed: only present with `headers_on_allowed`, and inline it would
            // add 120 bytes to a future that axum moves several times per request.
            headers: Option<Box<RateLimitHeaders>>,
            finish: Finish<F::Output, T, E>,
        },
        // Decided at once: the rejection response or error.
        Rejected {
            output: Option<Result<T, E>>,
        },
        // A remote store is deciding; the request waits in here.
        Deciding {
            future: Deciding<T, E>,
        },
    }
}

impl<F: Future, T, E> ResponseFuture<F, T, E> {
    #[inline]
    pub(crate) fn forwarded(
        future: F,
        headers: Option<RateLimitHeaders>,
        finish: Finish<F::Output, T, E>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Forwarded {
                future,
                headers: headers.map(Box::new),
                finish,
            },
        }
    }

    pub(crate) fn rejected(output: Result<T, E>) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                output: Some(output),
            },
        }
    }

    pub(crate) fn deciding(future: Deciding<T, E>) -> Self {
        ResponseFuture {
            kind: Kind::Deciding { future },
        }
    }
}

impl<F: Future, T, E> Future for ResponseFuture<F, T, E> {
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Forwarded {
                future,
                headers,
                finish,
            } => {
                let output = ready!(future.poll(cx));
                Poll::Ready(finish(output, headers.take().map(|h| *h)))
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

impl<F: Future, T, E> std::fmt::Debug for ResponseFuture<F, T, E> {
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

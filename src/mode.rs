//! How a rejection reaches the caller: an HTTP response (axum, hyper, tonic) or
//! an error value (any other request type).
//!
//! The choice is a type parameter of the layer, not a runtime flag, because the
//! two need different service signatures: axum requires a route's error type to
//! stay `Infallible`, so [`HttpRejection`] answers with a response and keeps the
//! inner service's error type, while [`ErrorRejection`] turns the error type into
//! [`BoxError`] to carry a [`RateLimited`].

use crate::error::{ConfigError, KeyMissing, RateLimited};
use crate::response::{self, HeaderOptions, PolicyName, RateLimitHeaders, Report};
use crate::store::StoreError;
use http::{Request, Response};
use tower::BoxError;
use tower_service::Service;

/// Why a request is rejected.
pub enum Rejection<'a> {
    Limited(Report<'a>, &'a PolicyName),
    StoreUnavailable(&'a StoreError),
    KeyMissing,
}

pub(crate) mod sealed {
    use super::*;

    pub trait Configure {
        fn validate(&self) -> Result<(), ConfigError>;

        /// Dry run: every forwarded response carries the headers a client would
        /// have paced itself by (HTTP mode).
        fn headers_on_every_response(&mut self) {}
    }

    /// What a forwarded request's outcome `O` becomes: a trait of its own,
    /// without the request type, so the response future calls it statically
    /// (inlined) rather than through a function pointer.
    pub trait Finish<O> {
        type Response;
        type Error;

        /// The inner service's outcome, with rate-limit headers written when given.
        fn finish(
            output: O,
            headers: Option<RateLimitHeaders>,
        ) -> Result<Self::Response, Self::Error>;
    }

    pub trait Mode<Req, S: Service<Req>>:
        Finish<Result<S::Response, S::Error>> + Send + Sync + 'static
    {
        fn map_error(error: S::Error) -> Self::Error;

        /// The headers for a forwarded request, if this mode writes any. The
        /// report is built only then: most layers write none on success.
        fn allowed_headers<'r>(
            &self,
            report: impl FnOnce() -> Report<'r>,
        ) -> Option<RateLimitHeaders>;

        fn reject(
            &self,
            req: &Req,
            rejection: Rejection<'_>,
        ) -> Result<Self::Response, Self::Error>;
    }
}

/// How rejections are delivered for request type `Req` to an inner service `S`:
/// implemented by [`HttpRejection`] and [`ErrorRejection`] (sealed).
///
/// The choice is a type parameter of the layer, not a runtime flag, because the
/// two need different service signatures: axum requires a route's error type to
/// stay `Infallible`, so [`HttpRejection`] (the default) answers with a response
/// and keeps the inner service's error type, while [`ErrorRejection`]
/// ([`reject_with_errors`](crate::SlidingWindowLayerBuilder::reject_with_errors))
/// makes the error type [`BoxError`] to carry a [`RateLimited`].
pub trait RejectionMode<Req, S: Service<Req>>: sealed::Mode<Req, S> {}

impl<T, Req, S> RejectionMode<Req, S> for T
where
    T: sealed::Mode<Req, S>,
    S: Service<Req>,
{
}

/// A rejection mode's settings, checked when the layer is built (sealed).
pub trait ModeConfig: sealed::Configure {}

impl<T: sealed::Configure> ModeConfig for T {}

/// Answer rejected `http::Request`s with a response (the default mode). The
/// response body is the inner service's (`ResBody: Default`) and the error type
/// stays the inner service's, so the layer composes with axum (whose routes must
/// stay `Infallible`) and tonic without boxing.
///
/// # Responses
///
/// | case | plain HTTP | gRPC (`content-type: application/grpc…`) |
/// |---|---|---|
/// | over a limit | 429 (configurable), empty body, or your [`RejectResponse`] | 200, `grpc-status: 8` (configurable), `grpc-message`, `grpc-retry-pushback-ms`, and the rate-limit headers below |
/// | no key, [`MissingKey::Reject`](crate::MissingKey::Reject) | the rejection status, no rate-limit headers | the rejection code |
/// | store down (fails closed) | 503 with `Retry-After` | `grpc-status: 14` UNAVAILABLE |
///
/// gRPC rejections are "trailers-only": the status travels in the response
/// headers of an empty body, which gRPC clients read as the call's status. The
/// response's `content-type` is the request's (so gRPC-web stays gRPC-web). A
/// bare HTTP 429 would reach them as UNAVAILABLE.
///
/// # Headers
///
/// All values are valid RFC 9651 structured fields. Rejections carry them;
/// allowed responses carry them only with
/// [`headers_on_allowed(true)`](crate::SlidingWindowLayerBuilder::headers_on_allowed)
/// or in a [`dry_run`](crate::SlidingWindowLayerBuilder::dry_run) (never
/// `Retry-After`), and not when every policy's store failed open
/// ([`Decision::is_unchecked`](crate::Decision::is_unchecked)): such a store
/// knows nothing of the key, so a checked policy is reported or none.
///
/// | header | value |
/// |---|---|
/// | `RateLimit-Policy` | `"name";q=L;w=W`, one list member per policy of the layer (`W`: window in seconds, rounded up) |
/// | `RateLimit` | `"name";r=R;t=T` for the reported policy: the closest to its limit (lowest remaining share) when allowed, the denying policy with the longest wait when denied. `R`: units remaining; `T`: seconds, rounded up, until the cost could pass when denied (equal to `Retry-After`), until the window drains when allowed or when the cost exceeds the limit (no `Retry-After` then; `t` may be 0) |
/// | `Retry-After` | on rejections: whole seconds, rounded up, at least 1; omitted when the cost exceeds the limit, since no wait helps |
/// | `X-RateLimit-Limit` / `-Remaining` / `-Reset` | opt-in legacy fields; `Reset` is **seconds until the window drains**, not an epoch time |
///
/// In strict mode a unit counts for up to one window plus one bucket, so waits
/// can exceed the window by one bucket (`window / buckets`).
#[derive(Debug, Clone, Default)]
pub struct HttpRejection<H = DefaultResponse> {
    pub(crate) options: HeaderOptions,
    pub(crate) hook: H,
}

/// Builds the response for a rate-limited HTTP request; see
/// [`reject_with`](crate::SlidingWindowLayerBuilder::reject_with). Any
/// `Fn(&RateLimited) -> http::Response<B>` is one.
pub trait RejectResponse<B>: Send + Sync + 'static {
    /// False only for [`DefaultResponse`], which leaves the response to the layer.
    #[doc(hidden)]
    const CUSTOM: bool = true;

    /// The response for `limited`. The layer adds its rate-limit headers
    /// afterwards unless the response already has them.
    fn respond(&self, limited: &RateLimited) -> Response<B>;
}

impl<F, B> RejectResponse<B> for F
where
    F: Fn(&RateLimited) -> Response<B> + Send + Sync + 'static,
{
    fn respond(&self, limited: &RateLimited) -> Response<B> {
        self(limited)
    }
}

/// The layer's own rejection response (429, or the configured status, empty body).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultResponse;

impl<B: Default> RejectResponse<B> for DefaultResponse {
    const CUSTOM: bool = false;

    fn respond(&self, _limited: &RateLimited) -> Response<B> {
        Response::new(B::default())
    }
}

impl<H> sealed::Configure for HttpRejection<H> {
    fn headers_on_every_response(&mut self) {
        self.options.on_allowed = true;
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let status = self.options.status;
        if !(status.is_client_error() || status.is_server_error()) {
            return Err(ConfigError::InvalidStatus { status });
        }
        if !(1..=16).contains(&self.options.grpc_status) {
            return Err(ConfigError::InvalidGrpcCode {
                code: self.options.grpc_status,
            });
        }
        Ok(())
    }
}

impl<H, ResBody, E> sealed::Finish<Result<Response<ResBody>, E>> for HttpRejection<H> {
    type Response = Response<ResBody>;
    type Error = E;

    #[inline]
    fn finish(
        output: Result<Response<ResBody>, E>,
        headers: Option<RateLimitHeaders>,
    ) -> Result<Response<ResBody>, E> {
        match headers {
            None => output,
            Some(headers) => output.map(|mut response| {
                headers.write_to(response.headers_mut());
                response
            }),
        }
    }
}

impl<H, S, ReqBody, ResBody> sealed::Mode<Request<ReqBody>, S> for HttpRejection<H>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
    H: RejectResponse<ResBody>,
{
    #[inline]
    fn map_error(error: S::Error) -> S::Error {
        error
    }

    #[inline]
    fn allowed_headers<'r>(&self, report: impl FnOnce() -> Report<'r>) -> Option<RateLimitHeaders> {
        let o = &self.options;
        if !(o.on_allowed && (o.ietf || o.legacy)) {
            return None;
        }
        let report = report();
        // A decision a store made without asking (failing open) says nothing
        // about the key: no fields rather than a full quota that is not known.
        (!report.decision.is_unchecked()).then(|| RateLimitHeaders::new(o, &report, false))
    }

    fn reject(
        &self,
        req: &Request<ReqBody>,
        rejection: Rejection<'_>,
    ) -> Result<Response<ResBody>, S::Error> {
        let grpc = response::grpc_content_type(req.headers());
        Ok(match rejection {
            Rejection::Limited(report, name) => {
                let headers = RateLimitHeaders::new(&self.options, &report, true);
                if let Some(content_type) = grpc {
                    response::grpc_limited(content_type, &self.options, &report, headers)
                } else if H::CUSTOM {
                    let limited = RateLimited::new(report.decision, PolicyName::clone(name));
                    let mut response = self.hook.respond(&limited);
                    // A rejection never goes out as a success, nor as a 1xx,
                    // which cannot be a final response.
                    if response.status().is_success() || response.status().is_informational() {
                        *response.status_mut() = self.options.status;
                    }
                    headers.write_to(response.headers_mut());
                    response
                } else {
                    response::limited(&self.options, headers)
                }
            }
            Rejection::StoreUnavailable(error) => {
                response::store_unavailable(&self.options, grpc, error)
            }
            Rejection::KeyMissing => response::key_missing(&self.options, grpc),
        })
    }
}

/// Answer rejected requests of any type with an error value, in tower's
/// [`BoxError`] convention: downcast to [`RateLimited`], [`KeyMissing`] or
/// [`StoreError`]. The inner service's errors are boxed too.
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrorRejection;

impl sealed::Configure for ErrorRejection {
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}

impl<R, E: Into<BoxError>> sealed::Finish<Result<R, E>> for ErrorRejection {
    type Response = R;
    type Error = BoxError;

    #[inline]
    fn finish(output: Result<R, E>, _headers: Option<RateLimitHeaders>) -> Result<R, BoxError> {
        output.map_err(Into::into)
    }
}

impl<Req, S> sealed::Mode<Req, S> for ErrorRejection
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    #[inline]
    fn map_error(error: S::Error) -> BoxError {
        error.into()
    }

    #[inline]
    fn allowed_headers<'r>(
        &self,
        _report: impl FnOnce() -> Report<'r>,
    ) -> Option<RateLimitHeaders> {
        None
    }

    fn reject(&self, _req: &Req, rejection: Rejection<'_>) -> Result<S::Response, BoxError> {
        Err(match rejection {
            Rejection::Limited(report, name) => {
                Box::new(RateLimited::new(report.decision, PolicyName::clone(name)))
            }
            Rejection::StoreUnavailable(error) => Box::new(error.clone()),
            Rejection::KeyMissing => Box::new(KeyMissing),
        })
    }
}

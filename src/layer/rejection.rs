//! How a rejection reaches the caller: an HTTP response (axum, hyper, tonic) or
//! an error value (any other request type).
//!
//! The choice is a type parameter of the layer, not a runtime flag, because the
//! two need different service signatures: axum requires a route's error type to
//! stay `Infallible`, so [`HttpRejection`] answers with a response and keeps the
//! inner service's error type, while [`ErrorRejection`] turns the error type into
//! [`BoxError`] to carry a [`RateLimited`].

use super::response::{self, HeaderOptions, PolicyName, RateLimitHeaders, Report};
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::store::StoreError;
use crate::tier::MAX_POLICIES;
use http::{Request, Response, StatusCode};
use std::fmt;
use std::time::Duration;
use tower::BoxError;
use tower_service::Service;

/// Why a request is rejected.
// Built on the rejection path only and lent to the hook, never stored: boxing
// the large variant would cost each rejection an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Rejection<'a> {
    /// Over a limit: the binding policy's report, its name, and the names
    /// of every policy that denied.
    Limited(Report<'a>, &'a PolicyName, Violated<'a>),
    /// A store could not decide and fails closed.
    StoreUnavailable(&'a StoreError),
    /// No key, under `MissingKey::Reject`: the status the extractor (or the
    /// layer) gives it.
    KeyMissing(StatusCode),
}

/// The names of the policies that denied a request, in the layer's order:
/// what a problem-details body lists as `violated-policies`. Gathered without
/// allocating (a layer has at most [`MAX_POLICIES`]).
#[derive(Debug, Clone, Copy)]
pub struct Violated<'a> {
    names: [&'a str; MAX_POLICIES],
    len: usize,
}

impl<'a> Violated<'a> {
    /// The first [`MAX_POLICIES`] of `names`.
    pub(crate) fn from_names(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut violated = Violated {
            names: [""; MAX_POLICIES],
            len: 0,
        };
        for (slot, name) in violated.names.iter_mut().zip(names) {
            *slot = name;
            violated.len += 1;
        }
        violated
    }

    /// The names, in the layer's order.
    pub(crate) fn names(&self) -> &[&'a str] {
        &self.names[..self.len]
    }
}

pub(crate) mod sealed {
    use super::*;

    pub trait Configure {
        fn validate(&self) -> Result<(), ConfigError>;

        /// Dry run: every forwarded response carries the headers a client would
        /// have paced itself by (HTTP mode).
        fn headers_on_every_response(&mut self) {}

        /// The status a request without a key is rejected with, when the
        /// layer sets one (HTTP mode).
        fn missing_key_status(&self) -> Option<StatusCode> {
            None
        }
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

        /// The request's extensions, where a settlement handle goes (HTTP
        /// mode; error mode takes any request and has none).
        fn extensions(req: &mut Req) -> Option<&mut http::Extensions> {
            let _ = req;
            None
        }

        /// The response's status and headers, which settlements read (HTTP
        /// mode; error mode has none).
        fn response_head(response: &S::Response) -> Option<(StatusCode, &http::HeaderMap)> {
            let _ = response;
            None
        }

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

    /// Who builds the response to a rate-limited HTTP request: the layer
    /// ([`DefaultResponse`], [`ProblemDetails`]) or the user's hook
    /// ([`CustomResponse`]).
    pub trait Respond<B>: Send + Sync + 'static {
        /// The response for `limited` (which `violated` denied; `status` is
        /// the layer's rejection status), or `None` for the layer's own.
        fn respond(
            &self,
            limited: impl FnOnce() -> RateLimited,
            violated: &Violated<'_>,
            status: StatusCode,
        ) -> Option<Response<B>>;

        /// Give the layer's 503 for a store that fails closed a body of this
        /// kind, if it has one (the empty body stays otherwise).
        fn store_unavailable(&self, response: &mut Response<B>, error: &StoreError) {
            let _ = (response, error);
        }
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
#[diagnostic::on_unimplemented(
    message = "the layer cannot reject requests of type `{Req}` in front of `{S}` with `{Self}`",
    note = "`HttpRejection` (the default) answers `http::Request`s with responses; it needs a \
            response body that implements `Default` (and, with `.problem_details()`, `From<String>`)",
    note = "for any other request type, build the layer with `.reject_with_errors()`; the inner \
            service's error must then convert into `BoxError`"
)]
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
/// stay `Infallible`) and tonic without boxing. `R` builds the response to a
/// rate-limited request: the layer's own ([`DefaultResponse`]), or yours
/// ([`CustomResponse`], from
/// [`reject_with`](crate::SlidingWindowLayerBuilder::reject_with)).
///
/// # Responses
///
/// | case | plain HTTP | gRPC (`content-type: application/grpc…`) |
/// |---|---|---|
/// | over a limit | 429 (configurable), empty body, an RFC 9457 [`ProblemDetails`] body, or your [`RejectResponse`] | 200, `grpc-status: 8` (configurable), `grpc-message`, `grpc-retry-pushback-ms`, and the rate-limit headers below |
/// | no key, [`MissingKey::Reject`](crate::MissingKey::Reject) | the extractor's [`missing_key_status`](crate::extract::Keyed::missing_key_status) (400, or 500 for the address extractors; configurable), no rate-limit headers | the code for that status: 3 INVALID_ARGUMENT for a 4xx, 16 UNAUTHENTICATED for 401, 7 PERMISSION_DENIED for 403, 8 RESOURCE_EXHAUSTED for 429, 14 UNAVAILABLE for 503, 13 INTERNAL for another 5xx |
/// | store down (fails closed) | 503 with `Retry-After` (and with [`ProblemDetails`], its body) | `grpc-status: 14` UNAVAILABLE |
///
/// A missing key is not throttling: it never answers 429 or `Retry-After`
/// (unless you set 429 yourself), so clients do not retry a request that
/// cannot pass.
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
/// ([`Decision::is_unchecked`]): such a store knows nothing of the key, so a
/// checked policy is reported or none.
///
/// | header | value |
/// |---|---|
/// | `RateLimit-Policy` | `"name";q=L;w=W`, one list member per policy of the layer (`W`: window in seconds, rounded up) |
/// | `RateLimit` | `"name";r=R;t=T` for the reported policy: the closest to its limit (lowest remaining share) when allowed, the denying policy with the longest wait when denied. `R`: units remaining; `T`: seconds, rounded up, until the cost could pass when denied (equal to `Retry-After`), until the window drains when allowed or when the cost exceeds the limit (no `Retry-After` then; `t=0` when the window is empty: the whole quota is there, and the request costs more); no `t` for a [denied tier](crate::TierLimits::Denied), whose quota of 0 is never made available (the draft makes `t` optional, and `t=0` would say "now") |
/// | `Retry-After` | on rejections: whole seconds, rounded up, at least 1; omitted when the cost exceeds the limit, since no wait helps |
/// | `X-RateLimit-Limit` / `-Remaining` / `-Reset` | opt-in legacy fields; `Reset` is **seconds until the window drains**, not an epoch time |
///
/// In strict mode a unit counts for up to one window plus one bucket, so waits
/// can exceed the window by one bucket (`window / buckets`).
#[derive(Debug, Clone, Default)]
pub struct HttpRejection<R = DefaultResponse> {
    pub(crate) options: HeaderOptions,
    pub(crate) response: R,
}

/// Builds the response for a rate-limited HTTP request; see
/// [`reject_with`](crate::SlidingWindowLayerBuilder::reject_with). Any
/// `Fn(&RateLimited) -> http::Response<B>`, boxed or shared in an `Arc`, is one.
pub trait RejectResponse<B>: Send + Sync + 'static {
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

impl<F, B> RejectResponse<B> for std::sync::Arc<F>
where
    F: Fn(&RateLimited) -> Response<B> + Send + Sync + ?Sized + 'static,
{
    fn respond(&self, limited: &RateLimited) -> Response<B> {
        (**self)(limited)
    }
}

/// The layer's own rejection response: 429 (or the configured status), empty
/// body, rate-limit headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultResponse;

/// Your [`RejectResponse`] for rate-limited requests; made by
/// [`reject_with`](crate::SlidingWindowLayerBuilder::reject_with).
#[derive(Debug, Clone, Copy)]
pub struct CustomResponse<F>(pub(crate) F);

/// An RFC 9457 problem-details body on plain HTTP rejections
/// (`application/problem+json`); made by
/// [`problem_details`](crate::SlidingWindowLayerBuilder::problem_details).
///
/// Over a limit, the IETF RateLimit draft's `quota-exceeded` problem type,
/// with `violated-policies` naming every policy that denied the request (a
/// denied tier: the tier), the response's status, and a `detail` for people:
///
/// ```json
/// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
///  "title":"Request cannot be satisfied as assigned quota has been exceeded",
///  "status":429,"detail":"Retry after 4 seconds.","violated-policies":["free"]}
/// ```
///
/// The `detail` gives the wait as `Retry-After` does (whole seconds, rounded
/// up); where no wait helps it says why: `Requests of tier "suspended" are
/// denied; no wait lets them pass.` for a denied tier, `The request costs
/// more than the quota allows; no wait lets it pass.` for a cost above the
/// limit.
///
/// A store that cannot decide and fails closed answers 503 with the draft's
/// `temporary-reduced-capacity` type, its `detail` the store's wait:
/// `The rate limiter could not decide. Retry after 2 seconds.` Answers to a missing key, and every gRPC
/// rejection, stay as they are without it.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct ProblemDetails;

impl<B: Default> sealed::Respond<B> for DefaultResponse {
    #[inline]
    fn respond(
        &self,
        _limited: impl FnOnce() -> RateLimited,
        _violated: &Violated<'_>,
        _status: StatusCode,
    ) -> Option<Response<B>> {
        None
    }
}

impl<B, F: RejectResponse<B>> sealed::Respond<B> for CustomResponse<F> {
    fn respond(
        &self,
        limited: impl FnOnce() -> RateLimited,
        _violated: &Violated<'_>,
        _status: StatusCode,
    ) -> Option<Response<B>> {
        Some(self.0.respond(&limited()))
    }
}

impl<B: From<String>> sealed::Respond<B> for ProblemDetails {
    fn respond(
        &self,
        limited: impl FnOnce() -> RateLimited,
        violated: &Violated<'_>,
        status: StatusCode,
    ) -> Option<Response<B>> {
        let body = response::quota_exceeded_problem(status, violated.names(), &limited());
        let mut response = Response::new(B::from(String::new()));
        *response.status_mut() = status;
        response::set_problem(&mut response, body);
        Some(response)
    }

    fn store_unavailable(&self, response: &mut Response<B>, error: &StoreError) {
        let body = response::reduced_capacity_problem(response.status(), error.retry_after());
        response::set_problem(response, body);
    }
}

impl<R> sealed::Configure for HttpRejection<R> {
    fn headers_on_every_response(&mut self) {
        self.options.on_allowed = true;
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let statuses = [Some(self.options.status), self.options.missing_key_status];
        for status in statuses.into_iter().flatten() {
            if !(status.is_client_error() || status.is_server_error()) {
                return Err(ConfigError::InvalidStatus { status });
            }
        }
        if !(1..=16).contains(&self.options.grpc_status) {
            return Err(ConfigError::InvalidGrpcCode {
                code: self.options.grpc_status,
            });
        }
        Ok(())
    }

    fn missing_key_status(&self) -> Option<StatusCode> {
        self.options.missing_key_status
    }
}

impl<R, ResBody, E> sealed::Finish<Result<Response<ResBody>, E>> for HttpRejection<R> {
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

impl<R, S, ReqBody, ResBody> sealed::Mode<Request<ReqBody>, S> for HttpRejection<R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
    R: sealed::Respond<ResBody>,
{
    #[inline]
    fn map_error(error: S::Error) -> S::Error {
        error
    }

    fn extensions(req: &mut Request<ReqBody>) -> Option<&mut http::Extensions> {
        Some(req.extensions_mut())
    }

    fn response_head(response: &Response<ResBody>) -> Option<(StatusCode, &http::HeaderMap)> {
        Some((response.status(), response.headers()))
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
            Rejection::Limited(mut report, name, violated) => {
                report.decision =
                    response::spread_wait(report.decision, self.options.retry_after_spread);
                let headers = RateLimitHeaders::new(&self.options, &report, true);
                if let Some(content_type) = grpc {
                    return Ok(response::grpc_limited(
                        content_type,
                        &self.options,
                        &report,
                        headers,
                    ));
                }
                let limited = || RateLimited::new(report.decision, PolicyName::clone(name));
                match self
                    .response
                    .respond(limited, &violated, self.options.status)
                {
                    Some(mut response) => {
                        // A rejection never goes out as a success, nor as a
                        // 1xx, which cannot be a final response.
                        let status = response.status();
                        if status.is_success() || status.is_informational() {
                            *response.status_mut() = self.options.status;
                        }
                        headers.write_to(response.headers_mut());
                        response
                    }
                    None => response::limited(&self.options, headers),
                }
            }
            Rejection::StoreUnavailable(error) => {
                let mut response = response::store_unavailable(&self.options, grpc, error);
                if grpc.is_none() {
                    self.response.store_unavailable(&mut response, error);
                }
                response
            }
            Rejection::KeyMissing(status) => response::key_missing(status, grpc),
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
            Rejection::Limited(report, name, _) => {
                Box::new(RateLimited::new(report.decision, PolicyName::clone(name)))
            }
            Rejection::StoreUnavailable(error) => Box::new(error.clone()),
            Rejection::KeyMissing(_) => Box::new(KeyMissing),
        })
    }
}

/// A request the layer rejected because a policy's limit was reached: the error
/// value a non-HTTP service sees (boxed in tower's [`BoxError`](tower::BoxError)
/// convention; downcast to get it back).
///
/// ```
/// use std::time::Duration;
/// use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
/// use tower_sliding_window::{GlobalKey, Policy, RateLimited, SlidingWindowLayer};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = SlidingWindowLayer::builder(GlobalKey)
///     .policy(Policy::per(1, Duration::from_secs(60)).unwrap())
///     .reject_with_errors()
///     .build()
///     .unwrap();
/// let mut svc = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|n: u32| async move { Ok::<_, BoxError>(n * 2) });
///
/// assert_eq!(svc.ready().await.unwrap().call(21).await.unwrap(), 42);
/// let err = svc.ready().await.unwrap().call(21).await.unwrap_err();
/// let limited = err.downcast_ref::<RateLimited>().unwrap();
/// assert_eq!(limited.policy_name(), "default");
/// assert!(limited.retry_after().unwrap() > Duration::ZERO);
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RateLimited {
    decision: Decision,
    policy_name: PolicyName,
}

impl RateLimited {
    pub(crate) fn new(decision: Decision, policy_name: PolicyName) -> Self {
        RateLimited {
            decision,
            policy_name,
        }
    }

    /// The denying policy's decision (limit, remaining, retry and reset times).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The name of the policy that denied the request ([`Policy::name`](crate::Policy::name)).
    pub fn policy_name(&self) -> &str {
        &self.policy_name
    }

    /// How long until the request could pass; `None` when its cost exceeds the
    /// limit, or its tier is denied (a limit of 0), so no wait helps.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision.retry_after()
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.decision.retry_after() {
            Some(wait) => write!(
                f,
                "rate limit of policy \"{}\" exceeded; retry after {wait:?}",
                self.policy_name
            ),
            None if self.decision.limit() == 0 => {
                write!(f, "tier \"{}\" is denied", self.policy_name)
            }
            None => write!(
                f,
                "request cost exceeds the limit of policy \"{}\"",
                self.policy_name
            ),
        }
    }
}

impl std::error::Error for RateLimited {}

/// A request had no rate-limit key and the layer is set to
/// [`MissingKey::Reject`](crate::MissingKey::Reject): the error value a non-HTTP
/// service sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyMissing;

impl fmt::Display for KeyMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request has no rate-limit key")
    }
}

impl std::error::Error for KeyMissing {}

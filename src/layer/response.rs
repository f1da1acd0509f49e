//! Rate-limit header values and rejection responses, built in one place.
//!
//! The formats are documented on [`HttpRejection`](crate::layer::HttpRejection).

use crate::decision::{Decision, Outcome};
use crate::policy::Policy;
use crate::store::StoreError;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

pub(crate) static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(crate) static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub(crate) static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(crate) static X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
pub(crate) static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// gRPC status code RESOURCE_EXHAUSTED.
pub(crate) const GRPC_RESOURCE_EXHAUSTED: u8 = 8;
/// gRPC status code UNAVAILABLE, for a store that is down.
const GRPC_UNAVAILABLE: u8 = 14;
/// gRPC status codes for a request without a key, by the HTTP status it gets.
const GRPC_INVALID_ARGUMENT: u8 = 3;
const GRPC_PERMISSION_DENIED: u8 = 7;
const GRPC_INTERNAL: u8 = 13;
const GRPC_UNAUTHENTICATED: u8 = 16;

/// Which headers a layer in HTTP mode writes: on rejections, all but the legacy
/// ones; on allowed responses, none unless asked.
#[derive(Debug, Clone)]
pub(crate) struct HeaderOptions {
    pub(crate) status: StatusCode,
    pub(crate) grpc_status: u8,
    pub(crate) grpc_retry_pushback: bool,
    pub(crate) ietf: bool,
    pub(crate) retry_after: bool,
    pub(crate) legacy: bool,
    pub(crate) on_allowed: bool,
    /// The status of a request without a key; `None`: the extractor's.
    pub(crate) missing_key_status: Option<StatusCode>,
    /// The most a rejection's reported wait is lengthened by, at random.
    pub(crate) retry_after_spread: Duration,
}

impl Default for HeaderOptions {
    fn default() -> Self {
        HeaderOptions {
            status: StatusCode::TOO_MANY_REQUESTS,
            grpc_status: GRPC_RESOURCE_EXHAUSTED,
            grpc_retry_pushback: true,
            ietf: true,
            retry_after: true,
            legacy: false,
            on_allowed: false,
            missing_key_status: None,
            retry_after_spread: Duration::ZERO,
        }
    }
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// A policy name as an RFC 9651 sf-string, quotes included. Names are
/// checked when a layer or table is built to need no escape; the escapes here
/// keep the field valid all the same.
pub(crate) fn quoted(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The `RateLimit-Policy` value describing every policy of a layer.
pub(crate) fn policy_header<'a>(policies: impl Iterator<Item = &'a Policy>) -> HeaderValue {
    let mut value = String::new();
    for (i, policy) in policies.enumerate() {
        if i > 0 {
            value.push_str(", ");
        }
        let _ = write!(
            value,
            "{};q={};w={}",
            quoted(policy.name()),
            policy.limit(),
            ceil_secs(policy.window())
        );
    }
    // Built from visible ASCII (the names were checked when the layer was
    // built), so the conversion does not fail; an empty value if it ever did.
    HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `decision` with its wait lengthened by a random part of `spread`: clients
/// denied at the same instant come back spread out rather than together. Only
/// ever later than the exact wait, so no client is told to come back before
/// its cost fits; a cost that can never pass stays as it is.
pub(crate) fn spread_wait(decision: Decision, spread: Duration) -> Decision {
    if spread.is_zero() || decision.outcome() != Outcome::Denied {
        return decision;
    }
    let extra = random_below(spread.as_nanos().min(u128::from(u64::MAX)) as u64 + 1);
    Decision {
        retry_after_ns: decision.retry_after_ns.saturating_add(extra),
        ..decision
    }
}

/// A number in `0..n` (`n` > 0), from a per-thread xorshift generator seeded
/// from std's random hasher keys: spread, not secrecy, is what it is for.
fn random_below(n: u64) -> u64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x5eed);
            h.finish() | 1
        });
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        // Multiply-shift: uniform enough for any n below 2^64.
        ((u128::from(x) * u128::from(n)) >> 64) as u64
    })
}

/// What one response reports: a decision of one of the layer's policies.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    pub(crate) decision: Decision,
    pub(crate) quoted_name: &'a str,
    pub(crate) policy_header: &'a HeaderValue,
}

/// Rate-limit header values computed for one response, ready to be written.
///
/// Opaque: produced by the layer in HTTP mode and written onto the response.
#[derive(Debug, Clone, Default)]
pub struct RateLimitHeaders {
    policy: Option<HeaderValue>,
    rate_limit: Option<HeaderValue>,
    retry_after: Option<u64>,
    legacy: Option<(u32, u32, u64)>,
}

impl RateLimitHeaders {
    /// The headers `options` ask for, for a response that forwards the request
    /// (`rejected == false`) or rejects it.
    pub(crate) fn new(options: &HeaderOptions, report: &Report<'_>, rejected: bool) -> Self {
        let d = &report.decision;
        let denied = d.outcome() != Outcome::Allowed;
        let t = match d.retry_after() {
            Some(wait) if denied => Some(ceil_secs(wait).max(1)),
            Some(_) => Some(ceil_secs(d.reset())),
            // A denied tier (a quota of 0): no quota is ever made available,
            // so no `t` (optional in the draft), where `t=0` would say "now".
            None if d.limit() == 0 => None,
            // The cost exceeds the limit: the quota's own state, when the
            // window drains (0 when it holds nothing: the whole quota is
            // there, and the request still costs more).
            None => Some(ceil_secs(d.reset())),
        };
        let mut headers = RateLimitHeaders::default();
        if options.ietf {
            headers.policy = Some(report.policy_header.clone());
            headers.rate_limit = rate_limit_value(report.quoted_name, d.remaining(), t);
        }
        if rejected && options.retry_after {
            headers.retry_after = d.retry_after().map(|wait| ceil_secs(wait).max(1));
        }
        if options.legacy {
            headers.legacy = Some((d.limit(), d.remaining(), ceil_secs(d.reset())));
        }
        headers
    }

    /// Write the headers, replacing none that are already there (a custom
    /// rejection response or the inner service may have set its own).
    pub(crate) fn write_to(self, map: &mut HeaderMap) {
        if map.is_empty() {
            // Nothing to keep (our own rejection): skip the vacancy checks.
            return self.write_into(|name, value| {
                map.append(name, value);
            });
        }
        self.write_into(|name, value| {
            if let http::header::Entry::Vacant(slot) = map.entry(name) {
                slot.insert(value);
            }
        });
    }

    fn write_into(self, mut put: impl FnMut(&'static HeaderName, HeaderValue)) {
        if let Some(v) = self.policy {
            put(&RATELIMIT_POLICY, v);
        }
        if let Some(v) = self.rate_limit {
            put(&RATELIMIT, v);
        }
        if let Some(secs) = self.retry_after {
            put(&RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some((limit, remaining, reset)) = self.legacy {
            put(&X_RATELIMIT_LIMIT, HeaderValue::from(limit));
            put(&X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
            put(&X_RATELIMIT_RESET, HeaderValue::from(reset));
        }
    }
}

/// `"name";r=R;t=T` (`"name";r=R` without a `T`), written by hand into a
/// stack buffer and copied once: `format!` (and a growable `Vec`) cost more
/// than the rest of the allowed path.
fn rate_limit_value(quoted_name: &str, remaining: u32, t: Option<u64>) -> Option<HeaderValue> {
    let mut buf = StackBuf::new();
    if quoted_name.len() + 50 > buf.bytes.len() {
        // Long policy names are rare: take the simple road.
        let value = match t {
            Some(t) => format!("{quoted_name};r={remaining};t={t}"),
            None => format!("{quoted_name};r={remaining}"),
        };
        return HeaderValue::try_from(value).ok();
    }
    buf.push(quoted_name.as_bytes());
    buf.push(b";r=");
    buf.push_decimal(remaining.into());
    if let Some(t) = t {
        buf.push(b";t=");
        buf.push_decimal(t);
    }
    HeaderValue::from_bytes(buf.as_slice()).ok()
}

/// A small fixed buffer for header values; callers check the length first.
struct StackBuf {
    bytes: [u8; 128],
    len: usize,
}

impl StackBuf {
    fn new() -> Self {
        StackBuf {
            bytes: [0; 128],
            len: 0,
        }
    }

    fn push(&mut self, part: &[u8]) {
        let end = self.len + part.len();
        self.bytes[self.len..end].copy_from_slice(part);
        self.len = end;
    }

    fn push_decimal(&mut self, n: u64) {
        self.push(itoa::Buffer::new().format(n).as_bytes());
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The content type of a gRPC request (`application/grpc`,
/// `application/grpc+proto`, `application/grpc-web…`), which its rejection
/// answers with: a gRPC-web client then reads the status as gRPC-web.
pub(crate) fn grpc_content_type(headers: &HeaderMap) -> Option<&HeaderValue> {
    headers
        .get(CONTENT_TYPE)
        .filter(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The plain HTTP response for a rate-limited request.
pub(crate) fn limited<B: Default>(
    options: &HeaderOptions,
    headers: RateLimitHeaders,
) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = options.status;
    headers.write_to(response.headers_mut());
    response
}

/// A gRPC "trailers-only" response: HTTP 200 whose headers carry the status, so
/// the client sees `code` instead of mapping a bare HTTP error to UNAVAILABLE.
pub(crate) fn grpc<B: Default>(
    content_type: &HeaderValue,
    code: u8,
    message: &str,
    pushback: Option<i32>,
) -> Response<B> {
    let mut response = Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, content_type.clone());
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(i32::from(code)));
    if let Ok(value) = HeaderValue::try_from(grpc_percent_encode(message)) {
        headers.insert(GRPC_MESSAGE.clone(), value);
    }
    if let Some(ms) = pushback {
        headers.insert(GRPC_RETRY_PUSHBACK_MS.clone(), HeaderValue::from(ms));
    }
    response
}

/// The gRPC response for a rate-limited request.
pub(crate) fn grpc_limited<B: Default>(
    content_type: &HeaderValue,
    options: &HeaderOptions,
    report: &Report<'_>,
    headers: RateLimitHeaders,
) -> Response<B> {
    let d = &report.decision;
    let (message, pushback) = match d.retry_after() {
        Some(wait) => {
            // Rounded up so the client never retries early; the message says
            // the same wait as the pushback (signed 32-bit milliseconds).
            let ms = wait.as_nanos().div_ceil(1_000_000).max(1);
            (
                format!(
                    "rate limit exceeded for policy {}; retry after {ms} ms",
                    report.quoted_name
                ),
                Some(i32::try_from(ms).unwrap_or(i32::MAX)),
            )
        }
        // Negative pushback: do not retry, no wait will help.
        None if d.limit() == 0 => (format!("tier {} is denied", report.quoted_name), Some(-1)),
        None => (
            format!(
                "request cost exceeds the limit of policy {}",
                report.quoted_name
            ),
            Some(-1),
        ),
    };
    let pushback = pushback.filter(|_| options.grpc_retry_pushback);
    let mut response = grpc(content_type, options.grpc_status, &message, pushback);
    headers.write_to(response.headers_mut());
    response
}

/// The answer when the store could not decide and fails closed: 503 (HTTP) or
/// UNAVAILABLE (gRPC), with `Retry-After` (`grpc-retry-pushback-ms`) unless the
/// layer turned it off.
pub(crate) fn store_unavailable<B: Default>(
    options: &HeaderOptions,
    grpc_request: Option<&HeaderValue>,
    error: &StoreError,
) -> Response<B> {
    let wait = ceil_secs(error.retry_after()).max(1);
    if let Some(content_type) = grpc_request {
        let ms = i32::try_from(wait.saturating_mul(1000)).unwrap_or(i32::MAX);
        return grpc(
            content_type,
            GRPC_UNAVAILABLE,
            "rate limiter unavailable",
            Some(ms).filter(|_| options.grpc_retry_pushback),
        );
    }
    let mut response = Response::new(B::default());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    if options.retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(wait));
    }
    response
}

/// The problem type of a request over a quota (IETF RateLimit draft).
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The problem type of a server shedding load (IETF RateLimit draft): here,
/// a store that could not decide and fails closed.
pub(crate) const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// `response` with `body` as an RFC 9457 problem-details document: its
/// media type and its length in bytes.
pub(crate) fn set_problem<B: From<String>>(response: &mut Response<B>, body: String) {
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    *response.body_mut() = B::from(body);
}

/// The `quota-exceeded` problem for `limited`, answered with `status`,
/// naming the `violated` policies.
pub(crate) fn quota_exceeded_problem(
    status: StatusCode,
    violated: &[&str],
    limited: &crate::RateLimited,
) -> String {
    let mut body = String::with_capacity(320);
    body.push_str("{\"type\":");
    json_string(&mut body, QUOTA_EXCEEDED);
    body.push_str(",\"title\":\"Request cannot be satisfied as assigned quota has been exceeded\"");
    let _ = write!(body, ",\"status\":{}", status.as_u16());
    body.push_str(",\"detail\":");
    let detail = match limited.retry_after() {
        Some(wait) => retry_after_detail(wait),
        // A tier of requests that are always rejected: its quota is 0.
        None if limited.decision().limit() == 0 => format!(
            "Requests of tier \"{}\" are denied; no wait lets them pass.",
            limited.policy_name()
        ),
        None => "The request costs more than the quota allows; no wait lets it pass.".to_owned(),
    };
    json_string(&mut body, &detail);
    body.push_str(",\"violated-policies\":[");
    for (i, name) in violated.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        json_string(&mut body, name);
    }
    body.push_str("]}");
    body
}

/// "Retry after N seconds.": the wait in whole seconds, rounded up (at least
/// 1), as `Retry-After` gives it.
fn retry_after_detail(wait: Duration) -> String {
    let secs = ceil_secs(wait).max(1);
    let unit = if secs == 1 { "second" } else { "seconds" };
    format!("Retry after {secs} {unit}.")
}

/// The `temporary-reduced-capacity` problem, answered with `status` when the
/// store could not decide; `wait` is the store's (its `Retry-After`).
pub(crate) fn reduced_capacity_problem(status: StatusCode, wait: Duration) -> String {
    let mut body = String::with_capacity(240);
    body.push_str("{\"type\":");
    json_string(&mut body, TEMPORARY_REDUCED_CAPACITY);
    body.push_str(
        ",\"title\":\"Request cannot be satisfied due to temporary server capacity constraints\"",
    );
    let _ = write!(body, ",\"status\":{}", status.as_u16());
    body.push_str(",\"detail\":");
    let detail = format!(
        "The rate limiter could not decide. {}",
        retry_after_detail(wait)
    );
    json_string(&mut body, &detail);
    body.push('}');
    body
}

/// `text` as a JSON string. Names are checked to need no escape when a
/// layer is built; the escapes keep the document valid all the same.
fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The answer to a request without a key under [`MissingKey::Reject`](crate::MissingKey::Reject):
/// `status` (gRPC: the code that status stands for), no rate-limit headers.
pub(crate) fn key_missing<B: Default>(
    status: StatusCode,
    grpc_request: Option<&HeaderValue>,
) -> Response<B> {
    if let Some(content_type) = grpc_request {
        let message = "no rate-limit key for this request";
        return grpc(content_type, grpc_code(status), message, None);
    }
    let mut response = Response::new(B::default());
    *response.status_mut() = status;
    response
}

/// The gRPC status code a rejection with HTTP `status` stands for.
fn grpc_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        401 => GRPC_UNAUTHENTICATED,
        403 => GRPC_PERMISSION_DENIED,
        429 => GRPC_RESOURCE_EXHAUSTED,
        503 => GRPC_UNAVAILABLE,
        400..=499 => GRPC_INVALID_ARGUMENT,
        _ => GRPC_INTERNAL,
    }
}

/// Percent-encode a `grpc-message` as the gRPC HTTP/2 spec asks: every byte
/// outside printable ASCII, and `%` itself, becomes `%XX`.
pub(crate) fn grpc_percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Shared names of a layer's policies, kept for error values and log events.
pub(crate) type PolicyName = Arc<str>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero_for_a_wait() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn the_ratelimit_field_is_written_in_decimal() {
        assert_eq!(
            rate_limit_value("\"p\"", 0, Some(64)).unwrap(),
            "\"p\";r=0;t=64"
        );
        let max = rate_limit_value("\"p\"", u32::MAX, Some(u64::MAX)).unwrap();
        assert_eq!(max, format!("\"p\";r={};t={}", u32::MAX, u64::MAX).as_str());
        assert_eq!(rate_limit_value("\"p\"", 0, None).unwrap(), "\"p\";r=0");
        let long = format!("\"{}\"", "n".repeat(100));
        assert_eq!(
            rate_limit_value(&long, 0, None).unwrap(),
            format!("{long};r=0").as_str()
        );
    }

    #[test]
    fn policy_names_are_quoted_with_escapes() {
        assert_eq!(quoted("a\"b\\c"), r#""a\"b\\c""#);
    }

    #[test]
    fn odd_policy_names_stay_valid_structured_fields() {
        let names = ["a \"quoted\" \\ name", "default", " spaced ", "50%"];
        let policies: Vec<Policy> = names
            .iter()
            .map(|n| {
                // Named after the build, which refuses these names: the
                // field stays valid even so.
                Policy::builder()
                    .limit(7)
                    .window(Duration::from_millis(1500))
                    .build()
                    .unwrap()
                    .with_name(*n)
            })
            .collect();
        let header = policy_header(policies.iter());
        let list: sfv::List = sfv::Parser::new(header.as_bytes()).parse().unwrap();
        assert_eq!(list.len(), names.len());
        for (entry, name) in list.iter().zip(names) {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("not an item: {entry:?}")
            };
            assert_eq!(item.bare_item.as_string().unwrap().as_str(), name);
            let w = item.params.get("w").unwrap().as_integer().unwrap();
            assert_eq!(i64::from(w), 2, "window in seconds, rounded up");
        }
    }

    #[test]
    fn the_grpc_message_names_the_pushback_wait_rounded_up() {
        let decision = Decision::from_parts(
            crate::decision::Outcome::Denied,
            1,
            0,
            Duration::from_micros(63_948_200),
            Duration::from_secs(64),
        );
        let policy_header = HeaderValue::from_static("\"p\";q=1;w=60");
        let report = Report {
            decision,
            quoted_name: "\"p\"",
            policy_header: &policy_header,
        };
        let options = HeaderOptions::default();
        let headers = RateLimitHeaders::new(&options, &report, true);
        let grpc_type = HeaderValue::from_static("application/grpc");
        let response: Response<()> = grpc_limited(&grpc_type, &options, &report, headers);
        let h = response.headers();
        assert_eq!(h["grpc-retry-pushback-ms"], "63949");
        assert_eq!(
            h["grpc-message"],
            "rate limit exceeded for policy \"p\"; retry after 63949 ms"
        );
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(grpc_percent_encode("50% off ✓"), "50%25 off %E2%9C%93");
    }

    #[test]
    fn recognises_grpc_content_types() {
        let mut h = HeaderMap::new();
        assert!(grpc_content_type(&h).is_none());
        for grpc in ["application/grpc+proto", "application/grpc-web+proto"] {
            h.insert(CONTENT_TYPE, HeaderValue::from_static(grpc));
            assert_eq!(grpc_content_type(&h).unwrap(), grpc);
        }
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(grpc_content_type(&h).is_none());
    }
}

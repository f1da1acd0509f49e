//! The layer in an axum app and in a plain hyper server: real servers on
//! 127.0.0.1, a hyper client that opens a fresh connection per request, and
//! header values parsed back as RFC 9651 structured fields.

mod layer_support;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use layer_support::{policy, serve};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;
#[cfg(feature = "axum")]
use tower_sliding_window::PeerIp;
use tower_sliding_window::{key_fn, GlobalKey, MissingKey, RateLimited, SlidingWindowLayer};

fn api_key(req: &Request<Body>) -> Option<String> {
    req.headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// One request on a new TCP connection.
async fn send(addr: SocketAddr, headers: &[(&str, &str)]) -> Response<Bytes> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder().uri("/");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let response = sender
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

fn header<'a, B>(response: &'a Response<B>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// A parsed `RateLimit` / `RateLimit-Policy` list member: name and integer params.
#[derive(Debug, PartialEq)]
struct Field {
    name: String,
    params: Vec<(String, i64)>,
}

fn parse_list(value: &str) -> Vec<Field> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not an RFC 9651 list: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => Field {
                name: item
                    .bare_item
                    .as_string()
                    .expect("policy name is an sf-string")
                    .as_str()
                    .to_owned(),
                params: item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        let int = v.as_integer().expect("integer parameter");
                        (k.as_str().to_owned(), i64::from(int))
                    })
                    .collect(),
            },
            other => panic!("unexpected inner list {other:?}"),
        })
        .collect()
}

fn field(name: &str, params: &[(&str, i64)]) -> Field {
    Field {
        name: name.to_owned(),
        params: params.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
    }
}

#[tokio::test]
async fn over_the_limit_gets_429_with_valid_rate_limit_headers() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("api", 3, Duration::from_secs(60)))
        .headers_on_allowed(true)
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;

    for remaining in [2, 1, 0] {
        let ok = send(addr, &[]).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.body(), "hello");
        assert_eq!(
            parse_list(header(&ok, "ratelimit-policy").unwrap()),
            [field("api", &[("q", 3), ("w", 60)])]
        );
        let rate = parse_list(header(&ok, "ratelimit").unwrap());
        assert_eq!(rate[0].name, "api");
        assert_eq!(rate[0].params[0], ("r".to_owned(), remaining));
        assert!(header(&ok, "retry-after").is_none());
    }

    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.body().is_empty());
    let retry: i64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    // Strict mode frees a unit at most one window plus one bucket (60 s / 15) later.
    assert!((1..=64).contains(&retry), "retry-after {retry}");
    let rate = parse_list(header(&limited, "ratelimit").unwrap());
    // t on a denial is the same wait as Retry-After.
    assert_eq!(rate, [field("api", &[("r", 0), ("t", retry)])]);
    assert!(
        header(&limited, "x-ratelimit-limit").is_none(),
        "legacy headers are opt-in"
    );
}

#[tokio::test]
async fn allowed_responses_carry_no_rate_limit_headers_by_default() {
    let layer =
        SlidingWindowLayer::new(policy("api", 1, Duration::from_secs(60)), GlobalKey).unwrap();
    let addr = serve(app().layer(layer)).await;
    let ok = send(addr, &[]).await;
    assert_eq!(ok.status(), StatusCode::OK);
    for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
        assert!(header(&ok, name).is_none(), "{name} on an allowed response");
    }
    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
        assert!(header(&limited, name).is_some(), "{name} missing on a 429");
    }
}

#[tokio::test]
async fn limit_holds_across_many_connections_with_axum_serve() {
    let layer =
        SlidingWindowLayer::new(policy("global", 5, Duration::from_secs(3600)), GlobalKey).unwrap();
    let stats = layer.clone();
    let addr = serve(app().layer(layer)).await;

    // 40 concurrent requests, each on its own connection (so `layer()` ran for each).
    let responses = futures_join(addr, 40).await;
    let ok = responses.iter().filter(|s| **s == StatusCode::OK).count();
    let limited = responses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((ok, limited), (5, 35));
    let counted = stats.stores().next().unwrap().stats();
    assert_eq!((counted.admitted, counted.rejected), (5, 35));
}

async fn futures_join(addr: SocketAddr, n: usize) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(async move { send(addr, &[]).await.status() }))
        .collect();
    let mut statuses = Vec::with_capacity(n);
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses
}

#[tokio::test]
async fn keys_are_limited_independently() {
    let layer = SlidingWindowLayer::builder(key_fn(api_key))
        .policy(policy("per-key", 2, Duration::from_secs(60)))
        .headers_on_allowed(true)
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;

    let alice = [("x-api-key", "alice")];
    let bob = [("x-api-key", "bob")];
    assert_eq!(send(addr, &alice).await.status(), StatusCode::OK);
    assert_eq!(send(addr, &alice).await.status(), StatusCode::OK);
    assert_eq!(
        send(addr, &alice).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Alice being limited leaves Bob's budget untouched.
    let first_bob = send(addr, &bob).await;
    assert_eq!(first_bob.status(), StatusCode::OK);
    assert_eq!(
        parse_list(header(&first_bob, "ratelimit").unwrap())[0].params[0],
        ("r".to_owned(), 1)
    );
    // No key at all: rejected by default (MissingKey::Reject) as a bad request,
    // not throttled: no Retry-After, no rate-limit headers.
    let anonymous = send(addr, &[]).await;
    assert_eq!(anonymous.status(), StatusCode::BAD_REQUEST);
    for name in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert!(
            header(&anonymous, name).is_none(),
            "{name} on a missing key"
        );
    }
}

#[tokio::test]
async fn peer_address_from_connect_info_is_a_key() {
    let closure = |req: &Request<Body>| {
        req.extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| addr.ip())
    };
    let layer =
        SlidingWindowLayer::new(policy("ip", 1, Duration::from_secs(60)), key_fn(closure)).unwrap();
    assert_limits_the_peer(serve(app().layer(layer)).await).await;
}

/// The ready extractor reads axum's `ConnectInfo` with the crate's `axum` feature.
#[cfg(feature = "axum")]
#[tokio::test]
async fn peer_ip_extractor_keys_by_connect_info() {
    let layer =
        SlidingWindowLayer::new(policy("ip", 1, Duration::from_secs(60)), PeerIp::new()).unwrap();
    assert_limits_the_peer(serve(app().layer(layer)).await).await;
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

async fn assert_limits_the_peer(addr: SocketAddr) {
    assert_eq!(send(addr, &[]).await.status(), StatusCode::OK);
    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        limited.headers().contains_key("ratelimit"),
        "keyed, not missing"
    );
}

#[tokio::test]
async fn legacy_headers_custom_status_and_quiet_allowed_responses() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("legacy", 1, Duration::from_secs(30)))
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .legacy_headers(true)
        .headers_on_allowed(false)
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;

    let ok = send(addr, &[]).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(header(&ok, "ratelimit").is_none());
    assert!(header(&ok, "x-ratelimit-limit").is_none());

    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&limited, "x-ratelimit-limit"), Some("1"));
    assert_eq!(header(&limited, "x-ratelimit-remaining"), Some("0"));
    let reset: u64 = header(&limited, "x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=32).contains(&reset),
        "reset is seconds until the window drains: {reset}"
    );
}

#[tokio::test]
async fn custom_rejection_response_keeps_the_rate_limit_headers() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("json", 1, Duration::from_secs(10)))
        .reject_with(|limited: &RateLimited| {
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("content-type", "application/json")
                .body(Body::from(format!(
                    r#"{{"error":"rate_limited","policy":"{}"}}"#,
                    limited.policy_name()
                )))
                .unwrap()
        })
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;
    send(addr, &[]).await;
    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&limited, "content-type"), Some("application/json"));
    assert_eq!(
        limited.body(),
        r#"{"error":"rate_limited","policy":"json"}"#
    );
    assert!(header(&limited, "retry-after").is_some());
    assert!(header(&limited, "ratelimit").is_some());
}

#[tokio::test]
async fn grpc_requests_get_a_trailers_only_resource_exhausted() {
    let layer =
        SlidingWindowLayer::new(policy("rpc", 1, Duration::from_secs(5)), GlobalKey).unwrap();
    let addr = serve(app().layer(layer)).await;
    let grpc = [("content-type", "application/grpc")];
    assert_eq!(send(addr, &grpc).await.status(), StatusCode::OK);
    let limited = send(addr, &grpc).await;
    assert_eq!(
        limited.status(),
        StatusCode::OK,
        "never a bare 429 for gRPC"
    );
    assert_eq!(header(&limited, "content-type"), Some("application/grpc"));
    assert_eq!(header(&limited, "grpc-status"), Some("8"));
    let message = header(&limited, "grpc-message").unwrap();
    assert!(message.starts_with("rate limit exceeded"), "{message}");
    let pushback: i64 = header(&limited, "grpc-retry-pushback-ms")
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5334).contains(&pushback), "{pushback}");
}

#[tokio::test]
async fn header_options_switch_fields_off_and_set_the_grpc_code() {
    let layer = SlidingWindowLayer::builder(key_fn(api_key))
        .policy(policy("opts", 1, Duration::from_secs(30)))
        .ietf_headers(false)
        .retry_after_header(false)
        .legacy_headers(true)
        .headers_on_allowed(true)
        .grpc_status(14)
        .grpc_retry_pushback(false)
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;

    // Allowed: only the legacy fields, since the IETF ones are off.
    let ok = send(addr, &[("x-api-key", "plain")]).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(header(&ok, "x-ratelimit-remaining"), Some("0"));
    assert!(header(&ok, "ratelimit").is_none());
    assert!(header(&ok, "ratelimit-policy").is_none());

    let limited = send(addr, &[("x-api-key", "plain")]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&limited, "x-ratelimit-limit"), Some("1"));
    for absent in ["retry-after", "ratelimit", "ratelimit-policy"] {
        assert!(header(&limited, absent).is_none(), "{absent}");
    }

    // gRPC-web: the configured code, no pushback, the request's content type.
    let web = [
        ("x-api-key", "web"),
        ("content-type", "application/grpc-web+proto"),
    ];
    assert_eq!(send(addr, &web).await.status(), StatusCode::OK);
    let limited = send(addr, &web).await;
    assert_eq!(limited.status(), StatusCode::OK);
    assert_eq!(header(&limited, "grpc-status"), Some("14"));
    assert_eq!(
        header(&limited, "content-type"),
        Some("application/grpc-web+proto")
    );
    assert!(header(&limited, "grpc-retry-pushback-ms").is_none());
}

/// Window rollover on tokio's paused clock: the default clock, built on paused
/// time, follows it.
/// The router is called in-process so no socket timer can auto-advance time.
#[tokio::test(start_paused = true)]
async fn window_rolls_over_on_paused_time() {
    let layer = SlidingWindowLayer::builder(key_fn(api_key))
        .policy(policy("second", 2, Duration::from_secs(1)))
        .missing_key(MissingKey::Fallback("anonymous".to_owned()))
        .build()
        .unwrap();
    let app = app().layer(layer);
    let status = |app: Router| async move {
        let response = app
            .oneshot(Request::builder().uri("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        (
            response.status(),
            response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned()),
        )
    };

    assert_eq!(status(app.clone()).await.0, StatusCode::OK);
    assert_eq!(status(app.clone()).await.0, StatusCode::OK);
    let (limited, retry) = status(app.clone()).await;
    assert_eq!(limited, StatusCode::TOO_MANY_REQUESTS);
    // The wait is one window plus one bucket (1 s + 1/15 s), rounded up.
    assert_eq!(retry.as_deref(), Some("2"));

    tokio::time::advance(Duration::from_millis(500)).await;
    assert_eq!(status(app.clone()).await.0, StatusCode::TOO_MANY_REQUESTS);

    // A window plus one bucket later, everything counted has expired.
    tokio::time::advance(Duration::from_millis(600) + Duration::from_secs(1) / 15).await;
    assert_eq!(status(app.clone()).await.0, StatusCode::OK);
    assert_eq!(status(app.clone()).await.0, StatusCode::OK);
    assert_eq!(status(app).await.0, StatusCode::TOO_MANY_REQUESTS);
}

/// A plain hyper 1 server: one service per connection, built from the same layer
/// value, the peer address put into the request's extensions.
#[tokio::test]
async fn plain_hyper_server_shares_the_limit_across_connections() {
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::service::TowerToHyperService;
    use std::convert::Infallible;
    use tower::ServiceBuilder;

    // PeerIp reads the SocketAddr extension the accept loop inserts.
    let layer = SlidingWindowLayer::new(policy("hyper", 3, Duration::from_secs(60)), PeerIp::new())
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, remote) = listener.accept().await.unwrap();
            let svc = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(remote);
                    req
                })
                .layer(layer.clone())
                .service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc)),
            );
        }
    });

    let statuses = futures_join(addr, 10).await;
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 3);
    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(header(&limited, "retry-after").is_some());
}

/// The problem document of a response: its JSON, after checking the media
/// type and that `Content-Length` is the body's length.
fn problem_of(response: &Response<Bytes>) -> serde_json::Value {
    assert_eq!(
        header(response, "content-type"),
        Some("application/problem+json")
    );
    let length: usize = header(response, "content-length").unwrap().parse().unwrap();
    assert_eq!(
        length,
        response.body().len(),
        "Content-Length is the body's"
    );
    serde_json::from_slice(response.body())
        .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", response.body()))
}

#[tokio::test]
async fn problem_details_name_every_policy_that_denied_in_json_of_the_right_length() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("burst", 1, Duration::from_secs(5)))
        .policy(policy("hourly", 1, Duration::from_secs(3600)))
        .policy(policy("daily", 100, Duration::from_secs(86_400)))
        .problem_details()
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;
    let allowed = send(addr, &[]).await;
    assert_eq!(allowed.status(), StatusCode::OK);
    assert_eq!(
        allowed.body().as_ref(),
        b"hello",
        "allowed bodies untouched"
    );

    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem = problem_of(&limited);
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert!(problem["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(problem["status"], 429);
    // Both policies that denied, in the layer's order; not the one that admitted.
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["burst", "hourly"])
    );
    let retry_after: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("{retry_after} seconds")),
        "{problem}"
    );
    // The headers are those of an empty-bodied rejection.
    assert!(header(&limited, "ratelimit").is_some());
    assert!(header(&limited, "ratelimit-policy").is_some());
}

/// A request that costs more than the limit: no wait lets it pass, so no
/// `Retry-After`; `RateLimit` reports the quota as it is (the whole quota
/// there, `t=0` on an empty window), and the `detail` says why.
#[tokio::test]
async fn a_cost_above_the_limit_is_reported_as_never_passing() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("jobs", 3, Duration::from_secs(60)))
        .cost(|req: &Request<Body>| if req.uri().path() == "/big" { 5 } else { 1 })
        .problem_details()
        .build()
        .unwrap();
    let app = app().route("/big", get(|| async { "big" })).layer(layer);
    let request = |path: &str| Request::get(path).body(Body::empty()).unwrap();

    let big = app.clone().oneshot(request("/big")).await.unwrap();
    assert_eq!(big.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&big, "retry-after"), None);
    assert_eq!(header(&big, "ratelimit"), Some("\"jobs\";r=3;t=0"));
    let body = big.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem["detail"],
        "The request costs more than the quota allows; no wait lets it pass."
    );

    // With units in the window, `t` is when it drains: the quota's state.
    assert_eq!(
        app.clone().oneshot(request("/")).await.unwrap().status(),
        StatusCode::OK
    );
    let big = app.oneshot(request("/big")).await.unwrap();
    let rate = header(&big, "ratelimit").unwrap();
    assert!(rate.starts_with("\"jobs\";r=2;t="), "{rate}");
    let t: u64 = rate.rsplit("t=").next().unwrap().parse().unwrap();
    assert!((60..=65).contains(&t), "{rate}");
}

#[tokio::test]
async fn problem_details_follow_the_layers_status_and_keep_grpc_rejections_as_they_are() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .policy(policy("rpc", 1, Duration::from_secs(5)))
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .problem_details()
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;
    assert_eq!(send(addr, &[]).await.status(), StatusCode::OK);
    let limited = send(addr, &[]).await;
    assert_eq!(limited.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem_of(&limited)["status"], 503);

    // gRPC: the trailers-only answer, no body and no problem document.
    let grpc = send(addr, &[("content-type", "application/grpc")]).await;
    assert_eq!(grpc.status(), StatusCode::OK);
    assert_eq!(header(&grpc, "content-type"), Some("application/grpc"));
    assert_eq!(header(&grpc, "grpc-status"), Some("8"));
    assert!(grpc.body().is_empty());
}

/// A store that cannot decide, as Redis failing closed during an outage.
struct Down(tower_sliding_window::Policy);

impl tower_sliding_window::Store<()> for Down {
    type Future = std::future::Ready<
        Result<tower_sliding_window::Decision, tower_sliding_window::StoreError>,
    >;

    fn check_n(&self, _key: &(), _cost: u32) -> Self::Future {
        std::future::ready(Err(Down::error()))
    }

    fn check_now(
        &self,
        _key: &(),
        _cost: u32,
    ) -> Option<Result<tower_sliding_window::Decision, tower_sliding_window::StoreError>> {
        Some(Err(Down::error()))
    }

    fn undo(&self, _key: &(), _decision: &tower_sliding_window::Decision) {}

    fn policy(&self) -> &tower_sliding_window::Policy {
        &self.0
    }
}

impl Down {
    fn error() -> tower_sliding_window::StoreError {
        tower_sliding_window::StoreError::new(
            tower_sliding_window::StoreErrorKind::ConnectionRefused,
            Duration::from_secs(2),
        )
    }
}

#[tokio::test]
async fn a_store_failing_closed_is_a_temporary_reduced_capacity_problem() {
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .store(Down(policy("fleet", 10, Duration::from_secs(60))))
        .problem_details()
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;
    let down = send(addr, &[]).await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&down, "retry-after"), Some("2"));
    let problem = problem_of(&down);
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
    );
    assert_eq!(problem["status"], 503);
    // The store's wait, as `Retry-After` gives it.
    assert_eq!(
        problem["detail"],
        "The rate limiter could not decide. Retry after 2 seconds."
    );
    assert!(problem.get("violated-policies").is_none());
    let grpc = send(addr, &[("content-type", "application/grpc")]).await;
    assert_eq!(header(&grpc, "grpc-status"), Some("14"));
    assert!(grpc.body().is_empty());

    // Without problem details, the default: the same 503 with an empty body.
    let layer = SlidingWindowLayer::builder(GlobalKey)
        .store(Down(policy("fleet", 10, Duration::from_secs(60))))
        .build()
        .unwrap();
    let addr = serve(app().layer(layer)).await;
    let down = send(addr, &[]).await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(down.body().is_empty());
    assert_eq!(header(&down, "content-type"), None);
}

//! A layer of tiers in an axum app served on 127.0.0.1, called by a hyper
//! client over fresh connections: each tier's own limits and headers,
//! unlimited and denied tiers, a tier the table lacks, and limits raised and
//! lowered while a client runs (on paused time).

mod layer_support;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use layer_support::serve;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tower_sliding_window::extract::TieredKeyFn;
use tower_sliding_window::{
    tiered_key_fn, ConfigError, Policy, SlidingWindowLayer, TierLimits, Tiers,
};

/// Tier from `x-tier`, key from `x-user`; no user, no key.
fn tier_and_user(req: &Request<Body>) -> Option<(String, String)> {
    let header = |name| Some(req.headers().get(name)?.to_str().ok()?.to_owned());
    Some((header("x-tier").unwrap_or_default(), header("x-user")?))
}

fn table() -> Tiers {
    Tiers::builder()
        .limited("free", ["2/min".parse().unwrap()])
        .limited(
            "paid",
            [
                "5/min".parse().unwrap(),
                Policy::per(100, Duration::from_secs(3600))
                    .unwrap()
                    .with_name("hourly"),
            ],
        )
        .unlimited("internal")
        .denied("suspended")
        .build()
        .unwrap()
}

type ByTier = TieredKeyFn<fn(&Request<Body>) -> Option<(String, String)>, String>;

fn by_tier() -> ByTier {
    tiered_key_fn(tier_and_user as fn(&Request<Body>) -> Option<(String, String)>)
}

/// A layer of `table()`, keyed by `by_tier()`, with the default settings.
fn tiered_layer() -> SlidingWindowLayer<ByTier> {
    SlidingWindowLayer::builder(by_tier())
        .tiers(table())
        .build()
        .unwrap()
}

async fn app(layer: SlidingWindowLayer<ByTier>) -> SocketAddr {
    serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

/// One request on a new TCP connection.
async fn send(addr: SocketAddr, tier: &str, user: &str) -> Response<Bytes> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder().uri("/").header("x-user", user);
    if !tier.is_empty() {
        req = req.header("x-tier", tier);
    }
    let response = sender
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

async fn statuses(addr: SocketAddr, tier: &str, user: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(addr, tier, user).await.status().as_u16());
    }
    out
}

fn header<'a>(response: &'a Response<Bytes>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn each_tier_has_its_own_limits_and_counts() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;

    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    // The same key in another tier is counted apart.
    assert_eq!(
        statuses(addr, "paid", "ada", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    // Another key of the same tier too.
    assert_eq!(statuses(addr, "free", "bob", 3).await, [200, 200, 429]);
    assert_eq!(
        layer
            .tier_stores("free")
            .unwrap()
            .iter()
            .next()
            .unwrap()
            .usage(&"ada".to_owned())
            .used,
        2
    );
}

#[tokio::test]
async fn headers_report_the_tiers_policy() {
    let layer = tiered_layer();
    let addr = app(layer).await;
    statuses(addr, "free", "ada", 2).await;
    let free = send(addr, "free", "ada").await;
    assert_eq!(free.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&free, "ratelimit-policy"), Some("\"free\";q=2;w=60"));
    assert!(header(&free, "ratelimit")
        .unwrap()
        .starts_with("\"free\";r=0;t="));
    assert!(header(&free, "retry-after").is_some());

    statuses(addr, "paid", "ada", 5).await;
    let paid = send(addr, "paid", "ada").await;
    assert_eq!(paid.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&paid, "ratelimit-policy"),
        Some("\"paid\";q=5;w=60, \"hourly\";q=100;w=3600")
    );
    assert!(header(&paid, "ratelimit")
        .unwrap()
        .starts_with("\"paid\";r=0;t="));
}

#[tokio::test]
async fn unlimited_tiers_pass_uncounted_and_denied_tiers_never_pass() {
    let layer = tiered_layer();
    let addr = app(layer).await;

    let internal = statuses(addr, "internal", "ci", 50).await;
    assert!(internal.iter().all(|&s| s == 200), "{internal:?}");
    assert_eq!(
        header(&send(addr, "internal", "ci").await, "ratelimit"),
        None
    );

    let denied = send(addr, "suspended", "mallory").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"suspended\";q=0")
    );
    // No quota is ever made available: no `t` (optional in the draft), where
    // `t=0` would tell the client to come back now.
    assert_eq!(header(&denied, "ratelimit"), Some("\"suspended\";r=0"));
    // Waiting will not help: no Retry-After.
    assert_eq!(header(&denied, "retry-after"), None);
}

#[tokio::test]
async fn a_denied_tier_says_it_is_denied_in_its_problem_details_and_grpc_message() {
    use tower::ServiceExt;
    let layer = SlidingWindowLayer::builder(by_tier())
        .tiers(table())
        .problem_details()
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let request = |content_type: &str| {
        Request::get("/")
            .header("x-tier", "suspended")
            .header("x-user", "mallory")
            .header("content-type", content_type)
            .body(Body::empty())
            .unwrap()
    };

    let denied = app.clone().oneshot(request("text/plain")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header_of(&denied, "ratelimit"), Some("\"suspended\";r=0"));
    let body = denied.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        problem["detail"],
        "Requests of tier \"suspended\" are denied; no wait lets them pass."
    );
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["suspended"])
    );

    let grpc = app.oneshot(request("application/grpc")).await.unwrap();
    assert_eq!(header_of(&grpc, "grpc-status"), Some("8"));
    assert_eq!(
        header_of(&grpc, "grpc-message"),
        Some("tier \"suspended\" is denied")
    );
    // Negative: do not retry.
    assert_eq!(header_of(&grpc, "grpc-retry-pushback-ms"), Some("-1"));
}

fn header_of<'a, B>(response: &'a Response<B>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn a_tier_the_table_lacks_is_a_server_error_or_goes_to_the_fallback() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    let unknown = send(addr, "platinum", "ada").await;
    assert_eq!(unknown.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(header(&unknown, "ratelimit"), None);
    assert_eq!(
        send(addr, "", "ada").await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(layer.stats().unknown_tier, 2);
    // No key at all: the missing-key outcome (400), not an unknown tier.
    let no_key = {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::builder().uri("/").header("x-tier", "free");
        sender
            .send_request(req.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap()
            .status()
    };
    assert_eq!(no_key, StatusCode::BAD_REQUEST);

    let layer = SlidingWindowLayer::builder(by_tier())
        .tiers(table())
        .unknown_tier_fallback("free")
        .build()
        .unwrap();
    let addr = app(layer.clone()).await;
    assert_eq!(statuses(addr, "platinum", "ada", 3).await, [200, 200, 429]);
    // Counted in the fallback tier, as the same key of that tier.
    assert_eq!(
        send(addr, "free", "ada").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(layer.stats().unknown_tier, 0);
}

#[tokio::test(start_paused = true)]
async fn raising_a_limit_gives_room_at_once_and_lowering_it_waits_for_the_window() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;

    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    layer
        .set_tier("free", TierLimits::Limited(vec!["4/min".parse().unwrap()]))
        .unwrap();
    // The two admitted still count: two more, not four.
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    let raised = send(addr, "free", "ada").await;
    assert_eq!(
        header(&raised, "ratelimit-policy"),
        Some("\"free\";q=4;w=60")
    );

    tokio::time::advance(Duration::from_secs(30)).await;
    layer
        .set_tier("free", TierLimits::Limited(vec!["1/min".parse().unwrap()]))
        .unwrap();
    // Four counted against a limit of one: denied until they leave the window,
    // a minute after they were admitted (to a step of their bucket).
    assert_eq!(statuses(addr, "free", "ada", 1).await, [429]);
    tokio::time::advance(Duration::from_millis(29_999)).await;
    assert_eq!(statuses(addr, "free", "ada", 1).await, [429]);
    tokio::time::advance(Duration::from_millis(2)).await;
    assert_eq!(statuses(addr, "free", "ada", 2).await, [200, 429]);
    // The other tiers were not touched.
    assert_eq!(
        statuses(addr, "paid", "ada", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_window_carries_the_counts_over_no_earlier_than_they_happened() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    // Two at 3 s, in the first bucket of "2/min" (8.6 s wide).
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    tokio::time::advance(Duration::from_secs(7)).await;
    // 2 per 30 s, in buckets of 4.3 s: the two count in the bucket holding
    // their instant, as admitted then (to a step of the buckets), so they
    // leave the window 30 s after it, at 33 s: not at 30 s, as they would
    // had they been moved to the start of that bucket.
    layer
        .set_tier(
            "free",
            TierLimits::Limited(vec!["2 per 30s".parse().unwrap()]),
        )
        .unwrap();
    assert_eq!(statuses(addr, "free", "ada", 1).await, [429]);
    tokio::time::advance(Duration::from_millis(22_999)).await; // 32.999 s
    assert_eq!(statuses(addr, "free", "ada", 1).await, [429]);
    tokio::time::advance(Duration::from_millis(2)).await; // 33.001 s
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
}

#[tokio::test(start_paused = true)]
async fn a_new_table_keeps_counts_by_tier_and_policy_name() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    assert_eq!(statuses(addr, "paid", "ada", 5).await, [200; 5]);
    assert_eq!(statuses(addr, "free", "ada", 2).await, [200; 2]);

    // "paid" gets a bigger burst limit (its first policy, named "paid" by
    // its position, keeps its counts by that name) and keeps "hourly";
    // "free" goes; "trial" is new.
    let next = Tiers::builder()
        .limited(
            "paid",
            [
                "6/min".parse().unwrap(),
                Policy::per(100, Duration::from_secs(3600))
                    .unwrap()
                    .with_name("hourly"),
            ],
        )
        .limited("trial", ["1/min".parse().unwrap()])
        .build()
        .unwrap();
    layer.set_tiers(&next).unwrap();
    assert_eq!(statuses(addr, "paid", "ada", 2).await, [200, 429]);
    assert_eq!(statuses(addr, "free", "ada", 1).await, [500]);
    assert_eq!(statuses(addr, "trial", "ada", 2).await, [200, 429]);
    assert_eq!(layer.tiers().unwrap(), next);
}

/// `n` requests per `window` in tier `tier`.
fn limited(rate: &str) -> TierLimits {
    TierLimits::Limited(vec![rate.parse().unwrap()])
}

#[tokio::test(start_paused = true)]
async fn a_policy_added_to_a_tier_leaves_the_others_their_names_and_counts() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    // An hourly policy joins "free": the first keeps its name, "free", and
    // with it the two units it counted; the new one is "free-2".
    layer
        .set_tier(
            "free",
            TierLimits::Limited(vec!["2/min".parse().unwrap(), "100/h".parse().unwrap()]),
        )
        .unwrap();
    let names: Vec<String> = layer
        .tiers()
        .unwrap()
        .get("free")
        .unwrap()
        .policies()
        .iter()
        .map(|p| p.name().to_owned())
        .collect();
    assert_eq!(names, ["free", "free-2"]);
    assert_eq!(statuses(addr, "free", "ada", 1).await, [429]);
    tokio::time::advance(Duration::from_secs(65)).await;
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
}

#[tokio::test(start_paused = true)]
async fn a_tiers_counts_outlast_an_interlude_as_denied_or_unlimited() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    for interlude in [TierLimits::Denied, TierLimits::Unlimited] {
        assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
        layer.set_tier("free", interlude.clone()).unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        // Limited again: the two units of 10 s ago still count.
        layer.set_tier("free", limited("2/min")).unwrap();
        assert_eq!(
            statuses(addr, "free", "ada", 1).await,
            [429],
            "after {interlude:?}"
        );
        // Limited again under another limit: counted against it, as any change.
        layer.set_tier("free", interlude.clone()).unwrap();
        layer.set_tier("free", limited("3/min")).unwrap();
        assert_eq!(
            statuses(addr, "free", "ada", 2).await,
            [200, 429],
            "after {interlude:?}"
        );
        // They leave the window as they would have without the interlude:
        // at 65 s the two of 0 s are gone, the one of 10 s is not.
        tokio::time::advance(Duration::from_secs(55)).await;
        layer.set_tier("free", limited("2/min")).unwrap();
        assert_eq!(statuses(addr, "free", "ada", 2).await, [200, 429]);
        tokio::time::advance(Duration::from_secs(65)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_tier_removed_from_the_table_and_added_back_starts_empty() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    let without_free = Tiers::builder()
        .limited("paid", ["5/min".parse().unwrap()])
        .build()
        .unwrap();
    layer.set_tiers(&without_free).unwrap();
    assert_eq!(statuses(addr, "free", "ada", 1).await, [500]);
    // The documented choice: a tier gone from the table takes its counts
    // with it.
    layer.set_tiers(&table()).unwrap();
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
}

#[tokio::test]
async fn changing_a_tier_the_table_lacks_is_an_error_and_adding_one_is_a_call_of_its_own() {
    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    // A typo changes nothing.
    assert!(matches!(
        layer.set_tier("fre", TierLimits::Unlimited),
        Err(ConfigError::UnknownTier { name }) if name == "fre"
    ));
    assert_eq!(layer.tiers().unwrap(), table());
    assert_eq!(statuses(addr, "fre", "ada", 1).await, [500]);
    // Adding is its own call, and refuses a tier the table has.
    layer.add_tier("trial", limited("1/min")).unwrap();
    assert_eq!(statuses(addr, "trial", "ada", 2).await, [200, 429]);
    assert!(matches!(
        layer.add_tier("free", TierLimits::Unlimited),
        Err(ConfigError::DuplicateTier { name }) if name == "free"
    ));
    assert_eq!(
        layer.tiers().unwrap().get("free"),
        table().get("free"),
        "nothing changed"
    );
}

#[tokio::test]
async fn a_handle_changes_the_layers_table_from_wherever_it_is_kept() {
    use tower_sliding_window::layer::TierHandle;

    /// What an admin endpoint keeps: no extractor type in sight.
    #[derive(Clone)]
    struct Admin {
        tiers: TierHandle<String>,
    }

    let layer = tiered_layer();
    let addr = app(layer.clone()).await;
    let admin = Admin {
        tiers: layer.tier_handle(),
    };
    let elsewhere = admin.clone();
    assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    elsewhere.tiers.set_tier("free", limited("3/min")).unwrap();
    // The layer's services see it, and the counts were kept.
    assert_eq!(statuses(addr, "free", "ada", 2).await, [200, 429]);
    assert_eq!(admin.tiers.tiers(), layer.tiers().unwrap());
    admin.tiers.add_tier("trial", limited("1/min")).unwrap();
    assert_eq!(statuses(addr, "trial", "ada", 2).await, [200, 429]);
    assert!(matches!(
        admin.tiers.set_tier("gold", TierLimits::Unlimited),
        Err(ConfigError::UnknownTier { .. })
    ));
    admin.tiers.set_tiers(&table()).unwrap();
    assert_eq!(layer.tiers().unwrap(), table());
}

/// Tier by API key; callers without one by `ClientIp` in "anonymous".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Caller {
    Key(String),
    Ip(std::net::IpAddr),
}

#[tokio::test]
async fn a_tiered_layer_keyed_through_client_ip_groups_ipv6_by_64_and_walks_trusted_proxies() {
    // The test client connects from 127.0.0.1, playing the trusted proxy.
    let client_ip = tower_sliding_window::ClientIp::trusting(["127.0.0.1".parse().unwrap()]);
    let by_tier = tiered_key_fn(
        move |req: &Request<Body>| match req.headers().get("x-api-key") {
            Some(key) => Some(("free", Caller::Key(key.to_str().ok()?.to_owned()))),
            None => Some(("anonymous", Caller::Ip(client_ip.key_of(req)?))),
        },
    );
    let tiers = Tiers::builder()
        .limited("anonymous", ["2/min".parse().unwrap()])
        .limited("free", ["2/min".parse().unwrap()])
        .build()
        .unwrap();
    let layer = SlidingWindowLayer::builder(by_tier)
        .tiers(tiers)
        .build()
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.clone()),
    )
    .await;
    let from = |forwarded_for: &'static str| async move {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::builder()
            .uri("/")
            .header("x-forwarded-for", forwarded_for)
            .body(Empty::<Bytes>::new())
            .unwrap();
        sender.send_request(req).await.unwrap().status().as_u16()
    };
    // Two addresses of one /64: one count.
    assert_eq!(from("2001:db8:1:2::a").await, 200);
    assert_eq!(from("2001:db8:1:2:ffff::b").await, 200);
    assert_eq!(from("2001:db8:1:2::c").await, 429);
    // A spoofed entry in front changes nothing: the proxy's entry, on the
    // right, is the client.
    assert_eq!(from("198.51.100.1, 2001:db8:1:2::d").await, 429);
    // Another /64, and an IPv4 client, have counts of their own.
    assert_eq!(from("2001:db8:1:3::a").await, 200);
    assert_eq!(from("198.51.100.1").await, 200);
    let anonymous = layer.tier_stores("anonymous").unwrap();
    let store = anonymous.iter().next().unwrap();
    let used = |ip: &str| store.usage(&Caller::Ip(ip.parse().unwrap())).used;
    assert_eq!(used("2001:db8:1:2::"), 2);
    assert_eq!(used("2001:db8:1:3::"), 1);
    assert_eq!(used("198.51.100.1"), 1);
}

#[tokio::test]
async fn shared_and_boxed_closures_key_a_layer_of_tiers() {
    use std::sync::Arc;
    use tower_sliding_window::extract::SharedTieredKeyFn;

    type Shared = SharedTieredKeyFn<Request<Body>, String, String>;
    let shared: Shared = tiered_key_fn(Arc::new(tier_and_user)
        as Arc<dyn Fn(&Request<Body>) -> Option<(String, String)> + Send + Sync>);
    let boxed = tiered_key_fn(Box::new(tier_and_user)
        as Box<dyn Fn(&Request<Body>) -> Option<(String, String)> + Send + Sync>);
    let shared_layer: SlidingWindowLayer<Shared> = SlidingWindowLayer::builder(shared)
        .tiers(table())
        .build()
        .unwrap();
    let boxed_layer = SlidingWindowLayer::builder(boxed)
        .tiers(table())
        .build()
        .unwrap();
    for addr in [app_of(shared_layer).await, app_of(boxed_layer).await] {
        assert_eq!(statuses(addr, "free", "ada", 3).await, [200, 200, 429]);
    }
}

async fn app_of<X>(layer: SlidingWindowLayer<X>) -> SocketAddr
where
    X: tower_sliding_window::KeyExtractor<Request<Body>>,
{
    serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

#[tokio::test]
async fn problem_details_name_the_tiers_policy_or_the_denied_tier() {
    let layer = SlidingWindowLayer::builder(by_tier())
        .tiers(table())
        .problem_details()
        .build()
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let violated = |response: &Response<Bytes>| -> serde_json::Value {
        assert_eq!(
            header(response, "content-type"),
            Some("application/problem+json")
        );
        let problem: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        problem["violated-policies"].clone()
    };
    statuses(addr, "free", "ada", 2).await;
    let free = send(addr, "free", "ada").await;
    assert_eq!(violated(&free), serde_json::json!(["free"]));
    let suspended = send(addr, "suspended", "mallory").await;
    assert_eq!(suspended.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(violated(&suspended), serde_json::json!(["suspended"]));
}

#[test]
fn mistakes_are_configuration_errors() {
    // Tiers with an extractor of keys alone, or policies with a tiered
    // one, do not compile (tests/compile/fail); a tiered extractor can still
    // reach `build` without its table.
    assert!(matches!(
        SlidingWindowLayer::builder(by_tier()).max_keys(10).build(),
        Err(ConfigError::NoTiers)
    ));
    assert!(matches!(
        SlidingWindowLayer::builder(by_tier())
            .tiers(table())
            .unknown_tier_fallback("gold")
            .build(),
        Err(ConfigError::UnknownFallbackTier { .. })
    ));
    // A change that drops the fallback tier is refused, and nothing changes.
    let layer = SlidingWindowLayer::builder(by_tier())
        .tiers(table())
        .unknown_tier_fallback("free")
        .build()
        .unwrap();
    let without_free = Tiers::builder().unlimited("internal").build().unwrap();
    assert!(matches!(
        layer.set_tiers(&without_free),
        Err(ConfigError::UnknownFallbackTier { .. })
    ));
    assert_eq!(layer.tiers().unwrap(), table());
}

#[tokio::test(start_paused = true)]
async fn a_count_no_compact_ring_holds_survives_a_change_through_a_small_limit() {
    use tower::ServiceExt;
    // A request costs what its `x-cost` header says.
    let cost = |req: &Request<Body>| -> u32 {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let big = || TierLimits::Limited(vec!["100000/min".parse().unwrap()]);
    let tiers = Tiers::builder()
        .limited("bulk", ["100000/min".parse().unwrap()])
        .build()
        .unwrap();
    let layer = SlidingWindowLayer::builder(by_tier())
        .tiers(tiers)
        .cost(cost)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer.clone());
    let call = |units: u32| {
        let req = Request::get("/")
            .header("x-tier", "bulk")
            .header("x-user", "ada")
            .header("x-cost", units.to_string())
            .body(Body::empty())
            .unwrap();
        let app = app.clone();
        async move { app.oneshot(req).await.unwrap().status() }
    };
    assert_eq!(call(100_000).await, StatusCode::OK);
    // Down to a limit a compact ring takes, and back, with no time passing:
    // the 100 000 units are all in the window.
    layer
        .set_tier("bulk", TierLimits::Limited(vec!["100/s".parse().unwrap()]))
        .unwrap();
    assert_eq!(call(1).await, StatusCode::TOO_MANY_REQUESTS);
    layer.set_tier("bulk", big()).unwrap();
    assert_eq!(call(34_465).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(call(1).await, StatusCode::TOO_MANY_REQUESTS);
}

//! An axum app keyed by the client's address but served without connect
//! info answers every request 500, and says why at WARN, naming the fix, at
//! most once a second. A test binary of its own: tracing caches each
//! callsite's interest globally, and the warning's throttle is the process's.

use axum::{routing::get, Router};
use http::{Request, StatusCode};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;
use tower_sliding_window::{ClientIp, PeerIp, Policy, SlidingWindowLayer};

/// A writer that keeps what tracing writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The WARN lines logged so far.
    fn warnings(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_owned)
            .collect()
    }
}

fn held_back(line: &str) -> u64 {
    let at = line.find("held_back=").expect("held_back") + "held_back=".len();
    line[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Requests to `app` as `axum::serve(listener, app)` hands them over, without
/// `into_make_service_with_connect_info`: no address in their extensions.
async fn status(app: &Router) -> StatusCode {
    let req = Request::get("/").body(axum::body::Body::empty()).unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

#[tokio::test(start_paused = true)]
async fn a_server_without_connect_info_warns_once_a_second_naming_the_fix() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let policy = Policy::per(100, Duration::from_secs(60)).unwrap();
    let by_peer = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(SlidingWindowLayer::new(policy.clone(), PeerIp::new()).unwrap());
    let by_client = Router::new().route("/", get(|| async { "ok" })).layer(
        SlidingWindowLayer::new(policy, ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]))
            .unwrap(),
    );

    // Ten requests in the first second (at 0, 99, ..., 891 ms), to either
    // extractor: one warning.
    for i in 0..10 {
        let app = if i % 2 == 0 { &by_peer } else { &by_client };
        assert_eq!(status(app).await, StatusCode::INTERNAL_SERVER_ERROR);
        tokio::time::advance(Duration::from_millis(99)).await;
    }
    let first = captured.warnings();
    assert_eq!(first.len(), 1, "{first:#?}");
    assert!(
        first[0].contains("into_make_service_with_connect_info::<SocketAddr>()"),
        "the fix is named: {}",
        first[0]
    );
    assert!(first[0].contains("no client address"), "{}", first[0]);
    assert_eq!(held_back(&first[0]), 0);

    // At 1 s, a second after the first: the next request logs again, with
    // the nine held back since.
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(status(&by_peer).await, StatusCode::INTERNAL_SERVER_ERROR);
    let second = captured.warnings();
    assert_eq!(second.len(), 2, "{second:#?}");
    assert_eq!(held_back(&second[1]), 9);
    assert!(second[1].contains("into_make_service_with_connect_info::<SocketAddr>()"));

    // Quiet for a second, then every request of the next ten seconds, one a
    // tenth of a second: one warning a second, no more.
    tokio::time::advance(Duration::from_secs(1)).await;
    for _ in 0..100 {
        assert_eq!(status(&by_client).await, StatusCode::INTERNAL_SERVER_ERROR);
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let all = captured.warnings();
    assert_eq!(all.len(), 2 + 10, "{all:#?}");
    let held: Vec<u64> = all[2..].iter().map(|w| held_back(w)).collect();
    assert_eq!(
        held,
        [0, 9, 9, 9, 9, 9, 9, 9, 9, 9],
        "none since the last, then nine a second"
    );
}

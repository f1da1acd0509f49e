//! Key logging, in a test binary of its own: tracing caches each callsite's
//! interest globally, so a test running beside it on another thread without a
//! subscriber could make these events invisible to a thread-local one.

mod layer_support;
use layer_support::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::Layer;
use tower_sliding_window::{key_fn, SlidingWindowLayer};

/// A writer that keeps what tracing writes, to check what gets logged.
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

async fn logs_of(layer_logs_keys: bool) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let builder =
        SlidingWindowLayer::builder(key_fn(user)).policy(policy("p", 1, Duration::from_secs(9)));
    let layer = if layer_logs_keys {
        builder.log_keys().build().unwrap()
    } else {
        builder.build().unwrap()
    };
    let mut svc = layer.layer(ok_service());
    status(&mut svc, request("secret-user-42")).await;
    status(&mut svc, request("secret-user-42")).await;
    let bytes = captured.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test(start_paused = true)]
async fn rejections_are_logged_and_keys_only_on_opt_in() {
    let quiet = logs_of(false).await;
    assert!(quiet.contains("rate limit: rejected"), "{quiet}");
    assert!(quiet.contains("policy=p"), "{quiet}");
    assert!(!quiet.contains("secret-user-42"), "{quiet}");

    let loud = logs_of(true).await;
    assert!(loud.contains("key=\"secret-user-42\""), "{loud}");
}

/// A store that cannot decide, as Redis failing closed during an outage.
struct Down(tower_sliding_window::Policy);

impl tower_sliding_window::Store<String> for Down {
    type Future = std::future::Ready<
        Result<tower_sliding_window::Decision, tower_sliding_window::StoreError>,
    >;

    fn check_n(&self, _key: &String, _cost: u32) -> Self::Future {
        std::future::ready(Err(self.error()))
    }

    fn check_now(
        &self,
        _key: &String,
        _cost: u32,
    ) -> Option<Result<tower_sliding_window::Decision, tower_sliding_window::StoreError>> {
        Some(Err(self.error()))
    }

    fn undo(&self, _key: &String, _decision: &tower_sliding_window::Decision) {}

    fn policy(&self) -> &tower_sliding_window::Policy {
        &self.0
    }
}

impl Down {
    fn error(&self) -> tower_sliding_window::StoreError {
        tower_sliding_window::StoreError::new(
            tower_sliding_window::StoreErrorKind::ConnectionRefused,
            Duration::from_secs(1),
        )
    }
}

/// An outage of 20 s at 200 requests a second (4 000 requests) logs about one
/// warning a second, each saying how many it held back, not one per request.
#[tokio::test(start_paused = true)]
async fn an_outage_logs_about_one_warning_a_second() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .store(Down(policy("p", 100, Duration::from_secs(60))))
        .build()
        .unwrap();
    let mut svc = layer.layer(ok_service());
    for _ in 0..4_000 {
        let (status, _) = status(&mut svc, request("u")).await;
        assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE);
        tokio::time::advance(Duration::from_millis(5)).await;
    }
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("store could not decide"))
        .collect();
    // One at 0 s, then one a second, the last at 19 s.
    assert_eq!(warnings.len(), 20, "{logs}");
    assert!(warnings.iter().all(|w| w.contains("WARN")), "{logs}");
    assert!(warnings[0].contains("kind=ConnectionRefused"), "{logs}");
    // Every request up to the last warning (at 19 s, the 3 801st) is accounted
    // for, logged or held back; the 199 after it are in the stats.
    let held: u64 = warnings
        .iter()
        .map(|w| {
            let at = w.find("held_back=").expect("held_back") + "held_back=".len();
            w[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(held + warnings.len() as u64, 3_801);
    assert_eq!(layer.stats().store_errors, 4_000);
}

/// A limiter behind a store that does not forward `charge` (the trait's
/// default: nothing counted past the limit).
struct NoCharge(tower_sliding_window::Limiter<String>);

impl tower_sliding_window::Store<String> for NoCharge {
    type Future = std::future::Ready<
        Result<tower_sliding_window::Decision, tower_sliding_window::StoreError>,
    >;

    fn check_n(&self, key: &String, cost: u32) -> Self::Future {
        std::future::ready(Ok(self.0.check_n(key, cost)))
    }

    fn undo(&self, key: &String, decision: &tower_sliding_window::Decision) {
        self.0.undo(key, decision)
    }

    fn policy(&self) -> &tower_sliding_window::Policy {
        self.0.policy()
    }
}

#[tokio::test(start_paused = true)]
async fn settlements_are_logged_and_an_excess_no_store_counts_warns() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let used = |_: http::StatusCode, headers: &http::HeaderMap| -> Option<u32> {
        headers.get("x-used")?.to_str().ok()?.parse().ok()
    };
    let answer_used = |used: &'static str| {
        tower::service_fn(move |_req: http::Request<Body>| async move {
            let response = http::Response::builder().header("x-used", used);
            Ok::<_, std::convert::Infallible>(response.body(String::new()).unwrap())
        })
    };
    let layer = SlidingWindowLayer::builder(key_fn(user))
        .cost(|_: &http::Request<Body>| 5)
        .policy(policy("tokens", 100, Duration::from_secs(60)))
        .settle(used)
        .log_keys()
        .build()
        .unwrap();
    status(
        &mut layer.layer(answer_used("2")),
        request("secret-user-42"),
    )
    .await;
    let plain = tower_sliding_window::Limiter::new(policy("plain", 100, Duration::from_secs(60)));
    let no_charge = SlidingWindowLayer::builder(key_fn(user))
        .cost(|_: &http::Request<Body>| 5)
        .store(NoCharge(plain.unwrap()))
        .settle(used)
        .build()
        .unwrap();
    status(
        &mut no_charge.layer(answer_used("9")),
        request("other-user"),
    )
    .await;
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("rate limit: settled"), "{logs}");
    assert!(logs.contains("policy=tokens"), "{logs}");
    assert!(logs.contains("given_back=3"), "{logs}");
    assert!(logs.contains("key=\"secret-user-42\""), "{logs}");
    assert!(logs.contains("an excess could not be charged"), "{logs}");
    assert!(
        logs.contains("policy=plain") && logs.contains("units=4"),
        "{logs}"
    );
    assert!(
        !logs.contains("other-user"),
        "keys only where the layer logs them: {logs}"
    );
}

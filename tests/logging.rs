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

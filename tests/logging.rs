//! Key logging, in a test binary of its own: tracing caches each callsite's
//! interest globally, so a test running beside it on another thread without a
//! subscriber could make these events invisible to a thread-local one.

type Body = String;
use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_sliding_window::{Policy, SlidingWindowLayer};

fn policy(name: &str, limit: u32, window: Duration) -> Policy {
    Policy::builder()
        .name(name)
        .limit(limit)
        .window(window)
        .build()
        .unwrap()
}

fn ok_service(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_req: Request<Body>| async { Ok::<_, Infallible>(Response::new("ok".to_owned())) })
}

fn request(user: &str) -> Request<Body> {
    Request::builder()
        .header("x-user", user)
        .body(String::new())
        .unwrap()
}

fn user(req: &Request<Body>) -> Option<String> {
    req.headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn status<S>(svc: &mut S, req: Request<Body>) -> (StatusCode, Option<String>)
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let response = svc.ready().await.unwrap().call(req).await.unwrap();
    let rate = response
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), rate)
}

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
    let builder = SlidingWindowLayer::builder(user).policy(policy("p", 1, Duration::from_secs(9)));
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

//! Races inside the layer's all-or-nothing check of several policies while
//! requests wait: a store whose check holds a thread at a chosen point, so a
//! second request runs in between. The hook sits where the public API has no
//! door (the check of an in-memory limiter), so these tests live in the crate.

use crate::extract::key_fn;
use crate::layer::local::LocalStore;
use crate::ring::WindowSnapshot;
use crate::{Policy, SlidingWindowLayer, WaitConfig};
use http::{Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

type Hook = Box<dyn FnOnce() + Send>;

/// An in-memory limiter whose check of a given cost first runs a hook, once:
/// it holds a thread at a chosen point of the layer's all-or-nothing check.
struct Hooked {
    limiter: crate::Limiter<String>,
    hooks: Mutex<Vec<(u32, Hook)>>,
}

impl Hooked {
    fn new(policy: Policy, hooks: Vec<(u32, Hook)>) -> Hooked {
        Hooked {
            limiter: crate::Limiter::new(policy).unwrap(),
            hooks: Mutex::new(hooks),
        }
    }
}

impl LocalStore<String> for Hooked {
    fn check_n(&self, key: &String, cost: u32) -> crate::Decision {
        let hook = {
            let mut hooks = self.hooks.lock().unwrap();
            let i = hooks.iter().position(|(c, _)| *c == cost);
            i.map(|i| hooks.remove(i).1)
        };
        if let Some(hook) = hook {
            hook();
        }
        self.limiter.check_n(key, cost)
    }

    fn window_snapshot(&self, key: &String) -> WindowSnapshot {
        LocalStore::window_snapshot(&self.limiter, key)
    }

    fn is_current(&self, decision: &crate::Decision) -> bool {
        LocalStore::is_current(&self.limiter, decision)
    }

    fn spend(&self, key: &String, decision: &crate::Decision) -> bool {
        LocalStore::spend(&self.limiter, key, decision)
    }
}

impl crate::Store<String> for Hooked {
    type Future = std::future::Ready<Result<crate::Decision, crate::StoreError>>;

    fn check_n(&self, key: &String, cost: u32) -> Self::Future {
        std::future::ready(Ok(LocalStore::check_n(self, key, cost)))
    }

    fn undo(&self, key: &String, decision: &crate::Decision) {
        self.limiter.undo(key, decision)
    }

    fn policy(&self) -> &Policy {
        self.limiter.policy()
    }
}

/// A hook that says it was reached, then waits to be let go.
fn rendezvous() -> (
    Hook,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    let (reached, on_reached) = std::sync::mpsc::channel();
    let (go, on_go) = std::sync::mpsc::channel::<()>();
    let hook: Hook = Box::new(move || {
        reached.send(()).unwrap();
        on_go.recv().unwrap();
    });
    (hook, on_reached, go)
}

/// Waits up to 10 s on two policies, p0 then p1 (100 ms buckets), with the
/// request's cost in its body; logs (cost, instant) of each request served.
fn two_hooked_policies(p0: Hooked, p1: Hooked) -> (impl CostService, CostLog) {
    let layer = SlidingWindowLayer::builder(key_fn(by_key_u32))
        .store(p0)
        .store(p1)
        .cost(|req: &Request<u32>| *req.body())
        .build_waiting(WaitConfig::bounded(ms(10_000), 8).unwrap(), |h| h)
        .unwrap();
    let served = CostLog::default();
    let log = served.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |req: Request<u32>| {
            log.lock().unwrap().push((*req.body(), Instant::now()));
            async { Ok::<_, Infallible>(Response::new(String::new())) }
        }));
    (svc, served)
}

type CostLog = Arc<Mutex<Vec<(u32, Instant)>>>;

trait CostService:
    Service<Request<u32>, Response = Response<String>, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> CostService for S where
    S: Service<
            Request<u32>,
            Response = Response<String>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

fn by_key_u32(req: &Request<u32>) -> Option<String> {
    req.headers()
        .get("x-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn costing(key: &str, cost: u32) -> Request<u32> {
    Request::builder().header("x-key", key).body(cost).unwrap()
}

fn p(name: &str, limit: u32) -> Policy {
    Policy::builder()
        .name(name)
        .limit(limit)
        .window(ms(1000))
        .buckets(10)
        .build()
        .unwrap()
}

/// Two requests for one key on two threads. `a` (cost 2) is counted by p0, then
/// denied by p1 and gives p0's units back; meanwhile `b` (cost 1) was denied by
/// p0 for them and became the head of the key's queue, polled at once. Once `a`
/// has given them back, every unit `b` needs is free and nobody is ahead of it:
/// it must be served then, not when its stale denial said (1 s).
#[tokio::test(start_paused = true)]
async fn a_head_denied_for_units_another_request_gives_back_is_woken_for_them() {
    let start = Instant::now();
    let (hold_a, a_counted_by_p0, let_a_go) = rendezvous();
    // p0: 2 per second; p1: 3 per second, 2 of them used.
    let p0 = Hooked::new(p("p0", 2), vec![]);
    let p1 = Hooked::new(p("p1", 3), vec![(2, hold_a)]);
    assert!(p1.limiter.check_n(&"k".to_owned(), 2).is_allowed());
    let (svc, served) = two_hooked_policies(p0, p1);
    let handle = tokio::runtime::Handle::current();

    let (mut svc_a, handle_a) = (svc.clone(), handle.clone());
    let a = std::thread::spawn(move || {
        let _runtime = handle_a.enter();
        svc_a.call(costing("k", 2))
    });
    a_counted_by_p0.recv().unwrap();
    let mut svc_b = svc.clone();
    let b = std::thread::spawn(move || {
        let _runtime = handle.enter();
        let mut b = Box::pin(svc_b.call(costing("k", 1)));
        // Its task polls it at once, before `a` gives its units back.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let polled = std::future::Future::poll(b.as_mut(), &mut cx);
        assert!(polled.is_pending(), "b waits for p0");
        b
    });
    let b = b.join().unwrap();
    let_a_go.send(()).unwrap();
    let a = a.join().unwrap();

    let (b, a) = (tokio::spawn(b), tokio::spawn(a));
    assert_eq!(b.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(a.await.unwrap().unwrap().status(), StatusCode::OK);
    let at: Vec<(u32, Duration)> = served
        .lock()
        .unwrap()
        .iter()
        .map(|&(cost, t)| (cost, t - start))
        .collect();
    // b at once; a when b's unit and p1's two leave their windows, a second
    // after them (to a step of the bucket), at the timer's next millisecond.
    assert_eq!(at, [(1, ms(0)), (2, ms(1001))]);
}

/// As above, but `a` (cost 2) is above p1's limit: it is turned away at once,
/// after `b`'s check outside the key's lock was denied for the units `a` held
/// in p0 (until 1.5 s), and before `b` joined the key's (then empty) queue.
/// `b` becomes the head: it must wait only for what it still needs once `a`
/// has given its units back (p1's unit, until 1 s), not sleep on that denial.
#[tokio::test(start_paused = true)]
async fn a_new_head_does_not_sleep_on_a_denial_taken_before_units_came_back() {
    let start = Instant::now();
    let (hold_a, a_counted_by_p0, let_a_go) = rendezvous();
    let (hold_b, b_denied_by_p0, let_b_go) = rendezvous();
    // p0: 2 per second; p1: 1 per second, used at 0.
    let p0 = Hooked::new(p("p0", 2), vec![]);
    let p1 = Hooked::new(p("p1", 1), vec![(2, hold_a), (1, hold_b)]);
    assert!(p1.limiter.check_n(&"k".to_owned(), 1).is_allowed());
    let (svc, served) = two_hooked_policies(p0, p1);
    tokio::time::advance(ms(500)).await;
    let handle = tokio::runtime::Handle::current();

    let (mut svc_a, handle_a) = (svc.clone(), handle.clone());
    let a = std::thread::spawn(move || {
        let _runtime = handle_a.enter();
        svc_a.call(costing("k", 2))
    });
    a_counted_by_p0.recv().unwrap();
    let mut svc_b = svc.clone();
    let b = std::thread::spawn(move || {
        let _runtime = handle.enter();
        svc_b.call(costing("k", 1))
    });
    b_denied_by_p0.recv().unwrap();
    let_a_go.send(()).unwrap();
    let a = a.join().unwrap();
    let_b_go.send(()).unwrap();
    let b = b.join().unwrap();

    assert_eq!(a.await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(b.await.unwrap().status(), StatusCode::OK);
    let at: Vec<(u32, Duration)> = served
        .lock()
        .unwrap()
        .iter()
        .map(|&(cost, t)| (cost, t - start))
        .collect();
    assert_eq!(at, [(1, ms(1001))], "b is served when p1's unit leaves");
}

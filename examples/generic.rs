//! The layer in front of a tower service that is not HTTP: a job queue whose
//! requests are plain structs. Over the limit, `call` returns a `RateLimited`
//! error (tower's `BoxError` convention) carrying the decision.
//! Run it with `cargo run --example generic`.

use std::time::Duration;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_sliding_window::{key_fn, Policy, RateLimited, SlidingWindowLayer};

#[derive(Debug)]
struct Job {
    tenant: &'static str,
    size: u32,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // 10 units per second per tenant; a job costs its size.
    let layer = SlidingWindowLayer::builder(key_fn(|job: &Job| Some(job.tenant)))
        .policy(Policy::per(10, Duration::from_secs(1))?)
        .cost(|job: &Job| job.size)
        .reject_with_errors()
        .build()?;
    let worker = service_fn(|job: Job| async move {
        Ok::<_, BoxError>(format!("ran {} units for {}", job.size, job.tenant))
    });
    let service = layer.layer(worker);

    let jobs = [
        ("acme", 4),
        ("acme", 4),
        ("acme", 4),
        ("globex", 8),
        ("acme", 11),
    ];
    for (tenant, size) in jobs {
        match service.clone().oneshot(Job { tenant, size }).await {
            Ok(done) => println!("ok       {done}"),
            Err(err) => match err.downcast_ref::<RateLimited>() {
                Some(limited) => {
                    let d = limited.decision();
                    println!(
                        "limited  {tenant} size {size}: {err} (remaining {}, retry after {:?})",
                        d.remaining(),
                        d.retry_after()
                    );
                }
                None => return Err(err),
            },
        }
    }
    Ok(())
}

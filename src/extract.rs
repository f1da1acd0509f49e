//! Turning a request into a rate-limit key.

use std::hash::Hash;

/// Pulls the rate-limit key out of a request. `None` means the request has no key;
/// what happens then is the layer's explicit choice (let it through, reject it, or
/// count it under a shared fallback key).
///
/// Any `Fn(&Req) -> Option<K>` closure is an extractor:
///
/// ```
/// use tower_sliding_window::KeyExtractor;
///
/// let by_user = |req: &http::Request<()>| {
///     req.headers().get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
/// };
/// let req = http::Request::builder().header("x-user", "ada").body(()).unwrap();
/// assert_eq!(by_user.extract(&req), Some("ada".to_owned()));
/// ```
pub trait KeyExtractor<Req>: Clone + Send + Sync + 'static {
    /// The key type.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// The request's key, or `None` when it has none.
    fn extract(&self, req: &Req) -> Option<Self::Key>;
}

impl<Req, K, F> KeyExtractor<Req> for F
where
    F: Fn(&Req) -> Option<K> + Clone + Send + Sync + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    type Key = K;

    #[inline]
    fn extract(&self, req: &Req) -> Option<K> {
        self(req)
    }
}

/// One key for every request: a global limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl<Req> KeyExtractor<Req> for GlobalKey {
    type Key = ();

    #[inline]
    fn extract(&self, _req: &Req) -> Option<()> {
        Some(())
    }
}

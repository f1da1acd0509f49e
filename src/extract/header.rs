//! [`HeaderKey`]: keys requests by one header's value.

use super::{KeyExtractor, Keyed};
use crate::ConfigError;
use http::header::HeaderName;

/// Keys requests by the value of one header, such as an API key.
///
/// The key is the value as a `String` (copied, so a key held by the limiter never
/// pins the request's receive buffer). The request has no key (`None`, the
/// layer's `None` outcome) when the header is missing, sent more than once
/// (ambiguous), empty, longer than [`max_len`](HeaderKey::max_len) bytes (256 by
/// default), or holds anything but visible ASCII (`!`..=`~`; no spaces, controls
/// or non-ASCII bytes). It never panics on any header bytes.
///
/// The client chooses the value: authenticate it before trusting it as an
/// identity, and do not let the `None` outcome bypass the limit.
///
/// ```
/// use tower_sliding_window::{HeaderKey, KeyExtractor};
///
/// let by_api_key = HeaderKey::named("x-api-key")?;
/// let req = http::Request::builder().header("x-api-key", "k-123").body(())?;
/// assert_eq!(by_api_key.extract(&req), Some("k-123".to_owned()));
///
/// let too_long = http::Request::builder().header("x-api-key", "k".repeat(300)).body(())?;
/// assert_eq!(by_api_key.extract(&too_long), None);
/// assert_eq!(by_api_key.extract(&http::Request::new(())), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// The longest value accepted unless [`max_len`](HeaderKey::max_len) says otherwise.
    pub const DEFAULT_MAX_LEN: usize = 256;

    /// Keys by the header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey {
            name,
            max_len: Self::DEFAULT_MAX_LEN,
        }
    }

    /// Keys by the header named `name` (case-insensitive); an invalid header name is
    /// a [`ConfigError`].
    pub fn named(name: &str) -> Result<Self, ConfigError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(Self::new)
            .map_err(|_| ConfigError::InvalidHeaderName {
                name: name.to_owned(),
            })
    }

    /// Values longer than `max_len` bytes give no key (1 or more; 256 by default).
    /// This bounds the memory a client can make the limiter hold per key.
    pub fn max_len(self, max_len: usize) -> Result<Self, ConfigError> {
        if max_len == 0 {
            return Err(ConfigError::ZeroMaxLen);
        }
        Ok(HeaderKey { max_len, ..self })
    }

    /// The header read.
    pub fn header_name(&self) -> &HeaderName {
        &self.name
    }
}

impl Keyed for HeaderKey {
    type Key = String;
    type Tiering = super::Untiered;
}

impl<B> KeyExtractor<http::Request<B>> for HeaderKey {
    fn extract(&self, req: &http::Request<B>) -> Option<String> {
        let mut values = req.headers().get_all(&self.name).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > self.max_len || !bytes.iter().all(u8::is_ascii_graphic)
        {
            return None;
        }
        // Visible ASCII is valid UTF-8.
        std::str::from_utf8(bytes).ok().map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// A request with `name` header lines.
    fn request(name: &str, lines: &[&[u8]]) -> http::Request<()> {
        let mut req = http::Request::new(());
        for line in lines {
            req.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(line).unwrap(),
            );
        }
        req
    }

    #[test]
    fn header_key_takes_visible_ascii_values_only() {
        let key = HeaderKey::named("X-Api-Key").unwrap();
        let get = |lines: &[&[u8]]| key.extract(&request("x-api-key", lines));
        assert_eq!(get(&[b"abc-123_XYZ~!"]), Some("abc-123_XYZ~!".to_owned()));
        assert_eq!(get(&[]), None, "missing");
        assert_eq!(get(&[b""]), None, "empty");
        assert_eq!(get(&[b"a", b"b"]), None, "sent twice");
        assert_eq!(get(&[b"a b"]), None, "space");
        assert_eq!(get(&[b"a\tb"]), None, "tab");
        assert_eq!(get(&[b"caf\xc3\xa9"]), None, "non-ASCII UTF-8");
        assert_eq!(get(&[b"\xff\xfe"]), None, "non-UTF-8");
        assert_eq!(get(&[&[b'k'; 256]]), Some("k".repeat(256)));
        assert_eq!(get(&[&[b'k'; 257]]), None, "over 256 bytes");
        let short = key.clone().max_len(3).unwrap();
        let req = request("x-api-key", &[b"abcd"]);
        assert_eq!(short.extract(&req), None);
        assert!(matches!(
            key.max_len(0),
            Err(ConfigError::Zero { setting: "max_len" })
        ));
        assert!(matches!(
            HeaderKey::named("bad header"),
            Err(ConfigError::InvalidHeaderName { name }) if name == "bad header"
        ));
        assert!(matches!(
            HeaderKey::named(""),
            Err(ConfigError::InvalidHeaderName { .. })
        ));
    }
}

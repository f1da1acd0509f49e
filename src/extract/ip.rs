//! [`PeerIp`] and [`ClientIp`]: keys requests by the client's IP address.

use super::forwarded::{self, ProxyHeader};
use super::net::{IpGrouping, IpNet};
use super::{KeyExtractor, Keyed};
use crate::log::Throttle;
use crate::ConfigError;
use http::StatusCode;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock};

/// The connection's peer address, as the server recorded it in the request's
/// extensions: axum's `ConnectInfo<SocketAddr>` (with the `axum` feature) or a
/// plain `SocketAddr` extension. Without one the server was set up without
/// recording it, which every request then shows: a warning names the fix,
/// at most once a second for the process (the count held back since).
fn peer_addr<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    let addr = req.extensions().get::<SocketAddr>().copied();
    if addr.is_none() {
        no_peer_address();
    }
    addr
}

/// The warning for a request without a peer address: a server
/// misconfiguration, one throttle for every extractor of the process.
#[cold]
fn no_peer_address() {
    static THROTTLE: LazyLock<Throttle> = LazyLock::new(Throttle::default);
    if let Some(held) = THROTTLE.admit() {
        tracing::warn!(
            held_back = held,
            "rate limit: request has no client address, so PeerIp and ClientIp give it no key \
             (500 by default); serve axum with \
             `into_make_service_with_connect_info::<SocketAddr>()`, or insert the \
             connection's `SocketAddr` into each request's extensions"
        );
    }
}

/// Keys requests by the peer's IP address: the address of the TCP connection,
/// IPv6 grouped by its /64 (see the [security notes](ClientIp#security-notes)).
///
/// The address is read from the request's extensions, where the server put it:
///
/// - **axum** (cargo feature `axum`): serve with
///   `app.into_make_service_with_connect_info::<SocketAddr>()`, which inserts
///   `axum::extract::ConnectInfo<SocketAddr>`.
/// - **hyper** or any server: insert the remote `SocketAddr` itself, e.g.
///   `req.extensions_mut().insert(remote_addr)` in the per-connection `service_fn`.
/// - **tonic** inserts `tonic::transport::server::TcpConnectInfo`; key with a
///   closure that reads it and groups the address with [`PeerIp::key_for`]:
///
/// ```
/// use std::net::IpAddr;
/// use tonic::transport::server::TcpConnectInfo;
/// use tower_sliding_window::{key_fn, KeyExtractor, PeerIp};
///
/// let peer = PeerIp::new();
/// let by_peer = key_fn(move |req: &http::Request<tonic::body::Body>| {
///     let info = req.extensions().get::<TcpConnectInfo>()?;
///     Some(peer.key_for(info.remote_addr()?.ip()))
/// });
///
/// let mut req = http::Request::new(tonic::body::Body::empty());
/// req.extensions_mut().insert(TcpConnectInfo {
///     local_addr: None,
///     remote_addr: Some("[2001:db8::7]:50051".parse()?),
/// });
/// assert_eq!(by_peer.extract(&req), Some("2001:db8::".parse::<IpAddr>()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A request without the address has no key (`None`), so the layer's
/// [`MissingKey`](crate::MissingKey) outcome applies (a 500 by default), and
/// a warning naming the fix is logged, at most once a second for the process
/// with the count held back since.
///
/// Behind a reverse proxy every request comes from the proxy; use [`ClientIp`].
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use tower_sliding_window::{KeyExtractor, PeerIp};
///
/// let peer = PeerIp::new();
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8:1:2:a:b:c:d]:50000".parse::<SocketAddr>()?);
/// assert_eq!(peer.extract(&req), Some("2001:db8:1:2::".parse::<IpAddr>()?));
///
/// let by_56 = PeerIp::new().ipv6_prefix(56)?;
/// assert_eq!(by_56.extract(&req), Some("2001:db8:1::".parse::<IpAddr>()?));
/// assert!(PeerIp::new().ipv6_prefix(129).is_err());
///
/// assert_eq!(peer.extract(&http::Request::new(())), None); // no address recorded
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp {
    grouping: IpGrouping,
}

impl PeerIp {
    /// Keys by peer address; IPv6 grouped by /64, IPv4 by whole address.
    pub fn new() -> Self {
        PeerIp::default()
    }

    /// Groups IPv6 addresses by their first `prefix_len` bits (0..=128; 64 by
    /// default). Out of range is a [`ConfigError`].
    pub fn ipv6_prefix(self, prefix_len: u8) -> Result<Self, ConfigError> {
        Ok(PeerIp {
            grouping: self.grouping.with_v6_prefix(prefix_len)?,
        })
    }

    /// Groups IPv4 addresses by their first `prefix_len` bits (0..=32; 32, one key
    /// per address, by default). Out of range is a [`ConfigError`].
    pub fn ipv4_prefix(self, prefix_len: u8) -> Result<Self, ConfigError> {
        Ok(PeerIp {
            grouping: self.grouping.with_v4_prefix(prefix_len)?,
        })
    }

    /// The key of a peer address: IPv4-mapped IPv6 made IPv4, then masked to the
    /// configured prefix. For servers that record the address in their own way.
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use tower_sliding_window::PeerIp;
    ///
    /// let ip: IpAddr = "::ffff:192.0.2.1".parse()?;
    /// assert_eq!(PeerIp::new().key_for(ip), "192.0.2.1".parse::<IpAddr>()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn key_for(&self, ip: IpAddr) -> IpAddr {
        self.grouping.key(ip)
    }

    /// The key of `req`, as this extractor keys it (the same as
    /// [`extract`](KeyExtractor::extract), without the trait in scope): for a
    /// [tiered extractor](crate::tiered_key_fn) that keys some tiers by
    /// address, as [`ClientIp::key_of`] shows.
    #[inline]
    pub fn key_of<B>(&self, req: &http::Request<B>) -> Option<IpAddr> {
        peer_addr(req).map(|addr| self.key_for(addr.ip()))
    }
}

impl Keyed for PeerIp {
    type Key = IpAddr;
    type Tiering = super::Untiered;

    /// 500: a request without a peer address reached a server set up without
    /// recording it (axum served without `ConnectInfo`, say).
    fn missing_key_status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

impl<B> KeyExtractor<http::Request<B>> for PeerIp {
    #[inline]
    fn extract(&self, req: &http::Request<B>) -> Option<IpAddr> {
        self.key_of(req)
    }
}

/// Which proxy hops [`ClientIp`] believes.
#[derive(Debug, Clone)]
enum Trust {
    /// Hops whose address lies in one of these networks.
    Networks(Arc<[IpNet]>),
    /// The first `n` hops from the right, whatever their address.
    Hops(usize),
}

/// Keys requests by the client's IP address behind trusted reverse proxies, read
/// from `X-Forwarded-For` (default) or `Forwarded` from the right. IPv6 is grouped
/// by /64 as in [`PeerIp`].
///
/// # The walk
///
/// Start at the peer address of the connection (found as [`PeerIp`] finds it;
/// without one the request has no key). While the current address is a trusted
/// proxy, step one entry left in the header (entries across several header lines
/// form one list, the last line rightmost; empty list elements are skipped). The
/// first address that is not a trusted proxy is the client and the key.
///
/// - **No proxy trusted** ([`ClientIp::new`], or an empty list): the headers are
///   never read; the key is the peer address. The client's own claim is never
///   believed by default.
/// - **The list runs out** while the current hop is still trusted (the request
///   came from the proxy itself, or the header is absent): the key is that last
///   trusted address.
/// - **A malformed entry** is reached (garbage, `unknown`, an obfuscated
///   `_identifier`, a `Forwarded` element without a readable `for=`, non-UTF-8
///   bytes, an address over 64 bytes, as an `X-Forwarded-For` entry or a
///   `for=` node): the walk stops and the key is the last
///   trustworthy address, the trusted proxy that wrote the entry. Such clients
///   share that proxy's key; they cannot choose a key of their own, and they
///   cannot reach the layer's `None` outcome either.
///
/// Trust proxies by network ([`ClientIp::trusting`]) where you can. Trusting a
/// count of hops ([`ClientIp::trusting_hops`]) believes the `n` nearest hops
/// whatever their address, so it is only sound when clients cannot reach the
/// server except through exactly those `n` proxies.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use tower_sliding_window::{ClientIp, KeyExtractor};
///
/// // Our load balancers live in 10.0.0.0/8.
/// let client_ip = ClientIp::trusting(["10.0.0.0/8".parse()?, "fd00::/8".parse()?]);
///
/// // The client prepended a spoofed entry; our proxy 10.0.0.2 appended the real one.
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9")
///     .body(())?;
/// req.extensions_mut().insert("10.0.0.2:41000".parse::<SocketAddr>()?);
/// assert_eq!(client_ip.extract(&req), Some("203.0.113.9".parse::<IpAddr>()?));
///
/// // Trusting nobody (the default), the header is ignored: the key is the peer.
/// assert_eq!(ClientIp::new().extract(&req), Some("10.0.0.2".parse::<IpAddr>()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Security notes
///
/// **Which address is the client's.** A request that passed through reverse
/// proxies arrives from the last proxy; the client's address is only known from
/// what the proxies wrote into `X-Forwarded-For` or `Forwarded`. Each proxy
/// *appends* the address it received the request from, so the list reads
/// `claimed…, client, proxy1, proxy2` and only its right end is trustworthy: every
/// entry left of the client's real address was sent by the client and can be
/// anything. [`ClientIp`] therefore walks the list from the right, starting at the
/// connection's peer address, and steps left only while the current hop is a proxy
/// you configured as trusted. The first address that is not a trusted proxy is the
/// client. Extractors that take the leftmost entry (as `tower_governor`'s
/// `SmartIpKeyExtractor` does) let every client pick its own key and so escape
/// any per-client limit, or exhaust someone else's.
///
/// **A spoofed `X-Forwarded-For` does not change the key.** With no trusted proxy
/// configured (the default) the headers are not read at all and the key is the
/// peer address. With trusted proxies, whatever the client prepends lies left of
/// the entry your own proxy appended, and the walk stops at that entry.
///
/// **Read the one header your proxy maintains.** A client can send both
/// `X-Forwarded-For` and `Forwarded`; only the one your trusted proxy appends to
/// has a trustworthy right end, so [`ClientIp`] reads exactly one
/// ([`ClientIp::header`]). List as trusted only proxies that append (or
/// overwrite) that header: a trusted hop that passes a client's header on
/// unchanged lets the client choose its key.
///
/// **IPv6 is grouped by prefix.** An IPv6 subscriber is normally handed a whole
/// /64 (often a /56 or /48), and picks addresses in it freely (privacy
/// extensions rotate them on their own), so one client could otherwise hold 2^64
/// keys. [`PeerIp`] and [`ClientIp`] mask IPv6 addresses to their /64 by default;
/// [`PeerIp::ipv6_prefix`] / [`ClientIp::ipv6_prefix`] pick another length (56 or
/// 48 is stricter, 128 keys every address). IPv4 addresses are keyed whole (/32)
/// unless [`ipv4_prefix`](PeerIp::ipv4_prefix) says otherwise. IPv4-mapped IPv6
/// addresses (`::ffff:192.0.2.1`, as dual-stack sockets report IPv4 peers) and
/// IPv4 clients behind NAT64's well-known prefix (`64:ff9b::192.0.2.1`) are
/// treated as the IPv4 address they carry. Like NAT for IPv4, grouping means the
/// devices of one /64 (one household or office) share a key.
///
/// **Header keys are chosen by the client.** [`HeaderKey`](super::HeaderKey) keys on whatever the
/// client sends; authenticate the value (or limit by [`ClientIp`] as well) before
/// relying on it, and pick a `None` outcome on the layer that does not let
/// header-less requests bypass the limit.
#[derive(Debug, Clone)]
pub struct ClientIp {
    trust: Trust,
    header: ProxyHeader,
    grouping: IpGrouping,
}

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp::new()
    }
}

impl ClientIp {
    /// Trusts no proxy: the key is the peer address, as with [`PeerIp`]. Add trust
    /// with [`trusting`](ClientIp::trusting) or [`trusting_hops`](ClientIp::trusting_hops).
    pub fn new() -> Self {
        ClientIp::trusting([])
    }

    /// Trusts the proxies whose addresses lie in `networks` (single addresses
    /// convert with `IpNet::from(ip)` or parse as `"192.0.2.7".parse()`).
    pub fn trusting(networks: impl IntoIterator<Item = IpNet>) -> Self {
        ClientIp {
            trust: Trust::Networks(networks.into_iter().collect()),
            header: ProxyHeader::default(),
            grouping: IpGrouping::default(),
        }
    }

    /// Trusts the `hops` nearest hops whatever their address: the peer and the
    /// `hops - 1` rightmost header entries are proxies, the entry left of them is
    /// the client. Sound only when no client can reach the server but through
    /// exactly `hops` proxies; prefer [`trusting`](ClientIp::trusting).
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use tower_sliding_window::{ClientIp, KeyExtractor};
    ///
    /// // client -> CDN -> load balancer -> us: two proxies.
    /// let client_ip = ClientIp::trusting_hops(2);
    /// let mut req = http::Request::builder()
    ///     .header("x-forwarded-for", "1.1.1.1, 198.51.100.7, 172.16.0.5")
    ///     .body(())?;
    /// req.extensions_mut().insert("172.16.0.9:443".parse::<SocketAddr>()?);
    /// assert_eq!(client_ip.extract(&req), Some("198.51.100.7".parse::<IpAddr>()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trusting_hops(hops: usize) -> Self {
        ClientIp {
            trust: Trust::Hops(hops),
            ..ClientIp::new()
        }
    }

    /// Reads the proxy chain from `header` instead of `X-Forwarded-For`. Only one
    /// header is ever read: use the one your proxy writes (and overwrites or
    /// appends to), since the client can send either.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use tower_sliding_window::extract::ProxyHeader;
    /// use tower_sliding_window::{ClientIp, KeyExtractor};
    ///
    /// let client_ip = ClientIp::trusting(["10.0.0.0/8".parse()?])
    ///     .header(ProxyHeader::Forwarded)
    ///     .ipv6_prefix(56)?;
    /// let mut req = http::Request::builder()
    ///     .header("forwarded", r#"for="[2001:db8:0:ab::1]:4711";proto=https, for=10.1.1.1"#)
    ///     .body(())?;
    /// req.extensions_mut().insert("10.0.0.2:41000".parse::<SocketAddr>()?);
    /// assert_eq!(client_ip.extract(&req), Some("2001:db8::".parse::<IpAddr>()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn header(self, header: ProxyHeader) -> Self {
        ClientIp { header, ..self }
    }

    /// Groups IPv6 client addresses by their first `prefix_len` bits (0..=128; 64 by
    /// default). Out of range is a [`ConfigError`].
    pub fn ipv6_prefix(self, prefix_len: u8) -> Result<Self, ConfigError> {
        Ok(ClientIp {
            grouping: self.grouping.with_v6_prefix(prefix_len)?,
            ..self
        })
    }

    /// Groups IPv4 client addresses by their first `prefix_len` bits (0..=32; 32 by
    /// default). Out of range is a [`ConfigError`].
    pub fn ipv4_prefix(self, prefix_len: u8) -> Result<Self, ConfigError> {
        Ok(ClientIp {
            grouping: self.grouping.with_v4_prefix(prefix_len)?,
            ..self
        })
    }

    /// The key for a request that arrived from `peer` with `headers`: the walk
    /// described [above](ClientIp#the-walk), then the prefix grouping. For servers
    /// that record the peer address in their own way (tonic's `TcpConnectInfo`).
    pub fn key_for(&self, peer: IpAddr, headers: &http::HeaderMap) -> IpAddr {
        self.grouping.key(self.client_addr(peer, headers))
    }

    /// The key of `req`, as this extractor keys it (the same as
    /// [`extract`](KeyExtractor::extract), without the trait in scope): the
    /// client's address behind the trusted proxies, IPv6 grouped by prefix.
    /// `None` without a peer address.
    ///
    /// A [tiered extractor](crate::tiered_key_fn) keys the callers it knows
    /// no better by it, with the walk and the grouping that a key of its own
    /// making would miss:
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use http::Request;
    /// use tower_sliding_window::{tiered_key_fn, ClientIp, KeyExtractor};
    ///
    /// #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    /// enum Caller {
    ///     Key(String),
    ///     Ip(IpAddr),
    /// }
    ///
    /// let client_ip = ClientIp::trusting(["10.0.0.0/8".parse()?]);
    /// let by_tier = tiered_key_fn(move |req: &Request<()>| match req.headers().get("x-api-key") {
    ///     Some(key) => Some(("free", Caller::Key(key.to_str().ok()?.to_owned()))),
    ///     None => Some(("anonymous", Caller::Ip(client_ip.key_of(req)?))),
    /// });
    ///
    /// // Behind our proxy 10.0.0.2, from an IPv6 address: keyed by its /64.
    /// let mut req = Request::builder()
    ///     .header("x-forwarded-for", "2001:db8:1:2:aaaa::7")
    ///     .body(())?;
    /// req.extensions_mut().insert("10.0.0.2:41000".parse::<SocketAddr>()?);
    /// assert_eq!(by_tier.extract(&req), Some(Caller::Ip("2001:db8:1:2::".parse()?)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key_of<B>(&self, req: &http::Request<B>) -> Option<IpAddr> {
        let peer = peer_addr(req)?;
        Some(self.key_for(peer.ip(), req.headers()))
    }

    fn client_addr(&self, peer: IpAddr, headers: &http::HeaderMap) -> IpAddr {
        let mut current = peer.to_canonical();
        let trusted_at = |ip: IpAddr, depth: usize| match &self.trust {
            Trust::Networks(nets) => nets.iter().any(|net| net.contains(ip)),
            Trust::Hops(hops) => depth < *hops,
        };
        if !trusted_at(current, 0) {
            return current; // never parse headers that nobody trusted wrote
        }
        // The peer is hop 0; header entries are hops 1, 2, … from the right.
        for (depth, hop) in (1..).zip(forwarded::hops_from_right(headers, self.header)) {
            match hop {
                Some(ip) => current = ip.to_canonical(),
                None => break, // malformed: stop at the trusted proxy that wrote it
            }
            if !trusted_at(current, depth) {
                break;
            }
        }
        current
    }
}

impl Keyed for ClientIp {
    type Key = IpAddr;
    type Tiering = super::Untiered;

    /// 500, as for [`PeerIp`]: the server recorded no peer address.
    fn missing_key_status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

impl<B> KeyExtractor<http::Request<B>> for ClientIp {
    fn extract(&self, req: &http::Request<B>) -> Option<IpAddr> {
        self.key_of(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::HeaderKey;
    use http::header::HeaderName;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    /// A request from `peer` (a `SocketAddr` extension) with `name` header lines.
    fn request(peer: &str, name: &str, lines: &[&[u8]]) -> http::Request<()> {
        let mut req = http::Request::new(());
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        for line in lines {
            req.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(line).unwrap(),
            );
        }
        req
    }

    fn xff(peer: &str, lines: &[&str]) -> http::Request<()> {
        let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        request(peer, "x-forwarded-for", &lines)
    }

    fn behind_10_8() -> ClientIp {
        ClientIp::trusting(nets(&["10.0.0.0/8"]))
    }

    #[test]
    fn peer_ip_keys_by_socket_addr_extension() {
        let req = xff("192.0.2.7:5000", &["6.6.6.6"]);
        assert_eq!(PeerIp::new().extract(&req), Some(ip("192.0.2.7")));
        assert_eq!(PeerIp::new().extract(&http::Request::new(())), None);
    }

    #[test]
    fn peer_ip_groups_ipv6_by_64_and_treats_mapped_ipv4_as_ipv4() {
        let a = xff("[2001:db8:aa:bb:1::1]:1", &[]);
        let b = xff("[2001:db8:aa:bb:ffff::2]:2", &[]);
        let other_64 = xff("[2001:db8:aa:bc::1]:1", &[]);
        let peer = PeerIp::new();
        assert_eq!(peer.extract(&a), Some(ip("2001:db8:aa:bb::")));
        assert_eq!(peer.extract(&a), peer.extract(&b));
        assert_ne!(peer.extract(&a), peer.extract(&other_64));
        let per_56 = PeerIp::new().ipv6_prefix(56).unwrap();
        assert_eq!(per_56.extract(&a), per_56.extract(&other_64));
        let mapped = xff("[::ffff:192.0.2.7]:5000", &[]);
        assert_eq!(peer.extract(&mapped), Some(ip("192.0.2.7")));
        let per_24 = PeerIp::new().ipv4_prefix(24).unwrap();
        assert_eq!(per_24.extract(&mapped), Some(ip("192.0.2.0")));
    }

    #[test]
    fn invalid_prefix_lengths_are_config_errors() {
        fn too_long<T>(r: Result<T, ConfigError>, len: u8, bits: u8) -> bool {
            matches!(r, Err(ConfigError::PrefixTooLong { prefix_len, max }) if prefix_len == len && max == bits)
        }
        assert!(too_long(PeerIp::new().ipv6_prefix(129), 129, 128));
        assert!(too_long(PeerIp::new().ipv4_prefix(33), 33, 32));
        assert!(too_long(ClientIp::new().ipv6_prefix(200), 200, 128));
        assert!(too_long(ClientIp::new().ipv4_prefix(255), 255, 32));
        assert!(PeerIp::new().ipv6_prefix(0).is_ok());
        assert!(ClientIp::new().ipv6_prefix(128).is_ok());
    }

    #[cfg(feature = "axum")]
    #[test]
    fn peer_ip_reads_axum_connect_info() {
        let mut req = http::Request::new(());
        let addr: SocketAddr = "198.51.100.4:80".parse().unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        assert_eq!(PeerIp::new().extract(&req), Some(ip("198.51.100.4")));
        let mut req = xff("10.0.0.1:1", &["198.51.100.9"]);
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        assert_eq!(
            behind_10_8().extract(&req),
            Some(ip("198.51.100.4")),
            "ConnectInfo wins over a SocketAddr extension"
        );
    }

    #[test]
    fn trusting_no_proxy_ignores_the_headers() {
        let req = xff("203.0.113.5:1", &["6.6.6.6"]);
        assert_eq!(ClientIp::new().extract(&req), Some(ip("203.0.113.5")));
        let req = xff("10.0.0.1:1", &["6.6.6.6"]);
        assert_eq!(ClientIp::new().extract(&req), Some(ip("10.0.0.1")));
        assert_eq!(
            ClientIp::trusting_hops(0).extract(&req),
            Some(ip("10.0.0.1"))
        );
        assert_eq!(ClientIp::new().extract(&http::Request::new(())), None);
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_claims() {
        let req = xff("203.0.113.5:1", &["10.0.0.7, 10.0.0.8"]);
        assert_eq!(behind_10_8().extract(&req), Some(ip("203.0.113.5")));
    }

    #[test]
    fn spoofed_leftmost_entries_do_not_change_the_key() {
        let client = Some(ip("203.0.113.9"));
        for spoof in [
            "203.0.113.9",
            "6.6.6.6, 203.0.113.9",
            "10.0.0.3, 203.0.113.9",
            "garbage, , unknown, 203.0.113.9",
            "1.1.1.1, 2.2.2.2, 3.3.3.3, 4.4.4.4, 203.0.113.9",
        ] {
            let req = xff("10.0.0.2:443", &[spoof]);
            assert_eq!(behind_10_8().extract(&req), client, "{spoof}");
        }
        let split = xff("10.0.0.2:443", &["6.6.6.6", "203.0.113.9"]);
        assert_eq!(behind_10_8().extract(&split), client);
    }

    #[test]
    fn walks_through_many_trusted_hops() {
        let proxies: Vec<String> = (1..=20).map(|i| format!("10.0.{i}.1")).collect();
        let mut entries = vec!["6.6.6.6".to_owned(), "198.51.100.23".to_owned()];
        entries.extend(proxies);
        let line = entries.join(", ");
        let req = xff("10.255.0.1:1", &[&line]);
        assert_eq!(behind_10_8().extract(&req), Some(ip("198.51.100.23")));
        // The same chain spread over several header lines.
        let lines: Vec<&str> = entries.iter().map(String::as_str).collect();
        let req = xff("10.255.0.1:1", &lines);
        assert_eq!(behind_10_8().extract(&req), Some(ip("198.51.100.23")));
    }

    #[test]
    fn mixed_trust_lists_and_ipv6_proxies() {
        let client_ip =
            ClientIp::trusting(nets(&["192.0.2.10", "2001:db8:ffff::/48", "10.0.0.0/8"]));
        let req = xff(
            "[::ffff:10.1.1.1]:1",
            &["6.6.6.6, [2001:db8:1:2:3::9]:5555, 192.0.2.10, 2001:db8:ffff::1"],
        );
        assert_eq!(client_ip.extract(&req), Some(ip("2001:db8:1:2::")));
        let per_128 = client_ip.ipv6_prefix(128).unwrap();
        assert_eq!(per_128.extract(&req), Some(ip("2001:db8:1:2:3::9")));
    }

    #[test]
    fn chain_of_only_trusted_hops_keys_the_leftmost_one() {
        let req = xff("10.0.0.2:1", &["10.0.0.9, 10.0.0.5"]);
        assert_eq!(behind_10_8().extract(&req), Some(ip("10.0.0.9")));
        let no_header = xff("10.0.0.2:1", &[]);
        assert_eq!(behind_10_8().extract(&no_header), Some(ip("10.0.0.2")));
        let blank = xff("10.0.0.2:1", &["", " , "]);
        assert_eq!(behind_10_8().extract(&blank), Some(ip("10.0.0.2")));
    }

    #[test]
    fn a_malformed_entry_stops_at_the_proxy_that_wrote_it() {
        for line in [
            "203.0.113.9, garbage",
            "203.0.113.9, unknown, 10.0.0.5",
            "203.0.113.9, 10.0.0.5:99999",
            "203.0.113.9, _hidden",
        ] {
            let req = xff("10.0.0.2:1", &[line]);
            let want = if line.ends_with("10.0.0.5") {
                "10.0.0.5"
            } else {
                "10.0.0.2"
            };
            assert_eq!(behind_10_8().extract(&req), Some(ip(want)), "{line}");
        }
        let non_utf8 = request("10.0.0.2:1", "x-forwarded-for", &[b"203.0.113.9, \xff\xfe"]);
        assert_eq!(behind_10_8().extract(&non_utf8), Some(ip("10.0.0.2")));
        let too_long = format!("203.0.113.9, {}", "1".repeat(10_000));
        let req = xff("10.0.0.2:1", &[&too_long]);
        assert_eq!(behind_10_8().extract(&req), Some(ip("10.0.0.2")));
    }

    #[test]
    fn forwarded_header_quoted_ipv6_and_obfuscated_nodes() {
        let client_ip = behind_10_8().header(ProxyHeader::Forwarded);
        let fwd = |peer: &str, lines: &[&str]| {
            let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
            client_ip.extract(&request(peer, "forwarded", &lines))
        };
        assert_eq!(
            fwd(
                "10.0.0.2:1",
                &[
                    r#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https, for=10.9.9.9;by=_lb"#
                ]
            ),
            Some(ip("2001:db8:cafe::"))
        );
        assert_eq!(
            fwd("10.0.0.2:1", &[r#"for="_gazonk""#, "for=10.0.0.3"]),
            Some(ip("10.0.0.3")),
            "an obfuscated client is keyed as the proxy that hid it"
        );
        assert_eq!(
            fwd("10.0.0.2:1", &[r#"for=unknown, for="192.0.2.60:8080""#]),
            Some(ip("192.0.2.60"))
        );
        assert_eq!(
            fwd("10.0.0.2:1", &[r#"for="6.6.6.6, for=192.0.2.60"#]),
            Some(ip("192.0.2.60")),
            "the client's unbalanced quote does not swallow the proxy's entry"
        );
        // Reading Forwarded, a client-sent X-Forwarded-For is ignored, and vice versa.
        let mut req = xff("10.0.0.2:1", &["6.6.6.6"]);
        req.headers_mut()
            .append("forwarded", HeaderValue::from_static("for=192.0.2.60"));
        assert_eq!(client_ip.extract(&req), Some(ip("192.0.2.60")));
        let mut req = request("10.0.0.2:1", "forwarded", &[b"for=6.6.6.6"]);
        req.headers_mut()
            .append("x-forwarded-for", HeaderValue::from_static("192.0.2.61"));
        assert_eq!(behind_10_8().extract(&req), Some(ip("192.0.2.61")));
    }

    #[test]
    fn trusting_hops_counts_from_the_peer() {
        let req = xff("172.16.0.9:1", &["6.6.6.6, 198.51.100.7, 172.16.0.5"]);
        let key = |hops| ClientIp::trusting_hops(hops).extract(&req);
        assert_eq!(key(1), Some(ip("172.16.0.5")));
        assert_eq!(key(2), Some(ip("198.51.100.7")));
        assert_eq!(key(3), Some(ip("6.6.6.6")));
        assert_eq!(
            key(9),
            Some(ip("6.6.6.6")),
            "a short chain keys its leftmost hop"
        );
        let garbage = xff("172.16.0.9:1", &["198.51.100.7, nonsense"]);
        assert_eq!(
            ClientIp::trusting_hops(2).extract(&garbage),
            Some(ip("172.16.0.9"))
        );
    }

    #[test]
    fn key_for_serves_servers_with_their_own_connect_info() {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_static("2001:db8::1"));
        assert_eq!(
            behind_10_8().key_for(ip("10.0.0.1"), &headers),
            ip("2001:db8::")
        );
    }

    /// Header values as a server can receive them: any bytes `http` accepts,
    /// biased towards the characters the parsers branch on.
    fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
        let interesting = prop::sample::select(
            b"0123456789abcdefABCDEF.:[],;=\"\\_ \tforFORunknw\xff\x80".to_vec(),
        );
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..80),
            prop::collection::vec(interesting, 0..120),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_header_bytes_never_panic_and_always_key_a_peer(
            lines in prop::collection::vec(header_bytes(), 0..4),
        ) {
            let lines: Vec<&[u8]> = lines
                .iter()
                .map(Vec::as_slice)
                .filter(|l| HeaderValue::from_bytes(l).is_ok())
                .collect();
            for name in ["x-forwarded-for", "forwarded", "x-api-key"] {
                let req = request("10.0.0.2:1", name, &lines);
                let _ = HeaderKey::named("x-api-key").unwrap().extract(&req);
                let via_xff = behind_10_8().extract(&req);
                let via_forwarded = behind_10_8().header(ProxyHeader::Forwarded).extract(&req);
                prop_assert!(via_xff.is_some() && via_forwarded.is_some());
                prop_assert!(ClientIp::trusting_hops(3).extract(&req).is_some());
                // Trusting nobody, no header bytes can move the key off the peer.
                prop_assert_eq!(ClientIp::new().extract(&req), PeerIp::new().extract(&req));
            }
        }

        #[test]
        fn anything_the_client_prepends_leaves_the_key_unchanged(
            spoof in header_bytes().prop_filter("a valid header value", |b| HeaderValue::from_bytes(b).is_ok()),
        ) {
            let client = Some(ip("203.0.113.9"));
            let mut line = spoof.clone();
            line.extend_from_slice(b", 203.0.113.9");
            let req = request("10.0.0.2:1", "x-forwarded-for", &[&spoof, &line]);
            prop_assert_eq!(behind_10_8().extract(&req), client);
            let mut line = spoof.clone();
            line.extend_from_slice(b", for=203.0.113.9;proto=https");
            let req = request("10.0.0.2:1", "forwarded", &[&spoof, &line]);
            prop_assert_eq!(behind_10_8().header(ProxyHeader::Forwarded).extract(&req), client);
        }
    }
}

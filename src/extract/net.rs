//! IP networks (CIDR blocks) for trusted-proxy lists, and grouping of client
//! addresses by prefix.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::ConfigError;

/// An IP network in CIDR notation, such as `10.0.0.0/8` or `2001:db8::/32`.
///
/// Used to list the reverse proxies [`ClientIp`](crate::ClientIp) trusts. A bare
/// address (`192.0.2.7`) parses as a single-host network (/32 or /128). Host bits
/// below the prefix are cleared (`10.1.2.3/8` is `10.0.0.0/8`). An IPv4-mapped IPv6
/// network (`::ffff:10.0.0.0/104`) becomes the IPv4 network it denotes, since
/// mapped addresses are compared as IPv4; with a prefix shorter than 96, which
/// would mask the mapping away, it is an error.
///
/// ```
/// use std::net::IpAddr;
/// use tower_sliding_window::extract::IpNet;
///
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.200.3.4".parse::<IpAddr>()?));
/// assert!(net.contains("::ffff:10.1.1.1".parse::<IpAddr>()?)); // IPv4-mapped IPv6
/// assert!(!net.contains("11.0.0.1".parse::<IpAddr>()?));
///
/// let v6: IpNet = "2001:db8::/32".parse()?;
/// assert!(v6.contains("2001:db8:ffff::1".parse::<IpAddr>()?));
/// assert!("10.0.0.0/33".parse::<IpNet>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix_len: u8,
}

impl IpNet {
    /// The network of `addr` with a prefix of `prefix_len` bits (0..=32 for IPv4,
    /// 0..=128 for IPv6); host bits are cleared.
    ///
    /// ```
    /// use std::net::Ipv4Addr;
    /// use tower_sliding_window::extract::IpNet;
    ///
    /// let net = IpNet::new(Ipv4Addr::new(192, 168, 7, 9).into(), 16)?;
    /// assert_eq!(net.to_string(), "192.168.0.0/16");
    /// # Ok::<(), tower_sliding_window::ConfigError>(())
    /// ```
    pub fn new(addr: IpAddr, prefix_len: u8) -> Result<Self, ConfigError> {
        let (addr, prefix_len) = match addr {
            IpAddr::V4(_) if prefix_len > 32 => {
                return Err(ConfigError::PrefixTooLong {
                    prefix_len,
                    max: 32,
                })
            }
            IpAddr::V6(_) if prefix_len > 128 => {
                return Err(ConfigError::PrefixTooLong {
                    prefix_len,
                    max: 128,
                })
            }
            // ::ffff:a.b.c.d/n with n >= 96 is the IPv4 network a.b.c.d/(n - 96).
            // A shorter prefix masks the mapping away (::ffff:10.0.0.0/8 would be
            // ::/8, trusting ::1 and no IPv4 peer): surely not what was meant.
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) if prefix_len >= 96 => (IpAddr::V4(v4), prefix_len - 96),
                Some(_) => return Err(ConfigError::MappedPrefixTooShort { prefix_len }),
                None => (addr, prefix_len),
            },
            IpAddr::V4(_) => (addr, prefix_len),
        };
        Ok(IpNet {
            addr: mask(addr, prefix_len),
            prefix_len,
        })
    }

    /// The network address (host bits cleared).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether `ip` lies in this network. IPv4-mapped IPv6 addresses
    /// (`::ffff:a.b.c.d`) are compared as the IPv4 address they carry.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix_len) == self.addr
    }
}

impl From<IpAddr> for IpNet {
    /// The single-host network of `addr` (/32 or /128).
    fn from(addr: IpAddr) -> Self {
        let addr = addr.to_canonical();
        let prefix_len = if addr.is_ipv4() { 32 } else { 128 };
        IpNet { addr, prefix_len }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Why a string is not an [`IpNet`].
#[derive(Debug)]
#[non_exhaustive]
pub enum IpNetParseError {
    /// The part before `/` is not an IPv4 or IPv6 address.
    InvalidAddress,
    /// The part after `/` is not a decimal number of at most 255.
    InvalidPrefixLength,
    /// The prefix length makes no network of this address: longer than the
    /// address, or an IPv4-mapped network below /96 (the source says which).
    Network(ConfigError),
}

impl fmt::Display for IpNetParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid IP network: ")?;
        match self {
            IpNetParseError::InvalidAddress => {
                f.write_str("expected an IPv4 or IPv6 address before '/'")
            }
            IpNetParseError::InvalidPrefixLength => {
                f.write_str("the prefix length must be a decimal number up to 128")
            }
            IpNetParseError::Network(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for IpNetParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IpNetParseError::Network(e) => Some(e),
            _ => None,
        }
    }
}

impl FromStr for IpNet {
    type Err = IpNetParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| IpNetParseError::InvalidAddress)?;
        match prefix {
            None => Ok(IpNet::from(addr)),
            Some(prefix) => {
                // u8::from_str accepts a leading '+'; CIDR notation does not.
                if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(IpNetParseError::InvalidPrefixLength);
                }
                let prefix_len: u8 = prefix
                    .parse()
                    .map_err(|_| IpNetParseError::InvalidPrefixLength)?;
                IpNet::new(addr, prefix_len).map_err(IpNetParseError::Network)
            }
        }
    }
}

/// `ip` with every bit after the first `prefix_len` cleared (`prefix_len` already checked).
pub(crate) fn mask(ip: IpAddr, prefix_len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(mask_v4(v4, prefix_len)),
        IpAddr::V6(v6) => IpAddr::V6(mask_v6(v6, prefix_len)),
    }
}

/// How client addresses become keys: IPv6 addresses grouped by prefix (a /64 by
/// default, since one IPv6 subscriber is handed a whole /64 or more), IPv4 by a
/// prefix too (/32 by default: one key per address). IPv4-mapped IPv6 addresses
/// (`::ffff:a.b.c.d`) and IPv4 clients translated by NAT64's well-known prefix
/// (`64:ff9b::a.b.c.d`, RFC 6052) are treated as the IPv4 address they carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpGrouping {
    v4_prefix: u8,
    v6_prefix: u8,
}

impl Default for IpGrouping {
    fn default() -> Self {
        IpGrouping {
            v4_prefix: 32,
            v6_prefix: 64,
        }
    }
}

impl IpGrouping {
    pub(crate) fn with_v6_prefix(self, prefix_len: u8) -> Result<Self, ConfigError> {
        if prefix_len > 128 {
            return Err(ConfigError::PrefixTooLong {
                prefix_len,
                max: 128,
            });
        }
        Ok(IpGrouping {
            v6_prefix: prefix_len,
            ..self
        })
    }

    pub(crate) fn with_v4_prefix(self, prefix_len: u8) -> Result<Self, ConfigError> {
        if prefix_len > 32 {
            return Err(ConfigError::PrefixTooLong {
                prefix_len,
                max: 32,
            });
        }
        Ok(IpGrouping {
            v4_prefix: prefix_len,
            ..self
        })
    }

    /// The key of a client address.
    #[inline]
    pub(crate) fn key(&self, ip: IpAddr) -> IpAddr {
        // Per family on integers, building the `IpAddr` once at the end, rather
        // than canonicalising to an `IpAddr` and matching it again in `mask`:
        // this runs for every request keyed by address.
        match ip {
            IpAddr::V4(v4) => IpAddr::V4(mask_v4(v4, self.v4_prefix)),
            IpAddr::V6(v6) => match embedded_v4(v6) {
                Some(v4) => IpAddr::V4(mask_v4(v4, self.v4_prefix)),
                None => IpAddr::V6(mask_v6(v6, self.v6_prefix)),
            },
        }
    }
}

/// `v4` with every bit after the first `prefix_len` (0..=32) cleared.
fn mask_v4(v4: Ipv4Addr, prefix_len: u8) -> Ipv4Addr {
    let bits = u32::from(v4);
    Ipv4Addr::from(match prefix_len {
        0 => 0,
        1..=31 => bits & !(u32::MAX >> prefix_len),
        _ => bits,
    })
}

/// `v6` with every bit after the first `prefix_len` (0..=128) cleared.
fn mask_v6(v6: Ipv6Addr, prefix_len: u8) -> Ipv6Addr {
    let bits = u128::from(v6);
    Ipv6Addr::from(match prefix_len {
        0 => 0,
        1..=127 => bits & !(u128::MAX >> prefix_len),
        _ => bits,
    })
}

/// NAT64's well-known prefix, `64:ff9b::/96` (RFC 6052).
const NAT64_WELL_KNOWN: u128 = 0x0064_ff9b_0000_0000_0000_0000_0000_0000;

/// The IPv4 address an IPv6 address stands for, if it is IPv4-mapped or NAT64
/// translated: behind an IPv6-only front with NAT64, every IPv4 client arrives
/// from one /64, which would make them all one key.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    if bits >> 32 == NAT64_WELL_KNOWN >> 32 {
        return Some(Ipv4Addr::from(bits as u32));
    }
    v6.to_ipv4_mapped()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_cidr_blocks_and_bare_addresses() {
        let net: IpNet = "10.1.2.3/8".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert_eq!("192.0.2.7".parse::<IpNet>().unwrap().prefix_len(), 32);
        assert_eq!("2001:db8::1".parse::<IpNet>().unwrap().prefix_len(), 128);
        assert_eq!(
            "2001:db8:1:2::/48".parse::<IpNet>().unwrap().to_string(),
            "2001:db8:1::/48"
        );
        assert_eq!("0.0.0.0/0".parse::<IpNet>().unwrap().prefix_len(), 0);
        assert_eq!("::/0".parse::<IpNet>().unwrap().prefix_len(), 0);
    }

    #[test]
    fn rejects_malformed_networks() {
        for bad in [
            "",
            "/8",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/8/8",
            "10.0.0.0/300",
            "::/129",
            "10.0.0/8",
            "[::1]/128",
            "garbage",
        ] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad:?} parsed");
        }
        // Each reason has its own variant.
        let why = |s: &str| s.parse::<IpNet>().unwrap_err();
        assert!(matches!(why("garbage"), IpNetParseError::InvalidAddress));
        assert!(matches!(
            why("10.0.0.0/+8"),
            IpNetParseError::InvalidPrefixLength
        ));
        assert!(matches!(
            why("10.0.0.0/300"),
            IpNetParseError::InvalidPrefixLength
        ));
        assert!(matches!(
            why("::/129"),
            IpNetParseError::Network(ConfigError::PrefixTooLong {
                prefix_len: 129,
                max: 128
            })
        ));
        assert!(matches!(
            why("::ffff:10.0.0.0/8"),
            IpNetParseError::Network(ConfigError::MappedPrefixTooShort { prefix_len: 8 })
        ));
    }

    #[test]
    fn contains_respects_prefix_and_family() {
        let net: IpNet = "192.168.0.0/16".parse().unwrap();
        assert!(net.contains(ip("192.168.255.255")));
        assert!(!net.contains(ip("192.169.0.0")));
        assert!(!net.contains(ip("::c0a8:1")), "IPv4-compatible is not IPv4");
        assert!(net.contains(ip("::ffff:192.168.1.1")));
        let all_v4: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(all_v4.contains(ip("255.255.255.255")));
        assert!(!all_v4.contains(ip("2001:db8::1")));
        let v6: IpNet = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fdff:ffff::1")));
        assert!(!v6.contains(ip("fe00::1")));
    }

    #[test]
    fn a_mapped_network_shorter_than_the_mapping_is_an_error() {
        // ::ffff:10.0.0.0/8 would mask the mapping away (::/8, trusting ::1).
        assert!("::ffff:10.0.0.0/8".parse::<IpNet>().is_err());
        assert!("::ffff:10.0.0.0/95".parse::<IpNet>().is_err());
        let err = IpNet::new("::ffff:10.0.0.0".parse().unwrap(), 8).unwrap_err();
        assert!(err.to_string().contains("96"), "{err}");
        assert_eq!(
            "::ffff:10.0.0.0/104".parse::<IpNet>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert!("::/8".parse::<IpNet>().is_ok());
    }

    #[test]
    fn mapped_ipv6_networks_become_ipv4() {
        let net: IpNet = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains(ip("10.9.9.9")));
    }

    #[test]
    fn grouping_masks_ipv6_to_64_and_keeps_ipv4_by_default() {
        let g = IpGrouping::default();
        assert_eq!(g.key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(g.key(ip("203.0.113.9")), ip("203.0.113.9"));
        assert_eq!(g.key(ip("::ffff:203.0.113.9")), ip("203.0.113.9"));
        // NAT64: each translated IPv4 client keeps its own key.
        assert_eq!(g.key(ip("64:ff9b::203.0.113.9")), ip("203.0.113.9"));
        assert_eq!(g.key(ip("64:ff9b::198.51.100.7")), ip("198.51.100.7"));
        assert_eq!(g.key(ip("64:ff9b:1::203.0.113.9")), ip("64:ff9b:1::"));
        let g = g.with_v6_prefix(56).unwrap().with_v4_prefix(24).unwrap();
        assert_eq!(g.key(ip("2001:db8:1:2ff::1")), ip("2001:db8:1:200::"));
        assert_eq!(g.key(ip("203.0.113.9")), ip("203.0.113.0"));
        let g = g.with_v6_prefix(0).unwrap().with_v4_prefix(0).unwrap();
        assert_eq!(g.key(ip("2001:db8::1")), ip("::"));
        assert_eq!(g.key(ip("203.0.113.9")), ip("0.0.0.0"));
        let g = g.with_v6_prefix(128).unwrap();
        assert_eq!(g.key(ip("2001:db8::1")), ip("2001:db8::1"));
    }

    #[test]
    fn grouping_rejects_out_of_range_prefixes() {
        assert!(IpGrouping::default().with_v6_prefix(129).is_err());
        assert!(IpGrouping::default().with_v4_prefix(33).is_err());
        assert!(IpGrouping::default().with_v6_prefix(u8::MAX).is_err());
    }
}

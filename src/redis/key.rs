//! Turning a rate-limit key into the bytes of its Redis key.

use std::borrow::Cow;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// A key a [`RedisStore`](crate::RedisStore) can count: it writes itself as bytes.
///
/// The store wraps these bytes in a hash tag, `prefix{bytes}`, so every key's data
/// lives in one Redis Cluster slot. Distinct keys of one type must write distinct
/// bytes; keys of *different* types may collide (`"1"` and `1u64` both write `1`),
/// so give each policy that uses another key type its own prefix.
///
/// Implemented for strings and byte strings (as they are), integers and IP / socket
/// addresses (their `Display` form; IPv6 in its canonical compressed form, a
/// socket address's nonzero flow label appended as `/label`), `()`
/// (the global key, empty), and references, `Box`es and `Arc`s of those.
///
/// ```
/// use tower_sliding_window::redis::RedisKey;
///
/// let mut out = Vec::new();
/// "10.0.0.1".parse::<std::net::IpAddr>().unwrap().write_redis_key(&mut out);
/// assert_eq!(out, b"10.0.0.1");
/// ```
pub trait RedisKey {
    /// Append this key's bytes to `out`.
    fn write_redis_key(&self, out: &mut Vec<u8>);
}

impl RedisKey for str {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl RedisKey for String {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl RedisKey for Cow<'_, str> {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl RedisKey for [u8] {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl RedisKey for Vec<u8> {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

/// The global key (see [`GlobalKey`](crate::GlobalKey)): no bytes, so `prefix{}`.
impl RedisKey for () {
    fn write_redis_key(&self, _out: &mut Vec<u8>) {}
}

impl<T: RedisKey + ?Sized> RedisKey for &T {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        (**self).write_redis_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Box<T> {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        (**self).write_redis_key(out)
    }
}

impl<T: RedisKey + ?Sized> RedisKey for Arc<T> {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        (**self).write_redis_key(out)
    }
}

macro_rules! display_keys {
    ($($t:ty),*) => {$(
        impl RedisKey for $t {
            fn write_redis_key(&self, out: &mut Vec<u8>) {
                // Writing into a Vec cannot fail.
                let _ = write!(out, "{self}");
            }
        }
    )*};
}

display_keys!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, char, IpAddr, Ipv4Addr,
    Ipv6Addr
);

/// The `Display` form, which leaves out an IPv6 flow label: `/label` follows
/// when there is one (no address form contains a `/`), so addresses that differ
/// only there stay distinct keys, as they are in memory.
impl RedisKey for SocketAddr {
    fn write_redis_key(&self, out: &mut Vec<u8>) {
        let _ = write!(out, "{self}");
        if let SocketAddr::V6(v6) = self {
            if v6.flowinfo() != 0 {
                let _ = write!(out, "/{}", v6.flowinfo());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<K: RedisKey + ?Sized>(k: &K) -> Vec<u8> {
        let mut out = Vec::new();
        k.write_redis_key(&mut out);
        out
    }

    #[test]
    fn keys_write_their_natural_bytes() {
        assert_eq!(bytes("alice"), b"alice");
        assert_eq!(bytes(&String::from("bob")), b"bob");
        assert_eq!(bytes(&42u64), b"42");
        assert_eq!(bytes(&-7i32), b"-7");
        assert_eq!(bytes(&()), b"");
        let v6: IpAddr = "2001:db8:0:0::1".parse().unwrap();
        assert_eq!(bytes(&v6), b"2001:db8::1");
        assert_eq!(bytes(&Arc::<str>::from("x")), b"x");
    }
}

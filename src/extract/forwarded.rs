//! Parsing of the proxy chain headers `X-Forwarded-For` and `Forwarded` (RFC 7239),
//! read from the right, one hop at a time.
//!
//! Every function here takes raw header bytes and returns `None` for anything it
//! cannot read with certainty; none of them panics on any input.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::header::{HeaderMap, HeaderName, FORWARDED};

/// `X-Forwarded-For` (not a registered header, so `http` has no constant for it).
pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The longest node a proxy can write: `"[ffff:…:255.255.255.255]:65535"` is 53
/// bytes; anything much longer is garbage and is not parsed at all.
const MAX_NODE_LEN: usize = 64;

/// Which header carries the proxy chain.
///
/// Pick the one your reverse proxy writes. [`ClientIp`](crate::ClientIp) reads
/// exactly one of them, never both: a client can send either header itself, so
/// reading the one your proxy does not maintain would hand the key to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, AWS ALB,
    /// Cloudflare, most load balancers). The default.
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"` (RFC 7239).
    /// Only the `for` parameter is read.
    Forwarded,
}

/// The hops the header lists, rightmost (nearest to us) first, across all header
/// lines (a later line continues the list of an earlier one). `None` is an entry
/// that names no IP address: garbage, an obfuscated identifier (`_hidden`),
/// `unknown`, or a `Forwarded` element without a usable `for=`. Empty list
/// elements are skipped, as HTTP list syntax requires.
pub(crate) fn hops_from_right(
    headers: &HeaderMap,
    header: ProxyHeader,
) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    let name = match header {
        ProxyHeader::XForwardedFor => &X_FORWARDED_FOR,
        ProxyHeader::Forwarded => &FORWARDED,
    };
    headers
        .get_all(name)
        .iter()
        .rev()
        .flat_map(move |line| RSplitList {
            rest: Some(line.as_bytes()),
            quotes: header == ProxyHeader::Forwarded,
        })
        .map(trim_ows)
        .filter(|element| !element.is_empty())
        .map(move |element| match header {
            ProxyHeader::XForwardedFor => parse_xff_entry(element),
            ProxyHeader::Forwarded => forwarded_for(element),
        })
}

/// One `X-Forwarded-For` entry: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:8080`.
pub(crate) fn parse_xff_entry(entry: &[u8]) -> Option<IpAddr> {
    let entry = trim_ows(entry);
    if entry.len() > MAX_NODE_LEN {
        return None;
    }
    let entry = std::str::from_utf8(entry).ok()?;
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = entry.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    let inner = entry.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// The address in the `for` parameter of one `Forwarded` element, such as
/// `for=192.0.2.60;proto=http;by=203.0.113.43` or `for="[2001:db8:cafe::17]:4711"`.
/// `None` when the element is malformed, has no `for` (or two), or names no address.
pub(crate) fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let mut found = None;
    for pair in split_outside_quotes(element, b';') {
        let pair = trim_ows(pair);
        if pair.is_empty() {
            continue; // `[ forwarded-pair ]` is optional between semicolons
        }
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (name, value) = (&pair[..eq], &pair[eq + 1..]);
        if name.is_empty() || !name.iter().copied().all(is_tchar) {
            return None;
        }
        let value = param_value(value)?;
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None; // RFC 7239 §4: a parameter must not occur twice in an element
            }
            found = Some(value);
        }
    }
    parse_node(&found?)
}

/// A `Forwarded` node: `192.0.2.60`, `192.0.2.60:80`, `[2001:db8::17]`,
/// `[2001:db8::17]:4711`, with the port possibly obfuscated (`:_abc`). `unknown` and
/// obfuscated identifiers (`_hidden`) name no address and give `None`.
pub(crate) fn parse_node(node: &str) -> Option<IpAddr> {
    if node.len() > MAX_NODE_LEN {
        return None;
    }
    if let Some(rest) = node.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = ip.parse().ok()?;
        return match after {
            "" => Some(IpAddr::V6(ip)),
            _ => valid_port(after.strip_prefix(':')?).then_some(IpAddr::V6(ip)),
        };
    }
    match node.split_once(':') {
        None => node.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        Some((ip, port)) if !port.contains(':') => {
            let ip: Ipv4Addr = ip.parse().ok()?;
            valid_port(port).then_some(IpAddr::V4(ip))
        }
        // A bare IPv6 address; RFC 7239 wants it quoted and bracketed, but its
        // meaning is unambiguous.
        Some(_) => node.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
    }
}

/// `port = 1*5DIGIT / obfport`, `obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-")`.
fn valid_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obf) => {
            !obf.is_empty()
                && obf
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => port.parse::<u16>().is_ok() && port.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// A parameter value: a token, or a quoted-string with its escapes undone.
fn param_value(raw: &[u8]) -> Option<Cow<'_, str>> {
    match raw.strip_prefix(b"\"") {
        None => {
            if raw.is_empty() || !raw.iter().copied().all(is_tchar) {
                return None;
            }
            std::str::from_utf8(raw).ok().map(Cow::Borrowed)
        }
        Some(quoted) => {
            let mut out = String::with_capacity(quoted.len());
            let mut bytes = quoted.iter().copied();
            while let Some(b) = bytes.next() {
                match b {
                    b'"' => {
                        // The closing quote must end the value.
                        return bytes.next().is_none().then_some(Cow::Owned(out));
                    }
                    b'\\' => out.push(char::from(printable_ascii(bytes.next()?)?)),
                    _ => out.push(char::from(printable_ascii(b)?)),
                }
            }
            None // unterminated quoted-string
        }
    }
}

/// Splits at `sep` bytes that are not inside a quoted-string (`"…"`, with `\"`
/// escapes), left to right. An unterminated quote swallows the rest, which then
/// fails to parse.
fn split_outside_quotes(bytes: &[u8], sep: u8) -> Vec<&[u8]> {
    let mut parts = Vec::with_capacity(4);
    let (mut start, mut in_quotes, mut escaped) = (0, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if in_quotes && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            in_quotes = !in_quotes;
        } else if !in_quotes && b == sep {
            parts.push(&bytes[start..i]);
            start = i + 1;
        }
    }
    parts.push(&bytes[start..]);
    parts
}

/// The elements of one comma-separated header line, rightmost first, without
/// allocating. With `quotes` (`Forwarded`), commas inside quoted-strings do not
/// split.
///
/// Scanning from the right means the elements our proxies appended are cut
/// correctly whatever the client put before them: a client's unbalanced quote
/// (`Forwarded: for="` joined by a proxy with `, for=203.0.113.9`) cannot swallow
/// the proxy's entry. Going leftwards, a quote is escaped when an odd number of
/// backslashes precedes it.
struct RSplitList<'a> {
    rest: Option<&'a [u8]>,
    quotes: bool,
}

impl<'a> Iterator for RSplitList<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let bytes = self.rest?;
        let mut in_quotes = false;
        for i in (0..bytes.len()).rev() {
            match bytes[i] {
                b'"' if self.quotes => {
                    let backslashes = bytes[..i].iter().rev().take_while(|&&b| b == b'\\').count();
                    if backslashes % 2 == 0 {
                        in_quotes = !in_quotes;
                    }
                }
                b',' if !in_quotes => {
                    self.rest = Some(&bytes[..i]);
                    return Some(&bytes[i + 1..]);
                }
                _ => {}
            }
        }
        self.rest = None;
        Some(bytes)
    }
}

/// Visible ASCII, space or tab: what a quoted-string may hold (obs-text is refused).
fn printable_ascii(b: u8) -> Option<u8> {
    (b == b'\t' || (0x20..0x7f).contains(&b)).then_some(b)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Strips optional whitespace (SP / HTAB) from both ends.
fn trim_ows(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn hops(header: ProxyHeader, lines: &[&[u8]]) -> Vec<Option<IpAddr>> {
        let mut headers = HeaderMap::new();
        let name = match header {
            ProxyHeader::XForwardedFor => X_FORWARDED_FOR.clone(),
            ProxyHeader::Forwarded => FORWARDED,
        };
        for line in lines {
            headers.append(name.clone(), HeaderValue::from_bytes(line).unwrap());
        }
        hops_from_right(&headers, header).collect()
    }

    #[test]
    fn xff_entries_in_every_written_form() {
        assert_eq!(parse_xff_entry(b"192.0.2.1"), Some(ip("192.0.2.1")));
        assert_eq!(parse_xff_entry(b" 192.0.2.1:8080\t"), Some(ip("192.0.2.1")));
        assert_eq!(parse_xff_entry(b"2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(parse_xff_entry(b"[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(
            parse_xff_entry(b"[2001:db8::1]:443"),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(
            parse_xff_entry(b"::ffff:192.0.2.1"),
            Some(ip("::ffff:192.0.2.1"))
        );
    }

    #[test]
    fn xff_garbage_is_no_address() {
        for bad in [
            &b""[..],
            b"unknown",
            b"_hidden",
            b"192.0.2",
            b"192.0.2.1:99999",
            b"192.0.2.1:",
            b"[2001:db8::1",
            b"[192.0.2.1]",
            b"2001:db8::1:443:x",
            b"\xff\xfe",
            b"1.2.3.4 5.6.7.8",
            b"localhost",
        ] {
            assert_eq!(parse_xff_entry(bad), None, "{bad:?}");
        }
        let long = format!("{}1.2.3.4", " ".repeat(10) + &"0".repeat(100));
        assert_eq!(parse_xff_entry(long.as_bytes()), None);
    }

    #[test]
    fn xff_hops_run_right_to_left_across_lines() {
        let got = hops(
            ProxyHeader::XForwardedFor,
            &[b"1.1.1.1, 2.2.2.2", b" ,3.3.3.3 ,, garbage,4.4.4.4 ,"],
        );
        assert_eq!(
            got,
            vec![
                Some(ip("4.4.4.4")),
                None,
                Some(ip("3.3.3.3")),
                Some(ip("2.2.2.2")),
                Some(ip("1.1.1.1")),
            ]
        );
        assert!(hops(ProxyHeader::XForwardedFor, &[b"", b" , ,"]).is_empty());
    }

    #[test]
    fn forwarded_quoted_ipv6_with_port() {
        assert_eq!(
            forwarded_for(br#"for="[2001:db8:cafe::17]:4711""#),
            Some(ip("2001:db8:cafe::17"))
        );
        assert_eq!(
            forwarded_for(br#"For="[2001:db8:cafe::17]";proto=https"#),
            Some(ip("2001:db8:cafe::17"))
        );
        assert_eq!(
            forwarded_for(b"for=192.0.2.60;proto=http;by=203.0.113.43"),
            Some(ip("192.0.2.60"))
        );
        assert_eq!(
            forwarded_for(br#"proto=http; for="192.0.2.60:_port"; by=_proxy"#),
            Some(ip("192.0.2.60"))
        );
        assert_eq!(
            forwarded_for(br#"for="\[2001:db8::1\]:80""#),
            Some(ip("2001:db8::1")),
            "quoted-pair escapes are undone"
        );
    }

    #[test]
    fn forwarded_obfuscated_and_unknown_nodes_name_no_address() {
        for bad in [
            &br#"for=unknown"#[..],
            br#"for="unknown""#,
            br#"for=_hidden"#,
            br#"for="_SEVKISEK""#,
            br#"for="[2001:db8::17]:99999""#,
            br#"for="[2001:db8::17]:""#,
            br#"for="[2001:db8::17]x""#,
            br#"for="[192.0.2.1]""#,
            br#"for=[2001:db8::17]"#, // brackets are not token characters
            br#"for="192.0.2.1:_""#,
            br#"proto=https"#,
            br#"for=1.2.3.4;for=5.6.7.8"#,
            br#"for="1.2.3.4"#,
            br#"for="1.2.3.4"x"#,
            br#"for=1.2.3.4;=x"#,
            br#"for=1.2.3.4;proto"#,
            br#"for="#,
            b"for=\"\xff\"",
            b"for=\"1.2.3.4\x7f\"",
            b"",
        ] {
            assert_eq!(forwarded_for(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn forwarded_hops_respect_quoted_commas() {
        let got = hops(
            ProxyHeader::Forwarded,
            &[
                br#"for="_a,b";proto=http, for=192.0.2.43"#,
                br#"for="[2001:db8::1]:4711", for=unknown ,for=198.51.100.17;by=x"#,
            ],
        );
        assert_eq!(
            got,
            vec![
                Some(ip("198.51.100.17")),
                None,
                Some(ip("2001:db8::1")),
                Some(ip("192.0.2.43")),
                None,
            ]
        );
    }

    #[test]
    fn forwarded_unbalanced_quote_cannot_swallow_entries_to_its_right() {
        let got = hops(ProxyHeader::Forwarded, &[br#"for="1.2.3.4, for=5.6.7.8"#]);
        assert_eq!(got, vec![Some(ip("5.6.7.8")), None]);
        let got = hops(
            ProxyHeader::Forwarded,
            &[br#"for="\", for=\"x", for="[2001:db8::1]", for=5.6.7.8"#],
        );
        assert_eq!(got[..2], [Some(ip("5.6.7.8")), Some(ip("2001:db8::1"))]);
    }
}

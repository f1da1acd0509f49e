//! Key extraction over a real connection: an axum server on 127.0.0.1 served with
//! `into_make_service_with_connect_info::<SocketAddr>()`, a hyper client sending
//! (spoofed) `X-Forwarded-For` headers, and a handler that echoes the keys the
//! extractors compute. Independent of the layer: it proves what key a request
//! would be counted under.
#![cfg(feature = "axum")]

mod layer_support;

use layer_support::serve;
use std::net::SocketAddr;

use axum::{extract::Request, routing::get, Router};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower_sliding_window::extract::ProxyHeader;
use tower_sliding_window::{ClientIp, HeaderKey, KeyExtractor, PeerIp};

/// The keys of one request, as `peer=… client=… untrusted=… forwarded=… api=…`.
async fn echo_keys(req: Request) -> String {
    // The test client on 127.0.0.1 plays our reverse proxy.
    let behind_loopback = ClientIp::trusting(["127.0.0.1".parse().unwrap()]);
    let behind_other = ClientIp::trusting(["10.0.0.0/8".parse().unwrap()]);
    let show = |key: Option<std::net::IpAddr>| key.map_or("none".to_owned(), |ip| ip.to_string());
    format!(
        "peer={} client={} untrusted={} forwarded={} api={}",
        show(PeerIp::new().extract(&req)),
        show(behind_loopback.extract(&req)),
        show(behind_other.extract(&req)),
        show(behind_loopback.header(ProxyHeader::Forwarded).extract(&req)),
        HeaderKey::named("x-api-key")
            .unwrap()
            .extract(&req)
            .unwrap_or_else(|| "none".to_owned()),
    )
}

async fn keys_for(addr: SocketAddr, headers: &[(&str, &str)]) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = http::Request::get(format!("http://{addr}/"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn spoofed_forwarded_for_does_not_change_the_key() {
    let addr = serve(Router::new().route("/", get(echo_keys))).await;

    let plain = keys_for(addr, &[]).await;
    assert_eq!(
        plain,
        "peer=127.0.0.1 client=127.0.0.1 untrusted=127.0.0.1 forwarded=127.0.0.1 api=none"
    );

    // Our "proxy" (the loopback client) appended the real client 203.0.113.9;
    // everything left of it was sent by the client and is ignored.
    let want = "peer=127.0.0.1 client=203.0.113.9 untrusted=127.0.0.1 forwarded=127.0.0.1 api=none";
    for xff in [
        "203.0.113.9",
        "6.6.6.6, 203.0.113.9",
        "127.0.0.1, 203.0.113.9",
        "garbage, unknown, 203.0.113.9",
        "1.1.1.1,2.2.2.2,3.3.3.3, 203.0.113.9",
    ] {
        assert_eq!(
            keys_for(addr, &[("x-forwarded-for", xff)]).await,
            want,
            "{xff}"
        );
    }
    // A spoofed Forwarded header does not count while X-Forwarded-For is read.
    let both = keys_for(
        addr,
        &[
            ("x-forwarded-for", "203.0.113.9"),
            ("forwarded", "for=6.6.6.6"),
        ],
    )
    .await;
    assert_eq!(
        both, "peer=127.0.0.1 client=203.0.113.9 untrusted=127.0.0.1 forwarded=6.6.6.6 api=none",
        "reading the header our proxy does not write would hand the key to the client"
    );
}

#[tokio::test]
async fn ipv6_clients_are_grouped_by_64_and_headers_keyed() {
    let addr = serve(Router::new().route("/", get(echo_keys))).await;
    for client in ["2001:db8:1:2::1", "[2001:db8:1:2:ffff::9]:4711"] {
        let got = keys_for(
            addr,
            &[
                ("x-forwarded-for", &format!("6.6.6.6, {client}")),
                ("x-api-key", "k-123"),
            ],
        )
        .await;
        assert_eq!(
            got,
            "peer=127.0.0.1 client=2001:db8:1:2:: untrusted=127.0.0.1 forwarded=127.0.0.1 api=k-123"
        );
    }
    let got = keys_for(
        addr,
        &[("forwarded", r#"for=6.6.6.6, for="[2001:db8:1:2::1]:4711""#)],
    )
    .await;
    assert_eq!(
        got,
        "peer=127.0.0.1 client=127.0.0.1 untrusted=127.0.0.1 forwarded=2001:db8:1:2:: api=none"
    );
}

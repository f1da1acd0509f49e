//! The Redis store over TLS (feature `redis-tls`), against a private
//! `redis-server` that serves TLS only (`--port 0 --tls-port <ephemeral>`),
//! with a CA and a server certificate made here by `rcgen` for 127.0.0.1. The
//! test that starts the server is `#[ignore]`d like the other Redis tests: run
//! it with `cargo test --all-features -- --include-ignored`; it fails, saying
//! so, when `redis-server` has no TLS support.
#![cfg(feature = "redis-tls")]

mod redis_support;

use redis_support::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tower_sliding_window::redis::redis::{self, TlsCertificates};
use tower_sliding_window::{FailurePolicy, Policy, RedisStore, Store, StoreErrorKind};

/// With `REQUIRE_REDIS=1` (CI) the ignored Redis tests below must be run.
#[test]
fn redis_tests_are_included_where_redis_is_required() {
    assert_included_where_required();
}

/// A CA, and a server certificate it signed for 127.0.0.1 and localhost, as
/// PEM files in a directory of their own (removed on drop).
struct Certificates {
    dir: PathBuf,
    ca_pem: String,
}

impl Certificates {
    fn new(test: &str) -> Certificates {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "tower-sliding-window test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();

        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        server_params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();

        let dir = std::env::temp_dir().join(unique_prefix(test).replace(':', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_pem = ca_cert.pem();
        std::fs::write(dir.join("ca.crt"), &ca_pem).unwrap();
        std::fs::write(dir.join("server.crt"), server_cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
        Certificates { dir, ca_pem }
    }

    /// The `redis-server` arguments that serve TLS with these files, without
    /// asking clients for certificates.
    fn server_args(&self) -> Vec<String> {
        let file = |name: &str| self.dir.join(name).to_string_lossy().into_owned();
        vec![
            "--tls-cert-file".into(),
            file("server.crt"),
            "--tls-key-file".into(),
            file("server.key"),
            "--tls-ca-cert-file".into(),
            file("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn builder() -> tower_sliding_window::redis::RedisStoreBuilder {
    RedisStore::builder(
        Policy::per(3, Duration::from_secs(10)).unwrap(),
        FailurePolicy::Closed,
    )
    .timeout(Duration::from_secs(2))
}

#[tokio::test]
#[ignore = "starts redis-server with TLS (or REDIS_SERVER_BIN): run with -- --include-ignored"]
async fn decisions_round_trip_over_tls_to_a_server_the_client_trusts() {
    let test = "decisions_round_trip_over_tls_to_a_server_the_client_trusts";
    let certificates = Certificates::new(test);
    let server = RedisServer::start_tls(test, certificates.server_args()).await;
    let url = server.url();
    assert!(url.starts_with("rediss://127.0.0.1:"), "{url}");

    // Trusting the test CA (and only it), through a client of our own.
    let client = redis::Client::build_with_tls(
        url.as_str(),
        TlsCertificates {
            client_tls: None,
            root_cert: Some(certificates.ca_pem.clone().into_bytes()),
        },
    )
    .unwrap();
    let prefix = unique_prefix(test);
    let store = builder().client(client).prefix(&prefix).build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = store.warm_up().await {
        assert!(Instant::now() < deadline, "no TLS round trip in 5 s: {e:?}");
    }
    // The fleet limit, decided by Redis over TLS: 3 allowed, then denied.
    for remaining in [2, 1, 0] {
        let d = store.check_n(&"k", 1).await.unwrap();
        assert!(d.is_allowed() && !d.is_unchecked(), "{d:?}");
        assert_eq!(d.remaining(), remaining);
    }
    assert!(!store.check_n(&"k", 1).await.unwrap().is_allowed());
    let stats = store.stats();
    assert_eq!((stats.round_trips, stats.failures), (4, 0), "{stats:?}");

    // A `rediss://` URL is accepted, and the certificate is checked: the
    // built-in roots do not know the test CA, so the handshake fails.
    let untrusting = builder()
        .url(&url)
        .prefix(&prefix)
        .circuit_breaker(tower_sliding_window::redis::CircuitBreaker::OFF)
        .build()
        .unwrap();
    let error = untrusting.check_n(&"k", 1).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Connection, "{error}");
    let chain = format!("{error} / {:?}", std::error::Error::source(&error));
    eprintln!("without the test CA: {chain}");
    assert!(
        chain.to_lowercase().contains("certificate"),
        "not a certificate error: {chain}"
    );
}

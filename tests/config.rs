//! Limits read from configuration: the policy notation and, with the `serde`
//! feature, tier tables from TOML, YAML and JSON.

use std::time::Duration;
use tower_sliding_window::{ConfigError, Policy, PolicyParseError};

#[test]
fn policy_notation_parses_the_units_people_write() {
    let cases = [
        ("100/min", 100, 60),
        ("10/s", 10, 1),
        ("5000/h", 5000, 3600),
        ("100 per 30s", 100, 30),
        ("7 / 1h30m", 7, 5400),
        ("1_000/d", 1000, 86_400),
    ];
    for (text, limit, secs) in cases {
        let policy: Policy = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(policy.limit(), limit, "{text}");
        assert_eq!(policy.window(), Duration::from_secs(secs), "{text}");
    }
}

#[test]
fn policy_notation_names_what_is_wrong() {
    assert!(matches!(
        "100".parse::<Policy>(),
        Err(PolicyParseError::Syntax { .. })
    ));
    assert!(matches!(
        "x/min".parse::<Policy>(),
        Err(PolicyParseError::Limit { .. })
    ));
    assert!(matches!(
        "10/fortnight".parse::<Policy>(),
        Err(PolicyParseError::Window { .. })
    ));
    assert!(matches!(
        "0/min".parse::<Policy>(),
        Err(PolicyParseError::Invalid(ConfigError::Zero {
            setting: "limit"
        }))
    ));
}

#[cfg(feature = "serde")]
mod serde_tables {
    use super::*;
    use tower_sliding_window::{Precision, TierLimits, Tiers};

    fn assert_table(tiers: &Tiers) {
        // Formats differ in whether they keep a map's order; the set is what counts.
        let mut names: Vec<&str> = tiers.iter().map(|(name, _)| name).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["anonymous", "free", "internal", "paid", "suspended"]
        );
        let anonymous = tiers.get("anonymous").unwrap().policies();
        assert_eq!(
            (anonymous[0].limit(), anonymous[0].name()),
            (20, "anonymous")
        );
        let paid = tiers.get("paid").unwrap().policies();
        assert_eq!(paid.len(), 2);
        assert_eq!((paid[0].limit(), paid[0].name()), (5000, "paid"));
        assert_eq!((paid[1].limit(), paid[1].name()), (100_000, "daily"));
        assert_eq!(paid[1].window(), Duration::from_secs(86_400));
        assert_eq!(paid[1].buckets(), 24);
        assert_eq!(paid[1].precision(), Precision::Interpolated);
        assert_eq!(tiers.get("internal"), Some(&TierLimits::Unlimited));
        assert_eq!(tiers.get("suspended"), Some(&TierLimits::Denied));
    }

    #[test]
    fn the_same_table_reads_from_toml_yaml_and_json() {
        let toml = r#"
            anonymous = "20/min"
            free = "100 per 1m"
            paid = ["5000/min", { limit = 100000, window = "1d", buckets = 24, precision = "interpolated", name = "daily" }]
            internal = "unlimited"
            suspended = "denied"
        "#;
        let yaml = r#"
anonymous: 20/min
free: 100 per 1m
paid:
  - 5000/min
  - { limit: 100000, window: 1d, buckets: 24, precision: interpolated, name: daily }
internal: unlimited
suspended: denied
"#;
        let json = r#"{
            "anonymous": "20/min",
            "free": "100 per 1m",
            "paid": ["5000/min", {"limit": 100000, "window": "1d", "buckets": 24,
                                  "precision": "interpolated", "name": "daily"}],
            "internal": "unlimited",
            "suspended": "denied"
        }"#;
        assert_table(&toml::from_str::<Tiers>(toml).unwrap());
        assert_table(&serde_yaml_ng::from_str::<Tiers>(yaml).unwrap());
        assert_table(&serde_json::from_str::<Tiers>(json).unwrap());
    }

    #[test]
    fn mistakes_in_a_table_are_errors_that_say_where() {
        let err = |text: &str| toml::from_str::<Tiers>(text).unwrap_err().to_string();
        assert!(err("free = \"100/fortnight\"").contains("fortnight"));
        assert!(err("free = \"unlimitd\"").contains("unlimitd"));
        assert!(err("free = []").contains("free"), "{}", err("free = []"));
        assert!(err("free = { limit = 10, window = \"1m\", bucket = 3 }").contains("bucket"));
        assert!(err("").contains("tier"), "{}", err(""));
        let too_short = err("free = { limit = 10, window = \"1s\", buckets = 100000 }");
        assert!(too_short.contains("free"), "{too_short}");
    }
}

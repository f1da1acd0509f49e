//! The Redis store on a real three-node Redis Cluster (private `redis-server`s on
//! ephemeral loopback ports), through a `ClusterConnection` given to
//! `RedisStoreBuilder::connection`: each key's script runs on the node that owns
//! its hash tag, keys spread over the nodes, and scripts reload on every node.
//! `#[ignore]`d: needs `redis-server` and `redis-cli` (run with `-- --include-ignored`).
#![cfg(feature = "redis")]

mod redis_support;

use redis_support::*;
use std::time::{Duration, Instant};
use tower_sliding_window::redis::redis::{self, cluster::ClusterClient};
use tower_sliding_window::redis::{Leases, RedisStoreBuilder};
use tower_sliding_window::{FailurePolicy, Policy, RedisStore, Store};

struct Cluster {
    nodes: Vec<RedisServer>,
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear(); // kill them before removing their files
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    /// Three masters, no replicas, every slot assigned; fails the test when
    /// they cannot be started. Up to three attempts, each on fresh ports: an
    /// ephemeral port picked here can be taken before the node binds it.
    async fn start(test: &str) -> Cluster {
        let mut failures = Vec::new();
        for attempt in 0..3 {
            match Cluster::try_start(test, attempt).await {
                Ok(cluster) => return cluster,
                Err(e) => failures.push(e),
            }
        }
        unavailable(test, &failures.join("; "))
    }

    async fn try_start(test: &str, attempt: u32) -> Result<Cluster, String> {
        let dir = std::env::temp_dir().join(format!(
            "{}-{attempt}",
            unique_prefix(test).replace(':', "-")
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut cluster = Cluster {
            nodes: Vec::new(),
            dir,
        };
        for i in 0..3 {
            let args = vec![
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                // Redis 7: the bus port is set explicitly (port + 10000 may not exist).
                "--cluster-port".to_owned(),
                free_port().to_string(),
                "--cluster-config-file".to_owned(),
                cluster
                    .dir
                    .join(format!("nodes-{i}.conf"))
                    .display()
                    .to_string(),
                "--dir".to_owned(),
                cluster.dir.display().to_string(),
            ];
            cluster
                .nodes
                .push(RedisServer::try_start_with(free_port(), args).await?);
        }
        let mut create = std::process::Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        match create.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                return Err(format!(
                    "redis-cli --cluster create failed: {}",
                    String::from_utf8_lossy(&out.stdout)
                ))
            }
            Err(e) => return Err(format!("cannot run redis-cli: {e}")),
        }
        // Bounded wait until every node agrees the cluster is up.
        let deadline = Instant::now() + Duration::from_secs(10);
        for node in &cluster.nodes {
            let mut conn = node.conn().await;
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("CLUSTER INFO: {e}"))?;
                if info.contains("cluster_state:ok") {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!("cluster not ok after 10 s: {info}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(cluster)
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    async fn store(&self, prefix: &str, limit: u32) -> RedisStore {
        self.builder(prefix, limit).await.build().unwrap()
    }

    async fn builder(&self, prefix: &str, limit: u32) -> RedisStoreBuilder {
        let conn = ClusterClient::new(self.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap();
        RedisStore::builder(
            Policy::per(limit, Duration::from_secs(10)).unwrap(),
            FailurePolicy::Closed,
        )
        .connection(conn)
        .timeout(Duration::from_secs(2))
        .prefix(prefix)
    }

    /// How many keys each node holds.
    async fn keys_per_node(&self) -> Vec<u64> {
        let mut counts = Vec::new();
        for node in &self.nodes {
            let mut conn = node.conn().await;
            counts.push(redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap());
        }
        counts
    }
}

/// With `REQUIRE_REDIS=1` (CI) the ignored Redis tests below must be run.
#[test]
fn redis_tests_are_included_where_redis_is_required() {
    assert_included_where_required();
}

#[tokio::test]
#[ignore = "starts a Redis Cluster (redis-server, redis-cli): run with -- --include-ignored"]
async fn a_cluster_enforces_each_key_on_the_node_owning_its_hash_tag() {
    let test = "a_cluster_enforces_each_key_on_the_node_owning_its_hash_tag";
    let cluster = Cluster::start(test).await;
    let prefix = unique_prefix(test);
    let (a, b) = (
        cluster.store(&prefix, 3).await,
        cluster.store(&prefix, 3).await,
    );

    // 30 keys, each checked 5 times through alternating instances: 3 pass each.
    let mut allowed = 0;
    for key in 0..30u64 {
        for i in 0..5 {
            let s = if i % 2 == 0 { &a } else { &b };
            allowed += s.check_n(&key, 1).await.unwrap().is_allowed() as u32;
        }
    }
    assert_eq!(allowed, 90);
    // One Redis key per user key, spread over the nodes by hash tag.
    let per_node = cluster.keys_per_node().await;
    assert_eq!(per_node.iter().sum::<u64>(), 30, "{per_node:?}");
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");

    // Scripts flushed everywhere: NOSCRIPT, SCRIPT LOAD on every master, retry.
    for node in &cluster.nodes {
        let mut conn = node.conn().await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    for key in 100..110u64 {
        assert!(b.check_n(&key, 1).await.unwrap().is_allowed());
    }
    assert_eq!(a.stats().failures + b.stats().failures, 0);

    // Leases through the cluster connection: hot keys on both instances, at
    // most the limit per key, and after shutdown Redis holds exactly the
    // units admitted.
    let prefix = unique_prefix(test);
    let leased = [
        cluster
            .builder(&prefix, 40)
            .await
            .leases(Leases::new())
            .build()
            .unwrap(),
        cluster
            .builder(&prefix, 40)
            .await
            .leases(Leases::new())
            .build()
            .unwrap(),
    ];
    let mut admitted = [0u64; 6];
    for round in 0..60 {
        for (key, count) in admitted.iter_mut().enumerate() {
            let s = &leased[(round + key) % 2];
            *count += s.check_n(&(key as u64), 1).await.unwrap().is_allowed() as u64;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(leased.iter().all(|s| s.stats().lease_decisions > 0));
    for s in &leased {
        s.shutdown().await;
    }
    let mut conn = ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    for (key, count) in admitted.iter().enumerate() {
        assert!(*count <= 40, "key {key}: {count}");
        let bytes: Vec<u8> = redis::cmd("GET")
            .arg(leased[0].redis_key(&(key as u64)))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(PackedKey::unpack(&bytes).units(), *count, "key {key}");
    }
}

//! The URL of every backend a test run has a server for: shared by the tests that run one
//! scenario on every backend (`conformance.rs`, `observe.rs`).

/// The URL of every backend this run has a server for (and its short lease/session settings).
pub fn backends() -> Vec<String> {
    let mut urls = Vec::new();
    match std::env::var("DISTLOCK_TEST_ZK") {
        Ok(addr) => urls.push(format!("zk://{addr}?session_timeout=4s")),
        Err(_) => eprintln!("conformance: DISTLOCK_TEST_ZK unset, ZooKeeper skipped"),
    }
    match std::env::var("DISTLOCK_TEST_REDIS") {
        Ok(addr) => urls.push(format!("redis://{addr}?lease=4s")),
        Err(_) => eprintln!("conformance: DISTLOCK_TEST_REDIS unset, Redis skipped"),
    }
    match std::env::var("DISTLOCK_TEST_POSTGRES") {
        Ok(url) => urls.push(format!("{url}?lease=4s")),
        Err(_) => eprintln!("conformance: DISTLOCK_TEST_POSTGRES unset, PostgreSQL skipped"),
    }
    match std::env::var("DISTLOCK_TEST_MYSQL") {
        Ok(url) => urls.push(format!("{url}?lease=4s")),
        Err(_) => eprintln!("conformance: DISTLOCK_TEST_MYSQL unset, MariaDB skipped"),
    }
    match std::env::var("DISTLOCK_TEST_ETCD") {
        Ok(addr) => urls.push(format!("etcd://{addr}?ttl=4s")),
        Err(_) => eprintln!("conformance: DISTLOCK_TEST_ETCD unset, etcd skipped"),
    }
    // SQLite needs no server: a database file of this test's own.
    let dir = std::env::temp_dir().join(format!("distlock-backends-sqlite-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    urls.push(format!("sqlite://{}/locks.db?lease=4s", dir.display()));
    assert!(!urls.is_empty(), "no backend to test: run with scripts/test.sh");
    urls
}

//! The URL of every backend a test run has a server for (and SQLite's and the in-process store's, which need none): shared by the tests that run one
//! scenario on every backend (`conformance.rs`, `observe.rs`).

/// The URL of every backend (and its short lease/session settings). A server missing from the
/// environment fails the test, naming its variable, unless `DISTLOCK_TEST_SKIP_MISSING=1` asks to
/// run on the servers there are (then each missing one is said on stderr).
pub fn backends() -> Vec<String> {
    let mut urls: Vec<String> = [
        ("DISTLOCK_TEST_ZK", "ZooKeeper", "zk://{}?session_timeout=4s"),
        ("DISTLOCK_TEST_REDIS", "Redis", "redis://{}?lease=4s"),
        ("DISTLOCK_TEST_POSTGRES", "PostgreSQL", "{}?lease=4s"),
        ("DISTLOCK_TEST_MYSQL", "MariaDB", "{}?lease=4s"),
        ("DISTLOCK_TEST_ETCD", "etcd", "etcd://{}?ttl=4s"),
    ]
    .into_iter()
    .filter_map(|(var, name, url)| server(var, name).map(|at| url.replace("{}", &at)))
    .collect();
    // SQLite needs no server: a database file of this test's own.
    let dir = std::env::temp_dir().join(format!("distlock-backends-sqlite-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    urls.push(format!("sqlite://{}/locks.db?lease=4s", dir.display()));
    // The in-process store needs nothing either: one of this test's own.
    urls.push(format!("memory://backends-{}?lease=4s", uuid::Uuid::new_v4().simple()));
    urls
}

/// The server in `var`; if unset, a failure naming it, or `None` when missing servers may be
/// skipped (`DISTLOCK_TEST_SKIP_MISSING=1`).
pub fn server(var: &str, name: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(at) => Some(at),
        Err(_) if std::env::var("DISTLOCK_TEST_SKIP_MISSING").as_deref() == Ok("1") => {
            eprintln!("{var} unset: {name} skipped (DISTLOCK_TEST_SKIP_MISSING=1)");
            None
        }
        Err(_) => panic!(
            "{var} unset: run the tests with scripts/test.sh, which starts {name}, or set \
             DISTLOCK_TEST_SKIP_MISSING=1 to run on the servers there are"
        ),
    }
}

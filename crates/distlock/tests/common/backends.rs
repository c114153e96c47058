//! The servers of a test run, and `on_every_backend!`: one scenario made a named test per backend
//! (`conformance::cancelled_acquires_leave_nothing::redis`, …), so a failure names its backend
//! and a filter picks one (`cargo test -p distlock --test main -- ::etcd`).

/// Every backend a scenario runs on: its name (the test's), the variable that names its server
/// (none: it needs no server), and its URL with short lease settings (`{}` is the server).
const BACKENDS: [(&str, Option<&str>, &str); 8] = [
    ("zookeeper", Some("DISTLOCK_TEST_ZK"), "zk://{}?session_timeout=4s"),
    ("redis", Some("DISTLOCK_TEST_REDIS"), "redis://{}?lease=4s"),
    ("postgres", Some("DISTLOCK_TEST_POSTGRES"), "{}?lease=4s"),
    ("mysql", Some("DISTLOCK_TEST_MYSQL"), "{}?lease=4s"),
    ("etcd", Some("DISTLOCK_TEST_ETCD"), "etcd://{}?ttl=4s"),
    ("nats", Some("DISTLOCK_TEST_NATS"), "nats://{}?ttl=4s"),
    // A database file of the test's own.
    ("sqlite", None, "sqlite://{}/locks.db?lease=4s"),
    // A store of the test's own.
    ("memory", None, "memory://{}?lease=4s"),
];

/// The URL of `backend` for one test. A server missing from the environment fails the test,
/// naming its variable, unless `DISTLOCK_TEST_SKIP_MISSING=1` asks to run on the servers there
/// are: then it is `None`, and said on stderr.
pub fn url(backend: &str) -> Option<String> {
    let (_, var, url) =
        BACKENDS.iter().find(|(name, _, _)| *name == backend).unwrap_or_else(|| panic!("no backend {backend}"));
    let at = match var {
        Some(var) => server(var, backend)?,
        None if backend == "sqlite" => {
            let dir = std::env::temp_dir().join(super::unique("distlock-backends-sqlite"));
            std::fs::create_dir_all(&dir).unwrap();
            dir.display().to_string()
        }
        None => super::unique("backends"),
    };
    Some(url.replace("{}", &at))
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

/// Runs `scenario` on `backend`'s URL (see `url` for a missing server).
pub async fn run<F: std::future::Future<Output = ()>>(backend: &str, scenario: impl FnOnce(String) -> F) {
    if let Some(url) = url(backend) {
        scenario(url).await
    }
}

/// `on_every_backend!(#[tokio::test] name);` beside `async fn name(url: String)` makes the module
/// `name` with one test per backend built in (`name::zookeeper`, `name::redis`, …), each running
/// the scenario on that backend's URL. The attributes are the tests' (`#[tokio::test(flavor = …)]`,
/// `#[ignore = …]`). `on_every_backend!(#[tokio::test] name: zookeeper, etcd);` names the backends
/// a scenario is for, when the others cannot have what it tests.
macro_rules! on_every_backend {
    ($(#[$attr:meta])+ $scenario:ident) => {
        $crate::common::backends::on_every_backend!($(#[$attr])+ $scenario: zookeeper, redis, postgres, mysql, etcd, nats, sqlite, memory);
    };
    ($(#[$attr:meta])+ $scenario:ident: $($backend:ident),+) => {
        mod $scenario {
            $crate::common::backends::backend_test!(@each [$(#[$attr])+] $scenario: $($backend),+);
        }
    };
}
pub(crate) use on_every_backend;

/// The tests of `on_every_backend!`, each built when its backend's feature is (the attributes
/// travel as one token tree, so that they repeat with each backend).
macro_rules! backend_test {
    (@each $attrs:tt $scenario:ident: $($backend:ident),+) => {
        $($crate::common::backends::backend_test!($backend $attrs $scenario);)+
    };
    (zookeeper $($rest:tt)+) => { #[cfg(feature = "zookeeper")] $crate::common::backends::backend_test!(@test zookeeper $($rest)+); };
    (redis $($rest:tt)+) => { #[cfg(feature = "redis")] $crate::common::backends::backend_test!(@test redis $($rest)+); };
    (postgres $($rest:tt)+) => { #[cfg(feature = "postgres")] $crate::common::backends::backend_test!(@test postgres $($rest)+); };
    (mysql $($rest:tt)+) => { #[cfg(feature = "mysql")] $crate::common::backends::backend_test!(@test mysql $($rest)+); };
    (etcd $($rest:tt)+) => { #[cfg(feature = "etcd")] $crate::common::backends::backend_test!(@test etcd $($rest)+); };
    (nats $($rest:tt)+) => { #[cfg(feature = "nats")] $crate::common::backends::backend_test!(@test nats $($rest)+); };
    (sqlite $($rest:tt)+) => { #[cfg(feature = "sqlite")] $crate::common::backends::backend_test!(@test sqlite $($rest)+); };
    (memory $($rest:tt)+) => { #[cfg(feature = "memory")] $crate::common::backends::backend_test!(@test memory $($rest)+); };
    (@test $backend:ident [$(#[$attr:meta])+] $scenario:ident) => {
        $(#[$attr])+
        async fn $backend() {
            $crate::common::backends::run(stringify!($backend), super::$scenario).await
        }
    };
}
pub(crate) use backend_test;

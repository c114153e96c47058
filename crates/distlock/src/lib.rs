//! Distributed locks that are fair, herd-free, fenced and honest about loss.
//!
//! distlock coordinates processes on many machines through a server they share, on the backends
//! of [`BACKENDS`] behind one API that [`connect`] picks by URL: ZooKeeper's queue of
//! EPHEMERAL_SEQUENTIAL nodes, Redis's leases renewed by a watchdog, the SQL databases' locks and
//! lease tables, etcd's and NATS's keys with leases; and, for users' own tests, an in-process
//! store (`memory://`) whose leases run on tokio's clock. Each backend is a module of its own
//! (below), with the URL it takes and what it promises.
//!
//! Opinionated API:
//! - async on tokio, with RAII guards named like [`tokio::sync`] (`lock`, `try_lock`,
//!   `lock_timeout`); a [`blocking`] facade for synchronous callers;
//! - every guard carries a **fencing token** that strictly increases from one holder to the next,
//!   and a **`lost()`** future that resolves when the lock can no longer be trusted;
//! - every acquire is cancel safe: dropping it leaves nothing behind on the server;
//! - node layout compatible with Apache Curator, so Java services can share the same locks;
//! - bad input (paths, URLs, durations) is an [`Error`] naming the bad value, never a panic.
//!
//! # Feature flags
//! One per backend, named as the backend's module and its entry in [`BACKENDS`] (`zookeeper`,
//! `redis`, `nats`, …); `full`, the default, turns on all of them. A backend whose feature is off
//! is refused by [`connect`] with an error naming the feature.
//!
//! # Layout
//! - [`connect`], [`Client`], [`Lock`], [`Guard`], [`MultiLock`]: one API over every backend,
//!   from the registry [`BACKENDS`] (name, URL schemes, connect); [`connect_with`] and
//!   [`ConnectOptions`] for the options every backend honours (lease, connect timeout, TLS
//!   files, `setup`); [`listing`] for what `inspect` and `top` show, in one shape;
//! - [`election`]: leader election (campaign, resign, proclaim, observe) and [`schedule`]:
//!   once-per-slot jobs (ShedLock's tables and semantics), both written once over every backend;
//! - [`observe`]: metrics and tracing spans; [`tls`]: the TLS files every backend reads;
//! - one module per backend (`zookeeper`, `redis`, `postgres`, …): its URL, its client and the
//!   recipes it has beyond the contract, e.g. [`zookeeper`]'s Curator-compatible
//!   [`Mutex`](zookeeper::Mutex), [`ReentrantMutex`](zookeeper::ReentrantMutex),
//!   [`RwLock`](zookeeper::RwLock) with downgrade, [`Semaphore`](zookeeper::Semaphore),
//!   [`MultiLock`](zookeeper::MultiLock), revocation and the herding
//!   [`NaiveLock`](zookeeper::NaiveLock) baseline;
//! - [`with_lock`]: run a closure under a lock or report busy;
//! - [`optimistic`]: the version-column update loop (no lock held at all);
//! - [`blocking`]: the same for synchronous code;
//! - [`Error`], [`LostReason`], [`parse_duration`] (and [`parse_duration_flag`]), [`Owner`].
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::zookeeper::Client;
//! let zk = Client::connect("zk://127.0.0.1:2181").await?;
//! let lock = zk.mutex("/locks/orders")?;
//! let guard = lock.lock().await?;
//! println!("token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// A build without every backend leaves unused parts of what several backends share: their
// dead-code lints are judged in the build of all of them (feature `full`, on by default: CI's
// workspace clippy), not per feature.
#![cfg_attr(not(feature = "full"), allow(dead_code, unused_imports, unused_macros))]
// docs.rs marks each item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Items that exist when at least one backend is compiled in.
macro_rules! with_a_backend {
    ($($item:item)*) => {$(
        #[cfg(feature = "_backend")]
        $item
    )*};
}

/// Checks at compile time (in test builds) that each type is `Send + Sync + 'static`: every lock
/// and guard type can move between tasks and threads and be shared. Each backend's `mod.rs` lists
/// its own types, so a new backend or guard type brings its check with it.
#[cfg(test)]
macro_rules! assert_send_sync_static {
    ($($t:ty),* $(,)?) => {
        const _: () = {
            fn send_sync_static<T: Send + Sync + 'static>() {}
            #[allow(dead_code)]
            fn check() {
                $(send_sync_static::<$t>();)*
            }
        };
    };
}

with_a_backend! {
    pub(crate) mod facade;
    pub mod blocking;
    pub(crate) mod contract;
    pub mod election;
    pub mod schedule;
    mod lease_margin;
    mod multi;
    mod options;
    mod redact;
    pub use facade::{connect, connect_with, schemes, BackendInfo, Capabilities, Client, Guard, Lock, BACKENDS};
    pub use multi::{MultiGuard, MultiLock};
    pub use options::ConnectOptions;
    pub use redact::redact_url;
}

#[cfg(feature = "_lease")]
mod background;
mod duration;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "_lease")]
mod lease;
#[cfg(feature = "_tls-probe")]
mod listening;
pub mod listing;
mod lock_state;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "nats")]
pub mod nats;
pub mod observe;
pub mod optimistic;
mod owner;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "_sql")]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod template;
pub mod tls;
#[cfg(feature = "_watchdog")]
mod watchdog;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use duration::{parse_duration, parse_duration_flag};
pub use error::{Error, LostReason, Result};
pub use lock_state::{LockState, QueueStatus};
pub use owner::Owner;
pub use template::with_lock;

/// The README's examples, compiled as doc tests so they cannot rot (and the docs' below). The
/// files are the repository's, outside the crate and not in its package: they are read only under
/// `cfg(doctest)`, which `cargo build`, `cargo doc`, docs.rs and `cargo package`'s verification
/// never set. Doc tests are the workspace's, like the unit tests (both need distlock-server, a
/// dev-dependency that packaging strips).
#[cfg(all(doctest, feature = "zookeeper", feature = "redis"))]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

#[cfg(all(doctest, feature = "zookeeper"))]
#[doc = include_str!("../../../docs/backends/zookeeper.md")]
struct ZooKeeperDocDoctests;

#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../../../docs/backends/redis.md")]
struct RedisDocDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/elections.md")]
struct ElectionsDocDoctests;

#[cfg(all(doctest, feature = "zookeeper"))]
#[doc = include_str!("../../../docs/embedded-server.md")]
struct EmbeddedServerDocDoctests;

#[cfg(all(doctest, feature = "memory"))]
#[doc = include_str!("../../../docs/backends/memory.md")]
struct MemoryDocDoctests;

/// Asserts that `parse` refuses each input with an error whose text contains the given words.
#[cfg(test)]
pub(crate) fn assert_refused<T: std::fmt::Debug>(parse: impl Fn(&str) -> Result<T>, cases: &[(&str, &str)]) {
    for (input, says) in cases {
        let e = parse(input).unwrap_err().to_string();
        assert!(e.contains(says), "{input}: {e}");
    }
}

/// As [`assert_refused`], and the error also quotes the input itself.
#[cfg(test)]
pub(crate) fn assert_refused_naming_url<T: std::fmt::Debug>(parse: impl Fn(&str) -> Result<T>, cases: &[(&str, &str)]) {
    for (input, _) in cases {
        let e = parse(input).unwrap_err().to_string();
        assert!(e.contains(input), "{e}");
    }
    assert_refused(parse, cases);
}

/// Every backend's URL query is read by one parser ([`options::QuerySpec`]): an unknown key is
/// refused in one wording naming it, and a duration that is not one names its key.
#[cfg(test)]
mod url_keys {
    /// A URL's parser, giving the lease it read (or the error's text).
    type Parse = fn(&str) -> std::result::Result<std::time::Duration, String>;

    /// Each compiled backend: a URL of it without a query, its parser, and its own duration keys.
    #[allow(clippy::vec_init_then_push)] // one push a backend, each under its feature
    fn backends() -> Vec<(&'static str, Parse, &'static [&'static str])> {
        fn text<T>(r: crate::Result<T>) -> std::result::Result<T, String> {
            r.map_err(|e| e.to_string())
        }
        let mut all: Vec<(&'static str, Parse, &'static [&'static str])> = Vec::new();
        #[cfg(feature = "zookeeper")]
        all.push((
            "zk://h:2181",
            |u| text(crate::zookeeper::ZkUrl::parse(u)).map(|p| p.session_timeout()),
            &["lease_margin"],
        ));
        #[cfg(feature = "redis")]
        all.push((
            "redis://h:6379",
            |u| text(crate::redis::RedisUrl::parse(u)).map(|p| p.lease()),
            &["replica_timeout"],
        ));
        #[cfg(feature = "postgres")]
        all.push(("postgres://h/db", |u| text(crate::postgres::PgUrl::parse(u)).map(|p| p.lease()), &["rescan"]));
        #[cfg(feature = "mysql")]
        all.push(("mysql://h/db", |u| text(crate::mysql::MysqlUrl::parse(u)).map(|p| p.lease()), &[]));
        #[cfg(feature = "sqlite")]
        all.push((
            "sqlite:///tmp/x.db",
            |u| text(crate::sqlite::SqliteUrl::parse(u)).map(|p| p.lease()),
            &["busy_timeout"],
        ));
        #[cfg(feature = "etcd")]
        all.push(("etcd://h:2379", |u| text(crate::etcd::EtcdUrl::parse(u)).map(|p| p.ttl()), &["timeout"]));
        #[cfg(feature = "nats")]
        all.push(("nats://h:4222", |u| text(crate::nats::NatsUrl::parse(u)).map(|p| p.ttl()), &["timeout"]));
        #[cfg(feature = "memory")]
        all.push(("memory://t", |u| text(crate::memory::MemoryUrl::parse(u)).map(|p| p.lease()), &[]));
        all
    }

    /// `lease`, `session_timeout` and `ttl` mean the same on every scheme (the README promises it).
    #[test]
    fn the_lease_under_each_of_its_names_on_every_backend() {
        for (base, parse, _) in backends() {
            for key in crate::options::LEASE_KEYS {
                let lease = parse(&format!("{base}?{key}=5s")).unwrap_or_else(|e| panic!("{base} {key}: {e}"));
                assert_eq!(lease, std::time::Duration::from_secs(5), "{base} {key}");
            }
        }
    }

    #[test]
    fn an_unknown_key_has_one_wording_and_is_named_on_every_backend() {
        for (base, parse, _) in backends() {
            parse(base).unwrap_or_else(|e| panic!("{base}: {e}"));
            for key in ["bogus", "colour"] {
                let e = parse(&format!("{base}?lease=5s&{key}=1")).unwrap_err();
                assert!(e.contains(&format!("unknown URL key \"{key}\" (known: ")), "{base}: {e}");
                assert!(e.contains("connect_timeout") && e.contains("setup"), "{base}: {e}");
            }
        }
    }

    #[test]
    fn connections_is_one_rule_where_it_is_taken_and_refused_alike_elsewhere() {
        for (base, parse, _) in backends() {
            let shares = base.starts_with("postgres") || base.starts_with("mysql");
            let ok = parse(&format!("{base}?connections=2"));
            let bad = parse(&format!("{base}?connections=0")).unwrap_err();
            if shares {
                ok.unwrap_or_else(|e| panic!("{base}: {e}"));
                assert!(bad.contains("connections=0: ") && bad.contains("1 to 1000"), "{base}: {bad}");
            } else {
                let e = ok.unwrap_err();
                assert!(e.contains("connections: ") && e.contains("PostgreSQL and MariaDB"), "{base}: {e}");
            }
        }
    }

    #[cfg(all(feature = "memory", feature = "postgres"))]
    #[test]
    fn connect_options_take_the_place_of_the_urls_values_under_any_name() {
        use std::time::Duration;
        let options = crate::ConnectOptions::new().lease(Duration::from_secs(20)).setup(false);
        let m =
            crate::memory::MemoryUrl::parse_with("memory://t?ttl=5s&setup=auto", &options.clone().common().unwrap())
                .unwrap();
        assert_eq!((m.lease(), m.setup()), (Duration::from_secs(20), false));
        let over = options.cacert("/b.pem").connections(7).common().unwrap();
        let p = crate::postgres::PgUrl::parse_with("postgres://h/db?sslrootcert=/a.pem&lease=4s&connections=2", &over)
            .unwrap();
        assert_eq!(
            (p.lease, p.tls_files.cacert.as_deref(), p.connections),
            (Duration::from_secs(20), Some(std::path::Path::new("/b.pem")), 7)
        );
        // What a backend refuses in its URL it refuses from the options too, never ignored.
        for (refused, key) in [("cacert", "cacert"), ("connections", "connections")] {
            let o = match refused {
                "cacert" => crate::ConnectOptions::new().cacert("/b.pem"),
                _ => crate::ConnectOptions::new().connections(2),
            };
            let e = crate::memory::MemoryUrl::parse_with("memory://t", &o.common().unwrap()).unwrap_err().to_string();
            assert!(e.contains(&format!("{key}: ")), "{e}");
        }
        let e = crate::ConnectOptions::new().connections(0).common().unwrap_err().to_string();
        assert!(e.contains("1 to 1000"), "{e}");
        // The backend's own checks judge them as a URL's.
        let short = crate::ConnectOptions::new().lease(Duration::from_millis(50)).common().unwrap();
        assert!(crate::memory::MemoryUrl::parse_with("memory://t", &short).unwrap_err().to_string().contains("lease"));
    }

    #[test]
    fn a_bad_duration_names_its_key_on_every_backend() {
        for (base, parse, own) in backends() {
            for key in ["lease", "session_timeout", "ttl", "connect_timeout"].iter().chain(own) {
                let e = parse(&format!("{base}?{key}=soon")).unwrap_err();
                assert!(e.contains(&format!("invalid duration \"{key}=soon\"")), "{base} {key}: {e}");
            }
        }
    }
}

// The backend-neutral lock and guard types move between tasks and threads and are shared
// (`Send + Sync + 'static`); each backend's folder checks its own types the same way
// (`assert_send_sync_static!` in its `mod.rs`).
#[cfg(all(test, feature = "_backend"))]
assert_send_sync_static!(
    crate::Client,
    crate::Lock,
    crate::Guard,
    crate::MultiLock,
    crate::MultiGuard,
    crate::blocking::Guard
);

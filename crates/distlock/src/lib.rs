//! Distributed locks that are fair, herd-free, fenced and honest about loss.
//!
//! distlock coordinates processes on many machines through a server they share, on seven backends
//! behind one API that [`connect`] picks by URL: ZooKeeper (contenders line up as
//! EPHEMERAL_SEQUENTIAL nodes, each watching only the node ahead of it), Redis (Redisson's and
//! redis-py's layouts, leases renewed by a watchdog), PostgreSQL (advisory locks), MariaDB and
//! MySQL (`GET_LOCK`), SQLite (a lease table in a file), etcd (its lock recipe, checked after
//! the wait) and NATS (keys with their own TTL in a JetStream KV bucket); and, for users' own
//! tests, an in-process store (`memory://`) whose leases run on tokio's clock.
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
//! - `zookeeper` (default): the ZooKeeper backend (`zk://`).
//! - `redis` (default): the Redis backend (`redis://`, `rediss://`, `redis+sentinel://`,
//!   `redis+cluster://`).
//! - `postgres` (default): PostgreSQL advisory locks (`postgres://`).
//! - `mysql` (default): MariaDB/MySQL `GET_LOCK` (`mysql://`, `mariadb://`).
//! - `sqlite` (default): a lease table in a SQLite file (`sqlite://`).
//! - `etcd` (default): etcd's lock recipe, checked after the wait (`etcd://`).
//! - `memory` (default): an in-process store for tests, on tokio's clock (`memory://NAME`).
//!
//! # Layout
//! - [`connect`], [`Client`], [`Lock`], [`Guard`], [`MultiLock`]: one API over every backend,
//!   from the registry [`BACKENDS`] (name, URL schemes, connect); [`connect_with`] and
//!   [`ConnectOptions`] for the options every backend honours (lease, connect timeout, TLS
//!   files, `setup`); [`listing`] for what `inspect` and `top` show, in one shape;
//! - [`election`]: leader election (campaign, resign, proclaim, observe) and [`schedule`]:
//!   once-per-slot jobs (ShedLock's tables and semantics), both written once over every backend;
//! - [`observe`]: metrics and tracing spans; [`tls`]: the TLS files every backend reads;
//! - [`redis`]: the Redis client and its recipes (mutex, simple lock, read/write lock, fair
//!   lock, semaphore, Redlock);
//! - [`postgres`]: session-level advisory locks on PostgreSQL, fenced by a sequence;
//! - [`mysql`]: `GET_LOCK` on MariaDB and MySQL; [`sqlite`]: a lease table in a SQLite file;
//!   [`memory`]: an in-process store for users' tests (paused time, a partition switch);
//! - [`etcd`]: etcd's mutex (as `etcdctl lock`), read/write lock and semaphore, fenced by
//!   create revision;
//! - [`zookeeper`]: [`Client`](zookeeper::Client) (one session, many locks) and the recipes:
//!   - [`Mutex`](zookeeper::Mutex): exclusive, FIFO, herd-free;
//!   - [`ReentrantMutex`](zookeeper::ReentrantMutex): re-entered by the same handle;
//!   - [`RwLock`](zookeeper::RwLock): shared readers, exclusive writers, downgrade;
//!   - [`Semaphore`](zookeeper::Semaphore): N permits (also the non-reentrant semaphore mutex);
//!   - [`MultiLock`](zookeeper::MultiLock): several locks, all or nothing, deadlock-free order;
//!   - [`NaiveLock`](zookeeper::NaiveLock): the herding baseline, for benchmarks only;
//!   - revocation ([`Client::revoke`](zookeeper::Client::revoke)) and `inspect`;
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
// dead-code lints are judged in the build of all of them (CI's workspace clippy), not per feature.
#![cfg_attr(
    not(all(
        feature = "zookeeper",
        feature = "redis",
        feature = "postgres",
        feature = "mysql",
        feature = "sqlite",
        feature = "etcd",
        feature = "nats",
        feature = "memory"
    )),
    allow(dead_code, unused_imports, unused_macros)
)]
// docs.rs marks each item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Items that exist when at least one backend is compiled in.
macro_rules! with_a_backend {
    ($($item:item)*) => {$(
        #[cfg(feature = "_backend")]
        $item
    )*};
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

/// Every lock and guard type of every backend can move between tasks and threads and be shared
/// (`Send + Sync + 'static`): one list, so a new guard type is added here or the omission shows.
#[cfg(test)]
mod bounds {
    fn send_sync_static<T: Send + Sync + 'static>() {}

    macro_rules! all_send_sync_static {
        ($($t:ty),* $(,)?) => {
            $(send_sync_static::<$t>();)*
        };
    }

    #[test]
    fn every_lock_and_guard_is_send_sync_static() {
        use crate::{blocking, Client, Guard, Lock, MultiGuard, MultiLock};
        all_send_sync_static!(Client, Lock, Guard, MultiLock, MultiGuard, blocking::Guard);
        #[cfg(feature = "zookeeper")]
        {
            use crate::zookeeper as z;
            all_send_sync_static!(
                z::MutexGuard,
                z::ReadGuard,
                z::WriteGuard,
                z::SemaphorePermit,
                z::ReentrantGuard,
                z::MultiGuard,
                z::NaiveGuard,
            );
        }
        #[cfg(feature = "redis")]
        {
            use crate::redis as r;
            all_send_sync_static!(
                r::MutexGuard,
                r::ReadGuard,
                r::WriteGuard,
                r::FairGuard,
                r::SemaphorePermit,
                r::SimpleGuard,
                r::RedlockGuard,
            );
        }
        #[cfg(feature = "postgres")]
        all_send_sync_static!(crate::postgres::MutexGuard);
        #[cfg(feature = "mysql")]
        all_send_sync_static!(crate::mysql::MutexGuard);
        #[cfg(feature = "sqlite")]
        all_send_sync_static!(crate::sqlite::MutexGuard);
        #[cfg(feature = "etcd")]
        all_send_sync_static!(crate::etcd::LockGuard);
        #[cfg(feature = "nats")]
        all_send_sync_static!(crate::nats::LockGuard);
    }
}

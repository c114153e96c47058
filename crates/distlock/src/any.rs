//! One API for every backend: [`connect`] picks the backend from the URL's scheme.
//!
//! The typed modules ([`zookeeper`](crate::zookeeper), [`redis`](crate::redis)) keep every
//! backend's extras; the types here erase the backend so that code (and the CLI) is written once:
//! a [`Client`] makes [`Lock`]s of a few kinds, every lock gives the same [`Guard`] contract
//! (fencing token, state, `lost()`, lease deadline, `release()`, release on drop), and
//! [`MultiLock`] takes several all or nothing. Dispatch is a `match` over a closed set of
//! backends, not a trait object: no allocation per waiter, and every backend's typed client
//! stays reachable ([`Client::zookeeper`], [`Client::redis`]).
//!
//! A recipe a backend does not offer is an [`Error::Unsupported`] when the lock is made, before
//! any I/O; a scheme whose cargo feature is compiled out is an [`Error::InvalidUrl`] naming the
//! feature.

use crate::{Error, LockState, LostReason, QueueStatus, Result};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The URL schemes distlock knows, and the cargo feature each needs.
pub const SCHEMES: &[(&str, &str)] = &[
    ("zk", "zookeeper"),
    ("redis", "redis"),
    ("redis+sentinel", "redis"),
    ("redis+cluster", "redis"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("sqlite", "sqlite"),
    ("etcd", "etcd"),
];

/// Connects to the backend named by `url`: `zk://host:port[,host:port]/chroot?…` (see
/// [`ZkUrl`](crate::zookeeper::ZkUrl)) or `redis://host:port/db?…` (see
/// [`RedisUrl`](crate::redis::RedisUrl)).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let client = distlock::connect("redis://127.0.0.1:6379?lease=10s").await?;
/// let lock = client.mutex("orders")?;
/// let guard = lock.lock().await?;
/// println!("{} held with token {}", guard.lock_name(), guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Client> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    let bad = |reason: String| Error::InvalidUrl { url: url.to_string(), reason };
    match scheme {
        #[cfg(feature = "zookeeper")]
        "zk" => {
            // A ZooKeeper that is not there at all (every address refuses) is reported at once
            // rather than after the connect timeout.
            let parsed = crate::zookeeper::ZkUrl::parse(url)?;
            let client = tokio::select! {
                client = crate::zookeeper::Client::connect_url(parsed.clone()) => client?,
                why = crate::zookeeper::nobody_listens(&parsed) => {
                    return Err(Error::Connect { url: parsed.to_string(), reason: why })
                }
            };
            Ok(Client { kind: ClientKind::ZooKeeper(client) })
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" => {
            Ok(Client { kind: ClientKind::Redis(crate::redis::Client::connect(url).await?) })
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            Ok(Client { kind: ClientKind::Postgres(crate::postgres::Client::connect(url).await?) })
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Client { kind: ClientKind::Mysql(crate::mysql::Client::connect(url).await?) }),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Client { kind: ClientKind::Sqlite(crate::sqlite::Client::connect(url).await?) }),
        #[cfg(feature = "etcd")]
        "etcd" => Ok(Client { kind: ClientKind::Etcd(crate::etcd::Client::connect(url).await?) }),
        _ => match SCHEMES.iter().find(|(s, _)| *s == scheme || (*s == "redis" && scheme == "rediss")) {
            Some((_, feature)) => {
                Err(bad(format!("the {scheme}:// backend is not compiled in (enable distlock's {feature:?} feature)")))
            }
            None => Err(bad(format!(
                "unknown scheme {scheme:?}: use one of {}",
                SCHEMES.iter().map(|(s, _)| format!("{s}://")).collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}

/// A connection to any backend; cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let client = distlock::connect("zk://127.0.0.1:2181").await?;
/// assert_eq!(client.backend(), "zookeeper");
/// let reports = client.read_lock("reports")?;   // Unsupported on backends without it
/// # let _ = reports; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    kind: ClientKind,
}

#[derive(Debug, Clone)]
enum ClientKind {
    #[cfg(feature = "zookeeper")]
    ZooKeeper(crate::zookeeper::Client),
    #[cfg(feature = "redis")]
    Redis(crate::redis::Client),
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::Client),
    #[cfg(feature = "mysql")]
    Mysql(crate::mysql::Client),
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sqlite::Client),
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::Client),
}

#[cfg(feature = "zookeeper")]
impl From<crate::zookeeper::Client> for Client {
    fn from(c: crate::zookeeper::Client) -> Client {
        Client { kind: ClientKind::ZooKeeper(c) }
    }
}

#[cfg(feature = "postgres")]
impl From<crate::postgres::Client> for Client {
    fn from(c: crate::postgres::Client) -> Client {
        Client { kind: ClientKind::Postgres(c) }
    }
}

#[cfg(feature = "etcd")]
impl From<crate::etcd::Client> for Client {
    fn from(c: crate::etcd::Client) -> Client {
        Client { kind: ClientKind::Etcd(c) }
    }
}

#[cfg(feature = "redis")]
impl From<crate::redis::Client> for Client {
    fn from(c: crate::redis::Client) -> Client {
        Client { kind: ClientKind::Redis(c) }
    }
}

/// Which lock a [`Client`] makes for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
    Permits(u32),
}

impl Client {
    /// `zookeeper`, `redis`, `postgres`, `mysql` or `sqlite`.
    pub fn backend(&self) -> &'static str {
        match &self.kind {
            #[cfg(feature = "zookeeper")]
            ClientKind::ZooKeeper(_) => "zookeeper",
            #[cfg(feature = "redis")]
            ClientKind::Redis(_) => "redis",
            #[cfg(feature = "postgres")]
            ClientKind::Postgres(_) => "postgres",
            #[cfg(feature = "mysql")]
            ClientKind::Mysql(_) => "mysql",
            #[cfg(feature = "sqlite")]
            ClientKind::Sqlite(_) => "sqlite",
            #[cfg(feature = "etcd")]
            ClientKind::Etcd(_) => "etcd",
        }
    }

    /// The typed PostgreSQL client, if this is one.
    #[cfg(feature = "postgres")]
    pub fn postgres(&self) -> Option<&crate::postgres::Client> {
        match &self.kind {
            ClientKind::Postgres(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The typed MariaDB client, if this is one.
    #[cfg(feature = "mysql")]
    pub fn mysql(&self) -> Option<&crate::mysql::Client> {
        match &self.kind {
            ClientKind::Mysql(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The typed SQLite client, if this is one.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(&self) -> Option<&crate::sqlite::Client> {
        match &self.kind {
            ClientKind::Sqlite(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The typed etcd client, if this is one.
    #[cfg(feature = "etcd")]
    pub fn etcd(&self) -> Option<&crate::etcd::Client> {
        match &self.kind {
            ClientKind::Etcd(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The typed ZooKeeper client, if this is one.
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper(&self) -> Option<&crate::zookeeper::Client> {
        match &self.kind {
            ClientKind::ZooKeeper(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The typed Redis client, if this is one.
    #[cfg(feature = "redis")]
    pub fn redis(&self) -> Option<&crate::redis::Client> {
        match &self.kind {
            ClientKind::Redis(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// How long the server keeps a lock whose holder went silent: the ZooKeeper session timeout,
    /// or the Redis lease. A guard reports `Lost` before it runs out.
    pub fn lease(&self) -> Duration {
        match &self.kind {
            #[cfg(feature = "zookeeper")]
            ClientKind::ZooKeeper(c) => c.session_timeout(),
            #[cfg(feature = "redis")]
            ClientKind::Redis(c) => c.lease(),
            #[cfg(feature = "postgres")]
            ClientKind::Postgres(c) => c.lease(),
            #[cfg(feature = "mysql")]
            ClientKind::Mysql(c) => c.lease(),
            #[cfg(feature = "sqlite")]
            ClientKind::Sqlite(c) => c.lease(),
            #[cfg(feature = "etcd")]
            ClientKind::Etcd(c) => c.lease(),
        }
    }

    /// What a lock name means on this backend: on ZooKeeper a bare name `orders` is the znode
    /// `/distlock/orders` and a path starting with `/` is used as is; on Redis the name is the
    /// key, exactly as given (as Redisson and redis-py use it).
    pub fn lock_name(&self, name: &str) -> Result<String> {
        match &self.kind {
            #[cfg(feature = "zookeeper")]
            ClientKind::ZooKeeper(_) => zk_path(name),
            #[cfg(feature = "redis")]
            ClientKind::Redis(_) => Ok(name.to_string()),
            #[cfg(feature = "postgres")]
            ClientKind::Postgres(c) => c.key(name).map(|_| name.to_string()),
            #[cfg(feature = "mysql")]
            ClientKind::Mysql(c) => c.mutex(name).map(|_| name.to_string()),
            #[cfg(feature = "sqlite")]
            ClientKind::Sqlite(c) => c.mutex(name).map(|_| name.to_string()),
            #[cfg(feature = "etcd")]
            ClientKind::Etcd(c) => c.mutex(name).map(|_| name.to_string()),
        }
    }

    /// An exclusive lock: ZooKeeper's queue mutex (Curator's InterProcessMutex layout), or on
    /// Redis the URL's layout (Redisson's RLock, or `?layout=simple` for redis-py's).
    pub fn mutex(&self, name: &str) -> Result<Lock> {
        self.make(name, Kind::Mutex)
    }

    /// The shared side of a read/write lock.
    pub fn read_lock(&self, name: &str) -> Result<Lock> {
        self.make(name, Kind::Read)
    }

    /// The exclusive side of a read/write lock.
    pub fn write_lock(&self, name: &str) -> Result<Lock> {
        self.make(name, Kind::Write)
    }

    /// One permit of a semaphore with `permits` permits.
    pub fn semaphore_permit(&self, name: &str, permits: u32) -> Result<Lock> {
        self.make(name, Kind::Permits(permits))
    }

    fn make(&self, name: &str, kind: Kind) -> Result<Lock> {
        let name = self.lock_name(name)?;
        let kind = match &self.kind {
            #[cfg(feature = "zookeeper")]
            ClientKind::ZooKeeper(c) => {
                use crate::zookeeper::LockSpec;
                LockKind::ZooKeeper(match kind {
                    Kind::Mutex => LockSpec::Exclusive(c.mutex(&name)?),
                    Kind::Read => LockSpec::Read(c.rwlock(&name)?),
                    Kind::Write => LockSpec::Write(c.rwlock(&name)?),
                    Kind::Permits(n) => LockSpec::Permits(c.semaphore(&name, n)?, 1),
                })
            }
            #[cfg(feature = "redis")]
            ClientKind::Redis(c) => match kind {
                Kind::Mutex => match c.url().layout {
                    crate::redis::Layout::Redisson => LockKind::Redis(c.mutex(&name)?),
                    crate::redis::Layout::Simple => LockKind::RedisSimple(c.simple_lock(&name)?),
                },
                Kind::Read => LockKind::RedisRead(c.rwlock(&name)?),
                Kind::Write => LockKind::RedisWrite(c.rwlock(&name)?),
                Kind::Permits(n) => LockKind::RedisPermit(c.semaphore(&name, n)?),
            },
            #[cfg(feature = "postgres")]
            ClientKind::Postgres(c) => match kind {
                Kind::Mutex | Kind::Write => LockKind::Postgres(c.mutex(&name)?),
                Kind::Read => LockKind::Postgres(c.rwlock(&name)?.reader()),
                Kind::Permits(n) => LockKind::PostgresPermit(c.semaphore(&name, n)?),
            },
            #[cfg(feature = "mysql")]
            ClientKind::Mysql(c) => match kind {
                Kind::Mutex => LockKind::Mysql(c.mutex(&name)?),
                other => {
                    return Err(Error::Unsupported {
                        backend: "mysql",
                        what: format!("{other:?} on {name} (MariaDB's GET_LOCK gives the mutex only)"),
                    })
                }
            },
            #[cfg(feature = "sqlite")]
            ClientKind::Sqlite(c) => match kind {
                Kind::Mutex => LockKind::Sqlite(c.mutex(&name)?),
                other => {
                    return Err(Error::Unsupported {
                        backend: "sqlite",
                        what: format!("{other:?} on {name} (the SQLite lease table has the mutex only)"),
                    })
                }
            },
            #[cfg(feature = "etcd")]
            ClientKind::Etcd(c) => match kind {
                Kind::Mutex => LockKind::Etcd(c.mutex(&name)?),
                Kind::Read => LockKind::EtcdRead(c.rwlock(&name)?),
                Kind::Write => LockKind::EtcdWrite(c.rwlock(&name)?),
                Kind::Permits(n) => LockKind::EtcdPermit(c.semaphore(&name, n)?),
            },
        };
        Ok(Lock { kind })
    }

    /// Closes the connection; on ZooKeeper, waits at most `bound` for the server to end the
    /// session (and so delete its nodes).
    pub async fn close(self, bound: Duration) {
        match self.kind {
            #[cfg(feature = "zookeeper")]
            ClientKind::ZooKeeper(c) => c.close(bound).await,
            #[cfg(feature = "redis")]
            ClientKind::Redis(c) => c.close(bound).await,
            #[cfg(feature = "postgres")]
            ClientKind::Postgres(c) => c.close(bound).await,
            #[cfg(feature = "mysql")]
            ClientKind::Mysql(c) => c.close(bound).await,
            #[cfg(feature = "sqlite")]
            ClientKind::Sqlite(c) => c.close(bound).await,
            #[cfg(feature = "etcd")]
            ClientKind::Etcd(c) => c.close(bound).await,
        }
    }
}

/// A bare name is `/distlock/NAME`; an absolute path is used as is; anything else is refused
/// with a suggestion.
#[cfg(feature = "zookeeper")]
fn zk_path(lock: &str) -> Result<String> {
    let bad = |reason: String| Error::InvalidLockPath { path: lock.to_string(), reason };
    if lock.is_empty() {
        return Err(bad("the lock name is empty".into()));
    }
    if lock.starts_with('/') {
        Ok(lock.to_string())
    } else if lock.contains('/') {
        let segments: Vec<&str> = lock.split('/').filter(|s| !s.is_empty() && *s != "." && *s != "..").collect();
        let suggestion = match segments.as_slice() {
            [one] => format!("{one} (which means /distlock/{one}) or /{one}"),
            _ => format!("/{}", segments.join("/")),
        };
        Err(bad(format!("give a bare name without '/' or an absolute znode path, e.g. {suggestion}")))
    } else {
        Ok(format!("/distlock/{lock}"))
    }
}

/// A lock of any backend and kind, made by [`Client`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// let lock = client.mutex("orders")?;
/// match lock.lock_timeout(std::time::Duration::from_secs(2)).await? {
///     Some(g) => g.release().await?,
///     None => println!("{} is busy", lock.name()),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Lock {
    kind: LockKind,
}

#[derive(Debug, Clone)]
enum LockKind {
    #[cfg(feature = "zookeeper")]
    ZooKeeper(crate::zookeeper::LockSpec),
    #[cfg(feature = "redis")]
    Redis(crate::redis::Mutex),
    #[cfg(feature = "redis")]
    RedisSimple(crate::redis::SimpleLock),
    #[cfg(feature = "redis")]
    RedisRead(crate::redis::RwLock),
    #[cfg(feature = "redis")]
    RedisWrite(crate::redis::RwLock),
    #[cfg(feature = "redis")]
    RedisPermit(crate::redis::Semaphore),
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::Mutex),
    #[cfg(feature = "postgres")]
    PostgresPermit(crate::postgres::Semaphore),
    #[cfg(feature = "mysql")]
    Mysql(crate::mysql::Mutex),
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sqlite::Mutex),
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::Mutex),
    #[cfg(feature = "etcd")]
    EtcdRead(crate::etcd::RwLock),
    #[cfg(feature = "etcd")]
    EtcdWrite(crate::etcd::RwLock),
    #[cfg(feature = "etcd")]
    EtcdPermit(crate::etcd::Semaphore),
}

#[cfg(feature = "redis")]
impl From<crate::redis::Mutex> for Lock {
    fn from(m: crate::redis::Mutex) -> Lock {
        Lock { kind: LockKind::Redis(m) }
    }
}

#[cfg(feature = "redis")]
impl From<crate::redis::SimpleLock> for Lock {
    fn from(m: crate::redis::SimpleLock) -> Lock {
        Lock { kind: LockKind::RedisSimple(m) }
    }
}

#[cfg(feature = "zookeeper")]
impl From<crate::zookeeper::LockSpec> for Lock {
    fn from(s: crate::zookeeper::LockSpec) -> Lock {
        Lock { kind: LockKind::ZooKeeper(s) }
    }
}

impl Lock {
    /// The lock's name on the server (znode path or key).
    pub fn name(&self) -> &str {
        match &self.kind {
            #[cfg(feature = "zookeeper")]
            LockKind::ZooKeeper(s) => s.path(),
            #[cfg(feature = "redis")]
            LockKind::Redis(m) => m.key(),
            #[cfg(feature = "redis")]
            LockKind::RedisSimple(m) => m.key(),
            #[cfg(feature = "redis")]
            LockKind::RedisRead(l) | LockKind::RedisWrite(l) => l.key(),
            #[cfg(feature = "redis")]
            LockKind::RedisPermit(s) => s.key(),
            #[cfg(feature = "postgres")]
            LockKind::Postgres(m) => m.name(),
            #[cfg(feature = "postgres")]
            LockKind::PostgresPermit(s) => s.name(),
            #[cfg(feature = "mysql")]
            LockKind::Mysql(m) => m.name(),
            #[cfg(feature = "sqlite")]
            LockKind::Sqlite(m) => m.name(),
            #[cfg(feature = "etcd")]
            LockKind::Etcd(m) => m.name(),
            #[cfg(feature = "etcd")]
            LockKind::EtcdRead(l) | LockKind::EtcdWrite(l) => l.name(),
            #[cfg(feature = "etcd")]
            LockKind::EtcdPermit(s) => s.name(),
        }
    }

    /// Waits as long as it takes.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe on every backend: a dropped acquire leaves nothing behind (ZooKeeper and etcd
    /// delete the queue node or key it made, PostgreSQL cancels the waiting statement, MariaDB
    /// closes the waiting connection, Redis and SQLite write nothing until they grant, and a grant
    /// that raced the drop is released in the background).
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] or [`Error::Connect`] when the server fails or cannot be reached,
    /// [`Error::SessionExpired`] when the client's session ended meanwhile (connect again), and
    /// the backend's refusals of the request (for example [`Error::WouldDeadlock`]).
    pub async fn lock(&self) -> Result<Guard> {
        Ok(self.acquire(None, None).await?.expect("waiting without a deadline ends only with the lock"))
    }

    /// Never waits: `None` if someone else holds it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe on every backend: a dropped acquire leaves nothing behind (ZooKeeper and etcd
    /// delete the queue node or key it made, PostgreSQL cancels the waiting statement, MariaDB
    /// closes the waiting connection, Redis and SQLite write nothing until they grant, and a grant
    /// that raced the drop is released in the background).
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] or [`Error::Connect`] when the server fails or cannot be reached,
    /// [`Error::SessionExpired`] when the client's session ended meanwhile (connect again), and
    /// the backend's refusals of the request (for example [`Error::WouldDeadlock`]).
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Waits at most `timeout`: `None` if not had in time (nothing is left waiting or held).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe on every backend: a dropped acquire leaves nothing behind (ZooKeeper and etcd
    /// delete the queue node or key it made, PostgreSQL cancels the waiting statement, MariaDB
    /// closes the waiting connection, Redis and SQLite write nothing until they grant, and a grant
    /// that raced the drop is released in the background).
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] or [`Error::Connect`] when the server fails or cannot be reached,
    /// [`Error::SessionExpired`] when the client's session ended meanwhile (connect again), and
    /// the backend's refusals of the request (for example [`Error::WouldDeadlock`]).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<Guard>> {
        self.acquire(Some(timeout), None).await
    }

    /// `timeout` `None` waits forever, `Some(ZERO)` never waits; `progress` receives the queue
    /// position while waiting, where the backend has a queue (ZooKeeper).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe on every backend: a dropped acquire leaves nothing behind (ZooKeeper and etcd
    /// delete the queue node or key it made, PostgreSQL cancels the waiting statement, MariaDB
    /// closes the waiting connection, Redis and SQLite write nothing until they grant, and a grant
    /// that raced the drop is released in the background).
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] or [`Error::Connect`] when the server fails or cannot be reached,
    /// [`Error::SessionExpired`] when the client's session ended meanwhile (connect again), and
    /// the backend's refusals of the request (for example [`Error::WouldDeadlock`]).
    pub async fn acquire(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<Guard>> {
        let _ = &progress;
        let kind = match &self.kind {
            #[cfg(feature = "zookeeper")]
            LockKind::ZooKeeper(s) => s.acquire(timeout, progress).await?.map(GuardKind::ZooKeeper),
            #[cfg(feature = "redis")]
            LockKind::Redis(m) => match timeout {
                None => Some(m.lock().await?),
                Some(t) if t.is_zero() => m.try_lock().await?,
                Some(t) => m.lock_timeout(t).await?,
            }
            .map(GuardKind::Redis),
            #[cfg(feature = "redis")]
            LockKind::RedisSimple(m) => match timeout {
                None => Some(m.lock().await?),
                Some(t) if t.is_zero() => m.try_lock().await?,
                Some(t) => m.lock_timeout(t).await?,
            }
            .map(GuardKind::RedisSimple),
            #[cfg(feature = "redis")]
            LockKind::RedisRead(l) => match timeout {
                None => Some(l.read().await?),
                Some(t) if t.is_zero() => l.try_read().await?,
                Some(t) => l.read_timeout(t).await?,
            }
            .map(GuardKind::RedisRead),
            #[cfg(feature = "redis")]
            LockKind::RedisWrite(l) => match timeout {
                None => Some(l.write().await?),
                Some(t) if t.is_zero() => l.try_write().await?,
                Some(t) => l.write_timeout(t).await?,
            }
            .map(GuardKind::RedisWrite),
            #[cfg(feature = "redis")]
            LockKind::RedisPermit(s) => match timeout {
                None => Some(s.acquire().await?),
                Some(t) if t.is_zero() => s.try_acquire().await?,
                Some(t) => s.acquire_timeout(t).await?,
            }
            .map(GuardKind::RedisPermit),
            #[cfg(feature = "postgres")]
            LockKind::Postgres(m) => match timeout {
                None => Some(m.lock().await?),
                Some(t) if t.is_zero() => m.try_lock().await?,
                Some(t) => m.lock_timeout(t).await?,
            }
            .map(GuardKind::Postgres),
            #[cfg(feature = "postgres")]
            LockKind::PostgresPermit(s) => match timeout {
                None => Some(s.acquire().await?),
                Some(t) if t.is_zero() => s.try_acquire().await?,
                Some(t) => s.acquire_timeout(t).await?,
            }
            .map(GuardKind::Postgres),
            #[cfg(feature = "mysql")]
            LockKind::Mysql(m) => match timeout {
                None => Some(m.lock().await?),
                Some(t) if t.is_zero() => m.try_lock().await?,
                Some(t) => m.lock_timeout(t).await?,
            }
            .map(GuardKind::Mysql),
            #[cfg(feature = "sqlite")]
            LockKind::Sqlite(m) => match timeout {
                None => Some(m.lock().await?),
                Some(t) if t.is_zero() => m.try_lock().await?,
                Some(t) => m.lock_timeout(t).await?,
            }
            .map(GuardKind::Sqlite),
            #[cfg(feature = "etcd")]
            LockKind::Etcd(m) => match timeout {
                None => Some(m.lock().await?),
                Some(t) if t.is_zero() => m.try_lock().await?,
                Some(t) => m.lock_timeout(t).await?,
            }
            .map(GuardKind::Etcd),
            #[cfg(feature = "etcd")]
            LockKind::EtcdRead(l) => match timeout {
                None => Some(l.read().await?),
                Some(t) if t.is_zero() => l.try_read().await?,
                Some(t) => l.read_timeout(t).await?,
            }
            .map(GuardKind::Etcd),
            #[cfg(feature = "etcd")]
            LockKind::EtcdWrite(l) => match timeout {
                None => Some(l.write().await?),
                Some(t) if t.is_zero() => l.try_write().await?,
                Some(t) => l.write_timeout(t).await?,
            }
            .map(GuardKind::Etcd),
            #[cfg(feature = "etcd")]
            LockKind::EtcdPermit(s) => match timeout {
                None => Some(s.acquire().await?),
                Some(t) if t.is_zero() => s.try_acquire().await?,
                Some(t) => s.acquire_timeout(t).await?,
            }
            .map(GuardKind::Etcd),
        };
        Ok(kind.map(|kind| Guard { kind }))
    }
}

/// A held [`Lock`], of any backend: the one guard contract.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(guard: distlock::Guard) -> distlock::Result<()> {
/// println!("{} token {} node {}", guard.lock_name(), guard.fencing_token(), guard.holder_id());
/// tokio::select! {
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => guard.release().await?,
///     reason = guard.lost() => eprintln!("lost: {reason}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct Guard {
    kind: GuardKind,
}

#[derive(Debug)]
enum GuardKind {
    #[cfg(feature = "zookeeper")]
    ZooKeeper(crate::zookeeper::AnyGuard),
    #[cfg(feature = "redis")]
    Redis(crate::redis::MutexGuard),
    #[cfg(feature = "redis")]
    RedisSimple(crate::redis::SimpleGuard),
    #[cfg(feature = "redis")]
    RedisRead(crate::redis::ReadGuard),
    #[cfg(feature = "redis")]
    RedisWrite(crate::redis::WriteGuard),
    #[cfg(feature = "redis")]
    RedisPermit(crate::redis::SemaphorePermit),
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::MutexGuard),
    #[cfg(feature = "mysql")]
    Mysql(crate::mysql::MutexGuard),
    #[cfg(feature = "sqlite")]
    Sqlite(crate::sqlite::MutexGuard),
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::LockGuard),
}

macro_rules! each {
    ($self:expr, $g:ident => $e:expr) => {
        match $self {
            #[cfg(feature = "zookeeper")]
            GuardKind::ZooKeeper($g) => $e,
            #[cfg(feature = "redis")]
            GuardKind::Redis($g) => $e,
            #[cfg(feature = "redis")]
            GuardKind::RedisSimple($g) => $e,
            #[cfg(feature = "redis")]
            GuardKind::RedisRead($g) => $e,
            #[cfg(feature = "redis")]
            GuardKind::RedisWrite($g) => $e,
            #[cfg(feature = "redis")]
            GuardKind::RedisPermit($g) => $e,
            #[cfg(feature = "postgres")]
            GuardKind::Postgres($g) => $e,
            #[cfg(feature = "mysql")]
            GuardKind::Mysql($g) => $e,
            #[cfg(feature = "sqlite")]
            GuardKind::Sqlite($g) => $e,
            #[cfg(feature = "etcd")]
            GuardKind::Etcd($g) => $e,
        }
    };
}

impl Guard {
    /// The ZooKeeper guard inside; `None` (and released, on drop) for another backend's.
    #[cfg(feature = "zookeeper")]
    pub(crate) fn into_zookeeper(self) -> Option<crate::zookeeper::AnyGuard> {
        match self.kind {
            GuardKind::ZooKeeper(g) => Some(g),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The lock's name on the server (znode path or key).
    pub fn lock_name(&self) -> String {
        match &self.kind {
            #[cfg(feature = "zookeeper")]
            GuardKind::ZooKeeper(g) => g.lock_path(),
            #[cfg(feature = "redis")]
            GuardKind::Redis(g) => g.key().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisSimple(g) => g.key().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisRead(g) => g.key().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisWrite(g) => g.key().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisPermit(g) => g.key().to_string(),
            #[cfg(feature = "postgres")]
            GuardKind::Postgres(g) => g.name().to_string(),
            #[cfg(feature = "mysql")]
            GuardKind::Mysql(g) => g.name().to_string(),
            #[cfg(feature = "sqlite")]
            GuardKind::Sqlite(g) => g.name().to_string(),
            #[cfg(feature = "etcd")]
            GuardKind::Etcd(g) => g.name().to_string(),
        }
    }

    /// Our mark on the server: the lock node's path (ZooKeeper), the hash field (Redisson
    /// layout) or the key's value (simple layout).
    pub fn holder_id(&self) -> String {
        match &self.kind {
            #[cfg(feature = "zookeeper")]
            GuardKind::ZooKeeper(g) => g.node_path(),
            #[cfg(feature = "redis")]
            GuardKind::Redis(g) => g.holder_id().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisSimple(g) => g.holder_id().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisRead(g) => g.holder_id().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisWrite(g) => g.holder_id().to_string(),
            #[cfg(feature = "redis")]
            GuardKind::RedisPermit(g) => g.holder_id().to_string(),
            #[cfg(feature = "postgres")]
            GuardKind::Postgres(g) => g.holder_id(),
            #[cfg(feature = "mysql")]
            GuardKind::Mysql(g) => g.holder_id(),
            #[cfg(feature = "sqlite")]
            GuardKind::Sqlite(g) => g.holder_id().to_string(),
            #[cfg(feature = "etcd")]
            GuardKind::Etcd(g) => g.key().to_string(),
        }
    }

    /// Strictly increasing from one holder of the lock to the next.
    pub fn fencing_token(&self) -> u64 {
        each!(&self.kind, g => g.fencing_token())
    }

    /// The instant after which the server may give the lock to someone else unless it hears
    /// from us first.
    pub fn lease_deadline(&self) -> std::time::Instant {
        each!(&self.kind, g => g.lease_deadline())
    }

    /// The state now.
    pub fn state(&self) -> LockState {
        each!(&self.kind, g => g.state())
    }

    /// Resolves when the lock can no longer be trusted.
    pub fn lost(&self) -> Pin<Box<dyn Future<Output = LostReason> + Send + 'static>> {
        each!(&self.kind, g => {
            let lost: Pin<Box<dyn Future<Output = LostReason> + Send + 'static>> = Box::pin(g.lost());
            lost
        })
    }

    /// Releases and waits for the server.
    ///
    /// # Cancel safety
    ///
    /// Dropping the release future (or the guard, unreleased) still releases: the release goes
    /// on in the background, and if the server cannot be reached the lock ends with the
    /// client's session, connection or lease.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] if the lock had been lost before, or the server no longer had it as
    /// ours (the work done under it may have overlapped another holder's: check the fencing
    /// token's use); [`Error::Backend`] if the server failed to answer.
    pub async fn release(self) -> Result<()> {
        each!(self.kind, g => g.release().await)
    }
}

/// Several [`Lock`]s of any kinds and backends, taken all or nothing, in name order (so two
/// multi-locks never wait for each other in a cycle).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// let both = distlock::MultiLock::new(vec![client.mutex("a")?, client.mutex("b")?])?;
/// if let Some(g) = both.lock_timeout(std::time::Duration::from_secs(5)).await? {
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

impl MultiLock {
    /// Orders the members; a name given twice is refused (it would wait for itself).
    pub fn new(mut locks: Vec<Lock>) -> Result<MultiLock> {
        order_members(&mut locks, Lock::name)?;
        Ok(MultiLock { locks })
    }

    /// Waits for every member.
    pub async fn lock(&self) -> Result<MultiGuard> {
        Ok(self.acquire(None, None).await?.expect("waiting forever always acquires"))
    }

    /// Every member within `timeout` (for the whole set), or none.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<MultiGuard>> {
        self.acquire(Some(timeout), None).await
    }

    /// `timeout` `None` waits forever, `Some(ZERO)` never waits; `progress` as in
    /// [`Lock::acquire`].
    pub async fn acquire(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<MultiGuard>> {
        Ok(acquire_all(&self.locks, timeout, progress).await?.map(|parts| MultiGuard { parts }))
    }
}

/// Takes `locks` in the order given, all or nothing: on a refusal or an error, what was taken is
/// released again (bounded by the deadline plus a grace, the rest goes on in the background).
pub(crate) async fn acquire_all(
    locks: &[Lock],
    timeout: Option<Duration>,
    progress: Option<&watch::Sender<QueueStatus>>,
) -> Result<Option<Vec<Guard>>> {
    // A timeout too large to add is as good as none.
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let mut taken = Vec::with_capacity(locks.len());
    for lock in locks {
        let remaining = match (timeout, deadline) {
            (Some(t), _) if t.is_zero() => Some(Duration::ZERO),
            (_, Some(d)) => Some(d.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))),
            _ => None,
        };
        let result = lock.acquire(remaining, progress).await;
        match result {
            Ok(Some(g)) => taken.push(g),
            Ok(None) | Err(_) => {
                tracing::debug!(
                    lock = lock.name(),
                    taken = taken.len(),
                    "multi-lock member not acquired; rolling back"
                );
                let rollback = MultiGuard { parts: taken }.release();
                let rollback = match deadline {
                    Some(d) => tokio::time::timeout_at(d.max(Instant::now()) + Duration::from_millis(200), rollback)
                        .await
                        .unwrap_or(Ok(())),
                    None => rollback.await,
                };
                return match (result, rollback) {
                    (Err(e), _) => Err(e),
                    (Ok(_), Err(e)) => Err(e),
                    (Ok(_), Ok(())) => Ok(None),
                };
            }
        }
    }
    Ok(Some(taken))
}

/// Every member of a [`MultiLock`], held; each released on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(g: distlock::MultiGuard) -> distlock::Result<()> {
/// for part in g.parts() {
///     println!("{} token {}", part.lock_name(), part.fencing_token());
/// }
/// g.release().await
/// # }
/// ```
#[must_use = "if unused the locks are released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MultiGuard {
    parts: Vec<Guard>,
}

impl MultiGuard {
    /// The held members, in acquisition order.
    pub fn parts(&self) -> &[Guard] {
        &self.parts
    }

    /// The earliest lease deadline of the members.
    pub fn lease_deadline(&self) -> Option<std::time::Instant> {
        self.parts.iter().map(|p| p.lease_deadline()).min()
    }

    /// Resolves when any member can no longer be trusted.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let all: Vec<_> = self.parts.iter().map(|p| p.lost()).collect();
        async move { futures::future::select_all(all).await.0 }
    }

    /// Releases every member in reverse order; reports the first error after trying all.
    pub async fn release(self) -> Result<()> {
        release_all(self.parts, Guard::release).await
    }
}

/// Sorts multi-lock members by name (one global order: no two multi-locks wait for each other
/// in a cycle); an empty list or a name given twice (it would wait for itself) is refused.
pub(crate) fn order_members<T>(members: &mut [T], name: impl Fn(&T) -> &str) -> Result<()> {
    if members.is_empty() {
        return Err(Error::InvalidArgument {
            what: "lock list",
            reason: "a multi-lock needs at least one lock".into(),
        });
    }
    members.sort_by(|a, b| name(a).cmp(name(b)));
    for pair in members.windows(2) {
        if name(&pair[0]) == name(&pair[1]) {
            return Err(Error::InvalidLockPath {
                path: name(&pair[0]).to_string(),
                reason: "named twice in one multi-lock (it would wait for itself)".into(),
            });
        }
    }
    Ok(())
}

/// Releases `parts` in reverse order; the first error after trying all.
pub(crate) async fn release_all<G, F, Fut>(parts: Vec<G>, release: F) -> Result<()>
where
    F: Fn(G) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut first = Ok(());
    for part in parts.into_iter().rev() {
        if let Err(e) = release(part).await {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

impl crate::DistributedLock for Lock {
    type Guard = Guard;
    fn name(&self) -> &str {
        Lock::name(self)
    }
    fn acquire_timeout(&self, timeout: Duration) -> impl Future<Output = Result<Option<Guard>>> + Send {
        self.lock_timeout(timeout)
    }
}

impl crate::DistributedGuard for Guard {
    fn fencing_token(&self) -> u64 {
        Guard::fencing_token(self)
    }
    fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        Guard::lost(self)
    }
    fn release(self) -> impl Future<Output = Result<()>> + Send {
        Guard::release(self)
    }
}

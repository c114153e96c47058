//! One API for every backend: [`connect`] picks the backend from the URL's scheme.
//!
//! The typed modules ([`zookeeper`](crate::zookeeper), [`redis`](crate::redis), …) keep every
//! backend's extras; the types here erase the backend so that code (and the CLI) is written once:
//! a [`Client`] makes [`Lock`]s of a few kinds, every lock gives the same [`Guard`] contract
//! (fencing token, state, `lost()`, lease deadline, `release()`, release on drop). They are thin
//! over the internal contract ([`crate::contract`]): nothing here matches on a backend, and a new
//! backend adds one line to [`BACKENDS`], the one registry.
//!
//! A recipe a backend does not offer is an [`Error::Unsupported`] when the lock is made, before
//! any I/O; a scheme whose cargo feature is compiled out is an [`Error::InvalidUrl`] naming the
//! feature.

use crate::contract::{Backend, BoxFuture, Held, Kind, Recipe, Wait};
use crate::{Error, LockState, LostReason, QueueStatus, Result};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A backend's connect function, by URL.
/// The values of `ConnectOptions` in place of the URL's.
type Connector = for<'a> fn(&'a str, &'a crate::options::Common) -> BoxFuture<'a, Result<Client>>;

/// A backend distlock knows: its name (which is also its cargo feature), the URL schemes it
/// serves, and how it connects when its feature is compiled in. [`BACKENDS`] lists them.
#[derive(Debug, Clone, Copy)]
pub struct BackendInfo {
    /// `zookeeper`, `redis`, `postgres`, `mysql`, `sqlite`, `etcd`, `nats` or `memory`: what
    /// [`Client::backend`] says, and the cargo feature that compiles it in.
    pub name: &'static str,
    /// The URL schemes it serves (`zk`, `zks`, …).
    pub schemes: &'static [&'static str],
    /// The shapes of its URLs and its own query keys, one line each, as the command line's
    /// `--backend` help shows them (every scheme also takes `lease=` and `connect_timeout=`).
    pub urls: &'static [&'static str],
    /// The environment variables in which the backend's own command-line lock tool gives its
    /// command the holder's mark ([`Guard::holder_id`]) and the token ([`Guard::fencing_token`]),
    /// where it has such a tool: `etcdctl lock`'s `ETCD_LOCK_KEY` and `ETCD_LOCK_REV`. A program
    /// run under a lock (`distlock exec`) gets them too, so scripts written for that tool work.
    pub tool_env: Option<[&'static str; 2]>,
    /// What it can do, for callers that adapt to a backend (the CLI, the shared tests) instead
    /// of naming it.
    pub capabilities: Capabilities,
    connect: Option<Connector>,
}

/// What a backend can do (see [`BackendInfo::capabilities`] and [`Client::info`]). What it
/// cannot is refused with [`crate::Error::Unsupported`] where asked for: this tells it before.
///
/// # Examples
///
/// ```
/// let info = distlock::BACKENDS.iter().find(|b| b.name == "mysql").unwrap();
/// assert!(!info.capabilities.read_write, "MariaDB's GET_LOCK gives the mutex only");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Read and write locks, besides the mutex.
    pub read_write: bool,
    /// Semaphores (permits).
    pub semaphores: bool,
    /// [`Client::locks`] lists the locks in use (MariaDB cannot: `GET_LOCK` has no listing).
    pub lists_locks: bool,
    /// The listing takes a name prefix (PostgreSQL lists advisory keys: only the whole database).
    pub lists_by_name: bool,
    /// The server records a waiter, so a listing shows it (Redis waiters wait on a channel,
    /// SQLite's poll the row, MariaDB's are the server's own).
    pub records_waiters: bool,
    /// Each lock's fencing tokens are its own, so a listing tells a holder's (PostgreSQL draws
    /// every lock's from one sequence).
    pub tokens_per_lock: bool,
    /// An election's leader is watched (a change is told at once); elsewhere it is polled.
    pub watches_leader: bool,
}

/// Every capability: a backend's entry names what it lacks.
const ALL: Capabilities = Capabilities {
    read_write: true,
    semaphores: true,
    lists_locks: true,
    lists_by_name: true,
    records_waiters: true,
    tokens_per_lock: true,
    watches_leader: true,
};

impl BackendInfo {
    /// Whether this build has the backend (its cargo feature is on).
    pub fn compiled_in(&self) -> bool {
        self.connect.is_some()
    }
}

/// `Some(connect)` when `feature` is compiled in, else `None`.
macro_rules! compiled {
    ($feature:literal, $connect:path) => {{
        #[cfg(feature = $feature)]
        const CONNECT: Option<Connector> = Some($connect);
        #[cfg(not(feature = $feature))]
        const CONNECT: Option<Connector> = None;
        CONNECT
    }};
}

/// The one registry of backends: the scheme dispatch of [`connect`], the error for a scheme
/// whose feature is off, and the list of known schemes all come from it. A new backend adds
/// one line here (and its folder).
///
/// # Examples
///
/// ```
/// let zk = distlock::BACKENDS.iter().find(|b| b.schemes.contains(&"zks")).unwrap();
/// assert_eq!(zk.name, "zookeeper");
/// let etcd = distlock::BACKENDS.iter().find(|b| b.name == "etcd").unwrap();
/// assert_eq!(etcd.tool_env, Some(["ETCD_LOCK_KEY", "ETCD_LOCK_REV"]));
/// ```
pub const BACKENDS: &[BackendInfo] = &[
    BackendInfo {
        name: "zookeeper",
        schemes: &["zk", "zks"],
        urls: &["zk://[user:password@]host:2181[,host:2181…]/chroot?lease=10s (zks:// for TLS, auth=sasl for a SASL login)"],
        tool_env: None,
        capabilities: ALL,
        connect: compiled!("zookeeper", crate::zookeeper::contract::connect),
    },
    BackendInfo {
        name: "redis",
        schemes: &["redis", "rediss", "redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"],
        urls: &["redis://[:password@]host:6379/db?lease=30s&layout=redisson|simple (rediss:// for TLS)", "redis+sentinel://sentinel1:26379,sentinel2/MASTER_NAME[/db]?lease=30s", "redis+cluster://node1:7000,node2:7001?lease=30s"],
        tool_env: None,
        capabilities: Capabilities { records_waiters: false, watches_leader: false, ..ALL },
        connect: compiled!("redis", crate::redis::contract::connect),
    },
    BackendInfo {
        name: "postgres",
        schemes: &["postgres", "postgresql"],
        urls: &["postgres://user@host:5432/db?lease=30s&keys=distributedlock|raw"],
        tool_env: None,
        capabilities: Capabilities { lists_by_name: false, tokens_per_lock: false, watches_leader: false, ..ALL },
        connect: compiled!("postgres", crate::postgres::contract::connect),
    },
    BackendInfo {
        name: "mysql",
        schemes: &["mysql", "mariadb"],
        urls: &["mysql://user@host:3306/db?lease=30s (MariaDB or MySQL GET_LOCK)"],
        tool_env: None,
        capabilities: Capabilities { read_write: false, semaphores: false, lists_locks: false, lists_by_name: false, records_waiters: false, watches_leader: false, ..ALL },
        connect: compiled!("mysql", crate::mysql::contract::connect),
    },
    BackendInfo {
        name: "sqlite",
        schemes: &["sqlite"],
        urls: &["sqlite:///path/locks.db?lease=30s&table=distlock_leases"],
        tool_env: None,
        capabilities: Capabilities { read_write: false, semaphores: false, records_waiters: false, watches_leader: false, ..ALL },
        connect: compiled!("sqlite", crate::sqlite::contract::connect),
    },
    BackendInfo {
        name: "etcd",
        schemes: &["etcd", "etcds"],
        urls: &["etcd://host:2379[,host:2379]?lease=30s (etcd's lock recipe, as etcdctl lock; etcds:// for TLS)"],
        tool_env: Some(["ETCD_LOCK_KEY", "ETCD_LOCK_REV"]),
        capabilities: ALL,
        connect: compiled!("etcd", crate::etcd::contract::connect),
    },
    BackendInfo {
        name: "nats",
        schemes: &["nats", "natss"],
        urls: &["nats://[user:password@|token@]host:4222[,host:4222][/BUCKET]?lease=30s&replicas=3 (a JetStream KV bucket; natss:// for TLS)"],
        tool_env: None,
        capabilities: Capabilities { records_waiters: false, watches_leader: false, ..ALL },
        connect: compiled!("nats", crate::nats::contract::connect),
    },
    BackendInfo {
        name: "memory",
        schemes: &["memory"],
        urls: &["memory://NAME?lease=30s (in this process only, for tests)"],
        tool_env: None,
        capabilities: Capabilities { records_waiters: false, ..ALL },
        connect: compiled!("memory", crate::memory::connect),
    },
];

/// Every URL scheme distlock knows, with the backend (and cargo feature) that serves it, from
/// [`BACKENDS`].
///
/// # Examples
///
/// ```
/// assert!(distlock::schemes().any(|(scheme, backend)| scheme == "rediss" && backend == "redis"));
/// ```
pub fn schemes() -> impl Iterator<Item = (&'static str, &'static str)> {
    BACKENDS.iter().flat_map(|b| b.schemes.iter().map(move |s| (*s, b.name)))
}

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
    connect_common(url, &Default::default()).await
}

/// As [`connect`], with `over`'s values (from [`ConnectOptions`](crate::ConnectOptions)) in place
/// of the URL's.
async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    let bad = |reason: String| Error::InvalidUrl { url: crate::redact_url(url), reason: crate::redact::scrub(&reason, url) };
    match BACKENDS.iter().find(|b| b.schemes.contains(&scheme)) {
        Some(BackendInfo { connect: Some(connect), .. }) => connect(url, over).await.map_err(|e| crate::redact::scrub_error(e, url)),
        Some(b) => Err(bad(format!(
            "the {scheme}:// backend is not compiled in (enable distlock's {:?} feature)",
            b.name
        ))),
        None => Err(bad(format!(
            "unknown scheme {scheme:?}: use one of {}",
            schemes().map(|(s, _)| format!("{s}://")).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Connects to the backend `url` names, with `options` in force on every backend: their values
/// take the place of the URL's (`lease`, `connect_timeout`, `setup`, the TLS files, under any of
/// their names), and each backend's own checks judge them as they judge a URL's.
///
/// # Errors
///
/// As [`connect`], and [`Error::InvalidArgument`] or [`Error::InvalidUrl`] for an option the
/// backend cannot take (the message names it).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// use distlock::ConnectOptions;
/// use std::time::Duration;
/// let options = ConnectOptions::new().connect_timeout(Duration::from_secs(1));
/// let client = distlock::connect_with("etcd://127.0.0.1:2379", &options).await?;
/// # let _ = client; Ok(()) }
/// ```
pub async fn connect_with(url: &str, options: &crate::ConnectOptions) -> Result<Client> {
    connect_common(url, &options.common()?).await.map_err(|e| options.explain(url, e))
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
    inner: Arc<dyn Backend>,
}

impl Client {
    pub(crate) fn from_backend(inner: Arc<dyn Backend>) -> Client {
        Client { inner }
    }

    /// `zookeeper`, `redis`, `postgres`, `mysql`, `sqlite`, `etcd` or `memory`.
    pub fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    /// This backend's entry in [`BACKENDS`].
    pub fn info(&self) -> &'static BackendInfo {
        let name = self.backend();
        BACKENDS.iter().find(|b| b.name == name).expect("every backend is in the registry")
    }

    /// The typed client of this backend (`distlock::redis::Client`, …), if it is that one: the
    /// way to a backend's extras. Each backend adds its own shorthand for it (`Client::redis()`, …).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> distlock::Result<()> {
    /// let client = distlock::connect("sqlite:///tmp/locks.db").await?;
    /// assert!(client.downcast::<distlock::sqlite::Client>().is_some());
    /// # Ok(()) }
    /// ```
    pub fn downcast<T: 'static>(&self) -> Option<&T> {
        self.inner.as_any().downcast_ref()
    }

    /// How long the server keeps a lock whose holder went silent (the URL's `lease`): the
    /// ZooKeeper session timeout, the Redis or SQL lease, the etcd session's TTL. A guard
    /// reports `Lost` before it runs out.
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// What a lock name means on this backend: on ZooKeeper a bare name `orders` is the znode
    /// `/distlock/orders` and a path starting with `/` is used as is; elsewhere the name is the
    /// key, exactly as given (as Redisson, redis-py and `etcdctl lock` use it), checked against
    /// the backend's limits.
    pub fn lock_name(&self, name: &str) -> Result<String> {
        crate::contract::check_name(name)?;
        self.inner.lock_name(name)
    }

    /// Every lock in use (held or awaited) whose name on the server starts with `prefix`, in
    /// one shape on every backend: holders and waiters in queue order with owner, hold or wait
    /// time, token and lease left, as far as the server records them ([`Listing::unseen`]
    /// says what it does not). On ZooKeeper a bare prefix is under `/distlock/` and an empty
    /// one lists all of it. Refused with [`Error::Unsupported`](crate::Error::Unsupported)
    /// where the server cannot list: a Redis Cluster, PostgreSQL with a non-empty prefix
    /// (`pg_locks` has keys, not names), and MariaDB (no reliable list of `GET_LOCK` locks).
    ///
    /// [`Listing::unseen`]: crate::listing::Listing::unseen
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> distlock::Result<()> {
    /// let client = distlock::connect("sqlite:///tmp/locks.db").await?;
    /// for lock in client.locks("orders").await?.locks {
    ///     for e in &lock.entries {
    ///         println!("{} {} {}", lock.name, if e.holds { "held by" } else { "awaited by" }, e.owner);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn locks(&self, prefix: &str) -> Result<crate::listing::Listing> {
        self.inner.locks(prefix).await
    }

    /// The one lock `name` in the shape of [`Client::locks`]: a listing of exactly that lock,
    /// its holders and waiters (none when it is free) and its last fencing token where the
    /// backend keeps one per lock. Works on every backend, also where a listing by prefix
    /// is refused (not on PostgreSQL with `lock_scope=transaction`: behind a transaction pooler
    /// the sessions are the pooler's).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> distlock::Result<()> {
    /// let client = distlock::connect("sqlite:///tmp/locks.db").await?;
    /// let seen = client.inspect("orders").await?;
    /// let lock = &seen.locks[0];
    /// match lock.holders().next() {
    ///     Some(h) => println!("{} held by {}", lock.name, h.owner),
    ///     None => println!("{} is free", lock.name),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, name: &str) -> Result<crate::listing::Listing> {
        let name = self.lock_name(name)?;
        self.inner.lock(&name).await
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

    /// The leader election `name` (see [`crate::election`]): on ZooKeeper Curator's
    /// `LeaderLatch` layout under the name's path (`LeaderSelector`'s with `?election=selector`), on etcd Go's `concurrency.Election` under
    /// the prefix `name/`, on Redis a Redisson lock hash at the key `name` with the value beside
    /// the holder, on the SQL backends their mutex plus an announcement row.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
    /// let election = client.election("scheduler")?;
    /// let leading = election.campaign("host-a").await?;
    /// println!("epoch {}", leading.epoch());
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: &str) -> Result<crate::election::Election> {
        let name = self.lock_name(name)?;
        Ok(crate::election::Election::new(self.inner.election(&name)?, self.backend()))
    }

    /// The scheduled job named `name` (see [`crate::schedule`]): at most once per slot, ShedLock's
    /// bounds, a record of the last run, by the server's clock, on every backend. The name is
    /// ShedLock's: at most 64 characters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
    /// let hourly = client.schedule("rollup")?.once_per(std::time::Duration::from_secs(3600));
    /// println!("{:?}", hourly.last_run().await?);
    /// # Ok(()) }
    /// ```
    pub fn schedule(&self, name: &str) -> Result<crate::schedule::Schedule> {
        crate::schedule::check_name(name)?;
        Ok(crate::schedule::Schedule::new(self.inner.jobs()?, name.to_string(), self.backend()))
    }

    /// Makes what this backend stores beside its locks, where it is missing: on PostgreSQL and
    /// MariaDB the fencing sequence (done by connecting) and the election and job tables
    /// (`distlock_leaders`, `shedlock`, `distlock_job_runs`); on SQLite the same tables. Run once
    /// by a user allowed to create them (`distlock setup`), it lets lock users work with the
    /// grants of docs/security.md and no CREATE. ZooKeeper, etcd and Redis make their nodes and
    /// keys as they go: nothing to do there.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> distlock::Result<()> {
    /// let admin = distlock::connect("postgres://admin@db.internal/app?sslmode=verify-full").await?;
    /// admin.setup().await?;
    /// # Ok(()) }
    /// ```
    pub async fn setup(&self) -> Result<()> {
        // Each table is made on first use where missing: a read of each makes them. What this
        // client cannot use (PostgreSQL's lock_scope=transaction has no elections or jobs) needs
        // no table.
        let unsupported = |r: Result<()>| match r {
            Err(Error::Unsupported { .. }) => Ok(()),
            r => r,
        };
        unsupported(async { self.election("distlock-setup")?.leader().await.map(drop) }.await)?;
        unsupported(async { self.schedule("distlock-setup")?.last_run().await.map(drop) }.await)?;
        Ok(())
    }

    fn make(&self, name: &str, kind: Kind) -> Result<Lock> {
        // Refused once here for every backend, before any I/O (the typed APIs check it too).
        if kind == Kind::Permits(0) {
            return Err(Error::InvalidArgument {
                what: "permit count",
                reason: "a semaphore needs at least 1 permit".into(),
            });
        }
        let name = self.lock_name(name)?;
        Ok(Lock { inner: self.inner.recipe(&name, kind)?, backend: self.backend() })
    }

    /// Closes the connection; on ZooKeeper, waits at most `bound` for the server to end the
    /// session (and so delete its nodes).
    pub async fn close(self, bound: Duration) {
        // The backend's close owns a handle of its own: this one must go first, or the
        // connection outlives the wait (a ZooKeeper session ended only when `bound` ran out).
        let closing = self.inner.close(bound);
        drop(self);
        closing.await
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
    inner: Arc<dyn Recipe>,
    backend: &'static str,
}

impl Lock {
    pub(crate) fn from_recipe(inner: Arc<dyn Recipe>, backend: &'static str) -> Lock {
        Lock { inner, backend }
    }

    /// The lock's name on the server (znode path or key).
    pub fn name(&self) -> &str {
        self.inner.name()
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
        Ok(self.take(Wait::Forever, None).await?.expect("waiting without a deadline ends only with the lock"))
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
        self.take(Wait::Never, None).await
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
        self.take(Wait::from_timeout(Some(timeout)), None).await
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
        self.take(Wait::from_timeout(timeout), progress).await
    }

    /// The backend's acquire, never handing out a guard already lost: a grant that reaches a
    /// cut-off client only after its lease ran out (the store has let it go, maybe to another) is
    /// dropped, and the acquire goes on while `wait` allows (the simulation found such grants on
    /// memory://, issue 54).
    async fn acquire_live(
        &self,
        wait: Wait,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<Box<dyn Held>>> {
        loop {
            let got = self.inner.acquire(wait, progress).await?;
            let Some(inner) = got else { return Ok(None) };
            // The deadline, not `state()`: reading it has no side effect on any backend (a
            // ZooKeeper guard's state starts following its node).
            let deadline = tokio::time::Instant::from_std(inner.lease_deadline());
            if deadline > tokio::time::Instant::now() {
                return Ok(Some(inner));
            }
            tracing::debug!(lock = %self.inner.name(), "a grant whose lease had run out is not handed out");
            drop(inner);
            match wait {
                Wait::Until(d) if d > tokio::time::Instant::now() => {}
                Wait::Forever => {}
                _ => return Ok(None),
            }
        }
    }

    pub(crate) async fn take(
        &self,
        wait: Wait,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<Guard>> {
        use tracing::Instrument;
        let obs = crate::observe::Acquire::start(self.backend, self.inner.name());
        let got = self.acquire_live(wait, progress).instrument(obs.span.clone()).await;
        let busy = wait == Wait::Never;
        match got {
            Ok(Some(inner)) => {
                let hold = obs.end(Ok(Some(inner.fencing_token())), busy).expect("a grant makes a hold");
                Ok(Some(Guard { hold, inner: Some(inner) }))
            }
            Ok(None) => {
                obs.end(Ok(None), busy);
                Ok(None)
            }
            Err(e) => {
                obs.end(Err(()), busy);
                Err(e)
            }
        }
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
    hold: crate::observe::Hold,
    /// Taken by the release; until then always there.
    inner: Option<Box<dyn Held>>,
}

impl Guard {
    fn held(&self) -> &dyn Held {
        self.inner.as_deref().expect("a guard has its lock until its release or drop")
    }

    /// The lock's name on the server (znode path or key).
    pub fn lock_name(&self) -> &str {
        self.held().name()
    }

    /// Our mark on the server: the lock node's path (ZooKeeper), the hash field (Redisson
    /// layout), the key's value (simple layout), our key (etcd), the holder column (SQLite) or
    /// the session (PostgreSQL, MariaDB).
    pub fn holder_id(&self) -> &str {
        self.held().holder_id()
    }

    /// Strictly increasing from one holder of the lock to the next.
    pub fn fencing_token(&self) -> u64 {
        self.held().fencing_token()
    }

    /// The instant after which the server may give the lock to someone else unless it hears
    /// from us first.
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.held().lease_deadline()
    }

    /// The state now.
    pub fn state(&self) -> LockState {
        let state = self.held().state();
        self.hold.saw(state);
        state
    }

    /// Resolves when the lock can no longer be trusted.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.hold.counting_loss(self.held().lost())
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
    pub async fn release(mut self) -> Result<()> {
        let inner = self.inner.take().expect("a guard has its lock until its release or drop");
        let state = inner.state();
        let left = inner.lease_deadline().saturating_duration_since(tokio::time::Instant::now().into_std());
        self.hold.ending(state);
        let out = inner.release().await;
        // A loss the release itself found (the server no longer had the lock as ours).
        let found = match &out {
            Err(Error::LockLost { reason, .. }) if !state.is_lost() => Some(*reason),
            _ => None,
        };
        self.hold.released(out.is_ok(), state, left, found);
        out
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Unreleased: a loss it had is counted before the drop's own release ends the lease.
        if let Some(inner) = self.inner.take() {
            self.hold.ending(inner.state());
            drop(inner);
        }
    }
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    #[test]
    fn every_scheme_has_one_backend_and_an_unknown_one_lists_them() {
        let all: Vec<_> = schemes().collect();
        let mut unique: Vec<_> = all.iter().map(|(s, _)| *s).collect();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len(), "a scheme served twice: {all:?}");
        for secure in ["zks", "rediss", "rediss+sentinel", "rediss+cluster", "etcds"] {
            assert!(all.iter().any(|(s, _)| *s == secure), "{secure} missing");
        }
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let Err(e) = rt.block_on(connect("nosuch://h:1")) else { panic!("an unknown scheme connected") };
        let text = e.to_string();
        assert!(all.iter().all(|(s, _)| text.contains(&format!("{s}://"))), "{text}");
    }
}

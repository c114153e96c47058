//! The MariaDB (and MySQL) backend: `GET_LOCK` user locks, many on one shared connection,
//! fenced by a sequence (or a counter row) and honest about loss.
//!
//! # Layout
//!
//! | Piece | On the server |
//! |---|---|
//! | Lock `name` | the user lock `GET_LOCK(name, timeout)` (names of at most 64 characters, the server's limit), released by `RELEASE_LOCK(name)` or when the connection ends |
//! | Fencing tokens | by default the sequence `distlock_fencing_seq` (`NEXTVAL`, read in the statement that takes the lock, only if it granted: `SELECT IF(GET_LOCK(…) = 1, GREATEST(NEXTVAL(…), server clock in µs after the grant), NULL)`); with `fencing=row` (or on a server without sequences) row `(name, token)` of table `distlock_fencing`, advanced in the acquire statement (`INSERT … SELECT … WHERE GET_LOCK(…) = 1 ON DUPLICATE KEY UPDATE`): `greatest(last + 1, server clock in µs)`; neither is ever deleted |
//!
//! # Leases and loss
//!
//! A user lock has no lease: the server keeps it until the holding connection ends. Every lock
//! connection sets its session's `wait_timeout` to the lease, so the server closes a connection
//! that sent nothing for that long (freeing its locks). The guard pings every sixth of the lease;
//! its [`lease_deadline`](MutexGuard::lease_deadline) is the send time of the last answered ping
//! plus the lease, less a drift margin, and [`lost`](MutexGuard::lost) resolves there if no ping
//! was answered since, before the server can give the lock to anyone else. A connection the server
//! closed (`KILL`, a restart, a reset) is `Lost` the moment its socket says so: sqlx's MariaDB
//! connection has no signal of its own for that, so a duplicate of its socket is watched (and
//! where the socket cannot be found, a Unix socket for one, at the next ping, a sixth of the lease
//! at most). The server frees a `GET_LOCK` lock the moment the connection ends.
//!
//! # Connections
//!
//! A client's locks use at most `connections` server connections (default 4, waits included),
//! whatever their number: an acquire first asks `GET_LOCK(name, 0)` on a shared connection, and a
//! lock that must wait waits on the server on a connection that holds nothing (at most
//! `connections - 1` at once), which joins the shared ones once granted; with none free, the
//! acquire polls (woken when a local holder lets the name go, and on a timer, 5 ms doubling to
//! 500 ms). A shared connection has one lease, which its locks follow: it is lost, and every
//! lock on it with it, when the connection ends or stays silent past its deadline (see
//! `shared.rs` for how a name is kept from being granted twice through one session). A wait that
//! is dropped closes its connection, and the server ends a `GET_LOCK` wait whose client is gone.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! let db = distlock::mysql::Client::connect("mysql://app@127.0.0.1:3306/app?lease=10s").await?;
//! let guard = db.mutex("orders")?.lock().await?;
//! println!("token {}, lease until {:?}", guard.fencing_token(), guard.lease_deadline());
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub(crate) mod contract;
mod election;
mod jobs;
mod mutex;
mod shared;
mod socket_watch;
mod url;

pub use mutex::{Mutex, MutexGuard};
pub use url::{Fencing, MysqlUrl, SslMode};

use crate::{Error, Result};
use sqlx::{Connection, MySqlConnection};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

/// Idle connections kept for reuse, at most.
const MAX_IDLE: usize = 16;

/// The fencing counters' table with `fencing=row` (created on connect if missing).
pub const FENCING_TABLE: &str = "distlock_fencing";

/// The fencing sequence (the default; created on connect if missing).
pub const FENCING_SEQUENCE: &str = "distlock_fencing_seq";

/// A MariaDB server to take locks on: the URL, and idle lock connections to reuse. Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let db = distlock::mysql::Client::connect("mysql://root@127.0.0.1:3306/app").await?;
/// if let Some(g) = db.mutex("reports")?.try_lock().await? {
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    url: MysqlUrl,
    idle: StdMutex<Vec<Conn>>,
    /// Where tokens come from on this server: the URL's choice, or `Row` where the server has
    /// no sequences (set once at connect).
    fencing: std::sync::OnceLock<Fencing>,
    /// Renews every held lock's lease with a ping of its connection.
    watchdog: Arc<crate::watchdog::Watchdog>,
    /// The connections that held locks share.
    pool: shared::Pool,
    /// The runtime the client was made on: releases of guards dropped outside any runtime run
    /// there.
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("url", &self.inner.url).finish()
    }
}

/// One lock connection and its server-side id (`CONNECTION_ID()`).
pub(crate) struct Conn {
    pub(crate) conn: MySqlConnection,
    pub(crate) id: u64,
    /// The lock this connection holds: lost at once when the server closes the connection.
    holder: Arc<crate::lease::HolderSlot>,
    /// The task that watches the connection's socket (a duplicate of it) for the server closing
    /// it (`None` if the socket could not be found: then the next ping finds out). Ended with
    /// the connection, so that closing the connection closes the socket.
    _watcher: Option<Watcher>,
}

/// The socket watcher's task. Dropped with the connection: the socket is shut down at once (the
/// duplicate would otherwise keep it open until the aborted task is dropped) and the task ended.
#[derive(Debug)]
struct Watcher {
    task: tokio::task::AbortHandle,
    socket: Arc<socket_watch::SocketWatch>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.socket.shutdown();
        self.task.abort();
    }
}

impl Conn {
    /// The connection now holds lock `name` under `lease`.
    pub(crate) fn set_holder(&self, lease: &Arc<crate::lease::Lease>, name: &str) {
        self.holder.set(lease, name);
    }
}

impl Client {
    /// Connects to the server named by a `mysql://` URL (see [`MysqlUrl`]): opens one connection
    /// to check it, creates the fencing table if missing, and keeps that connection for the first
    /// lock.
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_common(url, &Default::default()).await
    }

    /// As [`connect`](Self::connect), with `over`'s values (from [`crate::ConnectOptions`]) in
    /// place of the URL's.
    pub(crate) async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
        Client::connect_url(MysqlUrl::parse_with(url, over)?).await
    }

    /// Connects with a parsed URL.
    pub async fn connect_url(url: MysqlUrl) -> Result<Client> {
        // The TLS files are read by the driver at each connection: checked here first, so that a
        // missing or malformed one is named at once.
        url.tls_files.read()?;
        url.warn_if_unverified();
        let client = Client {
            inner: Arc::new(Inner {
                watchdog: Arc::new(crate::watchdog::Watchdog::new(url.lease / 6)),
                pool: shared::Pool::new(url.connections),
                url,
                idle: StdMutex::new(Vec::new()),
                fencing: std::sync::OnceLock::new(),
                runtime: tokio::runtime::Handle::current(),
            }),
        };
        let mut conn = client.open().await?;
        refuse_galera(&mut conn.conn, &client.inner.url).await?;
        let mut fencing = client.inner.url.fencing;
        // Made once (by `distlock setup` or the first client with the right): a lock user needs
        // no CREATE privilege when they are there.
        let exists = |name: &'static str| {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
            )
            .bind(name)
        };
        let has_sequence = exists(FENCING_SEQUENCE)
            .fetch_one(&mut conn.conn)
            .await
            .map_err(|e| backend("look for", FENCING_SEQUENCE, e))?
            > 0;
        let missing = |what: String| Error::NotSetUp { url: client.inner.url.to_string(), what };
        if fencing == Fencing::Sequence && !has_sequence && !client.inner.url.setup {
            // A server without sequences (MySQL) keeps counter rows instead, once set up.
            let has_rows = exists(FENCING_TABLE)
                .fetch_one(&mut conn.conn)
                .await
                .map_err(|e| backend("look for", FENCING_TABLE, e))?
                > 0;
            if !has_rows {
                return Err(missing(format!(
                    "the fencing sequence {FENCING_SEQUENCE} (or, on a server without sequences, the table {FENCING_TABLE})"
                )));
            }
            fencing = Fencing::Row;
        }
        if fencing == Fencing::Sequence && !has_sequence {
            let create = format!("CREATE SEQUENCE IF NOT EXISTS {FENCING_SEQUENCE} NOCACHE");
            match sqlx::query(&create).execute(&mut conn.conn).await {
                Ok(_) => {}
                // A syntax error: a server without sequences (MySQL). Counter rows serve instead.
                Err(e) if syntax_error(&e) => {
                    tracing::info!(error = %e, "the server has no sequences: fencing tokens from counter rows");
                    fencing = Fencing::Row;
                }
                Err(e) => return Err(backend("CREATE SEQUENCE", FENCING_SEQUENCE, e)),
            }
        }
        let has_table = || exists(FENCING_TABLE);
        if fencing == Fencing::Row
            && has_table().fetch_one(&mut conn.conn).await.map_err(|e| backend("look for", FENCING_TABLE, e))? == 0
        {
            if !client.inner.url.setup {
                return Err(missing(format!("the fencing table {FENCING_TABLE}")));
            }
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {FENCING_TABLE} (name VARCHAR(64) NOT NULL PRIMARY KEY, \
                 token BIGINT NOT NULL) ENGINE=InnoDB"
            );
            sqlx::query(&create)
                .execute(&mut conn.conn)
                .await
                .map_err(|e| backend("CREATE TABLE", FENCING_TABLE, e))?;
        }
        let _ = client.inner.fencing.set(fencing);
        client.put_back(conn);
        Ok(client)
    }

    /// The renewals of this client's held locks.
    pub(crate) fn runtime(&self) -> tokio::runtime::Handle {
        self.inner.runtime.clone()
    }

    pub(crate) fn pool(&self) -> &shared::Pool {
        &self.inner.pool
    }

    /// A handle that does not keep the client alive (a shared connection's renewals hold it).
    fn downgrade(&self) -> std::sync::Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// The client of [`downgrade`](Self::downgrade)'s handle, while it lives.
    fn upgrade(weak: &std::sync::Weak<Inner>) -> Option<Client> {
        weak.upgrade().map(|inner| Client { inner })
    }

    pub(crate) fn watchdog(&self) -> &Arc<crate::watchdog::Watchdog> {
        &self.inner.watchdog
    }

    /// Where this client's tokens come from.
    pub(crate) fn fencing(&self) -> Fencing {
        self.inner.fencing.get().copied().unwrap_or(self.inner.url.fencing)
    }

    /// The URL this client connected with.
    pub fn url(&self) -> &MysqlUrl {
        &self.inner.url
    }

    /// How long the server keeps a silent holder's lock at most.
    pub fn lease(&self) -> Duration {
        self.inner.url.lease
    }

    /// A mutex on user lock `name` (1 to 64 characters).
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        crate::sql::check_lock_name(name, 64, "a MariaDB user lock name")?;
        Ok(Mutex::new(self.clone(), name.to_string()))
    }

    /// Drops this handle's idle connections.
    pub async fn close(self, bound: Duration) {
        // The shared connections kept for the next acquire are idle ones now.
        self.inner.pool.retire_empty(&self).await;
        let idle = std::mem::take(&mut *self.inner.idle.lock().unwrap_or_else(|e| e.into_inner()));
        // A silent server would keep each polite close waiting: past the bound, the rest are
        // dropped, which closes their sockets all the same.
        let _ = tokio::time::timeout(bound, async move {
            for c in idle {
                let _ = c.conn.close().await;
            }
        })
        .await;
    }

    /// An idle connection, or a new one.
    pub(crate) async fn checkout(&self) -> Result<Conn> {
        loop {
            let idle = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match idle {
                // Closed by the server while idle (`wait_timeout` is the lease), as its socket
                // watcher saw: not handed out.
                Some(c) if c.holder.is_closed() => continue,
                Some(c) => return Ok(c),
                None => return self.open().await,
            }
        }
    }

    /// Keeps a connection that holds nothing for the next acquire, within the bound of lock
    /// connections (`connections`: idle ones count too), else closes it.
    pub(crate) fn put_back(&self, conn: Conn) {
        let mut idle = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE && self.inner.pool.may_keep_idle(idle.len()) {
            idle.push(conn);
        }
    }

    /// Opens a lock connection and sets its session's loss bound.
    pub(crate) async fn open(&self) -> Result<Conn> {
        let url = &self.inner.url;
        let failed = |reason: String| Error::Connect { url: url.to_string(), reason };
        let setup = async {
            let (host, port) = (url.options.get_host(), url.options.get_port());
            let (mut conn, watch) =
                socket_watch::SocketWatch::around(host, port, MySqlConnection::connect_with(&url.options)).await?;
            let secs = url.lease.as_secs();
            sqlx::query(&format!("SET SESSION wait_timeout = {secs}, SESSION interactive_timeout = {secs}"))
                .execute(&mut conn)
                .await?;
            let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(&mut conn).await?;
            let holder: Arc<crate::lease::HolderSlot> = Arc::default();
            let watcher = watch.map(|watch| {
                let (held, socket) = (holder.clone(), Arc::new(watch));
                let watched = socket.clone();
                let task = tokio::spawn(async move {
                    watched.closed().await;
                    held.connection_closed();
                })
                .abort_handle();
                Watcher { task, socket }
            });
            Ok::<_, sqlx::Error>(Conn { conn, id, holder, _watcher: watcher })
        };
        tokio::time::timeout(url.connect_timeout, setup)
            .await
            .map_err(|_| failed(format!("no answer within {:?}", url.connect_timeout)))?
            .map_err(|e| {
                failed(crate::tls::explain(url.explain_refused_tls(e.to_string()), url.tls, "ssl-mode=VERIFY_IDENTITY"))
            })
    }
}

/// Refuses a Galera cluster node (`wsrep_on = ON`): `GET_LOCK` there is local to the node a
/// client is connected to, so two clients on two nodes would both hold the "same" lock.
async fn refuse_galera(conn: &mut sqlx::MySqlConnection, url: &MysqlUrl) -> Result<()> {
    let on: Option<(String, String)> = sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| backend("SHOW VARIABLES", "wsrep_on", e))?;
    if on.is_some_and(|(_, v)| v.eq_ignore_ascii_case("ON")) {
        return Err(Error::Unsupported {
            backend: "mysql",
            what: format!(
                "locks on {url}: it is a Galera cluster node (wsrep_on = ON), where GET_LOCK is local to one node \
                 and two clients on two nodes would both hold the same lock; lock on a server outside the \
                 cluster (or on ZooKeeper, etcd or Redis) instead"
            ),
        });
    }
    Ok(())
}

/// True for the server's "syntax error" (1064): `CREATE SEQUENCE` on a server without sequences.
/// (Not SQLSTATE 42000 alone, which also covers a user refused the right to create one.)
fn syntax_error(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| d.number() == 1064)
}

pub(crate) fn backend(op: &'static str, name: &str, e: sqlx::Error) -> Error {
    Error::Backend { op, path: name.to_string(), source: Box::new(e) }
}

/// A lock as the server sees it, from [`Client::inspect`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(db: distlock::mysql::Client) -> distlock::Result<()> {
/// let view = db.inspect("orders").await?;
/// match view.holder_connection {
///     Some(id) => println!("held by connection {id} (KILL {id} frees it)"),
///     None => println!("free"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LockView {
    /// The lock's name.
    pub name: String,
    /// The holding connection's id (`IS_USED_LOCK`), if held.
    pub holder_connection: Option<u64>,
    /// The last fencing token handed out for this name (`fencing=row`); with the fencing
    /// sequence, a bound: at least every token handed out so far (for any name), and below
    /// every later one.
    pub last_token: Option<u64>,
}

impl Client {
    /// Who holds lock `name` now, and its last fencing token.
    pub async fn inspect(&self, name: &str) -> Result<LockView> {
        self.mutex(name)?;
        let mut conn = self.checkout().await?;
        let holder: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
            .bind(name)
            .fetch_one(&mut conn.conn)
            .await
            .map_err(|e| backend("inspect", name, e))?;
        let sql = match self.fencing() {
            Fencing::Row => "SELECT token FROM distlock_fencing WHERE name = ?",
            // Every token so far is at most the sequence's value (NOCACHE: its last one handed
            // out or set) or the clock now, whichever is larger, and every later one is above it.
            Fencing::Sequence => {
                "SELECT GREATEST(next_not_cached_value - 1, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)) \
                 FROM distlock_fencing_seq WHERE ? IS NOT NULL"
            }
        };
        let token: Option<i64> = sqlx::query_scalar(sql)
            .bind(name)
            .fetch_optional(&mut conn.conn)
            .await
            .map_err(|e| backend("inspect", name, e))?;
        self.put_back(conn);
        Ok(LockView { name: name.to_string(), holder_connection: holder, last_token: token.map(|t| t as u64) })
    }
}

impl Client {
    /// The lock `name` in the neutral shape of [`crate::Client::locks`], from [`Client::inspect`]
    /// (for [`crate::Client::inspect`]).
    pub(crate) async fn one_lock(&self, name: &str) -> Result<crate::listing::Listing> {
        use crate::listing::{Entry, Found, Listing, LockInfo};
        let view = self.inspect(name).await?;
        let found = match view.holder_connection {
            None => Found::Free { recipe: "mutex", last_token: view.last_token },
            Some(id) => Found::Lock(LockInfo {
                name: view.name,
                recipe: "mutex".into(),
                permits: None,
                last_token: view.last_token,
                entries: vec![Entry::new(true, "exclusive", format!("connection {id}"), format!("connection {id}"))],
            }),
        };
        Ok(Listing::one(
            "mysql",
            name,
            found,
            vec![
                "owners: MariaDB records the holder's connection id (KILL it to free the lock), not its host or pid"
                    .into(),
                "waiters and hold times: IS_USED_LOCK names the holder only".into(),
            ],
        ))
    }

    /// Refused: MariaDB has no reliable list of user locks. `performance_schema.metadata_locks`
    /// lists them only when the server was started with it, and there (MariaDB 10.11) a query
    /// from a client connection was seen to show a waiter as the holder, and afterwards no
    /// lock at all while both were still held. `inspect` of one lock by name works
    /// (`IS_USED_LOCK`).
    pub async fn locks(&self, prefix: &str) -> Result<crate::listing::Listing> {
        Err(Error::Unsupported {
            backend: "mysql",
            what: format!(
                "listing the locks under {prefix:?}: MariaDB keeps no reliable list of GET_LOCK locks \
                 (performance_schema.metadata_locks misreported them in testing); inspect one lock by name"
            ),
        })
    }
}

#[cfg(test)]
assert_send_sync_static!(MutexGuard);

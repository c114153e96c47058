//! The PostgreSQL backend: session-level advisory locks on a few connections a client's locks
//! share, fenced by a sequence and honest about loss.
//!
//! # Layout
//!
//! | Piece | On the server |
//! |---|---|
//! | Lock `name` | advisory lock on DistributedLock's key for the name (see [`KeyScheme`]: short ASCII names packed, hex names parsed, others SHA-1 hashed), so .NET and `distributed-lock-postgres` users share it; with `?keys=raw` the name is the key itself, a decimal `i64` |
//! | Read/write lock | readers: `pg_advisory_lock_shared(key)`; writers (and the mutex): `pg_advisory_lock(key)` |
//! | Fencing token | `nextval` of the sequence `distlock_fencing_seq`, in the statement that takes the lock (readers too), after the grant; every new lock connection first moves the sequence up to the server's clock in microseconds if it is more than a second behind |
//!
//! # Leases and loss
//!
//! An advisory lock has no lease: PostgreSQL keeps it until the holding session ends, and notices
//! a client that went silent only through TCP. Every lock connection therefore sets its session's
//! `tcp_keepalives_*` and `tcp_user_timeout` so that the server ends a silent session (and so frees
//! its locks) no sooner and not much later than the *lease* (`?lease=`, default 30 s) after it last
//! heard from the client, and `client_connection_check_interval` so that a backend busy in a lock
//! wait notices a closed client too. Each connection that holds locks is pinged every sixth of the
//! lease; a guard's [`lease_deadline`](MutexGuard::lease_deadline) is the send time of its
//! connection's last answered ping plus the lease less a drift margin, and
//! [`lost`](MutexGuard::lost) resolves at that deadline if no ping was answered since: before the
//! server can end the session and give the lock to anyone else. A connection that closes (the
//! backend was terminated, the server restarted) loses every lock on it at once.
//!
//! # Connections
//!
//! A client's locks share at most `connections` server connections (the URL's key, default 4),
//! whatever their number. The server counts an advisory lock per session (a session granted a key
//! twice holds it twice), so the client records which keys each connection holds or is taking,
//! and never routes a lock to a connection that already has its key: two holders of one name in
//! one client are two sessions, and the server orders them as it orders anyone. Statements that
//! do not wait (tries, releases, health checks) are pipelined on any connection; a wait
//! (`pg_advisory_lock`) runs on a connection that holds nothing, taken for it alone, so that it
//! holds up no other lock's statements, and granted, that connection holds the lock and carries
//! other statements again. At most `connections - 1` wait at once; a wait that finds none free
//! polls (it tries again when a lock of the key is let go in this client, and on a timer up to
//! `rescan`), without the server's queue order. With `lock_scope=transaction` each held lock has
//! a connection (and a transaction) of its own instead: one whose lock was released cleanly goes
//! back to the client's idle list and serves the next acquire; one whose acquire was cancelled,
//! timed out uncertainly or failed is closed.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! let pg = distlock::postgres::Client::connect("postgres://app@127.0.0.1:5432/app?lease=10s").await?;
//! let lock = pg.mutex("orders")?;
//! let guard = lock.lock().await?;
//! println!("token {}, lease until {:?}", guard.fencing_token(), guard.lease_deadline());
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub(crate) mod contract;
mod election;
mod inspect;
mod jobs;
mod mutex;
mod pool;
mod rwlock;
mod semaphore;
mod url;

pub use inspect::{LockView, Session};
pub use mutex::{Mutex, MutexGuard};
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};
pub use url::{AdvisoryKey, KeyScheme, LockScope, PgUrl, SslMode};

use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio::sync::Notify;

/// A PostgreSQL server to take locks on: the URL, and idle lock connections to reuse. Cheap to
/// clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let pg = distlock::postgres::Client::connect("postgres://postgres@127.0.0.1:5432/postgres").await?;
/// let reports = pg.mutex("reports")?;
/// if let Some(g) = reports.try_lock().await? {
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    url: PgUrl,
    /// The TLS connector of every connection (plaintext when `sslmode` says so or the server
    /// offers no TLS under `prefer`).
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    /// The lock connections every lock of this client shares (`lock_scope=session`).
    pool: Arc<pool::Pool>,
    /// Idle connections for the next transaction-scoped lock (`lock_scope=transaction`: a
    /// connection, and a transaction, for each held lock).
    idle: StdMutex<Vec<Conn>>,
    /// The connection that `LISTEN`s for semaphore releases, started by the first waiter.
    listener: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    /// Each waited-on semaphore's wake-up, by name.
    waiters: StdMutex<HashMap<String, Weak<Notify>>>,
    /// Renews every held lock's lease with a health check of its connection.
    watchdog: Arc<crate::watchdog::Watchdog>,
    /// The runtime the client was made on: a guard (or an acquire in flight) dropped outside any
    /// runtime is let go on it, since a lock on a shared connection would otherwise stay held
    /// for as long as the connection lives.
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("postgres::Client").field("url", &self.inner.url).finish()
    }
}

/// Idle connections kept for reuse (`lock_scope=transaction`), at most.
const MAX_IDLE: usize = 16;

/// The sequence fencing tokens come from (created on connect if missing).
///
/// One sequence serves every lock: a holder's `nextval` runs after its grant, so it is larger
/// than every value taken before the previous holder released. A clock floor covers what the
/// sequence alone cannot: the lock sessions commit asynchronously (`synchronous_commit = off`),
/// so a crash (or a failover to a standby that lagged) can lose its last advances. After that every
/// lock connection is new, and each new one first raises the sequence to the server's clock in
/// microseconds: past every token handed out before, as long as fewer tokens were taken than
/// microseconds passed (under a million a second) and the clock did not go back. The raise holds
/// the exclusive [`FENCING_GUARD`] lock and every `nextval` its shared one, so a raise never
/// lands between another's read and write: the sequence only goes up.
pub const FENCING_SEQUENCE: &str = "distlock_fencing_seq";

/// The advisory key (an integer pair: "dloc", "kseq") that orders raises of the fencing sequence
/// against `nextval`s. Not for other use.
pub const FENCING_GUARD: (i32, i32) = (0x646c_6f63, 0x6b73_6571);

/// The first integer ("dlkn") of the advisory keys that mark a name's kind (a lock's or a
/// semaphore's; the second is a hash of the name and kind): held beside each lock so that a
/// semaphore and a mutex of one name refuse each other. Listings leave them out.
pub(crate) const KIND_MARKER_CLASS: i32 = 0x646c_6b6e;

/// Raises the fencing sequence to the clock (µs) if it is behind, holding the guard exclusively
/// (to the end of this implicit transaction).
fn fencing_floor_sql() -> String {
    let (g1, g2) = FENCING_GUARD;
    format!(
        "SELECT pg_advisory_xact_lock({g1}, {g2}); \
         SELECT setval('{FENCING_SEQUENCE}', c) FROM (SELECT last_value AS v, \
         (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS c FROM {FENCING_SEQUENCE}) x WHERE c > v"
    )
}

/// One lock connection: the client half, and whether its connection task has ended.
pub(crate) struct Conn {
    pub(crate) client: tokio_postgres::Client,
    /// Its number in this client (for logs).
    pub(crate) id: u64,
    closed: watch::Receiver<bool>,
    /// Ends the connection at once (its task drops it: the server frees its session's locks).
    kill: Arc<Notify>,
    /// A cancel was sent for a statement of this connection: never reuse it.
    pub(crate) cancelled: Arc<std::sync::atomic::AtomicBool>,
    /// Statements prepared on this connection, by their text.
    prepared: StdMutex<HashMap<String, tokio_postgres::Statement>>,
    /// The lease of the lock this connection holds, told at once when the connection ends (the
    /// server frees a connection's locks with it).
    holder: Arc<crate::lease::HolderSlot>,
    /// Statements are never prepared (`lock_scope=transaction`: behind a transaction pooler a
    /// prepared statement lives on one server session, and the next transaction may get another).
    pub(crate) unprepared: bool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("id", &self.id).field("closed", &self.is_closed()).finish()
    }
}

impl Conn {
    /// Runs `sql` as a statement prepared on this connection (prepared on first use, then one
    /// round trip per run: no parse and plan each time).
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), tokio_postgres::types::Type)],
    ) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        if self.unprepared {
            // One round trip with an unnamed statement, parsed each time.
            return self.client.query_typed(sql, params).await;
        }
        let cached = self.prepared.lock().unwrap_or_else(|e| e.into_inner()).get(sql).cloned();
        let statement = match cached {
            Some(s) => s,
            None => {
                let types: Vec<_> = params.iter().map(|(_, t)| t.clone()).collect();
                let s = self.client.prepare_typed(sql, &types).await?;
                self.prepared.lock().unwrap_or_else(|e| e.into_inner()).insert(sql.to_string(), s.clone());
                s
            }
        };
        let values: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
        self.client.query(&statement, &values).await
    }

    /// The lock this connection now holds: its lease is lost when the connection ends.
    pub(crate) fn set_holder(&self, lease: &Arc<crate::lease::Lease>, name: &str) {
        self.holder.set(lease, name);
    }

    /// Closes the connection now, whoever else uses it (the server frees what its session holds).
    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }

    /// A cancel was sent for one of its statements.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// True once the connection is gone (closed by the server, reset, or dropped).
    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow() || self.client.is_closed()
    }

    /// Resolves when the connection is gone.
    pub(crate) fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closed.clone();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }
}

/// A connection taken for one transaction (a job's): back to the pool when finished, closed if
/// dropped unfinished (the open transaction dies with it).
pub(crate) struct Tx {
    pub(crate) conn: Arc<Conn>,
    pooled: Option<Arc<pool::Pool>>,
    done: bool,
}

impl Tx {
    /// The transaction ended (committed or rolled back): the connection serves others again.
    pub(crate) fn finished(mut self) {
        self.done = true;
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        match (&self.pooled, self.done) {
            (Some(pool), true) => pool.end_exclusive(&self.conn),
            (Some(pool), false) => pool.retire(&self.conn),
            (None, _) => self.conn.kill(),
        }
    }
}

impl Client {
    /// Connects to the server named by a `postgres://` URL (see [`PgUrl`]): opens one connection
    /// to check it, creates the fencing sequence if missing, and keeps that connection for the
    /// first lock.
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_common(url, &Default::default()).await
    }

    /// As [`connect`](Self::connect), with `over`'s values (from [`crate::ConnectOptions`]) in
    /// place of the URL's.
    pub(crate) async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
        Client::connect_url(PgUrl::parse_with(url, over)?).await
    }

    /// Connects with a parsed URL.
    pub async fn connect_url(url: PgUrl) -> Result<Client> {
        let tls = url.tls()?;
        url.warn_if_unverified();
        let watchdog = Arc::new(crate::watchdog::Watchdog::new(url.server_bound() / 6));
        let client = Client {
            inner: Arc::new(Inner {
                pool: Arc::new(pool::Pool::new(url.connections, url.server_bound(), watchdog.clone())),
                watchdog,
                tls,
                url,
                idle: StdMutex::new(Vec::new()),
                listener: tokio::sync::Mutex::new(None),
                waiters: StdMutex::new(HashMap::new()),
                runtime: tokio::runtime::Handle::current(),
            }),
        };
        if client.inner.url.scope == LockScope::Transaction {
            // Made for a transaction pooler: nothing to detect.
            let conn = client.open().await?;
            client.put_back(conn);
            return Ok(client);
        }
        // Two connections, opened together (the second also serves the first lock), and asked
        // about their server sessions before any session setting is made: behind a transaction
        // pooler such a setting would stay on server sessions other clients get next.
        let (a, b) = tokio::join!(client.open_unset(), client.open_unset());
        let (a, b) = (a?, b?);
        refuse_transaction_pooler(&client.inner.url, &a, &b).await?;
        let (set_a, set_b) = tokio::join!(client.session_settings(&a), client.session_settings(&b));
        set_a?;
        set_b?;
        // The first locks' connections.
        client.inner.pool.add(a, false);
        client.inner.pool.add(b, false);
        Ok(client)
    }

    /// The TLS connector of this client's connections (for cancel requests too).
    pub(crate) fn tls(&self) -> tokio_postgres_rustls::MakeRustlsConnect {
        self.inner.tls.clone()
    }

    /// The runtime to finish a release (or a dropped acquire) on: the current one, else the
    /// client's own (a guard dropped on a thread outside any runtime).
    pub(crate) fn runtime(&self) -> tokio::runtime::Handle {
        tokio::runtime::Handle::try_current().unwrap_or_else(|_| self.inner.runtime.clone())
    }

    /// The renewals of this client's held locks.
    pub(crate) fn watchdog(&self) -> &Arc<crate::watchdog::Watchdog> {
        &self.inner.watchdog
    }

    /// The URL this client connected with.
    pub fn url(&self) -> &PgUrl {
        &self.inner.url
    }

    /// How long the server keeps a silent holder's lock at most (see the module docs).
    pub fn lease(&self) -> Duration {
        self.inner.url.lease
    }

    /// A session-level advisory mutex on lock `name` (see the module docs for the key).
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        let key = self.inner.url.keys.key(name)?;
        Ok(Mutex::new(self.clone(), name.to_string(), key, false))
    }

    /// A read/write lock on lock `name`: readers take the shared advisory lock on the key,
    /// writers the exclusive one, which is also what [`Client::mutex`] takes, so a mutex and the
    /// writers of the same name exclude each other and the readers.
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        let key = self.inner.url.keys.key(name)?;
        Ok(RwLock::new(
            Mutex::new(self.clone(), name.to_string(), key, true),
            Mutex::new(self.clone(), name.to_string(), key, false),
        ))
    }

    /// A counting semaphore `name` with `permits` permits (1 to 1024; see [`Semaphore`]).
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        self.inner.url.keys.key(name)?;
        if name.contains('\0') {
            return Err(Error::InvalidLockPath {
                path: name.escape_debug().to_string(),
                reason: "a NUL character".into(),
            });
        }
        Semaphore::new(self.clone(), name, permits)
    }

    /// Wakes the waiters of semaphore `name` in this client when a permit of it is released
    /// anywhere (once the `LISTEN` connection is up; if it cannot be, waiters rescan on a timer).
    pub(crate) async fn releases(&self, name: &str) -> Arc<Notify> {
        let wake = {
            let mut map = self.inner.waiters.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(name).and_then(Weak::upgrade) {
                Some(n) => n,
                None => {
                    map.retain(|_, w| w.strong_count() > 0);
                    let n = Arc::new(Notify::new());
                    map.insert(name.to_string(), Arc::downgrade(&n));
                    n
                }
            }
        };
        let mut listener = self.inner.listener.lock().await;
        if listener.as_ref().is_none_or(|c| c.is_closed()) {
            match self.listen().await {
                Ok(c) => *listener = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "no LISTEN connection for semaphore releases; rescanning on a timer")
                }
            }
        }
        wake
    }

    /// Opens the `LISTEN` connection and forwards its notifications to the waiters.
    async fn listen(&self) -> std::result::Result<tokio_postgres::Client, String> {
        use futures::StreamExt;
        let url = &self.inner.url;
        let (client, mut connection) =
            tokio::time::timeout(url.connect_timeout, url.config.connect(self.inner.tls.clone()))
                .await
                .map_err(|_| "no answer".to_string())?
                .map_err(|e| e.to_string())?;
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                let tokio_postgres::AsyncMessage::Notification(n) = message else { continue };
                let Some(inner) = inner.upgrade() else { break };
                let waiters = inner.waiters.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(wake) = waiters.get(n.payload()).and_then(Weak::upgrade) {
                    wake.notify_waiters();
                }
            }
        });
        client.batch_execute(&format!("LISTEN {}", semaphore::RELEASED_CHANNEL)).await.map_err(|e| e.to_string())?;
        Ok(client)
    }

    /// The advisory key lock `name` maps to.
    pub fn key(&self, name: &str) -> Result<AdvisoryKey> {
        self.inner.url.keys.key(name)
    }

    /// Drops this handle: connections that hold nothing close now, the others when their locks
    /// are released.
    pub async fn close(self, _bound: Duration) {
        self.inner.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.inner.pool.close_empty();
    }

    /// The shared lock connections.
    pub(crate) fn pool(&self) -> &Arc<pool::Pool> {
        &self.inner.pool
    }

    /// Opens a connection for the pool, into the room `Route::Open` reserved (given back if
    /// this fails or is dropped unfinished).
    pub(crate) async fn open_into_pool(&self) -> Result<()> {
        struct Reservation<'a>(Option<&'a pool::Pool>);
        impl Drop for Reservation<'_> {
            fn drop(&mut self) {
                if let Some(pool) = self.0.take() {
                    pool.open_failed();
                }
            }
        }
        let mut reservation = Reservation(Some(&self.inner.pool));
        let conn = self.open().await?;
        reservation.0 = None;
        self.inner.pool.add(conn, true);
        Ok(())
    }

    /// A connection for a statement that neither locks nor waits long (inspection, an
    /// election's queries, a job's reads): one of the shared lock connections, pipelined with
    /// their statements (one is opened if there is none yet), or, should every one be taken
    /// for a wait, one of its own.
    pub(crate) async fn statement_conn(&self) -> Result<pool::Borrowed> {
        loop {
            if let Some(conn) = self.inner.pool.any() {
                return Ok(conn);
            }
            if !self.inner.pool.reserve_open() {
                return Ok(pool::Borrowed::own(self.open().await?));
            }
            self.open_into_pool().await?;
        }
    }

    /// A connection for a transaction alone (a job's): one of the pool's that holds nothing,
    /// else one of its own (outside the bound, closed after).
    pub(crate) async fn transaction_conn(&self) -> Result<Tx> {
        if let Some(conn) = self.inner.pool.exclusive() {
            return Ok(Tx { conn, pooled: Some(self.inner.pool.clone()), done: false });
        }
        Ok(Tx { conn: Arc::new(self.open().await?), pooled: None, done: false })
    }

    /// An idle connection, or a new one (`lock_scope=transaction`).
    pub(crate) async fn checkout(&self) -> Result<Conn> {
        loop {
            let conn = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match conn {
                Some(c) if !c.is_closed() => return Ok(c),
                Some(_) => continue,
                None => return self.open().await,
            }
        }
    }

    /// Keeps `conn` for a later acquire (it holds no lock).
    pub(crate) fn put_back(&self, conn: Conn) {
        if conn.is_closed() || conn.cancelled.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut idle = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// Opens a lock connection and sets its session's loss bounds.
    async fn open(&self) -> Result<Conn> {
        let conn = self.open_unset().await?;
        self.session_settings(&conn).await?;
        Ok(conn)
    }

    /// Sets the session's loss bounds on `conn` (not for `lock_scope=transaction`, whose locks
    /// set theirs for their own transaction: behind a transaction pooler a session setting would
    /// stay on a server session other clients get next).
    async fn session_settings(&self, conn: &Conn) -> Result<()> {
        let url = &self.inner.url;
        if conn.unprepared {
            return Ok(());
        }
        let failed = |reason: String| Error::Connect { url: url.to_string(), reason };
        tokio::time::timeout(url.connect_timeout, conn.client.batch_execute(&url.session_settings()))
            .await
            .map_err(|_| failed(format!("no answer to the session settings within {:?}", url.connect_timeout)))?
            .map_err(|e| failed(format!("setting the session's loss bounds: {}", cause(&e))))
    }

    /// Opens a lock connection and raises the fencing floor; no session setting yet.
    async fn open_unset(&self) -> Result<Conn> {
        let url = &self.inner.url;
        let failed = |reason: String| Error::Connect { url: url.to_string(), reason };
        let (client, connection) =
            tokio::time::timeout(url.connect_timeout, url.config.connect(self.inner.tls.clone()))
                .await
                .map_err(|_| failed(format!("no answer within {:?}", url.connect_timeout)))?
                .map_err(|e| {
                    let reason = url.explain_refused_tls(cause(&e));
                    failed(crate::tls::explain(reason, url.ssl_mode != SslMode::Disable, "sslmode=verify-full"))
                })?;
        let (tx, closed) = watch::channel(false);
        let holder: Arc<crate::lease::HolderSlot> = Arc::default();
        let held = holder.clone();
        let kill = Arc::new(Notify::new());
        let killed = kill.clone();
        tokio::spawn(async move {
            tokio::select! {
                ended = connection => if let Err(e) = ended {
                    tracing::debug!(error = %e, "lock connection ended");
                },
                _ = killed.notified() => tracing::debug!("lock connection closed by the client"),
            }
            let _ = tx.send(true);
            held.connection_closed();
        });
        let unprepared = url.scope == LockScope::Transaction;
        let conn = Conn {
            client,
            id: self.inner.pool.next_id(),
            closed,
            kill,
            cancelled: Arc::default(),
            prepared: StdMutex::default(),
            holder,
            unprepared,
        };
        let floor_sql = fencing_floor_sql();
        let floor = async {
            match conn.client.batch_execute(&floor_sql).await {
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) && url.setup => {
                    // The first client on this database (or one of several at once).
                    let create = format!("CREATE SEQUENCE IF NOT EXISTS {FENCING_SEQUENCE}");
                    if let Err(e) = conn.client.batch_execute(&create).await {
                        if !made_by_another(&e) {
                            return Err(e);
                        }
                    }
                    conn.client.batch_execute(&floor_sql).await
                }
                r => r,
            }
        };
        tokio::time::timeout(url.connect_timeout, floor)
            .await
            .map_err(|_| failed(format!("no answer to the fencing floor within {:?}", url.connect_timeout)))?
            .map_err(|e| {
                if !url.setup && e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
                    let what = format!("the fencing sequence {FENCING_SEQUENCE}");
                    return Error::NotSetUp { url: url.to_string(), what };
                }
                failed(format!("raising the fencing sequence {FENCING_SEQUENCE} to the clock: {}", cause(&e)))
            })?;
        Ok(conn)
    }
}

/// Refuses a server reached through a transaction (or statement) pooler such as PgBouncer's
/// `pool_mode = transaction`: there a client connection's statements run on whichever server
/// session is free, so a session advisory lock taken by one statement could be released, or
/// taken again, by another client's statement on the same server session.
///
/// One client connection meeting two server sessions, or two open client connections meeting the
/// same one, gives the pooler away: asked one after the other, an idle pooler hands its most
/// recently freed server session to the next statement (and a round-robin one another session
/// to the first connection's second statement). A direct connection or a session pool keeps one
/// server session per client connection.
async fn refuse_transaction_pooler(url: &PgUrl, a: &Conn, b: &Conn) -> Result<()> {
    let first = backend_pid(url, a).await?;
    let other = backend_pid(url, b).await?;
    let again = backend_pid(url, a).await?;
    if first.is_some() && (other == first || again != first) {
        return Err(Error::Connect {
            url: url.to_string(),
            reason: format!(
                "the server is behind a transaction pooler (PgBouncer's pool_mode = transaction or statement): \
                 one client connection met server sessions {} and {}, another met {}, so a session advisory \
                 lock could be held by another client of the pooler; add lock_scope=transaction to the URL \
                 (locks in transactions held open, which such a pooler keeps on one server session), or \
                 connect directly or through a session-mode pool",
                first.as_deref().unwrap_or("?"),
                again.as_deref().unwrap_or("?"),
                other.as_deref().unwrap_or("?"),
            ),
        });
    }
    Ok(())
}

/// The server session (backend pid) that answers `conn`'s next statement.
async fn backend_pid(url: &PgUrl, conn: &Conn) -> Result<Option<String>> {
    let rows = conn
        .client
        .simple_query("SELECT pg_backend_pid()")
        .await
        .map_err(|e| Error::Connect { url: url.to_string(), reason: cause(&e) })?;
    Ok(rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    }))
}

/// What went wrong, named: the server's own message and SQLSTATE (a wrong password, a missing
/// database), or the cause under tokio-postgres's summary ("error connecting to server:
/// Connection refused"), where its `Display` alone says only "db error".
fn cause(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        // PgBouncer's words for a wrong user or password under SCRAM, which name neither.
        let hint = if db.message() == "SASL authentication failed" { " (wrong user or password?)" } else { "" };
        return format!("{} (SQLSTATE {}){hint}", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

pub(crate) fn backend(op: &'static str, name: &str, e: tokio_postgres::Error) -> Error {
    Error::Backend { op, path: name.to_string(), source: Box::new(ServerSaid { text: cause(&e), error: e }) }
}

/// A driver error shown with the server's own words and SQLSTATE (the driver's display of a
/// server error is only "db error").
#[derive(Debug)]
struct ServerSaid {
    text: String,
    error: tokio_postgres::Error,
}

impl std::fmt::Display for ServerSaid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for ServerSaid {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// A `CREATE … IF NOT EXISTS` (a sequence, a table) that failed because another client made the
/// object at the same moment: the object is there. PostgreSQL says so as a unique violation on
/// its catalog or as "already exists" (42P07, or 42710 for a table's row type), depending on timing:
/// without 42710 the eight-clients test fails within a few runs.
pub(crate) fn made_by_another(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        [SqlState::UNIQUE_VIOLATION, SqlState::DUPLICATE_TABLE, SqlState::DUPLICATE_OBJECT].contains(c)
    })
}

#[cfg(test)]
assert_send_sync_static!(MutexGuard);

//! The Redis backend: Redisson's reentrant lock layout and the plain `SET NX PX` lock, both
//! fenced, renewed by a watchdog and honest about loss.
//!
//! # Layouts
//!
//! | Recipe | Constructor | Keys (lock name `K`) | Shares the lock with |
//! |---|---|---|---|
//! | Reentrant mutex | [`Client::mutex`] (default layout) | hash `K` {`<client uuid>:<handle id>`: hold count}, PEXPIRE lease; channel `redisson_lock__channel:{K}` | Redisson `getLock(K)` |
//! | Read/write lock | [`Client::rwlock`] | hash `K` {`mode`: read/write, `<field>`: read count, `<field>:write`: write count}, a key `{K}:<field>:rwlock_timeout:<n>` per read hold; channel `redisson_rwlock:{K}` | Redisson `getReadWriteLock(K)` |
//! | Fair lock | [`Client::fair_lock`] | the RLock hash `K`, list `distlock_fair_queue:{K}`, zset `distlock_fair_alive:{K}` {waiter: place kept until (server ms)}; channel `distlock_fair__channel:{K}:<waiter>` | Redisson `getLock(K)` holders (the queue is distlock's own) |
//! | Semaphore | [`Client::semaphore`] | zset `K` {permit id: expiry in server ms}, string `{K}:permits`; channel `distlock_semaphore__channel:{K}` | (distlock's own: expiry by the server clock) |
//! | Simple lock | [`Client::simple_lock`] | string `K` = random value, `SET NX PX`; channel `distlock_lock__channel:{K}` | redis-py `Lock(K)` |
//! | Redlock (opt-in, **no fencing token**) | [`Redlock::connect`] | string `K` = random value on each of N masters | Redlock clients (redsync, node-redlock) on the same masters |
//! | Fencing counter | (both) | string `redisson_lock_token:{K}`, never deleted | Redisson `getFencedLock(K)` |
//!
//! # Fencing tokens
//!
//! Every acquire runs one script that takes the lock and the next token of the lock's counter
//! together. The token is one more than the last one, and never less than the server's clock
//! in microseconds: tokens keep rising when a server without persistence restarts empty, or a
//! replica that missed the latest increments is promoted, as long as the server clock does not
//! step back. The counter is never deleted (Redisson's `RFencedLock` deletes it with the lock).
//!
//! # Leases and loss
//!
//! A held lock expires on the server one lease (default 30 s, `?lease=`) after the last
//! acquire or renewal; a watchdog renews it every third of the lease, up to 100 holds of the
//! client in one script (on a cluster, those of one hash slot), each with its own answer. The
//! guard's
//! [`lease_deadline`](MutexGuard::lease_deadline) is the send time of the last confirmed
//! renewal plus the lease less a drift margin, and [`lost`](MutexGuard::lost) resolves at that
//! deadline if no renewal was confirmed by then: before the server can expire the key and give
//! the lock to anyone else. A renewal that finds the key gone resolves it at once.
//!
//! Every hold is also checked at once, whatever its turn, when the server may have lost it: the
//! connection to the server ended (a restart or crash closes it), a request failed with a
//! connection error and the next one succeeded, the server's run id changed, or Sentinel named
//! another master. A server restarted without persistence is so reported within a round trip of
//! its return, not up to a third of a lease later. A release that finds the lock no longer ours
//! returns [`Error::LockLost`].
//!
//! # Waiting
//!
//! Waiters subscribe to the lock's channel and try again when a release is published, or when
//! the holder's TTL (returned by the failed attempt) runs out, and at least every second in case
//! a message was lost (a master that went silent, a failover). A holder that releases without
//! publishing (redis-py) is seen at that re-check, or, for the simple layout, at the next one of
//! every 100 ms (redis-py's own interval). A wait with time left rides through connection errors
//! and failovers: with Sentinel the waiter also asks the Sentinels at those re-checks, and on a
//! cluster `CLUSTERDOWN`, `MOVED` and `TRYAGAIN` are retried until the caller's deadline.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::redis::Client;
//! let redis = Client::connect("redis://127.0.0.1:6379?lease=10s").await?;
//! let lock = redis.mutex("orders")?;
//! let guard = lock.lock().await?;
//! println!("token {}, lease until {:?}", guard.fencing_token(), guard.lease_deadline());
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub(crate) mod contract;
mod election;
mod fair;
mod guard;
mod jobs;
mod listing;
mod mutex;
mod redlock;
mod rwlock;
mod scripts;
mod semaphore;
mod sentry;
mod simple;
mod url;
mod wake;

pub use fair::{FairGuard, FairLock};
pub use mutex::{Mutex, MutexGuard};
pub use redlock::{Redlock, RedlockGuard};
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};
pub use simple::{SimpleGuard, SimpleLock};
pub use url::{Layout, RedisUrl, SentinelUrl, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LEASE};

use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// One connection to a Redis server (multiplexed, reconnecting), shared by every lock made
/// from it; cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let redis = distlock::redis::Client::connect("redis://127.0.0.1:6379").await?;
/// let a = redis.mutex("jobs/a")?;       // Redisson layout
/// let b = redis.simple_lock("jobs/b")?; // SET NX PX layout (redis-py)
/// # let _ = (a, b); Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// The redis crate's connection under a [`Client`]: to one server (standalone, or the master
/// Sentinel names), or to a cluster (each command routed to its key's slot, redirects and
/// failovers followed by the crate).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(redis: distlock::redis::Client) -> redis::RedisResult<()> {
/// let mut conn = redis.connection();
/// let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
/// # let _ = pong; Ok(()) }
/// ```
#[derive(Clone)]
pub enum Connection {
    /// One server, reconnecting.
    Server(redis::aio::ConnectionManager),
    /// A cluster.
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Connection::Server(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Server(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Server(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

struct Inner {
    url: RedisUrl,
    /// The master's connection; replaced when Sentinel names another master.
    conn: std::sync::RwLock<Connection>,
    /// The master's `host:port` now, and when we last asked the Sentinels (at most every 200 ms).
    master: tokio::sync::Mutex<(String, Option<Instant>)>,
    wake: Arc<wake::Wakeups>,
    /// Renews every hold of this client.
    watchdog: Arc<crate::watchdog::Watchdog<guard::Renew>>,
    /// `clientId` of Redisson's fields: one per client.
    id: String,
    /// The same without dashes (the simple layout's values start with it).
    id_hex: String,
    next_handle: AtomicU64,
    /// The run id (`INFO server`) of the server the connection reached when last asked; `None`
    /// if unknown (and always on a cluster).
    server_id: std::sync::Mutex<Option<Arc<str>>>,
    /// A request failed with a connection error since the last one that succeeded.
    conn_failed: AtomicBool,
    /// Holds of this client not yet released or dropped.
    holds: AtomicUsize,
    /// The sentry's task, while it runs (`sentry.rs`).
    sentry: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("redis::Client").field("url", &self.inner.url).field("id", &self.inner.id).finish()
    }
}

/// Requests time out well inside the lease, so that a silent server is retried (or the lock
/// reported lost) before the lease can run out.
pub(crate) fn response_timeout(url: &RedisUrl) -> Duration {
    (url.lease / 6).min(url.connect_timeout)
}

/// Opens a cluster connection from the URL's seed nodes; with `push`, in RESP3 with sharded
/// pub/sub messages delivered to it.
pub(crate) async fn open_cluster(
    url: &RedisUrl,
    nodes: &[String],
    push: Option<wake::PushSender>,
) -> Result<redis::cluster_async::ClusterConnection> {
    let failed = |reason: String| Error::Connect { url: url.to_string(), reason };
    let seeds: Vec<String> = nodes
        .iter()
        .map(|hp| {
            let (h, p) = hp.rsplit_once(':').unwrap_or((hp, "6379"));
            url.connection_string_for(h, p.parse().unwrap_or(6379))
        })
        .collect();
    // Per node: a silent node (paused, partitioned) must not hold up learning the layout from
    // the others; `connect_timeout` bounds the whole.
    let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
        .connection_timeout(response_timeout(url))
        .response_timeout(response_timeout(url))
        .retries(3)
        .min_retry_wait(50)
        .max_retry_wait(500);
    if let Some(push) = push {
        builder = builder.use_protocol(redis::ProtocolVersion::RESP3).push_sender(push);
    }
    if let Some(certs) = tls_certificates(url)? {
        builder = builder.certs(certs);
    }
    let client = builder.build().map_err(|e| failed(e.to_string()))?;
    let conn = tokio::time::timeout(url.connect_timeout, client.get_async_connection())
        .await
        .map_err(|_| failed(format!("no cluster node answered within {:?}", url.connect_timeout)))?
        .map_err(|e| failed(crate::tls::explain(e.to_string(), url.tls, "rediss+cluster://")))?;
    Ok(conn)
}

/// The redis crate's client for one server (`conn` is its URL), over TLS with the URL's files
/// when the URL asks for TLS.
fn open_client(url: &RedisUrl, conn: &str) -> Result<redis::Client> {
    let failed = |reason: String| Error::Connect { url: url.to_string(), reason };
    match tls_certificates(url)? {
        Some(certs) => redis::Client::build_with_tls(conn, certs),
        None => redis::Client::open(conn),
    }
    .map_err(|e| failed(e.to_string()))
}

/// The CA and client certificate of a TLS URL, read from their files (`None` without TLS).
fn tls_certificates(url: &RedisUrl) -> Result<Option<redis::TlsCertificates>> {
    if !url.tls {
        return Ok(None);
    }
    let pem = url.tls_files.read()?;
    Ok(Some(redis::TlsCertificates {
        client_tls: pem.identity.map(|(client_cert, client_key)| redis::ClientTlsConfig { client_cert, client_key }),
        root_cert: pem.ca,
    }))
}

/// A plaintext Redis port says nothing to a TLS handshake (it waits for the end of a command
/// line), so a `rediss://` URL at one would wait out its connect timeout. Unless the connection is
/// up after a moment, this asks `host:port` `PING` in plaintext, and resolves when it answers in
/// RESP: that port is not a TLS port. Never resolves otherwise.
async fn plaintext_answers(host: &str, port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = async {
        let mut socket = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        socket.write_all(b"PING\r\n").await.ok()?;
        let mut answer = [0u8; 64];
        let n = socket.read(&mut answer).await.ok()?;
        let line = String::from_utf8_lossy(&answer[..n]).lines().next().unwrap_or_default().to_string();
        (line.starts_with('+') || line.starts_with('-')).then_some(line)
    };
    match tokio::time::timeout(Duration::from_secs(2), asked).await {
        Ok(Some(line)) => format!(
            "{host}:{port} answers in plaintext ({line:?}), not in TLS: it is not a TLS port (for a plaintext port write redis://)"
        ),
        _ => std::future::pending().await,
    }
}

/// The master a client talks to: its `host:port`, the redis crate's client and connection for
/// it, and its run id (if the server told it).
struct Master {
    addr: String,
    client: redis::Client,
    conn: redis::aio::ConnectionManager,
    run_id: Option<Arc<str>>,
}

/// Opens a connection to the master at `host:port` (with Sentinel, the one they named: checked
/// to be a master with ROLE). Each step waits at most `bound` for an answer.
async fn open_master(url: &RedisUrl, host: &str, port: u16, bound: Duration) -> Result<Master> {
    let failed = |reason: String| Error::Connect { url: url.to_string(), reason };
    let client = open_client(url, &url.connection_string_for(host, port))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(url.connect_timeout))
        .set_response_timeout(Some(response_timeout(url)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let connecting = tokio::time::timeout(bound, client.get_connection_manager_with_config(config));
    let conn = tokio::select! {
        biased; // a connection made is never dropped for the probe
        conn = connecting => conn
            .map_err(|_| failed(format!("no answer from {host}:{port} within {bound:?}")))?
            .map_err(|e| failed(crate::tls::explain(format!("{host}:{port}: {e}"), url.tls, "rediss://")))?,
        why = plaintext_answers(host, port), if url.tls => return Err(failed(why)),
    };
    let mut probe = conn.clone();
    let role: redis::Value = tokio::time::timeout(bound, redis::cmd("ROLE").query_async(&mut probe))
        .await
        .map_err(|_| failed(format!("no answer to ROLE from {host}:{port} within {bound:?}")))?
        .map_err(|e| failed(format!("{host}:{port}: {e}")))?;
    if url.sentinel.is_some() {
        let is_master = matches!(&role, redis::Value::Array(v) if matches!(v.first(), Some(redis::Value::BulkString(b)) if b == b"master"));
        if !is_master {
            return Err(failed(format!("{host}:{port}, named master by the Sentinels, is not a master (yet)")));
        }
    }
    // Not fatal if refused (an ACL without INFO): only the restart checks go without it.
    let run_id: Option<Arc<str>> = match tokio::time::timeout(bound, run_id(&mut probe)).await {
        Ok(Ok(id)) => Some(Arc::from(id.as_str())),
        _ => None,
    };
    Ok(Master { addr: format!("{host}:{port}"), client, conn, run_id })
}

/// Connects to the master. With Sentinel, tries again until `connect_timeout` runs out, asking
/// the Sentinels each time: a master they still name while it is silent (paused, cut off) must
/// not use up the whole time when they are about to name another. The first try waits a second
/// for each answer, every next one twice as long as the last. A master name no Sentinel knows
/// is not tried again.
async fn connect_master(url: &RedisUrl) -> Result<Master> {
    let Some(sentinel) = &url.sentinel else {
        return open_master(url, &url.host, url.port, url.connect_timeout).await;
    };
    let until = Instant::now() + url.connect_timeout;
    let mut bound = Duration::from_secs(1);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let attempt = async {
            match ask_sentinels(url, sentinel).await {
                Ok((host, port)) => open_master(url, &host, port, bound.min(left)).await,
                Err(e) => Err(e),
            }
        };
        let e = match tokio::time::timeout(left, attempt).await {
            Ok(Ok(master)) => return Ok(master),
            Ok(Err(e @ Error::InvalidArgument { .. })) => return Err(e),
            Ok(Err(e)) => e,
            Err(_) => Error::Connect {
                url: url.to_string(),
                reason: format!("no master answered within {:?}", url.connect_timeout),
            },
        };
        let pause = Duration::from_millis(200);
        if Instant::now() + pause >= until {
            return Err(e);
        }
        tracing::debug!(error = %e, "the master the Sentinels named did not answer; asking them again");
        tokio::time::sleep(pause).await;
        bound *= 2;
    }
}

/// The server's run id, from `INFO server` (a new one after every restart).
async fn run_id(conn: &mut (impl redis::aio::ConnectionLike + Send)) -> redis::RedisResult<String> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_string())
        .ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "INFO server without a run_id")))
}

/// The master's address, from the first Sentinel that knows it. When none named it and some said
/// they do not know the name (and none failed to answer), the name is wrong:
/// [`Error::InvalidArgument`].
async fn ask_sentinels(url: &RedisUrl, sentinel: &SentinelUrl) -> Result<(String, u16)> {
    let mut why = Vec::new();
    let mut unanswered = 0;
    for hp in &sentinel.hosts {
        // Sentinels are spoken to as the servers are: over TLS with the same files, if asked.
        let client = open_client(url, &url.sentinel_connection_string(hp))?;
        let asked = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&sentinel.master)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
        };
        match tokio::time::timeout(url.connect_timeout.min(Duration::from_secs(2)), asked).await {
            Ok(Ok(Some(addr))) => return Ok(addr),
            Ok(Ok(None)) => why.push(format!("{hp} does not know master {:?}", sentinel.master)),
            Ok(Err(e)) => {
                unanswered += 1;
                why.push(format!("{hp}: {e}"));
            }
            Err(_) => {
                unanswered += 1;
                why.push(format!("{hp}: no answer"));
            }
        }
    }
    if unanswered == 0 {
        return Err(Error::InvalidArgument {
            what: "Sentinel master name",
            reason: format!("no Sentinel monitors a master named {:?} ({})", sentinel.master, why.join("; ")),
        });
    }
    Err(Error::Connect { url: url.to_string(), reason: format!("no Sentinel named the master ({})", why.join("; ")) })
}

impl Client {
    /// Connects to the server named by a `redis://` or `redis+sentinel://` URL (see
    /// [`RedisUrl`]). With Sentinel, the client follows the master: when a request fails, or the
    /// server says it is a replica now, it asks the Sentinels again and moves to the new master.
    /// Connecting itself asks them again until `connect_timeout` if the master they name does
    /// not answer (a failover may be under way).
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_common(url, &Default::default()).await
    }

    /// As [`connect`](Self::connect), with `over`'s values (from [`crate::ConnectOptions`]) in
    /// place of the URL's.
    pub(crate) async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
        Client::connect_url(RedisUrl::parse_with(url, over)?).await
    }

    /// Connects with a parsed URL.
    pub async fn connect_url(url: RedisUrl) -> Result<Client> {
        let (master, conn, wake, server_id) = match &url.cluster {
            None => {
                let m = connect_master(&url).await?;
                (m.addr, Connection::Server(m.conn), wake::Wakeups::new(m.client, url.connect_timeout), m.run_id)
            }
            Some(nodes) => {
                let conn = open_cluster(&url, nodes, None).await?;
                (nodes.join(","), Connection::Cluster(conn), wake::Wakeups::cluster(url.clone()), None)
            }
        };
        let wake = Arc::new(wake);
        let url_lease = url.lease;
        let id = uuid::Uuid::new_v4();
        Ok(Client {
            inner: Arc::new(Inner {
                url,
                conn: std::sync::RwLock::new(conn),
                master: tokio::sync::Mutex::new((master, None)),
                wake,
                watchdog: Arc::new(crate::watchdog::Watchdog::new(url_lease / 3)),
                id: id.to_string(),
                id_hex: id.simple().to_string(),
                next_handle: AtomicU64::new(1),
                server_id: std::sync::Mutex::new(server_id),
                conn_failed: AtomicBool::new(false),
                holds: AtomicUsize::new(0),
                sentry: std::sync::Mutex::new(None),
            }),
        })
    }

    /// A lock name's checks; on a cluster also that every key of the lock lands in its slot:
    /// a name with `{` must hold a non-empty hash tag, as `orders{eu}`.
    fn validate(&self, name: &str) -> Result<()> {
        validate_key(name)?;
        if self.sharded() {
            if let Some(open) = name.find('{') {
                if name[open + 1..].find('}').is_none_or(|close| close == 0) {
                    return Err(Error::InvalidLockPath {
                        path: name.to_string(),
                        reason: "on a cluster, a name with '{' needs a non-empty hash tag such as {eu}: otherwise the lock's keys fall in different slots".into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// True on a cluster: wake-ups go by sharded pub/sub (SPUBLISH/SSUBSCRIBE).
    pub(crate) fn sharded(&self) -> bool {
        self.inner.url.cluster.is_some()
    }

    /// The master's connection now.
    fn conn(&self) -> Connection {
        self.inner.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// With Sentinel: asks again which server is the master (at most every 200 ms) and moves
    /// there if it changed. Called when a request failed in a way a failover explains.
    async fn follow_master(&self) {
        self.follow_master_every(Duration::from_millis(200), true).await
    }

    /// [`follow_master`](Client::follow_master), asking the Sentinels at most once per `gap`;
    /// unless `patient`, not at all while someone else is asking them. Moving to a new master
    /// has every hold checked there at once (a grant the old master had not replicated is gone)
    /// and every waiter re-subscribe there and try again.
    async fn follow_master_every(&self, gap: Duration, patient: bool) {
        let Some(sentinel) = &self.inner.url.sentinel else { return };
        let mut master = if patient {
            self.inner.master.lock().await
        } else {
            match self.inner.master.try_lock() {
                Ok(master) => master,
                Err(_) => return,
            }
        };
        if master.1.is_some_and(|at| at.elapsed() < gap) {
            return;
        }
        master.1 = Some(Instant::now());
        let Ok((host, port)) = ask_sentinels(&self.inner.url, sentinel).await else { return };
        if format!("{host}:{port}") == master.0 {
            return;
        }
        match open_master(&self.inner.url, &host, port, response_timeout(&self.inner.url)).await {
            Ok(m) => {
                tracing::warn!(from = %master.0, to = %m.addr, "Sentinel named a new master; following it");
                *self.inner.conn.write().unwrap_or_else(|e| e.into_inner()) = Connection::Server(m.conn);
                *self.inner.server_id.lock().unwrap_or_else(|e| e.into_inner()) = m.run_id;
                self.inner.wake.retarget(m.client).await;
                master.0 = m.addr;
                self.inner.watchdog.check_now();
            }
            Err(e) => tracing::debug!(error = %e, "cannot reach the new master yet"),
        }
    }

    /// At a waiter's re-check that no message prompted: with Sentinel, asks the Sentinels in the
    /// background (at most once per [`FALLBACK_POLL`]) whether they named another master. A
    /// master that went silent publishes no release, and its silence would otherwise show only
    /// as a request timing out. Moving to a new master wakes the waiters to try there; the
    /// waiter does not wait for the answer (a Sentinel that is down takes seconds to give up on).
    pub(crate) fn look_for_failover(&self) {
        if self.inner.url.sentinel.is_none() {
            return;
        }
        let client = self.clone();
        tokio::spawn(async move { client.follow_master_every(FALLBACK_POLL, false).await });
    }

    /// The run id of the server the connection reached when last asked.
    pub(crate) fn server_id(&self) -> Option<Arc<str>> {
        self.inner.server_id.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Asks the server for its run id. One other than we knew (a restart, or another server at
    /// the address) is remembered, and has every hold checked at once: the server may not have
    /// them. Called by the sentry when it (re)opens its connection, and after a connection error
    /// is followed by an answer. False if the server did not say (a server whose ACL refuses
    /// INFO counts as having said: nothing more can be learnt from it).
    pub(crate) async fn revalidate(&self) -> bool {
        if self.sharded() {
            return true;
        }
        let mut conn = self.conn();
        let id = match run_id(&mut conn).await {
            Ok(id) => id,
            Err(e) => {
                let e = backend("INFO", "", e);
                if e.is_transient() {
                    self.inner.conn_failed.store(true, Ordering::SeqCst); // checked when it answers
                    return false;
                }
                return true;
            }
        };
        let changed = {
            let mut known = self.inner.server_id.lock().unwrap_or_else(|e| e.into_inner());
            let changed = known.as_deref() != Some(id.as_str());
            if changed {
                *known = Some(Arc::from(id.as_str()));
            }
            changed
        };
        if changed && self.inner.holds.load(Ordering::SeqCst) > 0 {
            tracing::info!(
                url = %self.inner.url,
                run_id = %id,
                "the Redis server was restarted or replaced; checking every held lock at once"
            );
            self.inner.watchdog.check_now();
        }
        true
    }

    /// Whether the server now is the one with run id `confirmed_on` (the one a hold was last
    /// confirmed on). True when that cannot be told (no run id known, or on a cluster); if the
    /// server cannot be asked now, by the run id we know.
    pub(crate) async fn same_server(&self, confirmed_on: Option<&str>) -> bool {
        let Some(confirmed_on) = confirmed_on else { return true };
        if self.sharded() {
            return true;
        }
        let mut conn = self.conn();
        let asked = tokio::time::timeout(response_timeout(&self.inner.url), run_id(&mut conn)).await;
        let now: Option<Arc<str>> = match asked {
            Ok(Ok(id)) => Some(Arc::from(id.as_str())),
            _ => self.server_id(),
        };
        now.as_deref().is_none_or(|id| id == confirmed_on)
    }

    /// A hold began: counted, and the sentry started if it is not running.
    pub(crate) fn hold_started(&self) {
        self.inner.holds.fetch_add(1, Ordering::SeqCst);
        if self.sharded() {
            return;
        }
        let mut task = self.inner.sentry.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *task = Some(runtime.spawn(sentry::run(Arc::downgrade(&self.inner))));
        }
    }

    /// A hold ended (released or dropped).
    pub(crate) fn hold_ended(&self) {
        self.inner.holds.fetch_sub(1, Ordering::SeqCst);
    }

    /// A request was answered. The first answer after a connection error comes on a connection
    /// made since (the redis crate reconnects without telling), to a server that may have lost
    /// our keys: every hold is checked at once, and the server's run id is asked again.
    fn answered(&self) {
        if self.inner.conn_failed.load(Ordering::Relaxed) && self.inner.conn_failed.swap(false, Ordering::SeqCst) {
            tracing::debug!("the server answers again after a connection error; checking every held lock");
            self.inner.watchdog.check_now();
            let client = self.clone();
            tokio::spawn(async move {
                client.revalidate().await;
            });
        }
    }

    /// On a cluster: learns the slot layout afresh (at most every 200 ms). The redis crate
    /// follows MOVED redirects and reconnects after resets, but keeps sending to a master that
    /// went silent (paused, partitioned) until its replica's promotion is learnt this way.
    async fn relearn_cluster(&self) {
        let Some(nodes) = &self.inner.url.cluster else { return };
        let mut last = self.inner.master.lock().await;
        if last.1.is_some_and(|at| at.elapsed() < Duration::from_millis(200)) {
            return;
        }
        last.1 = Some(Instant::now());
        match open_cluster(&self.inner.url, nodes, None).await {
            Ok(conn) => {
                tracing::debug!("cluster layout learnt afresh after a failed request");
                *self.inner.conn.write().unwrap_or_else(|e| e.into_inner()) = Connection::Cluster(conn);
            }
            Err(e) => tracing::debug!(error = %e, "cannot learn the cluster layout now"),
        }
        last.1 = Some(Instant::now());
    }

    /// A reentrant mutex on key `name` in the URL's layout (Redisson's unless `?layout=simple`;
    /// with `simple`, use [`Client::simple_lock`] for the typed handle). The name is the key,
    /// exactly as given.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.validate(name)?;
        Ok(Mutex::new(self.clone(), name.to_string()))
    }

    /// A read/write lock on key `name` in Redisson's RReadWriteLock layout.
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        self.validate(name)?;
        Ok(RwLock::new(self.clone(), name.to_string()))
    }

    /// A fair (FIFO) reentrant lock on key `name`: Redisson's RLock hash, granted in arrival
    /// order by a queue the server keeps (see [`FairLock`]).
    pub fn fair_lock(&self, name: &str) -> Result<FairLock> {
        self.validate(name)?;
        Ok(FairLock::new(self.clone(), name.to_string()))
    }

    /// A semaphore of `permits` permits on key `name`; permits expire with their holder.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        self.validate(name)?;
        Semaphore::new(self.clone(), name.to_string(), permits)
    }

    /// The plain lock on key `name`: `SET name value NX PX lease`, as redis-py's `Lock(name)`.
    pub fn simple_lock(&self, name: &str) -> Result<SimpleLock> {
        self.validate(name)?;
        Ok(SimpleLock::new(self.clone(), name.to_string()))
    }

    /// The URL this client connected with.
    pub fn url(&self) -> &RedisUrl {
        &self.inner.url
    }

    /// The lease every lock of this client gets (renewed every third of it).
    pub fn lease(&self) -> Duration {
        self.inner.url.lease
    }

    /// The client id in every Redisson-layout field (`<id>:<handle>`).
    pub fn client_id(&self) -> &str {
        &self.inner.id
    }

    /// The redis crate's connection, for anything distlock does not wrap.
    pub fn connection(&self) -> Connection {
        self.conn()
    }

    /// Who holds `name` now, read from the server (either layout).
    pub async fn inspect(&self, name: &str) -> Result<LockView> {
        self.validate(name)?;
        let mut conn = self.conn();
        let fail = |op| move |e: redis::RedisError| backend(op, name, e);
        let kind: String = redis::cmd("TYPE").arg(name).query_async(&mut conn).await.map_err(fail("TYPE"))?;
        let pttl: i64 = redis::cmd("PTTL").arg(name).query_async(&mut conn).await.map_err(fail("PTTL"))?;
        let counter: Option<String> =
            redis::cmd("GET").arg(token_key(name)).query_async(&mut conn).await.map_err(fail("GET"))?;
        let holders = match kind.as_str() {
            "hash" => {
                let h: Vec<(String, String)> =
                    redis::cmd("HGETALL").arg(name).query_async(&mut conn).await.map_err(fail("HGETALL"))?;
                // `value` is an election leader's announced value, not a holder.
                h.into_iter()
                    .filter(|(id, _)| id != "value")
                    .map(|(id, count)| Holder { id, count: count.parse().unwrap_or(0) })
                    .collect()
            }
            "string" => {
                let v: Option<String> =
                    redis::cmd("GET").arg(name).query_async(&mut conn).await.map_err(fail("GET"))?;
                v.into_iter().map(|id| Holder { id, count: 1 }).collect()
            }
            _ => Vec::new(),
        };
        Ok(LockView {
            key: name.to_string(),
            layout: match kind.as_str() {
                "hash" => "redisson",
                "string" => "simple",
                "none" => "free",
                _ => "other",
            }
            .to_string(),
            holders,
            ttl_ms: (pttl >= 0).then_some(pttl as u64),
            last_token: counter.and_then(|c| c.parse().ok()),
        })
    }

    /// Drops this handle (the connection closes when the last clone and lock are gone).
    pub async fn close(self, _bound: Duration) {}

    /// A value no lock of this client has used, for the simple layout: 32 hex digits like
    /// redis-py's `uuid1().hex`, 16 of the client's random id then 16 of a count (no call for
    /// randomness on every acquire).
    pub(crate) fn fresh_value(&self) -> String {
        let n = self.inner.next_handle.fetch_add(1, Ordering::Relaxed);
        format!("{}{n:016x}", &self.inner.id_hex[..16])
    }

    /// A hash field no hold of this client has used: `<client uuid>:<n>`, Redisson's
    /// `<uuid>:<thread id>` shape. Every new hold gets one, so that nothing done for an ended
    /// hold (a late release, renewal or retry) can touch a later one.
    pub(crate) fn fresh_field(&self) -> String {
        format!("{}:{}", self.client_id(), self.inner.next_handle.fetch_add(1, Ordering::Relaxed))
    }

    fn lease_ms(&self) -> u64 {
        self.inner.url.lease.as_millis() as u64
    }

    /// Runs `script` with the given keys and arguments (EVALSHA, loading it if the server lacks it).
    async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[String],
        op: &'static str,
        key: &str,
    ) -> Result<T> {
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(*k);
        }
        for a in args {
            invocation.arg(a);
        }
        let mut conn = self.conn();
        let r = invocation.invoke_async(&mut conn).await;
        self.after(r, op, key).await
    }

    /// Runs an acquire script; with `?replicas=N` in the URL, pipelines `WAIT N timeout` after it
    /// on the same connection, and reports how many replicas confirmed (check it with
    /// [`Replication::check`] once the guard exists, so that a refusal releases the grant).
    async fn eval_acquire<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[String],
        key: &str,
    ) -> Result<(T, Replication)> {
        match self.eval_acquire_as_is(script, keys, args, key).await {
            Err(e) if is_wrong_type(&e) && scripts::kind_of(script).is_some() => {
                Err(self.kind_conflict(script, key).await.unwrap_or(e))
            }
            r => r,
        }
    }

    /// The contract's refusal of a key that holds another kind of lock (the server said
    /// WRONGTYPE): what the key is in use as, by its type; `None` when the key itself holds no
    /// lock's structure (the WRONGTYPE came from a side key: the server's error stands).
    async fn kind_conflict(&self, script: &redis::Script, key: &str) -> Option<Error> {
        let mut conn = self.conn();
        let held: redis::RedisResult<String> = redis::cmd("TYPE").arg(key).query_async(&mut conn).await;
        let in_use = match held.as_deref() {
            Ok("hash") => "a Redisson lock (a mutex, read/write lock or fair lock)",
            Ok("string") => "a redis-py lock (layout=simple) or another string",
            Ok("zset") => "a semaphore",
            _ => return None,
        };
        let wanted = scripts::kind_of(script).unwrap_or("a lock").to_string();
        Some(Error::KindConflict { lock: key.to_string(), in_use: in_use.to_string(), wanted })
    }

    async fn eval_acquire_as_is<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[String],
        key: &str,
    ) -> Result<(T, Replication)> {
        let wanted = self.inner.url.replicas;
        if wanted == 0 {
            return Ok((self.eval(script, keys, args, "acquire", key).await?, Replication { wanted, acked: 0 }));
        }
        let timeout_ms = self.inner.url.replica_timeout.as_millis() as u64;
        for loaded in [false, true] {
            let mut pipe = redis::pipe();
            pipe.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .cmd("WAIT")
                .arg(wanted)
                .arg(timeout_ms);
            let mut conn = self.conn();
            match pipe.query_async::<(T, i64)>(&mut conn).await {
                Ok((value, acked)) => {
                    self.answered();
                    return Ok((value, Replication { wanted, acked }));
                }
                Err(e) if e.code() == Some("NOSCRIPT") && !loaded => {
                    script.load_async(&mut conn).await.map_err(|e| backend("SCRIPT LOAD", key, e))?;
                }
                Err(e) => return self.after(Err(e), "acquire", key).await,
            }
        }
        Err(Error::Unsupported { backend: "redis", what: format!("running a script it has just loaded (on {key})") })
    }

    /// Maps a reply's error, following the master first if a failover may explain it.
    async fn after<T>(&self, r: redis::RedisResult<T>, op: &'static str, key: &str) -> Result<T> {
        match r {
            Ok(v) => {
                self.answered();
                Ok(v)
            }
            Err(e) => {
                let e = backend(op, key, e);
                if e.is_transient() {
                    self.inner.conn_failed.store(true, Ordering::SeqCst);
                }
                if self.inner.url.sentinel.is_some() && e.is_transient() {
                    self.follow_master().await;
                } else if self.inner.url.cluster.is_some() && e.is_transient() {
                    self.relearn_cluster().await;
                }
                Err(e)
            }
        }
    }

    /// Deletes `key` in the background (a retried unlock's latch).
    fn forget(&self, key: &str) {
        let mut conn = self.conn();
        let key = key.to_string();
        tokio::spawn(async move {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&key).query_async(&mut conn).await;
        });
    }
}

/// How many replicas confirmed an acquire (with `?replicas=N`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replication {
    wanted: u32,
    acked: i64,
}

impl Replication {
    /// An error (the caller then drops, and so releases, what it acquired) when fewer replicas
    /// than asked confirmed the acquire within the timeout.
    pub(crate) fn check(self, key: &str) -> Result<()> {
        if self.wanted == 0 || self.acked >= self.wanted as i64 {
            return Ok(());
        }
        Err(Error::NotReplicated { lock: key.to_string(), wanted: self.wanted, acked: self.acked.max(0) as u32 })
    }
}

/// A lock as seen on the server by [`Client::inspect`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(redis: distlock::redis::Client) -> distlock::Result<()> {
/// let view = redis.inspect("orders").await?;
/// for h in &view.holders {
///     println!("{} holds {} time(s); expires in {:?} ms", h.id, h.count, view.ttl_ms);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LockView {
    /// The key.
    pub key: String,
    /// `redisson` (a hash), `simple` (a string), `free` (no key) or `other`.
    pub layout: String,
    /// Who holds it: hash fields with their hold counts, or the string's value.
    pub holders: Vec<Holder>,
    /// Milliseconds until the key expires, if it has a TTL.
    pub ttl_ms: Option<u64>,
    /// The last fencing token handed out for this name.
    pub last_token: Option<u64>,
}

/// One holder in a [`LockView`].
///
/// # Examples
///
/// ```
/// let h = distlock::redis::Holder { id: "6f1c…:1".into(), count: 2 };
/// assert_eq!(h.count, 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Holder {
    /// The hash field (`<client uuid>:<thread or handle id>`) or the string value.
    pub id: String,
    /// Hold count (1 for the simple layout).
    pub count: u64,
}

/// Redisson's `prefixName`: `prefix:{K}`, or `prefix:K` when K already has a hash tag.
pub(crate) fn prefix_name(prefix: &str, key: &str) -> String {
    if key.contains('{') {
        format!("{prefix}:{key}")
    } else {
        format!("{prefix}:{{{key}}}")
    }
}

/// Redisson's `suffixName`: `{K}:suffix`, or `K:suffix` when K already has a hash tag (`{K}`
/// alone for an empty suffix).
pub(crate) fn suffix_name(key: &str, suffix: &str) -> String {
    let base = if key.contains('{') { key.to_string() } else { format!("{{{key}}}") };
    if suffix.is_empty() {
        base
    } else {
        format!("{base}:{suffix}")
    }
}

/// The fencing counter of lock `key` (Redisson's RFencedLock counter name; never deleted).
pub(crate) fn token_key(key: &str) -> String {
    prefix_name("redisson_lock_token", key)
}

/// Redisson's release channel of lock `key`.
pub(crate) fn redisson_channel(key: &str) -> String {
    prefix_name("redisson_lock__channel", key)
}

/// The release channel of a simple lock `key` (distlock's own; redis-py publishes nothing).
pub(crate) fn simple_channel(key: &str) -> String {
    prefix_name("distlock_lock__channel", key)
}

/// What a lock handle works with: the client, the lock's key, the channel its releases publish
/// on, and its fencing counter.
#[derive(Debug)]
pub(crate) struct Keys {
    pub(crate) client: Client,
    pub(crate) key: String,
    pub(crate) channel: String,
    pub(crate) token_key: String,
}

impl Keys {
    /// The keys of lock `key`, with its release channel named by `channel`.
    pub(crate) fn new(client: Client, key: String, channel: impl FnOnce(&str) -> String) -> Keys {
        Keys { channel: channel(&key), token_key: token_key(&key), client, key }
    }

    /// A re-entrant acquire of this lock by `script`, with `reentry`'s hold in progress;
    /// `holder` makes the holder from a field and the channel.
    pub(crate) fn reentrant<'a>(
        &'a self,
        reentry: &'a Arc<guard::Reentry>,
        script: &'static redis::Script,
        holder: fn(String, String) -> guard::Holder,
    ) -> guard::Reentrant<'a> {
        guard::Reentrant {
            client: &self.client,
            key: &self.key,
            token_key: &self.token_key,
            channel: &self.channel,
            reentry,
            script,
            holder,
            value: None,
        }
    }
}

/// Redisson's unlock latch key for one release request.
pub(crate) fn latch_key(key: &str, request_id: &str) -> String {
    format!("{}:{request_id}", prefix_name("redisson_unlock_latch", key))
}

pub(crate) fn validate_key(name: &str) -> Result<()> {
    crate::contract::check_name(name)?;
    if name.len() > 4096 {
        return Err(Error::InvalidLockPath { path: name.to_string(), reason: "longer than 4096 bytes".into() });
    }
    Ok(())
}

fn backend(op: &'static str, key: &str, e: redis::RedisError) -> Error {
    let text = e.to_string();
    if e.code() == Some("NOPERM") || text.starts_with("NoPerm") || text.contains("NOPERM") {
        // Redis's own words say which rule failed; ours say what a lock user needs.
        let detail = text.split_once(": ").map_or(text.as_str(), |(_, d)| d).trim().to_string();
        let why = format!(
            "NOPERM: the Redis user's ACL does not allow it ({detail}); a lock user needs the keys and \
             channels of the names it locks and the commands distlock sends (docs/security.md, \
             \"Least privilege\")"
        );
        return Error::Backend { op, path: key.to_string(), source: why.into() };
    }
    Error::Backend { op, path: key.to_string(), source: Box::new(e) }
}

/// True for the server's WRONGTYPE: the key holds a structure of another kind of lock.
fn is_wrong_type(e: &Error) -> bool {
    match e {
        Error::Backend { source, .. } => source
            .downcast_ref::<redis::RedisError>()
            .is_some_and(|r| r.code() == Some("WRONGTYPE") || r.to_string().contains("WRONGTYPE")),
        _ => false,
    }
}

/// True for errors worth retrying: the connection failed, the server did not answer in time, or
/// a failover is under way.
pub(crate) fn is_transient(e: &Error) -> bool {
    match e {
        Error::Backend { source, .. } => source.downcast_ref::<redis::RedisError>().is_some_and(|r| {
            r.is_io_error()
                || r.is_timeout()
                || r.is_connection_dropped()
                || r.is_connection_refusal()
                // A demoted master (after a failover) refuses writes: ask again, elsewhere.
                || matches!(r.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
                // A cluster between layouts (CLUSTERDOWN, MOVED, ASK, TRYAGAIN after the redis
                // crate's own retries), or without a connection to the slot's node yet.
                || r.is_cluster_error()
                || r.kind() == redis::ErrorKind::ClusterConnectionNotFound
        }),
        _ => false,
    }
}

impl Error {
    pub(crate) fn is_transient(&self) -> bool {
        is_transient(self)
    }
}

/// The longest a waiter sleeps between two attempts, whatever the holder's TTL: a release
/// message can be lost (a master that went silent, a failover, a pub/sub connection cut without
/// a word), and the holder's lease can be long.
pub(crate) const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// True if a failed attempt may be tried again: a connection error or a failover's refusal,
/// unless such errors have lasted `give_up_after` (`None`: until the caller's deadline, which
/// the caller checks).
fn may_retry(e: &Error, failing_since: &mut Option<Instant>, give_up_after: Option<Duration>) -> bool {
    if !e.is_transient() {
        return false;
    }
    let since = *failing_since.get_or_insert_with(Instant::now);
    if give_up_after.is_some_and(|limit| since.elapsed() >= limit) {
        return false;
    }
    tracing::debug!(error = %e, "acquire attempt failed; retrying");
    true
}

/// What an acquire script answered (the codes in `scripts.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A new hold, with its fencing token.
    Granted(u64),
    /// One more on the hold in progress.
    Reentered,
    /// Someone else's; their TTL in ms (negative: none, or none known).
    Held(i64),
    /// The hold in progress that a re-entry meant to count on is gone from the server.
    Gone,
    /// The semaphore is in use with this many permits.
    OtherPermits(i64),
}

impl Answer {
    pub(crate) fn parse(reply: &[i64], key: &str) -> Result<Answer> {
        Ok(match *reply {
            [1, token, ..] if token > 0 => Answer::Granted(token as u64),
            [2, ..] => Answer::Reentered,
            [0, ttl, ..] => Answer::Held(ttl),
            [3, ..] => Answer::Gone,
            [4, permits, ..] => Answer::OtherPermits(permits),
            _ => return Err(Answer::unexpected(reply, key)),
        })
    }

    pub(crate) fn unexpected(reply: &[i64], key: &str) -> Error {
        Error::Backend {
            op: "acquire",
            path: key.to_string(),
            source: format!("unexpected answer from the acquire script: {reply:?}").into(),
        }
    }
}

/// What one acquire attempt found.
pub(crate) enum Attempt<G> {
    /// Ours (the guard is built inside the attempt's task, so a dropped acquire releases it).
    Acquired(G),
    /// Someone else holds it; their TTL in ms (negative: none, or just gone).
    Held(i64),
}

/// Subscribes to `channel` (again, if the pub/sub connection was lost), giving up at `deadline`:
/// whether it is subscribed.
async fn subscribe_until(client: &Client, channel: &str, deadline: Option<Instant>) -> bool {
    let ensure = client.inner.wake.ensure(channel);
    match deadline {
        Some(d) => tokio::time::timeout_at(d, ensure).await.unwrap_or(false),
        None => ensure.await,
    }
}

/// The wait loop every Redis recipe shares: subscribe to `channel`, try, and on a refusal wait
/// for a release message or the holder's TTL (at most [`FALLBACK_POLL`]), until `deadline`
/// (`None`: forever).
///
/// Connection errors and failovers do not end a wait with time left: the attempt is tried again
/// (after the client followed the master, or learnt the cluster's layout afresh) until the
/// deadline, and the deadline passing after a failed attempt returns that attempt's error (the
/// lock could not be asked for, which is not the same as "held by someone else"). A wait
/// without deadline gives up when errors have lasted the longer of `connect_timeout` and the
/// lease. With Sentinel, a re-check that no message prompted also asks the Sentinels (in the
/// background) whether the master moved.
///
/// Each attempt builds its guard itself and is finished in the background if this future is
/// dropped while it is in flight ([`detach`](crate::background::detach)): the guard is then dropped
/// with the attempt's result and releases the lock, so a cancelled acquire leaves nothing behind.
pub(crate) async fn acquire_loop<G, F, Fut>(
    client: &Client,
    channel: &str,
    deadline: Option<Instant>,
    recheck: Option<Duration>,
    attempt: F,
) -> Result<Option<G>>
where
    G: Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Attempt<G>>> + Send + 'static,
{
    // In place, finished in the background if this acquire is dropped meanwhile: a grant that
    // comes after that is dropped with the attempt's output, and so released.
    let try_once = || crate::background::detach(attempt());
    let give_up_after = match deadline {
        Some(_) => None,
        None => Some(client.inner.url.connect_timeout.max(client.lease())),
    };
    let mut failing_since: Option<Instant> = None;
    // The last attempt's error, while attempts fail.
    let mut failed: Option<Error> = None;
    let out_of_time = |failed: Option<Error>| -> Result<Option<G>> {
        match failed {
            Some(e) => Err(e),
            None => Ok(None),
        }
    };
    // First a plain attempt: an uncontended acquire costs one round trip and no subscription. A
    // connection error is tried again at once (the connection is re-established), then as below.
    let mut first = try_once().await;
    if matches!(&first, Err(e) if e.is_transient()) {
        first = try_once().await;
    }
    match first {
        Ok(Attempt::Acquired(g)) => return Ok(Some(g)),
        Ok(Attempt::Held(_)) => {}
        Err(e) => {
            if !may_retry(&e, &mut failing_since, give_up_after) {
                return Err(e);
            }
            failed = Some(e);
        }
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return out_of_time(failed);
    }
    let registration = client.inner.wake.register(channel);
    // Whether the last wait ended without a message (a re-check on our own initiative).
    let mut unprompted = false;
    loop {
        if unprompted {
            client.look_for_failover();
        }
        // Neither (re)connecting the pub/sub side nor a slow attempt may hold us past the deadline.
        let subscribed = subscribe_until(client, channel, deadline).await;
        let notified = registration.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // After subscribing, try again (a release may have come before the subscription).
        let attempt = match deadline {
            Some(d) => match tokio::time::timeout_at(d, try_once()).await {
                Ok(outcome) => outcome,
                // A grant that comes after this is dropped and released.
                Err(_) => return out_of_time(failed),
            },
            None => try_once().await,
        };
        let pttl = match attempt {
            Ok(Attempt::Acquired(g)) => return Ok(Some(g)),
            Ok(Attempt::Held(pttl)) => {
                failing_since = None;
                failed = None;
                pttl
            }
            Err(e) => {
                if !may_retry(&e, &mut failing_since, give_up_after) {
                    return Err(e);
                }
                failed = Some(e);
                -1
            }
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return out_of_time(failed);
        }
        // Wait for a release message, or until the holder's TTL runs out. Without a confirmed
        // subscription, after a failed attempt, or with no TTL to go by, re-check sooner; never
        // later than the fallback poll.
        let mut wait = if pttl > 0 { Duration::from_millis(pttl as u64 + 1) } else { Duration::from_millis(100) };
        if !subscribed {
            wait = wait.min(Duration::from_millis(100));
        }
        if let Some(r) = recheck {
            wait = wait.min(r);
        }
        wait = wait.min(FALLBACK_POLL);
        let until = match deadline {
            Some(d) => d.min(now + wait),
            None => now + wait,
        };
        unprompted = tokio::select! {
            _ = &mut notified => false,
            _ = tokio::time::sleep_until(until) => true,
        };
    }
}

#[cfg(test)]
assert_send_sync_static!(MutexGuard, ReadGuard, WriteGuard, FairGuard, SemaphorePermit, SimpleGuard, RedlockGuard);

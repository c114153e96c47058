//! The ZooKeeper backend: a [`Client`] (one session, shared by any number of locks) and the lock
//! recipes built on one queue algorithm.
//!
//! # Layout
//!
//! - [`url`](ZkUrl): `zk://` URLs and path rules;
//! - `queue`: the queue of EPHEMERAL_SEQUENTIAL nodes, written once and used by every recipe;
//! - `guard`: a held lock node, its fencing token and its state machine (held, suspended, lost);
//! - `monitor`: one per session, following the session and every watched lock node for the guards;
//! - [`Mutex`]: the exclusive lock (Curator's InterProcessMutex node layout);
//! - [`inspect`](Client::inspect): who holds and who waits.

pub(crate) mod contract;
mod election;
mod guard;
mod inspect;
mod jobs;
mod monitor;
mod multi;
mod mutex;
mod naive;
mod queue;
mod reentrant;
mod rwlock;
mod semaphore;
mod session;
mod sim;
mod url;

pub use crate::LockState;
pub use inspect::{Contender, LockView};
pub use multi::{AnyGuard, LockSpec, MultiGuard, MultiLock};
pub use mutex::{Mutex, MutexGuard};
pub use naive::{NaiveGuard, NaiveLock};
pub use queue::QueueStatus;
pub use reentrant::{ReentrantGuard, ReentrantMutex};
pub use rwlock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};
pub use url::{AclMode, ElectionLayout, ZkAuth, ZkUrl, DEFAULT_CONNECT_TIMEOUT, DEFAULT_SESSION_TIMEOUT};

use crate::{Error, Owner, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zookeeper_client as zk;

/// A ZooKeeper session shared by any number of lock handles.
///
/// Cloning is cheap and shares the session: locks made from clones queue as the same session
/// (ZooKeeper ephemeral nodes belong to sessions, so when the session ends every lock node of
/// every clone goes with it). Connect once per process and make many locks from it.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// use distlock::zookeeper::Client;
/// let zk = Client::connect("zk://127.0.0.1:2181?session_timeout=10s").await?;
/// let orders = zk.mutex("/locks/orders")?;
/// let guard = orders.lock().await?;
/// println!("holding with fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    zk: zk::Client,
    url: ZkUrl,
    owner: Vec<u8>,
    metrics: Metrics,
    lease: Arc<session::Lease>,
    /// Listings of lock directories this session may have in flight at once. A listing's reply
    /// grows with the queue, and the server buffers every reply it has not yet sent: 10,000
    /// waiters queueing at once, each listing up to 10,000 names, ran Apache ZooKeeper (512 MB
    /// heap) out of memory.
    listings: tokio::sync::Semaphore,
    /// Follows the session and every lock node whose guard is watched (see `monitor`).
    monitor: monitor::Monitor,
}

/// See `Inner::listings`.
const LISTINGS_IN_FLIGHT: usize = 32;

/// The lease margin for a session the server granted `timeout`: refuses a lease asked for that
/// the server would not grant, and a margin not shorter than the timeout.
fn granted_margin(url: &ZkUrl, timeout: Duration) -> Result<Duration> {
    if url.lease_given() && timeout.as_millis() != url.session_timeout.as_millis() {
        // The server keeps sessions within its bounds and grants the nearest: a lease asked
        // for that it would not grant is refused, not replaced (the session closes as `zk`
        // drops). Without a lease asked for, the server's grant is the lease.
        return Err(Error::InvalidArgument {
            what: "lease",
            reason: format!(
                "the ZooKeeper server grants a session timeout of {timeout:?} where the lease asked for is {:?}: \
                 it keeps sessions between its minSessionTimeout and maxSessionTimeout (by default 2 and \
                 20 tickTimes); ask for a lease within them",
                url.session_timeout
            ),
        });
    }
    let margin = url.lease_margin.unwrap_or_else(|| session::default_margin(timeout));
    if margin >= timeout {
        return Err(Error::InvalidUrl {
            url: url.to_string(),
            reason: format!(
                "lease_margin ({margin:?}) must be shorter than the negotiated session timeout ({timeout:?})"
            ),
        });
    }
    Ok(margin)
}

impl Client {
    /// Leave to send one listing of a lock directory (with the create it travels with).
    pub(crate) async fn listing_permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.inner.listings.acquire().await.expect("the semaphore is never closed")
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("url", &self.inner.url.to_string()).field("session", &self.session_id()).finish()
    }
}

/// Resolves only when no address of `url` accepts a TCP connection at all (refused, unresolvable
/// or unreachable), with the reasons; pends forever otherwise. Probes once, after a short delay,
/// so a live server answers a real connect first and never sees the probe.
///
/// [`Client::connect`] keeps retrying a refusing server until its connect timeout (it may be
/// starting); a command-line tool races the connect with this to report a server that is not
/// there at once.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// use distlock::zookeeper::{nobody_listens, Client, ZkUrl};
/// let url = ZkUrl::parse("zk://127.0.0.1:2181")?;
/// let client = tokio::select! {
///     c = Client::connect_url(url.clone()) => c?,
///     why = nobody_listens(&url) => panic!("no server: {why}"),
/// };
/// # let _ = client; Ok(()) }
/// ```
pub async fn nobody_listens(url: &ZkUrl) -> String {
    crate::listening::nobody_listens(&url.hosts).await
}

/// The ZooKeeper client's TLS settings for `url`: its CA (else the system's roots), its client
/// certificate, the server's name always verified.
fn tls_options(url: &ZkUrl) -> Result<zk::TlsOptions> {
    let pem = url.tls_files.read()?;
    let bad = |what: &'static str, e: zk::Error| Error::InvalidArgument { what, reason: e.to_string() };
    let ca = match &pem.ca {
        Some(ca) => String::from_utf8_lossy(ca).into_owned(),
        None => system_roots_pem()?,
    };
    let mut options = zk::TlsOptions::new().with_pem_ca(&ca).map_err(|e| bad("CA certificate file (cacert)", e))?;
    if let Some((cert, key)) = &pem.identity {
        options = options
            .with_pem_identity(&String::from_utf8_lossy(cert), &String::from_utf8_lossy(key))
            .map_err(|e| bad("client certificate and key (cert, key)", e))?;
    }
    Ok(options)
}

/// The system's root certificates as PEM text (for a client library that takes only PEM).
///
/// # Errors
///
/// [`Error::InvalidArgument`] when the system has no root certificate.
pub(crate) fn system_roots_pem() -> Result<String> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        return Err(Error::InvalidArgument {
            what: "TLS roots",
            reason: "no cacert given and no system root certificate found".into(),
        });
    }
    let mut pem = String::new();
    for cert in found.certs {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let text = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, cert.as_ref());
        for line in text.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    Ok(pem)
}

/// A failed connect's reason, with what to try when the cause is known.
fn explain(url: &ZkUrl, e: &zk::Error) -> String {
    let text = e.to_string();
    let hint = match e {
        zk::Error::AuthFailed => match &url.auth {
            Some(ZkAuth::Sasl { user, .. }) => format!("the server refused user {user:?} (wrong user or password?)"),
            Some(ZkAuth::Digest { user, .. }) => format!(
                "the server refused user {user:?} (wrong user or password? a server that takes SASL logins only needs auth=sasl)"
            ),
            None => "the server requires a login: give zk://USER:PASSWORD@host:port (with auth=sasl for a SASL login)".into(),
        },
        zk::Error::Timeout => return no_session(url),
        _ if url.tls => return crate::tls::explain(text, true, "zks://"),
        _ => return text,
    };
    format!("{text}: {hint}")
}

/// The reason of a connect that timed out.
fn no_session(url: &ZkUrl) -> String {
    let hint = if url.tls { " (did the TLS handshake finish? is this the secure client port?)" } else { "" };
    format!("no session established within {}{hint}", humantime::format_duration(url.connect_timeout))
}

/// What the ZooKeeper client cannot say, tried when its session is not up after a moment: a
/// server refusing us for too many connections ([`refused`]), or a TLS trouble ([`tls_trouble`]).
/// Returns the cause when it is a definite one; otherwise never returns, and the client's own
/// outcome stands.
async fn trouble(url: &ZkUrl) -> String {
    // The deterministic simulation has no real sockets to probe with: nothing to learn.
    #[cfg(distlock_sim)]
    if true {
        return std::future::pending().await;
    }
    tokio::time::sleep(TROUBLE_AFTER).await;
    let refused = refused(url, REFUSAL_PROBE);
    let tls =
        crate::listening::tls_trouble(&url.hosts, url.tls.then_some(&url.tls_files), "zks://", None, Duration::ZERO);
    tokio::pin!(refused, tls);
    // A refusal comes in plaintext, before any TLS, so a TLS handshake with a refusing server
    // fails too: the refusal, the first cause, is the one told.
    tokio::select! {
        r = &mut refused => match r {
            Some(why) => why,
            None => tls.await,
        },
        why = &mut tls => refused.await.unwrap_or(why),
    }
}

/// The line distlock's embedded server writes to a connection it refuses for want of slots.
const TOO_MANY_CONNECTIONS: &str = "distlock-server: too many connections";

/// How long a session may take before [`trouble`] asks why.
const TROUBLE_AFTER: Duration = Duration::from_millis(300);

/// How long [`refused`] waits for a host to accept, and then for its first words, when asked by
/// [`trouble`].
const REFUSAL_PROBE: Duration = Duration::from_millis(500);

/// The same, when asked only at the connect timeout: a refusal comes at once from a server that
/// accepts, and a connect that failed must not take much longer than its timeout.
const LATE_REFUSAL_PROBE: Duration = Duration::from_millis(100);

/// Whether every host of `url` refuses connections for want of slots: distlock's embedded
/// server says so in a line of plaintext (before any TLS) and closes, where the ZooKeeper client
/// sees only a closed connection and retries until its timeout. One raw connection per host,
/// which reads what the server writes first; each bounded by `wait` to connect and `wait` to
/// read.
async fn refused(url: &ZkUrl, wait: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let probe = |host: String| async move {
        let connect = tokio::net::TcpStream::connect(host.as_str());
        let mut stream = tokio::time::timeout(wait, connect).await.ok()?.ok()?;
        let mut first = Vec::new();
        let read = async {
            let mut buf = [0u8; 256];
            while first.len() < 256 && !first.contains(&b'\n') {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => first.extend_from_slice(&buf[..n]),
                }
            }
        };
        let _ = tokio::time::timeout(wait, read).await;
        let text = String::from_utf8_lossy(&first);
        let line = text.lines().next().unwrap_or("");
        // The server's words, printable ASCII only: they end up in terminals and logs.
        let line: String = line.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').collect();
        line.starts_with(TOO_MANY_CONNECTIONS).then(|| format!("{host}: {line}"))
    };
    let all = futures::future::join_all(url.hosts.iter().cloned().map(probe)).await;
    let lines: Option<Vec<String>> = all.into_iter().collect();
    lines.filter(|l| !l.is_empty()).map(|l| format!("the server refused the connection: {}", l.join("; ")))
}

impl Client {
    /// Connects to the ensemble named by a `zk://` URL and establishes a session.
    ///
    /// # Notable errors
    /// - [`Error::InvalidUrl`] when the URL does not parse (the message names the bad part);
    /// - [`Error::Connect`] when no server answered within the URL's `connect_timeout` (see
    ///   [`nobody_listens`] to learn sooner that nothing listens at all).
    pub async fn connect(url: &str) -> Result<Client> {
        let parsed = ZkUrl::parse(url)?;
        Self::connect_url(parsed).await
    }

    /// Connects with an already parsed [`ZkUrl`].
    pub async fn connect_url(url: ZkUrl) -> Result<Client> {
        let connect_string = url.connect_string();
        let started = tokio::time::Instant::now();
        let mut connector = zk::Client::connector()
            .with_session_timeout(url.session_timeout)
            .with_connection_timeout(url.connect_timeout);
        match &url.auth {
            None => {}
            Some(ZkAuth::Digest { user, password }) => {
                connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
            }
            Some(ZkAuth::Sasl { user, password }) => {
                connector = connector.with_sasl(zk::SaslOptions::digest_md5(user.clone(), password.clone()));
            }
        }
        let connect = if url.tls {
            let connector = connector.with_tls(tls_options(&url)?);
            futures::future::Either::Left(async move { connector.secure_connect(&connect_string).await })
        } else {
            futures::future::Either::Right(async move { connector.connect(&connect_string).await })
        };
        // The client retries endpoints on its own (a server that is starting or restarting
        // comes up meanwhile); bound the whole attempt by the connect timeout.
        let bound = url.connect_timeout;
        let attempt = async {
            tokio::select! {
                r = connect => r.map_err(|e| explain(&url, &e)),
                why = trouble(&url) => Err(why),
            }
        };
        let zk = match tokio::time::timeout(bound, attempt).await {
            Ok(Ok(zk)) => zk,
            Ok(Err(reason)) => return Err(Error::Connect { url: url.to_string(), reason }),
            Err(_) => {
                // Too soon for `trouble` to have learnt it (a connect timeout under a second and
                // a half, say): a server refusing us for too many connections is still worth
                // naming, asked briefly.
                let asked = bound >= TROUBLE_AFTER + 2 * REFUSAL_PROBE;
                let late = if asked { None } else { refused(&url, LATE_REFUSAL_PROBE).await };
                let reason = match late {
                    Some(why) => format!("{}: {why}", no_session(&url)),
                    None => no_session(&url),
                };
                return Err(Error::Connect { url: url.to_string(), reason });
            }
        };
        if url.auth.is_none() {
            // A server that requires a login ends a session without one at its first request:
            // learn it now, as a connect error, rather than as a lock's loss later.
            let asked = tokio::time::timeout(bound, zk.check_stat("/")).await;
            if let Ok(Err(e @ zk::Error::AuthFailed)) = asked {
                return Err(Error::Connect { url: url.to_string(), reason: explain(&url, &e) });
            }
        }
        tracing::debug!(url = %url, session = %zk.session_id(), "connected to ZooKeeper");
        let timeout = zk.session_timeout();
        let margin = granted_margin(&url, timeout)?;
        let lease = Arc::new(session::Lease::new(started, timeout, margin));
        let inner = Arc::new(Inner {
            zk,
            url,
            owner: Owner::current().encode(),
            metrics: Metrics::default(),
            lease,
            listings: tokio::sync::Semaphore::new(LISTINGS_IN_FLIGHT),
            monitor: monitor::Monitor::default(),
        });
        tokio::spawn(session::heartbeat(Arc::downgrade(&inner)));
        Ok(Client { inner })
    }

    /// An exclusive lock on `path` (e.g. `/locks/orders`), sharing this session.
    ///
    /// The path is the lock's directory: contenders queue as its children, in Apache Curator's
    /// InterProcessMutex format, so a Curator client on the same path takes part in the same queue.
    ///
    /// # Notable errors
    /// [`Error::InvalidLockPath`] when `path` is not an absolute znode path.
    pub fn mutex(&self, path: &str) -> Result<Mutex> {
        Mutex::new(self.clone(), path)
    }

    /// A reentrant mutex on `path`: the handle is the owner (see [`ReentrantMutex`]).
    ///
    /// # Notable errors
    /// [`Error::InvalidLockPath`] when `path` is not an absolute znode path.
    pub fn reentrant_mutex(&self, path: &str) -> Result<ReentrantMutex> {
        Ok(ReentrantMutex::new(self.mutex(path)?))
    }

    /// The naive single-node lock (a benchmark baseline only; see [`NaiveLock`]).
    pub fn naive_lock(&self, path: &str) -> Result<NaiveLock> {
        NaiveLock::new(self.clone(), path)
    }

    /// A read/write lock on `path`, sharing this session (Curator's InterProcessReadWriteLock
    /// layout).
    ///
    /// # Notable errors
    /// [`Error::InvalidLockPath`] when `path` is not an absolute znode path.
    pub fn rwlock(&self, path: &str) -> Result<RwLock> {
        RwLock::new(self.clone(), path)
    }

    /// A semaphore with `permits` permits on `path` (Curator's InterProcessSemaphoreV2 layout).
    ///
    /// # Notable errors
    /// [`Error::InvalidLockPath`] for a bad path, [`Error::InvalidArgument`] for 0 permits.
    pub fn semaphore(&self, path: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(self.clone(), path, permits)
    }

    /// A non-reentrant mutex whose guard any task may release: a one-permit [`Semaphore`]
    /// (Curator's InterProcessSemaphoreMutex).
    pub fn semaphore_mutex(&self, path: &str) -> Result<Semaphore> {
        Semaphore::new(self.clone(), path, 1)
    }

    /// Asks the holder of the lock node `node_path` to release it, by writing `__REVOKE__` into
    /// the node (the ZooKeeper revocation recipe, as Curator does it). Holders opt in by awaiting
    /// their guard's `revocation_requested()`; others ignore it.
    ///
    /// # Notable errors
    /// [`Error::Backend`] with `NoNode` if the node is gone.
    pub async fn revoke(&self, node_path: &str) -> Result<()> {
        let path = url::lock_path(node_path)?;
        self.inner.metrics.sent(1);
        self.inner.zk.set_data(&path, guard::REVOKE, None).await.map_err(|e| backend("setData", &path, e))?;
        Ok(())
    }

    /// The session id, as ZooKeeper prints it (hex).
    pub fn session_id(&self) -> String {
        format!("{:#x}", self.inner.zk.session_id().0)
    }

    /// The negotiated session timeout.
    pub fn session_timeout(&self) -> Duration {
        self.inner.zk.session_timeout()
    }

    /// The lease deadline of this session: the last instant at which the server provably cannot
    /// yet have expired it (and handed its locks on), given the replies received so far. Every
    /// guard's [`lease_deadline`](MutexGuard::lease_deadline) is this instant. It moves forward
    /// while the server answers (a heartbeat renews it while locks are held) and stands still
    /// while the server is unreachable.
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.inner.lease.deadline().into_std()
    }

    /// How many lock nodes of this session the session's monitor follows now: one per held guard
    /// whose state was asked for (`state()`, `lost()`, `state_changes()`,
    /// `revocation_requested()`), until it is released, dropped or lost. For tests; hidden and
    /// outside semver.
    #[doc(hidden)]
    pub fn watched_nodes(&self) -> usize {
        self.inner.monitor.watched()
    }

    /// The URL this client connected with.
    pub fn url(&self) -> &ZkUrl {
        &self.inner.url
    }

    /// Counters of the requests this client's locks made; see [`Metrics`].
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The underlying `zookeeper-client` session, for operations distlock does not wrap.
    ///
    /// **An escape hatch outside distlock's semver**: its type is the ZooKeeper client crate's,
    /// so a new major version of that crate may change it in a minor release of distlock. The
    /// rest of the API names no driver type.
    pub fn zookeeper(&self) -> &zk::Client {
        &self.inner.zk
    }

    /// Closes the session now (rather than when the last clone drops), so the server deletes
    /// this session's lock nodes at once. Waits at most `bound` for the server to confirm.
    ///
    /// Other clones of this client, and the guards made from it, keep the session alive: this
    /// only waits for the close when this is the last user.
    pub async fn close(self, bound: Duration) {
        let mut states = self.inner.zk.state_watcher();
        drop(self);
        let _ = tokio::time::timeout(bound, async {
            loop {
                match states.changed().await {
                    zk::SessionState::Closed | zk::SessionState::Expired | zk::SessionState::AuthFailed => return,
                    _ => continue,
                }
            }
        })
        .await;
    }

    pub(crate) fn zk(&self) -> &zk::Client {
        &self.inner.zk
    }

    /// Creates the lock directory `dir` (a container) and its missing ancestors. With
    /// `acl=creator` only `dir` is the login's: the ancestors are shared by every lock under
    /// them (`/distlock`…), so they stay open, or the first login to make one would keep every
    /// other login's locks out of it.
    pub(crate) async fn make_lock_dir(&self, dir: &str) -> std::result::Result<(), zk::Error> {
        let open = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        if self.inner.url.acl == AclMode::Open {
            return self.zk().mkdir(dir, &open).await;
        }
        if let Some((parent, _)) = dir.rsplit_once('/').filter(|(parent, _)| !parent.is_empty()) {
            match self.zk().mkdir(parent, &open).await {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(e),
            }
        }
        let own = zk::CreateMode::Container.with_acls(self.acls());
        self.zk().create(dir, b"", &own).await.map(|_| ())
    }

    /// With `acl=creator`, the first entry of a lock directory's ACL that lets someone other
    /// than this login change it (write, create, delete or set the ACL), as `scheme:id:perms`:
    /// a directory someone else made first, open, would let them queue ahead or delete the
    /// holder's node. `None` when only this login may (or with `acl=open`, which lets anyone).
    pub(crate) fn foreign_entry(&self, acls: &[zk::Acl]) -> Option<String> {
        if self.inner.url.acl != AclMode::Creator {
            return None;
        }
        // A session with a client certificate is also its certificate's `x509` identity (Apache
        // ZooKeeper's default TLS auth provider), which the `auth` ACL of our own nodes names too.
        let certified = self.inner.url.tls_files.cert.is_some();
        let ours = |scheme: &str, id: &str| match self.inner.url.auth.as_ref() {
            _ if scheme == "x509" && certified => true,
            Some(ZkAuth::Digest { user, password }) => scheme == "digest" && id == digest_id(user, password),
            Some(ZkAuth::Sasl { user, .. }) => scheme == "sasl" && id == user,
            None => false,
        };
        let changes = [zk::Permission::WRITE, zk::Permission::CREATE, zk::Permission::DELETE, zk::Permission::ADMIN];
        acls.iter()
            .find(|a| changes.iter().any(|p| a.permission().has(*p)) && !ours(a.scheme(), a.id()))
            .map(|a| format!("{}:{}:{}", a.scheme(), a.id(), a.permission()))
    }

    /// The ACL of the nodes this client creates (the URL's `acl=`).
    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        /// The session's identities may do anything; anyone may read.
        static CREATOR_ALL_ANYONE_READ: [zk::Acl; 2] = [
            zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
            zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
        ];
        match self.inner.url.acl {
            AclMode::Open => zk::Acls::anyone_all(),
            AclMode::Creator => zk::Acls::new(&CREATOR_ALL_ANYONE_READ),
        }
    }

    /// After a `NoNode` on `path`: the error to report if the URL's chroot itself is missing.
    pub(crate) async fn missing_chroot(&self, path: &str) -> Option<Error> {
        let chroot = self.inner.url.chroot.as_deref()?;
        match self.inner.zk.check_stat("/").await {
            Ok(None) => Some(Error::InvalidLockPath {
                path: path.to_string(),
                reason: format!(
                    "the backend URL's chroot {chroot} does not exist on the server; create it first \
                     (e.g. zkCli.sh create {chroot}) or drop it from the URL"
                ),
            }),
            _ => None,
        }
    }

    pub(crate) fn owner_data(&self) -> &[u8] {
        &self.inner.owner
    }

    pub(crate) fn lease(&self) -> &session::Lease {
        &self.inner.lease
    }
}

/// Counters of what this client's lock operations cost, for tests and benchmarks.
///
/// - `requests`: requests sent to the server by lock operations;
/// - `round_trips`: times a lock operation had to wait for a reply before going on (requests
///   pipelined together count as one);
/// - `watch_wakeups`: watch events delivered to waiting contenders.
///
/// # Examples
///
/// ```
/// let m = distlock::zookeeper::Metrics::default();
/// assert_eq!(m.snapshot().round_trips, 0);
/// ```
#[derive(Debug, Default)]
pub struct Metrics {
    requests: AtomicU64,
    round_trips: AtomicU64,
    watch_wakeups: AtomicU64,
}

/// A copy of [`Metrics`] at one moment.
///
/// # Examples
///
/// ```
/// let a = distlock::zookeeper::MetricsSnapshot { requests: 5, round_trips: 3, watch_wakeups: 1 };
/// let b = distlock::zookeeper::MetricsSnapshot { requests: 2, round_trips: 1, watch_wakeups: 0 };
/// assert_eq!((a - b).round_trips, 2);
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Requests sent.
    pub requests: u64,
    /// Round trips waited for.
    pub round_trips: u64,
    /// Watch events delivered to waiters.
    pub watch_wakeups: u64,
}

impl std::ops::Sub for MetricsSnapshot {
    type Output = MetricsSnapshot;
    fn sub(self, rhs: Self) -> Self {
        MetricsSnapshot {
            requests: self.requests - rhs.requests,
            round_trips: self.round_trips - rhs.round_trips,
            watch_wakeups: self.watch_wakeups - rhs.watch_wakeups,
        }
    }
}

impl Metrics {
    /// Reads all counters.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            round_trips: self.round_trips.load(Ordering::Relaxed),
            watch_wakeups: self.watch_wakeups.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn sent(&self, requests: u64) {
        self.requests.fetch_add(requests, Ordering::Relaxed);
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn sent_background(&self, requests: u64) {
        self.requests.fetch_add(requests, Ordering::Relaxed);
    }

    pub(crate) fn woke(&self) {
        self.watch_wakeups.fetch_add(1, Ordering::Relaxed);
    }
}

/// Maps a `zookeeper-client` error to ours.
pub(crate) fn backend(op: &'static str, path: &str, e: zk::Error) -> Error {
    match e {
        zk::Error::SessionExpired => Error::SessionExpired,
        zk::Error::ClientClosed => Error::Closed,
        e => Error::Backend { op, path: path.to_string(), source: Box::new(e) },
    }
}

/// ZooKeeper's id of a `digest` login: `user:` and the base64 of SHA-1 of `user:password`.
/// (The server takes the user as what comes before the first `:` of `user:password`.)
fn digest_id(user: &str, password: &str) -> String {
    use base64::Engine;
    use sha1::Digest;
    let auth = format!("{user}:{password}");
    let hash = sha1::Sha1::digest(auth.as_bytes());
    let user = auth.split(':').next().unwrap_or_default();
    format!("{user}:{}", base64::engine::general_purpose::STANDARD.encode(hash))
}

#[cfg(test)]
assert_send_sync_static!(MutexGuard, ReadGuard, WriteGuard, SemaphorePermit, ReentrantGuard, MultiGuard, NaiveGuard);

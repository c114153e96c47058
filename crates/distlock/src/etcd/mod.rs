//! The etcd backend: etcd's lock recipe (the one `etcdctl lock` and Go's `concurrency.Mutex` use)
//! done on the client with KV, Watch and Lease, including the check after the wait that etcd 3.4's
//! own client and Lock RPC lack; fenced by the key's create revision.
//!
//! # Layout
//!
//! Every key is put under the client's session lease, so a client that stops keeping it alive
//! loses its keys (and locks) when the lease expires on the server.
//!
//! | Recipe | Our key | Waits for (keys of the name created before ours) | Held when |
//! |---|---|---|---|
//! | [`Mutex`] `name` | `name/<lease id hex>` (as `etcdctl lock name` and Go's `NewMutex(s, "name")`) | the last one | no key of the name is older |
//! | [`RwLock`] read | `name/read/<16 hex digits>` (Go's `contrib/recipes` `RWMutex`) | the last one that is not a reader's (a mutex's or a writer's) | no mutex or writer key is older |
//! | [`RwLock`] write | `name/write/<16 hex digits>` | the last one | no key of the name is older |
//! | [`Semaphore`] `name`, `n` permits | `name/<lease id hex>_<16 hex digits>` | any deletion under `name/` | fewer than `n` older permits |
//!
//! The keys of a longer name (`name/x/…`, lock `name/x`) are another lock's: nobody waits for
//! them (`etcdctl lock name` does, as it counts every key under the prefix). A mutex, readers and
//! writers of one name are one lock; a semaphore's permit older than a lock's key, or a lock's key
//! older than a permit, refuses the later acquire with [`Error::KindConflict`] (`kinds.rs`). A
//! name may not end in `/read` or `/write`: its keys would be a reader's or writer's.
//!
//! The key is created in one transaction (`If CreateRevision(key) == 0 Then Put(key, lease)`)
//! that also reads the keys it must wait for (for a mutex, the newest two: ours and the one just
//! before it), so a free lock costs one round trip and a waiter can start watching at once. A
//! waiter watches only the key just before it (no herd), except the semaphore's, which recounts
//! after any deletion. **After the wait** it reads, in the same request as the keys still older
//! than its own, its own key, and refuses the lock if the key is gone or was re-created (the
//! session expired, or someone deleted it): the Jepsen finding against etcd 3.4, whose
//! server-side Lock RPC grants in that case (`tests/etcd.rs` shows it). A refused or session-less
//! waiter queues again on a new session, within its timeout. A hand-off therefore costs the
//! holder's delete, the watch event and one linearizable read. etcd may register a new watch behind a concurrent write and then serve it from its catch-up
//! loop (every 100 ms); a waiter whose watch may be one of those also reads the key it waits
//! for at growing intervals until the catch-up has run.
//!
//! The fencing token is our key's create revision: cluster-wide, it only rises, and a later
//! holder's key was created after ours. A write guarded by
//! [`Compare::create_revision(key, Equal, token)`](etcd_client::Compare::create_revision) (see
//! [`LockGuard::txn_if_held`]) is refused once the lock has passed on.
//!
//! # Leases and loss
//!
//! One lease per client (the URL's `ttl`), kept alive every third of the TTL by one task for all
//! locks (see the session's notes in the source). A guard's [`lease_deadline`](LockGuard::lease_deadline)
//! is the send time of the last answered keep-alive plus the TTL, less a drift margin;
//! [`lost`](LockGuard::lost) resolves there if no keep-alive was answered since, or at once when
//! the server says the lease is gone (revoked or expired). A lost session is not revived: the
//! client grants a new lease for later acquires.
//!
//! Each held key is watched from the revision after its creation, on the client's one watch
//! stream for all its held keys (`own_keys.rs`): its deletion by anyone is a loss told at once,
//! `NodeDeleted`, or `SessionExpired` when the session's lease went with it.
//!
//! Two acquires of one mutex through one client queue locally first (they would share the key
//! `name/<lease id hex>`), then in etcd.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! let etcd = distlock::etcd::Client::connect("etcd://127.0.0.1:2379?ttl=10s").await?;
//! let guard = etcd.mutex("orders")?.lock().await?;
//! println!("key {}, token {}", guard.key(), guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub(crate) mod contract;
mod election;
mod guard;
mod jobs;
mod kinds;
mod mutex;
mod own_keys;
mod queue;
mod rwlock;
mod semaphore;
mod session;
mod url;

/// The etcd client crate [`Client::etcd`] hands out, re-exported so that its version is
/// distlock's.
///
/// **An escape hatch outside distlock's semver**, as [`Client::etcd`] is.
pub use etcd_client;
pub use guard::LockGuard;
pub use mutex::Mutex;
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use url::EtcdUrl;

use crate::{Error, Result};
use session::Session;
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

/// An etcd cluster to take locks on, with this client's session lease. Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let etcd = distlock::etcd::Client::connect("etcd://127.0.0.1:2379").await?;
/// if let Some(g) = etcd.mutex("reports")?.try_lock().await? {
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    url: EtcdUrl,
    etcd: etcd_client::Client,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Local queues for session-named keys, by key prefix.
    gates: StdMutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
    /// The watches on our held keys: one stream for all of them.
    own_keys: Arc<own_keys::OwnKeys>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.own_keys.stop();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("url", &self.inner.url).finish()
    }
}

impl Client {
    /// Connects to the cluster named by an `etcd://` URL (see [`EtcdUrl`]) and grants the
    /// session lease (which proves the cluster answers).
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_common(url, &Default::default()).await
    }

    /// As [`connect`](Self::connect), with `over`'s values (from [`crate::ConnectOptions`]) in
    /// place of the URL's.
    pub(crate) async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
        Client::connect_url(EtcdUrl::parse_with(url, over)?).await
    }

    /// Connects with a parsed URL.
    pub async fn connect_url(url: EtcdUrl) -> Result<Client> {
        let shown = url.to_string();
        let failed = |reason: String| Error::Connect { url: shown.clone(), reason };
        let mut options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(url.connect_timeout)
            // HTTP/2 pings find a dead connection (etcd refuses pings more often than every 5 s).
            .with_keep_alive(Duration::from_secs(6), Duration::from_secs(3))
            .with_keep_alive_while_idle(true);
        if let Some((name, password)) = &url.user {
            options = options.with_user(name, password);
        }
        if url.tls {
            let pem = url.tls_files.read()?;
            let mut tls = etcd_client::TlsOptions::new();
            tls = match &pem.ca {
                Some(ca) => tls.ca_certificate(etcd_client::Certificate::from_pem(ca)),
                None => tls.with_native_roots(),
            };
            if let Some((cert, key)) = &pem.identity {
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        // Every member refusing is reported at once (the client would try until its timeout:
        // its channel connects lazily, so the first request, the session's lease, is raced).
        let hosts: Vec<String> =
            url.endpoints.iter().map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h).to_string()).collect();
        let tls = url.tls;
        let bound = url.connect_timeout;
        let connecting = async {
            let etcd = tokio::time::timeout(bound, etcd_client::Client::connect(&url.endpoints, Some(options)))
                .await
                .map_err(|_| failed(format!("no answer within {bound:?}")))?
                .map_err(|e| failed(crate::tls::explain(error_text(&e), tls, "etcds://")))?;
            let client = Client {
                inner: Arc::new(Inner {
                    url: url.clone(),
                    own_keys: own_keys::OwnKeys::new(etcd.clone()),
                    etcd,
                    session: tokio::sync::Mutex::new(None),
                    gates: StdMutex::new(HashMap::new()),
                }),
            };
            tokio::time::timeout(bound, client.session_within(bound))
                .await
                .map_err(|_| failed(format!("no lease granted within {bound:?}")))?
                .map_err(|e| failed(crate::tls::explain(e.to_string(), tls, "etcds://")))?;
            Ok::<Client, Error>(client)
        };
        let client = tokio::select! {
            biased; // a client that connected is never dropped for a probe finishing with it
            client = connecting => client?,
            why = crate::listening::nobody_listens(&hosts) => return Err(failed(why)),
            why = crate::listening::tls_trouble(&hosts, tls.then_some(&url.tls_files), "etcds://", None, Duration::from_millis(300)) => {
                return Err(failed(why))
            }
        };
        Ok(client)
    }

    /// The URL this client connected with.
    pub fn url(&self) -> &EtcdUrl {
        &self.inner.url
    }

    /// The session lease's TTL: how long the server keeps a silent holder's keys at most.
    pub fn lease(&self) -> Duration {
        self.inner.url.ttl
    }

    /// The underlying `etcd-client` handle, for guarded writes and anything else.
    ///
    /// **An escape hatch outside distlock's semver**: its type is `etcd-client`'s, so a new
    /// major version of that crate may change it in a minor release of distlock. The rest of
    /// the API names no driver type.
    pub fn etcd(&self) -> etcd_client::Client {
        self.inner.etcd.clone()
    }

    /// The current session's lease id, granting a new lease if there is none or it was lost.
    pub async fn lease_id(&self) -> Result<i64> {
        Ok(self.session().await?.id)
    }

    /// A mutex on prefix `name` (as `etcdctl lock name`).
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        check_name(name)?;
        Ok(Mutex::new(self.clone(), name.to_string()))
    }

    /// A read/write lock on prefix `name`.
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        check_name(name)?;
        Ok(RwLock::new(self.clone(), name.to_string()))
    }

    /// A semaphore of `permits` permits on prefix `name`.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        check_name(name)?;
        if permits == 0 {
            return Err(Error::InvalidArgument {
                what: "permits",
                reason: "a semaphore needs at least 1 permit".into(),
            });
        }
        Ok(Semaphore::new(self.clone(), name.to_string(), permits))
    }

    /// Revokes the session lease (deleting every key of this client at once) and stops keeping
    /// it alive; waits at most `bound`.
    pub async fn close(self, bound: Duration) {
        let session = self.inner.session.lock().await.take();
        if let Some(s) = session {
            s.stop();
            let mut etcd = self.inner.etcd.clone();
            let _ = tokio::time::timeout(bound, etcd.lease_revoke(s.id)).await;
        }
    }

    /// The live session, or a new one.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        self.session_within(self.inner.url.timeout).await
    }

    /// The live session, or a new one granted within `bound`: a grant that fails on the
    /// connection (a member down: the channel may have picked it) is sent again, when the channel
    /// may pick another member, until the bound.
    async fn session_within(&self, bound: Duration) -> Result<Arc<Session>> {
        let mut current = self.inner.session.lock().await;
        if let Some(s) = current.as_ref().filter(|s| s.live()) {
            return Ok(s.clone());
        }
        if let Some(old) = current.take() {
            tracing::info!(lease = format_args!("{:x}", old.id), "etcd session lost; granting a new lease");
            old.stop();
        }
        let url = &self.inner.url;
        let deadline = tokio::time::Instant::now() + bound;
        let mut pause = Duration::from_millis(10);
        let s = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match Session::grant(self.inner.etcd.clone(), url.ttl, left).await {
                Ok(s) => break s,
                Err(e) if transient(&e) && tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(error = %e, "lease grant failed on the connection; sending it again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(backend("lease grant", "session", e)),
            }
        };
        *current = Some(s.clone());
        Ok(s)
    }

    /// The watches on our held keys.
    pub(crate) fn own_keys(&self) -> &Arc<own_keys::OwnKeys> {
        &self.inner.own_keys
    }

    /// The local queue for keys named after the session under `prefix`.
    pub(crate) fn gate(&self, prefix: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = gates.get(prefix).and_then(Weak::upgrade) {
            return g;
        }
        if gates.len() >= 64 {
            gates.retain(|_, g| g.strong_count() > 0);
        }
        let g = Arc::new(tokio::sync::Mutex::new(()));
        gates.insert(prefix.to_string(), Arc::downgrade(&g));
        g
    }

    /// Runs a request bounded by the URL's `timeout` in all, sending it again after a
    /// connection-level failure (see [`retry`]); the request must be safe to send twice (the
    /// closure gets the attempt number, from 0).
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, name: &str, f: F) -> Result<T>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        retry(self.inner.url.timeout, op, name, f).await
    }
}

impl Client {
    /// Runs a request that may not be safe to repeat, bounded by the URL's `timeout`: sent again
    /// only when it never left (the connection to the member chosen could not be made).
    pub(crate) async fn call_once<T, F, Fut>(&self, op: &'static str, name: &str, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let unsent = |e: &etcd_client::Error| format!("{e:?}").contains("ConnectError");
        let result = retry(self.inner.url.timeout, op, name, |_| {
            let fut = f();
            async move {
                match fut.await {
                    Err(e) if !unsent(&e) => Ok(Err(e)),
                    other => other.map(Ok),
                }
            }
        })
        .await?;
        result.map_err(|e| backend(op, name, e))
    }
}

/// Runs `f(attempt)` until it answers, bounded by `bound` in all. A failure of the connection
/// (a member down or restarting, a reset, "no leader" during an election: gRPC `Unavailable`) is
/// tried again after a pause (10 ms, doubling), when the channel may pick another member.
pub(crate) async fn retry<T, F, Fut>(bound: Duration, op: &'static str, name: &str, mut f: F) -> Result<T>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    let (mut attempt, mut pause) = (0, Duration::from_millis(10));
    loop {
        match tokio::time::timeout_at(deadline, f(attempt)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if transient(&e) && tokio::time::Instant::now() + pause < deadline => {
                tracing::debug!(op, lock = name, error = %e, attempt, "etcd request failed; sending it again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
                attempt += 1;
            }
            Ok(Err(e)) => return Err(backend(op, name, e)),
            Err(_) => return Err(Error::unanswered(op, name, format!("no answer within {bound:?}"))),
        }
    }
}

/// A failure of the connection or of the cluster's availability, worth another try.
fn transient(e: &etcd_client::Error) -> bool {
    match e {
        // Cancelled: the connection closed under the request (a reset), as hyper reports it;
        // Unknown with a transport error under it: the connection was reset or broke mid-request.
        etcd_client::Error::GRpcStatus(s) => {
            matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Cancelled)
                || (s.code() == tonic::Code::Unknown && from_transport(s))
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// Whether a status came from the connection breaking under the request (a reset, a broken
/// pipe, an end mid-answer: an I/O error of those kinds somewhere under it). Anything else the
/// transport says (a server that does not speak HTTP/2 or gRPC there) is not tried again.
fn from_transport(s: &tonic::Status) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(io.kind(), ConnectionReset | BrokenPipe | ConnectionAborted | UnexpectedEof);
        }
        source = e.source();
    }
    false
}

fn check_name(name: &str) -> Result<()> {
    crate::contract::check_name(name)?;
    let bad = |reason: &str| Error::InvalidLockPath { path: name.to_string(), reason: reason.to_string() };
    if name.ends_with('/') {
        return Err(bad("the lock name is a key prefix without a trailing '/' (distlock adds it)"));
    }
    if name.len() > 1024 {
        return Err(bad("a lock name has at most 1024 bytes"));
    }
    if name.ends_with("/read") || name.ends_with("/write") {
        // Its keys `name/<lease hex>` would be a reader's or writer's of the name before it.
        return Err(bad(
            "on etcd a name must not end in /read or /write: those keys are the read/write lock of the name before it",
        ));
    }
    Ok(())
}

pub(crate) fn backend(op: &'static str, name: &str, e: etcd_client::Error) -> Error {
    if let etcd_client::Error::GRpcStatus(s) = &e {
        if s.code() == tonic::Code::PermissionDenied {
            return Error::Backend { op, path: name.to_string(), source: permission_denied(op, name).into() };
        }
    }
    if transient(&e) {
        return Error::unanswered(op, name, e.to_string());
    }
    Error::Backend { op, path: name.to_string(), source: Box::new(e) }
}

/// etcd's "permission denied", with the keys the user's role lacks and the grant that gives them.
fn permission_denied(op: &str, name: &str) -> String {
    let keys = if name.is_empty() {
        return "permission denied: listing every lock reads every key; give a PREFIX the user's role may read"
            .to_string();
    } else if op.contains("job") {
        name.to_string()
    } else {
        format!("{name}/")
    };
    format!(
        "permission denied on key prefix {keys}: the etcd user's roles do not grant readwrite on it \
         (etcdctl role grant-permission ROLE --prefix readwrite '{keys}')"
    )
}

/// One key of a lock's queue, from [`Client::inspect`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(etcd: distlock::etcd::Client) -> distlock::Result<()> {
/// for key in etcd.inspect("orders").await?.keys {
///     println!("{} rev {} lease {:x}", key.key, key.create_revision, key.lease);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct KeyView {
    /// The key.
    pub key: String,
    /// Its create revision (the holder's fencing token).
    pub create_revision: i64,
    /// The lease it is put under.
    pub lease: i64,
}

/// A lock as the server sees it, from [`Client::inspect`]: every key under `name/`, oldest
/// first (for a mutex, the first is the holder's and the rest wait in that order).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(etcd: distlock::etcd::Client) -> distlock::Result<()> {
/// let view = etcd.inspect("orders").await?;
/// match view.keys.first() {
///     Some(holder) => println!("held by {} (token {})", holder.key, holder.create_revision),
///     None => println!("free"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LockView {
    /// The lock's name (key prefix).
    pub name: String,
    /// Every key under `name/`, by create revision.
    pub keys: Vec<KeyView>,
    /// The cluster's revision when read.
    pub revision: i64,
}

impl Client {
    /// Every key of lock `name`, oldest first.
    pub async fn inspect(&self, name: &str) -> Result<LockView> {
        check_name(name)?;
        use etcd_client::{GetOptions, SortOrder, SortTarget};
        let prefix = format!("{name}/");
        let etcd = self.etcd();
        let options = GetOptions::new().with_prefix().with_keys_only().with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = self
            .call("inspect", name, |_| {
                let mut etcd = etcd.clone();
                let args = (prefix.clone(), Some(options.clone()));
                async move { etcd.get(args.0, args.1).await }
            })
            .await?;
        let keys = resp
            .kvs()
            .iter()
            .map(|kv| KeyView {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                create_revision: kv.create_revision(),
                lease: kv.lease(),
            })
            .collect();
        Ok(LockView { name: name.to_string(), keys, revision: resp.header().map_or(0, |h| h.revision()) })
    }
}

/// One key of a lock in [`Client::locks`]: its lock's name, recipe and mode.
fn classify(key: &str) -> Option<(&str, &'static str, &'static str)> {
    let (parent, last) = key.rsplit_once('/')?;
    let hex16 = last.len() == 16 && last.bytes().all(|b| b.is_ascii_hexdigit());
    if hex16 {
        if let Some(name) = parent.strip_suffix("/read") {
            return Some((name, "rwlock", "read"));
        }
        if let Some(name) = parent.strip_suffix("/write") {
            return Some((name, "rwlock", "write"));
        }
    }
    if last.contains('_') {
        return Some((parent, "semaphore", "permit"));
    }
    Some((parent, "mutex", "exclusive"))
}

impl Client {
    /// The lock `name` as [`Client::locks`] shows each, or free (for [`crate::Client::inspect`]).
    pub(crate) async fn one_lock(&self, name: &str) -> Result<crate::listing::Listing> {
        use crate::listing::{Found, Listing};
        let listing = self.locks(name).await?;
        let found = listing.locks.into_iter().find(|l| l.name == name);
        let found = found.map_or(Found::Free { recipe: "mutex", last_token: None }, Found::Lock);
        let mut one = Listing::one("etcd", name, found, listing.unseen);
        // Many locks sharing the name as a prefix may have left this one out: say so.
        one.truncated = listing.truncated;
        Ok(one)
    }

    /// Every lock with keys under `prefix` (`etcdctl lock`'s mutex keys `name/<lease>`, read/write
    /// keys `name/read/…` and `name/write/…`, semaphore keys `name/<lease>_…`), in create-revision
    /// order, each key's token its create revision and its lease's time to live.
    pub async fn locks(&self, prefix: &str) -> Result<crate::listing::Listing> {
        use crate::listing::{Entry, Listing, LockInfo, MAX_LOCKS};
        use etcd_client::{GetOptions, SortOrder, SortTarget};
        const MAX_KEYS: i64 = 20_000;
        let etcd = self.etcd();
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(MAX_KEYS);
        let start = if prefix.is_empty() { "\0".to_string() } else { prefix.to_string() };
        let options = if prefix.is_empty() { options.with_all_keys() } else { options };
        let resp = self
            .call("list locks", prefix, |_| {
                let mut etcd = etcd.clone();
                let args = (start.clone(), Some(options.clone()));
                async move { etcd.get(args.0, args.1).await }
            })
            .await?;
        let mut listing = Listing {
            backend: "etcd",
            prefix: prefix.to_string(),
            locks: vec![],
            truncated: resp.more(),
            unseen: vec![
                "owners: etcd records a key's session lease, not its host or pid".into(),
                "hold and wait times: etcd records revisions, not times".into(),
                "a semaphore's permit count is not stored, so its holders and waiters are not told apart".into(),
            ],
        };
        // Each lock with the lease of each of its entries.
        let mut by_name: std::collections::BTreeMap<String, (LockInfo, Vec<i64>)> = Default::default();
        let mut leases: std::collections::HashMap<i64, Option<u64>> = Default::default();
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some((name, recipe, mode)) = classify(&key) else { continue };
            if kv.lease() == 0 || !name.starts_with(prefix) {
                continue; // a lock key is always under a session's lease
            }
            if !by_name.contains_key(name) && by_name.len() == MAX_LOCKS {
                listing.truncated = true;
                continue;
            }
            let (lock, lease_ids) = by_name.entry(name.to_string()).or_insert_with(|| {
                let info = LockInfo {
                    name: name.to_string(),
                    recipe: recipe.into(),
                    permits: None,
                    last_token: None,
                    entries: vec![],
                };
                (info, vec![])
            });
            let mut e = Entry::new(false, mode, format!("lease {:x}", kv.lease()), key.clone());
            e.token = Some(kv.create_revision() as u64);
            leases.entry(kv.lease()).or_insert(None);
            lease_ids.push(kv.lease());
            lock.entries.push(e);
        }
        // The leases' time to live, asked together, each for at most 2 s; at most 256 of them
        // (the rest show no lease left rather than slow every refresh of `top`).
        let asks = leases.keys().take(256).map(|id| {
            let (mut etcd, id) = (self.etcd(), *id);
            async move {
                let r = tokio::time::timeout(Duration::from_secs(2), etcd.lease_time_to_live(id, None)).await;
                (id, r.ok().and_then(|r| r.ok()).and_then(|r| (r.ttl() >= 0).then_some(r.ttl() as u64 * 1000)))
            }
        });
        for (id, ttl) in futures::future::join_all(asks).await {
            leases.insert(id, ttl);
        }
        for (mut lock, lease_ids) in by_name.into_values() {
            // Holders as the recipes grant: a mutex's oldest key; a reader with no older writer;
            // a writer that is the oldest key; every semaphore key (see `unseen`).
            let mut writer_before = false;
            for (i, (e, id)) in lock.entries.iter_mut().zip(lease_ids).enumerate() {
                e.holds = match e.mode.as_str() {
                    "read" => !writer_before,
                    "permit" => true,
                    _ => i == 0,
                };
                writer_before |= e.mode == "write";
                e.lease_left_ms = leases.get(&id).copied().flatten();
                if !e.holds {
                    e.token = None;
                }
            }
            lock.last_token = lock.entries.iter().filter_map(|e| e.token).max();
            listing.locks.push(lock);
        }
        Ok(listing)
    }
}

/// An etcd client error in words: its message and those of its causes (a TLS failure is a few
/// causes down a transport error), each once.
fn error_text(e: &etcd_client::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
assert_send_sync_static!(LockGuard);

#[cfg(test)]
mod tests {
    use super::*;

    /// A request cut by a reset comes back in one of three shapes; each is sent again. A status
    /// the server gave is not.
    #[test]
    fn a_request_cut_by_the_connection_is_tried_again() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let cut = tonic::Status::from_error(Box::new(reset));
        assert_eq!(cut.code(), tonic::Code::Unknown);
        assert!(transient(&etcd_client::Error::GRpcStatus(cut)));
        assert!(transient(&etcd_client::Error::GRpcStatus(tonic::Status::cancelled("operation was canceled"))));
        assert!(transient(&etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"))));
        assert!(!transient(&etcd_client::Error::GRpcStatus(tonic::Status::unknown("something else"))));
        let garbled = std::io::Error::new(std::io::ErrorKind::InvalidData, "not HTTP/2");
        assert!(!transient(&etcd_client::Error::GRpcStatus(tonic::Status::from_error(Box::new(garbled)))));
        assert!(!transient(&etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("no"))));
    }
}

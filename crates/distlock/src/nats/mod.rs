//! The NATS backend: locks on a JetStream key-value bucket, each lock one key whose per-key TTL
//! (`Nats-TTL`, NATS 2.11 and later) is its lease, written only by guarded publishes; fenced by
//! the create's stream sequence.
//!
//! # Layout
//!
//! One bucket (the URL's path, default `distlock`), whose stream distlock creates when missing:
//! file storage, one message per key (`history: 1`), per-message TTLs allowed, expiry markers
//! on (a key that expires leaves a marker that wakes watchers), direct gets off (every read is
//! answered by the stream's leader, never a lagging replica), and its first sequence set from
//! the clock in microseconds, so that a bucket deleted and made again starts above every token
//! the old one handed out. A bucket made otherwise is refused ([`Client::connect`] names what
//! differs).
//!
//! | Recipe | Key | Value |
//! |---|---|---|
//! | [`Mutex`] `name` | `locks.<name>` | `{"owner","token","value"}` (JSON) |
//! | once-per-slot job `name` | `jobs.<name>` | the job's lock row and run record (JSON) |
//!
//! Names are written into keys byte for byte where NATS allows the byte (`A-Z a-z 0-9 - _ /`),
//! every other byte as `=XX` (its hex), so any printable name is a key and a listing reads the
//! name back.
//!
//! **Acquire**: a publish to the key with `Nats-Expected-Last-Subject-Sequence` (the key's last
//! sequence: 0 when it has none, else the sequence of the delete or expiry marker it ended with)
//! and `Nats-TTL`. NATS refuses it (`wrong last sequence`) if anything else was written to the key
//! since; then the key is read (from the stream's leader): a live value is a holder, and a
//! waiter watches the key from the sequence after it, so that the holder's delete or expiry is
//! delivered to it however soon it comes (no polling). `async-nats`'s `create_with_ttl` is not
//! used: after a delete it falls back to a write without the TTL, a lock that would never expire.
//!
//! **Fencing**: the token is the stream sequence of the create. The stream's sequence only rises,
//! for every key of the bucket, across a purge and a server restart (with `sync_interval:
//! always`, see below), and the create of a later holder comes after the delete or expiry of the
//! earlier one.
//!
//! # Leases and loss
//!
//! A NATS key is not bound to a connection: only its TTL frees it. The server stamps each write
//! with its own clock and removes the key once that time plus the TTL has passed (checked on
//! nats-server 2.15.1: a 2 s key renewed after 1 s expired 2.01 s after the renewal's send), so
//! the key cannot go before the send time of the last acknowledged write plus the TTL. A guard's
//! [`lease_deadline`](LockGuard::lease_deadline) is that, less the drift margin
//! (`lease_margin.rs`: 2 % of the TTL plus 2 ms). The client's watchdog renews each hold every
//! third of the TTL with a guarded publish at the key's last sequence; a renewal NATS refuses
//! (someone else wrote the key) is a loss told at once, `KeyDeleted`; none answered by the
//! deadline is `LeaseExpired`. The server's clock must be slewed, not stepped (NTP's default):
//! a step forward ends keys early.
//!
//! # Durability
//!
//! NATS acknowledges a write before it is on disk unless the server runs with
//! `jetstream { sync_interval: always }`; without it an OS crash or power loss loses
//! acknowledged grants (two holders) and hands out a lost token again. See docs/backends/nats.md.

pub(crate) mod contract;
mod election;
mod hold;
mod jobs;
mod kinds;
mod mutex;
mod rwlock;
mod semaphore;
mod url;

/// The NATS client crate [`Client::nats`] hands out, re-exported so that its version is
/// distlock's.
///
/// **An escape hatch outside distlock's semver**, as [`Client::nats`] is.
pub use async_nats;
pub use hold::LockGuard;
pub use mutex::Mutex;
pub use rwlock::RwLock;
pub use semaphore::Semaphore;
pub use url::NatsUrl;

use crate::{Error, Result};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::kv::{Entry, Operation, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

/// A NATS server or cluster to take locks on, in one KV bucket. Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let nats = distlock::nats::Client::connect("nats://127.0.0.1:4222/locks?ttl=10s").await?;
/// let guard = nats.mutex("orders")?.lock().await?;
/// println!("token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) url: NatsUrl,
    pub(crate) nats: async_nats::Client,
    pub(crate) js: async_nats::jetstream::Context,
    pub(crate) kv: Store,
    /// Renews every hold of this client.
    pub(crate) watchdog: Arc<crate::watchdog::Watchdog<hold::Renew>>,
    /// The last sequence of keys this client deleted (a first guess for the next create of
    /// them, which saves a read), at most [`HINTS`] of them.
    hints: StdMutex<HashMap<String, u64>>,
    /// The holds of this client, by holder id (for an election's announcement).
    pub(crate) holds: StdMutex<HashMap<String, std::sync::Weak<hold::HoldState>>>,
    /// How many times the connection has dropped (async-nats's `Disconnected` events).
    drops: Arc<tokio::sync::watch::Sender<u64>>,
}

/// At most this many hints are kept (then they are forgotten all at once).
const HINTS: usize = 4096;

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("url", &self.inner.url).finish()
    }
}

/// What a guarded write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// Written, at this sequence.
    At(u64),
    /// Refused: the key's last sequence was not the one expected.
    Moved,
}

impl Client {
    /// Connects to the servers named by a `nats://` URL (see [`NatsUrl`]), and opens the bucket
    /// (creating it when missing).
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_common(url, &Default::default()).await
    }

    /// As [`connect`](Self::connect), with `over`'s values (from [`crate::ConnectOptions`]) in
    /// place of the URL's.
    pub(crate) async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
        Client::connect_url(NatsUrl::parse_with(url, over)?).await
    }

    /// Connects with a parsed URL.
    pub async fn connect_url(url: NatsUrl) -> Result<Client> {
        let shown = url.to_string();
        let failed = |reason: String| Error::Connect { url: shown.clone(), reason };
        let mut options = async_nats::ConnectOptions::new()
            .name("distlock")
            .connection_timeout(url.connect_timeout)
            .request_timeout(Some(url.timeout))
            // A silent connection is found dead after about three pings: within the TTL.
            .ping_interval((url.ttl / 4).max(Duration::from_secs(1)))
            // Reconnects back off as async-nats's do (0, 2, 4, … ms), but never wait more than a
            // tenth of the TTL between tries (its default waits up to 4 s): a lock whose server
            // is back must be renewed before its lease runs out.
            .reconnect_delay_callback(reconnect_delay(
                (url.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(4)),
            ));
        // A drop ends the requests sent before it (`answered`): async-nats keeps them open across
        // the reconnect, and an answer lost with the old connection never comes.
        let drops = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let counted = drops.clone();
        options = options.event_callback(move |event| {
            let counted = counted.clone();
            async move {
                if matches!(event, async_nats::Event::Disconnected) {
                    counted.send_modify(|n| *n += 1);
                }
            }
        });
        options = match &url.login {
            url::Login::None => options,
            url::Login::User(u, p) => options.user_and_password(u.clone(), p.clone()),
            url::Login::Token(t) => options.token(t.clone()),
            url::Login::Nkey(path) => options.nkey(url::read_seed(path).map_err(failed)?),
            url::Login::Creds(path) => url::with_creds(options, path).await.map_err(failed)?,
        };
        if url.tls {
            let pem = url.tls_files.read()?;
            let config = crate::tls::client_config(&pem, crate::tls::Verify::Full)?;
            options = options.require_tls(true).tls_client_config(config);
        }
        let hosts: Vec<String> =
            url.servers.iter().map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h).to_string()).collect();
        let tls = url.tls;
        let bound = url.connect_timeout;
        let connecting = async {
            let nats = tokio::time::timeout(bound, options.connect(url.servers.clone()))
                .await
                .map_err(|_| failed(format!("no answer within {bound:?}")))?
                .map_err(|e| {
                    let text = crate::tls::explain(error_text(&e), tls, "natss://");
                    // async-nats takes up TLS on its own when the server requires it.
                    match !tls && text.contains("certificate") {
                        true => failed(format!("{text}; the server requires TLS: write natss://…?cacert=")),
                        false => failed(text),
                    }
                })?;
            let js = async_nats::jetstream::ContextBuilder::new().timeout(url.timeout).build(nats.clone());
            let kv = tokio::time::timeout(bound, bucket(&js, &url))
                .await
                .map_err(|_| failed(format!("the bucket {} not opened within {bound:?}", url.bucket)))??;
            Ok::<Client, Error>(Client {
                inner: Arc::new(Inner {
                    watchdog: Arc::new(crate::watchdog::Watchdog::new(url.ttl / 3)),
                    url: url.clone(),
                    nats,
                    js,
                    kv,
                    hints: StdMutex::default(),
                    holds: StdMutex::default(),
                    drops,
                }),
            })
        };
        let client = tokio::select! {
            biased;
            client = connecting => client?,
            why = crate::listening::nobody_listens(&hosts) => return Err(failed(why)),
            why = crate::listening::tls_trouble(&hosts, tls.then_some(&url.tls_files), "natss://", Some(b"INFO "), Duration::from_millis(300)) => {
                return Err(failed(why))
            }
        };
        Ok(client)
    }

    /// The URL this client connected with.
    pub fn url(&self) -> &NatsUrl {
        &self.inner.url
    }

    /// Each lock key's TTL: how long the server keeps a silent holder's lock at most.
    pub fn lease(&self) -> Duration {
        self.inner.url.ttl
    }

    /// The underlying `async-nats` client, for anything else.
    ///
    /// **An escape hatch outside distlock's semver**: its type is `async-nats`'s, so a new
    /// version of that crate may change it in a minor release of distlock.
    pub fn nats(&self) -> async_nats::Client {
        self.inner.nats.clone()
    }

    /// A mutex named `name` (the key `locks.<name>` of the bucket).
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        check_name(name)?;
        Ok(Mutex::new(self.clone(), name.to_string()))
    }

    /// A read/write lock named `name` (its writer shares the mutex's key `locks.<name>`).
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        check_name(name)?;
        Ok(RwLock::new(self.clone(), name.to_string()))
    }

    /// A semaphore of `permits` permits named `name` (keys `permits.<name>.<i>`).
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        check_name(name)?;
        if permits == 0 || permits > 1000 {
            return Err(Error::InvalidArgument {
                what: "permits",
                reason: "a NATS semaphore has 1 to 1000 permits (one key each)".into(),
            });
        }
        Ok(Semaphore::new(self.clone(), name.to_string(), permits))
    }

    /// Flushes what is sent and closes the connection, waiting at most `bound`. Holds still
    /// held are not released: their keys expire after the TTL.
    pub async fn close(self, bound: Duration) {
        let _ = tokio::time::timeout(bound, self.inner.nats.flush()).await;
    }

    /// A guarded write of `key`: expected last sequence `expect` (0: the key has no message),
    /// with the TTL (`ttl`) or as a delete (`!ttl`), bounded by the URL's timeout. `Err` is a
    /// failure whose outcome is unknown (no answer, the connection) or a refusal of another
    /// kind.
    pub(crate) async fn write(&self, key: &str, expect: u64, value: Option<Vec<u8>>) -> Result<Wrote> {
        self.publish(key, expect, value, true).await
    }

    /// [`write`](Self::write), a value written without a TTL when `!ttl` (a job's record).
    pub(crate) async fn publish(&self, key: &str, expect: u64, value: Option<Vec<u8>>, ttl: bool) -> Result<Wrote> {
        use async_nats::jetstream::message::PublishMessage;
        let subject = format!("$KV.{}.{key}", self.inner.url.bucket);
        let mut msg = PublishMessage::build().expected_last_subject_sequence(expect);
        msg = match value {
            Some(v) if ttl => msg.payload(v.into()).ttl(self.inner.url.ttl),
            Some(v) => msg.payload(v.into()),
            // A delete goes a second later (then its expiry marker, a second after that): the
            // bucket keeps nothing of a released lock.
            None => msg.header("KV-Operation", "DEL").ttl(Duration::from_secs(1)),
        };
        let sent = async {
            let ack = self.inner.js.send_publish(subject, msg).await?;
            ack.await
        };
        match self.answered("write", key, sent).await? {
            Ok(ack) => Ok(Wrote::At(ack.sequence)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(Wrote::Moved),
            Err(e) => Err(Error::Backend { op: "write", path: key.to_string(), source: error_text(&e).into() }),
        }
    }

    /// Runs `request` (`op` on `key`) to its answer, within the URL's timeout and while the
    /// connection it went out on stays up. A drop ends it at once, outcome unknown: async-nats
    /// keeps a request open across the reconnect, but an answer lost with the old connection
    /// never comes, and a renewal waiting for it would wait out its lease (a false loss). A
    /// request made while disconnected goes out on the next connection, and is waited for.
    async fn answered<T>(
        &self,
        op: &'static str,
        key: &str,
        request: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        let mut drops = self.inner.drops.subscribe();
        let dropped = async move {
            if drops.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let timeout = self.inner.url.timeout;
        tokio::select! {
            answer = tokio::time::timeout(timeout, request) => answer.map_err(|_| no_answer(op, key, timeout)),
            () = dropped => Err(Error::unanswered(op, key, "the connection dropped before the answer (the outcome is unknown)")),
        }
    }

    /// The key's last entry, read from the stream's leader (`None`: no message at all).
    pub(crate) async fn read(&self, key: &str) -> Result<Option<Entry>> {
        self.answered("read", key, self.inner.kv.entry(key)).await?.map_err(|e| Error::Backend {
            op: "read",
            path: key.to_string(),
            source: error_text(&e).into(),
        })
    }

    /// The sequence to expect for a create of `key`: our hint if we have one, else 0.
    pub(crate) fn hint(&self, key: &str) -> u64 {
        self.inner.hints.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied().unwrap_or(0)
    }

    /// Remembers that `key`'s last message is now the tombstone at `seq`.
    pub(crate) fn remember(&self, key: &str, seq: u64) {
        let mut hints = self.inner.hints.lock().unwrap_or_else(|e| e.into_inner());
        if hints.len() >= HINTS {
            hints.clear();
        }
        hints.insert(key.to_string(), seq);
    }

    /// Forgets the hint of `key` (a create with it was refused).
    pub(crate) fn forget(&self, key: &str) {
        self.inner.hints.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// The server's time now, in milliseconds since the Unix epoch (the `ts` of a stream info
    /// answer: the server's clock when it answered).
    pub(crate) async fn server_time_ms(&self) -> Result<i64> {
        let subject = format!("$JS.API.STREAM.INFO.KV_{}", self.inner.url.bucket);
        let fail = |why: String| Error::Backend { op: "server time", path: String::new(), source: why.into() };
        let timeout = self.inner.url.timeout;
        let answer = tokio::time::timeout(timeout, self.inner.nats.request(subject, "".into()))
            .await
            .map_err(|_| fail(format!("no answer within {timeout:?}")))?
            .map_err(|e| fail(error_text(&e)))?;
        let info: serde_json::Value = serde_json::from_slice(&answer.payload).map_err(|e| fail(e.to_string()))?;
        let ts = info.get("ts").and_then(|t| t.as_str()).ok_or_else(|| fail(format!("no ts in {info}")))?;
        let at = humantime::parse_rfc3339_weak(ts.trim_end_matches('Z'))
            .or_else(|_| humantime::parse_rfc3339(ts))
            .map_err(|e| fail(format!("ts {ts}: {e}")))?;
        Ok(at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64))
    }
}

impl Client {
    /// The lock `name` as [`Client::locks`] shows each, or free (for [`crate::Client::inspect`]).
    pub(crate) async fn one_lock(&self, name: &str) -> Result<crate::listing::Listing> {
        use crate::listing::{Found, Listing};
        check_name(name)?;
        let k = key("locks", name);
        let found = match self.read(&k).await? {
            Some(e) if live(&e) => {
                match lock_info(name, &e.value, e.revision, e.created.unix_timestamp_nanos(), self.lease()) {
                    Some(info) => Found::Lock(info),
                    None => Found::Free { recipe: "mutex", last_token: None },
                }
            }
            _ => Found::Free { recipe: "mutex", last_token: None },
        };
        Ok(Listing::one("nats", name, found, unseen()))
    }

    /// Every lock held now whose name starts with `prefix` (the live keys of the bucket's
    /// mutexes and writers, readers and permits), each with its holder's mark, token and the
    /// TTL left.
    pub async fn locks(&self, prefix: &str) -> Result<crate::listing::Listing> {
        use crate::listing::{Listing, LockInfo, MAX_LOCKS};
        let mut by_name: std::collections::BTreeMap<String, LockInfo> = Default::default();
        let mut truncated = false;
        for space in ["locks", "reads", "permits"] {
            let filter = if space == "locks" { "locks.*".to_string() } else { format!("{space}.*.*") };
            let (live, _) = self.scan(&filter).await?;
            for s in live {
                let enc = if space == "locks" { s.key.as_str() } else { s.key.rsplit_once('.').map_or("", |(k, _)| k) };
                let Some(name) = name_of(space, enc).filter(|n| n.starts_with(prefix)) else { continue };
                if !by_name.contains_key(&name) && by_name.len() == MAX_LOCKS {
                    truncated = true;
                    continue;
                }
                let Some(info) = lock_info(&name, &s.value, s.seq, s.written_ns, self.lease()) else { continue };
                match by_name.entry(name) {
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(info);
                    }
                    std::collections::btree_map::Entry::Occupied(mut o) => {
                        let lock = o.get_mut();
                        lock.entries.extend(info.entries);
                        lock.entries.sort_by_key(|e| e.token);
                        lock.last_token = lock.entries.iter().filter_map(|e| e.token).max();
                    }
                }
            }
        }
        Ok(Listing {
            backend: "nats",
            prefix: prefix.to_string(),
            locks: by_name.into_values().collect(),
            truncated,
            unseen: unseen(),
        })
    }

    /// The last message of every key on `filter` (a subject filter under the bucket's prefix)
    /// that holds a live value, each read from the stream's leader; and the lowest sequence among
    /// those (`u64::MAX` if none). The keys come from one stream info request (the subjects that
    /// have a message), so a key that vanishes meanwhile (a released key's delete expiring) is
    /// simply not live, never waited for.
    pub(crate) async fn scan(&self, filter: &str) -> Result<(Vec<Scanned>, u64)> {
        use futures::StreamExt;
        let keys = self.keys_on(filter).await?;
        let reads = futures::stream::iter(keys).map(|k| async move { (self.read(&k).await, k) }).buffer_unordered(32);
        let read: Vec<_> = reads.collect().await;
        let (mut found, mut first) = (Vec::new(), u64::MAX);
        for (entry, key) in read {
            let Some(e) = entry?.filter(live) else { continue };
            first = first.min(e.revision);
            let written_ns = e.created.unix_timestamp_nanos();
            found.push(Scanned { key, seq: e.revision, value: e.value.to_vec(), written_ns });
        }
        Ok((found, first))
    }

    /// Whether any key on `filter` has a message at all (one stream info request).
    pub(crate) async fn any_message(&self, filter: &str) -> Result<bool> {
        Ok(!self.keys_on(filter).await?.is_empty())
    }

    /// The keys on `filter` that have a message (a stream info request with a subjects filter).
    pub(crate) async fn keys_on(&self, filter: &str) -> Result<Vec<String>> {
        let bucket = &self.inner.url.bucket;
        let subject = format!("$JS.API.STREAM.INFO.KV_{bucket}");
        let fail = |why: String| Error::Backend { op: "list keys", path: filter.to_string(), source: why.into() };
        let timeout = self.inner.url.timeout;
        let prefix = format!("$KV.{bucket}.");
        let (mut keys, mut offset) = (Vec::new(), 0u64);
        loop {
            let ask =
                serde_json::json!({ "subjects_filter": format!("{prefix}{filter}"), "offset": offset }).to_string();
            let answer = tokio::time::timeout(timeout, self.inner.nats.request(subject.clone(), ask.into()))
                .await
                .map_err(|_| fail(format!("no answer within {timeout:?}")))?
                .map_err(|e| fail(error_text(&e)))?;
            let info: serde_json::Value = serde_json::from_slice(&answer.payload).map_err(|e| fail(e.to_string()))?;
            if let Some(e) = info.get("error") {
                return Err(fail(e.to_string()));
            }
            let page: Vec<String> = info
                .pointer("/state/subjects")
                .and_then(|s| s.as_object())
                .map(|s| s.keys().filter_map(|k| k.strip_prefix(&prefix)).map(str::to_string).collect())
                .unwrap_or_default();
            let total = info.get("total").and_then(|t| t.as_u64()).unwrap_or(0);
            offset += page.len() as u64;
            let done = page.is_empty() || offset >= total;
            keys.extend(page);
            if done {
                return Ok(keys);
            }
        }
    }
}

/// A live key's last message, from [`Client::scan`].
pub(crate) struct Scanned {
    pub(crate) key: String,
    pub(crate) seq: u64,
    pub(crate) value: Vec<u8>,
    /// When the server stored it (Unix ns, the server's clock).
    pub(crate) written_ns: i128,
}

/// What a listing cannot show on NATS.
fn unseen() -> Vec<String> {
    vec!["waiters: they watch the key, which records only its holder".into()]
}

/// A held lock's listing from its key's value, sequence and write time (Unix ns, the server's).
fn lock_info(name: &str, value: &[u8], seq: u64, written_ns: i128, ttl: Duration) -> Option<crate::listing::LockInfo> {
    use crate::listing::{Entry as Shown, LockInfo};
    let v: hold::Value = serde_json::from_slice(value).ok()?;
    let token = if v.token == 0 { seq } else { v.token };
    let mut parts = v.owner.splitn(3, ':');
    let owner = match (parts.next(), parts.next().and_then(|p| p.parse::<u32>().ok())) {
        (Some(host), Some(pid)) if !host.is_empty() => format!("{host} pid {pid}"),
        _ => v.owner.clone(),
    };
    let (recipe, mode) = match v.kind.as_str() {
        "read" => ("rwlock", "read"),
        "write" => ("rwlock", "write"),
        "permit" => ("semaphore", "permit"),
        _ => ("mutex", "exclusive"),
    };
    let mut e = Shown::new(true, mode, owner, v.owner.clone());
    e.token = Some(token);
    let now_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
    let left_ns = written_ns + ttl.as_nanos() as i128 - now_ns;
    e.lease_left_ms = Some((left_ns.max(0) / 1_000_000) as u64);
    Some(LockInfo {
        name: name.to_string(),
        recipe: recipe.into(),
        permits: v.permits,
        last_token: Some(token),
        entries: vec![e],
    })
}

/// The bucket's stream as distlock needs it, made if missing; an existing one is checked.
async fn bucket(js: &async_nats::jetstream::Context, url: &NatsUrl) -> Result<Store> {
    use async_nats::jetstream::stream::{Config, DiscardPolicy, StorageType};
    let name = format!("KV_{}", url.bucket);
    let fail = |why: String| Error::Connect { url: url.to_string(), reason: why };
    let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64);
    let config = Config {
        name: name.clone(),
        description: Some("distlock's locks".into()),
        subjects: vec![format!("$KV.{}.>", url.bucket)],
        max_messages_per_subject: 1,
        storage: StorageType::File,
        num_replicas: url.replicas,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: false,
        discard: DiscardPolicy::New,
        allow_message_ttl: true,
        subject_delete_marker_ttl: Some(Duration::from_secs(1)),
        first_sequence: Some(now_us),
        ..Default::default()
    };
    let mut stream = match js.get_stream(&name).await {
        Ok(s) => s,
        Err(_) => match js.create_stream(config).await {
            Ok(s) => s,
            // Made meanwhile by another client: use theirs.
            Err(_) => js.get_stream(&name).await.map_err(|e| fail(error_text(&e)))?,
        },
    };
    let info = stream.info().await.map_err(|e| fail(error_text(&e)))?.clone();
    let c = &info.config;
    let wrong = [
        (c.storage != StorageType::File, "memory storage (a restart empties it and hands tokens out again)"),
        (c.max_messages_per_subject != 1, "history above 1 (the server would lengthen every TTL)"),
        (!c.allow_message_ttl, "no per-message TTLs (allow_msg_ttl)"),
        (
            c.subject_delete_marker_ttl.is_none(),
            "no expiry markers (subject_delete_marker_ttl: waiters would not be woken)",
        ),
        (c.allow_direct, "direct gets on (a replica behind its leader could answer a read)"),
    ];
    if let Some((_, why)) = wrong.iter().find(|(w, _)| *w) {
        return Err(fail(format!(
            "the bucket {} exists with {why}: give distlock a bucket of its own (the URL's path), which it creates",
            url.bucket
        )));
    }
    js.get_key_value(url.bucket.clone()).await.map_err(|e| fail(error_text(&e)))
}

/// The key of lock `name` under `space` (`locks`, `jobs`).
pub(crate) fn key(space: &str, name: &str) -> String {
    let mut k = String::with_capacity(space.len() + 1 + name.len());
    k.push_str(space);
    k.push('.');
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'/' {
            k.push(b as char);
        } else {
            k.push_str(&format!("={b:02X}"));
        }
    }
    k
}

/// The name a key of `space` holds (`None`: not a key of that space, or not ours).
pub(crate) fn name_of(space: &str, key: &str) -> Option<String> {
    let enc = key.strip_prefix(space)?.strip_prefix('.')?;
    let mut out = Vec::with_capacity(enc.len());
    let bytes = enc.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let hex = enc.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn check_name(name: &str) -> Result<()> {
    crate::contract::check_name(name)?;
    if name.len() > 1024 {
        return Err(Error::InvalidLockPath {
            path: name.to_string(),
            reason: "a lock name has at most 1024 bytes".into(),
        });
    }
    Ok(())
}

fn no_answer(op: &'static str, key: &str, bound: Duration) -> Error {
    Error::unanswered(op, key, format!("no answer within {bound:?}"))
}

/// Whether an entry is a live value (not a delete or an expiry marker).
pub(crate) fn live(e: &Entry) -> bool {
    e.operation == Operation::Put
}

/// An error in words: its message and those of its causes, each once.
pub(crate) fn error_text(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// The wait before reconnect try `attempts` (1 for the first): none for the first, then 2 ms
/// doubling per try, at most `most`.
fn reconnect_delay(most: Duration) -> impl Fn(usize) -> Duration + Send + Sync + 'static {
    move |attempts| match attempts {
        0 | 1 => Duration::ZERO,
        n => Duration::from_millis(2u64.saturating_pow(u32::try_from(n - 1).unwrap_or(u32::MAX))).min(most),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_keys_and_back() {
        for name in ["orders", "a/b", "a.b c", "x=y", "ünï", "/distlock/z", "-_"] {
            let k = key("locks", name);
            assert!(k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_/=.".contains(&b)), "{k}");
            assert_eq!(k.matches('.').count(), 1, "{k}");
            assert_eq!(name_of("locks", &k).as_deref(), Some(name));
        }
        assert_eq!(key("locks", "a.b"), "locks.a=2Eb");
        assert!(key("locks", "ab").starts_with(&key("locks", "a")), "a prefix of a name is a prefix of its key");
        assert_eq!(name_of("jobs", "locks.a"), None);
    }

    #[test]
    fn reconnects_wait_at_most_a_tenth_of_the_ttl() {
        let wait = reconnect_delay(Duration::from_millis(200));
        let waits: Vec<u64> = (1..=12).map(|n| wait(n).as_millis() as u64).collect();
        assert_eq!(waits, [0, 2, 4, 8, 16, 32, 64, 128, 200, 200, 200, 200]);
        assert_eq!(wait(usize::MAX), Duration::from_millis(200));
    }
}

#[cfg(test)]
assert_send_sync_static!(LockGuard);

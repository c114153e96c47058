//! The queue every etcd recipe is built on (written once): create our key under the session
//! lease, wait until fewer than `limit` older keys under the blocking prefix remain, then check
//! that our key is still there before calling the lock ours.

use super::guard::LockGuard;
use super::kinds::{self, Page, Role, Verdict};
use super::session::Session;
use super::Client;
use crate::contract::Wait;
use crate::{Error, Result};
use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

/// How our key is named under [`Spec::key_prefix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Naming {
    /// `<lease id hex>`: etcd's mutex layout; one per session, so acquires through one client
    /// queue locally first.
    Session,
    /// `<16 hex digits>` unique per acquire (the nanosecond clock, moved on past collisions).
    Unique,
    /// `<lease id hex>_<16 hex digits>`.
    SessionUnique,
}

/// One recipe's shape: where our key goes and what it waits for.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The lock's name, for messages and guards.
    pub(crate) name: String,
    /// Our key is this plus the [`Naming`].
    pub(crate) key_prefix: String,
    pub(crate) naming: Naming,
    /// Which older keys of the name block us (see `kinds.rs`)...
    pub(crate) role: Role,
    /// ...while at least this many of them remain (a semaphore's permits; else 1).
    pub(crate) limit: u32,
    /// Our key's value: an election's announced value (as `concurrency.Election` stores the
    /// proposal), or `None` for a lock (a fresh nonce, which tells our key from others).
    pub(crate) value: Option<Arc<str>>,
}

/// Our key as created, and what the create's read says of the keys older than it.
struct Created {
    key: String,
    rev: i64,
    /// `Unsure` when the read stopped before a key that decides (the queue is read again).
    verdict: Verdict,
}

/// How a wait ended.
enum Turn {
    Ours,
    TimedOut,
    /// The session was lost, or our key went (checked with the read that found no older key):
    /// queue again on a live session.
    Again(&'static str),
    /// An older key of the name is of another kind (refused: `Error::KindConflict`).
    Conflict(&'static str),
}

/// Acquires `spec` within `wait`.
pub(crate) async fn acquire(client: &Client, spec: &Spec, wait: Wait) -> Result<Option<LockGuard>> {
    let try_only = wait == Wait::Never;
    let deadline = wait.deadline();
    let mut gate = None;
    if spec.naming == Naming::Session {
        let local = client.gate(&spec.key_prefix);
        gate = Some(match (try_only, deadline) {
            (true, _) => match local.try_lock_owned() {
                Ok(g) => g,
                Err(_) => return Ok(None),
            },
            (false, Some(d)) => match tokio::time::timeout_at(d, local.lock_owned()).await {
                Ok(g) => g,
                Err(_) => return Ok(None),
            },
            (false, None) => local.lock_owned().await,
        });
    }
    let mut backoff = Duration::from_millis(10);
    loop {
        let session = client.session().await?;
        let mut pending = Pending { client: client.clone(), name: spec.name.clone(), key: None, gate: gate.take() };
        let Created { key, rev, verdict } = create(client, spec, &session, &mut pending).await?;
        let first = match verdict {
            Verdict::Free => Look::Ours,
            Verdict::Wait(k) => Look::Wait(k),
            Verdict::Conflict(what) => Look::Conflict(what),
            Verdict::Unsure(_) => look(client, spec, &key, rev).await?,
        };
        let turn = match first {
            Look::Ours => Turn::Ours,
            Look::Gone(why) => Turn::Again(why),
            Look::Conflict(what) => Turn::Conflict(what),
            Look::Wait(_) if try_only => Turn::TimedOut,
            Look::Wait(before) => {
                let turn = wait_turn(client, spec, &session, &key, rev, Some(before));
                match deadline {
                    Some(d) => tokio::time::timeout_at(d, turn).await.unwrap_or(Ok(Turn::TimedOut))?,
                    None => turn.await?,
                }
            }
        };
        match turn {
            Turn::Ours => {}
            Turn::TimedOut => {
                pending.remove().await;
                return Ok(None);
            }
            Turn::Conflict(in_use) => {
                pending.remove().await;
                return Err(conflict(spec, in_use));
            }
            Turn::Again(why) => {
                tracing::warn!(lock = spec.name, key, why, "not taking the lock; queueing again on a live session");
                gate = pending.remove().await;
                if deadline.is_some_and(|d| Instant::now() + backoff >= d) {
                    return Ok(None);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        }
        match session.guard_lease() {
            Some(lease) => {
                let gate = pending.disarm();
                return Ok(Some(LockGuard::new(client.clone(), spec.name.clone(), key, rev, lease, session, gate)));
            }
            None => {
                tracing::warn!(lock = spec.name, key, "session lost as the lock was granted; queueing again");
                gate = pending.remove().await;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(None);
                }
            }
        }
    }
}

/// Creates our key (one transaction, which also reads the oldest blockers): its key, create
/// revision, and whether older keys block it.
async fn create(client: &Client, spec: &Spec, session: &Session, pending: &mut Pending) -> Result<Created> {
    let mut stale = 0;
    // The key's value: a lock's tells our own key (created by a try whose answer was lost) from
    // others. An election's is the announced value, which may be an earlier campaign's too: an
    // existing key is then never taken for ours (it is deleted and ours created anew).
    let nonce = match &spec.value {
        Some(v) => v.to_string(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let mut unique =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    loop {
        let key = match spec.naming {
            Naming::Session => format!("{}{:x}", spec.key_prefix, session.id),
            Naming::Unique => format!("{}{:016x}", spec.key_prefix, unique),
            Naming::SessionUnique => format!("{}{:x}_{:016x}", spec.key_prefix, session.id, unique),
        };
        // The put and, in the same transaction, the keys it may have to wait for (newest first:
        // for a mutex, ours and the one to wait for; a semaphore's oldest first), whether the
        // put was made now or by an earlier try whose answer was lost.
        let (reads, read_limit) = first_reads(spec);
        let put = TxnOp::put(key.clone(), nonce.as_str(), Some(PutOptions::new().with_lease(session.id)));
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([vec![put], reads.clone()].concat())
            .or_else([vec![TxnOp::get(key.clone(), None)], reads.clone()].concat());
        let etcd = client.etcd();
        // An acquire dropped while the create is in flight must not leave the key behind, nor
        // send a delete that could reach the server before the create (another HTTP/2 stream):
        // the create finishes on its own then, and its `Cleanup` deletes the key once it has
        // answered. Run in place (no task) when nobody gives up.
        // The local gate goes with it: no other acquire of this client may use the key before a
        // late create's cleanup has run.
        let cleanup = Cleanup {
            client: client.clone(),
            name: spec.name.clone(),
            key: Some((key.clone(), nonce.clone())),
            gate: pending.gate.take(),
        };
        let (task_client, task_name) = (client.clone(), spec.name.clone());
        let (resp, mut cleanup) = crate::background::detach(async move {
            let etcd = task_client.etcd();
            let resp = task_client
                .call("acquire", &task_name, |_| {
                    let (mut etcd, txn) = (etcd.clone(), txn.clone());
                    async move { etcd.txn(txn).await }
                })
                .await;
            (resp, cleanup)
        })
        .await;
        // From here a dropped or failed acquire deletes the key (it may have been created).
        pending.key = cleanup.key.take();
        pending.gate = cleanup.gate.take();
        let resp = resp?;
        let ops = resp.op_responses();
        let existing = match ops.first() {
            Some(TxnOpResponse::Get(g)) if !resp.succeeded() => g.kvs().first().cloned(),
            _ => None,
        };
        let rev = if resp.succeeded() {
            resp.header().map_or(0, |h| h.revision())
        } else if let Some(kv) = existing.as_ref().filter(|kv| spec.value.is_none() && kv.value() == nonce.as_bytes()) {
            // Ours, from this acquire: the first try's answer was lost and the request sent again.
            kv.create_revision()
        } else if spec.naming == Naming::Session {
            // Our session's key is there already: an earlier acquire's delete failed. Unlike Go's
            // client we do not queue with it (its holder's token would be handed out twice):
            // delete it (only that one) and create ours anew.
            stale += 1;
            if stale > 3 {
                return Err(protocol(&spec.name, "our session's key keeps coming back"));
            }
            let old = existing.map_or(0, |kv| kv.create_revision());
            let remove = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, old)])
                .and_then([TxnOp::delete(key.clone(), None)]);
            client
                .call("acquire (stale key)", &spec.name, |_| {
                    let (mut etcd, txn) = (etcd.clone(), remove.clone());
                    async move { etcd.txn(txn).await }
                })
                .await?;
            // The key is gone; the next create's `Cleanup` (which holds the gate) is its only
            // deleter now. An ungated delete left armed here could, matching an election's value,
            // remove a later campaign's key.
            pending.key = None;
            continue;
        } else {
            pending.key = None; // someone else's key: not ours to delete
            unique += 1;
            continue;
        };
        let pages: Vec<Page<'_>> = ops[1..]
            .iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(g) => Some(Page::of(g.kvs(), read_limit)),
                _ => None,
            })
            .collect();
        if pages.len() != reads.len() {
            return Err(protocol(&spec.name, "the transaction's reads are missing"));
        }
        let verdict = kinds::decide(spec.role, &spec.name, spec.limit, &pages, rev);
        return Ok(Created { key, rev, verdict });
    }
}

/// The reads a create sends with its put, and the most keys each may answer: a mutex's,
/// writer's or reader's newest two keys of each range (ours, or the newest readers', and the
/// one to wait for), a semaphore's oldest keys.
fn first_reads(spec: &Spec) -> (Vec<TxnOp>, usize) {
    let (order, limit) = match spec.role {
        Role::Permit => (SortOrder::Ascend, spec.limit as usize + 16),
        _ => (SortOrder::Descend, 2),
    };
    (range_reads(spec, order, limit, None), limit)
}

/// A read of each of the ranges `spec` waits on (`kinds::ranges`), keys only, in create order,
/// at most `limit` keys each (`0`: all), only keys created before `below` if given.
fn range_reads(spec: &Spec, order: SortOrder, limit: usize, below: Option<i64>) -> Vec<TxnOp> {
    let read = |(start, end): (String, String)| {
        let options = GetOptions::new()
            .with_range(end)
            .with_keys_only()
            .with_sort(SortTarget::Create, order)
            .with_limit(limit as i64);
        let options = match below {
            Some(rev) => options.with_max_create_revision(rev - 1),
            None => options,
        };
        TxnOp::get(start, Some(options))
    };
    kinds::ranges(spec.role, &spec.name).into_iter().map(read).collect()
}

fn conflict(spec: &Spec, in_use: &'static str) -> Error {
    let wanted = match spec.role {
        Role::Exclusive if spec.key_prefix.ends_with("/write/") => "a write lock".to_string(),
        Role::Exclusive => "a mutex".to_string(),
        Role::Shared => "a read lock".to_string(),
        Role::Permit => format!("a semaphore of {} permits", spec.limit),
    };
    Error::KindConflict { lock: spec.name.clone(), in_use: in_use.to_string(), wanted }
}

/// etcd (3.4 at least) registers a watch that starts "now" at the revision it read just before;
/// a write committed in between leaves the watch in its catch-up list, served every 100 ms, so
/// its events can come up to 100 ms late (measured: 1.7 % of hand-offs with 8 clients, 4 to
/// 91 ms late). A waiter whose watch may be one of those (the store moved on between the watch's
/// answer and the read after it) also reads the watched key at growing intervals from
/// `FIRST_POLL` until the catch-up has surely run.
const CATCH_UP: Duration = Duration::from_millis(100);
const FIRST_POLL: Duration = Duration::from_millis(4);

/// Waits until fewer than `limit` keys older than ours block us (see `kinds.rs`), and
/// our key is still there as we created it; ends early when the session is lost. `before` is the
/// key to watch first, if the create found it.
async fn wait_turn(
    client: &Client,
    spec: &Spec,
    session: &Arc<Session>,
    key: &str,
    rev: i64,
    mut before: Option<Vec<u8>>,
) -> Result<Turn> {
    let lost = crate::lease::Lease::lost(session.lease.clone(), spec.name.clone(), std::future::pending());
    tokio::pin!(lost);
    let mut backoff = Duration::from_millis(20);
    loop {
        let etcd = client.etcd();
        // What to watch for: the one key just before ours, or (semaphore) the whole prefix.
        let watch_key = match before.take() {
            Some(k) => k,
            None => match look(client, spec, key, rev).await? {
                Look::Ours => return Ok(Turn::Ours),
                Look::Gone(why) => return Ok(Turn::Again(why)),
                Look::Conflict(what) => return Ok(Turn::Conflict(what)),
                Look::Wait(k) => k,
            },
        };
        let options = if spec.role != Role::Permit { WatchOptions::new() } else { WatchOptions::new().with_prefix() };
        // The watch starts at the current revision (a watch from an older one is served by
        // etcd's catch-up loop, every 100 ms); what happened between the read and the watch is
        // read again once the watch is in place.
        let options = options.with_filters([WatchFilterType::NoPut]);
        // Only keys created before ours count: a mutex key is named after its session, so the one
        // we watch may have been deleted and created again (behind us) before the watch began.
        let recheck = if spec.role != Role::Permit {
            GetOptions::new().with_keys_only().with_max_create_revision(rev - 1)
        } else {
            GetOptions::new().with_prefix().with_keys_only().with_max_create_revision(rev - 1)
        };
        // How many of the keys read still block us: the watched key, or a semaphore's permits.
        let still = |kvs: &[etcd_client::KeyValue]| match spec.role {
            Role::Permit => kinds::permits(&spec.name, kvs),
            _ => kvs.len(),
        };
        let deleted = async {
            let mut stream = etcd.clone().watch(watch_key.clone(), Some(options)).await?;
            // When the watch may have been registered behind a write (see `CATCH_UP`): when it
            // was created, and the next read of the key after that.
            let mut poll: Option<(Instant, Duration)> = None;
            let mut checked = false;
            loop {
                let msg = match poll {
                    None => stream.message().await?,
                    Some((created, after)) => tokio::select! {
                        msg = stream.message() => msg?,
                        _ = tokio::time::sleep_until(created + after) => {
                            let now = etcd.clone().get(watch_key.clone(), Some(recheck.clone())).await?;
                            if still(now.kvs()) < spec.limit as usize {
                                return Ok(()); // deleted; the watch had not told us yet
                            }
                            poll = (after < CATCH_UP).then(|| (created, after * 2));
                            continue;
                        }
                    },
                };
                let Some(msg) = msg else { break };
                if msg.canceled() || msg.events().iter().any(|e| e.event_type() == EventType::Delete) {
                    return Ok::<_, etcd_client::Error>(());
                }
                if msg.created() && !checked {
                    checked = true;
                    let created = Instant::now();
                    let now = etcd.clone().get(watch_key.clone(), Some(recheck.clone())).await?;
                    if still(now.kvs()) < spec.limit as usize {
                        return Ok(()); // gone before the watch began
                    }
                    // The watch answered as of revision `msg.header`; a write since may have
                    // left it behind, in etcd's catch-up list.
                    let revision = |h: Option<&etcd_client::ResponseHeader>| h.map_or(0, |h| h.revision());
                    if revision(now.header()) != revision(msg.header()) {
                        poll = Some((created, FIRST_POLL));
                    }
                }
            }
            Err(etcd_client::Error::WatchError("the watch stream ended".into()))
        };
        tokio::select! {
            done = deleted => match done {
                Ok(()) => backoff = Duration::from_millis(20),
                Err(e) => {
                    // A broken watch: look again after a pause (the next read fails or answers).
                    tracing::debug!(lock = spec.name, error = %e, "watch failed; reading again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            },
            _ = &mut lost => return Ok(Turn::Again("the session was lost while waiting")),
        }
    }
}

/// What one look at the queue found.
enum Look {
    /// Fewer than `limit` older keys, and our key is there as we created it.
    Ours,
    /// Our key is gone or was created again: not ours to take.
    Gone(&'static str),
    /// Still blocked: watch this key (mutex) or prefix (semaphore) for deletions.
    Wait(Vec<u8>),
    /// An older key of the name is of another kind.
    Conflict(&'static str),
}

/// How many keys a mutex's, writer's or reader's look reads per range at a time (more only when
/// those are all a longer name's, or readers' for a reader).
const LOOK_PAGE: usize = 8;

/// Reads, in one request, the keys older than ours that still block us and our own key: the
/// check after the wait (our key must still be there as we created it) costs no round trip of
/// its own. The read is linearizable: a member's own (serializable) state would spare it a wait
/// behind the writes in flight, but a lagging or cut-off member could show our key after the
/// cluster had deleted it, and grant the lock on a key that is gone (the very case the check is
/// for).
async fn look(client: &Client, spec: &Spec, key: &str, rev: i64) -> Result<Look> {
    // A semaphore counts every older key (etcd's `count` ignores the revision filters); the
    // others read the newest older keys, a page at a time.
    let (order, limit) = match spec.role {
        Role::Permit => (SortOrder::Ascend, 0),
        _ => (SortOrder::Descend, LOOK_PAGE),
    };
    let mut below = rev;
    loop {
        let mut reads = range_reads(spec, order, limit, Some(below));
        let ranges = reads.len();
        reads.push(TxnOp::get(key, Some(GetOptions::new().with_keys_only())));
        let txn = Txn::new().and_then(reads);
        let etcd = client.etcd();
        let resp = client
            .call("wait", &spec.name, |_| {
                let (mut etcd, txn) = (etcd.clone(), txn.clone());
                async move { etcd.txn(txn).await }
            })
            .await?;
        let ops = resp.op_responses();
        let Some(TxnOpResponse::Get(own)) = ops.get(ranges) else {
            return Err(protocol(&spec.name, "the wait's reads are missing"));
        };
        match own.kvs().first() {
            None => return Ok(Look::Gone("our key is gone (the session expired or someone deleted it)")),
            Some(kv) if kv.create_revision() != rev => return Ok(Look::Gone("our key was deleted and created again")),
            Some(_) => {}
        }
        let pages: Vec<Page<'_>> = ops[..ranges]
            .iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(g) => Some(Page::of(g.kvs(), limit)),
                _ => None,
            })
            .collect();
        return Ok(match kinds::decide(spec.role, &spec.name, spec.limit, &pages, rev) {
            Verdict::Free => Look::Ours,
            Verdict::Wait(k) => Look::Wait(k),
            Verdict::Conflict(what) => Look::Conflict(what),
            Verdict::Unsure(end) => {
                below = end;
                continue;
            }
        });
    }
}

fn protocol(name: &str, what: &str) -> Error {
    Error::Backend { op: "acquire", path: name.to_string(), source: what.to_string().into() }
}

/// A key whose create may still be in flight: deleted (in the background) when dropped armed.
struct Cleanup {
    client: Client,
    name: String,
    /// The key and the nonce in its value (only a key with it is ours).
    key: Option<(String, String)>,
    /// The client's local gate for the key, opened once the key is deleted.
    gate: Option<OwnedMutexGuard<()>>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let gate = self.gate.take();
        let Some((key, nonce)) = self.key.take() else { return };
        let (client, name) = (self.client.clone(), self.name.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                delete(&client, &name, key, nonce).await;
                drop(gate);
            });
        }
    }
}

/// A key being queued: deleted if the acquire is dropped or fails; the local gate goes with it.
struct Pending {
    client: Client,
    name: String,
    /// The key we may have created, and the nonce in its value (only a key with it is ours).
    key: Option<(String, String)>,
    gate: Option<OwnedMutexGuard<()>>,
}

impl Pending {
    /// Deletes the key now (bounded), handing the gate back. An acquire dropped meanwhile (a
    /// `select!` around a timed acquire) does not cancel the delete: it finishes on its own, and
    /// only then is the gate opened.
    async fn remove(mut self) -> Option<OwnedMutexGuard<()>> {
        let (key, gate) = (self.key.take(), self.gate.take());
        let (client, name) = (self.client.clone(), self.name.clone());
        crate::background::detach(async move {
            if let Some((key, nonce)) = key {
                delete(&client, &name, key, nonce).await;
            }
            gate
        })
        .await
    }

    /// The key is a guard's now.
    fn disarm(mut self) -> Option<OwnedMutexGuard<()>> {
        self.key = None;
        self.gate.take()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some((key, nonce)) = self.key.take() else { return };
        let (client, name, gate) = (self.client.clone(), self.name.clone(), self.gate.take());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                delete(&client, &name, key, nonce).await;
                drop(gate); // the next local acquire may use the key only after this
            });
        }
    }
}

/// Deletes `key` if it is ours (its value is our `nonce`): a session-named key may be another
/// local acquire's by the time a late cleanup runs.
async fn delete(client: &Client, name: &str, key: String, nonce: String) {
    let etcd = client.etcd();
    let txn = Txn::new()
        .when([Compare::value(key.clone(), CompareOp::Equal, nonce.as_str())])
        .and_then([TxnOp::delete(key.clone(), None)]);
    if let Err(e) = client
        .call("cancel", name, |_| {
            let (mut etcd, txn) = (etcd.clone(), txn.clone());
            async move { etcd.txn(txn).await }
        })
        .await
    {
        if e.to_string().contains("permission denied") {
            // The user may not write here, so the acquire's own put was refused: no key to delete.
            tracing::debug!(lock = name, key, error = %e, "no permission to delete a cancelled acquire's key");
        } else {
            tracing::warn!(lock = name, key, error = %e, "deleting a cancelled acquire's key failed; the lease will");
        }
    }
}

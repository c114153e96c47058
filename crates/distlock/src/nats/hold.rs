//! A hold of one key, every recipe's: created by a guarded publish with its TTL, renewed by the
//! client's watchdog, deleted by a guarded publish at release.

use super::{live, Client, Wrote};
use crate::contract::Wait;
use crate::lease::{Lease, Leased, Renewal};
use crate::{LostReason, Result};
use futures::StreamExt;
use std::sync::Arc;
use tokio::time::Instant;

/// What a lock key holds (JSON): the holder's mark, its token (0 until its first renewal, when
/// the key's sequence is the token) and, for an election, the announced value.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Value {
    pub(crate) owner: String,
    #[serde(default)]
    pub(crate) token: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) value: Option<String>,
    /// `mutex`, `write`, `read` or `permit`.
    #[serde(default)]
    pub(crate) kind: String,
    /// A semaphore's permit count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) permits: Option<u32>,
}

impl Value {
    /// The value of a live entry, if it is distlock's.
    pub(crate) fn of(e: &async_nats::jetstream::kv::Entry) -> Option<Value> {
        let mut v: Value = serde_json::from_slice(&e.value).ok()?;
        if v.token == 0 {
            v.token = e.revision; // not renewed yet: the key's sequence is the create's
        }
        Some(v)
    }
}

/// What one try found.
pub(crate) enum Tried {
    /// Ours.
    Got(LockGuard),
    /// Held by someone, whose last write was at this sequence.
    Busy(u64),
    /// Free, its last message (a delete or expiry marker) at this sequence: create at it.
    Free(u64),
}

/// What a hold writes into its key beside its mark: the recipe's kind, a semaphore's permit
/// count, an election's value.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mark {
    pub(crate) kind: &'static str,
    pub(crate) permits: Option<u32>,
    pub(crate) value: Option<String>,
}

/// A new holder id: `host:pid:random`.
pub(crate) fn new_owner() -> String {
    let host = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "unknown".into());
    format!("{host}:{}:{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// Takes `key` for lock `name` within `wait`: guarded creates, and between them a watch of the
/// key (or of `wake`, a subject filter, when given) until its holder's delete or expiry marker.
pub(crate) async fn take(client: &Client, name: &str, key: &str, mark: &Mark, wait: Wait) -> Result<Option<LockGuard>> {
    let owner = new_owner();
    let mut expect = client.hint(key);
    let give_up = wait.give_up_at();
    loop {
        let busy_at = match try_once(client, name, key, &owner, mark, expect, wait).await? {
            Some(Tried::Got(g)) => return Ok(Some(g)),
            Some(Tried::Free(seq)) => {
                expect = seq;
                continue;
            }
            Some(Tried::Busy(seq)) => seq,
            None => return Ok(None),
        };
        if give_up.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        expect = until_free(client, key, busy_at, give_up).await;
    }
}

/// One try, within `wait` (`None`: its deadline passed). The create runs to its answer even if
/// the caller is dropped meanwhile: a grant it brings then is a guard dropped at once, which
/// deletes the key.
pub(crate) async fn try_once(
    client: &Client,
    name: &str,
    key: &str,
    owner: &str,
    mark: &Mark,
    expect: u64,
    wait: Wait,
) -> Result<Option<Tried>> {
    let attempt = crate::background::detach(attempt(
        client.clone(),
        name.to_string(),
        key.to_string(),
        owner.to_string(),
        mark.clone(),
        expect,
    ));
    Ok(Some(match wait {
        Wait::Until(d) => match tokio::time::timeout_at(d, attempt).await {
            Ok(t) => t?,
            Err(_) => return Ok(None),
        },
        Wait::Never | Wait::Forever => attempt.await?,
    }))
}

/// Waits until a message after sequence `seq` on `filter` (a key, or keys by a wildcard) is a
/// delete or an expiry marker (its sequence is returned), watching from the next sequence; at
/// most a TTL at a time (then 0: read again), or until `give_up`.
pub(crate) async fn until_free(client: &Client, filter: &str, seq: u64, give_up: Option<Instant>) -> u64 {
    let ttl = client.lease();
    let until = give_up.map_or(Instant::now() + ttl, |d| d.min(Instant::now() + ttl));
    let kv = &client.inner.kv;
    let watching = async {
        let Ok(mut watch) = kv.watch_from_revision(filter, seq + 1).await else {
            // No watch now (the server busy, a reconnect): look again a little later.
            tokio::time::sleep(crate::lease::RETRY).await;
            return 0;
        };
        while let Some(e) = watch.next().await {
            match e {
                Ok(e) if !live(&e) => return e.revision,
                Ok(_) => {}
                Err(_) => return 0,
            }
        }
        0
    };
    tokio::time::timeout_at(until, watching).await.unwrap_or(0)
}

/// One guarded create of `key`, expecting its last sequence `expect`.
async fn attempt(client: Client, name: String, key: String, owner: String, mark: Mark, expect: u64) -> Result<Tried> {
    let value = Value {
        owner: owner.clone(),
        token: 0,
        value: mark.value.clone(),
        kind: mark.kind.to_string(),
        permits: mark.permits,
    };
    let payload = serde_json::to_vec(&value).expect("a value serializes");
    let sent = Instant::now();
    let written = client.write(&key, expect, Some(payload)).await;
    let read_back = match written {
        Ok(Wrote::At(seq)) => return Ok(Tried::Got(LockGuard::new(client, name, key, owner, seq, seq, mark, sent))),
        Ok(Wrote::Moved) => {
            client.forget(&key);
            None
        }
        Err(e) => Some(e),
    };
    // Refused (someone wrote the key since), or the outcome unknown: read what is there. A create
    // that landed without its answer reaching us is ours (our mark in it), sent at `sent`.
    let entry = match client.read(&key).await {
        Ok(e) => e,
        Err(read_error) => return Err(read_back.unwrap_or(read_error)),
    };
    Ok(match entry {
        None => Tried::Free(0),
        Some(e) if !live(&e) => Tried::Free(e.revision),
        Some(e) => match Value::of(&e) {
            Some(v) if v.owner == owner && read_back.is_some() => {
                Tried::Got(LockGuard::new(client, name, key, owner, v.token, e.revision, mark, sent))
            }
            _ if read_back.is_some() => return Err(read_back.expect("checked")),
            _ => Tried::Busy(e.revision),
        },
    })
}

/// A hold's state, shared by its guard, its renewals and an election's announcement.
#[derive(Debug)]
pub(crate) struct HoldState {
    pub(crate) client: Client,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) token: u64,
    /// The key's last sequence as we wrote it; locked for every write of the key.
    pub(crate) rev: tokio::sync::Mutex<u64>,
    /// The value announced (an election's), written by every renewal.
    pub(crate) value: std::sync::Mutex<Option<String>>,
    /// The hold's kind and permit count, written by every renewal.
    pub(crate) kind: &'static str,
    pub(crate) permits: Option<u32>,
}

impl HoldState {
    fn payload(&self) -> Vec<u8> {
        let value = self.value.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let v = Value {
            owner: self.owner.clone(),
            token: self.token,
            value,
            kind: self.kind.to_string(),
            permits: self.permits,
        };
        serde_json::to_vec(&v).expect("a value serializes")
    }

    /// Writes the key again (renewing its TTL) at the sequence we last wrote: `Renewed`, `Gone`
    /// when someone else wrote it, `Failed` when the outcome is unknown.
    pub(crate) async fn rewrite(&self) -> Renewal {
        let mut rev = self.rev.lock().await;
        match self.client.write(&self.key, *rev, Some(self.payload())).await {
            Ok(Wrote::At(seq)) => {
                *rev = seq;
                Renewal::Renewed
            }
            Ok(Wrote::Moved) => match self.ours_at().await {
                // An earlier write of ours landed unanswered: write again at its sequence. That
                // write is sent after this renewal began, so an answer to it renews the lease
                // from the renewal's send time (which the watchdog took before the first write).
                Ok(Some(seq)) => match self.client.write(&self.key, seq, Some(self.payload())).await {
                    Ok(Wrote::At(next)) => {
                        *rev = next;
                        Renewal::Renewed
                    }
                    _ => {
                        *rev = seq;
                        Renewal::Failed
                    }
                },
                Ok(None) => Renewal::Gone(LostReason::KeyDeleted),
                // Not read: the key may still be ours (a reset between the two requests).
                Err(e) => {
                    tracing::debug!(lock = self.key, error = %e, "renewal's read failed");
                    Renewal::Failed
                }
            },
            Err(e) => {
                tracing::debug!(lock = self.key, error = %e, "renewal failed");
                Renewal::Failed
            }
        }
    }

    /// The key's last sequence if its live value is still ours (same mark and token); `Err`
    /// if it could not be read.
    async fn ours_at(&self) -> Result<Option<u64>> {
        let Some(e) = self.client.read(&self.key).await? else { return Ok(None) };
        let ours = Value::of(&e).filter(|_| live(&e)).is_some_and(|v| v.owner == self.owner && v.token == self.token);
        Ok(ours.then_some(e.revision))
    }

    /// Deletes the key if it is still ours: `true` if it was.
    pub(crate) async fn delete(&self) -> Result<bool> {
        let mut rev = self.rev.lock().await;
        let mut at = *rev;
        for _ in 0..2 {
            match self.client.write(&self.key, at, None).await? {
                Wrote::At(seq) => {
                    *rev = seq;
                    self.client.remember(&self.key, seq);
                    return Ok(true);
                }
                // An unanswered renewal of ours may have landed: delete at its sequence.
                Wrote::Moved => match self.ours_at().await? {
                    Some(seq) => at = seq,
                    None => return Ok(false),
                },
            }
        }
        Ok(false)
    }
}

/// Proof of holding a lock of NATS ([`Mutex`](super::Mutex), a side of an
/// [`RwLock`](super::RwLock), a [`Semaphore`](super::Semaphore)'s permit): the key is ours until `lease_deadline`, which the client's
/// watchdog keeps moving. Released by [`release`](LockGuard::release) or, in the background,
/// on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::nats::Mutex) -> distlock::Result<()> {
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => guard.release().await?,
///     reason = guard.lost() => eprintln!("lost: {reason}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct LockGuard {
    hold: Option<Hold>,
}

#[derive(Debug)]
struct Hold {
    leased: Leased,
    state: Arc<HoldState>,
    /// The hold's place in the client's renewals (dropped: renewed no more).
    renewals: crate::watchdog::Ticket,
}

impl LockGuard {
    #[allow(clippy::too_many_arguments)]
    fn new(
        client: Client,
        name: String,
        key: String,
        owner: String,
        token: u64,
        rev: u64,
        mark: Mark,
        sent: Instant,
    ) -> LockGuard {
        let lease = Arc::new(Lease::new(sent, client.lease(), "nats"));
        let state = Arc::new(HoldState {
            client: client.clone(),
            key,
            owner: owner.clone(),
            token,
            rev: tokio::sync::Mutex::new(rev),
            value: std::sync::Mutex::new(mark.value),
            kind: mark.kind,
            permits: mark.permits,
        });
        {
            let mut holds = client.inner.holds.lock().unwrap_or_else(|e| e.into_inner());
            if holds.len() >= 1024 {
                holds.retain(|_, h| h.strong_count() > 0);
            }
            holds.insert(owner, Arc::downgrade(&state));
        }
        let renewals = client.inner.watchdog.watch(lease.clone(), name.clone(), Renew(state.clone()));
        LockGuard { hold: Some(Hold { leased: Leased::new(name, lease), state, renewals }) }
    }

    fn hold(&self) -> &Hold {
        self.hold.as_ref().expect("a guard holds until released")
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.hold().leased.name()
    }

    /// The lock's key in the bucket.
    pub fn key(&self) -> &str {
        &self.hold().state.key
    }

    /// The stream sequence of our create: larger than every token an earlier holder of this
    /// lock got.
    pub fn fencing_token(&self) -> u64 {
        self.hold().state.token
    }

    /// Our mark in the key's value: `host:pid:random`.
    pub fn holder_id(&self) -> &str {
        &self.hold().state.owner
    }

    crate::lease::leased_methods!(|g| g.hold().leased);

    /// Deletes the key now; [`Error::LockLost`](crate::Error::LockLost) if it had been lost or
    /// taken over before.
    pub async fn release(mut self) -> Result<()> {
        let Hold { leased: Leased { name, lease }, state, renewals } =
            self.hold.take().expect("a guard holds until released");
        drop(renewals);
        let before = lease.state(&name);
        if before.is_lost() {
            // Lost, but a renewal may have landed after the deadline: the key goes if ours.
            cleanup(state.clone());
        }
        // A delete whose outcome is unknown (the connection dropped, no answer) is sent again
        // while the lease lasts: it is guarded, and finds an earlier one of ours that landed.
        let deadline = lease.deadline();
        let unlock = async move {
            let mut unanswered = false;
            loop {
                match state.delete().await {
                    Err(e) if e.is_unanswered() && Instant::now() + crate::lease::RETRY < deadline => {
                        tracing::debug!(lock = state.key, error = %e, "release failed; trying again");
                        unanswered = true;
                        tokio::time::sleep(crate::lease::RETRY).await;
                    }
                    // Not ours any more after an unanswered delete, within the lease (nobody else
                    // could have had the key yet): that delete landed.
                    Ok(false) if unanswered => return Ok(true),
                    done => return done,
                }
            }
        };
        lease.release(before, name, unlock, LostReason::KeyDeleted).await
    }
}

/// Deletes the key in the background if it is still ours.
fn cleanup(state: Arc<HoldState>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            if let Err(e) = state.delete().await {
                tracing::warn!(lock = state.key, error = %e, "release failed; the key's TTL frees it instead");
            }
        });
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(Hold { leased, state, renewals }) = self.hold.take() else {
            return;
        };
        drop(renewals);
        leased.lease.end();
        cleanup(state);
    }
}

/// A hold's renewal, as the client's watchdog keeps it: every third of the TTL, one guarded
/// write of the key at the sequence we last wrote.
pub(crate) struct Renew(Arc<HoldState>);

impl crate::watchdog::Check for Renew {
    type Group = ();

    fn group(&self) {}

    fn renew(&self) -> crate::contract::BoxFuture<'static, Renewal> {
        let state = self.0.clone();
        Box::pin(async move { state.rewrite().await })
    }

    /// Lost: a renewal may still land after the deadline; the key goes if it is ours.
    fn lost(&self) {
        cleanup(self.0.clone());
    }
}

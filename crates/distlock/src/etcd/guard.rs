//! The guard of every etcd recipe.

use super::session::Session;
use super::Client;
use crate::lease::{Lease, Leased};
use crate::{Error, LockState, LostReason, Result};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};
use std::sync::Arc;
use tokio::sync::OwnedMutexGuard;

/// Proof of holding an etcd lock (a [`Mutex`](super::Mutex), either side of an
/// [`RwLock`](super::RwLock), or a [`Semaphore`](super::Semaphore) permit): our key, its create
/// revision as the fencing token, and the session lease's deadline. Released by
/// [`release`](LockGuard::release) or, in the background, on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::etcd::Mutex) -> distlock::Result<()> {
/// use distlock::etcd::etcd_client::TxnOp;
/// let guard = lock.lock().await?;
/// // A write that etcd refuses once the lock has passed on:
/// let done = guard.txn_if_held(vec![TxnOp::put("orders/last", "42", None)]).await?;
/// assert!(done.succeeded());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct LockGuard {
    hold: Option<Hold>,
}

struct Hold {
    client: Client,
    leased: Leased,
    key: String,
    rev: i64,
    /// Kept so the keeper keeps the lease alive while we hold.
    _session: Arc<Session>,
    /// The local queue of session-named keys, held until the key is deleted.
    gate: Option<OwnedMutexGuard<()>>,
    /// Our key's watcher on the client's one watch stream: its deletion by anyone else is a
    /// loss, told at once. Taken (cancelling it) before our own delete.
    watch: Option<super::own_keys::OwnWatch>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("key", &self.key).field("revision", &self.rev).finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        client: Client,
        name: String,
        key: String,
        rev: i64,
        lease: Arc<Lease>,
        session: Arc<Session>,
        gate: Option<OwnedMutexGuard<()>>,
    ) -> LockGuard {
        let watch = Some(client.own_keys().watch(&name, &key, rev, session.clone(), &lease));
        let leased = Leased::new(name, lease);
        LockGuard { hold: Some(Hold { client, leased, key, rev, _session: session, gate, watch }) }
    }

    fn hold(&self) -> &Hold {
        self.hold.as_ref().expect("a guard holds until released")
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.hold().leased.name()
    }

    /// Our key, e.g. `orders/694d8b5a1c2f3e07` (what `etcdctl lock` puts in `ETCD_LOCK_KEY`).
    pub fn key(&self) -> &str {
        &self.hold().key
    }

    /// Our mark on the server: our key, as on every backend's guards.
    pub fn holder_id(&self) -> &str {
        &self.hold().key
    }

    /// Our key's create revision: larger than every earlier holder's.
    pub fn fencing_token(&self) -> u64 {
        self.hold().rev as u64
    }

    /// The comparison that holds while we hold the lock: our key exists with our create revision.
    pub fn is_owner(&self) -> Compare {
        let h = self.hold();
        Compare::create_revision(h.key.clone(), CompareOp::Equal, h.rev)
    }

    /// Runs `ops` in one transaction only while our key exists as we created it; the response's
    /// `succeeded()` is false (and nothing was written) once the lock has passed on.
    pub async fn txn_if_held(&self, ops: Vec<TxnOp>) -> Result<TxnResponse> {
        let h = self.hold();
        // The operations are the caller's, and may not be safe to repeat: sent again only if
        // they never left.
        let (etcd, txn) = (h.client.etcd(), Txn::new().when([self.is_owner()]).and_then(ops));
        h.client
            .call_once("guarded transaction", h.leased.name(), || {
                let (mut etcd, txn) = (etcd.clone(), txn.clone());
                async move { etcd.txn(txn).await }
            })
            .await
    }

    crate::lease::leased_methods!(|g| g.hold().leased);

    /// Deletes our key (only if it is still ours) and waits for the server; [`Error::LockLost`]
    /// if the lock had been lost before or the key was gone.
    pub async fn release(mut self) -> Result<()> {
        let before = self.state();
        let mut hold = self.hold.take().expect("a guard holds until released");
        drop(hold.watch.take());
        hold.leased.lease.end();
        let name = hold.leased.name.clone();
        let held = crate::background::detach(unlock(hold)).await?;
        match (before, held) {
            (LockState::Lost(reason), _) => Err(Error::LockLost { lock: name, reason }),
            (_, false) => Err(Error::LockLost { lock: name, reason: LostReason::KeyDeleted }),
            _ => Ok(()),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(mut hold) = self.hold.take() else { return };
        drop(hold.watch.take());
        hold.leased.lease.end();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let name = hold.leased.name.clone();
                if let Err(e) = unlock(hold).await {
                    tracing::warn!(lock = name, error = %e, "release on drop failed; the session lease frees it");
                }
            });
        }
    }
}

/// Deletes our key if it is still ours; true if it was. The local gate opens after.
async fn unlock(hold: Hold) -> Result<bool> {
    let Hold { client, leased: Leased { name, .. }, key, rev, gate, .. } = hold;
    let etcd = client.etcd();
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    // Sent again after a lost answer, "not ours" with the key gone means the first try deleted it.
    let done = client
        .call("release", &name, |attempt| {
            let (mut etcd, txn) = (etcd.clone(), txn.clone());
            async move {
                let resp = etcd.txn(txn).await?;
                let gone = matches!(resp.op_responses().first(), Some(TxnOpResponse::Get(g)) if g.kvs().is_empty());
                Ok(resp.succeeded() || (attempt > 0 && gone))
            }
        })
        .await;
    drop(gate);
    done
}

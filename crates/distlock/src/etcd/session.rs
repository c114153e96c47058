//! The client's session: one etcd lease that every lock key of the client is put under, kept
//! alive by one task, and the leases (deadlines and states) of the guards that depend on it.
//!
//! The keeper sends a keep-alive every third of the TTL. An answer with a TTL confirms the
//! session as of the request's send time, for every guard at once (one timer per client, not per
//! guard). An answer with TTL 0 means the server has revoked or expired the lease: every guard is
//! `Lost(SessionExpired)` at once. No answer by the deadline (send time of the last confirmed
//! keep-alive plus the TTL, less a drift margin) is `Lost(LeaseExpired)`: the server cannot have
//! expired the lease before then, so the loss is reported before the keys can go. A lost session
//! is never revived; the client grants a new one for later acquires.

use crate::lease::Lease;
use crate::{LockState, LostReason};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

pub(crate) struct Session {
    /// The lease's id: the `<lease hex>` in mutex keys.
    pub(crate) id: i64,
    /// The TTL the server granted.
    pub(crate) ttl: Duration,
    /// The session's own lease state: lost when the session is.
    pub(crate) lease: Arc<Lease>,
    /// The guards' leases, confirmed and lost with the session's.
    guards: StdMutex<Vec<Weak<Lease>>>,
    keeper: StdMutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("lease", &format_args!("{:x}", self.id)).field("ttl", &self.ttl).finish()
    }
}

impl Session {
    /// Grants a lease of `ttl` and starts keeping it alive.
    pub(crate) async fn grant(
        mut etcd: etcd_client::Client,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Arc<Session>, etcd_client::Error> {
        let sent = Instant::now();
        let granted =
            tokio::time::timeout(timeout, etcd.lease_grant(ttl.as_secs() as i64, None)).await.map_err(|_| {
                etcd_client::Error::LeaseKeepAliveError(format!("no answer to the lease grant in {timeout:?}"))
            })??;
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let session = Arc::new(Session {
            id: granted.id(),
            ttl,
            lease: Arc::new(Lease::new(sent, ttl)),
            guards: StdMutex::new(Vec::new()),
            keeper: StdMutex::new(None),
        });
        let keeper = tokio::spawn(keep(etcd, Arc::downgrade(&session), timeout));
        *session.keeper.lock().unwrap_or_else(|e| e.into_inner()) = Some(keeper);
        Ok(session)
    }

    /// True until the session is lost (published, or its deadline passed).
    pub(crate) fn live(&self) -> bool {
        !self.lease.state("etcd session").is_lost()
    }

    /// A lease for a new guard, confirmed and lost with the session's; `None` if the session is
    /// lost already.
    pub(crate) fn guard_lease(&self) -> Option<Arc<Lease>> {
        let mut guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
        if !self.live() {
            return None;
        }
        // The session's deadline less the TTL is the send time of its last confirmed request.
        let confirmed = self.lease.deadline() + crate::lease::drift(self.ttl) - self.ttl;
        let lease = Arc::new(Lease::new(confirmed, self.ttl));
        guards.retain(|g| g.strong_count() > 0);
        guards.push(Arc::downgrade(&lease));
        Some(lease)
    }

    /// Every lease that depends on the session, the session's own first.
    fn all(&self) -> Vec<Arc<Lease>> {
        let guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
        std::iter::once(self.lease.clone()).chain(guards.iter().filter_map(Weak::upgrade)).collect()
    }

    fn confirmed(&self, sent: Instant) {
        for lease in self.all() {
            lease.confirmed(sent, "etcd session");
        }
    }

    fn publish(&self, state: LockState) {
        // The session's own state first: a guard lease made after this sees it (and is refused);
        // one made before is in the list collected after it.
        self.lease.publish(state, "etcd session");
        for lease in self.all().into_iter().skip(1) {
            lease.publish(state, "etcd session");
        }
    }

    /// Stops keeping the lease alive (the caller revokes it).
    pub(crate) fn stop(&self) {
        if let Some(k) = self.keeper.lock().unwrap_or_else(|e| e.into_inner()).take() {
            k.abort();
        }
        // Ended by us (the client closed): quietly, as a released guard's lease ends.
        for lease in self.all() {
            lease.end();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            k.abort();
        }
    }
}

/// The keep-alive loop (see the module's text). Holds the session weakly: a session nobody
/// uses any more is not kept alive.
async fn keep(mut etcd: etcd_client::Client, session: Weak<Session>, timeout: Duration) {
    let Some((id, ttl, lease)) = session.upgrade().map(|s| (s.id, s.ttl, s.lease.clone())) else { return };
    let period = ttl / 3;
    let mut retry = Duration::from_millis(50);
    'stream: loop {
        // (Re)open the keep-alive stream; its first answer is a renewal too.
        let sent = Instant::now();
        let deadline = lease.deadline();
        if sent >= deadline {
            return lost(&session, LostReason::LeaseExpired);
        }
        let opened = tokio::time::timeout_at(deadline.min(sent + timeout), etcd.lease_keep_alive(id)).await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(e))) if e.contains("not found") => {
                return lost(&session, LostReason::SessionExpired);
            }
            Ok(Err(e)) => {
                tracing::debug!(lease = format_args!("{id:x}"), error = %e, "keep-alive stream failed");
                let Some(s) = session.upgrade() else { return };
                s.publish(LockState::Suspended);
                drop(s);
                tokio::time::sleep(retry.min(lease.deadline().saturating_duration_since(Instant::now()) / 2)).await;
                retry = (retry * 2).min(Duration::from_secs(1));
                continue 'stream;
            }
            Err(_) => {
                let Some(s) = session.upgrade() else { return };
                s.publish(LockState::Suspended);
                continue 'stream;
            }
        };
        retry = Duration::from_millis(50);
        match session.upgrade() {
            Some(s) => s.confirmed(sent),
            None => return,
        }
        loop {
            let left = lease.deadline().saturating_duration_since(Instant::now());
            tokio::time::sleep(period.min(left / 2)).await;
            if session.strong_count() == 0 {
                return;
            }
            let deadline = lease.deadline();
            let sent = Instant::now();
            if sent >= deadline {
                return lost(&session, LostReason::LeaseExpired);
            }
            let answer = tokio::time::timeout_at(deadline.min(sent + timeout), async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match answer {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => match session.upgrade() {
                    Some(s) => s.confirmed(sent),
                    None => return,
                },
                Ok(Ok(Some(_))) => return lost(&session, LostReason::SessionExpired),
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    // A stream that ended, failed or went quiet: suspended; open a new one while
                    // time is left (at the deadline the lease is lost).
                    if let Some(s) = session.upgrade() {
                        s.publish(LockState::Suspended);
                    }
                    continue 'stream;
                }
            }
        }
    }
}

fn lost(session: &Weak<Session>, reason: LostReason) {
    if let Some(s) = session.upgrade() {
        s.publish(LockState::Lost(reason));
    }
}

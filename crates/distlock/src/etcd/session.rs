//! The client's session: one etcd lease that every lock key of the client is put under, kept
//! alive by one task, and the leases (deadlines and states) of the guards that depend on it.
//!
//! The keeper sends a keep-alive every third of the TTL. An answer with a TTL confirms the
//! session as of the request's send time, for every guard at once (one timer per client, not per
//! guard). An answer with TTL 0 means the server has revoked or expired the lease: every guard is
//! `Lost(SessionExpired)` at once. No answer by the deadline (send time of the last confirmed
//! keep-alive plus the TTL, less a drift margin) is `Lost(LeaseExpired)`: the server cannot have
//! expired the lease before then, so the loss is reported before the keys can go. A lost session
//! is never revived; the client grants a new one for later acquires. The loop is the crate's one
//! renewal loop ([`Lease::keep`]); the guards' leases follow the session's ([`Lease::follower`]).

use crate::lease::{Lease, Renewal};
use crate::LostReason;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::time::Instant;

pub(crate) struct Session {
    /// The lease's id: the `<lease hex>` in mutex keys.
    pub(crate) id: i64,
    /// The TTL the server granted.
    pub(crate) ttl: Duration,
    /// The session's own lease state: lost when the session is. The guards' leases follow it.
    pub(crate) lease: Arc<Lease>,
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
        let lease = Arc::new(Lease::carrier(sent, ttl, "etcd"));
        let keeper = tokio::spawn(keep(etcd, granted.id(), lease.clone(), ttl, timeout));
        Ok(Arc::new(Session { id: granted.id(), ttl, lease, keeper: StdMutex::new(Some(keeper)) }))
    }

    /// True until the session is lost (published, or its deadline passed).
    pub(crate) fn live(&self) -> bool {
        !self.lease.state(NAME).is_lost()
    }

    /// A lease for a new guard, confirmed and lost with the session's; `None` if the session is
    /// lost already.
    pub(crate) fn guard_lease(&self) -> Option<Arc<Lease>> {
        if !self.live() {
            return None;
        }
        self.lease.follower()
    }

    /// Stops keeping the lease alive (the caller revokes it).
    pub(crate) fn stop(&self) {
        if let Some(k) = self.keeper.lock().unwrap_or_else(|e| e.into_inner()).take() {
            k.abort();
        }
        // Ended by us (the client closed): quietly, as a released guard's lease ends.
        self.lease.end();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(k) = self.keeper.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            k.abort();
        }
    }
}

/// The name the session's state changes are logged under.
const NAME: &str = "etcd session";

/// The keep-alive loop (see the module's text): the one renewal loop ([`Lease::keep`]) over a
/// keep-alive stream, opened again after it fails or goes quiet for `timeout`. Ends with the
/// session (which aborts it) or when the lease is lost.
async fn keep(etcd: etcd_client::Client, id: i64, lease: Arc<Lease>, ttl: Duration, timeout: Duration) {
    let stream = Arc::new(tokio::sync::Mutex::new(None));
    let renew = || {
        let (mut etcd, stream) = (etcd.clone(), stream.clone());
        async move {
            let mut stream = stream.lock().await;
            // The TTL of the answer, or `None` if the stream ended.
            let answer = tokio::time::timeout(timeout, async {
                match stream.as_mut() {
                    // The stream's first answer, read when it opens, is a renewal too.
                    None => etcd.lease_keep_alive(id).await.map(|pair| {
                        *stream = Some(pair);
                        Some(1)
                    }),
                    Some((keeper, answers)) => {
                        keeper.keep_alive().await?;
                        Ok(answers.message().await?.map(|a| a.ttl()))
                    }
                }
            })
            .await;
            match answer {
                Ok(Ok(Some(ttl))) if ttl > 0 => Renewal::Renewed,
                // An answer with TTL 0: the server has revoked or expired the lease.
                Ok(Ok(Some(_))) => Renewal::Gone(LostReason::SessionExpired),
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(e))) if e.contains("not found") => {
                    Renewal::Gone(LostReason::SessionExpired)
                }
                failed => {
                    // A stream that failed, ended or went quiet: open a new one next time.
                    if let Ok(Err(e)) = &failed {
                        tracing::debug!(lease = format_args!("{id:x}"), error = %e, "keep-alive stream failed");
                    }
                    *stream = None;
                    Renewal::Failed
                }
            }
        }
    };
    lease.keep(NAME, ttl / 3, renew).await;
}

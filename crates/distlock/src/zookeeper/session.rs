//! What every recipe needs to know about the session: how a client error is to be read, waiting
//! for a reconnection, deleting our own nodes for sure, and the **lease deadline**.
//!
//! # Errors
//! `zookeeper-client` reports a lost connection in several ways: `ConnectionLoss` for a clean
//! close, `Custom(..)` for a reset or for a connection that stopped answering ("no response from
//! connection in …ms"). All of them mean the same thing to a lock: the request may or may not
//! have been applied, and the session may still be alive. [`Failure::of`] sorts every error
//! into one of three kinds, and recipes act on the kind, never on a single variant.
//!
//! # The lease deadline
//! A ZooKeeper server expires a session no earlier than the negotiated timeout after the last
//! packet it received from the client; only then are its ephemeral nodes deleted and the lock
//! handed on. If the server answered a request we sent at instant `s`, it heard from us at `s` or
//! later, so it cannot hand our locks on before `s + timeout` on its clock. The client keeps the
//! latest such `s` (of any request of ours, and of a heartbeat `sync` sent while locks are held)
//! and publishes `s + timeout - margin` as the lease deadline: the last instant at which we
//! still know we hold. The margin covers clock-rate drift between the machines and, in an
//! ensemble, the delay with which a follower passes session activity on to the leader (at most
//! half a tick, and a tick is at most half the minimum session timeout). It assumes our own
//! process is not paused between reading the clock and acting on it; only fencing tokens cover
//! that case.

use super::Client;
use crate::{Error, LostReason, Result};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use zookeeper_client as zk;

/// The kinds of failure a recipe tells apart.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The connection failed (closed, reset, silent, or a garbled reply that made the client
    /// drop it): the request may or may not have been applied, the session may be alive. Retry
    /// after reconnecting.
    Connection,
    /// The session is gone for good (expired, closed, authentication failed).
    SessionGone(LostReason),
    /// The server answered with an error code (NoNode, NodeExists, …).
    Server,
    /// The client refused the request itself (bad arguments): nothing reached the server.
    Local,
}

impl Failure {
    pub(crate) fn of(e: &zk::Error) -> Failure {
        use zk::Error as E;
        match e {
            E::SessionExpired => Failure::SessionGone(LostReason::SessionExpired),
            E::ClientClosed | E::NoHosts => Failure::SessionGone(LostReason::SessionClosed),
            E::AuthFailed => Failure::SessionGone(LostReason::AuthFailed),
            // The error that ends a connection is handed to every request in flight on it; a
            // moved session is re-established by the client on its next connection.
            E::ConnectionLoss
            | E::Custom(_)
            | E::Timeout
            | E::UnexpectedError(_)
            | E::UnmarshalError { .. }
            | E::SessionMoved => Failure::Connection,
            E::NoNode
            | E::NoAuth
            | E::BadVersion
            | E::NoChildrenForEphemerals
            | E::NodeExists
            | E::NotEmpty
            | E::InvalidAcl
            | E::NotReadOnly
            | E::NoWatcher
            | E::QuotaExceeded
            | E::Throttled
            | E::MarshallingError
            | E::Unimplemented
            | E::ReconfigDisabled
            | E::UnexpectedErrorCode(_) => Failure::Server,
            _ => Failure::Local,
        }
    }
}

/// True when `e` means the connection failed and the session may be alive.
pub(crate) fn is_connection_loss(e: &zk::Error) -> bool {
    matches!(Failure::of(e), Failure::Connection)
}

/// The error to report when the session ended.
pub(crate) fn session_error(reason: LostReason) -> Error {
    match reason {
        LostReason::SessionExpired => Error::SessionExpired,
        _ => Error::Closed,
    }
}

/// Waits until the session is connected again, or has ended (an error). Never longer than the
/// session: `zookeeper-client` declares the session expired when it cannot reconnect within it.
pub(crate) async fn await_connected(zk: &zk::Client) -> Result<()> {
    let mut states = zk.state_watcher();
    loop {
        match states.state() {
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => return Ok(()),
            zk::SessionState::Expired => return Err(Error::SessionExpired),
            zk::SessionState::Closed | zk::SessionState::AuthFailed => return Err(Error::Closed),
            zk::SessionState::Disconnected => {
                states.changed().await;
            }
        }
    }
}

/// What became of a node we deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// Our delete removed it.
    Now,
    /// It was not there (deleted before, perhaps by an earlier attempt of ours).
    AlreadyGone,
    /// The session ended, and the server deletes ephemeral nodes with it.
    WithSession(LostReason),
}

/// Retries of one delete at most (20 ms apart while the session reads as connected: 10 s).
const DELETE_ATTEMPTS: u32 = 500;

/// Deletes one of our own nodes for sure: retried across connection losses until the server
/// confirms or the session is known to be gone (which deletes it too). A `NoNode` answer to a
/// retry counts as our own earlier attempt having been applied (its reply was lost).
pub(crate) async fn delete_own(client: &Client, path: &str) -> Result<Deleted> {
    let zk = client.zk();
    let mut retried = false;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let sent = Instant::now();
        client.inner.metrics.sent(1);
        let result = zk.delete(path, None).await;
        client.lease().observe(sent, &result);
        match result {
            Ok(()) => return Ok(Deleted::Now),
            Err(zk::Error::NoNode) if retried => return Ok(Deleted::Now),
            Err(zk::Error::NoNode) => return Ok(Deleted::AlreadyGone),
            Err(e) => match Failure::of(&e) {
                // The simulation's planted defect: a release whose reply was lost gives up,
                // leaving its node for the session's life, as before 98085a8 and cece324.
                Failure::Connection if super::sim::planted("release-leak") => {
                    return Err(super::backend("delete", path, e));
                }
                Failure::Connection => {
                    retried = true;
                    if let Err(e) = await_connected(zk).await {
                        return Ok(Deleted::WithSession(lost_reason(&e)));
                    }
                    // The session reads as connected although the request failed as if the
                    // connection had (the client has not noticed yet, or answers at once): pause,
                    // so the retry never spins on a worker thread, and give up after a bound
                    // (the node then goes with the session).
                    if attempts >= DELETE_ATTEMPTS {
                        return Err(super::backend("delete", path, e));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Failure::SessionGone(reason) => return Ok(Deleted::WithSession(reason)),
                Failure::Server | Failure::Local => return Err(super::backend("delete", path, e)),
            },
        }
    }
}

/// The loss reason behind a session error of ours.
pub(crate) fn lost_reason(e: &Error) -> LostReason {
    match e {
        Error::SessionExpired => LostReason::SessionExpired,
        _ => LostReason::SessionClosed,
    }
}

/// The lease of a session: when the server last provably heard from us.
#[derive(Debug)]
pub(crate) struct Lease {
    base: Instant,
    /// Nanoseconds after `base` at which the newest answered request was sent.
    last_ack: AtomicU64,
    timeout: Duration,
    margin: Duration,
    /// Live lock nodes; the heartbeat runs only while there are some.
    holders: AtomicUsize,
    wake: Notify,
}

impl Lease {
    /// A lease that starts at `connected` (the session was established by a reply to a request
    /// sent after this instant).
    pub(crate) fn new(connected: Instant, timeout: Duration, margin: Duration) -> Lease {
        Lease {
            base: connected,
            last_ack: AtomicU64::new(0),
            timeout,
            margin,
            holders: AtomicUsize::new(0),
            wake: Notify::new(),
        }
    }

    /// Records that the server answered a request we sent at `sent` (a server error is an
    /// answer too; a connection failure is not). Only for requests that pass through the
    /// ensemble's leader (`sync` and writes): a follower cut off from the leader may still answer
    /// reads on its own, and the leader alone expires sessions.
    pub(crate) fn observe<T>(&self, sent: Instant, result: &std::result::Result<T, zk::Error>) {
        let answered = match result {
            Ok(_) => true,
            Err(e) => matches!(Failure::of(e), Failure::Server),
        };
        if answered {
            let at = sent.saturating_duration_since(self.base).as_nanos() as u64;
            self.last_ack.fetch_max(at, Ordering::AcqRel);
        }
    }

    /// The last instant at which the server cannot yet have expired our session.
    pub(crate) fn deadline(&self) -> Instant {
        let acked = self.base + Duration::from_nanos(self.last_ack.load(Ordering::Acquire));
        if super::sim::planted("no-lease-deadline") {
            // The simulation's planted defect: no lease deadline of our own, as before 98085a8;
            // a holder learns of its loss only from the server.
            return acked + Duration::from_secs(86_400);
        }
        acked + self.timeout.saturating_sub(self.margin)
    }

    /// How often the heartbeat renews the lease while locks are held.
    fn interval(&self) -> Duration {
        (self.timeout / 6).max(Duration::from_millis(50))
    }

    pub(crate) fn hold(&self) {
        if self.holders.fetch_add(1, Ordering::AcqRel) == 0 {
            self.wake.notify_one();
        }
    }

    pub(crate) fn unhold(&self) {
        self.holders.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Renews the lease now with a `sync` when less than a quarter of the session is left of it (a
/// grant right after a long disconnection would otherwise start with a lapsed lease). Errors are
/// left to the caller's next request to find.
pub(crate) async fn renew_if_short(client: &Client) {
    let lease = client.lease();
    if lease.deadline() > Instant::now() + lease.timeout / 4 {
        return;
    }
    let sent = Instant::now();
    let result = client.zk().sync("/").await;
    lease.observe(sent, &result);
}

/// The default margin kept before the session timeout: the one rule ([`crate::lease_margin::margin`]) with a
/// quarter of the timeout for a follower's reporting delay.
pub(crate) fn default_margin(timeout: Duration) -> Duration {
    crate::lease_margin::margin(timeout, timeout / 4)
}

/// Renews the lease of `client` with a `sync` every lease interval while it has live lock nodes.
/// Holds only a weak reference, so it never keeps the session open; ends with the client.
pub(crate) async fn heartbeat(client: Weak<super::Inner>) {
    loop {
        let Some(inner) = client.upgrade() else { return };
        let lease: Arc<Lease> = inner.lease.clone();
        if lease.holders.load(Ordering::Acquire) == 0 {
            let woken = lease.wake.notified();
            drop(inner);
            // Re-check after registering, so a hold() in between is not missed.
            if lease.holders.load(Ordering::Acquire) == 0 {
                tokio::select! {
                    _ = woken => {}
                    _ = tokio::time::sleep(lease.interval() * 4) => {}
                }
            }
            continue;
        }
        let sent = Instant::now();
        // Held only while the sync is outstanding (bounded); guards keep the session open anyway.
        let result = tokio::time::timeout(lease.interval() * 2, inner.zk.sync("/")).await;
        drop(inner);
        if let Ok(result) = result {
            lease.observe(sent, &result);
            if let Err(e) = &result {
                if let Failure::SessionGone(_) = Failure::of(e) {
                    return;
                }
            }
        }
        tokio::time::sleep_until(sent + lease.interval()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_failure_is_a_connection_loss() {
        assert!(is_connection_loss(&zk::Error::ConnectionLoss));
        assert!(is_connection_loss(&zk::Error::Timeout));
        assert!(matches!(Failure::of(&zk::Error::SessionExpired), Failure::SessionGone(LostReason::SessionExpired)));
        assert!(matches!(Failure::of(&zk::Error::ClientClosed), Failure::SessionGone(LostReason::SessionClosed)));
        assert!(matches!(Failure::of(&zk::Error::NoNode), Failure::Server));
        assert!(is_connection_loss(&zk::Error::UnexpectedError("recv response with xid 7".into())));
        assert!(matches!(Failure::of(&zk::Error::BadArguments(&"path")), Failure::Local));
    }

    #[tokio::test(start_paused = true)]
    async fn lease_deadline_follows_the_newest_answered_send() {
        let start = Instant::now();
        let lease = Lease::new(start, Duration::from_secs(10), Duration::from_secs(3));
        assert_eq!(lease.deadline(), start + Duration::from_secs(7));
        tokio::time::advance(Duration::from_secs(2)).await;
        let sent = Instant::now();
        lease.observe(sent, &Err::<(), _>(zk::Error::ConnectionLoss));
        assert_eq!(lease.deadline(), start + Duration::from_secs(7), "a lost reply renews nothing");
        lease.observe(sent, &Err::<(), _>(zk::Error::NoNode));
        assert_eq!(lease.deadline(), sent + Duration::from_secs(7), "a server error is an answer");
        lease.observe(start, &Ok(()));
        assert_eq!(lease.deadline(), sent + Duration::from_secs(7), "an older answer does not move it back");
    }
}

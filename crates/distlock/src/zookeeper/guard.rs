//! A held lock node: fencing token, state machine, release.
//!
//! States: `Held` -> `Suspended` (connection lost, session may still be alive) -> `Held` (the
//! connection came back within the session) or `Lost` (the session expired or closed, our node
//! was deleted, or the lease deadline passed without an answer from the server). `Lost` is final.
//! Only a session the client knows to be gone, a deletion seen on the server, or the lease
//! deadline make a guard `Lost`; a failed connection of any kind makes it `Suspended`.

use super::monitor::{self, Node};
use super::session::{delete_own, is_connection_loss, Deleted, Failure};
use super::{backend, Client};
use crate::{Error, LockState, LostReason, Result};
use std::sync::Arc;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

/// The state every recipe's guard shares.
#[derive(Debug)]
pub(crate) struct HeldNode {
    client: Client,
    /// The lock (directory) path, for messages.
    lock: String,
    token: u64,
    handle: Handle,
    /// Our node, as the session's monitor follows it.
    node: Arc<Node>,
    released: bool,
}

/// Data a revoker writes into a holder's node to ask it to release (Curator's value).
pub(crate) const REVOKE: &[u8] = b"__REVOKE__";

impl HeldNode {
    /// A held node with fencing token `token` (the creation zxid of the node that began the hold).
    pub(crate) fn new(client: Client, lock: String, path: String, token: i64) -> HeldNode {
        client.lease().hold();
        HeldNode {
            client,
            lock,
            token: token as u64,
            handle: Handle::current(),
            node: Arc::new(Node::new(path)),
            released: false,
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Resolves once someone has asked this holder to release (data `__REVOKE__` on our node).
    pub(crate) fn revocation_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let _ = self.watch(); // make sure the monitor follows our node
        let mut rx = self.node.revoke().subscribe();
        async move {
            if rx.wait_for(|r| *r).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    pub(crate) fn node_path(&self) -> &str {
        &self.node.path
    }

    pub(crate) fn lock_path(&self) -> &str {
        &self.lock
    }

    pub(crate) fn lease_deadline(&self) -> std::time::Instant {
        self.client.lease().deadline().into_std()
    }

    /// Has the session's monitor follow our node (once); returns a receiver of the state.
    pub(crate) fn watch(&self) -> watch::Receiver<LockState> {
        if !self.released {
            monitor::watch(&self.client, &self.node, &self.handle);
        }
        self.node.tx.subscribe()
    }

    /// The state now. Besides what the monitor has published, it reads the clock against the
    /// lease deadline and the session's state itself, so that no caller is told `Held` after the
    /// deadline, however late the monitor runs (or on the very first call, which registers the node).
    pub(crate) fn state(&self) -> LockState {
        let _ = self.watch();
        self.state_now()
    }

    /// [`HeldNode::state`] without registering with the monitor (for a release, whose delete
    /// finds out itself whether the node is still there, or a grant's last check).
    pub(crate) fn state_now(&self) -> LockState {
        let published = *self.node.tx.borrow();
        if published.is_lost() {
            return published;
        }
        if Instant::now() >= self.client.lease().deadline() {
            // Final: published, so that a late renewal cannot turn it back. Found here first, the
            // node leaves the monitor and is deleted as the monitor would have.
            if self.node.publish_lost(LostReason::LeaseExpired)
                && !self.released
                && monitor::unwatch(&self.client, &self.node)
            {
                let (client, path) = (self.client.clone(), self.node.path.clone());
                self.handle.spawn(async move { monitor::delete_after_lease(&client, &path).await });
            }
            return LockState::Lost(LostReason::LeaseExpired);
        }
        match self.client.zk().state_watcher().peek_state() {
            zk::SessionState::Disconnected => LockState::Suspended,
            zk::SessionState::Expired => LockState::Lost(LostReason::SessionExpired),
            zk::SessionState::Closed => LockState::Lost(LostReason::SessionClosed),
            zk::SessionState::AuthFailed => LockState::Lost(LostReason::AuthFailed),
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => published,
        }
    }

    pub(crate) fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let mut rx = self.watch();
        async move {
            loop {
                if let LockState::Lost(reason) = *rx.borrow_and_update() {
                    return reason;
                }
                if rx.changed().await.is_err() {
                    // The guard is gone: the lock was released, so it is no longer ours either.
                    return LostReason::SessionClosed;
                }
            }
        }
    }

    /// Deletes our node and waits for the server's answer, retrying across connection losses
    /// until the server confirms or the session is known to be gone.
    ///
    /// Reports [`Error::LockLost`] when the lock had been lost before (the node was deleted by
    /// someone else, the session ended, or the lease deadline passed while the server was
    /// unreachable): the caller's work under it was not protected to the end.
    pub(crate) async fn release(mut self) -> Result<()> {
        self.released = true;
        monitor::unwatch(&self.client, &self.node);
        let before = self.state_now();
        // In a task of its own: a caller that stops waiting (a timeout, a select) does not stop
        // the delete.
        let (client, path) = (self.client.clone(), self.node.path.clone());
        let outcome = self.handle.spawn(async move { delete_own(&client, &path).await }).await.unwrap_or_else(|e| {
            Err(Error::Backend { op: "delete", path: self.node.path.clone(), source: Box::new(e) })
        })?;
        let lost = |reason| Err(Error::LockLost { lock: self.lock.clone(), reason });
        match (before, outcome) {
            (LockState::Lost(reason), _) => lost(reason),
            (_, Deleted::Now) => Ok(()),
            (_, Deleted::AlreadyGone) => lost(LostReason::NodeDeleted),
            (_, Deleted::WithSession(reason)) => lost(reason),
        }
    }
}

impl Drop for HeldNode {
    fn drop(&mut self) {
        monitor::unwatch(&self.client, &self.node);
        self.client.lease().unhold();
        if self.released {
            return;
        }
        // The delete is queued on the session now; every later request of this session is
        // ordered after it, so nothing of ours can observe the lock as still held. The reply is
        // awaited in the background, and the delete retried until the server confirms or the
        // session is gone.
        let client = self.client.clone();
        let path = self.node.path.clone();
        client.inner.metrics.sent_background(1);
        let sent = tokio::time::Instant::now();
        let first = client.zk().delete(&path, None);
        self.handle.spawn(async move {
            let result = first.await;
            client.lease().observe(sent, &result);
            let result = match result {
                Err(e) if is_connection_loss(&e) => delete_own(&client, &path).await.map(|_| ()),
                Ok(()) | Err(zk::Error::NoNode) => Ok(()),
                Err(e) => match Failure::of(&e) {
                    Failure::SessionGone(_) => Ok(()),
                    _ => Err(backend("delete", &path, e)),
                },
            };
            if let Err(e) = result {
                tracing::warn!(node = %path, error = %e, "could not delete lock node on drop");
            }
        });
    }
}

/// The accessors every guard made of one [`HeldNode`] (field `node`) offers.
macro_rules! guard_methods {
    () => {
        /// A number larger than every earlier holder's token on this lock path (the creation zxid of
        /// our node), also after the lock directory was deleted and re-created. Give it to storage
        /// that rejects writes carrying a smaller token than it has seen: that, not the lock alone,
        /// keeps a paused or partitioned former holder from doing harm.
        pub fn fencing_token(&self) -> u64 {
            self.node.token()
        }

        /// The lock path.
        pub fn lock_path(&self) -> &str {
            self.node.lock_path()
        }

        /// Our node's full path.
        pub fn node_path(&self) -> &str {
            self.node.node_path()
        }

        /// The lock's name: its path, as on every backend's guards.
        pub fn name(&self) -> &str {
            self.node.lock_path()
        }

        /// Our mark on the server: our node's full path, as on every backend's guards.
        pub fn holder_id(&self) -> &str {
            self.node.node_path()
        }

        /// The lease deadline: the last instant at which the server provably cannot yet have
        /// expired our session and handed this lock on, given the replies received so far. It
        /// moves forward while the server answers (a heartbeat renews it while locks are held);
        /// while the server is unreachable it stands still, and when it passes the guard becomes
        /// `Lost(LeaseExpired)`. Stop work that must not overlap the next holder before it.
        pub fn lease_deadline(&self) -> std::time::Instant {
            self.node.lease_deadline()
        }

        /// The current state; the first call starts watching our node.
        pub fn state(&self) -> crate::zookeeper::LockState {
            self.node.state()
        }

        /// A receiver of state changes (held, suspended, lost).
        pub fn state_changes(&self) -> tokio::sync::watch::Receiver<crate::zookeeper::LockState> {
            self.node.watch()
        }

        /// Resolves when the lock can no longer be trusted: the session expired or closed, our node
        /// was deleted by someone else, or the [lease deadline](Self::lease_deadline) passed while the
        /// server did not answer. A connection loss alone (`Suspended`) does not resolve it; see
        /// [`state_changes`](Self::state_changes) for that.
        pub fn lost(&self) -> impl std::future::Future<Output = crate::LostReason> + Send + 'static {
            self.node.lost()
        }

        /// Resolves when someone asks this holder to release (see
        /// [`Client::revoke`](crate::zookeeper::Client::revoke)). Opt-in: a holder that never awaits this is not
        /// affected by revocation requests.
        pub fn revocation_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
            self.node.revocation_requested()
        }
    };
}
pub(crate) use guard_methods;

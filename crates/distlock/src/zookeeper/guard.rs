//! A held lock node: fencing token, state machine, release.
//!
//! States: `Held` -> `Suspended` (connection lost, session may still be alive) -> `Held` (the
//! connection came back within the session) or `Lost` (the session expired or closed, or our node
//! was deleted). `Lost` is final.

use super::{await_connected, backend, Client};
use crate::{Error, LostReason, Result};
use std::sync::{Arc, OnceLock};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use zookeeper_client as zk;

/// What a guard knows about its lock right now.
///
/// # Examples
///
/// ```
/// use distlock::{zookeeper::LockState, LostReason};
/// assert!(LockState::Held.is_held());
/// assert!(!LockState::Suspended.is_held());
/// assert!(LockState::Lost(LostReason::SessionExpired).is_lost());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockState {
    /// The lock node exists and the session is connected.
    Held,
    /// The connection to the server is lost. The session (and the lock) may still be alive, but
    /// until the connection returns nobody can tell: treat the lock as uncertain. If the session
    /// expires meanwhile, the state becomes `Lost`.
    Suspended,
    /// The lock is gone; another contender may hold it. Final.
    Lost(LostReason),
}

impl LockState {
    /// True only in `Held`.
    pub fn is_held(self) -> bool {
        self == LockState::Held
    }

    /// True in `Lost`.
    pub fn is_lost(self) -> bool {
        matches!(self, LockState::Lost(_))
    }
}

/// The state every recipe's guard shares.
#[derive(Debug)]
pub(crate) struct HeldNode {
    client: Client,
    /// The lock (directory) path, for messages.
    lock: String,
    /// Our node.
    path: String,
    token: u64,
    handle: Handle,
    shared: Arc<Shared>,
    released: bool,
}

#[derive(Debug)]
struct Shared {
    tx: watch::Sender<LockState>,
    revoke: watch::Sender<bool>,
    monitor: OnceLock<AbortHandle>,
}

/// Data a revoker writes into a holder's node to ask it to release (Curator's value).
pub(crate) const REVOKE: &[u8] = b"__REVOKE__";

impl HeldNode {
    pub(crate) fn new(client: Client, lock: String, path: String, czxid: i64) -> HeldNode {
        let (tx, _) = watch::channel(LockState::Held);
        let (revoke, _) = watch::channel(false);
        HeldNode {
            client,
            lock,
            path,
            token: czxid as u64,
            handle: Handle::current(),
            shared: Arc::new(Shared { tx, revoke, monitor: OnceLock::new() }),
            released: false,
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Resolves once someone has asked this holder to release (data `__REVOKE__` on our node).
    pub(crate) fn revocation_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let _ = self.watch(); // make sure the monitor runs
        let mut rx = self.shared.revoke.subscribe();
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
        &self.path
    }

    pub(crate) fn lock_path(&self) -> &str {
        &self.lock
    }

    /// Starts watching our node and the session (once); returns a receiver of the state.
    pub(crate) fn watch(&self) -> watch::Receiver<LockState> {
        self.shared.monitor.get_or_init(|| {
            let task =
                monitor(self.client.clone(), self.path.clone(), self.shared.tx.clone(), self.shared.revoke.clone());
            self.handle.spawn(task).abort_handle()
        });
        self.shared.tx.subscribe()
    }

    pub(crate) fn state(&self) -> LockState {
        *self.watch().borrow()
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

    /// Deletes our node and waits for the server's answer.
    pub(crate) async fn release(mut self) -> Result<()> {
        self.released = true;
        self.stop_monitor();
        let zk = self.client.zk();
        let mut attempts = 0;
        let mut after_loss = false;
        loop {
            attempts += 1;
            self.client.inner.metrics.sent(1);
            match zk.delete(&self.path, None).await {
                Ok(()) => return Ok(()),
                // A delete sent before a connection loss may have been applied.
                Err(zk::Error::NoNode) if after_loss => return Ok(()),
                Err(zk::Error::NoNode) => {
                    return Err(Error::LockLost { lock: self.lock.clone(), reason: LostReason::NodeDeleted })
                }
                Err(zk::Error::SessionExpired) => {
                    return Err(Error::LockLost { lock: self.lock.clone(), reason: LostReason::SessionExpired })
                }
                Err(zk::Error::ConnectionLoss) if attempts < 5 => {
                    after_loss = true;
                    await_connected(zk, self.client.session_timeout()).await?;
                }
                Err(e) => return Err(backend("delete", &self.path, e)),
            }
        }
    }

    fn stop_monitor(&self) {
        if let Some(m) = self.shared.monitor.get() {
            m.abort();
        }
    }
}

impl Drop for HeldNode {
    fn drop(&mut self) {
        self.stop_monitor();
        if self.released {
            return;
        }
        // The delete is queued on the session now; every later request of this session is
        // ordered after it, so nothing of ours can observe the lock as still held. The reply is
        // awaited in the background only to retry after a connection loss and to log.
        let client = self.client.clone();
        let path = std::mem::take(&mut self.path);
        client.inner.metrics.sent_background(1);
        let first = client.zk().delete(&path, None);
        self.handle.spawn(async move {
            let mut result = first.await;
            for _ in 0..4 {
                match result {
                    Err(zk::Error::ConnectionLoss) => {
                        if await_connected(client.zk(), client.session_timeout()).await.is_err() {
                            return;
                        }
                        client.inner.metrics.sent_background(1);
                        result = client.zk().delete(&path, None).await;
                    }
                    _ => break,
                }
            }
            match result {
                Ok(()) | Err(zk::Error::NoNode) | Err(zk::Error::SessionExpired) | Err(zk::Error::ClientClosed) => {}
                Err(e) => {
                    tracing::warn!(node = %path, error = %e, "could not delete lock node on drop")
                }
            }
        });
    }
}

/// Watches our node and the session, publishing the guard's state until it is lost.
async fn monitor(client: Client, path: String, tx: watch::Sender<LockState>, revoke: watch::Sender<bool>) {
    let zk = client.zk();
    let mut states = zk.state_watcher();
    let session_state = |s: zk::SessionState| match s {
        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => LockState::Held,
        zk::SessionState::Disconnected => LockState::Suspended,
        zk::SessionState::Expired => LockState::Lost(LostReason::SessionExpired),
        zk::SessionState::Closed => LockState::Lost(LostReason::SessionClosed),
        zk::SessionState::AuthFailed => LockState::Lost(LostReason::AuthFailed),
    };
    let publish = |s: LockState| {
        tx.send_if_modified(|cur| {
            if cur.is_lost() || *cur == s {
                false
            } else {
                tracing::debug!(node = %path, from = ?*cur, to = ?s, "lock state changed");
                *cur = s;
                true
            }
        });
        s.is_lost()
    };
    if publish(session_state(states.state())) {
        return;
    }
    loop {
        // Arm a watch on our own node (getData + watch); re-armed after data changes, which is
        // how a revoker's request arrives.
        client.inner.metrics.sent_background(1);
        // Keep following the session while the request is outstanding: requests wait for a
        // reconnection, and a disconnection must show as `Suspended` meanwhile.
        let arm = zk.get_and_watch_data(&path);
        tokio::pin!(arm);
        let armed = loop {
            tokio::select! {
                r = &mut arm => break r,
                state = states.changed() => {
                    if publish(session_state(state)) {
                        return;
                    }
                }
            }
        };
        let watcher = match armed {
            Ok((data, _, watcher)) => {
                if data == REVOKE {
                    revoke.send_replace(true);
                }
                watcher
            }
            Err(zk::Error::NoNode) => {
                publish(LockState::Lost(LostReason::NodeDeleted));
                return;
            }
            Err(zk::Error::ConnectionLoss) => {
                publish(LockState::Suspended);
                match await_connected(zk, client.session_timeout()).await {
                    Ok(()) => {
                        publish(session_state(states.state()));
                        continue;
                    }
                    Err(_) => {
                        publish(session_state(states.state()));
                        if tx.borrow().is_lost() {
                            return;
                        }
                        continue;
                    }
                }
            }
            Err(e) => {
                let state = match e {
                    zk::Error::SessionExpired => LockState::Lost(LostReason::SessionExpired),
                    _ => LockState::Lost(LostReason::SessionClosed),
                };
                publish(state);
                return;
            }
        };
        let changed = watcher.changed();
        tokio::pin!(changed);
        loop {
            tokio::select! {
                event = &mut changed => {
                    match event.event_type {
                        zk::EventType::NodeDeleted => {
                            publish(LockState::Lost(LostReason::NodeDeleted));
                            return;
                        }
                        zk::EventType::Session if publish(session_state(event.session_state)) => return,
                        _ => {}
                    }
                    break; // re-arm
                }
                state = states.changed() => {
                    if publish(session_state(state)) {
                        return;
                    }
                }
            }
        }
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

        /// The current state; the first call starts watching our node.
        pub fn state(&self) -> crate::zookeeper::LockState {
            self.node.state()
        }

        /// A receiver of state changes (held, suspended, lost).
        pub fn state_changes(&self) -> tokio::sync::watch::Receiver<crate::zookeeper::LockState> {
            self.node.watch()
        }

        /// Resolves when the lock can no longer be trusted: the session expired or closed, or our node
        /// was deleted by someone else. A connection loss alone (`Suspended`) does not resolve it; see
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

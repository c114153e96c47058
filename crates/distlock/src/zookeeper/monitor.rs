//! One monitor per session for every watched lock node.
//!
//! A guard whose state is asked for (`state()`, `lost()`, `state_changes()`,
//! `revocation_requested()`) is registered here once. The session's monitor, a single task while
//! any node is registered, follows what every node shares once for all of them — the session's
//! state (disconnected: `Suspended`; connected again: `Held`; expired, closed or refused: every
//! node lost) and the lease deadline (passed: every node lost, then deleted) — and keeps one
//! getData watch on each node, which ZooKeeper needs to tell us of its deletion or of a
//! revoker's write. A watch fired by a data change is armed again (reading the new data); one
//! whose arming failed on a lost connection is armed again once the session is connected. The
//! client itself re-sends armed watches to the server after a reconnection.
//!
//! Each node costs the monitor an entry in its map and one pending step (an arming or a watch),
//! no task and no periodic request. A released or dropped guard leaves the map at once, and its
//! pending step ends (dropping its watch).

use super::guard::REVOKE;
use super::session::{delete_own, Failure};
use super::Client;
use crate::{LockState, LostReason};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::AtomicWaker;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use zookeeper_client as zk;

/// What a guard and the monitor share about one lock node.
#[derive(Debug)]
pub(crate) struct Node {
    /// The node's path.
    pub(crate) path: String,
    pub(crate) tx: watch::Sender<LockState>,
    /// Whether someone asked the holder to release; made when first asked for or first seen (a
    /// channel costs some 400 bytes, and few holders ever await it).
    revoke: OnceLock<watch::Sender<bool>>,
    /// Registered with the monitor (once; a node that left it is not registered again).
    registered: AtomicBool,
    /// Set when the node leaves the monitor (released, dropped or lost): its pending step ends.
    stopped: AtomicBool,
    /// The pending step's waker, woken when `stopped` is set.
    step: AtomicWaker,
}

impl Node {
    pub(crate) fn new(path: String) -> Node {
        Node {
            path,
            tx: watch::channel(LockState::Held).0,
            revoke: OnceLock::new(),
            registered: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            step: AtomicWaker::new(),
        }
    }

    /// The channel of revocation requests.
    pub(crate) fn revoke(&self) -> &watch::Sender<bool> {
        self.revoke.get_or_init(|| watch::channel(false).0)
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.step.wake();
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Publishes a final loss (unless one is published already); true if this published it.
    pub(crate) fn publish_lost(&self, reason: LostReason) -> bool {
        self.tx.send_if_modified(|cur| {
            if cur.is_lost() {
                false
            } else {
                tracing::debug!(node = %self.path, from = ?*cur, ?reason, "lock lost");
                *cur = LockState::Lost(reason);
                true
            }
        })
    }

    /// Publishes `state` (never over a loss); true when the node is lost now.
    fn publish(&self, state: LockState) -> bool {
        if let LockState::Lost(reason) = state {
            self.publish_lost(reason);
            return true;
        }
        self.tx.send_if_modified(|cur| {
            if cur.is_lost() || *cur == state {
                false
            } else {
                tracing::debug!(node = %self.path, from = ?*cur, to = ?state, "lock state changed");
                *cur = state;
                true
            }
        });
        self.tx.borrow().is_lost()
    }
}

/// The key of a node in the monitor's map: its address, which no other node can have while the
/// map holds it.
fn key(node: &Arc<Node>) -> usize {
    Arc::as_ptr(node) as usize
}

/// A session's monitor (one per [`Client`]).
#[derive(Debug, Default)]
pub(crate) struct Monitor {
    nodes: Mutex<Nodes>,
    /// Wakes the task: nodes registered, or the map emptied.
    wake: Notify,
}

#[derive(Debug, Default)]
struct Nodes {
    watched: HashMap<usize, Arc<Node>>,
    /// Registered since the task last looked.
    fresh: Vec<Arc<Node>>,
    /// Whether the task runs (it ends when no node is left).
    running: bool,
}

impl Monitor {
    fn nodes(&self) -> std::sync::MutexGuard<'_, Nodes> {
        // Nothing panics while holding it; a poisoned map is still a consistent one.
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many nodes the monitor watches now.
    pub(crate) fn watched(&self) -> usize {
        self.nodes().watched.len()
    }
}

/// Registers `node` with `client`'s monitor (once), starting the monitor's task on `handle` if
/// it is not running.
pub(crate) fn watch(client: &Client, node: &Arc<Node>, handle: &Handle) {
    if node.registered.swap(true, Ordering::AcqRel) || node.is_stopped() {
        return;
    }
    let monitor = &client.inner.monitor;
    let mut nodes = monitor.nodes();
    nodes.watched.insert(key(node), node.clone());
    nodes.fresh.push(node.clone());
    if nodes.running {
        drop(nodes);
        monitor.wake.notify_one();
    } else {
        nodes.running = true;
        handle.spawn(run(client.clone()));
    }
}

/// Takes `node` out of `client`'s monitor (released, dropped, or lost by the caller's own
/// reading of the lease); true if it was in it.
pub(crate) fn unwatch(client: &Client, node: &Arc<Node>) -> bool {
    node.stop();
    let monitor = &client.inner.monitor;
    let mut nodes = monitor.nodes();
    let removed = nodes.watched.remove(&key(node)).is_some();
    let wake = nodes.watched.is_empty() || !nodes.fresh.is_empty();
    drop(nodes);
    if wake {
        monitor.wake.notify_one();
    }
    removed
}

/// What a node's pending step came to.
enum Outcome {
    /// The node left the monitor.
    Stopped,
    /// The watch is armed; the node's data then.
    Armed(Vec<u8>, zk::OneshotWatcher),
    /// Arming failed.
    Failed(zk::Error),
    /// The watch fired.
    Event(zk::WatchedEvent),
    /// A pause before arming again ended.
    Retry,
}

type Pending<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// A node's one pending step; ends early (`Stopped`) once the node leaves the monitor.
struct Step<'a> {
    node: Option<Arc<Node>>,
    pending: Pending<'a>,
}

impl Future for Step<'_> {
    type Output = (Arc<Node>, Outcome);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let node = this.node.as_ref().expect("a step is not polled after it ended");
        let mut outcome = Outcome::Stopped;
        if !node.is_stopped() {
            node.step.register(cx.waker());
            if !node.is_stopped() {
                match this.pending.as_mut().poll(cx) {
                    Poll::Ready(o) => outcome = o,
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
        Poll::Ready((this.node.take().expect("checked above"), outcome))
    }
}

/// getData with a watch on the node.
fn arm<'a>(client: &'a Client, node: Arc<Node>) -> Step<'a> {
    client.inner.metrics.sent_background(1);
    let armed = client.zk().get_and_watch_data(&node.path);
    let pending = Box::pin(async move {
        match armed.await {
            Ok((data, _, watcher)) => Outcome::Armed(data, watcher),
            Err(e) => Outcome::Failed(e),
        }
    });
    Step { node: Some(node), pending }
}

fn await_event<'a>(node: Arc<Node>, watcher: zk::OneshotWatcher) -> Step<'a> {
    Step { node: Some(node), pending: Box::pin(async move { Outcome::Event(watcher.changed().await) }) }
}

fn pause<'a>(node: Arc<Node>, pause: Duration) -> Step<'a> {
    let pending = Box::pin(async move {
        tokio::time::sleep(pause).await;
        Outcome::Retry
    });
    Step { node: Some(node), pending }
}

fn session_state(s: zk::SessionState) -> LockState {
    match s {
        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => LockState::Held,
        zk::SessionState::Disconnected => LockState::Suspended,
        zk::SessionState::Expired => LockState::Lost(LostReason::SessionExpired),
        zk::SessionState::Closed => LockState::Lost(LostReason::SessionClosed),
        zk::SessionState::AuthFailed => LockState::Lost(LostReason::AuthFailed),
    }
}

fn connected(s: zk::SessionState) -> bool {
    matches!(s, zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly)
}

/// The pause before arming again after a failure that left the session reading as connected.
const REARM_PAUSE: Duration = Duration::from_millis(20);

/// The pause before arming again after the server refused the watch.
const REFUSED_PAUSE: Duration = Duration::from_secs(1);

/// The monitor's task state.
struct Run<'a> {
    client: &'a Client,
    session: zk::SessionState,
    steps: FuturesUnordered<Step<'a>>,
    /// Nodes to arm once the session is connected.
    waiting: Vec<Arc<Node>>,
}

impl<'a> Run<'a> {
    fn monitor(&self) -> &'a Monitor {
        &self.client.inner.monitor
    }

    /// Arms `node` now if the session is connected, else once it is.
    fn rearm(&mut self, node: Arc<Node>) {
        if connected(self.session) {
            self.steps.push(arm(self.client, node));
        } else {
            self.waiting.push(node);
        }
    }

    /// Takes `node` out of the map, lost for `reason` (out of the map first: whoever is told of
    /// the loss finds the monitor no longer following it).
    fn lose(&self, node: &Arc<Node>, reason: LostReason) {
        self.monitor().nodes().watched.remove(&key(node));
        node.stop();
        node.publish_lost(reason);
    }

    /// Starts following the nodes registered since the last look; false when none is left.
    fn take_fresh(&mut self) -> bool {
        let fresh = {
            let mut nodes = self.monitor().nodes();
            if nodes.watched.is_empty() {
                nodes.running = false;
                nodes.fresh.clear();
                return false;
            }
            std::mem::take(&mut nodes.fresh)
        };
        let state = session_state(self.session);
        for node in fresh {
            if node.is_stopped() {
                continue;
            }
            match state {
                LockState::Lost(reason) => self.lose(&node, reason),
                _ => {
                    node.publish(state);
                    self.rearm(node);
                }
            }
        }
        true
    }

    fn on_step(&mut self, node: Arc<Node>, outcome: Outcome) {
        if node.is_stopped() {
            return;
        }
        match outcome {
            Outcome::Stopped => {}
            Outcome::Armed(data, watcher) => {
                if data == REVOKE {
                    node.revoke().send_replace(true);
                }
                self.steps.push(await_event(node, watcher));
            }
            Outcome::Event(event) => match event.event_type {
                zk::EventType::NodeDeleted => self.lose(&node, LostReason::NodeDeleted),
                zk::EventType::Session => match session_state(event.session_state) {
                    LockState::Lost(reason) => self.lose(&node, reason),
                    _ => self.rearm(node),
                },
                // The data changed (perhaps a revoker's request): arm again, reading it.
                _ => self.rearm(node),
            },
            Outcome::Retry => self.rearm(node),
            Outcome::Failed(zk::Error::NoNode) => self.lose(&node, LostReason::NodeDeleted),
            Outcome::Failed(e) => match Failure::of(&e) {
                // The client marks the session disconnected before it fails requests: arm again
                // once connected (after a pause if it reads as connected already).
                Failure::Connection if connected(self.client.zk().state_watcher().peek_state()) => {
                    self.steps.push(pause(node, REARM_PAUSE));
                }
                Failure::Connection => self.waiting.push(node),
                Failure::SessionGone(reason) => self.lose(&node, reason),
                Failure::Server | Failure::Local => {
                    tracing::warn!(node = %node.path, error = %e, "cannot watch our lock node; retrying in 1 s");
                    self.steps.push(pause(node, REFUSED_PAUSE));
                }
            },
        }
    }

    /// The session's state changed: told to every node.
    fn on_session(&mut self, state: zk::SessionState) {
        self.session = state;
        let published = session_state(state);
        let mut nodes = self.monitor().nodes();
        if let LockState::Lost(reason) = published {
            for (_, node) in nodes.watched.drain() {
                node.publish_lost(reason);
                node.stop();
            }
            self.waiting.clear();
            return;
        }
        for node in nodes.watched.values() {
            node.publish(published);
        }
        drop(nodes);
        if connected(state) {
            for node in std::mem::take(&mut self.waiting) {
                if !node.is_stopped() {
                    self.steps.push(arm(self.client, node));
                }
            }
        }
    }

    /// The lease deadline passed without an answer from the server: every node is lost (before
    /// the server can have expired the session), then deleted, as the session may still be
    /// alive and a holder that gave up must not keep others waiting.
    fn on_lease_expired(&mut self) {
        let lost: Vec<Arc<Node>> = {
            let mut nodes = self.monitor().nodes();
            nodes.watched.drain().map(|(_, n)| n).collect()
        };
        tracing::warn!(nodes = lost.len(), "no answer from the server within the lease; the locks may be handed on");
        for node in &lost {
            node.publish_lost(LostReason::LeaseExpired);
            node.stop();
        }
        self.waiting.clear();
        let client = self.client.clone();
        tokio::spawn(async move {
            let client = &client;
            let each = |n: Arc<Node>| async move { delete_after_lease(client, &n.path).await };
            futures::stream::iter(lost).for_each_concurrent(None, each).await;
        });
    }
}

/// After a loss by lease expiry the session may still be alive: delete our node, so that a holder
/// that gave up does not keep others waiting.
pub(crate) async fn delete_after_lease(client: &Client, path: &str) {
    if let Err(e) = delete_own(client, path).await {
        tracing::warn!(node = %path, error = %e, "could not delete our lock node after the lease expired");
    }
}

/// The monitor's task: runs while any node is registered.
async fn run(client: Client) {
    let mut states = client.zk().state_watcher();
    let lease = client.lease();
    let mut run = Run { client: &client, session: states.state(), steps: FuturesUnordered::new(), waiting: Vec::new() };
    let expiry = tokio::time::sleep_until(lease.deadline());
    tokio::pin!(expiry);
    while run.take_fresh() {
        let deadline = lease.deadline();
        if expiry.deadline() != deadline {
            expiry.as_mut().reset(deadline);
        }
        let woken = run.monitor().wake.notified();
        tokio::select! {
            _ = woken => {}
            Some((node, outcome)) = run.steps.next(), if !run.steps.is_empty() => run.on_step(node, outcome),
            state = states.changed() => run.on_session(state),
            () = &mut expiry => {
                if Instant::now() >= lease.deadline() {
                    run.on_lease_expired();
                }
            }
        }
    }
}

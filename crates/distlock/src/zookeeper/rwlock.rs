//! The shared (read/write) lock.

use super::guard::HeldNode;
use super::queue::{Exclusive, Policy, Queue, QueueStatus, Wait};
use super::session::{await_connected, delete_own, Failure};
use super::{backend, url, Client};
use crate::LockState;
use crate::{Error, LostReason, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use zookeeper_client as zk;

use super::queue::is_exclusive;
pub(crate) use super::queue::{READ, WRITE};

/// Readers are blocked only by exclusive nodes (writers, mutex nodes) queued ahead of them; they
/// watch the nearest one.
pub(crate) struct ReadPolicy;

impl Policy for ReadPolicy {
    fn blocker(&self, sorted: &[String], ours: usize) -> Option<usize> {
        sorted[..ours].iter().rposition(|n| is_exclusive(n))
    }

    fn proceeds_without(&self, sorted: &[String], _ours: usize, blocker: usize) -> bool {
        // The blocker is the nearest exclusive node ahead; we proceed if no other is ahead of it.
        !sorted[..blocker].iter().any(|n| is_exclusive(n))
    }
}

/// A read/write lock on a znode path: many readers or one writer, in queue order.
///
/// Readers queue behind earlier writers only, and share with each other; a writer waits for
/// everything queued ahead of it. When a writer leaves, all readers queued directly behind it
/// proceed together. Node names follow Apache Curator's InterProcessReadWriteLock
/// (`_c_<uuid>-__READ__<seq>`, `_c_<uuid>-__WRIT__<seq>` in one directory), so Curator readers
/// and writers on the same path take part in the same queue.
///
/// Downgrade is allowed ([`WriteGuard::downgrade`]); upgrade is not: asking this handle for the
/// write lock while it holds a read guard is refused with [`Error::WouldDeadlock`] (the write
/// would wait for our own read forever).
///
/// Clones of a handle share its read-guard count, so an upgrade through a clone is refused too.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(zk: distlock::zookeeper::Client) -> distlock::Result<()> {
/// let config = zk.rwlock("/locks/config")?;
/// let r = config.read().await?;      // shares with other readers
/// r.release().await?;
/// let w = config.write().await?;     // alone
/// let r = w.downgrade().await?;      // keep reading, let other readers in
/// w.release().await?;
/// r.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    read_q: Queue,
    write_q: Queue,
    /// Read guards of this handle still alive (upgrade detection).
    readers: Arc<AtomicUsize>,
}

impl RwLock {
    pub(super) fn new(client: Client, path: &str) -> Result<RwLock> {
        let dir = url::lock_path(path)?;
        let read_q = Queue { client: client.clone(), dir: dir.clone(), marker: READ, data: None };
        let write_q = Queue { client, dir, marker: WRITE, data: None };
        Ok(RwLock { read_q, write_q, readers: Arc::new(AtomicUsize::new(0)) })
    }

    /// The lock path.
    pub fn path(&self) -> &str {
        &self.read_q.dir
    }

    /// Waits for a shared (read) lock.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped acquire leaves no node behind.
    pub async fn read(&self) -> Result<ReadGuard> {
        Ok(self.read_with(None, None).await?.expect("waiting forever always acquires"))
    }

    /// Takes a read lock only if no writer holds or waits ahead; never waits.
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        self.read_with(Some(Duration::ZERO), None).await
    }

    /// Waits at most `timeout` for a read lock.
    pub async fn read_timeout(&self, timeout: Duration) -> Result<Option<ReadGuard>> {
        self.read_with(Some(timeout), None).await
    }

    /// Read lock with full control (see [`Mutex::lock_with`](super::Mutex::lock_with)).
    pub async fn read_with(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<ReadGuard>> {
        let acquired = self.read_q.acquire(&ReadPolicy, Wait::from_timeout(timeout), progress).await?;
        Ok(acquired.map(|a| {
            self.readers.fetch_add(1, Ordering::SeqCst);
            ReadGuard {
                node: HeldNode::new(self.read_q.client.clone(), self.read_q.dir.clone(), a.path, a.czxid),
                _reader: ReaderCount(Some(self.readers.clone())),
            }
        }))
    }

    /// Waits for the exclusive (write) lock.
    ///
    /// # Notable errors
    /// [`Error::WouldDeadlock`] if this handle holds a read guard (upgrade is refused).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped acquire leaves no node behind.
    pub async fn write(&self) -> Result<WriteGuard> {
        Ok(self.write_with(None, None).await?.expect("waiting forever always acquires"))
    }

    /// Takes the write lock only if nobody holds or waits; never waits.
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        self.write_with(Some(Duration::ZERO), None).await
    }

    /// Waits at most `timeout` for the write lock.
    pub async fn write_timeout(&self, timeout: Duration) -> Result<Option<WriteGuard>> {
        self.write_with(Some(timeout), None).await
    }

    /// Write lock with full control (see [`Mutex::lock_with`](super::Mutex::lock_with)).
    pub async fn write_with(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<WriteGuard>> {
        if self.readers.load(Ordering::SeqCst) > 0 {
            return Err(Error::WouldDeadlock {
                lock: self.path().to_string(),
                reason: "upgrade refused: this handle holds a read lock, and a write lock would wait for it forever; release the read guard first",
            });
        }
        let acquired = self.write_q.acquire(&Exclusive, Wait::from_timeout(timeout), progress).await?;
        Ok(acquired.map(|a| WriteGuard {
            node: HeldNode::new(self.write_q.client.clone(), self.write_q.dir.clone(), a.path, a.czxid),
            readers: self.readers.clone(),
            downgraded: AtomicBool::new(false),
            downgrading: Arc::new(tokio::sync::Mutex::new(())),
        }))
    }
}

/// A downgrade's read node while the downgrade is in progress: deleted in the background if the
/// downgrade fails half-way or is dropped.
struct DowngradeNode {
    client: Client,
    path: Option<String>,
    /// The write guard's downgrade permit, kept until the cleanup is done.
    permit: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for DowngradeNode {
    fn drop(&mut self) {
        let permit = self.permit.take();
        let Some(path) = self.path.take() else { return };
        let client = self.client.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = delete_own(&client, &path).await {
                    tracing::warn!(node = %path, error = %e, "could not delete an abandoned downgrade node");
                }
                drop(permit);
            });
        }
    }
}

/// A held read lock; released on drop. Made by [`RwLock::read`] and friends, or
/// [`WriteGuard::downgrade`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(l: distlock::zookeeper::RwLock) -> distlock::Result<()> {
/// let r = l.read().await?;
/// println!("reading with token {}", r.fencing_token());
/// r.release().await
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReadGuard {
    node: HeldNode,
    _reader: ReaderCount,
}

/// Counts a handle's live read guards (for refusing upgrades); decrements on drop.
#[derive(Debug)]
struct ReaderCount(Option<Arc<AtomicUsize>>);

impl Drop for ReaderCount {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl ReadGuard {
    crate::zookeeper::guard::guard_methods!();

    /// Releases and waits for the server.
    pub async fn release(self) -> Result<()> {
        self.node.release().await
    }
}

/// A held write lock; released on drop. Made by [`RwLock::write`] and friends.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(l: distlock::zookeeper::RwLock) -> distlock::Result<()> {
/// let w = l.write().await?;
/// w.release().await
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct WriteGuard {
    node: HeldNode,
    /// The handle's read-guard count: a downgraded read guard counts too.
    readers: Arc<AtomicUsize>,
    downgraded: AtomicBool,
    /// Held by a downgrade in progress, and by the cleanup of one that was dropped, so that a
    /// second downgrade never meets the first one's read node.
    downgrading: Arc<tokio::sync::Mutex<()>>,
}

impl WriteGuard {
    crate::zookeeper::guard::guard_methods!();

    /// Takes a read lock while holding this write lock (a downgrade): release the write guard
    /// afterwards and keep reading, with readers queued behind us let in.
    ///
    /// The read node is `_c_<our uuid>-__READ__<our write sequence>`: an ephemeral node that
    /// sorts at our write node's place in the queue, so no writer queued behind us can get
    /// between. (Curator instead queues the read node at the tail and lets it pass its own
    /// writer; a writer queued meanwhile then waits for our read as well, as here.) Its name is
    /// derived from our write node, so a create whose reply was lost is recognised when retried,
    /// and a dropped downgrade deletes it in the background. It is created in one transaction with
    /// a check that our write node still exists, so a lock lost meanwhile is never downgraded.
    ///
    /// The read guard keeps the write guard's fencing token: the hold began with the write, and a
    /// writer queued behind us carries a larger token.
    ///
    /// One round trip; never waits. The read guard counts as a read lock of the handle, so a
    /// later `write()` through the same handle is refused while it lives.
    ///
    /// # Notable errors
    /// [`Error::LockLost`] when the write lock is already lost.
    pub async fn downgrade(&self) -> Result<ReadGuard> {
        if self.downgraded.load(Ordering::SeqCst) {
            return Err(Error::InvalidArgument {
                what: "downgrade",
                reason: format!("the write lock on {} was downgraded already; use that read guard", self.lock_path()),
            });
        }
        if let LockState::Lost(reason) = self.node.state() {
            return Err(Error::LockLost { lock: self.node.lock_path().to_string(), reason });
        }
        let client = self.node.client().clone();
        let write_path = self.node.node_path();
        let dir = self.node.lock_path().to_string();
        let Some(path) =
            write_path.rfind(WRITE).map(|i| format!("{}{READ}{}", &write_path[..i], &write_path[i + WRITE.len()..]))
        else {
            return Err(Error::InvalidLockPath {
                path: write_path.to_string(),
                reason: "not a write lock node".into(),
            });
        };
        let permit = self.downgrading.clone().lock_owned().await;
        let mut pending = DowngradeNode { client: client.clone(), path: Some(path.clone()), permit: Some(permit) };
        // Whether an earlier attempt of this call may have been applied (its reply was lost).
        let mut retried = false;
        let options = zk::CreateMode::Ephemeral.with_acls(client.acls());
        loop {
            let mut txn = client.zk().new_multi_writer();
            txn.add_check_version(write_path, -1).map_err(|e| backend("check", write_path, e))?;
            txn.add_create(&path, client.owner_data(), &options).map_err(|e| backend("create", &path, e))?;
            client.metrics().sent(1);
            let sent = tokio::time::Instant::now();
            let result = txn.commit().await;
            let answered = match &result {
                Err(zk::MultiWriteError::RequestFailed { source }) => Err(source.clone()),
                _ => Ok(()),
            };
            client.lease().observe(sent, &answered);
            match result {
                Ok(_) => break,
                Err(zk::MultiWriteError::OperationFailed { index: 1, source: zk::Error::NodeExists }) if retried => {
                    // Our earlier attempt was applied; its reply was lost.
                    break;
                }
                // Nothing of this answer was applied; an earlier attempt's node (if any) is deleted.
                Err(zk::MultiWriteError::OperationFailed { index: 0, .. }) => {
                    if !retried {
                        pending.path = None;
                    }
                    return Err(Error::LockLost { lock: dir, reason: LostReason::NodeDeleted });
                }
                Err(zk::MultiWriteError::OperationFailed { source, .. }) => {
                    if !retried {
                        pending.path = None; // not ours to delete
                    }
                    return Err(backend("create", &path, source));
                }
                Err(zk::MultiWriteError::RequestFailed { source }) => match Failure::of(&source) {
                    Failure::Connection => {
                        retried = true;
                        await_connected(client.zk()).await?
                    }
                    Failure::SessionGone(reason) => {
                        pending.path = None;
                        return Err(Error::LockLost { lock: dir, reason });
                    }
                    Failure::Server | Failure::Local => return Err(backend("multi", &path, source)),
                },
            }
        }
        pending.path = None;
        self.downgraded.store(true, Ordering::SeqCst);
        self.readers.fetch_add(1, Ordering::SeqCst);
        Ok(ReadGuard {
            node: HeldNode::new(client, dir, path, self.node.token() as i64),
            _reader: ReaderCount(Some(self.readers.clone())),
        })
    }

    /// Releases and waits for the server.
    pub async fn release(self) -> Result<()> {
        self.node.release().await
    }
}

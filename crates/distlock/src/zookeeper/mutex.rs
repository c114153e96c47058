//! The exclusive lock.

use super::guard::HeldNode;
use super::queue::{Exclusive, Queue, QueueStatus, Wait};
use super::{url, Client};
use crate::Result;
use std::time::Duration;
use tokio::sync::watch;

/// Marker before the sequence number in Curator's InterProcessMutex nodes.
const MARKER: &str = "lock-";

/// An exclusive lock on a znode path, fair (first come, first served) and free of herd effects.
///
/// Unlike [`tokio::sync::Mutex`] it protects no value: it coordinates processes, possibly on
/// different machines, that share a ZooKeeper ensemble. Each acquire queues an
/// EPHEMERAL_SEQUENTIAL child `_c_<uuid>-lock-<seq>` under the lock path (Curator's
/// InterProcessMutex format, so Curator clients on the same path share the queue); the lowest
/// sequence holds; every other contender watches only the child just ahead of it. When a holder's
/// session ends (crash, network partition longer than the session timeout), the server deletes its
/// node and the next contender proceeds: no lock outlives its owner.
///
/// Contract:
/// - grants follow queue order (FIFO);
/// - each release wakes exactly one waiter;
/// - every guard carries a [fencing token](MutexGuard::fencing_token) larger than any earlier
///   holder's on this path;
/// - a guard reports loss ([`MutexGuard::lost`]) when the lock can no longer be trusted;
/// - not reentrant: a second `lock()` through the same or another handle queues behind the
///   first and waits for it.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// use distlock::zookeeper::Client;
/// use std::time::Duration;
/// let zk = Client::connect("zk://127.0.0.1:2181").await?;
/// let lock = zk.mutex("/locks/invoices")?;
/// if let Some(guard) = lock.lock_timeout(Duration::from_secs(5)).await? {
///     // Pass the token to storage that rejects stale writers.
///     let token = guard.fencing_token();
///     # let _ = token;
///     guard.release().await?;
/// } else {
///     println!("busy");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    queue: Queue,
}

impl Mutex {
    pub(super) fn new(client: Client, path: &str) -> Result<Mutex> {
        let dir = url::lock_path(path)?;
        Ok(Mutex { queue: Queue { client, dir, marker: MARKER, data: None } })
    }

    /// An election's candidate: the same queue algorithm with nodes marked `marker` (`lock-` for
    /// Curator's LeaderSelector, `latch-` for its LeaderLatch), whose data is `data` instead of
    /// the owner record (Curator keeps the participant's id there).
    pub(super) fn candidate(client: Client, dir: String, marker: &'static str, data: std::sync::Arc<[u8]>) -> Mutex {
        Mutex { queue: Queue { client, dir, marker, data: Some(data) } }
    }

    /// The lock path.
    pub fn path(&self) -> &str {
        &self.queue.dir
    }

    /// Waits as long as it takes for the lock.
    ///
    /// One round trip when nobody holds the lock.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future before it completes removes our queue node (in the
    /// background), so an abandoned acquire never blocks others; a caller that cancels loses its
    /// place in the queue.
    ///
    /// # Error handling on connection loss
    /// A failed connection (closed, reset or silent) is waited out and the acquire goes on: a
    /// create whose reply was lost is found again by its unique prefix, never made twice. It
    /// gives up only when the session ends.
    ///
    /// # Notable errors
    /// - [`Error::SessionExpired`](crate::Error::SessionExpired): the session ended while waiting;
    /// - [`Error::InvalidLockPath`](crate::Error::InvalidLockPath): the path holds another kind of
    ///   lock, or its chroot does not exist.
    pub async fn lock(&self) -> Result<MutexGuard> {
        let guard = self.acquire(Wait::Forever, None).await?;
        Ok(guard.expect("waiting forever always acquires"))
    }

    /// Takes the lock only if nobody holds or waits for it; never waits for another holder.
    ///
    /// Returns `Ok(None)` when busy (our node is deleted before returning). A connection loss is
    /// waited out as in [`lock`](Mutex::lock); use [`lock_timeout`](Mutex::lock_timeout) to bound
    /// that too.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Mutex::lock).
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        self.acquire(Wait::Never, None).await
    }

    /// Waits at most `timeout` for the lock; `Ok(None)` when it was not had in time, in which
    /// case our node has been deleted before this returns. The timeout is a total: it covers
    /// connection losses too, and when the server is unreachable at the deadline, the call
    /// returns at most 200 ms later and our node is deleted in the background once it can be.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Mutex::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<MutexGuard>> {
        self.acquire(super::queue::deadline_after(timeout).map_or(Wait::Forever, Wait::Until), None).await
    }

    /// Acquires with full control: `timeout` `None` waits forever, `Some(ZERO)` never waits;
    /// `progress` receives the queue position while waiting (for status displays).
    pub async fn lock_with(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<MutexGuard>> {
        self.acquire(Wait::from_timeout(timeout), progress).await
    }

    async fn acquire(&self, wait: Wait, progress: Option<&watch::Sender<QueueStatus>>) -> Result<Option<MutexGuard>> {
        let acquired = self.queue.acquire(&Exclusive, wait, progress).await?;
        Ok(acquired.map(|a| MutexGuard {
            node: HeldNode::new(self.queue.client.clone(), self.queue.dir.clone(), a.path, a.czxid),
        }))
    }
}

/// Proof of holding a [`Mutex`]; releases the lock when dropped.
///
/// Made by [`Mutex::lock`], [`Mutex::try_lock`] and [`Mutex::lock_timeout`]. Dropping it sends
/// the delete of our node at once (without waiting for the reply); [`release`](Self::release)
/// waits for the server and reports errors.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::zookeeper::Mutex) -> distlock::Result<()> {
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = do_work(guard.fencing_token()) => guard.release().await?,
///     reason = guard.lost() => eprintln!("lock lost: {reason}; work abandoned"),
/// }
/// # Ok(()) }
/// # async fn do_work(_: u64) {}
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct MutexGuard {
    node: HeldNode,
}

impl std::fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MutexGuard").field("node", &self.node.node_path()).field("token", &self.node.token()).finish()
    }
}

impl MutexGuard {
    crate::zookeeper::guard::guard_methods!();

    /// Releases the lock and waits for the server to confirm.
    ///
    /// # Notable errors
    /// [`Error::LockLost`](crate::Error::LockLost) when our node was already gone (the lock had
    /// been lost before this release).
    pub async fn release(self) -> Result<()> {
        self.node.release().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send_sync_static<T: Send + Sync + 'static>() {}

    #[test]
    fn bounds() {
        is_send_sync_static::<Mutex>();
        is_send_sync_static::<MutexGuard>();
    }
}

/// Waiting handles must stay small (see `distlock bench waiters`): the acquire future is what a
/// waiter keeps alive, so its size is bounded here.
#[cfg(test)]
mod size_probe {
    #[test]
    fn acquire_future_stays_small() {
        fn size<F>(_: &F) -> usize {
            std::mem::size_of::<F>()
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let s = distlock_server::EmbeddedServer::start().await.unwrap();
            let c = super::super::Client::connect(&s.url()).await.unwrap();
            let m = c.mutex("/x").unwrap();
            let f = m.lock_with(None, None);
            println!("lock_with future: {} bytes", size(&f));
            assert!(size(&f) <= 400, "lock_with future grew to {} bytes", size(&f));
            assert!(std::mem::size_of::<super::Mutex>() <= 64);
        });
    }
}

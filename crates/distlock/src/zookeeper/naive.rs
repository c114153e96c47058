//! The naive single-node lock (every contender creates one node), kept only as a baseline.

use super::queue::QueueStatus;
use super::{backend, url, Client};
use crate::Result;
use std::time::Duration;
use tokio::sync::watch;
use zookeeper_client as zk;

/// The lock with the herd effect: every contender tries to create one EPHEMERAL node
/// `<path>/lock`, and every loser watches that node. Each release wakes **all** waiters (the herd
/// effect), who race again; there is no order and no fairness.
///
/// It exists only as a baseline for benchmarks and for the test that measures its herd effect
/// against the queue lock ([`Mutex`](super::Mutex)), which wakes exactly one waiter per release.
/// Do not use it to protect anything.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(zk: distlock::zookeeper::Client) -> distlock::Result<()> {
/// let baseline = zk.naive_lock("/bench/naive")?;
/// let g = baseline.lock().await?;
/// g.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NaiveLock {
    client: Client,
    dir: String,
    node: String,
}

impl NaiveLock {
    pub(super) fn new(client: Client, path: &str) -> Result<NaiveLock> {
        let dir = url::lock_path(path)?;
        Ok(NaiveLock { node: format!("{dir}/lock"), client, dir })
    }

    /// Waits for the lock.
    pub async fn lock(&self) -> Result<NaiveGuard> {
        Ok(self.lock_with(None, None).await?.expect("waiting forever always acquires"))
    }

    /// Acquires; `progress` is told (`ahead: 1`) each time we start waiting on the node.
    pub async fn lock_with(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<NaiveGuard>> {
        let zk = self.client.zk();
        let metrics = self.client.metrics();
        let deadline = timeout.and_then(super::queue::deadline_after);
        let options = zk::CreateMode::Ephemeral.with_acls(self.client.acls());
        loop {
            metrics.sent(1);
            match zk.create(&self.node, self.client.owner_data(), &options).await {
                Ok((stat, _)) => {
                    return Ok(Some(NaiveGuard {
                        client: self.client.clone(),
                        node: self.node.clone(),
                        token: stat.czxid as u64,
                    }))
                }
                Err(zk::Error::NoNode) => {
                    metrics.sent(1);
                    match self.client.make_lock_dir(&self.dir).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(backend("create", &self.dir, e)),
                    }
                    continue;
                }
                Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(backend("create", &self.node, e)),
            }
            metrics.sent(1);
            let (stat, watcher) =
                zk.check_and_watch_stat(&self.node).await.map_err(|e| backend("exists", &self.node, e))?;
            if stat.is_none() {
                continue;
            }
            if let Some(p) = progress {
                p.send_replace(QueueStatus { ahead: 1, queue_len: 0 });
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, watcher.changed()).await.is_err() {
                        return Ok(None);
                    }
                }
                None => {
                    watcher.changed().await;
                }
            }
            metrics.woke();
        }
    }
}

/// A held [`NaiveLock`]; released on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(l: distlock::zookeeper::NaiveLock) -> distlock::Result<()> {
/// let g = l.lock().await?;
/// assert!(g.fencing_token() > 0);
/// g.release().await
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct NaiveGuard {
    client: Client,
    node: String,
    token: u64,
}

impl NaiveGuard {
    /// Creation zxid of the lock node.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Deletes the lock node.
    pub async fn release(mut self) -> Result<()> {
        let node = std::mem::take(&mut self.node);
        self.client.metrics().sent(1);
        self.client.zk().delete(&node, None).await.map_err(|e| backend("delete", &node, e))
    }
}

impl Drop for NaiveGuard {
    fn drop(&mut self) {
        if !self.node.is_empty() {
            drop(self.client.zk().delete(&self.node, None));
        }
    }
}

//! The counting semaphore (Curator's InterProcessSemaphoreV2 layout).

use super::guard::{HeldNode, LockState};
use super::mutex::Mutex;
use super::{backend, url, Client};
use crate::{Error, LostReason, Result};
use std::time::Duration;
use tokio::time::Instant;
use zookeeper_client as zk;

/// A semaphore with a fixed number of permits shared by every process on the same path.
///
/// Layout as Apache Curator's InterProcessSemaphoreV2: `<path>/locks` holds an internal mutex
/// that serializes acquirers, `<path>/leases` holds one EPHEMERAL_SEQUENTIAL
/// `_c_<uuid>-lease-<seq>` node per permit in use. An acquirer takes the internal mutex, creates
/// its lease nodes and waits (watching the leases directory) until at most `permits` leases exist,
/// then lets go of the mutex. Holders that die free their permits when their session ends.
///
/// The permit count is not stored on the server: every user of a path must agree on it (as with
/// Curator). With one permit this is Curator's InterProcessSemaphoreMutex: a non-reentrant lock
/// whose permit any task may release.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(zk: distlock::zookeeper::Client) -> distlock::Result<()> {
/// let pool = zk.semaphore("/locks/db-connections", 3)?;
/// let permit = pool.acquire().await?;          // one of three
/// let two = pool.acquire_many(2).await?;       // two more, all or nothing
/// permit.release().await?;
/// two.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Client,
    path: String,
    leases: String,
    permits: u32,
    gate: Mutex,
}

impl Semaphore {
    pub(super) fn new(client: Client, path: &str, permits: u32) -> Result<Semaphore> {
        let path = url::lock_path(path)?;
        if permits == 0 {
            return Err(Error::InvalidArgument {
                what: "permit count",
                reason: format!("a semaphore on {path} needs at least 1 permit, got 0"),
            });
        }
        let gate = client.mutex(&format!("{path}/locks"))?;
        Ok(Semaphore { leases: format!("{path}/leases"), client, path, permits, gate })
    }

    /// The semaphore path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Total permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Waits for one permit.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped acquire deletes its lease nodes and leaves the internal mutex.
    pub async fn acquire(&self) -> Result<SemaphorePermit> {
        Ok(self.acquire_with(1, None).await?.expect("waiting forever always acquires"))
    }

    /// Waits for `n` permits, all or nothing.
    ///
    /// # Notable errors
    /// [`Error::InvalidArgument`] if `n` is 0 or more than the semaphore has.
    pub async fn acquire_many(&self, n: u32) -> Result<SemaphorePermit> {
        Ok(self.acquire_with(n, None).await?.expect("waiting forever always acquires"))
    }

    /// One permit if available now; never waits.
    pub async fn try_acquire(&self) -> Result<Option<SemaphorePermit>> {
        self.acquire_with(1, Some(Duration::ZERO)).await
    }

    /// `n` permits if available now; never waits.
    pub async fn try_acquire_many(&self, n: u32) -> Result<Option<SemaphorePermit>> {
        self.acquire_with(n, Some(Duration::ZERO)).await
    }

    /// `n` permits within `timeout`, or `Ok(None)` (nothing left behind).
    pub async fn acquire_timeout(&self, n: u32, timeout: Duration) -> Result<Option<SemaphorePermit>> {
        self.acquire_with(n, Some(timeout)).await
    }

    /// `n` permits; `timeout` `None` waits forever, `Some(ZERO)` never waits.
    pub async fn acquire_with(&self, n: u32, timeout: Option<Duration>) -> Result<Option<SemaphorePermit>> {
        if n == 0 || n > self.permits {
            return Err(Error::InvalidArgument {
                what: "permit count",
                reason: format!("asked for {n} permits of {} on {}", self.permits, self.path),
            });
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let remaining = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let Some(gate) = self.gate.lock_with(remaining(), None).await? else { return Ok(None) };
        let mut created = Created { client: self.client.clone(), nodes: Vec::new(), armed: true };
        let result = self.take_leases(n, deadline, &mut created).await;
        let gate_result = gate.release().await;
        match result {
            Ok(true) => {
                gate_result?;
                created.armed = false;
                let leases = std::mem::take(&mut created.nodes)
                    .into_iter()
                    .map(|(path, czxid)| HeldNode::new(self.client.clone(), self.path.clone(), path, czxid))
                    .collect();
                Ok(Some(SemaphorePermit { leases }))
            }
            Ok(false) => {
                created.remove().await;
                Ok(None)
            }
            Err(e) => {
                created.remove().await;
                Err(e)
            }
        }
    }

    async fn take_leases(&self, n: u32, deadline: Option<Instant>, created: &mut Created) -> Result<bool> {
        let zk = self.client.zk();
        let metrics = self.client.metrics();
        let prefix = format!("{}/_c_{}-lease-", self.leases, uuid::Uuid::new_v4());
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        for _ in 0..n {
            metrics.sent(1);
            let (stat, seq) = match zk.create(&prefix, self.client.owner_data(), &options).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => {
                    let dir = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                    metrics.sent(1);
                    zk.mkdir(&self.leases, &dir).await.map_err(|e| backend("create", &self.leases, e))?;
                    metrics.sent(1);
                    zk.create(&prefix, self.client.owner_data(), &options)
                        .await
                        .map_err(|e| backend("create", &prefix, e))?
                }
                Err(e) => return Err(backend("create", &prefix, e)),
            };
            let path = format!("{prefix}{seq}");
            let name = path[self.leases.len() + 1..].to_string();
            created.nodes.push((path, stat.czxid));
            loop {
                metrics.sent(1);
                let (children, watcher) = zk
                    .list_and_watch_children(&self.leases)
                    .await
                    .map_err(|e| backend("getChildren", &self.leases, e))?;
                if !children.contains(&name) {
                    return Err(Error::LockLost { lock: self.path.clone(), reason: LostReason::NodeDeleted });
                }
                if children.len() <= self.permits as usize {
                    break;
                }
                let event = match deadline {
                    Some(d) if Instant::now() >= d => return Ok(false),
                    Some(d) => match tokio::time::timeout_at(d, watcher.changed()).await {
                        Ok(e) => e,
                        Err(_) => return Ok(false),
                    },
                    None => watcher.changed().await,
                };
                metrics.woke();
                if event.event_type == zk::EventType::Session && event.session_state == zk::SessionState::Expired {
                    return Err(Error::SessionExpired);
                }
            }
        }
        Ok(true)
    }
}

/// Lease nodes created by an acquire in progress; deleted if it fails or is dropped.
struct Created {
    client: Client,
    nodes: Vec<(String, i64)>,
    armed: bool,
}

impl Created {
    async fn remove(&mut self) {
        self.armed = false;
        let zk = self.client.zk();
        let deletes: Vec<_> = self.nodes.iter().map(|(p, _)| zk.delete(p, None)).collect();
        self.client.metrics().sent(deletes.len() as u64);
        for r in futures::future::join_all(deletes).await {
            if let Err(e) = r {
                if e != zk::Error::NoNode {
                    tracing::warn!(error = %e, "could not delete a lease node; the session's end will");
                }
            }
        }
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.armed {
            for (path, _) in &self.nodes {
                // Queued on the session at once; the reply is not awaited.
                drop(self.client.zk().delete(path, None));
            }
        }
    }
}

/// Permits held from a [`Semaphore`]; released on drop (from any task).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(s: distlock::zookeeper::Semaphore) -> distlock::Result<()> {
/// let p = s.acquire_many(2).await?;
/// assert_eq!(p.num_permits(), 2);
/// p.release().await
/// # }
/// ```
#[must_use = "if unused the permits are released at once"]
#[derive(Debug)]
pub struct SemaphorePermit {
    leases: Vec<HeldNode>,
}

impl SemaphorePermit {
    /// How many permits this holds.
    pub fn num_permits(&self) -> usize {
        self.leases.len()
    }

    /// The lease node paths.
    pub fn node_paths(&self) -> Vec<&str> {
        self.leases.iter().map(|l| l.node_path()).collect()
    }

    /// The largest creation zxid of our leases: larger than the token of any permit granted
    /// before ours was created.
    pub fn fencing_token(&self) -> u64 {
        self.leases.iter().map(|l| l.token()).max().unwrap_or(0)
    }

    /// `Held` only while every lease is held; the worst state of any lease otherwise.
    pub fn state(&self) -> LockState {
        let states: Vec<LockState> = self.leases.iter().map(|l| l.state()).collect();
        states
            .iter()
            .find(|s| s.is_lost())
            .or_else(|| states.iter().find(|s| **s == LockState::Suspended))
            .copied()
            .unwrap_or(LockState::Held)
    }

    /// Resolves when any of our leases can no longer be trusted.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let all: Vec<_> = self.leases.iter().map(|l| Box::pin(l.lost())).collect();
        async move { futures::future::select_all(all).await.0 }
    }

    /// Releases every permit and waits for the server.
    pub async fn release(self) -> Result<()> {
        let results = futures::future::join_all(self.leases.into_iter().map(|l| l.release())).await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

//! The counting semaphore (Curator's InterProcessSemaphoreV2 layout).

use super::guard::HeldNode;
use super::mutex::Mutex;
use super::queue::{is_no_node, list_dir, other_recipe, Acquired, Pending, Queue};
use super::session::{await_connected, is_connection_loss, session_error, Failure};
use super::{backend, url, Client};
use crate::LockState;
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
/// Every user of a path must agree on the permit count (as with Curator). distlock records it in
/// each lease node's owner record, and an acquire that finds leases taken with another count is
/// refused with [`Error::InvalidArgument`] naming both counts; Curator's leases carry no count and
/// are not checked. With one permit this is Curator's InterProcessSemaphoreMutex: a non-reentrant lock
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
    /// The leases directory as a queue (for its protected create); leases are not FIFO-granted.
    lease_queue: Queue,
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
        let leases = format!("{path}/leases");
        let mut owner = crate::Owner::current();
        owner.permits = Some(permits);
        let data = Some(std::sync::Arc::from(owner.encode()));
        let lease_queue = Queue { client: client.clone(), dir: leases.clone(), marker: "lease-", data };
        Ok(Semaphore { leases, client, path, permits, gate, lease_queue })
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
    ///
    /// # Cancel safety
    /// Cancel safe: lease nodes are created under a prefix unique to the acquire, so a dropped
    /// acquire (or one whose create reply was lost) finds and deletes them in the background.
    pub async fn acquire_with(&self, n: u32, timeout: Option<Duration>) -> Result<Option<SemaphorePermit>> {
        if n == 0 || n > self.permits {
            return Err(Error::InvalidArgument {
                what: "permit count",
                reason: format!("asked for {n} permits of {} on {}", self.permits, self.path),
            });
        }
        let deadline = timeout.and_then(super::queue::deadline_after);
        let remaining = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let Some(gate) = self.gate.lock_with(remaining(), None).await? else { return Ok(None) };
        let mut leases: Vec<Pending> = Vec::with_capacity(n as usize);
        let taking = self.take_leases(n, deadline, &mut leases);
        let result = match deadline {
            Some(d) if !timeout.is_some_and(|t| t.is_zero()) => {
                tokio::time::timeout_at(d, taking).await.unwrap_or(Ok(None))
            }
            _ => taking.await,
        };
        // Bounded by the deadline (plus a grace): the gate's delete goes on in the background.
        let bound = deadline.map(|d| d.max(Instant::now()) + Duration::from_millis(200));
        let gate_result = match bound {
            Some(b) => tokio::time::timeout_at(b, gate.release()).await.unwrap_or(Ok(())),
            None => gate.release().await,
        };
        match result {
            Ok(Some(nodes)) => {
                gate_result?;
                for lease in &mut leases {
                    lease.disarm();
                }
                super::session::renew_if_short(&self.client).await;
                let leases = nodes
                    .into_iter()
                    .map(|a| HeldNode::new(self.client.clone(), self.path.clone(), a.path, a.czxid))
                    .collect();
                let permit = SemaphorePermit { client: self.client.clone(), leases };
                // The gate's release can outlast the session (its delete waits out a lost
                // connection): a permit already lost is never handed out (the simulation found
                // one granted as its session expired, seed 1000509). Dropped, its leases go.
                // (The planted defect `semaphore-lost-permit` skips this check, as before.)
                let lost = match super::sim::planted("semaphore-lost-permit") {
                    true => None,
                    false => permit.leases.iter().map(HeldNode::state_now).find(|s| s.is_lost()),
                };
                match lost {
                    Some(LockState::Lost(reason @ (LostReason::SessionExpired | LostReason::SessionClosed))) => {
                        Err(session_error(reason))
                    }
                    Some(LockState::Lost(reason)) => Err(Error::LockLost { lock: self.path.clone(), reason }),
                    _ => Ok(Some(permit)),
                }
            }
            Ok(None) | Err(_) => {
                let removals = leases.iter_mut().map(|l| l.remove_within(bound));
                let cleanup: Result<Vec<()>> = futures::future::join_all(removals).await.into_iter().collect();
                match (result, cleanup) {
                    (Err(e), _) | (Ok(None), Err(e)) => Err(e),
                    _ => Ok(None),
                }
            }
        }
    }

    /// Creates `n` lease nodes (each protected by a unique prefix, found again after a lost
    /// reply) and waits until they are within the permit count. `None` when a try found too many.
    async fn take_leases(
        &self,
        n: u32,
        deadline: Option<Instant>,
        leases: &mut Vec<Pending>,
    ) -> Result<Option<Vec<Acquired>>> {
        let zk = self.client.zk();
        let metrics = self.client.metrics();
        let never_wait = deadline.is_some_and(|d| d <= Instant::now());
        // Sent together with the first lease: a mutex or read/write lock on this very path would
        // let both hold at once.
        metrics.sent_background(1);
        let parent = zk.list_children(&self.path);
        let mut parent = Some(parent);
        let mut taken = Vec::with_capacity(n as usize);
        for _ in 0..n {
            leases.push(Pending::new(&self.client, &self.leases));
            let pending = leases.last_mut().expect("just pushed");
            let (acquired, mut children) = self.lease_queue.create_and_list(pending).await?;
            if let Some(parent) = parent.take() {
                let siblings = match parent.await {
                    Ok(c) => c,
                    Err(zk::Error::NoNode) => Vec::new(),
                    Err(e) if is_connection_loss(&e) => self.lease_queue_parent().await?,
                    Err(e) => return Err(backend("getChildren", &self.path, e)),
                };
                if let Some(other) = siblings.iter().find_map(|c| other_recipe(c, MARKERS)) {
                    let wanted = format!("a semaphore of {} permits", self.permits);
                    return Err(super::queue::kind_conflict(&self.path, other, &wanted));
                }
            }
            let name = acquired.path[self.leases.len() + 1..].to_string();
            if taken.is_empty() {
                self.check_permit_count(&children, &name).await?;
            }
            taken.push(acquired);
            loop {
                if !children.contains(&name) {
                    return Err(Error::LockLost { lock: self.path.clone(), reason: LostReason::NodeDeleted });
                }
                if children.len() <= self.permits as usize {
                    break;
                }
                if never_wait {
                    return Ok(None);
                }
                metrics.sent(1);
                let watcher = match zk.list_and_watch_children(&self.leases).await {
                    Ok((c, w)) => {
                        children = c;
                        if children.len() <= self.permits as usize || !children.contains(&name) {
                            continue;
                        }
                        w
                    }
                    Err(e) => match Failure::of(&e) {
                        Failure::Connection => {
                            await_connected(zk).await?;
                            continue;
                        }
                        Failure::SessionGone(reason) => return Err(session_error(reason)),
                        Failure::Server | Failure::Local => return Err(backend("getChildren", &self.leases, e)),
                    },
                };
                let event = watcher.changed().await;
                metrics.woke();
                if event.event_type == zk::EventType::Session {
                    match event.session_state {
                        zk::SessionState::Expired => return Err(Error::SessionExpired),
                        zk::SessionState::Closed | zk::SessionState::AuthFailed => return Err(Error::Closed),
                        _ => {}
                    }
                }
            }
        }
        Ok(Some(taken))
    }

    /// Refuses to join leases taken with another permit count: one holder thinking the limit is 2
    /// and another 5 would let 5 hold where 2 were meant to. Reads the oldest other lease (one
    /// round trip, only when the semaphore is in use); a lease without a count (Curator's, or
    /// one that left meanwhile) is not checked.
    async fn check_permit_count(&self, children: &[String], ours: &str) -> Result<()> {
        let mut others: Vec<String> = children.iter().filter(|c| c.as_str() != ours).cloned().collect();
        if others.is_empty() {
            return Ok(());
        }
        super::queue::sort_children(&mut others, &["lease-"]);
        // The oldest lease that records a count (one that left meanwhile, or Curator's, which
        // records none, is passed over; a few at most are read).
        let mut theirs = None;
        for other in others.iter().take(3) {
            let path = format!("{}/{}", self.leases, other);
            self.client.metrics().sent(1);
            match self.client.zk().get_data(&path).await {
                Ok((data, _)) => {
                    theirs = crate::Owner::parse(&data).and_then(|o| o.permits);
                    if theirs.is_some() {
                        break;
                    }
                }
                Err(e) => tracing::debug!(node = %path, error = %e, "could not read a lease's permit count"),
            }
        }
        match theirs {
            Some(p) if p != self.permits => Err(Error::InvalidArgument {
                what: "permit count",
                reason: format!(
                    "{} is in use as a semaphore with {p} permits; this one was made with {}",
                    self.path, self.permits
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Lists the semaphore path itself, across connection losses.
    async fn lease_queue_parent(&self) -> Result<Vec<String>> {
        match list_dir(&self.client, &self.path).await {
            Err(e) if is_no_node(&e) => Ok(Vec::new()),
            other => other,
        }
    }
}

/// The children a semaphore keeps under its path.
const MARKERS: &[&str] = &["leases", "locks"];

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
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct SemaphorePermit {
    client: Client,
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

    /// The lease deadline of our session (see
    /// [`MutexGuard::lease_deadline`](super::MutexGuard::lease_deadline)).
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.client.lease_deadline()
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

//! The queue algorithm every ZooKeeper recipe shares.
//!
//! A contender creates an EPHEMERAL_SEQUENTIAL child `_c_<uuid>-<marker><seq>` under the lock
//! directory, lists the directory, sorts the children by the sequence after the marker (as
//! Apache Curator does), and asks the recipe's [`Policy`] whether some earlier child blocks it.
//! If one does, it watches only that child (getData with a watch, so no watch is left on a
//! missing node) and re-checks when the watch fires. Details and the safety argument are in
//! `docs/design.md`.
//!
//! Round trips: create and getChildren are sent back to back (requests on one session are
//! answered in order, so the listing already contains our node), so an uncontended acquire
//! costs one round trip. When the blocker was the only thing ahead of us, its deletion alone
//! proves we are first (sequence numbers only grow, so nothing can appear ahead of us), and the
//! hand-off needs no further read.

use super::session::{await_connected, delete_own, is_connection_loss, session_error, Failure};
use super::{backend, AclMode, Client};
use crate::{Error, Result};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

/// How many times the lock directory is made again when reaped under us, and how many times we
/// queue again when our node is deleted by someone else while we wait.
const MAX_ATTEMPTS: u32 = 5;
/// First backoff between attempts; doubles each time, capped at [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How deep in the queue a waiter also watches the node ahead of its blocker. Deeper waiters
/// would each list the whole directory once per hand-off, concurrently: with 10,000 waiters
/// those listings (up to 10,000 names each) piled up faster than they were served, and Apache
/// ZooKeeper with a 512 MB heap died during the drain. Within this depth the listings are few.
const LOOKAHEAD_DEPTH: usize = 16;

pub use crate::QueueStatus;

pub(crate) use crate::contract::Wait;

/// `now + t`, or `None` when that is too far to represent (a timeout of centuries: forever).
pub(crate) fn deadline_after(t: Duration) -> Option<Instant> {
    Instant::now().checked_add(t)
}

/// A recipe's rule for who may proceed.
pub(crate) trait Policy: Send + Sync {
    /// `sorted` is the queue in order; `ours` our index in it. Returns the index of the child we
    /// must wait for, or `None` when we may proceed.
    fn blocker(&self, sorted: &[String], ours: usize) -> Option<usize>;

    /// Whether we would proceed if `blocker` left the queue `sorted` (and nothing else changed).
    fn proceeds_without(&self, sorted: &[String], ours: usize, blocker: usize) -> bool {
        let mut without = sorted[..=ours].to_vec();
        without.remove(blocker);
        self.blocker(&without, ours - 1).is_none()
    }
}

/// Exclusive: only the first child holds; everyone else waits for the child just ahead.
pub(crate) struct Exclusive;

impl Policy for Exclusive {
    fn blocker(&self, _sorted: &[String], ours: usize) -> Option<usize> {
        ours.checked_sub(1)
    }

    fn proceeds_without(&self, sorted: &[String], ours: usize, blocker: usize) -> bool {
        // A read/write lock's writer may downgrade: it inserts a read node at its own place in
        // the queue before deleting its write node, so its deletion alone proves nothing.
        ours == 1 && blocker == 0 && node_kind(&sorted[0]) != NodeKind::Write
    }
}

/// A lock directory and the naming of its children.
#[derive(Debug, Clone)]
pub(crate) struct Queue {
    pub(crate) client: Client,
    /// The lock directory, e.g. `/locks/orders`.
    pub(crate) dir: String,
    /// The marker before the sequence, e.g. `lock-`.
    pub(crate) marker: &'static str,
    /// Data of our nodes when not the client's owner record (a semaphore's lease records its
    /// permit count too).
    pub(crate) data: Option<std::sync::Arc<[u8]>>,
}

impl Queue {
    /// What this queue's nodes are, as a user names the kind (in errors).
    pub(crate) fn wanted(&self) -> &'static str {
        match self.marker {
            READ => "a read lock",
            WRITE => "a write lock",
            LATCH => "a leader latch",
            LOCK => "a mutex",
            _ => "a semaphore",
        }
    }

    /// Every marker that may take part in this directory's queue: the lock family's, or (for a
    /// semaphore's leases) the marker alone.
    pub(crate) fn markers(&self) -> &'static [&'static str] {
        if FAMILY.contains(&self.marker) {
            FAMILY
        } else if self.marker == LATCH {
            LATCH_MARKERS
        } else {
            LEASE_MARKERS
        }
    }
}

/// A semaphore's lease nodes.
const LEASE_MARKERS: &[&str] = &["lease-"];
/// A leader latch's nodes.
const LATCH_MARKERS: &[&str] = &[LATCH];

/// What woke a waiter.
enum Woken {
    /// The blocker's deletion granted us the lock.
    Granted,
    /// Something changed: list the queue again.
    Relist,
    /// The connection failed: wait for it, then list again.
    Reconnect,
}

/// What a waiter watches, from its last listing of the queue.
struct Watching {
    /// The node we wait for.
    blocker: String,
    /// The node just ahead of the blocker, and whether its deletion alone means only the blocker
    /// is left ahead of us.
    lookahead: Option<(String, bool)>,
    /// When that deletion does not settle it: every node ahead of the lookahead node, to be read
    /// once it goes.
    further: Vec<String>,
    /// Whether the blocker's deletion alone grants us the lock.
    grant_on_delete: bool,
    /// The queue's length at the listing.
    queue_len: usize,
    /// How many nodes were ahead of ours at the listing (published once the watch is set).
    ahead: usize,
}

/// Whether none of `paths` exists, read in one round trip (no watches). Any error answers
/// `false`: the caller then lists the queue as it would have. A "gone" never goes stale: node
/// names carry the acquire's unique prefix, so a deleted node never comes back (a downgrade's
/// read node is ruled out by the caller: no write node is ahead), and a server behind the one
/// that listed them can only answer that one still exists.
async fn all_gone(zk: &zk::Client, metrics: &super::Metrics, paths: &[String]) -> bool {
    metrics.sent(paths.len() as u64);
    let batch = zk.batch();
    let checks: Vec<_> = paths.iter().map(|p| batch.check_stat(p)).collect();
    batch.send();
    futures::future::join_all(checks).await.into_iter().all(|r| matches!(r, Ok(None)))
}

/// A node we created and own in the queue.
#[derive(Debug, Clone)]
pub(crate) struct Acquired {
    /// Full path of our node.
    pub(crate) path: String,
    /// Creation zxid of our node: the fencing token.
    pub(crate) czxid: i64,
}

/// Marker of mutex nodes (Apache Curator's InterProcessMutex: `_c_<uuid>-lock-<seq>`).
pub(crate) const LOCK: &str = "lock-";
/// Marker of read nodes (Curator's InterProcessReadWriteLock).
pub(crate) const READ: &str = "__READ__";
/// Marker of write nodes (Curator's InterProcessReadWriteLock).
pub(crate) const WRITE: &str = "__WRIT__";
/// The layouts that share one directory and one queue, ordered by sequence number: mutex nodes
/// and writers are exclusive, readers share with readers. So a path's kind never depends on who
/// came first: a mutex on a path that readers hold waits for them like a writer.
pub(crate) const FAMILY: &[&str] = &[LOCK, READ, WRITE];
/// Marker of Curator's LeaderLatch nodes (`_c_<uuid>-latch-<seq>`): a queue of its own, exclusive
/// like mutex nodes, never mixed with the lock family's.
pub(crate) const LATCH: &str = "latch-";
/// Every queue marker, for reading a directory of any of them.
pub(crate) const EVERY_MARKER: &[&str] = &[LOCK, READ, WRITE, LATCH];

/// What a child of a lock directory is, by the marker that decides its sort key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// A mutex node (exclusive).
    Lock,
    /// A reader (shares with readers).
    Read,
    /// A writer (exclusive).
    Write,
    /// Not a lock node; the queue ignores it.
    Other,
}

pub(crate) fn node_kind(name: &str) -> NodeKind {
    let found =
        EVERY_MARKER.iter().filter_map(|m| name.rfind(m).map(|i| (i + m.len(), *m))).max_by_key(|(end, _)| *end);
    match found {
        Some((_, LOCK | LATCH)) => NodeKind::Lock,
        Some((_, READ)) => NodeKind::Read,
        Some((_, WRITE)) => NodeKind::Write,
        _ => NodeKind::Other,
    }
}

/// Whether a child excludes everyone queued after it (a mutex node or a writer).
pub(crate) fn is_exclusive(name: &str) -> bool {
    matches!(node_kind(name), NodeKind::Lock | NodeKind::Write)
}

/// Sort key of a child: the text after the last marker, or the whole name (Curator's rule).
pub(crate) fn sort_key<'a>(name: &'a str, markers: &[&str]) -> &'a str {
    markers.iter().filter_map(|m| name.rfind(m).map(|i| i + m.len())).max().map(|i| &name[i..]).unwrap_or(name)
}

/// Names the recipe a child belongs to when it cannot share our queue (a semaphore's layout and
/// the queue locks' layout would let both sides hold at once).
pub(crate) fn other_recipe(name: &str, markers: &[&str]) -> Option<&'static str> {
    let families: [(&[&str], &str); 3] = [
        (FAMILY, "a mutex or read/write lock"),
        (&["leases", "locks"], "a semaphore (use the same permit count)"),
        (
            LATCH_MARKERS,
            "a leader latch (Curator's LeaderLatch; for a LeaderSelector's path add ?election=selector to the URL)",
        ),
    ];
    for (family, what) in families {
        if family.iter().any(|m| markers.contains(m)) {
            continue;
        }
        let belongs =
            if family.contains(&"leases") { family.contains(&name) } else { family.iter().any(|m| name.contains(m)) };
        if belongs {
            return Some(what);
        }
    }
    None
}

/// The refusal of a lock directory (with `acl=creator`) that someone else may change.
fn foreign_dir(dir: &str, entry: &str) -> Error {
    Error::InvalidLockPath {
        path: dir.to_string(),
        reason: format!(
            "acl=creator, but this lock's directory was made by someone else and lets {entry} change it \
             (they could queue ahead or delete the holder's node); have its owner delete it \
             (`deleteall {dir}`) or give it this login's ACL (`setAcl {dir} auth::cdrwa,world:anyone:r`), then try again"
        ),
    }
}

/// The contract's refusal of a path in use as another kind of lock.
pub(crate) fn kind_conflict(path: &str, in_use: &str, wanted: &str) -> Error {
    Error::KindConflict { lock: path.to_string(), in_use: in_use.to_string(), wanted: wanted.to_string() }
}

/// Sorts children into queue order.
pub(crate) fn sort_children(children: &mut [String], markers: &[&str]) {
    // Each key is found once (a substring search), not once per comparison.
    let mut keyed: Vec<(usize, String)> =
        children.iter_mut().map(|c| (c.len() - sort_key(c, markers).len(), std::mem::take(c))).collect();
    keyed.sort_unstable_by(|(ia, a), (ib, b)| a[*ia..].cmp(&b[*ib..]).then_with(|| a.cmp(b)));
    for (slot, (_, name)) in children.iter_mut().zip(keyed) {
        *slot = name;
    }
}

/// How long an acquire whose deadline has passed still waits for the deletion of its node
/// before returning; the deletion goes on in the background after that.
const CLEANUP_GRACE: Duration = Duration::from_millis(200);

/// Our node in a queue, from before its create is sent until the acquire succeeds: removes it
/// (in a task of its own, so that dropping the caller cannot stop it) if the acquire gives up,
/// fails or is dropped. Disarmed on success. Keeps the session's lease renewed meanwhile, so a
/// grant starts with a fresh lease.
///
/// One string holds everything a waiter must remember of its node (a long queue keeps one per
/// waiter): `<dir>/<prefix>` until the node is created, then the node's whole path
/// `<dir>/<prefix><marker><seq>`. The prefix `_c_<uuid>-` is unique to this acquire.
pub(crate) struct Pending {
    client: Client,
    node: String,
    dir_len: usize,
    created: bool,
    armed: bool,
}

/// Length of a node's unique prefix, `_c_<uuid>-`.
const PREFIX_LEN: usize = 3 + 36 + 1;

impl Pending {
    pub(crate) fn new(client: &Client, dir: &str) -> Pending {
        client.lease().hold();
        // Room for the longest marker (`__READ__`, `__WRIT__`) and a 10-digit sequence.
        let mut node = String::with_capacity(dir.len() + 1 + PREFIX_LEN + 18);
        node.push_str(dir);
        node.push('/');
        let dir_len = dir.len();
        let mut pending = Pending { client: client.clone(), node, dir_len, created: false, armed: true };
        pending.new_prefix();
        pending
    }

    /// Takes a fresh unique prefix (queueing again) and forgets any node.
    pub(crate) fn new_prefix(&mut self) {
        self.node.truncate(self.dir_len + 1);
        self.node.push_str(&format!("_c_{}-", uuid::Uuid::new_v4()));
        debug_assert_eq!(self.node.len(), self.dir_len + 1 + PREFIX_LEN);
        self.created = false;
    }

    /// The lock directory.
    pub(crate) fn dir(&self) -> &str {
        &self.node[..self.dir_len]
    }

    /// Our unique prefix, `_c_<uuid>-`.
    pub(crate) fn prefix(&self) -> &str {
        &self.node[self.dir_len + 1..self.dir_len + 1 + PREFIX_LEN]
    }

    /// Our node's path, once it is known to exist.
    pub(crate) fn path(&self) -> Option<&str> {
        self.created.then_some(self.node.as_str())
    }

    /// Our node's name in the directory (meaningful once created).
    pub(crate) fn name(&self) -> &str {
        &self.node[self.dir_len + 1..]
    }

    /// Our node exists, named `<prefix><rest>`.
    fn created(&mut self, rest: &str) {
        self.node.truncate(self.dir_len + 1 + PREFIX_LEN);
        self.node.push_str(rest);
        self.created = true;
    }

    /// Keeps the node: the acquire succeeded.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Starts the removal of our node now, in a task of its own; the handle reports its end.
    pub(crate) fn remove(&mut self) -> Option<tokio::task::JoinHandle<Result<()>>> {
        if !std::mem::replace(&mut self.armed, false) {
            return None;
        }
        let (client, dir, prefix, path) =
            (self.client.clone(), self.dir().to_string(), self.prefix().to_string(), self.path().map(str::to_string));
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => Some(handle.spawn(async move {
                let result = remove_own(&client, &dir, &prefix, path.as_deref()).await;
                if let Err(e) = &result {
                    tracing::warn!(dir, prefix, error = %e, "could not remove an abandoned lock node; the session's end will");
                }
                result
            })),
            Err(_) => {
                if let Some(path) = path {
                    // The request is queued on the session at once; nobody awaits the reply.
                    self.client.inner.metrics.sent_background(1);
                    drop(self.client.zk().delete(&path, None));
                }
                None
            }
        }
    }

    /// Removes our node and waits for the server, at most until `bound` (then the removal goes
    /// on in the background).
    pub(crate) async fn remove_within(&mut self, bound: Option<Instant>) -> Result<()> {
        let Some(task) = self.remove() else { return Ok(()) };
        let joined = match bound {
            Some(bound) => match tokio::time::timeout_at(bound, task).await {
                Ok(joined) => joined,
                Err(_) => {
                    tracing::debug!(dir = %self.dir(), "deadline passed; our node is removed in the background");
                    return Ok(());
                }
            },
            None => task.await,
        };
        joined.unwrap_or(Ok(()))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.remove();
        self.client.lease().unhold();
    }
}

/// Deletes our node for sure: by path when we know it, else by finding our unique prefix (a
/// create whose reply was lost may or may not have been applied). Retried across connection
/// losses until done or the session is gone.
async fn remove_own(client: &Client, dir: &str, prefix: &str, path: Option<&str>) -> Result<()> {
    let paths = match path {
        Some(path) => vec![path.to_string()],
        // Catch up with the leader first: a follower we reconnected to may not have applied our
        // create yet.
        None => match sync_then_list(client, dir).await {
            Ok(children) => {
                children.into_iter().filter(|c| c.starts_with(prefix)).map(|c| format!("{dir}/{c}")).collect()
            }
            // No directory, or no session: nothing of ours is left.
            Err(e) if is_no_node(&e) => Vec::new(),
            Err(Error::SessionExpired) | Err(Error::Closed) => Vec::new(),
            Err(e) => return Err(e),
        },
    };
    let deletes: Vec<_> = paths.iter().map(|p| delete_own(client, p)).collect();
    for r in futures::future::join_all(deletes).await {
        r?;
    }
    Ok(())
}

/// True for the error [`list_dir`] reports for a missing directory.
pub(crate) fn is_no_node(e: &Error) -> bool {
    matches!(e, Error::Backend { source, .. } if source.downcast_ref::<zk::Error>() == Some(&zk::Error::NoNode))
}

/// `sync` on `dir` (so a follower has applied everything the leader had), then [`list_dir`].
async fn sync_then_list(client: &Client, dir: &str) -> Result<Vec<String>> {
    loop {
        let sent = Instant::now();
        let result = client.zk().sync(dir).await;
        client.lease().observe(sent, &result);
        match result {
            Ok(()) | Err(zk::Error::NoNode) => return list_dir(client, dir).await,
            Err(e) => match Failure::of(&e) {
                Failure::Connection => await_connected(client.zk()).await?,
                Failure::SessionGone(reason) => return Err(session_error(reason)),
                Failure::Server | Failure::Local => return Err(backend("sync", dir, e)),
            },
        }
    }
}

/// Lists a directory, retrying across connection losses until the session is gone; `NoNode` is
/// reported as [`Error::Backend`].
pub(crate) async fn list_dir(client: &Client, dir: &str) -> Result<Vec<String>> {
    let zk = client.zk();
    loop {
        client.inner.metrics.sent(1);
        // A read: it renews no lease (a follower may answer it on its own).
        let result = {
            let _permit = client.listing_permit().await;
            zk.list_children(dir).await
        };
        match result {
            Ok(children) => return Ok(children),
            Err(e) => match Failure::of(&e) {
                Failure::Connection => await_connected(zk).await?,
                Failure::SessionGone(reason) => return Err(session_error(reason)),
                Failure::Server | Failure::Local => return Err(backend("getChildren", dir, e)),
            },
        }
    }
}

impl Queue {
    /// Joins the queue and waits (per `wait`) until `policy` lets us proceed.
    ///
    /// Returns `Ok(None)` when we gave up (never waiting, or the deadline passed); our node is
    /// deleted before returning (when the deadline has passed, at most [`CLEANUP_GRACE`] is spent
    /// on that, and the deletion goes on in the background). Connection losses are retried within
    /// the deadline (or, without one, until the session ends). Cancel safe: dropping the future
    /// removes our node in the background.
    pub(crate) async fn acquire(
        &self,
        policy: &dyn Policy,
        wait: Wait,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<Acquired>> {
        let mut pending = Pending::new(&self.client, &self.dir);
        let inner = self.acquire_inner(policy, wait, progress, &mut pending);
        let result = match wait.deadline() {
            Some(deadline) => Box::pin(tokio::time::timeout_at(deadline, inner)).await.unwrap_or(Ok(None)),
            None => Box::pin(inner).await,
        };
        match result {
            Ok(Some(acquired)) => {
                pending.disarm();
                // Boxed: inline, it would size the acquire future for as long as it waits.
                Box::pin(super::session::renew_if_short(&self.client)).await;
                Ok(Some(acquired))
            }
            Ok(None) | Err(_) => {
                // Leave nothing behind: delete our node before reporting.
                let bound = wait.deadline().map(|d| d.max(Instant::now()) + CLEANUP_GRACE);
                let cleanup = Box::pin(pending.remove_within(bound)).await;
                match (result, cleanup) {
                    (Ok(None), Ok(())) => Ok(None),
                    (Ok(None), Err(e)) => Err(e),
                    (Err(e), _) => Err(e),
                    (Ok(Some(_)), _) => unreachable!(),
                }
            }
        }
    }

    async fn acquire_inner(
        &self,
        policy: &dyn Policy,
        wait: Wait,
        progress: Option<&watch::Sender<QueueStatus>>,
        pending: &mut Pending,
    ) -> Result<Option<Acquired>> {
        let zk = self.client.zk();
        // Our node's path is kept once, in `pending`; of the rest only its creation zxid.
        let (acquired, mut children) = Box::pin(self.create_and_list(pending)).await?;
        let mut czxid = acquired.czxid;
        drop(acquired);
        let granted = |pending: &Pending, czxid| Ok(Some(Acquired { path: pending.node.clone(), czxid }));
        let mut recreated = 0;
        // Checked once per acquire: whether a semaphore's directories here are in use.
        let mut semaphore_checked = false;
        loop {
            // A semaphore's `locks`/`leases` or a leader latch's nodes belong to another recipe
            // (mutex and read/write nodes share one queue). A semaphore's directories outlive
            // their users for a while (containers are reaped late): only a semaphore in use makes
            // the path its own; a latch's nodes are ephemeral, so there is one in use.
            if let Some(other) = children.iter().find_map(|c| other_recipe(c, self.markers())) {
                let in_use = !other.starts_with("a semaphore")
                    || (!semaphore_checked && !Box::pin(self.semaphore_idle()).await?);
                if in_use {
                    return Err(kind_conflict(&self.dir, other, self.wanted()));
                }
                semaphore_checked = true;
            }
            // Children that are not lock nodes (a stray znode) take no part in the queue.
            children.retain(|c| self.markers().iter().any(|m| c.contains(m)));
            sort_children(&mut children, self.markers());
            let own_name = pending.name();
            let Some(ours) = children.iter().position(|c| c == own_name) else {
                // Our node vanished while we waited (deleted by an operator?): queue again.
                recreated += 1;
                if recreated > MAX_ATTEMPTS {
                    return Err(Error::LockLost { lock: self.dir.clone(), reason: crate::LostReason::NodeDeleted });
                }
                tracing::warn!(node = %pending.node, "our lock node disappeared while waiting; queueing again");
                pending.new_prefix();
                let (a, c) = Box::pin(self.create_and_list(pending)).await?;
                czxid = a.czxid;
                children = c;
                continue;
            };
            let Some(blocker) = policy.blocker(&children, ours) else {
                if let Some(p) = progress {
                    p.send_replace(QueueStatus { ahead: 0, queue_len: children.len() });
                }
                return granted(pending, czxid);
            };
            if let Wait::Never = wait {
                return Ok(None);
            }
            // If the blocker were gone, would we proceed with what we know now? Then its deletion
            // alone grants us the lock: nodes created later sort after ours.
            let grant_on_delete = policy.proceeds_without(&children, ours, blocker);
            // If not, watch the node just ahead of the blocker too, when its deletion alone would
            // settle it: then the blocker's deletion grants us the lock without listing again, as
            // a hand-off needs (the listing then comes while the lock is held, off its path).
            // Never on a write node's deletion: a downgrading writer puts a read node in its place.
            let lookahead =
                (!grant_on_delete && blocker >= 1 && ours <= LOOKAHEAD_DEPTH).then(|| blocker - 1).map(|s| {
                    let mut without = children[..=ours].to_vec();
                    without.remove(s);
                    let settles = node_kind(&children[s]) != NodeKind::Write
                        && policy.blocker(&without, ours - 1) == Some(blocker - 1)
                        && policy.proceeds_without(&without, ours - 1, blocker - 1);
                    (format!("{}/{}", self.dir, children[s]), settles)
                });
            // When the ahead node's deletion alone does not settle it (more nodes are ahead of it),
            // the nodes further ahead: once the ahead node goes, one read finds whether they are all
            // gone too, and then the blocker's deletion grants us the lock, with no listing and
            // without leaving the wait. Only when none of them is a write node (a downgrading
            // writer would put a read node in its place) and nothing but the blocker is between
            // it and us.
            let further = match &lookahead {
                Some((_, false))
                    if blocker + 1 == ours
                        && children[..blocker].iter().all(|c| node_kind(c) != NodeKind::Write)
                        && policy.blocker(&children[blocker..=ours], 1) == Some(0)
                        && policy.proceeds_without(&children[blocker..=ours], 1, 0) =>
                {
                    children[..blocker - 1].iter().map(|c| format!("{}/{}", self.dir, c)).collect()
                }
                _ => Vec::new(),
            };
            let watching = Watching {
                blocker: format!("{}/{}", self.dir, children[blocker]),
                lookahead,
                further,
                grant_on_delete,
                queue_len: children.len(),
                ahead: ours,
            };
            // Waiters hold no copy of the queue while they sleep: memory per waiter stays constant
            // however long the queue is (a waiter near the front keeps a few names, see `further`).
            drop(std::mem::take(&mut children));
            let woken = Box::pin(self.watch_and_wait(pending, watching, progress)).await?;
            match woken {
                Woken::Granted => return granted(pending, czxid),
                Woken::Relist => {}
                Woken::Reconnect => Box::pin(await_connected(zk)).await?,
            }
            children = Box::pin(self.list()).await?;
        }
    }

    /// Watches the blocker (and, when its deletion may grant us the lock, our own node, the node
    /// ahead of it and the connection) and sleeps until something changes. A future of its own,
    /// boxed by the caller: what a sleeping waiter keeps is only what this needs.
    async fn watch_and_wait(
        &self,
        pending: &Pending,
        watching: Watching,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Woken> {
        let Watching { blocker: blocker_path, lookahead, further, mut grant_on_delete, queue_len, ahead } = watching;
        let zk = self.client.zk();
        let metrics = &self.client.inner.metrics;
        // Whether the blocker's deletion may grant us the lock without a listing, now or once
        // the node ahead of it goes. Only then do we watch our own node (a grant on the
        // blocker's deletion must not be given if our node was deleted first) and the
        // connection (see below); a waiter deeper in the queue lists again on any change, and
        // that listing shows whether our node is still there. One watch per deep waiter keeps
        // the memory of a long queue (client and server) low.
        let may_grant = grant_on_delete || matches!(lookahead, Some((_, true))) || !further.is_empty();
        metrics.sent(1 + may_grant as u64);
        // A reconnection between here and the blocker's deletion voids the no-re-read grant:
        // the server then fires re-registered watches in no particular order.
        let mut states = may_grant.then(|| {
            let mut states = zk.state_watcher();
            // Only changes from now on count: a fresh watcher may still show an older change
            // (the connection made before this acquire) as unseen, which voided every grant.
            states.state();
            states
        });
        // The batch (a client of its own) is dropped once answered, and these requests'
        // futures live in a box of their own (inline, they would size the whole acquire
        // future for as long as it waits): a waiter keeps only its watches while it sleeps.
        let (blocker_watch, own_watch, ahead_watch) = Box::pin(async {
            let batch = zk.batch();
            let blocker_watch = batch.get_and_watch_data(&blocker_path);
            let own_watch = may_grant.then(|| batch.get_and_watch_data(&pending.node));
            let ahead_watch = lookahead.as_ref().map(|(path, _)| batch.get_and_watch_data(path));
            metrics.sent(lookahead.is_some() as u64);
            batch.send();
            // Only the watchers are kept (the node's data and stat would size the acquire
            // future for as long as it waits).
            let watcher = |r: std::result::Result<(Vec<u8>, zk::Stat, zk::OneshotWatcher), zk::Error>| {
                r.map(|(_, _, watcher)| watcher)
            };
            let optional = |w: Option<_>| async {
                match w {
                    Some(w) => Some(watcher(w.await)),
                    None => None,
                }
            };
            futures::join!(async { watcher(blocker_watch.await) }, optional(own_watch), optional(ahead_watch))
        })
        .await;
        // The node ahead of the blocker: gone already (it settles it now, or we list again),
        // or watched.
        // The node ahead of the blocker was gone already, without settling it: read the nodes
        // further ahead at once (that answer is ordered after our listing, as an event would be).
        let ahead_gone_unsettled =
            matches!((&ahead_watch, &lookahead), (Some(Err(zk::Error::NoNode)), Some((_, false))));
        let mut ahead_changed = match (ahead_watch, &lookahead) {
            (Some(Ok(w)), _) => Some(Box::pin(w.changed())),
            (Some(Err(zk::Error::NoNode)), Some((_, true))) => {
                grant_on_delete = true;
                None
            }
            _ => None,
        };
        let relist_when_ahead_goes = matches!(lookahead, Some((_, false)));
        let (blocker_watcher, own_watcher) = match (blocker_watch, own_watch.transpose()) {
            (Ok(b), Ok(o)) => (b, o),
            // The blocker left before our watch (as a hand-off without work under the lock
            // does): read in server order after our listing, that is its deletion, and our
            // node was there after it. A deletion of ours since would have been notified
            // before the last of these replies.
            (Err(zk::Error::NoNode), Ok(Some(o))) if grant_on_delete => {
                if futures::FutureExt::now_or_never(Box::pin(o.changed())).is_none() {
                    tracing::trace!(node = %pending.node, "predecessor gone before our watch; granted");
                    if let Some(p) = progress {
                        p.send_replace(QueueStatus { ahead: 0, queue_len: queue_len - 1 });
                    }
                    return Ok(Woken::Granted);
                }
                return Ok(Woken::Relist);
            }
            (Err(e), _) | (_, Err(e)) => match Failure::of(&e) {
                // Gone before the watch was set (the blocker, or our own node): look again.
                Failure::Server if e == zk::Error::NoNode => return Ok(Woken::Relist),
                Failure::Connection => return Ok(Woken::Reconnect),
                Failure::SessionGone(reason) => return Err(session_error(reason)),
                Failure::Server | Failure::Local => return Err(backend("getData", &blocker_path, e)),
            },
        };
        drop(blocker_path);
        // Waiting now, with the watch set: a release from here on wakes us (published only now,
        // so that whoever waits for this status knows the wake-up will come as an event).
        if let Some(p) = progress {
            p.send_replace(QueueStatus { ahead, queue_len });
        }
        let mut own_changed = own_watcher.map(|o| Box::pin(o.changed()));
        let mut blocker_changed = Box::pin(blocker_watcher.changed());
        // The read of the nodes further ahead, once the ahead node has gone (see `further`).
        let mut further_check =
            (ahead_gone_unsettled && !further.is_empty()).then(|| Box::pin(all_gone(zk, metrics, &further)));
        let event = loop {
            tokio::select! {
                biased;
                // Events arrive in zxid order: if our node went first, this is seen first.
                _ = async { own_changed.as_mut().expect("guarded").await }, if own_changed.is_some() => break None,
                event = &mut blocker_changed => break Some(event),
                event = async { ahead_changed.as_mut().expect("guarded").await }, if ahead_changed.is_some() => {
                    ahead_changed = None;
                    if event.event_type == zk::EventType::NodeDeleted && !relist_when_ahead_goes {
                        metrics.woke(); // an event delivered, though it costs no request
                        grant_on_delete = true; // keep waiting for the blocker, knowing more
                        continue;
                    }
                    if event.event_type == zk::EventType::NodeDeleted && !further.is_empty() {
                        metrics.woke();
                        further_check = Some(Box::pin(all_gone(zk, metrics, &further)));
                        continue; // the blocker stays watched meanwhile
                    }
                    break None; // list again while the blocker still holds
                }
                gone = async { further_check.as_mut().expect("guarded").await }, if further_check.is_some() => {
                    further_check = None;
                    if gone {
                        grant_on_delete = true; // only the blocker is left ahead of us
                        continue;
                    }
                    break None; // something further ahead is still there: list again
                }
            }
        };
        // The blocker went while the read of the nodes further ahead was out: its answer decides.
        // (Anything else that ended the wait means listing again, whatever it says.)
        if let Some(check) = further_check.take() {
            if event.as_ref().is_some_and(|e| e.event_type == zk::EventType::NodeDeleted) {
                grant_on_delete = check.await;
            }
        }
        metrics.woke();
        match event {
            // A deletion of our own node before the blocker's would already be queued.
            Some(event)
                if event.event_type == zk::EventType::NodeDeleted
                    && grant_on_delete
                    && own_changed.as_mut().is_some_and(|o| futures::FutureExt::now_or_never(o).is_none())
                    && states.as_mut().is_some_and(|s| futures::FutureExt::now_or_never(s.changed()).is_none()) =>
            {
                tracing::trace!(node = %pending.node, "predecessor gone; granted without re-reading");
                if let Some(p) = progress {
                    p.send_replace(QueueStatus { ahead: 0, queue_len: queue_len - 1 });
                }
                return Ok(Woken::Granted);
            }
            Some(event) if event.event_type == zk::EventType::Session => match event.session_state {
                zk::SessionState::Expired => return Err(Error::SessionExpired),
                zk::SessionState::Closed | zk::SessionState::AuthFailed => return Err(Error::Closed),
                _ => {}
            },
            _ => {}
        }
        Ok(Woken::Relist)
    }

    /// Lists the lock directory, retrying across connection losses.
    async fn list(&self) -> Result<Vec<String>> {
        list_dir(&self.client, &self.dir).await
    }

    /// Creates our node and lists the directory in one round trip; creates missing parents as
    /// containers; after a connection loss finds our node by its unique prefix rather than
    /// creating a second one. Connection losses are retried until the session ends (the caller
    /// bounds the wait).
    pub(crate) async fn create_and_list(&self, pending: &mut Pending) -> Result<(Acquired, Vec<String>)> {
        let zk = self.client.zk();
        let metrics = &self.client.inner.metrics;
        let node_prefix = format!("{}/{}{}", self.dir, pending.prefix(), self.marker);
        let options = zk::CreateMode::EphemeralSequential.with_acls(self.client.acls());
        let mut attempts = 0;
        let mut parents_made = false;
        loop {
            attempts += 1;
            metrics.sent(2);
            let sent = Instant::now();
            let data = self.data.as_deref().unwrap_or(self.client.owner_data());
            // Handed to the session as one, so both leave in one write: requests made one by one
            // can be written apart when the session task runs on another thread in between.
            // With acl=creator, the directory's ACL in the same write: one made by someone else
            // (before our first lock here, or after it was reaped) may let them in.
            let creator = self.client.url().acl == AclMode::Creator;
            let (created, listed, acl) = {
                let _permit = self.client.listing_permit().await;
                let batch = zk.batch();
                let create = batch.create(&node_prefix, data, &options);
                let list = batch.list_children(&self.dir);
                let acl: futures::future::OptionFuture<_> = creator.then(|| batch.get_acl(&self.dir)).into();
                batch.send();
                futures::join!(create, list, acl)
            };
            self.client.lease().observe(sent, &created);
            match created {
                Ok((stat, seq)) => {
                    let path = format!("{node_prefix}{seq}");
                    pending.created(&path[node_prefix.len() - self.marker.len()..]);
                    if let Some(acl) = acl {
                        self.check_dir_acl(Some(acl)).await?;
                    }
                    let acquired = Acquired { path, czxid: stat.czxid };
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.list().await?,
                    };
                    return Ok((acquired, children));
                }
                Err(zk::Error::NoNode) if !parents_made => {
                    tracing::debug!(dir = %self.dir, "creating lock directory as containers");
                    self.make_dir().await?;
                    parents_made = true;
                }
                // The directory was reaped between our mkdir and create: make it again.
                Err(zk::Error::NoNode) if attempts < MAX_ATTEMPTS => parents_made = false,
                Err(e) => match Failure::of(&e) {
                    Failure::Connection => {
                        self.backoff(attempts).await?;
                        // The create may have been applied before the connection dropped: look
                        // for our prefix (unique to this acquire) instead of creating a second
                        // node.
                        if let Some(found) = self.find_own(pending.prefix()).await? {
                            tracing::debug!(node = %found.path, "found our node after a connection loss");
                            pending.created(&found.path[self.dir.len() + 1 + PREFIX_LEN..]);
                            if creator {
                                self.check_dir_acl(None).await?;
                            }
                            let children = Box::pin(self.list()).await?;
                            return Ok((found, children));
                        }
                    }
                    Failure::SessionGone(reason) => return Err(session_error(reason)),
                    Failure::Server | Failure::Local => return Err(backend("create", &node_prefix, e)),
                },
            }
        }
    }

    /// With `acl=creator`: refuses a directory whose ACL (read with the create, or now if that
    /// read is missing or failed) lets someone else change it. An ACL that cannot be read is a
    /// failure, not a pass.
    async fn check_dir_acl(
        &self,
        read: Option<std::result::Result<(Vec<zk::Acl>, zk::Stat), zk::Error>>,
    ) -> Result<()> {
        let acls = match read {
            Some(Ok((acls, _))) => acls,
            _ => loop {
                self.client.inner.metrics.sent(1);
                match self.client.zk().get_acl(&self.dir).await {
                    Ok((acls, _)) => break acls,
                    Err(e) if is_connection_loss(&e) => await_connected(self.client.zk()).await?,
                    Err(e) => return Err(backend("getACL", &self.dir, e)),
                }
            },
        };
        match self.client.foreign_entry(&acls) {
            Some(entry) => Err(foreign_dir(&self.dir, &entry)),
            None => Ok(()),
        }
    }

    /// Whether a semaphore's `<dir>/locks` and `<dir>/leases` are both missing or empty. A
    /// semaphore holds a gate node in `locks` from before it lists this directory until its lease
    /// exists, and then the lease: so an empty pair, read after our node exists, means no
    /// semaphore holder and none that could have missed our node.
    async fn semaphore_idle(&self) -> Result<bool> {
        let zk = self.client.zk();
        let (leases, gate) = (format!("{}/leases", self.dir), format!("{}/locks", self.dir));
        loop {
            self.client.inner.metrics.sent(2);
            let (l, g) = futures::join!(zk.check_stat(&leases), zk.check_stat(&gate));
            let empty = |stat: Option<zk::Stat>| stat.is_none_or(|s| s.num_children == 0);
            match (l, g) {
                (Ok(l), Ok(g)) => return Ok(empty(l) && empty(g)),
                (Err(e), _) | (_, Err(e)) if is_connection_loss(&e) => await_connected(zk).await?,
                (Err(e), _) | (_, Err(e)) => return Err(backend("exists", &self.dir, e)),
            }
        }
    }

    /// Creates the lock directory (and its parents) as containers, across connection losses.
    async fn make_dir(&self) -> Result<()> {
        let zk = self.client.zk();
        loop {
            self.client.inner.metrics.sent(1);
            match self.client.make_lock_dir(&self.dir).await {
                Ok(()) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => {
                    return Err(self.client.missing_chroot(&self.dir).await.unwrap_or_else(|| Error::InvalidLockPath {
                        path: self.dir.clone(),
                        reason: "a parent was deleted while it was being made; try again".into(),
                    }))
                }
                Err(e) if is_connection_loss(&e) => await_connected(zk).await?,
                Err(e) => return Err(backend("create", &self.dir, e)),
            }
        }
    }

    async fn backoff(&self, attempts: u32) -> Result<()> {
        let pause = FIRST_BACKOFF.saturating_mul(1 << attempts.min(10)).min(MAX_BACKOFF);
        tokio::time::sleep(pause).await;
        await_connected(self.client.zk()).await
    }

    /// Finds a node with our unique prefix, with its creation zxid. A listing that fails is
    /// retried, never taken for "not found" (which would queue a second node of ours).
    async fn find_own(&self, prefix: &str) -> Result<Option<Acquired>> {
        let zk = self.client.zk();
        let children = match sync_then_list(&self.client, &self.dir).await {
            Ok(c) => c,
            // The directory is gone, so our node is not in it.
            Err(e) if is_no_node(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(name) = children.into_iter().find(|c| c.starts_with(prefix)) else {
            return Ok(None);
        };
        let path = format!("{}/{}", self.dir, name);
        loop {
            self.client.inner.metrics.sent(1);
            match zk.check_stat(&path).await {
                Ok(Some(stat)) => return Ok(Some(Acquired { path, czxid: stat.czxid })),
                Ok(None) => return Ok(None),
                Err(e) if is_connection_loss(&e) => await_connected(zk).await?,
                Err(e) => return Err(backend("exists", &path, e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_like_curator() {
        let markers = &["lock-"];
        let mut c = vec![
            "_c_bbbb-lock-0000000003".to_string(),
            "foreign".to_string(),
            "_c_aaaa-lock-0000000010".to_string(),
            "_c_cccc-lock-0000000001".to_string(),
        ];
        sort_children(&mut c, markers);
        assert_eq!(c, ["_c_cccc-lock-0000000001", "_c_bbbb-lock-0000000003", "_c_aaaa-lock-0000000010", "foreign"]);
        assert_eq!(sort_key("_c_x-lock-0000000007", markers), "0000000007");
    }

    #[test]
    fn mixing_recipes_on_one_path_is_detected() {
        assert_eq!(other_recipe("_c_x-__WRIT__0000000001", FAMILY), None);
        assert_eq!(other_recipe("_c_x-lock-0000000001", FAMILY), None);
        assert_eq!(other_recipe("leases", FAMILY), Some("a semaphore (use the same permit count)"));
        assert_eq!(other_recipe("_c_x-lock-0000000001", &["leases", "locks"]), Some("a mutex or read/write lock"));
        assert_eq!(other_recipe("foreign", FAMILY), None);
    }

    #[test]
    fn mutex_and_read_write_nodes_form_one_queue() {
        let mut c = vec![
            "_c_b-__READ__0000000004".to_string(),
            "_c_a-lock-0000000002".to_string(),
            "_c_c-__WRIT__0000000003".to_string(),
        ];
        sort_children(&mut c, FAMILY);
        let kinds: Vec<NodeKind> = c.iter().map(|n| node_kind(n)).collect();
        assert_eq!(kinds, [NodeKind::Lock, NodeKind::Write, NodeKind::Read]);
        assert_eq!(node_kind("config"), NodeKind::Other);
        // A LeaderLatch node is exclusive, in a queue of its own: each side refuses the other.
        let latch = "_c_x-latch-0000000003";
        assert_eq!(node_kind(latch), NodeKind::Lock);
        assert_eq!(sort_key(latch, LATCH_MARKERS), "0000000003");
        assert!(other_recipe(latch, FAMILY).is_some_and(|w| w.contains("leader latch")));
        assert!(other_recipe("_c_x-lock-0000000001", LATCH_MARKERS).is_some_and(|w| w.contains("mutex")));
        assert_eq!(other_recipe(latch, LATCH_MARKERS), None);
        assert!(is_exclusive(&c[0]) && is_exclusive(&c[1]) && !is_exclusive(&c[2]));
        // A reader behind a mutex node waits for it.
        assert_eq!(
            crate::zookeeper::rwlock::ReadPolicy.blocker(&c[..1].iter().chain(&c[2..]).cloned().collect::<Vec<_>>(), 1),
            Some(0)
        );
    }

    #[test]
    fn exclusive_waits_for_predecessor_only() {
        let q: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
        assert_eq!(Exclusive.blocker(&q, 0), None);
        assert_eq!(Exclusive.blocker(&q, 3), Some(2));
        assert!(Exclusive.proceeds_without(&q, 1, 0));
        assert!(!Exclusive.proceeds_without(&q, 2, 1));
    }

    /// The fast paths must agree with the generic rule on every queue shape.
    #[test]
    fn proceeds_without_fast_paths_match_the_generic_rule() {
        struct Generic<'a>(&'a dyn Policy);
        impl Policy for Generic<'_> {
            fn blocker(&self, sorted: &[String], ours: usize) -> Option<usize> {
                self.0.blocker(sorted, ours)
            }
        }
        let read = crate::zookeeper::rwlock::ReadPolicy;
        // Every queue of six nodes, each a reader, a writer or a mutex node.
        for code in 0u32..729 {
            let q: Vec<String> = (0..6)
                .map(|i| match (code / 3u32.pow(i)) % 3 {
                    0 => format!("_c_x-__READ__{i:010}"),
                    1 => format!("_c_x-__WRIT__{i:010}"),
                    _ => format!("_c_x-lock-{i:010}"),
                })
                .collect();
            for ours in 1..q.len() {
                for policy in [&Exclusive as &dyn Policy, &read] {
                    if let Some(b) = policy.blocker(&q, ours) {
                        let fast = policy.proceeds_without(&q, ours, b);
                        let generic = Generic(policy).proceeds_without(&q, ours, b);
                        // The fast path may re-read where the rule would not (a writer that may
                        // downgrade), never the other way round.
                        assert!(!fast || generic, "{q:?} {ours}");
                        if node_kind(&q[b]) != NodeKind::Write {
                            assert_eq!(fast, generic, "{q:?} {ours}");
                        }
                    }
                }
            }
        }
    }
}

//! Who holds a lock and who waits, for every recipe's layout.

use super::queue::{node_kind, sort_children, sort_key, Exclusive, NodeKind, Policy, EVERY_MARKER, LATCH};
use super::rwlock::ReadPolicy;
use super::{backend, url, Client};
use crate::listing::{Entry, Found, Listing, LockInfo, MAX_LOCKS};
use crate::{Owner, Result};
use serde::Serialize;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zookeeper_client as zk;

/// One node in a lock's queue, as [`Client::inspect`] sees it.
///
/// # Examples
///
/// ```
/// use distlock::zookeeper::Contender;
/// let c = Contender { node: "_c_x-lock-0000000001".into(), mode: "lock".into(), holds: true,
///     position: 0, owner: None, raw_data: "10.0.0.7".into(), session: "0x1".into(),
///     age_ms: 1500, czxid: 42 };
/// assert!(c.holds);
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct Contender {
    /// Child name (for a semaphore: `leases/<name>` or `locks/<name>`).
    pub node: String,
    /// `lock` (mutex), `read` / `write` (read/write lock), `lease` / `gate` (semaphore), `naive`.
    pub mode: String,
    /// Whether this node holds (a lock, a read share, or a permit).
    pub holds: bool,
    /// Position in queue order (0 is first).
    pub position: usize,
    /// Owner, when the node was written by distlock.
    pub owner: Option<Owner>,
    /// The node's data as text (lossy), e.g. Curator's IP address.
    pub raw_data: String,
    /// The owning session id (hex).
    pub session: String,
    /// Time since the node was created, in milliseconds (by the server's clock).
    pub age_ms: u64,
    /// Creation zxid (the holder's fencing token).
    pub czxid: i64,
}

/// A lock's queue in order: holders first, then waiters.
///
/// # Examples
///
/// ```
/// let v = distlock::zookeeper::LockView {
///     path: "/locks/a".into(), kind: "free".into(), permits: None, contenders: vec![], others: vec![],
/// };
/// assert!(v.holder().is_none());
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct LockView {
    /// The lock path.
    pub path: String,
    /// `mutex`, `rwlock` (readers or writers, possibly beside mutex nodes, in one queue),
    /// `semaphore`, `naive`, or `free` (no lock nodes).
    pub kind: String,
    /// A semaphore's permit count, as recorded by its distlock holders (Curator records none).
    pub permits: Option<u32>,
    /// Every lock node under it, in queue order.
    pub contenders: Vec<Contender>,
    /// Children that are not lock nodes (the queue ignores them).
    pub others: Vec<String>,
}

impl LockView {
    /// The first holder, if any.
    pub fn holder(&self) -> Option<&Contender> {
        self.contenders.iter().find(|c| c.holds)
    }
}

impl Client {
    /// Reads a lock's queue: holders and waiters in order, with owners, sessions and ages.
    /// Understands the mutex, read/write lock, semaphore and naive-lock layouts. A missing path
    /// shows as free.
    ///
    /// # Notable errors
    /// [`Error::InvalidLockPath`](crate::Error::InvalidLockPath) when the URL's chroot does not
    /// exist (as an acquire would report it).
    pub async fn inspect(&self, path: &str) -> Result<LockView> {
        let dir = url::lock_path(path)?;
        let children = self.children(&dir).await?;
        self.view(dir, children).await
    }

    /// The view of lock directory `dir`, whose children are already listed.
    async fn view(&self, dir: String, children: Vec<String>) -> Result<LockView> {
        let (mut leases, mut gate) = if children.iter().any(|c| c == "leases" || c == "locks") {
            (self.children(&format!("{dir}/leases")).await?, self.children(&format!("{dir}/locks")).await?)
        } else {
            (Vec::new(), Vec::new())
        };
        // A semaphore's directories outlive their users for a while: only leases or gate nodes in
        // them make this a semaphore's path.
        if !leases.is_empty() || !gate.is_empty() {
            sort_children(&mut leases, &["lease-"]);
            sort_children(&mut gate, &["lock-"]);
            let mut contenders = self.read_nodes(&format!("{dir}/leases"), "leases/", &leases, "lease").await?;
            contenders.iter_mut().for_each(|c| c.holds = true);
            let mut waiting = self.read_nodes(&format!("{dir}/locks"), "locks/", &gate, "gate").await?;
            // Every gate node waits for a permit. The first one holds the gate and has created its
            // lease already, waiting until the count of leases drops to the limit: its newest lease
            // is a waiting one, not a held permit.
            if let Some(counting) = waiting.first() {
                if let Some(lease) = contenders.iter_mut().rev().find(|c| c.session == counting.session) {
                    lease.holds = false;
                }
            }
            contenders.sort_by_key(|c| !c.holds);
            contenders.append(&mut waiting);
            for (i, c) in contenders.iter_mut().enumerate() {
                c.position = i;
            }
            let permits = contenders.iter().find_map(|c| c.owner.as_ref().and_then(|o| o.permits));
            return Ok(LockView { path: dir, kind: "semaphore".into(), permits, contenders, others: vec![] });
        }
        let (mut queue, mut others): (Vec<String>, Vec<String>) =
            children.into_iter().partition(|c| node_kind(c) != NodeKind::Other);
        if queue.is_empty() && others == ["lock"] {
            let mut contenders = self.read_nodes(&dir, "", &others, "naive").await?;
            contenders.iter_mut().for_each(|c| c.holds = true);
            let kind = if contenders.is_empty() { "free" } else { "naive" };
            return Ok(LockView { path: dir, kind: kind.into(), permits: None, contenders, others: vec![] });
        }
        others.sort();
        let kind = if queue.is_empty() {
            "free"
        } else if queue.iter().any(|c| matches!(node_kind(c), NodeKind::Read | NodeKind::Write)) {
            "rwlock"
        } else if queue.iter().any(|c| sort_key(c, &[LATCH]).len() == 10) {
            "election"
        } else {
            "mutex"
        };
        sort_children(&mut queue, EVERY_MARKER);
        let mut contenders = self.read_nodes(&dir, "", &queue, "lock").await?;
        let live: Vec<String> = contenders.iter().map(|c| c.node.clone()).collect();
        for (i, c) in contenders.iter_mut().enumerate() {
            c.position = i;
            let node = node_kind(&c.node);
            c.mode = match node {
                NodeKind::Read => "read",
                NodeKind::Write => "write",
                _ => "lock",
            }
            .into();
            c.holds = if node == NodeKind::Read {
                ReadPolicy.blocker(&live, i).is_none()
            } else {
                Exclusive.blocker(&live, i).is_none()
            };
        }
        Ok(LockView { path: dir, kind: kind.into(), permits: None, contenders, others })
    }

    async fn children(&self, dir: &str) -> Result<Vec<String>> {
        match self.zk().list_children(dir).await {
            Ok(c) => Ok(c),
            Err(zk::Error::NoNode) => match self.missing_chroot(dir).await {
                Some(e) => Err(e),
                None => Ok(Vec::new()),
            },
            Err(e) => Err(backend("getChildren", dir, e)),
        }
    }

    /// Reads every node's data and stat, pipelined; skips nodes that left meanwhile.
    async fn read_nodes(&self, dir: &str, label: &str, names: &[String], mode: &str) -> Result<Vec<Contender>> {
        let zk = self.zk();
        let paths: Vec<String> = names.iter().map(|c| format!("{dir}/{c}")).collect();
        let reads: Vec<_> = paths.iter().map(|p| zk.get_data(p)).collect();
        let results = futures::future::join_all(reads).await;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as i64;
        let mut out = Vec::new();
        for (name, result) in names.iter().zip(results) {
            let (data, stat) = match result {
                Ok(r) => r,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(backend("getData", &format!("{dir}/{name}"), e)),
            };
            out.push(Contender {
                node: format!("{label}{name}"),
                mode: mode.into(),
                holds: false,
                position: out.len(),
                owner: Owner::parse(&data),
                raw_data: String::from_utf8_lossy(&data).into_owned(),
                session: format!("{:#x}", stat.ephemeral_owner),
                age_ms: (now_ms - stat.ctime).max(0) as u64,
                czxid: stat.czxid,
            });
        }
        Ok(out)
    }
}

/// Most znodes one listing visits.
const MAX_VISITED: usize = 20_000;

impl Client {
    /// Every lock in use under `prefix` (a bare name prefix means under `/distlock/`, a path
    /// starting with `/` is taken as is), each read as [`Client::inspect`] reads one; the
    /// neutral form of [`crate::Client::locks`].
    pub async fn locks(&self, prefix: &str) -> Result<Listing> {
        let full = if prefix.starts_with('/') { prefix.to_string() } else { format!("/distlock/{prefix}") };
        let start = match full.rfind('/') {
            Some(0) | None => "/".to_string(),
            Some(i) => full[..i].to_string(),
        };
        let mut listing = Listing {
            backend: "zookeeper",
            prefix: full.clone(), // the path listed: a bare prefix is under /distlock/
            locks: vec![],
            truncated: false,
            unseen: vec![],
        };
        let mut dirs = vec![start];
        let mut visited = 0usize;
        while let Some(dir) = dirs.pop() {
            let children = self.children(&dir).await?;
            visited += children.len() + 1;
            // A lock's directory: one with queue nodes, a semaphore's `leases`/`locks`, or the
            // naive lock's `lock` (the root is never one).
            let may_be_lock = dir != "/"
                && dir.starts_with(&full)
                && children.iter().any(|c| is_queue_node(c) || c == "leases" || c == "locks" || c == "lock");
            let mut semaphore = false;
            if may_be_lock {
                let view = self.view(dir.clone(), children.clone()).await?;
                semaphore = view.kind == "semaphore";
                if !view.contenders.is_empty() {
                    if listing.locks.len() == MAX_LOCKS {
                        listing.truncated = true;
                        break;
                    }
                    listing.locks.push(lock_info(view));
                }
            }
            // Everything else may hold locks further down (queue nodes are ephemeral: no children;
            // a semaphore's own directories were read with it).
            for c in children.iter().rev() {
                let path = if dir == "/" { format!("/{c}") } else { format!("{dir}/{c}") };
                let own = semaphore && (c == "leases" || c == "locks");
                let may_match = path.starts_with(&full) || full.starts_with(&format!("{path}/"));
                if !is_queue_node(c) && !own && may_match && path != "/zookeeper" {
                    dirs.push(path);
                }
            }
            if visited > MAX_VISITED {
                listing.truncated = true;
                break;
            }
        }
        listing.locks.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listing)
    }
}

impl Client {
    /// The lock at `path` as [`Client::locks`] shows each: [`Client::inspect`] in the neutral
    /// shape (for [`crate::Client::inspect`]).
    pub(crate) async fn one_lock(&self, path: &str) -> Result<Listing> {
        let view = self.inspect(path).await?;
        let found = match view.contenders.is_empty() {
            true => Found::Free { recipe: "mutex", last_token: None },
            false => Found::Lock(lock_info(view)),
        };
        Ok(Listing::one("zookeeper", path, found, vec![]))
    }
}

/// A sequential queue node (`…lock-0000000042`, `…__READ__0000000007`): a queue marker followed
/// by the ten digits ZooKeeper appends, not a name that merely contains a marker.
fn is_queue_node(name: &str) -> bool {
    let digits = name.len() >= 10 && name.as_bytes()[name.len() - 10..].iter().all(u8::is_ascii_digit);
    digits && node_kind(name) != NodeKind::Other && sort_key(name, EVERY_MARKER).len() == 10
}

fn lock_info(view: LockView) -> LockInfo {
    let entries = view
        .contenders
        .into_iter()
        .map(|c| {
            let owner = match (&c.owner, c.raw_data.is_empty()) {
                (Some(o), _) => o.to_string(),
                (None, true) => "-".to_string(),
                (None, false) => c.raw_data.chars().take(40).collect(),
            };
            let mode = match c.mode.as_str() {
                "read" => "read",
                "write" => "write",
                "lease" | "gate" => "permit",
                _ => "exclusive",
            };
            let mut e = Entry::new(c.holds, mode, owner, c.node);
            e.since_ms = Some(c.age_ms);
            // The zxid that created a holder's node is its fencing token.
            e.token = c.holds.then_some(c.czxid as u64);
            e
        })
        .collect::<Vec<_>>();
    let last_token = entries.iter().filter_map(|e| e.token).max();
    LockInfo { name: view.path, recipe: view.kind, permits: view.permits, last_token, entries }
}

#[cfg(test)]
mod tests {
    #[test]
    fn queue_nodes_are_a_marker_and_ten_digits() {
        use super::is_queue_node;
        assert!(is_queue_node("_c_0f3e-lock-0000000042"));
        assert!(is_queue_node("_c_0f3e-__READ__0000000007"));
        assert!(is_queue_node("lock-0000000001"));
        assert!(is_queue_node("_c_0f3e-latch-0000000002"));
        assert!(!is_queue_node("clock-sync"));
        assert!(!is_queue_node("db-lock-1"));
        assert!(!is_queue_node("locks"));
        assert!(!is_queue_node("lock-0000000001-old"));
    }
}

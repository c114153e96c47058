//! Who holds a lock and who waits.

use super::queue::{sort_children, Exclusive, Policy};
use super::rwlock::{is_writer, ReadPolicy, READ};
use super::{backend, url, Client};
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
/// let c = Contender { node: "_c_x-lock-0000000001".into(), holds: true, position: 0,
///     owner: None, raw_data: "10.0.0.7".into(), session: "0x1".into(),
///     age_ms: 1500, czxid: 42 };
/// assert!(c.holds);
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct Contender {
    /// Child name.
    pub node: String,
    /// Whether this node holds the lock.
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

/// A lock's queue in order: holder first, then waiters.
///
/// # Examples
///
/// ```
/// let v = distlock::zookeeper::LockView { path: "/locks/a".into(), contenders: vec![] };
/// assert!(v.holder().is_none());
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct LockView {
    /// The lock path.
    pub path: String,
    /// Every node under it, in queue order.
    pub contenders: Vec<Contender>,
}

impl LockView {
    /// The holder, if any.
    pub fn holder(&self) -> Option<&Contender> {
        self.contenders.iter().find(|c| c.holds)
    }
}

impl Client {
    /// Reads a lock's queue: holder and waiters in order, with owners, sessions and ages.
    /// A missing lock path shows as an empty queue.
    pub async fn inspect(&self, path: &str) -> Result<LockView> {
        let dir = url::lock_path(path)?;
        let zk = self.zk();
        let mut children = match zk.list_children(&dir).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(backend("getChildren", &dir, e)),
        };
        sort_children(&mut children, &["lock-", "__READ__", "__WRIT__", "lease-"]);
        // Pipelined: every getData is sent before the first reply is awaited.
        let paths: Vec<String> = children.iter().map(|c| format!("{dir}/{c}")).collect();
        let reads: Vec<_> = paths.iter().map(|p| zk.get_data(p)).collect();
        let results = futures::future::join_all(reads).await;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as i64;
        let mut contenders = Vec::new();
        let mut live: Vec<String> = Vec::new();
        for (name, result) in children.iter().zip(results) {
            let (data, stat) = match result {
                Ok(r) => r,
                Err(zk::Error::NoNode) => continue, // left while we looked
                Err(e) => return Err(backend("getData", &format!("{dir}/{name}"), e)),
            };
            live.push(name.clone());
            contenders.push(Contender {
                node: name.clone(),
                holds: false,
                position: contenders.len(),
                owner: Owner::parse(&data),
                raw_data: String::from_utf8_lossy(&data).into_owned(),
                session: format!("{:#x}", stat.ephemeral_owner),
                age_ms: (now_ms - stat.ctime).max(0) as u64,
                czxid: stat.czxid,
            });
        }
        for (i, c) in contenders.iter_mut().enumerate() {
            // Read nodes of a read/write lock share; everything else is exclusive.
            let shared = c.node.contains(READ) && !is_writer(&c.node);
            c.holds =
                if shared { ReadPolicy.blocker(&live, i).is_none() } else { Exclusive.blocker(&live, i).is_none() };
        }
        Ok(LockView { path: dir, contenders })
    }
}

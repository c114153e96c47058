//! Per-session limits on the nodes a session has made and the bytes of data they hold.
//!
//! A session is charged for every node it creates while the node exists (persistent ones too,
//! after the session ends) and for the data that node holds now. The charges are counted from the
//! server's start: nodes recovered from a data directory belong to no one.

use super::{OpResult, State};
use crate::proto::err;
use crate::tree::{data_len, Data, Mutation, Tree, CONTAINER_OWNER, TTL_MASK};
use std::collections::{HashMap, HashSet};

#[derive(Default)]
pub(super) struct Quotas {
    /// Who made each node still standing, and its data's length now.
    made_by: HashMap<String, (i64, usize)>,
    /// Per session: nodes standing, bytes of data in them.
    usage: HashMap<i64, (usize, usize)>,
    /// Each session's ephemeral nodes, so that ending a session costs its own nodes, not a scan
    /// of the whole tree (100,000 expiring sessions beside 60,000 nodes stalled the server).
    ephemerals: HashMap<i64, HashSet<String>>,
    /// The owner of each ephemeral node.
    owners: HashMap<String, i64>,
}

impl Quotas {
    /// The ephemeral nodes of a tree loaded at start (their sessions may be recovered too).
    pub(super) fn with_ephemerals_of(tree: &Tree) -> Quotas {
        let mut q = Quotas::default();
        for (path, node) in &tree.nodes {
            if let Some(sid) = node.ephemeral_session() {
                q.ephemerals.entry(sid).or_default().insert(path.clone());
                q.owners.insert(path.clone(), sid);
            }
        }
        q
    }

    /// The ephemeral nodes session `sid` owns.
    pub(super) fn ephemerals_of(&self, sid: i64) -> Vec<String> {
        self.ephemerals.get(&sid).map_or_else(Vec::new, |set| set.iter().cloned().collect())
    }

    /// Charges the changes of a committed transaction; `by` made it (0: the server itself).
    pub(super) fn account(&mut self, by: i64, muts: &[Mutation]) {
        for m in muts {
            match m {
                Mutation::Create { path, stat, .. } => {
                    let o = stat.ephemeral_owner;
                    if o != 0 && o != CONTAINER_OWNER && (o & TTL_MASK) != TTL_MASK {
                        self.ephemerals.entry(o).or_default().insert(path.clone());
                        self.owners.insert(path.clone(), o);
                    }
                }
                Mutation::Delete { path, .. } => {
                    if let Some(owner) = self.owners.remove(path) {
                        if let Some(set) = self.ephemerals.get_mut(&owner) {
                            set.remove(path);
                            if set.is_empty() {
                                self.ephemerals.remove(&owner);
                            }
                        }
                    }
                }
                _ => {}
            }
            match m {
                Mutation::Create { path, data, .. } if by != 0 => {
                    let len = data_len(data) as usize;
                    self.made_by.insert(path.clone(), (by, len));
                    let u = self.usage.entry(by).or_default();
                    u.0 += 1;
                    u.1 += len;
                }
                Mutation::Delete { path, .. } => {
                    if let Some((maker, len)) = self.made_by.remove(path) {
                        if let Some(u) = self.usage.get_mut(&maker) {
                            u.0 = u.0.saturating_sub(1);
                            u.1 = u.1.saturating_sub(len);
                            if u.0 == 0 {
                                self.usage.remove(&maker);
                            }
                        }
                    }
                }
                Mutation::SetData { path, data, .. } => {
                    if let Some((maker, len)) = self.made_by.get_mut(path) {
                        let new = data_len(data) as usize;
                        if let Some(u) = self.usage.get_mut(maker) {
                            u.1 = u.1.saturating_sub(*len) + new;
                        }
                        *len = new;
                    }
                }
                _ => {}
            }
        }
    }
}

impl State {
    /// Refuses (ZooKeeper's QuotaExceeded) a create by `sid` of a node holding `data`, counting
    /// the creates earlier in the same request (`pending`) too.
    pub(super) fn quota_for_create(&self, sid: i64, data: &Data, pending: &[Mutation]) -> OpResult<()> {
        let (mut nodes, mut bytes) = self.quotas.usage.get(&sid).copied().unwrap_or_default();
        for m in pending {
            if let Mutation::Create { data, .. } = m {
                nodes += 1;
                bytes += data_len(data) as usize;
            }
        }
        if nodes + 1 > self.config.max_nodes_per_session
            || bytes + data_len(data) as usize > self.config.max_data_per_session
        {
            tracing::warn!(
                session = format_args!("{sid:#x}"),
                nodes,
                bytes,
                "create refused: the session's quota is used up"
            );
            return Err(err::QUOTA_EXCEEDED);
        }
        Ok(())
    }

    /// Refuses (QuotaExceeded) new data for `path` that would take its maker past its data quota.
    pub(super) fn quota_for_set(&self, path: &str, data: &Data) -> OpResult<()> {
        let Some((maker, len)) = self.quotas.made_by.get(path) else { return Ok(()) };
        let Some((_, bytes)) = self.quotas.usage.get(maker) else { return Ok(()) };
        if bytes.saturating_sub(*len) + data_len(data) as usize > self.config.max_data_per_session {
            return Err(err::QUOTA_EXCEEDED);
        }
        Ok(())
    }
}

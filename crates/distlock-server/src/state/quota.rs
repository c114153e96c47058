//! Limits on nodes and the bytes of data they hold: per session, and for the whole server.
//!
//! A session is charged for every node it creates while the node exists (persistent ones too,
//! after the session ends) and for the data that node holds now. The charges are counted from the
//! server's start: nodes recovered from a data directory belong to no one (maker 0), but count
//! towards the server's totals like every other node.

use super::{OpResult, State};
use crate::proto::err;
use crate::tree::{data_len, Data, Mutation, Tree, CONTAINER_OWNER, TTL_MASK};
use std::collections::{HashMap, HashSet};

#[derive(Default)]
pub(super) struct Quotas {
    /// Who made each node still standing (0: no session), and its data's length now.
    made_by: HashMap<String, (i64, usize)>,
    /// Per session: nodes standing, bytes of data in them.
    usage: HashMap<i64, (usize, usize)>,
    /// Bytes of data in every node.
    data_total: usize,
    /// Each session's ephemeral nodes, so that ending a session costs its own nodes, not a scan
    /// of the whole tree (100,000 expiring sessions beside 60,000 nodes stalled the server).
    ephemerals: HashMap<i64, HashSet<String>>,
    /// The owner of each ephemeral node.
    owners: HashMap<String, i64>,
}

impl Quotas {
    /// The accounts of a tree loaded at start: its nodes are no session's, and its ephemeral
    /// nodes are their sessions' (which may be recovered too).
    pub(super) fn of_tree(tree: &Tree) -> Quotas {
        let mut q = Quotas::default();
        for (path, node) in &tree.nodes {
            let len = data_len(&node.data) as usize;
            q.made_by.insert(path.clone(), (0, len));
            q.data_total += len;
            if let Some(sid) = node.ephemeral_session() {
                q.ephemerals.entry(sid).or_default().insert(path.clone());
                q.owners.insert(path.clone(), sid);
            }
        }
        q
    }

    /// Bytes of data in every node of the tree.
    pub(super) fn data_total(&self) -> usize {
        self.data_total
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
                Mutation::Create { path, data, .. } => {
                    let len = data_len(data) as usize;
                    self.data_total += len;
                    self.made_by.insert(path.clone(), (by, len));
                    if by != 0 {
                        let u = self.usage.entry(by).or_default();
                        u.0 += 1;
                        u.1 += len;
                    }
                }
                Mutation::Delete { path, .. } => {
                    if let Some((maker, len)) = self.made_by.remove(path) {
                        self.data_total = self.data_total.saturating_sub(len);
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
                        self.data_total = self.data_total.saturating_sub(*len) + new;
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
    /// the creates earlier in the same request (`pending`) too: past the session's own quotas, or
    /// past the server's totals of nodes (`max_nodes`) and data (`max_data`).
    pub(super) fn quota_for_create(&self, sid: i64, data: &Data, pending: &[Mutation]) -> OpResult<()> {
        let (mut nodes, mut bytes) = self.quotas.usage.get(&sid).copied().unwrap_or_default();
        let mut pending_bytes = 0;
        for m in pending {
            if let Mutation::Create { data, .. } = m {
                nodes += 1;
                pending_bytes += data_len(data) as usize;
            }
        }
        bytes += pending_bytes;
        let len = data_len(data) as usize;
        // The tree holds the earlier creates of a multi already.
        let (all_nodes, all_bytes) = (self.tree.nodes.len(), self.quotas.data_total + pending_bytes);
        let c = &self.config;
        let why = if nodes + 1 > c.max_nodes_per_session || bytes + len > c.max_data_per_session {
            "create refused (QuotaExceeded): the session's quota is used up"
        } else if all_nodes + 1 > c.max_nodes || all_bytes + len > c.max_data {
            "create refused (QuotaExceeded): the server's total of nodes or data is reached"
        } else {
            return Ok(());
        };
        self.quota_warning.warn(|held_back| {
            tracing::warn!(
                session = format_args!("{sid:#x}"),
                nodes,
                bytes,
                server_nodes = all_nodes,
                server_bytes = all_bytes,
                held_back,
                "{why}"
            )
        });
        Err(err::QUOTA_EXCEEDED)
    }

    /// Refuses (QuotaExceeded) new data for `path` that would take its maker past its data quota,
    /// or the server past its total of data.
    pub(super) fn quota_for_set(&self, path: &str, data: &Data) -> OpResult<()> {
        let Some(&(maker, len)) = self.quotas.made_by.get(path) else { return Ok(()) };
        let new = data_len(data) as usize;
        let maker_bytes = if maker == 0 { None } else { self.quotas.usage.get(&maker).map(|u| u.1) };
        let why = if maker_bytes.is_some_and(|b| b.saturating_sub(len) + new > self.config.max_data_per_session) {
            "set refused (QuotaExceeded): the data quota of the node's maker is used up"
        } else if new > len && self.quotas.data_total.saturating_sub(len) + new > self.config.max_data {
            "set refused (QuotaExceeded): the server's total of data is reached"
        } else {
            return Ok(());
        };
        self.quota_warning.warn(|held_back| {
            tracing::warn!(
                path,
                maker = format_args!("{maker:#x}"),
                server_bytes = self.quotas.data_total,
                held_back,
                "{why}"
            )
        });
        Err(err::QUOTA_EXCEEDED)
    }
}

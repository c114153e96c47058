//! Write operations (create, delete, set data, set ACL, check) and multi: decoding, applying, replies.

use super::{header, multi_ops, now_ms, OpResult, Reply, State};
use crate::proto::{err, event, op, perms, Acl, DResult, DecodeError, Reader, Stat, Writer};
use crate::tree::{data_len, parent_of, valid_path, Data, Mutation, Node, Tree, CONTAINER_OWNER, TTL_MASK};

/// A node without its children: what a multi saves to undo an op.
type NodeFields = (Data, std::sync::Arc<Vec<Acl>>, Stat);

impl State {
    /// Validates and applies one write (on the live tree; multi undoes on failure).
    pub(super) fn write_op(
        &mut self,
        sid: i64,
        req: &WriteOp,
        zxid: i64,
        time: i64,
        muts: &mut Vec<Mutation>,
        events: &mut Vec<(String, i32)>,
    ) -> OpResult<WriteResult> {
        match req {
            WriteOp::Create { opcode, path, data, acl, flags, ttl } => {
                // ZooKeeper's order: the mode (the flags decide it; the opcode only what the
                // reply carries, and only outside a multi), the TTL, a path with a parent, the
                // ACL, the parent, the permission, then the whole path, existence and an
                // ephemeral parent.
                if !(0..=6).contains(flags) {
                    return Err(err::BAD_ARGUMENTS);
                }
                let sequential = matches!(flags, 2 | 3 | 6);
                let ttl_mode = matches!(flags, 5 | 6);
                let ttl_ok =
                    if ttl_mode { (1..=0x00FF_FFFF_FFFF).contains(ttl) } else { *ttl < 0 || *opcode != op::CREATE_TTL };
                if !ttl_ok {
                    return Err(err::BAD_ARGUMENTS);
                }
                if !path.contains('/') || path.contains('\0') {
                    return Err(err::BAD_ARGUMENTS);
                }
                let acl = self.fix_acl(sid, acl.clone())?;
                let parent_path = if path == "/" { "/".to_string() } else { parent_of(path).to_string() };
                let parent = self.node(&parent_path)?;
                if !self.allowed(sid, &parent.acl, perms::CREATE) {
                    return Err(err::NO_AUTH);
                }
                if path == "/" {
                    return Err(err::NODE_EXISTS);
                }
                let actual = if sequential { format!("{path}{:010}", parent.stat.cversion) } else { path.clone() };
                if !valid_path(&actual, false) {
                    return Err(err::BAD_ARGUMENTS);
                }
                if self.tree.get(&actual).is_some() {
                    return Err(err::NODE_EXISTS);
                }
                if parent.ephemeral_session().is_some() {
                    return Err(err::NO_CHILDREN_FOR_EPHEMERALS);
                }
                self.quota_for_create(sid, data, muts)?;
                let owner = match flags {
                    1 | 3 => sid,
                    4 => CONTAINER_OWNER,
                    5 | 6 => TTL_MASK | ttl,
                    _ => 0,
                };
                let stat = Stat {
                    czxid: zxid,
                    mzxid: zxid,
                    pzxid: zxid,
                    ctime: time,
                    mtime: time,
                    ephemeral_owner: owner,
                    data_length: data_len(data),
                    ..Stat::default()
                };
                let m = Mutation::Create { path: actual.clone(), data: data.clone(), acl, stat };
                self.tree.apply(&m);
                muts.push(m);
                events.push((actual.clone(), event::NODE_CREATED));
                events.push((parent_path, event::NODE_CHILDREN_CHANGED));
                Ok(WriteResult::Create { opcode: *opcode, flags: *flags, path: actual, stat })
            }
            WriteOp::Delete { path, version } => {
                // ZooKeeper's order: a path with a parent that is not one of the server's own
                // nodes, the parent and its DELETE permission, then the node. (No other check of
                // the path: a malformed one is not there.)
                if !path.contains('/') || path.contains('\0') || crate::tree::is_system_path(path) {
                    return Err(err::BAD_ARGUMENTS);
                }
                let parent_path = parent_of(path).to_string();
                if !self.allowed(sid, &self.node(&parent_path)?.acl, perms::DELETE) {
                    return Err(err::NO_AUTH);
                }
                let n = self.node(path)?;
                if *version != -1 && *version != n.stat.version {
                    return Err(err::BAD_VERSION);
                }
                if !n.children.is_empty() {
                    return Err(err::NOT_EMPTY);
                }
                let m = Mutation::Delete { path: path.clone(), zxid };
                self.tree.apply(&m);
                muts.push(m);
                events.push((path.clone(), event::NODE_DELETED));
                events.push((parent_path, event::NODE_CHILDREN_CHANGED));
                Ok(WriteResult::Delete)
            }
            WriteOp::SetData { path, data, version } => {
                Self::check_path(path)?;
                let n = self.node(path)?;
                if !self.allowed(sid, &n.acl, perms::WRITE) {
                    return Err(err::NO_AUTH);
                }
                if *version != -1 && *version != n.stat.version {
                    return Err(err::BAD_VERSION);
                }
                self.quota_for_set(path, data)?;
                let m = Mutation::SetData { path: path.clone(), data: data.clone(), zxid, time };
                self.tree.apply(&m);
                muts.push(m);
                events.push((path.clone(), event::NODE_DATA_CHANGED));
                Ok(WriteResult::SetData(self.node(path)?.stat))
            }
            WriteOp::SetAcl { path, acl, version } => {
                Self::check_path(path)?;
                let n = self.node(path)?;
                if !self.allowed(sid, &n.acl, perms::ADMIN) {
                    return Err(err::NO_AUTH);
                }
                let aversion = n.stat.aversion;
                let acl = self.fix_acl(sid, acl.clone())?;
                if *version != -1 && *version != aversion {
                    return Err(err::BAD_VERSION);
                }
                let m = Mutation::SetAcl { path: path.clone(), acl };
                self.tree.apply(&m);
                muts.push(m);
                Ok(WriteResult::SetData(self.node(path)?.stat))
            }
            WriteOp::Check { path, version } => {
                Self::check_path(path)?;
                let n = self.node(path)?;
                if !self.allowed(sid, &n.acl, perms::READ) {
                    return Err(err::NO_AUTH);
                }
                if *version != -1 && *version != n.stat.version {
                    return Err(err::BAD_VERSION);
                }
                Ok(WriteResult::Check)
            }
        }
    }

    pub(super) fn multi(&mut self, sid: i64, xid: i32, r: &mut Reader) -> DResult<Reply> {
        let ops = multi_ops(r, WriteOp::decode)?;
        let time = now_ms();
        let zxid = self.zxid + 1;
        let mut muts = Vec::new();
        let mut events = Vec::new();
        let mut results = Vec::new();
        let mut failure = None;
        // What each op may change, saved before it runs: a node's own fields, never its children
        // (a parent with thousands of children used to be copied once per op). Children sets are
        // put back by undoing the creates and deletes of the children themselves.
        let mut undo: Vec<(String, Option<NodeFields>)> = Vec::new();
        for (i, o) in ops.iter().enumerate() {
            for p in o.touches(&self.tree) {
                let saved = self.tree.get(&p).map(|n| (n.data.clone(), n.acl.clone(), n.stat));
                undo.push((p, saved));
            }
            match self.write_op(sid, o, zxid, time, &mut muts, &mut events) {
                Ok(res) => results.push(res),
                Err(code) => {
                    failure = Some((i, code));
                    break;
                }
            }
        }
        let mut w = Writer::framed();
        match failure {
            None if ops.is_empty() => {
                header(&mut w, xid, self.zxid, 0);
                w.i32(-1).bool(true).i32(-1);
            }
            None => {
                self.zxid = zxid;
                self.commit(sid, muts, time);
                self.deliver(events);
                header(&mut w, xid, zxid, 0);
                for res in results {
                    res.encode_in_multi(&mut w);
                }
                w.i32(-1).bool(true).i32(-1);
            }
            Some((failed, code)) => {
                // Undo in reverse order, so the oldest saved state of each node wins.
                for (path, saved) in undo.into_iter().rev() {
                    let name = crate::tree::name_of(&path).to_string();
                    let parent = parent_of(&path).to_string();
                    match saved {
                        Some((data, acl, stat)) => match self.tree.nodes.get_mut(&path) {
                            Some(n) => (n.data, n.acl, n.stat) = (data, acl, stat),
                            None => {
                                // Deleted by the multi (so it had no children): put it back.
                                let node = Node { data, acl, stat, children: Default::default() };
                                self.tree.nodes.insert(path, node);
                                if let Some(p) = self.tree.nodes.get_mut(&parent) {
                                    p.children.insert(name);
                                }
                            }
                        },
                        None => {
                            if self.tree.nodes.remove(&path).is_some() {
                                if let Some(p) = self.tree.nodes.get_mut(&parent) {
                                    p.children.remove(&name);
                                }
                            }
                        }
                    }
                }
                header(&mut w, xid, self.zxid, 0);
                for i in 0..ops.len() {
                    let e = match i.cmp(&failed) {
                        std::cmp::Ordering::Less => 0,
                        std::cmp::Ordering::Equal => code,
                        std::cmp::Ordering::Greater => err::RUNTIME_INCONSISTENCY,
                    };
                    w.i32(op::ERROR).bool(false).i32(e).i32(e);
                }
                w.i32(-1).bool(true).i32(-1);
            }
        }
        Ok(Reply { frame: Some(w.frame()), close: false })
    }
}

/// A decoded write operation (also the members of a multi).
#[derive(Debug)]
pub(super) enum WriteOp {
    Create { opcode: i32, path: String, data: Data, acl: Vec<Acl>, flags: i32, ttl: i64 },
    Delete { path: String, version: i32 },
    SetData { path: String, data: Data, version: i32 },
    SetAcl { path: String, acl: Vec<Acl>, version: i32 },
    Check { path: String, version: i32 },
}

impl WriteOp {
    pub(super) fn decode(opcode: i32, r: &mut Reader) -> DResult<WriteOp> {
        Ok(match opcode {
            op::CREATE | op::CREATE2 | op::CREATE_CONTAINER | op::CREATE_TTL => {
                let path = r.string("path")?;
                let data = r.data("data")?;
                let acl = r.acls()?;
                let flags = r.i32("flags")?;
                let ttl = if opcode == op::CREATE_TTL { r.i64("ttl")? } else { 0 };
                WriteOp::Create { opcode, path, data, acl, flags, ttl }
            }
            op::DELETE => WriteOp::Delete { path: r.string("path")?, version: r.i32("version")? },
            op::SET_DATA => {
                WriteOp::SetData { path: r.string("path")?, data: r.data("data")?, version: r.i32("version")? }
            }
            op::SET_ACL => WriteOp::SetAcl { path: r.string("path")?, acl: r.acls()?, version: r.i32("version")? },
            op::CHECK => WriteOp::Check { path: r.string("path")?, version: r.i32("version")? },
            other => return Err(DecodeError::UnknownOpcode(other)),
        })
    }

    /// Paths whose state this op may change (saved for a multi's undo).
    fn touches(&self, tree: &Tree) -> Vec<String> {
        match self {
            WriteOp::Create { path, flags, .. } => {
                let parent = parent_of(path).to_string();
                let mut v = vec![parent.clone()];
                let actual = if matches!(flags, 2 | 3 | 6) {
                    tree.get(&parent).map(|p| format!("{path}{:010}", p.stat.cversion)).unwrap_or_else(|| path.clone())
                } else {
                    path.clone()
                };
                v.push(actual);
                v
            }
            WriteOp::Delete { path, .. } => vec![path.clone(), parent_of(path).to_string()],
            WriteOp::SetData { path, .. } | WriteOp::SetAcl { path, .. } => vec![path.clone()],
            WriteOp::Check { .. } => vec![],
        }
    }
}

pub(super) enum WriteResult {
    /// `opcode` as sent and the mode's `flags`: a request on its own is answered by the one, an
    /// op inside a multi by the other.
    Create {
        opcode: i32,
        flags: i32,
        path: String,
        stat: Stat,
    },
    Delete,
    SetData(Stat),
    Check,
}

impl WriteResult {
    /// The reply body of a request on its own: a create answers with the stat unless it was sent
    /// as a plain create (opcode 1), whatever its mode.
    pub(super) fn encode(&self, w: &mut Writer) {
        match self {
            WriteResult::Create { opcode, path, stat, .. } => {
                w.string(path);
                if *opcode != op::CREATE {
                    w.stat(stat);
                }
            }
            WriteResult::SetData(stat) => {
                w.stat(stat);
            }
            WriteResult::Delete | WriteResult::Check => {}
        }
    }

    /// The result type inside a multi reply. A create's is chosen by its mode, not by the opcode
    /// it was sent with, as ZooKeeper 3.8.0 and 3.8.1 do: their `MultiOperationRecord` rebuilds
    /// each create op from its flags alone (`Op.create(path, data, acl, flags)`, or the TTL form
    /// for createTTL), and `Op.Create` takes the opcode createTTL for a TTL mode, createContainer
    /// for the container mode and create for every other. `FinalRequestProcessor` then answers
    /// create with the path alone and createContainer or createTTL with the path and the stat, as
    /// a create2 result (the Java client disconnects on "Invalid type 19 in MultiResponse").
    /// (From 3.8.2 on, ZOOKEEPER-4026, a non-container, non-TTL create keeps the opcode it was
    /// sent with, so create2 there answers with the stat; Debian's 3.8.0, the ZooKeeper the
    /// differential test runs against, does as here.)
    fn multi_type(&self) -> i32 {
        match self {
            // 4 container, 5 persistent with TTL, 6 persistent sequential with TTL.
            WriteResult::Create { flags: 4..=6, .. } => op::CREATE2,
            WriteResult::Create { .. } => op::CREATE,
            WriteResult::Delete => op::DELETE,
            WriteResult::SetData(_) => op::SET_DATA,
            WriteResult::Check => op::CHECK,
        }
    }

    /// The result's header and body inside a multi reply.
    fn encode_in_multi(&self, w: &mut Writer) {
        let typ = self.multi_type();
        w.i32(typ).bool(false).i32(0);
        match self {
            WriteResult::Create { path, stat, .. } => {
                w.string(path);
                if typ == op::CREATE2 {
                    w.stat(stat);
                }
            }
            other => other.encode(w),
        }
    }
}

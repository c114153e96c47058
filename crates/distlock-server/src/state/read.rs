//! Read operations: exists, get data, get children, get ACL, watch checks, multiRead and the like.

use super::watches::{CHILD, DATA, PERSISTENT, RECURSIVE};
use super::{header, multi_ops, OpResult, Reply, State};
use crate::proto::{err, op, perms, Acl, DResult, DecodeError, Reader, Writer};

impl State {
    /// Read-only operations. The outer `DResult` fails on malformed frames, the inner on
    /// ZooKeeper errors.
    pub(super) fn read_op(&mut self, sid: i64, opcode: i32, r: &mut Reader) -> DResult<OpResult<Writer>> {
        let mut w = Writer::new();
        let result: OpResult<()> = match opcode {
            op::EXISTS => {
                let path = r.string("path")?;
                let watch = r.bool("watch")?;
                r.finish()?;
                (|| {
                    if watch && !self.watch_limit_ok(sid, &path) {
                        return Err(err::THROTTLED);
                    }
                    if watch {
                        self.watches.add(DATA, &path, sid);
                    }
                    let n = self.node(&path)?;
                    w.stat(&n.stat);
                    Ok(())
                })()
            }
            op::GET_DATA => {
                let path = r.string("path")?;
                let watch = r.bool("watch")?;
                r.finish()?;
                self.get_data(sid, &path, watch, &mut w)
            }
            op::GET_CHILDREN | op::GET_CHILDREN2 => {
                let path = r.string("path")?;
                let watch = r.bool("watch")?;
                r.finish()?;
                self.get_children(sid, &path, watch, opcode == op::GET_CHILDREN2, &mut w)
            }
            op::GET_ACL => {
                let path = r.string("path")?;
                r.finish()?;
                (|| {
                    let n = self.node(&path)?;
                    if !self.allowed(sid, &n.acl, perms::READ | perms::ADMIN) {
                        return Err(err::NO_AUTH);
                    }
                    if self.allowed(sid, &n.acl, perms::ADMIN) {
                        w.acls(&n.acl);
                    } else {
                        // Without ADMIN, digest ids are shown without their password hash, as
                        // ZooKeeper does: `user:x`.
                        let shown: Vec<Acl> = n
                            .acl
                            .iter()
                            .map(|a| match (a.scheme.as_str(), a.id.split_once(':')) {
                                ("digest", Some((user, _))) => Acl { id: format!("{user}:x"), ..a.clone() },
                                _ => a.clone(),
                            })
                            .collect();
                        w.acls(&shown);
                    }
                    w.stat(&n.stat);
                    Ok(())
                })()
            }
            op::SYNC => {
                let path = r.string("path")?;
                r.finish()?;
                w.string(&path);
                Ok(())
            }
            op::GET_EPHEMERALS => {
                let prefix = r.string("prefix")?;
                r.finish()?;
                let mut paths: Vec<&String> = self
                    .tree
                    .nodes
                    .iter()
                    .filter(|(p, n)| n.ephemeral_session() == Some(sid) && p.starts_with(&prefix))
                    .map(|(p, _)| p)
                    .collect();
                paths.sort();
                w.strings(&paths);
                Ok(())
            }
            op::GET_ALL_CHILDREN_NUMBER => {
                let path = r.string("path")?;
                r.finish()?;
                (|| {
                    Self::check_path(&path)?;
                    let n = self.node(&path)?;
                    if !self.allowed(sid, &n.acl, perms::READ) {
                        return Err(err::NO_AUTH);
                    }
                    w.i32(self.tree.descendants(&path) as i32);
                    Ok(())
                })()
            }
            op::ADD_WATCH => {
                let path = r.string("path")?;
                let mode = r.i32("mode")?;
                r.finish()?;
                (|| {
                    Self::check_path(&path)?;
                    if !self.watch_limit_ok(sid, &path) {
                        return Err(err::THROTTLED);
                    }
                    match mode {
                        0 => self.watches.add(PERSISTENT, &path, sid),
                        1 => self.watches.add(RECURSIVE, &path, sid),
                        _ => return Err(err::BAD_ARGUMENTS),
                    }
                    Ok(())
                })()
            }
            op::REMOVE_WATCHES | op::CHECK_WATCHES => {
                let path = r.string("path")?;
                let typ = r.i32("watcher type")?;
                r.finish()?;
                let remove = opcode == op::REMOVE_WATCHES;
                let kinds: &[usize] = match typ {
                    1 => &[CHILD],
                    2 => &[DATA],
                    3 => &[CHILD, DATA, PERSISTENT, RECURSIVE],
                    4 => &[PERSISTENT],
                    5 => &[RECURSIVE],
                    // ZooKeeper fails to decode an unknown type.
                    _ => return Ok(Err(err::MARSHALLING_ERROR)),
                };
                let mut found = false;
                for &kind in kinds {
                    if self.watches.contains(kind, &path, sid) {
                        found = true;
                        if remove {
                            self.watches.remove(kind, &path, sid);
                        }
                    }
                }
                if found {
                    Ok(())
                } else {
                    Err(err::NO_WATCHER)
                }
            }
            op::WHO_AM_I => {
                r.finish()?;
                let s = self.sessions.get(&sid);
                let mut infos: Vec<(String, String)> = Vec::new();
                if let Some(ip) = s.and_then(|s| s.addr) {
                    infos.push(("ip".into(), ip.to_string()));
                }
                infos.extend(s.map(|s| s.auth.clone()).unwrap_or_default());
                w.i32(infos.len() as i32);
                for (scheme, user) in infos {
                    w.string(&scheme).string(&user);
                }
                Ok(())
            }
            op::RECONFIG => Err(err::RECONFIG_DISABLED),
            op::SASL => Err(err::UNIMPLEMENTED),
            other => return Err(DecodeError::UnknownOpcode(other)),
        };
        Ok(result.map(|()| w))
    }

    fn get_data(&mut self, sid: i64, path: &str, watch: bool, w: &mut Writer) -> OpResult<()> {
        let n = self.node(path)?;
        if !self.allowed(sid, &n.acl, perms::READ) {
            return Err(err::NO_AUTH);
        }
        w.data(&n.data).stat(&n.stat);
        if watch {
            if !self.watch_limit_ok(sid, path) {
                return Err(err::THROTTLED);
            }
            self.watches.add(DATA, path, sid);
        }
        Ok(())
    }

    fn get_children(&mut self, sid: i64, path: &str, watch: bool, with_stat: bool, w: &mut Writer) -> OpResult<()> {
        let n = self.node(path)?;
        if !self.allowed(sid, &n.acl, perms::READ) {
            return Err(err::NO_AUTH);
        }
        let children: Vec<&String> = n.children.iter().collect();
        w.strings(&children);
        if with_stat {
            w.stat(&n.stat);
        }
        if watch {
            if !self.watch_limit_ok(sid, path) {
                return Err(err::THROTTLED);
            }
            self.watches.add(CHILD, path, sid);
        }
        Ok(())
    }

    pub(super) fn multi_read(&mut self, sid: i64, xid: i32, r: &mut Reader) -> DResult<Reply> {
        let ops = multi_ops(r, |typ, r| {
            let path = r.string("path")?;
            let watch = r.bool("watch")?;
            if typ != op::GET_CHILDREN && typ != op::GET_DATA {
                return Err(DecodeError::Invalid("multiRead operation"));
            }
            Ok((typ, path, watch))
        })?;
        let mut w = Writer::framed();
        header(&mut w, xid, self.zxid, 0);
        for (typ, path, watch) in ops {
            let mut body = Writer::new();
            let res = if typ == op::GET_DATA {
                self.get_data(sid, &path, watch, &mut body)
            } else {
                self.get_children(sid, &path, watch, false, &mut body)
            };
            match res {
                Ok(()) => {
                    w.i32(typ).bool(false).i32(0);
                    w.buf.extend_from_slice(&body.buf);
                }
                Err(code) => {
                    w.i32(op::ERROR).bool(false).i32(code).i32(code);
                }
            }
        }
        w.i32(-1).bool(true).i32(-1);
        Ok(Reply { frame: Some(w.frame()), close: false })
    }
}

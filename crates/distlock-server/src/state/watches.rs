//! Watches: the table of who watches what, and firing them.

use super::{header, State};
use crate::outbox::Outgoing;
use crate::proto::{self, event, Writer};
use crate::tree::parent_of;
use std::collections::{HashMap, HashSet};

/// Indexes of [`Watches::tables`].
pub(super) const DATA: usize = 0;
pub(super) const CHILD: usize = 1;
pub(super) const PERSISTENT: usize = 2;
pub(super) const RECURSIVE: usize = 3;

/// Every watch: per kind, the sessions watching each path; and per session, how many it holds
/// and the bytes of their paths (so the per-session limits cost nothing to check), with the
/// server-wide total of those bytes.
#[derive(Default)]
pub(super) struct Watches {
    tables: [HashMap<String, HashSet<i64>>; 4],
    /// Per session: watches held, bytes of their paths.
    counts: HashMap<i64, (usize, usize)>,
    /// The path bytes of every watch of every session.
    bytes: usize,
}

impl Watches {
    pub(super) fn add(&mut self, kind: usize, path: &str, sid: i64) {
        if self.tables[kind].entry(path.to_string()).or_default().insert(sid) {
            let c = self.counts.entry(sid).or_default();
            c.0 += 1;
            c.1 += path.len();
            self.bytes += path.len();
        }
    }

    /// Removes and returns the sessions watching `path` (a one-shot watch firing).
    fn take(&mut self, kind: usize, path: &str) -> HashSet<i64> {
        let taken = self.tables[kind].remove(path).unwrap_or_default();
        for sid in &taken {
            self.uncount(*sid, path.len());
        }
        taken
    }

    pub(super) fn contains(&self, kind: usize, path: &str, sid: i64) -> bool {
        self.tables[kind].get(path).is_some_and(|s| s.contains(&sid))
    }

    pub(super) fn remove(&mut self, kind: usize, path: &str, sid: i64) {
        if let Some(s) = self.tables[kind].get_mut(path) {
            if s.remove(&sid) {
                if s.is_empty() {
                    self.tables[kind].remove(path);
                }
                self.uncount(sid, path.len());
            }
        }
    }

    /// One watch of `sid`, on a path of `len` bytes, is gone.
    fn uncount(&mut self, sid: i64, len: usize) {
        if let Some(c) = self.counts.get_mut(&sid) {
            c.0 -= 1;
            c.1 = c.1.saturating_sub(len);
            self.bytes = self.bytes.saturating_sub(len);
            if c.0 == 0 {
                self.counts.remove(&sid);
            }
        }
    }

    /// The watches `sid` holds and the bytes of their paths.
    fn held(&self, sid: i64) -> (usize, usize) {
        self.counts.get(&sid).copied().unwrap_or_default()
    }

    fn total(&self) -> usize {
        self.counts.values().map(|c| c.0).sum()
    }

    /// The path bytes of every watch held.
    pub(super) fn total_bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn remove_session(&mut self, sid: i64) {
        let Some((_, bytes)) = self.counts.remove(&sid) else { return };
        self.bytes = self.bytes.saturating_sub(bytes);
        for t in &mut self.tables {
            t.retain(|_, s| {
                s.remove(&sid);
                !s.is_empty()
            });
        }
    }
}

impl State {
    // ---- watches ----------------------------------------------------------------------------

    /// Whether `sid` may set one more watch, on `path`: within its count
    /// (`max_watches_per_session`), the bytes of its watched paths
    /// (`max_watch_bytes_per_session`) and the server's total of those bytes (`max_watch_bytes`).
    /// A path it watches already in that kind costs nothing more, but is refused at a limit all
    /// the same (as the count limit always did).
    pub(super) fn watch_limit_ok(&self, sid: i64, path: &str) -> bool {
        let (count, bytes) = self.watches.held(sid);
        let c = &self.config;
        let ok = count < c.max_watches_per_session
            && bytes + path.len() <= c.max_watch_bytes_per_session
            && self.watches.total_bytes() + path.len() <= c.max_watch_bytes;
        if !ok {
            self.watch_warning.warn(|held_back| {
                tracing::warn!(
                    session = format_args!("{sid:#x}"),
                    watches = count,
                    watch_bytes = bytes,
                    server_watch_bytes = self.watches.total_bytes(),
                    held_back,
                    "watch refused (Throttled): a watch limit is reached"
                )
            });
        }
        ok
    }

    /// Fires the watches matching `(path, type)` events and queues the notifications.
    pub(super) fn deliver(&mut self, events: Vec<(String, i32)>) {
        for (path, typ) in events {
            let mut targets: HashSet<i64> = match typ {
                event::NODE_CREATED | event::NODE_DATA_CHANGED => self.watches.take(DATA, &path),
                event::NODE_DELETED => {
                    let mut t = self.watches.take(DATA, &path);
                    t.extend(self.watches.take(CHILD, &path));
                    t
                }
                _ => self.watches.take(CHILD, &path),
            };
            if let Some(s) = self.watches.tables[PERSISTENT].get(&path) {
                targets.extend(s.iter().copied());
            }
            if typ != event::NODE_CHILDREN_CHANGED {
                let mut p = path.as_str();
                loop {
                    if let Some(s) = self.watches.tables[RECURSIVE].get(p) {
                        targets.extend(s.iter().copied());
                    }
                    if p == "/" {
                        break;
                    }
                    p = parent_of(p);
                }
            }
            // In session order, not the set's: the same events notify in the same order (the
            // deterministic simulation's traces depend on it).
            let mut targets: Vec<i64> = targets.into_iter().collect();
            targets.sort_unstable();
            for sid in targets {
                self.notify(sid, typ, &path);
            }
        }
    }

    fn notify(&mut self, sid: i64, typ: i32, path: &str) {
        if let Some((_, conn)) = self.sessions.get(&sid).and_then(|s| s.conn.as_ref()) {
            let mut w = Writer::framed();
            header(&mut w, proto::xid::NOTIFICATION, -1, 0);
            w.i32(typ).i32(event::SYNC_CONNECTED).string(path);
            self.gate.send(conn, Outgoing::Frame(w.frame()));
            self.counters.sent += 1;
        }
    }

    /// Re-registers a reconnecting client's watches. Those past the watch limits are not set;
    /// returns whether any were refused so (the reply is then Throttled).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn set_watches(
        &mut self,
        sid: i64,
        rel: i64,
        data: Vec<String>,
        exist: Vec<String>,
        child: Vec<String>,
        pers: Vec<String>,
        rec: Vec<String>,
    ) -> bool {
        let mut fire = Vec::new();
        let mut set = Vec::new();
        for p in data {
            match self.tree.get(&p) {
                None => fire.push((p, event::NODE_DELETED)),
                Some(n) if n.stat.mzxid > rel => fire.push((p, event::NODE_DATA_CHANGED)),
                Some(_) => set.push((DATA, p)),
            }
        }
        for p in exist {
            match self.tree.get(&p) {
                Some(_) => fire.push((p, event::NODE_CREATED)),
                None => set.push((DATA, p)),
            }
        }
        for p in child {
            match self.tree.get(&p) {
                None => fire.push((p, event::NODE_DELETED)),
                Some(n) if n.stat.pzxid > rel => fire.push((p, event::NODE_CHILDREN_CHANGED)),
                Some(_) => set.push((CHILD, p)),
            }
        }
        set.extend(pers.into_iter().map(|p| (PERSISTENT, p)));
        set.extend(rec.into_iter().map(|p| (RECURSIVE, p)));
        let mut refused = false;
        for (kind, p) in set {
            if self.watch_limit_ok(sid, &p) {
                self.watches.add(kind, &p, sid);
            } else {
                refused = true;
            }
        }
        for (p, typ) in fire {
            self.notify(sid, typ, &p);
        }
        refused
    }

    pub fn watch_count(&self) -> usize {
        self.watches.total()
    }
}

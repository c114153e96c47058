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
/// (so the per-session limit costs nothing to check).
#[derive(Default)]
pub(super) struct Watches {
    tables: [HashMap<String, HashSet<i64>>; 4],
    counts: HashMap<i64, usize>,
}

impl Watches {
    pub(super) fn add(&mut self, kind: usize, path: &str, sid: i64) {
        if self.tables[kind].entry(path.to_string()).or_default().insert(sid) {
            *self.counts.entry(sid).or_default() += 1;
        }
    }

    /// Removes and returns the sessions watching `path` (a one-shot watch firing).
    fn take(&mut self, kind: usize, path: &str) -> HashSet<i64> {
        let taken = self.tables[kind].remove(path).unwrap_or_default();
        for sid in &taken {
            self.uncount(*sid);
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
                self.uncount(sid);
            }
        }
    }

    fn uncount(&mut self, sid: i64) {
        if let Some(n) = self.counts.get_mut(&sid) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&sid);
            }
        }
    }

    fn count(&self, sid: i64) -> usize {
        self.counts.get(&sid).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.counts.values().sum()
    }

    pub(super) fn remove_session(&mut self, sid: i64) {
        if self.counts.remove(&sid).is_none() {
            return;
        }
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

    pub(super) fn watch_limit_ok(&self, sid: i64) -> bool {
        self.watches.count(sid) < self.config.max_watches_per_session
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
    ) {
        let mut fire = Vec::new();
        for p in data {
            match self.tree.get(&p) {
                None => fire.push((p, event::NODE_DELETED)),
                Some(n) if n.stat.mzxid > rel => fire.push((p, event::NODE_DATA_CHANGED)),
                Some(_) => self.watches.add(DATA, &p, sid),
            }
        }
        for p in exist {
            match self.tree.get(&p) {
                Some(_) => fire.push((p, event::NODE_CREATED)),
                None => self.watches.add(DATA, &p, sid),
            }
        }
        for p in child {
            match self.tree.get(&p) {
                None => fire.push((p, event::NODE_DELETED)),
                Some(n) if n.stat.pzxid > rel => fire.push((p, event::NODE_CHILDREN_CHANGED)),
                Some(_) => self.watches.add(CHILD, &p, sid),
            }
        }
        for p in pers {
            self.watches.add(PERSISTENT, &p, sid);
        }
        for p in rec {
            self.watches.add(RECURSIVE, &p, sid);
        }
        for (p, typ) in fire {
            self.notify(sid, typ, &p);
        }
    }

    pub fn watch_count(&self) -> usize {
        self.watches.total()
    }
}

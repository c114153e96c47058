//! Sessions: connecting, re-attaching, disconnecting, expiry, and the clean-up when one ends.

use super::{now_ms, State};
use crate::outbox::{Outbox, Outgoing};
use crate::proto::{self, event, Writer};
use crate::tree::{parent_of, Mutation};
use std::net::IpAddr;
use std::time::Duration;
// tokio's clock: the real one, except in the deterministic simulation (tests: `--cfg distlock_sim`).
use tokio::time::Instant;

/// The most sessions one round of expiry ends while holding the state.
pub const EXPIRE_PER_ROUND: usize = 256;

pub struct Session {
    pub id: i64,
    pub password: Vec<u8>,
    pub timeout_ms: i32,
    pub deadline: Instant,
    pub conn: Option<(u64, Outbox)>,
    pub auth: Vec<(String, String)>,
    pub addr: Option<IpAddr>,
}

impl State {
    // ---- sessions ---------------------------------------------------------------------------

    fn negotiate_timeout(&self, requested: i32) -> i32 {
        let min = self.config.tick.as_millis() as i32 * 2;
        let max = self.config.tick.as_millis() as i32 * 20;
        requested.clamp(min, max)
    }

    /// Opens a new session or re-attaches an existing one. Returns the connect response frame
    /// and the session id, or `None` (with an "expired" response) when the session is unknown.
    pub fn connect(
        &mut self,
        req: &proto::ConnectRequest,
        conn: (u64, Outbox),
        addr: Option<IpAddr>,
    ) -> Result<(Vec<u8>, Option<i64>), String> {
        if req.last_zxid_seen > self.zxid {
            // The client has seen a newer state than ours: we went back in time (a data directory
            // restored from an old copy, say). Refused without a reply, as ZooKeeper does, so the
            // client tries another server instead of trusting this one.
            return Err(format!(
                "refusing the client: it has seen zxid {:#x}, our last is {:#x}",
                req.last_zxid_seen, self.zxid
            ));
        }
        let timeout = self.negotiate_timeout(req.timeout_ms);
        let mut w = Writer::framed();
        if req.session_id == 0 {
            let id = self.next_session;
            self.next_session += 1;
            let password: Vec<u8> = (0..16).map(|_| rand::random::<u8>()).collect();
            let deadline = Instant::now() + Duration::from_millis(timeout as u64);
            let session = Session {
                id,
                password: password.clone(),
                timeout_ms: timeout,
                deadline,
                conn: Some(conn),
                auth: Vec::new(),
                addr,
            };
            // The simulation's planted defect `snapshot-session` puts the session in the table
            // after the commit, as this server once did: a snapshot the commit triggers lacks it.
            // In the session table before the commit: a snapshot the commit triggers must hold it.
            let late = if crate::sim::planted("snapshot-session") {
                Some(session)
            } else {
                self.sessions.insert(id, session);
                None
            };
            self.zxid += 1;
            self.commit(
                0,
                vec![Mutation::OpenSession { id, password: password.clone(), timeout_ms: timeout }],
                now_ms(),
            );
            if let Some(session) = late {
                self.sessions.insert(id, session);
            }
            w.i32(0).i32(timeout).i64(id).buffer(&password);
            // readOnly: answered when asked (3.4+ clients), left out for older ones, as ZooKeeper does.
            if req.read_only.is_some() {
                w.bool(false);
            }
            tracing::debug!(session = format!("{id:#x}"), timeout, "session opened");
            return Ok((w.frame(), Some(id)));
        }
        match self.sessions.get_mut(&req.session_id) {
            Some(s) if s.password == req.password => {
                if let Some((_, old)) = s.conn.take() {
                    self.gate.send(&old, Outgoing::Close("session moved to a new connection".into()));
                }
                s.conn = Some(conn);
                s.addr = addr;
                s.timeout_ms = timeout;
                s.deadline = Instant::now() + Duration::from_millis(timeout as u64);
                let id = s.id;
                self.watches.remove_session(id);
                w.i32(0).i32(timeout).i64(id).buffer(&s.password.clone());
                if req.read_only.is_some() {
                    w.bool(false);
                }
                tracing::debug!(session = format!("{id:#x}"), "session re-attached");
                Ok((w.frame(), Some(id)))
            }
            _ => {
                // Unknown or expired session (or a wrong password): timeout 0 tells the client.
                w.i32(0).i32(0).i64(0).buffer(&[0u8; 16]);
                if req.read_only.is_some() {
                    w.bool(false);
                }
                Ok((w.frame(), None))
            }
        }
    }

    /// The connection of a session went away: its watches go with it (the client re-registers
    /// them with setWatches); the session lives on until its timeout.
    pub fn disconnect(&mut self, sid: i64, conn_id: u64) {
        if let Some(s) = self.sessions.get_mut(&sid) {
            if s.conn.as_ref().is_some_and(|(id, _)| *id == conn_id) {
                s.conn = None;
                self.watches.remove_session(sid);
            }
        }
    }

    /// Whether `conn_id` is the connection session `sid` is attached to now (a session that moved
    /// to a new connection, or ended, no longer answers the old one).
    pub fn is_current(&self, sid: i64, conn_id: u64) -> bool {
        self.sessions.get(&sid).is_some_and(|s| s.conn.as_ref().is_some_and(|(id, _)| *id == conn_id))
    }

    pub fn touch(&mut self, sid: i64) {
        if let Some(s) = self.sessions.get_mut(&sid) {
            s.deadline = Instant::now() + Duration::from_millis(s.timeout_ms as u64);
        }
    }

    /// Moves every session's deadline `by` later (time the server could not hear its clients).
    pub fn credit_sessions(&mut self, by: Duration) {
        for s in self.sessions.values_mut() {
            s.deadline += by;
        }
    }

    /// Ends a session: deletes its ephemeral nodes (firing their watches) and its watches.
    pub fn close_session(&mut self, sid: i64, why: &str) {
        if self.sessions.remove(&sid).is_none() {
            return;
        }
        let mut owned = self.quotas.ephemerals_of(sid);
        // Deepest first; equal depths by name, so the same nodes go the same way every time.
        owned.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.watches.remove_session(sid);
        self.delete_in_one_txn(owned, vec![Mutation::CloseSession { id: sid }], now_ms());
        tracing::debug!(session = format!("{sid:#x}"), why, "session closed");
    }

    /// Whether session `sid` has logged in (added an identity with `addauth`).
    pub fn logged_in(&self, sid: i64) -> bool {
        self.sessions.get(&sid).is_some_and(|s| !s.auth.is_empty())
    }

    /// Ends session `sid`, which has not logged in by its deadline where the server requires a
    /// login: its client gets an AuthFailed event (as after a refused login), then its
    /// connection `conn` closes.
    pub fn end_unauthenticated(&mut self, sid: i64, conn: &Outbox) {
        let mut ev = Writer::framed();
        super::header(&mut ev, proto::xid::NOTIFICATION, -1, 0);
        ev.i32(-1).i32(event::AUTH_FAILED).string("");
        self.send(conn, Outgoing::Frame(ev.frame()));
        self.send(conn, Outgoing::Close("no login by the deadline".into()));
        self.close_session(sid, "no login by the handshake deadline (the server requires one)");
    }

    /// Sessions open now (`mntr`'s `zk_global_sessions`, as Apache ZooKeeper names it).
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The sessions whose clients have been silent longer than their timeout.
    pub fn due_sessions(&self) -> Vec<i64> {
        let now = Instant::now();
        let mut due: Vec<i64> = self.sessions.values().filter(|s| s.deadline <= now).map(|s| s.id).collect();
        // Expired in session order, not the table's: the same state expires the same way.
        due.sort_unstable();
        due
    }

    /// Expires those of `sids` still due (one may have been heard from since it was found due).
    /// The caller passes at most `EXPIRE_PER_ROUND` at a time and lets go of the state between
    /// rounds, so that a flood of sessions expiring at once does not keep everyone else's
    /// requests waiting.
    pub fn expire(&mut self, sids: &[i64]) {
        let now = Instant::now();
        for &sid in sids {
            if self.sessions.get(&sid).is_none_or(|s| s.deadline > now) {
                continue;
            }
            if let Some((_, conn)) = self.sessions.get_mut(&sid).and_then(|s| s.conn.take()) {
                self.gate.send(&conn, Outgoing::Close("session expired".into()));
            }
            self.close_session(sid, "expired");
        }
    }

    /// Deletes empty containers (once used) and expired TTL nodes.
    pub fn reap(&mut self) {
        let now = now_ms();
        let mut doomed: Vec<String> = self
            .tree
            .nodes
            .iter()
            .filter(|(_, n)| {
                n.children.is_empty()
                    && ((n.is_container() && n.stat.cversion > 0)
                        || n.ttl_ms().is_some_and(|ttl| now > n.stat.mtime + ttl))
            })
            .map(|(p, _)| p.clone())
            .collect();
        if doomed.is_empty() {
            return;
        }
        doomed.sort();
        self.delete_in_one_txn(doomed, Vec::new(), now);
    }

    /// Deletes `paths` (children before parents) in one transaction with `then` appended, and
    /// fires the watches.
    fn delete_in_one_txn(&mut self, paths: Vec<String>, then: Vec<Mutation>, time: i64) {
        self.zxid += 1;
        let zxid = self.zxid;
        let mut muts = Vec::new();
        let mut events = Vec::new();
        for path in paths {
            let m = Mutation::Delete { path: path.clone(), zxid };
            self.tree.apply(&m);
            muts.push(m);
            let parent = parent_of(&path).to_string();
            events.push((path, event::NODE_DELETED));
            events.push((parent, event::NODE_CHILDREN_CHANGED));
        }
        muts.extend(then);
        self.commit(0, muts, time);
        self.deliver(events);
    }
}

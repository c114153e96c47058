//! The server's state machine: the tree, sessions, watches, and every request.
//!
//! All requests of all sessions are applied one at a time under one lock, in arrival order. A
//! request's reply and the watch events it triggers are queued on the sessions' outboxes while
//! the lock is held, so a client always receives an event before the reply to any later request
//! that could show the change (ZooKeeper's ordering guarantee).

use crate::outbox::{Gate, Outbox, Outgoing};
use crate::persist::Persist;
use crate::proto::{self, err, event, op, perms, Acl, DResult, DecodeError, Reader, Stat, Writer};
use crate::tree::{data_len, parent_of, valid_path, Data, Mutation, Node, Tree, CONTAINER_OWNER, TTL_MASK};
use crate::Config;
use base64::Engine;
use sha1::{Digest, Sha1};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct Session {
    pub id: i64,
    pub password: Vec<u8>,
    pub timeout_ms: i32,
    pub deadline: Instant,
    pub conn: Option<(u64, Outbox)>,
    pub auth: Vec<(String, String)>,
    pub addr: Option<IpAddr>,
}

/// Indexes of [`Watches::tables`].
const DATA: usize = 0;
const CHILD: usize = 1;
const PERSISTENT: usize = 2;
const RECURSIVE: usize = 3;

/// Every watch: per kind, the sessions watching each path; and per session, how many it holds
/// (so the per-session limit costs nothing to check).
#[derive(Default)]
struct Watches {
    tables: [HashMap<String, HashSet<i64>>; 4],
    counts: HashMap<i64, usize>,
}

impl Watches {
    fn add(&mut self, kind: usize, path: &str, sid: i64) {
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

    fn contains(&self, kind: usize, path: &str, sid: i64) -> bool {
        self.tables[kind].get(path).is_some_and(|s| s.contains(&sid))
    }

    fn remove(&mut self, kind: usize, path: &str, sid: i64) {
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

    fn remove_session(&mut self, sid: i64) {
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

/// A node without its children: what a multi saves to undo an op.
type NodeFields = (Data, std::sync::Arc<Vec<Acl>>, Stat);

/// Counters for the four-letter words.
#[derive(Default, Clone, Copy)]
pub struct Counters {
    pub received: u64,
    pub sent: u64,
    /// Request latencies (time under the state, in microseconds): count, sum, min, max.
    pub latency_count: u64,
    pub latency_sum_us: u64,
    pub latency_min_us: u64,
    pub latency_max_us: u64,
    /// fsyncs of the transaction log: count, total and longest time (microseconds).
    pub fsyncs: u64,
    pub fsync_sum_us: u64,
    pub fsync_max_us: u64,
}

impl Counters {
    pub fn record_latency(&mut self, us: u64) {
        self.latency_min_us = if self.latency_count == 0 { us } else { self.latency_min_us.min(us) };
        self.latency_max_us = self.latency_max_us.max(us);
        self.latency_sum_us += us;
        self.latency_count += 1;
    }

    /// (min, avg, max) in milliseconds, as ZooKeeper prints them.
    pub fn latency_ms(&self) -> (f64, f64, f64) {
        let avg = if self.latency_count == 0 { 0.0 } else { self.latency_sum_us as f64 / self.latency_count as f64 };
        (self.latency_min_us as f64 / 1000.0, avg / 1000.0, self.latency_max_us as f64 / 1000.0)
    }
}

pub struct State {
    pub tree: Tree,
    pub zxid: i64,
    pub sessions: HashMap<i64, Session>,
    watches: Watches,
    pub persist: Option<Persist>,
    pub config: Config,
    next_session: i64,
    pub counters: Counters,
    /// Replies and events waiting for their transactions to reach the disk.
    pub gate: Gate,
    /// Someone is fsyncing the log (see [`State::sync`]).
    syncing: bool,
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as i64
}

/// A failed operation: a ZooKeeper error code.
type OpResult<T> = Result<T, i32>;

/// The reply to a request, and whether to close the connection after it.
pub struct Reply {
    pub frame: Option<Vec<u8>>,
    pub close: bool,
}

fn header(w: &mut Writer, xid: i32, zxid: i64, err: i32) {
    w.i32(xid).i64(zxid).i32(err);
}

pub fn digest_id(user_password: &str) -> String {
    let user = user_password.split(':').next().unwrap_or("");
    let hash = Sha1::digest(user_password.as_bytes());
    format!("{user}:{}", base64::engine::general_purpose::STANDARD.encode(hash))
}

impl State {
    pub fn new(
        config: Config,
        tree: Tree,
        zxid: i64,
        sessions: Vec<(i64, Vec<u8>, i32)>,
        persist: Option<Persist>,
    ) -> State {
        let now = Instant::now();
        let mut next_session = (now_ms() << 24) & 0x00FF_FFFF_FFFF_FFFF | (1 << 56);
        let sessions: HashMap<i64, Session> = sessions
            .into_iter()
            .map(|(id, password, timeout_ms)| {
                next_session = next_session.max(id + 1);
                let deadline = now + Duration::from_millis(timeout_ms as u64);
                (id, Session { id, password, timeout_ms, deadline, conn: None, auth: Vec::new(), addr: None })
            })
            .collect();
        State {
            tree,
            zxid,
            sessions,
            watches: Watches::default(),
            persist,
            config,
            next_session,
            counters: Counters::default(),
            gate: Gate::default(),
            syncing: false,
        }
    }

    /// Group commit: makes every transaction written so far durable and releases what waited
    /// for it (see [`Gate`]). Called by whoever wrote a transaction, after letting go of the state.
    ///
    /// One caller at a time fsyncs (the leader), for everything written by the time it starts;
    /// transactions written meanwhile by others, who find an fsync under way and return, are
    /// covered by the leader's next round. So a lone client pays one fsync per write, as before,
    /// and many clients share each fsync.
    pub fn sync(state: &Mutex<State>) {
        loop {
            let (upto, file) = {
                let mut s = state.lock().unwrap();
                if s.syncing || s.gate.is_durable() {
                    return;
                }
                let Some(file) = s.persist.as_ref().map(|p| p.sync_handle()) else { return };
                s.syncing = true;
                (s.gate.appended_count(), file)
            };
            let started = Instant::now();
            if let Err(e) = file.and_then(|f| f.sync_data()) {
                tracing::error!(error = %e, "cannot fsync the transaction log; stopping");
                std::process::abort();
            }
            let took = started.elapsed().as_micros() as u64;
            let mut s = state.lock().unwrap();
            s.counters.fsyncs += 1;
            s.counters.fsync_sum_us += took;
            s.counters.fsync_max_us = s.counters.fsync_max_us.max(took);
            s.syncing = false;
            s.gate.durable_up_to(upto);
        }
    }

    /// Queues `out` on `conn` behind whatever waits for the disk.
    pub fn send(&mut self, conn: &Outbox, out: Outgoing) {
        self.gate.send(conn, out);
    }

    fn negotiate_timeout(&self, requested: i32) -> i32 {
        let min = self.config.tick.as_millis() as i32 * 2;
        let max = self.config.tick.as_millis() as i32 * 20;
        requested.clamp(min, max)
    }

    /// Commits a transaction: assigns the zxid, applies and logs it.
    fn commit(&mut self, mutations: Vec<Mutation>, time: i64) -> i64 {
        // The caller has applied the tree mutations already (a multi validates later ops against
        // them) and keeps the session table itself; here they are made durable.
        if let Some(p) = self.persist.as_mut() {
            if let Err(e) = p.append(self.zxid, time, &mutations) {
                tracing::error!(error = %e, "cannot write the transaction log; stopping");
                std::process::abort();
            }
            // With `always`, the writer calls `State::sync` once it lets go of the state.
            self.gate.appended(p.fsync() == crate::persist::Fsync::Never);
        }
        if let Some(p) = self.persist.as_mut() {
            if p.wants_snapshot() {
                let sessions = self.sessions.values().map(|s| (s.id, s.password.clone(), s.timeout_ms)).collect();
                if let Err(e) = p.start_snapshot(self.zxid, &self.tree, sessions) {
                    tracing::warn!(error = %e, "cannot start a snapshot; the log keeps growing");
                }
            }
        }
        self.zxid
    }

    // ---- sessions ---------------------------------------------------------------------------

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
            // In the session table before the commit: a snapshot the commit triggers must hold it.
            self.sessions.insert(
                id,
                Session {
                    id,
                    password: password.clone(),
                    timeout_ms: timeout,
                    deadline,
                    conn: Some(conn),
                    auth: Vec::new(),
                    addr,
                },
            );
            self.zxid += 1;
            self.commit(vec![Mutation::OpenSession { id, password: password.clone(), timeout_ms: timeout }], now_ms());
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
        let mut owned: Vec<String> = self
            .tree
            .nodes
            .iter()
            .filter(|(_, n)| n.ephemeral_session() == Some(sid))
            .map(|(p, _)| p.clone())
            .collect();
        owned.sort_by_key(|p| std::cmp::Reverse(p.len()));
        self.watches.remove_session(sid);
        self.delete_in_one_txn(owned, vec![Mutation::CloseSession { id: sid }], now_ms());
        tracing::debug!(session = format!("{sid:#x}"), why, "session closed");
    }

    /// Expires sessions whose clients have been silent longer than their timeout; returns the
    /// connections to close.
    pub fn expire_sessions(&mut self) {
        let now = Instant::now();
        let expired: Vec<i64> = self.sessions.values().filter(|s| s.deadline <= now).map(|s| s.id).collect();
        for sid in expired {
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
        self.commit(muts, time);
        self.deliver(events);
    }

    // ---- watches ----------------------------------------------------------------------------

    fn watch_limit_ok(&self, sid: i64) -> bool {
        self.watches.count(sid) < self.config.max_watches_per_session
    }

    /// Fires the watches matching `(path, type)` events and queues the notifications.
    fn deliver(&mut self, events: Vec<(String, i32)>) {
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

    // ---- access control ---------------------------------------------------------------------

    fn allowed(&self, sid: i64, acl: &[Acl], perm: i32) -> bool {
        let session = self.sessions.get(&sid);
        if session.is_some_and(|s| s.auth.iter().any(|(scheme, _)| scheme == "super")) {
            return true;
        }
        acl.iter().any(|a| {
            a.perms & perm != 0
                && match a.scheme.as_str() {
                    "world" => a.id == "anyone",
                    "ip" => session.and_then(|s| s.addr).is_some_and(|ip| ip_matches(&a.id, ip)),
                    scheme => session.is_some_and(|s| s.auth.iter().any(|(sc, id)| sc == scheme && *id == a.id)),
                }
        })
    }

    /// Validates ACLs of a create/setACL, expanding the `auth` scheme to the session's ids.
    ///
    /// As ZooKeeper's `fixupACL` does, the list as sent is first rid of repeated entries (same
    /// perms, scheme and id; the first of each is kept, in order). Only the list as sent: entries
    /// that the `auth` expansion happens to repeat stay, as they do in ZooKeeper.
    fn fix_acl(&self, sid: i64, acl: Vec<Acl>) -> OpResult<Vec<Acl>> {
        let acl = without_repeats(acl);
        if acl.is_empty() {
            return Err(err::INVALID_ACL);
        }
        let mut out = Vec::new();
        for a in acl {
            if a.perms & !perms::ALL != 0 {
                return Err(err::INVALID_ACL);
            }
            match a.scheme.as_str() {
                "world" if a.id == "anyone" => out.push(a),
                "auth" => {
                    let ids: Vec<Acl> = self
                        .sessions
                        .get(&sid)
                        .map(|s| {
                            s.auth
                                .iter()
                                .map(|(sc, id)| Acl { perms: a.perms, scheme: sc.clone(), id: id.clone() })
                                .collect()
                        })
                        .unwrap_or_default();
                    if ids.is_empty() {
                        return Err(err::INVALID_ACL);
                    }
                    out.extend(ids);
                }
                "digest" if a.id.contains(':') => out.push(a),
                "ip" if a.id.split('/').next().is_some_and(|ip| ip.parse::<IpAddr>().is_ok()) => out.push(a),
                _ => return Err(err::INVALID_ACL),
            }
        }
        Ok(out)
    }

    // ---- requests ---------------------------------------------------------------------------

    /// Handles one request frame of session `sid`.
    pub fn handle(&mut self, sid: i64, frame: &[u8]) -> DResult<Reply> {
        self.counters.received += 1;
        let (xid, opcode, body) = proto::request_header(frame)?;
        let mut r = Reader::new(body);
        let reply = |w: Writer| Ok(Reply { frame: Some(w.frame()), close: false });
        match opcode {
            op::PING => {
                r.finish()?;
                // Replies echo the request's xid (the Java client uses -2 for pings, -4 for auth and
                // -8 for setWatches; other clients number them like any request).
                let mut w = Writer::framed();
                header(&mut w, xid, self.zxid, 0);
                reply(w)
            }
            op::CLOSE_SESSION => {
                self.close_session(sid, "closed by client");
                let mut w = Writer::framed();
                header(&mut w, xid, self.zxid, 0);
                Ok(Reply { frame: Some(w.frame()), close: true })
            }
            op::AUTH => {
                let _typ = r.i32("auth type")?;
                let scheme = r.string("auth scheme")?;
                let auth = r.buffer("auth data")?;
                r.finish()?;
                let mut w = Writer::framed();
                if scheme == "digest" {
                    let id = digest_id(&String::from_utf8_lossy(&auth));
                    if let Some(s) = self.sessions.get_mut(&sid) {
                        if !s.auth.contains(&("digest".to_string(), id.clone())) {
                            s.auth.push(("digest".to_string(), id));
                        }
                    }
                    header(&mut w, xid, 0, 0);
                    reply(w)
                } else {
                    header(&mut w, xid, 0, err::AUTH_FAILED);
                    // The Java client expects an AuthFailed state event, then the connection ends.
                    let mut ev = Writer::framed();
                    header(&mut ev, proto::xid::NOTIFICATION, -1, 0);
                    ev.i32(-1).i32(4).string("");
                    if let Some((_, conn)) = self.sessions.get(&sid).and_then(|s| s.conn.as_ref()) {
                        self.gate.send(conn, Outgoing::Frame(w.frame()));
                        self.gate.send(conn, Outgoing::Frame(ev.frame()));
                    }
                    Ok(Reply { frame: None, close: true })
                }
            }
            op::SET_WATCHES | op::SET_WATCHES2 => {
                let rel = r.i64("relative zxid")?;
                let data = r.strings("data watches")?;
                let exist = r.strings("exist watches")?;
                let child = r.strings("child watches")?;
                let (pers, rec) = if opcode == op::SET_WATCHES2 {
                    (r.strings("persistent watches")?, r.strings("recursive watches")?)
                } else {
                    (Vec::new(), Vec::new())
                };
                r.finish()?;
                self.set_watches(sid, rel, data, exist, child, pers, rec);
                let mut w = Writer::framed();
                header(&mut w, xid, self.zxid, 0);
                reply(w)
            }
            op::MULTI => self.multi(sid, xid, &mut r),
            op::MULTI_READ => self.multi_read(sid, xid, &mut r),
            op::CREATE
            | op::CREATE2
            | op::CREATE_CONTAINER
            | op::CREATE_TTL
            | op::DELETE
            | op::SET_DATA
            | op::SET_ACL => {
                let req = WriteOp::decode(opcode, &mut r)?;
                r.finish()?;
                let mut w = Writer::framed();
                let time = now_ms();
                let zxid = self.zxid + 1;
                let mut muts = Vec::new();
                let mut events = Vec::new();
                match self.write_op(sid, &req, zxid, time, &mut muts, &mut events) {
                    Ok(result) => {
                        self.zxid = zxid;
                        self.commit(muts, time);
                        self.deliver(events);
                        header(&mut w, xid, zxid, 0);
                        result.encode(&mut w);
                    }
                    Err(code) => header(&mut w, xid, self.zxid, code),
                }
                reply(w)
            }
            _ => {
                let mut w = Writer::framed();
                match self.read_op(sid, opcode, &mut r)? {
                    Ok(body) => {
                        header(&mut w, xid, self.zxid, 0);
                        w.buf.extend_from_slice(&body.buf);
                    }
                    Err(code) => header(&mut w, xid, self.zxid, code),
                }
                reply(w)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn set_watches(
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

    /// The node at `path`. Reads look paths up as given, unvalidated, as ZooKeeper does: a
    /// malformed path is simply not there (NoNode), and "" is the root.
    fn node(&self, path: &str) -> OpResult<&Node> {
        self.tree.get(if path.is_empty() { "/" } else { path }).ok_or(err::NO_NODE)
    }

    fn check_path(path: &str) -> OpResult<()> {
        if valid_path(path, false) {
            Ok(())
        } else {
            Err(err::BAD_ARGUMENTS)
        }
    }

    /// Read-only operations. The outer `DResult` fails on malformed frames, the inner on
    /// ZooKeeper errors.
    fn read_op(&mut self, sid: i64, opcode: i32, r: &mut Reader) -> DResult<OpResult<Writer>> {
        let mut w = Writer::new();
        let result: OpResult<()> = match opcode {
            op::EXISTS => {
                let path = r.string("path")?;
                let watch = r.bool("watch")?;
                r.finish()?;
                (|| {
                    if watch && !self.watch_limit_ok(sid) {
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
                    if !self.watch_limit_ok(sid) {
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
            if !self.watch_limit_ok(sid) {
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
            if !self.watch_limit_ok(sid) {
                return Err(err::THROTTLED);
            }
            self.watches.add(CHILD, path, sid);
        }
        Ok(())
    }

    /// Validates and applies one write (on the live tree; multi undoes on failure).
    fn write_op(
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

    fn multi(&mut self, sid: i64, xid: i32, r: &mut Reader) -> DResult<Reply> {
        let mut ops = Vec::new();
        loop {
            let typ = r.i32("multi header type")?;
            let done = r.bool("multi header done")?;
            let _err = r.i32("multi header err")?;
            if done {
                break;
            }
            ops.push(WriteOp::decode(typ, r)?);
        }
        r.finish()?;
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
                self.commit(muts, time);
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

    fn multi_read(&mut self, sid: i64, xid: i32, r: &mut Reader) -> DResult<Reply> {
        let mut ops = Vec::new();
        loop {
            let typ = r.i32("multi header type")?;
            let done = r.bool("multi header done")?;
            let _err = r.i32("multi header err")?;
            if done {
                break;
            }
            let path = r.string("path")?;
            let watch = r.bool("watch")?;
            if typ != op::GET_CHILDREN && typ != op::GET_DATA {
                return Err(DecodeError::Invalid("multiRead operation"));
            }
            ops.push((typ, path, watch));
        }
        r.finish()?;
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

    pub fn ephemeral_count(&self) -> usize {
        self.tree.nodes.values().filter(|n| n.ephemeral_session().is_some()).count()
    }

    pub fn watch_count(&self) -> usize {
        self.watches.total()
    }
}

/// `acl` with every entry equal to an earlier one left out, order otherwise kept (ZooKeeper's
/// `PrepRequestProcessor.removeDuplicates`). A frame may carry tens of thousands of entries, so
/// earlier ones are looked up in a set rather than by scanning the list for each.
fn without_repeats(acl: Vec<Acl>) -> Vec<Acl> {
    if acl.len() < 2 {
        return acl;
    }
    let mut seen: HashSet<(i32, &str, &str)> = HashSet::with_capacity(acl.len());
    let first: Vec<bool> = acl.iter().map(|a| seen.insert((a.perms, a.scheme.as_str(), a.id.as_str()))).collect();
    drop(seen); // it borrows from `acl`, which is taken apart next
    acl.into_iter().zip(first).filter_map(|(a, keep)| keep.then_some(a)).collect()
}

fn ip_matches(spec: &str, ip: IpAddr) -> bool {
    let (addr, bits) = match spec.split_once('/') {
        Some((a, b)) => (a, b.parse::<u32>().ok()),
        None => (spec, None),
    };
    match (addr.parse::<IpAddr>(), ip) {
        (Ok(IpAddr::V4(a)), IpAddr::V4(b)) => {
            let bits = bits.unwrap_or(32).min(32);
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            (u32::from(a) & mask) == (u32::from(b) & mask)
        }
        (Ok(a), b) => a == b,
        _ => false,
    }
}

/// A decoded write operation (also the members of a multi).
#[derive(Debug)]
enum WriteOp {
    Create { opcode: i32, path: String, data: Data, acl: Vec<Acl>, flags: i32, ttl: i64 },
    Delete { path: String, version: i32 },
    SetData { path: String, data: Data, version: i32 },
    SetAcl { path: String, acl: Vec<Acl>, version: i32 },
    Check { path: String, version: i32 },
}

impl WriteOp {
    fn decode(opcode: i32, r: &mut Reader) -> DResult<WriteOp> {
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

enum WriteResult {
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
    fn encode(&self, w: &mut Writer) {
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

//! The server's state machine: the tree, sessions, watches, and every request.
//!
//! All requests of all sessions are applied one at a time under one lock, in arrival order. A
//! request's reply and the watch events it triggers are queued on the sessions' outboxes while
//! the lock is held, so a client always receives an event before the reply to any later request
//! that could show the change (ZooKeeper's ordering guarantee).

mod acl;
mod quota;
mod read;
mod sessions;
mod watches;
mod write;

use crate::outbox::{Gate, Outbox, Outgoing};
use crate::persist::Persist;
use crate::proto::{self, err, op, DResult, Reader, Writer};
use crate::tree::{valid_path, Mutation, Node, Tree};
use crate::Config;
use base64::Engine;
use sha1::{Digest, Sha1};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};
// tokio's clock: the real one, except in the deterministic simulation (tests: `--cfg distlock_sim`).
use tokio::time::Instant;

pub use sessions::{Session, EXPIRE_PER_ROUND};
use watches::Watches;
use write::WriteOp;

/// Counters for the four-letter words and the metrics.
#[derive(Default, Clone)]
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
    /// Transactions made durable by those fsyncs (the group commit's batches add up to it).
    pub fsync_batched: u64,
    /// Requests by opcode: count and total time under the state (microseconds).
    pub ops: std::collections::BTreeMap<i32, (u64, u64)>,
    /// Connections accepted since the start.
    pub connections_accepted: u64,
}

impl Counters {
    pub fn record_latency(&mut self, us: u64) {
        self.latency_min_us = if self.latency_count == 0 { us } else { self.latency_min_us.min(us) };
        self.latency_max_us = self.latency_max_us.max(us);
        self.latency_sum_us += us;
        self.latency_count += 1;
    }

    /// One request of `opcode` took `us` under the state.
    pub fn record_op(&mut self, opcode: i32, us: u64) {
        let e = self.ops.entry(opcode).or_default();
        e.0 += 1;
        e.1 += us;
    }

    /// (min, avg, max) in milliseconds, as ZooKeeper prints them.
    pub fn latency_ms(&self) -> (f64, f64, f64) {
        let avg = if self.latency_count == 0 { 0.0 } else { self.latency_sum_us as f64 / self.latency_count as f64 };
        (self.latency_min_us as f64 / 1000.0, avg / 1000.0, self.latency_max_us as f64 / 1000.0)
    }
}

/// What [`State::figures`] reads: counts of the state now.
pub struct Figures {
    pub znodes: usize,
    /// Bytes of node data.
    pub data_size: usize,
    pub ephemerals: usize,
    pub watches: usize,
    /// Bytes of the paths those watches are on.
    pub watch_bytes: usize,
    pub sessions: usize,
    /// Sessions with a connection.
    pub alive: usize,
    /// Replies waiting for the disk.
    pub outstanding: usize,
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
    /// What each session's nodes take up, against its limits.
    quotas: quota::Quotas,
    /// Refused watches and refused creates or sets are logged this way: a flood of them is not.
    watch_warning: Occasional,
    quota_warning: Occasional,
}

/// A warning given at most once per [`Occasional::EVERY`], however often its cause recurs: a
/// client flooding refused requests must not flood the log too. The next warning given counts
/// those held back.
#[derive(Default)]
pub(crate) struct Occasional {
    last: std::cell::Cell<Option<Instant>>,
    held_back: std::cell::Cell<u64>,
}

impl Occasional {
    const EVERY: Duration = Duration::from_secs(10);

    /// Calls `log` with the number of warnings held back since the last one, unless one was
    /// given within [`Occasional::EVERY`].
    pub(crate) fn warn(&self, log: impl FnOnce(u64)) {
        let now = Instant::now();
        if self.last.get().is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            self.held_back.set(self.held_back.get() + 1);
            return;
        }
        self.last.set(Some(now));
        log(self.held_back.replace(0));
    }
}

pub fn now_ms() -> i64 {
    crate::sim::wall_clock().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as i64
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

/// The ops of a multi request, each read by `op` from its type, up to the closing header; then
/// the end of the frame.
fn multi_ops<T>(r: &mut Reader, mut op: impl FnMut(i32, &mut Reader) -> DResult<T>) -> DResult<Vec<T>> {
    let mut ops = Vec::new();
    loop {
        let typ = r.i32("multi header type")?;
        let done = r.bool("multi header done")?;
        let _err = r.i32("multi header err")?;
        if done {
            break;
        }
        ops.push(op(typ, r)?);
    }
    r.finish()?;
    Ok(ops)
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
            zxid,
            sessions,
            watches: Watches::default(),
            persist,
            config,
            next_session,
            counters: Counters::default(),
            gate: Gate::default(),
            syncing: false,
            quotas: quota::Quotas::of_tree(&tree),
            watch_warning: Occasional::default(),
            quota_warning: Occasional::default(),
            tree,
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
            let (upto, before, file) = {
                let mut s = state.lock().unwrap();
                if s.syncing || s.gate.is_durable() {
                    return;
                }
                let Some(file) = s.persist.as_ref().map(|p| p.sync_handle()) else { return };
                s.syncing = true;
                (s.gate.appended_count(), s.gate.durable_count(), file)
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
            s.counters.fsync_batched += upto.saturating_sub(before);
            s.syncing = false;
            s.gate.durable_up_to(upto);
        }
    }

    /// Queues `out` on `conn` behind whatever waits for the disk.
    pub fn send(&mut self, conn: &Outbox, out: Outgoing) {
        self.gate.send(conn, out);
    }

    /// Commits a transaction made by session `by` (0: the server itself): logs it and charges
    /// its nodes to `by`'s quota.
    fn commit(&mut self, by: i64, mutations: Vec<Mutation>, time: i64) -> i64 {
        self.quotas.account(by, &mutations);
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

    // ---- requests ---------------------------------------------------------------------------

    /// Handles one request frame of session `sid`.
    pub fn handle(&mut self, sid: i64, frame: &[u8]) -> DResult<Reply> {
        self.counters.received += 1;
        let (xid, opcode, body) = proto::request_header(frame)?;
        let mut r = Reader::new(body);
        let reply = |w: Writer| Ok(Reply { frame: Some(w.frame()), close: false });
        if self.config.auth_required
            && !matches!(opcode, op::PING | op::AUTH | op::CLOSE_SESSION)
            && self.sessions.get(&sid).is_some_and(|s| s.auth.is_empty())
        {
            // ZooKeeper's enforce.auth: the session ends; the client reads AuthFailed.
            let mut w = Writer::framed();
            header(&mut w, xid, self.zxid, err::SESSION_CLOSED_REQUIRE_AUTH);
            self.close_session(sid, "no login (the server requires one)");
            return Ok(Reply { frame: Some(w.frame()), close: true });
        }
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
                let id = digest_id(&String::from_utf8_lossy(&auth));
                // With a users file, a digest is a login: only a known user with its password.
                let known = |users: &std::collections::HashMap<String, String>| {
                    users.get(id.split(':').next().unwrap_or("")).is_some_and(|line| *line == id)
                };
                if scheme == "digest" && self.config.users.as_deref().is_none_or(known) {
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
                    ev.i32(-1).i32(proto::event::AUTH_FAILED).string("");
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
                let refused = self.set_watches(sid, rel, data, exist, child, pers, rec);
                let mut w = Writer::framed();
                header(&mut w, xid, self.zxid, if refused { err::THROTTLED } else { 0 });
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
                        self.commit(sid, muts, time);
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

    /// The figures that `mntr` and `/metrics` both report, read in one place.
    pub fn figures(&self) -> Figures {
        Figures {
            znodes: self.tree.nodes.len(),
            data_size: self.quotas.data_total(),
            ephemerals: self.ephemeral_count(),
            watches: self.watch_count(),
            watch_bytes: self.watches.total_bytes(),
            sessions: self.sessions.len(),
            alive: self.sessions.values().filter(|x| x.conn.is_some()).count(),
            outstanding: self.gate.held(),
        }
    }

    pub fn ephemeral_count(&self) -> usize {
        self.tree.nodes.values().filter(|n| n.ephemeral_session().is_some()).count()
    }
}

//! The lock connections of a client (`lock_scope=session`), shared by every lock it holds: at
//! most `connections` of them (the URL's key, default 4) for any number of locks.
//!
//! PostgreSQL counts advisory locks per session: a session granted a key twice holds it twice,
//! and a session never waits for itself. So the pool keeps, for each connection, the keys it
//! holds or is taking (and the kind markers it holds, with how many of its holds rely on each),
//! and never routes a lock to a connection that already has its key: two local holders of one
//! name are two sessions, which the server orders as it orders anyone. A statement that may have
//! taken something it reports no answer for (an error) is followed by the unlocks that undo
//! exactly it, which the record makes safe: no other hold on that connection has its key.
//!
//! Statements that do not wait (tries, releases, health checks) are pipelined on any connection.
//! A statement that waits (`pg_advisory_lock`) would hold up every statement behind it, so it
//! runs only on a connection that holds nothing, taken for it alone (`exclusive`); at most
//! `connections - 1` are, so one always serves the others. Granted, that connection holds the
//! lock and serves other statements again. When no connection is free for a wait, the acquire
//! polls: it tries again when a local holder of the key lets it go, and on a timer.
//!
//! A connection's holds share one lease: its health check (a ping every sixth of the lease)
//! renews all of them, and when the connection ends or the lease runs out every one is lost at
//! once (each guard's lease follows the connection's, [`Lease::follower`]).

use super::{AdvisoryKey, Conn};
use crate::lease::{Lease, Renewal};
use crate::watchdog::{Ticket, Watchdog};
use crate::{LockState, LostReason};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What an acquire locks, as the pool routes it: the advisory key and the name's kind markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    /// The lock's advisory key.
    pub(crate) key: AdvisoryKey,
    /// The marker of our kind, held (shared) beside the lock.
    pub(crate) mark: AdvisoryKey,
    /// The marker of the other kind: no connection carrying it may take this lock (the server's
    /// check looks at other sessions only).
    pub(crate) other: AdvisoryKey,
}

/// A kind marker on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// A statement in flight takes it (the connection had none): nothing else may use it until
    /// that statement's answer says whether the session holds it.
    Taking,
    /// Held by the session once, relied on by this many holds and acquires in flight.
    Held(u32),
    /// Its unlock is in flight.
    Releasing,
}

/// How an acquire wants a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// A statement that does not wait: on the connection with the most holds that may take the
    /// key (so that empty ones stay free for waits), else an empty one, else a new one.
    Try,
    /// A connection that holds nothing, for a statement that waits.
    Wait,
}

/// Where an acquire goes.
#[derive(Debug)]
pub(crate) enum Route {
    /// Reserved on this connection.
    On(Reserved),
    /// There is room for another connection (reserved): open one ([`Pool::add`]), then route again.
    Open,
    /// No connection may take it now and none may be opened: every connection has its key (it is
    /// held or being taken here), or, for a wait, none is free.
    Busy,
    /// A connection's state of our marker is changing: route again when it has.
    Changing,
    /// The other kind's marker is held here: the name is in use as the other kind.
    Conflict,
}

/// An acquire's place on a connection: its key (and marker) recorded there.
#[derive(Debug)]
pub(crate) struct Reserved {
    pub(crate) conn: Arc<Conn>,
    /// Its statement takes our marker (the connection had none); else the session holds it already.
    pub(crate) takes_mark: bool,
    /// The connection is taken for this acquire alone: its statement may wait.
    pub(crate) exclusive: bool,
}

/// One connection and what it carries.
struct Slot {
    conn: Arc<Conn>,
    /// Lock keys held here or being taken or let go.
    keys: HashSet<AdvisoryKey>,
    marks: HashMap<AdvisoryKey, Mark>,
    /// Taken for one statement that waits (or a transaction) alone.
    exclusive: bool,
    /// Locks held.
    holds: usize,
    /// Statements of other work (inspection, an election's queries) in flight: not empty, so
    /// not taken for a wait that would hold them up.
    busy: usize,
    /// The lease of its holds, and its health checks: from its first hold on, kept while it is
    /// empty too (so that an idle connection that died is found, and a lock taken next needs no
    /// new lease), dropped when it is taken for a wait (a statement that waits would hold up
    /// the health check behind it).
    holding: Option<Holding>,
}

struct Holding {
    lease: Arc<Lease>,
    _renewals: Ticket,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.marks.is_empty() && !self.exclusive && self.busy == 0
    }

    /// Takes it for one statement that waits (or a transaction) alone. Its health checks end:
    /// it holds nothing, and the check would wait behind the statement.
    fn take_exclusive(&mut self) -> Option<Holding> {
        self.exclusive = true;
        self.holding.take()
    }

    /// Gone, or its holds are lost: to be retired.
    fn is_dead(&self) -> bool {
        self.conn.is_closed() || self.holding.as_ref().is_some_and(|h| h.lease.state("lock connection").is_lost())
    }
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    /// Connections being opened (they count against the bound).
    opening: usize,
}

/// A client's shared lock connections (see the module docs).
pub(crate) struct Pool {
    /// At most this many connections.
    cap: usize,
    state: StdMutex<State>,
    /// Wakes acquires waiting for a key or a marker to leave a connection, by key.
    wakes: StdMutex<HashMap<AdvisoryKey, Weak<Notify>>>,
    /// Wakes acquires waiting for a connection to come or go.
    changed: Notify,
    /// How long the server keeps a silent session: each holding's lease.
    bound: Duration,
    watchdog: Arc<Watchdog>,
    next_id: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Pool").field("cap", &self.cap).field("connections", &s.slots.len()).finish()
    }
}

/// A retired connection: it, its holds' lease (and whether it holds any), and its keys.
type RetiredConn = (Arc<Conn>, Option<(Holding, bool)>, Vec<AdvisoryKey>);

/// Connections to close, and leases to tell, once the pool's lock is let go.
#[derive(Default)]
#[must_use]
struct Retired {
    /// Each connection retired.
    conns: Vec<RetiredConn>,
    /// Health checks ended (their connection taken for a wait), to drop outside the lock.
    ended: Vec<Holding>,
}

impl Pool {
    pub(crate) fn new(cap: usize, bound: Duration, watchdog: Arc<Watchdog>) -> Pool {
        Pool {
            cap: cap.max(1),
            state: StdMutex::default(),
            wakes: StdMutex::default(),
            changed: Notify::new(),
            bound,
            watchdog,
            next_id: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A number for a new connection (its name in logs).
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// The wake-up of acquires waiting for `key` to leave a connection.
    pub(crate) fn wake_for(&self, key: AdvisoryKey) -> Arc<Notify> {
        let mut map = self.wakes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(&key).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(key, Arc::downgrade(&n));
        n
    }

    /// The wake-up of acquires waiting for a connection to come or go.
    pub(crate) fn changed(&self) -> &Notify {
        &self.changed
    }

    fn wake(&self, keys: &[AdvisoryKey]) {
        let map = self.wakes.lock().unwrap_or_else(|e| e.into_inner());
        for k in keys {
            if let Some(n) = map.get(k).and_then(Weak::upgrade) {
                n.notify_waiters();
            }
        }
    }

    /// Takes dead connections out of `s` (their holds are told at [`Pool::finish`]).
    fn prune(&self, s: &mut State, retired: &mut Retired) {
        let mut i = 0;
        while i < s.slots.len() {
            if s.slots[i].is_dead() {
                let slot = s.slots.swap_remove(i);
                retired.add(slot);
            } else {
                i += 1;
            }
        }
    }

    /// Closes what `retired` holds and tells its holds they are lost (outside the pool's lock).
    fn finish(&self, retired: Retired) {
        for h in retired.ended {
            h.lease.end();
        }
        if retired.conns.is_empty() {
            return;
        }
        let mut keys = Vec::new();
        for (conn, holding, k) in retired.conns {
            // Its holds are lost first (an empty connection's lease ends quietly), then it closes.
            match holding {
                Some((h, true)) => h.lease.publish(LockState::Lost(LostReason::ConnectionClosed), "lock connection"),
                Some((h, false)) => h.lease.end(),
                None => {}
            }
            conn.kill();
            keys.extend(k);
        }
        self.wake(&keys);
        self.changed.notify_waiters();
    }

    /// Where an acquire of `want` goes (see [`How`]).
    pub(crate) fn route(&self, want: &Want, how: How) -> Route {
        let mut retired = Retired::default();
        let route = {
            let mut s = self.lock();
            self.prune(&mut s, &mut retired);
            self.route_in(&mut s, want, how, &mut retired)
        };
        self.finish(retired);
        route
    }

    fn route_in(&self, s: &mut State, want: &Want, how: How, retired: &mut Retired) -> Route {
        // The other kind held here is a conflict the server would report (another session of
        // ours holds its marker); while one is being taken or let go, wait for its answer.
        let mut changing = false;
        for slot in &s.slots {
            match slot.marks.get(&want.other) {
                Some(Mark::Held(_)) => return Route::Conflict,
                Some(_) => changing = true,
                None => {}
            }
        }
        if changing {
            return Route::Changing;
        }
        let room = s.slots.len() + s.opening < self.cap;
        if how == How::Wait {
            // One connection always stays for statements that do not wait.
            let exclusive = s.slots.iter().filter(|slot| slot.exclusive).count();
            if exclusive + 1 >= self.cap {
                return Route::Busy;
            }
            if let Some(slot) = s.slots.iter_mut().find(|slot| slot.is_empty()) {
                retired.ended.extend(slot.take_exclusive());
                slot.keys.insert(want.key);
                slot.marks.insert(want.mark, Mark::Taking);
                return Route::On(Reserved { conn: slot.conn.clone(), takes_mark: true, exclusive: true });
            }
            if room {
                s.opening += 1;
                return Route::Open;
            }
            return Route::Busy;
        }
        let mut best: Option<usize> = None;
        for (i, slot) in s.slots.iter().enumerate() {
            if slot.exclusive || slot.keys.contains(&want.key) {
                continue;
            }
            if let Some(Mark::Taking | Mark::Releasing) = slot.marks.get(&want.mark) {
                changing = true;
                continue;
            }
            // Most holds first: empty connections are kept for waits.
            let load = |slot: &Slot| (slot.holds, slot.keys.len());
            if best.is_none_or(|b| load(slot) > load(&s.slots[b])) {
                best = Some(i);
            }
        }
        match best {
            Some(i) => {
                let slot = &mut s.slots[i];
                slot.keys.insert(want.key);
                let takes_mark = match slot.marks.get_mut(&want.mark) {
                    Some(Mark::Held(n)) => {
                        *n += 1;
                        false
                    }
                    _ => {
                        slot.marks.insert(want.mark, Mark::Taking);
                        true
                    }
                };
                Route::On(Reserved { conn: slot.conn.clone(), takes_mark, exclusive: false })
            }
            None if room => {
                s.opening += 1;
                Route::Open
            }
            None if changing => Route::Changing,
            None => Route::Busy,
        }
    }

    /// A connection opened for a [`Route::Open`] (or at connect, `reserved` false) joins the pool.
    pub(crate) fn add(&self, conn: Conn, reserved: bool) {
        {
            let mut s = self.lock();
            if reserved {
                s.opening = s.opening.saturating_sub(1);
            }
            if !reserved && s.slots.len() + s.opening >= self.cap {
                return; // dropped: closed
            }
            s.slots.push(Slot {
                conn: Arc::new(conn),
                keys: HashSet::new(),
                marks: HashMap::new(),
                exclusive: false,
                holds: 0,
                busy: 0,
                holding: None,
            });
        }
        self.changed.notify_waiters();
    }

    /// A [`Route::Open`] that failed (or was given up).
    pub(crate) fn open_failed(&self) {
        {
            let mut s = self.lock();
            s.opening = s.opening.saturating_sub(1);
        }
        self.changed.notify_waiters();
    }

    /// The acquire reserved in `r` was granted by a statement sent at `sent`: the lease its guard
    /// follows (the connection's), or `None` if the connection went meanwhile (or its acquire
    /// was cancelled: then it is closed, which frees what it got), or its lease is lost.
    ///
    /// The grant's answer proves the session alive at `sent`, so the guard's lease runs from
    /// `sent`, whatever the connection's last health check: a guard is never born near its
    /// deadline. The connection's lease is confirmed by it too when it is older than a renewal
    /// period (so that confirming every hold on it costs a look at each at most that often).
    pub(crate) fn granted(self: &Arc<Self>, r: &Reserved, want: &Want, sent: Instant) -> Option<Arc<Lease>> {
        let name = format!("lock connection {}", r.conn.id);
        let lease = self.granted_in(r, want, sent, &name)?;
        if lease.state(&name).is_lost() {
            return None;
        }
        let fresh = sent + self.bound - crate::lease::drift(self.bound);
        if lease.deadline() + self.bound / 6 < fresh {
            lease.confirmed(sent, &name);
        }
        let follower = lease.follower()?;
        follower.confirmed(sent, &name);
        Some(follower)
    }

    /// The record of a grant: the connection's lease (made now if it has none), or `None`.
    fn granted_in(self: &Arc<Self>, r: &Reserved, want: &Want, sent: Instant, name: &str) -> Option<Arc<Lease>> {
        let mut retired = Retired::default();
        let lease = {
            let mut s = self.lock();
            let at = s.slots.iter().position(|slot| Arc::ptr_eq(&slot.conn, &r.conn));
            match at {
                None => None,
                Some(i) if r.exclusive && r.conn.is_cancelled() => {
                    retired.add(s.slots.swap_remove(i));
                    None
                }
                Some(i) => {
                    let slot = &mut s.slots[i];
                    slot.exclusive = false;
                    if let Some(m @ Mark::Taking) = slot.marks.get_mut(&want.mark) {
                        *m = Mark::Held(1);
                    }
                    slot.holds += 1;
                    if slot.holding.is_none() {
                        let lease = Arc::new(Lease::new(sent, self.bound, "postgres"));
                        r.conn.set_holder(&lease, name);
                        let renewals = self.watchdog.watch(lease.clone(), name.to_string(), self.check(&r.conn));
                        self.retire_when_lost(&r.conn, &lease, name);
                        slot.holding = Some(Holding { lease, _renewals: renewals });
                    }
                    slot.holding.as_ref().map(|h| h.lease.clone())
                }
            }
        };
        self.finish(retired);
        lease
    }

    /// The health check of `conn`'s holds: a ping, answered before their lease runs out, or
    /// the connection is retired (its holds lost; closed, so the server frees them).
    fn check(self: &Arc<Self>, conn: &Arc<Conn>) -> crate::watchdog::Alone {
        let (pool, conn) = (Arc::downgrade(self), Arc::downgrade(conn));
        crate::watchdog::Alone::new(move || -> crate::contract::BoxFuture<'static, Renewal> {
            let (pool, conn) = (pool.clone(), conn.clone());
            Box::pin(async move {
                let Some(conn) = conn.upgrade() else { return Renewal::Failed };
                let deadline = pool.upgrade().and_then(|p| p.deadline_of(&conn));
                let Some(deadline) = deadline else { return Renewal::Failed };
                match tokio::time::timeout_at(deadline, conn.client.simple_query("")).await {
                    Ok(answer) => Renewal::of_check(answer.map(drop), |_| conn.is_closed(), "lock connection"),
                    Err(_) => {
                        if let Some(pool) = pool.upgrade() {
                            pool.retire(&conn);
                        }
                        Renewal::Gone(LostReason::LeaseExpired)
                    }
                }
            })
        })
    }

    /// Watches `lease`, the holds' lease of `conn`: once it is lost (a health check refused or
    /// unanswered, or its deadline passed with none confirmed, however late the renewals run),
    /// every hold on it has been told, and the connection is retired at once, so that the server
    /// frees its locks now rather than at the next acquire's look.
    fn retire_when_lost(self: &Arc<Self>, conn: &Arc<Conn>, lease: &Arc<Lease>, name: &str) {
        let (pool, conn, lease, name) = (Arc::downgrade(self), Arc::downgrade(conn), lease.clone(), name.to_string());
        tokio::spawn(async move {
            let reason = Lease::lost(lease.clone(), name, std::future::pending()).await;
            let (Some(pool), Some(conn)) = (pool.upgrade(), conn.upgrade()) else { return };
            let mut retired = Retired::default();
            {
                let mut s = pool.lock();
                // Still its lease (not ended by a wait taking the connection, nor retired).
                let at = s.slots.iter().position(|slot| {
                    Arc::ptr_eq(&slot.conn, &conn)
                        && slot.holding.as_ref().is_some_and(|h| Arc::ptr_eq(&h.lease, &lease))
                });
                if let Some(i) = at {
                    tracing::debug!(connection = conn.id, %reason, "lock connection lost; closing it");
                    retired.add(s.slots.swap_remove(i));
                }
            }
            pool.finish(retired);
        });
    }

    fn deadline_of(&self, conn: &Arc<Conn>) -> Option<Instant> {
        let s = self.lock();
        let slot = s.slots.iter().find(|slot| Arc::ptr_eq(&slot.conn, conn))?;
        slot.holding.as_ref().map(|h| h.lease.deadline())
    }

    /// The acquire reserved in `r` was not granted (its statement said so, or the unlocks that
    /// undo it were answered): its key leaves the connection. If it took our marker, the
    /// statement let it go; if it relied on one no hold needs any more, that marker is to be
    /// unlocked: the connection is returned for [`Pool::unlock_mark`]'s statement.
    pub(crate) fn not_granted(&self, r: &Reserved, want: &Want) -> Option<Arc<Conn>> {
        let mut retired = Retired::default();
        let mut unlock = None;
        {
            let mut s = self.lock();
            if let Some(i) = s.slots.iter().position(|slot| Arc::ptr_eq(&slot.conn, &r.conn)) {
                if r.exclusive && r.conn.is_cancelled() {
                    retired.add(s.slots.swap_remove(i));
                } else {
                    let slot = &mut s.slots[i];
                    slot.keys.remove(&want.key);
                    if r.exclusive {
                        slot.exclusive = false;
                    }
                    match slot.marks.get_mut(&want.mark) {
                        Some(Mark::Taking) if r.takes_mark => {
                            slot.marks.remove(&want.mark);
                        }
                        Some(Mark::Held(n)) if !r.takes_mark => {
                            *n -= 1;
                            if *n == 0 {
                                slot.marks.insert(want.mark, Mark::Releasing);
                                unlock = Some(slot.conn.clone());
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        self.finish(retired);
        self.wake(&[want.key, want.mark]);
        unlock
    }

    /// The marker `mark`'s unlock on `conn` was answered (`ok`) or failed (then the connection
    /// is retired: only its end is sure to let the marker go).
    pub(crate) fn mark_unlocked(&self, conn: &Arc<Conn>, mark: AdvisoryKey, ok: bool) {
        if !ok {
            return self.retire(conn);
        }
        {
            let mut s = self.lock();
            if let Some(slot) = s.slots.iter_mut().find(|slot| Arc::ptr_eq(&slot.conn, conn)) {
                if slot.marks.get(&mark) == Some(&Mark::Releasing) {
                    slot.marks.remove(&mark);
                }
            }
        }
        self.wake(&[mark]);
    }

    /// A release of `want` held on `conn` begins: whether its unlock also lets our marker go
    /// (no other hold relies on it); `None` if the connection is gone from the pool (the lock
    /// went with it).
    pub(crate) fn release_begin(&self, conn: &Arc<Conn>, want: &Want) -> Option<bool> {
        let mut s = self.lock();
        let slot = s.slots.iter_mut().find(|slot| Arc::ptr_eq(&slot.conn, conn))?;
        Some(match slot.marks.get_mut(&want.mark) {
            Some(Mark::Held(1)) => {
                slot.marks.insert(want.mark, Mark::Releasing);
                true
            }
            Some(Mark::Held(n)) => {
                *n -= 1;
                false
            }
            _ => false,
        })
    }

    /// The release's unlock was answered: the key (and the marker, if it let it go) leaves the
    /// connection.
    pub(crate) fn release_done(&self, conn: &Arc<Conn>, want: &Want, with_mark: bool) {
        {
            let mut s = self.lock();
            let Some(slot) = s.slots.iter_mut().find(|slot| Arc::ptr_eq(&slot.conn, conn)) else { return };
            slot.keys.remove(&want.key);
            if with_mark {
                slot.marks.remove(&want.mark);
            }
            slot.holds = slot.holds.saturating_sub(1);
        }
        self.wake(&[want.key, want.mark]);
    }

    /// Whether the holds on `conn` are lost (or it is gone from the pool).
    pub(crate) fn is_lost(&self, conn: &Arc<Conn>) -> bool {
        let s = self.lock();
        s.slots.iter().find(|slot| Arc::ptr_eq(&slot.conn, conn)).is_none_or(Slot::is_dead)
    }

    /// Takes `conn` out of the pool and closes it: the server frees everything its session held,
    /// and every hold on it is told it is lost. The way out when a statement's effect cannot be
    /// known or undone.
    pub(crate) fn retire(&self, conn: &Arc<Conn>) {
        let mut retired = Retired::default();
        {
            let mut s = self.lock();
            if let Some(i) = s.slots.iter().position(|slot| Arc::ptr_eq(&slot.conn, conn)) {
                retired.add(s.slots.swap_remove(i));
            }
        }
        if retired.conns.is_empty() {
            conn.kill();
        }
        self.finish(retired);
    }

    /// A connection for a statement that neither waits nor locks (inspection, an election's
    /// queries, a job's reads): the emptiest that serves other statements, not taken for a wait
    /// until the borrow ends; `None` when there is none (then [`Pool::reserve_open`]).
    pub(crate) fn any(self: &Arc<Self>) -> Option<Borrowed> {
        let mut retired = Retired::default();
        let conn = {
            let mut s = self.lock();
            self.prune(&mut s, &mut retired);
            s.slots.iter_mut().filter(|slot| !slot.exclusive).min_by_key(|slot| slot.holds).map(|slot| {
                slot.busy += 1;
                slot.conn.clone()
            })
        };
        self.finish(retired);
        conn.map(|conn| Borrowed { conn, pool: Some(self.clone()) })
    }

    fn unborrow(&self, conn: &Arc<Conn>) {
        let mut s = self.lock();
        if let Some(slot) = s.slots.iter_mut().find(|slot| Arc::ptr_eq(&slot.conn, conn)) {
            slot.busy = slot.busy.saturating_sub(1);
        }
    }

    /// A connection that holds nothing, for a transaction alone (a job's); `None` when none is
    /// free (then a connection of its own, outside the pool).
    pub(crate) fn exclusive(&self) -> Option<Arc<Conn>> {
        let (conn, ended) = {
            let mut s = self.lock();
            let exclusive = s.slots.iter().filter(|slot| slot.exclusive).count();
            if exclusive + 1 >= self.cap {
                return None;
            }
            let slot = s.slots.iter_mut().find(|slot| slot.is_empty() && !slot.conn.is_closed())?;
            (slot.conn.clone(), slot.take_exclusive())
        };
        if let Some(h) = ended {
            h.lease.end();
        }
        Some(conn)
    }

    /// The transaction on a connection of [`Pool::exclusive`] ended: it serves others again.
    pub(crate) fn end_exclusive(&self, conn: &Arc<Conn>) {
        {
            let mut s = self.lock();
            if let Some(slot) = s.slots.iter_mut().find(|slot| Arc::ptr_eq(&slot.conn, conn)) {
                slot.exclusive = false;
            }
        }
        self.changed.notify_waiters();
    }

    /// Room for one more connection, reserved (give it back with [`Pool::add`] or
    /// [`Pool::open_failed`]).
    pub(crate) fn reserve_open(&self) -> bool {
        let mut s = self.lock();
        if s.slots.len() + s.opening < self.cap {
            s.opening += 1;
            true
        } else {
            false
        }
    }

    /// Closes every connection that holds nothing (the client is closing).
    pub(crate) fn close_empty(&self) {
        let mut retired = Retired::default();
        {
            let mut s = self.lock();
            let mut i = 0;
            while i < s.slots.len() {
                if s.slots[i].is_empty() {
                    retired.add(s.slots.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        self.finish(retired);
    }
}

/// A connection of the pool lent to one statement of other work (see [`Pool::any`]), or one of
/// its own (outside the pool, closed when dropped).
pub(crate) struct Borrowed {
    conn: Arc<Conn>,
    pool: Option<Arc<Pool>>,
}

impl Borrowed {
    /// A connection outside the pool.
    pub(crate) fn own(conn: Conn) -> Borrowed {
        Borrowed { conn: Arc::new(conn), pool: None }
    }
}

impl std::ops::Deref for Borrowed {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.unborrow(&self.conn);
        }
    }
}

impl Retired {
    fn add(&mut self, slot: Slot) {
        let keys = slot.keys.iter().chain(slot.marks.keys()).copied().collect();
        let holds = slot.holds > 0;
        self.conns.push((slot.conn, slot.holding.map(|h| (h, holds)), keys));
    }
}

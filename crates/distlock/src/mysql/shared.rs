//! The lock connections of a client, shared by every lock it holds: at most `connections` of
//! them (the URL's key, default 4), waits included, for any number of locks.
//!
//! A `GET_LOCK` lock belongs to the server session (the connection) that took it, and one
//! session can hold any number of them, so the locks of one client need not cost a connection
//! each: a server ships with `max_connections` = 151, shared with the application. An acquire
//! first reserves its name on a shared connection and asks `GET_LOCK(name, 0)` there, which
//! answers at once. A waiting `GET_LOCK` occupies its connection until it is granted, so a lock
//! that must wait waits on a connection that holds nothing, taken for it alone (at most
//! `connections - 1` at once, so that one always serves the tries); granted, that connection
//! joins the shared ones. With no connection free for a wait, the acquire polls: it tries again
//! when a local holder of the name lets it go, when a connection is freed, and on a timer
//! (doubling from 5 ms to half a second), as PostgreSQL's pool does.
//!
//! What keeps each promise:
//! - **Loss, per connection.** A shared connection has one lease, renewed by one ping every
//!   sixth of the lease whatever the number of locks on it; each lock's lease *follows* it
//!   ([`Lease::follower`]): a ping answered moves every lock's deadline on, and the connection
//!   closed (its socket watched as every lock connection's is), a ping refused or the deadline
//!   passed without an answer makes every lock on it `Lost` at once. The session's `wait_timeout`
//!   is the lease, so the server cannot free the locks before that deadline.
//! - **One holder per name on a connection.** `GET_LOCK` is reentrant within a session (taken
//!   twice, it needs two `RELEASE_LOCK`s), so two local holders of one name through one
//!   connection would both be granted. A name is reserved on a connection before its statement
//!   is sent and kept there until its `RELEASE_LOCK` has been answered; an acquire never uses a
//!   connection on which its name is reserved, so it asks on another one (where the server says
//!   busy, as it would to any other client) or waits.
//! - **Nothing left behind, nothing disturbed.** The statement on a shared connection runs to its
//!   answer even if the acquire is dropped (a statement cut off would leave the connection in an
//!   unknown state, and perhaps a grant no one knows of): a grant nobody waits for any more is
//!   released at once. Statements on a shared connection never wait on the server, so a ping or
//!   another lock's release behind one waits a round trip at most. A wait that is dropped closes
//!   its connection, and the server ends a `GET_LOCK` wait whose client is gone.
//! - **No churn.** A connection whose last lock is released stays shared, with its lease and
//!   renewals, so that a lock taken and released in a loop makes no new lease, renewal or
//!   connection each time; at most one empty one stays, and only until its next renewal finds it
//!   still empty, when it goes back to the idle list (where the server's `wait_timeout` ends it).
//! - **The bound.** Shared connections, connections taken for a wait and idle ones kept for
//!   reuse are counted together: no more than `connections` are open for locks at once.

use super::{backend, Client, Conn, MutexGuard};
use crate::lease::{Lease, Renewal};
use crate::watchdog::Ticket;
use crate::{Error, LockState, LostReason, Result};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The lock connections of one client.
#[derive(Debug)]
pub(crate) struct Pool {
    /// At most this many connections for locks (shared, waiting, idle).
    cap: usize,
    /// The shared connections now in use, in a lock held across opening one, so that a burst of
    /// acquires opens no more than the bound.
    conns: tokio::sync::Mutex<Vec<Arc<Shared>>>,
    /// How many connections of `conns` there are (read without its lock, for the bound).
    shared: AtomicUsize,
    /// Connections taken for a wait on the server (claimed under `conns`' lock).
    waiting: AtomicUsize,
    /// Wakes acquires polling for a name, when a local holder lets it go.
    wakes: StdMutex<HashMap<String, Weak<Notify>>>,
    /// Wakes acquires polling for a connection to wait on.
    freed: Notify,
}

/// A connection taken for a wait on the server: it counts against the bound until dropped.
pub(crate) struct WaitSlot {
    client: Client,
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        let pool = self.client.pool();
        pool.waiting.fetch_sub(1, Ordering::AcqRel);
        pool.freed.notify_waiters();
    }
}

/// One shared connection: its lease, and the names reserved or held on it.
pub(crate) struct Shared {
    pub(crate) conn: tokio::sync::Mutex<Option<Conn>>,
    /// `CONNECTION_ID()`.
    pub(crate) id: u64,
    /// The connection's lease: every lock on it follows it.
    pub(crate) lease: Arc<Lease>,
    /// The names reserved (an acquire in flight) or held on this connection.
    names: StdMutex<HashSet<String>>,
    /// The connection's renewals: a ping every sixth of the lease (ended with the connection).
    renewals: StdMutex<Option<Ticket>>,
    /// "the shared connection ID", its name in the lease's log lines (made once).
    label: String,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("connection", &self.id).finish()
    }
}

impl Shared {
    fn label(&self) -> &str {
        &self.label
    }

    fn live(&self) -> bool {
        !self.lease.state(self.label()).is_lost()
    }

    fn holds(&self, name: &str) -> bool {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).contains(name)
    }

    fn load(&self) -> usize {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// What a try on a shared connection found.
pub(crate) enum Tried {
    /// Granted.
    Granted(MutexGuard),
    /// Held by someone else (another client, or a local holder on another connection).
    Busy,
    /// The connection had ended unseen (an idle one the server closed, its close not yet seen):
    /// it held no other lock, so the try is made again on another.
    Stale,
}

impl Pool {
    pub(crate) fn new(cap: usize) -> Pool {
        Pool {
            cap: cap.max(1),
            conns: tokio::sync::Mutex::default(),
            shared: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            wakes: StdMutex::default(),
            freed: Notify::new(),
        }
    }

    /// Connections in use for locks (shared, or taken for a wait).
    pub(crate) fn in_use(&self) -> usize {
        self.shared.load(Ordering::Acquire) + self.waiting.load(Ordering::Acquire)
    }

    /// Whether an idle connection may be kept beside `idle` others (all count against the bound).
    pub(crate) fn may_keep_idle(&self, idle: usize) -> bool {
        idle + self.in_use() < self.cap
    }

    fn retain_live(&self, conns: &mut Vec<Arc<Shared>>) {
        conns.retain(|s| s.live());
        self.shared.store(conns.len(), Ordering::Release);
    }

    /// A shared connection on which `name` is now reserved: the least loaded live one that does
    /// not have it, or a new one while the bound leaves room (and one more, for a wait); `None` when every one has it (a
    /// local holder) or there is no room: the acquire must then wait.
    async fn reserve(&self, client: &Client, name: &str) -> Result<Option<Arc<Shared>>> {
        let mut conns = self.conns.lock().await;
        self.retain_live(&mut conns);
        let free = conns.iter().filter(|s| !s.holds(name)).min_by_key(|s| s.load()).cloned();
        // One connection of the bound is kept for a wait on the server (unless it is 1).
        let room = conns.len() + self.waiting.load(Ordering::Acquire) < (self.cap - 1).max(1);
        let chosen = match free {
            // A new connection rather than a busy one while there is room: the locks spread.
            Some(s) if s.load() == 0 || !room => s,
            _ if room => {
                let shared = Arc::new(open(client).await?);
                conns.push(shared.clone());
                self.shared.store(conns.len(), Ordering::Release);
                shared
            }
            Some(s) => s,
            None => return Ok(None),
        };
        chosen.names.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
        Ok(Some(chosen))
    }

    /// A connection for a wait on the server, if the bound leaves one: fewer than
    /// `connections - 1` taken for waits (one always serves the tries), and room for one more.
    pub(crate) async fn claim_wait(&self, client: &Client) -> Option<WaitSlot> {
        let mut conns = self.conns.lock().await;
        self.retain_live(&mut conns);
        let waiting = self.waiting.load(Ordering::Acquire);
        if waiting + 1 >= self.cap {
            return None;
        }
        if conns.len() + waiting >= self.cap {
            // An empty connection kept for the next acquire gives way to the wait (it goes back
            // to the idle list, where the wait takes it).
            let empty = conns.iter().find(|s| s.load() == 0).cloned()?;
            self.leave(client, &mut conns, &empty);
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Some(WaitSlot { client: client.clone() })
    }

    /// The connection of a granted wait (`slot`'s) joins the shared ones, with `name` held on it
    /// under a lease from `sent` (the statement's send, or the ping that confirmed the session
    /// after a long wait).
    pub(crate) async fn adopt(
        &self,
        client: &Client,
        slot: WaitSlot,
        conn: Conn,
        name: &str,
        sent: Instant,
    ) -> Arc<Shared> {
        let shared = Arc::new(shared_from(client, conn, sent));
        shared.names.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string());
        let mut conns = self.conns.lock().await;
        conns.push(shared.clone());
        self.shared.store(conns.len(), Ordering::Release);
        drop(conns);
        drop(slot);
        shared
    }

    /// The wake-up of acquires polling for `name`.
    pub(crate) fn wake_for(&self, name: &str) -> Arc<Notify> {
        let mut map = self.wakes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(name).and_then(Weak::upgrade) {
            return n;
        }
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let n = Arc::new(Notify::new());
        map.insert(name.to_string(), Arc::downgrade(&n));
        n
    }

    /// The wake-up of acquires polling for a connection to wait on.
    pub(crate) fn freed(&self) -> &Notify {
        &self.freed
    }

    fn wake(&self, name: &str) {
        let n = self.wakes.lock().unwrap_or_else(|e| e.into_inner()).get(name).and_then(Weak::upgrade);
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    /// `name` is no longer reserved or held on `shared`. A connection left with no locks stays
    /// shared for the next acquire (its lease and renewals go on, so a lock taken and released
    /// in a loop costs no new lease, renewal or connection each time) unless another empty one
    /// does already; it leaves at its next renewal if it is still empty then ([`retire`]).
    pub(crate) async fn done(&self, client: &Client, shared: &Arc<Shared>, name: &str) {
        let mut conns = self.conns.lock().await;
        let empty = {
            let mut names = shared.names.lock().unwrap_or_else(|e| e.into_inner());
            names.remove(name);
            names.is_empty()
        };
        let kept = !empty
            || (shared.live()
                && conns.iter().any(|s| Arc::ptr_eq(s, shared))
                && !conns.iter().any(|s| !Arc::ptr_eq(s, shared) && s.load() == 0));
        if kept {
            drop(conns);
            if empty {
                // Kept empty after a refused try too, which started no renewals: its next
                // renewal is what retires it.
                renew(client, shared);
                self.freed.notify_waiters();
            }
            self.wake(name);
            return;
        }
        self.leave(client, &mut conns, shared);
        drop(conns);
        self.wake(name);
    }

    /// `shared` leaves the set if it still holds nothing (its renewal found it empty): true if
    /// it left.
    async fn retire(&self, client: &Client, shared: &Arc<Shared>) -> bool {
        let mut conns = self.conns.lock().await;
        if shared.load() > 0 || !conns.iter().any(|s| Arc::ptr_eq(s, shared)) {
            return false;
        }
        self.leave(client, &mut conns, shared);
        true
    }

    /// Every shared connection that holds nothing leaves the set (the client closes).
    pub(crate) async fn retire_empty(&self, client: &Client) {
        let empty: Vec<_> = self.conns.lock().await.iter().filter(|s| s.load() == 0).cloned().collect();
        for shared in empty {
            self.retire(client, &shared).await;
        }
    }

    /// `shared`, which holds nothing, leaves the set (`conns`, locked by the caller): its
    /// renewals end and the connection is idle again (the next lock on it makes a new lease).
    fn leave(&self, client: &Client, conns: &mut Vec<Arc<Shared>>, shared: &Arc<Shared>) {
        conns.retain(|s| !Arc::ptr_eq(s, shared));
        self.shared.store(conns.len(), Ordering::Release);
        drop(shared.renewals.lock().unwrap_or_else(|e| e.into_inner()).take());
        if shared.live() {
            if let Some(conn) = shared.conn.try_lock().ok().and_then(|mut c| c.take()) {
                client.put_back(conn);
            }
        }
        self.freed.notify_waiters();
    }
}

/// A connection of the idle list (or a new one) made shared: a lease of its own from now, renewed
/// by a ping every sixth of the lease.
async fn open(client: &Client) -> Result<Shared> {
    let conn = client.checkout().await?;
    Ok(shared_from(client, conn, Instant::now()))
}

/// `conn` made shared, with a lease from `sent`.
fn shared_from(client: &Client, conn: Conn, sent: Instant) -> Shared {
    let id = conn.id;
    let lease = Arc::new(Lease::carrier(sent, client.lease(), "mysql"));
    let label = format!("the shared connection {id}");
    conn.set_holder(&lease, &label);
    Shared {
        conn: tokio::sync::Mutex::new(Some(conn)),
        id,
        lease: lease.clone(),
        names: StdMutex::default(),
        renewals: StdMutex::new(None),
        label,
    }
}

/// Starts the renewals of a shared connection (its first lock was granted). A renewal that
/// finds the connection empty takes it out of the set instead ([`Pool::retire`]).
pub(crate) fn renew(client: &Client, shared: &Arc<Shared>) {
    let mut renewals = shared.renewals.lock().unwrap_or_else(|e| e.into_inner());
    if renewals.is_some() {
        return;
    }
    let weak = Arc::downgrade(shared);
    let owner = client.downgrade();
    let check = move || -> crate::contract::BoxFuture<'static, Renewal> {
        let (weak, owner) = (weak.clone(), owner.clone());
        Box::pin(async move {
            use sqlx::Connection;
            let Some(shared) = weak.upgrade() else { return Renewal::Failed };
            if shared.load() == 0 {
                if let Some(client) = Client::upgrade(&owner) {
                    if client.pool().retire(&client, &shared).await {
                        // Out of the set, its renewals ended: nothing follows its lease.
                        return Renewal::Renewed;
                    }
                }
            }
            let gone = |e: &sqlx::Error| {
                matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed)
            };
            let mut conn = shared.conn.lock().await;
            let Some(c) = conn.as_mut() else { return Renewal::Gone(LostReason::ConnectionClosed) };
            let answer = c.conn.ping().await;
            Renewal::of_check(answer, gone, shared.label())
        })
    };
    *renewals = Some(client.watchdog().watch(
        shared.lease.clone(),
        shared.label().to_string(),
        crate::watchdog::Alone::new(check),
    ));
}

/// `GET_LOCK(name, 0)` (with its token) on a shared connection, run to its answer even if the
/// caller goes away (then a grant is released at once: the guard made is dropped). `None` when
/// every shared connection has `name` (a local holder) and the bound leaves no room for
/// another: the caller waits.
pub(crate) async fn try_lock(client: &Client, name: &str) -> Result<Option<Tried>> {
    for _ in 0..2 {
        match try_once(client, name).await? {
            Some(Tried::Stale) => continue,
            tried => return Ok(tried),
        }
    }
    try_once(client, name).await.map(|tried| match tried {
        Some(Tried::Stale) => None,
        tried => tried,
    })
}

/// One try of [`try_lock`].
async fn try_once(client: &Client, name: &str) -> Result<Option<Tried>> {
    let Some(shared) = client.pool().reserve(client, name).await? else { return Ok(None) };
    let (client, name) = (client.clone(), name.to_string());
    let attempt = async move {
        let sent = Instant::now();
        // Bounded by the connection's deadline: a statement stuck behind a silent server (or a
        // ping stuck there) must not hold the acquire past the point where the connection is lost.
        let answer = tokio::time::timeout_at(shared.lease.deadline(), async {
            let mut conn = shared.conn.lock().await;
            match conn.as_mut() {
                Some(c) => super::mutex::grant(&mut c.conn, client.fencing(), &name, 0.0).await,
                None => Err(sqlx::Error::WorkerCrashed),
            }
        })
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut));
        let token = match answer {
            Ok(Some(token)) => token,
            Ok(None) => {
                // A refusal proves the session alive at `sent` as much as a grant does: a
                // connection on which every try is refused (many acquires polling, none granted
                // yet, so no renewals yet) must not reach its deadline for want of a ping.
                shared.lease.confirmed(sent, shared.label());
                client.pool().done(&client, &shared, &name).await;
                return Ok(Some(Tried::Busy));
            }
            Err(e) => {
                let alone = shared.load() == 1;
                let ended = ends_session(&e);
                if ended {
                    // The session is gone (or silent past its deadline), and every lock on it.
                    end(&shared).await;
                } else {
                    // The statement failed after `GET_LOCK` may have granted (its token's
                    // `NEXTVAL` or row write failed): released while the name is still reserved
                    // here, or the connection ended, so that no grant outlives the error.
                    let undone = {
                        let mut conn = shared.conn.lock().await;
                        match conn.as_mut() {
                            Some(c) => release_lock(&mut c.conn, &name).await.is_ok(),
                            None => true,
                        }
                    };
                    if !undone {
                        end(&shared).await;
                    }
                }
                client.pool().done(&client, &shared, &name).await;
                if ended && alone {
                    return Ok(Some(Tried::Stale));
                }
                return Err(backend("acquire", &name, e));
            }
        };
        // The answer proves the session alive at `sent`; the lock follows the connection's lease.
        shared.lease.confirmed(sent, shared.label());
        let Some(lease) = shared.lease.follower() else {
            // Granted on a connection already lost: ended, so the server frees the grant.
            end(&shared).await;
            client.pool().done(&client, &shared, &name).await;
            return Err(Error::LockLost { lock: name, reason: LostReason::ConnectionClosed });
        };
        renew(&client, &shared);
        Ok(Some(Tried::Granted(MutexGuard::on_shared(client, shared, name, token, lease))))
    };
    crate::background::detach(attempt).await
}

/// `RELEASE_LOCK(name)` on a shared connection; true if it was held. The name stays reserved on
/// the connection until the answer (see the module docs), then leaves it. A release that fails
/// (or gets no answer within the lease) ends the connection, so the server frees what it held:
/// the lock cannot stay held with its reservation gone.
pub(crate) async fn unlock(client: Client, shared: Arc<Shared>, name: String) -> Result<bool> {
    let released = tokio::time::timeout(client.lease(), async {
        let mut conn = shared.conn.lock().await;
        match conn.as_mut() {
            Some(c) => release_lock(&mut c.conn, &name).await,
            None => Err(sqlx::Error::WorkerCrashed),
        }
    })
    .await
    .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut));
    if released.is_err() {
        end(&shared).await;
    }
    client.pool().done(&client, &shared, &name).await;
    Ok(released.map_err(|e| backend("release", &name, e))? == Some(1))
}

/// `RELEASE_LOCK(name)` on `conn`: 1 if it was held, 0 if another's, NULL if no one's.
async fn release_lock(conn: &mut sqlx::MySqlConnection, name: &str) -> std::result::Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT RELEASE_LOCK(?)").bind(name).fetch_one(conn).await
}

/// Whether error `e` of a statement means the session is gone (or silent past its deadline).
fn ends_session(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed | sqlx::Error::PoolTimedOut)
}

/// The shared connection ends: every lock on it is told lost first, then the connection is
/// dropped (its socket shut), so the server frees whatever it still holds there.
pub(crate) async fn end(shared: &Shared) {
    shared.lease.publish(LockState::Lost(LostReason::ConnectionClosed), shared.label());
    drop(shared.conn.lock().await.take());
}

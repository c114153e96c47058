//! A session-level advisory mutex, fenced by a counter row.

use super::semaphore::RELEASED_CHANNEL;
use super::{backend, AdvisoryKey, Client, Conn, FENCING_GUARD, FENCING_SEQUENCE};
use crate::contract::Wait;
use crate::lease::{Lease, Leased, Renewal};
use crate::{Error, LockState, LostReason, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::SimpleQueryMessage;

/// An exclusive lock on an advisory key, held by a connection of its own.
///
/// Waiting is done by the server (`pg_advisory_lock`, with `lock_timeout` for a bounded wait): no
/// polling, and waiters are granted in the order the server queues them. Not reentrant: a second
/// acquire through the same handle waits like anyone else's.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(pg: distlock::postgres::Client) -> distlock::Result<()> {
/// let lock = pg.mutex("nightly-report")?;
/// match lock.lock_timeout(std::time::Duration::from_secs(5)).await? {
///     Some(guard) => {
///         println!("token {}", guard.fencing_token());
///         guard.release().await?;
///     }
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    client: Client,
    target: Arc<Target>,
}

/// What a [`Mutex`] locks, and its statements.
#[derive(Debug)]
struct Target {
    name: String,
    key: AdvisoryKey,
    /// Takes the lock without waiting and, if granted, a fencing token: one statement.
    try_sql: String,
    /// Waits for the lock (bounded by `lock_timeout`, set in the same statement by the last
    /// parameter, `0` = forever), then takes a fencing token.
    wait_sql: String,
    unlock_sql: String,
    /// `lock_scope=transaction`: the statements of a transaction-scoped lock instead.
    xact: Option<Xact>,
    /// The name's kind marker (see [`Marker`]).
    marker: Marker,
}

/// The contract's rule that a semaphore and a mutex or read/write lock cannot share a name
/// ([`Error::KindConflict`]), on advisory keys: each acquire first takes its kind's marker key
/// of the name (shared, so acquires of one kind never refuse each other), then looks in
/// `pg_locks` for another session holding the other kind's marker, and is refused if one does.
/// Marking before looking means two acquires of different kinds can never both miss each other
/// (whichever looks second has been marked after the first one's mark). The marker is held as long as the
/// lock is held or awaited, and let go with it.
#[derive(Debug, Clone)]
struct Marker {
    /// Our kind's marker key, as SQL literals.
    ours: String,
    /// The other kind's marker key, as `pg_locks` shows it.
    other: (i64, i64, i64),
    /// What the other kind is and what we are, in an error's words.
    in_use: &'static str,
    wanted: &'static str,
}

impl Marker {
    fn new(name: &str, semaphore: bool, shared: bool) -> Marker {
        let key = |kind: &str| match super::url::hashed_key(&format!("{name}\0kind:{kind}")) {
            AdvisoryKey::Single(h) => AdvisoryKey::Pair(super::KIND_MARKER_CLASS, h as i32),
            pair => pair,
        };
        let (ours, other) = if semaphore { (key("semaphore"), key("lock")) } else { (key("lock"), key("semaphore")) };
        let (in_use, wanted) = match (semaphore, shared) {
            (true, _) => ("a mutex or read/write lock", "a semaphore"),
            (false, true) => ("a semaphore", "a read lock"),
            (false, false) => ("a semaphore", "a mutex or write lock"),
        };
        Marker { ours: ours.sql_literals(), other: other.pg_locks_ids(), in_use, wanted }
    }

    /// Takes our marker (after `after`, a CTE it reads from, if any), as CTE `m`; then CTE `c`'s
    /// `other`: whether another session holds the other kind's.
    fn ctes(&self, after: Option<&str>) -> String {
        let (a, b, c) = self.other;
        let from = after.map_or(String::new(), |cte| format!(" FROM {cte}"));
        format!(
            "m AS (SELECT pg_advisory_lock_shared({})::text AS x{from}), \
             c AS (SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks k WHERE k.locktype = 'advisory' AND k.granted \
             AND k.pid <> pg_backend_pid() AND k.classid::bigint = {a} AND k.objid::bigint = {b} \
             AND k.objsubid::bigint = {c} AND m.x IS NOT NULL) AS other FROM m)",
            self.ours
        )
    }

    /// The same in a transaction (`lock_scope=transaction`): our marker for the transaction,
    /// then a row `other, true` if another session holds the other kind's (kept in a setting
    /// for the transaction, which [`Marker::UNLESS_OTHER`] reads: the lock is not even tried).
    fn in_transaction(&self) -> String {
        let (a, b, c) = self.other;
        format!(
            "SELECT pg_advisory_xact_lock_shared({}); SELECT 'other', set_config('distlock.kind_conflict', \
             EXISTS (SELECT 1 FROM pg_catalog.pg_locks k WHERE k.locktype = 'advisory' AND k.granted \
             AND k.pid <> pg_backend_pid() AND k.classid::bigint = {a} AND k.objid::bigint = {b} \
             AND k.objsubid::bigint = {c})::text, true)",
            self.ours
        )
    }

    /// The condition a transaction's lock statement runs under.
    const UNLESS_OTHER: &'static str = " WHERE current_setting('distlock.kind_conflict') = 'false'";

    /// Lets go of our marker.
    fn unlock(&self) -> String {
        format!("pg_advisory_unlock_shared({})", self.ours)
    }

    fn conflict(&self, lock: &str) -> Error {
        Error::KindConflict { lock: lock.to_string(), in_use: self.in_use.into(), wanted: self.wanted.into() }
    }
}

/// A transaction-scoped lock's statements (simple protocol: nothing is prepared, since behind a
/// transaction pooler the next transaction may run on another server session).
#[derive(Debug)]
struct Xact {
    /// `BEGIN` and the transaction's loss bound: the server ends a transaction idle for longer
    /// than the lease (`idle_in_transaction_session_timeout`), which frees the lock.
    begin: String,
    /// The lock functions, `pg_advisory_xact_lock[_shared]` and its `pg_try_` form, and their
    /// literal arguments.
    lock_fn: String,
    try_fn: String,
    args: String,
    /// The fencing token, after raising the sequence to the clock, under the fencing guard held
    /// exclusively and given back at once (a transaction-scoped guard would be held for the
    /// lock's whole life).
    token_sql: String,
    /// Ends the transaction, freeing the lock (and, for a semaphore slot, telling its waiters).
    release_sql: String,
}

impl Mutex {
    /// One permit slot of a [`Semaphore`](super::Semaphore): the mutex's statements on the slot's
    /// key, whose release also announces itself (`NOTIFY`) to the semaphore's waiters.
    pub(crate) fn new_slot(client: Client, name: String, key: AdvisoryKey) -> Mutex {
        let mut m = Mutex::with_marker(client, name.clone(), key, false, Marker::new(&name, true, false));
        let t = Arc::get_mut(&mut m.target).expect("just made");
        // An escape-string literal (E'...'): its backslashes and quotes doubled, it means the
        // same whatever `standard_conforming_strings` says.
        let payload = t.name.replace('\\', "\\\\").replace('\'', "''");
        t.unlock_sql = format!(
            "WITH u AS (SELECT pg_advisory_unlock({}) AS held FROM (SELECT pg_notify('{RELEASED_CHANNEL}', E'{payload}')) n) \
             SELECT held, {} FROM u",
            key.sql_args(1),
            t.marker.unlock()
        );
        if let Some(x) = t.xact.as_mut() {
            x.release_sql = format!("SELECT pg_notify('{RELEASED_CHANNEL}', E'{payload}'); COMMIT");
        }
        m
    }

    /// `shared`: a read side of a [`RwLock`](super::RwLock), the shared advisory lock on the key.
    pub(crate) fn new(client: Client, name: String, key: AdvisoryKey, shared: bool) -> Mutex {
        let marker = Marker::new(&name, false, shared);
        Mutex::with_marker(client, name, key, shared, marker)
    }

    fn with_marker(client: Client, name: String, key: AdvisoryKey, shared: bool, marker: Marker) -> Mutex {
        let (args, suffix) = (key.sql_args(1), if shared { "_shared" } else { "" });
        // The token is taken after the grant (`nextval` runs on `l`'s row, or in the THEN arm),
        // under the fencing guard's shared lock (see FENCING_SEQUENCE), held to the statement's end.
        let (g1, g2) = FENCING_GUARD;
        let token =
            format!("SELECT nextval('{FENCING_SEQUENCE}') FROM (SELECT pg_advisory_xact_lock_shared({g1}, {g2})::text");
        // Each answers `other` (the name is in use as the other kind: nothing was tried) and the
        // token if granted; not granted, the marker is let go in the same statement.
        let answer = format!(
            "SELECT c.other, t.token, CASE WHEN t.token IS NULL THEN {} END FROM c LEFT JOIN t ON true",
            marker.unlock()
        );
        let target = Target {
            try_sql: format!(
                "WITH {}, t(token) AS (SELECT CASE WHEN pg_try_advisory_lock{suffix}({args}) THEN ({token}) f) END \
                 FROM c WHERE NOT c.other) {answer}",
                marker.ctes(None)
            ),
            wait_sql: format!(
                "WITH s AS (SELECT set_config('lock_timeout', ${}, true)), {}, \
                 l AS (SELECT pg_advisory_lock{suffix}({args})::text FROM c WHERE NOT c.other), \
                 t(token) AS ({token} FROM l) f) {answer}",
                key.arity() + 1,
                marker.ctes(Some("s"))
            ),
            unlock_sql: format!(
                "WITH u AS (SELECT pg_advisory_unlock{suffix}({args}) AS held) SELECT held, {} FROM u",
                marker.unlock()
            ),
            xact: (client.url().scope == super::LockScope::Transaction).then(|| Xact {
                begin: format!(
                    "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}; SET LOCAL statement_timeout = 0",
                    client.url().server_bound().as_millis()
                ),
                lock_fn: format!("pg_advisory_xact_lock{suffix}"),
                try_fn: format!("pg_try_advisory_xact_lock{suffix}"),
                args: key.sql_literals(),
                // No lock_timeout for the token: a granted lock must not fail on the guard. Behind a
                // pooler, client connections outlive a server crash, so the clock floor that new
                // connections raise (see FENCING_SEQUENCE) is raised here, before every token,
                // under the guard held exclusively for these statements alone.
                token_sql: format!(
                    "SET LOCAL lock_timeout = 0; SELECT pg_advisory_lock({g1}, {g2}); \
                     SELECT setval('{FENCING_SEQUENCE}', c) FROM (SELECT last_value AS v, \
                     (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS c FROM {FENCING_SEQUENCE}) x \
                     WHERE c > v; \
                     SELECT 'token', nextval('{FENCING_SEQUENCE}'); SELECT pg_advisory_unlock({g1}, {g2})"
                ),
                release_sql: "COMMIT".to_string(),
            }),
            name,
            key,
            marker,
        };
        Mutex { client, target: Arc::new(target) }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// The advisory key it locks.
    pub fn key(&self) -> AdvisoryKey {
        self.target.key
    }

    crate::contract::wait_methods!(MutexGuard, "the lock", |l, w| l.acquire(w); lock, try_lock, lock_timeout);

    async fn acquire(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        let conn = self.client.checkout().await?;
        let cancel = (conn.client.cancel_token(), conn.cancelled.clone(), self.client.tls());
        let (client, target) = (self.client.clone(), self.target.clone());
        let attempt = async move {
            if let Some(xact) = &target.xact {
                return acquire_in_transaction(client, conn, target.clone(), xact, wait).await;
            }
            let name = &target.name;
            let sent = Instant::now();
            // Prepared once per connection; then one round trip each.
            let row = match wait.timeout() {
                Some(w) if w.is_zero() => conn.query(&target.try_sql, &target.key.params()).await,
                w => {
                    // `0` waits forever; so does anything past what lock_timeout can hold (~24 days).
                    let ms = match w.map(|w| w.as_millis()) {
                        Some(ms) if ms <= i32::MAX as u128 => ms.max(1).to_string(),
                        _ => "0".to_string(),
                    };
                    let mut params = target.key.params();
                    params.push((&ms, Type::TEXT));
                    conn.query(&target.wait_sql, &params).await
                }
            };
            let answer = row.map(|rows| rows.first().map(|r| (r.get::<_, bool>(0), r.get::<_, Option<i64>>(1))));
            let token: Option<i64> = match answer {
                Ok(Some((true, _))) => {
                    client.put_back(conn);
                    return Err(target.marker.conflict(name));
                }
                Ok(answer) => answer.and_then(|(_, token)| token),
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    // lock_timeout ran out. The lock may have been granted just as the timeout
                    // fired; an unlock makes sure the connection holds nothing before reuse.
                    match conn.query(&target.unlock_sql, &target.key.params()).await {
                        Ok(_) => client.put_back(conn),
                        Err(e) => tracing::debug!(error = %e, "unlock after a lock timeout failed; closing"),
                    }
                    return Ok(None);
                }
                Err(e) => return Err(backend("acquire", name, e)),
            };
            let Some(token) = token else {
                client.put_back(conn);
                return Ok(None);
            };
            granted(client, conn, target.clone(), token as u64, sent).await
        };
        Cancelling { fut: Some(Box::pin(attempt)), cancel: Some(cancel) }.await
    }
}

/// A transaction-scoped acquire (`lock_scope=transaction`) on `conn`: `BEGIN` with the loss
/// bound, the lock (tried, or waited for within `lock_timeout`), then the fencing token. Not
/// granted: the transaction is rolled back and the connection reused.
async fn acquire_in_transaction(
    client: Client,
    conn: Conn,
    target: Arc<Target>,
    xact: &Xact,
    wait: Wait,
) -> Result<Option<MutexGuard>> {
    let name = &target.name;
    let (lock_fn, args, begin) = (&xact.lock_fn, &xact.args, &xact.begin);
    let marker = target.marker.in_transaction();
    let sql = match wait.timeout() {
        Some(w) if w.is_zero() => format!("{begin}; {marker}; SELECT {}({args}){}", xact.try_fn, Marker::UNLESS_OTHER),
        w => {
            // `0` waits forever; so does anything past what lock_timeout can hold (~24 days).
            let ms = match w.map(|w| w.as_millis()) {
                Some(ms) if ms <= i32::MAX as u128 => ms.max(1),
                _ => 0,
            };
            let unless = Marker::UNLESS_OTHER;
            format!("{begin}; {marker}; SET LOCAL lock_timeout = {ms}; SELECT {lock_fn}({args})::text{unless}")
        }
    };
    let sent = Instant::now();
    let rollback = |conn: Conn| {
        let client = client.clone();
        async move {
            match conn.client.simple_query("ROLLBACK").await {
                Ok(_) => client.put_back(conn),
                Err(e) => tracing::debug!(error = %e, "rollback after a lock not granted failed; closing"),
            }
        }
    };
    let got = match conn.client.simple_query(&sql).await {
        Ok(messages)
            if messages.iter().any(
                |m| matches!(m, SimpleQueryMessage::Row(r) if r.get(0) == Some("other") && r.get(1) == Some("true")),
            ) =>
        {
            rollback(conn).await;
            return Err(target.marker.conflict(name));
        }
        // The lock statement's row: `t`/`f` for a try, any value once a wait is granted.
        Ok(messages) => messages
            .iter()
            .rev()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0) != Some("f")),
                _ => None,
            })
            .unwrap_or(false),
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => false,
        Err(e) => return Err(backend("acquire", name, e)),
    };
    if !got {
        rollback(conn).await;
        return Ok(None);
    }
    let token =
        conn.client.simple_query(&xact.token_sql).await.map_err(|e| backend("acquire (fencing token)", name, e))?;
    let token: u64 = token
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("token") => {
                r.get(1).and_then(|t| t.parse().ok())
            }
            _ => None,
        })
        .ok_or_else(|| Error::Backend {
            op: "acquire (fencing token)",
            path: name.clone(),
            source: "no token".into(),
        })?;
    granted(client, conn, target.clone(), token, sent).await
}

/// The guard of a lock granted on `conn` by a request sent at `sent`. The lease runs from the
/// last request the server surely received; after a long wait that is no longer the acquire's:
/// the session is confirmed first (else the guard would be born lost), and if that fails, the
/// connection is dropped, which frees the lock.
async fn granted(
    client: Client,
    conn: Conn,
    target: Arc<Target>,
    token: u64,
    sent: Instant,
) -> Result<Option<MutexGuard>> {
    let bound = client.url().server_bound();
    let name = &target.name;
    let ping = async {
        conn.client
            .simple_query("")
            .await
            .map(|_| ())
            .map_err(|e| backend("acquire (session check after the wait)", name, e))
    };
    let confirmed = crate::lease::fresh_after_wait(sent, bound, name, ping).await?;
    Ok(Some(MutexGuard::new(client, conn, target, token, confirmed)))
}

/// An acquire in flight: if dropped unfinished, its statement is cancelled on the server (again
/// every 200 ms until the attempt ends, since a cancel that arrives before the statement starts
/// is ignored) and the attempt finished in the background: a lock granted meanwhile is released
/// by its guard's drop, and the connection is never reused (a late cancel could hit later work).
struct Cancelling<T: Send + 'static> {
    fut: Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
    cancel: Option<(tokio_postgres::CancelToken, Arc<AtomicBool>, tokio_postgres_rustls::MakeRustlsConnect)>,
}

impl<T: Send + 'static> std::future::Future for Cancelling<T> {
    type Output = T;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let out = self.fut.as_mut().expect("polled after it finished").as_mut().poll(cx);
        if out.is_ready() {
            self.fut = None;
        }
        out
    }
}

impl<T: Send + 'static> Drop for Cancelling<T> {
    fn drop(&mut self) {
        let (Some(fut), Some((cancel, cancelled, tls))) = (self.fut.take(), self.cancel.take()) else { return };
        cancelled.store(true, Ordering::SeqCst);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut attempt = tokio::spawn(fut);
                for _ in 0..50 {
                    let _ = cancel.cancel_query(tls.clone()).await;
                    if tokio::time::timeout(Duration::from_millis(200), &mut attempt).await.is_ok() {
                        return;
                    }
                }
                // Still not done after 10 s: drop it, which closes its connection (the server
                // notices within client_connection_check_interval and frees what it holds).
                attempt.abort();
            });
        }
    }
}

/// Proof of holding a [`Mutex`]: its connection, fencing token and lease deadline. Released by
/// [`release`](MutexGuard::release) or, in the background, on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::postgres::Mutex) -> distlock::Result<()> {
/// let guard = lock.lock().await?;
/// tokio::select! {
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => guard.release().await?,
///     reason = guard.lost() => eprintln!("lost: {reason}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MutexGuard {
    hold: Option<Hold>,
}

struct Hold {
    client: Client,
    conn: Arc<Conn>,
    target: Arc<Target>,
    /// Our mark, `advisory:KEY` (see [`MutexGuard::holder_id`]).
    holder: String,
    token: u64,
    leased: Leased,
    /// Its place in the client's renewals: a health check of the connection every sixth of the
    /// lease (ended when dropped).
    _renewals: crate::watchdog::Ticket,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("target", &self.target).field("token", &self.token).finish()
    }
}

impl MutexGuard {
    fn new(client: Client, conn: Conn, target: Arc<Target>, token: u64, sent: Instant) -> MutexGuard {
        let lease = Arc::new(Lease::new(sent, client.url().server_bound(), "postgres"));
        conn.set_holder(&lease, &target.name);
        let conn = Arc::new(conn);
        let check = {
            let (conn, name) = (Arc::downgrade(&conn), target.name.clone());
            move || -> crate::contract::BoxFuture<'static, Renewal> {
                let (conn, name) = (conn.clone(), name.clone());
                Box::pin(async move {
                    // Gone: released while this renewal was due; nothing left to renew.
                    let Some(conn) = conn.upgrade() else { return Renewal::Failed };
                    let answer = conn.client.simple_query("").await.map(drop);
                    Renewal::of_check(answer, |_| conn.is_closed(), &name)
                })
            }
        };
        let renewals = client.watchdog().watch(lease.clone(), target.name.clone(), crate::watchdog::Alone::new(check));
        let holder = format!("advisory:{}", target.key);
        let leased = Leased::new(target.name.clone(), lease);
        MutexGuard { hold: Some(Hold { client, conn, target, holder, token, leased, _renewals: renewals }) }
    }

    fn hold(&self) -> &Hold {
        self.hold.as_ref().expect("a guard holds until released")
    }

    /// Larger than every token an earlier holder of this lock got. Pass it to the resource you
    /// protect, which must refuse tokens lower than the highest it has seen.
    pub fn fencing_token(&self) -> u64 {
        self.hold().token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.hold().leased.name()
    }

    /// The advisory key held.
    pub fn key(&self) -> AdvisoryKey {
        self.hold().target.key
    }

    /// Runs `sql` on the connection that holds the lock (an election's announcement, which names
    /// that connection's `pg_backend_pid()`); the rows it changed.
    pub(crate) async fn on_own_connection(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        self.hold().conn.client.execute(sql, params).await
    }

    /// The backend's process id of the holding connection, as `pg_locks.pid` shows it: unknown
    /// here without a query, so the advisory key is given as the holder's mark instead.
    pub fn holder_id(&self) -> &str {
        &self.hold().holder
    }

    /// The instant after which the server may end our silent session and give the lock to
    /// someone else: the send time of the last answered health check plus the lease, less a
    /// drift margin.
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.hold().leased.lease_deadline()
    }

    /// The state now (`Lost` once the lease deadline has passed without an answer, or the
    /// connection closed).
    pub fn state(&self) -> LockState {
        let h = self.hold();
        if h.conn.is_closed() {
            h.leased.lease.publish(LockState::Lost(LostReason::ConnectionClosed), h.leased.name());
        }
        h.leased.state()
    }

    /// Every change of state, as a watch receiver.
    pub fn state_changes(&self) -> watch::Receiver<LockState> {
        self.hold().leased.state_changes()
    }

    /// Resolves when the lock can no longer be trusted: the connection closed, or the lease
    /// deadline passed without an answered health check.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let h = self.hold();
        let closed = h.conn.closed();
        h.leased.lost_or(async move {
            closed.await;
            LostReason::ConnectionClosed
        })
    }

    /// Unlocks and waits for the server; [`Error::LockLost`] if the lock had been lost before or
    /// the server no longer had it.
    pub async fn release(mut self) -> Result<()> {
        let before = self.state();
        let Hold { client, conn, target, leased: Leased { lease, .. }, _renewals, .. } =
            self.hold.take().expect("a guard holds until released");
        let name = target.name.clone();
        drop(_renewals);
        lease.end();
        if let LockState::Lost(reason) = before {
            return Err(Error::LockLost { lock: name, reason }); // dropping the connection frees it
        }
        match crate::background::detach(unlock(client, conn, target)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::LockLost { lock: name, reason: LostReason::ConnectionClosed }),
            Err(e) => Err(e),
        }
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        let Some(Hold { client, conn, target, leased: Leased { lease, .. }, _renewals, .. }) = self.hold.take() else {
            return;
        };
        drop(_renewals);
        lease.end();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let name = target.name.clone();
                if let Err(e) = unlock(client, conn, target).await {
                    tracing::warn!(lock = name, error = %e, "release on drop failed; closing the connection frees it");
                }
            });
        }
    }
}

/// Unlocks on the held connection; true if it was held. The connection goes back to the idle
/// list only after a clean unlock (anything else closes it, which frees whatever it held).
async fn unlock(client: Client, conn: Arc<Conn>, target: Arc<Target>) -> Result<bool> {
    let name = &target.name;
    if let Some(xact) = &target.xact {
        // The transaction's end frees the lock; a server that ended it already closed the
        // connection (the lease ran out), and the lock was lost.
        return match conn.client.simple_query(&xact.release_sql).await {
            Ok(_) => {
                if let Ok(conn) = Arc::try_unwrap(conn) {
                    client.put_back(conn);
                }
                Ok(true)
            }
            Err(_) if conn.is_closed() => Ok(false),
            Err(e) => Err(backend("release", name, e)),
        };
    }
    let r = conn.query(&target.unlock_sql, &target.key.params()).await;
    match r {
        Ok(rows) => {
            let held: bool = rows.first().is_some_and(|r| r.get(0));
            if held {
                match Arc::try_unwrap(conn) {
                    Ok(conn) => client.put_back(conn),
                    Err(_) => tracing::debug!(lock = name, "connection still shared after the release; closing it"),
                }
            }
            Ok(held)
        }
        Err(_) if conn.is_closed() => Ok(false),
        Err(e) => Err(backend("release", name, e)),
    }
}

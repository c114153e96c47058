//! A session-level advisory mutex, fenced by a sequence, on the client's shared connections.

use super::pool::{How, Reserved, Route, Want};
use super::semaphore::RELEASED_CHANNEL;
use super::{backend, AdvisoryKey, Client, Conn, FENCING_GUARD, FENCING_SEQUENCE};
use crate::contract::Wait;
use crate::lease::{Lease, Leased, Renewal};
use crate::{Error, LockState, LostReason, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::SimpleQueryMessage;

/// An exclusive lock on an advisory key, held on one of the client's shared connections (see
/// the [module docs](super#connections)).
///
/// Waiting is done by the server (`pg_advisory_lock`, with `lock_timeout` for a bounded wait), on
/// a connection that holds nothing else while it waits: no polling, and waiters are granted in
/// the order the server queues them; when every connection but one is waiting already, a wait
/// polls instead (see the module docs). Not reentrant: a second acquire through the same handle,
/// or of the same name in the same client, waits like anyone else's (on another connection).
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

/// What a [`Mutex`] locks, and its statements. The statements take the key and the markers as
/// parameters, so that every lock of one shape shares each prepared statement on a connection.
#[derive(Debug)]
struct Target {
    name: String,
    key: AdvisoryKey,
    /// The key and markers, as the pool routes them.
    want: Want,
    /// This lock's last acquire had to wait: the next one waits at once, without a try first.
    contended: AtomicBool,
    /// The markers' integers, as the statements' parameters.
    mark: (i32, i32),
    other: (i32, i32),
    /// A semaphore slot's release notice (its payload: the semaphore's name).
    notify: Option<String>,
    sql: Sql,
    /// `lock_scope=transaction`: the statements of a transaction-scoped lock instead.
    xact: Option<Xact>,
    /// The name's kind marker (see [`Marker`]).
    marker: Marker,
}

/// A session-scoped lock's statements. Parameters: the key (`$1`, or `$1, $2` for a pair),
/// then, where used, our marker, the other kind's marker, the wait's `lock_timeout`, and a
/// slot's release notice.
#[derive(Debug, Default)]
struct Sql {
    /// Marks, looks, tries the lock and, if granted, takes a fencing token: one statement; not
    /// granted, lets the marker go again. Answers `other, token`.
    try_marked: String,
    /// The same on a connection whose session holds our marker already: only the try and the
    /// token.
    try_plain: String,
    /// Marks, looks and waits for the lock (bounded by `lock_timeout`, set in the same statement,
    /// `0` = forever), then takes a fencing token; on a connection that holds nothing else.
    wait: String,
    /// Unlocks, and lets the marker go (no other hold on the connection relies on it).
    unlock_marked: String,
    /// Unlocks only.
    unlock_plain: String,
    /// Undoes whatever a failed `try_marked` may have taken: the lock, our marker, the probe of
    /// the other's (each unlock is answered `false` with a warning if not held). Safe because no
    /// other hold on the connection has these keys.
    undo_marked: String,
    /// Undoes a failed `try_plain`: the lock.
    undo_plain: String,
}

/// Which parameters a statement takes after the key.
#[derive(Debug, Clone, Copy)]
enum Params<'a> {
    Key,
    KeyMark,
    KeyMarks,
    KeyMarksTimeout(&'a String),
}

/// The contract's rule that a semaphore and a mutex or read/write lock cannot share a name
/// ([`Error::KindConflict`]), on advisory keys: each acquire first takes its kind's marker key
/// of the name (shared, so acquires of one kind never refuse each other), then looks for another
/// session holding the other kind's marker, and is refused if one does. Marking before looking
/// means two acquires of different kinds can never both miss each other (whichever looks second
/// has been marked after the first one's mark). The marker is held as long as the lock is held
/// or awaited, and let go with it.
///
/// The look is a probe: `pg_try_advisory_lock` of the other kind's marker, let go at once, is
/// granted only if no other session holds that marker; only when it is not granted does the
/// look read `pg_locks` (which copies the server's whole lock table: 30 ms with 19,000 advisory
/// locks held) for a shared holder of it (a probe is exclusive and never counts). On a shared
/// connection the session already holding our marker (another lock of this name's kind on that
/// connection, such as another permit of the semaphore) has looked when it took it, so a later
/// acquire there neither marks nor looks again.
#[derive(Debug, Clone)]
struct Marker {
    /// Our kind's marker key, as SQL literals.
    ours: String,
    /// The other kind's marker key, as `pg_locks` shows it.
    other: (i64, i64, i64),
    /// Both keys, for the pool's record and the statements' parameters.
    ours_key: AdvisoryKey,
    other_key: AdvisoryKey,
    /// What the other kind is and what we are, in an error's words.
    in_use: &'static str,
    wanted: &'static str,
}

/// A marker key's integers (markers are always integer pairs).
fn pair(key: AdvisoryKey) -> (i32, i32) {
    match key {
        AdvisoryKey::Pair(a, b) => (a, b),
        AdvisoryKey::Single(_) => unreachable!("kind markers are integer pairs"),
    }
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
        Marker {
            ours: ours.sql_literals(),
            other: other.pg_locks_ids(),
            ours_key: ours,
            other_key: other,
            in_use,
            wanted,
        }
    }

    /// Takes our marker (parameters `$m`, `$m+1`; after `after`, a CTE it reads from, if any), as
    /// CTE `m`; then CTE `c`'s `other`: whether another session holds the other kind's
    /// (parameters `$m+2`, `$m+3`).
    fn ctes(m: usize, after: Option<&str>) -> String {
        let from = after.map_or(String::new(), |cte| format!(" FROM {cte}"));
        let (a, b) = (m + 2, m + 3);
        format!(
            "m AS (SELECT pg_advisory_lock_shared(${m}, ${})::text AS x{from}), \
             c AS (SELECT CASE WHEN m.x IS NULL THEN NULL WHEN pg_try_advisory_lock(${a}, ${b}) \
             THEN NOT pg_advisory_unlock(${a}, ${b}) \
             ELSE EXISTS (SELECT 1 FROM pg_catalog.pg_locks k WHERE k.locktype = 'advisory' AND k.granted \
             AND k.mode = 'ShareLock' AND k.pid <> pg_backend_pid() AND k.objsubid = 2 \
             AND k.classid::bigint = (${a}::bigint & 4294967295) AND k.objid::bigint = (${b}::bigint & 4294967295)) \
             END AS other FROM m)",
            m + 1
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
             AND k.mode = 'ShareLock' AND k.pid <> pg_backend_pid() AND k.classid::bigint = {a} \
             AND k.objid::bigint = {b} AND k.objsubid::bigint = {c})::text, true)",
            self.ours
        )
    }

    /// The condition a transaction's lock statement runs under.
    const UNLESS_OTHER: &'static str = " WHERE current_setting('distlock.kind_conflict') = 'false'";

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
        let marker = Marker::new(&name, true, false);
        Mutex::with_marker(client, name, key, false, marker, true)
    }

    /// `shared`: a read side of a [`RwLock`](super::RwLock), the shared advisory lock on the key.
    pub(crate) fn new(client: Client, name: String, key: AdvisoryKey, shared: bool) -> Mutex {
        let marker = Marker::new(&name, false, shared);
        Mutex::with_marker(client, name, key, shared, marker, false)
    }

    fn with_marker(client: Client, name: String, key: AdvisoryKey, shared: bool, marker: Marker, slot: bool) -> Mutex {
        let (args, suffix, n) = (key.sql_args(1), if shared { "_shared" } else { "" }, key.arity());
        // The token is taken after the grant (`nextval` runs on `l`'s row, or in the THEN arm),
        // under the fencing guard's shared lock (see FENCING_SEQUENCE), held to the statement's end.
        let (g1, g2) = FENCING_GUARD;
        let token =
            format!("SELECT nextval('{FENCING_SEQUENCE}') FROM (SELECT pg_advisory_xact_lock_shared({g1}, {g2})::text");
        // Our marker is `$m, $m+1` after the key.
        let m = n + 1;
        let unmark = format!("pg_advisory_unlock_shared(${m}, ${})", m + 1);
        // Each answers `other` (the name is in use as the other kind: nothing was tried) and the
        // token if granted; not granted, the marker is let go in the same statement.
        let answer =
            format!("SELECT c.other, t.token, CASE WHEN t.token IS NULL THEN {unmark} END FROM c LEFT JOIN t ON true");
        // A slot's release tells the semaphore's waiters (`$p`, after the key and any marker).
        let notice = |p: usize| {
            if slot {
                format!(" FROM (SELECT pg_notify('{RELEASED_CHANNEL}', ${p}::text)) n")
            } else {
                String::new()
            }
        };
        let sql = Sql {
            try_marked: format!(
                "WITH {}, t(token) AS (SELECT CASE WHEN pg_try_advisory_lock{suffix}({args}) THEN ({token}) f) END \
                 FROM c WHERE NOT c.other) {answer}",
                Marker::ctes(m, None)
            ),
            try_plain: format!("SELECT false, CASE WHEN pg_try_advisory_lock{suffix}({args}) THEN ({token}) f) END"),
            wait: format!(
                "WITH s AS (SELECT set_config('lock_timeout', ${}, true)), {}, \
                 l AS (SELECT pg_advisory_lock{suffix}({args})::text FROM c WHERE NOT c.other), \
                 t(token) AS ({token} FROM l) f) {answer}",
                n + 5,
                Marker::ctes(m, Some("s"))
            ),
            unlock_marked: format!(
                "WITH u AS (SELECT pg_advisory_unlock{suffix}({args}) AS held{}) SELECT held, {unmark} FROM u",
                notice(n + 3)
            ),
            unlock_plain: format!(
                "WITH u AS (SELECT pg_advisory_unlock{suffix}({args}) AS held{}) SELECT held FROM u",
                notice(n + 1)
            ),
            undo_marked: format!(
                "SELECT pg_advisory_unlock{suffix}({args}), {unmark}, pg_advisory_unlock(${}, ${})",
                m + 2,
                m + 3
            ),
            undo_plain: format!("SELECT pg_advisory_unlock{suffix}({args})"),
        };
        let xact = (client.url().scope == super::LockScope::Transaction).then(|| {
            let payload = name.replace('\\', "\\\\").replace('\'', "''");
            Xact {
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
                // An escape-string literal (E'...'): its backslashes and quotes doubled, it means
                // the same whatever `standard_conforming_strings` says.
                release_sql: if slot {
                    format!("SELECT pg_notify('{RELEASED_CHANNEL}', E'{payload}'); COMMIT")
                } else {
                    "COMMIT".to_string()
                },
            }
        });
        let want = Want { key, mark: marker.ours_key, other: marker.other_key };
        let target = Target {
            want,
            contended: AtomicBool::new(false),
            mark: pair(marker.ours_key),
            other: pair(marker.other_key),
            notify: slot.then(|| name.clone()),
            sql,
            xact,
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
        if self.target.xact.is_some() {
            return self.acquire_dedicated(wait).await;
        }
        acquire_shared(self.client.clone(), self.target.clone(), wait).await
    }

    /// `lock_scope=transaction`: a connection (and a transaction) of its own for the lock.
    async fn acquire_dedicated(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        let conn = self.client.checkout().await?;
        let cancel = (conn.client.cancel_token(), conn.cancelled.clone(), self.client.tls());
        let (client, target) = (self.client.clone(), self.target.clone());
        let attempt = async move {
            let xact = target.xact.as_ref().expect("a transaction-scoped lock");
            acquire_in_transaction(client, conn, target.clone(), xact, wait).await
        };
        Cancelling { fut: Some(Box::pin(attempt)), cancel: Some(cancel), runtime: self.client.runtime() }.await
    }
}

impl Target {
    /// The parameters of a statement: the key, then `more`.
    fn params<'a>(&'a self, more: Params<'a>) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        let mut p = self.key.params();
        let (int4, text) = (Type::INT4, Type::TEXT);
        if !matches!(more, Params::Key) {
            p.extend([(&self.mark.0 as &(dyn ToSql + Sync), int4.clone()), (&self.mark.1, int4.clone())]);
        }
        if matches!(more, Params::KeyMarks | Params::KeyMarksTimeout(_)) {
            p.extend([(&self.other.0 as &(dyn ToSql + Sync), int4.clone()), (&self.other.1, int4)]);
        }
        if let Params::KeyMarksTimeout(ms) = more {
            p.push((ms as &(dyn ToSql + Sync), text.clone()));
        }
        p
    }

    /// A release's parameters (a slot's notice last).
    fn unlock_params(&self, with_mark: bool) -> Vec<(&(dyn ToSql + Sync), Type)> {
        let mut p = self.params(if with_mark { Params::KeyMark } else { Params::Key });
        if let Some(payload) = &self.notify {
            p.push((payload as &(dyn ToSql + Sync), Type::TEXT));
        }
        p
    }
}

/// An acquire on the client's shared connections (see the pool's module docs): a try on the
/// connection with the most locks (so that the others stay free for waits); refused, for a
/// wait, `pg_advisory_lock` on a connection that holds nothing, taken for it alone (at once, with
/// no try first, when this lock's last acquire had to wait); with none to be had, a try again
/// whenever a local holder of the key lets it go, and on a timer (doubling from 5 ms to
/// `rescan`).
async fn acquire_shared(client: Client, target: Arc<Target>, wait: Wait) -> Result<Option<MutexGuard>> {
    let pool = client.pool().clone();
    let waits = !matches!(wait, Wait::Never);
    let deadline = wait.deadline();
    // The wake-ups of a key or marker let go here, or a connection come or gone: made once the
    // acquire has to wait (most never do).
    let mut wakes: Option<[Arc<Notify>; 2]> = None;
    let mut how = if waits && target.contended.load(Ordering::Relaxed) { How::Wait } else { How::Try };
    // Whether the next refused try is the first (then the wait follows at once) or a poll's.
    let mut first = true;
    let mut pause = Duration::from_millis(5);
    loop {
        // Listening before routing: a change after the routing's look wakes this.
        let now_waking = wakes.clone();
        let listening = now_waking.as_ref().map(|[k, m]| {
            let mut all = [Box::pin(k.notified()), Box::pin(m.notified()), Box::pin(pool.changed().notified())];
            for n in &mut all {
                n.as_mut().enable();
            }
            all
        });
        let mut idle = false;
        match pool.route(&target.want, how) {
            Route::Conflict => return Err(target.marker.conflict(&target.name)),
            Route::On(r) if r.exclusive => {
                let cancel = (r.conn.client.cancel_token(), r.conn.cancelled.clone(), client.tls());
                let step = wait_on(client.clone(), target.clone(), r, wait);
                let runtime = client.runtime();
                return Cancelling { fut: Some(Box::pin(step)), cancel: Some(cancel), runtime }.await;
            }
            Route::On(r) => {
                // Never cancelled (the connection's other statements could be hit): finished in
                // the background if dropped.
                let attempt = try_on(client.clone(), target.clone(), r);
                if let Some(g) = crate::background::detach_on(client.runtime(), attempt).await? {
                    if first {
                        target.contended.store(false, Ordering::Relaxed);
                    }
                    return Ok(Some(g));
                }
                if !waits {
                    return Ok(None);
                }
                target.contended.store(true, Ordering::Relaxed);
                idle = !std::mem::take(&mut first);
                how = How::Wait;
            }
            Route::Open => {
                crate::background::detach_on(client.runtime(), {
                    let client = client.clone();
                    async move { client.open_into_pool().await }
                })
                .await?;
                continue;
            }
            Route::Busy if !waits => return Ok(None),
            Route::Busy => match how {
                // No connection free to wait on: poll, a try now.
                How::Wait => {
                    how = How::Try;
                    first = false;
                }
                // Every connection has the key (local holders): wait for one to let it go.
                How::Try => {
                    idle = true;
                    how = How::Wait;
                }
            },
            Route::Changing => idle = true,
        }
        if !idle {
            continue;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        let Some([k, m, c]) = listening else {
            // Listen, then look again at once.
            wakes = Some([pool.wake_for(target.want.key), pool.wake_for(target.want.mark)]);
            continue;
        };
        let until = deadline.map_or(now + pause, |d| d.min(now + pause));
        pause = (pause * 2).min(client.url().rescan);
        tokio::select! {
            _ = k => {}
            _ = m => {}
            _ = c => {}
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}

/// The answer of an acquire statement: `(other, token)`.
fn answer(rows: &[tokio_postgres::Row]) -> (bool, Option<i64>) {
    rows.first().map_or((false, None), |r| (r.get::<_, Option<bool>>(0).unwrap_or(false), r.get(1)))
}

/// A try reserved on a shared connection: granted, a guard; not, its key (and marker) leave the
/// connection's record; failed, the unlocks that undo it first (or, if even they fail, the
/// connection is closed, the only sure way).
async fn try_on(client: Client, target: Arc<Target>, r: Reserved) -> Result<Option<MutexGuard>> {
    let pool = client.pool().clone();
    let (sql, params) = if r.takes_mark {
        (&target.sql.try_marked, target.params(Params::KeyMarks))
    } else {
        (&target.sql.try_plain, target.params(Params::Key))
    };
    let sent = Instant::now();
    let rows = r.conn.query(sql, &params).await;
    match rows.map(|rows| answer(&rows)) {
        Ok((true, _)) => {
            not_granted(&client, &r, &target).await;
            Err(target.marker.conflict(&target.name))
        }
        Ok((false, Some(token))) => {
            let lease = pool.granted(&r, &target.want, sent);
            Ok(Some(MutexGuard::shared(client, r.conn, target, token as u64, sent, lease)))
        }
        Ok((false, None)) => {
            not_granted(&client, &r, &target).await;
            Ok(None)
        }
        Err(e) => {
            let error = backend("acquire", &target.name, e);
            if r.conn.is_closed() {
                pool.retire(&r.conn);
                return Err(error);
            }
            let (undo, params) = if r.takes_mark {
                (&target.sql.undo_marked, target.params(Params::KeyMarks))
            } else {
                (&target.sql.undo_plain, target.params(Params::Key))
            };
            match r.conn.query(undo, &params).await {
                Ok(_) => not_granted(&client, &r, &target).await,
                Err(e) => {
                    tracing::debug!(lock = target.name, error = %e, "undoing a failed acquire failed; closing its connection");
                    pool.retire(&r.conn);
                }
            }
            Err(error)
        }
    }
}

/// Records an acquire not granted; lets go of a marker it relied on that nothing needs now.
async fn not_granted(client: &Client, r: &Reserved, target: &Target) {
    let pool = client.pool();
    if let Some(conn) = pool.not_granted(r, &target.want) {
        let unlocked = conn
            .query("SELECT pg_advisory_unlock_shared($1, $2)", &target.params(Params::KeyMark)[target.key.arity()..])
            .await;
        pool.mark_unlocked(&conn, target.want.mark, unlocked.is_ok());
    }
}

/// A wait on a connection that holds nothing else, taken for it alone: `pg_advisory_lock` under
/// `lock_timeout`. A timeout (or a kind conflict) leaves the connection empty again; anything
/// else closes it, which frees whatever the statement took.
async fn wait_on(client: Client, target: Arc<Target>, r: Reserved, wait: Wait) -> Result<Option<MutexGuard>> {
    let pool = client.pool().clone();
    // `0` waits forever; so does anything past what lock_timeout can hold (~24 days).
    let ms = match wait.timeout().map(|w| w.as_millis()) {
        Some(ms) if ms <= i32::MAX as u128 => ms.max(1).to_string(),
        _ => "0".to_string(),
    };
    let sent = Instant::now();
    let rows = r.conn.query(&target.sql.wait, &target.params(Params::KeyMarksTimeout(&ms))).await;
    match rows.map(|rows| answer(&rows)) {
        Ok((true, _)) => {
            pool.not_granted(&r, &target.want);
            Err(target.marker.conflict(&target.name))
        }
        Ok((false, Some(token))) => {
            let bound = client.url().server_bound();
            let ping = async {
                r.conn
                    .client
                    .simple_query("")
                    .await
                    .map(|_| ())
                    .map_err(|e| backend("acquire (session check after the wait)", &target.name, e))
            };
            match crate::lease::fresh_after_wait(sent, bound, &target.name, ping).await {
                Ok(confirmed) => {
                    let lease = pool.granted(&r, &target.want, confirmed);
                    Ok(Some(MutexGuard::shared(client, r.conn, target, token as u64, confirmed, lease)))
                }
                Err(e) => {
                    pool.retire(&r.conn); // frees the lock
                    Err(e)
                }
            }
        }
        Ok((false, None)) => {
            pool.not_granted(&r, &target.want);
            Ok(None)
        }
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            // lock_timeout ran out. The lock may have been granted just as the timeout fired;
            // the connection holds nothing else, so everything it holds is let go.
            match r.conn.client.simple_query("SELECT pg_advisory_unlock_all()").await {
                Ok(_) => {
                    pool.not_granted(&r, &target.want);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "unlock after a lock timeout failed; closing");
                    pool.retire(&r.conn);
                }
            }
            Ok(None)
        }
        Err(e) => {
            pool.retire(&r.conn);
            Err(backend("acquire", &target.name, e))
        }
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
    Ok(Some(MutexGuard::dedicated(client, conn, target, token, confirmed)))
}

/// An acquire in flight: if dropped unfinished, its statement is cancelled on the server (again
/// every 200 ms until the attempt ends, since a cancel that arrives before the statement starts
/// is ignored) and the attempt finished in the background: a lock granted meanwhile is released
/// by its guard's drop, and the connection is never reused (a late cancel could hit later work).
struct Cancelling<T: Send + 'static> {
    fut: Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
    cancel: Option<(tokio_postgres::CancelToken, Arc<AtomicBool>, tokio_postgres_rustls::MakeRustlsConnect)>,
    /// Where the cancel and the attempt's end run: the current runtime, else the client's (an
    /// acquire dropped on a thread outside any runtime would otherwise leave its wait queued on
    /// the server, and a grant nobody releases).
    runtime: tokio::runtime::Handle,
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
        let runtime = tokio::runtime::Handle::try_current().unwrap_or_else(|_| self.runtime.clone());
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
    /// `lock_scope=transaction`: its place in the client's renewals, a health check of its own
    /// connection every sixth of the lease (ended when dropped). On a shared connection the
    /// connection's checks renew every hold on it, and this is `None`.
    _renewals: Option<crate::watchdog::Ticket>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("target", &self.target).field("token", &self.token).finish()
    }
}

impl MutexGuard {
    /// A lock held on a shared connection, under `lease` (the connection's, followed), or born
    /// lost if there is none (the connection went as the lock was granted).
    fn shared(
        client: Client,
        conn: Arc<Conn>,
        target: Arc<Target>,
        token: u64,
        sent: Instant,
        lease: Option<Arc<Lease>>,
    ) -> MutexGuard {
        let lease = lease.unwrap_or_else(|| {
            client.pool().retire(&conn);
            let lease = Arc::new(Lease::new(sent, client.url().server_bound(), "postgres"));
            lease.publish(LockState::Lost(LostReason::ConnectionClosed), &target.name);
            lease
        });
        let holder = format!("advisory:{}", target.key);
        let leased = Leased::new(target.name.clone(), lease);
        MutexGuard { hold: Some(Hold { client, conn, target, holder, token, leased, _renewals: None }) }
    }

    /// A transaction-scoped lock (`lock_scope=transaction`) held on a connection of its own.
    fn dedicated(client: Client, conn: Conn, target: Arc<Target>, token: u64, sent: Instant) -> MutexGuard {
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
        MutexGuard { hold: Some(Hold { client, conn, target, holder, token, leased, _renewals: Some(renewals) }) }
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
            let_go_of_lost(client, conn, target);
            return Err(Error::LockLost { lock: name, reason });
        }
        let runtime = client.runtime();
        match crate::background::detach_on(runtime, unlock(client, conn, target)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::LockLost { lock: name, reason: LostReason::ConnectionClosed }),
            Err(e) => Err(e),
        }
    }
}

/// What becomes of a lost lock at its release. Its own connection (`lock_scope=transaction`) is
/// dropped, which frees it. A shared connection whose holds are lost is closed (every hold on it
/// was told); if only this hold saw its deadline pass (the connection's renewal was being
/// confirmed that moment), it is unlocked as usual.
fn let_go_of_lost(client: Client, conn: Arc<Conn>, target: Arc<Target>) {
    if target.xact.is_some() {
        return; // dropping the connection frees it
    }
    if client.pool().is_lost(&conn) {
        client.pool().retire(&conn);
        return;
    }
    client.runtime().spawn(async move {
        let _ = unlock(client, conn, target).await;
    });
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        let Some(Hold { client, conn, target, leased: Leased { lease, .. }, _renewals, .. }) = self.hold.take() else {
            return;
        };
        drop(_renewals);
        let lost = lease.state(&target.name).is_lost();
        lease.end();
        if lost {
            return let_go_of_lost(client, conn, target);
        }
        // On the client's runtime if dropped outside any: the lock would otherwise stay held on
        // a connection other locks keep open.
        client.runtime().spawn(async move {
            let name = target.name.clone();
            if let Err(e) = unlock(client, conn, target).await {
                tracing::warn!(lock = name, error = %e, "release on drop failed; closing the connection frees it");
            }
        });
    }
}

/// Unlocks on the held connection; true if it was held.
async fn unlock(client: Client, conn: Arc<Conn>, target: Arc<Target>) -> Result<bool> {
    if target.xact.is_some() {
        return unlock_dedicated(client, conn, target).await;
    }
    let pool = client.pool().clone();
    let name = &target.name;
    // Gone from the pool: closed with its connection, which freed the lock.
    let Some(with_mark) = pool.release_begin(&conn, &target.want) else { return Ok(false) };
    let sql = if with_mark { &target.sql.unlock_marked } else { &target.sql.unlock_plain };
    let params = target.unlock_params(with_mark);
    let held = |rows: Vec<tokio_postgres::Row>| rows.first().is_some_and(|r| r.get::<_, bool>(0));
    let mut answer = conn.query(sql, &params).await.map(held);
    if answer.is_err() && !conn.is_closed() {
        // Once more: no other hold on this connection has the key (or, if this lets it go, the
        // marker), so a second unlock is safe. Its answer is the release's: `false` (the first
        // did run, or the lock was not held) cannot be told from a lock lost, and is reported so.
        answer = conn.query(sql, &params).await.map(held);
    }
    match answer {
        Ok(held) => {
            pool.release_done(&conn, &target.want, with_mark);
            Ok(held)
        }
        Err(_) if conn.is_closed() => {
            pool.retire(&conn);
            Ok(false)
        }
        Err(e) => {
            // Its effect unknown twice: only the connection's end surely lets the lock go.
            pool.retire(&conn);
            Err(backend("release", name, e))
        }
    }
}

/// Unlocks on a connection of the lock's own. It goes back to the idle list only after a clean
/// unlock (anything else closes it, which frees whatever it held).
async fn unlock_dedicated(client: Client, conn: Arc<Conn>, target: Arc<Target>) -> Result<bool> {
    let name = &target.name;
    let xact = target.xact.as_ref().expect("a transaction-scoped lock");
    // The transaction's end frees the lock; a server that ended it already closed the
    // connection (the lease ran out), and the lock was lost.
    match conn.client.simple_query(&xact.release_sql).await {
        Ok(_) => {
            if let Ok(conn) = Arc::try_unwrap(conn) {
                client.put_back(conn);
            }
            Ok(true)
        }
        Err(_) if conn.is_closed() => Ok(false),
        Err(e) => Err(backend("release", name, e)),
    }
}

//! The SQLite backend: a lease table, for processes on one host that share a database file and
//! no lock server.
//!
//! # Layout
//!
//! One row per lock in table `distlock_leases` (or `?table=`), with ShedLock's columns, so
//! ShedLock's tooling and people who know it can read it, plus a fencing column:
//!
//! | Column | Meaning |
//! |---|---|
//! | `name` | the lock's name (primary key) |
//! | `lock_until` | the lease's end, UTC, `YYYY-MM-DD HH:MM:SS.SSS` (SQLite's clock) |
//! | `locked_at` | when the holder took it |
//! | `locked_by` | the holder: `host:pid:random` |
//! | `fencing_token` | one more than the table's fencing counter and the row's last token, and at least the clock in µs |
//!
//! The fencing counter is one row of table `distlock_leases_fencing` (`<table>_fencing`), moved up
//! by triggers whenever a lock row gets a token: a lock row deleted by hand does not bring an old
//! token back, and neither does a deleted counter while the lock rows stand. Every token is also
//! at least the machine's clock in microseconds (milliseconds × 1,000), so a database file
//! restored from an older copy does not bring old tokens back either (tokens rise by one within a
//! millisecond and jump to the clock across milliseconds).
//!
//! A lock is free when `lock_until <= now`. Taking it is one upsert that succeeds only if the row
//! is missing or expired, and advances the token; the client's watchdog extends `lock_until` of
//! every row it holds every third of the lease, in one statement for up to 10,000 rows, while
//! each row is still ours; a release sets `lock_until` to now. Rows are never deleted by
//! distlock.
//!
//! # Leases and loss
//!
//! Nothing notices a holder that died: its lease runs out and the next acquire takes the row over.
//! So the guard's [`lease_deadline`](MutexGuard::lease_deadline) is the send time of its last
//! confirmed extension plus the lease, less a drift margin, and [`lost`](MutexGuard::lost)
//! resolves there if no extension was confirmed since (a stalled disk, a paused process), or at
//! once when an extension finds the row taken over.
//!
//! # Waiting
//!
//! SQLite has no way to wait for a row. The acquires of one process (every client of the same
//! database file and table) queue in a FIFO first, and only the queue's head asks the database:
//! it goes as soon as the previous local holder's release has reached the file (or its lease was
//! lost), and a holder that asks again queues behind the others. A head that finds the row held
//! by another process retries, 2 ms at first, doubling to 50 ms; across processes there is no
//! order.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! let db = distlock::sqlite::Client::connect("sqlite:///var/lib/app/locks.db?lease=10s").await?;
//! let guard = db.mutex("nightly-report")?.lock().await?;
//! println!("token {}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub(crate) mod contract;
mod election;
mod jobs;
mod mutex;
mod url;

pub use mutex::{LeaseView, Mutex, MutexGuard};
pub use url::SqliteUrl;

use crate::{Error, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};
use std::time::Duration;

/// A SQLite database file to take leases in. Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// let db = distlock::sqlite::Client::connect("sqlite://locks.db").await?;
/// if let Some(g) = db.mutex("reports")?.try_lock().await? {
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: SqliteUrl,
    pool: SqlitePool,
    sql: Statements,
    /// Renews every hold of this client, a statement for up to [`mutex::RENEW_TOGETHER`] of them.
    watchdog: Arc<crate::watchdog::Watchdog<mutex::Renew>>,
    /// The database file itself, however its path was written (relative, through a link): the
    /// key of this process's queues.
    file: std::path::PathBuf,
}

/// The table's statements, with its name in them.
#[derive(Debug)]
struct Statements {
    acquire: String,
    extend: String,
    release: String,
    view: String,
    list: String,
}

/// The least fencing token an acquire may hand out now: the machine's real-time clock in
/// microseconds (whole milliseconds times 1,000), read by the system call as the job store reads
/// it (libfaketime in a client does not move it).
///
/// Why it is sound: every token is at least the floor of its own grant and one more than the last
/// one, so a token handed out in millisecond `m` is below `(m + 1) × 1000` unless a thousand grants
/// were written to the file within one millisecond (each is a write transaction: far slower). A
/// file restored from an older copy forgets the tokens handed out since the copy; the next grant,
/// at least a millisecond after them, is floored above every one of them. It needs the clock not
/// to step back across the restore, as PostgreSQL's and MariaDB's floors do.
pub(crate) fn fencing_floor() -> i64 {
    kernel_now_ms().saturating_mul(1000)
}

/// The machine's real-time clock by the system call (not libc's, which libfaketime replaces), in
/// milliseconds since the epoch.
pub(crate) fn kernel_now_ms() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to the pointer given, which is valid.
    let rc = unsafe { libc::syscall(libc::SYS_clock_gettime, libc::CLOCK_REALTIME, &mut ts as *mut libc::timespec) };
    if rc != 0 {
        return crate::schedule::epoch_ms(std::time::SystemTime::now());
    }
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// `strftime` of SQLite's clock now, and `?3` (a modifier such as `+30.000 seconds`) later.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
const UNTIL: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?3)";
/// A row's `lock_until` in Unix milliseconds.
const UNTIL_MS: &str = "CAST(round((julianday(lock_until) - 2440587.5) * 86400000.0) AS INTEGER)";

impl Statements {
    fn new(t: &str) -> Statements {
        Statements {
            // ?1 name, ?2 holder, ?3 the lease as a modifier, ?4 the clock floor (see
            // `fencing_floor`; unbound, none).
            // The token is one more than both the table's counter (kept apart from the lock
            // rows, so deleting a row cannot bring a token back) and the row's own last token
            // (so a deleted counter cannot either), and at least the clock floor (so a file
            // restored from an older copy cannot either); a trigger moves the counter up. The
            // lease's end comes back in Unix milliseconds: the statement may have waited for the
            // file lock, and the lease runs from when it ran, not from when it was sent.
            acquire: format!(
                "INSERT INTO {t} (name, lock_until, locked_at, locked_by, fencing_token) \
                 VALUES (?1, {UNTIL}, {NOW}, ?2, \
                 max(coalesce((SELECT token FROM {t}_fencing WHERE id = 1), 0) + 1, coalesce(?4, 0))) \
                 ON CONFLICT (name) DO UPDATE SET lock_until = excluded.lock_until, \
                 locked_at = excluded.locked_at, locked_by = excluded.locked_by, \
                 fencing_token = max(excluded.fencing_token, {t}.fencing_token + 1) \
                 WHERE {t}.lock_until <= excluded.locked_at \
                 RETURNING fencing_token, {UNTIL_MS}"
            ),
            // ?1 a JSON array of [name, holder] pairs, ?2 the lease as a modifier: every row of
            // the list still ours (unexpired, our holder) extended at one instant, in one
            // statement; the rows extended come back.
            extend: format!(
                "UPDATE {t} SET lock_until = strftime('%Y-%m-%d %H:%M:%f', 'now', ?2) \
                 FROM (SELECT json_extract(value, '$[0]') AS n, json_extract(value, '$[1]') AS h \
                 FROM json_each(?1)) AS ours \
                 WHERE {t}.name = ours.n AND {t}.locked_by = ours.h AND {t}.lock_until > {NOW} \
                 RETURNING {t}.name, {t}.locked_by"
            ),
            release: format!(
                "UPDATE {t} SET lock_until = {NOW} WHERE name = ?1 AND locked_by = ?2 AND lock_until > {NOW}"
            ),
            view: format!(
                "SELECT locked_by, locked_at, lock_until, fencing_token, lock_until > {NOW} FROM {t} WHERE name = ?1"
            ),
            // ?1 the prefix, ?2 the most rows. Held rows only, with the hold's age and the time
            // left on its lease in milliseconds.
            list: format!(
                "SELECT name, locked_by, fencing_token, \
                 CAST(round((julianday('now') - julianday(locked_at)) * 86400000.0) AS INTEGER), \
                 CAST(round((julianday(lock_until) - julianday('now')) * 86400000.0) AS INTEGER) \
                 FROM {t} WHERE lock_until > {NOW} AND substr(name, 1, length(?1)) = ?1 ORDER BY name LIMIT ?2"
            ),
        }
    }
}

/// The statements that make the lease table `t` and its fencing counter where missing
/// (`setup=auto`); each is idempotent, so clients opening at once may all run them.
fn setup_statements(t: &str) -> [String; 5] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (name VARCHAR(64) NOT NULL PRIMARY KEY, \
             lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, locked_by VARCHAR(255) NOT NULL, \
             fencing_token BIGINT NOT NULL)"
        ),
        // The fencing counter, apart from the lock rows (a table made by an older version
        // starts from its rows' highest token).
        format!(
            "CREATE TABLE IF NOT EXISTS {t}_fencing (id INTEGER PRIMARY KEY CHECK (id = 1), token BIGINT NOT NULL)"
        ),
        format!("INSERT OR IGNORE INTO {t}_fencing (id, token) SELECT 1, coalesce(max(fencing_token), 0) FROM {t}"),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {t}_fencing_up AFTER UPDATE OF fencing_token ON {t} \
             BEGIN UPDATE {t}_fencing SET token = NEW.fencing_token WHERE id = 1 AND token < NEW.fencing_token; END"
        ),
        format!(
            "CREATE TRIGGER IF NOT EXISTS {t}_fencing_new AFTER INSERT ON {t} \
             BEGIN INSERT INTO {t}_fencing (id, token) VALUES (1, NEW.fencing_token) \
             ON CONFLICT (id) DO UPDATE SET token = max(token, excluded.token); END"
        ),
    ]
}

impl Client {
    /// Opens (creating if missing, unless the URL says `setup=no`) the database named by a
    /// `sqlite://` URL (see [`SqliteUrl`]) and creates the lease table if missing.
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_common(url, &Default::default()).await
    }

    /// As [`connect`](Self::connect), with `over`'s values (from [`crate::ConnectOptions`]) in
    /// place of the URL's.
    pub(crate) async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
        Client::connect_url(SqliteUrl::parse_with(url, over)?).await
    }

    /// Opens with a parsed URL.
    pub async fn connect_url(url: SqliteUrl) -> Result<Client> {
        let failed = |reason: String| Error::Connect { url: url.to_string(), reason };
        if !url.setup && !url.path.exists() {
            return Err(failed(format!(
                "no database file {} (setup=no makes nothing: is the path right?)",
                url.path.display()
            )));
        }
        let options = SqliteConnectOptions::new()
            .filename(&url.path)
            .create_if_missing(url.setup)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(url.busy_timeout);
        let options = sqlx::ConnectOptions::disable_statement_logging(options);
        let t = &url.table;
        let create = setup_statements(t);
        // Switching a new file to WAL needs the file to itself for a moment, before the busy
        // timeout is in force: clients opening at once retry (with a bound) instead of failing.
        let give_up = tokio::time::Instant::now() + url.busy_timeout.min(url.connect_timeout);
        let open = async {
            loop {
                let opened = async {
                    let pool = SqlitePoolOptions::new()
                        .max_connections(4)
                        .acquire_timeout(url.busy_timeout)
                        .connect_with(options.clone())
                        .await?;
                    // With setup=no nothing is made (a missing table is said below).
                    for statement in create.iter().filter(|_| url.setup) {
                        sqlx::query(statement).execute(&pool).await?;
                    }
                    Ok::<_, sqlx::Error>(pool)
                };
                match opened.await {
                    Ok(pool) => break Ok(pool),
                    Err(e) if busy(&e) && tokio::time::Instant::now() < give_up => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(e) => return Err(failed(format!("opening the database and table {t}: {e}"))),
                }
            }
        };
        let pool = tokio::time::timeout(url.connect_timeout, open)
            .await
            .map_err(|_| failed(format!("opening took longer than connect_timeout ({:?})", url.connect_timeout)))??;
        if !url.setup {
            let tables: i64 =
                sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1")
                    .bind(t)
                    .fetch_one(&pool)
                    .await
                    .map_err(|e| failed(format!("looking for the table {t}: {e}")))?;
            if tables == 0 {
                pool.close().await;
                return Err(Error::NotSetUp { url: url.to_string(), what: format!("the lease table {t}") });
            }
        }
        let sql = Statements::new(t);
        let file = std::fs::canonicalize(&url.path).unwrap_or_else(|_| url.path.clone());
        let watchdog = Arc::new(crate::watchdog::Watchdog::new(url.lease / 3));
        Ok(Client { inner: Arc::new(Inner { url, pool, sql, watchdog, file }) })
    }

    /// The connection pool (for the election's statements).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// The URL this client opened.
    pub fn url(&self) -> &SqliteUrl {
        &self.inner.url
    }

    /// The acquire and release statements of the lease table (`?1` name, `?2` holder, `?3` the
    /// lease as a modifier such as `+30.000 seconds`; the acquire's `?4`, the fencing floor, may
    /// be left unbound), for measuring the table's own floor.
    #[doc(hidden)]
    pub fn lease_statements(&self) -> (&str, &str) {
        (&self.inner.sql.acquire, &self.inner.sql.release)
    }

    /// The lease: how long a holder that stopped extending keeps the lock.
    pub fn lease(&self) -> Duration {
        self.inner.url.lease
    }

    /// A mutex on lock `name` (any non-empty name of at most 64 characters, ShedLock's limit).
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        crate::sql::check_lock_name(name, 64, "a lock name (the table's name column)")?;
        Ok(Mutex::new(self.clone(), name.to_string()))
    }

    /// Closes the database's connections.
    pub async fn close(self, _bound: Duration) {
        self.inner.pool.close().await;
    }

    /// This process's queue for lock `name` of this table, shared by every client of the same
    /// database file: local acquires take it in turn (FIFO), so a holder that releases and asks
    /// again queues behind the others instead of winning the row back at once, and only the
    /// queue's head asks the database.
    fn gate(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        /// The queues by file, table and name, and the size at which the unused ones go next.
        type Gates = (HashMap<String, Weak<tokio::sync::Mutex<()>>>, usize);
        static GATES: OnceLock<StdMutex<Gates>> = OnceLock::new();
        let key = format!("{}\0{}\0{name}", self.inner.file.display(), self.inner.url.table);
        let mut gates = GATES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        let (map, prune_at) = &mut *gates;
        if let Some(g) = map.get(&key).and_then(Weak::upgrade) {
            return g;
        }
        // The unused queues go once the map has doubled since the last sweep: a sweep at every
        // new name would cost each acquire a pass over every lock held (10,000 held, 10,000
        // entries a pass).
        if map.len() >= *prune_at {
            map.retain(|_, w| w.strong_count() > 0);
            *prune_at = (map.len() * 2).max(64);
        }
        let g = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(key, Arc::downgrade(&g));
        g
    }
}

/// SQLite's "database is locked" (SQLITE_BUSY, 5) or "database table is locked" (6).
fn busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("5") | Some("6")))
}

pub(crate) fn backend(op: &'static str, name: &str, e: sqlx::Error) -> Error {
    Error::Backend { op, path: name.to_string(), source: Box::new(e) }
}

impl Client {
    /// The lock `name` as [`Client::locks`] shows each, or free with its row's last token (for
    /// [`crate::Client::inspect`]).
    pub(crate) async fn one_lock(&self, name: &str) -> Result<crate::listing::Listing> {
        use crate::listing::{Found, Listing};
        let last_token = self.mutex(name)?.inspect().await?.map(|row| row.fencing_token);
        let listing = self.locks(name).await?;
        let found = listing.locks.into_iter().find(|l| l.name == name);
        let found = found.map_or(Found::Free { recipe: "lease", last_token }, Found::Lock);
        Ok(Listing::one("sqlite", name, found, listing.unseen))
    }

    /// Every lock whose name starts with `prefix` and whose lease row is held now, with its
    /// holder, token, hold time and lease left. Waiters poll the row, so none are recorded.
    pub async fn locks(&self, prefix: &str) -> Result<crate::listing::Listing> {
        use crate::listing::{Entry, Listing, LockInfo, MAX_LOCKS};
        let rows: Vec<(String, String, i64, i64, i64)> = sqlx::query_as(&self.inner.sql.list)
            .bind(prefix)
            .bind(MAX_LOCKS as i64 + 1)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| backend("list locks", prefix, e))?;
        let truncated = rows.len() > MAX_LOCKS;
        let locks = rows
            .into_iter()
            .take(MAX_LOCKS)
            .map(|(name, holder, token, held_ms, left_ms)| {
                let mut e = Entry::new(true, "exclusive", owner_of_holder(&holder), holder);
                e.since_ms = Some(held_ms.max(0) as u64);
                e.token = Some(token as u64);
                e.lease_left_ms = Some(left_ms.max(0) as u64);
                LockInfo {
                    name,
                    recipe: "lease".into(),
                    permits: None,
                    last_token: Some(token as u64),
                    entries: vec![e],
                }
            })
            .collect();
        Ok(Listing {
            backend: "sqlite",
            prefix: prefix.to_string(),
            locks,
            truncated,
            unseen: vec!["waiters: they poll the lease row, which records only its holder".into()],
        })
    }
}

/// `host pid N` from a `host:pid:…` holder string (SQLite's holder column), else the string.
fn owner_of_holder(holder: &str) -> String {
    let mut parts = holder.splitn(3, ':');
    match (parts.next(), parts.next().and_then(|p| p.parse::<u32>().ok())) {
        (Some(host), Some(pid)) if !host.is_empty() => format!("{host} pid {pid}"),
        _ => holder.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_of_a_sqlite_holder() {
        assert_eq!(owner_of_holder("web-1:4242:0a1b2c3d4e5f"), "web-1 pid 4242");
        assert_eq!(owner_of_holder("not-a-holder"), "not-a-holder");
        assert_eq!(owner_of_holder(":12:x"), ":12:x");
    }
}

#[cfg(test)]
assert_send_sync_static!(MutexGuard);

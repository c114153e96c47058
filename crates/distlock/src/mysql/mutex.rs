//! A `GET_LOCK` mutex, fenced by a sequence (or a counter row).

use super::{backend, Client, Conn, Fencing, FENCING_SEQUENCE, FENCING_TABLE};
use crate::contract::Wait;
use crate::lease::{Lease, Leased, Renewal};
use crate::{LostReason, Result};
use std::sync::Arc;
use tokio::time::Instant;

/// An exclusive user lock, held by a connection of its own.
///
/// Waiting is done by the server (`GET_LOCK` with a timeout): no polling. Not reentrant: a
/// second acquire through the same handle waits like anyone else's.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(db: distlock::mysql::Client) -> distlock::Result<()> {
/// let lock = db.mutex("nightly-report")?;
/// match lock.lock_timeout(std::time::Duration::from_secs(5)).await? {
///     Some(guard) => guard.release().await?,
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    client: Client,
    name: String,
}

/// `GET_LOCK`'s timeout for "forever" (DistributedLock's choice; −1 is refused by MariaDB).
const FOREVER_SECS: f64 = 4_294_967_295.0;

/// Takes the lock and, only if granted, advances the counter row (one more than the last, never
/// below the server clock in µs): one statement, one round trip. `GET_LOCK` runs once (one row
/// of `DUAL`); the row count says whether it granted; `LAST_INSERT_ID(expr)` hands the token back
/// in the reply's OK packet.
/// Takes the lock and, only if granted, a token: the sequence's next value, or the server clock
/// in µs read after the grant (`SYSDATE`, not the statement's start) if that is larger. `IF`
/// evaluates its chosen branch only. Binds: name, timeout in seconds; answers the token, or NULL.
///
/// The sequence alone rises on one server; the clock covers what it cannot: a sequence behind
/// after a failover to a replica or made again, and
/// clients taking tokens from counter rows (`fencing=row`, which also read the clock after the
/// grant) on the same lock. Both assume a server clock that does not step back.
const ACQUIRE_SEQUENCE_SQL: &str = "SELECT IF(GET_LOCK(?, ?) = 1, \
     GREATEST(NEXTVAL(distlock_fencing_seq), CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)), NULL)";

/// Takes the lock and, only if granted, advances the name's counter row. Binds: name, name,
/// timeout in seconds; one row affected if granted, its token as `LAST_INSERT_ID`.
const ACQUIRE_ROW_SQL: &str = "INSERT INTO distlock_fencing (name, token) \
     SELECT ?, LAST_INSERT_ID(CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)) FROM DUAL \
     WHERE GET_LOCK(?, ?) = 1 \
     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, VALUES(token)))";

impl Mutex {
    pub(crate) fn new(client: Client, name: String) -> Mutex {
        debug_assert!(ACQUIRE_ROW_SQL.contains(FENCING_TABLE) && ACQUIRE_SEQUENCE_SQL.contains(FENCING_SEQUENCE));
        Mutex { client, name }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    crate::contract::wait_methods!(MutexGuard, "the lock", |l, w| l.acquire(w); lock, try_lock, lock_timeout);

    async fn acquire(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        let name = &self.name;
        let mut conn = self.client.checkout().await?;
        let secs = match wait.timeout() {
            None => FOREVER_SECS,
            Some(w) => w.as_secs_f64().min(FOREVER_SECS),
        };
        // Dropped while the server waits: the connection closes with this future, and the
        // server ends a `GET_LOCK` wait whose client is gone (tested), so nothing is left waiting.
        let sent = Instant::now();
        let granted = match self.client.fencing() {
            Fencing::Sequence => sqlx::query_scalar(ACQUIRE_SEQUENCE_SQL)
                .bind(name)
                .bind(secs)
                .fetch_one(&mut conn.conn)
                .await
                .map(|token: Option<i64>| token.map(|t| t as u64)),
            Fencing::Row => sqlx::query(ACQUIRE_ROW_SQL)
                .bind(name)
                .bind(name)
                .bind(secs)
                .execute(&mut conn.conn)
                .await
                .map(|done| (done.rows_affected() > 0).then(|| done.last_insert_id())),
        };
        let Some(token) = granted.map_err(|e| backend("acquire", name, e))? else {
            // Not granted in time (or the wait was ended on the server): it holds nothing.
            self.client.put_back(conn);
            return Ok(None);
        };
        // Held. The lease runs from the statement's send, unless the wait was long: then a ping
        // confirms the session first (else the guard would be born lost); a failure drops the
        // connection, which frees the lock.
        let lease = self.client.lease();
        let ping = async {
            use sqlx::Connection;
            conn.conn.ping().await.map_err(|e| backend("acquire (session check after the wait)", name, e))
        };
        let sent = crate::lease::fresh_after_wait(sent, lease, name, ping).await?;
        Ok(Some(MutexGuard::new(self.client.clone(), conn, name.clone(), token, sent)))
    }
}

/// Proof of holding a [`Mutex`]: its connection, fencing token and lease deadline. Released by
/// [`release`](MutexGuard::release) or, in the background, on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::mysql::Mutex) -> distlock::Result<()> {
/// let guard = lock.lock().await?;
/// // Pass the token with every write; stop before the deadline unless the lease moves on.
/// println!("token {} until {:?}", guard.fencing_token(), guard.lease_deadline());
/// if !guard.state().is_lost() {
///     guard.release().await?;
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
    conn: Arc<tokio::sync::Mutex<Conn>>,
    leased: Leased,
    id: u64,
    /// Our mark, `connection:ID`, as `IS_USED_LOCK(name)` and the process list show it.
    holder: String,
    token: u64,
    /// Its place in the client's renewals: a ping of the connection every sixth of the lease
    /// (ended when dropped).
    _renewals: crate::watchdog::Ticket,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("name", &self.leased.name)
            .field("connection", &self.id)
            .field("token", &self.token)
            .finish()
    }
}

impl MutexGuard {
    fn new(client: Client, conn: Conn, name: String, token: u64, sent: Instant) -> MutexGuard {
        let lease = Arc::new(Lease::new(sent, client.lease(), "mysql"));
        conn.set_holder(&lease, &name);
        let id = conn.id;
        let conn = Arc::new(tokio::sync::Mutex::new(conn));
        let check = {
            let (conn, name) = (Arc::downgrade(&conn), name.clone());
            move || -> crate::contract::BoxFuture<'static, Renewal> {
                let (conn, name) = (conn.clone(), name.clone());
                Box::pin(async move {
                    use sqlx::Connection;
                    // Gone: released while this renewal was due; nothing left to renew.
                    let Some(conn) = conn.upgrade() else { return Renewal::Failed };
                    let gone = |e: &sqlx::Error| {
                        matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed)
                    };
                    let answer = conn.lock().await.conn.ping().await;
                    Renewal::of_check(answer, gone, &name)
                })
            }
        };
        let renewals = client.watchdog().watch(lease.clone(), name.clone(), crate::watchdog::Alone::new(check));
        let holder = format!("connection:{id}");
        let leased = Leased::new(name, lease);
        MutexGuard { hold: Some(Hold { client, conn, leased, id, holder, token, _renewals: renewals }) }
    }

    fn hold(&self) -> &Hold {
        self.hold.as_ref().expect("a guard holds until released")
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.hold().leased.name()
    }

    /// Larger than every token an earlier holder of this lock got.
    pub fn fencing_token(&self) -> u64 {
        self.hold().token
    }

    /// The holding connection, as `IS_USED_LOCK(name)` and the process list show it.
    pub fn holder_id(&self) -> &str {
        &self.hold().holder
    }

    crate::lease::leased_methods!(|g| g.hold().leased);

    /// Unlocks and waits for the server; [`Error::LockLost`](crate::Error::LockLost) if the lock had been lost before or
    /// the server no longer had it.
    pub async fn release(mut self) -> Result<()> {
        let before = self.state();
        let Hold { client, conn, leased: Leased { name, lease }, _renewals, .. } =
            self.hold.take().expect("a guard holds until released");
        drop(_renewals);
        // A lock lost before: dropping the connection frees it.
        lease.release(before, name.clone(), unlock(client, conn, name), LostReason::ConnectionClosed).await
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        let Some(Hold { client, conn, leased: Leased { name, lease }, _renewals, .. }) = self.hold.take() else {
            return;
        };
        drop(_renewals);
        lease.end();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = unlock(client, conn, name.clone()).await {
                    tracing::warn!(lock = name, error = %e, "release on drop failed; closing the connection frees it");
                }
            });
        }
    }
}

/// `RELEASE_LOCK` on the held connection; true if it was held. The connection goes back to the
/// idle list only after a clean release.
async fn unlock(client: Client, conn: Arc<tokio::sync::Mutex<Conn>>, name: String) -> Result<bool> {
    let released: Option<i64> = {
        let mut c = conn.lock().await;
        sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(&name)
            .fetch_one(&mut c.conn)
            .await
            .map_err(|e| backend("release", &name, e))?
    };
    let held = released == Some(1);
    if held {
        if let Ok(conn) = Arc::try_unwrap(conn) {
            client.put_back(conn.into_inner());
        }
    }
    Ok(held)
}

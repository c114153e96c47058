//! A `GET_LOCK` mutex, fenced by a sequence (or a counter row).

use super::{backend, Client, Conn, Fencing, FENCING_SEQUENCE, FENCING_TABLE};
use crate::contract::Wait;
use crate::lease::{Lease, Leased, Renewal};
use crate::{LostReason, Result};
use std::sync::Arc;
use tokio::time::Instant;

/// An exclusive user lock, held on a connection shared with the client's other locks, or (after
/// a wait) on a connection of its own (see [the module docs](crate::mysql#connections)).
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
        // A lock free now is taken on a shared connection (see `shared`); only a wait needs a
        // connection of its own.
        match super::shared::try_lock(&self.client, name).await? {
            Some(super::shared::Tried::Granted(guard)) => return Ok(Some(guard)),
            Some(super::shared::Tried::Busy) if wait == Wait::Never => return Ok(None),
            Some(super::shared::Tried::Busy | super::shared::Tried::Stale) | None => {}
        }
        let mut conn = self.client.checkout().await?;
        let secs = match wait.timeout() {
            None => FOREVER_SECS,
            Some(w) => w.as_secs_f64().min(FOREVER_SECS),
        };
        // Dropped while the server waits: the connection closes with this future, and the
        // server ends a `GET_LOCK` wait whose client is gone (tested), so nothing is left waiting.
        let sent = Instant::now();
        let granted = grant(&mut conn.conn, self.client.fencing(), name, secs).await;
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

/// `GET_LOCK(name, secs)` on `conn` and, only if granted, a fencing token from `fencing`'s
/// source: the token, or `None` if not granted in time.
pub(crate) async fn grant(
    conn: &mut sqlx::MySqlConnection,
    fencing: Fencing,
    name: &str,
    secs: f64,
) -> std::result::Result<Option<u64>, sqlx::Error> {
    match fencing {
        Fencing::Sequence => sqlx::query_scalar(ACQUIRE_SEQUENCE_SQL)
            .bind(name)
            .bind(secs)
            .fetch_one(&mut *conn)
            .await
            .map(|token: Option<i64>| token.map(|t| t as u64)),
        Fencing::Row => sqlx::query(ACQUIRE_ROW_SQL)
            .bind(name)
            .bind(name)
            .bind(secs)
            .execute(&mut *conn)
            .await
            .map(|done| (done.rows_affected() > 0).then(|| done.last_insert_id())),
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
    place: Place,
    leased: Leased,
    id: u64,
    /// Our mark, `connection:ID`, as `IS_USED_LOCK(name)` and the process list show it.
    holder: String,
    token: u64,
}

/// Where a lock is held.
enum Place {
    /// On a connection of its own (taken after a wait), with its place in the client's
    /// renewals: a ping of the connection every sixth of the lease (ended when dropped).
    Own { conn: Arc<tokio::sync::Mutex<Conn>>, _renewals: crate::watchdog::Ticket },
    /// On a shared connection, whose lease it follows (see `shared`).
    Shared(Arc<super::shared::Shared>),
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("name", &self.leased.name)
            .field("connection", &self.id)
            .field("shared", &matches!(self.place, Place::Shared(_)))
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
        let place = Place::Own { conn, _renewals: renewals };
        MutexGuard { hold: Some(Hold { client, place, leased, id, holder, token }) }
    }

    /// A lock granted on a shared connection, under `lease` (a follower of the connection's).
    pub(crate) fn on_shared(
        client: Client,
        shared: Arc<super::shared::Shared>,
        name: String,
        token: u64,
        lease: Arc<Lease>,
    ) -> MutexGuard {
        let id = shared.id;
        let holder = format!("connection:{id}");
        let leased = Leased::new(name, lease);
        MutexGuard { hold: Some(Hold { client, place: Place::Shared(shared), leased, id, holder, token }) }
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
        let Hold { client, place, leased: Leased { name, lease }, .. } =
            self.hold.take().expect("a guard holds until released");
        if let (true, Place::Shared(shared)) = (before.is_lost(), &place) {
            // Lost on its own (its deadline passed while the connection lives on): the server
            // may still have it on the shared connection, which outlives this guard. Released
            // all the same, in the background.
            let (runtime, client, shared, name) = (client.runtime(), client.clone(), shared.clone(), name.clone());
            spawn_unlock(runtime, async move { super::shared::unlock(client, shared, name.clone()).await.map(drop) });
        }
        // A lock lost before on a connection of its own: dropping the connection frees it.
        lease.release(before, name.clone(), unlock(client, place, name), LostReason::ConnectionClosed).await
    }
}

/// Runs a release in the background, on the current runtime or else on the client's (a guard
/// dropped on a thread of its own: a lock on a shared connection would otherwise stay held as
/// long as the connection lives), logging its failure.
fn spawn_unlock(
    client_runtime: tokio::runtime::Handle,
    release: impl std::future::Future<Output = Result<()>> + Send + 'static,
) {
    let runtime = tokio::runtime::Handle::try_current().unwrap_or(client_runtime);
    runtime.spawn(async move {
        if let Err(e) = release.await {
            tracing::warn!(error = %e, "release on drop failed; closing the connection frees it");
        }
    });
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        let Some(Hold { client, place, leased: Leased { name, lease }, .. }) = self.hold.take() else {
            return;
        };
        lease.end();
        spawn_unlock(client.runtime(), async move { unlock(client, place, name).await.map(drop) });
    }
}

/// `RELEASE_LOCK` where the lock is held; true if it was held. A connection of its own goes back
/// to the idle list only after a clean release.
async fn unlock(client: Client, place: Place, name: String) -> Result<bool> {
    let conn = match place {
        Place::Shared(shared) => return super::shared::unlock(client, shared, name).await,
        Place::Own { conn, _renewals } => {
            drop(_renewals);
            conn
        }
    };
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

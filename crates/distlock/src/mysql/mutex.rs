//! A `GET_LOCK` mutex, fenced by a sequence (or a counter row).

use super::{backend, Client, Fencing, FENCING_SEQUENCE, FENCING_TABLE};
use crate::contract::Wait;
use crate::lease::{Lease, Leased};
use crate::{LostReason, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
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
    /// This lock's last acquire had to wait: the next one that may wait waits on the server at
    /// once (if a connection is free for it), without a try first that would cost a round trip.
    contended: Arc<std::sync::atomic::AtomicBool>,
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
        Mutex { client, name, contended: Arc::default() }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    crate::contract::wait_methods!(MutexGuard, "the lock", |l, w| l.acquire(w); lock, try_lock, lock_timeout);

    async fn acquire(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        use super::shared::Tried;
        let (client, name) = (&self.client, &self.name);
        let pool = client.pool();
        let deadline = wait.deadline();
        // Made once the acquire has to poll (most never do).
        let mut wake: Option<Arc<tokio::sync::Notify>> = None;
        let mut pause = Duration::from_millis(5);
        let contended = &self.contended;
        if wait != Wait::Never && contended.load(Ordering::Relaxed) {
            if let Some(slot) = pool.claim_wait(client).await {
                return self.wait_on_server(slot, deadline).await;
            }
        }
        let mut first = true;
        loop {
            // Listening before the try: a release after the try's look wakes this.
            let now_waking = wake.clone();
            let listening = now_waking.as_ref().map(|w| {
                let mut all = [Box::pin(w.notified()), Box::pin(pool.freed().notified())];
                for n in &mut all {
                    n.as_mut().enable();
                }
                all
            });
            // A lock free now is taken on a shared connection (see `shared`).
            match super::shared::try_lock(client, name).await? {
                Some(Tried::Granted(guard)) => {
                    if std::mem::take(&mut first) {
                        contended.store(false, Ordering::Relaxed);
                    }
                    return Ok(Some(guard));
                }
                // Every shared connection has the name (local holders): busy too.
                Some(Tried::Busy) | None if wait == Wait::Never => return Ok(None),
                Some(Tried::Busy | Tried::Stale) | None => {}
            }
            first = false;
            contended.store(true, Ordering::Relaxed);
            if let Some(slot) = pool.claim_wait(client).await {
                return self.wait_on_server(slot, deadline).await;
            }
            // No connection free to wait on: poll.
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let Some([named, freed]) = listening else {
                // Listen, then look again at once.
                wake = Some(pool.wake_for(name));
                continue;
            };
            let until = deadline.map_or(now + pause, |d| d.min(now + pause));
            pause = (pause * 2).min(MAX_POLL_PAUSE);
            tokio::select! {
                _ = named => {}
                _ = freed => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// `GET_LOCK(name, timeout)` on a connection that holds nothing (`slot`'s), until
    /// `deadline`; granted, the connection joins the shared ones with the lock on it.
    async fn wait_on_server(
        &self,
        slot: super::shared::WaitSlot,
        deadline: Option<Instant>,
    ) -> Result<Option<MutexGuard>> {
        let (client, name) = (&self.client, &self.name);
        let mut conn = client.checkout().await?;
        let secs = match deadline {
            None => FOREVER_SECS,
            Some(d) => d.saturating_duration_since(Instant::now()).as_secs_f64().min(FOREVER_SECS),
        };
        // Dropped while the server waits: the connection closes with this future, and the
        // server ends a `GET_LOCK` wait whose client is gone (tested), so nothing is left waiting.
        let sent = Instant::now();
        let granted = grant(&mut conn.conn, client.fencing(), name, secs).await;
        let Some(token) = granted.map_err(|e| backend("acquire", name, e))? else {
            // Not granted in time (or the wait was ended on the server): it holds nothing.
            drop(slot);
            client.put_back(conn);
            return Ok(None);
        };
        // Held. The lease runs from the statement's send, unless the wait was long: then a ping
        // confirms the session first (else the guard would be born lost); a failure drops the
        // connection, which frees the lock.
        let ping = async {
            use sqlx::Connection;
            conn.conn.ping().await.map_err(|e| backend("acquire (session check after the wait)", name, e))
        };
        let sent = crate::lease::fresh_after_wait(sent, client.lease(), name, ping).await?;
        let shared = client.pool().adopt(client, slot, conn, name, sent).await;
        let Some(lease) = shared.lease.follower() else {
            // Cannot be: the lease was made now. Ended all the same, which frees the lock.
            super::shared::end(&shared).await;
            client.pool().done(client, &shared, name).await;
            return Err(crate::Error::LockLost { lock: name.clone(), reason: LostReason::ConnectionClosed });
        };
        super::shared::renew(client, &shared);
        Ok(Some(MutexGuard::on_shared(client.clone(), shared, name.clone(), token, lease)))
    }
}

/// The longest an acquire that polls (no connection free to wait on) waits between tries
/// without having been told of a local release.
const MAX_POLL_PAUSE: Duration = Duration::from_millis(500);

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
    /// The shared connection it is held on, whose lease it follows (see `shared`).
    shared: Arc<super::shared::Shared>,
    leased: Leased,
    id: u64,
    /// Our mark, `connection:ID`, as `IS_USED_LOCK(name)` and the process list show it.
    holder: String,
    token: u64,
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
        MutexGuard { hold: Some(Hold { client, shared, leased, id, holder, token }) }
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
        let Hold { client, shared, leased: Leased { name, lease }, .. } =
            self.hold.take().expect("a guard holds until released");
        if before.is_lost() {
            // Lost on its own (its deadline passed while the connection lives on): the server
            // may still have it on the shared connection, which outlives this guard. Released
            // all the same, in the background.
            let (runtime, client, shared, name) = (client.runtime(), client.clone(), shared.clone(), name.clone());
            spawn_unlock(runtime, async move { super::shared::unlock(client, shared, name.clone()).await.map(drop) });
        }
        let unlock = super::shared::unlock(client, shared, name.clone());
        lease.release(before, name, unlock, LostReason::ConnectionClosed).await
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
        let Some(Hold { client, shared, leased: Leased { name, lease }, .. }) = self.hold.take() else {
            return;
        };
        lease.end();
        let runtime = client.runtime();
        spawn_unlock(runtime, async move { super::shared::unlock(client, shared, name).await.map(drop) });
    }
}

//! A mutex on a lease row, extended by its client's watchdog with the client's other rows.

use super::{backend, Client};
use crate::contract::Wait;
use crate::lease::{Lease, Leased, Renewal};
use crate::{LostReason, Result};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

/// A lock on one row of the lease table. Not reentrant: a second acquire waits like anyone's.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(db: distlock::sqlite::Client) -> distlock::Result<()> {
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

/// The lease row of a lock, from [`Mutex::inspect`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::sqlite::Mutex) -> distlock::Result<()> {
/// if let Some(v) = lock.inspect().await? {
///     println!("{} until {} (held: {})", v.locked_by, v.lock_until, v.held);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct LeaseView {
    /// The lock's name.
    pub name: String,
    /// The last holder (`host:pid:random`).
    pub locked_by: String,
    /// When it took the lock (UTC).
    pub locked_at: String,
    /// When its lease ends or ended (UTC).
    pub lock_until: String,
    /// The last fencing token handed out.
    pub fencing_token: u64,
    /// `lock_until` is still ahead: someone holds it.
    pub held: bool,
}

/// Polling bounds while waiting for another process's holder (this process's acquires queue in
/// a local FIFO first, and the next one asks as soon as the previous holder's release is done).
const FIRST_RETRY: Duration = Duration::from_millis(2);
const MAX_RETRY: Duration = Duration::from_millis(50);

impl Mutex {
    pub(crate) fn new(client: Client, name: String) -> Mutex {
        Mutex { client, name }
    }

    /// The lock's name (its row's key).
    pub fn name(&self) -> &str {
        &self.name
    }

    crate::contract::wait_methods!(MutexGuard, "the lock", |l, w| l.acquire(w); lock, try_lock, lock_timeout);

    /// The lock's row now, if it was ever taken.
    pub async fn inspect(&self) -> Result<Option<LeaseView>> {
        let inner = &self.client.inner;
        let row: Option<(String, String, String, i64, bool)> = sqlx::query_as(&inner.sql.view)
            .bind(&self.name)
            .fetch_optional(&inner.pool)
            .await
            .map_err(|e| backend("inspect", &self.name, e))?;
        Ok(row.map(|(locked_by, locked_at, lock_until, token, held)| LeaseView {
            name: self.name.clone(),
            locked_by,
            locked_at,
            lock_until,
            fencing_token: token as u64,
            held,
        }))
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        let host = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "unknown".into());
        let holder = format!("{host}:{}:{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..12]);
        // This process's queue first: held until our release has reached the database.
        let gate = self.client.gate(&self.name);
        let gate = match wait {
            Wait::Never => match gate.try_lock_owned() {
                Ok(g) => g,
                Err(_) => return Ok(None),
            },
            Wait::Until(d) => match tokio::time::timeout_at(d, gate.lock_owned()).await {
                Ok(g) => g,
                Err(_) => return Ok(None),
            },
            Wait::Forever => gate.lock_owned().await,
        };
        // Only another process can hold the row now: ask again at growing intervals.
        let mut retry = FIRST_RETRY;
        let mut gate = gate;
        loop {
            // The upsert runs to its end even if this acquire is dropped meanwhile (SQLite's
            // worker thread commits it anyway): then the guard it makes is dropped, which
            // releases the row, instead of the row staying ours for a whole lease.
            let attempt =
                crate::background::detach(attempt(self.client.clone(), self.name.clone(), holder.clone(), gate));
            let answer = match wait {
                // An upsert waiting for another process's file lock may outlast the deadline:
                // give up then (a grant that comes later is released in the background).
                Wait::Until(d) => match tokio::time::timeout_at(d, attempt).await {
                    Ok(answer) => answer,
                    Err(_) => return Ok(None),
                },
                Wait::Never | Wait::Forever => attempt.await,
            };
            gate = match answer? {
                Ok(guard) => return Ok(Some(guard)),
                Err(gate) => gate,
            };
            let now = Instant::now();
            let until = match wait {
                Wait::Never => return Ok(None),
                Wait::Until(d) if now >= d => return Ok(None),
                Wait::Until(d) => d.min(now + retry),
                Wait::Forever => now + retry,
            };
            tokio::time::sleep_until(until).await;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }
}

/// One upsert: our guard if we took the row, else this process's queue place back (someone else
/// holds the row).
async fn attempt(
    client: Client,
    name: String,
    holder: String,
    gate: OwnedMutexGuard<()>,
) -> Result<std::result::Result<MutexGuard, OwnedMutexGuard<()>>> {
    let inner = &client.inner;
    let sent = Instant::now();
    let row: Option<(i64, i64)> = sqlx::query_as(&inner.sql.acquire)
        .bind(&name)
        .bind(&holder)
        .bind(inner.url.lease_modifier())
        .bind(super::fencing_floor())
        .fetch_optional(&inner.pool)
        .await
        .map_err(|e| backend("acquire", &name, e))?;
    Ok(match row {
        Some((token, until_ms)) => {
            // The lease runs from when the statement ran (it may have waited for SQLite's file
            // lock), which the row's lock_until tells; never from before it was sent.
            let confirmed = lease_start(sent, until_ms, client.lease());
            Ok(MutexGuard::new(client, name, holder, token as u64, confirmed, gate))
        }
        None => Err(gate),
    })
}

/// The instant a lease of `lease` that ends at `until_ms` (Unix ms, SQLite's clock, which is this
/// process's own) started, as this process's monotonic clock tells it; never before `sent`.
fn lease_start(sent: Instant, until_ms: i64, lease: Duration) -> Instant {
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    let left = Duration::from_millis(until_ms.saturating_sub(now_ms).max(0) as u64);
    let now = Instant::now();
    // The row's end, less the lease, on our monotonic clock; a lease whose end is already
    // behind us is at most as old as the request.
    match (now + left).checked_sub(lease) {
        Some(start) if start > sent => start.min(now),
        _ => sent,
    }
}

/// Proof of holding a [`Mutex`]: the row is ours until `lease_deadline`, which the watchdog keeps
/// moving. Released by [`release`](MutexGuard::release) or, in the background, on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::sqlite::Mutex) -> distlock::Result<()> {
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

#[derive(Debug)]
struct Hold {
    client: Client,
    leased: Leased,
    holder: String,
    token: u64,
    /// The hold's place in the client's renewals (dropped: renewed no more).
    renewals: crate::watchdog::Ticket,
    /// This process's queue for the lock: the next local acquire goes once our release is done,
    /// or at once when the lease is lost (the watchdog opens it then).
    gate: Gate,
}

/// A hold's place at the head of this process's queue, opened by whoever comes first: the
/// release (after the database has it) or the watchdog (at a loss).
type Gate = Arc<std::sync::Mutex<Option<OwnedMutexGuard<()>>>>;

fn open(gate: &Gate) {
    drop(gate.lock().unwrap_or_else(|e| e.into_inner()).take());
}

impl MutexGuard {
    fn new(
        client: Client,
        name: String,
        holder: String,
        token: u64,
        sent: Instant,
        gate: OwnedMutexGuard<()>,
    ) -> MutexGuard {
        let lease = Arc::new(Lease::new(sent, client.lease(), "sqlite"));
        let gate = Arc::new(std::sync::Mutex::new(Some(gate)));
        let check = Renew { client: client.clone(), name: name.clone(), holder: holder.clone(), gate: gate.clone() };
        let renewals = client.inner.watchdog.watch(lease.clone(), name.clone(), check);
        MutexGuard { hold: Some(Hold { client, leased: Leased::new(name, lease), holder, token, renewals, gate }) }
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

    /// Our mark in the row's `locked_by`: `host:pid:random`.
    pub fn holder_id(&self) -> &str {
        &self.hold().holder
    }

    crate::lease::leased_methods!(|g| g.hold().leased);

    /// Ends the lease now; [`Error::LockLost`](crate::Error::LockLost) if it had been lost or taken over before.
    pub async fn release(mut self) -> Result<()> {
        let Hold { client, leased: Leased { name, lease }, holder, renewals, gate, .. } =
            self.hold.take().expect("a guard holds until released");
        drop(renewals);
        let (before, lock) = (lease.state(&name), name.clone());
        // The queue opens once the release has reached the file, also when nobody waits for it
        // any more (the release then finishes on its own); at once if it is not sent (lost).
        let unlock = async move {
            let released = release(client, name, holder).await;
            open(&gate);
            released
        };
        lease.release(before, lock, unlock, LostReason::KeyDeleted).await
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        let Some(Hold { client, leased: Leased { name, lease }, holder, renewals, gate, .. }) = self.hold.take() else {
            return;
        };
        drop(renewals);
        lease.end();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = release(client, name.clone(), holder).await {
                    tracing::warn!(lock = name, error = %e, "release on drop failed; the lease runs out instead");
                }
                open(&gate);
            });
        }
    }
}

/// Ends our lease on the row; true if it was still ours.
async fn release(client: Client, name: String, holder: String) -> Result<bool> {
    let inner = &client.inner;
    let done = sqlx::query(&inner.sql.release)
        .bind(&name)
        .bind(&holder)
        .execute(&inner.pool)
        .await
        .map_err(|e| backend("release", &name, e))?;
    Ok(done.rows_affected() == 1)
}

/// At most this many rows in one extension: a statement of 10,000 rows runs in well under a
/// second (its list is one JSON parameter, so SQLite's limit on parameters does not apply).
pub(crate) const RENEW_TOGETHER: usize = 10_000;

/// A hold's extension, as the client's watchdog keeps it: every third of the lease, with the
/// client's other holds, in one statement for up to [`RENEW_TOGETHER`] rows, each with its own
/// answer; a row that the statement did not extend (expired and taken, or released or deleted by
/// someone else) is a loss of that hold alone.
pub(crate) struct Renew {
    client: Client,
    name: String,
    holder: String,
    gate: Gate,
}

impl crate::watchdog::Check for Renew {
    type Group = ();

    const TOGETHER: usize = RENEW_TOGETHER;

    fn group(&self) {}

    fn renew(&self) -> crate::contract::BoxFuture<'static, Renewal> {
        let together = Self::renew_together(&[self]);
        Box::pin(async move { together.await.pop().unwrap_or(Renewal::Failed) })
    }

    /// One statement for them all: each row it extended comes back (by name and holder); a hold
    /// whose row did not is `Gone(KeyDeleted)`; a failed statement fails every one of them.
    fn renew_together(checks: &[&Self]) -> crate::contract::BoxFuture<'static, Vec<Renewal>> {
        let client = checks[0].client.clone();
        let ours: Vec<(String, String)> = checks.iter().map(|c| (c.name.clone(), c.holder.clone())).collect();
        let list = serde_json::to_string(&ours).unwrap_or_default();
        Box::pin(async move {
            let inner = &client.inner;
            let extended: std::result::Result<Vec<(String, String)>, _> = sqlx::query_as(&inner.sql.extend)
                .bind(list)
                .bind(inner.url.lease_modifier())
                .fetch_all(&inner.pool)
                .await;
            match extended {
                Ok(rows) => {
                    let rows: std::collections::HashSet<(String, String)> = rows.into_iter().collect();
                    let answer = |row: &(String, String)| match rows.contains(row) {
                        true => Renewal::Renewed,
                        false => Renewal::Gone(LostReason::KeyDeleted),
                    };
                    ours.iter().map(answer).collect()
                }
                Err(e) => {
                    tracing::debug!(lock = ours[0].0, holds = ours.len(), error = %e, "lease extension failed");
                    vec![Renewal::Failed; ours.len()]
                }
            }
        })
    }

    /// Lost: the next local acquire need not wait for our release.
    fn lost(&self) {
        open(&self.gate);
    }
}

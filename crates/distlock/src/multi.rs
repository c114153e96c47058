//! Several locks taken all or nothing, in one global order: written once for any lock that is a
//! [`Member`] (the one API's [`Lock`], and the typed locks a backend makes members, such as
//! ZooKeeper's `LockSpec`).

use crate::contract::Wait;
use crate::{Error, Guard, Lock, LostReason, QueueStatus, Result};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A lock that can be a member of a multi-lock.
pub(crate) trait Member: Send + Sync {
    /// The member held.
    type Held: Send;
    /// Its name: members are taken in name order.
    fn name(&self) -> &str;
    /// Acquires within `wait`.
    fn take<'a>(
        &'a self,
        wait: Wait,
        progress: Option<&'a watch::Sender<QueueStatus>>,
    ) -> impl Future<Output = Result<Option<Self::Held>>> + Send + 'a;
    /// Releases a held member.
    fn give_back(held: Self::Held) -> impl Future<Output = Result<()>> + Send;
}

impl Member for Lock {
    type Held = Guard;
    fn name(&self) -> &str {
        Lock::name(self)
    }
    fn take<'a>(
        &'a self,
        wait: Wait,
        progress: Option<&'a watch::Sender<QueueStatus>>,
    ) -> impl Future<Output = Result<Option<Guard>>> + Send + 'a {
        Lock::take(self, wait, progress)
    }
    fn give_back(held: Guard) -> impl Future<Output = Result<()>> + Send {
        held.release()
    }
}

/// Several [`Lock`]s of any kinds and backends, taken all or nothing, in name order (so two
/// multi-locks never wait for each other in a cycle).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// let both = distlock::MultiLock::new(vec![client.mutex("a")?, client.mutex("b")?])?;
/// if let Some(g) = both.lock_timeout(std::time::Duration::from_secs(5)).await? {
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

impl MultiLock {
    /// Orders the members; a name given twice is refused (it would wait for itself).
    pub fn new(mut locks: Vec<Lock>) -> Result<MultiLock> {
        order_members(&mut locks, Lock::name)?;
        Ok(MultiLock { locks })
    }

    /// Waits for every member.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: members taken are released (in the background) when the future is dropped.
    ///
    /// # Errors
    ///
    /// The first member's error; what was taken is released first.
    pub async fn lock(&self) -> Result<MultiGuard> {
        Ok(self.acquire(None, None).await?.expect("waiting forever always acquires"))
    }

    /// Every member now, or none.
    ///
    /// # Cancel safety
    ///
    /// As [`MultiLock::lock`].
    ///
    /// # Errors
    ///
    /// As [`MultiLock::lock`].
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        self.acquire(Some(Duration::ZERO), None).await
    }

    /// Every member within `timeout` (for the whole set), or none.
    ///
    /// # Cancel safety
    ///
    /// As [`MultiLock::lock`].
    ///
    /// # Errors
    ///
    /// As [`MultiLock::lock`].
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<MultiGuard>> {
        self.acquire(Some(timeout), None).await
    }

    /// `timeout` `None` waits forever, `Some(ZERO)` never waits; `progress` as in
    /// [`Lock::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`MultiLock::lock`].
    ///
    /// # Errors
    ///
    /// As [`MultiLock::lock`].
    pub async fn acquire(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<MultiGuard>> {
        let wait = Wait::from_timeout(timeout);
        Ok(acquire_all(&self.locks, wait, progress).await?.map(|parts| MultiGuard { parts }))
    }
}

/// Takes `locks` in the order given, all or nothing: on a refusal or an error, what was taken is
/// released again (bounded by the deadline plus a grace, the rest goes on in the background).
pub(crate) async fn acquire_all<M: Member>(
    locks: &[M],
    wait: Wait,
    progress: Option<&watch::Sender<QueueStatus>>,
) -> Result<Option<Vec<M::Held>>> {
    let mut taken = Vec::with_capacity(locks.len());
    for lock in locks {
        // A member reached after the deadline still gets one try (a 1 ms wait).
        let wait = match wait {
            Wait::Until(d) => Wait::Until(d.max(Instant::now() + Duration::from_millis(1))),
            other => other,
        };
        let result = lock.take(wait, progress).await;
        match result {
            Ok(Some(g)) => taken.push(g),
            Ok(None) | Err(_) => {
                tracing::debug!(
                    lock = lock.name(),
                    taken = taken.len(),
                    "multi-lock member not acquired; rolling back"
                );
                let rollback = release_all(taken, M::give_back);
                let rollback = match wait.give_up_at() {
                    Some(d) => tokio::time::timeout_at(d.max(Instant::now()) + Duration::from_millis(200), rollback)
                        .await
                        .unwrap_or(Ok(())),
                    None => rollback.await,
                };
                return match (result, rollback) {
                    (Err(e), _) => Err(e),
                    (Ok(_), Err(e)) => Err(e),
                    (Ok(_), Ok(())) => Ok(None),
                };
            }
        }
    }
    Ok(Some(taken))
}

/// Every member of a [`MultiLock`], held; each released on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(g: distlock::MultiGuard) -> distlock::Result<()> {
/// for part in g.parts() {
///     println!("{} token {}", part.lock_name(), part.fencing_token());
/// }
/// g.release().await
/// # }
/// ```
#[must_use = "if unused the locks are released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MultiGuard {
    parts: Vec<Guard>,
}

impl MultiGuard {
    /// The held members, in acquisition order.
    pub fn parts(&self) -> &[Guard] {
        &self.parts
    }

    /// The earliest lease deadline of the members.
    pub fn lease_deadline(&self) -> Option<std::time::Instant> {
        self.parts.iter().map(|p| p.lease_deadline()).min()
    }

    /// Resolves when any member can no longer be trusted.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        lost_any(self.parts.iter().map(|p| p.lost()).collect())
    }

    /// Releases every member in reverse order; reports the first error after trying all.
    ///
    /// # Errors
    ///
    /// The first member's release error ([`Error::LockLost`] if it had been lost), after every
    /// member was tried.
    pub async fn release(self) -> Result<()> {
        release_all(self.parts, Guard::release).await
    }
}

/// Resolves with the first of `losses`.
pub(crate) async fn lost_any<F>(losses: Vec<F>) -> LostReason
where
    F: Future<Output = LostReason> + Send + Unpin,
{
    futures::future::select_all(losses).await.0
}

/// Sorts multi-lock members by name (one global order: no two multi-locks wait for each other
/// in a cycle); an empty list or a name given twice (it would wait for itself) is refused.
pub(crate) fn order_members<T>(members: &mut [T], name: impl Fn(&T) -> &str) -> Result<()> {
    if members.is_empty() {
        return Err(Error::InvalidArgument {
            what: "lock list",
            reason: "a multi-lock needs at least one lock".into(),
        });
    }
    members.sort_by(|a, b| name(a).cmp(name(b)));
    for pair in members.windows(2) {
        if name(&pair[0]) == name(&pair[1]) {
            return Err(Error::InvalidLockPath {
                path: name(&pair[0]).to_string(),
                reason: "named twice in one multi-lock (it would wait for itself)".into(),
            });
        }
    }
    Ok(())
}

/// Releases `parts` in reverse order; the first error after trying all.
pub(crate) async fn release_all<G, F, Fut>(parts: Vec<G>, release: F) -> Result<()>
where
    F: Fn(G) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut first = Ok(());
    for part in parts.into_iter().rev() {
        if let Err(e) = release(part).await {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

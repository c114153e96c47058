//! The "run this under the lock or report busy" template, and the traits it works over.

use crate::{Error, LostReason, Result};
use std::future::Future;
use std::time::Duration;

/// A lock that can be acquired with a timeout: every backend's mutex and semaphore (one
/// permit), Redis's fair lock, ZooKeeper's reentrant mutex, and [`crate::Lock`] (not the naive
/// lock, the multi-locks or Redlock, which have no single name or timeout of this shape).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::Lock) -> distlock::Result<()> {
/// use distlock::{DistributedGuard, DistributedLock};
/// if let Some(g) = lock.acquire_timeout(std::time::Duration::from_secs(1)).await? {
///     println!("{} held with token {}", lock.name(), g.fencing_token());
/// }
/// # Ok(()) }
/// ```
pub trait DistributedLock: Send + Sync {
    /// The guard proving possession.
    type Guard: DistributedGuard;
    /// The lock's name (path or key), for messages.
    fn name(&self) -> &str;
    /// Waits at most `timeout`; `Ok(None)` when not acquired in time.
    fn acquire_timeout(&self, timeout: Duration) -> impl Future<Output = Result<Option<Self::Guard>>> + Send;
}

/// What every guard offers.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(g: distlock::Guard) -> distlock::Result<()> {
/// use distlock::DistributedGuard;
/// let token = g.fencing_token();
/// # let _ = token;
/// g.release().await
/// # }
/// ```
pub trait DistributedGuard: Send + Sync + 'static {
    /// Strictly increasing from one holder to the next.
    fn fencing_token(&self) -> u64;
    /// Resolves when the lock can no longer be trusted.
    fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static;
    /// Releases and reports errors.
    fn release(self) -> impl Future<Output = Result<()>> + Send;
}

/// Runs `work` while holding `lock`, or returns [`Error::Busy`] if the lock was not had within
/// `timeout`: the "run under the lock or report busy" template.
///
/// `work` receives the fencing token. If the lock is lost while `work` runs, `work` is dropped
/// (cancelled at its next await point) and [`Error::LockLost`] is returned: work is never left
/// running unlocked. The lock is released when `work` finishes; a failed release is returned as
/// the error, because it means the lock may not have been held throughout.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::Lock) -> distlock::Result<()> {
/// use std::time::Duration;
/// match distlock::with_lock(&lock, Duration::from_secs(2), |token| async move {
///     format!("order issued under token {token}")
/// }).await {
///     Ok(msg) => println!("{msg}"),
///     Err(distlock::Error::Busy { .. }) => println!("someone else is issuing orders"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
pub async fn with_lock<L, F, Fut, T>(lock: &L, timeout: Duration, work: F) -> Result<T>
where
    L: DistributedLock,
    F: FnOnce(u64) -> Fut,
    Fut: Future<Output = T>,
{
    let Some(guard) = lock.acquire_timeout(timeout).await? else {
        tracing::debug!(lock = lock.name(), "busy");
        return Err(Error::Busy { lock: lock.name().to_string(), waited: timeout });
    };
    let lost = guard.lost();
    let result = tokio::select! {
        biased;
        reason = lost => Err(Error::LockLost { lock: lock.name().to_string(), reason }),
        value = work(guard.fencing_token()) => Ok(value),
    };
    match result {
        Ok(value) => {
            guard.release().await?;
            Ok(value)
        }
        Err(e) => {
            drop(guard);
            Err(e)
        }
    }
}

/// Implements [`DistributedLock`] for a typed lock: `$l` is the lock and `$t` the timeout in
/// the expressions.
///
/// ```ignore
/// distributed_lock!(Mutex => MutexGuard, |l, t| name: l.name(), within: l.lock_timeout(t));
/// ```
// The in-process store's locks are reached through `Client` only.
macro_rules! distributed_lock {
    ($ty:ty => $guard:ty, |$l:ident, $t:ident| name: $name:expr, within: $within:expr) => {
        impl $crate::DistributedLock for $ty {
            type Guard = $guard;
            fn name(&self) -> &str {
                let $l = self;
                $name
            }
            fn acquire_timeout(
                &self,
                $t: std::time::Duration,
            ) -> impl std::future::Future<Output = $crate::Result<Option<$guard>>> + Send {
                let $l = self;
                $within
            }
        }
    };
}
pub(crate) use distributed_lock;

/// Implements [`DistributedGuard`] for guards with `fencing_token`, `lost` and `release`.
macro_rules! distributed_guard {
    ($($t:ty),* $(,)?) => {$(
        impl $crate::DistributedGuard for $t {
            fn fencing_token(&self) -> u64 {
                <$t>::fencing_token(self)
            }
            fn lost(&self) -> impl std::future::Future<Output = $crate::LostReason> + Send + 'static {
                <$t>::lost(self)
            }
            fn release(self) -> impl std::future::Future<Output = $crate::Result<()>> + Send {
                <$t>::release(self)
            }
        }
    )*};
}
pub(crate) use distributed_guard;

#[cfg(test)]
mod tests {
    use super::DistributedLock;

    /// The one API's lock takes the template (each backend's tests check its typed locks:
    /// `contract_tests::typed_locks_are_distributed_locks`).
    #[test]
    fn the_lock_is_a_distributed_lock() {
        fn takes<L: DistributedLock>() {}
        takes::<crate::Lock>();
    }
}

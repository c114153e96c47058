//! The "run this under the lock or report busy" template, over the one lock of every backend
//! ([`crate::Lock`]; a typed lock converts into it with `From`).

use crate::{Error, Lock, Result};
use std::future::Future;
use std::time::Duration;

/// Runs `work` while holding `lock`, or returns [`Error::Busy`] if the lock was not had within
/// `timeout`: the "run under the lock or report busy" template.
///
/// `work` receives the fencing token. If the lock is lost while `work` runs, `work` is dropped
/// (cancelled at its next await point) and [`Error::LockLost`] is returned: work is never left
/// running unlocked. The lock is released when `work` finishes; a failed release is returned as
/// the error, because it means the lock may not have been held throughout.
///
/// A backend's typed lock converts into the one [`Lock`] (`From`, so `&typed.into()`), and runs
/// under the template like any other.
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
pub async fn with_lock<F, Fut, T>(lock: &Lock, timeout: Duration, work: F) -> Result<T>
where
    F: FnOnce(u64) -> Fut,
    Fut: Future<Output = T>,
{
    let Some(guard) = lock.lock_timeout(timeout).await? else {
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

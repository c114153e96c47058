//! A read/write lock: `name/read/…` and `name/write/…` keys in one queue (the layout of Go's
//! `contrib/recipes` `RWMutex`).

use super::queue::{acquire, Naming, Spec};
use super::{Client, LockGuard};
use crate::Result;
use std::time::Duration;

/// A read/write lock on key prefix `name`: readers share it, a writer has it alone, and all are
/// served in the order their keys were created (a waiting writer holds back later readers, so
/// writers are not starved). A reader waits for the last older writer's key only; a writer for
/// the last older key of either kind.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(etcd: distlock::etcd::Client) -> distlock::Result<()> {
/// let rw = etcd.rwlock("catalog")?;
/// let a = rw.read().await?;
/// let b = rw.read().await?;          // readers share
/// assert!(rw.try_write().await?.is_none());
/// a.release().await?;
/// b.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    client: Client,
    read: Spec,
    write: Spec,
}

impl RwLock {
    pub(crate) fn new(client: Client, name: String) -> RwLock {
        let read = Spec {
            name: name.clone(),
            key_prefix: format!("{name}/read/"),
            naming: Naming::Unique,
            blockers: format!("{name}/write"),
            limit: 1,
        };
        let write = Spec {
            name: name.clone(),
            key_prefix: format!("{name}/write/"),
            naming: Naming::Unique,
            blockers: format!("{name}/"),
            limit: 1,
        };
        RwLock { client, read, write }
    }

    /// The lock's name (its key prefix without the `/`).
    pub fn name(&self) -> &str {
        &self.read.name
    }

    /// Waits for a shared hold.
    pub async fn read(&self) -> Result<LockGuard> {
        Ok(acquire(&self.client, &self.read, None).await?.expect("waiting without a deadline ends only with the lock"))
    }

    /// A shared hold only if no writer holds or waits before us.
    pub async fn try_read(&self) -> Result<Option<LockGuard>> {
        acquire(&self.client, &self.read, Some(Duration::ZERO)).await
    }

    /// Waits at most `timeout` for a shared hold.
    pub async fn read_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        acquire(&self.client, &self.read, Some(timeout)).await
    }

    /// Waits for the exclusive hold.
    pub async fn write(&self) -> Result<LockGuard> {
        Ok(acquire(&self.client, &self.write, None).await?.expect("waiting without a deadline ends only with the lock"))
    }

    /// The exclusive hold only if nobody holds or waits.
    pub async fn try_write(&self) -> Result<Option<LockGuard>> {
        acquire(&self.client, &self.write, Some(Duration::ZERO)).await
    }

    /// Waits at most `timeout` for the exclusive hold.
    pub async fn write_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        acquire(&self.client, &self.write, Some(timeout)).await
    }
}

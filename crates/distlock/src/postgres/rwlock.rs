//! A read/write lock: shared and exclusive advisory locks on one key.

use super::{Mutex, MutexGuard};
use crate::Result;
use std::time::Duration;

/// Proof of holding the read side of a [`RwLock`] (the same guard as a mutex's).
pub type ReadGuard = MutexGuard;
/// Proof of holding the write side of a [`RwLock`].
pub type WriteGuard = MutexGuard;

/// Readers share, a writer excludes everyone: the shared and the exclusive advisory lock on the
/// name's key, each hold on its own session (two holds of one name are never on one shared
/// connection, even two readers'). PostgreSQL queues them itself (a waiting
/// writer holds back readers that come after it). No upgrade: a reader that wants to write
/// releases first.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(pg: distlock::postgres::Client) -> distlock::Result<()> {
/// let config = pg.rwlock("config")?;
/// let r = config.read().await?;
/// println!("reading under token {}", r.fencing_token());
/// r.release().await?;
/// let w = config.write().await?;
/// w.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    read: Mutex,
    write: Mutex,
}

impl RwLock {
    pub(crate) fn new(read: Mutex, write: Mutex) -> RwLock {
        RwLock { read, write }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.write.name()
    }

    /// The read side as a lock handle (for the one API).
    pub(crate) fn reader(&self) -> Mutex {
        self.read.clone()
    }

    /// Waits for a read hold as long as it takes.
    pub async fn read(&self) -> Result<ReadGuard> {
        self.read.lock().await
    }

    /// A read hold only if no writer holds it; never waits.
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        self.read.try_lock().await
    }

    /// Waits at most `timeout` for a read hold.
    pub async fn read_timeout(&self, timeout: Duration) -> Result<Option<ReadGuard>> {
        self.read.lock_timeout(timeout).await
    }

    /// Waits for the write hold as long as it takes.
    pub async fn write(&self) -> Result<WriteGuard> {
        self.write.lock().await
    }

    /// The write hold only if nobody holds it; never waits.
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        self.write.try_lock().await
    }

    /// Waits at most `timeout` for the write hold.
    pub async fn write_timeout(&self, timeout: Duration) -> Result<Option<WriteGuard>> {
        self.write.lock_timeout(timeout).await
    }
}

//! A read/write lock: `name/read/…` and `name/write/…` keys in one queue (the layout of Go's
//! `contrib/recipes` `RWMutex`).

use super::kinds::Role;
use super::queue::{acquire, Naming, Spec};
use super::{Client, LockGuard};

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
        // One side's keys under `name/<side>/`; a reader waits for the older keys that are not
        // readers', a writer for every older key (`kinds.rs`).
        let side = |side: &str, role: Role| Spec {
            name: name.clone(),
            key_prefix: format!("{name}/{side}/"),
            naming: Naming::Unique,
            role,
            limit: 1,
            value: None,
        };
        RwLock { client, read: side("read", Role::Shared), write: side("write", Role::Exclusive) }
    }

    /// The lock's name (its key prefix without the `/`).
    pub fn name(&self) -> &str {
        &self.read.name
    }

    crate::contract::wait_methods!(LockGuard, "a read hold", |l, w| acquire(&l.client, &l.read, w); read, try_read, read_timeout);

    crate::contract::wait_methods!(LockGuard, "the write hold", |l, w| acquire(&l.client, &l.write, w); write, try_write, write_timeout);
}

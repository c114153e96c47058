//! etcd's mutex: the queue of `name/<lease id hex>` keys (`etcdctl lock`'s layout).

use super::queue::{acquire, Naming, Spec};
use super::{Client, LockGuard};
use crate::Result;
use std::time::Duration;

/// An exclusive lock on key prefix `name`, the same lock as `etcdctl lock name` and Go's
/// `concurrency.NewMutex(session, "name")`. Waiters are served in the order their keys were
/// created (FIFO). Not reentrant: a second acquire through the same client waits like anyone
/// else's.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(etcd: distlock::etcd::Client) -> distlock::Result<()> {
/// let lock = etcd.mutex("nightly-report")?;
/// match lock.lock_timeout(std::time::Duration::from_secs(5)).await? {
///     Some(guard) => guard.release().await?,
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    client: Client,
    spec: Spec,
}

impl Mutex {
    pub(crate) fn new(client: Client, name: String) -> Mutex {
        let prefix = format!("{name}/");
        let spec = Spec { name, key_prefix: prefix.clone(), naming: Naming::Session, blockers: prefix, limit: 1 };
        Mutex { client, spec }
    }

    /// The lock's name (its key prefix without the `/`).
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Waits as long as it takes.
    pub async fn lock(&self) -> Result<LockGuard> {
        Ok(acquire(&self.client, &self.spec, None).await?.expect("waiting without a deadline ends only with the lock"))
    }

    /// Takes the lock only if it is free; never waits.
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        acquire(&self.client, &self.spec, Some(Duration::ZERO)).await
    }

    /// Waits at most `timeout`; `None` if the lock was not had in time (our key is deleted).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        acquire(&self.client, &self.spec, Some(timeout)).await
    }
}

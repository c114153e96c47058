//! etcd's mutex: the queue of `name/<lease id hex>` keys (`etcdctl lock`'s layout).

use super::kinds::Role;
use super::queue::{acquire, Naming, Spec};
use super::{Client, LockGuard};

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
        let spec =
            Spec { name, key_prefix: prefix, naming: Naming::Session, role: Role::Exclusive, limit: 1, value: None };
        Mutex { client, spec }
    }

    /// The same queue as a candidate of election `name` announcing `value` (Go's
    /// `concurrency.Election` layout: the key holds the proposal).
    pub(crate) fn candidate(client: Client, name: String, value: std::sync::Arc<str>) -> Mutex {
        let mut m = Mutex::new(client, name);
        m.spec.value = Some(value);
        m
    }

    /// The lock's name (its key prefix without the `/`).
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    crate::contract::wait_methods!(LockGuard, "the lock", |l, w| acquire(&l.client, &l.spec, w); lock, try_lock, lock_timeout);
}

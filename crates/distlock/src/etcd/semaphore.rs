//! A counting semaphore: `n` permits, each a key under `name/`; the oldest `n` keys hold.

use super::kinds::Role;
use super::queue::{acquire, Naming, Spec};
use super::{Client, LockGuard};

/// A semaphore of `n` permits on key prefix `name`: a permit is ours while fewer than `n` keys
/// under `name/` are older than ours, so permits go out in the order keys were created (FIFO).
/// A waiter recounts after every deletion under the prefix (it cannot know which holder leaves
/// first). A permit's fencing token is its key's create revision.
///
/// Every user of one name must give the same `n`: it is not stored on the server.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(etcd: distlock::etcd::Client) -> distlock::Result<()> {
/// let pool = etcd.semaphore("gpu", 2)?;
/// let a = pool.acquire().await?;
/// let b = pool.acquire().await?;
/// assert!(pool.try_acquire().await?.is_none());
/// a.release().await?;
/// b.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Client,
    spec: Spec,
}

impl Semaphore {
    pub(crate) fn new(client: Client, name: String, permits: u32) -> Semaphore {
        let prefix = format!("{name}/");
        let spec = Spec {
            name,
            key_prefix: prefix,
            naming: Naming::SessionUnique,
            role: Role::Permit,
            limit: permits,
            value: None,
        };
        Semaphore { client, spec }
    }

    /// The semaphore's name (its key prefix without the `/`).
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.spec.limit
    }

    crate::contract::wait_methods!(LockGuard, "a permit", |l, w| acquire(&l.client, &l.spec, w); acquire, try_acquire, acquire_timeout);
}

//! Redisson's reentrant lock (RLock layout), fenced.

use super::guard::{reentrant_guard, Holder, Reentry};
use super::{scripts, Client, Keys};
use crate::Result;
use std::sync::Arc;
use tokio::time::Instant;

/// A reentrant mutex in Redisson's RLock layout: a hash at the lock's key whose field
/// `<client uuid>:<n>` counts this handle's holds (a fresh `n` for every new hold, so that a late
/// release or renewal of an ended hold can never touch the next one).
///
/// The owner is the handle (clones of it included): locking again through it re-enters and
/// returns another guard with the same fencing token, as a Java thread re-enters a Redisson lock.
/// Other handles, in this process or elsewhere, wait. Waiters are woken by Redisson's release
/// message or when the holder's lease runs out.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(redis: distlock::redis::Client) -> distlock::Result<()> {
/// let lock = redis.mutex("orders")?;
/// let outer = lock.lock().await?;
/// let inner = lock.lock().await?;             // re-entered: same token
/// assert_eq!(outer.fencing_token(), inner.fencing_token());
/// inner.release().await?;
/// outer.release().await?;
/// if let Some(g) = lock.try_lock().await? {   // never waits
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    keys: Keys,
    /// The hold in progress.
    reentry: Arc<Reentry>,
    /// An election candidate's value (see [`crate::election`]), put in the hash with the grant.
    value: Option<Arc<str>>,
}

impl Mutex {
    pub(crate) fn new(client: Client, key: String) -> Mutex {
        Mutex {
            inner: Arc::new(Inner {
                keys: Keys::new(client, key, super::redisson_channel),
                reentry: Arc::default(),
                value: None,
            }),
        }
    }

    /// A candidate of election `key` announcing `value`.
    pub(crate) fn candidate(client: Client, key: String, value: Arc<str>) -> Mutex {
        Mutex {
            inner: Arc::new(Inner {
                keys: Keys::new(client, key, super::redisson_channel),
                reentry: Arc::default(),
                value: Some(value),
            }),
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.inner.keys.key
    }

    /// The hash field of this handle's hold in progress (`<client uuid>:<n>`), if any.
    pub fn field(&self) -> Option<String> {
        self.inner.reentry.field()
    }

    crate::contract::wait_methods!(MutexGuard, "the lock", |l, w| l.acquire(w.give_up_at()); lock, try_lock, lock_timeout);

    async fn acquire(&self, deadline: Option<Instant>) -> Result<Option<MutexGuard>> {
        let inner = &self.inner;
        let mut target = inner
            .keys
            .reentrant(&inner.reentry, &scripts::REDISSON_LOCK, |field, channel| Holder::Redisson { field, channel });
        target.value = inner.value.clone();
        target.acquire(inner.keys.client.fresh_field(), deadline, MutexGuard::new).await
    }
}

reentrant_guard! {
    /// Proof of holding a [`Mutex`]; released by [`release`](MutexGuard::release) or, in the
    /// background, on drop.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: distlock::redis::Mutex) -> distlock::Result<()> {
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => guard.release().await?,
    ///     reason = guard.lost() => eprintln!("lost: {reason}"),
    /// }
    /// # Ok(()) }
    /// ```
    MutexGuard
}

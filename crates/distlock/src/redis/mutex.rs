//! Redisson's reentrant lock (RLock layout), fenced.

use super::guard::{enter, reentrant_guard, Hold, Holder};
use super::{acquire_loop, scripts, Attempt, Client};
use crate::Result;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::time::Instant;

/// A reentrant mutex in Redisson's RLock layout: a hash at the lock's key whose field
/// `<client uuid>:<handle id>` counts this handle's holds.
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
    client: Client,
    key: String,
    field: String,
    channel: String,
    token_key: String,
    /// The token of the hold in progress and how many guards share it.
    reentry: Arc<StdMutex<Option<(u64, usize)>>>,
}

impl Mutex {
    pub(crate) fn new(client: Client, key: String) -> Mutex {
        let field = format!("{}:{}", client.client_id(), client.next_handle_id());
        Mutex {
            inner: Arc::new(Inner {
                channel: super::redisson_channel(&key),
                token_key: super::token_key(&key),
                client,
                key,
                field,
                reentry: Arc::default(),
            }),
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// This handle's hash field, `<client uuid>:<handle id>`.
    pub fn field(&self) -> &str {
        &self.inner.field
    }

    /// Waits as long as it takes.
    pub async fn lock(&self) -> Result<MutexGuard> {
        Ok(self.acquire(None).await?.expect("waiting without a deadline ends only with the lock"))
    }

    /// Takes the lock only if it is free (or already this handle's); never waits.
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        self.acquire(Some(Instant::now())).await
    }

    /// Waits at most `timeout` (one too large to count is forever); `None` if the lock was not
    /// had in time.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<MutexGuard>> {
        self.acquire(Instant::now().checked_add(timeout)).await
    }

    async fn acquire(&self, deadline: Option<Instant>) -> Result<Option<MutexGuard>> {
        let inner = &self.inner;
        acquire_loop(&inner.client, &inner.channel, deadline, None, || {
            let inner = inner.clone();
            async move {
                let sent = Instant::now();
                let client = &inner.client;
                let ((code, token), replication): ((i64, u64), _) = client
                    .eval_acquire(
                        &scripts::REDISSON_LOCK,
                        &[&inner.key, &inner.token_key],
                        &[client.lease_ms().to_string(), inner.field.clone()],
                        &inner.key,
                    )
                    .await?;
                if !(-2..0).contains(&code) {
                    return Ok(Attempt::Held(code));
                }
                let token = enter(&inner.reentry, code, token);
                let holder = Holder::Redisson { field: inner.field.clone(), channel: inner.channel.clone() };
                let hold = Hold::new(client.clone(), inner.key.clone(), holder, token, sent);
                let guard = MutexGuard::new(hold, inner.reentry.clone());
                replication.check(&inner.key)?; // not confirmed: the guard drops and releases
                Ok(Attempt::Acquired(guard))
            }
        })
        .await
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

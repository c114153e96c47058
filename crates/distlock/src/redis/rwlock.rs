//! Redisson's read/write lock (RReadWriteLock layout), fenced.

use super::guard::{enter, reentrant_guard, Entry, Hold, Holder, Plan, Reentry};
use super::{acquire_loop, scripts, Attempt, Client, Keys};
use crate::{Error, Result};
use std::sync::Arc;
use tokio::time::Instant;

/// A read/write lock in Redisson's RReadWriteLock layout: a hash at the lock's key with field
/// `mode` (`read` or `write`), one field per reading handle (`<client uuid>:<n>`, its hold count)
/// with a key per read hold (`{K}:<field>:rwlock_timeout:<i>`, each with the lease), and
/// `<client uuid>:<n>:write` for the writer. Every new hold (not a re-entry) gets a fresh `n`. Releases publish on `redisson_rwlock:{K}`.
///
/// Readers share; a writer excludes everyone else. The owner is the handle (clones included):
/// it re-enters both sides, and its writer may also take read holds (a downgrade: release the
/// write guard and the reads stay). Taking the write lock while holding only reads is refused
/// with [`Error::WouldDeadlock`]. As in Redisson, readers that keep coming can hold a waiting
/// writer off: this lock is not FIFO.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(redis: distlock::redis::Client) -> distlock::Result<()> {
/// let config = redis.rwlock("config")?;
/// let w = config.write().await?;
/// let r = config.read().await?;     // downgrade: the writer may read
/// w.release().await?;               // still read-locked
/// r.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    keys: Keys,
    key_prefix: String,
    /// This handle's read hold in progress, and its write hold.
    reads: Arc<Reentry>,
    writes: Arc<Reentry>,
}

impl RwLock {
    pub(crate) fn new(client: Client, key: String) -> RwLock {
        RwLock {
            inner: Arc::new(Inner {
                key_prefix: super::suffix_name(&key, ""),
                keys: Keys::new(client, key, |key| super::prefix_name("redisson_rwlock", key)),
                reads: Arc::default(),
                writes: Arc::default(),
            }),
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.inner.keys.key
    }

    crate::contract::wait_methods!(ReadGuard, "a read hold", |l, w| l.read_until(w.give_up_at()); read, try_read, read_timeout);

    crate::contract::wait_methods!(WriteGuard, "the write hold (`Error::WouldDeadlock` if this handle holds only reads)", |l, w| l.write_until(w.give_up_at()); write, try_write, write_timeout);

    async fn read_until(&self, deadline: Option<Instant>) -> Result<Option<ReadGuard>> {
        let inner = &self.inner;
        let fresh = inner.keys.client.fresh_field();
        acquire_loop(&inner.keys.client, &inner.keys.channel, deadline, None, || {
            let (inner, fresh) = (inner.clone(), fresh.clone());
            async move {
                let inner: &Inner = &inner;
                let client = &inner.keys.client;
                let eval = |plan: Plan| async move {
                    let sent = Instant::now();
                    // Our own write hold lets us read (a downgrade).
                    let writing = inner.writes.field().unwrap_or_else(|| "-".into());
                    let (reply, replication) = client
                        .eval_acquire(
                            &scripts::READ_LOCK,
                            &[&inner.keys.key, &inner.timeouts(&plan.field), &inner.keys.token_key],
                            &[client.lease_ms().to_string(), plan.field.clone(), writing, plan.mode()],
                            &inner.keys.key,
                        )
                        .await?;
                    Ok((reply, replication, sent))
                };
                let (field, token, sent, replication) = match enter(&inner.reads, &fresh, &inner.keys.key, eval).await?
                {
                    Entry::Held(reply) => return Ok(Attempt::Held(reply[1])),
                    Entry::Entered { field, token, sent, replication } => (field, token, sent, replication),
                };
                let holder = Holder::Read {
                    timeouts: inner.timeouts(&field),
                    field,
                    channel: inner.keys.channel.clone(),
                    key_prefix: inner.key_prefix.clone(),
                };
                let hold = Hold::new(client.clone(), inner.keys.key.clone(), holder, token, sent);
                let guard = ReadGuard::new(hold, inner.reads.clone());
                replication.check(&inner.keys.key)?; // not confirmed: the guard drops and releases
                Ok(Attempt::Acquired(guard))
            }
        })
        .await
    }

    async fn write_until(&self, deadline: Option<Instant>) -> Result<Option<WriteGuard>> {
        let inner = &self.inner;
        let reading = inner.reads.field().is_some();
        let writing = inner.writes.field().is_some();
        if reading && !writing {
            return Err(Error::WouldDeadlock {
                lock: inner.keys.key.clone(),
                reason: "this handle holds a read lock; a write lock would wait for it forever (upgrade is refused)",
            });
        }
        let target = inner
            .keys
            .reentrant(&inner.writes, &scripts::WRITE_LOCK, |field, channel| Holder::Write { field, channel });
        target.acquire(format!("{}:write", inner.keys.client.fresh_field()), deadline, WriteGuard::new).await
    }
}

impl Inner {
    /// The prefix of the per-hold timeout keys of read field `field`: `{K}:<field>:rwlock_timeout`.
    fn timeouts(&self, field: &str) -> String {
        super::suffix_name(&self.keys.key, &format!("{field}:rwlock_timeout"))
    }
}

reentrant_guard! {
    /// A read hold of a [`RwLock`]; released by `release()` or, in the background, on drop.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: distlock::redis::RwLock) -> distlock::Result<()> {
    /// let r = lock.read().await?;
    /// println!("token {}", r.fencing_token());
    /// r.release().await
    /// # }
    /// ```
    ReadGuard
}

reentrant_guard! {
    /// The write hold of a [`RwLock`]; released by `release()` or, in the background, on drop.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: distlock::redis::RwLock) -> distlock::Result<()> {
    /// let w = lock.write().await?;
    /// println!("token {}", w.fencing_token());
    /// w.release().await
    /// # }
    /// ```
    WriteGuard
}

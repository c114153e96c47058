//! The plain lock: `SET K value NX PX lease`, compatible with redis-py's `Lock`.

use super::guard::{hold_methods, Hold, Holder};
use super::{acquire_loop, scripts, Answer, Attempt, Client, Keys};
use crate::Result;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often a waiter re-checks a simple lock: a redis-py holder releases without a message.
const RECHECK: Duration = Duration::from_millis(100);

/// The plain lock: a string key set with `SET K value NX PX lease` to a random value, released
/// by compare-and-delete and renewed by compare-and-pexpire. redis-py's `Lock(K)` uses the same
/// key and compare scripts, so the two exclude each other.
///
/// Not reentrant: a second `lock()` through any handle waits (as redis-py's does).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(redis: distlock::redis::Client) -> distlock::Result<()> {
/// let lock = redis.simple_lock("reports")?;
/// match lock.try_lock().await? {
///     Some(g) => g.release().await?,
///     None => println!("someone else is writing reports"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SimpleLock {
    inner: Arc<Keys>,
}

impl SimpleLock {
    pub(crate) fn new(client: Client, key: String) -> SimpleLock {
        SimpleLock { inner: Arc::new(Keys::new(client, key, super::simple_channel)) }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    crate::contract::wait_methods!(SimpleGuard, "the lock", |l, w| l.acquire(w.give_up_at()); lock, try_lock, lock_timeout);

    async fn acquire(&self, deadline: Option<Instant>) -> Result<Option<SimpleGuard>> {
        let inner = &self.inner;
        // One value for every attempt of this acquire: an attempt whose answer was lost is
        // found by the next one and granted to it, not left holding the key for a lease.
        let value = inner.client.fresh_value();
        acquire_loop(&inner.client, &inner.channel, deadline, Some(RECHECK), || {
            let (inner, value) = (inner.clone(), value.clone());
            async move {
                let sent = Instant::now();
                let client = &inner.client;
                let (reply, replication): (Vec<i64>, _) = client
                    .eval_acquire(
                        &scripts::SIMPLE_LOCK,
                        &[&inner.key, &inner.token_key],
                        &[value.clone(), client.lease_ms().to_string()],
                        &inner.key,
                    )
                    .await?;
                let token = match Answer::parse(&reply, &inner.key)? {
                    Answer::Granted(token) => token,
                    Answer::Held(ttl) => return Ok(Attempt::Held(ttl)),
                    _ => return Err(Answer::unexpected(&reply, &inner.key)),
                };
                let holder = Holder::Simple { value, channel: inner.channel.clone() };
                let guard =
                    SimpleGuard { hold: Some(Hold::new(client.clone(), inner.key.clone(), holder, token, sent)) };
                replication.check(&inner.key)?; // not confirmed: the guard drops and releases
                Ok(Attempt::Acquired(guard))
            }
        })
        .await
    }
}

/// Proof of holding a [`SimpleLock`]; released by [`release`](SimpleGuard::release) or, in the
/// background, on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::redis::SimpleLock) -> distlock::Result<()> {
/// let g = lock.lock().await?;
/// println!("value {} token {}", g.holder_id(), g.fencing_token());
/// g.release().await
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct SimpleGuard {
    hold: Option<Hold>,
}

impl SimpleGuard {
    hold_methods!(hold_ref);

    fn hold_ref(&self) -> &Hold {
        self.hold.as_ref().expect("a guard holds until released")
    }

    /// Deletes the key if it is still ours and waits for the answer;
    /// [`Error::LockLost`](crate::Error::LockLost) if it was lost before or no longer ours.
    pub async fn release(mut self) -> Result<()> {
        self.hold.take().expect("a guard holds until released").release().await
    }
}

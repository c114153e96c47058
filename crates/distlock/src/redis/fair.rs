//! A fair (FIFO) reentrant lock whose order and timeouts depend only on the server.

use super::guard::{enter, reentrant_guard, Entry, Hold, Holder, Plan, Reentry};
use super::{scripts, Client};
use crate::{QueueStatus, Result};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A reentrant lock granted in arrival order.
///
/// Layout (lock name `K`): the lock itself is Redisson's RLock hash `K` (so Redisson's `getLock`
/// holders and ours exclude each other); waiters line up in the list
/// `distlock_fair_queue:{K}`, and `distlock_fair_alive:{K}` scores each waiter with the server
/// time until which its place is kept. A waiter refreshes its place every third of the lease
/// while it waits; one that dies or stops trying is dropped from the head of the queue once that
/// time passes, by the server's clock. No client clock takes part (Redisson's fair lock compares
/// deadlines computed on client clocks, which is how its queues drift and hang). The final
/// release wakes only the first live waiter, on `distlock_fair__channel:{K}:<its field>`. Each
/// acquire waits (and, granted, holds) under a field of its own, `<client uuid>:<n>`.
///
/// A waiter that gives up (timeout, cancellation) leaves the queue at once, and wakes the next
/// one if the lock is free. `try_lock` never takes the lock past waiters in the queue.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(redis: distlock::redis::Client) -> distlock::Result<()> {
/// let lock = redis.fair_lock("tickets")?;
/// let g = lock.lock().await?;        // granted in arrival order
/// g.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FairLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    key: String,
    queue: String,
    alive: String,
    channel_prefix: String,
    token_key: String,
    reentry: Arc<Reentry>,
}

/// What one attempt found.
enum Outcome {
    Granted(FairGuard),
    Waiting { ttl_ms: i64, status: QueueStatus },
}

impl FairLock {
    pub(crate) fn new(client: Client, key: String) -> FairLock {
        FairLock {
            inner: Arc::new(Inner {
                channel_prefix: super::prefix_name("distlock_fair__channel", &key),
                queue: super::prefix_name("distlock_fair_queue", &key),
                alive: super::prefix_name("distlock_fair_alive", &key),
                token_key: super::token_key(&key),
                client,
                key,
                reentry: Arc::default(),
            }),
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// Waits, in arrival order, as long as it takes.
    pub async fn lock(&self) -> Result<FairGuard> {
        Ok(self.lock_with(None, None).await?.expect("waiting without a deadline ends only with the lock"))
    }

    /// Takes the lock only if it is free and nobody waits for it (or it is this handle's).
    pub async fn try_lock(&self) -> Result<Option<FairGuard>> {
        self.lock_with(Some(Duration::ZERO), None).await
    }

    /// Waits at most `timeout`; leaves the queue if not granted by then.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<FairGuard>> {
        self.lock_with(Some(timeout), None).await
    }

    /// `timeout` `None` waits forever, `Some(ZERO)` never waits; `progress` receives the place in
    /// the queue while waiting.
    pub async fn lock_with(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<FairGuard>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let fresh = self.inner.client.fresh_field();
        if timeout == Some(Duration::ZERO) {
            return Ok(match self.attempt(&fresh, false).await? {
                Outcome::Granted(g) => Some(g),
                Outcome::Waiting { .. } => None,
            });
        }
        let inner = &self.inner;
        let channel = format!("{}:{fresh}", inner.channel_prefix);
        let registration = inner.client.inner.wake.register(&channel);
        // From here on we may be queued: leave the queue however this ends, unless granted.
        let mut queued = Queued { inner: Some((inner.clone(), fresh.clone())) };
        let heartbeat = inner.client.lease() / 3;
        // Whether the last wait ended without a message (a re-check on our own initiative).
        let mut unprompted = false;
        loop {
            if unprompted {
                inner.client.look_for_failover();
            }
            let subscribed = super::subscribe_until(&inner.client, &channel, deadline).await;
            let notified = registration.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // A connection error or a failover does not end a wait with time left: try again.
            let mut failed = false;
            let ttl = match self.attempt(&fresh, true).await {
                Ok(Outcome::Granted(g)) => {
                    queued.inner = None;
                    return Ok(Some(g));
                }
                Ok(Outcome::Waiting { ttl_ms, status }) => {
                    if let Some(p) = progress {
                        p.send_replace(status);
                    }
                    ttl_ms
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(key = %inner.key, error = %e, "fair lock attempt failed; retrying");
                    failed = true;
                    0
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                queued.leave().await;
                return Ok(None);
            }
            // Wake on our message, when the holder's lease runs out, or in time to keep our
            // place in the queue; at the latest at the fallback poll (our message may be lost).
            let mut wait = heartbeat.min(super::FALLBACK_POLL);
            if ttl > 0 {
                wait = wait.min(Duration::from_millis(ttl as u64 + 1));
            }
            if !subscribed || failed {
                wait = wait.min(Duration::from_millis(100));
            }
            let until = deadline.map_or(now + wait, |d| d.min(now + wait));
            unprompted = tokio::select! {
                _ = &mut notified => false,
                _ = tokio::time::sleep_until(until) => true,
            };
        }
    }

    /// One attempt, finished in the background if dropped (a grant made for a dropped acquire is
    /// released):
    /// re-enter the hold in progress, or ask for a new one under `fresh`.
    async fn attempt(&self, fresh: &str, enqueue: bool) -> Result<Outcome> {
        let (inner, fresh) = (self.inner.clone(), fresh.to_string());
        let task = crate::background::detach(async move {
            let inner: &Inner = &inner;
            let client = &inner.client;
            let eval = |plan: Plan| async move {
                let sent = Instant::now();
                let args =
                    [client.lease_ms().to_string(), plan.field.clone(), (enqueue as u8).to_string(), plan.mode()];
                let (reply, replication) = client
                    .eval_acquire(
                        &scripts::FAIR_LOCK,
                        &[&inner.key, &inner.queue, &inner.alive, &inner.token_key],
                        &args,
                        &inner.key,
                    )
                    .await?;
                Ok((reply, replication, sent))
            };
            let (field, token, sent, replication) = match enter(&inner.reentry, &fresh, &inner.key, eval).await? {
                Entry::Held(reply) => {
                    let at = |i: usize| reply.get(i).copied().unwrap_or(0).max(0) as usize;
                    let status = QueueStatus { ahead: at(2).saturating_sub(1), queue_len: at(3) };
                    return Ok(Outcome::Waiting { ttl_ms: reply[1], status });
                }
                Entry::Entered { field, token, sent, replication } => (field, token, sent, replication),
            };
            let holder = Holder::Fair {
                field,
                queue: inner.queue.clone(),
                alive: inner.alive.clone(),
                channel_prefix: inner.channel_prefix.clone(),
            };
            let hold = Hold::new(client.clone(), inner.key.clone(), holder, token, sent);
            let guard = FairGuard::new(hold, inner.reentry.clone());
            replication.check(&inner.key)?; // not confirmed: the guard drops and releases
            Ok(Outcome::Granted(guard))
        });
        task.await
    }
}

/// Our place in the queue: removed when the acquire ends without the lock, however it ends.
struct Queued {
    inner: Option<(Arc<Inner>, String)>,
}

impl Queued {
    async fn leave(&mut self) {
        if let Some((inner, field)) = self.inner.take() {
            let _ = leave_queue(&inner, &field).await;
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if let (Some((inner, field)), Ok(handle)) = (self.inner.take(), tokio::runtime::Handle::try_current()) {
            handle.spawn(async move {
                let _ = leave_queue(&inner, &field).await;
            });
        }
    }
}

async fn leave_queue(inner: &Inner, field: &str) -> Result<()> {
    let _: i64 = inner
        .client
        .eval(
            scripts::FAIR_LEAVE.pick(inner.client.sharded()),
            &[&inner.key, &inner.queue, &inner.alive, &inner.channel_prefix],
            &[field.to_string()],
            "leave queue",
            &inner.key,
        )
        .await?;
    Ok(())
}

reentrant_guard! {
    /// Proof of holding a [`FairLock`]; released by [`release`](FairGuard::release) or, in the
    /// background, on drop (waking the next waiter).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: distlock::redis::FairLock) -> distlock::Result<()> {
    /// let g = lock.lock().await?;
    /// println!("token {}", g.fencing_token());
    /// g.release().await
    /// # }
    /// ```
    FairGuard
}

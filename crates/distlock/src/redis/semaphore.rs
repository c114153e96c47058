//! A counting semaphore whose permits expire with their holder, judged by the server's clock.

use super::guard::{hold_methods, Hold, Holder};
use super::{acquire_loop, scripts, Answer, Attempt, Client, Keys};
use crate::{Error, Result};
use std::sync::Arc;
use tokio::time::Instant;

/// A semaphore of `permits` permits on key `K`: a sorted set of permit ids scored by their expiry
/// in the server's clock (ms), the permit count in `{K}:permits`, releases published on
/// `distlock_semaphore__channel:{K}`.
///
/// Each permit has the client's lease and is renewed by its guard's watchdog; a holder that dies
/// stops renewing and its permit comes back when the lease runs out (the next acquire drops
/// expired permits first). Expiry is decided by the server alone, never by client clocks (unlike
/// Redisson's RPermitExpirableSemaphore). Every user of a key must give the same permit count;
/// another count is refused with an error naming both.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(redis: distlock::redis::Client) -> distlock::Result<()> {
/// let pool = redis.semaphore("db-connections", 3)?;
/// let permit = pool.acquire().await?;     // at most 3 holders at a time
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    keys: Keys,
    permits: u32,
    permits_key: String,
}

impl Semaphore {
    pub(crate) fn new(client: Client, key: String, permits: u32) -> Result<Semaphore> {
        if permits == 0 {
            return Err(Error::InvalidArgument {
                what: "permit count",
                reason: "a semaphore needs at least 1 permit".into(),
            });
        }
        Ok(Semaphore {
            inner: Arc::new(Inner {
                permits_key: super::suffix_name(&key, "permits"),
                keys: Keys::new(client, key, |key| super::prefix_name("distlock_semaphore__channel", key)),
                permits,
            }),
        })
    }

    /// The semaphore's key.
    pub fn key(&self) -> &str {
        &self.inner.keys.key
    }

    /// The permit count.
    pub fn permits(&self) -> u32 {
        self.inner.permits
    }

    crate::contract::wait_methods!(SemaphorePermit, "a permit", |l, w| l.acquire_until(w.give_up_at()); acquire, try_acquire, acquire_timeout);

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<SemaphorePermit>> {
        let inner = &self.inner;
        // One permit id for every attempt of this acquire (see `SimpleLock`).
        let id = inner.keys.client.fresh_field();
        acquire_loop(&inner.keys.client, &inner.keys.channel, deadline, None, || {
            let (inner, id) = (inner.clone(), id.clone());
            async move {
                let sent = Instant::now();
                let client = &inner.keys.client;
                let (reply, replication): (Vec<i64>, _) = client
                    .eval_acquire(
                        &scripts::SEMAPHORE_ACQUIRE,
                        &[&inner.keys.key, &inner.permits_key, &inner.keys.token_key],
                        &[inner.permits.to_string(), id.clone(), client.lease_ms().to_string()],
                        &inner.keys.key,
                    )
                    .await?;
                let value = match Answer::parse(&reply, &inner.keys.key)? {
                    Answer::Granted(token) => token,
                    Answer::OtherPermits(permits) => {
                        return Err(Error::InvalidArgument {
                            what: "permit count",
                            reason: format!(
                                "semaphore {} is in use with {permits} permits, not {}",
                                inner.keys.key, inner.permits
                            ),
                        })
                    }
                    Answer::Held(wait) => return Ok(Attempt::Held(wait)),
                    Answer::Reentered | Answer::Gone => return Err(Answer::unexpected(&reply, &inner.keys.key)),
                };
                let holder =
                    Holder::Permit { id, permits_key: inner.permits_key.clone(), channel: inner.keys.channel.clone() };
                let permit = SemaphorePermit {
                    hold: Some(Hold::new(client.clone(), inner.keys.key.clone(), holder, value, sent)),
                };
                replication.check(&inner.keys.key)?; // not confirmed: the permit drops and is given back
                Ok(Attempt::Acquired(permit))
            }
        })
        .await
    }
}

/// One permit of a [`Semaphore`]; released by [`release`](SemaphorePermit::release) or, in the
/// background, on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(pool: distlock::redis::Semaphore) -> distlock::Result<()> {
/// let p = pool.acquire().await?;
/// println!("permit {} token {}", p.holder_id(), p.fencing_token());
/// p.release().await
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct SemaphorePermit {
    hold: Option<Hold>,
}

impl SemaphorePermit {
    hold_methods!(hold_ref);

    fn hold_ref(&self) -> &Hold {
        self.hold.as_ref().expect("a permit holds until released")
    }

    /// Gives the permit back and waits for the server;
    /// [`Error::LockLost`](crate::Error::LockLost) if it had expired before.
    pub async fn release(mut self) -> Result<()> {
        self.hold.take().expect("a permit holds until released").release().await
    }
}

//! The semaphore: `n` slot keys (`permits.<name>.<i>`); a permit is the first free slot taken by
//! a guarded create, and a waiter watches every slot for a delete or expiry marker.

use super::hold::{new_owner, try_once, until_free, Mark, Tried};
use super::{key, Client, LockGuard};
use crate::contract::Wait;
use crate::Result;
use tokio::time::Instant;

/// A semaphore of `permits` permits named `name`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(nats: distlock::nats::Client) -> distlock::Result<()> {
/// let pool = nats.semaphore("exports", 3)?;
/// if let Some(permit) = pool.try_acquire().await? {
///     permit.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Client,
    name: String,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(client: Client, name: String, permits: u32) -> Semaphore {
        Semaphore { client, name, permits }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    crate::contract::wait_methods!(LockGuard, "a permit", |l, w| l.take(w); acquire, try_acquire, acquire_timeout);

    async fn take(&self, wait: Wait) -> Result<Option<LockGuard>> {
        let (client, name) = (&self.client, self.name.as_str());
        let owner = new_owner();
        let mark = Mark { kind: "permit", permits: Some(self.permits), value: None };
        let give_up = wait.give_up_at();
        let base = key("permits", name);
        loop {
            // The earliest sequence seen on a busy slot: a slot freed after we looked at it is
            // freed after that.
            let mut first_busy = u64::MAX;
            for i in 0..self.permits {
                let slot = format!("{base}.{i}");
                let mut expect = client.hint(&slot);
                // A free slot's last message (a delete or marker) may change under us: a few tries.
                for _ in 0..3 {
                    match try_once(client, name, &slot, &owner, &mark, expect, wait).await? {
                        Some(Tried::Got(g)) => {
                            // No mutex or read/write lock of the name (`kinds.rs`), or the slot
                            // we took goes again.
                            if let Err(e) = super::kinds::no_locks(client, name, self.permits).await {
                                g.release().await.ok();
                                return Err(e);
                            }
                            return Ok(Some(g));
                        }
                        Some(Tried::Free(seq)) => expect = seq,
                        Some(Tried::Busy(seq)) => {
                            first_busy = first_busy.min(seq);
                            break;
                        }
                        None => return Ok(None),
                    }
                }
            }
            if give_up.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            let from = if first_busy == u64::MAX { 0 } else { first_busy };
            until_free(client, &format!("{base}.*"), from, give_up).await;
        }
    }
}

//! A counting semaphore: `permits` advisory-lock slots, a permit being one slot held.

use super::{Client, Mutex, MutexGuard};
use crate::contract::Wait;
use crate::{Error, Result};
use std::sync::Arc;
use tokio::time::Instant;

/// The channel releases of a permit are announced on (`NOTIFY`, payload: the semaphore's name).
pub(crate) const RELEASED_CHANNEL: &str = "distlock_semaphore";

/// At most `permits` holders at once: each permit is one of `permits` advisory locks (slot `i`'s
/// key is the SHA-1 key of `name` + `\0permit:i/permits`), taken with the mutex's statement and
/// guard (so with its fencing token, lease and loss signal).
///
/// PostgreSQL cannot wait for "any of these locks", so a waiter tries the slots, then waits to be
/// told of a release: releases `NOTIFY` on channel `distlock_semaphore`, which every client
/// `LISTEN`s to on one connection of its own; a permit freed by a dead holder's session is found
/// by a rescan every 0.5 s (`?rescan=`). Waiters are not served in order. Every user of one semaphore must
/// give the same `permits`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(pg: distlock::postgres::Client) -> distlock::Result<()> {
/// let pool = pg.semaphore("exports", 3)?;
/// let permit = pool.acquire().await?;
/// println!("permit with token {}", permit.fencing_token());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Client,
    name: String,
    slots: Arc<Vec<Mutex>>,
}

/// Proof of holding one permit of a [`Semaphore`] (the mutex's guard on one slot).
pub type SemaphorePermit = MutexGuard;

impl Semaphore {
    pub(crate) fn new(client: Client, name: &str, permits: u32) -> Result<Semaphore> {
        if permits == 0 || permits > 1024 {
            return Err(Error::InvalidArgument {
                what: "permits",
                reason: format!("{permits}: a PostgreSQL semaphore has 1 to 1024 permits"),
            });
        }
        let slots = (0..permits)
            .map(|i| {
                let key = super::url::hashed_key(&format!("{name}\0permit:{i}/{permits}"));
                Mutex::new_slot(client.clone(), name.to_string(), key)
            })
            .collect();
        Ok(Semaphore { client, name: name.to_string(), slots: Arc::new(slots) })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.slots.len() as u32
    }

    crate::contract::wait_methods!(SemaphorePermit, "a permit", |l, w| l.take(w); acquire, try_acquire, acquire_timeout);

    /// A permit within `wait`.
    async fn take(&self, wait: Wait) -> Result<Option<SemaphorePermit>> {
        match wait {
            Wait::Never => self.scan().await,
            wait => self.wait(wait.deadline()).await,
        }
    }

    /// Tries every slot once, from a random one (so that holders spread over the slots).
    async fn scan(&self) -> Result<Option<SemaphorePermit>> {
        let n = self.slots.len();
        let first = uuid::Uuid::new_v4().as_u128() as usize % n;
        for i in 0..n {
            if let Some(g) = self.slots[(first + i) % n].try_lock().await? {
                return Ok(Some(g));
            }
        }
        Ok(None)
    }

    async fn wait(&self, deadline: Option<Instant>) -> Result<Option<SemaphorePermit>> {
        let released = self.client.releases(&self.name).await;
        // A permit freed by a holder's session ending (a crash, a partition) announces nothing:
        // rescan now and then unprompted.
        let rescan = self.client.url().rescan;
        loop {
            let told = released.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if let Some(g) = self.scan().await? {
                return Ok(Some(g));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let until = deadline.map_or(now + rescan, |d| d.min(now + rescan));
            tokio::select! {
                _ = told => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

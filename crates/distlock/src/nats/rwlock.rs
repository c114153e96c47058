//! The read/write lock: a writer takes the name's exclusive key (as the mutex does), then waits
//! until no reader's key is left; a reader waits until the exclusive key is free, creates a key
//! of its own (`reads.<name>.<random>`), then reads the exclusive key again and steps back (its
//! key deleted) if a mutex or writer took it meanwhile. Both sides write, then read the other's
//! keys from the stream's leader, so one of them always sees the other; a waiting writer keeps
//! new readers out (writer preference).

use super::hold::{new_owner, try_once, until_free, Mark, Tried};
use super::{key, live, Client, LockGuard};
use crate::contract::{Kind, Wait};
use crate::Result;
use tokio::time::Instant;

/// A read/write lock named `name`: shared readers or one writer (or the mutex of the name).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(nats: distlock::nats::Client) -> distlock::Result<()> {
/// let rw = nats.rwlock("catalog")?;
/// let reading = rw.read().await?;
/// reading.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    client: Client,
    name: String,
}

impl RwLock {
    pub(crate) fn new(client: Client, name: String) -> RwLock {
        RwLock { client, name }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    crate::contract::wait_methods!(LockGuard, "a read lock", |l, w| l.acquire_read(w); read, try_read, read_timeout);
    crate::contract::wait_methods!(LockGuard, "the write lock", |l, w| l.acquire_write(w); write, try_write, write_timeout);

    async fn acquire_write(&self, wait: Wait) -> Result<Option<LockGuard>> {
        let mark = Mark { kind: "write", permits: None, value: None };
        super::mutex::exclusive(&self.client, &self.name, &key("locks", &self.name), &mark, Kind::Write, wait).await
    }

    async fn acquire_read(&self, wait: Wait) -> Result<Option<LockGuard>> {
        let (client, name) = (&self.client, self.name.as_str());
        let exclusive = key("locks", name);
        let owner = new_owner();
        let mark = Mark { kind: "read", permits: None, value: None };
        let give_up = wait.give_up_at();
        loop {
            // No mutex or writer now: a key of our own, then a look again.
            if let Some(seq) = held_at(client, &exclusive).await? {
                if give_up.is_some_and(|d| Instant::now() >= d) {
                    return Ok(None);
                }
                until_free(client, &exclusive, seq, give_up).await;
                continue;
            }
            let mine = format!("{}.{}", key("reads", name), &uuid::Uuid::new_v4().simple().to_string()[..16]);
            let guard = match try_once(client, name, &mine, &owner, &mark, 0, wait).await? {
                Some(Tried::Got(g)) => g,
                Some(_) => continue, // a fresh key is free: taken only by a race of ours
                None => return Ok(None),
            };
            let Some(seq) = held_at(client, &exclusive).await? else {
                // No semaphore of the name either (`kinds.rs`), or the key we wrote goes again.
                if let Err(e) = super::kinds::no_permits(client, name, Kind::Read).await {
                    guard.release().await.ok();
                    return Err(e);
                }
                return Ok(Some(guard));
            };
            guard.release().await.ok();
            if give_up.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            until_free(client, &exclusive, seq, give_up).await;
        }
    }
}

/// The sequence of `key`'s live value (someone holds it), if any.
async fn held_at(client: &Client, key: &str) -> Result<Option<u64>> {
    Ok(client.read(key).await?.filter(live).map(|e| e.revision))
}

/// Waits (within `wait`) until no reader of `name` holds a key: `false` if some still did at
/// the deadline.
pub(crate) async fn readers_gone(client: &Client, name: &str, wait: Wait) -> Result<bool> {
    let filter = format!("{}.*", key("reads", name));
    let give_up = wait.give_up_at();
    loop {
        // One request when no reader ever used the name (its keys gone a moment after each
        // release), else each reader key's last message.
        if !client.any_message(&filter).await? {
            return Ok(true);
        }
        let (live, first) = client.scan(&filter).await?;
        if live.is_empty() {
            return Ok(true);
        }
        if give_up.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        until_free(client, &filter, first.saturating_sub(1), give_up).await;
    }
}

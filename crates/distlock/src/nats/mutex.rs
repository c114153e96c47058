//! The mutex: the name's exclusive key (the one a writer of the name's read/write lock takes),
//! held once no reader of the name is left.

use super::hold::{take, Mark};
use super::{key, kinds, Client, LockGuard};
use crate::contract::{Kind, Wait};
use crate::Result;

/// A lock on one key of the bucket (`locks.<name>`). Not reentrant: a second acquire waits like
/// anyone's.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(nats: distlock::nats::Client) -> distlock::Result<()> {
/// let lock = nats.mutex("nightly-report")?;
/// match lock.lock_timeout(std::time::Duration::from_secs(5)).await? {
///     Some(guard) => guard.release().await?,
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) key: String,
}

impl Mutex {
    pub(crate) fn new(client: Client, name: String) -> Mutex {
        Mutex { key: key("locks", &name), client, name }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock's key in the bucket.
    pub fn key(&self) -> &str {
        &self.key
    }

    crate::contract::wait_methods!(LockGuard, "the lock", |l, w| l.acquire(w, None); lock, try_lock, lock_timeout);

    /// Acquires within `wait`, the key's value carrying `announce` (an election's value).
    pub(crate) async fn acquire(&self, wait: Wait, announce: Option<String>) -> Result<Option<LockGuard>> {
        let mark = Mark { kind: "mutex", permits: None, value: announce };
        exclusive(&self.client, &self.name, &self.key, &mark, Kind::Mutex, wait).await
    }
}

/// The exclusive key of `name` (a mutex's or a writer's), then no reader left: readers that came
/// before it finish, those after it see it and stay out (`rwlock.rs`); and no permit of a
/// semaphore of the name (`kinds.rs`). One request looks for both when neither was ever there.
/// A guard dropped on an error deletes its key in the background.
pub(crate) async fn exclusive(
    client: &Client,
    name: &str,
    key: &str,
    mark: &Mark,
    wanted: Kind,
    wait: Wait,
) -> Result<Option<LockGuard>> {
    let Some(guard) = take(client, name, key, mark, wait).await? else { return Ok(None) };
    let others = client.keys_on(&kinds::readers_and_permits(name)).await?;
    if others.iter().any(|k| k.starts_with("permits.")) {
        if let Err(e) = kinds::no_permits(client, name, wanted).await {
            guard.release().await.ok();
            return Err(e);
        }
    }
    if !others.iter().any(|k| k.starts_with("reads.")) || super::rwlock::readers_gone(client, name, wait).await? {
        Ok(Some(guard))
    } else {
        guard.release().await.ok();
        Ok(None)
    }
}

//! Redlock: one lock over N independent Redis masters, held while a majority agrees. Opt-in, and
//! deliberately without fencing tokens.

use super::{scripts, Client};
use crate::{Error, LockState, LostReason, Result};
use futures::future::join_all;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A lock over N independent Redis masters (the Redlock algorithm): `SET K value NX PX ttl` on
/// every master at once, held when a majority (N/2+1) said yes within the time the lock is valid;
/// released (compare-and-delete) on all of them otherwise, and tried again after a random pause.
///
/// **No fencing token.** N counters on N masters cannot give one strictly rising sequence, so a
/// [`RedlockGuard`] has no `fencing_token()` and cannot become a [`distlock::Guard`](crate::Guard):
/// code written for fenced locks does not compile with it. What it offers instead is the
/// validity deadline, after which any other client may hold the lock: stop before it. Redlock's
/// safety rests on bounded pauses, network delays and clock drift; a holder paused past the
/// deadline is not stopped by anything. Prefer [`Client::mutex`](super::Client::mutex) with its
/// fencing token where the protected resource can check one.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// use distlock::redis::Redlock;
/// use std::time::Duration;
/// let redlock = Redlock::connect(&["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]).await?;
/// if let Some(g) = redlock.lock_timeout("report", Duration::from_secs(5)).await? {
///     println!("valid until {:?}", g.validity_deadline());
///     g.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Redlock {
    nodes: Arc<Vec<Client>>,
    ttl: Duration,
}

impl Redlock {
    /// Connects to every master (`redis://` URLs; each URL's `lease` is ignored, the first one's
    /// is the lock's time to live). At least three masters, an odd number preferred. A master that
    /// cannot be reached is an error: start with all of them up.
    pub async fn connect(urls: &[&str]) -> Result<Redlock> {
        if urls.len() < 3 {
            return Err(Error::InvalidArgument {
                what: "Redlock masters",
                reason: format!("{} given; Redlock needs at least 3 independent masters", urls.len()),
            });
        }
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            nodes.push(Client::connect(url).await?);
        }
        let ttl = nodes[0].lease();
        Ok(Redlock { nodes: Arc::new(nodes), ttl })
    }

    /// How many masters must agree.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Waits as long as it takes.
    pub async fn lock(&self, name: &str) -> Result<RedlockGuard> {
        Ok(self.acquire(name, None).await?.expect("waiting without a deadline ends only with the lock"))
    }

    /// One round; `None` if a majority did not agree.
    pub async fn try_lock(&self, name: &str) -> Result<Option<RedlockGuard>> {
        self.acquire(name, Some(Instant::now())).await
    }

    /// Rounds until `timeout`.
    pub async fn lock_timeout(&self, name: &str, timeout: Duration) -> Result<Option<RedlockGuard>> {
        self.acquire(name, Instant::now().checked_add(timeout)).await
    }

    async fn acquire(&self, name: &str, deadline: Option<Instant>) -> Result<Option<RedlockGuard>> {
        super::validate_key(name)?;
        loop {
            if let Some(g) = self.round(name).await? {
                return Ok(Some(g));
            }
            let pause = Duration::from_millis(50 + (uuid::Uuid::new_v4().as_u128() % 200) as u64);
            match deadline {
                Some(d) if Instant::now() + pause >= d => return Ok(None),
                _ => tokio::time::sleep(pause).await,
            }
        }
    }

    /// One Redlock round: every master at once, each bounded by a small timeout.
    async fn round(&self, name: &str) -> Result<Option<RedlockGuard>> {
        let value = uuid::Uuid::new_v4().simple().to_string();
        let ttl_ms = self.ttl.as_millis() as u64;
        let per_node = (self.ttl / 100).clamp(Duration::from_millis(5), Duration::from_millis(50));
        let start = Instant::now();
        let replies = join_all(self.nodes.iter().map(|node| {
            let mut conn = node.connection();
            let (name, value) = (name.to_string(), value.clone());
            async move {
                let mut set = redis::cmd("SET");
                set.arg(&name).arg(&value).arg("NX").arg("PX").arg(ttl_ms);
                let reply = tokio::time::timeout(per_node, set.query_async::<Option<String>>(&mut conn)).await;
                matches!(reply, Ok(Ok(Some(_))))
            }
        }))
        .await;
        let granted = replies.iter().filter(|ok| **ok).count();
        let validity = self.ttl.checked_sub(start.elapsed() + crate::lease::drift(self.ttl));
        match validity {
            Some(v) if granted >= self.quorum() && !v.is_zero() => {
                let (tx, _) = watch::channel(LockState::Held);
                Ok(Some(RedlockGuard {
                    redlock: self.clone(),
                    name: name.to_string(),
                    value,
                    deadline: Arc::new(StdMutex::new(start + v)),
                    state: tx,
                    released: false,
                }))
            }
            _ => {
                release_all(&self.nodes, name, &value).await;
                Ok(None)
            }
        }
    }
}

/// Compare-and-delete on every master (errors ignored: the TTL frees what this misses). Returns
/// how many masters answered that the value was not ours (any more).
async fn release_all(nodes: &[Client], name: &str, value: &str) -> usize {
    let replies = join_all(nodes.iter().map(|node| async move {
        let channel = super::simple_channel(name);
        let r: Result<Option<i64>> = node
            .eval(
                scripts::SIMPLE_RELEASE.pick(node.sharded()),
                &[name, &channel],
                &[value.to_string()],
                "release",
                name,
            )
            .await;
        matches!(r, Ok(None))
    }))
    .await;
    replies.into_iter().filter(|not_ours| *not_ours).count()
}

/// A Redlock held by a majority of masters. It has **no fencing token** (see [`Redlock`]); it has
/// a validity deadline, which [`extend`](RedlockGuard::extend) moves on.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(g: distlock::redis::RedlockGuard) -> distlock::Result<()> {
/// tokio::select! {
///     _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => g.release().await?,
///     reason = g.lost() => eprintln!("validity ran out: {reason}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct RedlockGuard {
    redlock: Redlock,
    name: String,
    value: String,
    deadline: Arc<StdMutex<Instant>>,
    state: watch::Sender<LockState>,
    released: bool,
}

impl RedlockGuard {
    /// The lock's key (the same on every master).
    pub fn key(&self) -> &str {
        &self.name
    }

    /// After this instant another client may hold the lock; stop before it.
    pub fn validity_deadline(&self) -> std::time::Instant {
        self.deadline().into_std()
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Lost(LeaseExpired)` once the validity deadline has passed.
    pub fn state(&self) -> LockState {
        if Instant::now() >= self.deadline() {
            self.state.send_replace(LockState::Lost(LostReason::LeaseExpired));
        }
        *self.state.borrow()
    }

    /// Resolves at the validity deadline (as moved on by `extend`).
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let deadline = self.deadline.clone();
        let mut rx = self.state.subscribe();
        async move {
            loop {
                if let LockState::Lost(r) = *rx.borrow_and_update() {
                    return r;
                }
                let d = *deadline.lock().unwrap_or_else(|e| e.into_inner());
                if Instant::now() >= d {
                    return LostReason::LeaseExpired;
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return LostReason::SessionClosed },
                    _ = tokio::time::sleep_until(d) => {}
                }
            }
        }
    }

    /// Resets the time to live on every master that still has our value; the new validity counts
    /// only if a majority confirmed before the current deadline. Returns the new deadline, or
    /// [`Error::LockLost`] (the lock is then no longer to be trusted).
    pub async fn extend(&self) -> Result<std::time::Instant> {
        let ttl = self.redlock.ttl;
        let start = Instant::now();
        let replies = join_all(self.redlock.nodes.iter().map(|node| async move {
            let r: Result<Vec<i64>> = node
                .eval(
                    &scripts::RENEW,
                    &[&self.name],
                    &[(ttl.as_millis() as u64).to_string(), "s".to_string(), self.value.clone()],
                    "extend",
                    &self.name,
                )
                .await;
            matches!(r.as_deref(), Ok([1]))
        }))
        .await;
        let confirmed = replies.into_iter().filter(|ok| *ok).count();
        let now = Instant::now();
        if confirmed < self.redlock.quorum() || now >= self.deadline() {
            self.state.send_replace(LockState::Lost(LostReason::LeaseExpired));
            return Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::LeaseExpired });
        }
        let new = start + ttl - crate::lease::drift(ttl);
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = new;
        self.state.send_modify(|_| {});
        Ok(new.into_std())
    }

    /// Deletes our value on every master. [`Error::LockLost`] if the validity had run out before,
    /// or if so many masters answered that our value was gone (expired, deleted, or replaced by
    /// someone else's) that fewer than a majority can still have held it.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        let expired = Instant::now() >= self.deadline();
        let not_ours = release_all(&self.redlock.nodes, &self.name, &self.value).await;
        if expired {
            return Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::LeaseExpired });
        }
        if not_ours > self.redlock.nodes.len() - self.redlock.quorum() {
            return Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::KeyDeleted });
        }
        Ok(())
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (nodes, name, value) = (self.redlock.nodes.clone(), self.name.clone(), self.value.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                release_all(&nodes, &name, &value).await;
            });
        }
    }
}

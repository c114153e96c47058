//! The reentrant mutex (Curator's InterProcessMutex semantics).

use super::mutex::{Mutex, MutexGuard};
use crate::LockState;
use crate::{LostReason, Result};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

/// A mutex the same owner may acquire again while holding it; it is released when every
/// acquisition has been released.
///
/// Rust tasks have no thread identity to own a lock, so the **handle is the owner**: every
/// acquisition through one `ReentrantMutex` value (and its clones) re-enters, and acquisitions
/// through a different handle queue as strangers, even in the same process. Share one handle only
/// within one logical owner (one request, one job). On the server there is one queue node per
/// owner, whatever the hold count, in Curator's InterProcessMutex format.
///
/// Each acquisition returns a [`ReentrantGuard`]; releasing is done through guards only, so
/// releasing what one does not hold cannot be expressed, and each guard releases exactly once.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(zk: distlock::zookeeper::Client) -> distlock::Result<()> {
/// let lock = zk.reentrant_mutex("/locks/account-42")?;
/// let outer = lock.lock().await?;
/// let inner = lock.lock().await?;        // same owner: no wait
/// assert_eq!(lock.hold_count(), 2);
/// inner.release().await?;                 // still held
/// outer.release().await?;                 // now released on the server
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ReentrantMutex {
    inner: Mutex,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Serializes first acquisitions through this handle.
    gate: tokio::sync::Mutex<()>,
    held: StdMutex<Option<Holding>>,
}

#[derive(Debug)]
struct Holding {
    guard: MutexGuard,
    count: usize,
    token: u64,
    lock: Arc<str>,
    node: Arc<str>,
}

impl ReentrantMutex {
    pub(super) fn new(inner: Mutex) -> ReentrantMutex {
        ReentrantMutex {
            inner,
            shared: Arc::new(Shared { gate: tokio::sync::Mutex::new(()), held: StdMutex::new(None) }),
        }
    }

    /// The lock path.
    pub fn path(&self) -> &str {
        self.inner.path()
    }

    /// How many acquisitions this owner holds (0 when not held).
    pub fn hold_count(&self) -> usize {
        self.shared.held.lock().unwrap().as_ref().map_or(0, |h| h.count)
    }

    fn reenter(&self) -> Option<ReentrantGuard> {
        let mut held = self.shared.held.lock().unwrap();
        let h = held.as_mut()?;
        h.count += 1;
        Some(ReentrantGuard {
            shared: self.shared.clone(),
            token: h.token,
            lock: h.lock.clone(),
            node: h.node.clone(),
            released: false,
        })
    }

    /// Acquires, re-entering at once if this owner holds the lock already.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Mutex::lock`].
    pub async fn lock(&self) -> Result<ReentrantGuard> {
        Ok(self.lock_with(None).await?.expect("waiting forever always acquires"))
    }

    /// Acquires only if free or already ours; never waits.
    pub async fn try_lock(&self) -> Result<Option<ReentrantGuard>> {
        self.lock_with(Some(Duration::ZERO)).await
    }

    /// Waits at most `timeout`.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<ReentrantGuard>> {
        self.lock_with(Some(timeout)).await
    }

    async fn lock_with(&self, timeout: Option<Duration>) -> Result<Option<ReentrantGuard>> {
        if let Some(g) = self.reenter() {
            return Ok(Some(g));
        }
        // One deadline for the whole call: the wait for this handle's gate counts against it.
        let deadline = timeout.and_then(super::queue::deadline_after);
        let _gate = match deadline {
            None => self.shared.gate.lock().await,
            Some(d) => match tokio::time::timeout_at(d, self.shared.gate.lock()).await {
                Ok(g) => g,
                Err(_) => return Ok(None),
            },
        };
        // Another acquisition through this handle may have won while we waited for the gate.
        if let Some(g) = self.reenter() {
            return Ok(Some(g));
        }
        let remaining = match (timeout, deadline) {
            (Some(t), _) if t.is_zero() => Some(t),
            (_, Some(d)) => Some(d.saturating_duration_since(tokio::time::Instant::now()).max(Duration::from_nanos(1))),
            _ => None,
        };
        let Some(guard) = self.inner.lock_with(remaining, None).await? else { return Ok(None) };
        let token = guard.fencing_token();
        let (lock, node): (Arc<str>, Arc<str>) = (guard.lock_path().into(), guard.node_path().into());
        let holding = Holding { guard, count: 1, token, lock: lock.clone(), node: node.clone() };
        *self.shared.held.lock().unwrap() = Some(holding);
        Ok(Some(ReentrantGuard { shared: self.shared.clone(), token, lock, node, released: false }))
    }

    /// The state of the underlying lock, if held.
    pub fn state(&self) -> Option<LockState> {
        self.shared.held.lock().unwrap().as_ref().map(|h| h.guard.state())
    }
}

/// One acquisition of a [`ReentrantMutex`]; the lock is released on the server when the last
/// guard of its owner is released or dropped.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: distlock::zookeeper::ReentrantMutex) -> distlock::Result<()> {
/// let g = lock.lock().await?;
/// println!("token {}", g.fencing_token());
/// g.release().await
/// # }
/// ```
#[must_use = "if unused the acquisition is released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct ReentrantGuard {
    shared: Arc<Shared>,
    token: u64,
    /// The lock path and the owner's node (the same for every re-entry), kept here to be lent
    /// out: the hold itself is behind the owner's mutex.
    lock: Arc<str>,
    node: Arc<str>,
    released: bool,
}

impl ReentrantGuard {
    /// The fencing token of the owner's hold (the same for every re-entry).
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The lock's name: its path, as on every backend's guards.
    pub fn name(&self) -> &str {
        &self.lock
    }

    /// Our mark on the server: the owner's node path, as on every backend's guards.
    pub fn holder_id(&self) -> &str {
        &self.node
    }

    /// The owner's hold, there while any of its guards is (the last release takes it).
    fn holding<T>(&self, f: impl FnOnce(&Holding) -> T) -> T {
        f(self.shared.held.lock().unwrap().as_ref().expect("held while a guard of it is unreleased"))
    }

    /// The lease deadline of the underlying lock (see
    /// [`MutexGuard::lease_deadline`](super::MutexGuard::lease_deadline)).
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.holding(|h| h.guard.lease_deadline())
    }

    /// The state of the underlying lock.
    pub fn state(&self) -> LockState {
        self.holding(|h| h.guard.state())
    }

    /// Resolves when the underlying lock can no longer be trusted.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let lost = self.shared.held.lock().unwrap().as_ref().map(|h| h.guard.lost());
        async move {
            match lost {
                Some(l) => l.await,
                None => LostReason::SessionClosed,
            }
        }
    }

    /// Takes this acquisition away; returns the underlying guard when it was the last one.
    fn take(&mut self) -> Option<MutexGuard> {
        self.released = true;
        let mut held = self.shared.held.lock().unwrap();
        let h = held.as_mut()?;
        h.count -= 1;
        if h.count == 0 {
            held.take().map(|h| h.guard)
        } else {
            None
        }
    }

    /// Releases this acquisition; the last one releases the lock and waits for the server.
    ///
    /// # Notable errors
    /// [`Error::LockLost`](crate::Error::LockLost) when the last release finds the lock already
    /// lost.
    pub async fn release(mut self) -> Result<()> {
        match self.take() {
            Some(guard) => guard.release().await,
            None => Ok(()),
        }
    }
}

impl Drop for ReentrantGuard {
    fn drop(&mut self) {
        if !self.released {
            drop(self.take());
        }
    }
}

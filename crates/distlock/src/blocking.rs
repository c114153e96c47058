//! A blocking facade for synchronous callers (threads, not tasks), over every backend.
//!
//! Each [`Client`] owns a small tokio runtime (one worker thread) that keeps the connection, the
//! session and the lease renewals alive between calls. Every method blocks the calling thread.
//! It wraps the backend-neutral [`crate::Client`], so the same code runs on `zk://` and
//! `redis://` URLs.
//!
//! # Panics
//! Calling these methods from inside an async runtime panics (as tokio's `blocking_*` methods
//! do): use the async API there.
//!
//! # Examples
//!
//! ```no_run
//! use distlock::blocking::Client;
//! let client = Client::connect("redis://127.0.0.1:6379")?; // or zk://127.0.0.1:2181
//! let lock = client.mutex("report")?;
//! let guard = lock.lock()?;
//! println!("token {}", guard.fencing_token());
//! guard.release()?;
//! # Ok::<(), distlock::Error>(())
//! ```

use crate::{LockState, LostReason, Result};
use std::sync::Arc;
use std::time::Duration;

/// A blocking client for any backend URL; see [`crate::connect`].
///
/// # Examples
///
/// ```no_run
/// let zk = distlock::blocking::Client::connect("zk://127.0.0.1:2181")?;
/// let permit = zk.semaphore_permit("pool", 3)?.try_lock()?;
/// # Ok::<(), distlock::Error>(())
/// ```
#[derive(Clone)]
pub struct Client {
    inner: crate::Client,
    rt: Arc<tokio::runtime::Runtime>,
}

impl Client {
    /// Connects to the backend the URL names; see [`crate::connect`].
    pub fn connect(url: &str) -> Result<Client> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("distlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| crate::Error::Connect {
                url: url.to_string(),
                reason: format!("cannot start runtime: {e}"),
            })?;
        let inner = rt.block_on(crate::connect(url))?;
        Ok(Client { inner, rt: Arc::new(rt) })
    }

    /// An exclusive lock; see [`crate::Client::mutex`].
    pub fn mutex(&self, name: &str) -> Result<Lock> {
        self.wrap(self.inner.mutex(name))
    }

    /// The shared side of a read/write lock; see [`crate::Client::read_lock`].
    pub fn read_lock(&self, name: &str) -> Result<Lock> {
        self.wrap(self.inner.read_lock(name))
    }

    /// The exclusive side of a read/write lock; see [`crate::Client::write_lock`].
    pub fn write_lock(&self, name: &str) -> Result<Lock> {
        self.wrap(self.inner.write_lock(name))
    }

    /// One permit of a semaphore of `permits`; see [`crate::Client::semaphore_permit`].
    pub fn semaphore_permit(&self, name: &str, permits: u32) -> Result<Lock> {
        self.wrap(self.inner.semaphore_permit(name, permits))
    }

    fn wrap(&self, lock: Result<crate::Lock>) -> Result<Lock> {
        Ok(Lock { inner: lock?, rt: self.rt.clone() })
    }

    /// The async client underneath.
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }
}

/// A blocking lock (mutex, either side of a read/write lock, or a semaphore permit); see
/// [`crate::Lock`].
///
/// # Examples
///
/// ```no_run
/// # fn demo(lock: distlock::blocking::Lock) -> distlock::Result<()> {
/// match lock.try_lock()? {
///     Some(guard) => guard.release()?,
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: crate::Lock,
    rt: Arc<tokio::runtime::Runtime>,
}

/// The name this facade used before it covered every backend.
pub type Mutex = Lock;
/// The name this facade used before it covered every backend.
pub type MutexGuard = Guard;

impl Lock {
    /// Blocks until the lock is held.
    pub fn lock(&self) -> Result<Guard> {
        let g = self.rt.block_on(self.inner.lock())?;
        Ok(self.guard(g))
    }

    /// Takes the lock only if free; never waits.
    pub fn try_lock(&self) -> Result<Option<Guard>> {
        let g = self.rt.block_on(self.inner.try_lock())?;
        Ok(g.map(|g| self.guard(g)))
    }

    /// Waits at most `timeout`.
    pub fn lock_timeout(&self, timeout: Duration) -> Result<Option<Guard>> {
        let g = self.rt.block_on(self.inner.lock_timeout(timeout))?;
        Ok(g.map(|g| self.guard(g)))
    }

    fn guard(&self, g: crate::Guard) -> Guard {
        Guard { inner: Some(g), rt: self.rt.clone() }
    }
}

/// Proof of holding a blocking [`Lock`]; releases on drop. See [`crate::Guard`].
///
/// # Examples
///
/// ```no_run
/// # fn demo(lock: distlock::blocking::Lock) -> distlock::Result<()> {
/// let g = lock.lock()?;
/// assert!(g.lost_reason().is_none());
/// g.release()
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct Guard {
    inner: Option<crate::Guard>,
    rt: Arc<tokio::runtime::Runtime>,
}

impl Guard {
    fn guard(&self) -> &crate::Guard {
        self.inner.as_ref().expect("guard present until release")
    }

    /// See [`crate::Guard::fencing_token`].
    pub fn fencing_token(&self) -> u64 {
        self.guard().fencing_token()
    }

    /// See [`crate::Guard::lease_deadline`]: finish work that must not overlap the next holder
    /// before this instant.
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.guard().lease_deadline()
    }

    /// The state now; see [`crate::Guard::state`].
    pub fn state(&self) -> LockState {
        let _enter = self.rt.enter();
        self.guard().state()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        match self.state() {
            LockState::Lost(r) => Some(r),
            _ => None,
        }
    }

    /// Releases and waits for the server.
    pub fn release(mut self) -> Result<()> {
        let g = self.inner.take().expect("guard present until release");
        self.rt.block_on(g.release())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(g) = self.inner.take() {
            let _enter = self.rt.enter();
            drop(g);
        }
    }
}

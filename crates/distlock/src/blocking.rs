//! A blocking facade for synchronous callers (threads, not tasks).
//!
//! Each [`Client`] owns a small tokio runtime (one worker thread) that keeps the session alive
//! between calls. Every method blocks the calling thread.
//!
//! # Panics
//! Calling these methods from inside an async runtime panics (as tokio's `blocking_*` methods
//! do): use the async API there.
//!
//! # Examples
//!
//! ```no_run
//! use distlock::blocking::Client;
//! let zk = Client::connect("zk://127.0.0.1:2181")?;
//! let lock = zk.mutex("/locks/report")?;
//! let guard = lock.lock()?;
//! println!("token {}", guard.fencing_token());
//! guard.release()?;
//! # Ok::<(), distlock::Error>(())
//! ```

use crate::zookeeper as zk;
use crate::{LostReason, Result};
use std::sync::Arc;
use std::time::Duration;

/// A blocking ZooKeeper client; see [`zk::Client`].
///
/// # Examples
///
/// ```no_run
/// let zk = distlock::blocking::Client::connect("zk://127.0.0.1:2181")?;
/// # Ok::<(), distlock::Error>(())
/// ```
#[derive(Clone)]
pub struct Client {
    inner: zk::Client,
    rt: Arc<tokio::runtime::Runtime>,
}

impl Client {
    /// Connects; see [`zk::Client::connect`].
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
        let inner = rt.block_on(zk::Client::connect(url))?;
        Ok(Client { inner, rt: Arc::new(rt) })
    }

    /// An exclusive lock; see [`zk::Client::mutex`].
    pub fn mutex(&self, path: &str) -> Result<Mutex> {
        Ok(Mutex { inner: self.inner.mutex(path)?, rt: self.rt.clone() })
    }

    /// The async client underneath.
    pub fn as_async(&self) -> &zk::Client {
        &self.inner
    }
}

/// A blocking exclusive lock; see [`zk::Mutex`].
///
/// # Examples
///
/// ```no_run
/// # fn demo(lock: distlock::blocking::Mutex) -> distlock::Result<()> {
/// match lock.try_lock()? {
///     Some(guard) => guard.release()?,
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Mutex {
    inner: zk::Mutex,
    rt: Arc<tokio::runtime::Runtime>,
}

impl Mutex {
    /// Blocks until the lock is held.
    pub fn lock(&self) -> Result<MutexGuard> {
        let g = self.rt.block_on(self.inner.lock())?;
        Ok(MutexGuard { inner: Some(g), rt: self.rt.clone() })
    }

    /// Takes the lock only if free; never waits.
    pub fn try_lock(&self) -> Result<Option<MutexGuard>> {
        let g = self.rt.block_on(self.inner.try_lock())?;
        Ok(g.map(|g| MutexGuard { inner: Some(g), rt: self.rt.clone() }))
    }

    /// Waits at most `timeout`.
    pub fn lock_timeout(&self, timeout: Duration) -> Result<Option<MutexGuard>> {
        let g = self.rt.block_on(self.inner.lock_timeout(timeout))?;
        Ok(g.map(|g| MutexGuard { inner: Some(g), rt: self.rt.clone() }))
    }
}

/// Blocking guard; releases on drop. See [`zk::MutexGuard`].
///
/// # Examples
///
/// ```no_run
/// # fn demo(lock: distlock::blocking::Mutex) -> distlock::Result<()> {
/// let g = lock.lock()?;
/// assert!(g.lost_reason().is_none());
/// g.release()
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
pub struct MutexGuard {
    inner: Option<zk::MutexGuard>,
    rt: Arc<tokio::runtime::Runtime>,
}

impl MutexGuard {
    fn guard(&self) -> &zk::MutexGuard {
        self.inner.as_ref().expect("guard present until release")
    }

    /// See [`zk::MutexGuard::fencing_token`].
    pub fn fencing_token(&self) -> u64 {
        self.guard().fencing_token()
    }

    /// See [`zk::MutexGuard::lease_deadline`]: finish work that must not overlap the next holder
    /// before this instant.
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.guard().lease_deadline()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        let _enter = self.rt.enter();
        match self.guard().state() {
            zk::LockState::Lost(r) => Some(r),
            _ => None,
        }
    }

    /// Releases and waits for the server.
    pub fn release(mut self) -> Result<()> {
        let g = self.inner.take().expect("guard present until release");
        self.rt.block_on(g.release())
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        if let Some(g) = self.inner.take() {
            let _enter = self.rt.enter();
            drop(g);
        }
    }
}

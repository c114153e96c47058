//! Several locks of any kind, taken all or nothing.

use super::queue::QueueStatus;
use super::{Mutex, MutexGuard, ReadGuard, RwLock, Semaphore, SemaphorePermit, WriteGuard};
use crate::contract::Wait;
use crate::LockState;
use crate::{LostReason, Result};
use std::time::Duration;
use tokio::sync::watch;

/// One member of a [`MultiLock`].
///
/// # Examples
///
/// ```no_run
/// # fn demo(zk: distlock::zookeeper::Client) -> distlock::Result<()> {
/// use distlock::zookeeper::LockSpec;
/// let specs = vec![
///     LockSpec::Exclusive(zk.mutex("/locks/a")?),
///     LockSpec::Read(zk.rwlock("/locks/config")?),
///     LockSpec::Permits(zk.semaphore("/locks/pool", 4)?, 1),
/// ];
/// # let _ = specs; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub enum LockSpec {
    /// An exclusive [`Mutex`].
    Exclusive(Mutex),
    /// The read side of an [`RwLock`].
    Read(RwLock),
    /// The write side of an [`RwLock`].
    Write(RwLock),
    /// `n` permits of a [`Semaphore`].
    Permits(Semaphore, u32),
}

impl LockSpec {
    /// The lock path.
    pub fn path(&self) -> &str {
        match self {
            LockSpec::Exclusive(m) => m.path(),
            LockSpec::Read(l) | LockSpec::Write(l) => l.path(),
            LockSpec::Permits(s, _) => s.path(),
        }
    }

    pub(crate) async fn acquire(
        &self,
        wait: Wait,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<AnyGuard>> {
        Ok(match self {
            LockSpec::Exclusive(m) => m.lock_with(wait.timeout(), progress).await?.map(AnyGuard::Exclusive),
            LockSpec::Read(l) => l.read_with(wait.timeout(), progress).await?.map(AnyGuard::Read),
            LockSpec::Write(l) => l.write_with(wait.timeout(), progress).await?.map(AnyGuard::Write),
            LockSpec::Permits(s, n) => s.acquire_with(*n, wait.timeout()).await?.map(AnyGuard::Permits),
        })
    }
}

/// A held member of a [`MultiGuard`].
///
/// # Examples
///
/// ```no_run
/// # fn demo(g: &distlock::zookeeper::AnyGuard) {
/// println!("{} {}", g.lock_path(), g.fencing_token());
/// # }
/// ```
#[derive(Debug)]
pub enum AnyGuard {
    /// From [`LockSpec::Exclusive`].
    Exclusive(MutexGuard),
    /// From [`LockSpec::Read`].
    Read(ReadGuard),
    /// From [`LockSpec::Write`].
    Write(WriteGuard),
    /// From [`LockSpec::Permits`].
    Permits(SemaphorePermit),
}

impl AnyGuard {
    /// The guard's fencing token.
    pub fn fencing_token(&self) -> u64 {
        match self {
            AnyGuard::Exclusive(g) => g.fencing_token(),
            AnyGuard::Read(g) => g.fencing_token(),
            AnyGuard::Write(g) => g.fencing_token(),
            AnyGuard::Permits(g) => g.fencing_token(),
        }
    }

    /// The lock path.
    pub fn lock_path(&self) -> &str {
        match self {
            AnyGuard::Exclusive(g) => g.lock_path(),
            AnyGuard::Read(g) => g.lock_path(),
            AnyGuard::Write(g) => g.lock_path(),
            AnyGuard::Permits(g) => {
                let p = g.node_paths()[0];
                &p[..p.rfind("/leases/").unwrap_or(p.len())]
            }
        }
    }

    /// The lock's name: its path, as on every backend's guards.
    pub fn name(&self) -> &str {
        self.lock_path()
    }

    /// Our mark on the server: our node's full path, as on every backend's guards.
    pub fn holder_id(&self) -> &str {
        self.node_path()
    }

    /// Our node's full path (for a semaphore permit, its first lease node), e.g.
    /// `/locks/a/_c_<uuid>-lock-0000000007`.
    pub fn node_path(&self) -> &str {
        match self {
            AnyGuard::Exclusive(g) => g.node_path(),
            AnyGuard::Read(g) => g.node_path(),
            AnyGuard::Write(g) => g.node_path(),
            AnyGuard::Permits(g) => g.node_paths()[0],
        }
    }

    /// The guard's lease deadline (see
    /// [`MutexGuard::lease_deadline`](super::MutexGuard::lease_deadline)).
    pub fn lease_deadline(&self) -> std::time::Instant {
        match self {
            AnyGuard::Exclusive(g) => g.lease_deadline(),
            AnyGuard::Read(g) => g.lease_deadline(),
            AnyGuard::Write(g) => g.lease_deadline(),
            AnyGuard::Permits(g) => g.lease_deadline(),
        }
    }

    /// The guard's state.
    pub fn state(&self) -> LockState {
        match self {
            AnyGuard::Exclusive(g) => g.state(),
            AnyGuard::Read(g) => g.state(),
            AnyGuard::Write(g) => g.state(),
            AnyGuard::Permits(g) => g.state(),
        }
    }

    /// Resolves when the guard's lock can no longer be trusted.
    pub fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = LostReason> + Send + 'static>> {
        match self {
            AnyGuard::Exclusive(g) => Box::pin(g.lost()),
            AnyGuard::Read(g) => Box::pin(g.lost()),
            AnyGuard::Write(g) => Box::pin(g.lost()),
            AnyGuard::Permits(g) => Box::pin(g.lost()),
        }
    }

    /// Releases and waits for the server.
    pub async fn release(self) -> Result<()> {
        match self {
            AnyGuard::Exclusive(g) => g.release().await,
            AnyGuard::Read(g) => g.release().await,
            AnyGuard::Write(g) => g.release().await,
            AnyGuard::Permits(g) => g.release().await,
        }
    }
}

/// Several locks of any kind acquired all or nothing (Curator's InterProcessMultiLock).
///
/// Members are acquired in one global order (by path, then kind), whatever order they were given
/// in, so two multi-locks over overlapping sets never deadlock each other. A timeout covers the
/// whole set. If any member cannot be had (timeout, busy, error), the members already taken are
/// released (and the server has confirmed) before the call returns.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(zk: distlock::zookeeper::Client) -> distlock::Result<()> {
/// use distlock::zookeeper::{LockSpec, MultiLock};
/// use std::time::Duration;
/// let transfer = MultiLock::new(vec![
///     LockSpec::Exclusive(zk.mutex("/locks/account-9")?),
///     LockSpec::Exclusive(zk.mutex("/locks/account-3")?),
/// ])?;
/// if let Some(both) = transfer.lock_timeout(Duration::from_secs(5)).await? {
///     both.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiLock {
    specs: Vec<LockSpec>,
}

impl MultiLock {
    /// Orders the members; a path named twice is refused (it would wait for itself).
    pub fn new(mut specs: Vec<LockSpec>) -> Result<MultiLock> {
        crate::multi::order_members(&mut specs, LockSpec::path)?;
        Ok(MultiLock { specs })
    }

    /// The members in acquisition order.
    pub fn specs(&self) -> &[LockSpec] {
        &self.specs
    }

    /// Waits for every member.
    pub async fn lock(&self) -> Result<MultiGuard> {
        Ok(self.lock_with(None).await?.expect("waiting forever always acquires"))
    }

    /// Every member only if each is free now; never waits.
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        self.lock_with(Some(Duration::ZERO)).await
    }

    /// Every member within `timeout` (for the whole set), or none.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<MultiGuard>> {
        self.lock_with(Some(timeout)).await
    }

    /// `timeout` `None` waits forever, `Some(ZERO)` never waits.
    pub async fn lock_with(&self, timeout: Option<Duration>) -> Result<Option<MultiGuard>> {
        self.lock_observed(timeout, None).await
    }

    /// As [`lock_with`](Self::lock_with); `progress` receives the queue position of the member
    /// being waited for (semaphores report none).
    pub async fn lock_observed(
        &self,
        timeout: Option<Duration>,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<MultiGuard>> {
        let wait = crate::contract::Wait::from_timeout(timeout);
        let Some(parts) = crate::multi::acquire_all(&self.specs, wait, progress).await? else { return Ok(None) };
        Ok(Some(MultiGuard { parts }))
    }
}

/// Every member of a [`MultiLock`], held; released on drop.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(g: distlock::zookeeper::MultiGuard) -> distlock::Result<()> {
/// for part in g.parts() {
///     println!("{} token {}", part.lock_path(), part.fencing_token());
/// }
/// g.release().await
/// # }
/// ```
#[must_use = "if unused the locks are released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MultiGuard {
    parts: Vec<AnyGuard>,
}

impl MultiGuard {
    /// The held members, in acquisition order.
    pub fn parts(&self) -> &[AnyGuard] {
        &self.parts
    }

    /// The largest member token.
    pub fn fencing_token(&self) -> u64 {
        self.parts.iter().map(|p| p.fencing_token()).max().unwrap_or(0)
    }

    /// The earliest lease deadline of the members: stop work that must not overlap another
    /// holder of any member before it.
    pub fn lease_deadline(&self) -> Option<std::time::Instant> {
        self.parts.iter().map(|p| p.lease_deadline()).min()
    }

    /// Resolves when any member can no longer be trusted.
    pub fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        crate::multi::lost_any(self.parts.iter().map(|p| p.lost()).collect())
    }

    /// Releases every member in reverse order; reports the first error after trying all.
    pub async fn release(self) -> Result<()> {
        crate::multi::release_all(self.parts, AnyGuard::release).await
    }
}

impl crate::multi::Member for LockSpec {
    type Held = AnyGuard;
    fn name(&self) -> &str {
        self.path()
    }
    fn take<'a>(
        &'a self,
        wait: Wait,
        progress: Option<&'a watch::Sender<QueueStatus>>,
    ) -> impl std::future::Future<Output = Result<Option<AnyGuard>>> + Send + 'a {
        self.acquire(wait, progress)
    }
    fn give_back(held: AnyGuard) -> impl std::future::Future<Output = Result<()>> + Send {
        held.release()
    }
}

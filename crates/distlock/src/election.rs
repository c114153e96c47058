//! Leader election, written once over the lock contract: a leader is the holder of the
//! election's lock, and its mark on the server carries the value it announces.
//!
//! - [`Election::campaign`] waits to lead and returns a [`Leadership`]: its
//!   [`epoch`](Leadership::epoch) is the lock's fencing token (it rises with every new leader),
//!   [`lost`](Leadership::lost) and [`lease_deadline`](Leadership::lease_deadline) are the lock's
//!   (leadership is reported lost before anyone else can be elected),
//!   [`proclaim`](Leadership::proclaim) changes the announced value without giving up the lead,
//!   and [`resign`](Leadership::resign) (or dropping it) hands the lead on.
//! - [`Election::leader`] reads the leader now; [`Election::observe`] reports every change,
//!   including **no leader** (the last leader resigned or its lease ended and nobody has been
//!   elected yet), which etcd's `Observe` never reports.
//!
//! Every backend has elections. Layouts are the peers' where they exist:
//! - **ZooKeeper**: Curator's `LeaderLatch` (`_c_<uuid>-latch-<seq>` nodes under the election's
//!   path, each node's data the participant's id), or with `?election=selector` in the URL its
//!   `LeaderSelector` (an `InterProcessMutex` queue of `_c_<uuid>-lock-<seq>` nodes): Curator's
//!   participants and distlock's take turns, and each reads the other's leader. A path holds one
//!   layout: a candidate of the other is refused;
//! - **etcd**: Go's `concurrency.Election` (keys `<name>/<lease id in hex>` holding the proposal,
//!   the oldest create revision leads): `etcdctl elect NAME PROPOSAL` campaigns against
//!   distlock both ways, and `etcdctl elect -l NAME` observes a distlock leader. As in Go, every
//!   key under `<name>/` is a candidate: a lock or election named `<name>/x` takes part in
//!   election `<name>` (keep such names apart);
//! - **Redis** (Redisson has no election): Redisson's RLock hash at the election's key, whose
//!   grant also puts a `value` field (the announced value) beside the holder's `<uuid>:<n>`
//!   field; the epoch is the lock's fencing counter. Always this layout, whatever the URL's
//!   `layout`.
//!
//! - **PostgreSQL, MariaDB, SQLite** (distlock's layouts): the backend's mutex on the name, then
//!   an announcement row written once the grant is had (`distlock_leaders`, or
//!   `<table>_leaders` on SQLite) naming the holder (the holding connection's pid, the
//!   `GET_LOCK` connection, the lease row's token); the leader is the announcement whose holder
//!   holds the lock now, so a holder is named leader once it has announced, one statement after
//!   its grant. (On PostgreSQL and MariaDB a pooled connection that led before and is granted
//!   again shows its earlier announcement for that one statement.)
//!
//! [`Election::leader`] names the candidate the server has made leader; that candidate learns it
//! at most one round trip later (as Curator's `getLeader` and etcd's `Leader` do).
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! let client = distlock::connect("zk://127.0.0.1:2181").await?;
//! let election = client.election("scheduler")?;
//! let leading = election.campaign("host-a:8080").await?;
//! println!("leading with epoch {}", leading.epoch());
//! tokio::select! {
//!     reason = leading.lost() => eprintln!("no longer leader: {reason}"),
//!     _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => leading.resign().await?,
//! }
//! # Ok(()) }
//! ```

use crate::contract::{Ballot, Wait};
use crate::{Error, Guard, Lock, LockState, LostReason, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The largest announced value, in bytes (ZooKeeper's node data and etcd's values take far more;
/// a value is an address or an id, and every observer reads it).
pub const MAX_VALUE: usize = 64 * 1024;

/// How often [`Election::observe`] reads the leader unless told otherwise.
pub const OBSERVE_EVERY: Duration = Duration::from_millis(100);

pub use crate::contract::Leader;

/// A change seen by an [`Observer`].
///
/// # Examples
///
/// ```
/// use distlock::election::Change;
/// let change = Change::NoLeader;
/// assert_eq!(change.value(), "");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// A leader, new or announcing a new value.
    Leader(Leader),
    /// Nobody leads: the last leader resigned or its lease ended, and nobody has been elected
    /// yet.
    NoLeader,
}

impl Change {
    /// The leader's value, or the empty string for no leader (as `distlock elect --observe`
    /// prints it).
    pub fn value(&self) -> &str {
        match self {
            Change::Leader(l) => &l.value,
            Change::NoLeader => "",
        }
    }
}

/// An election on one backend, made by [`Client::election`](crate::Client::election).
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// let election = client.election("billing-writer")?;
/// if let Some(leading) = election.try_campaign("pod-7").await? {
///     leading.proclaim("pod-7 (draining)").await?;
///     leading.resign().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    inner: Arc<dyn Ballot>,
    backend: &'static str,
}

impl Election {
    pub(crate) fn new(inner: Arc<dyn Ballot>, backend: &'static str) -> Election {
        Election { inner, backend }
    }

    /// The election's name on the server (znode path or key prefix).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The campaign for `value` as a [`Lock`]: holding it is leading (for [`crate::with_lock`],
    /// a [`MultiLock`](crate::MultiLock) or code written for locks). Its guard has no
    /// `proclaim`; [`campaign`](Self::campaign) gives one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value over [`MAX_VALUE`] bytes.
    pub fn candidate(&self, value: &str) -> Result<Lock> {
        Ok(Lock::from_recipe(self.inner.candidate(checked(value)?), self.backend))
    }

    /// Waits as long as it takes to lead, announcing `value`.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped campaign leaves no candidate behind.
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        Ok(self.run(value, Wait::Forever).await?.expect("waiting without a deadline ends only with the lead"))
    }

    /// Leads only if nobody leads or waits now; never waits.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`campaign`](Self::campaign).
    pub async fn try_campaign(&self, value: &str) -> Result<Option<Leadership>> {
        self.run(value, Wait::Never).await
    }

    /// Waits at most `timeout` to lead; `None` if not elected in time (nothing is left behind).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`campaign`](Self::campaign).
    pub async fn campaign_timeout(&self, value: &str, timeout: Duration) -> Result<Option<Leadership>> {
        self.run(value, Wait::from_timeout(Some(timeout))).await
    }

    async fn run(&self, value: &str, wait: Wait) -> Result<Option<Leadership>> {
        let value = checked(value)?;
        let lock = Lock::from_recipe(self.inner.candidate(value.clone()), self.backend);
        let guard = lock.take(wait, None).await?;
        Ok(guard.map(|guard| Leadership {
            guard,
            ballot: self.inner.clone(),
            value: std::sync::Mutex::new(value),
        }))
    }

    /// The leader now, or `None` when nobody leads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.inner.leader().await
    }

    /// A stream of changes, read every [`OBSERVE_EVERY`]: see [`observe_every`](Self::observe_every).
    pub fn observe(&self) -> Observer {
        self.observe_every(OBSERVE_EVERY)
    }

    /// A stream of changes: the first [`next`](Observer::next) gives the state now (a leader,
    /// or [`Change::NoLeader`]), each later one the next change: a new leader, a new value, or no
    /// leader. On ZooKeeper and etcd the leader is read again when a watch set with the last read
    /// fires (within a round trip of the change; a leadership that begins and ends inside that
    /// round trip can still go unseen, its epoch skipped); elsewhere it is read every `interval`,
    /// and a leadership shorter than that may go unseen.
    pub fn observe_every(&self, interval: Duration) -> Observer {
        Observer { ballot: self.inner.clone(), interval: interval.max(Duration::from_millis(1)), last: None, watch: None, watches: false }
    }
}

/// A candidate on a backend whose lock cannot carry the value in its grant (the SQL backends):
/// the lock, then the value announced through the ballot's `announce` (its `proclaim` with the
/// grant's mark and token, unless the backend announces from the grant itself). A grant lost before its announcement is let go and the campaign goes on within its
/// wait. Written once; a backend's ballot returns it from `candidate`.
#[derive(Debug)]
pub(crate) struct Announcing {
    pub(crate) lock: Arc<dyn crate::contract::Recipe>,
    pub(crate) ballot: Arc<dyn Ballot>,
    pub(crate) value: Arc<str>,
}

impl crate::contract::Recipe for Announcing {
    fn name(&self) -> &str {
        self.lock.name()
    }

    fn acquire<'a>(
        &'a self,
        wait: Wait,
        progress: Option<&'a tokio::sync::watch::Sender<crate::QueueStatus>>,
    ) -> crate::contract::BoxFuture<'a, Result<Option<Box<dyn crate::contract::Held>>>> {
        Box::pin(async move {
            let mut backoff = Backoff::default();
            loop {
                let Some(held) = self.lock.acquire(wait, progress).await? else { return Ok(None) };
                // Dropped here (the campaign cancelled), the grant is released in the background.
                match self.ballot.announce(held.as_ref(), self.value.clone()).await {
                    Ok(()) => return Ok(Some(held)),
                    Err(Error::LockLost { .. }) => {
                        drop(held);
                        if !backoff.wait(wait).await {
                            return Ok(None);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        })
    }
}

/// The pause before a campaign tries again after a grant it could not announce (lost at once,
/// or taken over): 10 ms, doubling up to 1 s, never past the wait's deadline.
#[derive(Debug)]
pub(crate) struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff(Duration::from_millis(10))
    }
}

impl Backoff {
    /// Pauses; false if the wait's deadline has come (give up).
    pub(crate) async fn wait(&mut self, wait: Wait) -> bool {
        // `Never` gives up at once (its `give_up_at` is a now taken after this one's).
        if wait == Wait::Never {
            return false;
        }
        let now = tokio::time::Instant::now();
        let until = match wait.give_up_at() {
            Some(d) if d <= now => return false,
            Some(d) => d.min(now + self.0),
            None => now + self.0,
        };
        tokio::time::sleep_until(until).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
        true
    }
}

fn checked(value: &str) -> Result<Arc<str>> {
    if value.len() > MAX_VALUE {
        return Err(Error::InvalidArgument {
            what: "election value",
            reason: format!("{} bytes; at most {MAX_VALUE}", value.len()),
        });
    }
    Ok(Arc::from(value))
}

/// Leading an [`Election`]: the election's lock, held, and the value announced. Dropping it
/// resigns in the background.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(election: distlock::election::Election) -> distlock::Result<()> {
/// let leading = election.campaign("10.0.0.7:9000").await?;
/// // Pass the epoch to storage that refuses writes from older leaders.
/// let epoch = leading.epoch();
/// # let _ = epoch;
/// leading.resign().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the leadership is resigned at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: Guard,
    ballot: Arc<dyn Ballot>,
    value: std::sync::Mutex<Arc<str>>,
}

impl Leadership {
    /// The election's name on the server.
    pub fn election(&self) -> String {
        self.guard.lock_name().to_string()
    }

    /// The fencing token of this leadership: higher than every earlier leader's.
    pub fn epoch(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// The value announced now.
    pub fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).to_string()
    }

    /// Our mark on the server (node path or key).
    pub fn key(&self) -> String {
        self.guard.holder_id().to_string()
    }

    /// Announces `value` instead, keeping the lead (and the epoch).
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lead was lost (nothing is announced then);
    /// [`Error::InvalidArgument`] for a value over [`MAX_VALUE`] bytes.
    pub async fn proclaim(&self, value: &str) -> Result<()> {
        let value = checked(value)?;
        if let LockState::Lost(reason) = self.guard.state() {
            return Err(Error::LockLost { lock: self.election(), reason });
        }
        self.ballot.proclaim(self.key(), self.epoch(), value.clone()).await?;
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = value;
        Ok(())
    }

    /// The instant after which the server may elect someone else unless it hears from us.
    pub fn lease_deadline(&self) -> std::time::Instant {
        self.guard.lease_deadline()
    }

    /// The state now.
    pub fn state(&self) -> LockState {
        self.guard.state()
    }

    /// Resolves when the lead can no longer be trusted, before anyone else can be elected.
    pub fn lost(&self) -> Pin<Box<dyn Future<Output = LostReason> + Send + 'static>> {
        Box::pin(self.guard.lost())
    }

    /// The election's lock, held.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Gives up the lead and waits for the server.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lead had been lost before.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

/// Changes of an election's leader, from [`Election::observe`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(election: distlock::election::Election) -> distlock::Result<()> {
/// let mut changes = election.observe();
/// loop {
///     match changes.next().await? {
///         distlock::election::Change::Leader(l) => println!("leader {} (epoch {})", l.value, l.epoch),
///         distlock::election::Change::NoLeader => println!("no leader"),
///         _ => {} // a change of a kind added later
///     }
/// }
/// # }
/// ```
pub struct Observer {
    ballot: Arc<dyn Ballot>,
    interval: Duration,
    /// The last state reported: `Some(None)` no leader, `Some(Some(..))` that leader.
    last: Option<Option<Leader>>,
    /// The watch set with the last read, where the backend has watches.
    watch: Option<crate::contract::BoxFuture<'static, ()>>,
    /// Whether the backend has set a watch (then `interval` is not how often to read).
    watches: bool,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").field("interval", &self.interval).field("last", &self.last).finish_non_exhaustive()
    }
}

/// How long an observer with a watch waits before reading again anyway (a watch is the
/// server's promise; this bounds what a lost one could hide).
const WATCH_REREAD: Duration = Duration::from_secs(10);

/// How soon an observer with watches reads again after an error.
const RETRY_WATCHED: Duration = Duration::from_millis(500);

impl Observer {
    /// The next change (the first call: the state now). An error (the server unreachable) is
    /// returned as it happens; the next call goes on from the last state reported.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is lost by dropping the future.
    pub async fn next(&mut self) -> Result<Change> {
        let mut first = self.last.is_none();
        loop {
            match self.watch.as_mut() {
                // Woken by the server at the change. The watch is kept until it fires or the
                // bound passes, so a call cancelled here loses nothing: the next one waits on it.
                Some(changed) => {
                    tokio::select! {
                        _ = changed => {}
                        _ = tokio::time::sleep(WATCH_REREAD.max(self.interval)) => {}
                    }
                    self.watch = None;
                }
                // After an error on a backend with watches: read again soon, not after an
                // interval meant for polling.
                None if !first && self.watches => tokio::time::sleep(self.interval.min(RETRY_WATCHED)).await,
                None if !first => tokio::time::sleep(self.interval).await,
                None => {}
            }
            first = false;
            let now = match self.ballot.watch_leader().await? {
                Some((now, changed)) => {
                    self.watch = Some(changed);
                    self.watches = true;
                    now
                }
                None => self.ballot.leader().await?,
            };
            let same = match (&self.last, &now) {
                (Some(Some(a)), Some(b)) => a.epoch == b.epoch && a.value == b.value,
                (Some(None), None) => true,
                _ => false,
            };
            if !same {
                self.last = Some(now.clone());
                return Ok(now.map_or(Change::NoLeader, Change::Leader));
            }
        }
    }
}

/// The servers' own checks of a proclaim (not the guard's local state): a wrong epoch or a mark
/// that is not the leader's is refused on the server, and nothing is announced.
#[cfg(test)]
pub(crate) mod server_checks {
    use super::*;

    /// A wrong epoch or mark is refused by the server at `url` (each backend's tests call it).
    pub(crate) async fn check(url: &str) {
        let client = crate::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let election = client.election(&format!("proclaim-check-{}", uuid::Uuid::new_v4().simple())).unwrap();
        let leading = election.campaign("first").await.unwrap();
        let (key, epoch) = (leading.key(), leading.epoch());
        let ballot = &leading.ballot;
        let refused = |r: Result<()>| matches!(r, Err(Error::LockLost { .. }));
        assert!(refused(ballot.proclaim(key.clone(), epoch - 1, Arc::from("wrong epoch")).await), "{url}");
        // Another holder's mark, in the backend's own form (a MariaDB connection id must parse).
        let other = match key.strip_prefix("connection:").and_then(|id| id.parse::<u64>().ok()) {
            Some(id) => format!("connection:{}", id + 1),
            None => format!("{key}-not-ours"),
        };
        assert!(refused(ballot.proclaim(other, epoch, Arc::from("not ours")).await), "{url}");
        assert_eq!(election.leader().await.unwrap().map(|l| l.value), Some("first".into()), "{url}");
        ballot.proclaim(key, epoch, Arc::from("second")).await.unwrap();
        assert_eq!(election.leader().await.unwrap().map(|l| l.value), Some("second".into()), "{url}");
        leading.resign().await.unwrap();
    }
}

//! The election's side of the contract: what a backend implements ([`Ballot`]) and the leader it
//! reads. Everything else about elections is written once, in the `election` module.

use super::{BoxFuture, Held, Recipe};
use crate::Result;
use std::fmt::Debug;
use std::sync::Arc;

/// The leader of an election, as read from the server.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(election: distlock::election::Election) -> distlock::Result<()> {
/// match election.leader().await? {
///     Some(leader) => println!("{} leads (epoch {})", leader.value, leader.epoch),
///     None => println!("no leader"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader announces (its proposal or id).
    pub value: String,
    /// The leader's epoch: its lock's fencing token, higher for every later leader.
    pub epoch: u64,
    /// The leader's mark on the server: its node path (ZooKeeper) or key (etcd).
    pub key: String,
}

/// The leader read with a watch, and the future the watch resolves at the next change (see
/// [`Ballot::watch_leader`]); `None` where the backend has no watch.
pub(crate) type Watched = Option<(Option<Leader>, BoxFuture<'static, ()>)>;

/// A backend's side of a leader election (see the `election` module): campaigning is acquiring a
/// lock whose holder's mark on the server carries the announced value. Everything else (the
/// guard, loss, resign, observing) is written once over this.
pub(crate) trait Ballot: Debug + Send + Sync + 'static {
    /// The election's name on the server.
    fn name(&self) -> &str;
    /// The lock a candidate announcing `value` acquires: holding it is leading.
    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe>;
    /// The leader now (the oldest candidate still on the server), if any.
    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>>;
    /// The leader now, read with a watch set on the server, and a future that resolves at the
    /// first change after that read (a candidate come or gone, a new value, or the session's
    /// trouble); `None` on a backend without watches, whose observers poll [`Ballot::leader`].
    fn watch_leader(&self) -> BoxFuture<'_, Result<Watched>> {
        Box::pin(async { Ok(None) })
    }
    /// Replaces the value announced by the leadership held as `holder_id` with `token`; fails
    /// with [`Error::LockLost`] if it is no longer ours.
    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>>;
    /// Announces `value` for `held`, a grant of [`Ballot::candidate`]'s lock just had, on a
    /// backend whose grant cannot carry the value (the `election` module's `Announcing`): by
    /// default a [`Ballot::proclaim`] with the grant's mark and token. A backend whose
    /// announcement must come from the grant itself (from its connection) overrides it.
    fn announce<'a>(&'a self, held: &'a dyn Held, value: Arc<str>) -> BoxFuture<'a, Result<()>> {
        self.proclaim(held.holder_id().to_string(), held.fencing_token(), value)
    }
}

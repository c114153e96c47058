//! ZooKeeper's side of the one lock contract ([`crate::contract`]): the client, the lock
//! specs (mutex, read, write, permit) and their guards.

use super::{nobody_listens, AnyGuard, Client, LockSpec, ZkUrl};
use crate::contract::{self, Backend, BoxFuture, Held, Kind, Recipe, Wait};
use crate::{Error, QueueStatus, Result};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Connects; a ZooKeeper that is not there at all (every address refuses) is reported at once
/// rather than after the connect timeout.
pub(crate) fn connect<'a>(url: &'a str, over: &'a crate::options::Common) -> BoxFuture<'a, Result<crate::Client>> {
    Box::pin(async move {
        let parsed = ZkUrl::parse_with(url, over)?;
        let client = tokio::select! {
            client = Client::connect_url(parsed.clone()) => client?,
            why = nobody_listens(&parsed) => {
                return Err(Error::Connect { url: parsed.to_string(), reason: why })
            }
        };
        Ok(contract::client(client))
    })
}

impl Backend for Client {
    fn backend(&self) -> &'static str {
        "zookeeper"
    }

    fn lease(&self) -> Duration {
        self.session_timeout()
    }

    fn lock_name(&self, name: &str) -> Result<String> {
        zk_path(name)
    }

    fn recipe(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        Ok(Arc::new(match kind {
            Kind::Mutex => LockSpec::Exclusive(self.mutex(name)?),
            Kind::Read => LockSpec::Read(self.rwlock(name)?),
            Kind::Write => LockSpec::Write(self.rwlock(name)?),
            Kind::Permits(n) => LockSpec::Permits(self.semaphore(name, n)?, 1),
        }))
    }

    fn locks<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<crate::listing::Listing>> {
        Box::pin(Client::locks(self, prefix))
    }

    fn lock<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<crate::listing::Listing>> {
        Box::pin(Client::one_lock(self, name))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn contract::Ballot>> {
        Ok(Arc::new(super::election::Election { client: self.clone(), dir: super::url::lock_path(name)? }))
    }

    fn jobs(&self) -> Result<Arc<dyn contract::Jobs>> {
        self.jobs_of()
    }

    fn close(&self, bound: Duration) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().close(bound))
    }
}

impl Recipe for LockSpec {
    fn name(&self) -> &str {
        self.path()
    }

    fn acquire<'a>(
        &'a self,
        wait: Wait,
        progress: Option<&'a watch::Sender<QueueStatus>>,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Held>>>> {
        Box::pin(
            async move { Ok(LockSpec::acquire(self, wait, progress).await?.map(|g| Box::new(g) as Box<dyn Held>)) },
        )
    }
}

contract::held!(AnyGuard);

impl From<Client> for crate::Client {
    fn from(c: Client) -> crate::Client {
        contract::client(c)
    }
}

impl From<LockSpec> for crate::Lock {
    fn from(s: LockSpec) -> crate::Lock {
        crate::Lock::from_recipe(Arc::new(s), "zookeeper")
    }
}

/// A bare name is `/distlock/NAME`; an absolute path is used as is; anything else is refused
/// with a suggestion.
fn zk_path(lock: &str) -> Result<String> {
    let bad = |reason: String| Error::InvalidLockPath { path: lock.to_string(), reason };
    if lock.is_empty() {
        return Err(bad("the lock name is empty".into()));
    }
    if lock.starts_with('/') {
        Ok(lock.to_string())
    } else if lock.contains('/') {
        let segments: Vec<&str> = lock.split('/').filter(|s| !s.is_empty() && *s != "." && *s != "..").collect();
        let suggestion = match segments.as_slice() {
            [one] => format!("{one} (which means /distlock/{one}) or /{one}"),
            _ => format!("/{}", segments.join("/")),
        };
        Err(bad(format!("give a bare name without '/' or an absolute znode path, e.g. {suggestion}")))
    } else {
        Ok(format!("/distlock/{lock}"))
    }
}

impl super::Client {
    fn jobs_of(&self) -> crate::Result<std::sync::Arc<dyn crate::contract::Jobs>> {
        Ok(std::sync::Arc::new(super::jobs::Jobs { client: self.clone(), parents: std::sync::Arc::default() }))
    }
}

impl crate::Client {
    /// The typed ZooKeeper client, if this is one (see [`crate::Client::downcast`]).
    pub fn zookeeper(&self) -> Option<&super::Client> {
        self.downcast()
    }
}

// ZooKeeper's typed locks as the one lock: the mutex and the semaphore (one permit, as the other
// backends' semaphores take) through their lock specs, the reentrant mutex as a recipe of its own.
impl From<super::Mutex> for crate::Lock {
    fn from(m: super::Mutex) -> crate::Lock {
        LockSpec::Exclusive(m).into()
    }
}

impl From<super::Semaphore> for crate::Lock {
    fn from(s: super::Semaphore) -> crate::Lock {
        LockSpec::Permits(s, 1).into()
    }
}

contract::recipe!(super::ReentrantMutex => "zookeeper", |l, t| name: l.path(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
contract::held!(super::ReentrantGuard);

#[cfg(test)]
mod contract_tests {
    /// Each typed lock converts into the one lock ([`crate::Lock`]), which the template takes.
    #[test]
    fn typed_locks_convert_into_the_lock() {
        fn takes<L: Into<crate::Lock>>() {}
        takes::<super::super::Mutex>();
        takes::<super::super::ReentrantMutex>();
        takes::<super::super::Semaphore>();
    }

    /// A wrong epoch or mark is refused by the server itself.
    #[tokio::test]
    async fn a_wrong_epoch_or_mark_is_refused_by_the_server() {
        let s = distlock_server::EmbeddedServer::start().await.unwrap();
        crate::election::server_checks::check(&s.url()).await;
    }
}

//! NATS's side of the one lock contract ([`crate::contract`]): the mutex, the read/write lock and
//! the semaphore (keys with their TTLs, all held as a [`LockGuard`]), elections on the mutex and
//! once-per-slot jobs.

use super::{Client, LockGuard, Mutex, RwLock, Semaphore};
use crate::contract::{self, recipe, Kind, Reading, Recipe, Writing};
use crate::Result;
use std::sync::Arc;

contract::backend!(Client);

impl contract::Backend for Client {
    fn backend(&self) -> &'static str {
        "nats"
    }

    fn lease(&self) -> std::time::Duration {
        Client::lease(self)
    }

    fn locks<'a>(&'a self, prefix: &'a str) -> contract::BoxFuture<'a, Result<crate::listing::Listing>> {
        Box::pin(Client::locks(self, prefix))
    }

    fn lock<'a>(&'a self, name: &'a str) -> contract::BoxFuture<'a, Result<crate::listing::Listing>> {
        Box::pin(Client::one_lock(self, name))
    }

    fn close(&self, bound: std::time::Duration) -> contract::BoxFuture<'static, ()> {
        Box::pin(self.clone().close(bound))
    }

    fn jobs(&self) -> Result<Arc<dyn contract::Jobs>> {
        Ok(Arc::new(super::jobs::Jobs { client: self.clone() }))
    }

    fn lock_name(&self, name: &str) -> Result<String> {
        self.mutex(name).map(|_| name.to_string())
    }

    fn election(&self, name: &str) -> Result<Arc<dyn contract::Ballot>> {
        let mutex = self.mutex(name)?;
        Ok(Arc::new(super::election::Election { client: self.clone(), mutex }))
    }

    fn recipe(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        Ok(match kind {
            Kind::Mutex => contract::lock(self.mutex(name)?),
            Kind::Read => contract::lock(Reading(self.rwlock(name)?)),
            Kind::Write => contract::lock(Writing(self.rwlock(name)?)),
            Kind::Permits(n) => contract::lock(self.semaphore(name, n)?),
        })
    }
}

recipe!(Mutex => "nats", |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
recipe!(Reading<RwLock>, |l, t| name: l.0.name(), forever: l.0.read(), never: l.0.try_read(), within: l.0.read_timeout(t));
recipe!(Writing<RwLock>, |l, t| name: l.0.name(), forever: l.0.write(), never: l.0.try_write(), within: l.0.write_timeout(t));
recipe!(Semaphore => "nats", |l, t| name: l.name(), forever: l.acquire(), never: l.try_acquire(), within: l.acquire_timeout(t));
contract::held!(LockGuard);

impl crate::Client {
    /// The typed NATS client, if this is one (see [`crate::Client::downcast`]).
    pub fn nats(&self) -> Option<&super::Client> {
        self.downcast()
    }
}

#[cfg(test)]
mod contract_tests {
    /// Each typed lock converts into the one lock ([`crate::Lock`]), which the template takes.
    #[test]
    fn typed_locks_convert_into_the_lock() {
        fn takes<L: Into<crate::Lock>>() {}
        takes::<super::super::Mutex>();
        takes::<super::super::Semaphore>();
    }

    /// A wrong epoch or mark is refused by the server itself.
    #[tokio::test]
    async fn a_wrong_epoch_or_mark_is_refused_by_the_server() {
        match std::env::var("DISTLOCK_TEST_NATS") {
            Ok(addr) => crate::election::server_checks::check(&format!("nats://{addr}")).await,
            Err(_) => eprintln!("skipped: DISTLOCK_TEST_NATS is not set (scripts/test.sh sets it)"),
        }
    }
}

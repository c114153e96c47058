//! etcd's side of the one lock contract ([`crate::contract`]): the mutex (as `etcdctl lock`),
//! the read/write lock and the semaphore, all held as a [`LockGuard`].

use super::{Client, LockGuard, Mutex, RwLock, Semaphore};
use crate::contract::{self, recipe, Kind, Reading, Recipe, Writing};
use crate::Result;
use std::sync::Arc;

contract::backend!(Client, "etcd");

impl Client {
    fn checked_name(&self, name: &str) -> Result<String> {
        self.mutex(name).map(|_| name.to_string())
    }

    fn election_of(&self, name: &str) -> Result<Arc<dyn contract::Ballot>> {
        self.mutex(name)?;
        Ok(Arc::new(super::election::Election { client: self.clone(), name: name.to_string() }))
    }

    fn make(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        Ok(match kind {
            Kind::Mutex => contract::lock(self.mutex(name)?),
            Kind::Read => contract::lock(Reading(self.rwlock(name)?)),
            Kind::Write => contract::lock(Writing(self.rwlock(name)?)),
            Kind::Permits(n) => contract::lock(self.semaphore(name, n)?),
        })
    }
}

recipe!(Mutex => LockGuard, |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
recipe!(Reading<RwLock>, |l, t| name: l.0.name(), forever: l.0.read(), never: l.0.try_read(), within: l.0.read_timeout(t));
recipe!(Writing<RwLock>, |l, t| name: l.0.name(), forever: l.0.write(), never: l.0.try_write(), within: l.0.write_timeout(t));
recipe!(Semaphore => LockGuard, |l, t| name: l.name(), forever: l.acquire(), never: l.try_acquire(), within: l.acquire_timeout(t));
contract::held!(LockGuard);

impl super::Client {
    fn jobs_of(&self) -> crate::Result<std::sync::Arc<dyn crate::contract::Jobs>> {
        Ok(std::sync::Arc::new(super::jobs::Jobs { client: self.clone() }))
    }
}

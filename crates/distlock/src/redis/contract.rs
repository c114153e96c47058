//! Redis's side of the one lock contract ([`crate::contract`]): the URL's mutex layout
//! (Redisson's or redis-py's), the read/write lock and the semaphore.

use super::{
    Client, Layout, Mutex, MutexGuard, ReadGuard, RwLock, Semaphore, SemaphorePermit, SimpleGuard, SimpleLock,
    WriteGuard,
};
use crate::contract::{self, recipe, Kind, Reading, Recipe, Writing};
use crate::Result;
use std::sync::Arc;

contract::backend!(Client, "redis");

impl Client {
    fn election_of(&self, name: &str) -> Result<Arc<dyn contract::Ballot>> {
        self.validate(name)?;
        Ok(Arc::new(super::election::Election { client: self.clone(), key: name.to_string() }))
    }

    fn checked_name(&self, name: &str) -> Result<String> {
        Ok(name.to_string())
    }

    fn make(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        Ok(match kind {
            Kind::Mutex => match self.url().layout {
                Layout::Redisson => contract::lock(self.mutex(name)?),
                Layout::Simple => contract::lock(self.simple_lock(name)?),
            },
            Kind::Read => contract::lock(Reading(self.rwlock(name)?)),
            Kind::Write => contract::lock(Writing(self.rwlock(name)?)),
            Kind::Permits(n) => contract::lock(self.semaphore(name, n)?),
        })
    }
}

recipe!(Mutex => MutexGuard, |l, t| name: l.key(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
recipe!(SimpleLock => SimpleGuard, |l, t| name: l.key(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
recipe!(Reading<RwLock>, |l, t| name: l.0.key(), forever: l.0.read(), never: l.0.try_read(), within: l.0.read_timeout(t));
recipe!(Writing<RwLock>, |l, t| name: l.0.key(), forever: l.0.write(), never: l.0.try_write(), within: l.0.write_timeout(t));
recipe!(Semaphore => SemaphorePermit, |l, t| name: l.key(), forever: l.acquire(), never: l.try_acquire(), within: l.acquire_timeout(t));
contract::held!(MutexGuard, SimpleGuard, ReadGuard, WriteGuard, SemaphorePermit);
// The fair lock is no recipe of the contract (its queue is Redisson's), but takes the template.
crate::template::distributed_lock!(super::FairLock => super::FairGuard, |l, t| name: l.key(), within: l.lock_timeout(t));
crate::template::distributed_guard!(super::FairGuard);

impl From<Mutex> for crate::Lock {
    fn from(m: Mutex) -> crate::Lock {
        crate::Lock::from_recipe(Arc::new(m), "redis")
    }
}

impl From<SimpleLock> for crate::Lock {
    fn from(m: SimpleLock) -> crate::Lock {
        crate::Lock::from_recipe(Arc::new(m), "redis")
    }
}

impl super::Client {
    fn jobs_of(&self) -> crate::Result<std::sync::Arc<dyn crate::contract::Jobs>> {
        Ok(std::sync::Arc::new(super::jobs::Jobs { client: self.clone() }))
    }
}

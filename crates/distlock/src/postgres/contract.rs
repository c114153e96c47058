//! PostgreSQL's side of the one lock contract ([`crate::contract`]): advisory-lock mutex, the
//! read side of the read/write lock, and the semaphore.

use super::{Client, Mutex, MutexGuard, Semaphore};
use crate::contract::{self, recipe, Kind, Recipe};
use crate::Result;
use std::sync::Arc;

contract::backend!(Client, "postgres");

impl Client {
    /// Refuses `what` with `lock_scope=transaction`: it needs a server session of its own, which
    /// a transaction pooler does not keep.
    pub(crate) fn session_scope_only(&self, what: &str) -> Result<()> {
        if self.url().scope == super::LockScope::Transaction {
            return Err(crate::Error::Unsupported {
                backend: "postgres",
                what: format!(
                    "{what} with lock_scope=transaction (it needs session scope: only locks run in transactions)"
                ),
            });
        }
        Ok(())
    }

    fn election_of(&self, name: &str) -> Result<Arc<dyn contract::Ballot>> {
        // The leader's row names its server session, which a transaction pooler changes.
        self.session_scope_only(&format!("election {name}"))?;
        Ok(Arc::new(super::election::Election::new(self.clone(), name)?))
    }

    fn checked_name(&self, name: &str) -> Result<String> {
        self.key(name).map(|_| name.to_string())
    }

    fn make(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        Ok(match kind {
            Kind::Mutex | Kind::Write => contract::lock(self.mutex(name)?),
            Kind::Read => contract::lock(self.rwlock(name)?.reader()),
            Kind::Permits(n) => contract::lock(self.semaphore(name, n)?),
        })
    }
}

recipe!(Mutex => MutexGuard, |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
recipe!(Semaphore => MutexGuard, |l, t| name: l.name(), forever: l.acquire(), never: l.try_acquire(), within: l.acquire_timeout(t));
contract::held!(MutexGuard);

impl super::Client {
    fn jobs_of(&self) -> crate::Result<std::sync::Arc<dyn crate::contract::Jobs>> {
        // Its statements are prepared on a session, which a transaction pooler does not keep.
        self.session_scope_only("scheduled jobs")?;
        Ok(std::sync::Arc::new(super::jobs::Jobs { client: self.clone(), created: std::sync::Arc::default() }))
    }
}

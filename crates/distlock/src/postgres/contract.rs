//! PostgreSQL's side of the one lock contract ([`crate::contract`]): advisory-lock mutex, the
//! read side of the read/write lock, and the semaphore.

use super::{Client, Mutex, MutexGuard, Semaphore};
use crate::contract::{self, recipe, Kind, Recipe};
use crate::Result;
use std::sync::Arc;

contract::backend!(Client);

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
}

impl contract::Backend for Client {
    fn backend(&self) -> &'static str {
        "postgres"
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
        // Its statements are prepared on a session, which a transaction pooler does not keep.
        self.session_scope_only("scheduled jobs")?;
        Ok(Arc::new(crate::sql::jobs::Jobs::new(self.clone())))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn contract::Ballot>> {
        // The leader's row names its server session, which a transaction pooler changes.
        self.session_scope_only(&format!("election {name}"))?;
        Ok(Arc::new(super::election::Election::new(self.clone(), name)?))
    }

    fn lock_name(&self, name: &str) -> Result<String> {
        self.key(name).map(|_| name.to_string())
    }

    fn recipe(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        Ok(match kind {
            Kind::Mutex | Kind::Write => contract::lock(self.mutex(name)?),
            Kind::Read => contract::lock(self.rwlock(name)?.reader()),
            Kind::Permits(n) => contract::lock(self.semaphore(name, n)?),
        })
    }
}

recipe!(Mutex => "postgres", |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
recipe!(Semaphore => "postgres", |l, t| name: l.name(), forever: l.acquire(), never: l.try_acquire(), within: l.acquire_timeout(t));
contract::held!(MutexGuard);

impl crate::Client {
    /// The typed PostgreSQL client, if this is one (see [`crate::Client::downcast`]).
    pub fn postgres(&self) -> Option<&super::Client> {
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
        match std::env::var("DISTLOCK_TEST_POSTGRES") {
            Ok(url) => crate::election::server_checks::check(&url).await,
            Err(_) => eprintln!("skipped: DISTLOCK_TEST_POSTGRES is not set (scripts/test.sh sets it)"),
        }
    }
}

//! The one lock contract ([`crate::contract`]) on SQLite's lease-table mutex; other kinds are
//! refused. Elections: the mutex plus an announcement table (`election.rs`).

use super::{Client, Mutex, MutexGuard};
use crate::contract;
use crate::Result;
use std::sync::Arc;

crate::contract::backend!(Client);

impl contract::Backend for Client {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn lease(&self) -> std::time::Duration {
        Client::lease(self)
    }

    fn lock_name(&self, name: &str) -> Result<String> {
        self.mutex(name).map(|_| name.to_string())
    }

    fn recipe(&self, name: &str, kind: contract::Kind) -> Result<Arc<dyn contract::Recipe>> {
        contract::mutex_only(kind, "sqlite", name, "the SQLite lease table has the mutex only", || self.mutex(name))
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
        Ok(Arc::new(crate::sql::jobs::Jobs::new(self.clone())))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn contract::Ballot>> {
        self.mutex(name)?;
        Ok(Arc::new(super::election::Election {
            client: self.clone(),
            name: name.to_string(),
            created: Arc::default(),
        }))
    }
}

contract::recipe!(Mutex => "sqlite", |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
contract::held!(MutexGuard);

impl crate::Client {
    /// The typed SQLite client, if this is one (see [`crate::Client::downcast`]).
    pub fn sqlite(&self) -> Option<&super::Client> {
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
    }

    /// A wrong epoch or mark is refused by the server itself.
    #[tokio::test]
    async fn a_wrong_epoch_or_mark_is_refused_by_the_server() {
        let dir = std::env::temp_dir().join(format!("distlock-proclaim-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        crate::election::server_checks::check(&format!("sqlite://{}/locks.db", dir.display())).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

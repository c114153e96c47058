//! The one lock contract ([`crate::contract`]) on MariaDB's `GET_LOCK` mutex; other kinds are
//! refused. Elections: the mutex plus an announcement table (`election.rs`).

use super::{Client, Mutex, MutexGuard};
use std::sync::Arc;

crate::contract::mutex_only_backend!(Client, "mysql", Mutex, MutexGuard, "MariaDB's GET_LOCK gives the mutex only");

impl Client {
    fn election_of(&self, name: &str) -> crate::Result<Arc<dyn crate::contract::Ballot>> {
        self.mutex(name)?;
        Ok(Arc::new(super::election::Election {
            client: self.clone(),
            name: name.to_string(),
            created: Arc::default(),
        }))
    }
}

impl super::Client {
    fn jobs_of(&self) -> crate::Result<std::sync::Arc<dyn crate::contract::Jobs>> {
        Ok(std::sync::Arc::new(super::jobs::Jobs { client: self.clone(), created: std::sync::Arc::default() }))
    }
}

impl crate::Client {
    /// The typed MariaDB client, if this is one (see [`crate::Client::downcast`]).
    pub fn mysql(&self) -> Option<&super::Client> {
        self.downcast()
    }
}

#[cfg(test)]
mod contract_tests {
    /// `lease`, `session_timeout` and `ttl` mean the same here as on every scheme (the README
    /// promises it).
    #[test]
    fn the_lease_under_each_of_its_names() {
        for key in crate::options::LEASE_KEYS {
            assert_eq!(
                super::super::MysqlUrl::parse(&format!("mysql://u@h:1/d?{key}=5s")).unwrap().lease,
                std::time::Duration::from_secs(5),
                "{key}"
            );
        }
    }

    /// Each typed lock takes the template ([`crate::DistributedLock`]).
    #[test]
    fn typed_locks_are_distributed_locks() {
        fn takes<L: crate::DistributedLock>() {}
        takes::<super::super::Mutex>();
    }

    /// A wrong epoch or mark is refused by the server itself.
    #[tokio::test]
    async fn a_wrong_epoch_or_mark_is_refused_by_the_server() {
        match std::env::var("DISTLOCK_TEST_MYSQL") {
            Ok(url) => crate::election::server_checks::check(&url).await,
            Err(_) => eprintln!("skipped: DISTLOCK_TEST_MYSQL is not set (scripts/test.sh sets it)"),
        }
    }
}

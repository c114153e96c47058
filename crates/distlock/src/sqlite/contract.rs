//! The one lock contract ([`crate::contract`]) on SQLite's lease-table mutex; other kinds are
//! refused. Elections: the mutex plus an announcement table (`election.rs`).

use super::{Client, Mutex, MutexGuard};
use std::sync::Arc;

crate::contract::mutex_only_backend!(Client, "sqlite", Mutex, MutexGuard, "the SQLite lease table has the mutex only");

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
    /// The typed SQLite client, if this is one (see [`crate::Client::downcast`]).
    pub fn sqlite(&self) -> Option<&super::Client> {
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
                super::super::SqliteUrl::parse(&format!("sqlite:///tmp/a.db?{key}=5s")).unwrap().lease,
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
        let dir = std::env::temp_dir().join(format!("distlock-proclaim-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        crate::election::server_checks::check(&format!("sqlite://{}/locks.db", dir.display())).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

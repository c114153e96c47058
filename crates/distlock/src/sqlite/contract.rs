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

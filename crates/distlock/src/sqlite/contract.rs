//! The one lock contract ([`crate::contract`]) on SQLite's lease-table mutex; other kinds are refused.

use super::{Client, Mutex, MutexGuard};
use crate::contract::{self, recipe, Kind, Recipe};
use crate::Result;
use std::sync::Arc;

contract::backend!(Client, "sqlite");

impl Client {
    fn checked_name(&self, name: &str) -> Result<String> {
        self.mutex(name).map(|_| name.to_string())
    }

    fn make(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        kind.mutex_only("sqlite", name, "the SQLite lease table has the mutex only")?;
        Ok(contract::lock(self.mutex(name)?))
    }
}

recipe!(Mutex, |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
contract::held!(MutexGuard);

//! The one lock contract ([`crate::contract`]) on SQLite's lease-table mutex; other kinds are refused.

use super::{Client, Mutex, MutexGuard};
use crate::contract::{self, recipe, Backend, BoxFuture, Kind, Recipe};
use crate::Result;
use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn connect(url: &str) -> BoxFuture<'_, Result<crate::Client>> {
    Box::pin(async move { Ok(contract::client(Client::connect(url).await?)) })
}

impl Backend for Client {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn lease(&self) -> Duration {
        Client::lease(self)
    }

    fn lock_name(&self, name: &str) -> Result<String> {
        self.mutex(name).map(|_| name.to_string())
    }

    fn recipe(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        kind.mutex_only("sqlite", name, "the SQLite lease table has the mutex only")?;
        Ok(contract::lock(self.mutex(name)?))
    }

    fn close(&self, bound: Duration) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().close(bound))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

recipe!(Mutex, |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
contract::held!(MutexGuard);

impl From<Client> for crate::Client {
    fn from(c: Client) -> crate::Client {
        contract::client(c)
    }
}

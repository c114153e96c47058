//! PostgreSQL's side of the one lock contract ([`crate::contract`]): advisory-lock mutex, the
//! read side of the read/write lock, and the semaphore.

use super::{Client, Mutex, MutexGuard, Semaphore};
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
        "postgres"
    }

    fn lease(&self) -> Duration {
        Client::lease(self)
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

    fn close(&self, bound: Duration) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().close(bound))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

recipe!(Mutex, |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
recipe!(Semaphore, |l, t| name: l.name(), forever: l.acquire(), never: l.try_acquire(), within: l.acquire_timeout(t));
contract::held!(MutexGuard);

impl From<Client> for crate::Client {
    fn from(c: Client) -> crate::Client {
        contract::client(c)
    }
}

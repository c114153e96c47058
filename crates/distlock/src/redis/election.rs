//! Elections on Redis, in distlock's own layout over Redisson's RLock (Redisson has no
//! election): a candidate is the [`Mutex`] on the election's key whose grant also puts the
//! hash field `value` (the announced value) beside the holder's `<uuid>:<n>` field, in the same
//! script; the epoch is the lock's fencing token (Redisson's `redisson_lock_token:{key}`
//! counter). The field goes with the hash when the leader resigns or its lease runs out.

use super::{scripts, token_key, Client, Mutex};
use crate::contract::{self, Ballot, BoxFuture, Recipe};
use crate::election::Leader;
use crate::{Error, LostReason, Result};
use std::sync::Arc;

/// An election's side on Redis.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) key: String,
}

impl Ballot for Election {
    fn name(&self) -> &str {
        &self.key
    }

    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe> {
        contract::lock(Mutex::candidate(self.client.clone(), self.key.clone(), value))
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            let keys = [self.key.as_str(), &token_key(&self.key)];
            let got: Option<(String, String, String)> =
                self.client.eval(&scripts::LEADER, &keys, &[], "leader", &self.key).await?;
            Ok(got.map(|(field, value, epoch)| Leader { value, epoch: epoch.parse().unwrap_or(0), key: field }))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let keys = [self.key.as_str(), &token_key(&self.key)];
            let args = [holder_id, value.to_string(), token.to_string()];
            let put: i64 = self.client.eval(&scripts::PROCLAIM, &keys, &args, "proclaim", &self.key).await?;
            if put == 1 {
                Ok(())
            } else {
                Err(Error::LockLost { lock: self.key.clone(), reason: LostReason::KeyDeleted })
            }
        })
    }
}

//! Elections on NATS: a candidate takes the election's mutex key with its value in the key's
//! own value (one guarded create); the leader is the key's live holder, its epoch the create's
//! sequence (the fencing token), its key the holder's mark. A proclaim is a guarded write of the
//! key at our last sequence (a renewal with the new value).

use super::hold::Value;
use super::{live, Client, Mutex};
use crate::contract::{Ballot, BoxFuture, Held, Recipe, Wait};
use crate::election::Leader;
use crate::lease::Renewal;
use crate::{Error, LostReason, QueueStatus, Result};
use std::sync::Arc;

/// An election's side on NATS.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) mutex: Mutex,
}

/// A candidate: the election's mutex, acquired with the value in the key.
#[derive(Debug)]
struct Candidate {
    mutex: Mutex,
    value: Arc<str>,
}

impl Recipe for Candidate {
    fn name(&self) -> &str {
        self.mutex.name()
    }

    fn acquire<'a>(
        &'a self,
        wait: Wait,
        _progress: Option<&'a tokio::sync::watch::Sender<QueueStatus>>,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Held>>>> {
        Box::pin(async move {
            let held = self.mutex.acquire(wait, Some(self.value.to_string())).await?;
            Ok(held.map(|g| Box::new(g) as Box<dyn Held>))
        })
    }
}

impl Ballot for Election {
    fn name(&self) -> &str {
        self.mutex.name()
    }

    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe> {
        Arc::new(Candidate { mutex: self.mutex.clone(), value })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            let Some(e) = self.client.read(self.mutex.key()).await? else { return Ok(None) };
            if !live(&e) {
                return Ok(None);
            }
            Ok(Value::of(&e).and_then(|v| {
                let value = v.value?;
                Some(Leader { value, epoch: v.token, key: v.owner })
            }))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let lost = || Error::LockLost { lock: self.mutex.name().to_string(), reason: LostReason::KeyDeleted };
            let state = {
                let holds = self.client.inner.holds.lock().unwrap_or_else(|e| e.into_inner());
                holds.get(&holder_id).and_then(std::sync::Weak::upgrade)
            };
            let state = state.filter(|s| s.token == token && s.key == self.mutex.key()).ok_or_else(lost)?;
            *state.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(value.to_string());
            // Twice at most: a first answer "failed" may have found our own unanswered write.
            for _ in 0..2 {
                match state.rewrite().await {
                    Renewal::Renewed => return Ok(()),
                    Renewal::Gone(_) => return Err(lost()),
                    Renewal::Failed => {}
                }
            }
            Err(Error::Backend {
                op: "proclaim",
                path: self.mutex.name().to_string(),
                source: "the server did not confirm the new value".into(),
            })
        })
    }
}

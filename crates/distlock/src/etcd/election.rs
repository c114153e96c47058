//! Elections on etcd, in the layout of Go's `concurrency.Election` (what `etcdctl elect` uses):
//! each candidate's key is `<name>/<lease id in hex>` under its session lease, holding the
//! proposal; the key with the oldest create revision leads. A candidate is the [`Mutex`] queue
//! with the proposal as the key's value, so the campaign, the check after the wait and the
//! loss signal are the mutex's; the epoch is the leader key's create revision.

use super::{Client, Mutex};
use crate::contract::{self, Ballot, BoxFuture, Recipe};
use crate::election::Leader;
use crate::{Error, LostReason, Result};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions};
use std::sync::Arc;

/// An election's side on etcd.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) name: String,
}

impl Election {
    /// Go's `Leader`: the first key by create revision under `<name>/`, and the revision of the
    /// read.
    async fn read_leader(&self) -> Result<(Option<Leader>, i64)> {
        let prefix = format!("{}/", self.name);
        let options = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        let etcd = self.client.etcd();
        let resp = self
            .client
            .call("leader", &self.name, |_| {
                let (mut etcd, prefix, options) = (etcd.clone(), prefix.clone(), options.clone());
                async move { etcd.get(prefix, Some(options)).await }
            })
            .await?;
        let leader = resp.kvs().first().map(|kv| Leader {
            value: String::from_utf8_lossy(kv.value()).into_owned(),
            epoch: kv.create_revision() as u64,
            key: String::from_utf8_lossy(kv.key()).into_owned(),
        });
        Ok((leader, resp.header().map_or(0, |h| h.revision())))
    }
}

impl Ballot for Election {
    fn name(&self) -> &str {
        &self.name
    }

    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe> {
        contract::lock(Mutex::candidate(self.client.clone(), self.name.clone(), value))
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move { Ok(self.read_leader().await?.0) })
    }

    fn watch_leader(&self) -> BoxFuture<'_, Result<crate::contract::Watched>> {
        Box::pin(async move {
            // As `leader`, then a watch on the candidates' prefix from the revision after that
            // read: no change made after the read is missed.
            let (leader, revision) = self.read_leader().await?;
            let (prefix, etcd) = (format!("{}/", self.name), self.client.etcd());
            let watch = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
            let mut stream = self
                .client
                .call("watch", &self.name, |_| {
                    let (mut etcd, prefix, watch) = (etcd.clone(), prefix.clone(), watch.clone());
                    async move { etcd.watch(prefix, Some(watch)).await }
                })
                .await?;
            let changed: BoxFuture<'static, ()> = Box::pin(async move {
                // The first event (the notice of the watch's creation carries none); a cancelled
                // or compacted watch, an error or the stream's end wakes the observer too.
                while let Ok(Some(msg)) = stream.message().await {
                    if !msg.events().is_empty() || msg.canceled() || msg.compact_revision() > 0 {
                        return;
                    }
                }
            });
            Ok(Some((leader, changed)))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // Go's `Proclaim`: put the new value, keeping the key's lease, only while the key is
            // the one we created (its create revision is our epoch).
            let txn = Txn::new()
                .when([Compare::create_revision(holder_id.clone(), CompareOp::Equal, token as i64)])
                .and_then([TxnOp::put(
                    holder_id.clone(),
                    value.as_bytes(),
                    Some(PutOptions::new().with_ignore_lease()),
                )]);
            let etcd = self.client.etcd();
            let resp = self
                .client
                .call("proclaim", &self.name, |_| {
                    let (mut etcd, txn) = (etcd.clone(), txn.clone());
                    async move { etcd.txn(txn).await }
                })
                .await?;
            if resp.succeeded() {
                Ok(())
            } else {
                Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::NodeDeleted })
            }
        })
    }
}

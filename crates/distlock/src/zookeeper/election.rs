//! Elections on ZooKeeper, in the layout of Curator's `LeaderSelector`: each candidate queues
//! an `InterProcessMutex` node (`_c_<uuid>-lock-<seq>`) under the election's path, whose data is
//! the candidate's value (LeaderSelector's participant id); the first node in sequence order
//! leads. A candidate is the [`Mutex`] queue with that data, so the campaign, the watch on the
//! predecessor only and the loss signal are the mutex's; the epoch is the leader node's czxid.

use super::queue::{node_kind, sort_children, NodeKind, FAMILY};
use super::{backend, Client, LockSpec, Mutex};
use crate::contract::{Ballot, BoxFuture, Recipe};
use crate::election::Leader;
use crate::{Error, LostReason, Result};
use std::sync::Arc;
use zookeeper_client as zk;

/// An election's side on ZooKeeper.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) dir: String,
}

impl Ballot for Election {
    fn name(&self) -> &str {
        &self.dir
    }

    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe> {
        let data: Arc<[u8]> = Arc::from(value.as_bytes());
        Arc::new(LockSpec::Exclusive(Mutex::with_data(self.client.clone(), self.dir.clone(), data)))
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            // Curator's `LeaderSelector.getLeader()`: the participants in sequence order, the
            // first one still there leads. A node that goes between the listing and its read is
            // skipped, as Curator does.
            let zk = self.client.zk();
            self.client.metrics().sent(1);
            let mut children = match zk.list_children(&self.dir).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => match self.client.missing_chroot(&self.dir).await {
                    Some(e) => return Err(e),
                    None => return Ok(None),
                },
                Err(e) => return Err(backend("getChildren", &self.dir, e)),
            };
            children.retain(|c| node_kind(c) == NodeKind::Lock);
            sort_children(&mut children, FAMILY);
            for child in children {
                let path = format!("{}/{child}", self.dir);
                self.client.metrics().sent(1);
                match zk.get_data(&path).await {
                    Ok((data, stat)) => {
                        return Ok(Some(Leader {
                            value: String::from_utf8_lossy(&data).into_owned(),
                            epoch: stat.czxid as u64,
                            key: path,
                        }))
                    }
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(backend("getData", &path, e)),
                }
            }
            Ok(None)
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // Our node's path carries the acquire's unique prefix: while it exists it is the one
            // we created (its czxid, the epoch, is checked too), owned by our session.
            let zk = self.client.zk();
            self.client.metrics().sent(1);
            let lost = || Error::LockLost { lock: self.dir.clone(), reason: LostReason::NodeDeleted };
            match zk.set_data(&holder_id, value.as_bytes(), None).await {
                Ok(stat) if stat.czxid as u64 == token => Ok(()),
                Ok(_) => Err(lost()),
                Err(zk::Error::NoNode) => Err(lost()),
                Err(e) => Err(backend("setData", &holder_id, e)),
            }
        })
    }
}

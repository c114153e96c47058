//! Elections on ZooKeeper, in the layouts of Curator's leader recipes (the URL's
//! `election=latch|selector`): `LeaderLatch` (the default), whose participants queue
//! `_c_<uuid>-latch-<seq>` nodes, or `LeaderSelector`, whose participants queue an
//! `InterProcessMutex`'s `_c_<uuid>-lock-<seq>` nodes. Either way a node's data is the
//! participant's id (our value), and the first node in sequence order leads. A candidate is the
//! [`Mutex`] queue with that marker and data, so the campaign, the watch on the predecessor only
//! and the loss signal are the mutex's; the epoch is the leader node's czxid.

use super::queue::{sort_children, sort_key, LATCH, LOCK};
use super::{backend, Client, ElectionLayout, LockSpec, Mutex};
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

impl Election {
    /// The participants' nodes among `children`, in sequence order (the first one still there
    /// leads).
    fn participants(&self, mut children: Vec<String>) -> Vec<String> {
        let marker = [self.marker()];
        children.retain(|c| {
            let key = sort_key(c, &marker);
            key.len() == 10 && key.bytes().all(|b| b.is_ascii_digit())
        });
        sort_children(&mut children, &marker);
        children
    }

    /// The marker of this election's nodes, by the URL's layout.
    fn marker(&self) -> &'static str {
        match self.client.url().election {
            ElectionLayout::Latch => LATCH,
            ElectionLayout::Selector => LOCK,
        }
    }
}

impl Ballot for Election {
    fn name(&self) -> &str {
        &self.dir
    }

    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe> {
        let data: Arc<[u8]> = Arc::from(value.as_bytes());
        Arc::new(LockSpec::Exclusive(Mutex::candidate(self.client.clone(), self.dir.clone(), self.marker(), data)))
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            // Curator's `getLeader()`: the participants in sequence order, the first one still
            // there leads. A node that goes between the listing and its read is skipped, as
            // Curator does.
            let zk = self.client.zk();
            self.client.metrics().sent(1);
            let children = match zk.list_children(&self.dir).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => match self.client.missing_chroot(&self.dir).await {
                    Some(e) => return Err(e),
                    None => return Ok(None),
                },
                Err(e) => return Err(backend("getChildren", &self.dir, e)),
            };
            for child in self.participants(children) {
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

    fn watch_leader(&self) -> BoxFuture<'_, Result<crate::contract::Watched>> {
        Box::pin(async move {
            // As `leader`, with a watch on the participants (and, once found, on the leader's
            // data, which a proclaim changes); a missing directory is watched for its creation.
            let zk = self.client.zk();
            let (children, participants) = loop {
                self.client.metrics().sent(1);
                match zk.list_and_watch_children(&self.dir).await {
                    Ok(listed) => break listed,
                    Err(zk::Error::NoNode) => {
                        if let Some(e) = self.client.missing_chroot(&self.dir).await {
                            return Err(e);
                        }
                        self.client.metrics().sent(1);
                        let (stat, created) =
                            zk.check_and_watch_stat(&self.dir).await.map_err(|e| backend("exists", &self.dir, e))?;
                        if stat.is_none() {
                            return Ok(Some((
                                None,
                                Box::pin(async move { drop(created.changed().await) }) as BoxFuture<'static, ()>,
                            )));
                        }
                        // Made since the listing: list it.
                    }
                    Err(e) => return Err(backend("getChildren", &self.dir, e)),
                }
            };
            for child in self.participants(children) {
                let path = format!("{}/{child}", self.dir);
                self.client.metrics().sent(1);
                match zk.get_and_watch_data(&path).await {
                    Ok((data, stat, value)) => {
                        let leader = Leader {
                            value: String::from_utf8_lossy(&data).into_owned(),
                            epoch: stat.czxid as u64,
                            key: path,
                        };
                        let changed: BoxFuture<'static, ()> = Box::pin(async move {
                            tokio::select! {
                                _ = participants.changed() => {}
                                _ = value.changed() => {}
                            }
                        });
                        return Ok(Some((Some(leader), changed)));
                    }
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(backend("getData", &path, e)),
                }
            }
            Ok(Some((None, Box::pin(async move { drop(participants.changed().await) }) as BoxFuture<'static, ()>)))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // Our node's path carries the acquire's unique prefix: while it exists it is the one
            // we created, owned by our session (the czxid, the epoch, is compared as a check of
            // that; it is read only with the write's answer).
            let zk = self.client.zk();
            let lost = || Error::LockLost { lock: self.dir.clone(), reason: LostReason::NodeDeleted };
            // The write is conditional on the node's data version read with its czxid (the
            // epoch), so nothing is written to a node that is not this leadership's.
            for _ in 0..3 {
                self.client.metrics().sent(2);
                let stat = match zk.check_stat(&holder_id).await {
                    Ok(Some(stat)) if stat.czxid as u64 == token => stat,
                    Ok(_) => return Err(lost()),
                    Err(e) => return Err(backend("exists", &holder_id, e)),
                };
                match zk.set_data(&holder_id, value.as_bytes(), Some(stat.version)).await {
                    Ok(_) => return Ok(()),
                    Err(zk::Error::NoNode) => return Err(lost()),
                    // Written meanwhile (a revoker): read it again.
                    Err(zk::Error::BadVersion) => continue,
                    Err(e) => return Err(backend("setData", &holder_id, e)),
                }
            }
            Err(backend("setData", &holder_id, zk::Error::BadVersion))
        })
    }
}

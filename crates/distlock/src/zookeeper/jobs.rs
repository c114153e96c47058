//! Scheduled jobs on ZooKeeper ([`crate::schedule`]), in ShedLock's
//! `ZookeeperCuratorLockProvider` layout so that Java services using ShedLock and distlock
//! exclude each other by job name: the lock row is the PERSISTENT node `/shedlock/<job>` whose
//! data is `lock_until` as an ISO-8601 instant (data that does not parse: taken forever, as
//! ShedLock reads it; the node keeps neither `locked_at` nor `locked_by`); distlock's record of
//! the last run is the PERSISTENT node `/distlock-jobs/<job>` holding the [`Run`] as JSON. Both
//! are inside the URL's chroot, as Curator's are. ZooKeeper has no clock to read: the server's
//! time is the `mtime` of an empty `setData` on `/shedlock`, sent ahead of the reads of both
//! nodes. A write is one `multi` that sets each node at the data version read (or creates it if
//! it was missing), so it applies only if neither changed.

use super::{backend, Client};
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Seen};
use crate::schedule::{parse_ms, stored_time, Run, FOREVER_MS};
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zookeeper_client as zk;

/// ShedLock's parent of the lock nodes; its `mtime` is the server's time.
const LOCKS: &str = "/shedlock";
/// distlock's parent of the records.
const RECORDS: &str = "/distlock-jobs";

/// The job store of a ZooKeeper client.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub(crate) client: Client,
    /// Both parents are known to exist (made sure of once per store, and again after a write
    /// finds one missing).
    pub(crate) parents: Arc<AtomicBool>,
}

/// The lock node's and the record node's paths of `job`, or why `job` cannot be a node name.
fn paths(job: &str) -> Result<(String, String)> {
    let bad = |reason: String| Error::InvalidArgument { what: "job name", reason: format!("{job:?}: {reason}") };
    if job.contains('/') {
        return Err(bad(
            "holds '/', which ZooKeeper reads as a path separator (ShedLock's node is /shedlock/<job>)".into()
        ));
    }
    if job == "." || job == ".." {
        return Err(bad("is not a ZooKeeper node name".into()));
    }
    let lock = format!("{LOCKS}/{job}");
    super::url::validate_path(&lock).map_err(|reason| bad(format!("not a ZooKeeper node name: {reason}")))?;
    Ok((lock, format!("{RECORDS}/{job}")))
}

/// A node's data version as [`Seen`] keeps it, read back.
fn version(job: &str, seen: &str) -> Result<i32> {
    seen.parse().map_err(|_| Error::Backend {
        op: "write job",
        path: job.to_string(),
        source: format!("{seen:?} is not a ZooKeeper data version").into(),
    })
}

impl Jobs {
    /// Creates `path` (PERSISTENT, empty, as Curator's parents) if it is missing.
    async fn parent(&self, path: &str) -> Result<()> {
        // The parents are every job's: open, whatever `acl=` says (only the job's own nodes
        // are the login's), or the first login to make one would keep the others' jobs out.
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        self.client.metrics().sent(1);
        match self.client.zk().create(path, b"", &options).await {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(zk::Error::NoNode) => Err(self
                .client
                .missing_chroot(path)
                .await
                .unwrap_or_else(|| backend("create", path, zk::Error::NoNode))),
            Err(e) => Err(backend("create", path, e)),
        }
    }

    /// Makes sure both parents exist (once per store, unless `again`).
    async fn parents(&self, again: bool) -> Result<()> {
        if again || !self.parents.load(Ordering::Acquire) {
            let (locks, records) = futures::join!(self.parent(LOCKS), self.parent(RECORDS));
            locks.and(records)?;
            self.parents.store(true, Ordering::Release);
        }
        Ok(())
    }
}

impl JobStore for Jobs {
    /// The session's connection failed, dropped or did not answer (the outcome unknown): the
    /// session, and with it the run's hold, may well live on.
    fn transient(&self, e: &Error) -> bool {
        let connection =
            |z: &zk::Error| matches!(z, zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_));
        e.is_unanswered()
            || matches!(e, Error::Backend { source, .. } if source.downcast_ref::<zk::Error>().is_some_and(connection))
    }

    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            let (lock_path, record_path) = paths(job)?;
            let zk = self.client.zk();
            let mut created = false;
            // The write and both reads leave together; the server answers a session's requests
            // in order, so the reads see the tree after the write (whose mtime is then never
            // later than any write that follows, nor earlier than this send).
            let (now, lock, record) = loop {
                self.client.metrics().sent(3);
                let (touched, lock, record) =
                    futures::join!(zk.set_data(LOCKS, b"", None), zk.get_data(&lock_path), zk.get_data(&record_path));
                match touched {
                    Ok(stat) => break (stat.mtime, lock, record),
                    Err(zk::Error::NoNode) if !created => {
                        self.parent(LOCKS).await?;
                        created = true;
                    }
                    Err(e) => return Err(backend("setData", LOCKS, e)),
                }
            };
            let lock = match lock {
                Ok((data, stat)) => {
                    // ShedLock's reading: a date that does not parse is taken forever.
                    let until = std::str::from_utf8(&data).ok().and_then(parse_ms).unwrap_or(FOREVER_MS);
                    let row = JobLock { lock_until_ms: until, locked_at_ms: 0, locked_by: String::new() };
                    Some((row, stat.version.to_string()))
                }
                Err(zk::Error::NoNode) => None,
                Err(e) => return Err(backend("getData", &lock_path, e)),
            };
            let record = match record {
                Ok((data, stat)) => Some((Run::from_stored(job, &record_path, &data)?, stat.version.to_string())),
                Err(zk::Error::NoNode) => None,
                Err(e) => return Err(backend("getData", &record_path, e)),
            };
            let (lock, lock_seen) = lock.unzip();
            let (run, run_seen) = record.unzip();
            Ok(JobRead { now_ms: now, now_error_ms: 0, lock, run, seen: Seen { lock: lock_seen, run: run_seen } })
        })
    }

    fn write<'a>(
        &'a self,
        job: &'a str,
        seen: &'a Seen,
        lock: Option<&'a JobLock>,
        run: &'a Run,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let (lock_path, record_path) = paths(job)?;
            self.parents(false).await?;
            let record = run.stored();
            let options = zk::CreateMode::Persistent.with_acls(self.client.acls());
            let mut txn = self.client.zk().new_multi_writer();
            let mut ops: Vec<(&str, &[u8], Option<&String>)> = Vec::with_capacity(2);
            let lock_data = lock.map(|l| stored_time(job, l.lock_until_ms)).transpose()?;
            if let Some(data) = &lock_data {
                ops.push((&lock_path, data.as_bytes(), seen.lock.as_ref()));
            }
            ops.push((&record_path, record.as_bytes(), seen.run.as_ref()));
            for (path, data, was) in &ops {
                let added = match was {
                    Some(v) => txn.add_set_data(path, data, Some(version(job, v)?)),
                    None => txn.add_create(path, data, &options),
                };
                added.map_err(|e| backend("multi", path, e))?;
            }
            self.client.metrics().sent(1);
            match txn.commit().await {
                Ok(_) => Ok(true),
                // Changed since the read (a version moved, a node came or went): nothing written.
                Err(zk::MultiWriteError::OperationFailed {
                    source: zk::Error::BadVersion | zk::Error::NodeExists,
                    ..
                }) => Ok(false),
                Err(zk::MultiWriteError::OperationFailed { index, source: zk::Error::NoNode }) => {
                    // A node deleted since the read, or a parent deleted since we made sure of
                    // it: make sure again, and read again.
                    if ops.get(index).is_some_and(|(_, _, was)| was.is_none()) {
                        self.parents(true).await?;
                    }
                    Ok(false)
                }
                Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                    Err(backend("multi", ops.get(index).map_or(record_path.as_str(), |op| op.0), source))
                }
                Err(zk::MultiWriteError::RequestFailed { source }) => Err(backend("multi", &record_path, source)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_node_names() {
        assert_eq!(paths("nightly").unwrap(), ("/shedlock/nightly".into(), "/distlock-jobs/nightly".into()));
        for bad in ["a/b", ".", "..", "a\u{e000}"] {
            let e = paths(bad).unwrap_err();
            assert!(matches!(&e, Error::InvalidArgument { what: "job name", .. }), "{bad:?}: {e}");
        }
        assert!(stored_time("j", FOREVER_MS).is_err());
    }
}

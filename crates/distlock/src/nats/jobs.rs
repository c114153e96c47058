//! Scheduled jobs on NATS: one key per job, `jobs.<name>`, holding the job's lock row and its
//! last run's record together (JSON), written only by a publish guarded by the sequence read, so
//! both change at once or not at all. The server's time is the `ts` of a stream info answer.

use super::{key, live, Client, Wrote};
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Run, Seen};
use crate::{Error, Result};

/// The jobs' store on a NATS bucket.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub(crate) client: Client,
}

/// What a job's key holds.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Stored {
    lock: Option<JobLock>,
    run: Option<Run>,
}

impl JobStore for Jobs {
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            // The time first: never later than the server's time at a following write.
            let now_ms = self.client.server_time_ms().await?;
            let key = key("jobs", job);
            let entry = self.client.read(&key).await?;
            let (stored, rev) = match entry {
                Some(e) if live(&e) => {
                    let stored: Stored = serde_json::from_slice(&e.value).map_err(|err| Error::Backend {
                        op: "read job",
                        path: job.to_string(),
                        source: format!("key {key} holds a value that is not distlock's: {err}").into(),
                    })?;
                    (stored, e.revision)
                }
                Some(e) => (Stored::default(), e.revision),
                None => (Stored::default(), 0),
            };
            let lock_seen = stored.lock.as_ref().map(|l| serde_json::to_string(l).expect("a lock row serializes"));
            Ok(JobRead {
                now_ms,
                now_error_ms: 0,
                lock: stored.lock,
                run: stored.run,
                seen: Seen { lock: lock_seen, run: Some(rev.to_string()) },
            })
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
            let bad = |why: String| Error::Backend { op: "write job", path: job.to_string(), source: why.into() };
            let rev: u64 =
                seen.run.as_deref().unwrap_or("0").parse().map_err(|e| bad(format!("seen revision: {e}")))?;
            let lock_read: Option<JobLock> = match &seen.lock {
                Some(l) => Some(serde_json::from_str(l).map_err(|e| bad(format!("seen lock row: {e}")))?),
                None => None,
            };
            let lock = lock.cloned().or(lock_read);
            let value = serde_json::to_vec(&Stored { lock, run: Some(run.clone()) }).expect("a job's value serializes");
            // Guarded by the sequence read: applied once at most, refused if anyone wrote since.
            match self.client.publish(&key("jobs", job), rev, Some(value), false).await? {
                Wrote::At(_) => Ok(true),
                Wrote::Moved => Ok(false),
            }
        })
    }
}

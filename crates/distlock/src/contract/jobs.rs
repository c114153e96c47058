//! The scheduled jobs' side of the contract: what a backend implements ([`Jobs`]: read a job
//! with the server's time, write it back only if unchanged) and the rows and record it keeps.
//! Every decision about a job is made once, in the `schedule` module.

use super::BoxFuture;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;

/// The record of a job's run, as the server keeps it. Times are the server's, in milliseconds
/// since the Unix epoch.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// if let Some(run) = client.schedule("nightly-report")?.last_run().await? {
///     println!("{}", serde_json::to_string(&run).unwrap());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Run {
    /// The job's name.
    pub job: String,
    /// The run's fencing token: the last run's plus one, and at least the start's server time
    /// in milliseconds × 1000 (so that it rises past a record its server lost).
    pub token: u64,
    /// The slot it ran in (`started_ms / period_ms`), for a job run once per period.
    pub slot: Option<u64>,
    /// The period, for a job run once per period.
    pub period_ms: Option<u64>,
    /// The holder's host name.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When the holder's process started, in clock ticks after its host's boot (`/proc/PID/stat`'s
    /// 22nd field, as `ps` reads it): with the host and pid it names the process, so that a pid
    /// reused later is not mistaken for it.
    pub pid_start: Option<u64>,
    /// The holder's mark in the lock row (`locked_by`).
    pub locked_by: String,
    /// When it started.
    pub started_ms: i64,
    /// Until when the job was taken at the start.
    pub lock_until_ms: i64,
    /// ShedLock's `lockAtLeastFor`, in milliseconds.
    pub at_least_ms: u64,
    /// When it ended (`None` while it runs, or if its holder died).
    pub ended_ms: Option<i64>,
    /// Its exit status, where the holder reported one.
    pub exit: Option<i32>,
}

// etcd keeps the record inside its own JSON value.
impl Run {
    /// The record as a backend stores it (JSON).
    pub(crate) fn stored(&self) -> String {
        serde_json::to_string(self).expect("a record serializes")
    }

    /// A record as a backend stored it, or the error naming where (`place`) it is kept.
    pub(crate) fn from_stored(job: &str, place: &str, stored: &[u8]) -> Result<Run> {
        serde_json::from_slice(stored).map_err(|e| Error::Backend {
            op: "read job",
            path: job.to_string(),
            source: format!("{place} holds a record that is not distlock's: {e}").into(),
        })
    }
}

/// A job's lock row, in ShedLock's terms. Times are the server's, in milliseconds since the Unix
/// epoch. The job is free when `lock_until_ms <= now`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct JobLock {
    /// Until when the job is taken.
    pub lock_until_ms: i64,
    /// When it was taken (where the layout keeps it; else the record's start).
    pub locked_at_ms: i64,
    /// Who took it (where the layout keeps it; else the record's).
    pub locked_by: String,
}

/// One read of a job's lock row and run record, with the server's time.
#[derive(Debug, Clone)]
pub(crate) struct JobRead {
    /// The server's time during the read, in milliseconds since the Unix epoch. It is never
    /// later than the server's time when a following [`Jobs::write`] is applied, and never
    /// more than `now_error_ms` earlier than the moment the read was sent.
    pub now_ms: i64,
    /// How much earlier than the read's send `now_ms` may be (0 where the server reports its
    /// time to the millisecond during the request; etcd's is whole seconds).
    pub now_error_ms: i64,
    /// The lock row, if there is one.
    pub lock: Option<JobLock>,
    /// The last run's record, if there is one.
    pub run: Option<Run>,
    /// The backend's versions of both, for [`Jobs::write`]'s compare.
    pub seen: Seen,
}

/// A backend's versions of a job's lock row and record as read (`None`: not there): whatever
/// the backend compares to know that neither changed since (a node version, a mod revision, the
/// row's values as text, the key's value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The lock row's version.
    pub lock: Option<String>,
    /// The record's version.
    pub run: Option<String>,
}

/// A backend's side of scheduled jobs (the `schedule` module): read a job with the server's time,
/// and write it back only if nothing changed since. Every decision (free or not, the slot,
/// the bounds, the token, the record) is made once, in `schedule.rs`.
pub(crate) trait Jobs: Debug + Send + Sync + 'static {
    /// Reads job `job`'s lock row and record, and the server's time.
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>>;
    /// Writes the lock row (unless `lock` is `None`: left as it is) and the record, both at
    /// once, only if neither changed since the read that gave `seen`: `Ok(false)` if one did
    /// (nothing was written).
    fn write<'a>(
        &'a self,
        job: &'a str,
        seen: &'a Seen,
        lock: Option<&'a JobLock>,
        run: &'a Run,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Whether `e`, from [`read`](Self::read) or [`write`](Self::write), may pass if tried
    /// again: its outcome is unknown (a connection failed or dropped, no answer in time). A
    /// run's end is tried again after one, until the run's bound. The contract's own mark
    /// ([`Error::is_unanswered`](crate::Error)) unless a backend knows more of its driver's.
    fn transient(&self, e: &Error) -> bool {
        e.is_unanswered()
    }
}

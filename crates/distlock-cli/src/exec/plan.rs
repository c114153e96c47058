//! The flags of `exec`, `hold` and `elect`, declared once, and the plan they are turned into
//! before anything connects: what to take (locks of one kind, an election's lead, or a
//! scheduled job's run), how long to wait, and what to report.

use crate::{BackendArg, EXIT_NOT_ACQUIRED};
use std::time::Duration;

/// How to acquire and what to say and record about it: shared by `exec`, `hold` and `elect`.
#[derive(clap::Args, Debug, Clone)]
pub struct AcquireArgs {
    /// Wait at most this long for the lock (`elect`: to be elected): seconds as flock(1) takes
    /// them (5, 0.5) or with a unit (500ms, 2m); 0 never waits. Without -w or -n, waits as long
    /// as it takes.
    #[arg(allow_hyphen_values = true, short = 'w', long = "wait", visible_alias = "timeout", value_name = "SECONDS", value_parser = wait_arg, conflicts_with = "nonblock")]
    wait: Option<Duration>,
    /// Do not wait: fail at once if the lock is held (`elect`: if another candidate leads or
    /// waits).
    #[arg(short = 'n', long = "nonblock", visible_alias = "no-wait")]
    nonblock: bool,
    /// Exit status when the lock is not acquired (`elect`: when not elected).
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N", default_value_t = EXIT_NOT_ACQUIRED)]
    pub conflict_exit_code: u8,
    /// Say nothing when the lock is not acquired, or a job's slot has had its run (cron mails
    /// whatever a job prints: with -E 0 a busy run is then silent). Errors are still reported.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// At exit, write the run's figures (wait and hold seconds, outcome, exit status, lost
    /// reason, fencing tokens, time) to PATH in the Prometheus text format, replacing it
    /// atomically, for node_exporter's textfile collector.
    #[arg(long = "metrics-textfile", value_name = "PATH")]
    metrics_textfile: Option<std::path::PathBuf>,
}

/// Which locks to take: the flags of `exec` and `hold`.
#[derive(clap::Args, Debug)]
pub struct LockArgs {
    #[command(flatten)]
    backend: BackendArg,
    #[command(flatten)]
    acquire: AcquireArgs,
    /// Shared: a read lock, held together with other -s holders (Curator's
    /// InterProcessReadWriteLock layout, `__READ__` nodes).
    #[arg(short = 's', long = "shared", conflicts_with_all = ["exclusive", "permits"])]
    shared: bool,
    /// Exclusive, as the write side of a read/write lock (`__WRIT__` nodes; Curator's
    /// InterProcessReadWriteLock writers share the queue). Without -s, -x or --permits the lock
    /// is a plain mutex (Curator's InterProcessMutex layout); distlock queues both in one FIFO
    /// with -s holders, so either is exclusive against everyone on the path. (Curator orders
    /// such a mixed queue wrongly: where Curator clients share a path, keep to one layout.)
    #[arg(short = 'x', long = "exclusive", visible_alias = "write", conflicts_with = "permits")]
    exclusive: bool,
    /// Take one permit of a semaphore with N permits (Curator's InterProcessSemaphoreV2 layout).
    /// Every user of the path must give the same N; a different N is refused.
    #[arg(long = "permits", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// Redis: the plain `SET key value NX PX` lock, shared with redis-py's `Lock`, instead of
    /// Redisson's reentrant lock layout (the default, shared with Redisson's `getLock`).
    #[arg(long = "simple", conflicts_with_all = ["shared", "exclusive", "permits"])]
    simple: bool,
    /// The locks: on ZooKeeper znode paths (/locks/orders) or bare names (orders =
    /// /distlock/orders); on Redis keys, as given. Several locks are taken all or nothing, in a
    /// fixed global order.
    #[arg(value_name = "LOCK", required = true, num_args = 1..)]
    locks: Vec<String>,
    /// Run at most once per DURATION across every machine using this job name (LOCK), by the
    /// server's clock: the slot is the server's time divided by DURATION (aligned on the Unix
    /// epoch), and a start in a slot that has had its run exits at once with the -E status,
    /// naming who ran it and when. The name is ShedLock's job name.
    #[arg(allow_hyphen_values = true, long = "once-per", value_name = "DURATION", value_parser = crate::duration_arg, conflicts_with_all = ["shared", "exclusive", "permits", "simple"])]
    once_per: Option<Duration>,
    /// ShedLock's lockAtMostFor: the job is taken for at most DURATION; the command is stopped
    /// before it (TERM, then KILL before the bound) and distlock exits 3. Default: the
    /// --once-per period.
    #[arg(allow_hyphen_values = true, long = "at-most-for", value_name = "DURATION", value_parser = crate::duration_arg, conflicts_with_all = ["shared", "exclusive", "permits", "simple"])]
    at_most_for: Option<Duration>,
    /// ShedLock's lockAtLeastFor: the job stays taken at least DURATION after its start, even
    /// when the command ends sooner (a short job on a late cron does not run twice).
    #[arg(allow_hyphen_values = true, long = "at-least-for", value_name = "DURATION", value_parser = crate::duration_arg, conflicts_with_all = ["shared", "exclusive", "permits", "simple"])]
    at_least_for: Option<Duration>,
}

/// `-w`: a duration (a bare number is seconds, as flock(1) takes it; or with a unit); 0 never
/// waits.
pub fn wait_arg(s: &str) -> Result<Duration, String> {
    if s.trim().starts_with('-') {
        return Err(format!("{s:?}: a wait cannot be negative (0 never waits)"));
    }
    crate::duration_arg(s)
}

/// The kind of lock each name of a [`Target::Locks`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Mutex,
    Read,
    Write,
    Permits(u32),
    /// Redis's plain `SET NX PX` layout.
    Simple,
}

/// What a run takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Locks of one kind, all or nothing.
    Locks { names: Vec<String>, kind: Kind },
    /// The lead of election `name`, announcing `value` (`distlock elect`).
    Election { name: String, value: String },
    /// A run of scheduled job `name` (ShedLock's `lockAtMostFor`/`lockAtLeastFor`).
    Job { name: String, once_per: Option<Duration>, at_most_for: Option<Duration>, at_least_for: Option<Duration> },
}

impl Target {
    /// The names as the user gave them, in their order.
    pub fn names(&self) -> Vec<String> {
        match self {
            Target::Locks { names, .. } => names.clone(),
            Target::Election { name, .. } | Target::Job { name, .. } => vec![name.clone()],
        }
    }
}

/// A validated run: where, what, and how to wait and report.
#[derive(Debug)]
pub struct Plan {
    pub backend: BackendArg,
    pub target: Target,
    pub acquire: AcquireArgs,
}

impl LockArgs {
    /// The plan these flags describe, or what is wrong with them.
    pub fn plan(self) -> anyhow::Result<Plan> {
        let job = self.once_per.is_some() || self.at_most_for.is_some() || self.at_least_for.is_some();
        let target = if job {
            let [name] = <[String; 1]>::try_from(self.locks).map_err(|locks| {
                anyhow::anyhow!(
                    "a scheduled job (--once-per, --at-most-for, --at-least-for) takes one name, not {}",
                    locks.len()
                )
            })?;
            Target::Job {
                name,
                once_per: self.once_per,
                at_most_for: self.at_most_for,
                at_least_for: self.at_least_for,
            }
        } else {
            let kind = match (self.permits, self.shared, self.exclusive, self.simple) {
                (Some(n), ..) => Kind::Permits(n),
                (None, true, ..) => Kind::Read,
                (None, false, true, _) => Kind::Write,
                (None, false, false, true) => Kind::Simple,
                (None, false, false, false) => Kind::Mutex,
            };
            Target::Locks { names: self.locks, kind }
        };
        Ok(Plan { backend: self.backend, target, acquire: self.acquire })
    }
}

impl Plan {
    /// A campaign in election `name` announcing `value`.
    pub fn election(backend: BackendArg, name: String, value: String, acquire: AcquireArgs) -> Plan {
        Plan { backend, target: Target::Election { name, value }, acquire }
    }

    /// True for a scheduled job's run.
    pub fn is_job(&self) -> bool {
        matches!(self.target, Target::Job { .. })
    }

    /// How long to wait: `-n` never waits, nor does a scheduled job without `-w` (a start finds
    /// its slot free or exits; `-w` waits for a run going on elsewhere to end).
    pub fn timeout(&self) -> Option<Duration> {
        if self.acquire.nonblock || (self.is_job() && self.acquire.wait.is_none()) {
            Some(Duration::ZERO)
        } else {
            self.acquire.wait
        }
    }

    /// Starts the run's record for `--metrics-textfile` (nothing without it).
    pub fn start_record(&self, command: &'static str) -> anyhow::Result<()> {
        crate::textfile::start(self.acquire.metrics_textfile.clone(), command, &self.target.names())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_takes_seconds_like_flock() {
        assert_eq!(wait_arg("5"), Ok(Duration::from_secs(5)));
        assert_eq!(wait_arg("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(wait_arg("0"), Ok(Duration::ZERO));
        assert_eq!(wait_arg("250ms"), Ok(Duration::from_millis(250)));
        assert!(wait_arg("1.2.3").unwrap_err().contains("1.2.3"));
        assert!(wait_arg("soon").is_err());
    }
}

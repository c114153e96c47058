//! Scheduled jobs across machines, written once over the contract: "run at most once per slot",
//! ShedLock's two bounds, and a record of the last run, all by the **server's** clock.
//!
//! A job is ShedLock's lock row (`lock_until`, `locked_at`, `locked_by`) plus distlock's record
//! of its last run ([`Run`]). A start reads both with the server's time and takes the job only
//! when `lock_until <= now` (and, with [`Schedule::once_per`], no run is recorded in now's slot),
//! writing both back only if nobody changed them since: so of all the machines that fire in a
//! slot, one runs, whatever their clocks say.
//!
//! - [`Schedule::once_per`]: the slot is `floor(server time / period)`. A start takes the job
//!   until the slot's end at least, so a machine whose cron fires late, or whose clock is wrong,
//!   finds it taken. Slots are aligned on the Unix epoch (an hourly job's slots start on the hour).
//! - [`Schedule::at_most_for`] (ShedLock's `lockAtMostFor`): the job is taken for at most this
//!   long. Unlike ShedLock, distlock makes the bound hold on the holder's side too:
//!   [`JobGuard::stop_by`] is the instant by which the work must have stopped (measured on the
//!   holder's monotonic clock from before the start was sent, less a margin for clock rates), and
//!   `distlock exec` stops the command there (TERM, then KILL before the bound). Defaults to the
//!   period.
//! - [`Schedule::at_least_for`] (ShedLock's `lockAtLeastFor`): when the run ends earlier, the job
//!   stays taken until this long after its start, so a short job on a late cron does not run
//!   twice.
//! - The record of the last run ([`Run`]): who ran it (host, pid and the process's start, so a
//!   reused pid is not mistaken), when it started and ended by the server's clock, its exit
//!   status, its slot and its fencing token (above the last run's, and at least the start's
//!   server time in ms × 1000).
//!
//! A start whose reply is lost, or that is dropped while its write is on its way, may have
//! taken the job on the server: the job is then taken until its bound without a run (at most
//! once, never twice). A client that sends a write again after a lost answer (etcd's) hears
//! "changed" from its own write: the next read finds its own run in the record, and it runs. A
//! start confirmed with less than three quarters of its bound left is given back and reported
//! as an error.
//!
//! Layouts (ShedLock's where it has a provider, so that Java services using ShedLock and cron
//! jobs using distlock exclude each other):
//! - **PostgreSQL, MariaDB, SQLite**: ShedLock's table `shedlock (name, lock_until, locked_at,
//!   locked_by)` (UTC times), and the records in `distlock_job_runs (name, token, record)`;
//! - **Redis**: ShedLock's key `job-lock:default:<name>` (value `ADDED:<locked_at>@<locked_by>`,
//!   expiring at `lock_until`), and the record in `{job-lock:default:<name>}:run`;
//! - **ZooKeeper**: ShedLock's node `/shedlock/<name>` (data: `lock_until` as an ISO-8601
//!   instant), and the record in `/distlock-jobs/<name>`; the server's time is the `mtime` of a
//!   write to `/shedlock`;
//! - **etcd** (ShedLock has no provider): one key `distlock/jobs/<name>` holding both as JSON;
//!   etcd reports no time, so the server's time is the `Date` of its HTTP answer (whole seconds,
//!   which the bounds allow for).
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! use distlock::schedule::Started;
//! use std::time::Duration;
//!
//! let client = distlock::connect("postgres://app@db/app").await?;
//! let nightly = client.schedule("nightly-report")?.once_per(Duration::from_secs(86_400));
//! match nightly.try_start().await? {
//!     Started::Running(job) => {
//!         // ... the work, done before job.stop_by() ...
//!         job.finish(Some(0)).await?;
//!     }
//!     Started::Skipped(skipped) => println!("{skipped}"),
//! }
//! # Ok(()) }
//! ```

use crate::contract::{BoxFuture, Held, JobLock, JobRead, Jobs, Recipe, Wait};
use crate::{Error, LockState, LostReason, QueueStatus, Result};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// The shortest at-most bound: a start's round trip and a command's start must fit well within.
const MIN_AT_MOST: Duration = Duration::from_millis(100);

/// The longest period or bound (a year): longer is not a schedule, and would pass the end of
/// some servers' time columns (MariaDB's `TIMESTAMP` ends in 2038).
const MAX_BOUND: Duration = Duration::from_secs(366 * 86_400);

/// How many times a start or a finish reads again after another writer changed the job between
/// its read and its write.
const ATTEMPTS: u32 = 50;
/// How long a run's end is tried again after failures of unknown outcome, at least.
const END_RETRIES_FOR: Duration = Duration::from_secs(5);
/// The pause between two such tries.
const END_PAUSE: Duration = Duration::from_millis(100);

pub use crate::contract::Run;

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ran by {} (pid {}) at {}", self.job, self.host, self.pid, show_ms(self.started_ms))?;
        match (self.ended_ms, self.exit) {
            (Some(end), Some(exit)) => write!(f, ", ended {} with status {exit}", show_ms(end))?,
            (Some(end), None) => write!(f, ", ended {}", show_ms(end))?,
            (None, _) => write!(f, ", not recorded as ended")?,
        }
        write!(f, " (token {}", self.token)?;
        if let Some(slot) = self.slot {
            write!(f, ", slot {slot}")?;
        }
        write!(f, ")")
    }
}

/// The last millisecond RFC 3339 can show: 9999-12-31T23:59:59.999Z.
const LAST_MS: i64 = 253_402_300_799_999;

/// A lock row whose `lock_until` is unknown (no expiry on Redis; data that does not parse, which
/// ShedLock reads as taken) is taken until this, "forever".
pub(crate) const FOREVER_MS: i64 = i64::MAX / 4;

/// A time in milliseconds since the Unix epoch, as RFC 3339 (UTC, milliseconds).
pub fn show_ms(ms: i64) -> String {
    // RFC 3339 ends with the year 9999 (a key without expiry reads as "until far later").
    let ms = ms.clamp(0, LAST_MS);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms as u64)).to_string()
}

/// `ms` as the RFC 3339 instant a layout stores (ShedLock's), or an error past the year 9999,
/// which it cannot show (where [`show_ms`] would write another time).
pub(crate) fn stored_time(job: &str, ms: i64) -> Result<String> {
    if ms > LAST_MS {
        return Err(Error::InvalidArgument {
            what: "job time",
            reason: format!("job {job}: {ms} ms since the epoch is past the year 9999 (give a shorter bound)"),
        });
    }
    Ok(show_ms(ms))
}

/// Why a start did not run the job.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// A run is going on (or its holder died and its hold has not run out).
    Running,
    /// The job already ran in this slot.
    RanInSlot,
    /// The job is taken until `lock_until` (ShedLock's `lockAtLeastFor`, or a peer's hold).
    Taken,
}

/// A start that did not run the job: why, the last run, and until when the job is taken.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// if let distlock::schedule::Started::Skipped(s) = client.schedule("sync")?.try_start().await? {
///     eprintln!("{s}");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Skipped {
    /// The job's name.
    pub job: String,
    /// Why.
    pub reason: SkipReason,
    /// The last run, if one is recorded.
    pub last: Option<Run>,
    /// Who holds the lock row (`locked_by`).
    pub locked_by: String,
    /// Until when the job is taken (server time, ms since the Unix epoch).
    pub lock_until_ms: i64,
    /// The server's time when this was read.
    pub now_ms: i64,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The record is the lock row's run when the row names it (or names nobody: ZooKeeper).
        let last = self.last.as_ref().filter(|r| self.locked_by.is_empty() || r.locked_by == self.locked_by);
        match (&self.reason, last) {
            (SkipReason::Running, Some(run)) => write!(
                f,
                "{}: running, started by {} (pid {}) at {} (token {})",
                self.job,
                run.host,
                run.pid,
                show_ms(run.started_ms),
                run.token
            ),
            (SkipReason::RanInSlot, Some(run)) => write!(f, "{}: already run in this slot: {run}", self.job),
            (reason, _) => {
                let by = if self.locked_by.is_empty() { String::new() } else { format!(" by {}", self.locked_by) };
                let until = show_ms(self.lock_until_ms);
                match (reason, last) {
                    // The job stays taken past its last run's end (lockAtLeastFor, or the slot).
                    (SkipReason::Taken, Some(run)) if run.ended_ms.is_some() => {
                        write!(f, "{}: taken until {until}, after its last run: {run}", self.job)
                    }
                    _ => write!(f, "{}: taken{by} until {until}", self.job),
                }
            }
        }
    }
}

/// What [`Schedule::try_start`] found.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// use distlock::schedule::Started;
/// match client.schedule("sync")?.at_most_for(std::time::Duration::from_secs(60)).try_start().await? {
///     Started::Running(job) => drop(job.finish(Some(0)).await?),
///     Started::Skipped(s) => eprintln!("{s}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum Started {
    /// The job is ours: do the work, then [`JobGuard::finish`].
    Running(JobGuard),
    /// Not this time.
    Skipped(Skipped),
}

/// The holder as the record names it.
#[derive(Debug, Clone)]
struct Holder {
    host: String,
    pid: u32,
    pid_start: Option<u64>,
}

impl Holder {
    fn this_process() -> Holder {
        let host = hostname::get().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "unknown".into());
        Holder { host, pid: std::process::id(), pid_start: process_start() }
    }
}

/// This process's start, in clock ticks after boot (`/proc/self/stat`'s 22nd field).
fn process_start() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// A job that runs at most once per slot, or under ShedLock's bounds, across every machine that
/// uses its name on the same server. Made by [`crate::Client::schedule`]; cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// use std::time::Duration;
/// let job = client
///     .schedule("invoices")?
///     .once_per(Duration::from_secs(300))
///     .at_most_for(Duration::from_secs(240));
/// if let distlock::schedule::Started::Running(run) = job.try_start().await? {
///     run.finish(Some(0)).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    jobs: Arc<dyn Jobs>,
    name: String,
    backend: &'static str,
    period: Option<Duration>,
    at_most: Option<Duration>,
    at_least: Duration,
}

impl Schedule {
    pub(crate) fn new(jobs: Arc<dyn Jobs>, name: String, backend: &'static str) -> Schedule {
        Schedule { jobs, name, backend, period: None, at_most: None, at_least: Duration::ZERO }
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs at most once per `period` (slots aligned on the Unix epoch, by the server's clock).
    pub fn once_per(mut self, period: Duration) -> Schedule {
        self.period = Some(period);
        self
    }

    /// ShedLock's `lockAtMostFor`: the job is taken for at most this long (default: the period).
    pub fn at_most_for(mut self, bound: Duration) -> Schedule {
        self.at_most = Some(bound);
        self
    }

    /// ShedLock's `lockAtLeastFor`: the job stays taken at least this long after its start.
    pub fn at_least_for(mut self, bound: Duration) -> Schedule {
        self.at_least = bound;
        self
    }

    /// The bounds in milliseconds, checked: (period, at most, at least).
    fn bounds(&self) -> Result<(Option<i64>, i64, i64)> {
        let bad = |what, reason: String| Err(Error::InvalidArgument { what, reason });
        let ms = |d: Duration| d.as_millis().min(i64::MAX as u128 / 4) as i64;
        let period = match self.period {
            Some(p) if p < Duration::from_millis(1) => {
                return bad("once-per period", format!("{} is under 1 ms", humantime::format_duration(p)))
            }
            Some(p) => Some(ms(p)),
            None => None,
        };
        let at_most = match (self.at_most, period) {
            (Some(d), _) if d < MIN_AT_MOST => {
                return bad(
                    "at-most-for",
                    format!("{} is under 100 ms: too short for a round trip and a start", humantime::format_duration(d)),
                )
            }
            (Some(d), _) if d > MAX_BOUND => {
                return bad("at-most-for", format!("{} is over a year", humantime::format_duration(d)))
            }
            (Some(d), _) => ms(d),
            (None, Some(p)) if p < MIN_AT_MOST.as_millis() as i64 => {
                return bad(
                    "once-per period",
                    format!(
                        "{} is under 100 ms, the shortest hold (give at-most-for)",
                        humantime::format_duration(Duration::from_millis(p as u64))
                    ),
                )
            }
            (None, Some(p)) => p,
            (None, None) => {
                return bad(
                    "schedule",
                    format!(
                        "job {}: give it a period (once_per; the CLI's --once-per) or a bound (at_most_for; \
                         --at-most-for)",
                        self.name
                    ),
                )
            }
        };
        if self.period.is_some_and(|p| p > MAX_BOUND) {
            return bad("once-per period", "over a year".into());
        }
        let at_least = ms(self.at_least);
        if at_least > at_most {
            return bad(
                "at-least-for",
                format!("{:?} is longer than at-most-for {:?}", self.at_least, Duration::from_millis(at_most as u64)),
            );
        }
        Ok((period, at_most, at_least))
    }

    /// Takes the job if it is free by the server's clock (and not yet run in this slot); never
    /// waits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for bounds that make no sense (neither a period nor an
    /// at-most bound, at-least longer than at-most), and the backend's errors. A start whose
    /// reply was lost may have taken the job on the server: the slot is then used without a run
    /// (at most once, never twice).
    pub async fn try_start(&self) -> Result<Started> {
        let (period, at_most, at_least) = self.bounds()?;
        let holder = Holder::this_process();
        // The last write answered "changed", and when it was sent: a client that sent it again
        // after a lost answer (etcd's) hears "changed" from its own write.
        let mut attempt: Option<(Run, tokio::time::Instant)> = None;
        for _ in 0..ATTEMPTS {
            // The hold is counted from before the read was sent: the server's `now` is later.
            let sent = tokio::time::Instant::now();
            let read = self.jobs.read(&self.name).await?;
            if let Some((ours, ours_sent)) = attempt.take() {
                if read.run.as_ref().is_some_and(|r| r.token == ours.token && r.locked_by == ours.locked_by) {
                    return self.confirmed(ours, ours_sent, at_most).await;
                }
            }
            if let Some(skipped) = skipped(&self.name, &read, period) {
                return Ok(Started::Skipped(skipped));
            }
            let now = read.now_ms;
            let slot = period.map(|p| now.div_euclid(p));
            // Taken for at_most from the send (allowing for a server time that reads early),
            // and to the slot's end at least.
            let mut lock_until = now + read.now_error_ms + at_most;
            if let (Some(p), Some(s)) = (period, slot) {
                lock_until = lock_until.max((s + 1) * p);
            }
            let locked_by = format!("{}:{}:{}", holder.host, holder.pid, &uuid::Uuid::new_v4().simple().to_string()[..8]);
            let run = Run {
                job: self.name.clone(),
                // Rises from run to run, and past a record lost with its server's data (Redis
                // without persistence) as long as the server's clock does.
                token: (read.run.as_ref().map_or(0, |r| r.token) + 1).max(now.max(0) as u64 * 1000),
                slot: slot.map(|s| s as u64),
                period_ms: period.map(|p| p as u64),
                host: holder.host.clone(),
                pid: holder.pid,
                pid_start: holder.pid_start,
                locked_by: locked_by.clone(),
                started_ms: now,
                lock_until_ms: lock_until,
                at_least_ms: at_least as u64,
                ended_ms: None,
                exit: None,
            };
            let lock = JobLock { lock_until_ms: lock_until, locked_at_ms: now, locked_by };
            if self.jobs.write(&self.name, &read.seen, Some(&lock), &run).await? {
                return self.confirmed(run, sent, at_most).await;
            }
            tracing::debug!(job = %self.name, "the job changed between read and write; reading again");
            attempt = Some((run, sent));
        }
        Err(Error::Backend {
            op: "start",
            path: self.name.clone(),
            source: format!("the job kept changing under us ({ATTEMPTS} attempts)").into(),
        })
    }

    /// A start the server applied: running until `stop_by` (its bound from `sent`, the send of
    /// the read it was decided on), unless it was confirmed with less than three quarters of its
    /// bound left (a reply held up in the network): then it is given back, as the work would not
    /// have its time and the job may be another's soon after.
    async fn confirmed(&self, run: Run, sent: tokio::time::Instant, at_most: i64) -> Result<Started> {
        let bound = Duration::from_millis(at_most as u64);
        let stop_by = sent + bound - crate::lease_margin::margin(bound, Duration::ZERO);
        if tokio::time::Instant::now() + bound / 4 >= stop_by {
            if let Err(e) = self.finish_run(run.token, None).await {
                tracing::warn!(job = %self.name, error = %e, "giving back a late start failed");
            }
            return Err(Error::Backend {
                op: "start",
                path: self.name.clone(),
                source: format!(
                    "the start (token {}{}) was confirmed {} after it was sent, too late for its bound of {}; \
                     given back, not run",
                    run.token,
                    run.slot.map(|s| format!(", slot {s}")).unwrap_or_default(),
                    humantime::format_duration(Duration::from_millis(sent.elapsed().as_millis() as u64)),
                    humantime::format_duration(bound)
                )
                .into(),
            });
        }
        tracing::debug!(job = %self.name, token = run.token, slot = ?run.slot, "job started");
        Ok(Started::Running(JobGuard { schedule: self.clone(), run, stop_by, finished: false }))
    }

    /// Why a start now would be skipped, without starting: `None` if it would run (as far as
    /// this read can tell; only [`Schedule::try_start`] decides).
    pub async fn check(&self) -> Result<Option<Skipped>> {
        // Without bounds (`distlock inspect --job`) the slot is the last run's period.
        let read = self.jobs.read(&self.name).await?;
        let period = match self.bounds() {
            Ok((period, _, _)) => period,
            Err(_) => read.run.as_ref().and_then(|r| r.period_ms).map(|p| p as i64),
        };
        Ok(skipped(&self.name, &read, period))
    }

    /// The bound on a run: ShedLock's `lockAtMostFor` (the period if not set).
    pub fn at_most(&self) -> Result<Duration> {
        Ok(Duration::from_millis(self.bounds()?.1 as u64))
    }

    /// The record of the last run, if any.
    pub async fn last_run(&self) -> Result<Option<Run>> {
        Ok(self.jobs.read(&self.name).await?.run)
    }

    /// Records the end of run `token` with `exit`, and gives the job back (it stays taken until
    /// the slot's end and ShedLock's at-least bound). `Ok(false)` if the record is another run's
    /// now, or this run's end was recorded already.
    pub async fn finish_run(&self, token: u64, exit: Option<i32>) -> Result<bool> {
        let until = tokio::time::Instant::now() + END_RETRIES_FOR;
        Ok(matches!(self.end(token, exit, until).await?, Ended::Now(_)))
    }

    /// Records the end of run `token` (one read and one write; again on a change between, and
    /// after a failure whose outcome is unknown, until `until`: the write is guarded by the
    /// read, so one that landed unanswered is found by the next read as this run's end).
    async fn end(&self, token: u64, exit: Option<i32>, until: tokio::time::Instant) -> Result<Ended> {
        let mut attempts = 0;
        while attempts < ATTEMPTS {
            match self.end_once(token, exit).await {
                Ok(Some(ended)) => return Ok(ended),
                Ok(None) => attempts += 1,
                Err(e) if self.jobs.transient(&e) && tokio::time::Instant::now() + END_PAUSE < until => {
                    tracing::debug!(job = self.name, error = %e, "recording a run's end failed; trying again");
                    tokio::time::sleep(END_PAUSE).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Backend {
            op: "finish",
            path: self.name.clone(),
            source: format!("the job kept changing under us ({ATTEMPTS} attempts)").into(),
        })
    }

    /// One read and one guarded write of a run's end: `None` if the job changed between.
    async fn end_once(&self, token: u64, exit: Option<i32>) -> Result<Option<Ended>> {
        let read = self.jobs.read(&self.name).await?;
        let mut run = match read.run.clone() {
            Some(r) if r.token == token && r.ended_ms.is_none() => r,
            Some(r) if r.token == token => return Ok(Some(Ended::Before(r))),
            _ => return Ok(Some(Ended::Another)),
        };
        let now = read.now_ms;
        // The lock row is still this run's: it names it, or (ZooKeeper, whose row names
        // nobody) still holds the bound this run wrote.
        let ours = read.lock.as_ref().filter(|l| {
            l.locked_by == run.locked_by || (l.locked_by.is_empty() && l.lock_until_ms == run.lock_until_ms)
        });
        // Taken until the slot's end and start + at least; never shortened past now. The
        // start's time may read up to `now_error_ms` early (etcd's whole-second `Date`), so
        // at-least counts from that much later: never shorter than asked.
        let mut until = now.max(run.started_ms + read.now_error_ms + run.at_least_ms as i64);
        if let (Some(p), Some(s)) = (run.period_ms, run.slot) {
            until = until.max((s as i64 + 1) * p as i64);
        }
        let lock = ours.map(|l| JobLock { lock_until_ms: until.min(l.lock_until_ms), ..l.clone() });
        run.ended_ms = Some(now);
        run.exit = exit;
        let written = self.jobs.write(&self.name, &read.seen, lock.as_ref(), &run).await?;
        Ok(written.then_some(Ended::Now(run)))
    }

    /// The job as a [`crate::Lock`]: acquiring it is [`Schedule::try_start`] (again at growing
    /// intervals while a wait allows), holding it is running, and its lease deadline is
    /// [`JobGuard::stop_by`]. `distlock exec --once-per` runs commands through it.
    pub fn lock(&self) -> Result<crate::Lock> {
        self.bounds()?;
        Ok(crate::Lock::from_recipe(Arc::new(self.clone()), self.backend))
    }
}

/// Checks a job's name: ShedLock's column holds 64 characters; no control characters.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let bad = |reason: &str| Err(Error::InvalidArgument { what: "job name", reason: format!("{name:?}: {reason}") });
    if name.is_empty() {
        return bad("empty");
    }
    if name.chars().count() > 64 {
        return bad("longer than 64 characters (ShedLock's name column)");
    }
    if name.chars().any(char::is_control) {
        return bad("holds a control character");
    }
    Ok(())
}

/// Why `read` does not let a start run the job now, if it does not.
fn skipped(job: &str, read: &JobRead, period: Option<i64>) -> Option<Skipped> {
    let now = read.now_ms;
    let skip = |reason| {
        Some(Skipped {
            job: job.to_string(),
            reason,
            last: read.run.clone(),
            locked_by: read.lock.as_ref().map(|l| l.locked_by.clone()).unwrap_or_default(),
            lock_until_ms: read.lock.as_ref().map_or(0, |l| l.lock_until_ms),
            now_ms: now,
        })
    };
    if let Some(lock) = read.lock.as_ref().filter(|l| l.lock_until_ms > now) {
        // The record is the lock row's run when the row names it (or names nobody: ZooKeeper).
        let mine = read.run.as_ref().filter(|r| lock.locked_by.is_empty() || r.locked_by == lock.locked_by);
        return skip(match mine {
            Some(r) if r.ended_ms.is_none() => SkipReason::Running,
            Some(r) if period.is_some() && r.slot == period.map(|p| now.div_euclid(p) as u64) => SkipReason::RanInSlot,
            _ => SkipReason::Taken,
        });
    }
    // The record's slot only rises, whatever a peer did to the lock row.
    if let (Some(p), Some(run)) = (period, &read.run) {
        if run.period_ms == Some(p as u64) && run.slot.is_some_and(|s| s as i64 >= now.div_euclid(p)) {
            return skip(SkipReason::RanInSlot);
        }
    }
    None
}

/// A started run of a job. Finish it with [`JobGuard::finish`]; dropped, it finishes in the
/// background with no exit status.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: distlock::Client) -> distlock::Result<()> {
/// let job = client.schedule("compact")?.at_most_for(std::time::Duration::from_secs(30));
/// if let distlock::schedule::Started::Running(run) = job.try_start().await? {
///     tokio::time::timeout_at(run.stop_by().into(), async { /* the work */ }).await.ok();
///     run.finish(Some(0)).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct JobGuard {
    schedule: Schedule,
    run: Run,
    /// On tokio's clock (which a paused test moves).
    stop_by: tokio::time::Instant,
    finished: bool,
}

impl JobGuard {
    /// The run's record as written at its start.
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// The run's fencing token: higher than every earlier run's of this job.
    pub fn fencing_token(&self) -> u64 {
        self.run.token
    }

    /// The instant by which the work must have stopped: after it the server may give the job to
    /// another (ShedLock's `lockAtMostFor`, counted from before the start was sent, less a
    /// margin for clock rates).
    pub fn stop_by(&self) -> std::time::Instant {
        self.stop_by.into_std()
    }

    /// Records the end and `exit`, and gives the job back (it stays taken until the slot's end
    /// and the at-least bound). [`Error::LockLost`] if the record is another run's by now (the
    /// at-most bound was passed and another started).
    pub async fn finish(mut self, exit: Option<i32>) -> Result<Run> {
        self.finished = true;
        // Tried again after an unanswered failure while the run is ours: until its bound, and at
        // least a while (a run ended at its bound is recorded too).
        let until = self.stop_by.max(tokio::time::Instant::now() + END_RETRIES_FOR);
        match self.schedule.end(self.run.token, exit, until).await? {
            Ended::Now(run) | Ended::Before(run) => Ok(run),
            Ended::Another => Err(Error::LockLost { lock: self.run.job.clone(), reason: LostReason::LeaseExpired }),
        }
    }
}

/// What recording a run's end found.
enum Ended {
    /// Recorded now: the record as written.
    Now(Run),
    /// Recorded before (`exec` records the exit status, then releases).
    Before(Run),
    /// The record is another run's by now.
    Another,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let (schedule, token) = (self.schedule.clone(), self.run.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = schedule.finish_run(token, None).await {
                    tracing::warn!(job = %schedule.name, error = %e, "finishing a dropped job failed");
                }
            });
        }
    }
}

// The job as a lock, for the CLI and `with_lock`.

impl Recipe for Schedule {
    fn name(&self) -> &str {
        &self.name
    }

    fn acquire<'a>(
        &'a self,
        wait: Wait,
        _progress: Option<&'a watch::Sender<QueueStatus>>,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Held>>>> {
        Box::pin(async move {
            let mut backoff = crate::election::Backoff::default();
            loop {
                match self.try_start().await? {
                    Started::Running(job) => return Ok(Some(Box::new(job) as Box<dyn Held>)),
                    // A slot that had its run is not waited out: the next slot is another run.
                    Started::Skipped(s) if s.reason == SkipReason::RanInSlot => return Ok(None),
                    Started::Skipped(s) => {
                        tracing::debug!(job = %self.name, "{s}");
                        if !backoff.wait(wait).await {
                            return Ok(None);
                        }
                    }
                }
            }
        })
    }
}

impl Held for JobGuard {
    fn name(&self) -> &str {
        &self.run.job
    }
    fn holder_id(&self) -> &str {
        &self.run.locked_by
    }
    fn fencing_token(&self) -> u64 {
        self.run.token
    }
    fn lease_deadline(&self) -> std::time::Instant {
        self.stop_by.into_std()
    }
    fn state(&self) -> LockState {
        if tokio::time::Instant::now() < self.stop_by {
            LockState::Held
        } else {
            LockState::Lost(LostReason::LeaseExpired)
        }
    }
    fn lost(&self) -> BoxFuture<'static, LostReason> {
        // Nothing but the bound ends a run: the job is the holder's until `stop_by`, and may be
        // another's after it.
        let at = self.stop_by;
        Box::pin(async move {
            tokio::time::sleep_until(at).await;
            LostReason::LeaseExpired
        })
    }
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move { (*self).finish(None).await.map(|_| ()) })
    }
}

/// Milliseconds since the Unix epoch of a system time (0 before it).
pub(crate) fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Parses an RFC 3339 instant (`2026-11-26T18:30:00.123Z`, or SQLite's `2026-11-26
/// 18:30:00.123`) to milliseconds since the Unix epoch.
pub(crate) fn parse_ms(text: &str) -> Option<i64> {
    let t = text.trim();
    let t = if t.contains('T') { t.to_string() } else { format!("{}Z", t.replacen(' ', "T", 1)) };
    humantime::parse_rfc3339_weak(&t).ok().map(epoch_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(show_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_ms("2023-11-14T22:13:20.123Z"), Some(1_700_000_000_123));
        assert_eq!(parse_ms("2023-11-14 22:13:20.123"), Some(1_700_000_000_123));
        assert_eq!(parse_ms("soon"), None);
    }

    /// The decision logic only (the servers are in `tests/schedule.rs`): a store whose first
    /// write is applied but answers "changed", as a write sent again after a lost answer does.
    #[derive(Debug, Default)]
    struct EchoStore {
        state: std::sync::Mutex<(Option<JobLock>, Option<Run>, u32)>,
    }

    impl Jobs for EchoStore {
        fn read<'a>(&'a self, _job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
            let (lock, run, version) = self.state.lock().unwrap().clone();
            let seen = crate::contract::Seen { lock: Some(version.to_string()), run: Some(version.to_string()) };
            Box::pin(async move { Ok(JobRead { now_ms: epoch_ms(SystemTime::now()), now_error_ms: 0, lock, run, seen }) })
        }

        fn write<'a>(
            &'a self,
            _job: &'a str,
            seen: &'a crate::contract::Seen,
            lock: Option<&'a JobLock>,
            run: &'a Run,
        ) -> BoxFuture<'a, Result<bool>> {
            let mut state = self.state.lock().unwrap();
            let applied = seen.run == Some(state.2.to_string());
            if applied {
                if let Some(l) = lock {
                    state.0 = Some(l.clone());
                }
                state.1 = Some(run.clone());
                state.2 += 1;
            }
            // The first write's answer is lost: its second send finds the version moved.
            let answer = applied && state.2 > 1;
            Box::pin(async move { Ok(answer) })
        }
    }

    #[tokio::test]
    async fn a_start_that_hears_changed_from_its_own_write_runs() {
        let store = Arc::new(EchoStore::default());
        let job = Schedule::new(store.clone(), "j".into(), "test").at_most_for(Duration::from_secs(10));
        let Started::Running(guard) = job.try_start().await.unwrap() else { panic!("its own write was taken for another's") };
        let recorded = store.state.lock().unwrap().1.clone().unwrap();
        assert_eq!((guard.run().token, &guard.run().locked_by), (recorded.token, &recorded.locked_by));
        assert_eq!(store.state.lock().unwrap().2, 1, "one start written");
        guard.finish(Some(0)).await.unwrap();
    }

    #[test]
    fn process_start_is_read() {
        assert!(process_start().is_some_and(|t| t > 0), "Linux has /proc/self/stat");
    }
}

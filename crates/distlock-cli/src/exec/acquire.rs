//! Taking what a [`Plan`] names (locks, an election's lead, a job's run), with a status line
//! while waiting, and letting go of it within a bound: shared by `exec`, `hold` and `elect`.

use super::plan::{Kind, Plan, Target};
use super::signals::{interrupted, signal_name, Signals};
use super::terminal::show_status;
use crate::EXIT_LOST;
use distlock::schedule::Schedule;
use distlock::{Client, MultiGuard, MultiLock, QueueStatus};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Locks that are held, with the session that holds them.
pub struct Acquired {
    pub client: Client,
    pub guard: MultiGuard,
    /// The lock paths, comma-separated, for messages.
    pub shown: String,
    /// The value announced, when leading an election (`distlock elect`).
    pub value: Option<String>,
    /// The scheduled job, when running one (`--once-per`, `--at-most-for`).
    pub job: Option<distlock::schedule::Schedule>,
    /// The run's record as its start wrote it, when running a scheduled job.
    pub run: Option<distlock::schedule::Run>,
}

impl Acquired {
    /// `DISTLOCK_KEY`, `DISTLOCK_TOKEN` and `DISTLOCK_NODE`, each comma-separated in lock order
    /// (in each name `\` is written `\\` and `,` is `\,`: [`crate::shown::list`]);
    /// and the same marks and tokens under the names the backend's own lock tool uses, where it
    /// has one ([`distlock::BackendInfo::tool_env`]: `etcdctl lock`'s `ETCD_LOCK_KEY`, `ETCD_LOCK_REV`).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let parts = self.guard.parts();
        let join = |f: &dyn Fn(&distlock::Guard) -> String| {
            crate::shown::list(parts.iter().map(f).collect::<Vec<_>>().iter().map(String::as_str))
        };
        let mut env = vec![
            ("DISTLOCK_KEY", join(&|p| p.lock_name().to_string())),
            ("DISTLOCK_TOKEN", join(&|p| p.fencing_token().to_string())),
            ("DISTLOCK_NODE", join(&|p| p.holder_id().to_string())),
        ];
        if let Some([key, token]) = self.client.info().tool_env {
            env.push((key, join(&|p| p.holder_id().to_string())));
            env.push((token, join(&|p| p.fencing_token().to_string())));
        }
        if let Some(run) = &self.run {
            env.push(("DISTLOCK_JOB_STARTED_MS", run.started_ms.to_string()));
            if let Some(slot) = run.slot {
                env.push(("DISTLOCK_JOB_SLOT", slot.to_string()));
            }
        }
        if let Some(value) = &self.value {
            env.push(("DISTLOCK_EPOCH", join(&|p| p.fencing_token().to_string())));
            env.push(("DISTLOCK_VALUE", value.clone()));
        }
        env
    }

    /// Releases every lock and closes the session (so the server has deleted our nodes), within
    /// a bound: a server that does not answer cannot keep us from exiting (closing our
    /// connections frees what they held, and a lease ends on its own). Says what went wrong;
    /// returns [`Released::Lost`] when the release found a lock already lost, so that the caller
    /// exits with the lost status (the command may have run part of the time without it).
    pub async fn release(self) -> Released {
        // The job's store holds a handle of the client: dropped first, or `close` would wait for
        // its bound (ZooKeeper ends the session once every handle is gone).
        let Acquired { client, guard, shown, job, .. } = self;
        drop(job);
        crate::textfile::released();
        let bound = release_bound(client.lease());
        let outcome = match tokio::time::timeout(bound, guard.release()).await {
            Ok(Ok(())) => Released::Clean,
            Ok(Err(e @ distlock::Error::LockLost { .. })) => {
                crate::shown::say!("distlock: releasing {shown}: {e}");
                if let distlock::Error::LockLost { reason, .. } = &e {
                    crate::textfile::lost(&reason.to_string());
                }
                Released::Lost
            }
            Ok(Err(e)) => {
                crate::shown::say!("distlock: releasing {shown}: {e}");
                Released::Unconfirmed
            }
            Err(_) => {
                crate::shown::say!(
                    "distlock: releasing {shown}: no answer from the server within {}; it frees the lock when our \
                     connection closes or the lease ends",
                    humantime::format_duration(bound)
                );
                Released::Unconfirmed
            }
        };
        client.close(Duration::from_secs(2).min(bound)).await;
        outcome
    }
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The server confirmed every release.
    Clean,
    /// A lock was already lost when it was released.
    Lost,
    /// The server did not confirm (an error or no answer in time); the lock ends with our
    /// connection or its lease.
    Unconfirmed,
}

/// How long a release may wait for the server: a fifth of the lease, between 1 s and 5 s.
pub fn release_bound(lease: Duration) -> Duration {
    (lease / 5).clamp(Duration::from_secs(1), Duration::from_secs(5))
}

impl Released {
    /// The exit status for a command that exited with `status` under the lock.
    pub fn status(self, status: u8) -> u8 {
        match self {
            Released::Lost => EXIT_LOST,
            Released::Clean | Released::Unconfirmed => status,
        }
    }
}

/// Acquires what `plan` names, or says why not: `Err(status)` is the exit status to end with.
pub async fn acquire(plan: &Plan, signals: &mut Signals) -> anyhow::Result<Result<Acquired, u8>> {
    let client = tokio::select! {
        client = plan.backend.connect() => client?,
        sig = signals.ending() => {
            crate::shown::say!("distlock: {} while connecting; gave up", signal_name(sig));
            crate::textfile::not_acquired("interrupted");
            return Ok(Err(interrupted(sig)));
        }
    };
    let (job, specs) = match locks_of(plan, &client) {
        Ok(taken) => taken,
        Err(e) => {
            client.close(Duration::from_secs(2)).await;
            return Err(e.into());
        }
    };
    let shown = specs.iter().map(|l| l.name()).collect::<Vec<_>>().join(",");
    // The names as given, by the server's name (the multi-lock takes them in its own order).
    let typed: HashMap<String, String> =
        specs.iter().zip(plan.target.names()).map(|(l, given)| (l.name().to_string(), given)).collect();
    let multi = MultiLock::new(specs)?;
    let waited = wait(&multi, &shown, plan.timeout(), signals).await;
    // Locks and guards hold clones of the session; `close` only takes effect once all are gone.
    drop(multi);
    match waited {
        Err(sig) => {
            // Interrupted while waiting: our queue node is removed on drop; closing the session
            // makes sure the server has done it before we exit.
            drop(job);
            client.close(Duration::from_secs(2)).await;
            crate::textfile::not_acquired("interrupted");
            crate::shown::say!("distlock: {} while waiting for {shown}; gave up", signal_name(sig));
            Ok(Err(interrupted(sig)))
        }
        Ok(Err(e)) => {
            drop(job);
            client.close(Duration::from_secs(2)).await;
            Err(match e {
                distlock::Error::InvalidLockPath { .. } | distlock::Error::InvalidArgument { .. } => e.into(),
                e => anyhow::Error::from(e).context(format!("waiting for {shown}")),
            })
        }
        Ok(Ok(None)) => {
            say_not_acquired(plan, job, &shown).await;
            crate::textfile::not_acquired("busy");
            client.close(Duration::from_secs(2)).await;
            Ok(Err(plan.acquire.conflict_exit_code))
        }
        Ok(Ok(Some(guard))) => Ok(Ok(held(plan, client, guard, job, shown, &typed).await)),
    }
}

/// The locks `plan` takes on `client` (a scheduled job's with the job itself).
fn locks_of(plan: &Plan, client: &Client) -> distlock::Result<(Option<Schedule>, Vec<distlock::Lock>)> {
    match &plan.target {
        Target::Job { name, once_per, at_most_for, at_least_for } => {
            let mut job = client.schedule(name)?;
            if let Some(p) = once_per {
                job = job.once_per(*p);
            }
            if let Some(d) = at_most_for {
                job = job.at_most_for(*d);
            }
            if let Some(d) = at_least_for {
                job = job.at_least_for(*d);
            }
            // Refuses a job with neither a period nor a bound.
            job.at_most()?;
            let lock = job.lock()?;
            Ok((Some(job), vec![lock]))
        }
        Target::Election { name, value } => Ok((None, vec![client.election(name)?.candidate(value)?])),
        Target::Locks { names, kind } => {
            let lock = |name: &String| match kind {
                Kind::Permits(n) => client.semaphore_permit(name, *n),
                Kind::Read => client.read_lock(name),
                Kind::Write => client.write_lock(name),
                Kind::Simple => match client.redis() {
                    Some(redis) => Ok(redis.simple_lock(name)?.into()),
                    None => Err(distlock::Error::Unsupported {
                        backend: client.backend(),
                        what: "--simple (it chooses the Redis lock layout)".into(),
                    }),
                },
                Kind::Mutex => client.mutex(name),
            };
            Ok((None, names.iter().map(lock).collect::<distlock::Result<_>>()?))
        }
    }
}

/// Waits for `multi` within `timeout`, with a status line on a terminal once the wait lasts long
/// enough to be worth one; `Err(signal)` when INT, TERM, HUP or QUIT ends the wait.
async fn wait(
    multi: &MultiLock,
    shown: &str,
    timeout: Option<Duration>,
    signals: &mut Signals,
) -> Result<distlock::Result<Option<MultiGuard>>, libc::c_int> {
    let (progress_tx, progress_rx) = watch::channel(QueueStatus::default());
    let shown_status = Arc::new(AtomicBool::new(false));
    let status_line = (std::io::stderr().is_terminal() && timeout != Some(Duration::ZERO))
        .then(|| tokio::spawn(show_status(shown.to_string(), progress_rx, Instant::now(), shown_status.clone())));
    tracing::debug!("waiting for {shown}");
    let acquired = tokio::select! {
        r = multi.acquire(timeout, Some(&progress_tx)) => Ok(r),
        sig = signals.ending() => Err(sig),
    };
    if let Some(task) = status_line {
        task.abort();
        let _ = task.await;
        if shown_status.load(Ordering::SeqCst) {
            eprint!("\r\x1b[K");
        }
    }
    acquired
}

/// Says why nothing was acquired (unless `-q`): a scheduled job's slot had its run or runs
/// elsewhere, another candidate leads, or the lock is held.
async fn say_not_acquired(plan: &Plan, job: Option<Schedule>, shown: &str) {
    let quiet = plan.acquire.quiet;
    if let Some(job) = job {
        match job.check().await {
            Ok(Some(skipped)) if !quiet => crate::shown::say!("distlock: {skipped}; not run"),
            Ok(None) if !quiet => crate::shown::say!("distlock: {shown}: taken by another start; not run"),
            Ok(_) => {}
            Err(e) => crate::shown::say!("distlock: {shown}: not run; reading its record failed: {e}"),
        }
        // Dropped here, so that the job's store (a handle of the client) is gone before `close`.
    } else if !quiet {
        if matches!(plan.target, Target::Election { .. }) {
            crate::shown::say!("distlock: another candidate leads {shown}; not elected");
        } else {
            crate::shown::say!("distlock: {shown} is held by someone else; not acquired");
        }
    }
}

/// What was acquired, recorded for `--metrics-textfile` (by the names as given).
async fn held(
    plan: &Plan,
    client: Client,
    guard: MultiGuard,
    job: Option<Schedule>,
    shown: String,
    typed: &HashMap<String, String>,
) -> Acquired {
    let tokens = guard.parts().iter().map(|p| {
        let name = p.lock_name();
        (typed.get(name).cloned().unwrap_or_else(|| name.to_string()), p.fencing_token())
    });
    crate::textfile::acquired(tokens.collect());
    // The run's record, for the command's environment (the start just wrote it; nobody else can
    // start the job while it runs).
    let run = match &job {
        Some(job) => {
            let token = guard.parts().first().map(|p| p.fencing_token());
            job.last_run().await.ok().flatten().filter(|r| Some(r.token) == token)
        }
        None => None,
    };
    let value = match &plan.target {
        Target::Election { value, .. } => Some(value.clone()),
        _ => None,
    };
    Acquired { client, guard, shown, value, job, run }
}

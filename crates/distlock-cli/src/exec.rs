//! `distlock exec`: run a command while holding locks. The lock flags and the acquire are shared
//! with `distlock hold`.

use crate::{BackendArg, EXIT_LOST, EXIT_NOT_ACQUIRED};
use distlock::{Client, MultiGuard, MultiLock, QueueStatus};
use std::io::IsTerminal;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;

/// Exit status of a command that could not be found (as shells report it).
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit status of a command that was found but could not be run.
pub const EXIT_CANNOT_RUN: u8 = 126;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLost {
    /// SIGTERM, then SIGKILL after the grace period.
    Term,
    /// SIGKILL at once.
    Kill,
    /// Keep running (unsafe: the command runs without the lock); a warning is printed.
    Ignore,
}

/// Which locks to take and how long to wait: shared by `exec` and `hold`.
#[derive(clap::Args, Debug)]
pub struct LockArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Wait at most this long for the lock: seconds as flock(1) takes them (5, 0.5) or with a
    /// unit (500ms, 2m); 0 never waits. Without -w or -n, waits as long as it takes.
    #[arg(allow_hyphen_values = true, short = 'w', long = "wait", visible_alias = "timeout", value_name = "SECONDS", value_parser = wait_arg, conflicts_with = "nonblock")]
    wait: Option<Duration>,
    /// Do not wait: fail at once if the lock is held.
    #[arg(short = 'n', long = "nonblock", visible_alias = "no-wait")]
    nonblock: bool,
    /// Exit status when the lock is not acquired.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N", default_value_t = EXIT_NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// Say nothing when the lock is not acquired, or a job's slot has had its run (cron mails
    /// whatever a job prints: with -E 0 a busy run is then silent). Errors are still reported.
    #[arg(short = 'q', long = "quiet")]
    quiet: bool,
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
    /// At exit, write the run's figures (wait and hold seconds, outcome, exit status, lost
    /// reason, fencing tokens, time) to PATH in the Prometheus text format, replacing it
    /// atomically, for node_exporter's textfile collector.
    #[arg(long = "metrics-textfile", value_name = "PATH")]
    metrics_textfile: Option<std::path::PathBuf>,
    /// `distlock elect`: campaign in the election named by the one LOCK, announcing this value.
    #[arg(skip)]
    elect: Option<String>,
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

impl LockArgs {
    /// A campaign in election `name` announcing `value`, waiting as `wait` says (`Some(ZERO)`
    /// never waits), with `conflict_exit_code` when another leads.
    pub fn election(
        backend: BackendArg,
        name: String,
        value: String,
        wait: Option<Duration>,
        conflict_exit_code: u8,
        metrics_textfile: Option<std::path::PathBuf>,
    ) -> LockArgs {
        LockArgs {
            backend,
            wait,
            nonblock: false,
            conflict_exit_code,
            quiet: false,
            shared: false,
            exclusive: false,
            permits: None,
            simple: false,
            locks: vec![name],
            metrics_textfile,
            elect: Some(value),
            once_per: None,
            at_most_for: None,
            at_least_for: None,
        }
    }

    /// True when the one LOCK is a scheduled job (`--once-per`, `--at-most-for`,
    /// `--at-least-for`).
    pub fn is_job(&self) -> bool {
        self.once_per.is_some() || self.at_most_for.is_some() || self.at_least_for.is_some()
    }

    /// The scheduled job the flags describe, on `client`.
    fn schedule(&self, client: &Client, name: &str) -> distlock::Result<distlock::schedule::Schedule> {
        let mut job = client.schedule(name)?;
        if let Some(p) = self.once_per {
            job = job.once_per(p);
        }
        if let Some(d) = self.at_most_for {
            job = job.at_most_for(d);
        }
        if let Some(d) = self.at_least_for {
            job = job.at_least_for(d);
        }
        job.at_most()?;
        Ok(job)
    }

    /// Starts the run's record for `--metrics-textfile` (nothing without it).
    pub fn start_record(&self, command: &'static str) -> anyhow::Result<()> {
        crate::textfile::start(self.metrics_textfile.clone(), command, &self.locks)
    }
}

impl ExecArgs {
    /// `exec` under the locks `lock` names (an election's campaign for `distlock elect`).
    pub fn under(
        lock: LockArgs,
        on_lost: OnLost,
        grace: Duration,
        command_string: Option<String>,
        command: Vec<String>,
    ) -> ExecArgs {
        ExecArgs { lock, on_lost, grace, command_string, command }
    }
}

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// What to do to the command if the lock is lost while it runs.
    #[arg(long = "on-lost", value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,
    /// Time between SIGTERM and SIGKILL when the lock is lost; cut to a quarter of the session
    /// timeout, so that SIGKILL always lands before the lock's lease ends.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "5s")]
    grace: Duration,
    /// Run STRING with `sh -c` (as flock -c does) instead of a COMMAND after --.
    #[arg(short = 'c', long = "command", value_name = "STRING", conflicts_with = "command")]
    command_string: Option<String>,
    /// The command and its arguments, after --.
    #[arg(value_name = "COMMAND", last = true, num_args = 1..)]
    command: Vec<String>,
}

/// `-w`: a duration (a bare number is seconds, as flock(1) takes it; or with a unit); 0 never
/// waits.
pub fn wait_arg(s: &str) -> Result<Duration, String> {
    if s.trim().starts_with('-') {
        return Err(format!("{s:?}: a wait cannot be negative (0 never waits)"));
    }
    crate::duration_arg(s)
}

/// Every signal `exec` and `hold` react to, caught from before the acquire on, so none is missed
/// between waiting and running.
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    quit: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    pub fn new() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }

    /// The next INT, TERM, HUP or QUIT (the signals that end a wait or a hold).
    pub async fn ending(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
        }
    }

    /// Forgets USR1 and USR2 that arrived while waiting: they were for no command yet.
    fn forget_pending(&mut self) {
        use futures::FutureExt;
        while self.usr1.recv().now_or_never().is_some() {}
        while self.usr2.recv().now_or_never().is_some() {}
    }

    /// The next signal to forward to the command.
    async fn any(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
            _ = self.usr1.recv() => libc::SIGUSR1,
            _ = self.usr2.recv() => libc::SIGUSR2,
        }
    }
}

/// Locks that are held, with the session that holds them.
pub struct Held {
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

impl Held {
    /// `DISTLOCK_KEY`, `DISTLOCK_TOKEN` and `DISTLOCK_NODE`, each comma-separated in lock order;
    /// on etcd also `ETCD_LOCK_KEY` (our keys) and `ETCD_LOCK_REV` (their create revisions), the
    /// names `etcdctl lock` gives its command.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let parts = self.guard.parts();
        let join = |f: &dyn Fn(&distlock::Guard) -> String| parts.iter().map(f).collect::<Vec<_>>().join(",");
        let mut env = vec![
            ("DISTLOCK_KEY", join(&|p| p.lock_name())),
            ("DISTLOCK_TOKEN", join(&|p| p.fencing_token().to_string())),
            ("DISTLOCK_NODE", join(&|p| p.holder_id())),
        ];
        if self.client.backend() == "etcd" {
            env.push(("ETCD_LOCK_KEY", join(&|p| p.holder_id())));
            env.push(("ETCD_LOCK_REV", join(&|p| p.fencing_token().to_string())));
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
        let Held { client, guard, shown, job, .. } = self;
        drop(job);
        crate::textfile::released();
        let bound = release_bound(client.lease());
        let outcome = match tokio::time::timeout(bound, guard.release()).await {
            Ok(Ok(())) => Released::Clean,
            Ok(Err(e @ distlock::Error::LockLost { .. })) => {
                eprintln!("distlock: releasing {shown}: {e}");
                if let distlock::Error::LockLost { reason, .. } = &e {
                    crate::textfile::lost(&reason.to_string());
                }
                Released::Lost
            }
            Ok(Err(e)) => {
                eprintln!("distlock: releasing {shown}: {e}");
                Released::Unconfirmed
            }
            Err(_) => {
                eprintln!(
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

/// Acquires the locks, or says why not: `Err(status)` is the exit status to end with.
pub async fn acquire(args: &LockArgs, signals: &mut Signals) -> anyhow::Result<Result<Held, u8>> {
    // A scheduled job never waits for its next slot: a start finds it free or exits (-w waits
    // for a run going on elsewhere to end, within the wait).
    let timeout =
        if args.nonblock || (args.is_job() && args.wait.is_none()) { Some(Duration::ZERO) } else { args.wait };
    let client = tokio::select! {
        client = args.backend.connect() => client?,
        sig = signals.ending() => {
            eprintln!("distlock: {} while connecting; gave up", signal_name(sig));
            crate::textfile::not_acquired("interrupted");
            return Ok(Err(interrupted(sig)));
        }
    };
    if args.is_job() && args.locks.len() > 1 {
        client.close(Duration::from_secs(2)).await;
        anyhow::bail!(
            "a scheduled job (--once-per, --at-most-for, --at-least-for) takes one name, not {}",
            args.locks.len()
        );
    }
    let mut job = if args.is_job() {
        match args.schedule(&client, &args.locks[0]) {
            Ok(job) => Some(job),
            Err(e) => {
                client.close(Duration::from_secs(2)).await;
                return Err(e.into());
            }
        }
    } else {
        None
    };
    let specs = args
        .locks
        .iter()
        .map(|name| {
            if let Some(job) = &job {
                job.lock()
            } else if let Some(value) = &args.elect {
                client.election(name).and_then(|e| e.candidate(value))
            } else if let Some(n) = args.permits {
                client.semaphore_permit(name, n)
            } else if args.shared {
                client.read_lock(name)
            } else if args.exclusive {
                client.write_lock(name)
            } else if args.simple {
                match client.redis() {
                    Some(redis) => Ok(redis.simple_lock(name)?.into()),
                    None => Err(distlock::Error::Unsupported {
                        backend: client.backend(),
                        what: "--simple (it chooses the Redis lock layout)".into(),
                    }),
                }
            } else {
                client.mutex(name)
            }
        })
        .collect::<distlock::Result<Vec<_>>>();
    let specs = match specs {
        Ok(specs) => specs,
        Err(e) => {
            client.close(Duration::from_secs(2)).await;
            return Err(e.into());
        }
    };
    let shown = specs.iter().map(|l| l.name()).collect::<Vec<_>>().join(",");
    // The names as given, by the server's name (the multi-lock takes them in its own order).
    let typed: std::collections::HashMap<String, String> =
        specs.iter().zip(&args.locks).map(|(l, given)| (l.name().to_string(), given.clone())).collect();
    let multi = MultiLock::new(specs)?;

    // A status line on a terminal, once the wait lasts long enough to be worth one.
    let (progress_tx, progress_rx) = watch::channel(QueueStatus::default());
    let shown_status = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let status_line = (std::io::stderr().is_terminal() && timeout != Some(Duration::ZERO))
        .then(|| tokio::spawn(show_status(shown.clone(), progress_rx, Instant::now(), shown_status.clone())));
    tracing::debug!("waiting for {shown}");
    let acquired = tokio::select! {
        r = multi.acquire(timeout, Some(&progress_tx)) => Ok(r),
        sig = signals.ending() => Err(sig),
    };
    if let Some(task) = status_line {
        task.abort();
        let _ = task.await;
        if shown_status.load(std::sync::atomic::Ordering::SeqCst) {
            eprint!("\r\x1b[K");
        }
    }
    // Locks and guards hold clones of the session; `close` only takes effect once all are gone.
    drop(multi);
    match acquired {
        Err(sig) => {
            // Interrupted while waiting: our queue node is removed on drop; closing the session
            // makes sure the server has done it before we exit.
            drop(job);
            client.close(Duration::from_secs(2)).await;
            crate::textfile::not_acquired("interrupted");
            eprintln!("distlock: {} while waiting for {shown}; gave up", signal_name(sig));
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
            // Taken out, so that the job's store (a handle of the client) is gone before `close`.
            if let Some(job) = job.take() {
                match job.check().await {
                    Ok(Some(skipped)) if !args.quiet => eprintln!("distlock: {skipped}; not run"),
                    Ok(None) if !args.quiet => eprintln!("distlock: {shown}: taken by another start; not run"),
                    Ok(_) => {}
                    Err(e) => eprintln!("distlock: {shown}: not run; reading its record failed: {e}"),
                }
            } else if !args.quiet {
                if args.elect.is_some() {
                    eprintln!("distlock: another candidate leads {shown}; not elected");
                } else {
                    eprintln!("distlock: {shown} is held by someone else; not acquired");
                }
            }
            crate::textfile::not_acquired("busy");
            client.close(Duration::from_secs(2)).await;
            Ok(Err(args.conflict_exit_code))
        }
        Ok(Ok(Some(guard))) => {
            crate::textfile::acquired(
                guard
                    .parts()
                    .iter()
                    .map(|p| {
                        let name = p.lock_name();
                        (typed.get(&name).cloned().unwrap_or(name), p.fencing_token())
                    })
                    .collect(),
            );
            // The run's record, for the command's environment (the start just wrote it; nobody
            // else can start the job while it runs).
            let run = match &job {
                Some(job) => {
                    let token = guard.parts().first().map(|p| p.fencing_token());
                    job.last_run().await.ok().flatten().filter(|r| Some(r.token) == token)
                }
                None => None,
            };
            Ok(Ok(Held { client, guard, shown, value: args.elect.clone(), job, run }))
        }
    }
}

/// The exit status for a wait ended by `sig`: 128+N. For INT and QUIT distlock dies of the signal
/// itself instead (after cleaning up), as a shell expects of a program it ran when the user
/// pressed Ctrl-C, so that a calling script stops too.
fn interrupted(sig: libc::c_int) -> u8 {
    if sig == libc::SIGINT || sig == libc::SIGQUIT {
        die_of(sig);
    }
    128 + sig as u8
}

/// Sends `sig` to our own process group (us included: our disposition is set to the default
/// first, so we die of it).
fn interrupt_our_group(sig: libc::c_int) {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    // SAFETY: resetting our disposition, then kill(2) on our own process group.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(0, sig);
    }
}

/// Ends the process by `sig` with its default action (flushing stderr and writing the run's
/// `--metrics-textfile` first: the shell will report 128+N).
fn die_of(sig: libc::c_int) {
    use std::io::Write;
    crate::textfile::finish(128 + sig as u8);
    let _ = std::io::stderr().flush();
    // SAFETY: resetting a disposition to the default and raising a signal at ourselves.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "a signal",
    }
}

/// What to run: COMMAND after --, or `sh -c STRING`.
fn argv(args: &ExecArgs) -> anyhow::Result<Vec<String>> {
    match &args.command_string {
        Some(s) => {
            // `exec L -c make all` would run `sh -c make` holding a second lock named `all`.
            let words: Vec<String> = std::env::args().collect();
            if let Some(c) = words.iter().position(|w| w == "-c" || w == "--command") {
                if let Some(extra) =
                    words[c + 2..].iter().take_while(|w| *w != "--").find(|w| args.lock.locks.contains(w))
                {
                    anyhow::bail!(
                        "{extra:?} comes after -c STRING: put the locks before -c, and the whole shell command in one quoted STRING"
                    );
                }
            }
            Ok(vec!["sh".into(), "-c".into(), s.clone()])
        }
        None if !args.command.is_empty() => Ok(args.command.clone()),
        None => {
            let hint = if args.lock.locks.len() > 1 {
                format!(" (without --, {:?} is read as a second lock)", args.lock.locks[1..].join(" "))
            } else {
                String::new()
            };
            anyhow::bail!(
                "no command to run{hint}: put -- before the command (distlock exec LOCK -- COMMAND ARGS), \
                 give a shell command with -c 'STRING', or use `distlock hold LOCK` to hold the lock without a command"
            )
        }
    }
}

pub async fn run(args: ExecArgs) -> anyhow::Result<u8> {
    let argv = argv(&args)?;
    if args.lock.is_job() && args.on_lost == OnLost::Ignore {
        anyhow::bail!(
            "--on-lost ignore cannot go with a scheduled job (--once-per, --at-most-for): past its bound the job \
             may be another's, so the command is always stopped there"
        );
    }
    let mut signals = Signals::new()?;
    args.lock.start_record("exec")?;
    let held = match acquire(&args.lock, &mut signals).await? {
        Ok(held) => held,
        Err(code) => return Ok(code),
    };
    let path = held.shown.clone();
    tracing::info!(lock = %path, tokens = %held.env()[1].1, "acquired");

    // The lock's lease bounds how long the command may run once the server stops answering:
    // SIGTERM early enough that SIGKILL lands before the lease deadline, whatever --grace says.
    // A scheduled job's bound is its --at-most-for, counted from its start.
    let session = match &held.job {
        Some(job) => job.at_most()?,
        None => held.client.lease(),
    };
    let grace = args.grace.min(session / 4);
    let kill_margin = (session / 20).min(Duration::from_millis(500));
    if grace < args.grace {
        tracing::debug!(?grace, "--grace cut to a quarter of the session timeout");
    }

    signals.forget_pending();
    let mut command = tokio::process::Command::new(&argv[0]);
    command.args(&argv[1..]).envs(held.env()).process_group(0);
    if crate::backend_env_has_secret() {
        command.env_remove("DISTLOCK_BACKEND");
    }
    // A job's bound holds on the server whatever happens to us: the watchdog keeps it too.
    let kill_by = held.job.as_ref().map(|_| {
        held.guard.lease_deadline().unwrap_or_else(Instant::now).checked_sub(kill_margin).unwrap_or_else(Instant::now)
    });
    // The watchdog first: nothing would end the command if we died before it ran.
    let watchdog = match crate::supervise::Watchdog::start(grace + kill_margin, kill_by) {
        Ok(w) => w,
        Err(e) => {
            held.release().await;
            anyhow::bail!(
                "cannot start the watchdog that ends the command if distlock dies ({e}); the command was not run"
            );
        }
    };
    // SAFETY: report_group makes only async-signal-safe calls (getpid, write).
    unsafe {
        command.pre_exec(watchdog.report_group());
    }
    let terminal = Terminal::foreground();
    let had_terminal = terminal.is_some();
    if terminal.is_some() {
        // The command's group takes the terminal, as a shell gives it to a foreground job: it
        // reads the terminal and gets Ctrl-C itself (once).
        // Ctrl-Z is ignored by the command: a stopped group that owns the terminal would hang
        // the shell with the lock held (distlock cannot stop and resume with it, as sudo does).
        // SAFETY: only async-signal-safe calls (signal, tcsetpgrp, getpid) between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                libc::signal(libc::SIGTSTP, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let exists = argv[0].contains('/') && std::path::Path::new(&argv[0]).exists();
            let (code, why) = match e.kind() {
                // The file is there but its #! interpreter is not (as a shell says: 126).
                std::io::ErrorKind::NotFound if exists => (EXIT_CANNOT_RUN, "bad interpreter (see its #! line)".into()),
                std::io::ErrorKind::NotFound => (EXIT_NOT_FOUND, "command not found".to_string()),
                std::io::ErrorKind::PermissionDenied => (EXIT_CANNOT_RUN, "permission denied (not executable?)".into()),
                _ => (EXIT_CANNOT_RUN, e.to_string()),
            };
            eprintln!("distlock: cannot run {:?}: {why}", argv[0]);
            watchdog.disarm();
            if let Some(t) = terminal {
                t.take_back(); // the failed child may have taken it before its exec failed
            }
            held.release().await;
            return Ok(code);
        }
    };
    let pgid = child.id().map(|p| p as libc::pid_t).unwrap_or(0);
    let to_group = |sig| {
        if pgid > 1 {
            crate::supervise::signal_group(pgid, sig);
        }
    };

    let lost = held.guard.lost();
    tokio::pin!(lost);
    let far = || Instant::now() + Duration::from_secs(86400);
    // The command's own status, once it has exited; the lock stays held until the processes it
    // left in its group have ended too (as flock(1)'s lock stays held while a background child
    // keeps the file open).
    let mut status: Option<ExitStatus> = None;
    let mut terminal = terminal;
    // Signals received after the command itself exited, while its leftovers run.
    let mut late_signals = 0;
    let lost_reason: Option<(String, bool)> = loop {
        let lease_deadline = held.guard.lease_deadline().unwrap_or_else(far);
        let term_at = lease_deadline.checked_sub(grace + kill_margin).unwrap_or_else(Instant::now);
        tokio::select! {
            s = child.wait(), if status.is_none() => {
                status = Some(s?);
                if let Some(t) = terminal.take() {
                    t.take_back();
                }
                if !crate::supervise::group_alive(pgid) {
                    break None;
                }
                eprintln!(
                    "distlock: the command exited; {path} stays held until the processes it left behind end \
                     (process group {pgid}: {}); INT or TERM passes on to them, a second one kills them",
                    crate::supervise::members(pgid).iter().map(|p| p.to_string()).collect::<Vec<_>>().join(" ")
                );
            }
            _ = tokio::time::sleep(GROUP_POLL), if status.is_some() => {
                if !crate::supervise::group_alive(pgid) {
                    break None;
                }
            }
            sig = signals.any() => {
                if status.is_some() && (sig == libc::SIGINT || sig == libc::SIGTERM) {
                    late_signals += 1;
                    to_group(if late_signals > 1 { libc::SIGKILL } else { libc::SIGTERM });
                } else {
                    to_group(sig);
                }
            }
            reason = &mut lost => break Some((reason.to_string(), true)),
            _ = tokio::time::sleep_until(term_at.into()) => {
                let left = held.guard.lease_deadline().unwrap_or_else(far).saturating_duration_since(Instant::now());
                if left <= grace + kill_margin {
                    let left = humantime::format_duration(Duration::from_millis(left.as_millis() as u64));
                    break Some((if held.job.is_some() {
                        format!("the job's bound (--at-most-for {}) ends in {left}", humantime::format_duration(session))
                    } else {
                        format!("no answer from the server; the lease ends in {left}")
                    }, false));
                }
            }
        }
    };
    if let Some((reason, _)) = &lost_reason {
        crate::textfile::lost(reason);
    }
    let Some((reason, already_lost)) = lost_reason else {
        command_ended(watchdog, terminal);
        let status = status.expect("the loop ends normally only after the command exited");
        record_exit(&held, exit_code(status)).await;
        let released = held.release().await;
        // Killed by Ctrl-C (or Ctrl-\\): distlock dies the same way, so a calling shell stops its
        // script. When the command had the terminal, the keypress reached only its group; it is
        // passed on to ours (the calling shell included), as the terminal would have done.
        if let Some(sig @ (libc::SIGINT | libc::SIGQUIT)) = std::os::unix::process::ExitStatusExt::signal(&status) {
            if had_terminal {
                interrupt_our_group(sig);
            }
            die_of(sig);
        }
        return Ok(released.status(exit_code(status)));
    };
    // Lost, or about to be: stop the command group before anyone else can hold the lock. A lock
    // reported lost may be someone else's already (the server ended our session, the key was
    // deleted): no grace is left, whatever the lease deadline says. Only a lock about to be lost
    // (the server silent, the lease running out) leaves time for SIGTERM to work.
    let kill_at = if already_lost {
        Instant::now()
    } else {
        held.guard.lease_deadline().unwrap_or_else(far).checked_sub(kill_margin).unwrap_or_else(Instant::now)
    };
    let on_lost = if already_lost && args.on_lost == OnLost::Term { OnLost::Kill } else { args.on_lost };
    // A job's bound coming is no loss of a lock: it is said as what it is.
    let what = if held.job.is_some() && !already_lost {
        format!("job {path}: {reason}")
    } else {
        format!("lock {path} lost ({reason})")
    };
    match on_lost {
        OnLost::Ignore => {
            eprintln!("distlock: WARNING: {what}; the command keeps running WITHOUT the lock (--on-lost ignore)");
            let Held { client, guard, .. } = held;
            drop(guard);
            let status = group_ended(&mut child, pgid).await?;
            command_ended(watchdog, terminal);
            client.close(Duration::from_secs(2)).await;
            return Ok(exit_code(status));
        }
        OnLost::Kill => {
            let why = if args.on_lost == OnLost::Term {
                " at once (it may be held by another already: no grace)"
            } else {
                ""
            };
            eprintln!("distlock: {what}; killing the command{why}");
            to_group(libc::SIGKILL);
        }
        OnLost::Term => {
            let kill_at = kill_at.min(Instant::now() + grace);
            eprintln!(
                "distlock: {what}; terminating the command (SIGTERM, SIGKILL after {})",
                humantime::format_duration(Duration::from_millis(
                    kill_at.saturating_duration_since(Instant::now()).as_millis() as u64
                ))
            );
            to_group(libc::SIGTERM);
            if tokio::time::timeout_at(kill_at.into(), group_ended(&mut child, pgid)).await.is_err() {
                eprintln!("distlock: the command outlived the grace period; SIGKILL");
            }
        }
    }
    // Whatever is left of the group (a command may exit and leave children behind).
    to_group(libc::SIGKILL);
    let status = child.wait().await?;
    command_ended(watchdog, terminal);
    record_exit(&held, exit_code(status)).await;
    // Every other lock of a multi-lock is released now, not when the session ends.
    held.release().await;
    Ok(EXIT_LOST)
}

/// Records a scheduled job's end and exit status (nothing for a lock): a run whose bound passed
/// and whose job another start took by now is not recorded (the record is the other run's).
async fn record_exit(held: &Held, code: u8) {
    let Some(job) = &held.job else { return };
    let token = held.guard.parts().first().map(|p| p.fencing_token()).unwrap_or_default();
    match job.finish_run(token, Some(i32::from(code))).await {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("distlock: {}: the record is another run's by now; this run's end is not recorded", job.name())
        }
        Err(e) => eprintln!("distlock: {}: recording the run's end failed: {e}", job.name()),
    }
}

/// How often a command's leftover process group is checked for having ended (a process group has
/// no event to wait on once its leader is reaped).
const GROUP_POLL: Duration = Duration::from_millis(50);

/// Waits until the command has exited and its whole process group has ended.
async fn group_ended(child: &mut tokio::process::Child, pgid: libc::pid_t) -> std::io::Result<ExitStatus> {
    let status = child.wait().await?;
    while crate::supervise::group_alive(pgid) {
        tokio::time::sleep(GROUP_POLL).await;
    }
    Ok(status)
}

/// The command's group is gone: the watchdog stands down and the terminal comes back to us.
fn command_ended(watchdog: crate::supervise::Watchdog, terminal: Option<Terminal>) {
    watchdog.disarm();
    if let Some(t) = terminal {
        t.take_back();
    }
}

/// The controlling terminal, when our process group is its foreground group (we run in the
/// foreground): the command's group is given the terminal, and it is taken back when the command
/// itself ends.
#[derive(Clone, Copy)]
struct Terminal {
    our_group: libc::pid_t,
}

impl Terminal {
    fn foreground() -> Option<Terminal> {
        // SAFETY: plain queries of our own process group and of stdin's terminal.
        unsafe {
            if libc::isatty(0) != 1 {
                return None;
            }
            // (In a script the shell shares our group and loses Ctrl-C to the command meanwhile;
            // a command killed by Ctrl-C makes distlock die of SIGINT too, which a shell takes as
            // its own interrupt: its loop stops.)
            let ours = libc::getpgrp();
            (libc::tcgetpgrp(0) == ours).then_some(Terminal { our_group: ours })
        }
    }

    fn take_back(self) {
        // SAFETY: a background group may take the terminal back with SIGTTOU ignored.
        unsafe {
            let previous = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, self.our_group);
            libc::signal(libc::SIGTTOU, previous);
        }
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        _ => crate::EXIT_ERROR,
    }
}

/// Shows where we stand in the queue, on one line that fits the terminal, from half a second into
/// the wait on (an acquire that succeeds at once prints nothing).
async fn show_status(
    path: String,
    mut progress: watch::Receiver<QueueStatus>,
    started: Instant,
    shown: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let mut tick = tokio::time::interval_at((started + Duration::from_millis(500)).into(), Duration::from_millis(250));
    loop {
        tick.tick().await;
        let s = *progress.borrow_and_update();
        let line = status_text(&path, s, started.elapsed(), terminal_width());
        shown.store(true, std::sync::atomic::Ordering::SeqCst);
        eprint!("\r\x1b[K{line}");
    }
}

/// The status line, at most `width - 1` characters (the last column would wrap on some
/// terminals): the queue position and time first, the path shortened from the left if needed.
pub fn status_text(path: &str, s: QueueStatus, elapsed: Duration, width: usize) -> String {
    let budget = width.saturating_sub(1);
    let tail = if s.queue_len == 0 {
        format!(" ({:.1}s)", elapsed.as_secs_f64())
    } else {
        format!(": {} ahead ({:.1}s)", s.ahead, elapsed.as_secs_f64())
    };
    let head = "distlock: waiting for ";
    let fixed = head.chars().count() + tail.chars().count();
    let path_len = path.chars().count();
    if fixed + path_len <= budget {
        return format!("{head}{path}{tail}");
    }
    if fixed + 4 <= budget {
        let keep = budget - fixed - 1;
        let short: String = path.chars().skip(path_len - keep).collect();
        return format!("{head}…{short}{tail}");
    }
    let minimal = format!("waiting{tail}");
    if minimal.chars().count() <= budget {
        return minimal;
    }
    tail.trim_start_matches([':', ' ']).chars().take(budget).collect()
}

/// Columns of the terminal on stderr (80 when unknown).
fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize struct for a terminal file descriptor.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        size.ws_col as usize
    } else {
        80
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

    #[test]
    fn status_line_fits_the_terminal() {
        let s = QueueStatus { ahead: 3, queue_len: 5 };
        let path = "/locks/a-rather-long-lock-name-for-orders";
        for width in [20, 40, 60, 80, 200] {
            let line = status_text(path, s, Duration::from_millis(12_345), width);
            assert!(line.chars().count() < width, "{width}: {line:?}");
            assert!(line.contains("12.3s"), "{width}: {line:?}");
        }
        assert!(status_text(path, s, Duration::ZERO, 200).contains(path));
        assert!(status_text(path, s, Duration::ZERO, 50).contains("…"));
    }
}

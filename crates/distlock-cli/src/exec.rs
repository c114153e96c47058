//! `distlock exec`: run a command while holding a lock.

use crate::{BackendArg, EXIT_LOST, EXIT_NOT_ACQUIRED};
use anyhow::Context;
use distlock::zookeeper::{LockSpec, MultiLock, QueueStatus};
use std::io::IsTerminal;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnLost {
    /// SIGTERM, then SIGKILL after the grace period.
    Term,
    /// SIGKILL at once.
    Kill,
    /// Keep running (unsafe: the command runs without the lock); a warning is printed.
    Ignore,
}

#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Wait at most this long for the lock (e.g. 500ms, 10s, 2m); 0 never waits.
    #[arg(short = 'w', long = "wait", value_name = "DURATION", value_parser = crate::duration_arg, conflicts_with = "nonblock")]
    wait: Option<Duration>,
    /// Do not wait: fail at once if the lock is held.
    #[arg(short = 'n', long = "nonblock")]
    nonblock: bool,
    /// Exit status when the lock is not acquired.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N", default_value_t = EXIT_NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// What to do to the command if the lock is lost while it runs.
    #[arg(long = "on-lost", value_enum, default_value_t = OnLost::Term)]
    on_lost: OnLost,
    /// Time between SIGTERM and SIGKILL when the lock is lost; cut to a quarter of the session
    /// timeout, so that SIGKILL always lands before the lock's lease ends.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "5s")]
    grace: Duration,
    /// Take the read side of a read/write lock: shared with other readers (Curator's
    /// InterProcessReadWriteLock layout). Its exclusive partner is --write, not a plain exec.
    #[arg(short = 's', long = "shared", conflicts_with = "permits")]
    shared: bool,
    /// Take the write side of a read/write lock (exclusive against --shared and --write).
    #[arg(long = "write", conflicts_with_all = ["shared", "permits"])]
    write: bool,
    /// Take one permit of a semaphore with N permits (Curator's InterProcessSemaphoreV2 layout).
    #[arg(long = "permits", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// The locks: znode paths (/locks/orders) or bare names (orders = /distlock/orders). Several
    /// locks are taken all or nothing, in a fixed global order.
    #[arg(value_name = "LOCK", required = true, num_args = 1..)]
    locks: Vec<String>,
    /// The command and its arguments (after --).
    #[arg(value_name = "COMMAND", last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

pub async fn run(args: ExecArgs) -> anyhow::Result<u8> {
    let paths =
        args.locks.iter().map(|l| crate::lock_path(l)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    let shown = paths.join(",");
    let timeout = if args.nonblock { Some(Duration::ZERO) } else { args.wait };
    let client = args.backend.connect().await?;
    let specs = paths
        .iter()
        .map(|p| {
            Ok(if let Some(n) = args.permits {
                LockSpec::Permits(client.semaphore(p, n)?, 1)
            } else if args.shared {
                LockSpec::Read(client.rwlock(p)?)
            } else if args.write {
                LockSpec::Write(client.rwlock(p)?)
            } else {
                LockSpec::Exclusive(client.mutex(p)?)
            })
        })
        .collect::<distlock::Result<Vec<_>>>()?;
    let multi = MultiLock::new(specs)?;

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;

    // Acquire, showing a status line on a terminal, and giving up cleanly on INT/TERM.
    let (progress_tx, progress_rx) = watch::channel(QueueStatus::default());
    let started = Instant::now();
    let status_line = (std::io::stderr().is_terminal() && timeout != Some(Duration::ZERO))
        .then(|| tokio::spawn(show_status(shown.clone(), progress_rx, started)));
    let acquired = tokio::select! {
        r = multi.lock_observed(timeout, Some(&progress_tx)) => Some(r),
        _ = sigint.recv() => None,
        _ = sigterm.recv() => None,
    };
    if let Some(task) = status_line {
        task.abort();
        eprint!("\r\x1b[K");
    }
    // Locks and guards hold clones of the session; `close` only takes effect once all are gone.
    drop(multi);
    let path = shown;
    let guard = match acquired {
        None => {
            // Interrupted while waiting: our queue node is removed on drop; closing the session
            // makes sure the server has done it before we exit.
            client.close(Duration::from_secs(2)).await;
            eprintln!("distlock: interrupted while waiting for {path}");
            return Ok(130);
        }
        Some(Err(e)) => return Err(e.into()),
        Some(Ok(None)) => {
            eprintln!("distlock: {path} is held by someone else; not acquired");
            client.close(Duration::from_secs(2)).await;
            return Ok(args.conflict_exit_code);
        }
        Some(Ok(Some(g))) => g,
    };
    let keys: Vec<String> = guard.parts().iter().map(|p| p.lock_path()).collect();
    let tokens: Vec<String> = guard.parts().iter().map(|p| p.fencing_token().to_string()).collect();
    tracing::info!(lock = %path, tokens = %tokens.join(","), "acquired");

    // The lock's lease bounds how long the command may run once the server stops answering:
    // SIGTERM early enough that SIGKILL lands before the lease deadline, whatever --grace says.
    let session = client.session_timeout();
    let grace = args.grace.min(session / 4);
    let kill_margin = (session / 20).min(Duration::from_millis(500));
    if grace < args.grace {
        tracing::debug!(?grace, "--grace cut to a quarter of the session timeout");
    }

    // Every signal that exec forwards is caught before the command starts.
    let mut sighup = signal(SignalKind::hangup())?;
    let mut sigquit = signal(SignalKind::quit())?;
    let mut sigusr1 = signal(SignalKind::user_defined1())?;
    let mut sigusr2 = signal(SignalKind::user_defined2())?;
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("DISTLOCK_KEY", keys.join(","))
        .env("DISTLOCK_TOKEN", tokens.join(","))
        .process_group(0);
    let terminal = Terminal::foreground();
    if terminal.is_some() {
        // The command's group takes the terminal, as a shell gives it to a foreground job: it
        // reads the terminal and gets Ctrl-C itself (once).
        // SAFETY: only async-signal-safe calls (signal, tcsetpgrp, getpid) between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                libc::tcsetpgrp(0, libc::getpid());
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                Ok(())
            });
        }
    }
    let mut child = command.spawn().with_context(|| format!("cannot run {:?}", args.command[0]))?;
    let pgid = child.id().map(|p| p as libc::pid_t).unwrap_or(0);
    let watchdog = crate::supervise::Watchdog::start(pgid, grace + kill_margin)?;
    let to_group = |sig| {
        if pgid > 1 {
            crate::supervise::signal_group(pgid, sig);
        }
    };

    let lost = guard.lost();
    tokio::pin!(lost);
    let far = || Instant::now() + Duration::from_secs(86400);
    let lost_reason: Option<String> = loop {
        let lease_deadline = guard.lease_deadline().unwrap_or_else(far);
        let term_at = lease_deadline.checked_sub(grace + kill_margin).unwrap_or_else(Instant::now);
        tokio::select! {
            status = child.wait() => {
                let status = status?;
                command_ended(watchdog, terminal);
                guard.release().await.unwrap_or_else(|e| eprintln!("distlock: releasing {path}: {e}"));
                client.close(Duration::from_secs(2)).await;
                return Ok(exit_code(status));
            }
            _ = sigint.recv() => to_group(libc::SIGINT),
            _ = sigterm.recv() => to_group(libc::SIGTERM),
            _ = sighup.recv() => to_group(libc::SIGHUP),
            _ = sigquit.recv() => to_group(libc::SIGQUIT),
            _ = sigusr1.recv() => to_group(libc::SIGUSR1),
            _ = sigusr2.recv() => to_group(libc::SIGUSR2),
            reason = &mut lost => break Some(reason.to_string()),
            _ = tokio::time::sleep_until(term_at.into()) => {
                let left = guard.lease_deadline().unwrap_or_else(far).saturating_duration_since(Instant::now());
                if left <= grace + kill_margin {
                    break Some(format!("no answer from ZooKeeper; the lease ends in {}", humantime::format_duration(Duration::from_millis(left.as_millis() as u64))));
                }
            }
        }
    };
    let reason = lost_reason.unwrap_or_default();
    // Lost, or about to be: stop the command group before anyone else can hold the lock.
    let kill_at = guard.lease_deadline().unwrap_or_else(far).checked_sub(kill_margin).unwrap_or_else(Instant::now);
    match args.on_lost {
        OnLost::Ignore => {
            eprintln!("distlock: WARNING: lock {path} lost ({reason}); the command keeps running WITHOUT the lock (--on-lost ignore)");
            drop(guard);
            let status = child.wait().await?;
            command_ended(watchdog, terminal);
            client.close(Duration::from_secs(2)).await;
            return Ok(exit_code(status));
        }
        OnLost::Kill => {
            eprintln!("distlock: lock {path} lost ({reason}); killing the command");
            to_group(libc::SIGKILL);
        }
        OnLost::Term => {
            let kill_at = kill_at.min(Instant::now() + grace);
            eprintln!(
                "distlock: lock {path} lost ({reason}); terminating the command (SIGTERM, SIGKILL after {})",
                humantime::format_duration(Duration::from_millis(
                    kill_at.saturating_duration_since(Instant::now()).as_millis() as u64
                ))
            );
            to_group(libc::SIGTERM);
            if tokio::time::timeout_at(kill_at.into(), child.wait()).await.is_err() {
                eprintln!("distlock: the command outlived the grace period; SIGKILL");
                to_group(libc::SIGKILL);
            }
        }
    }
    // The rest of the group too (a command may exit and leave children behind).
    to_group(libc::SIGKILL);
    child.wait().await?;
    command_ended(watchdog, terminal);
    // Every other lock of a multi-lock is released now, not when the session ends.
    drop(guard);
    client.close(Duration::from_secs(2)).await;
    Ok(EXIT_LOST)
}

/// The command's group is gone: the watchdog stands down and the terminal comes back to us.
fn command_ended(watchdog: crate::supervise::Watchdog, terminal: Option<Terminal>) {
    watchdog.disarm();
    if let Some(t) = terminal {
        t.take_back();
    }
}

/// The controlling terminal, when our process group is its foreground group (we were started in
/// the foreground of an interactive shell): the command's group is given the terminal, and it is
/// taken back when the command ends.
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

async fn show_status(path: String, mut progress: watch::Receiver<QueueStatus>, started: Instant) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let s = *progress.borrow_and_update();
        let elapsed = started.elapsed().as_secs_f64();
        if s.queue_len == 0 {
            eprint!("\r\x1b[Kdistlock: waiting for {path} ({elapsed:.1}s)");
        } else {
            eprint!(
                "\r\x1b[Kdistlock: waiting for {path}: {} ahead of us, queue of {} ({elapsed:.1}s)",
                s.ahead, s.queue_len
            );
        }
    }
}

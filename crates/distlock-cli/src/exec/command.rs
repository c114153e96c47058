//! Running the command under what is held: started in a process group of its own after the
//! watchdog that ends it should distlock die, given the terminal when distlock has it, passed
//! every signal, and stopped before the server can hand the lock on (SIGTERM early enough that
//! SIGKILL lands before the lease ends; SIGKILL at once when the lock is already lost).

use super::acquire::{acquire, Acquired};
use super::plan::Plan;
use super::signals::{die_of, interrupt_our_group, Signals};
use super::terminal::Terminal;
use super::{CommandArgs, OnLost};
use crate::supervise::{group_alive, members, signal_group, Watchdog};
use crate::EXIT_LOST;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// Exit status of a command that could not be found (as shells report it).
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit status of a command that was found but could not be run.
pub const EXIT_CANNOT_RUN: u8 = 126;

/// How often a command's leftover process group is checked for having ended (a process group has
/// no event to wait on once its leader is reaped).
const GROUP_POLL: Duration = Duration::from_millis(50);

/// Runs the command `cmd` names under what `plan` takes; the exit status.
pub async fn exec(plan: Plan, cmd: CommandArgs) -> anyhow::Result<u8> {
    let argv = argv(&cmd, &plan)?;
    if plan.is_job() && cmd.on_lost == OnLost::Ignore {
        anyhow::bail!(
            "--on-lost ignore cannot go with a scheduled job (--once-per, --at-most-for): past its bound the job \
             may be another's, so the command is always stopped there"
        );
    }
    let mut signals = Signals::new()?;
    plan.start_record("exec")?;
    let held = match acquire(&plan, &mut signals).await? {
        Ok(held) => held,
        Err(code) => return Ok(code),
    };
    tracing::info!(lock = %held.shown, tokens = %held.env()[1].1, "acquired");
    let bounds = Bounds::of(&held, cmd.grace)?;
    signals.forget_pending();
    let mut running = match Running::spawn(&argv, &held, &bounds) {
        Ok(Ok(running)) => running,
        Ok(Err(code)) => {
            held.release().await;
            return Ok(code);
        }
        Err(e) => {
            held.release().await;
            return Err(e);
        }
    };
    let Some((reason, already_lost)) = running.supervise(&held, &mut signals, &bounds).await? else {
        return running.ended(held).await;
    };
    crate::textfile::lost(&reason);
    running.stop(held, &bounds, cmd.on_lost, &reason, already_lost).await
}

/// What to run: COMMAND after --, or `sh -c STRING`.
fn argv(cmd: &CommandArgs, plan: &Plan) -> anyhow::Result<Vec<String>> {
    let locks = plan.target.names();
    match &cmd.command_string {
        Some(s) => {
            // `exec L -c make all` would run `sh -c make` holding a second lock named `all`.
            let words: Vec<String> = std::env::args().collect();
            if let Some(c) = words.iter().position(|w| w == "-c" || w == "--command") {
                if let Some(extra) = words[c + 2..].iter().take_while(|w| *w != "--").find(|w| locks.contains(w)) {
                    anyhow::bail!(
                        "{extra:?} comes after -c STRING: put the locks before -c, and the whole shell command in one quoted STRING"
                    );
                }
            }
            Ok(vec!["sh".into(), "-c".into(), s.clone()])
        }
        None if !cmd.command.is_empty() => Ok(cmd.command.clone()),
        None => {
            let hint = if locks.len() > 1 {
                format!(" (without --, {:?} is read as a second lock)", locks[1..].join(" "))
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

/// The times that bound the command once the server stops answering.
struct Bounds {
    /// The lock's lease, or a scheduled job's `--at-most-for` (counted from its start).
    session: Duration,
    /// `--grace`, cut to a quarter of `session`, so that SIGKILL lands before the lease ends.
    grace: Duration,
    /// How long before the lease deadline SIGKILL must have landed.
    kill_margin: Duration,
}

impl Bounds {
    fn of(held: &Acquired, grace: Duration) -> anyhow::Result<Bounds> {
        let session = match &held.job {
            Some(job) => job.at_most()?,
            None => held.client.lease(),
        };
        let cut = grace.min(session / 4);
        if cut < grace {
            tracing::debug!(grace = ?cut, "--grace cut to a quarter of the session timeout");
        }
        Ok(Bounds { session, grace: cut, kill_margin: (session / 20).min(Duration::from_millis(500)) })
    }
}

/// A day from now: the deadline of a lock without a lease.
fn far() -> Instant {
    Instant::now() + Duration::from_secs(86400)
}

/// The command, running in its process group under the watchdog.
struct Running {
    child: tokio::process::Child,
    pgid: libc::pid_t,
    watchdog: Watchdog,
    terminal: Option<Terminal>,
    had_terminal: bool,
    /// The command's own status, once it has exited (its leftovers may still run).
    status: Option<ExitStatus>,
}

impl Running {
    /// Starts the command; `Ok(Err(status))` when it cannot be run (127 not found, 126 not
    /// runnable: as shells say).
    fn spawn(argv: &[String], held: &Acquired, bounds: &Bounds) -> anyhow::Result<Result<Running, u8>> {
        let mut command = tokio::process::Command::new(&argv[0]);
        command.args(&argv[1..]).envs(held.env()).process_group(0);
        if crate::backend_env_has_secret() {
            command.env_remove("DISTLOCK_BACKEND");
        }
        // A job's bound holds on the server whatever happens to us: the watchdog keeps it too.
        let kill_by = held.job.as_ref().map(|_| {
            let deadline = held.guard.lease_deadline().unwrap_or_else(Instant::now);
            deadline.checked_sub(bounds.kill_margin).unwrap_or_else(Instant::now)
        });
        // The watchdog first: nothing would end the command if we died before it ran.
        let watchdog = Watchdog::start(bounds.grace + bounds.kill_margin, kill_by).map_err(|e| {
            anyhow::anyhow!(
                "cannot start the watchdog that ends the command if distlock dies ({e}); the command was not run"
            )
        })?;
        // SAFETY: report_group makes only async-signal-safe calls (getpid, write).
        unsafe {
            command.pre_exec(watchdog.report_group());
        }
        let terminal = Terminal::foreground();
        if terminal.is_some() {
            give_terminal(&mut command);
        }
        match command.spawn() {
            Ok(child) => {
                let pgid = child.id().map(|p| p as libc::pid_t).unwrap_or(0);
                let had_terminal = terminal.is_some();
                Ok(Ok(Running { child, pgid, watchdog, terminal, had_terminal, status: None }))
            }
            Err(e) => {
                let code = cannot_run(&argv[0], &e);
                watchdog.disarm();
                if let Some(t) = terminal {
                    t.take_back(); // the failed child may have taken it before its exec failed
                }
                Ok(Err(code))
            }
        }
    }

    fn to_group(&self, sig: libc::c_int) {
        if self.pgid > 1 {
            signal_group(self.pgid, sig);
        }
    }

    /// Runs until the command and what it left in its group have ended (`None`), or the lock is
    /// lost or about to be (the reason, and whether it is lost already). Signals are passed on;
    /// INT or TERM after the command itself exited go to its leftovers, a second one kills them.
    async fn supervise(
        &mut self,
        held: &Acquired,
        signals: &mut Signals,
        bounds: &Bounds,
    ) -> anyhow::Result<Option<(String, bool)>> {
        let lost = held.guard.lost();
        tokio::pin!(lost);
        let mut late_signals = 0;
        let margin = bounds.grace + bounds.kill_margin;
        loop {
            let lease_deadline = held.guard.lease_deadline().unwrap_or_else(far);
            let term_at = lease_deadline.checked_sub(margin).unwrap_or_else(Instant::now);
            tokio::select! {
                s = self.child.wait(), if self.status.is_none() => {
                    self.status = Some(s?);
                    if let Some(t) = self.terminal.take() {
                        t.take_back();
                    }
                    if !group_alive(self.pgid) {
                        return Ok(None);
                    }
                    let left: Vec<String> = members(self.pgid).iter().map(|p| p.to_string()).collect();
                    crate::shown::say!(
                        "distlock: the command exited; {} stays held until the processes it left behind end \
                         (process group {}: {}); INT or TERM passes on to them, a second one kills them",
                        held.shown, self.pgid, left.join(" ")
                    );
                }
                _ = tokio::time::sleep(GROUP_POLL), if self.status.is_some() => {
                    if !group_alive(self.pgid) {
                        return Ok(None);
                    }
                }
                sig = signals.any() => {
                    if self.status.is_some() && (sig == libc::SIGINT || sig == libc::SIGTERM) {
                        late_signals += 1;
                        self.to_group(if late_signals > 1 { libc::SIGKILL } else { libc::SIGTERM });
                    } else {
                        self.to_group(sig);
                    }
                }
                reason = &mut lost => return Ok(Some((reason.to_string(), true))),
                _ = tokio::time::sleep_until(term_at.into()) => {
                    let left = held.guard.lease_deadline().unwrap_or_else(far).saturating_duration_since(Instant::now());
                    if left <= margin {
                        let left = humantime::format_duration(Duration::from_millis(left.as_millis() as u64));
                        return Ok(Some((if held.job.is_some() {
                            format!("the job's bound (--at-most-for {}) ends in {left}", humantime::format_duration(bounds.session))
                        } else {
                            format!("no answer from the server; the lease ends in {left}")
                        }, false)));
                    }
                }
            }
        }
    }

    /// The command and its group ended under the lock: records the job's end, releases, and
    /// exits as the command did. Killed by Ctrl-C (or Ctrl-\), distlock dies the same way, so that
    /// a calling shell stops its script; when the command had the terminal, the keypress reached
    /// only its group and is passed on to ours, as the terminal would have done.
    async fn ended(self, held: Acquired) -> anyhow::Result<u8> {
        let Running { watchdog, terminal, had_terminal, status, .. } = self;
        command_ended(watchdog, terminal);
        let status = status.expect("the command ends before its group");
        record_exit(&held, exit_code(status)).await;
        let released = held.release().await;
        if let Some(sig @ (libc::SIGINT | libc::SIGQUIT)) = std::os::unix::process::ExitStatusExt::signal(&status) {
            if had_terminal {
                interrupt_our_group(sig);
            }
            die_of(sig);
        }
        Ok(released.status(exit_code(status)))
    }

    /// Lost, or about to be: stops the command group before anyone else can hold the lock. A
    /// lock reported lost may be someone else's already (the server ended our session, the key
    /// was deleted): no grace is left, whatever the lease deadline says. Only a lock about to be
    /// lost (the server silent, the lease running out) leaves time for SIGTERM to work.
    async fn stop(
        mut self,
        held: Acquired,
        bounds: &Bounds,
        asked: OnLost,
        reason: &str,
        already_lost: bool,
    ) -> anyhow::Result<u8> {
        let kill_at = if already_lost {
            Instant::now()
        } else {
            held.guard.lease_deadline().unwrap_or_else(far).checked_sub(bounds.kill_margin).unwrap_or_else(Instant::now)
        };
        let on_lost = if already_lost && asked == OnLost::Term { OnLost::Kill } else { asked };
        // A job's bound coming is no loss of a lock: it is said as what it is.
        let what = if held.job.is_some() && !already_lost {
            format!("job {}: {reason}", held.shown)
        } else {
            format!("lock {} lost ({reason})", held.shown)
        };
        match on_lost {
            OnLost::Ignore => {
                crate::shown::say!(
                    "distlock: WARNING: {what}; the command keeps running WITHOUT the lock (--on-lost ignore)"
                );
                let Acquired { client, guard, .. } = held;
                drop(guard);
                let status = group_ended(&mut self.child, self.pgid).await?;
                command_ended(self.watchdog, self.terminal);
                client.close(Duration::from_secs(2)).await;
                return Ok(exit_code(status));
            }
            OnLost::Kill => {
                let why =
                    if asked == OnLost::Term { " at once (it may be held by another already: no grace)" } else { "" };
                crate::shown::say!("distlock: {what}; killing the command{why}");
                self.to_group(libc::SIGKILL);
            }
            OnLost::Term => {
                let kill_at = kill_at.min(Instant::now() + bounds.grace);
                let grace = Duration::from_millis(kill_at.saturating_duration_since(Instant::now()).as_millis() as u64);
                crate::shown::say!(
                    "distlock: {what}; terminating the command (SIGTERM, SIGKILL after {})",
                    humantime::format_duration(grace)
                );
                self.to_group(libc::SIGTERM);
                if tokio::time::timeout_at(kill_at.into(), group_ended(&mut self.child, self.pgid)).await.is_err() {
                    crate::shown::say!("distlock: the command outlived the grace period; SIGKILL");
                }
            }
        }
        // Whatever is left of the group (a command may exit and leave children behind).
        self.to_group(libc::SIGKILL);
        let status = self.child.wait().await?;
        command_ended(self.watchdog, self.terminal);
        record_exit(&held, exit_code(status)).await;
        // Every other lock of a multi-lock is released now, not when the session ends.
        held.release().await;
        Ok(EXIT_LOST)
    }
}

/// The command's group takes the terminal, as a shell gives it to a foreground job: it reads the
/// terminal and gets Ctrl-C itself (once). Ctrl-Z is ignored by the command: a stopped group that
/// owns the terminal would hang the shell with the lock held (distlock cannot stop and resume
/// with it, as sudo does).
fn give_terminal(command: &mut tokio::process::Command) {
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

/// Says why `program` could not be run; the exit status a shell would give.
fn cannot_run(program: &str, e: &std::io::Error) -> u8 {
    let exists = program.contains('/') && std::path::Path::new(program).exists();
    let (code, why) = match e.kind() {
        // The file is there but its #! interpreter is not (as a shell says: 126).
        std::io::ErrorKind::NotFound if exists => (EXIT_CANNOT_RUN, "bad interpreter (see its #! line)".into()),
        std::io::ErrorKind::NotFound => (EXIT_NOT_FOUND, "command not found".to_string()),
        std::io::ErrorKind::PermissionDenied => (EXIT_CANNOT_RUN, "permission denied (not executable?)".into()),
        _ => (EXIT_CANNOT_RUN, e.to_string()),
    };
    crate::shown::say!("distlock: cannot run {program:?}: {why}");
    code
}

/// Records a scheduled job's end and exit status (nothing for a lock): a run whose bound passed
/// and whose job another start took by now is not recorded (the record is the other run's).
async fn record_exit(held: &Acquired, code: u8) {
    let Some(job) = &held.job else { return };
    let token = held.guard.parts().first().map(|p| p.fencing_token()).unwrap_or_default();
    match job.finish_run(token, Some(i32::from(code))).await {
        Ok(true) => {}
        Ok(false) => {
            crate::shown::say!(
                "distlock: {}: the record is another run's by now; this run's end is not recorded",
                job.name()
            )
        }
        Err(e) => crate::shown::say!("distlock: {}: recording the run's end failed: {e}", job.name()),
    }
}

/// Waits until the command has exited and its whole process group has ended.
async fn group_ended(child: &mut tokio::process::Child, pgid: libc::pid_t) -> std::io::Result<ExitStatus> {
    let status = child.wait().await?;
    while group_alive(pgid) {
        tokio::time::sleep(GROUP_POLL).await;
    }
    Ok(status)
}

/// The command's group is gone: the watchdog stands down and the terminal comes back to us.
fn command_ended(watchdog: Watchdog, terminal: Option<Terminal>) {
    watchdog.disarm();
    if let Some(t) = terminal {
        t.take_back();
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

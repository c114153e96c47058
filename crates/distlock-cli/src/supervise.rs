//! Keeping the command's process group from outliving `distlock exec`.
//!
//! The command runs in a process group of its own. A **watchdog**, a second `distlock` process
//! (`distlock supervise`, hidden) in yet another group, reads a pipe whose only write end
//! `distlock exec` holds. It is started before the command; the command's process, between its
//! fork and its exec, writes its group (`group PGID`) to the pipe, so there is no moment in which
//! the command runs unwatched (a `distlock exec` killed right after starting it left the command
//! running for good). When `exec` ends normally it writes `done` first and the watchdog just
//! exits. When `exec` dies any other way, SIGKILL included, the kernel closes the pipe and the
//! watchdog sees end-of-file without `done`: it sends SIGTERM to the whole command group and
//! SIGKILL after the grace period, which `exec` has already cut to fit the lock's lease.
//!
//! A scheduled job's run has a bound the server keeps whatever happens to us (its
//! `--at-most-for`): the watchdog is then also given that instant (on `CLOCK_MONOTONIC`, which
//! every process of the machine shares) and kills the group there itself, so that a `distlock
//! exec` that died late, or is stopped (SIGSTOP), cannot let the command outlive the bound.
//!
//! Why a watchdog and not `PR_SET_PDEATHSIG`: the death signal reaches only the direct child, not
//! what it started, and it fires when the *thread* that forked exits, which in a multi-threaded
//! runtime can happen while `exec` lives on. A pipe's end-of-file is certain and immediate.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The `exec` side of the watchdog.
pub struct Watchdog {
    pipe: Option<ChildStdin>,
    child: Child,
}

impl Watchdog {
    /// Starts a watchdog that kills the command's process group within `kill_after` of our
    /// death, and at `kill_at` at the latest if given (whatever happens to us). It is started
    /// before the command: the command's process, between its fork and its exec, writes its
    /// group to the watchdog ([`Watchdog::report_group`]), so that no moment exists in which the
    /// command runs and nothing would end it if we died.
    pub fn start(kill_after: Duration, kill_at: Option<Instant>) -> anyhow::Result<Watchdog> {
        // /proc/self/exe works even when our binary was replaced or removed meanwhile (a package
        // upgrade during a long wait), where the path current_exe() gives would not.
        let exe = match std::path::Path::new("/proc/self/exe") {
            p if p.exists() => p.to_path_buf(),
            _ => std::env::current_exe()?,
        };
        let mut args = vec!["supervise".to_string(), format!("{}ms", kill_after.as_millis())];
        if let Some(at) = kill_at {
            let ms = monotonic_ms() + at.saturating_duration_since(Instant::now()).as_millis() as u64;
            args.extend(["--kill-at-monotonic-ms".to_string(), ms.to_string()]);
        }
        let mut command = Command::new(exe);
        command.args(&args).stdin(Stdio::piped()).stdout(Stdio::null()).process_group(0);
        if crate::backend_env_has_secret() {
            command.env_remove("DISTLOCK_BACKEND");
        }
        let mut child = command.spawn()?;
        let pipe = child.stdin.take();
        Ok(Watchdog { pipe, child })
    }

    /// What the command's process calls between fork and exec (`pre_exec`): writes
    /// `group PGID` to the watchdog. Only async-signal-safe calls (getpid, write).
    pub fn report_group(&self) -> impl Fn() -> std::io::Result<()> + Send + Sync + 'static {
        use std::os::fd::AsRawFd;
        let fd = self.pipe.as_ref().map_or(-1, |p| p.as_raw_fd());
        move || {
            // The line is built on the stack: no allocation after fork.
            let mut line = *b"group 0000000000\n";
            // SAFETY: getpid and write are async-signal-safe; `line` is a local buffer.
            let mut pid = unsafe { libc::getpid() } as u32;
            for i in (6..16).rev() {
                line[i] = b'0' + (pid % 10) as u8;
                pid /= 10;
            }
            let written = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
            if written == line.len() as isize {
                Ok(())
            } else {
                // No watchdog to tell: the command must not run.
                Err(std::io::Error::other("the watchdog is not listening"))
            }
        }
    }

    /// `exec` is ending normally: the watchdog leaves the group alone.
    pub fn disarm(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = pipe.write_all(b"done\n");
        }
        let _ = self.child.wait();
    }
}

/// Sends `sig` to every process of group `pgid`.
pub fn signal_group(pgid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) on a process group we created, with a valid signal number.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Whether any process of group `pgid` is still alive. Zombies do not count: an orphaned member
/// that has exited stays in the group until its new parent reaps it, which some init processes
/// (a container's) do late or never.
pub fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the group exists.
    if unsafe { libc::kill(-pgid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false; // ESRCH: no such group (EPERM: members we may not signal, e.g. setuid)
    }
    live_members(pgid).is_none_or(|n| n > 0)
}

/// Pids of the live members of group `pgid` (empty where `/proc` cannot be read).
pub fn members(pgid: libc::pid_t) -> Vec<u32> {
    let mut pids = Vec::new();
    scan_group(pgid, |pid| pids.push(pid));
    pids.sort_unstable();
    pids
}

/// Members of group `pgid` that have not exited, from `/proc` (`None` where it cannot be read).
fn live_members(pgid: libc::pid_t) -> Option<usize> {
    let mut live = 0;
    scan_group(pgid, |_| live += 1).then_some(live)
}

/// Calls `found` with each live (not zombie) member of group `pgid`; false if `/proc` is unreadable.
fn scan_group(pgid: libc::pid_t, mut found: impl FnMut(u32)) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // "pid (comm) state ppid pgrp ...": comm may hold anything, so read after its last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|g| g.parse::<libc::pid_t>().ok());
        if pgrp == Some(pgid) && !matches!(state, Some("Z" | "X")) {
            found(pid);
        }
    }
    true
}

/// This machine's `CLOCK_MONOTONIC` in milliseconds (shared by every process).
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// What the watchdog hears on its pipe.
enum Heard {
    /// The command's process group (written by the command's process before its exec).
    Group(libc::pid_t),
    /// The pipe closed: `true` if exec said "done" first (a normal end), `false` if it died.
    End(bool),
}

/// `distlock supervise KILL_AFTER [--kill-at-monotonic-ms MS]`: the watchdog itself. Returns its
/// exit status.
pub fn run(kill_after: Duration, kill_at: Option<u64>) -> u8 {
    // Terminal hang-ups and interrupts are for the command and for exec, not for us.
    // SAFETY: setting signal dispositions to SIG_IGN before any thread is started.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    // The pipe is read on a thread, so that the bound (if any) is kept while exec lives.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut done = false;
        for line in std::io::BufRead::lines(std::io::stdin().lock()) {
            let Ok(line) = line else { break };
            if let Some(pgid) = line.strip_prefix("group ").and_then(|g| g.trim().parse().ok()) {
                let _ = tx.send(Heard::Group(pgid));
            } else if line == "done" {
                done = true;
            }
        }
        let _ = tx.send(Heard::End(done));
    });
    let bound = kill_at.map(|ms| Instant::now() + Duration::from_millis(ms.saturating_sub(monotonic_ms())));
    let mut pgid: libc::pid_t = 0;
    let done = loop {
        let heard = match bound {
            None => rx.recv().unwrap_or(Heard::End(false)),
            Some(bound) => match rx.recv_timeout(bound.saturating_duration_since(Instant::now())) {
                Ok(heard) => heard,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Heard::End(false),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // exec should have ended the command by now: the bound is kept here.
                    if pgid > 1 && group_alive(pgid) {
                        crate::shown::say!("distlock: the job's bound came with its command still running; killing process group {pgid}");
                        signal_group(pgid, libc::SIGKILL);
                    }
                    while let Ok(heard) = rx.recv() {
                        if matches!(heard, Heard::End(_)) {
                            break;
                        }
                    }
                    return 0;
                }
            },
        };
        match heard {
            Heard::Group(g) => pgid = g,
            Heard::End(done) => break done,
        }
    };
    if done || pgid <= 1 {
        return 0;
    }
    crate::shown::say!(
        "distlock: distlock exec ended without releasing; terminating its command (process group {pgid})"
    );
    signal_group(pgid, libc::SIGTERM);
    let deadline = bound.map_or(Instant::now() + kill_after, |b| b.min(Instant::now() + kill_after));
    while group_alive(pgid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20)); // polling a process group: no event to wait on
    }
    if group_alive(pgid) {
        signal_group(pgid, libc::SIGKILL);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose only member has exited but is not reaped yet (a zombie) has ended.
    #[test]
    fn a_group_of_zombies_has_ended() {
        let mut child = Command::new("true").process_group(0).spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            if stat.rsplit_once(')').unwrap().1.trim_start().starts_with('Z') {
                break;
            }
            assert!(Instant::now() < deadline, "the child never exited");
            std::thread::sleep(Duration::from_millis(10)); // polling a process state: no event to wait on
        }
        // SAFETY: signal 0 only checks that the group exists.
        assert_eq!(unsafe { libc::kill(-pid, 0) }, 0, "the zombie is still in its group");
        assert!(!group_alive(pid));
        child.wait().unwrap();
        let mut live = Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        assert!(group_alive(live.id() as libc::pid_t));
        live.kill().unwrap();
        live.wait().unwrap();
    }
}

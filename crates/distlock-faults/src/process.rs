//! Process faults: stop-the-world pauses and crashes, by signal.
//!
//! [`pause`] (SIGSTOP) freezes a process the way a long garbage-collection pause or a swapped-out
//! VM would: its sockets stay open but it answers nothing, its timers do not run, and when
//! [`resume`]d (SIGCONT) it carries on as if no time had passed. [`kill`] (SIGKILL) is a crash
//! with no chance to clean up.
//!
//! Only signal processes the test started itself (a server it spawned, a child client).

use std::io;

fn signal(pid: u32, sig: libc::c_int, name: &str) -> io::Result<()> {
    // pid 0 and negative pids address process groups; never let a bad pid widen the blast.
    let target = match libc::pid_t::try_from(pid) {
        Ok(p) if p > 0 => p,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name} to pid {pid}: not a process id"))),
    };
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    if unsafe { libc::kill(target, sig) } == 0 {
        Ok(())
    } else {
        let err = io::Error::last_os_error();
        Err(io::Error::new(err.kind(), format!("{name} to pid {pid}: {err}")))
    }
}

/// Freezes process `pid` (SIGSTOP) until [`resume`].
///
/// # Errors
///
/// When the signal cannot be sent (no such process, not permitted, pid 0 or too large); the
/// message names the pid.
///
/// # Examples
///
/// ```no_run
/// # fn demo(server_pid: u32) -> std::io::Result<()> {
/// distlock_faults::pause(server_pid)?;
/// std::thread::sleep(std::time::Duration::from_secs(3)); // longer than the session timeout
/// distlock_faults::resume(server_pid)?;
/// # Ok(()) }
/// ```
pub fn pause(pid: u32) -> io::Result<()> {
    signal(pid, libc::SIGSTOP, "SIGSTOP")
}

/// Lets a paused process `pid` run again (SIGCONT).
///
/// # Errors
///
/// When the signal cannot be sent; the message names the pid.
///
/// # Examples
///
/// ```
/// let err = distlock_faults::resume(0).unwrap_err();
/// assert!(err.to_string().contains("pid 0"));
/// ```
pub fn resume(pid: u32) -> io::Result<()> {
    signal(pid, libc::SIGCONT, "SIGCONT")
}

/// Kills process `pid` at once (SIGKILL): a crash, no cleanup. The caller still has to reap its
/// own child (for example with `Child::wait`).
///
/// # Errors
///
/// When the signal cannot be sent; the message names the pid.
///
/// # Examples
///
/// ```
/// let mut child = std::process::Command::new("sleep").arg("30").spawn()?;
/// distlock_faults::kill(child.id())?;
/// assert!(!child.wait()?.success());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn kill(pid: u32) -> io::Result<()> {
    signal(pid, libc::SIGKILL, "SIGKILL")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    #[test]
    fn pause_resume_and_kill_a_child() {
        let mut child = Command::new("sleep").arg("30").stdout(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        pause(pid).unwrap();
        resume(pid).unwrap();
        kill(pid).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn errors_name_the_pid() {
        for pid in [0, u32::MAX] {
            let err = pause(pid).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
            assert!(err.to_string().contains(&format!("pid {pid}")), "{err}");
        }
        // A pid that does not exist (above the kernel's pid_max default range).
        let missing = 4_194_304 + 17;
        let err = kill(missing).unwrap_err();
        assert!(err.to_string().contains(&format!("SIGKILL to pid {missing}")), "{err}");
    }
}

/// A child process whose standard output and error are read on threads of their own (so that it
/// never blocks on a full pipe), and whose end a test awaits with a bound.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let out = distlock_faults::process::run_bounded(std::process::Command::new("echo").arg("hi"), Duration::from_secs(10));
/// assert_eq!(out.stdout, b"hi\n");
/// ```
#[derive(Debug)]
pub struct Running {
    child: std::process::Child,
    what: String,
    stdout: std::thread::JoinHandle<Vec<u8>>,
    stderr: std::thread::JoinHandle<Vec<u8>>,
}

impl Running {
    /// Starts `cmd` with standard input closed and its output collected.
    ///
    /// # Panics
    ///
    /// If the command cannot be started.
    pub fn start(cmd: &mut std::process::Command) -> Running {
        use std::process::Stdio;
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let drain = |mut r: Box<dyn io::Read + Send>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = r.read_to_end(&mut v);
                v
            })
        };
        let stdout = drain(Box::new(child.stdout.take().unwrap()));
        let stderr = drain(Box::new(child.stderr.take().unwrap()));
        Running { child, what: format!("{cmd:?}"), stdout, stderr }
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the end, which must come within `bound`.
    ///
    /// # Panics
    ///
    /// If it does not (the child is killed first).
    pub fn finish(mut self, bound: std::time::Duration) -> std::process::Output {
        let deadline = std::time::Instant::now() + bound;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() >= deadline {
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                panic!("{} did not end within {bound:?}", self.what);
            }
            std::thread::sleep(std::time::Duration::from_millis(20)); // polling a process exit: no event to wait on
        };
        std::process::Output { status, stdout: self.stdout.join().unwrap(), stderr: self.stderr.join().unwrap() }
    }
}

/// Runs `cmd` to its end, which must come within `bound` (see [`Running`]).
pub fn run_bounded(cmd: &mut std::process::Command, bound: std::time::Duration) -> std::process::Output {
    Running::start(cmd).finish(bound)
}

/// A scratch directory of a test's own under the temporary directory, removed when dropped.
#[derive(Debug)]
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    /// A new, empty directory.
    ///
    /// # Panics
    ///
    /// If it cannot be made.
    pub fn new() -> Scratch {
        let p = std::env::temp_dir().join(format!("distlock-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Default for Scratch {
    fn default() -> Scratch {
        Scratch::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

//! The signals `exec` and `hold` react to, caught from before the acquire on, and how distlock
//! ends by one: 128+N, or by the signal itself for INT and QUIT, as a shell expects.

use tokio::signal::unix::{signal, Signal, SignalKind};

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
    pub fn forget_pending(&mut self) {
        use futures::FutureExt;
        while self.usr1.recv().now_or_never().is_some() {}
        while self.usr2.recv().now_or_never().is_some() {}
    }

    /// The next signal to forward to the command.
    pub async fn any(&mut self) -> libc::c_int {
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

/// The exit status for a wait ended by `sig`: 128+N. For INT and QUIT distlock dies of the signal
/// itself instead (after cleaning up), as a shell expects of a program it ran when the user
/// pressed Ctrl-C, so that a calling script stops too.
pub fn interrupted(sig: libc::c_int) -> u8 {
    if sig == libc::SIGINT || sig == libc::SIGQUIT {
        die_of(sig);
    }
    128 + sig as u8
}

/// Sends `sig` to our own process group (us included: our disposition is set to the default
/// first, so we die of it).
pub fn interrupt_our_group(sig: libc::c_int) {
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
pub fn die_of(sig: libc::c_int) {
    use std::io::Write;
    crate::textfile::finish(128 + sig as u8);
    let _ = std::io::stderr().flush();
    // SAFETY: resetting a disposition to the default and raising a signal at ourselves.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

pub fn signal_name(sig: libc::c_int) -> &'static str {
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

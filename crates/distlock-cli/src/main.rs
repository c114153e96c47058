//! `distlock`: run commands under distributed locks, and look at them.
//!
//! Exit status: 0 success (for `exec`: the command's own status), 1 lock not acquired (or the
//! `-E` value), 2 usage or backend error, 3 the lock was lost while the command ran (the command
//! was terminated), 128+N when the command was killed by signal N.

mod alloc;
mod bench;
mod exec;
mod inspect;
mod serve;
mod supervise;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// Exit status when the lock was not acquired (flock's default).
pub const EXIT_NOT_ACQUIRED: u8 = 1;
/// Exit status for usage and backend errors.
pub const EXIT_ERROR: u8 = 2;
/// Exit status when the lock was lost while the command ran.
pub const EXIT_LOST: u8 = 3;

const DEFAULT_BACKEND: &str = "zk://127.0.0.1:2181";

#[derive(Parser, Debug)]
#[command(name = "distlock", version, about = "Run commands under distributed locks (ZooKeeper)")]
#[command(
    after_help = "EXIT STATUS:\n  0    success (exec: the command's own status)\n  1    lock not acquired (exec -E N changes it)\n  2    usage or backend error\n  3    lock lost while the command ran; the command was terminated\n  128+N  the command was killed by signal N\n\nLOCK is a znode path (/locks/orders) or a bare name (orders = /distlock/orders)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run COMMAND while holding LOCK (like flock(1), across machines).
    ///
    /// The command runs in a process group of its own; INT, TERM, HUP, QUIT, USR1 and USR2 sent
    /// to distlock are passed to the whole group. If distlock dies for any reason (SIGKILL
    /// included), a watchdog process terminates the group at once. If the lock is lost, or the
    /// server stops answering, the group gets SIGTERM early enough that SIGKILL lands before the
    /// lock's lease ends (before the server can give the lock to anyone else), whatever --grace
    /// says; distlock then exits 3.
    Exec(exec::ExecArgs),
    /// Show who holds LOCK and who waits for it, in queue order.
    Inspect(inspect::InspectArgs),
    /// Measure every lock against the server's own limit (create+delete pairs/s).
    Bench(bench::BenchArgs),
    /// Run the embedded single-node server that speaks the ZooKeeper client protocol.
    Serve(serve::ServeArgs),
    /// (internal) The watchdog `exec` starts: ends the command's process group if `exec` dies.
    #[command(hide = true)]
    Supervise {
        /// The command's process group.
        pgid: i32,
        /// SIGKILL this long after SIGTERM.
        #[arg(value_parser = duration_arg)]
        kill_after: Duration,
    },
}

/// Parses `500ms`, `10s`, `2m` for clap.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    distlock::parse_duration(s).map_err(|e| e.to_string())
}

/// Turns a LOCK argument into a znode path.
pub fn lock_path(lock: &str) -> Result<String, String> {
    if lock.is_empty() {
        return Err("the lock name is empty".into());
    }
    if lock.starts_with('/') {
        Ok(lock.to_string())
    } else if lock.contains('/') {
        Err(format!("invalid lock {lock:?}: a name without '/' or an absolute path like /locks/{lock}"))
    } else {
        Ok(format!("/distlock/{lock}"))
    }
}

/// The backend URL: the flag, then `$DISTLOCK_BACKEND` (empty counts as unset), then the default.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArg {
    /// Backend URL, e.g. zk://host:2181,host2:2181/chroot?session_timeout=10s
    #[arg(long, env = "DISTLOCK_BACKEND", default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// ZooKeeper session timeout (overrides the URL's session_timeout; default 10s). A lock held
    /// by a process that dies is passed on after about this long.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub session_timeout: Option<Duration>,
    /// Give up connecting after this long (overrides the URL's connect_timeout; default 10s).
    /// A refused connection is reported at once.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub connect_timeout: Option<Duration>,
}

impl BackendArg {
    /// The URL with the flags applied.
    pub fn url(&self) -> anyhow::Result<distlock::zookeeper::ZkUrl> {
        let mut url = distlock::zookeeper::ZkUrl::parse(backend_or_default(&self.backend))?;
        if let Some(t) = self.session_timeout {
            if t.is_zero() {
                anyhow::bail!("invalid --session-timeout: must be greater than zero");
            }
            url.session_timeout = t;
        }
        if let Some(t) = self.connect_timeout {
            if t.is_zero() {
                anyhow::bail!("invalid --connect-timeout: must be greater than zero");
            }
            url.connect_timeout = t;
        }
        if let Some(m) = url.lease_margin.filter(|m| *m >= url.session_timeout) {
            anyhow::bail!("lease_margin ({m:?}) must be shorter than the session timeout ({:?})", url.session_timeout);
        }
        Ok(url)
    }

    /// Connects with [`BackendArg::url`].
    pub async fn connect(&self) -> anyhow::Result<distlock::zookeeper::Client> {
        Ok(distlock::zookeeper::Client::connect_url(self.url()?).await?)
    }
}

/// `$DISTLOCK_BACKEND` set but empty means the default backend, as if unset.
pub fn backend_or_default(backend: &str) -> &str {
    if backend.trim().is_empty() {
        DEFAULT_BACKEND
    } else {
        backend
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Supervise { pgid, kill_after } = cli.command {
        // No runtime, no threads: the watchdog only reads a pipe and sends signals.
        return ExitCode::from(supervise::run(pgid, kill_after));
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("DISTLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock: cannot start runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let code = rt.block_on(async {
        match cli.command {
            Command::Exec(args) => exec::run(args).await,
            Command::Inspect(args) => inspect::run(args).await,
            Command::Serve(args) => serve::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Supervise { .. } => unreachable!("handled before the runtime starts"),
        }
    });
    match code {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("distlock: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

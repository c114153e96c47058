//! `distlock`: run commands under distributed locks, and look at them.
//!
//! Exit statuses: see `exec_help!` (printed by `distlock exec --help`).

mod elect;
mod exec;
mod hold;
mod inspect;
mod serve;
mod shown;
mod supervise;
mod textfile;
mod top;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;

/// Exit status when the lock was not acquired (flock's default).
pub const EXIT_NOT_ACQUIRED: u8 = 1;
/// Exit status for usage and backend errors.
pub const EXIT_ERROR: u8 = 2;
/// Exit status when the lock was lost while the command ran.
pub const EXIT_LOST: u8 = 3;

const DEFAULT_BACKEND: &str = "zk://127.0.0.1:2181";

/// The exit-status table and environment of `exec` and `hold`, printed in their help.
macro_rules! exec_help {
    () => {
        "EXIT STATUS:
  0      success (exec: the command exited 0); hold: released after stdin closed or INT/TERM/HUP
  1      the lock was not acquired (-n, or -w ran out); a scheduled job (--once-per) was not
         run: its slot had its run, or it runs elsewhere (stderr names who ran it and when);
         -E N changes it (e.g. -q -E 0 for a quiet cron)
  2      usage error, bad lock name, or backend error (unreachable server, expired session)
  3      the lock was lost while held, or a job's --at-most-for bound came; exec terminated
         the command first
  126    the command was found but could not be run (not executable)
  127    the command was not found
  128+N  exec: the command was killed by signal N; exec and hold: signal N (INT 130, TERM 143,
         HUP 129) arrived while waiting for the lock, which was not taken
  other  exec: the command's own exit status

ENVIRONMENT:
  DISTLOCK_BACKEND  backend URL when --backend is not given (empty or unset: zk://127.0.0.1:2181);
                    a URL of any backend (see --backend for their shapes); one
                    holding a password is not passed on to the command
  DISTLOCK_BACKEND_FILE  a file holding the backend URL (see --backend-file)
  DISTLOCK_LOG      log filter for messages on stderr, e.g. info, debug, distlock=trace (default warn)
  The command gets DISTLOCK_KEY (lock paths or keys), DISTLOCK_TOKEN (fencing tokens) and
  DISTLOCK_NODE (our lock nodes; on Redis our hash field or key value), each comma-separated in
  lock order (a \\ or , inside a name is written \\\\ or \\,); on etcd also ETCD_LOCK_KEY (our
  key) and ETCD_LOCK_REV (its create revision, the fencing token), as etcdctl lock names them;
  hold prints the same as KEY=value lines.
  A scheduled job's command also gets DISTLOCK_JOB_SLOT (with --once-per: the server's time
  divided by the period) and DISTLOCK_JOB_STARTED_MS (its start, the server's time in ms)."
    };
}

/// `elect`'s exit statuses and environment.
const ELECT_HELP: &str = "EXIT STATUS:
  0      the command exited 0; without a command: led until stdin closed or INT/TERM/HUP;
         with --observe: ended by a signal
  1      not elected (-n, or -w ran out); -E N changes it
  2      usage error, bad name, or backend error (unreachable server, expired session)
  3      the lead was lost while leading; the command was terminated first
  126    the command was found but could not be run (not executable)
  127    the command was not found
  128+N  the command was killed by signal N; or signal N arrived while campaigning
  other  the command's own exit status

ENVIRONMENT:
  DISTLOCK_BACKEND, DISTLOCK_BACKEND_FILE, DISTLOCK_LOG  as for exec (see exec --help)
  The command gets DISTLOCK_EPOCH (the leader's epoch: the fencing token, higher for every new
  leader), DISTLOCK_VALUE (the value announced), DISTLOCK_KEY and DISTLOCK_TOKEN (as exec's).";

/// Exit statuses of the subcommands that run no command.
const LEADER_EXIT: &str =
    "EXIT STATUS:\n  0  a leader: its value printed\n  1  nobody leads\n  2  usage or backend error";
const INSPECT_EXIT: &str =
    "EXIT STATUS:\n  0  shown (held or free)\n  2  usage or backend error (unreachable server, a backend that cannot list)";
const TOP_EXIT: &str =
    "EXIT STATUS:\n  0  ended by q, Esc, Ctrl-C, INT, TERM or HUP, or after --iterations views\n  2  usage or backend \
     error (no terminal without --batch or --http, a backend that cannot list)";
const SERVE_EXIT: &str =
    "EXIT STATUS:\n  0  stopped by INT or TERM\n  2  could not start (address in use, unreadable TLS or users file, bad flag)";
const OTHER_EXIT: &str = "EXIT STATUS:\n  0  done\n  2  usage or backend error";

#[derive(Parser, Debug)]
#[command(
    name = "distlock",
    version,
    about = "Run commands under distributed locks (ZooKeeper, Redis, PostgreSQL, MariaDB, SQLite, etcd)"
)]
#[command(
    after_help = "LOCK is a znode path (/locks/orders) or a bare name (orders = /distlock/orders) on ZooKeeper;\non Redis it is the key, as given (Redisson's lock layout; ?layout=simple for redis-py's);\non etcd it is the key prefix, as etcdctl lock takes it.\n\nSee `distlock exec --help` for exit statuses and environment variables."
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
    /// to distlock are passed to the whole group. The lock is held until the command and every
    /// process it left in its group have ended. If distlock dies for any reason (SIGKILL
    /// included), a watchdog process terminates the group at once. If the lock is lost, or the
    /// server stops answering, the group gets SIGTERM early enough that SIGKILL lands before the
    /// lock's lease ends (before the server can give the lock to anyone else), whatever --grace
    /// says; distlock then exits 3.
    #[command(after_help = exec_help!())]
    Exec(exec::ExecArgs),
    /// Take LOCK and hold it without a command: prints DISTLOCK_KEY, DISTLOCK_TOKEN and
    /// DISTLOCK_NODE lines, then holds until standard input closes or INT, TERM or HUP arrives.
    ///
    /// For scripts: `coproc distlock hold orders` (bash) holds the lock until the coprocess's
    /// input is closed. If the lock is lost, a message goes to stderr and distlock exits 3.
    #[command(after_help = exec_help!())]
    Hold(hold::HoldArgs),
    /// Campaign in election NAME announcing --value, and run COMMAND while leading (as exec runs
    /// it under a lock: it is stopped before the lease ends if the lead is lost); or, with
    /// --observe, print the leader's value on every change.
    ///
    /// Leading is holding the election's lock: on ZooKeeper Curator's LeaderLatch layout
    /// (node data = the value; LeaderSelector's with ?election=selector in the URL), on etcd Go's concurrency.Election layout (`etcdctl elect NAME
    /// PROPOSAL` and `etcdctl elect -l NAME` take part), on Redis Redisson's lock hash with a
    /// `value` field, on the SQL backends their lock plus a row announcing the value. The command
    /// also gets DISTLOCK_EPOCH
    /// (the fencing token, higher for every new leader) and DISTLOCK_VALUE. Without a command,
    /// leads until standard input closes or INT, TERM or HUP arrives, as hold does.
    #[command(after_help = ELECT_HELP)]
    Elect(elect::ElectArgs),
    /// Print the value of election NAME's leader; exit 1 if nobody leads.
    #[command(after_help = LEADER_EXIT)]
    Leader(elect::LeaderArgs),
    /// Show who holds LOCK and who waits for it, in queue order.
    #[command(after_help = INSPECT_EXIT)]
    Inspect(inspect::InspectArgs),
    /// A live view of every lock under a prefix: holders and waiters in queue order, refreshed
    /// every second, with a sparkline of acquisitions; on the terminal, or with --http as a web
    /// page.
    #[command(after_help = TOP_EXIT)]
    Top(top::TopArgs),
    /// Measure every lock against the server's own limit (runs distlock-bench).
    ///
    /// Runs `distlock-bench` with these arguments, found beside this program or on PATH: the
    /// benchmark is a program of its own, so that this one carries no fault proxy, peer library or
    /// counting allocator. `distlock bench --help` is its help.
    #[command(disable_help_flag = true)]
    Bench {
        /// distlock-bench's arguments.
        #[arg(value_name = "ARGS", trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run the embedded single-node server that speaks the ZooKeeper client protocol.
    #[command(after_help = SERVE_EXIT)]
    Serve(serve::ServeArgs),
    /// Make the tables and sequence distlock keeps beside its locks (PostgreSQL, MariaDB,
    /// SQLite), where missing: run once as a user allowed to create them, so lock users need only
    /// the grants in docs/security.md. Nothing to make on ZooKeeper, etcd or Redis.
    #[command(after_help = OTHER_EXIT)]
    Setup {
        #[command(flatten)]
        backend: BackendArg,
    },
    /// Print a completion script for SHELL to standard output, e.g. `distlock completions bash >
    /// /etc/bash_completion.d/distlock` (or `source <(distlock completions bash)`).
    #[command(after_help = OTHER_EXIT)]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to standard output: `distlock man | man -l -`, or
    /// `distlock man > /usr/local/share/man/man1/distlock.1`.
    #[command(after_help = OTHER_EXIT)]
    Man,
    /// (internal) The watchdog `exec` starts: ends the command's process group if `exec` dies.
    #[command(hide = true)]
    Supervise {
        /// SIGKILL this long after SIGTERM.
        #[arg(value_parser = duration_arg)]
        kill_after: Duration,
        /// SIGKILL the group at this CLOCK_MONOTONIC instant (ms) whatever happens to exec: a
        /// scheduled job's bound.
        #[arg(long = "kill-at-monotonic-ms")]
        kill_at: Option<u64>,
    },
}

/// Refuses to serve an unauthenticated endpoint (`what`) on `addr` unless it is loopback or the
/// user said `--allow-remote`; then it warns.
pub(crate) fn only_loopback_unless_allowed(what: &str, addr: std::net::SocketAddr, allow: bool) -> anyhow::Result<()> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    if !allow {
        anyhow::bail!(
            "{what} {addr}: other hosts could reach it and it has no authentication; listen on 127.0.0.1 \
             (or [::1]), or give --allow-remote to serve it beyond this host"
        );
    }
    crate::shown::say!("distlock {what}: warning: {addr} is reachable from other hosts and has no authentication");
    Ok(())
}

/// Parses a flag's duration for clap: a bare number is seconds (`5`, `0.5`, as flock(1)'s `-w`
/// and sleep(1) take them), else `500ms`, `10s`, `2m` as [`distlock::parse_duration`] reads them.
/// One rule for every flag. (URL keys keep the unit: peers write them in milliseconds, as
/// Redisson's `lockWatchdogTimeout=30000`, so a bare number there is refused, not read as hours.)
/// The flags take values that start with `-`, so that a negative one is refused by name here.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    distlock::parse_duration_flag(s).map_err(|e| e.to_string())
}

/// The `--backend` help: each backend's URL shapes from the library's registry
/// ([`distlock::BACKENDS`]), so a new backend is named here without a line of the CLI.
fn backend_help() -> String {
    let shapes: Vec<&str> = distlock::BACKENDS.iter().flat_map(|b| b.urls.iter().copied()).collect();
    format!(
        "Backend URL: {}; every scheme takes lease= (session_timeout= and ttl= are aliases) and \
         connect_timeout=. Default: {DEFAULT_BACKEND} (an empty value counts as unset)",
        shapes.join(", ")
    )
}

/// The backend URL: the flag, then `$DISTLOCK_BACKEND` (empty counts as unset), then the default.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArg {
    /// Backend URL (every backend's shapes: see `backend_help`, made from the library's registry).
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, help = backend_help())]
    pub backend: Option<String>,
    /// Read the backend URL from this file instead (its first line): a password then stays off
    /// the command line and out of the environment. A file holding a password must be readable
    /// by its owner only (chmod 600), as ssh requires of keys.
    #[arg(long, env = "DISTLOCK_BACKEND_FILE", hide_env_values = true, value_name = "PATH")]
    pub backend_file: Option<std::path::PathBuf>,
    /// The lease, on every backend: how long the server keeps the lock of a holder it no longer
    /// hears from (ZooKeeper's session timeout, etcd's lease TTL, the lease of Redis keys and of
    /// the SQL backends). A lock held by a process that dies is passed on after about this long.
    /// Overrides the URL's `lease` (or its aliases `session_timeout`, `ttl`).
    #[arg(allow_hyphen_values = true, long, visible_alias = "session-timeout", value_name = "DURATION", value_parser = duration_arg)]
    pub lease: Option<Duration>,
    /// Give up connecting after this long, on every backend (overrides the URL's
    /// connect_timeout). A refused connection is reported at once.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = duration_arg)]
    pub connect_timeout: Option<Duration>,
    /// TLS: verify the server's certificate against the CA certificates in this PEM file instead
    /// of the system's roots (rediss://, etcds://; on PostgreSQL and MariaDB a TLS file asks for
    /// TLS, fully verified). As etcdctl --cacert; the URL's cacert= on every backend.
    #[arg(long, value_name = "PEM_FILE")]
    pub cacert: Option<std::path::PathBuf>,
    /// TLS: the client certificate (PEM) for a server that asks for one; needs --key.
    #[arg(long, value_name = "PEM_FILE", requires = "key")]
    pub cert: Option<std::path::PathBuf>,
    /// TLS: the client certificate's private key (PEM); needs --cert.
    #[arg(long, value_name = "PEM_FILE", requires = "cert")]
    pub key: Option<std::path::PathBuf>,
}

impl BackendArg {
    /// The options the flags give, for any backend.
    pub fn options(&self) -> distlock::ConnectOptions {
        let mut options = distlock::ConnectOptions::new();
        if let Some(lease) = self.lease {
            options = options.lease(lease);
        }
        if let Some(t) = self.connect_timeout {
            options = options.connect_timeout(t);
        }
        if let Some(p) = &self.cacert {
            options = options.cacert(p);
        }
        if let Some(p) = &self.cert {
            options = options.cert(p);
        }
        if let Some(p) = &self.key {
            options = options.key(p);
        }
        options
    }

    /// Connects to the backend the URL names, with the flags applied (one way for every
    /// backend: the library applies them).
    pub async fn connect(&self) -> anyhow::Result<distlock::Client> {
        Ok(distlock::connect_with(&self.url()?, &self.options()).await?)
    }

    /// Connects to look (`inspect`, `top`, `leader`), making no database: a
    /// mistyped SQLite path is an error, not a new, empty database reported as "0 locks". First
    /// with `setup=no`; a database that exists but that no distlock client has used yet
    /// ([`distlock::Error::NotSetUp`]) is then set up as any client would, so that looking before
    /// the first lock (an observer started first) works.
    pub async fn connect_to_look(&self) -> anyhow::Result<distlock::Client> {
        let url = self.url()?;
        match distlock::connect_with(&url, &self.options().setup(false)).await {
            Err(distlock::Error::NotSetUp { .. }) => Ok(distlock::connect_with(&url, &self.options()).await?),
            connected => Ok(connected?),
        }
    }

    /// The backend URL: `--backend` (or `$DISTLOCK_BACKEND`), else the first line of
    /// `--backend-file` (or `$DISTLOCK_BACKEND_FILE`), else the default. Both given is an error.
    pub fn url(&self) -> anyhow::Result<String> {
        let given = self.backend.as_deref().filter(|b| !b.trim().is_empty());
        match (given, &self.backend_file) {
            (Some(_), Some(_)) => anyhow::bail!(
                "both a backend URL (--backend or $DISTLOCK_BACKEND) and --backend-file (or $DISTLOCK_BACKEND_FILE) are given: keep one"
            ),
            (Some(url), None) => Ok(url.to_string()),
            (None, Some(file)) => backend_from_file(file),
            (None, None) => Ok(DEFAULT_BACKEND.to_string()),
        }
    }
}

/// The first line of `file`, refused if it holds a password and others may read it.
fn backend_from_file(file: &std::path::Path) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = file.display();
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("--backend-file {shown}: {e}"))?;
    let url = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap_or("");
    if url.is_empty() {
        anyhow::bail!("--backend-file {shown}: no URL in it");
    }
    let mode = std::fs::metadata(file).map(|m| m.permissions().mode()).unwrap_or(0);
    if distlock::redact_url(url) != url && mode & 0o077 != 0 {
        anyhow::bail!(
            "--backend-file {shown}: it holds a password and its permissions {:o} let others read it (chmod 600 {shown})",
            mode & 0o777
        );
    }
    Ok(url.to_string())
}

/// Whether `$DISTLOCK_BACKEND` holds a password: then it is not passed on to the commands and
/// helpers distlock starts (a child's environment is readable in `/proc` as long as it runs).
pub fn backend_env_has_secret() -> bool {
    std::env::var("DISTLOCK_BACKEND").is_ok_and(|v| distlock::redact_url(&v) != v)
}

/// `distlock bench ARGS`: replaces this process with `distlock-bench ARGS`, found beside this
/// program (a build's target directory, or the same `cargo install` root) or else on `PATH`, as
/// git runs `git-NAME`. Returns only on failure, with the exit status.
fn run_bench(args: Vec<std::ffi::OsString>) -> u8 {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("distlock-bench")));
    let program = beside.filter(|p| p.is_file()).unwrap_or_else(|| "distlock-bench".into());
    let e = std::process::Command::new(&program).args(args).exec();
    if e.kind() == std::io::ErrorKind::NotFound {
        crate::shown::say!(
            "distlock: the benchmark is a program of its own, distlock-bench, found neither beside this \
             distlock nor on PATH: cargo install --path crates/distlock-bench (from a clone of distlock), or \
             cargo run --release -p distlock-bench -- ARGS"
        );
    } else {
        crate::shown::say!("distlock: cannot run {}: {e}", program.display());
    }
    EXIT_ERROR
}

/// The backend flags every connecting subcommand takes (each with a value).
const BACKEND_FLAGS: [&str; 8] =
    ["--backend", "--backend-file", "--lease", "--session-timeout", "--connect-timeout", "--cacert", "--cert", "--key"];

/// `distlock --backend URL inspect …`: backend flags given before the subcommand are moved after
/// it, where the subcommand reads them (as git, kubectl and etcdctl take global flags first).
fn hoist_backend_flags(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut hoisted = Vec::new();
    let mut i = 1;
    while let Some(flag) = args.get(i).and_then(|a| a.to_str()) {
        let (name, inline) = flag.split_once('=').map_or((flag, false), |(n, _)| (n, true));
        if !BACKEND_FLAGS.contains(&name) {
            break;
        }
        let end = (i + if inline { 1 } else { 2 }).min(args.len());
        hoisted.extend_from_slice(&args[i..end]);
        i = end;
    }
    if hoisted.is_empty() || i >= args.len() {
        return args;
    }
    let mut out = vec![args[0].clone(), args[i].clone()];
    out.extend(hoisted);
    out.extend_from_slice(&args[i + 1..]);
    out
}

fn main() -> ExitCode {
    let args = hoist_backend_flags(std::env::args_os().collect());
    let subcommand = args.get(1).and_then(|a| a.to_str()).unwrap_or_default().to_string();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, &subcommand),
    };
    let cli = match without_runtime(cli.command) {
        Ok(code) => return code,
        Err(command) => *command,
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("DISTLOCK_LOG")
        // The ZooKeeper client's own retries (one warning per attempt) are its business: distlock
        // reports the outcome once. DISTLOCK_LOG=info shows them.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,zookeeper_client=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(log::Plain)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            crate::shown::say!("distlock: cannot start runtime: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let code = rt.block_on(async {
        match cli {
            Command::Exec(args) => exec::run(args).await,
            Command::Hold(args) => hold::run(args).await,
            Command::Elect(args) => elect::run(args).await,
            Command::Leader(args) => elect::leader(args).await,
            Command::Inspect(args) => inspect::run(args).await,
            Command::Top(args) => top::run(args).await,
            Command::Serve(args) => serve::run(args).await,
            Command::Setup { backend } => setup(backend).await,
            Command::Bench { .. } | Command::Supervise { .. } | Command::Completions { .. } | Command::Man => {
                unreachable!("handled before the runtime starts")
            }
        }
    });
    // Work left in the background (a release on drop, a blocking connect or a close that a silent
    // server never answers) must not keep us from exiting: what it held ends with our
    // connections, or with its lease.
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    textfile::finish(*code.as_ref().unwrap_or(&EXIT_ERROR));
    match code {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            crate::shown::say!("distlock: {}", error_text(&e));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Runs the subcommands that need no runtime (completions, the manual page, the benchmark, the
/// watchdog): their exit status, or the command back for the others.
fn without_runtime(command: Command) -> Result<ExitCode, Box<Command>> {
    match command {
        Command::Completions { shell } => {
            let mut cli = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cli, "distlock", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            match clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut std::io::stdout()) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    crate::shown::say!("distlock: cannot write the manual page: {e}");
                    Ok(ExitCode::from(EXIT_ERROR))
                }
            }
        }
        Command::Bench { args } => Ok(ExitCode::from(run_bench(args))),
        // The watchdog only reads a pipe (on a thread) and sends signals.
        Command::Supervise { kill_after, kill_at } => Ok(ExitCode::from(supervise::run(kill_after, kill_at))),
        command => Err(Box::new(command)),
    }
}

/// `distlock setup`.
async fn setup(backend: BackendArg) -> anyhow::Result<u8> {
    let client = backend.connect().await?;
    client.setup().await?;
    client.close(std::time::Duration::from_secs(2)).await;
    crate::shown::say!(
        "distlock setup: {}: the fencing sequence and the election and job tables are in place",
        distlock::redact_url(&backend.url()?)
    );
    Ok(0)
}

/// An error and its causes on one line, each cause once: a cause whose text the line already
/// holds (most errors print their source in their own message) is not repeated.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

/// Prints clap's error; for `exec` arguments clap did not expect, says where the command goes.
fn usage_error(e: clap::Error, subcommand: &str) -> ExitCode {
    use clap::error::ErrorKind;
    let code = e.exit_code();
    let _ = e.print();
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        return ExitCode::from(code as u8);
    }
    if matches!(e.kind(), ErrorKind::UnknownArgument) {
        match subcommand {
            "exec" => {
                crate::shown::say!(
                    "distlock: put -- before the command: distlock exec LOCK -- COMMAND ARGS (or -c 'STRING')"
                )
            }
            "elect" => {
                crate::shown::say!("distlock: put -- before the command: distlock elect NAME --value V -- COMMAND ARGS (or -c 'STRING')")
            }
            _ => {}
        }
    }
    ExitCode::from(EXIT_ERROR)
}

mod log {
    //! Log lines as plain `distlock: level: message key=value` text, with no colours or times.

    use tracing::{Event, Subscriber};
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
    use tracing_subscriber::registry::LookupSpan;

    pub struct Plain;

    impl<S, N> FormatEvent<S, N> for Plain
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> std::fmt::Result {
            // The fields may quote a server's words or a lock's name: escaped as every message is.
            let level = event.metadata().level().as_str().to_ascii_lowercase();
            let mut fields = String::new();
            ctx.field_format().format_fields(Writer::new(&mut fields), event)?;
            writeln!(writer, "distlock: {level}: {}", crate::shown::text(&fields))
        }
    }
}

/// The command-line reference (docs/cli-reference.md): every subcommand's `--help`, generated
/// from the same definitions the program parses with, at a fixed width.
#[cfg(test)]
fn reference() -> String {
    use std::fmt::Write;
    let mut cli = <Cli as clap::CommandFactory>::command().term_width(100);
    let mut out = String::from(
        "# distlock command-line reference\n\n\
         Generated from the program's own definitions: every subcommand's `--help`. Do not edit; after a\n\
         change to a flag, `DISTLOCK_BLESS=1 cargo test -p distlock-cli reference` writes it again (the\n\
         test fails while it differs). docs/cli.md explains; this lists.\n\n",
    );
    let _ = write!(out, "## distlock\n\n```text\n{}```\n", cli.render_long_help());
    cli.build();
    for sub in cli.get_subcommands_mut().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        let name = sub.get_name().to_string();
        let help = sub.render_long_help().to_string();
        let _ = write!(out, "\n## distlock {name}\n\n```text\n{}\n```\n", help.trim_end());
    }
    out
}

#[cfg(test)]
mod doc_commands;

#[cfg(test)]
mod tests {
    #[test]
    fn reference_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli-reference.md");
        let now = super::reference();
        if std::env::var_os("DISTLOCK_BLESS").is_some() {
            std::fs::write(&path, &now).unwrap();
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == now,
            "docs/cli-reference.md is not the help of this build: DISTLOCK_BLESS=1 cargo test -p distlock-cli reference"
        );
    }
}

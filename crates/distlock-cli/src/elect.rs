//! `distlock elect` (campaign and run a command while leading, or observe) and `distlock leader`:
//! thin over `distlock::election`. Leading is holding the election's lock, so a campaign runs
//! through `exec` and `hold` with their guarantees and exit statuses.

use crate::exec::{ExecArgs, LockArgs, OnLost, Signals};
use crate::{BackendArg, EXIT_NOT_ACQUIRED};
use distlock::election::Change;
use std::io::Write;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ElectArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// The value to announce while leading (`etcdctl elect`'s PROPOSAL, Curator's participant
    /// id); not empty (--observe prints an empty line for "no leader"). Default: this host's
    /// name and distlock's pid.
    #[arg(long, value_name = "VALUE", conflicts_with = "observe", value_parser = non_empty)]
    value: Option<String>,
    /// Print the leader's value on every change, one line each (an empty line when nobody
    /// leads), until INT or TERM; as `etcdctl elect -l` but with "no leader" shown.
    #[arg(short = 'l', long = "observe", visible_alias = "listen")]
    observe: bool,
    /// With --observe: how often the leader is read.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "100ms", requires = "observe")]
    interval: Duration,
    /// Wait at most this long to be elected (seconds, or with a unit); 0 never waits.
    #[arg(allow_hyphen_values = true, short = 'w', long = "wait", value_name = "SECONDS", value_parser = crate::exec::wait_arg, conflicts_with_all = ["nonblock", "observe"])]
    wait: Option<Duration>,
    /// Do not wait: fail at once if another candidate leads or waits.
    #[arg(short = 'n', long = "nonblock", conflicts_with = "observe")]
    nonblock: bool,
    /// Exit status when not elected.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N", default_value_t = EXIT_NOT_ACQUIRED, conflicts_with = "observe")]
    conflict_exit_code: u8,
    /// What to do to the command if the lead is lost while it runs.
    #[arg(long = "on-lost", value_enum, default_value_t = OnLost::Term, conflicts_with = "observe")]
    on_lost: OnLost,
    /// Time between SIGTERM and SIGKILL when the lead is lost (cut as `exec` cuts it).
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "5s", conflicts_with = "observe")]
    grace: Duration,
    /// Write the run's figures to PATH in the Prometheus text format, as `exec` does.
    #[arg(long = "metrics-textfile", value_name = "PATH", conflicts_with = "observe")]
    metrics_textfile: Option<std::path::PathBuf>,
    /// Run STRING with `sh -c` while leading, instead of a COMMAND after --.
    #[arg(short = 'c', long = "command", value_name = "STRING", conflicts_with_all = ["command", "observe"])]
    command_string: Option<String>,
    /// The election: a znode path or bare name on ZooKeeper, the key prefix on etcd, the key on
    /// Redis.
    #[arg(value_name = "NAME")]
    name: String,
    /// The command to run while leading, after --. Without one, distlock leads until standard
    /// input closes or INT, TERM or HUP arrives (as `hold`).
    #[arg(value_name = "COMMAND", last = true, num_args = 1.., conflicts_with = "observe")]
    command: Vec<String>,
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("the value is empty: `elect --observe` prints an empty line for \"no leader\"".into())
    } else {
        Ok(s.to_string())
    }
}

#[derive(clap::Args, Debug)]
pub struct LeaderArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Print `{"name", "value", "epoch", "key"}` as JSON instead of the value alone.
    #[arg(long)]
    json: bool,
    /// The election: a znode path or bare name on ZooKeeper, the key prefix on etcd, the key on
    /// Redis.
    #[arg(value_name = "NAME")]
    name: String,
}

pub async fn run(args: ElectArgs) -> anyhow::Result<u8> {
    if args.observe {
        return observe(args).await;
    }
    let value = args.value.unwrap_or_else(|| {
        let owner = distlock::Owner::current();
        format!("{}:{}", owner.host, owner.pid)
    });
    let wait = if args.nonblock { Some(Duration::ZERO) } else { args.wait };
    let lock = LockArgs::election(args.backend, args.name, value, wait, args.conflict_exit_code, args.metrics_textfile);
    if args.command.is_empty() && args.command_string.is_none() {
        return crate::hold::run(crate::hold::HoldArgs::under(lock)).await;
    }
    crate::exec::run(ExecArgs::under(lock, args.on_lost, args.grace, args.command_string, args.command)).await
}

async fn observe(args: ElectArgs) -> anyhow::Result<u8> {
    let mut signals = Signals::new()?;
    let client = tokio::select! {
        c = args.backend.connect() => c?,
        _ = signals.ending() => return Ok(0),
    };
    let election = client.election(&args.name)?;
    let mut changes = election.observe_every(args.interval);
    let mut failing = false;
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Ok(change) => {
                    if failing {
                        eprintln!("distlock: observing {}: the server answers again", election.name());
                        failing = false;
                    }
                    let mut out = std::io::stdout().lock();
                    let written = writeln!(out, "{}", printable(&change)).and_then(|_| out.flush());
                    match written {
                        // Whoever read our lines is gone (`| head -1`): the observing is over.
                        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
                        other => other?,
                    }
                }
                Err(e) => {
                    // Unknown is not "no leader": say so on stderr and keep trying.
                    if !failing {
                        eprintln!("distlock: observing {}: {e}; trying again", election.name());
                        failing = true;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(args.interval.max(Duration::from_millis(500))) => {}
                        _ = signals.ending() => break,
                    }
                }
            },
            _ = signals.ending() => break,
        }
    }
    drop(changes);
    drop(election);
    client.close(Duration::from_secs(2)).await;
    Ok(0)
}

/// A value on one line: a newline in it would read as two changes.
fn printable(change: &Change) -> String {
    change.value().replace('\n', "\\n")
}

pub async fn leader(args: LeaderArgs) -> anyhow::Result<u8> {
    let client = args.backend.connect().await?;
    let election = client.election(&args.name)?;
    let leader = election.leader().await;
    let name = election.name().to_string();
    drop(election);
    client.close(Duration::from_secs(2)).await;
    let leader = leader?;
    let mut out = std::io::stdout().lock();
    match (&leader, args.json) {
        (Some(l), false) => writeln!(out, "{}", printable(&Change::Leader(l.clone())))?,
        (Some(l), true) => {
            writeln!(out, "{}", serde_json::json!({"name": name, "value": l.value, "epoch": l.epoch, "key": l.key}))?
        }
        (None, false) => eprintln!("distlock: {name} has no leader"),
        (None, true) => {
            writeln!(out, "{}", serde_json::json!({"name": name, "value": null, "epoch": null, "key": null}))?
        }
    }
    Ok(if leader.is_some() { 0 } else { 1 })
}

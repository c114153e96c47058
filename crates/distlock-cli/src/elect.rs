//! `distlock elect` (campaign and run a command while leading, or observe) and `distlock leader`:
//! thin over `distlock::election`. Leading is holding the election's lock, so a campaign runs
//! through `exec` and `hold` with their guarantees and exit statuses.

use crate::exec::{AcquireArgs, CommandArgs, Plan, Signals};
use crate::BackendArg;
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
    #[arg(long, value_name = "VALUE", value_parser = non_empty)]
    value: Option<String>,
    /// Print the leader's value on every change, one line each (an empty line when nobody
    /// leads), until INT or TERM; as `etcdctl elect -l` but with "no leader" shown.
    #[arg(short = 'l', long = "observe", visible_alias = "listen", conflicts_with_all = CAMPAIGN_ONLY)]
    observe: bool,
    /// With --observe: how often the leader is read on a backend without watches (Redis and the
    /// SQL backends; ZooKeeper and etcd wake the observer by a watch instead).
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "100ms", requires = "observe")]
    interval: Duration,
    #[command(flatten)]
    acquire: AcquireArgs,
    /// The election: a znode path or bare name on ZooKeeper, the key prefix on etcd, the key on
    /// Redis.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    command: CommandArgs,
}

/// The flags of a campaign, which --observe does not take.
const CAMPAIGN_ONLY: [&str; 10] = [
    "value",
    "wait",
    "nonblock",
    "conflict_exit_code",
    "quiet",
    "metrics_textfile",
    "on_lost",
    "grace",
    "command_string",
    "command",
];

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
    let plan = Plan::election(args.backend, args.name, value, args.acquire);
    if args.command.is_empty() {
        return crate::hold::hold(plan).await;
    }
    crate::exec::exec(plan, args.command).await
}

async fn observe(args: ElectArgs) -> anyhow::Result<u8> {
    let mut signals = Signals::new()?;
    let client = tokio::select! {
        // Not `connect_to_look`: an observer started before the first candidate, on a SQLite
        // path nobody has used yet, waits for it (as `etcdctl elect -l` does), making the file.
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
                        crate::shown::say!("distlock: observing {}: the server answers again", election.name());
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
                        crate::shown::say!("distlock: observing {}: {e}; trying again", election.name());
                        failing = true;
                    }
                    tokio::select! {
                        // The observer itself waits before its next read (a poll's interval).
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
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

/// A value on one line, escaped (`crate::shown::text`): a newline in it would read as two
/// changes, an escape sequence would act on the terminal.
fn printable(change: &Change) -> String {
    crate::shown::text(change.value()).into_owned()
}

pub async fn leader(args: LeaderArgs) -> anyhow::Result<u8> {
    let client = args.backend.connect_to_look().await?;
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
            let json = serde_json::json!({"name": name, "value": l.value, "epoch": l.epoch, "key": l.key});
            writeln!(out, "{}", crate::shown::json(json.to_string()))?
        }
        (None, false) => crate::shown::say!("distlock: {name} has no leader"),
        (None, true) => {
            let json = serde_json::json!({"name": name, "value": null, "epoch": null, "key": null});
            writeln!(out, "{}", crate::shown::json(json.to_string()))?
        }
    }
    Ok(if leader.is_some() { 0 } else { 1 })
}

//! `distlock-bench`: every lock against the server's own limit, measured in one run, with the
//! peers (Apache Curator, Redisson's and redis-py's layouts, DistributedLock) beside it. A
//! program of its own so that `distlock` carries no fault proxy, peer library or counting
//! allocator; `distlock bench ARGS` runs it. This file is the entry point, which picks the
//! backend by URL; the shared harness is in `harness`, and each backend's workloads in a file of
//! its own above it.

mod alloc;
mod curator;
mod etcd;
mod handover;
mod harness;
mod held;
mod nats;
mod observe;
mod postgres;
mod postgres_tls;
mod redis;
mod sql;
mod zookeeper;

use harness::{print_table, through_proxy, BenchParams, Progress};
use std::io::IsTerminal;

use harness::BenchArgs;
use std::process::ExitCode;
use std::time::Duration;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// The server measured when neither --backend nor $DISTLOCK_BACKEND names one.
const DEFAULT_BACKEND: &str = "zk://127.0.0.1:2181";

#[derive(clap::Parser, Debug)]
#[command(
    name = "distlock-bench",
    version,
    about = "Measure every distlock lock against its server's own limit, with the peers beside it",
    after_help = "EXIT STATUS:\n  0  done\n  2  usage or backend error"
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    // The crash hand-over's leader is this program again (run by the workload, not by a user).
    let argv: Vec<String> = std::env::args().collect();
    let leader = match argv.as_slice() {
        [_, flag, name] if flag == handover::LEADER_ARG => Some(name.clone()),
        _ => None,
    };
    // The `held` workload's proxies and embedded server are this program again, too.
    let held_child = match argv.as_slice() {
        [_, flag, rest @ ..] if flag == held::CHILD_ARG => Some(rest.to_vec()),
        _ => None,
    };
    let bench = (leader.is_none() && held_child.is_none()).then(|| <Cli as clap::Parser>::parse().args);
    let filter = tracing_subscriber::EnvFilter::try_from_env("DISTLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,zookeeper_client=error"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock-bench: cannot start runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = rt.block_on(async {
        match (leader, held_child, bench) {
            (Some(name), _, _) => handover::lead_until_killed(&name).await.map(|()| 0),
            (None, Some(args), _) => held::child(&args).await.map(|()| 0),
            (None, None, Some(args)) => run(args).await,
            (None, None, None) => Ok(0),
        }
    });
    rt.shutdown_timeout(Duration::from_millis(200));
    match code {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("distlock-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// A flag's duration, by the `distlock` command's rule (a bare number is seconds).
fn duration_arg(s: &str) -> Result<Duration, String> {
    distlock::parse_duration_flag(s).map_err(|e| e.to_string())
}

async fn run(args: BenchArgs) -> anyhow::Result<u8> {
    // `$DISTLOCK_BACKEND` set but empty means the default, as if unset.
    let backend = if args.backend.trim().is_empty() { DEFAULT_BACKEND } else { &args.backend };
    let url = with_tls_files(backend, &args)?;
    let backend = url.as_str();
    if backend.starts_with("redis+cluster://") || backend.starts_with("rediss+cluster://") {
        anyhow::bail!(
            "bench does not run on a cluster yet (its floor is one server's): point it at one master with redis://"
        );
    }
    if cfg!(debug_assertions) {
        eprintln!(
            "distlock-bench: warning: this is a debug build; its figures are not representative (cargo build --release)"
        );
    }
    let progress = Progress { on: std::io::stderr().is_terminal() && !args.json };
    let (duration, clients, json) = (args.duration, args.clients, args.json);
    // `observe` (the cost of metrics and spans), `handover` (an election's) and `held` (the
    // cost per held lock) run on any backend through the shared API.
    const SHARED: [&str; 3] = ["observe", "handover", "held"];
    for w in SHARED.iter().filter(|w| args.workloads.iter().any(|a| a == *w)) {
        let r = match *w {
            "observe" => observe::run(backend, duration, &progress).await?,
            "held" => {
                let held = held::HeldArgs { held: args.held, periods: args.held_periods };
                held::run(backend, &held, &progress).await?
            }
            _ => handover::run(backend, duration, &progress).await?,
        };
        if json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            print_table(std::slice::from_ref(&r));
        }
    }
    if !args.workloads.is_empty() && args.workloads.iter().all(|w| SHARED.contains(&w.as_str())) {
        return Ok(0);
    }
    let workloads: Vec<String> = args.workloads.iter().filter(|w| !SHARED.contains(&w.as_str())).cloned().collect();
    let chosen = |defaults: &[&str]| -> Vec<String> {
        if workloads.is_empty() {
            defaults.iter().filter(|w| **w != "scaling").map(|w| w.to_string()).collect()
        } else {
            workloads.clone()
        }
    };
    // Over TLS every floor and peer connects as the lock does (the URL's CA, client certificate
    // and login), so the floor is measured over TLS in the same run.
    let is_zk = backend == "embedded" || backend.starts_with("zk://") || backend.starts_with("zks://");
    if args.curator && !is_zk {
        anyhow::bail!("--curator measures Apache Curator, a ZooKeeper client: use a zk:// backend or embedded");
    }
    if args.curator && backend.starts_with("zks://") {
        anyhow::bail!("--curator runs Curator in plaintext only: measure it with a zk:// URL");
    }
    // Other backends run through the proxy too; the shared workloads count the client's writes
    // on it around their own cycles.
    let proxied;
    let backend = match args.rtt {
        Some(rtt) if !is_zk => {
            let (p, u) = through_proxy(backend, rtt).await?;
            harness::count_wire(std::sync::Arc::new(p));
            proxied = u;
            proxied.as_str()
        }
        _ => backend,
    };
    // What the backends on the shared harness are asked to do.
    let run = |workloads| BenchParams {
        url: backend,
        workloads,
        duration,
        clients,
        json,
        progress: &progress,
        plot: args.plot.as_deref(),
    };
    let is_redis = ["redis://", "rediss://", "redis+sentinel://", "rediss+sentinel://"];
    let reports = if is_redis.iter().any(|s| backend.starts_with(s)) {
        let settings =
            redis::Settings { duration, clients, locks: args.locks, tasks: args.tasks, json, plot: args.plot.clone() };
        Some(redis::run(backend, &chosen(&redis::WORKLOADS), &settings, &progress).await?)
    } else if ["mysql://", "mariadb://", "sqlite:"].iter().any(|s| backend.starts_with(s)) {
        let workloads = chosen(&sql::WORKLOADS);
        Some(sql::run(run(&workloads)).await?)
    } else if backend.starts_with("etcd://") || backend.starts_with("etcds://") {
        let workloads = chosen(&etcd::WORKLOADS);
        Some(etcd::run(run(&workloads)).await?)
    } else if backend.starts_with("nats://") || backend.starts_with("natss://") {
        let workloads = chosen(&nats::WORKLOADS);
        Some(nats::run(run(&workloads)).await?)
    } else if backend.starts_with("postgres://") || backend.starts_with("postgresql://") {
        let workloads = chosen(&postgres::WORKLOADS);
        Some(postgres::run(run(&workloads)).await?)
    } else {
        None
    };
    if let Some(reports) = reports {
        if !json {
            print_table(&reports);
        }
        return Ok(0);
    }
    let workloads = chosen(&["raw", "uncontended", "contended", "many-locks", "waiters", "herd"]);
    zookeeper::run(&args, backend, workloads, &progress).await
}

/// The backend URL with `--cacert`, `--cert` and `--key` added as its `cacert`, `cert` and `key`
/// keys, which every backend reads (the floors and peers read them from the URL too).
fn with_tls_files(backend: &str, args: &BenchArgs) -> anyhow::Result<String> {
    let files = [("cacert", &args.cacert), ("cert", &args.cert), ("key", &args.key)];
    let keys: Vec<String> =
        files.iter().filter_map(|(k, v)| v.as_ref().map(|p| format!("{k}={}", p.display()))).collect();
    if keys.is_empty() {
        return Ok(backend.to_string());
    }
    if backend == "embedded" {
        anyhow::bail!("--cacert, --cert and --key are for a server of your own: the in-process server is plaintext");
    }
    let joiner = if backend.contains('?') { '&' } else { '?' };
    Ok(format!("{backend}{joiner}{}", keys.join("&")))
}

//! `distlock bench`: every lock against the server's own limit, measured in one run. This file
//! is the entry point, which picks the backend by URL; the shared harness is in `harness`, and
//! each backend's workloads in a file of its own above it.

mod curator;
mod etcd;
mod handover;
mod harness;
mod observe;
mod postgres;
mod redis;
mod sql;
mod zookeeper;

use harness::{print_table, through_proxy, Progress, Run};
use std::io::IsTerminal;

pub(crate) use harness::BenchArgs;

pub async fn run(args: BenchArgs) -> anyhow::Result<u8> {
    let backend = crate::backend_or_default(&args.backend);
    // The floors and peers speak plaintext: a TLS URL would be measured without TLS, or not at
    // all. Refused until bench carries the TLS settings to them.
    let tls_asked = ["rediss", "etcds://"].iter().any(|s| backend.starts_with(s))
        || ["sslmode=", "ssl-mode=", "ssl_mode=", "cacert=", "sslrootcert=", "ssl-ca="]
            .iter()
            .any(|k| backend.contains(k));
    if tls_asked {
        anyhow::bail!(
            "bench does not run over TLS yet (its floors and peers connect in plaintext): give it a plaintext URL"
        );
    }
    if backend.starts_with("redis+cluster://") {
        anyhow::bail!(
            "bench does not run on a cluster yet (its floor is one server's): point it at one master with redis://"
        );
    }
    if cfg!(debug_assertions) {
        eprintln!(
            "distlock: warning: this is a debug build; its figures are not representative (cargo build --release)"
        );
    }
    let progress = Progress { on: std::io::stderr().is_terminal() && !args.json };
    let (duration, clients, json) = (args.duration, args.clients, args.json);
    // `observe` (the cost of metrics and spans) and `handover` (an election's) run on any
    // backend through the shared API.
    const SHARED: [&str; 2] = ["observe", "handover"];
    for w in SHARED.iter().filter(|w| args.workloads.iter().any(|a| a == *w)) {
        let r = match *w {
            "observe" => observe::run(backend, duration, &progress).await?,
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
    let is_zk = backend == "embedded" || backend.starts_with("zk://");
    if args.curator && !is_zk {
        anyhow::bail!("--curator measures Apache Curator, a ZooKeeper client: use a zk:// backend or embedded");
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
    let run = |workloads| Run {
        url: backend,
        workloads,
        duration,
        clients,
        json,
        progress: &progress,
        plot: args.plot.as_deref(),
    };
    let reports = if backend.starts_with("redis://") || backend.starts_with("redis+sentinel://") {
        let settings =
            redis::Settings { duration, clients, locks: args.locks, tasks: args.tasks, json, plot: args.plot.clone() };
        Some(redis::run(backend, &chosen(&redis::WORKLOADS), &settings, &progress).await?)
    } else if ["mysql://", "mariadb://", "sqlite:"].iter().any(|s| backend.starts_with(s)) {
        let workloads = chosen(&sql::WORKLOADS);
        Some(sql::run(run(&workloads)).await?)
    } else if backend.starts_with("etcd://") {
        let workloads = chosen(&etcd::WORKLOADS);
        Some(etcd::run(run(&workloads)).await?)
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

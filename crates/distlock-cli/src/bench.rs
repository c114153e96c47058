//! `distlock bench`: every lock against the server's own limit, measured in one run.

use distlock::zookeeper::{Client, MetricsSnapshot};
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use zookeeper_client as zk;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Backend URL, or `embedded` for an in-process server. Defaults to $DISTLOCK_BACKEND, then
    /// zk://127.0.0.1:2181.
    #[arg(long, env = "DISTLOCK_BACKEND", default_value = "zk://127.0.0.1:2181")]
    backend: String,
    /// How long each workload runs.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "10s")]
    duration: Duration,
    /// One JSON object per workload per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Sessions for `contended` and `herd`.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    clients: u32,
    /// Distinct locks for `many-locks`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    locks: u32,
    /// Tasks for `many-locks`.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    tasks: u32,
    /// Waiting handles for `waiters`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    count: u32,
    /// Also write SVG plots here: acquire latency distribution (uncontended) and throughput
    /// against sessions (contended; runs the workload at 1, 2, 4, 8, 16 and 32 sessions too).
    /// Other workloads have nothing to plot.
    #[arg(long, value_name = "DIR")]
    plot: Option<std::path::PathBuf>,
    /// Run through the project's fault proxy, which holds back every reply this long, as a
    /// network between machines would (e.g. 1ms); `uncontended` and `contended` then also report
    /// the client's writes per cycle counted on the wire (`0ms` counts without delaying). Needs
    /// one server: a URL with one host, or `embedded`.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration_arg)]
    rtt: Option<Duration>,
    /// Also measure Apache Curator's InterProcessMutex (zk:// and embedded): `uncontended` and
    /// `contended` then run three rounds each, distlock and Curator in turns, on the same server
    /// (and proxy). Needs Java 17 and Debian's Curator jars (libcurator-recipes-java).
    #[arg(long)]
    curator: bool,
    /// Workloads: raw, uncontended, contended, many-locks, waiters, herd, optimistic (default: all the
    /// backend has).
    #[arg(value_name = "WORKLOAD", value_parser = ["raw", "uncontended", "contended", "many-locks", "waiters", "herd", "optimistic"])]
    workloads: Vec<String>,
}

/// One workload's result (one JSON line with --json).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub workload: String,
    pub ops_per_sec: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub limit_ops_per_sec: f64,
    pub ratio_to_limit: f64,
    /// `debug` or `release`: the build of distlock that measured (debug figures mean little).
    pub build_profile: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<(String, String)>,
}

impl Default for Report {
    fn default() -> Self {
        Report {
            workload: String::new(),
            ops_per_sec: 0.0,
            p50_us: 0,
            p99_us: 0,
            p999_us: 0,
            limit_ops_per_sec: 0.0,
            ratio_to_limit: 0.0,
            build_profile: BUILD_PROFILE,
            extra: Vec::new(),
        }
    }
}

struct Limits {
    sequential: f64,
    pipelined: f64,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A report of `ops` per second against the backend's `limit` (its floor).
pub(crate) fn report(workload: &str, ops: f64, limit: f64, extra: Vec<(String, String)>) -> Report {
    Report {
        workload: workload.into(),
        ops_per_sec: ops,
        limit_ops_per_sec: limit,
        ratio_to_limit: ops / limit,
        extra,
        ..Default::default()
    }
}

pub(crate) fn summarize(mut samples: Vec<u64>) -> (u64, u64, u64) {
    samples.sort_unstable();
    (percentile(&samples, 0.5), percentile(&samples, 0.99), percentile(&samples, 0.999))
}

pub(crate) struct Progress {
    on: bool,
}

impl Progress {
    pub(crate) fn show(&self, what: &str, done: u64, elapsed: Duration) {
        if self.on {
            eprint!("\r\x1b[Kbench: {what}: {done} ops in {:.1}s", elapsed.as_secs_f64());
        }
    }
    pub(crate) fn clear(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

/// The build profile of this binary, as `--json` reports it.
const BUILD_PROFILE: &str = if cfg!(debug_assertions) { "debug" } else { "release" };

/// The workloads that write a plot with `--plot`.
const PLOTTED: [&str; 2] = ["uncontended", "contended"];

/// Every run works under `/distlock-bench/<run id>`; the run removes its own directory, then this
/// one if nothing else is left in it.
const BENCH_ROOT: &str = "/distlock-bench";

pub async fn run(args: BenchArgs) -> anyhow::Result<u8> {
    let backend = crate::backend_or_default(&args.backend);
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
    // The workloads asked for, or the backend's own list.
    let chosen = |defaults: &[&str]| -> Vec<String> {
        if args.workloads.is_empty() {
            defaults.iter().map(|w| w.to_string()).collect()
        } else {
            args.workloads.clone()
        }
    };
    let (duration, clients, json) = (args.duration, args.clients, args.json);
    let is_zk = backend == "embedded" || backend.starts_with("zk://");
    if args.curator && !is_zk {
        anyhow::bail!("--curator measures Apache Curator, a ZooKeeper client: use a zk:// backend or embedded");
    }
    // Other backends run through the proxy too (their reports do not count the wire yet).
    let (_proxy, proxied);
    let backend = match args.rtt {
        Some(rtt) if !is_zk => {
            let (p, u) = through_proxy(backend, rtt).await?;
            (_proxy, proxied) = (Some(p), u);
            proxied.as_str()
        }
        _ => backend,
    };
    let reports = if backend.starts_with("redis://") || backend.starts_with("redis+sentinel://") {
        let settings = crate::bench_redis::Settings {
            duration,
            clients,
            locks: args.locks,
            tasks: args.tasks,
            json,
            plot: args.plot.clone(),
        };
        Some(crate::bench_redis::run(backend, &chosen(&crate::bench_redis::WORKLOADS), &settings, &progress).await?)
    } else if ["mysql://", "mariadb://", "sqlite:"].iter().any(|s| backend.starts_with(s)) {
        let workloads = chosen(&crate::bench_sql::WORKLOADS);
        Some(crate::bench_sql::run(backend, &workloads, duration, clients, json, &progress).await?)
    } else if backend.starts_with("etcd://") {
        let workloads = chosen(&crate::bench_etcd::WORKLOADS);
        Some(crate::bench_etcd::run(backend, &workloads, duration, clients, json, &progress).await?)
    } else if backend.starts_with("postgres://") || backend.starts_with("postgresql://") {
        let workloads = chosen(&crate::bench_postgres::WORKLOADS);
        Some(crate::bench_postgres::run(backend, &workloads, duration, clients, json, &progress).await?)
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
    if workloads.iter().any(|w| w == "optimistic") {
        anyhow::bail!(
            "workload optimistic is measured on mysql:// and sqlite:// backends (a version column needs a table)"
        );
    }
    if args.plot.is_some() {
        let mut unplotted: Vec<&str> = Vec::new();
        for w in workloads.iter().map(String::as_str) {
            if !PLOTTED.contains(&w) && !unplotted.contains(&w) {
                unplotted.push(w);
            }
        }
        if !unplotted.is_empty() {
            eprintln!(
                "distlock: --plot: nothing to plot for workload{} {} (only {} write plots)",
                if unplotted.len() > 1 { "s" } else { "" },
                unplotted.join(", "),
                PLOTTED.join(" and ")
            );
        }
    }
    let _embedded;
    let url = if backend == "embedded" {
        let cfg = distlock_server::Config { fsync: distlock_server::Fsync::Never, ..Default::default() };
        let s = distlock_server::EmbeddedServer::start_with(cfg).await?;
        let url = s.url();
        _embedded = Some(s);
        url
    } else {
        _embedded = None;
        backend.to_string()
    };
    let (url, wire) = match args.rtt {
        Some(rtt) => {
            let (proxy, url) = through_proxy(&url, rtt).await?;
            (url, Wire(Some(proxy)))
        }
        None => (url, Wire(None)),
    };
    let mut curator = match args.curator {
        true => Some(crate::bench_curator::Curator::start(&curator_connect(&url)?).await?),
        false => None,
    };
    let prefix = format!("{BENCH_ROOT}/{}", uuid::Uuid::new_v4().simple());
    // This session measures the raw limit, then removes what the run created, whether the
    // workloads succeed, fail or are interrupted. (Nothing is created before it connects.)
    let admin = raw_client(&url).await?;
    let mut stop = StopSignals::new();
    let measured = tokio::select! {
        r = measure(&args, &workloads, &url, &prefix, &admin, &progress, &wire, curator.as_mut()) => Ok(r),
        sig = stop.next() => Err(sig),
    };
    progress.clear();
    let removed = tokio::select! {
        r = remove_run(&admin, &prefix) => r,
        sig = stop.next() => {
            eprintln!("distlock: interrupted again: {prefix} is left on the server");
            return Ok(128 + sig);
        }
    };
    match measured {
        Ok(Ok(reports)) => {
            if !args.json {
                print_table(&reports);
            }
            removed.map(|()| 0)
        }
        Ok(Err(e)) => {
            if let Err(r) = removed {
                eprintln!("distlock: {r:#}");
            }
            Err(e)
        }
        Err(sig) => {
            match removed {
                Ok(()) => eprintln!("distlock: bench interrupted; its nodes are removed"),
                Err(r) => eprintln!("distlock: bench interrupted; {r:#}"),
            }
            Ok(128 + sig)
        }
    }
}

/// SIGINT and SIGTERM, caught so that an interrupted run can remove its nodes first.
struct StopSignals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn new() -> StopSignals {
        use tokio::signal::unix::{signal, SignalKind};
        StopSignals { int: signal(SignalKind::interrupt()).ok(), term: signal(SignalKind::terminate()).ok() }
    }

    /// The next signal's number (never, for one that could not be caught).
    async fn next(&mut self) -> u8 {
        async fn on(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = on(&mut self.int) => libc::SIGINT as u8,
            () = on(&mut self.term) => libc::SIGTERM as u8,
        }
    }
}

/// Runs `workloads` in order under `prefix`, printing each one's JSON lines as it ends.
#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &BenchArgs,
    workloads: &[String],
    url: &str,
    prefix: &str,
    admin: &Client,
    progress: &Progress,
    wire: &Wire,
    mut curator: Option<&mut crate::bench_curator::Curator>,
) -> anyhow::Result<Vec<Report>> {
    // The limit is always measured first, in the same run, on the same server.
    let limits = raw_limits(admin, prefix, args.duration, progress).await?;
    let mut reports = Vec::new();
    for w in workloads {
        let r = match w.as_str() {
            "raw" => vec![
                Report {
                    workload: "raw-sequential".into(),
                    ops_per_sec: limits.sequential,
                    limit_ops_per_sec: limits.sequential,
                    ratio_to_limit: 1.0,
                    ..Default::default()
                },
                Report {
                    workload: "raw-pipelined".into(),
                    ops_per_sec: limits.pipelined,
                    limit_ops_per_sec: limits.pipelined,
                    ratio_to_limit: 1.0,
                    ..Default::default()
                },
            ],
            "uncontended" => {
                let mut v =
                    uncontended(url, prefix, args.duration, &limits, progress, args.plot.as_deref(), wire).await?;
                if let Some(c) = curator.as_deref_mut() {
                    v.extend(uncontended_vs_curator(url, prefix, args.duration, &limits, progress, wire, c).await?);
                }
                v
            }
            "contended" => {
                let mut v = vec![contended(url, prefix, args.clients, args.duration, &limits, progress, wire).await?];
                if let Some(c) = curator.as_deref_mut() {
                    v.extend(
                        contended_vs_curator(url, prefix, args.clients, args.duration, &limits, progress, wire, c)
                            .await?,
                    );
                }
                if let Some(dir) = &args.plot {
                    let mut points = Vec::new();
                    for n in [1u32, 2, 4, 8, 16, 32] {
                        let r = contended(url, prefix, n, args.duration, &limits, progress, wire).await?;
                        points.push((n as f64, r.ops_per_sec));
                    }
                    plot_lines(
                        &dir.join("contended-throughput.svg"),
                        "Contended hand-offs/s against sessions",
                        "sessions",
                        "hand-offs/s",
                        &[("queue mutex", points)],
                        (limits.sequential, "raw sequential create+delete limit"),
                    )?;
                    v[0].extra.push(("plot".into(), dir.join("contended-throughput.svg").display().to_string()));
                }
                v
            }
            "many-locks" => {
                vec![many_locks(url, prefix, args.locks, args.tasks, args.duration, &limits, progress).await?]
            }
            "waiters" => vec![waiters(url, prefix, args.count, &limits, progress).await?],
            "herd" => herd(url, prefix, args.clients, args.duration, &limits, progress).await?,
            _ => unreachable!("clap checked the workload"),
        };
        progress.clear();
        for rep in &r {
            if args.json {
                println!("{}", serde_json::to_string(rep)?);
            }
        }
        reports.extend(r);
    }
    Ok(reports)
}

/// Removes `prefix` and everything under it, then [`BENCH_ROOT`] if that is left empty (another
/// run may still be using it, or have removed it already: both are fine). Gives up after 30 s.
async fn remove_run(client: &Client, prefix: &str) -> anyhow::Result<()> {
    let zk = client.zookeeper();
    let remove = async {
        // A node can appear while the tree is walked (a release queued by a drop, a task of a
        // failed workload winding down): walk again, a bounded number of times.
        let mut walks = 0;
        loop {
            match remove_tree(zk, prefix.to_string()).await {
                Err(zk::Error::NotEmpty) if walks < 20 => walks += 1,
                r => break r,
            }
        }?;
        match zk.delete(BENCH_ROOT, None).await {
            Ok(()) | Err(zk::Error::NotEmpty) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e),
        }
    };
    let reason = match tokio::time::timeout(Duration::from_secs(30), remove).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer within 30s".to_string(),
    };
    anyhow::bail!("cannot remove {prefix} from the server (remove it by hand): {reason}")
}

/// Deletes `path` and its descendants, children before parents, siblings concurrently (a
/// many-locks run leaves a directory per lock). A node already gone is not an error; a node
/// that gains a child meanwhile is `NotEmpty`.
fn remove_tree(zk: &zk::Client, path: String) -> BoxFuture<'_, Result<(), zk::Error>> {
    async move {
        let children = match zk.list_children(&path).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(()),
            Err(e) => return Err(e),
        };
        futures::future::try_join_all(children.iter().map(|c| remove_tree(zk, format!("{path}/{c}")))).await?;
        match zk.delete(&path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e),
        }
    }
    .boxed()
}

fn print_table(reports: &[Report]) {
    println!(
        "{:<26} {:>12} {:>9} {:>9} {:>9} {:>12} {:>7}  NOTES",
        "WORKLOAD", "OPS/S", "P50 us", "P99 us", "P999 us", "LIMIT OPS/S", "RATIO"
    );
    for r in reports {
        let notes: Vec<String> = r.extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:<26} {:>12.0} {:>9} {:>9} {:>9} {:>12.0} {:>7.2}  {}",
            r.workload,
            r.ops_per_sec,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.limit_ops_per_sec,
            r.ratio_to_limit,
            notes.join(" ")
        );
    }
}

async fn raw_client(url: &str) -> anyhow::Result<Client> {
    Ok(Client::connect(url).await?)
}

/// The server's own limit: create+delete pairs of an ephemeral node, sequential (round-trip
/// bound) and pipelined (throughput bound), on one session.
async fn raw_limits(client: &Client, prefix: &str, duration: Duration, progress: &Progress) -> anyhow::Result<Limits> {
    let zk = client.zookeeper();
    let dir = format!("{prefix}/raw");
    zk.mkdir(&dir, &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await?;
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let node = format!("{dir}/n");
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < duration {
        zk.create(&node, b"", &eph).await?;
        zk.delete(&node, None).await?;
        pairs += 1;
        if pairs % 256 == 0 {
            progress.show("raw sequential", pairs, start.elapsed());
        }
    }
    let sequential = pairs as f64 / start.elapsed().as_secs_f64();
    // Pipelined: many pairs in flight, each on its own node.
    const WINDOW: usize = 256;
    let start = Instant::now();
    let mut pairs = 0u64;
    let mut inflight = FuturesUnordered::new();
    let mut next = 0u64;
    let pair = |i: u64| {
        let path = format!("{dir}/p{}", i % (WINDOW as u64 * 2));
        let eph = eph.clone();
        async move {
            zk.create(&path, b"", &eph).await?;
            zk.delete(&path, None).await?;
            Ok::<(), zk::Error>(())
        }
    };
    for _ in 0..WINDOW {
        inflight.push(pair(next));
        next += 1;
    }
    while let Some(r) = inflight.next().await {
        r?;
        pairs += 1;
        if start.elapsed() < duration {
            inflight.push(pair(next));
            next += 1;
        }
        if pairs % 1024 == 0 {
            progress.show("raw pipelined", pairs, start.elapsed());
        }
    }
    let pipelined = pairs as f64 / start.elapsed().as_secs_f64();
    Ok(Limits { sequential, pipelined })
}

async fn uncontended(
    url: &str,
    prefix: &str,
    duration: Duration,
    limits: &Limits,
    progress: &Progress,
    plot: Option<&std::path::Path>,
    wire: &Wire,
) -> anyhow::Result<Vec<Report>> {
    let client = raw_client(url).await?;
    let lock = client.mutex(&format!("{prefix}/uncontended"))?;
    lock.lock().await?.release().await?; // create the directory outside the measurement
    let (mut acq, mut rel) = (Vec::new(), Vec::new());
    let before = client.metrics().snapshot();
    let wire_before = wire.writes();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        let t = Instant::now();
        let g = lock.lock().await?;
        let t2 = Instant::now();
        g.release().await?;
        acq.push((t2 - t).as_micros() as u64);
        rel.push(t2.elapsed().as_micros() as u64);
        n += 1;
        if n % 256 == 0 {
            progress.show("uncontended", n, start.elapsed());
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let m: MetricsSnapshot = client.metrics().snapshot() - before;
    let rtt_per_cycle = m.round_trips as f64 / n as f64;
    let on_wire = wire.per(wire_before, n);
    let mut plotted = None;
    if let Some(dir) = plot {
        let mut sorted = acq.clone();
        sorted.sort_unstable();
        let cdf: Vec<(f64, f64)> = sorted
            .iter()
            .enumerate()
            .step_by((sorted.len() / 400).max(1))
            .map(|(i, us)| (*us as f64, (i + 1) as f64 / sorted.len() as f64))
            .collect();
        plot_lines(
            &dir.join("uncontended-latency.svg"),
            "Uncontended acquire latency (CDF)",
            "microseconds",
            "fraction",
            &[("acquire", cdf)],
            (0.0, ""),
        )?;
        plotted = Some(dir.join("uncontended-latency.svg").display().to_string());
    }
    let ops = n as f64 / elapsed;
    let (a50, a99, a999) = summarize(acq);
    let (r50, r99, r999) = summarize(rel);
    // Release by drop: the delete is queued, not awaited.
    let start = Instant::now();
    let mut d = 0u64;
    let before = client.metrics().snapshot();
    while start.elapsed() < duration {
        drop(lock.lock().await?);
        d += 1;
        if d % 256 == 0 {
            progress.show("uncontended (release by drop)", d, start.elapsed());
        }
    }
    let drop_ops = d as f64 / start.elapsed().as_secs_f64();
    let md = client.metrics().snapshot() - before;
    let mut acquire_extra = vec![("round_trips_per_acquire+release".into(), format!("{rtt_per_cycle:.2}"))];
    acquire_extra.extend(on_wire);
    acquire_extra.extend(plotted.map(|p| ("plot".to_string(), p)));
    Ok(vec![
        Report {
            workload: "uncontended-acquire".into(),
            ops_per_sec: ops,
            p50_us: a50,
            p99_us: a99,
            p999_us: a999,
            limit_ops_per_sec: limits.sequential,
            ratio_to_limit: ops / limits.sequential,
            extra: acquire_extra,
            ..Default::default()
        },
        Report {
            workload: "uncontended-release".into(),
            ops_per_sec: ops,
            p50_us: r50,
            p99_us: r99,
            p999_us: r999,
            limit_ops_per_sec: limits.sequential,
            ratio_to_limit: ops / limits.sequential,
            ..Default::default()
        },
        Report {
            workload: "uncontended-drop-release".into(),
            ops_per_sec: drop_ops,
            limit_ops_per_sec: limits.sequential,
            ratio_to_limit: drop_ops / limits.sequential,
            extra: vec![("round_trips_per_cycle".into(), format!("{:.2}", md.round_trips as f64 / d as f64))],
            ..Default::default()
        },
    ])
}

async fn contended(
    url: &str,
    prefix: &str,
    clients: u32,
    duration: Duration,
    limits: &Limits,
    progress: &Progress,
    wire: &Wire,
) -> anyhow::Result<Report> {
    let path = format!("{prefix}/contended-{clients}-{}", uuid::Uuid::new_v4().simple());
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let waits = Arc::new(StdMutex::new(Vec::new()));
    // A JoinSet: if this returns early with an error, dropping it aborts the other tasks.
    let mut tasks = tokio::task::JoinSet::new();
    let mut sessions = Vec::new();
    for _ in 0..clients {
        sessions.push(raw_client(url).await?);
    }
    let start = Instant::now();
    let wire_before = wire.writes();
    for c in &sessions {
        let c = c.clone();
        let (path, stop, total, waits) = (path.clone(), stop.clone(), total.clone(), waits.clone());
        tasks.spawn(async move {
            let lock = c.mutex(&path)?;
            let mut mine = 0u64;
            let mut local = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let g = lock.lock().await?;
                local.push(t.elapsed().as_micros() as u64);
                mine += 1;
                total.fetch_add(1, Ordering::Relaxed);
                g.release().await?;
            }
            waits.lock().unwrap().extend(local);
            Ok::<u64, distlock::Error>(mine)
        });
    }
    while start.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(200)).await; // the measuring window, not a wait for a condition
        progress.show(&format!("contended x{clients}"), total.load(Ordering::Relaxed), start.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let mut per_client = Vec::new();
    while let Some(t) = tasks.join_next().await {
        per_client.push(t??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n: u64 = per_client.iter().sum();
    let ops = n as f64 / elapsed;
    let (p50, p99, p999) = summarize(std::mem::take(&mut *waits.lock().unwrap()));
    let (min, max) = (per_client.iter().min().copied().unwrap_or(0), per_client.iter().max().copied().unwrap_or(0));
    let wakeups: u64 = sessions.iter().map(|c| c.metrics().snapshot().watch_wakeups).sum();
    let on_wire = wire.per(wire_before, n);
    Ok(Report {
        workload: format!("contended-{clients}"),
        ops_per_sec: ops,
        p50_us: p50,
        p99_us: p99,
        p999_us: p999,
        limit_ops_per_sec: limits.sequential,
        ratio_to_limit: ops / limits.sequential,
        extra: vec![
            ("fairness_min/max".into(), format!("{min}/{max}")),
            ("watch_events_per_acquisition".into(), format!("{:.2}", wakeups as f64 / n.max(1) as f64)),
        ]
        .into_iter()
        .chain(on_wire)
        .collect(),
        ..Default::default()
    })
}

async fn many_locks(
    url: &str,
    prefix: &str,
    locks: u32,
    tasks: u32,
    duration: Duration,
    limits: &Limits,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let client = raw_client(url).await?;
    let handles: Vec<_> = (0..locks).map(|i| client.mutex(&format!("{prefix}/many/l{i}"))).collect::<Result<_, _>>()?;
    // Create the directories outside the measurement.
    futures::future::try_join_all(handles.iter().map(|l| async move { l.lock().await?.release().await })).await?;
    let handles = Arc::new(handles);
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(StdMutex::new(Vec::new()));
    let start = Instant::now();
    let mut jobs = tokio::task::JoinSet::new(); // dropped early on an error: aborts the rest
    for t in 0..tasks {
        let (handles, stop, total, lat) = (handles.clone(), stop.clone(), total.clone(), lat.clone());
        jobs.spawn(async move {
            let mut i = t as usize;
            let mut local = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let l = &handles[i % handles.len()];
                i += tasks as usize;
                let s = Instant::now();
                let g = l.lock().await?;
                g.release().await?;
                local.push(s.elapsed().as_micros() as u64);
                total.fetch_add(1, Ordering::Relaxed);
            }
            lat.lock().unwrap().extend(local);
            Ok::<(), distlock::Error>(())
        });
    }
    while start.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(200)).await; // the measuring window
        progress.show("many-locks", total.load(Ordering::Relaxed), start.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(j) = jobs.join_next().await {
        j??;
    }
    let ops = total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let (p50, p99, p999) = summarize(std::mem::take(&mut *lat.lock().unwrap()));
    Ok(Report {
        workload: format!("many-locks-{locks}x{tasks}"),
        ops_per_sec: ops,
        p50_us: p50,
        p99_us: p99,
        p999_us: p999,
        limit_ops_per_sec: limits.pipelined,
        ratio_to_limit: ops / limits.pipelined,
        ..Default::default()
    })
}

/// The server's watch count from the `mntr` four-letter word (None if it does not answer).
async fn server_watches(url: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = distlock::zookeeper::ZkUrl::parse(url).ok()?.hosts.into_iter().next()?;
    let mut sock = tokio::net::TcpStream::connect(host).await.ok()?;
    sock.write_all(b"mntr").await.ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), sock.read_to_string(&mut text)).await.ok()?.ok()?;
    text.lines().find_map(|l| l.strip_prefix("zk_watch_count").map(|v| v.trim().parse().ok()))?
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

async fn waiters(url: &str, prefix: &str, count: u32, limits: &Limits, progress: &Progress) -> anyhow::Result<Report> {
    let holder = raw_client(url).await?;
    let path = format!("{prefix}/waiters");
    let first = holder.mutex(&path)?.lock().await?;
    let client = raw_client(url).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let before = rss_bytes();
    let heap_before = crate::alloc::live_bytes();
    let mut tasks = tokio::task::JoinSet::new(); // dropped early on an error: aborts the rest
    for _ in 0..count {
        let lock = client.mutex(&path)?;
        let tx = tx.clone();
        tasks.spawn(async move {
            let g = lock.lock().await?;
            let _ = tx.send(());
            drop(g); // release by drop: the next waiter proceeds
            Ok::<(), distlock::Error>(())
        });
    }
    drop(tx); // the channel closes when every waiter has ended, failed ones included
              // Wait until every waiter is queued, judged on the server (the waiters carry nothing extra
              // for the benchmark): the lock directory holds the holder plus `count` nodes.
    let setup = Instant::now();
    loop {
        let (_, stat) = holder.zookeeper().get_children(&path).await?;
        let queued = stat.num_children.max(1) as u64 - 1;
        // Queued, and every waiter's watch registered on the server (so no listing is still in
        // flight), judged by the server's own `mntr` where it answers.
        if queued >= count as u64 && server_watches(url).await.is_none_or(|w| w >= count as u64) {
            break;
        }
        anyhow::ensure!(setup.elapsed() < Duration::from_secs(600), "waiters did not queue within 10 minutes");
        progress.show("waiters: queueing", queued, setup.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await; // polling the server's count
    }
    let per_waiter = rss_bytes().saturating_sub(before) as f64 / count as f64;
    let heap_per_waiter = (crate::alloc::live_bytes() - heap_before) as f64 / count as f64;
    let start = Instant::now();
    first.release().await?;
    let mut drained = 0u64;
    while drained < count as u64 {
        if rx.recv().await.is_none() {
            break; // a waiter failed: its error comes out of the join below
        }
        drained += 1;
        if drained % 256 == 0 {
            progress.show("waiters: draining", drained, start.elapsed());
        }
    }
    let elapsed = start.elapsed();
    while let Some(t) = tasks.join_next().await {
        t??;
    }
    let ops = count as f64 / elapsed.as_secs_f64();
    Ok(Report {
        workload: format!("waiters-{count}"),
        ops_per_sec: ops,
        limit_ops_per_sec: limits.sequential,
        ratio_to_limit: ops / limits.sequential,
        extra: vec![
            ("heap_bytes_per_waiter".into(), format!("{heap_per_waiter:.0}")),
            ("rss_bytes_per_waiter".into(), format!("{per_waiter:.0}")),
            ("drain_ms".into(), format!("{}", elapsed.as_millis())),
            ("queue_setup_ms".into(), format!("{}", start.duration_since(setup).as_millis())),
        ],
        ..Default::default()
    })
}

async fn herd(
    url: &str,
    prefix: &str,
    clients: u32,
    duration: Duration,
    limits: &Limits,
    progress: &Progress,
) -> anyhow::Result<Vec<Report>> {
    let mut out = Vec::new();
    for naive in [true, false] {
        let path = format!("{prefix}/herd-{}", if naive { "naive" } else { "queue" });
        let stop = Arc::new(AtomicBool::new(false));
        let total = Arc::new(AtomicU64::new(0));
        let mut sessions = Vec::new();
        for _ in 0..clients {
            sessions.push(raw_client(url).await?);
        }
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new(); // dropped early on an error: aborts the rest
        for c in &sessions {
            let c = c.clone();
            let (path, stop, total) = (path.clone(), stop.clone(), total.clone());
            tasks.spawn(async move {
                if naive {
                    let lock = c.naive_lock(&path)?;
                    while !stop.load(Ordering::Relaxed) {
                        let g = lock.lock().await?;
                        total.fetch_add(1, Ordering::Relaxed);
                        g.release().await?;
                    }
                } else {
                    let lock = c.mutex(&path)?;
                    while !stop.load(Ordering::Relaxed) {
                        let g = lock.lock().await?;
                        total.fetch_add(1, Ordering::Relaxed);
                        g.release().await?;
                    }
                }
                Ok::<(), distlock::Error>(())
            });
        }
        while start.elapsed() < duration {
            tokio::time::sleep(Duration::from_millis(200)).await; // the measuring window
            progress.show(
                if naive { "herd: naive" } else { "herd: queue" },
                total.load(Ordering::Relaxed),
                start.elapsed(),
            );
        }
        stop.store(true, Ordering::Relaxed);
        while let Some(t) = tasks.join_next().await {
            t??;
        }
        let n = total.load(Ordering::Relaxed);
        let ops = n as f64 / start.elapsed().as_secs_f64();
        let wakeups: u64 = sessions.iter().map(|c| c.metrics().snapshot().watch_wakeups).sum();
        out.push(Report {
            workload: format!("herd-{}-{clients}", if naive { "naive" } else { "queue" }),
            ops_per_sec: ops,
            limit_ops_per_sec: limits.sequential,
            ratio_to_limit: ops / limits.sequential,
            extra: vec![("watch_events_per_acquisition".into(), format!("{:.2}", wakeups as f64 / n.max(1) as f64))],
            ..Default::default()
        });
    }
    Ok(out)
}

/// A minimal SVG line chart, written by distlock itself.
pub(crate) fn plot_lines(
    path: &std::path::Path,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[(&str, Vec<(f64, f64)>)],
    (hline, hline_label): (f64, &str),
) -> anyhow::Result<()> {
    let (w, h, m) = (640.0, 400.0, 60.0);
    let pts: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let xmax = pts.iter().map(|p| p.0).fold(1.0, f64::max);
    let ymax = pts.iter().map(|p| p.1).fold(hline, f64::max) * 1.1;
    let sx = |x: f64| m + x / xmax * (w - 2.0 * m);
    let sy = |y: f64| h - m - y / ymax.max(1e-9) * (h - 2.0 * m);
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n<text x='{}' y='20' text-anchor='middle' font-size='14'>{title}</text>\n<line x1='{m}' y1='{}' x2='{}' y2='{}' stroke='black'/>\n<line x1='{m}' y1='{m}' x2='{m}' y2='{}' stroke='black'/>\n<text x='{}' y='{}' text-anchor='middle'>{xlabel}</text>\n<text x='15' y='{}' transform='rotate(-90 15 {})' text-anchor='middle'>{ylabel}</text>\n",
        w / 2.0, h - m, w - m, h - m, h - m, w / 2.0, h - 15.0, h / 2.0, h / 2.0
    );
    for i in 0..=4 {
        let (xv, yv) = (xmax * i as f64 / 4.0, ymax * i as f64 / 4.0);
        svg += &format!("<text x='{}' y='{}' text-anchor='middle'>{:.0}</text>\n", sx(xv), h - m + 15.0, xv);
        svg += &format!(
            "<text x='{}' y='{}' text-anchor='end'>{}</text>\n",
            m - 5.0,
            sy(yv) + 4.0,
            if ymax < 10.0 { format!("{yv:.2}") } else { format!("{yv:.0}") }
        );
    }
    if hline > 0.0 {
        svg += &format!("<line x1='{m}' y1='{y}' x2='{}' y2='{y}' stroke='gray' stroke-dasharray='4'/><text x='{}' y='{}' text-anchor='end' fill='gray'>{hline_label}</text>\n", w - m, w - m, sy(hline) - 4.0, y = sy(hline));
    }
    let colors = ["#1f77b4", "#d62728", "#2ca02c"];
    for (i, (name, p)) in series.iter().enumerate() {
        let d: Vec<String> = p.iter().map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y))).collect();
        svg +=
            &format!("<polyline fill='none' stroke='{}' stroke-width='2' points='{}'/>\n", colors[i % 3], d.join(" "));
        for (x, y) in p.iter().filter(|_| p.len() < 50) {
            svg += &format!("<circle cx='{:.1}' cy='{:.1}' r='3' fill='{}'/>\n", sx(*x), sy(*y), colors[i % 3]);
        }
        svg += &format!(
            "<text x='{}' y='{}' fill='{}'>{name}</text>\n",
            m + 10.0,
            m + 15.0 * (i as f64 + 1.0),
            colors[i % 3]
        );
    }
    svg += "</svg>\n";
    std::fs::create_dir_all(path.parent().unwrap_or(std::path::Path::new(".")))
        .and_then(|()| std::fs::write(path, svg))
        .map_err(|e| anyhow::anyhow!("--plot: cannot write {}: {e}", path.display()))
}

/// Lock + release cycles of `lock`, one at a time, taking turns slice by slice (20 of them) with
/// the backend's floor pair, so that both see the same server weather: the `uncontended` report.
pub(crate) async fn interleaved<F, Fut>(
    lock: &distlock::Lock,
    mut floor_pair: F,
    duration: Duration,
    extra: Vec<(String, String)>,
    progress: &Progress,
) -> anyhow::Result<Report>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let slice = (duration / 20).max(Duration::from_millis(20));
    let (mut ours, mut ours_time, mut floor, mut floor_time) = (0u64, Duration::ZERO, 0u64, Duration::ZERO);
    let mut samples = Vec::new();
    let start = std::time::Instant::now();
    while ours_time < duration {
        let began = std::time::Instant::now();
        while began.elapsed() < slice {
            floor_pair().await?;
            floor += 1;
        }
        floor_time += began.elapsed();
        let began = std::time::Instant::now();
        while began.elapsed() < slice {
            let t = std::time::Instant::now();
            lock.lock().await?.release().await?;
            samples.push(t.elapsed().as_micros() as u64);
            ours += 1;
        }
        ours_time += began.elapsed();
        progress.show("uncontended", ours, start.elapsed());
    }
    let (p50, p99, p999) = summarize(samples);
    let mut extra = extra;
    extra.push(("limit".into(), format!("floor sequential, interleaved in {slice:?} slices")));
    Ok(Report {
        p50_us: p50,
        p99_us: p99,
        p999_us: p999,
        ..report("uncontended", ours as f64 / ours_time.as_secs_f64(), floor as f64 / floor_time.as_secs_f64(), extra)
    })
}

/// `clients` clients of `url` (each its own connection) take and release lock `name` for
/// `duration`: hand-offs per second against `floor`, and how evenly the clients got it.
pub(crate) async fn contended_on(
    url: &str,
    name: &str,
    clients: u32,
    duration: Duration,
    floor: f64,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let start = std::time::Instant::now();
    let until = start + duration;
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (url, name) = (url.to_string(), name.to_string());
        handles.push(tokio::spawn(async move {
            let client = distlock::connect(&url).await?;
            let lock = client.mutex(&name)?;
            let mut n = 0u64;
            while std::time::Instant::now() < until {
                lock.lock().await?.release().await?;
                n += 1;
            }
            Ok::<u64, anyhow::Error>(n)
        }));
    }
    let mut counts = Vec::new();
    for h in handles {
        counts.push(h.await??);
        progress.show("contended", counts.iter().sum(), start.elapsed());
    }
    let ops = counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64();
    let (min, max) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
    Ok(report(
        "contended",
        ops,
        floor,
        vec![
            ("clients".into(), clients.to_string()),
            ("per_client_min".into(), min.to_string()),
            ("per_client_max".into(), max.to_string()),
            ("min_over_max".into(), format!("{:.2}", min as f64 / max.max(1) as f64)),
            ("limit".into(), "floor sequential".into()),
        ],
    ))
}

/// The fault proxy a `--rtt` run goes through, which counts the client's writes as they arrive.
pub(crate) struct Wire(Option<distlock_faults::FaultProxy>);

impl Wire {
    /// Client writes so far (all connections), when running through the proxy.
    fn writes(&self) -> Option<u64> {
        self.0.as_ref().map(|p| p.writes_to_upstream())
    }

    /// Client writes per operation since `before` (nothing without the proxy).
    fn per_op(&self, before: Option<u64>, ops: u64) -> Option<f64> {
        Some((self.writes()? - before?) as f64 / ops.max(1) as f64)
    }

    /// [`Wire::per_op`] as a report's extra.
    fn per(&self, before: Option<u64>, ops: u64) -> Vec<(String, String)> {
        self.per_op(before, ops).map(|w| ("wire_writes_per_op".into(), format!("{w:.2}"))).into_iter().collect()
    }
}

/// Starts a fault proxy in front of `url`'s one server that holds every reply back by `rtt`;
/// returns it and the URL that goes through it.
pub(crate) async fn through_proxy(url: &str, rtt: Duration) -> anyhow::Result<(distlock_faults::FaultProxy, String)> {
    let bad = |why: &str| anyhow::anyhow!("--rtt: {why} in {url}");
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme://"))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    if hostport.is_empty() || scheme == "sqlite" {
        return Err(bad("no server to put a proxy in front of"));
    }
    if hostport.contains(',') {
        return Err(bad("more than one server (the proxy stands in front of one)"));
    }
    let upstream = tokio::net::lookup_host(hostport)
        .await
        .map_err(|e| bad(&format!("cannot resolve {hostport} ({e})")))?
        .next()
        .ok_or_else(|| bad(&format!("{hostport} resolves to no address")))?;
    let proxy = distlock_faults::FaultProxy::start(upstream).await?;
    proxy.set(distlock_faults::Fault::Delay { to_client: rtt, to_upstream: Duration::ZERO });
    let proxied = format!("{scheme}://{user}{}{tail}", proxy.addr());
    Ok((proxy, proxied))
}

/// ZooKeeper's connect string (`host:port[/chroot]`) of a zk:// URL, for Curator.
fn curator_connect(url: &str) -> anyhow::Result<String> {
    let rest = url.strip_prefix("zk://").ok_or_else(|| anyhow::anyhow!("--curator needs a zk:// URL, not {url}"))?;
    Ok(rest.split('?').next().unwrap_or(rest).to_string())
}

/// Rounds of distlock and Curator in turns, for `--curator`.
const CURATOR_ROUNDS: usize = 3;

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn joined(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join("/")
}

/// A compared pair of reports: distlock's and Curator's medians over the rounds.
#[allow(clippy::too_many_arguments)]
fn compared(
    name: &str,
    limit: f64,
    ours: &[f64],
    ours_wire: &[f64],
    theirs: &[f64],
    theirs_wire: &[f64],
    mut ours_extra: Vec<(String, String)>,
    mut theirs_extra: Vec<(String, String)>,
) -> Vec<Report> {
    let (o, t) = (median(ours), median(theirs));
    ours_extra.push(("rounds".into(), joined(ours)));
    ours_extra.push(("over_curator".into(), format!("{:.2}", o / t)));
    theirs_extra.push(("rounds".into(), joined(theirs)));
    if !ours_wire.is_empty() {
        ours_extra.push(("wire_writes_per_op".into(), format!("{:.2}", median(ours_wire))));
        theirs_extra.push(("wire_writes_per_op".into(), format!("{:.2}", median(theirs_wire))));
    }
    vec![
        report(&format!("{name}-vs-curator"), o, limit, ours_extra),
        report(&format!("curator-{name}"), t, limit, theirs_extra),
    ]
}

/// Uncontended cycles of distlock and of Curator in turns (medians of [`CURATOR_ROUNDS`]).
async fn uncontended_vs_curator(
    url: &str,
    prefix: &str,
    duration: Duration,
    limits: &Limits,
    progress: &Progress,
    wire: &Wire,
    curator: &mut crate::bench_curator::Curator,
) -> anyhow::Result<Vec<Report>> {
    let client = raw_client(url).await?;
    let lock = client.mutex(&format!("{prefix}/uncontended-vs-curator"))?;
    let theirs_path = format!("{prefix}/curator-uncontended");
    // Outside the rounds: the directories, and the JVM's warm-up (its JIT).
    lock.lock().await?.release().await?;
    curator.uncontended(&theirs_path, Duration::from_secs(2)).await?;
    let (mut ours, mut ours_wire, mut theirs, mut theirs_wire) = (vec![], vec![], vec![], vec![]);
    for round in 1..=CURATOR_ROUNDS {
        let before = wire.writes();
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < duration {
            lock.lock().await?.release().await?;
            n += 1;
        }
        ours.push(n as f64 / start.elapsed().as_secs_f64());
        ours_wire.extend(wire.per_op(before, n));
        progress.show(&format!("uncontended vs Curator, round {round}"), n, start.elapsed());
        let before = wire.writes();
        let (m, elapsed) = curator.uncontended(&theirs_path, duration).await?;
        theirs.push(m as f64 / elapsed.as_secs_f64());
        theirs_wire.extend(wire.per_op(before, m));
    }
    Ok(compared("uncontended", limits.sequential, &ours, &ours_wire, &theirs, &theirs_wire, vec![], vec![]))
}

/// Contended hand-offs of distlock and of Curator in turns (medians of [`CURATOR_ROUNDS`]).
#[allow(clippy::too_many_arguments)]
async fn contended_vs_curator(
    url: &str,
    prefix: &str,
    clients: u32,
    duration: Duration,
    limits: &Limits,
    progress: &Progress,
    wire: &Wire,
    curator: &mut crate::bench_curator::Curator,
) -> anyhow::Result<Vec<Report>> {
    curator.contended(&format!("{prefix}/curator-warm-up"), clients, Duration::from_secs(2)).await?;
    let (mut ours, mut ours_wire, mut theirs, mut theirs_wire) = (vec![], vec![], vec![], vec![]);
    let mut fairness = (vec![], vec![]);
    for round in 1..=CURATOR_ROUNDS {
        let before = wire.writes();
        let r = contended(url, prefix, clients, duration, limits, progress, &Wire(None)).await?;
        let handoffs = (r.ops_per_sec * duration.as_secs_f64()).max(1.0);
        ours.push(r.ops_per_sec);
        ours_wire.extend(wire.per_op(before, handoffs as u64));
        fairness.0.extend(r.extra.into_iter().filter(|(k, _)| k == "fairness_min/max").map(|(_, v)| v));
        progress.show(&format!("contended vs Curator, round {round}"), handoffs as u64, duration);
        let before = wire.writes();
        let c = curator.contended(&format!("{prefix}/curator-contended-{clients}-{round}"), clients, duration).await?;
        theirs.push(c.handoffs as f64 / c.elapsed.as_secs_f64());
        theirs_wire.extend(wire.per_op(before, c.handoffs));
        fairness.1.push(format!("{}/{}", c.min, c.max));
    }
    let name = format!("contended-{clients}");
    let ours_extra = vec![("fairness_min/max".into(), fairness.0.join(" "))];
    let theirs_extra = vec![("fairness_min/max".into(), fairness.1.join(" "))];
    Ok(compared(&name, limits.sequential, &ours, &ours_wire, &theirs, &theirs_wire, ours_extra, theirs_extra))
}

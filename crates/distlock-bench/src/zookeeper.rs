//! `distlock bench` on ZooKeeper (`zk://`, or `embedded` for an in-process server): the server's
//! own limit (create+delete pairs of an ephemeral node), every workload against it, the run's
//! directory removed at the end, and Apache Curator measured beside distlock with `--curator`.

use super::curator::Curator;
use super::harness::{
    min_max, plot_lines, print_table, report, summarize, through_proxy, Bench, BenchArgs, Progress, Report,
};
use distlock::zookeeper::{Client, MetricsSnapshot};
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use zookeeper_client as zk;

struct Limits {
    sequential: f64,
    pipelined: f64,
}

/// The workloads that write a plot with `--plot`.
const PLOTTED: [&str; 2] = ["uncontended", "contended"];

/// Every run works under `/distlock-bench/<run id>`; the run removes its own directory, then this
/// one if nothing else is left in it.
pub(crate) const BENCH_ROOT: &str = "/distlock-bench";

/// Runs `workloads` on ZooKeeper (zk:// or embedded) under a directory of its own, removed at
/// the end, also when interrupted (SIGINT, SIGTERM).
pub(super) async fn run(
    args: &BenchArgs,
    backend: &str,
    workloads: Vec<String>,
    progress: &Progress,
) -> anyhow::Result<u8> {
    if workloads.iter().any(|w| w == "optimistic") {
        anyhow::bail!(
            "workload optimistic is measured on mysql:// and sqlite:// backends (a version column needs a table)"
        );
    }
    if args.plot.is_some() {
        let mut unplotted: Vec<&str> = Vec::new();
        for w in workloads.iter().map(String::as_str) {
            if !PLOTTED.contains(&w) && w != "scaling" && !unplotted.contains(&w) {
                unplotted.push(w);
            }
        }
        if !unplotted.is_empty() {
            eprintln!(
                "distlock-bench: --plot: nothing to plot for workload{} {} (only {} write plots)",
                if unplotted.len() > 1 { "s" } else { "" },
                unplotted.join(", "),
                PLOTTED.join(" and ")
            );
        }
    }
    let (_embedded, url) = super::harness::embedded_or(backend).await?;
    let (url, wire) = match args.rtt {
        Some(rtt) => {
            let (proxy, url) = through_proxy(&url, rtt).await?;
            (url, Wire(Some(proxy)))
        }
        None => (url, Wire(None)),
    };
    let mut curator = match args.curator {
        true => Some(Curator::start(&curator_connect(&url)?).await?),
        false => None,
    };
    let prefix = format!("{BENCH_ROOT}/{}", uuid::Uuid::new_v4().simple());
    // This session measures the raw limit, then removes what the run created, whether the
    // workloads succeed, fail or are interrupted. (Nothing is created before it connects.)
    let admin = raw_client(&url).await?;
    let mut stop = StopSignals::new();
    let measured = tokio::select! {
        r = measure(args, &workloads, &url, &prefix, &admin, progress, &wire, curator.as_mut()) => Ok(r),
        sig = stop.next() => Err(sig),
    };
    progress.clear();
    let removed = tokio::select! {
        r = remove_run(&admin, &prefix) => r,
        sig = stop.next() => {
            eprintln!("distlock-bench: interrupted again: {prefix} is left on the server");
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
                eprintln!("distlock-bench: {r:#}");
            }
            Err(e)
        }
        Err(sig) => {
            match removed {
                Ok(()) => eprintln!("distlock-bench: interrupted; its nodes are removed"),
                Err(r) => eprintln!("distlock-bench: interrupted; {r:#}"),
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
    mut curator: Option<&mut Curator>,
) -> anyhow::Result<Vec<Report>> {
    // The limit is always measured first, in the same run, on the same server.
    let limits = raw_limits(admin, prefix, args.duration, progress).await?;
    let bench = Bench { url, prefix, duration: args.duration, limits: &limits, progress };
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
                let mut v = uncontended(bench, args.plot.as_deref(), wire).await?;
                if let Some(c) = curator.as_deref_mut() {
                    v.extend(uncontended_vs_curator(bench, wire, c).await?);
                }
                v
            }
            "contended" => {
                let mut v = vec![contended(bench, args.clients, wire).await?];
                if let Some(c) = curator.as_deref_mut() {
                    v.extend(contended_vs_curator(bench, args.clients, wire, c).await?);
                }
                if let Some(dir) = &args.plot {
                    let mut points = Vec::new();
                    for n in [1u32, 2, 4, 8, 16, 32] {
                        let r = contended(bench, n, wire).await?;
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
                vec![many_locks(bench, args.locks, args.tasks).await?]
            }
            "waiters" => vec![waiters(bench, args.count).await?],
            "herd" => herd(bench, args.clients).await?,
            "scaling" => {
                let run = super::harness::BenchParams {
                    url,
                    workloads: &[],
                    duration: args.duration,
                    clients: args.clients,
                    json: args.json,
                    progress,
                    plot: args.plot.as_deref(),
                };
                super::harness::scaling_on(&run, &format!("{prefix}/scaling"), limits.sequential).await?
            }
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
pub(crate) async fn remove_run(client: &Client, prefix: &str) -> anyhow::Result<()> {
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
        if pairs.is_multiple_of(256) {
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
        if pairs.is_multiple_of(1024) {
            progress.show("raw pipelined", pairs, start.elapsed());
        }
    }
    let pipelined = pairs as f64 / start.elapsed().as_secs_f64();
    Ok(Limits { sequential, pipelined })
}

async fn uncontended(
    bench: Bench<'_, Limits>,
    plot: Option<&std::path::Path>,
    wire: &Wire,
) -> anyhow::Result<Vec<Report>> {
    let Bench { url, prefix, duration, limits, progress } = bench;
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
        if n.is_multiple_of(256) {
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
        if d.is_multiple_of(256) {
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

async fn contended(bench: Bench<'_, Limits>, clients: u32, wire: &Wire) -> anyhow::Result<Report> {
    let Bench { url, prefix, duration, limits, progress } = bench;
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
    let (min, max) = min_max(&per_client);
    let wakeups: u64 = sessions.iter().map(|c| c.metrics().snapshot().watch_wakeups).sum();
    let on_wire = wire.per(wire_before, n);
    let extra = vec![
        ("fairness_min/max".into(), format!("{min}/{max}")),
        ("watch_events_per_acquisition".into(), format!("{:.2}", wakeups as f64 / n.max(1) as f64)),
    ]
    .into_iter()
    .chain(on_wire)
    .collect();
    let waits = std::mem::take(&mut *waits.lock().unwrap());
    Ok(report(&format!("contended-{clients}"), ops, limits.sequential, extra).with_latencies(waits))
}

async fn many_locks(bench: Bench<'_, Limits>, locks: u32, tasks: u32) -> anyhow::Result<Report> {
    let Bench { url, prefix, duration, limits, progress } = bench;
    let client = raw_client(url).await?;
    let handles: Vec<_> = (0..locks).map(|i| client.mutex(&format!("{prefix}/many/l{i}"))).collect::<Result<_, _>>()?;
    // Create the directories outside the measurement.
    futures::future::try_join_all(handles.iter().map(|l| async move { l.lock().await?.release().await })).await?;
    let recipe_floor = recipe_floor(&client, prefix, locks, tasks, duration).await?;
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
    let lat = std::mem::take(&mut *lat.lock().unwrap());
    let extra = vec![
        ("floor_recipe".into(), format!("{recipe_floor:.0}")),
        ("ratio_to_floor_recipe".into(), format!("{:.2}", ops / recipe_floor)),
    ];
    Ok(report(&format!("many-locks-{locks}x{tasks}"), ops, limits.pipelined, extra).with_latencies(lat))
}

/// The server's cost of the recipe's own requests, shaped like `many-locks` (as many tasks, the
/// same number of lock directories, one session) with no lock logic: each cycle is an ephemeral sequential
/// create sent with a listing of its directory (one write), then the node's delete. Cycles per
/// second.
async fn recipe_floor(
    client: &Client,
    prefix: &str,
    locks: u32,
    tasks: u32,
    duration: Duration,
) -> anyhow::Result<f64> {
    let zk = client.zookeeper().clone();
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    // Directories of their own, persistent (the locks' are containers, which the server may reap
    // between uses: that cost is the recipe's, not the server's floor).
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let dirs: Vec<String> = (0..locks).map(|i| format!("{prefix}/many-floor/l{i}")).collect();
    futures::future::try_join_all(dirs.iter().map(|d| zk.mkdir(d, &persistent))).await?;
    let start = Instant::now();
    let mut jobs = tokio::task::JoinSet::new(); // dropped early on an error: aborts the rest
    for t in 0..tasks {
        let (zk, options, prefix) = (zk.clone(), options.clone(), prefix.to_string());
        jobs.spawn(async move {
            let (mut i, mut n) = (t as usize, 0u64);
            while start.elapsed() < duration {
                let dir = format!("{prefix}/many-floor/l{}", i % locks as usize);
                i += tasks as usize;
                let node = format!("{dir}/_c_floor-lock-");
                let batch = zk.batch();
                let (create, list) = (batch.create(&node, b"", &options), batch.list_children(&dir));
                batch.send();
                let (created, listed) = futures::join!(create, list);
                let (_, seq) = created?;
                listed?;
                zk.delete(&format!("{node}{seq}"), None).await?;
                n += 1;
            }
            Ok::<u64, zk::Error>(n)
        });
    }
    let mut cycles = 0;
    while let Some(j) = jobs.join_next().await {
        cycles += j??;
    }
    Ok(cycles as f64 / start.elapsed().as_secs_f64())
}

/// The server's watch count from the `mntr` four-letter word (None if it does not answer, and on
/// a TLS port, which this plaintext probe cannot speak to).
async fn server_watches(url: &str) -> Option<u64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if url.starts_with("zks://") {
        return None;
    }
    let host = distlock::zookeeper::ZkUrl::parse(url).ok()?.hosts().first()?.clone();
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

async fn waiters(bench: Bench<'_, Limits>, count: u32) -> anyhow::Result<Report> {
    let Bench { url, prefix, limits, progress, .. } = bench;
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
        if drained.is_multiple_of(256) {
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

async fn herd(bench: Bench<'_, Limits>, clients: u32) -> anyhow::Result<Vec<Report>> {
    let Bench { url, prefix, duration, limits, progress } = bench;
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
    bench: Bench<'_, Limits>,
    wire: &Wire,
    curator: &mut Curator,
) -> anyhow::Result<Vec<Report>> {
    let Bench { url, prefix, duration, limits, progress } = bench;
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
async fn contended_vs_curator(
    bench: Bench<'_, Limits>,
    clients: u32,
    wire: &Wire,
    curator: &mut Curator,
) -> anyhow::Result<Vec<Report>> {
    let Bench { prefix, duration, limits, progress, .. } = bench;
    curator.contended(&format!("{prefix}/curator-warm-up"), clients, Duration::from_secs(2)).await?;
    let (mut ours, mut ours_wire, mut theirs, mut theirs_wire) = (vec![], vec![], vec![], vec![]);
    let mut fairness = (vec![], vec![]);
    for round in 1..=CURATOR_ROUNDS {
        let before = wire.writes();
        let r = contended(bench, clients, &Wire(None)).await?;
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

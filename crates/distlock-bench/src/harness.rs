//! The shared, backend-neutral part of `distlock bench`, below every backend's file: the
//! arguments, the report (one JSON line with --json, or the table), percentiles, progress, the
//! SVG plots, the workloads measured alike on several backends (interleaved uncontended cycles,
//! contended hand-offs), and the `--rtt` fault proxy.

use serde::Serialize;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Backend URL, or `embedded` for an in-process server. Defaults to $DISTLOCK_BACKEND, then
    /// zk://127.0.0.1:2181.
    #[arg(long, env = "DISTLOCK_BACKEND", hide_env_values = true, default_value = crate::DEFAULT_BACKEND)]
    pub(super) backend: String,
    /// TLS: the CA certificates (PEM) that verify the server, as on every other subcommand (the
    /// URL's cacert=). Every floor and peer of the run then connects over TLS as the lock does.
    #[arg(long, value_name = "PEM_FILE")]
    pub(super) cacert: Option<std::path::PathBuf>,
    /// TLS: the client certificate (PEM) for a server that asks for one; needs --key.
    #[arg(long, value_name = "PEM_FILE", requires = "key")]
    pub(super) cert: Option<std::path::PathBuf>,
    /// TLS: the client certificate's private key (PEM); needs --cert.
    #[arg(long, value_name = "PEM_FILE", requires = "cert")]
    pub(super) key: Option<std::path::PathBuf>,
    /// How long each workload runs.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "10s")]
    pub(super) duration: Duration,
    /// One JSON object per workload per line instead of a table.
    #[arg(long)]
    pub(super) json: bool,
    /// Sessions for `contended` and `herd`.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(super) clients: u32,
    /// Distinct locks for `many-locks`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) locks: u32,
    /// Tasks for `many-locks`.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) tasks: u32,
    /// Locks one client holds at once for `held` (all or nothing, as `distlock hold n1 … nK`).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(super) held: u32,
    /// How many lease periods `held` holds its locks for (the run's lease: the URL's).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(super) held_periods: u32,
    /// Waiting handles for `waiters`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(super) count: u32,
    /// Also write SVG plots here: acquire latency distribution (uncontended) and throughput
    /// against sessions (contended; runs the workload at 1, 2, 4, 8, 16 and 32 sessions too).
    /// Other workloads have nothing to plot.
    #[arg(long, value_name = "DIR")]
    pub(super) plot: Option<std::path::PathBuf>,
    /// Run through the project's fault proxy, which holds back every reply this long, as a
    /// network between machines would (e.g. 1ms); `uncontended` and `contended` then also report
    /// the client's writes per cycle counted on the wire (`0ms` counts without delaying). Needs
    /// one server: a URL with one host, or `embedded`.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg)]
    pub(super) rtt: Option<Duration>,
    /// Also measure Apache Curator's InterProcessMutex (zk:// and embedded): `uncontended` and
    /// `contended` then run three rounds each, distlock and Curator in turns, on the same server
    /// (and proxy). Needs Java 17 and Debian's Curator jars (libcurator-recipes-java).
    #[arg(long)]
    pub(super) curator: bool,
    /// Workloads: raw, uncontended, contended, many-locks, waiters, herd, optimistic, scaling,
    /// observe, handover, held (default: all the backend has but scaling, observe, handover and
    /// held, which run only when asked for). `observe` measures what metrics and spans cost,
    /// `handover` an election's time without a leader (resign, and SIGKILL of the leader), and
    /// `held` the cost per held lock (one client holding `--held` locks for `--held-periods`
    /// leases: acquire time, server connections, requests per second while holding, heap and RSS
    /// per lock, beside the server's own floor), on any backend.
    #[arg(value_name = "WORKLOAD", value_parser = ["raw", "uncontended", "contended", "many-locks", "waiters", "herd", "optimistic", "scaling", "observe", "handover", "held"])]
    pub(super) workloads: Vec<String>,
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

/// `backend`'s URL, starting an in-process server (fsync never) for `embedded`: keep the server
/// as long as the URL is used.
pub(crate) async fn embedded_or(backend: &str) -> anyhow::Result<(Option<distlock_server::EmbeddedServer>, String)> {
    if backend != "embedded" {
        return Ok((None, backend.to_string()));
    }
    // `mntr` too: the bench reads the server's watch count. Every session comes from loopback:
    // only the total limits connections (`--clients` goes up to 1000).
    let defaults = distlock_server::Config::default();
    let cfg = distlock_server::Config {
        fsync: distlock_server::Fsync::Never,
        four_letter_words: distlock_server::FOUR_LETTER_WORDS.to_vec(),
        max_connections_per_address: defaults.max_connections,
        ..defaults
    };
    let s = distlock_server::EmbeddedServer::start_with(cfg).await?;
    let url = s.url();
    Ok((Some(s), url))
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

impl Report {
    /// This report with the percentiles of `samples` (µs).
    pub(crate) fn with_latencies(self, samples: Vec<u64>) -> Report {
        let (p50_us, p99_us, p999_us) = summarize(samples);
        Report { p50_us, p99_us, p999_us, ..self }
    }
}

/// The fewest and most acquisitions of one client (0 and 0 without clients).
pub(crate) fn min_max(counts: &[u64]) -> (u64, u64) {
    (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0))
}

/// How evenly the clients got the lock: the fewest and most acquisitions of one client.
pub(crate) fn fairness(min: u64, max: u64) -> Vec<(String, String)> {
    vec![
        ("per_client_min".into(), min.to_string()),
        ("per_client_max".into(), max.to_string()),
        ("min_over_max".into(), format!("{:.2}", min as f64 / max.max(1) as f64)),
    ]
}

pub(crate) struct Progress {
    pub(super) on: bool,
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

pub(super) fn print_table(reports: &[Report]) {
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
    floor_pair: F,
    duration: Duration,
    extra: Vec<(String, String)>,
    progress: &Progress,
) -> anyhow::Result<Report>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let cycle = || async {
        lock.lock().await?.release().await?;
        Ok(())
    };
    interleaved_cycle("uncontended", cycle, floor_pair, duration, extra, progress).await
}

/// [`interleaved`] for any acquire+release `cycle` (a peer's, say), reported as `workload`.
pub(crate) async fn interleaved_cycle<C, CFut, F, Fut>(
    workload: &str,
    mut cycle: C,
    mut floor_pair: F,
    duration: Duration,
    extra: Vec<(String, String)>,
    progress: &Progress,
) -> anyhow::Result<Report>
where
    C: FnMut() -> CFut,
    CFut: std::future::Future<Output = anyhow::Result<()>>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let slice = (duration / 20).max(Duration::from_millis(20));
    let (mut ours, mut ours_time, mut floor, mut floor_time) = (0u64, Duration::ZERO, 0u64, Duration::ZERO);
    let mut samples = Vec::new();
    // Client writes during our slices only (the floor's go through the same proxy).
    let mut wire = wire_writes().map(|_| 0u64);
    let start = std::time::Instant::now();
    while ours_time < duration {
        let began = std::time::Instant::now();
        while began.elapsed() < slice {
            floor_pair().await?;
            floor += 1;
        }
        floor_time += began.elapsed();
        let began = std::time::Instant::now();
        let writes_before = wire_writes();
        while began.elapsed() < slice {
            let t = std::time::Instant::now();
            cycle().await?;
            samples.push(t.elapsed().as_micros() as u64);
            ours += 1;
        }
        ours_time += began.elapsed();
        if let (Some(w), Some(after), Some(before)) = (wire.as_mut(), wire_writes(), writes_before) {
            *w += after - before;
        }
        progress.show(workload, ours, start.elapsed());
    }
    let mut extra = extra;
    extra.extend(wire_extra("cycle", wire, ours));
    extra.push(("limit".into(), format!("floor sequential, interleaved in {slice:?} slices")));
    let (ops, limit) = (ours as f64 / ours_time.as_secs_f64(), floor as f64 / floor_time.as_secs_f64());
    Ok(report(workload, ops, limit, extra).with_latencies(samples))
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
    // Every client connects before the clock starts.
    let mut locks = Vec::new();
    for _ in 0..clients {
        let client = distlock::connect(url).await?;
        locks.push((client.mutex(name)?, client));
    }
    let writes_before = wire_writes();
    let start = std::time::Instant::now();
    let until = start + duration;
    let mut handles = Vec::new();
    for (lock, client) in locks {
        handles.push(tokio::spawn(async move {
            let _client = client;
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
    let writes = wire_writes().zip(writes_before).map(|(after, before)| after - before);
    let (min, max) = min_max(&counts);
    let mut extra = vec![("clients".into(), clients.to_string())];
    extra.extend(fairness(min, max));
    extra.extend(wire_extra("handoff", writes, counts.iter().sum()));
    extra.push(("limit".into(), "floor sequential".into()));
    Ok(report("contended", ops, floor, extra))
}

/// The `--rtt` proxy of a run on a backend other than ZooKeeper, whose count of client writes the
/// shared workloads read around their own cycles (ZooKeeper's bench keeps its own, per request).
static WIRE: std::sync::OnceLock<std::sync::Arc<distlock_faults::FaultProxy>> = std::sync::OnceLock::new();

/// Counts the wire through `proxy` for the rest of the run.
pub(crate) fn count_wire(proxy: std::sync::Arc<distlock_faults::FaultProxy>) {
    let _ = WIRE.set(proxy);
}

/// Client writes so far, when the run goes through the `--rtt` proxy.
pub(crate) fn wire_writes() -> Option<u64> {
    WIRE.get().map(|p| p.writes_to_upstream())
}

/// `("wire_writes_per_<per>", writes ÷ ops)` when the run counts the wire.
pub(crate) fn wire_extra(per: &str, writes: Option<u64>, ops: u64) -> Vec<(String, String)> {
    writes
        .map(|w| (format!("wire_writes_per_{per}"), format!("{:.2}", w as f64 / ops.max(1) as f64)))
        .into_iter()
        .collect()
}

/// Starts a fault proxy in front of `url`'s one server that holds every reply back by `rtt`;
/// returns it and the URL that goes through it.
pub(crate) async fn through_proxy(url: &str, rtt: Duration) -> anyhow::Result<(distlock_faults::FaultProxy, String)> {
    let (upstream, rebuild) = one_server(url).await?;
    let proxy = distlock_faults::FaultProxy::start(upstream).await?;
    proxy.set(distlock_faults::Fault::Delay { to_client: rtt, to_upstream: Duration::ZERO });
    let proxied = rebuild(&proxy.addr().to_string());
    Ok((proxy, proxied))
}

/// The address of `url`'s one server, and a function making the same URL with another
/// `host:port` in its place (a proxy's).
pub(crate) async fn one_server(url: &str) -> anyhow::Result<(std::net::SocketAddr, impl Fn(&str) -> String)> {
    let bad = |why: &str| anyhow::anyhow!("--rtt: {why} in {}", distlock::redact_url(url));
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
    let (scheme, tail) = (scheme.to_string(), tail.to_string());
    Ok((upstream, move |addr: &str| format!("{scheme}://{user}{addr}{tail}")))
}

/// Refuses a workload `backend` does not measure, naming the ones it does.
pub(crate) fn check_workloads(backend: &str, asked: &[String], known: &[&str]) -> anyhow::Result<()> {
    match asked.iter().find(|w| !known.contains(&w.as_str())) {
        Some(w) => anyhow::bail!("workload {w} is not measured on {backend} yet ({backend}: {})", known.join(", ")),
        None => Ok(()),
    }
}

/// Clears the progress line, prints `done` as JSON lines if asked, and adds them to `all`.
pub(crate) fn emit(done: Vec<Report>, json: bool, progress: &Progress, all: &mut Vec<Report>) -> anyhow::Result<()> {
    progress.clear();
    if json {
        for rep in &done {
            println!("{}", serde_json::to_string(rep)?);
        }
    }
    all.extend(done);
    Ok(())
}

/// What a backend's bench run is asked for: the URL, the workloads, how long each runs, how
/// many clients contend, JSON lines or not, and where progress goes.
#[derive(Clone, Copy)]
pub(crate) struct BenchParams<'a> {
    pub(crate) url: &'a str,
    pub(crate) workloads: &'a [String],
    pub(crate) duration: Duration,
    pub(crate) clients: u32,
    pub(crate) json: bool,
    pub(crate) progress: &'a Progress,
    /// Where `scaling` writes its plots (`--plot`).
    pub(crate) plot: Option<&'a std::path::Path>,
}

/// What every workload of one backend's run works with: the server's URL, the run's own key
/// prefix, how long the workload runs, the backend's floors, and where progress goes.
pub(crate) struct Bench<'a, L> {
    pub(crate) url: &'a str,
    pub(crate) prefix: &'a str,
    pub(crate) duration: Duration,
    pub(crate) limits: &'a L,
    pub(crate) progress: &'a Progress,
}

impl<L> Clone for Bench<'_, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L> Copy for Bench<'_, L> {}

/// Lock names held at once, each by its own task through one client, for `scaling`.
pub(crate) const SCALING_NAMES: [u32; 4] = [1, 10, 100, 1000];
/// Clients contending for one lock, for `scaling`.
pub(crate) const SCALING_CLIENTS: [u32; 3] = [2, 8, 32];

/// How the cost grows with the work, on any backend of the one contract: uncontended cycles/s
/// and p99 with 1, 10, 100 and 1,000 distinct names held at once (a task per name, one client),
/// and contended hand-offs/s with 2, 8 and 32 clients on one name; each point runs `duration`.
/// Ratios are against `floor` (the backend's sequential floor pair). With `plot`, two SVGs.
pub(crate) async fn scaling_on(run: &BenchParams<'_>, base: &str, floor: f64) -> anyhow::Result<Vec<Report>> {
    let (url, duration, progress) = (run.url, run.duration, run.progress);
    let client = distlock::connect(url).await?;
    let mut reports = Vec::new();
    let (mut names_ops, mut names_p99) = (Vec::new(), Vec::new());
    for n in SCALING_NAMES {
        let start = std::time::Instant::now();
        let until = start + duration;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let lock = client.mutex(&format!("{base}-n{n}-{i}"))?;
            tasks.spawn(async move {
                let mut samples = Vec::new();
                while std::time::Instant::now() < until {
                    let t = std::time::Instant::now();
                    lock.lock().await?.release().await?;
                    samples.push(t.elapsed().as_micros() as u64);
                }
                Ok::<_, anyhow::Error>(samples)
            });
        }
        let (mut samples, mut failed) = (Vec::new(), None);
        while let Some(t) = tasks.join_next().await {
            match t? {
                Ok(s) => samples.extend(s),
                // A point the server cannot carry (e.g. more connections than it allows, on a
                // backend whose held lock owns its connection) is reported, not fatal.
                Err(e) => failed = failed.or(Some(format!("{e:#}"))),
            }
        }
        let ops = samples.len() as f64 / start.elapsed().as_secs_f64();
        progress.show("scaling", samples.len() as u64, start.elapsed());
        let mut extra = vec![("names".into(), n.to_string())];
        extra.extend(failed.map(|e| ("error".into(), e)));
        let r = report(&format!("scaling-names-{n}"), ops, floor, extra).with_latencies(samples);
        names_ops.push(((n as f64).log10(), ops));
        names_p99.push(((n as f64).log10(), r.p99_us as f64));
        reports.push(r);
    }
    let mut clients_ops = Vec::new();
    for c in SCALING_CLIENTS {
        let mut r = contended_on(url, &format!("{base}-c{c}"), c, duration, floor, progress).await?;
        r.workload = format!("scaling-clients-{c}");
        clients_ops.push((c as f64, r.ops_per_sec));
        reports.push(r);
    }
    client.close(Duration::from_secs(2)).await;
    if let Some(dir) = run.plot {
        let names = dir.join("scaling-names.svg");
        plot_lines(
            &names,
            "Uncontended cycles/s with N names held at once",
            "log10(names)",
            "cycles/s",
            &[("cycles/s", names_ops)],
            (floor, "floor pair, sequential"),
        )?;
        let p99 = dir.join("scaling-names-p99.svg");
        plot_lines(
            &p99,
            "Uncontended cycle p99 with N names held at once",
            "log10(names)",
            "µs",
            &[("p99", names_p99)],
            (0.0, ""),
        )?;
        let clients = dir.join("scaling-clients.svg");
        plot_lines(
            &clients,
            "Contended hand-offs/s against clients",
            "clients",
            "hand-offs/s",
            &[("hand-offs/s", clients_ops)],
            (floor, "floor pair, sequential"),
        )?;
        reports[0]
            .extra
            .push(("plot".into(), format!("{}, {}, {}", names.display(), p99.display(), clients.display())));
    }
    Ok(reports)
}

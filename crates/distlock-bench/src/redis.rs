//! `distlock bench` on a `redis://` backend: the server's own floors (sequential and pipelined
//! pairs of `SET NX PX` + `DEL`; of `SET NX PX` + compare-and-delete, the common lock done by
//! hand; of a Redisson-layout lock + unlock script pair without fencing or client machinery;
//! on a server with `DELIFEQ` (Valkey 9), of `SET NX PX` + `DELIFEQ`, the same compare-and-delete
//! as one command), each lock workload against its floor, and redis-py's `Lock` beside us.

use super::harness::{check_workloads, emit, fairness, min_max, report, Bench, Progress, Report};
use distlock::redis::Client;
use futures::stream::{FuturesUnordered, StreamExt};
use std::time::{Duration, Instant};

/// The workloads measured on Redis.
pub const WORKLOADS: [&str; 5] = ["raw", "uncontended", "contended", "many-locks", "scaling"];

/// Pairs per second, one at a time and 256 in flight, of each floor.
struct Limits {
    /// `SET NX PX` + `DEL`.
    sequential: f64,
    pipelined: f64,
    /// `SET NX PX` + compare-and-delete script: the simple lock's floor.
    simple: f64,
    simple_pipelined: f64,
    /// `SET NX PX` + `DELIFEQ` (sequential, pipelined), where the server has the command.
    delifeq: Option<(f64, f64)>,
    /// A Redisson-layout lock script + unlock script (hash, hold count, PEXPIRE, PUBLISH): the
    /// Redisson-layout lock's floor.
    redisson: f64,
    redisson_pipelined: f64,
}

/// The bench flags the Redis workloads use.
#[derive(Clone)]
pub struct Settings {
    pub duration: Duration,
    pub clients: u32,
    pub locks: u32,
    pub tasks: u32,
    pub json: bool,
    /// Write SVG plots here: acquire latency (uncontended) and hand-offs/s against clients.
    pub plot: Option<std::path::PathBuf>,
}

/// Runs `workloads` against `url`; every key the run made is deleted at the end (fencing
/// counters included), also when a workload fails.
pub async fn run(
    url: &str,
    workloads: &[String],
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<Vec<Report>> {
    check_workloads("Redis", workloads, &WORKLOADS)?;
    let admin = Client::connect(url).await?;
    let prefix = format!("distlock-bench:{}", uuid::Uuid::new_v4().simple());
    let result = measure(url, &admin, &prefix, workloads, settings, progress).await;
    progress.clear();
    let removed = remove_run(&admin, &prefix).await;
    let reports = result?;
    removed?;
    Ok(reports)
}

async fn measure(
    url: &str,
    admin: &Client,
    prefix: &str,
    workloads: &[String],
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<Vec<Report>> {
    let Settings { duration, clients, locks, tasks, json, ref plot } = *settings;
    let limits = raw_limits(admin, prefix, duration, progress).await?;
    let bench = Bench { url, prefix, duration, limits: &limits, progress };
    let mut reports = Vec::new();
    for w in workloads {
        let r = match w.as_str() {
            "raw" => {
                let mut r = vec![
                    report("raw-sequential", limits.sequential, limits.sequential, Vec::new()),
                    report("raw-pipelined", limits.pipelined, limits.pipelined, Vec::new()),
                    report("floor-simple", limits.simple, limits.simple, Vec::new()),
                    report("floor-simple-pipelined", limits.simple_pipelined, limits.simple_pipelined, Vec::new()),
                ];
                if let Some((sequential, pipelined)) = limits.delifeq {
                    r.push(report("floor-simple-delifeq", sequential, limits.simple, Vec::new()));
                    r.push(report("floor-simple-delifeq-pipelined", pipelined, limits.simple_pipelined, Vec::new()));
                }
                r.push(report("floor-redisson", limits.redisson, limits.redisson, Vec::new()));
                r.push(report(
                    "floor-redisson-pipelined",
                    limits.redisson_pipelined,
                    limits.redisson_pipelined,
                    Vec::new(),
                ));
                r
            }
            "uncontended" => uncontended(bench, plot.as_deref()).await?,
            "contended" => contended(bench, clients, plot.as_deref()).await?,
            "many-locks" => vec![many_locks(bench, locks, tasks).await?],
            "scaling" => {
                let run = super::harness::BenchParams {
                    url,
                    workloads,
                    duration,
                    clients,
                    json,
                    progress,
                    plot: plot.as_deref(),
                };
                super::harness::scaling_on(&run, &format!("{prefix}:scaling"), limits.redisson).await?
            }
            _ => unreachable!("checked above"),
        };
        emit(r, json, progress, &mut reports)?;
    }
    Ok(reports)
}

/// A cumulative distribution of `samples` (µs), thinned to about 400 points.
fn cdf(samples: &[u64]) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    sorted.iter().enumerate().step_by((n / 400).max(1)).map(|(i, us)| (*us as f64, (i + 1) as f64 / n as f64)).collect()
}

/// The usual compare-and-delete (redis-py's too): delete the key only if it holds our value.
const COMPARE_AND_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
/// A Redisson-layout acquire: take the hash if free or ours, count the hold, set the lease.
const REDISSON_LIKE_LOCK: &str =
    "if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then \
     redis.call('hincrby', KEYS[1], ARGV[2], 1) redis.call('pexpire', KEYS[1], ARGV[1]) return nil end \
     return redis.call('pttl', KEYS[1])";
/// A Redisson-layout release: uncount the hold; the last one deletes the hash and publishes `0`.
const REDISSON_LIKE_UNLOCK: &str = "if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return nil end \
     if redis.call('hincrby', KEYS[1], ARGV[1], -1) > 0 then return 0 end \
     redis.call('del', KEYS[1]) redis.call('publish', KEYS[2], '0') return 1";

/// One floor's pairs per second: sequential, then [`WINDOW`] in flight.
async fn floor<F, Fut>(name: &str, duration: Duration, progress: &Progress, pair: F) -> anyhow::Result<(f64, f64)>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), redis::RedisError>>,
{
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < duration {
        pair(0).await?;
        pairs += 1;
        if pairs.is_multiple_of(1024) {
            progress.show(&format!("{name} sequential"), pairs, start.elapsed());
        }
    }
    let sequential = pairs as f64 / start.elapsed().as_secs_f64();
    let pipelined = in_flight(&format!("{name} pipelined"), WINDOW, duration, progress, &pair).await?;
    Ok((sequential, pipelined))
}

/// Pairs in flight for the pipelined floors.
const WINDOW: u64 = 256;

/// Pairs per second of `pair` with `window` in flight at all times (each on a key of its own)
/// for `duration`.
async fn in_flight<F, Fut>(
    name: &str,
    window: u64,
    duration: Duration,
    progress: &Progress,
    pair: &F,
) -> anyhow::Result<f64>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), redis::RedisError>>,
{
    let start = Instant::now();
    let mut pairs = 0u64;
    let mut inflight = FuturesUnordered::new();
    for i in 0..window {
        inflight.push(pair(i + 1));
    }
    let mut next = window;
    while let Some(r) = inflight.next().await {
        r?;
        pairs += 1;
        if start.elapsed() < duration {
            inflight.push(pair(next % (2 * window) + 1));
            next += 1;
        }
        if pairs.is_multiple_of(4096) {
            progress.show(name, pairs, start.elapsed());
        }
    }
    Ok(pairs as f64 / start.elapsed().as_secs_f64())
}

/// The simple lock's floor, one pair: `SET NX PX`, then the compare-and-delete script.
async fn simple_pair(
    mut conn: distlock::redis::Connection,
    key: String,
    cad: &redis::Script,
) -> redis::RedisResult<()> {
    let value = uuid::Uuid::new_v4().simple().to_string();
    let _: Option<String> =
        redis::cmd("SET").arg(&key).arg(&value).arg("NX").arg("PX").arg(30_000).query_async(&mut conn).await?;
    let _: i64 = cad.key(&key).arg(&value).invoke_async(&mut conn).await?;
    Ok(())
}

/// The simple lock's floor with the server's own compare-and-delete, one pair: `SET NX PX`, then
/// `DELIFEQ` (Valkey 9).
async fn delifeq_pair(mut conn: distlock::redis::Connection, key: String) -> redis::RedisResult<()> {
    let value = uuid::Uuid::new_v4().simple().to_string();
    let _: Option<String> =
        redis::cmd("SET").arg(&key).arg(&value).arg("NX").arg("PX").arg(30_000).query_async(&mut conn).await?;
    let _: i64 = redis::cmd("DELIFEQ").arg(&key).arg(&value).query_async(&mut conn).await?;
    Ok(())
}

/// The Redisson-layout lock's floor, one pair: the lock script, then the unlock script.
async fn redisson_pair(
    mut conn: distlock::redis::Connection,
    key: String,
    (lock, unlock): (&redis::Script, &redis::Script),
) -> redis::RedisResult<()> {
    let field = format!("{}:1", uuid::Uuid::new_v4());
    let channel = format!("redisson_lock__channel:{{{key}}}");
    let _: Option<i64> = lock.key(&key).arg(30_000).arg(&field).invoke_async(&mut conn).await?;
    let _: Option<i64> = unlock.key(&key).key(&channel).arg(&field).invoke_async(&mut conn).await?;
    Ok(())
}

/// The Redisson-layout floor's two scripts.
fn redisson_scripts() -> (redis::Script, redis::Script) {
    (redis::Script::new(REDISSON_LIKE_LOCK), redis::Script::new(REDISSON_LIKE_UNLOCK))
}

/// The server's own floors, each a pair of requests per cycle on one connection, one at a time
/// (round-trip bound) and with many in flight (throughput bound).
async fn raw_limits(client: &Client, prefix: &str, duration: Duration, progress: &Progress) -> anyhow::Result<Limits> {
    let conn = client.connection();
    let (sequential, pipelined) = floor("raw", duration, progress, |i| {
        let mut conn = conn.clone();
        let key = format!("{prefix}:raw{i}");
        async move {
            let _: Option<String> =
                redis::cmd("SET").arg(&key).arg("v").arg("NX").arg("PX").arg(30_000).query_async(&mut conn).await?;
            let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
            Ok(())
        }
    })
    .await?;
    let cad = redis::Script::new(COMPARE_AND_DELETE);
    let (simple, simple_pipelined) =
        floor("floor-simple", duration, progress, |i| simple_pair(conn.clone(), format!("{prefix}:simple{i}"), &cad))
            .await?;
    // Right after the script's floor, on a server that knows the command (an unknown one errs).
    let probe: redis::RedisResult<i64> =
        redis::cmd("DELIFEQ").arg(format!("{prefix}:probe")).arg("-").query_async(&mut conn.clone()).await;
    let delifeq = match probe {
        Ok(_) => Some(
            floor("floor-simple-delifeq", duration, progress, |i| {
                delifeq_pair(conn.clone(), format!("{prefix}:delifeq{i}"))
            })
            .await?,
        ),
        Err(_) => None,
    };
    let scripts = redisson_scripts();
    let (redisson, redisson_pipelined) = floor("floor-redisson", duration, progress, |i| {
        redisson_pair(conn.clone(), format!("{prefix}:redisson{i}"), (&scripts.0, &scripts.1))
    })
    .await?;
    Ok(Limits { sequential, pipelined, simple, simple_pipelined, delifeq, redisson, redisson_pipelined })
}

/// Slices of an interleaved measurement: the floor and the lock take turns, so that whatever
/// else the machine does in the meantime (two cores shared with the server) falls on both alike.
const SLICES: u32 = 20;

/// Acquire + release cycles, one at a time, on the mutex (Redisson layout) and on the simple lock,
/// each interleaved slice by slice with its floor's pairs on the same connection.
async fn uncontended(bench: Bench<'_, Limits>, plot: Option<&std::path::Path>) -> anyhow::Result<Vec<Report>> {
    let Bench { url, prefix, duration, limits, progress } = bench;
    let client = Client::connect(url).await?;
    let conn = client.connection();
    let (cad, scripts) = (redis::Script::new(COMPARE_AND_DELETE), redisson_scripts());
    let slice = (duration / SLICES).max(Duration::from_millis(20));
    let mut reports = Vec::new();
    let mut cdfs = Vec::new();
    for (name, simple) in [("uncontended", false), ("uncontended-simple", true)] {
        let key = format!("{prefix}:{name}");
        let floor_key = format!("{prefix}:{name}-floor");
        let (mutex, simple_lock) = (client.mutex(&key)?, client.simple_lock(&key)?);
        let mut acq = Vec::new();
        let (mut ours, mut ours_time, mut floor, mut floor_time) = (0u64, Duration::ZERO, 0u64, Duration::ZERO);
        // Client writes during our slices only, when the run counts the wire (`--rtt`).
        let mut wire = super::harness::wire_writes().map(|_| 0u64);
        let start = Instant::now();
        while ours_time < duration {
            let began = Instant::now();
            while began.elapsed() < slice {
                if simple {
                    simple_pair(conn.clone(), floor_key.clone(), &cad).await?;
                } else {
                    redisson_pair(conn.clone(), floor_key.clone(), (&scripts.0, &scripts.1)).await?;
                }
                floor += 1;
            }
            floor_time += began.elapsed();
            let began = Instant::now();
            let writes_before = super::harness::wire_writes();
            while began.elapsed() < slice {
                let t = Instant::now();
                if simple {
                    simple_lock.lock().await?.release().await?;
                } else {
                    mutex.lock().await?.release().await?;
                }
                acq.push(t.elapsed().as_micros() as u64);
                ours += 1;
            }
            ours_time += began.elapsed();
            if let (Some(w), Some(after), Some(before)) = (wire.as_mut(), super::harness::wire_writes(), writes_before)
            {
                *w += after - before;
            }
            progress.show(name, ours, start.elapsed());
        }
        let ops = ours as f64 / ours_time.as_secs_f64();
        let floor_ops = floor as f64 / floor_time.as_secs_f64();
        cdfs.push((if simple { "simple layout" } else { "Redisson layout" }, cdf(&acq)));
        let floor_name = if simple { "floor-simple" } else { "floor-redisson" };
        let mut extra = vec![("cycle".into(), "acquire+release".into())];
        extra.extend(super::harness::wire_extra("cycle", wire, ours));
        extra.push(("limit".into(), format!("{floor_name} sequential, interleaved in {:?} slices", slice)));
        reports.push(report(name, ops, floor_ops, extra).with_latencies(acq));
    }
    reports.push(peer_redis_py(url, &format!("{prefix}:redis-py"), 1, duration, limits, "uncontended-redis-py")?);
    if let Some(dir) = plot {
        let path = dir.join("uncontended-latency.svg");
        super::harness::plot_lines(
            &path,
            "Uncontended cycle latency (CDF)",
            "microseconds",
            "fraction",
            &cdfs,
            (0.0, ""),
        )?;
        reports[0].extra.push(("plot".into(), path.display().to_string()));
    }
    Ok(reports)
}

async fn contended(
    bench: Bench<'_, Limits>,
    clients: u32,
    plot: Option<&std::path::Path>,
) -> anyhow::Result<Vec<Report>> {
    let Bench { url, prefix, duration, limits, progress } = bench;
    let mut reports = Vec::new();
    for (name, fair) in [("contended", false), ("contended-fair", true)] {
        let writes_before = super::harness::wire_writes();
        let run = hand_offs(url, &format!("{prefix}:{name}"), fair, clients, duration, progress, name).await?;
        let writes = super::harness::wire_writes().zip(writes_before).map(|(after, before)| after - before);
        let (min, max) = min_max(&run.counts);
        let extra = [
            vec![("clients".into(), clients.to_string())],
            fairness(min, max),
            super::harness::wire_extra("handoff", writes, run.counts.iter().sum()),
            vec![("latency".into(), "hand-off: release begun to next acquire done".into())],
        ]
        .concat();
        reports.push(report(name, run.ops, limits.redisson, extra).with_latencies(run.handoffs));
    }
    reports.push(peer_redis_py(
        url,
        &format!("{prefix}:redis-py-contended"),
        clients,
        duration,
        limits,
        "contended-redis-py",
    )?);
    if let Some(dir) = plot {
        let mut series = Vec::new();
        for (label, fair) in [("mutex (Redisson layout)", false), ("fair lock", true)] {
            let mut points = Vec::new();
            for n in [1u32, 2, 4, 8, 16] {
                let key = format!("{prefix}:sweep-{fair}-{n}");
                let run = hand_offs(url, &key, fair, n, duration, progress, "contended sweep").await?;
                points.push((n as f64, run.ops));
            }
            series.push((label, points));
        }
        let path = dir.join("contended-throughput.svg");
        super::harness::plot_lines(
            &path,
            "Contended hand-offs/s against clients",
            "clients",
            "hand-offs/s",
            &series,
            (limits.redisson, "floor: Redisson-layout lock + unlock scripts, sequential"),
        )?;
        reports[0].extra.push(("plot".into(), path.display().to_string()));
    }
    Ok(reports)
}

/// One contended run: what each client got, and every hand-off's latency.
struct HandOffs {
    ops: f64,
    counts: Vec<u64>,
    handoffs: Vec<u64>,
}

/// `clients` clients, each with its own connection, take and release `key` in a loop for
/// `duration`.
async fn hand_offs(
    url: &str,
    key: &str,
    fair: bool,
    clients: u32,
    duration: Duration,
    progress: &Progress,
    name: &str,
) -> anyhow::Result<HandOffs> {
    let mut handles = Vec::new();
    let start = Instant::now();
    let until = start + duration;
    // When the last holder began its release (µs since start; 0: nobody yet): the next acquire's
    // completion minus it is one hand-off.
    let released = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    for _ in 0..clients {
        let (url, key, released) = (url.to_string(), key.to_string(), released.clone());
        handles.push(tokio::spawn(async move {
            let client = Client::connect(&url).await?;
            let (mutex, fair_lock) = (client.mutex(&key)?, client.fair_lock(&key)?);
            let mut n = 0u64;
            let mut handoffs = Vec::new();
            let since = |t: Instant| t.duration_since(start).as_micros() as u64;
            while Instant::now() < until {
                let guard = if fair { Err(fair_lock.lock().await?) } else { Ok(mutex.lock().await?) };
                let got = since(Instant::now());
                let prev = released.swap(0, std::sync::atomic::Ordering::SeqCst);
                if prev > 0 {
                    handoffs.push(got.saturating_sub(prev));
                }
                released.store(since(Instant::now()).max(1), std::sync::atomic::Ordering::SeqCst);
                match guard {
                    Ok(g) => g.release().await?,
                    Err(g) => g.release().await?,
                }
                n += 1;
            }
            Ok::<(u64, Vec<u64>), anyhow::Error>((n, handoffs))
        }));
    }
    let (mut counts, mut handoffs) = (Vec::new(), Vec::new());
    for h in handles {
        let (n, mut lat) = h.await??;
        counts.push(n);
        handoffs.append(&mut lat);
        progress.show(name, counts.iter().sum(), start.elapsed());
    }
    let ops = counts.iter().sum::<u64>() as f64 / start.elapsed().as_secs_f64();
    Ok(HandOffs { ops, counts, handoffs })
}

/// Pairs per second of the Redisson-layout floor run by `tasks` tasks at once on `conn`, each
/// on a key of its own, one pair after another.
async fn floor_tasks(
    conn: distlock::redis::Connection,
    prefix: &str,
    tasks: u32,
    duration: Duration,
) -> anyhow::Result<f64> {
    let scripts = std::sync::Arc::new(redisson_scripts());
    let start = Instant::now();
    let until = start + duration;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (conn, scripts, key) = (conn.clone(), scripts.clone(), format!("{prefix}:many-floor{t}"));
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                redisson_pair(conn.clone(), key.clone(), (&scripts.0, &scripts.1)).await?;
                n += 1;
            }
            Ok::<u64, redis::RedisError>(n)
        }));
    }
    let mut total = 0u64;
    for h in handles {
        total += h.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn many_locks(bench: Bench<'_, Limits>, locks: u32, tasks: u32) -> anyhow::Result<Report> {
    let Bench { url, prefix, duration, limits, progress } = bench;
    let client = Client::connect(url).await?;
    // The floor shaped like the workload, on the same connection, just before: as many tasks,
    // each running the floor's pairs one after another (the pipelined floor above keeps 256
    // pairs in flight from one task, which costs the client far less scheduling).
    let window_floor = floor_tasks(client.connection(), prefix, tasks, duration).await?;
    let start = Instant::now();
    let until = start + duration;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (client, prefix) = (client.clone(), prefix.to_string());
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut i = t as u64;
            while Instant::now() < until {
                let lock = client.mutex(&format!("{prefix}:many:{}", i % locks as u64))?;
                lock.lock().await?.release().await?;
                i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) >> 1;
                n += 1;
            }
            Ok::<u64, anyhow::Error>(n)
        }));
    }
    let mut total = 0u64;
    for h in handles {
        total += h.await??;
        progress.show("many-locks", total, start.elapsed());
    }
    let ops = total as f64 / start.elapsed().as_secs_f64();
    Ok(report(
        "many-locks",
        ops,
        window_floor,
        vec![
            ("locks".into(), locks.to_string()),
            ("tasks".into(), tasks.to_string()),
            ("limit".into(), format!("floor-redisson pairs from {tasks} tasks")),
            ("ratio_to_floor_256_in_flight".into(), format!("{:.2}", ops / limits.redisson_pipelined)),
        ],
    ))
}

/// redis-py's `Lock` (acquire + release cycles, `clients` threads on one key, its defaults: poll
/// every 0.1 s while waiting), run by python3 in the same run; skipped with a note if redis-py is
/// not installed.
fn peer_redis_py(
    url: &str,
    key: &str,
    clients: u32,
    duration: Duration,
    limits: &Limits,
    workload: &str,
) -> anyhow::Result<Report> {
    let parsed = distlock::redis::RedisUrl::parse(url)?;
    if parsed.sentinel().is_some() {
        return Ok(report(workload, 0.0, limits.sequential, vec![("skipped".into(), "Sentinel URL".into())]));
    }
    // The connection's settings go on stdin (the login among them: never in argv or the
    // environment, where other users could read it).
    let files = parsed.tls_files();
    let settings = serde_json::json!({
        "host": parsed.host(),
        "port": parsed.port(),
        "db": parsed.db(),
        "username": parsed.username(),
        "password": parsed.password(),
        "ssl": parsed.tls(),
        "ssl_ca_certs": files.cacert,
        "ssl_certfile": files.cert,
        "ssl_keyfile": files.key,
    });
    let script = r#"
import json, sys, threading, time
try:
    import redis
except ImportError:
    print("missing"); sys.exit(0)
conn = json.loads(sys.stdin.readline())
if conn["ssl"]:
    conn.update(ssl_cert_reqs="required", ssl_check_hostname=True)
else:
    for k in ("ssl", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"): conn.pop(k)
key, clients, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
counts = [0] * clients
stop = time.monotonic() + secs
def work(i):
    lock = redis.Redis(**conn).lock(key, timeout=30)
    n = 0
    while time.monotonic() < stop:
        lock.acquire()
        lock.release()
        n += 1
    counts[i] = n
start = time.monotonic()
threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(counts) / (time.monotonic() - start), min(counts), max(counts))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, key])
        .arg(clients.to_string())
        .arg(duration.as_secs_f64().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("piped");
            // A python3 without redis-py exits before reading: its answer says so, not the pipe.
            let _ = writeln!(stdin, "{settings}");
            drop(stdin);
            child.wait_with_output()
        });
    let note = |why: &str| report(workload, 0.0, limits.sequential, vec![("skipped".into(), why.into())]);
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => return Ok(note(&format!("python3 failed: {}", String::from_utf8_lossy(&out.stderr).trim()))),
        Err(e) => return Ok(note(&format!("no python3: {e}"))),
    };
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if text == "missing" {
        return Ok(note("redis-py not installed (pip install redis)"));
    }
    let bad = || anyhow::anyhow!("redis-py peer printed {text:?}");
    let mut fields = text.split_whitespace();
    let ops: f64 = fields.next().and_then(|f| f.parse().ok()).ok_or_else(bad)?;
    let (min, max): (u64, u64) = match (fields.next(), fields.next()) {
        (Some(a), Some(b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    let limit = if clients > 1 { limits.redisson } else { limits.simple };
    Ok(report(workload, ops, limit, [vec![("peer".into(), "redis-py Lock".into())], fairness(min, max)].concat()))
}

/// Deletes every key of this run (locks, fencing counters, latches).
pub(crate) async fn remove_run(client: &Client, prefix: &str) -> anyhow::Result<()> {
    let mut conn = client.connection();
    for pattern in [format!("{prefix}*"), format!("*{{{prefix}*")] {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(())
}

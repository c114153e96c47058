//! `distlock bench` on a `redis://` backend: the server's own limit (`SET NX PX` + `DEL` pairs,
//! sequential and pipelined), each lock workload against it, and redis-py's `Lock` beside us.

use crate::bench::{summarize, Progress, Report};
use distlock::redis::Client;
use futures::stream::{FuturesUnordered, StreamExt};
use std::time::{Duration, Instant};

/// The workloads measured on Redis.
pub const WORKLOADS: [&str; 4] = ["raw", "uncontended", "contended", "many-locks"];

struct Limits {
    sequential: f64,
    pipelined: f64,
}

/// The bench flags the Redis workloads use.
#[derive(Clone, Copy)]
pub struct Settings {
    pub duration: Duration,
    pub clients: u32,
    pub locks: u32,
    pub tasks: u32,
    pub json: bool,
}

/// Runs `workloads` against `url`; every key the run made is deleted at the end (fencing
/// counters included), also when a workload fails.
pub async fn run(
    url: &str,
    workloads: &[String],
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<Vec<Report>> {
    for w in workloads {
        if !WORKLOADS.contains(&w.as_str()) {
            anyhow::bail!("workload {w} is not measured on Redis yet (Redis: {})", WORKLOADS.join(", "));
        }
    }
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
    let Settings { duration, clients, locks, tasks, json } = *settings;
    let limits = raw_limits(admin, prefix, duration, progress).await?;
    let mut reports = Vec::new();
    for w in workloads {
        let r = match w.as_str() {
            "raw" => vec![
                report("raw-sequential", limits.sequential, limits.sequential, Vec::new()),
                report("raw-pipelined", limits.pipelined, limits.pipelined, Vec::new()),
            ],
            "uncontended" => uncontended(url, prefix, duration, &limits, progress).await?,
            "contended" => contended(url, prefix, clients, duration, &limits, progress).await?,
            "many-locks" => vec![many_locks(url, prefix, locks, tasks, duration, &limits, progress).await?],
            _ => unreachable!("checked above"),
        };
        progress.clear();
        if json {
            for rep in &r {
                println!("{}", serde_json::to_string(rep)?);
            }
        }
        reports.extend(r);
    }
    Ok(reports)
}

fn report(workload: &str, ops: f64, limit: f64, extra: Vec<(String, String)>) -> Report {
    Report {
        workload: workload.into(),
        ops_per_sec: ops,
        limit_ops_per_sec: limit,
        ratio_to_limit: ops / limit,
        extra,
        ..Default::default()
    }
}

/// The server's own limit: `SET k v NX PX 30000` + `DEL k` pairs on one connection, one at a time
/// (round-trip bound) and with many in flight (throughput bound).
async fn raw_limits(client: &Client, prefix: &str, duration: Duration, progress: &Progress) -> anyhow::Result<Limits> {
    let conn = client.connection();
    let pair = |key: String| {
        let mut conn = conn.clone();
        async move {
            let _: Option<String> =
                redis::cmd("SET").arg(&key).arg("v").arg("NX").arg("PX").arg(30_000).query_async(&mut conn).await?;
            let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
            Ok::<(), redis::RedisError>(())
        }
    };
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < duration {
        pair(format!("{prefix}:raw")).await?;
        pairs += 1;
        if pairs % 1024 == 0 {
            progress.show("raw sequential", pairs, start.elapsed());
        }
    }
    let sequential = pairs as f64 / start.elapsed().as_secs_f64();
    const WINDOW: u64 = 256;
    let start = Instant::now();
    let mut pairs = 0u64;
    let mut inflight = FuturesUnordered::new();
    for i in 0..WINDOW {
        inflight.push(pair(format!("{prefix}:raw{i}")));
    }
    let mut next = WINDOW;
    while let Some(r) = inflight.next().await {
        r?;
        pairs += 1;
        if start.elapsed() < duration {
            inflight.push(pair(format!("{prefix}:raw{}", next % (2 * WINDOW))));
            next += 1;
        }
        if pairs % 4096 == 0 {
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
) -> anyhow::Result<Vec<Report>> {
    let client = Client::connect(url).await?;
    let mut reports = Vec::new();
    for (name, simple) in [("uncontended", false), ("uncontended-simple", true)] {
        let key = format!("{prefix}:{name}");
        let (mutex, simple_lock) = (client.mutex(&key)?, client.simple_lock(&key)?);
        let mut acq = Vec::new();
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < duration {
            let t = Instant::now();
            if simple {
                simple_lock.lock().await?.release().await?;
            } else {
                mutex.lock().await?.release().await?;
            }
            acq.push(t.elapsed().as_micros() as u64);
            n += 1;
            if n % 256 == 0 {
                progress.show(name, n, start.elapsed());
            }
        }
        let ops = n as f64 / start.elapsed().as_secs_f64();
        let (p50, p99, p999) = summarize(acq);
        reports.push(Report {
            p50_us: p50,
            p99_us: p99,
            p999_us: p999,
            ..report(name, ops, limits.sequential, vec![("cycle".into(), "acquire+release".into())])
        });
    }
    reports.push(peer_redis_py(url, &format!("{prefix}:redis-py"), 1, duration, limits, "uncontended-redis-py")?);
    Ok(reports)
}

async fn contended(
    url: &str,
    prefix: &str,
    clients: u32,
    duration: Duration,
    limits: &Limits,
    progress: &Progress,
) -> anyhow::Result<Vec<Report>> {
    let mut reports = Vec::new();
    for (name, fair) in [("contended", false), ("contended-fair", true)] {
        let key = format!("{prefix}:{name}");
        let mut handles = Vec::new();
        let start = Instant::now();
        let until = start + duration;
        for _ in 0..clients {
            let (url, key) = (url.to_string(), key.clone());
            handles.push(tokio::spawn(async move {
                let client = Client::connect(&url).await?;
                let (mutex, fair_lock) = (client.mutex(&key)?, client.fair_lock(&key)?);
                let mut n = 0u64;
                while Instant::now() < until {
                    if fair {
                        fair_lock.lock().await?.release().await?;
                    } else {
                        mutex.lock().await?.release().await?;
                    }
                    n += 1;
                }
                Ok::<u64, anyhow::Error>(n)
            }));
        }
        let mut total = 0u64;
        for h in handles {
            total += h.await??;
            progress.show(name, total, start.elapsed());
        }
        let ops = total as f64 / start.elapsed().as_secs_f64();
        reports.push(report(name, ops, limits.sequential, vec![("clients".into(), clients.to_string())]));
    }
    reports.push(peer_redis_py(
        url,
        &format!("{prefix}:redis-py-contended"),
        clients,
        duration,
        limits,
        "contended-redis-py",
    )?);
    Ok(reports)
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
    let client = Client::connect(url).await?;
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
        limits.pipelined,
        vec![("locks".into(), locks.to_string()), ("tasks".into(), tasks.to_string())],
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
    if parsed.sentinel.is_some() {
        return Ok(report(workload, 0.0, limits.sequential, vec![("skipped".into(), "Sentinel URL".into())]));
    }
    let script = r#"
import sys, threading, time
try:
    import redis
except ImportError:
    print("missing"); sys.exit(0)
host, port, db, key, clients, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
counts = [0] * clients
stop = time.monotonic() + secs
def work(i):
    lock = redis.Redis(host=host, port=port, db=db).lock(key, timeout=30)
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
print(sum(counts) / (time.monotonic() - start))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &parsed.host, &parsed.port.to_string(), &parsed.db.to_string(), key])
        .arg(clients.to_string())
        .arg(duration.as_secs_f64().to_string())
        .output();
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
    let ops: f64 = text.parse().map_err(|_| anyhow::anyhow!("redis-py peer printed {text:?}"))?;
    Ok(report(workload, ops, limits.sequential, vec![("peer".into(), "redis-py Lock".into())]))
}

/// Deletes every key of this run (locks, fencing counters, latches).
async fn remove_run(client: &Client, prefix: &str) -> anyhow::Result<()> {
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

//! `distlock bench` on a `postgres://` backend: the server's own floor (`pg_advisory_lock` +
//! `pg_advisory_unlock` pairs on one connection, one at a time and many in flight), the
//! uncontended lock interleaved with that floor, and contended hand-offs between clients.

use crate::bench::{report, summarize, Progress, Report};
use distlock::postgres::Client;
use futures::stream::{FuturesUnordered, StreamExt};
use std::time::{Duration, Instant};

/// The workloads measured on PostgreSQL.
pub const WORKLOADS: [&str; 3] = ["raw", "uncontended", "contended"];

/// Slices of the interleaved uncontended measurement (the floor and the lock take turns).
const SLICES: u32 = 20;
/// Pairs in flight for the pipelined floor.
const WINDOW: i64 = 64;

/// Runs `workloads` against `url` with `clients` contending clients for `duration` each.
pub async fn run(
    url: &str,
    workloads: &[String],
    duration: Duration,
    clients: u32,
    json: bool,
    progress: &Progress,
) -> anyhow::Result<Vec<Report>> {
    for w in workloads {
        if !WORKLOADS.contains(&w.as_str()) {
            anyhow::bail!("workload {w} is not measured on PostgreSQL yet (PostgreSQL: {})", WORKLOADS.join(", "));
        }
    }
    let (floor_conn, connection) =
        tokio_postgres::connect(url.split('?').next().unwrap_or(url), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    // Keys of this run: random, so that nothing else is disturbed.
    let base: i64 = (uuid::Uuid::new_v4().as_u128() as i64) & 0x0fff_ffff_ffff_0000;
    let (sequential, pipelined) = floor(&floor_conn, base, duration, progress).await?;
    let mut reports = Vec::new();
    for w in workloads {
        let r = match w.as_str() {
            "raw" => vec![
                report(
                    "floor-sequential",
                    sequential,
                    sequential,
                    vec![("pair".into(), "pg_advisory_lock + pg_advisory_unlock".into())],
                ),
                report("floor-pipelined", pipelined, pipelined, vec![("in_flight".into(), WINDOW.to_string())]),
            ],
            "uncontended" => vec![uncontended(url, &floor_conn, base, duration, progress).await?],
            "contended" => vec![contended(url, base, clients, duration, sequential, progress).await?],
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

/// One floor pair on `conn`, each statement one round trip (no separate prepare), as the
/// lock's own statements are sent.
async fn pair(conn: &tokio_postgres::Client, key: i64) -> Result<(), tokio_postgres::Error> {
    use tokio_postgres::types::Type;
    conn.query_typed("SELECT pg_advisory_lock($1)::text", &[(&key, Type::INT8)]).await?;
    conn.query_typed("SELECT pg_advisory_unlock($1)", &[(&key, Type::INT8)]).await?;
    Ok(())
}

/// The floor's pairs per second: one at a time, then [`WINDOW`] in flight (tokio-postgres
/// pipelines requests issued together on one connection).
async fn floor(
    conn: &tokio_postgres::Client,
    base: i64,
    duration: Duration,
    progress: &Progress,
) -> anyhow::Result<(f64, f64)> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        pair(conn, base).await?;
        n += 1;
        if n % 256 == 0 {
            progress.show("floor sequential", n, start.elapsed());
        }
    }
    let sequential = n as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut n = 0u64;
    let mut inflight: FuturesUnordered<_> = (0..WINDOW).map(|i| pair(conn, base + 1 + i)).collect();
    let mut next = 0i64;
    while let Some(r) = inflight.next().await {
        r?;
        n += 1;
        if start.elapsed() < duration {
            inflight.push(pair(conn, base + 1 + next % WINDOW + WINDOW));
            next += 1;
        }
    }
    Ok((sequential, n as f64 / start.elapsed().as_secs_f64()))
}

/// Lock + release cycles, one at a time, taking turns slice by slice with the floor's pairs.
async fn uncontended(
    url: &str,
    floor_conn: &tokio_postgres::Client,
    base: i64,
    duration: Duration,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let pg = Client::connect(url).await?;
    let lock = pg.mutex(&format!("distlock-bench:{base:x}:uncontended"))?;
    let slice = (duration / SLICES).max(Duration::from_millis(20));
    let (mut ours, mut ours_time, mut floor, mut floor_time) = (0u64, Duration::ZERO, 0u64, Duration::ZERO);
    let mut samples = Vec::new();
    let start = Instant::now();
    while ours_time < duration {
        let began = Instant::now();
        while began.elapsed() < slice {
            pair(floor_conn, base).await?;
            floor += 1;
        }
        floor_time += began.elapsed();
        let began = Instant::now();
        while began.elapsed() < slice {
            let t = Instant::now();
            lock.lock().await?.release().await?;
            samples.push(t.elapsed().as_micros() as u64);
            ours += 1;
        }
        ours_time += began.elapsed();
        progress.show("uncontended", ours, start.elapsed());
    }
    let (p50, p99, p999) = summarize(samples);
    Ok(Report {
        p50_us: p50,
        p99_us: p99,
        p999_us: p999,
        ..report(
            "uncontended",
            ours as f64 / ours_time.as_secs_f64(),
            floor as f64 / floor_time.as_secs_f64(),
            vec![
                ("cycle".into(), "acquire (lock + fencing nextval) + release".into()),
                ("limit".into(), format!("floor sequential, interleaved in {slice:?} slices")),
            ],
        )
    })
}

/// `clients` clients take and release one lock for `duration`: hand-offs per second, each by
/// the server's own queue, and how evenly the clients got it.
async fn contended(
    url: &str,
    base: i64,
    clients: u32,
    duration: Duration,
    floor: f64,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let name = format!("distlock-bench:{base:x}:contended");
    let start = Instant::now();
    let until = start + duration;
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (url, name) = (url.to_string(), name.clone());
        handles.push(tokio::spawn(async move {
            let pg = Client::connect(&url).await?;
            let lock = pg.mutex(&name)?;
            let mut n = 0u64;
            while Instant::now() < until {
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

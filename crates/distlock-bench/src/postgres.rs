//! `distlock bench` on a `postgres://` backend: the server's own floor (`pg_advisory_lock` +
//! `pg_advisory_unlock` pairs on one connection, one at a time and many in flight), the
//! uncontended lock interleaved with that floor, and contended hand-offs between clients; beside
//! them the peer, the Rust port of DistributedLock (`distributed-lock-postgres`), measured alike.

use super::harness::{
    check_workloads, contended_on, emit, interleaved, interleaved_cycle, report, BenchParams, Progress, Report,
};
use distlock::postgres::Client;
use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use futures::stream::{FuturesUnordered, StreamExt};
use std::time::{Duration, Instant};

/// The workloads measured on PostgreSQL.
pub const WORKLOADS: [&str; 4] = ["raw", "uncontended", "contended", "scaling"];

/// Pairs in flight for the pipelined floor.
const WINDOW: i64 = 64;

/// Runs `workloads` against `url` with `clients` contending clients for `duration` each.
pub async fn run(run: BenchParams<'_>) -> anyhow::Result<Vec<Report>> {
    let BenchParams { url, workloads, duration, clients, json, progress, plot } = run;
    check_workloads("PostgreSQL", workloads, &WORKLOADS)?;
    // The floor's connection is made as the lock's are: the URL's login and TLS (`sslmode`, its
    // CA and client certificate), so a TLS run measures TLS on both sides.
    let parsed = distlock::postgres::PgUrl::parse(url)?;
    let config = super::postgres_tls::config(url, &parsed)?;
    let (floor_conn, connection) = config.connect(super::postgres_tls::connector(&parsed)?).await?;
    tokio::spawn(connection);
    // Keys of this run: random, so that nothing else is disturbed.
    let base: i64 = (uuid::Uuid::new_v4().as_u128() as i64) & 0x0fff_ffff_ffff_0000;
    let floor_conn = Floor::new(floor_conn).await?;
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
            "uncontended" => {
                let lock = distlock::Client::from(Client::connect(url).await?)
                    .mutex(&format!("distlock-bench:{base:x}:uncontended"))?;
                let pair = || async { Ok(pair(&floor_conn, base).await?) };
                let extra = vec![("cycle".into(), "acquire (lock + fencing nextval) + release".into())];
                let ours = interleaved(&lock, pair, duration, extra, progress).await?;
                vec![ours, peer_uncontended(&peer_url(url, &parsed), &floor_conn, base, duration, progress).await?]
            }
            "scaling" => {
                let this = BenchParams { url, workloads, duration, clients, json, progress, plot };
                super::harness::scaling_on(&this, &format!("distlock-bench:{base:x}:scaling"), sequential).await?
            }
            "contended" => {
                let name = format!("distlock-bench:{base:x}:contended");
                vec![contended_on(url, &name, clients, duration, sequential, progress).await?]
            }
            _ => unreachable!("checked above"),
        };
        emit(r, json, progress, &mut reports)?;
    }
    Ok(reports)
}

/// The peer's connection string: the URL's server and login, and its TLS settings in libpq's
/// names (which the peer's driver reads; it knows none of distlock's other keys).
fn peer_url(url: &str, parsed: &distlock::postgres::PgUrl) -> String {
    use distlock::postgres::SslMode;
    let mode = match parsed.ssl_mode() {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    };
    let files = parsed.tls_files();
    let mut query = vec![format!("sslmode={mode}")];
    for (name, file) in [("sslrootcert", &files.cacert), ("sslcert", &files.cert), ("sslkey", &files.key)] {
        if let Some(file) = file {
            query.push(format!("{name}={}", file.display()));
        }
    }
    format!("{}?{}", url.split('?').next().unwrap_or(url), query.join("&"))
}

/// The peer's uncontended cycle (`acquire` + `release` of a DistributedLock lock on a name of its
/// own), interleaved with the same floor.
async fn peer_uncontended(
    url: &str,
    floor_conn: &Floor,
    base: i64,
    duration: Duration,
    progress: &Progress,
) -> anyhow::Result<Report> {
    let provider = distributed_lock_postgres::PostgresLockProvider::new(url.to_string())
        .await
        .map_err(|e| anyhow::anyhow!("distributed-lock-postgres: {e}"))?;
    let lock = provider.create_lock(&format!("distlock-bench:{base:x}:peer"));
    let cycle = || async {
        let handle = lock.acquire(None).await.map_err(|e| anyhow::anyhow!("distributed-lock-postgres: {e}"))?;
        handle.release().await.map_err(|e| anyhow::anyhow!("distributed-lock-postgres: {e}"))?;
        Ok(())
    };
    let pair = || async { Ok(pair(floor_conn, base).await?) };
    let extra = vec![("peer".into(), "distributed-lock-postgres 0.2 (DistributedLock's Rust port)".into())];
    interleaved_cycle("uncontended-peer", cycle, pair, duration, extra, progress).await
}

/// The floor's connection and its two statements, prepared once (as the lock prepares its own
/// once per connection).
struct Floor {
    conn: tokio_postgres::Client,
    lock: tokio_postgres::Statement,
    unlock: tokio_postgres::Statement,
}

impl Floor {
    async fn new(conn: tokio_postgres::Client) -> Result<Floor, tokio_postgres::Error> {
        use tokio_postgres::types::Type;
        let lock = conn.prepare_typed("SELECT pg_advisory_lock($1)::text", &[Type::INT8]).await?;
        let unlock = conn.prepare_typed("SELECT pg_advisory_unlock($1)", &[Type::INT8]).await?;
        Ok(Floor { conn, lock, unlock })
    }
}

/// One floor pair, each statement one round trip.
async fn pair(floor: &Floor, key: i64) -> Result<(), tokio_postgres::Error> {
    floor.conn.query(&floor.lock, &[&key]).await?;
    floor.conn.query(&floor.unlock, &[&key]).await?;
    Ok(())
}

async fn floor(conn: &Floor, base: i64, duration: Duration, progress: &Progress) -> anyhow::Result<(f64, f64)> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        pair(conn, base).await?;
        n += 1;
        if n.is_multiple_of(256) {
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

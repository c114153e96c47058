//! `distlock bench` on `mysql://` (MariaDB `GET_LOCK`) and `sqlite://` (the lease table): the
//! backend's own floor (a `GET_LOCK` + `RELEASE_LOCK` pair, or the lease table's acquire upsert +
//! release update, on one connection), the uncontended lock interleaved with it, contended
//! hand-offs, and the optimistic (version column) helper alone and under contention.

use super::harness::{check_workloads, contended_on, emit, interleaved, report, BenchParams, Progress, Report};
use distlock::optimistic::optimistic_update;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The workloads measured on MariaDB and SQLite.
pub const WORKLOADS: [&str; 5] = ["raw", "uncontended", "contended", "optimistic", "scaling"];

/// A plain pool on the same database, for the floor and the optimistic workload. Its connections
/// are not pinged when taken from the pool (sqlx's `test_before_acquire`, on by default, would add
/// a round trip to every floor pair that the lock, on a connection of its own, does not make).
#[derive(Clone)]
enum Db {
    Mysql(sqlx::MySqlPool),
    Sqlite(sqlx::SqlitePool, String, String),
}

impl Db {
    /// One floor pair on the first connection.
    async fn pair(&self, name: &str) -> anyhow::Result<()> {
        match self {
            Db::Mysql(pool) => {
                let mut c = pool.acquire().await?;
                let got: Option<i64> =
                    sqlx::query_scalar("SELECT GET_LOCK(?, 0)").bind(name).fetch_one(&mut *c).await?;
                anyhow::ensure!(got == Some(1), "the floor's GET_LOCK({name}) was refused");
                sqlx::query("SELECT RELEASE_LOCK(?)").bind(name).fetch_one(&mut *c).await?;
            }
            Db::Sqlite(pool, acquire, release) => {
                let token: Option<i64> = sqlx::query_scalar(acquire)
                    .bind(name)
                    .bind("bench-floor")
                    .bind("+30.000 seconds")
                    .fetch_optional(pool)
                    .await?;
                anyhow::ensure!(token.is_some(), "the floor's lease row {name} was held");
                sqlx::query(release).bind(name).bind("bench-floor").execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Reads the counter row: (value, version).
    async fn read(&self, table: &str) -> Result<(i64, i64), sqlx::Error> {
        let q = format!("SELECT v, version FROM {table} WHERE id = 1");
        match self {
            Db::Mysql(pool) => sqlx::query_as(&q).fetch_one(pool).await,
            Db::Sqlite(pool, ..) => sqlx::query_as(&q).fetch_one(pool).await,
        }
    }

    /// The version-checked write: true if the row still had `version`.
    async fn write(&self, table: &str, v: i64, version: i64) -> Result<bool, sqlx::Error> {
        let q = format!("UPDATE {table} SET v = ?, version = version + 1 WHERE id = 1 AND version = ?");
        let done = match self {
            Db::Mysql(pool) => sqlx::query(&q).bind(v).bind(version).execute(pool).await?.rows_affected(),
            Db::Sqlite(pool, ..) => sqlx::query(&q).bind(v).bind(version).execute(pool).await?.rows_affected(),
        };
        Ok(done == 1)
    }

    async fn execute(&self, q: &str) -> anyhow::Result<()> {
        match self {
            Db::Mysql(pool) => sqlx::query(q).execute(pool).await.map(drop)?,
            Db::Sqlite(pool, ..) => sqlx::query(q).execute(pool).await.map(drop)?,
        }
        Ok(())
    }
}

/// The connection settings of the floor's pool, as the lock's connections are made: the URL's
/// server, login and database (sqlx reads them from the URL as distlock does), and the TLS
/// distlock has in force for it (its `ssl-mode`, CA and client certificate). No statement logging
/// (a floor pair is not a slow statement).
pub(crate) fn mysql_options(
    url: &str,
    parsed: &distlock::mysql::MysqlUrl,
) -> anyhow::Result<sqlx::mysql::MySqlConnectOptions> {
    use distlock::mysql::SslMode;
    use sqlx::mysql::MySqlSslMode as M;
    let rest = url.strip_prefix("mysql://").or_else(|| url.strip_prefix("mariadb://")).unwrap_or(url);
    let base = rest.split('?').next().unwrap_or(rest);
    let mut options: sqlx::mysql::MySqlConnectOptions = format!("mysql://{base}").parse()?;
    options = options.ssl_mode(match parsed.ssl_mode() {
        SslMode::Disabled => M::Disabled,
        SslMode::Preferred => M::Preferred,
        SslMode::Required => M::Required,
        SslMode::VerifyIdentity => M::VerifyIdentity,
    });
    let files = parsed.tls_files();
    if let Some(ca) = &files.cacert {
        options = options.ssl_ca(ca);
    }
    if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
        options = options.ssl_client_cert(cert).ssl_client_key(key);
    }
    Ok(sqlx::ConnectOptions::disable_statement_logging(options))
}

/// Runs `workloads` against `url` (a `mysql://` or `sqlite://` URL) with `clients` contending
/// clients for `duration` each.
pub async fn run(run: BenchParams<'_>) -> anyhow::Result<Vec<Report>> {
    let BenchParams { url, workloads, duration, clients, json, progress, plot } = run;
    check_workloads("MariaDB and SQLite", workloads, &WORKLOADS)?;
    let client = distlock::connect(url).await?;
    let conns = clients.max(1) + 1;
    let db = match client.sqlite() {
        Some(lite) => {
            let (acquire, release) = lite.lease_statements();
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(lite.url().path())
                .busy_timeout(Duration::from_secs(30));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(conns)
                .test_before_acquire(false)
                .connect_with(options)
                .await?;
            Db::Sqlite(pool, acquire.to_string(), release.to_string())
        }
        None => {
            let my = client.mysql().ok_or_else(|| anyhow::anyhow!("{url}: not a mysql:// or sqlite:// URL"))?;
            let options = mysql_options(url, my.url())?;
            Db::Mysql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(conns)
                    .test_before_acquire(false)
                    .connect_with(options)
                    .await?,
            )
        }
    };
    let base = format!("distlock-bench:{:x}", uuid::Uuid::new_v4().as_u128() as u32);
    let floor = floor(&db, &format!("{base}:floor"), duration, progress).await?;
    let mut reports = Vec::new();
    for w in workloads {
        let r = match w.as_str() {
            "raw" => vec![report("floor-sequential", floor, floor, vec![("pair".into(), floor_pair(&db).into())])],
            "uncontended" => {
                let lock = client.mutex(&format!("{base}:uncontended"))?;
                let floor_name = format!("{base}:floor");
                let pair = || db.pair(&floor_name);
                let extra = vec![("pair".into(), floor_pair(&db).into())];
                vec![interleaved(&lock, pair, duration, extra, progress).await?]
            }
            "scaling" => {
                let this = BenchParams { url, workloads, duration, clients, json, progress, plot };
                super::harness::scaling_on(&this, &format!("{base}:scaling"), floor).await?
            }
            "contended" => {
                vec![contended_on(url, &format!("{base}:contended"), clients, duration, floor, progress).await?]
            }
            "optimistic" => optimistic(&db, &base, clients, duration, progress).await?,
            _ => unreachable!("checked above"),
        };
        emit(r, json, progress, &mut reports)?;
    }
    Ok(reports)
}

fn floor_pair(db: &Db) -> &'static str {
    match db {
        Db::Mysql(_) => "GET_LOCK + RELEASE_LOCK",
        Db::Sqlite(..) => "lease table acquire upsert + release update",
    }
}

/// Floor pairs per second, one at a time.
async fn floor(db: &Db, name: &str, duration: Duration, progress: &Progress) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        db.pair(name).await?;
        n += 1;
        if n.is_multiple_of(256) {
            progress.show("floor", n, start.elapsed());
        }
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// The optimistic helper incrementing one counter row: one task alone (the limit), then
/// `clients` tasks at once; updates per second and retries per update.
async fn optimistic(
    db: &Db,
    base: &str,
    clients: u32,
    duration: Duration,
    progress: &Progress,
) -> anyhow::Result<Vec<Report>> {
    let table = format!("distlock_bench_{}", base.rsplit(':').next().unwrap_or("x"));
    db.execute(&format!("CREATE TABLE {table} (id INTEGER PRIMARY KEY, v BIGINT NOT NULL, version BIGINT NOT NULL)"))
        .await?;
    db.execute(&format!("INSERT INTO {table} VALUES (1, 0, 1)")).await?;
    let mut out = Vec::new();
    let mut alone = 0.0;
    for tasks in [1, clients.max(1)] {
        let (updates, attempts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let start = Instant::now();
        let until = start + duration;
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let (db, table, updates, attempts) = (db.clone(), table.clone(), updates.clone(), attempts.clone());
            handles.push(tokio::spawn(async move {
                while Instant::now() < until {
                    let done = optimistic_update(
                        1000,
                        || db.read(&table),
                        |v: &i64| Some(v + 1),
                        |v: &i64, version| db.write(&table, *v, version),
                    )
                    .await?
                    .expect("always computes");
                    updates.fetch_add(1, Ordering::Relaxed);
                    attempts.fetch_add(done.attempts as u64, Ordering::Relaxed);
                }
                Ok::<(), anyhow::Error>(())
            }));
        }
        for h in handles {
            h.await??;
        }
        let (n, tries) = (updates.load(Ordering::Relaxed), attempts.load(Ordering::Relaxed));
        progress.show("optimistic", n, start.elapsed());
        let ops = n as f64 / start.elapsed().as_secs_f64();
        if tasks == 1 {
            alone = ops;
        }
        out.push(report(
            if tasks == 1 { "optimistic-alone" } else { "optimistic-contended" },
            ops,
            alone,
            vec![
                ("tasks".into(), tasks.to_string()),
                ("retries_per_update".into(), format!("{:.2}", (tries - n) as f64 / n.max(1) as f64)),
                ("limit".into(), "one task alone (read + version-checked update)".into()),
            ],
        ));
        let (v, _): (i64, i64) = db.read(&table).await?;
        anyhow::ensure!(v as u64 >= n, "the counter lost updates: {v} < {n}");
        db.execute(&format!("UPDATE {table} SET v = 0")).await?;
    }
    db.execute(&format!("DROP TABLE {table}")).await?;
    Ok(out)
}

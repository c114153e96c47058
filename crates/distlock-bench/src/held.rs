//! `distlock bench held`: the cost per held lock, on any backend, through the shared API. One
//! client takes `--held` K locks (distinct names, in name order, one at a time, all or nothing,
//! as `distlock hold n1 … nK` does) and holds them for `--held-periods` lease periods, watching
//! every guard's `lost()` as `hold` does. Reported:
//!
//! - the time to acquire all K (and per lock, with its percentiles);
//! - the server connections the client used, counted at a fault proxy in front of the server
//!   (it sees every connection whatever the protocol): open while holding, and accepted in all;
//! - the client's requests to the server while only holding, as the writes that reach the proxy
//!   per second per 1,000 held locks (renewals, keep-alives, pings);
//! - the client's heap per held lock: the counting allocator's live bytes after acquiring minus
//!   before, ÷ K (heap, not RSS), again at the end of the hold; and the growth of the process's
//!   RSS (VmRSS) over the acquire, for comparison with figures measured with `distlock hold`.
//!
//! Beside it, where the server has one, the server's own floor for holding K, through a proxy of
//! its own and measured alike: ZooKeeper, K ephemeral nodes on one session (its pings keep
//! them); etcd, one lease and K puts under it (one keep-alive stream keeps them); Redis, K
//! `SET key v NX PX` in one pipeline and a pipeline of K `PEXPIRE` every third of the lease;
//! PostgreSQL, K `pg_try_advisory_lock` on one connection; MariaDB, K `GET_LOCK` on one
//! connection; SQLite, K acquire upserts of the lease table and one `UPDATE` extending all of
//! them every third of the lease. The floors' keys are taken one at a time too (Redis's in its
//! pipeline).
//!
//! Both proxies (and, for `embedded`, the ZooKeeper server) run in processes of their own (this
//! program again, with [`CHILD_ARG`]): their buffers are neither in the client's heap nor in its
//! RSS. SQLite and `memory://` have no server: no proxy, no connections or requests to count.
//!
//! A backend that cannot hold K (one server connection per held lock, and the server's limit
//! reached) is reported with how many it held and the server's error; the run goes on.

use super::harness::{Progress, Report};
use futures::stream::StreamExt;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// `distlock-bench --held-child proxy HOST:PORT` (a fault proxy in front of that server) or
/// `--held-child embedded` (the in-process ZooKeeper server): a process the `held` workload
/// starts so that what it allocates is not the client's.
pub(super) const CHILD_ARG: &str = "--held-child";

/// How long one lock's acquire may take before the run stops taking more (a pool that waits for
/// a connection the server will not give).
const PER_LOCK: Duration = Duration::from_secs(30);

/// The child's life: prints its address (a URL for `embedded`), then answers each line `count`
/// with `OPEN ACCEPTED WRITES` (proxy) until its standard input closes.
pub(super) async fn child(args: &[String]) -> anyhow::Result<()> {
    let mut out = tokio::io::stdout();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    match args {
        [kind, upstream] if kind == "proxy" => {
            let upstream: std::net::SocketAddr = upstream.parse()?;
            let proxy = distlock_faults::FaultProxy::start(upstream).await?;
            out.write_all(format!("{}\n", proxy.addr()).as_bytes()).await?;
            out.flush().await?;
            while let Some(line) = lines.next_line().await? {
                if line.trim() == "count" {
                    let c = format!("{} {} {}\n", proxy.connections(), proxy.accepted(), proxy.writes_to_upstream());
                    out.write_all(c.as_bytes()).await?;
                    out.flush().await?;
                }
            }
        }
        [kind] if kind == "embedded" => {
            let (server, url) = super::harness::embedded_or("embedded").await?;
            out.write_all(format!("{url}\n").as_bytes()).await?;
            out.flush().await?;
            while lines.next_line().await?.is_some() {}
            drop(server);
        }
        _ => anyhow::bail!("{CHILD_ARG}: expected `proxy HOST:PORT` or `embedded`"),
    }
    Ok(())
}

/// A child process of this program (see [`CHILD_ARG`]), killed when dropped.
struct Child {
    _process: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    /// Its first line: the proxy's address, or the server's URL.
    addr: String,
}

impl Child {
    async fn start(args: &[&str]) -> anyhow::Result<Child> {
        let mut process = tokio::process::Command::new(std::env::current_exe()?)
            .arg(CHILD_ARG)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = process.stdin.take().expect("piped");
        let mut stdout = BufReader::new(process.stdout.take().expect("piped")).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
            .await
            .map_err(|_| anyhow::anyhow!("the bench's {} child did not start within 30s", args[0]))??
            .ok_or_else(|| anyhow::anyhow!("the bench's {} child ended at its start", args[0]))?;
        Ok(Child { _process: process, stdin, stdout, addr })
    }

    /// A proxy child's counts now: (connections open, accepted in all, client writes).
    async fn count(&mut self) -> anyhow::Result<(u64, u64, u64)> {
        self.stdin.write_all(b"count\n").await?;
        self.stdin.flush().await?;
        let line = self.stdout.next_line().await?.ok_or_else(|| anyhow::anyhow!("the proxy child ended"))?;
        let n: Vec<u64> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
        match n.as_slice() {
            [open, accepted, writes] => Ok((*open, *accepted, *writes)),
            _ => anyhow::bail!("the proxy child answered {line:?}"),
        }
    }
}

/// A fault proxy in its own process in front of `url`'s one server, and the URL through it.
async fn proxy_for(url: &str) -> anyhow::Result<(Child, String)> {
    let (upstream, rebuild) = super::harness::one_server(url).await?;
    let child = Child::start(&["proxy", &upstream.to_string()]).await?;
    let proxied = rebuild(&child.addr);
    Ok((child, proxied))
}

/// The resident set of this process (VmRSS), in bytes.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What the workload is asked for.
pub(super) struct HeldArgs {
    pub(super) held: u32,
    pub(super) periods: u32,
}

/// Runs the workload on `backend` (a URL, or `embedded`).
pub(super) async fn run(backend: &str, args: &HeldArgs, progress: &Progress) -> anyhow::Result<Report> {
    let k = args.held as usize;
    let embedded = match backend {
        "embedded" => Some(Child::start(&["embedded"]).await?),
        _ => None,
    };
    let url = embedded.as_ref().map_or(backend.to_string(), |c| c.addr.clone());
    let serverless = url.starts_with("sqlite:") || url.starts_with("memory:");
    // The lock's proxy and the floor's, each in front of the same server.
    let (mut proxy, lock_url) = match serverless {
        true => (None, url.clone()),
        false => {
            let (p, u) = proxy_for(&url).await?;
            (Some(p), u)
        }
    };
    let client = distlock::connect(&lock_url).await?;
    let lease = client.lease();
    let backend_name = client.backend();
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let names: Vec<String> = (0..k)
        .map(|i| match backend_name {
            "zookeeper" => format!("{}/{run_id}/held/l{i:05}", super::zookeeper::BENCH_ROOT),
            _ => format!("distlock-bench-{run_id}-held-{i:05}"),
        })
        .collect();
    let locks: Vec<distlock::Lock> = names.iter().map(|n| client.mutex(n)).collect::<Result<_, _>>()?;

    // Acquire, one at a time in name order (as a multi-lock does).
    let counts_before = match proxy.as_mut() {
        Some(p) => Some(p.count().await?),
        None => None,
    };
    let (heap_before, rss_before) = (crate::alloc::live_bytes(), rss_bytes());
    let mut guards = Vec::with_capacity(k);
    let mut samples = Vec::with_capacity(k);
    let mut error = None;
    let start = Instant::now();
    for lock in &locks {
        let t = Instant::now();
        match lock.lock_timeout(PER_LOCK).await {
            Ok(Some(g)) => guards.push(g),
            Ok(None) => {
                error = Some(format!("{} not acquired within {PER_LOCK:?}", lock.name()));
                break;
            }
            Err(e) => {
                error = Some(format!("{e:#}"));
                break;
            }
        }
        samples.push(t.elapsed().as_micros() as u64);
        if guards.len().is_multiple_of(100) {
            progress.show("held: acquiring", guards.len() as u64, start.elapsed());
        }
    }
    let acquire = start.elapsed();
    let got = guards.len();
    let heap_per_lock = (crate::alloc::live_bytes() - heap_before) as f64 / got.max(1) as f64;
    let rss_per_lock = rss_bytes().saturating_sub(rss_before) as f64 / got.max(1) as f64;
    let counts_acquired = match proxy.as_mut() {
        Some(p) => Some(p.count().await?),
        None => None,
    };

    // The floor, through a proxy of its own, then both hold for the same window.
    // A floor that cannot connect beside the locks (they took every server connection) is
    // measured again alone once they are released.
    let has_floor = backend_name != "memory";
    let mut floor_beside = None;
    let mut floor = match has_floor {
        false => None,
        true => match Floor::start(&url, backend_name, &run_id, k, lease, progress).await {
            Ok(f) => Some(f),
            Err(e) => {
                floor_beside = Some(format!("{e:#}"));
                None
            }
        },
    };
    let hold = lease * args.periods;
    let window_start = Instant::now();
    let lock_writes_before = match proxy.as_mut() {
        Some(p) => Some(p.count().await?),
        None => None,
    };
    let floor_writes_before = match floor.as_mut() {
        Some(f) => f.count().await?,
        None => None,
    };
    // Every guard's `lost()`, as `hold` watches them (and one that never ends, for K = 0).
    type Loss = std::pin::Pin<Box<dyn std::future::Future<Output = distlock::LostReason> + Send>>;
    let mut losses: Vec<Loss> = guards.iter().map(|g| Box::pin(g.lost()) as Loss).collect();
    losses.push(Box::pin(std::future::pending()));
    let lost = futures::future::select_all(losses);
    let mut lost_reason = None;
    tokio::select! {
        (reason, i, _) = lost => lost_reason = Some(format!("{}: {reason}", names.get(i).map_or("?", String::as_str))),
        _ = async {
            while window_start.elapsed() < hold {
                progress.show("held: holding", got as u64, window_start.elapsed());
                tokio::time::sleep(Duration::from_millis(500)).await; // the measuring window
            }
        } => {}
    }
    let window = window_start.elapsed();
    let lock_writes_after = match proxy.as_mut() {
        Some(p) => Some(p.count().await?),
        None => None,
    };
    let floor_writes_after = match floor.as_mut() {
        Some(f) => f.count().await?,
        None => None,
    };
    let heap_after_hold = (crate::alloc::live_bytes() - heap_before) as f64 / got.max(1) as f64;

    // Let go: the locks, the floor, then what is left on the server.
    let release_start = Instant::now();
    let mut releases = futures::stream::iter(guards.into_iter().map(|g| g.release())).buffer_unordered(64);
    let mut release_error = None;
    while let Some(r) = releases.next().await {
        if let Err(e) = r {
            release_error.get_or_insert_with(|| format!("{e:#}"));
        }
    }
    drop(releases);
    let release_time = release_start.elapsed();
    let (mut floor_writes_before, mut floor_writes_after) = (floor_writes_before, floor_writes_after);
    let mut floor_alone = false;
    if floor.is_none() && floor_beside.is_some() {
        floor_alone = true;
        match Floor::start(&url, backend_name, &format!("{run_id}a"), k, lease, progress).await {
            Ok(mut f) => {
                floor_writes_before = f.count().await?;
                tokio::time::sleep(window).await; // the same window, alone
                floor_writes_after = f.count().await?;
                floor = Some(f);
            }
            Err(e) => floor_beside = Some(format!("{} (and alone: {e:#})", floor_beside.unwrap_or_default())),
        }
    }
    let floor_report = match floor.take() {
        Some(f) => Some(f.stop().await),
        None => None,
    };
    cleanup(&client, backend_name, &run_id).await;
    client.close(Duration::from_secs(5)).await;
    progress.clear();

    let per_1000 = |before: Option<(u64, u64, u64)>, after: Option<(u64, u64, u64)>, held: usize| -> String {
        match (before, after) {
            (Some(b), Some(a)) if held > 0 => {
                format!("{:.2}", (a.2 - b.2) as f64 / window.as_secs_f64() / (held as f64 / 1000.0))
            }
            (Some(_), Some(_)) => "0".into(),
            _ => "n/a".into(),
        }
    };
    let na = || "n/a".to_string();
    let mut extra = vec![
        ("held".into(), got.to_string()),
        ("asked".into(), k.to_string()),
        ("acquire_ms".into(), acquire.as_millis().to_string()),
        ("acquire_us_per_lock".into(), format!("{:.0}", acquire.as_micros() as f64 / got.max(1) as f64)),
        ("connections".into(), lock_writes_after.map_or_else(na, |c| c.0.to_string())),
        ("connections_accepted".into(), lock_writes_after.map_or_else(na, |c| c.1.to_string())),
        (
            "acquire_writes_per_lock".into(),
            match (counts_before, counts_acquired) {
                (Some(b), Some(a)) => format!("{:.2}", (a.2 - b.2) as f64 / got.max(1) as f64),
                _ => na(),
            },
        ),
        ("requests_per_s_per_1000_held".into(), per_1000(lock_writes_before, lock_writes_after, got)),
        ("heap_bytes_per_lock".into(), format!("{heap_per_lock:.0}")),
        ("heap_bytes_per_lock_end_of_hold".into(), format!("{heap_after_hold:.0}")),
        ("rss_bytes_per_lock".into(), format!("{rss_per_lock:.0}")),
        ("lease_ms".into(), lease.as_millis().to_string()),
        ("hold_s".into(), format!("{:.1}", window.as_secs_f64())),
        ("release_ms".into(), release_time.as_millis().to_string()),
    ];
    extra.extend(error.map(|e| ("error".to_string(), e)));
    extra.extend(lost_reason.map(|e| ("lost".to_string(), e)));
    extra.extend(release_error.map(|e| ("release_error".to_string(), e)));
    let mut limit = 0.0;
    match floor_report {
        Some(f) => {
            limit = f.held as f64 / f.acquire.as_secs_f64().max(1e-9);
            extra.push(("floor".into(), f.what.to_string()));
            extra.push(("floor_held".into(), f.held.to_string()));
            extra.push(("floor_acquire_ms".into(), f.acquire.as_millis().to_string()));
            extra.push(("floor_connections".into(), floor_writes_after.map_or_else(na, |c| c.0.to_string())));
            extra.push((
                "floor_requests_per_s_per_1000_held".into(),
                per_1000(floor_writes_before, floor_writes_after, f.held),
            ));
            extra.push(("floor_heap_bytes_per_lock".into(), format!("{:.0}", f.heap_per_lock)));
            extra.extend(f.error.map(|e| ("floor_error".to_string(), e)));
        }
        None if has_floor => extra.push(("floor".into(), "not measured".into())),
        None => extra.push(("floor".into(), "none (no server)".into())),
    }
    if let Some(e) = floor_beside {
        extra.push(("floor_error_beside_the_locks".into(), e));
    }
    if floor_alone {
        extra.push(("floor_measured".into(), "alone, after the locks were released".into()));
    }
    extra.push((
        "measured".into(),
        "heap: live bytes of the counting allocator; rss: VmRSS; connections and requests: at a proxy in a process of its own"
            .into(),
    ));
    let ops = got as f64 / acquire.as_secs_f64().max(1e-9);
    Ok(Report {
        workload: format!("held-{k}"),
        ops_per_sec: ops,
        limit_ops_per_sec: limit,
        ratio_to_limit: if limit > 0.0 { ops / limit } else { 0.0 },
        extra,
        ..Default::default()
    }
    .with_latencies(samples))
}

/// Removes what the locks leave behind on the server: ZooKeeper's run directory, Redis's
/// fencing counters, SQLite's lease rows (the other backends leave nothing of the run's).
async fn cleanup(client: &distlock::Client, backend: &str, run_id: &str) {
    let done = match backend {
        "zookeeper" => match client.zookeeper() {
            Some(zk) => super::zookeeper::remove_run(zk, &format!("{}/{run_id}", super::zookeeper::BENCH_ROOT)).await,
            None => Ok(()),
        },
        "redis" => match client.redis() {
            Some(r) => super::redis::remove_run(r, &format!("distlock-bench-{run_id}")).await,
            None => Ok(()),
        },
        "sqlite" => match client.sqlite() {
            Some(lite) => {
                let q = format!("DELETE FROM {} WHERE name LIKE 'distlock-bench-{run_id}-%'", lite.url().table());
                async {
                    let pool = sqlx::sqlite::SqlitePoolOptions::new()
                        .max_connections(1)
                        .connect_with(
                            sqlx::sqlite::SqliteConnectOptions::new()
                                .filename(lite.url().path())
                                .busy_timeout(Duration::from_secs(30)),
                        )
                        .await?;
                    sqlx::query(&q).execute(&pool).await?;
                    pool.close().await;
                    Ok::<(), anyhow::Error>(())
                }
                .await
            }
            None => Ok(()),
        },
        _ => Ok(()),
    };
    if let Err(e) = done {
        eprintln!("distlock-bench: held: cleaning up the run's keys: {e:#}");
    }
}

/// The server's own floor for holding K locks, through a proxy of its own.
struct Floor {
    what: &'static str,
    /// None for SQLite: no server.
    proxy: Option<Child>,
    held: usize,
    acquire: Duration,
    heap_per_lock: f64,
    error: Option<String>,
    hold: FloorHold,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

/// What the floor holds its keys with.
enum FloorHold {
    Etcd(distlock::etcd::Client),
    Zk(distlock::zookeeper::Client, String),
    Redis(distlock::redis::Client, String),
    Postgres(tokio_postgres::Client),
    Mysql(Box<sqlx::MySqlConnection>),
    Sqlite(sqlx::SqlitePool, String, String),
}

/// What the floor measured.
struct FloorReport {
    what: &'static str,
    held: usize,
    acquire: Duration,
    heap_per_lock: f64,
    error: Option<String>,
}

impl Floor {
    async fn start(
        url: &str,
        backend: &str,
        run_id: &str,
        k: usize,
        lease: Duration,
        progress: &Progress,
    ) -> anyhow::Result<Floor> {
        let (proxy, furl) = match url.starts_with("sqlite:") {
            true => (None, url.to_string()),
            false => {
                let (p, u) = proxy_for(url).await?;
                (Some(p), u)
            }
        };
        let heap_before = crate::alloc::live_bytes();
        let start = Instant::now();
        let mut held = 0usize;
        let mut error = None;
        // One key's answer: counted, or the first error (and no more keys).
        let note = |r: Result<(), String>, held: &mut usize, error: &mut Option<String>| match r {
            Ok(()) => {
                *held += 1;
                if (*held).is_multiple_of(100) {
                    progress.show("held: floor acquiring", *held as u64, start.elapsed());
                }
                true
            }
            Err(e) => {
                *error = Some(e);
                false
            }
        };
        let (what, hold, renewer): (&'static str, FloorHold, Option<tokio::task::JoinHandle<()>>) = match backend {
            "etcd" => {
                let c = distlock::etcd::Client::connect(&furl).await?;
                let lease_id = c.lease_id().await?;
                let mut etcd = c.etcd();
                let put = Some(distlock::etcd::etcd_client::PutOptions::new().with_lease(lease_id));
                for i in 0..k {
                    let r = etcd.put(format!("distlock-bench-{run_id}-floor/{i:05}"), "", put.clone()).await;
                    if !note(r.map(drop).map_err(|e| e.to_string()), &mut held, &mut error) {
                        break;
                    }
                }
                ("one lease (its keep-alive stream) + K puts under it", FloorHold::Etcd(c), None)
            }
            "zookeeper" => {
                let c = distlock::zookeeper::Client::connect(&furl).await?;
                let dir = format!("{}/{run_id}/floor", super::zookeeper::BENCH_ROOT);
                let zk = c.zookeeper();
                let persistent =
                    zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
                zk.mkdir(&dir, &persistent).await?;
                let eph = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
                for i in 0..k {
                    let r = zk.create(&format!("{dir}/n{i:05}"), b"", &eph).await;
                    if !note(r.map(drop).map_err(|e| e.to_string()), &mut held, &mut error) {
                        break;
                    }
                }
                ("K ephemeral nodes on one session (its pings keep them)", FloorHold::Zk(c, dir), None)
            }
            "redis" => {
                let c = distlock::redis::Client::connect(&furl).await?;
                let prefix = format!("distlock-bench-{run_id}-floor");
                let mut conn = c.connection();
                let ms = lease.as_millis() as u64;
                let mut pipe = redis::pipe();
                for i in 0..k {
                    pipe.cmd("SET").arg(format!("{prefix}:{i:05}")).arg("v").arg("NX").arg("PX").arg(ms);
                }
                let r: Result<Vec<Option<String>>, _> = pipe.query_async(&mut conn).await;
                match r {
                    Ok(v) => held = v.iter().filter(|s| s.is_some()).count(),
                    Err(e) => error = Some(e.to_string()),
                }
                let renew_prefix = prefix.clone();
                let renewer = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(lease / 3).await; // the floor's renewal period
                        let mut pipe = redis::pipe();
                        for i in 0..k {
                            pipe.cmd("PEXPIRE").arg(format!("{renew_prefix}:{i:05}")).arg(ms);
                        }
                        let _: Result<Vec<i64>, _> = pipe.query_async(&mut conn).await;
                    }
                });
                (
                    "K SET NX PX in one pipeline; a pipeline of K PEXPIRE every third of the lease",
                    FloorHold::Redis(c, prefix),
                    Some(renewer),
                )
            }
            "postgres" => {
                let parsed = distlock::postgres::PgUrl::parse(&furl)?;
                let config = super::postgres_tls::config(&furl, &parsed)?;
                let (conn, connection) = config.connect(super::postgres_tls::connector(&parsed)?).await?;
                tokio::spawn(connection);
                let base: i64 = (uuid::Uuid::new_v4().as_u128() as i64) & 0x0fff_ffff_ffff_0000;
                let stmt = conn.prepare("SELECT pg_try_advisory_lock($1)").await?;
                for i in 0..k {
                    let r = conn.query_one(&stmt, &[&(base + i as i64)]).await;
                    let r = match r {
                        Ok(row) if row.get::<_, bool>(0) => Ok(()),
                        Ok(_) => Err("pg_try_advisory_lock refused".to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if !note(r, &mut held, &mut error) {
                        break;
                    }
                }
                ("K pg_try_advisory_lock on one connection", FloorHold::Postgres(conn), None)
            }
            "mysql" => {
                use sqlx::Connection;
                let parsed = distlock::mysql::MysqlUrl::parse(&furl)?;
                let options = super::sql::mysql_options(&furl, &parsed)?;
                let mut conn = sqlx::MySqlConnection::connect_with(&options).await?;
                for i in 0..k {
                    let r: Result<Option<i64>, _> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                        .bind(format!("distlock-bench-{run_id}-floor-{i:05}"))
                        .fetch_one(&mut conn)
                        .await;
                    let r = match r {
                        Ok(Some(1)) => Ok(()),
                        Ok(other) => Err(format!("GET_LOCK answered {other:?}")),
                        Err(e) => Err(e.to_string()),
                    };
                    if !note(r, &mut held, &mut error) {
                        break;
                    }
                }
                ("K GET_LOCK on one connection", FloorHold::Mysql(Box::new(conn)), None)
            }
            "sqlite" => {
                let client = distlock::connect(url).await?;
                let lite = client.sqlite().ok_or_else(|| anyhow::anyhow!("not a sqlite URL"))?;
                let (acquire, _) = lite.lease_statements();
                let table = lite.url().table().to_string();
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(lite.url().path())
                    .busy_timeout(Duration::from_secs(30));
                let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect_with(options).await?;
                let modifier = format!("+{:.3} seconds", lease.as_secs_f64());
                let holder = format!("bench-floor-{run_id}");
                for i in 0..k {
                    let r: Result<Option<(i64, i64)>, _> = sqlx::query_as(acquire)
                        .bind(format!("distlock-bench-{run_id}-floor-{i:05}"))
                        .bind(&holder)
                        .bind(&modifier)
                        .fetch_optional(&pool)
                        .await;
                    let r = match r {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err("the lease row was held".to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if !note(r, &mut held, &mut error) {
                        break;
                    }
                }
                let (renew_pool, extend) = (
                    pool.clone(),
                    format!(
                        "UPDATE {table} SET lock_until = strftime('%Y-%m-%d %H:%M:%f', 'now', ?1) WHERE locked_by = ?2"
                    ),
                );
                let renewer = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(lease / 3).await; // the floor's renewal period
                        let _ = sqlx::query(&extend).bind(&modifier).bind(&holder).execute(&renew_pool).await;
                    }
                });
                (
                    "K acquire upserts of the lease table; one UPDATE of all every third of the lease",
                    FloorHold::Sqlite(pool, table, format!("distlock-bench-{run_id}-floor-")),
                    Some(renewer),
                )
            }
            other => anyhow::bail!("held: no floor for {other}"),
        };
        let acquire = start.elapsed();
        let heap_per_lock = (crate::alloc::live_bytes() - heap_before) as f64 / held.max(1) as f64;
        Ok(Floor { what, proxy, held, acquire, heap_per_lock, error, hold, renewer })
    }

    /// The floor proxy's counts (none for SQLite: no server).
    async fn count(&mut self) -> anyhow::Result<Option<(u64, u64, u64)>> {
        match self.proxy.as_mut() {
            Some(p) => Ok(Some(p.count().await?)),
            None => Ok(None),
        }
    }

    /// Lets the floor's keys go and removes them.
    async fn stop(self) -> FloorReport {
        if let Some(r) = &self.renewer {
            r.abort();
        }
        let done: anyhow::Result<()> = async {
            match self.hold {
                FloorHold::Etcd(c) => c.close(Duration::from_secs(5)).await, // revokes the lease: its keys go
                FloorHold::Zk(c, dir) => {
                    super::zookeeper::remove_run(&c, &dir).await?;
                    c.close(Duration::from_secs(5)).await;
                }
                FloorHold::Redis(c, prefix) => super::redis::remove_run(&c, &prefix).await?,
                FloorHold::Postgres(conn) => {
                    conn.execute("SELECT pg_advisory_unlock_all()", &[]).await?;
                }
                FloorHold::Mysql(conn) => {
                    let mut conn = *conn;
                    sqlx::query("SELECT RELEASE_ALL_LOCKS()").execute(&mut conn).await?;
                }
                FloorHold::Sqlite(pool, table, prefix) => {
                    sqlx::query(&format!("DELETE FROM {table} WHERE name LIKE '{prefix}%'")).execute(&pool).await?;
                    pool.close().await;
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = done {
            eprintln!("distlock-bench: held: letting the floor's keys go: {e:#}");
        }
        FloorReport {
            what: self.what,
            held: self.held,
            acquire: self.acquire,
            heap_per_lock: self.heap_per_lock,
            error: self.error,
        }
    }
}

//! The PostgreSQL backend against a real server (started by `scripts/test.sh` with
//! `scripts/postgres.sh`, which exports `DISTLOCK_TEST_POSTGRES=postgres://…`).
#![cfg(feature = "postgres")]

use crate::common;
use crate::common::{eventually, unique};

use distlock::postgres::{AdvisoryKey, Client};
use distlock::{Error, LockState, LostReason};
use distlock_faults::{Fault, FaultProxy, FencedResource, Mode};
use std::time::Duration;
use tokio::time::Instant;

fn pg_url() -> String {
    std::env::var("DISTLOCK_TEST_POSTGRES").expect(
        "DISTLOCK_TEST_POSTGRES is not set: run the tests with scripts/test.sh, which starts PostgreSQL on a free port",
    )
}

fn url(query: &str) -> String {
    format!("{}{query}", pg_url())
}

async fn connect(query: &str) -> Client {
    Client::connect(&url(query)).await.expect("connect to the test PostgreSQL server")
}

/// A plain connection for looking at the server as a third party.
async fn raw() -> tokio_postgres::Client {
    raw_to(&pg_url()).await
}

/// A new database of the test's own (for tests that change its fencing sequence or need it
/// untouched): its name and its URL, no query. [`drop_database`] removes it.
async fn own_database(prefix: &str) -> (String, String) {
    let db = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    raw().await.batch_execute(&format!("CREATE DATABASE {db}")).await.unwrap();
    let url = format!("{}/{db}", pg_url().rsplit_once('/').unwrap().0);
    (db, url)
}

/// Removes a database of [`own_database`], its connections ended.
async fn drop_database(db: &str) {
    raw().await.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).await.unwrap();
}

/// [`raw`] to the server at `conninfo` (a URL or libpq's key=value form).
async fn raw_to(conninfo: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await.expect("raw connection");
    tokio::spawn(connection);
    client
}

/// Advisory locks on `key` as `pg_locks` shows them: (pid, granted), holders first (also the
/// shared-connection tests').
pub(crate) async fn holders(raw: &tokio_postgres::Client, key: AdvisoryKey) -> Vec<(i32, bool)> {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    raw.query(
        "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = $1 \
         AND objid::bigint = $2 AND objsubid::bigint = $3 ORDER BY granted DESC",
        &[&classid, &objid, &objsubid],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// The first clients on a new database, all at once: each makes what is missing (the fencing
/// sequence, the elections' and the jobs' tables), and one that loses the race to make it finds
/// it made. PostgreSQL reports that loss as a unique violation or as "already exists", by timing;
/// every connect, election and job works.
#[tokio::test]
async fn the_first_clients_on_a_new_database_make_its_objects_at_once() {
    for round in 0..6 {
        let (db, url) = own_database("first").await;
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let url = format!("{url}?lease=5s");
                tokio::spawn(async move {
                    let client = distlock::connect(&url).await.map_err(|e| format!("connect: {e}"))?;
                    client.election("e").unwrap().leader().await.map_err(|e| format!("election: {e}"))?;
                    let job = client.schedule("j").unwrap().once_per(Duration::from_secs(60));
                    job.last_run().await.map_err(|e| format!("job: {e}"))?;
                    client.close(Duration::from_secs(5)).await;
                    Ok::<(), String>(())
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        drop_database(&db).await;
    }
}

#[tokio::test]
async fn the_key_the_token_and_nothing_left_after_release() {
    let pg = connect("?lease=10s").await;
    let raw = raw().await;
    let name = unique("layout");
    let key = pg.key(&name).unwrap();
    let guard = pg.mutex(&name).unwrap().lock().await.unwrap();
    let held = holders(&raw, key).await;
    assert_eq!(held.len(), 1, "one advisory lock on the key: {held:?}");
    assert!(held[0].1, "granted");
    let token = guard.fencing_token() as i64;
    let last: i64 = raw.query_one("SELECT last_value FROM distlock_fencing_seq", &[]).await.unwrap().get(0);
    assert!(token <= last, "the token came from the sequence: {token} vs its last value {last}");
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.lease_deadline() > std::time::Instant::now() + Duration::from_secs(8));
    guard.release().await.unwrap();
    assert!(holders(&raw, key).await.is_empty(), "released on the server");
    let again = pg.mutex(&name).unwrap().try_lock().await.unwrap().expect("free again");
    assert!(again.fencing_token() > token as u64, "the counter rose");
    again.release().await.unwrap();
    // Tokens start from the server clock in µs (a new connection raises the sequence to it).
    let now_us: i64 =
        raw.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint", &[]).await.unwrap().get(0);
    assert!(token >= now_us - 600_000_000, "tokens follow the server clock: {token} vs {now_us}");
    // Raw keys: the name is the key.
    let raw_pg = connect("?keys=raw").await;
    assert_eq!(raw_pg.key("-42").unwrap(), AdvisoryKey::Single(-42));
    assert!(matches!(raw_pg.mutex("orders"), Err(Error::InvalidLockPath { .. })));
}

/// The fencing sequence when it lost its last advances (a crash with asynchronous commit, or a
/// failover to a lagging standby), simulated by setting it back, in a database of the test's own
/// so that no other test sees it: every connection opened afterwards raises it past the clock, so
/// tokens still rise; and a sequence ahead of the clock is only ever advanced, never set back.
#[tokio::test]
async fn tokens_rise_across_a_lost_sequence_advance_and_a_clock_behind() {
    let (db, plain) = own_database("distlock_floor").await;
    let db_url = format!("{plain}?lease=10s");
    let (own, connection) = tokio_postgres::connect(&plain, tokio_postgres::NoTls).await.unwrap();
    let own_task = tokio::spawn(connection);
    {
        let a = Client::connect(&db_url).await.unwrap();
        let g = a.mutex("floor").unwrap().lock().await.unwrap();
        let before = g.fencing_token();
        g.release().await.unwrap();
        drop(a);
        own.batch_execute("SELECT setval('distlock_fencing_seq', 1)").await.unwrap();
        let b = Client::connect(&db_url).await.unwrap();
        let g = b.mutex("floor").unwrap().lock().await.unwrap();
        assert!(
            g.fencing_token() > before,
            "a new connection raised the sequence past {before}: {}",
            g.fencing_token()
        );
        g.release().await.unwrap();
        // A sequence ahead of the clock (a clock set back, or a million tokens a second) is left
        // alone by new connections: the next token is one more.
        let ahead = g_ahead(&own).await;
        let c = Client::connect(&db_url).await.unwrap();
        let g = c.mutex("floor").unwrap().lock().await.unwrap();
        assert_eq!(g.fencing_token(), ahead as u64 + 1);
        g.release().await.unwrap();
    }
    drop(own);
    let _ = own_task.await;
    drop_database(&db).await;
}

/// Sets the fencing sequence an hour ahead of the server clock; returns the value set.
async fn g_ahead(own: &tokio_postgres::Client) -> i64 {
    own.query_one(
        "SELECT setval('distlock_fencing_seq', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 3600000000)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn exclusion_with_the_fenced_checker_and_rising_tokens() {
    // Four clients, 15 cycles each, checked by the fenced checker; nothing left held.
    exclusion_through(&url("?lease=5s"), &unique("exclusion"), 15, &raw().await).await;
}

#[tokio::test]
async fn a_timed_out_or_cancelled_wait_leaves_nothing() {
    let (a, b) = (connect("").await, connect("").await);
    let raw = raw().await;
    let name = unique("timeout");
    let key = a.key(&name).unwrap();
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let started = Instant::now();
    assert!(b.mutex(&name).unwrap().lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(5), "waited {waited:?}");
    assert!(b.mutex(&name).unwrap().try_lock().await.unwrap().is_none());
    // A wait dropped while the server queues it: cancelled on the server, nothing left waiting.
    let waiter = b.mutex(&name).unwrap();
    let pending = tokio::spawn(async move { waiter.lock().await });
    eventually(Duration::from_secs(5), "the waiter to queue on the server", || async {
        holders(&raw, key).await.iter().any(|(_, granted)| !granted)
    })
    .await;
    pending.abort();
    eventually(Duration::from_secs(5), "the cancelled wait to leave the queue", || async {
        holders(&raw, key).await.len() == 1
    })
    .await;
    let t = held.fencing_token();
    held.release().await.unwrap();
    assert!(holders(&raw, key).await.is_empty(), "nothing held after the release");
    let g = b.mutex(&name).unwrap().try_lock().await.unwrap().expect("free");
    assert!(g.fencing_token() > t);
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_terminated_backend_is_lost_at_once_and_frees_the_lock() {
    let (a, b) = (connect("?lease=30s").await, connect("").await);
    let raw = raw().await;
    let name = unique("terminated");
    let key = a.key(&name).unwrap();
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let pid = holders(&raw, key).await[0].0;
    let lost = held.lost();
    let killed = Instant::now();
    let _: bool = raw.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
    let reason = tokio::time::timeout(Duration::from_secs(5), lost).await.expect("told within 5 s, not the lease");
    assert_eq!(reason, LostReason::ConnectionClosed);
    println!("lost {:?} after pg_terminate_backend", killed.elapsed());
    assert!(held.state().is_lost());
    let g =
        b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(5)).await.unwrap().expect("freed with the session");
    assert!(g.fencing_token() > held.fencing_token());
    assert!(matches!(held.release().await, Err(Error::LockLost { reason: LostReason::ConnectionClosed, .. })));
    g.release().await.unwrap();
}

/// A holder cut off from the server is `Lost` at its lease deadline. Through a loopback proxy
/// the server still hears TCP from the proxy, so it keeps the lock (safe, not live) until the
/// proxy closes the connection; the test shows the loss came while the server still held it.
#[tokio::test]
async fn a_partitioned_holder_is_lost_while_the_server_still_holds_it() {
    let target = pg_url();
    let hostport = target.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let proxy = FaultProxy::start(hostport.parse().unwrap()).await.unwrap();
    let proxied = target.replace(&hostport, &proxy.addr().to_string());
    let a = Client::connect(&format!("{proxied}?lease=3s")).await.unwrap();
    let raw = raw().await;
    let name = unique("partition");
    let key = a.key(&name).unwrap();
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let deadline = held.lease_deadline();
    let lost = held.lost();
    proxy.set(Fault::Blackhole);
    let reason = tokio::time::timeout(Duration::from_secs(10), lost).await.expect("lost within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    assert!(
        std::time::Instant::now() < deadline + Duration::from_secs(4),
        "told by the deadline (a renewal may have moved it)"
    );
    assert_eq!(
        holders(&raw, key).await.iter().filter(|(_, g)| *g).count(),
        1,
        "the server still held it when we were told"
    );
    // The connection is cut: the server frees the lock, the next holder gets a larger token.
    proxy.set(Fault::CutAfter { to_client_bytes: 0 });
    let b = connect("").await;
    let g = b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap().expect("freed once cut");
    assert!(g.fencing_token() > held.fencing_token());
    g.release().await.unwrap();
}

#[tokio::test]
async fn readers_share_writers_exclude_and_the_mutex_is_a_writer() {
    const CYCLES: u64 = 10;
    let name = unique("rw");
    let resource = FencedResource::new(false, 1);
    let mut tasks = Vec::new();
    for who in 0..4usize {
        let (name, resource) = (name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let pg = connect("?lease=5s").await;
            let lock = pg.rwlock(&name).unwrap();
            let mutex = pg.mutex(&name).unwrap();
            for _ in 0..CYCLES {
                let (g, mode) = match who {
                    0 => (mutex.lock().await.unwrap(), Mode::Exclusive),
                    1 => (lock.write().await.unwrap(), Mode::Exclusive),
                    _ => (lock.read().await.unwrap(), Mode::Shared),
                };
                let id = resource.begin(who, mode, g.fencing_token());
                if mode == Mode::Shared {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                } else {
                    tokio::task::yield_now().await;
                }
                resource.end(id);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.overlaps.is_empty(), "{report}");
    // Two readers at once, a writer refused while they hold.
    let (a, b) = (connect("").await, connect("").await);
    let r1 = a.rwlock(&name).unwrap().read().await.unwrap();
    let r2 = b.rwlock(&name).unwrap().try_read().await.unwrap().expect("readers share");
    assert!(b.rwlock(&name).unwrap().try_write().await.unwrap().is_none());
    assert!(b.mutex(&name).unwrap().try_lock().await.unwrap().is_none(), "the mutex is the write side");
    let t = r1.fencing_token().max(r2.fencing_token());
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = b.rwlock(&name).unwrap().try_write().await.unwrap().expect("free");
    assert!(w.fencing_token() > t, "a writer after readers gets a larger token");
    w.release().await.unwrap();
    assert!(holders(&raw().await, a.key(&name).unwrap()).await.is_empty());
}

/// A released lock's connection serves the next acquire (the same backend), and a lock granted
/// after a wait longer than the lease is held, not born lost.
#[tokio::test]
async fn connections_are_reused_and_a_long_wait_is_not_a_loss() {
    let raw = raw().await;
    let (a, b) = (connect("?lease=3s").await, connect("?lease=3s").await);
    let name = unique("reuse");
    let key = a.key(&name).unwrap();
    let g = a.mutex(&name).unwrap().lock().await.unwrap();
    let first_pid = holders(&raw, key).await[0].0;
    g.release().await.unwrap();
    let g = a.mutex(&name).unwrap().lock().await.unwrap();
    assert_eq!(holders(&raw, key).await[0].0, first_pid, "the same connection served again");
    // b waits 4 s (longer than its 3 s lease) behind a's hold.
    let waiter = tokio::spawn({
        let lock = b.mutex(&name).unwrap();
        async move { lock.lock().await.unwrap() }
    });
    eventually(Duration::from_secs(5), "b to queue", || async { holders(&raw, key).await.len() == 2 }).await;
    tokio::time::sleep(Duration::from_secs(4)).await; // the wait itself is what is tested
    assert_eq!(g.state(), LockState::Held, "a's hold is renewed by its pings meanwhile");
    g.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("granted").unwrap();
    assert_eq!(got.state(), LockState::Held, "granted after a wait longer than the lease, and held");
    assert!(got.lease_deadline() > std::time::Instant::now() + Duration::from_secs(2));
    let lost = got.lost();
    assert!(tokio::time::timeout(Duration::from_secs(4), lost).await.is_err(), "still held a lease later");
    got.release().await.unwrap();
}

/// A semaphore of 3 permits under 6 clients: never more than 3 holders (the checker counts
/// them), every holder's slot is one advisory lock, and nothing is left held.
#[tokio::test]
async fn a_semaphore_never_has_more_holders_than_permits() {
    const CLIENTS: usize = 6;
    const CYCLES: u64 = 8;
    let name = unique("semaphore");
    let resource = FencedResource::new(false, 3);
    let mut tasks = Vec::new();
    for who in 0..CLIENTS {
        let (name, resource) = (name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let pg = connect("?lease=5s").await;
            let sem = pg.semaphore(&name, 3).unwrap();
            for _ in 0..CYCLES {
                let p = tokio::time::timeout(Duration::from_secs(30), sem.acquire()).await.unwrap().unwrap();
                let id = resource.begin(who, Mode::Shared, p.fencing_token());
                tokio::time::sleep(Duration::from_millis(2)).await;
                resource.end(id);
                p.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, CLIENTS * CYCLES as usize);
    let pg = connect("").await;
    let sem = pg.semaphore(&name, 3).unwrap();
    let all: Vec<_> =
        [sem.try_acquire().await.unwrap(), sem.try_acquire().await.unwrap(), sem.try_acquire().await.unwrap()]
            .into_iter()
            .map(|p| p.expect("every permit free again"))
            .collect();
    assert!(sem.try_acquire().await.unwrap().is_none(), "three of three");
    for p in all {
        p.release().await.unwrap();
    }
    assert!(matches!(pg.semaphore(&name, 0), Err(Error::InvalidArgument { .. })));
}

/// A waiter is woken by a release in another client (NOTIFY), and finds a permit freed by a
/// holder whose session was terminated (no NOTIFY: the rescan).
#[tokio::test]
async fn a_semaphore_waiter_gets_released_and_orphaned_permits() {
    let name = unique("semaphore-wait");
    // b rescans only every minute: within the 20 s bound only the release's NOTIFY can wake it.
    let app = format!("waiter{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let (a, b) = (connect("?lease=10s").await, connect(&format!("?lease=10s&rescan=60s&application_name={app}")).await);
    let held = a.semaphore(&name, 1).unwrap().acquire().await.unwrap();
    let waiter = b.semaphore(&name, 1).unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.acquire_timeout(Duration::from_secs(20)).await });
    // Released in the other client once b waits (its LISTEN connection is up): b gets it.
    let raw = raw().await;
    eventually(Duration::from_secs(10), "b's LISTEN connection", || async {
        let q = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'";
        let n: i64 = raw.query_one(q, &[&app]).await.unwrap().get(0);
        n > 0
    })
    .await;
    held.release().await.unwrap();
    let got = waiting.await.unwrap().unwrap().expect("the NOTIFY woke the waiter");
    // Now the holder's session is terminated: no release, no NOTIFY; a waiter that rescans (the
    // default 0.5 s) still gets it.
    let waiter = connect("?lease=10s").await.semaphore(&name, 1).unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.acquire_timeout(Duration::from_secs(20)).await });
    let pids: Vec<i32> = holders(&raw, got.key()).await.into_iter().filter(|(_, g)| *g).map(|(p, _)| p).collect();
    assert_eq!(pids.len(), 1);
    raw.execute("SELECT pg_terminate_backend($1)", &[&pids[0]]).await.unwrap();
    let again = waiting.await.unwrap().unwrap().expect("the orphaned permit was found");
    assert!(again.fencing_token() > got.fencing_token());
    again.release().await.unwrap();
    assert!(matches!(got.release().await, Err(Error::LockLost { .. })));
}

/// A PostgreSQL set up as production is (`scripts/postgres.sh start-tls`: `ssl = on`, only
/// `hostssl` lines, a SCRAM user and a certificate user): `sslmode=verify-full` with the CA locks,
/// elects and runs a job as either user; what falls short is refused, naming the cause, within
/// the connect timeout, without the password.
#[tokio::test]
async fn a_tls_only_server_with_scram_and_certificate_users() {
    let server = distlock_faults::OwnServer::start("postgres.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let (ca, other_ca) = (server.file("certs/ca.pem"), server.file("certs/other-ca.pem"));
    let (cert, key) = (server.file("certs/client.pem"), server.file("certs/client.key"));
    let addr = server.printed.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let scram = format!(
        "postgres://distlock:{password}@{addr}/locks?sslmode=verify-full&sslrootcert={ca}&lease=5s&connect_timeout=3s"
    );
    let by_cert = format!(
        "postgres://certuser@{addr}/locks_cert?sslmode=verify-full&cacert={ca}&cert={cert}&key={key}&lease=5s&connect_timeout=3s"
    );
    for url in [&scram, &by_cert] {
        common::secure::locks_elects_and_runs_a_job(url).await;
    }
    // psql sees our session's TLS.
    let _open = distlock::connect(&scram).await.unwrap();
    let out = std::process::Command::new("psql")
        .arg(format!("host=127.0.0.1 port={} user=distlock dbname=locks sslmode=verify-full sslrootcert={ca}", addr.rsplit(':').next().unwrap()))
        .args(["-Atc", "select count(*) > 0 from pg_stat_ssl s join pg_stat_activity a using (pid) where a.application_name = 'distlock' and s.ssl"])
        .env("PGPASSWORD", &password)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "t", "{}", String::from_utf8_lossy(&out.stderr));

    let refused: Vec<(String, &str)> = vec![
        (scram.replace(&ca, &other_ca), "not signed by a CA trusted here"),
        (
            scram.replace("sslmode=verify-full", "sslmode=disable").replace(&format!("&sslrootcert={ca}"), ""),
            "ask for TLS",
        ),
        (scram.replace(&password, "not-the-password"), "password authentication failed"),
        (by_cert.replace(&format!("&cert={cert}&key={key}"), ""), "give cert and key"),
        (scram.replace(&ca, "/no/such/ca.pem"), "/no/such/ca.pem"),
        (scram.replace("sslmode=verify-full", "sslmode=sometimes"), "sslmode=sometimes"),
    ];
    for (bad, says) in refused {
        common::secure::refused_at_once(&bad, says, &password).await;
    }
    // The server presents a certificate of the trusted CA for another host, then an expired one,
    // then a self-signed one (its own CA), which is refused even when given as the CA (pinned).
    for (cert, says) in
        [("misnamed", "does not name the host"), ("expired", "has expired"), ("selfsigned", "its own CA")]
    {
        server.run("use-cert", &[cert]);
        common::secure::refused_at_once(&scram, says, &password).await;
    }
    let pinned = scram.replace(&ca, &server.file("certs/selfsigned.pem"));
    common::secure::refused_at_once(&pinned, "its own CA", &password).await;
}

/// Least privilege: role `team_a` (`scripts/postgres.sh start-tls`) has no CREATE on the schema
/// (PostgreSQL 15's default), so before `setup` it cannot make the fencing sequence and says so;
/// once the database's owner has run `Client::setup` (`distlock setup`) and given it exactly the
/// grants of docs/security.md, every recipe works for it.
#[tokio::test]
async fn a_least_privilege_user_needs_only_its_grants() {
    let server = distlock_faults::OwnServer::start("postgres.sh", "start-tls", &[]);
    let read = |f: &str| std::fs::read_to_string(server.dir().join(f)).unwrap().trim().to_string();
    let (password, team_password) = (read("password"), read("team-a.password"));
    let ca = server.file("certs/ca.pem");
    let addr = server.printed.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let tail = format!("@{addr}/locks?sslmode=verify-full&sslrootcert={ca}&lease=5s&connect_timeout=3s");
    let (owner, team) =
        (format!("postgres://distlock:{password}{tail}"), format!("postgres://team_a:{team_password}{tail}"));
    let Err(e) = distlock::connect(&team).await else { panic!("no sequence, and no right to make it: connected") };
    let e = e.to_string();
    assert!(e.contains("permission denied for schema public"), "{e}");
    assert!(!e.contains(&team_password), "{e}");
    let admin = distlock::connect(&owner).await.unwrap();
    admin.setup().await.unwrap();
    admin.setup().await.unwrap(); // a second run finds everything in place
    let grants = "GRANT CONNECT ON DATABASE locks TO team_a; GRANT USAGE ON SCHEMA public TO team_a; \
        GRANT SELECT, INSERT, UPDATE, DELETE ON shedlock, distlock_job_runs, distlock_leaders TO team_a; \
        GRANT USAGE, SELECT, UPDATE ON SEQUENCE distlock_fencing_seq TO team_a;";
    let out = std::process::Command::new("psql")
        .arg(format!(
            "host=127.0.0.1 port={} user=distlock dbname=locks sslmode=verify-full sslrootcert={ca}",
            addr.rsplit(':').next().unwrap()
        ))
        .args(["-v", "ON_ERROR_STOP=1", "-qc", grants])
        .env("PGPASSWORD", &password)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    common::secure::every_recipe_under(&team, "team-a/").await;
}

/// Mutual exclusion through `url`: four clients, each taking `name` `cycles` times, checked by
/// the fenced checker (no overlap, tokens rising); nothing is left held on the server, looked at
/// through `server` (a connection to the server itself, not through a pooler).
async fn exclusion_through(url: &str, name: &str, cycles: u64, server: &tokio_postgres::Client) {
    let resource = FencedResource::new(true, 1);
    let mut tasks = Vec::new();
    for who in 0..4usize {
        let (url, name, resource) = (url.to_string(), name.to_string(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let pg = distlock::connect(&url).await.unwrap();
            let lock = pg.mutex(&name).unwrap();
            for seq in 0..cycles {
                let g = tokio::time::timeout(Duration::from_secs(30), lock.lock()).await.unwrap().unwrap();
                let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                assert!(resource.write(who, g.fencing_token(), seq));
                tokio::task::yield_now().await;
                resource.end(id);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, 4 * cycles as usize);
    assert!(holders(server, connect("").await.key(name).unwrap()).await.is_empty(), "nothing left held");
}

/// Behind PgBouncer (Debian's, `scripts/pgbouncer.sh`): in session pooling, locks exclude as on
/// the server itself (the fenced checker); in transaction pooling, where a session advisory lock
/// could be taken or released by another client's statement on the same server session (and
/// where tokio-postgres's prepared statements failed: "prepared statement \"s0\" already
/// exists"), the connect is refused, naming the pooler.
#[tokio::test]
async fn behind_pgbouncer_session_pooling_works_and_transaction_pooling_is_refused() {
    let upstream = pg_url().split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let db = pg_url().rsplit('/').next().unwrap().to_string();
    let session = distlock_faults::OwnServer::start("pgbouncer.sh", "start", &[&upstream, "session", "20"]);
    let url = format!("postgres://postgres@{}/{db}?lease=5s&connect_timeout=5s", session.printed);
    exclusion_through(&url, &unique("pgbouncer-session"), 10, &raw().await).await;
    for mode in ["transaction", "statement"] {
        let pooler = distlock_faults::OwnServer::start("pgbouncer.sh", "start", &[&upstream, mode, "2"]);
        let url = format!("postgres://postgres@{}/{db}?lease=5s&connect_timeout=5s", pooler.printed);
        let Err(e) = distlock::connect(&url).await else { panic!("{mode} pooling accepted") };
        let text = e.to_string();
        assert!(text.contains("transaction pooler") && text.contains("PgBouncer"), "{mode}: {text}");
    }
}

/// PgBouncer set up as production is (`scripts/pgbouncer.sh start-tls`) in front of a TLS-only
/// PostgreSQL (`scripts/postgres.sh start-tls`): TLS required from clients, TLS verified toward
/// the server, SCRAM logins. Over `sslmode=verify-full`: in session pooling a lock, an election
/// and a job work; in transaction pooling `lock_scope=transaction` locks exclude (the fenced
/// checker). A plaintext client, a wrong password and a wrong CA are refused, by name, without
/// the password.
#[tokio::test]
async fn behind_pgbouncer_over_tls_in_front_of_a_tls_only_server() {
    let server = distlock_faults::OwnServer::start("postgres.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let (ca, other_ca) = (server.file("certs/ca.pem"), server.file("certs/other-ca.pem"));
    let updir = server.dir().to_string_lossy().to_string();
    let url = |pooler: &distlock_faults::OwnServer, extra: &str| {
        format!(
            "postgres://distlock:{password}@{}/locks?sslmode=verify-full&sslrootcert={ca}&lease=5s&connect_timeout=5s{extra}",
            pooler.printed.trim()
        )
    };
    let session = distlock_faults::OwnServer::start("pgbouncer.sh", "start-tls", &[&updir, "session", "20"]);
    common::secure::locks_elects_and_runs_a_job(&url(&session, "")).await;
    let transaction = distlock_faults::OwnServer::start("pgbouncer.sh", "start-tls", &[&updir, "transaction", "3"]);
    let scoped = url(&transaction, "&lock_scope=transaction");
    // The server itself, as its owner over its Unix socket (its network port takes TLS logins only).
    let port = std::fs::read_to_string(server.dir().join("postgres.port")).unwrap();
    let socket = std::fs::read_to_string(server.dir().join("data.path")).unwrap();
    let owner = raw_to(&format!("host={} port={} user=postgres dbname=locks", socket.trim(), port.trim())).await;
    exclusion_through(&scoped, &unique("pgbouncer-tls"), 10, &owner).await;

    let plain =
        url(&session, "").replace("sslmode=verify-full", "sslmode=disable").replace(&format!("&sslrootcert={ca}"), "");
    let refused: Vec<(String, &str)> = vec![
        (plain, "ask for TLS"),
        (url(&session, "").replace(&password, "not-the-password"), "wrong user or password"),
        (scoped.replace(&ca, &other_ca), "not signed by a CA trusted here"),
    ];
    for (bad, says) in refused {
        common::secure::refused(&bad, says, &password).await;
    }
}

/// `lock_scope=transaction` behind PgBouncer's transaction pooling (pool of 3 server sessions for
/// 4 clients): every lock is a transaction advisory lock in a transaction held open for its
/// life, so the pooler keeps its client on one server session. The fenced checker finds no
/// overlap; readers share; a semaphore counts (one with a quote and a backslash in its name
/// too); an election, a job and inspection are refused (they need a server session of their own); and a holder cut off from the pooler is told of the loss before the server (its
/// `idle_in_transaction_session_timeout`, the lease) frees the lock for the next holder.
#[tokio::test]
async fn transaction_scoped_locks_behind_pgbouncer_transaction_pooling() {
    let upstream = pg_url().split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let db = pg_url().rsplit('/').next().unwrap().to_string();
    // Each held lock (and each waiting one) keeps a server session for its transaction: three
    // sessions for four clients, and for two readers beside a writer's try.
    let pooler = distlock_faults::OwnServer::start("pgbouncer.sh", "start", &[&upstream, "transaction", "3"]);
    let url = |at: &str| format!("postgres://postgres@{at}/{db}?lease=3s&connect_timeout=10s&lock_scope=transaction");
    exclusion_through(&url(&pooler.printed), &unique("pgbouncer-xact"), 10, &raw().await).await;
    let c = distlock::connect(&url(&pooler.printed)).await.unwrap();
    let rw = unique("pgbouncer-xact-rw");
    let r1 = c.read_lock(&rw).unwrap().lock().await.unwrap();
    let r2 = c.read_lock(&rw).unwrap().try_lock().await.unwrap().expect("readers share");
    assert!(c.write_lock(&rw).unwrap().try_lock().await.unwrap().is_none(), "a writer waits for readers");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let sem = unique("pgbouncer-xact-sem");
    let p1 = c.semaphore_permit(&sem, 1).unwrap().lock().await.unwrap();
    assert!(c.semaphore_permit(&sem, 1).unwrap().try_lock().await.unwrap().is_none(), "one permit");
    // The kind rule holds in transaction scope too: a semaphore and a mutex cannot share a name.
    let m = c.mutex(&sem).unwrap().lock().await;
    assert!(matches!(m, Err(Error::KindConflict { .. })), "a mutex beside a permit: {:?}", m.map(|_| ()));
    p1.release().await.unwrap();
    let m = c.mutex(&sem).unwrap().lock().await.unwrap();
    let p = c.semaphore_permit(&sem, 1).unwrap().try_lock().await;
    assert!(matches!(p, Err(Error::KindConflict { .. })), "a permit beside a mutex: {:?}", p.map(|p| p.is_some()));
    m.release().await.unwrap();
    let Err(e) = c.election("pgbouncer-xact-election") else { panic!("an election with lock_scope=transaction") };
    let e = e.to_string();
    assert!(e.contains("lock_scope=transaction"), "{e}");
    let Err(e) = c.schedule("pgbouncer-xact-job") else { panic!("a job with lock_scope=transaction") };
    assert!(e.to_string().contains("lock_scope=transaction"), "{e}");
    c.setup().await.unwrap(); // nothing it cannot use is made, nothing refused
                              // A semaphore whose name needs escaping in its release notice (a quote and a backslash).
    let odd = format!("{}-o'dd\\name", unique("pgbouncer-xact-sem"));
    let p = c.semaphore_permit(&odd, 1).unwrap().lock().await.unwrap();
    p.release().await.unwrap();
    c.semaphore_permit(&odd, 1).unwrap().try_lock().await.unwrap().expect("released").release().await.unwrap();

    // A holder cut off from the pooler: lost before the next holder is granted.
    let proxy = FaultProxy::start(pooler.printed.parse().unwrap()).await.unwrap();
    let cut = distlock::connect(&url(&proxy.addr().to_string())).await.unwrap();
    let name = unique("pgbouncer-xact-cut");
    let held = cut.mutex(&name).unwrap().lock().await.unwrap();
    let lost = held.lost();
    proxy.set(Fault::Blackhole);
    let next = tokio::spawn({
        let (url, name) = (url(&pooler.printed), name.clone());
        async move {
            let c = distlock::connect(&url).await.unwrap();
            let g = c
                .mutex(&name)
                .unwrap()
                .lock_timeout(Duration::from_secs(30))
                .await
                .unwrap()
                .expect("freed by the server");
            (std::time::Instant::now(), g.fencing_token(), g)
        }
    });
    let reason = tokio::time::timeout(Duration::from_secs(20), lost).await.expect("told within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    let (granted, token, g) = tokio::time::timeout(Duration::from_secs(40), next).await.expect("granted").unwrap();
    // The holder's own deadline (when it counts itself lost), not the instant its task woke.
    assert!(held.lease_deadline() <= granted, "lease until {:?}, granted at {granted:?}", held.lease_deadline());
    assert!(token > held.fencing_token());
    g.release().await.unwrap();
}

/// `setup=no` makes nothing: in a database no distlock client has used, connecting says the
/// fencing sequence is missing and leaves it so; once a client made it, `setup=no` connects.
#[tokio::test]
async fn setup_no_makes_nothing_and_names_what_is_missing() {
    let (db, plain) = own_database("distlock_setup").await;
    let db_url = format!("{plain}?lease=10s");
    let look = format!("{db_url}&setup=no");
    let e = Client::connect(&look).await.unwrap_err();
    assert!(matches!(e, Error::NotSetUp { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("the fencing sequence distlock_fencing_seq is missing, and setup=no makes nothing"), "{e}");
    let own = raw_to(db_url.split('?').next().unwrap()).await;
    let n: i64 = own
        .query_one("SELECT count(*) FROM pg_class WHERE relname = 'distlock_fencing_seq'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "setup=no made the sequence");
    Client::connect(&db_url).await.unwrap().close(Duration::from_secs(2)).await;
    let looking = Client::connect(&look).await.unwrap();
    looking.close(Duration::from_secs(2)).await;
    drop(own);
    drop_database(&db).await;
}

/// The kind markers (advisory keys `646c6b6e,…`) go with their locks: after a hold, a busy try,
/// a wait that timed out, a refused semaphore, a permit and their releases, none is left in the
/// test's own database (a marker left behind would refuse the other kind on that name forever).
#[tokio::test]
async fn kind_markers_go_with_their_locks() {
    let (db, url) = own_database("markers").await;
    let (a, b) = (
        Client::connect(&format!("{url}?lease=4s")).await.unwrap(),
        Client::connect(&format!("{url}?lease=4s")).await.unwrap(),
    );
    let name = unique("markers");
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    assert!(b.mutex(&name).unwrap().try_lock().await.unwrap().is_none(), "busy");
    assert!(b.mutex(&name).unwrap().lock_timeout(Duration::from_millis(200)).await.unwrap().is_none(), "timed out");
    let refused = b.semaphore(&name, 2).unwrap().try_acquire().await;
    assert!(matches!(refused, Err(Error::KindConflict { .. })), "{:?}", refused.map(|p| p.is_some()));
    held.release().await.unwrap();
    b.semaphore(&name, 2).unwrap().acquire().await.unwrap().release().await.unwrap();
    let sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = $1 \
               AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = $2)";
    let left: i64 = raw().await.query_one(sql, &[&0x646c_6b6e_i64, &db]).await.unwrap().get(0);
    assert_eq!(left, 0, "kind markers left in pg_locks");
    drop((a, b));
    drop_database(&db).await;
}

//! The MariaDB backend against a real server (started by `scripts/test.sh` with
//! `scripts/mariadb.sh`, which exports `DISTLOCK_TEST_MYSQL=mysql://…`).
#![cfg(feature = "mysql")]

use crate::common;
use crate::common::unique;

use distlock::mysql::Client;
use distlock::optimistic::optimistic_update;
use distlock::{Error, LockState, LostReason};
use distlock_faults::{Fault, FaultProxy, FencedResource, FreeWatch, Mode};
use sqlx::{Connection, MySqlConnection};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

fn my_url() -> String {
    std::env::var("DISTLOCK_TEST_MYSQL").expect(
        "DISTLOCK_TEST_MYSQL is not set: run the tests with scripts/test.sh, which starts MariaDB on a free port",
    )
}

async fn connect(query: &str) -> Client {
    Client::connect(&format!("{}{query}", my_url())).await.expect("connect to the test MariaDB server")
}

/// A plain connection for looking at the server as a third party.
async fn raw() -> MySqlConnection {
    MySqlConnection::connect(&my_url()).await.expect("raw connection")
}

/// A database of the test's own (for tests that change its fencing sequence or watch its
/// process list): its name and its URL, no query.
async fn own_database(raw: &mut MySqlConnection, prefix: &str) -> (String, String) {
    let db = format!("{prefix}_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    sqlx::query(&format!("CREATE DATABASE {db}")).execute(&mut *raw).await.unwrap();
    let url = format!("{}/{db}", my_url().rsplit_once('/').unwrap().0);
    (db, url)
}

/// The connection holding user lock `name`, if any (`IS_USED_LOCK`).
async fn holder(raw: &mut MySqlConnection, name: &str) -> Option<u64> {
    sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)").bind(name).fetch_one(raw).await.unwrap()
}

#[tokio::test]
async fn the_user_lock_the_sequence_and_nothing_left_after_release() {
    user_lock_and_token("?lease=10s").await;
}

#[tokio::test]
async fn the_user_lock_the_counter_row_and_nothing_left_after_release() {
    user_lock_and_token("?lease=10s&fencing=row").await;
}

/// The layout on the server with either source of tokens (the URL's `fencing`).
async fn user_lock_and_token(query: &str) {
    let db = connect(query).await;
    let mut raw = raw().await;
    let name = unique("layout");
    let lock = db.mutex(&name).unwrap();
    let g = lock.lock().await.unwrap();
    let held_by = holder(&mut raw, &name).await.expect("the user lock is held");
    assert_eq!(g.holder_id(), format!("connection:{held_by}"));
    let token = g.fencing_token() as i64;
    if query.contains("fencing=row") {
        let row: i64 = sqlx::query_scalar("SELECT token FROM distlock_fencing WHERE name = ?")
            .bind(&name)
            .fetch_one(&mut raw)
            .await
            .unwrap();
        assert_eq!(token, row, "the token is the name's counter row");
    } else {
        // The sequence's value or the server clock after the grant, whichever was larger.
        let (seq, now): (i64, i64) = sqlx::query_as(
            "SELECT next_not_cached_value - 1, CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED) \
             FROM distlock_fencing_seq",
        )
        .fetch_one(&mut raw)
        .await
        .unwrap();
        assert!(token <= seq.max(now), "the token came from the sequence or the clock: {token} vs {seq}, {now}");
        assert!(
            db.inspect(&name).await.unwrap().last_token >= Some(token as u64),
            "inspect shows a bound of the tokens handed out"
        );
    }
    assert_eq!(g.state(), LockState::Held);
    assert!(g.lease_deadline() > std::time::Instant::now() + Duration::from_secs(8));
    // Held: not for anyone else, now or within a bounded wait (which leaves nothing behind).
    let other = connect(query).await;
    assert!(other.mutex(&name).unwrap().try_lock().await.unwrap().is_none());
    let began = Instant::now();
    assert!(other.mutex(&name).unwrap().lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    assert!(began.elapsed() >= Duration::from_millis(250), "the server waited: {:?}", began.elapsed());
    g.release().await.unwrap();
    assert_eq!(holder(&mut raw, &name).await, None, "released on the server");
    let again = other.mutex(&name).unwrap().try_lock().await.unwrap().expect("free again");
    assert!(again.fencing_token() > token as u64, "the counter rose");
    again.release().await.unwrap();
    // The connection was reused, and the clock floor holds.
    let now_us: i64 = sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert!(token >= now_us - 600_000_000, "tokens follow the server clock: {token} vs {now_us}");
    assert!(matches!(db.mutex(""), Err(Error::InvalidLockPath { .. })));
    assert!(matches!(db.mutex(&"x".repeat(65)), Err(Error::InvalidLockPath { .. })));
}

/// The fencing sequence when it lost its advances (a replica promoted before it saw them, or the
/// sequence made again), simulated by restarting it at 1, in a database of the test's own: the
/// server clock read after the grant keeps tokens rising; and a sequence ahead of the clock
/// still gives its next value.
#[tokio::test]
async fn tokens_rise_across_a_lost_sequence_advance_and_a_clock_behind() {
    let mut raw = raw().await;
    let (db, plain) = own_database(&mut raw, "distlock_floor").await;
    let mut own = MySqlConnection::connect(&plain).await.unwrap();
    {
        let a = Client::connect(&plain).await.unwrap();
        let g = a.mutex("floor").unwrap().lock().await.unwrap();
        let before = g.fencing_token();
        g.release().await.unwrap();
        drop(a);
        sqlx::query("ALTER SEQUENCE distlock_fencing_seq RESTART WITH 1").execute(&mut own).await.unwrap();
        let b = Client::connect(&plain).await.unwrap();
        let g = b.mutex("floor").unwrap().lock().await.unwrap();
        assert!(
            g.fencing_token() > before,
            "the clock read after the grant keeps tokens above {before}: {}",
            g.fencing_token()
        );
        g.release().await.unwrap();
        // A sequence an hour ahead of the clock gives its own next value.
        let now_us: i64 = sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)")
            .fetch_one(&mut own)
            .await
            .unwrap();
        let ahead = now_us + 3_600_000_000;
        sqlx::query(&format!("ALTER SEQUENCE distlock_fencing_seq RESTART WITH {ahead}"))
            .execute(&mut own)
            .await
            .unwrap();
        let c = Client::connect(&plain).await.unwrap();
        let g = c.mutex("floor").unwrap().lock().await.unwrap();
        assert_eq!(g.fencing_token(), ahead as u64);
        g.release().await.unwrap();
    }
    drop(own);
    sqlx::query(&format!("DROP DATABASE {db}")).execute(&mut raw).await.unwrap();
}

/// Clients taking tokens from the sequence and from counter rows (`fencing=row`: an older
/// client, or a server without sequences) on the same lock: every token is larger than the last,
/// since both read the server clock after the grant; and a sequence set far back (a failover to a
/// replica that missed its advances, seen by connections that stay open) still gives tokens
/// above the last.
#[tokio::test]
async fn tokens_rise_across_token_sources_and_a_sequence_set_back() {
    // A database of the test's own: the sequence is set back below.
    let mut raw = raw().await;
    let (db, plain) = own_database(&mut raw, "distlock_sources").await;
    {
        let seq = Client::connect(&format!("{plain}?lease=10s")).await.unwrap();
        let row = Client::connect(&format!("{plain}?lease=10s&fencing=row")).await.unwrap();
        let mut last = 0;
        for i in 0..6 {
            let client = if i % 2 == 0 { &seq } else { &row };
            let g = client.mutex("sources").unwrap().lock().await.unwrap();
            assert!(g.fencing_token() > last, "round {i}: {} after {last}", g.fencing_token());
            last = g.fencing_token();
            g.release().await.unwrap();
        }
        // Set back under open connections (the pooled ones raise nothing again).
        let held = seq.mutex("sources").unwrap().lock().await.unwrap();
        let mut own = MySqlConnection::connect(&plain).await.unwrap();
        sqlx::query("ALTER SEQUENCE distlock_fencing_seq RESTART WITH 1").execute(&mut own).await.unwrap();
        assert!(held.fencing_token() > last);
        last = held.fencing_token();
        held.release().await.unwrap();
        let g = seq.mutex("sources").unwrap().lock().await.unwrap();
        assert!(g.fencing_token() > last, "after the sequence was set back: {} after {last}", g.fencing_token());
        g.release().await.unwrap();
    }
    sqlx::query(&format!("DROP DATABASE {db}")).execute(&mut raw).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_with_the_fenced_checker_and_rising_tokens() {
    const CLIENTS: usize = 4;
    const CYCLES: u64 = 15;
    let name = unique("exclusion");
    let resource = FencedResource::new(true, 1);
    let mut tasks = Vec::new();
    for who in 0..CLIENTS {
        let (name, resource) = (name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let db = connect("?lease=5s").await;
            let lock = db.mutex(&name).unwrap();
            for seq in 0..CYCLES {
                let g = tokio::time::timeout(Duration::from_secs(30), lock.lock()).await.unwrap().unwrap();
                let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                assert!(resource.write(who, g.fencing_token(), seq));
                tokio::time::sleep(Duration::from_millis(1)).await;
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
    assert_eq!(report.holds, CLIENTS * CYCLES as usize);
    assert_eq!(holder(&mut raw().await, &name).await, None, "nothing left held");
}

/// A holder cut off by a silent partition is told `Lost` at its lease deadline while the server
/// still holds its lock; the server frees it only later (its `wait_timeout`, the lease, after
/// the last ping it received), and the next holder's token is larger.
#[tokio::test]
async fn a_partitioned_holder_is_lost_before_the_server_frees_its_lock() {
    let target = my_url();
    let hostport = target.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let proxy = FaultProxy::start(hostport.parse().unwrap()).await.unwrap();
    let proxied = target.replace(&hostport, &proxy.addr().to_string());
    let a = Client::connect(&format!("{proxied}?lease=3s")).await.unwrap();
    let raw = Arc::new(tokio::sync::Mutex::new(raw().await));
    let name = unique("partition");
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let lost = held.lost();
    proxy.set(Fault::Blackhole);
    // The server's side, watched from now on: when the lock is first seen free.
    let watch = FreeWatch::start(Duration::from_millis(5), {
        let name = name.clone();
        move || {
            let (raw, name) = (raw.clone(), name.clone());
            async move { holder(&mut *raw.lock().await, &name).await.is_some() }
        }
    });
    let reason = tokio::time::timeout(Duration::from_secs(10), lost).await.expect("lost within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    // The holder's deadline came before the server freed the lock.
    let deadline = held.lease_deadline();
    let freed = watch.freed_at(Duration::from_secs(10)).await;
    assert!(deadline < freed, "the server freed the lock {:?} before the holder's deadline", deadline - freed);
    let b = connect("").await;
    let g =
        b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap().expect("freed by wait_timeout");
    assert!(g.fencing_token() > held.fencing_token());
    g.release().await.unwrap();
    proxy.heal();
}

/// A holding connection killed on the server (`KILL`) is `Lost` by the next ping.
#[tokio::test]
async fn a_killed_connection_is_lost_within_a_sixth_of_the_lease() {
    let db = connect("?lease=3s").await;
    let mut raw = raw().await;
    let name = unique("killed");
    let g = db.mutex(&name).unwrap().lock().await.unwrap();
    let id = holder(&mut raw, &name).await.unwrap();
    let lost = g.lost();
    sqlx::query(&format!("KILL {id}")).execute(&mut raw).await.unwrap();
    let reason =
        tokio::time::timeout(Duration::from_secs(2), lost).await.expect("lost within a sixth of the lease and a bit");
    assert_eq!(reason, LostReason::ConnectionClosed);
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    // The server frees a killed thread's locks as the thread ends, which may come a little after
    // its socket closed (what the client saw): then the lock is ours to take again at once.
    let raw = tokio::sync::Mutex::new(raw);
    common::eventually(Duration::from_secs(10), "the server to free the killed connection's lock", || async {
        holder(&mut *raw.lock().await, &name).await.is_none()
    })
    .await;
    let again = db.mutex(&name).unwrap().try_lock().await.unwrap().expect("freed with the connection");
    again.release().await.unwrap();
}

/// A dropped wait is ended on the server (its connection closes with it, and the server ends a
/// GET_LOCK whose client is gone), so it cannot take the lock after its owner gave up.
#[tokio::test]
async fn a_dropped_wait_leaves_nothing_waiting_on_the_server() {
    // The waiter uses a database of its own, so the process list shows its statements apart from
    // other tests' (user locks are server-wide: it still waits for the same lock).
    let mut raw = raw().await;
    let (db, own_db) = own_database(&mut raw, "distlock_drop").await;
    let (a, b) = (connect("").await, Client::connect(&own_db).await.unwrap());
    let name = unique("dropped");
    let g = a.mutex(&name).unwrap().lock().await.unwrap();
    let waiter = b.mutex(&name).unwrap();
    let mut wait = Box::pin(waiter.lock());
    // Drop the wait only once the server shows it waiting.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::select! {
            r = &mut wait => panic!("granted while held: {r:?}"),
            n = waiting(&mut raw, &db) => if n > 0 { break },
        }
        assert!(Instant::now() < deadline, "the wait never showed in the process list");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(wait);
    {
        let raw = tokio::sync::Mutex::new(&mut raw);
        common::eventually(Duration::from_secs(5), "the dropped wait killed on the server", || async {
            waiting(&mut **raw.lock().await, &db).await == 0
        })
        .await;
    }
    g.release().await.unwrap();
    let c = connect("").await;
    let next = c.mutex(&name).unwrap().try_lock().await.unwrap().expect("nobody else took it");
    next.release().await.unwrap();
    sqlx::query(&format!("DROP DATABASE {db}")).execute(&mut raw).await.unwrap();
}

/// Acquire statements (`SELECT IF(GET_LOCK(…) = 1, NEXTVAL(…), NULL)`) running in database
/// `db` now.
async fn waiting(raw: &mut MySqlConnection, db: &str) -> i64 {
    // By the thread's state, not its statement's text: reading another thread's INFO while the
    // server kills that thread crashed MariaDB 10.11 once (a segfault in this very query, in a
    // full run of scripts/test.sh).
    processes(raw, db, "AND STATE = 'User lock'").await
}

/// The server sessions using database `db` (the process list's), those matching `and` only.
async fn processes(raw: &mut MySqlConnection, db: &str, and: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ? {and}");
    sqlx::query_scalar(&sql).bind(db).fetch_one(raw).await.unwrap()
}

/// The seed's account on MariaDB (balance 1000, version 1; +100 and −50 read at once): one write
/// wins, the other finds the version moved, reads again and writes; the balance is 1050.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_optimistic_account_on_mariadb() {
    let table = format!("account_{}", uuid::Uuid::new_v4().simple());
    let mut admin = raw().await;
    sqlx::query(&format!(
        "CREATE TABLE {table} (id INT PRIMARY KEY, balance BIGINT NOT NULL, version BIGINT NOT NULL)"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::query(&format!("INSERT INTO {table} VALUES (1, 1000, 1)")).execute(&mut admin).await.unwrap();
    let both_read = Arc::new(tokio::sync::Barrier::new(2));
    let session = |delta: i64| {
        let (table, both_read) = (table.clone(), both_read.clone());
        tokio::spawn(async move {
            let db = tokio::sync::Mutex::new(raw().await);
            let first = std::sync::atomic::AtomicBool::new(true);
            let (select, update) = (
                format!("SELECT balance, version FROM {table} WHERE id = 1"),
                format!("UPDATE {table} SET balance = ?, version = version + 1 WHERE id = 1 AND version = ?"),
            );
            optimistic_update(
                5,
                || async {
                    let read: (i64, i64) = sqlx::query_as(&select).fetch_one(&mut *db.lock().await).await?;
                    if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        both_read.wait().await;
                    }
                    Ok::<_, sqlx::Error>(read)
                },
                |balance: &i64| Some(balance + delta),
                |new: &i64, version: i64| {
                    let (db, new, update) = (&db, *new, &update);
                    async move {
                        let done = sqlx::query(update).bind(new).bind(version).execute(&mut *db.lock().await).await?;
                        Ok(done.rows_affected() == 1)
                    }
                },
            )
            .await
            .unwrap()
            .unwrap()
        })
    };
    let (a, b) = (session(100), session(-50));
    let mut attempts = vec![a.await.unwrap().attempts, b.await.unwrap().attempts];
    attempts.sort();
    let (balance, version): (i64, i64) = sqlx::query_as(&format!("SELECT balance, version FROM {table} WHERE id = 1"))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE {table}")).execute(&mut admin).await.unwrap();
    assert_eq!((balance, version), (1050, 3));
    assert_eq!(attempts, vec![1, 2], "one conflict, one retry");
}

/// An election's statements outlive the server closing an idle pooled connection (as it does
/// after `wait_timeout`, the lease): the statement runs once more on a new connection, so a
/// campaign that waited long still announces and `leader()` still answers.
#[tokio::test]
async fn an_election_outlives_a_pooled_connection_the_server_closed() {
    let client = distlock::Client::from(connect("").await);
    let election = client.election(&unique("idle-election")).unwrap();
    let leading = election.campaign("first").await.unwrap();
    let id: u64 = leading.key().strip_prefix("connection:").unwrap().parse().unwrap();
    leading.resign().await.unwrap();
    // The resigned lock connection is back in the client's pool; the server ends it.
    let mut raw = raw().await;
    sqlx::query(&format!("KILL {id}")).execute(&mut raw).await.unwrap();
    let raw = tokio::sync::Mutex::new(raw);
    common::eventually(Duration::from_secs(10), "the server to end the killed connection", || async {
        let there: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *raw.lock().await)
            .await
            .unwrap();
        there == 0
    })
    .await;
    assert_eq!(election.leader().await.unwrap(), None, "answered on a new connection");
    let again = election.campaign("second").await.unwrap();
    assert_eq!(election.leader().await.unwrap().map(|l| l.value), Some("second".into()));
    again.resign().await.unwrap();
}

/// An idle pooled connection the server closed (its `wait_timeout` is the lease) is not handed
/// out again: the next acquire takes the lock on a live connection, without an error.
#[tokio::test]
async fn a_pooled_connection_the_server_closed_is_not_handed_out() {
    let client = connect("?lease=3s").await;
    let name = unique("idle-closed");
    let mutex = client.mutex(&name).unwrap();
    let guard = mutex.try_lock().await.unwrap().expect("free");
    let id: u64 = guard.holder_id().trim_start_matches("connection:").parse().unwrap();
    guard.release().await.unwrap();
    // The server ends the idle connection after its wait_timeout: seen from a third party.
    let third = tokio::sync::Mutex::new(raw().await);
    common::eventually(Duration::from_secs(20), &format!("the server to close the idle connection {id}"), || async {
        let alive: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *third.lock().await)
            .await
            .unwrap();
        alive == 0
    })
    .await;
    // Its socket watcher saw the close when the server sent it (before the processlist row
    // went): the lock is taken again at once, on a new connection.
    let again = match mutex.try_lock().await {
        Ok(Some(g)) => g,
        Ok(None) => panic!("nobody else holds {name}"),
        Err(e) => panic!("the closed pooled connection was handed out: {e}"),
    };
    assert_ne!(again.holder_id(), format!("connection:{id}"));
    again.release().await.unwrap();
}

/// A MariaDB set up as production is (`scripts/mariadb.sh start-tls`: `require_secure_transport`,
/// a password user and a `REQUIRE X509` user): `ssl-mode=VERIFY_IDENTITY` with the CA locks,
/// elects and runs a job as either user; what falls short is refused, naming the cause, without
/// the password.
#[tokio::test]
async fn a_tls_only_server_with_password_and_x509_users() {
    let server = distlock_faults::OwnServer::start("mariadb.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let (ca, other_ca) = (server.file("certs/ca.pem"), server.file("certs/other-ca.pem"));
    let (cert, key) = (server.file("certs/client.pem"), server.file("certs/client.key"));
    let addr = server.printed.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let by_password = format!(
        "mysql://distlock:{password}@{addr}/distlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&lease=5s&connect_timeout=3s"
    );
    let by_cert =
        format!("mysql://x509user@{addr}/distlock?cacert={ca}&cert={cert}&key={key}&lease=5s&connect_timeout=3s");
    for url in [&by_password, &by_cert] {
        common::secure::locks_elects_and_runs_a_job(url).await;
    }
    let refused: Vec<(String, &str)> = vec![
        (by_password.replace(&ca, &other_ca), "not signed by a CA trusted here"),
        // Plaintext: the user REQUIRE SSL is refused as any login would be, with the hint.
        (
            by_password.replace(&format!("?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"), "?"),
            "(if the server takes TLS only, ask for TLS: ssl-mode=VERIFY_IDENTITY)",
        ),
        (by_password.replace(&password, "not-the-password"), "Access denied"),
        (by_cert.replace(&format!("&cert={cert}&key={key}"), ""), "Access denied"),
        (by_password.replace(&ca, "/no/such/ca.pem"), "/no/such/ca.pem"),
        (by_password.replace("VERIFY_IDENTITY", "SOMETIMES"), "ssl-mode=SOMETIMES"),
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
        common::secure::refused_at_once(&by_password, says, &password).await;
    }
    let pinned = by_password.replace(&ca, &server.file("certs/selfsigned.pem"));
    common::secure::refused_at_once(&pinned, "its own CA", &password).await;
}

/// Least privilege: user `team_a` (`scripts/mariadb.sh start-tls`) starts with no grants; after an
/// admin has run `Client::setup` (`distlock setup`) and given it exactly the grants of
/// docs/security.md, every recipe works for it, with no CREATE (the sequence is looked for
/// before it is made).
#[tokio::test]
async fn a_least_privilege_user_needs_only_its_grants() {
    let server = distlock_faults::OwnServer::start("mariadb.sh", "start-tls", &[]);
    let read = |f: &str| std::fs::read_to_string(server.dir().join(f)).unwrap().trim().to_string();
    let (password, team_password) = (read("password"), read("team-a.password"));
    let ca = server.file("certs/ca.pem");
    let addr = server.printed.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let tail = format!("@{addr}/distlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&lease=5s&connect_timeout=3s");
    let (admin, team) = (format!("mysql://distlock:{password}{tail}"), format!("mysql://team_a:{team_password}{tail}"));
    let Err(e) = distlock::connect(&team).await else { panic!("no grants yet: connected") };
    let e = e.to_string();
    assert!(e.contains("denied") && !e.contains(&team_password), "{e}");
    let admin = distlock::connect(&admin).await.unwrap();
    admin.setup().await.unwrap();
    let grants = "GRANT SELECT, INSERT, UPDATE, DELETE ON distlock.shedlock TO team_a; \
        GRANT SELECT, INSERT, UPDATE, DELETE ON distlock.distlock_job_runs TO team_a; \
        GRANT SELECT, INSERT, UPDATE, DELETE ON distlock.distlock_leaders TO team_a; \
        GRANT SELECT, INSERT ON distlock.distlock_fencing_seq TO team_a;";
    let data = read("data.path");
    let out = std::process::Command::new("mariadb")
        .args(["--no-defaults", "-S", &format!("{data}/sock"), "-u", "root", "-e", grants])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    common::secure::every_recipe_under(&team, "team-a/").await;
}

/// On a Galera cluster node (`wsrep_on = ON`; a one-node cluster of Debian's galera-4 is enough),
/// `GET_LOCK` is local to the node, so two clients on two nodes would both hold a lock: the
/// connect is refused, saying why.
#[tokio::test]
async fn a_galera_node_is_refused_saying_why() {
    let server = distlock_faults::OwnServer::start("mariadb.sh", "start-galera", &[]);
    let url = format!("{}?lease=5s&connect_timeout=5s", server.printed);
    let Err(e) = distlock::connect(&url).await else { panic!("locks taken on a Galera node") };
    let text = e.to_string();
    assert!(matches!(e, Error::Unsupported { .. }), "{text}");
    assert!(text.contains("Galera") && text.contains("wsrep_on = ON") && text.contains("GET_LOCK is local"), "{text}");
}

/// `setup=no` makes nothing: in a database no distlock client has used, connecting says the
/// fencing sequence (or, with `fencing=row`, table) is missing and leaves it so; once a client
/// made it, `setup=no` connects.
#[tokio::test]
async fn setup_no_makes_nothing_and_names_what_is_missing() {
    let mut raw = raw().await;
    let (db, db_url) = own_database(&mut raw, "distlock_setup").await;
    for (query, what) in [("?lease=10s", "sequence distlock_fencing_seq"), ("?lease=10s&fencing=row", "table")] {
        let url = format!("{db_url}{query}");
        let e = Client::connect(&format!("{url}&setup=no")).await.unwrap_err();
        assert!(matches!(e, Error::NotSetUp { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains(&format!("the fencing {what}")) && e.contains("is missing, and setup=no"), "{e}");
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?")
            .bind(&db)
            .fetch_one(&mut raw)
            .await
            .unwrap();
        assert_eq!(n, 0, "setup=no made something in {db}");
    }
    let url = format!("{db_url}?lease=10s");
    Client::connect(&url).await.unwrap().close(Duration::from_secs(2)).await;
    Client::connect(&format!("{url}&setup=no")).await.unwrap().close(Duration::from_secs(2)).await;
}

/// The connections holding these guards' locks (their `connection:ID` marks).
fn connections(guards: &[distlock::mysql::MutexGuard]) -> std::collections::HashSet<String> {
    guards.iter().map(|g| g.holder_id().to_string()).collect()
}

/// A client's locks use a few connections (`connections`, 4 by default): 120 held locks are on
/// at most 4 server connections (a server as shipped allows 151 in all), the server names one of
/// them as each lock's holder, another client can take none of them, and nothing is left held
/// after release.
#[tokio::test]
async fn many_held_locks_share_four_connections() {
    let db = connect("?lease=10s").await;
    let mut raw = raw().await;
    let names: Vec<String> = (0..120).map(|i| unique(&format!("shared{i}"))).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(db.mutex(name).unwrap().lock().await.unwrap());
    }
    let used = connections(&guards);
    assert!(used.len() <= 4, "{} server connections for 120 held locks", used.len());
    let other = connect("").await;
    for (name, g) in names.iter().zip(&guards) {
        let on_server = holder(&mut raw, name).await.map(|id| format!("connection:{id}"));
        assert_eq!(on_server.as_deref(), Some(g.holder_id()), "{name}: the server's holder");
        assert!(other.mutex(name).unwrap().try_lock().await.unwrap().is_none(), "{name} taken by another client");
    }
    for g in guards {
        g.release().await.unwrap();
    }
    for name in &names {
        assert_eq!(holder(&mut raw, name).await, None, "{name} left held");
    }
}

/// Waits count against the bound (`connections=2`): with six locks held by another client and
/// six local acquires waiting for them, at most one waits on the server (one connection always
/// serves the tries), the others poll; every one is granted once the holder lets go, and the
/// client never has more than two connections open.
#[tokio::test]
async fn waits_count_against_the_connection_bound() {
    let mut raw = raw().await;
    let (own_db, own_url) = own_database(&mut raw, "distlock_bound").await;
    // User locks are the server's, not a database's: the holder uses another database, so that
    // the process list's count of `own_db` is the waiting client's alone.
    let holder_client = connect("?lease=10s").await;
    let db = Client::connect(&format!("{own_url}?lease=10s&connections=2")).await.unwrap();
    let names: Vec<String> = (0..6).map(|i| unique(&format!("bound{i}"))).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(holder_client.mutex(name).unwrap().lock().await.unwrap());
    }
    let waits: Vec<_> = names
        .iter()
        .map(|name| {
            let (db, name) = (db.clone(), name.clone());
            tokio::spawn(async move { db.mutex(&name).unwrap().lock_timeout(Duration::from_secs(30)).await })
        })
        .collect();
    {
        let raw = tokio::sync::Mutex::new(&mut raw);
        common::eventually(Duration::from_secs(5), "one acquire waiting on the server", || async {
            waiting(&mut **raw.lock().await, &own_db).await == 1
        })
        .await;
    }
    let mut most = 0;
    for g in held {
        most = most.max(processes(&mut raw, &own_db, "").await);
        g.release().await.unwrap();
    }
    let mut granted = Vec::new();
    for w in waits {
        let g = tokio::time::timeout(Duration::from_secs(20), w).await.expect("granted once freed").unwrap();
        granted.push(g.unwrap().expect("granted within its wait"));
        most = most.max(processes(&mut raw, &own_db, "").await);
    }
    assert!(most <= 2, "{most} connections open with connections=2");
    assert!(connections(&granted).len() <= 2, "{:?}", connections(&granted));
    for g in granted {
        g.release().await.unwrap();
    }
    for name in &names {
        assert_eq!(holder(&mut raw, name).await, None, "{name} left held");
    }
    sqlx::query(&format!("DROP DATABASE {own_db}")).execute(&mut raw).await.unwrap();
}

/// `GET_LOCK` is reentrant within a session, so two holders of one name in one client must never
/// both be granted through one shared connection: with a single connection (`connections=1`),
/// the second is refused while the first holds, its wait polls (no connection is free to wait
/// on) and is granted after the first's release; a release frees only its own lock.
#[tokio::test]
async fn two_local_holders_of_one_name_never_share_a_grant() {
    let mut raw = raw().await;
    let db = connect("?lease=10s&connections=1").await;
    let (name, beside) = (unique("twice"), unique("beside"));
    let first = db.mutex(&name).unwrap().lock().await.unwrap();
    let other = db.mutex(&beside).unwrap().lock().await.unwrap();
    assert_eq!(first.holder_id(), other.holder_id(), "both on the one shared connection");
    assert!(db.mutex(&name).unwrap().try_lock().await.unwrap().is_none(), "granted twice in one client");
    let mut second = {
        let (db, name) = (db.clone(), name.clone());
        tokio::spawn(async move { db.mutex(&name).unwrap().lock_timeout(Duration::from_secs(20)).await })
    };
    // A bounded look: the poll must not be granted while the first holds.
    let early = tokio::time::timeout(Duration::from_millis(300), &mut second).await;
    assert!(early.is_err(), "the second holder got the lock while the first held it: {early:?}");
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("granted after the first's release")
        .unwrap()
        .unwrap()
        .expect("granted within its wait");
    let on_server = holder(&mut raw, &beside).await.map(|id| format!("connection:{id}"));
    assert_eq!(on_server.as_deref(), Some(other.holder_id()), "the first's release freed another lock");
    let on_server = holder(&mut raw, &name).await.map(|id| format!("connection:{id}"));
    assert_eq!(on_server.as_deref(), Some(second.holder_id()), "the second's lock on the server");
    second.release().await.unwrap();
    other.release().await.unwrap();
    assert_eq!((holder(&mut raw, &name).await, holder(&mut raw, &beside).await), (None, None), "left held");
}

/// Fifty locks on one shared connection cut off by a silent partition: every one is told `Lost`
/// at the connection's lease deadline, before the server frees any of them (its `wait_timeout`
/// after the last ping it received), and each next holder's token is larger.
#[tokio::test]
async fn a_partitioned_shared_connection_loses_every_lock_before_the_server_frees_one() {
    let target = my_url();
    let hostport = target.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let proxy = FaultProxy::start(hostport.parse().unwrap()).await.unwrap();
    let proxied = target.replace(&hostport, &proxy.addr().to_string());
    let a = Client::connect(&format!("{proxied}?lease=3s&connections=1")).await.unwrap();
    let names: Vec<String> = (0..50).map(|i| unique(&format!("cut{i}"))).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(a.mutex(name).unwrap().lock().await.unwrap());
    }
    assert_eq!(connections(&held).len(), 1);
    let raw = Arc::new(tokio::sync::Mutex::new(raw().await));
    proxy.set(Fault::Blackhole);
    // The server's side from now on: when any of the fifty is first seen free.
    let watch = FreeWatch::start(Duration::from_millis(5), {
        let names = names.clone();
        move || {
            let (raw, names) = (raw.clone(), names.clone());
            async move {
                let mut raw = raw.lock().await;
                for name in &names {
                    if holder(&mut raw, name).await.is_none() {
                        return false;
                    }
                }
                true
            }
        }
    });
    for g in &held {
        let reason = tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("lost within the lease");
        assert_eq!(reason, LostReason::LeaseExpired, "{}", g.name());
    }
    let latest = held.iter().map(|g| g.lease_deadline()).max().unwrap();
    let freed = watch.freed_at(Duration::from_secs(10)).await;
    assert!(latest < freed, "the server freed a lock {:?} before a holder's deadline", latest - freed);
    let b = connect("").await;
    for g in &held {
        let next = b.mutex(g.name()).unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap().expect("freed");
        assert!(next.fencing_token() > g.fencing_token());
        next.release().await.unwrap();
    }
    proxy.heal();
}

/// A shared connection killed on the server: every lock on it is `Lost` at once (its socket is
/// watched), a release says so, and the client takes them again on another connection.
#[tokio::test]
async fn a_killed_shared_connection_loses_every_lock_on_it() {
    let db = connect("?lease=10s&connections=1").await;
    let mut raw = raw().await;
    let names: Vec<String> = (0..50).map(|i| unique(&format!("kill{i}"))).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(db.mutex(name).unwrap().lock().await.unwrap());
    }
    let id = holder(&mut raw, &names[0]).await.unwrap();
    sqlx::query(&format!("KILL {id}")).execute(&mut raw).await.unwrap();
    for g in &held {
        let reason = tokio::time::timeout(Duration::from_secs(3), g.lost()).await.expect("told at once");
        assert_eq!(reason, LostReason::ConnectionClosed, "{}", g.name());
    }
    for g in held {
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    }
    for name in &names {
        let again = db.mutex(name).unwrap().try_lock().await.unwrap().expect("freed with the connection");
        assert_ne!(again.holder_id(), format!("connection:{id}"));
        again.release().await.unwrap();
    }
}

/// Acquires dropped at any point of their statement on a shared connection leave nothing held
/// (a grant no one waits for is released) and disturb no lock held on that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_on_a_shared_connection_leave_nothing_behind() {
    let db = connect("?lease=10s&connections=1").await;
    let mut raw = raw().await;
    let kept_name = unique("kept");
    let kept = db.mutex(&kept_name).unwrap().lock().await.unwrap();
    let names: Vec<String> = (0..100).map(|i| unique(&format!("drop{i}"))).collect();
    for (i, name) in names.iter().enumerate() {
        let lock = db.mutex(name).unwrap();
        // Cut off after 0–990 µs: before, during or after its statement.
        let _ = tokio::time::timeout(Duration::from_micros((i as u64 % 100) * 10), lock.try_lock()).await;
    }
    {
        let raw = tokio::sync::Mutex::new(&mut raw);
        let names = &names;
        common::eventually(Duration::from_secs(5), "every dropped acquire's lock free", || async {
            let mut raw = raw.lock().await;
            for name in names {
                if holder(&mut raw, name).await.is_some() {
                    return false;
                }
            }
            true
        })
        .await;
    }
    assert_eq!(kept.state(), LockState::Held);
    let on_server = holder(&mut raw, &kept_name).await.map(|id| format!("connection:{id}"));
    assert_eq!(on_server.as_deref(), Some(kept.holder_id()), "the held lock disturbed");
    let again = db.mutex(&names[0]).unwrap().try_lock().await.unwrap().expect("the connection still serves");
    assert_eq!(again.holder_id(), kept.holder_id());
    again.release().await.unwrap();
    kept.release().await.unwrap();
}

/// A guard dropped on a thread outside any runtime still releases its lock (through the
/// client's runtime): on a shared connection, which outlives the guard, it would otherwise stay
/// held as long as the connection lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_the_runtime_releases_its_lock() {
    let db = connect("?lease=10s&connections=1").await;
    let mut raw = raw().await;
    let (name, kept) = (unique("off-runtime"), unique("kept"));
    let other = db.mutex(&kept).unwrap().lock().await.unwrap();
    let g = db.mutex(&name).unwrap().lock().await.unwrap();
    assert_eq!(g.holder_id(), other.holder_id(), "both on one shared connection");
    std::thread::spawn(move || drop(g)).join().unwrap();
    let raw = tokio::sync::Mutex::new(&mut raw);
    common::eventually(Duration::from_secs(5), "the lock dropped off the runtime released", || async {
        holder(&mut **raw.lock().await, &name).await.is_none()
    })
    .await;
    other.release().await.unwrap();
}

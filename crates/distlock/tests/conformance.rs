//! One contract, every backend: the same scenarios through `distlock::connect(url)` against each
//! server the test run provides (`DISTLOCK_TEST_ZK` for ZooKeeper, `DISTLOCK_TEST_REDIS` for
//! Redis, `DISTLOCK_TEST_POSTGRES` for PostgreSQL, `DISTLOCK_TEST_MYSQL` for MariaDB; `scripts/test.sh` sets them all; SQLite always, on a file of its own). A backend whose variable is unset is reported and
//! skipped, so a new backend joins by adding its URL to `backends()`.

use distlock::{Error, LockState, MultiLock};
use distlock_faults::{FencedResource, Mode};
use std::time::Duration;
use tokio::time::Instant;

use crate::common::backends::on_every_backend;
use crate::common::unique;

async fn connect(url: &str) -> distlock::Client {
    distlock::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"))
}

on_every_backend!(
    #[tokio::test]
    exclusion_fencing_and_nothing_left_behind
);
async fn exclusion_fencing_and_nothing_left_behind(url: String) {
    let name = unique("mutex");
    let resource = FencedResource::new(true, 1);
    let mut tasks = Vec::new();
    for who in 0..4usize {
        let (url, name, resource) = (url.clone(), name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect(&url).await;
            let lock = client.mutex(&name).unwrap();
            for seq in 0..10u64 {
                let g = lock
                    .lock_timeout(Duration::from_secs(30))
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{url}: client {who}, cycle {seq}: not granted within 30 s"));
                let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                assert!(resource.write(who, g.fencing_token(), seq), "{url}: a fresh holder's write refused");
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
    assert!(report.is_clean(), "{url}: {report}");
    assert_eq!(report.holds, 40, "{url}");
    // Nothing is held any more: another client takes it at once.
    let client = connect(&url).await;
    let g = client.mutex(&name).unwrap().try_lock().await.unwrap().unwrap_or_else(|| panic!("{url}: left held"));
    assert!(g.fencing_token() >= report.max_token, "{url}: tokens never go back");
    g.release().await.unwrap();
}

on_every_backend!(
    #[tokio::test]
    busy_timeouts_release_on_drop_and_the_guard_contract
);
async fn busy_timeouts_release_on_drop_and_the_guard_contract(url: String) {
    let name = unique("contract");
    let (a, b) = (connect(&url).await, connect(&url).await);
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    assert_eq!(held.state(), LockState::Held, "{url}");
    assert!(held.lease_deadline() > std::time::Instant::now(), "{url}: a deadline ahead");
    assert!(!held.holder_id().is_empty(), "{url}");
    assert_eq!(held.lock_name(), a.lock_name(&name).unwrap(), "{url}");
    let other = b.mutex(&name).unwrap();
    assert!(other.try_lock().await.unwrap().is_none(), "{url}: try_lock on a held lock");
    let started = Instant::now();
    assert!(other.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none(), "{url}");
    assert!(started.elapsed() < Duration::from_secs(5), "{url}: the timeout is kept");
    // The run-or-report-busy template says busy.
    let busy = distlock::with_lock(&other, Duration::from_millis(100), |_| async {}).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{url}: {busy:?}");
    // A waiter gets it when the holder's guard is dropped (release in the background).
    let t = held.fencing_token();
    let waiter = tokio::spawn(async move { other.lock_timeout(Duration::from_secs(20)).await.unwrap() });
    drop(held);
    let g = waiter.await.unwrap().unwrap_or_else(|| panic!("{url}: released by drop"));
    assert!(g.fencing_token() > t, "{url}: tokens rise");
    // with_lock runs under the lock and passes its token.
    g.release().await.unwrap();
    let token =
        distlock::with_lock(&b.mutex(&name).unwrap(), Duration::from_secs(5), |t| async move { t }).await.unwrap();
    assert!(token > t, "{url}");
    // Bad names are clear errors, never a panic.
    let e = a.mutex("").unwrap_err();
    assert!(matches!(e, Error::InvalidLockPath { .. } | Error::InvalidArgument { .. }), "{url}: {e:?}");
    assert!(e.to_string().to_lowercase().contains("empty"), "{url}: an empty name is an error that says why: {e}");
}

on_every_backend!(
    #[tokio::test]
    readers_share_writers_exclude_and_permits_count
);
async fn readers_share_writers_exclude_and_permits_count(url: String) {
    let (a, b) = (connect(&url).await, connect(&url).await);
    let can = a.info().capabilities;
    // What the capabilities say is what the locks do: a kind a backend lacks is refused when
    // the lock is made (SQLite's lease table and MariaDB's GET_LOCK have the mutex only).
    assert_eq!(a.read_lock("x").is_ok(), can.read_write, "{url}: capabilities.read_write");
    assert_eq!(a.semaphore_permit("x", 2).is_ok(), can.semaphores, "{url}: capabilities.semaphores");
    if !can.read_write || !can.semaphores {
        assert!(matches!(a.read_lock("x"), Err(Error::Unsupported { .. })), "{url}");
        assert!(matches!(a.semaphore_permit("x", 2), Err(Error::Unsupported { .. })), "{url}");
        println!("{url}: skipped: {} has the mutex only (capabilities); checked that it refuses the rest", a.backend());
        return;
    }
    let rw = unique("rw");
    let r1 = a.read_lock(&rw).unwrap().lock().await.unwrap();
    let r2 = b.read_lock(&rw).unwrap().try_lock().await.unwrap().unwrap_or_else(|| panic!("{url}: readers share"));
    assert!(b.write_lock(&rw).unwrap().try_lock().await.unwrap().is_none(), "{url}: a writer waits for readers");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = b.write_lock(&rw).unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap().expect("free");
    assert!(a.read_lock(&rw).unwrap().try_lock().await.unwrap().is_none(), "{url}: readers wait for a writer");
    w.release().await.unwrap();

    let pool = unique("pool");
    let p1 = a.semaphore_permit(&pool, 2).unwrap().lock().await.unwrap();
    let p2 = b.semaphore_permit(&pool, 2).unwrap().lock().await.unwrap();
    assert!(a.semaphore_permit(&pool, 2).unwrap().try_lock().await.unwrap().is_none(), "{url}: two of two");
    p1.release().await.unwrap();
    let p3 = a.semaphore_permit(&pool, 2).unwrap().try_lock().await.unwrap();
    assert!(p3.is_some(), "{url}: a released permit is free again");
    p2.release().await.unwrap();
    p3.unwrap().release().await.unwrap();
}

on_every_backend!(
    #[tokio::test]
    a_multilock_takes_all_or_nothing
);
async fn a_multilock_takes_all_or_nothing(url: String) {
    let (a, b) = (connect(&url).await, connect(&url).await);
    let (x, y) = (unique("x"), unique("y"));
    let only_y = b.mutex(&y).unwrap().lock().await.unwrap();
    let both = MultiLock::new(vec![a.mutex(&x).unwrap(), a.mutex(&y).unwrap()]).unwrap();
    assert!(both.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none(), "{url}");
    // Nothing of the set is kept: x is free for someone else (the rollback may finish in the
    // background just after the timeout returns, so a short wait, far below any lease).
    let gx = b
        .mutex(&x)
        .unwrap()
        .lock_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{url}: x kept"));
    gx.release().await.unwrap();
    only_y.release().await.unwrap();
    let g = both.lock_timeout(Duration::from_secs(10)).await.unwrap().expect("both free");
    g.release().await.unwrap();
    assert!(MultiLock::new(vec![a.mutex(&x).unwrap(), a.mutex(&x).unwrap()]).is_err(), "{url}: a name twice");
}

on_every_backend!(
    #[tokio::test]
    cancelled_acquires_leave_nothing
);
async fn cancelled_acquires_leave_nothing(url: String) {
    let name = unique("cancel");
    let client = connect(&url).await;
    let lock = client.mutex(&name).unwrap();
    // Acquires cut off at every stage of their request: whatever they were granted is released.
    for i in 0..30u64 {
        let _ = tokio::time::timeout(Duration::from_micros(20 * i), lock.lock()).await;
    }
    let other = connect(&url).await;
    let g = other
        .mutex(&name)
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{url}: a cancelled acquire kept the lock"));
    g.release().await.unwrap();
}

on_every_backend!(
    #[tokio::test]
    locks_lists_the_holder_and_the_waiter_in_order
);
/// `Client::locks`: a holder and a waiter as the server records them, tokens that match the
/// guard's, and nothing listed once both are gone. MariaDB refuses, naming why.
async fn locks_lists_the_holder_and_the_waiter_in_order(url: String) {
    let name = unique("list");
    let (a, b) = (connect(&url).await, connect(&url).await);
    let backend = a.backend();
    let can = a.info().capabilities;
    if !can.lists_locks {
        println!("{url}: skipped: {backend} cannot list its locks (capabilities.lists_locks); checked that it says so");
        let e = a.locks("").await.expect_err("a backend that cannot list its locks refuses");
        assert!(matches!(e, Error::Unsupported { .. }) && e.to_string().contains("inspect one lock"), "{e}");
        return;
    }
    // PostgreSQL lists by advisory key, so only the whole database.
    let (prefix, listed) = match b.postgres() {
        Some(pg) => (String::new(), format!("advisory key {}", pg.key(&name).unwrap())),
        None => (name.clone(), a.lock_name(&name).unwrap()),
    };
    assert_eq!(can.lists_by_name, b.postgres().is_none(), "{url}: capabilities.lists_by_name");
    let find = |l: distlock::listing::Listing| l.locks.into_iter().find(|l| l.name == listed);
    let g = a.mutex(&name).unwrap().lock().await.unwrap();
    let waiter = {
        let lock = b.mutex(&name).unwrap();
        tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(30)).await })
    };
    // Backends whose server records a waiter show it (Redis waiters wait on a channel, SQLite's
    // poll the row): the count below checks the capability.
    let waiters = usize::from(can.records_waiters);
    let lock = crate::common::eventually_some(
        Duration::from_secs(10),
        &format!("{url}: {listed} listed with {waiters} waiters"),
        || async {
            let lock = find(a.locks(&prefix).await.unwrap()).unwrap_or_else(|| panic!("{url}: {listed} not listed"));
            (lock.waiters().count() == waiters).then_some(lock)
        },
    )
    .await;
    assert_eq!(lock.holders().count(), 1, "{url}: {lock:?}");
    assert_eq!(lock.waiters().count(), waiters, "{url}: {lock:?}");
    assert!(lock.entries[0].holds, "{url}: holders first: {lock:?}");
    let holder = &lock.entries[0];
    // Every backend but PostgreSQL (one sequence for every lock) tells a holder's token.
    assert_eq!(holder.token.is_some(), can.tokens_per_lock, "{url}: {lock:?}");
    if let Some(token) = holder.token {
        assert_eq!(token, g.fencing_token(), "{url}: {lock:?}");
    }
    if matches!(backend, "zookeeper" | "sqlite") {
        let me = format!("pid {}", std::process::id());
        assert!(lock.entries.iter().all(|e| e.owner.ends_with(&me)), "{url}: owners: {lock:?}");
    }
    g.release().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap().expect("the waiter gets the lock");
    g2.release().await.unwrap();
    crate::common::eventually(
        Duration::from_secs(10),
        &format!("{url}: {listed} unlisted after both released"),
        || async { find(a.locks(&prefix).await.unwrap()).is_none() },
    )
    .await;
}

/// An `openssl s_server` on a free loopback port with one of `scripts/lib/certs.sh`'s server
/// certificates, killed when dropped.
struct TlsEnd(std::process::Child, u16);

impl TlsEnd {
    fn start(certs: &std::path::Path, name: &str) -> TlsEnd {
        use std::io::BufRead;
        let (cert, key) = (certs.join(format!("{name}.pem")), certs.join(format!("{name}.key")));
        let mut child = std::process::Command::new("openssl")
            .args(["s_server", "-accept", "127.0.0.1:0", "-cert"])
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            // Its stdin stays open (and silent): at end of input it would stop serving.
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("openssl s_server");
        // It prints "ACCEPT 127.0.0.1:PORT" once listening (EOF if it failed to start).
        let accept = std::io::BufReader::new(child.stdout.take().unwrap())
            .lines()
            .map_while(|l| l.ok())
            .find(|l| l.starts_with("ACCEPT"))
            .expect("openssl s_server listening");
        let port = accept.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{accept:?}"));
        TlsEnd(child, port)
    }
}

impl Drop for TlsEnd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Hostile ends, the same on every network backend whose connection starts with TLS: a server
/// whose certificate names another host, one whose certificate has expired (both signed by the
/// CA the client trusts), one whose certificate another CA signed, one whose certificate is its
/// own CA (self-signed, CA:TRUE: refused even when given as cacert, since distlock does not pin),
/// a plaintext server asked for TLS and a TLS server asked in plaintext. Each is refused at
/// once (well inside a 5 s connect timeout), with an error that names the cause; and one that
/// accepts the connection and never says a word, at the connect timeout.
#[tokio::test]
async fn hostile_tls_ends_are_refused_naming_the_cause() {
    let dir = std::env::temp_dir().join(format!("distlock-hostile-{}", uuid::Uuid::new_v4().simple()));
    let certs = dir.join("certs");
    let made = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}/../../scripts/lib/certs.sh && make_certs {}",
            env!("CARGO_MANIFEST_DIR"),
            certs.display()
        ))
        .status()
        .unwrap();
    assert!(made.success());
    let file = |name: &str| certs.join(format!("{name}.pem")).display().to_string();
    // The backends whose connection starts with the TLS handshake (PostgreSQL and MySQL first
    // speak their own protocol; their servers' tests check the certificate).
    let tls_first = |port: u16, ca: &str| {
        [
            format!("rediss://127.0.0.1:{port}?cacert={ca}&connect_timeout=5s"),
            format!("etcds://127.0.0.1:{port}?cacert={ca}&connect_timeout=5s"),
            format!("zks://127.0.0.1:{port}?cacert={ca}&connect_timeout=5s"),
        ]
    };
    // Every case runs; the failures are listed together at the end.
    let mut failed = Vec::new();
    let mut at_once = |url: &str, e: &Error, took: Duration, says: &str| {
        println!("{url}: {e} ({took:?})");
        if !e.to_string().contains(says) || took >= Duration::from_millis(1500) {
            failed.push(format!("{url}: after {took:?}, wanted {says:?}: {e}"));
        }
    };
    let cases = [
        ("misnamed", "ca", "does not name the host"),
        ("expired", "ca", "has expired"),
        ("server", "other-ca", "not signed by a CA trusted here"),
        ("selfsigned", "ca", "its own CA"),
        ("selfsigned", "selfsigned", "its own CA"),
    ];
    for (cert, ca, says) in cases {
        let end = TlsEnd::start(&certs, cert);
        for url in tls_first(end.1, &file(ca)) {
            let started = Instant::now();
            let e = distlock::connect(&url).await.map(|_| ()).expect_err(&url);
            at_once(&url, &e, started.elapsed(), says);
        }
    }
    // A TLS port asked in plaintext.
    let end = TlsEnd::start(&certs, "server");
    for (url, says) in [
        (format!("redis://127.0.0.1:{}?connect_timeout=5s", end.1), "rediss://"),
        (format!("etcd://127.0.0.1:{}?connect_timeout=5s", end.1), "etcds://"),
        (format!("zk://127.0.0.1:{}?connect_timeout=5s", end.1), "zks://"),
    ] {
        let started = Instant::now();
        let e = distlock::connect(&url).await.map(|_| ()).expect_err(&url);
        at_once(&url, &e, started.elapsed(), says);
    }
    drop(end);
    // A plaintext port asked for TLS: it reads the handshake as a request, answers in its own
    // words and closes (as a plaintext Redis or ZooKeeper port does).
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = plain.local_addr().unwrap().port();
    let answering = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = plain.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(b"-ERR unknown command\r\n").await;
            });
        }
    });
    for url in tls_first(port, &file("ca")) {
        let started = Instant::now();
        let e = distlock::connect(&url).await.map(|_| ()).expect_err(&url);
        // "did not answer in TLS: is this its TLS port?", or Redis's probe: "not a TLS port".
        at_once(&url, &e, started.elapsed(), "TLS port");
    }
    answering.abort();
    assert!(failed.is_empty(), "not named at once:\n{}", failed.join("\n"));
    // Accepts, and never answers (not even the TLS handshake).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let ca = file("ca");
    let urls = [
        format!("rediss://127.0.0.1:{port}?cacert={ca}&connect_timeout=2s"),
        format!("postgres://u@127.0.0.1:{port}/db?sslmode=verify-full&sslrootcert={ca}&connect_timeout=2s"),
        format!("mysql://u@127.0.0.1:{port}/db?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&connect_timeout=2s"),
        format!("etcds://127.0.0.1:{port}?cacert={ca}&connect_timeout=2s"),
        format!("zks://127.0.0.1:{port}?cacert={ca}&connect_timeout=2s"),
    ];
    for url in urls {
        let started = Instant::now();
        let e = distlock::connect(&url).await.map(|_| ()).expect_err(&url);
        let took = started.elapsed();
        println!("{url}: {e} ({took:?})");
        assert!(took < Duration::from_millis(3500), "{url}: took {took:?}: {e}");
        assert!(took >= Duration::from_millis(1900), "{url}: gave up early, {took:?}: {e}");
        let text = e.to_string().to_lowercase();
        assert!(["timed out", "timeout", "within", "no answer"].iter().any(|w| text.contains(w)), "{url}: {e}");
    }
    keep.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

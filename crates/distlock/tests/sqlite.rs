//! The SQLite lease table on real database files (one per test, in a temporary directory).
#![cfg(feature = "sqlite")]

use distlock::optimistic::optimistic_update;
use distlock::sqlite::Client;
use distlock::{Error, LockState, LostReason};
use distlock_faults::{FencedResource, Mode};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A fresh database file's URL (the directory is removed with the returned guard).
fn db(query: &str) -> (String, TempDir) {
    let dir = std::env::temp_dir().join(format!("distlock-sqlite-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    (format!("sqlite://{}/locks.db{query}", dir.display()), TempDir(dir))
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A plain connection for looking at the file as a third party.
async fn raw(url: &str) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    sqlx::SqliteConnection::connect(url.split('?').next().unwrap()).await.unwrap()
}

#[tokio::test]
async fn the_row_has_shedlocks_columns_a_rising_token_and_ends_at_release() {
    let (url, _dir) = db("?lease=10s");
    let a = Client::connect(&url).await.unwrap();
    let lock = a.mutex("report").unwrap();
    let g = lock.lock().await.unwrap();
    assert_eq!(g.state(), LockState::Held);
    assert!(g.lease_deadline() > std::time::Instant::now() + Duration::from_secs(9));
    let mut raw = raw(&url).await;
    let (locked_by, held, token): (String, bool, i64) = sqlx::query_as(
        "SELECT locked_by, lock_until > strftime('%Y-%m-%d %H:%M:%f','now') AND locked_at <= lock_until, \
         fencing_token FROM distlock_leases WHERE name = 'report'",
    )
    .fetch_one(&mut raw)
    .await
    .unwrap();
    assert_eq!(locked_by, g.holder_id());
    assert!(held, "lock_until is ahead");
    assert_eq!(token as u64, g.fencing_token());
    // Held: another client cannot have it, now or within a bounded wait.
    let b = Client::connect(&url).await.unwrap();
    assert!(b.mutex("report").unwrap().try_lock().await.unwrap().is_none());
    assert!(b.mutex("report").unwrap().lock_timeout(Duration::from_millis(100)).await.unwrap().is_none());
    let view = lock.inspect().await.unwrap().unwrap();
    assert!(view.held && view.locked_by == g.holder_id(), "{view:?}");
    g.release().await.unwrap();
    assert!(!lock.inspect().await.unwrap().unwrap().held, "released: lock_until is now");
    let again = b.mutex("report").unwrap().try_lock().await.unwrap().expect("free after the release");
    assert!(again.fencing_token() > token as u64, "{} after {token}", again.fencing_token());
    again.release().await.unwrap();
    // Bad names and URLs are named, not panics.
    assert!(matches!(a.mutex(""), Err(Error::InvalidLockPath { .. })));
    assert!(matches!(a.mutex(&"x".repeat(65)), Err(Error::InvalidLockPath { .. })));
    let e = Client::connect("sqlite:///nonexistent-dir-distlock/x.db").await.unwrap_err().to_string();
    assert!(e.contains("nonexistent-dir-distlock"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_with_the_fenced_checker_and_rising_tokens() {
    const CLIENTS: usize = 4;
    const CYCLES: u64 = 15;
    let (url, _dir) = db("?lease=5s");
    let resource = FencedResource::new(true, 1);
    let highest = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for who in 0..CLIENTS {
        let (url, resource, highest) = (url.clone(), resource.clone(), highest.clone());
        tasks.push(tokio::spawn(async move {
            let db = Client::connect(&url).await.unwrap();
            let lock = db.mutex("counter").unwrap();
            for seq in 0..CYCLES {
                let g = tokio::time::timeout(Duration::from_secs(30), lock.lock()).await.unwrap().unwrap();
                highest.fetch_max(g.fencing_token(), std::sync::atomic::Ordering::SeqCst);
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
    let view = Client::connect(&url).await.unwrap().mutex("counter").unwrap().inspect().await.unwrap().unwrap();
    assert!(!view.held, "nothing left held: {view:?}");
    // The fenced resource accepted every hold's write, so tokens rose hold after hold; the row
    // keeps the last one.
    assert_eq!(
        view.fencing_token,
        highest.load(std::sync::atomic::Ordering::SeqCst),
        "the row's token is the last hold's"
    );
}

/// A holder whose extensions stall (the file's write lock held from outside past its lease, as a
/// stalled disk would) reports `Lost` at its lease deadline, not before; the row is then taken
/// over at once, with a higher token, and the old guard's release reports the loss.
#[tokio::test]
async fn a_silent_holder_is_taken_over_after_its_lease_and_learns_it() {
    let (url, _dir) = db("?lease=1s");
    let a = Client::connect(&url).await.unwrap();
    let old = a.mutex("job").unwrap().lock().await.unwrap();
    let deadline = old.lease_deadline();
    // Freeze the holder's extensions: take SQLite's write lock on the file from outside for
    // longer than the lease (the holder's watchdog fails with "database is locked").
    let mut blocker = raw(&url).await;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut blocker).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), old.lost()).await.expect("lost within the lease");
    assert_eq!(lost, LostReason::LeaseExpired);
    assert!(std::time::Instant::now() >= deadline, "not before its deadline");
    // Let go: the row is expired on the database's clock, so another client takes it over.
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let b = Client::connect(&url).await.unwrap();
    let started = Instant::now();
    let new = tokio::time::timeout(Duration::from_secs(5), b.mutex("job").unwrap().lock()).await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "no wait beyond the lease");
    assert!(new.fencing_token() > old.fencing_token());
    assert!(matches!(old.release().await, Err(Error::LockLost { .. })), "the old guard's release reports the loss");
    assert_eq!(new.name(), "job");
    new.release().await.unwrap();
}

/// The seed's account (balance 1000, version 1; +100 and −50 read at once): one write wins, the
/// other finds the version moved, reads again and writes; the balance is 1050.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_optimistic_account_on_sqlite() {
    let (url, _dir) = db("");
    let _ = Client::connect(&url).await.unwrap(); // creates the file
    let mut admin = raw(&url).await;
    sqlx::query("CREATE TABLE account (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL, version BIGINT NOT NULL)")
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query("INSERT INTO account VALUES (1, 1000, 1)").execute(&mut admin).await.unwrap();
    let both_read = Arc::new(tokio::sync::Barrier::new(2));
    let session = |delta: i64| {
        let (url, both_read) = (url.clone(), both_read.clone());
        tokio::spawn(async move {
            let db = tokio::sync::Mutex::new(raw(&url).await);
            let first = std::sync::atomic::AtomicBool::new(true);
            optimistic_update(
                5,
                || async {
                    let read: (i64, i64) = sqlx::query_as("SELECT balance, version FROM account WHERE id = 1")
                        .fetch_one(&mut *db.lock().await)
                        .await?;
                    if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        both_read.wait().await;
                    }
                    Ok::<_, sqlx::Error>(read)
                },
                |balance: &i64| Some(balance + delta),
                |new: &i64, version: i64| {
                    let (db, new) = (&db, *new);
                    async move {
                        let done = sqlx::query(
                            "UPDATE account SET balance = ?1, version = version + 1 WHERE id = 1 AND version = ?2",
                        )
                        .bind(new)
                        .bind(version)
                        .execute(&mut *db.lock().await)
                        .await?;
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
    let (balance, version): (i64, i64) =
        sqlx::query_as("SELECT balance, version FROM account WHERE id = 1").fetch_one(&mut admin).await.unwrap();
    assert_eq!((balance, version), (1050, 3));
    assert_eq!(attempts, vec![1, 2], "one conflict, one retry");
}

/// Deleting a lock's row by hand (or a whole cleanup of the table) does not bring old fencing
/// tokens back: the counter is kept apart from the lock rows. (Before, the next holder got
/// token 1 again.)
#[tokio::test]
async fn a_deleted_row_does_not_bring_an_old_token_back() {
    let (url, _dir) = db("?lease=10s");
    let a = Client::connect(&url).await.unwrap();
    let lock = a.mutex("deleted").unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let g = lock.lock().await.unwrap();
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.release().await.unwrap();
    }
    let mut raw = raw(&url).await;
    sqlx::query("DELETE FROM distlock_leases WHERE name = 'deleted'").execute(&mut raw).await.unwrap();
    let g = lock.lock().await.unwrap();
    assert!(g.fencing_token() > last, "token {} after the row was deleted, {last} before", g.fencing_token());
    last = g.fencing_token();
    g.release().await.unwrap();
    // The counter deleted too: the row's own last token still bounds the next one from below.
    sqlx::query("DELETE FROM distlock_leases_fencing").execute(&mut raw).await.unwrap();
    let g = lock.lock().await.unwrap();
    assert!(g.fencing_token() > last, "token {} after the counter was deleted, {last} before", g.fencing_token());
    // Held, its row deleted: the holder learns at its next extension that the row is gone.
    sqlx::query("DELETE FROM distlock_leases WHERE name = 'deleted'").execute(&mut raw).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("loss reported");
    assert_eq!(reason, LostReason::KeyDeleted);
}

/// A database file restored from a copy taken earlier (a backup restore) has forgotten the tokens
/// handed out since the copy; the next holder's token is still above every one of them (the
/// clock floor). Before the floor the tokens ran 1, 2, 3, 4, then 3 again.
#[tokio::test]
async fn a_restored_file_does_not_bring_an_old_token_back() {
    let (url, dir) = db("?lease=10s");
    let file = dir.0.join("locks.db");
    let backup = dir.0.join("backup.db");
    let mut tokens = Vec::new();
    {
        let a = Client::connect(&url).await.unwrap();
        let lock = a.mutex("restored").unwrap();
        for i in 0..4 {
            if i == 2 {
                // The backup, taken as SQLite takes one: a consistent copy of the whole database.
                let mut raw = raw(&url).await;
                sqlx::query(&format!("VACUUM INTO '{}'", backup.display())).execute(&mut raw).await.unwrap();
            }
            let g = lock.lock().await.unwrap();
            tokens.push(g.fencing_token());
            g.release().await.unwrap();
        }
        a.close(Duration::from_secs(5)).await;
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // The restore: the copy replaces the file (its write-ahead log and index go with it).
    for ext in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{ext}", file.display()));
    }
    std::fs::copy(&backup, &file).unwrap();
    let b = Client::connect(&url).await.unwrap();
    let g = b.mutex("restored").unwrap().lock().await.unwrap();
    let last = *tokens.last().unwrap();
    assert!(g.fencing_token() > last, "token {} after the restore; {tokens:?} before", g.fencing_token());
    g.release().await.unwrap();
}

/// Another process keeps SQLite's write lock longer than the lease while we wait: the acquire is
/// granted once the file is free, with a full lease from then (before, the lease was counted from
/// the request's send and the new holder was reported lost at once while its row stayed taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_a_long_wait_for_the_file_has_its_whole_lease() {
    let (url, _dir) = db("?lease=1s&busy_timeout=20s");
    let a = Client::connect(&url).await.unwrap();
    let lock = a.mutex("busy").unwrap();
    lock.lock().await.unwrap().release().await.unwrap();
    let mut raw = raw(&url).await;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut raw).await.unwrap();
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    // Past the lease, the file still write-locked: the acquire cannot have run yet.
    tokio::time::sleep(Duration::from_millis(1500)).await; // the fault's duration, not a condition
    assert!(!waiting.is_finished(), "the acquire could not write while the file was locked");
    // The grant can only come after this commit: its lease (1 s, less the margin) runs from then.
    let committed = std::time::Instant::now();
    sqlx::query("COMMIT").execute(&mut raw).await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("granted").unwrap().unwrap();
    let from_commit = g.lease_deadline().saturating_duration_since(committed);
    assert!(
        from_commit > Duration::from_millis(900),
        "the lease runs from the grant: it ends {from_commit:?} after the commit"
    );
    assert_eq!(g.state(), LockState::Held);
    // And it is kept: held through two more leases.
    let held = tokio::time::timeout(Duration::from_millis(2500), g.lost()).await;
    assert!(held.is_err(), "lost after a grant that waited for the file: {held:?}");
    g.release().await.unwrap();
}

/// An acquire dropped while its upsert waits for SQLite's file lock: the upsert still commits
/// once the file is free (SQLite's worker thread runs it to its end), and the lock must then come
/// free at once, not stay taken for the whole 30 s lease by a holder nobody has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_while_its_upsert_waits_leaves_the_lock_free() {
    let (url, _dir) = db("?lease=30s&busy_timeout=20s");
    let a = Client::connect(&url).await.unwrap();
    let lock = a.mutex("dropped").unwrap();
    let first = lock.lock().await.unwrap();
    let first_token = first.fencing_token();
    first.release().await.unwrap(); // the table and the row exist
    let mut raw = raw(&url).await;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut raw).await.unwrap();
    // The caller gives up while the upsert waits for the file.
    assert!(tokio::time::timeout(Duration::from_millis(300), lock.lock()).await.is_err());
    sqlx::query("COMMIT").execute(&mut raw).await.unwrap();
    // The late upsert runs: the row's token rises.
    crate::common::eventually(Duration::from_secs(10), "the dropped acquire's upsert to run", || async {
        lock.inspect().await.unwrap().unwrap().fencing_token != first_token
    })
    .await;
    let b = Client::connect(&url).await.unwrap();
    let g = b.mutex("dropped").unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap();
    let g = g.expect("the lock came free after the dropped acquire's late grant");
    let view = b.mutex("dropped").unwrap().inspect().await.unwrap().unwrap();
    assert_eq!(view.locked_by, g.holder_id());
    g.release().await.unwrap();
}

/// `lock_timeout` keeps its deadline while its upsert waits for another connection's file lock
/// (SQLite's busy timeout here is 20 s), and the grant that comes after the deadline is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_keeps_its_deadline_while_the_file_is_locked() {
    let (url, _dir) = db("?lease=30s&busy_timeout=20s");
    let a = Client::connect(&url).await.unwrap();
    let lock = a.mutex("deadline").unwrap();
    lock.lock().await.unwrap().release().await.unwrap(); // the table and the row exist
    let mut raw = raw(&url).await;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut raw).await.unwrap();
    let asked = Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(15), lock.lock_timeout(Duration::from_millis(500)))
        .await
        .expect("lock_timeout(500 ms) did not return within 15 s while the file stayed locked")
        .unwrap();
    assert!(got.is_none(), "not had in time");
    assert!(asked.elapsed() < Duration::from_secs(5), "returned after {:?}, not near its deadline", asked.elapsed());
    sqlx::query("COMMIT").execute(&mut raw).await.unwrap();
    let g = lock.lock_timeout(Duration::from_secs(10)).await.unwrap().expect("free once the late grant is released");
    g.release().await.unwrap();
}

/// Clients of one process take the lock in turn: a holder that releases and asks again queues
/// behind the others (this process's FIFO queue), instead of winning the row back at once while
/// they wait for their next poll. Counted over 200 grants among 4 clients on separate pools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_one_process_take_turns() {
    const CLIENTS: usize = 4;
    const GRANTS: usize = 200;
    let (url, _dir) = db("");
    let granted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Every client connected before anyone starts.
    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (url, granted, start) = (url.clone(), granted.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            let lock = Client::connect(&url).await.unwrap().mutex("turns").unwrap();
            start.wait().await;
            let mut mine = 0usize;
            loop {
                let g = tokio::time::timeout(Duration::from_secs(10), lock.lock()).await.expect("a turn").unwrap();
                let n = granted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                g.release().await.unwrap();
                if n >= GRANTS {
                    return mine;
                }
                mine += 1;
            }
        }));
    }
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(tokio::time::timeout(Duration::from_secs(60), t).await.expect("finished").unwrap());
    }
    let (min, max) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
    assert!(min as f64 >= 0.8 * max as f64, "grants per client {counts:?}: a client got fewer than 0.8 of another's");
}

/// The "run under the lock or report busy" template on a typed lock, converted into the one
/// `Lock`: the work runs with the lock's token while it is held; a second caller is told busy
/// after its timeout; the lock is free afterwards.
#[tokio::test]
async fn with_lock_runs_on_the_typed_mutex_or_reports_busy() {
    let (url, _dir) = db("?lease=5s");
    let client = Client::connect(&url).await.unwrap();
    let lock: distlock::Lock = client.mutex("template").unwrap().into();
    let held = client.mutex("template").unwrap();
    let token = distlock::with_lock(&lock, Duration::from_secs(2), |token| async move { token }).await.unwrap();
    assert!(token > 0);
    let guard = held.lock().await.unwrap();
    let busy = distlock::with_lock(&lock, Duration::from_millis(100), |_| async { panic!("ran while held") }).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    guard.release().await.unwrap();
    let next = distlock::with_lock(&lock, Duration::from_secs(2), |token| async move { token }).await.unwrap();
    assert!(next > token, "tokens rise: {token} then {next}");
}

/// `setup=no` makes nothing: a missing file is an error naming it (and stays missing), so is a
/// file without the lease table; once a client made them, `setup=no` opens them as usual.
#[tokio::test]
async fn setup_no_makes_nothing_and_names_what_is_missing() {
    let (url, dir) = db("?lease=5s");
    let file = dir.0.join("locks.db");
    let look = format!("{url}&setup=no");
    let e = Client::connect(&look).await.unwrap_err().to_string();
    assert!(e.contains(&format!("no database file {} (setup=no makes nothing", file.display())), "{e}");
    assert!(!file.exists(), "setup=no made the file");
    std::fs::write(&file, b"").unwrap();
    let e = Client::connect(&look).await.unwrap_err();
    assert!(matches!(e, Error::NotSetUp { .. }), "{e:?}");
    assert!(e.to_string().contains("the lease table distlock_leases is missing, and setup=no makes nothing"), "{e}");
    let made = Client::connect(&url).await.unwrap();
    made.mutex("setup").unwrap().lock().await.unwrap().release().await.unwrap();
    let looking = Client::connect(&look).await.unwrap();
    assert!(looking.mutex("setup").unwrap().try_lock().await.unwrap().is_some());
    assert!(Client::connect(&format!("{url}&setup=maybe")).await.unwrap_err().to_string().contains("setup=maybe"));
}

/// A client's holds are extended together: 300 locks taken at their own times are extended by a
/// bounded number of statements per period, not one per hold. Counted in the file: a trigger logs
/// every extended row's new `lock_until`, and SQLite's clock is one instant per statement, so the
/// rows of one statement share one value (a statement per hold would give each its own). A row
/// deleted from outside among them, and another taken over, lose those two holds alone, at their
/// next extension, and this process's next acquire of a lost lock does not wait for a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_holds_are_extended_by_one_statement_and_a_deleted_row_loses_only_its_own() {
    const HELD: usize = 300;
    let (url, _dir) = db("?lease=3s");
    let period = Duration::from_secs(1);
    let a = Client::connect(&url).await.unwrap();
    let mut raw = raw(&url).await;
    for statement in [
        "CREATE TABLE extensions (lock_until TEXT NOT NULL)",
        "CREATE TRIGGER log_extensions AFTER UPDATE OF lock_until ON distlock_leases \
         BEGIN INSERT INTO extensions VALUES (NEW.lock_until); END",
    ] {
        sqlx::query(statement).execute(&mut raw).await.unwrap();
    }
    let mut guards = Vec::new();
    // Taken over more than a period, each at its own time.
    let started = Instant::now();
    for i in 0..HELD {
        guards.push(a.mutex(&format!("h{i:03}")).unwrap().lock().await.unwrap());
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    assert!(started.elapsed() > period, "the holds were taken over more than a period");
    // From a period after the last grant on, each round of extensions is one statement.
    tokio::time::sleep(period * 2).await;
    sqlx::query("DELETE FROM extensions").execute(&mut raw).await.unwrap();
    tokio::time::sleep(period * 4).await;
    let (rows, statements): (i64, i64) = sqlx::query_as("SELECT count(*), count(DISTINCT lock_until) FROM extensions")
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert!(rows >= 3 * HELD as i64, "{rows} extensions of {HELD} holds in four periods");
    assert!((3..=6).contains(&statements), "{statements} statements extended {rows} rows in four periods");
    assert!(guards.iter().all(|g| g.state() == LockState::Held));

    // One row deleted from outside, another taken over: those two holds are lost, no other.
    let (deleted, taken) = (guards[150].name().to_string(), guards[7].name().to_string());
    sqlx::query("DELETE FROM distlock_leases WHERE name = ?1").bind(&deleted).execute(&mut raw).await.unwrap();
    sqlx::query("UPDATE distlock_leases SET locked_by = 'someone:1:else' WHERE name = ?1")
        .bind(&taken)
        .execute(&mut raw)
        .await
        .unwrap();
    for i in [150, 7] {
        let reason = tokio::time::timeout(period * 2, guards[i].lost()).await.expect("lost at its next extension");
        assert_eq!(reason, LostReason::KeyDeleted);
    }
    // The deleted lock is free, and this process's queue for it opens at the loss (just after the
    // guard is told; without that, not before the old guard is dropped).
    let again = a.mutex(&deleted).unwrap().lock_timeout(period).await.unwrap().expect("the queue opened at the loss");
    tokio::time::sleep(period * 2).await;
    let held = guards.iter().filter(|g| g.state() == LockState::Held).count();
    assert_eq!(held, HELD - 2, "only the two holds whose rows went are lost");
    assert_eq!(again.state(), LockState::Held);
    again.release().await.unwrap();
}

//! Scheduled jobs on every backend the run has a server for: once per slot by the server's
//! clock, ShedLock's two bounds, the record of the last run, rising tokens, bad input refused.
//! One test per backend (`cargo test -p distlock --test main -- schedule::once_per_slot::redis` runs Redis's).

use distlock::schedule::{SkipReason, Started};
use distlock::Error;
use std::time::{Duration, Instant};

use crate::common::backends::on_every_backend;
use crate::common::unique;

async fn connect(url: &str) -> distlock::Client {
    distlock::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn running(url: &str, s: Started) -> distlock::schedule::JobGuard {
    match s {
        Started::Running(job) => job,
        Started::Skipped(s) => panic!("{url}: expected to run, skipped: {s}"),
    }
}

fn skipped(url: &str, s: Started) -> distlock::schedule::Skipped {
    match s {
        Started::Running(job) => panic!("{url}: expected a skip, ran: {:?}", job.run()),
        Started::Skipped(s) => s,
    }
}

/// Starts `job` until it runs, within `bound`.
async fn start_within(url: &str, job: &distlock::schedule::Schedule, bound: Duration) -> distlock::schedule::JobGuard {
    crate::common::eventually_some(bound, &format!("{url}: the job to run, not be skipped"), || async {
        match job.try_start().await.unwrap() {
            Started::Running(j) => Some(j),
            Started::Skipped(_) => None,
        }
    })
    .await
}

on_every_backend!(
    #[tokio::test]
    once_per_slot
);
async fn once_per_slot(url: String) {
    let url = url.as_str();
    let (a, b) = (connect(url).await, connect(url).await);
    let name = unique("slot");
    let period = Duration::from_secs(2);
    let ja = a.schedule(&name).unwrap().once_per(period);
    let jb = b.schedule(&name).unwrap().once_per(period);
    assert_eq!(ja.last_run().await.unwrap(), None, "{url}: a new job has no record");

    // One run per slot: the other sees it running, then run in this slot.
    let first = running(url, ja.try_start().await.unwrap());
    let started = first.run().clone();
    assert!(first.stop_by() <= Instant::now() + period, "{url}: the hold is at most the period");
    let s = skipped(url, jb.try_start().await.unwrap());
    assert_eq!(s.reason, SkipReason::Running, "{url}: {s}");
    assert!(s.to_string().contains(&started.host), "{url}: the message names the holder: {s}");
    let done = first.finish(Some(7)).await.unwrap();
    assert_eq!((done.token, done.exit), (started.token, Some(7)), "{url}");
    assert!(done.ended_ms.is_some_and(|e| e >= started.started_ms), "{url}: {done:?}");
    let last = jb.last_run().await.unwrap().expect("a record");
    assert_eq!(last, done, "{url}: every client reads the same record");
    assert_eq!(last.pid, std::process::id(), "{url}");
    assert!(last.pid_start.is_some(), "{url}");
    // Still in the first run's slot (the usual case), the slot had its run; past its end, the
    // next slot's run starts (checked below either way).
    match jb.try_start().await.unwrap() {
        Started::Skipped(s) => assert!(matches!(s.reason, SkipReason::RanInSlot), "{url}: {s}"),
        Started::Running(j) => {
            assert!(j.run().slot > started.slot, "{url}: a second run in slot {:?}", started.slot);
            j.finish(None).await.unwrap();
        }
    }

    // The next slot runs once, with a higher token and slot.
    let second = start_within(url, &jb, period * 3).await;
    assert!(second.fencing_token() > started.token, "{url}: tokens rise");
    assert!(second.run().slot > started.slot, "{url}: a later slot");
    assert!(matches!(ja.try_start().await.unwrap(), Started::Skipped(_)), "{url}: twice in a slot");
    second.finish(None).await.unwrap();

    // ShedLock's bounds, without a period: at least 1 s taken after a quick run; a holder that
    // passes its at-most bound loses the job to the next, and its late finish is refused.
    let name = unique("bounds");
    let jb = b.schedule(&name).unwrap().at_most_for(Duration::from_millis(1500)).at_least_for(Duration::from_secs(1));
    let ja = a.schedule(&name).unwrap().at_most_for(Duration::from_millis(1500)).at_least_for(Duration::from_secs(1));
    let t0 = Instant::now();
    running(url, ja.try_start().await.unwrap()).finish(Some(0)).await.unwrap();
    let s = skipped(url, jb.try_start().await.unwrap());
    assert_eq!(s.reason, SkipReason::Taken, "{url}: {s}");
    let next = start_within(url, &jb, Duration::from_secs(5)).await;
    assert!(t0.elapsed() >= Duration::from_millis(900), "{url}: at least for 1 s, ran again after {:?}", t0.elapsed());
    // `next` hangs past its bound: the job is given to the next start.
    let stop_by = next.stop_by();
    let third = start_within(url, &ja, Duration::from_secs(6)).await;
    assert!(Instant::now() >= stop_by, "{url}: given on before the holder's stop_by");
    assert!(matches!(next.finish(Some(0)).await, Err(Error::LockLost { .. })), "{url}: a late finish is refused");
    third.finish(Some(0)).await.unwrap();
    assert_eq!(ja.last_run().await.unwrap().unwrap().exit, Some(0), "{url}");

    // Bad input: clear errors, nothing written.
    for bad in ["", &"x".repeat(65), "a\nb"] {
        assert!(matches!(a.schedule(bad), Err(Error::InvalidArgument { .. })), "{url}: {bad:?} accepted");
    }
    let name = unique("bad");
    let j = a.schedule(&name).unwrap();
    assert!(matches!(j.try_start().await, Err(Error::InvalidArgument { .. })), "{url}: no bound accepted");
    let j = j.at_most_for(Duration::from_secs(1)).at_least_for(Duration::from_secs(2));
    assert!(matches!(j.try_start().await, Err(Error::InvalidArgument { .. })), "{url}: at least > at most");
    assert_eq!(j.last_run().await.unwrap(), None, "{url}: refused starts write nothing");

    // A dropped run is finished in the background (no exit status).
    let name = unique("drop");
    let j = a.schedule(&name).unwrap().at_most_for(Duration::from_secs(5));
    drop(running(url, j.try_start().await.unwrap()));
    crate::common::eventually(Duration::from_secs(10), &format!("{url}: a dropped run recorded as ended"), || async {
        j.last_run().await.unwrap().is_some_and(|r| r.ended_ms.is_some())
    })
    .await;
    start_within(url, &j, Duration::from_secs(2)).await.finish(None).await.unwrap();
}

// ShedLock's own statements (its JDBC provider with `usingDbTime()`), run by hand against the
// same table: a ShedLock service and distlock exclude each other both ways.

/// ShedLock's PostgreSQL lock statement (with the database's time): 1 row when it took the job.
/// (`$2::text`: JDBC sends the interval as text; tokio-postgres would infer `interval`.)
const SHEDLOCK_PG_LOCK: &str = "INSERT INTO shedlock (name, lock_until, locked_at, locked_by) \
     VALUES ($1, timezone('utc', CURRENT_TIMESTAMP) + cast($2::text as interval), timezone('utc', CURRENT_TIMESTAMP), $3) \
     ON CONFLICT (name) DO UPDATE SET lock_until = timezone('utc', CURRENT_TIMESTAMP) + cast($2::text as interval), \
     locked_at = timezone('utc', CURRENT_TIMESTAMP), locked_by = $3 \
     WHERE shedlock.lock_until <= timezone('utc', CURRENT_TIMESTAMP)";
/// ShedLock's PostgreSQL unlock (lockAtLeastFor 0).
const SHEDLOCK_PG_UNLOCK: &str =
    "UPDATE shedlock SET lock_until = timezone('utc', CURRENT_TIMESTAMP) WHERE name = $1 AND locked_by = $2";

/// ShedLock's MySQL statements: insert, then update when the row is there.
const SHEDLOCK_MY_INSERT: &str = "INSERT IGNORE INTO shedlock (name, lock_until, locked_at, locked_by) \
     VALUES (?, UTC_TIMESTAMP(3) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(3), ?)";
const SHEDLOCK_MY_UPDATE: &str = "UPDATE shedlock SET lock_until = UTC_TIMESTAMP(3) + INTERVAL ? MICROSECOND, \
     locked_at = UTC_TIMESTAMP(3), locked_by = ? WHERE name = ? AND lock_until <= UTC_TIMESTAMP(3)";
const SHEDLOCK_MY_UNLOCK: &str = "UPDATE shedlock SET lock_until = UTC_TIMESTAMP(3) WHERE name = ? AND locked_by = ?";

/// The generic JDBC statements on SQLite, with SQLite's own UTC time text.
const SHEDLOCK_LITE_INSERT: &str = "INSERT OR IGNORE INTO shedlock (name, lock_until, locked_at, locked_by) \
     VALUES (?1, strftime('%Y-%m-%d %H:%M:%f', 'now', ?2), strftime('%Y-%m-%d %H:%M:%f', 'now'), ?3)";
const SHEDLOCK_LITE_UPDATE: &str = "UPDATE shedlock SET lock_until = strftime('%Y-%m-%d %H:%M:%f', 'now', ?2), \
     locked_at = strftime('%Y-%m-%d %H:%M:%f', 'now'), locked_by = ?3 \
     WHERE name = ?1 AND lock_until <= strftime('%Y-%m-%d %H:%M:%f', 'now')";
const SHEDLOCK_LITE_UNLOCK: &str =
    "UPDATE shedlock SET lock_until = strftime('%Y-%m-%d %H:%M:%f', 'now') WHERE name = ?1 AND locked_by = ?2";

/// A ShedLock peer speaking SQL to one of the three databases.
enum Peer {
    Postgres(tokio_postgres::Client),
    Mysql(sqlx::MySqlPool),
    Sqlite(sqlx::SqlitePool),
}

impl Peer {
    /// ShedLock's lock for 5 s: true if it took the job.
    async fn lock(&self, name: &str, by: &str) -> bool {
        match self {
            Peer::Postgres(c) => c.execute(SHEDLOCK_PG_LOCK, &[&name, &"5000 milliseconds", &by]).await.unwrap() == 1,
            Peer::Mysql(p) => {
                let micros: i64 = 5_000_000;
                let ins = sqlx::query(SHEDLOCK_MY_INSERT).bind(name).bind(micros).bind(by).execute(p).await.unwrap();
                ins.rows_affected() == 1
                    || sqlx::query(SHEDLOCK_MY_UPDATE)
                        .bind(micros)
                        .bind(by)
                        .bind(name)
                        .execute(p)
                        .await
                        .unwrap()
                        .rows_affected()
                        == 1
            }
            Peer::Sqlite(p) => {
                let ins =
                    sqlx::query(SHEDLOCK_LITE_INSERT).bind(name).bind("+5 seconds").bind(by).execute(p).await.unwrap();
                ins.rows_affected() == 1
                    || sqlx::query(SHEDLOCK_LITE_UPDATE)
                        .bind(name)
                        .bind("+5 seconds")
                        .bind(by)
                        .execute(p)
                        .await
                        .unwrap()
                        .rows_affected()
                        == 1
            }
        }
    }

    async fn unlock(&self, name: &str, by: &str) {
        match self {
            Peer::Postgres(c) => assert_eq!(c.execute(SHEDLOCK_PG_UNLOCK, &[&name, &by]).await.unwrap(), 1),
            Peer::Mysql(p) => {
                sqlx::query(SHEDLOCK_MY_UNLOCK).bind(name).bind(by).execute(p).await.unwrap();
            }
            Peer::Sqlite(p) => {
                sqlx::query(SHEDLOCK_LITE_UNLOCK).bind(name).bind(by).execute(p).await.unwrap();
            }
        }
    }
}

/// ShedLock takes the job: distlock is skipped, naming ShedLock's holder; ShedLock unlocks:
/// distlock runs; while distlock runs (and for its at-least bound) ShedLock cannot take it;
/// then it can.
async fn shedlock_exclusion(url: &str, peer: Peer) {
    let client = connect(url).await;
    let name = unique("shedlock");
    let job = client.schedule(&name).unwrap().at_most_for(Duration::from_secs(10)).at_least_for(Duration::from_secs(3));
    // distlock made the table (ShedLock's DDL) on first use.
    assert_eq!(job.last_run().await.unwrap(), None);

    assert!(peer.lock(&name, "java-service-1").await, "{url}: ShedLock takes a free job");
    let s = skipped(url, job.try_start().await.unwrap());
    assert_eq!(s.reason, SkipReason::Taken, "{url}");
    assert!(s.to_string().contains("java-service-1"), "{url}: names ShedLock's holder: {s}");
    peer.unlock(&name, "java-service-1").await;

    // Free from ShedLock's unlock time on (rounded up to the millisecond: a start in the same
    // millisecond may still find it taken).
    let run = start_within(url, &job, Duration::from_secs(1)).await;
    assert!(!peer.lock(&name, "java-service-2").await, "{url}: ShedLock took a job distlock runs");
    run.finish(Some(0)).await.unwrap();
    assert!(!peer.lock(&name, "java-service-2").await, "{url}: ShedLock ran within distlock's at-least bound");
    crate::common::eventually(Duration::from_secs(10), &format!("{url}: ShedLock to get the job back"), || {
        peer.lock(&name, "java-service-2")
    })
    .await;
    let s = skipped(url, job.try_start().await.unwrap());
    assert!(s.to_string().contains("java-service-2"), "{url}: {s}");
}

on_every_backend!(#[tokio::test] shedlock_interop: postgres, mysql, sqlite);
/// ShedLock's statements on the backend's own table, beside distlock (`shedlock_exclusion`).
async fn shedlock_interop(url: String) {
    let base = url.split('?').next().unwrap().to_string();
    let peer = if base.starts_with("postgres") {
        let (c, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        Peer::Postgres(c)
    } else if base.starts_with("mysql") {
        Peer::Mysql(sqlx::MySqlPool::connect(&base).await.unwrap())
    } else {
        drop(connect(&url).await); // makes the file
        Peer::Sqlite(sqlx::SqlitePool::connect(&base).await.unwrap())
    };
    shedlock_exclusion(&url, peer).await;
}

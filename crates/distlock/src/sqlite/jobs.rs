//! Scheduled jobs on SQLite ([`crate::schedule`]): ShedLock's table `shedlock (name,
//! lock_until, locked_at, locked_by)` in the database file, times as UTC text `YYYY-MM-DD
//! HH:MM:SS.SSS` (SQLite's own format; integer milliseconds written by a JDBC driver are read
//! too), and distlock's record of the last run in `distlock_job_runs (name, token, record)` (the
//! record as JSON). A write is one transaction that changes each row only if it still reads as
//! it did.
//!
//! # The clock
//!
//! SQLite has no server: the processes that share a database file share one machine, and its
//! kernel's clock is the server's clock. It is read with the `clock_gettime` system call itself,
//! not through the C library, so that a process whose library calls are given another time
//! (libfaketime, a test's skew) still agrees with the others on the slot.

use super::{backend, kernel_now_ms, Client};
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Seen};
use crate::schedule::{parse_ms, Run};
use crate::Result;
use std::sync::Arc;
use tokio::sync::OnceCell;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL PRIMARY KEY, \
     lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, locked_by VARCHAR(255) NOT NULL); \
     CREATE TABLE IF NOT EXISTS distlock_job_runs (name VARCHAR(64) NOT NULL PRIMARY KEY, token BIGINT NOT NULL, \
     record TEXT NOT NULL)";

/// A lock row's values as text: what a write compares.
const LOCK_TEXT: &str = "CAST(s.lock_until AS TEXT) || '|' || CAST(s.locked_at AS TEXT) || '|' || s.locked_by";

/// The job store of a SQLite client.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub(crate) client: Client,
    pub(crate) created: Arc<OnceCell<()>>,
}

/// SQLite's UTC text for milliseconds since the epoch.
fn text(ms: i64) -> String {
    crate::schedule::show_ms(ms).trim_end_matches('Z').replacen('T', " ", 1)
}

/// Milliseconds since the epoch of a stored time: text, or an integer (milliseconds as a JDBC
/// driver writes them; a number too small for milliseconds since 1973 is seconds, as
/// `unixepoch()` writes them).
fn stored_ms(v: &str) -> Option<i64> {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        let n: i64 = v.parse().ok()?;
        Some(if n < 100_000_000_000 { n * 1000 } else { n })
    } else {
        parse_ms(v)
    }
}

impl Jobs {
    async fn created(&self) -> Result<()> {
        self.created
            .get_or_try_init(|| async {
                sqlx::raw_sql(CREATE)
                    .execute(self.client.pool())
                    .await
                    .map(|_| ())
                    .map_err(|e| backend("create", "shedlock", e))
            })
            .await
            .copied()
    }
}

/// A read's row: lock_until, locked_at, locked_by, the lock row as text, the record.
type Row = (Option<String>, Option<String>, Option<String>, Option<String>, Option<String>);

impl JobStore for Jobs {
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            self.created().await?;
            let sql = format!(
                "SELECT CAST(s.lock_until AS TEXT), CAST(s.locked_at AS TEXT), s.locked_by, {LOCK_TEXT}, r.record \
                 FROM (SELECT 1) one LEFT JOIN shedlock s ON s.name = ?1 LEFT JOIN distlock_job_runs r ON r.name = ?1"
            );
            let now_ms = kernel_now_ms();
            let (until, at, by, lock_text, record): Row = sqlx::query_as(&sql)
                .bind(job)
                .fetch_one(self.client.pool())
                .await
                .map_err(|e| backend("read job", job, e))?;
            let run = record.as_ref().map(|r| Run::from_stored(job, "distlock_job_runs", r.as_bytes())).transpose()?;
            let lock = match (until, at, by) {
                (Some(until), Some(at), Some(locked_by)) => Some(JobLock {
                    // A time that does not parse holds the job (ShedLock does the same).
                    lock_until_ms: stored_ms(&until).unwrap_or(crate::schedule::FOREVER_MS),
                    locked_at_ms: stored_ms(&at).unwrap_or(0),
                    locked_by,
                }),
                _ => None,
            };
            Ok(JobRead { now_ms, now_error_ms: 0, lock, run, seen: Seen { lock: lock_text, run: record } })
        })
    }

    fn write<'a>(
        &'a self,
        job: &'a str,
        seen: &'a Seen,
        lock: Option<&'a JobLock>,
        run: &'a Run,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.created().await?;
            let record = run.stored();
            let outcome: sqlx::Result<bool> = async {
                // IMMEDIATE: the write lock is waited for (busy timeout) before anything is read, so a
                // concurrent writer cannot leave this transaction on a stale snapshot.
                let mut tx = self.client.pool().begin_with("BEGIN IMMEDIATE").await?;
                let mut ok = true;
                if let Some(l) = lock {
                    let done = match &seen.lock {
                        None => sqlx::query(
                            "INSERT INTO shedlock (name, lock_until, locked_at, locked_by) VALUES (?1, ?2, ?3, ?4) \
                                 ON CONFLICT (name) DO NOTHING",
                        )
                        .bind(job)
                        .bind(text(l.lock_until_ms))
                        .bind(text(l.locked_at_ms))
                        .bind(&l.locked_by)
                        .execute(&mut *tx)
                        .await?,
                        Some(was) => {
                            sqlx::query(&format!(
                                "UPDATE shedlock AS s SET lock_until = ?2, locked_at = ?3, locked_by = ?4 \
                                 WHERE s.name = ?1 AND {LOCK_TEXT} = ?5"
                            ))
                            .bind(job)
                            .bind(text(l.lock_until_ms))
                            .bind(text(l.locked_at_ms))
                            .bind(&l.locked_by)
                            .bind(was)
                            .execute(&mut *tx)
                            .await?
                        }
                    };
                    ok = done.rows_affected() == 1;
                }
                if ok {
                    let done =
                        match &seen.run {
                            None => {
                                sqlx::query(
                                    "INSERT INTO distlock_job_runs (name, token, record) VALUES (?1, ?2, ?3) \
                                 ON CONFLICT (name) DO NOTHING",
                                )
                                .bind(job)
                                .bind(run.token as i64)
                                .bind(&record)
                                .execute(&mut *tx)
                                .await?
                            }
                            Some(was) => sqlx::query(
                                "UPDATE distlock_job_runs SET token = ?2, record = ?3 WHERE name = ?1 AND record = ?4",
                            )
                            .bind(job)
                            .bind(run.token as i64)
                            .bind(&record)
                            .bind(was)
                            .execute(&mut *tx)
                            .await?,
                        };
                    ok = done.rows_affected() == 1;
                }
                if ok {
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                Ok(ok)
            }
            .await;
            outcome.map_err(|e| backend("write job", job, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_times() {
        assert_eq!(text(1_700_000_000_123), "2023-11-14 22:13:20.123");
        assert_eq!(stored_ms("2023-11-14 22:13:20.123"), Some(1_700_000_000_123));
        assert_eq!(stored_ms("1700000000123"), Some(1_700_000_000_123));
        assert_eq!(stored_ms("1700000000"), Some(1_700_000_000_000));
        assert_eq!(stored_ms("later"), None);
        let (k, s) = (kernel_now_ms(), crate::schedule::epoch_ms(std::time::SystemTime::now()));
        assert!((k - s).abs() < 1000, "{k} vs {s}");
    }
}

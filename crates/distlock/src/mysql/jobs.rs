//! Scheduled jobs on MariaDB ([`crate::schedule`]): ShedLock's table `shedlock (name,
//! lock_until, locked_at, locked_by)` with ShedLock's `usingDbTime()` meaning (the columns hold
//! `UTC_TIMESTAMP(3)` wall-clock values, compared with `UTC_TIMESTAMP(3)`), so Java services
//! using ShedLock's JDBC provider and distlock exclude each other by job name; and distlock's
//! record of the last run in `distlock_job_runs (name, token, record)` (the record as JSON).
//! The server's time is `UTC_TIMESTAMP(3)`. A write is one transaction that changes each row
//! only if it still reads as it did (the lock row by its values as text, the record by its text).

use super::{backend, Client};
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Seen};
use crate::schedule::Run;
use crate::Result;
use sqlx::{Connection, MySqlConnection};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// ShedLock's MySQL table, and distlock's records.
const CREATE_SHEDLOCK: &str = "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL, \
     lock_until TIMESTAMP(3) NOT NULL, locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
     locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))";
const CREATE_RUNS: &str = "CREATE TABLE IF NOT EXISTS distlock_job_runs (name VARCHAR(64) NOT NULL PRIMARY KEY, \
     token BIGINT NOT NULL, record MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL) DEFAULT CHARSET = utf8mb4";

/// A lock row's values as text (bytes): what a write compares.
const LOCK_TEXT: &str = "CAST(CONCAT(s.lock_until, '|', s.locked_at, '|', s.locked_by) AS BINARY)";

/// A wall-clock `TIMESTAMP(3)` from milliseconds since the epoch, as ShedLock's UTC values.
const AT: &str = "(TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? * 1000 MICROSECOND)";

/// Milliseconds since the epoch of a UTC wall-clock value `v`.
fn ms(v: &str) -> String {
    format!("TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', {v})")
}

/// The job store of a MariaDB client.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub(crate) client: Client,
    pub(crate) created: Arc<OnceCell<()>>,
}

impl Jobs {
    /// A connection, with the tables made sure of (created where missing). An idle pooled
    /// connection the server closed (`wait_timeout` is the lease) fails its first statement:
    /// then a new one is opened.
    async fn conn(&self) -> Result<super::Conn> {
        let mut conn = self.client.checkout().await?;
        if self.ready(&mut conn.conn).await.is_err() {
            conn = self.client.open().await?;
            self.ready(&mut conn.conn).await.map_err(|e| backend("create", "shedlock", e))?;
        }
        Ok(conn)
    }

    async fn ready(&self, conn: &mut MySqlConnection) -> sqlx::Result<()> {
        // ShedLock's JDBC sessions keep the server's time zone, in which its `TIMESTAMP` values
        // are written and read; the client's sessions are set to UTC. Job statements read and
        // write in the server's zone, so that both see the same wall-clock values.
        sqlx::query("SET time_zone = @@global.time_zone").execute(&mut *conn).await?;
        if self.created.get().is_some() {
            return Ok(());
        }
        for (table, create) in [("shedlock", CREATE_SHEDLOCK), ("distlock_job_runs", CREATE_RUNS)] {
            let there: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
            )
            .bind(table)
            .fetch_one(&mut *conn)
            .await?;
            if there == 0 {
                sqlx::query(create).execute(&mut *conn).await?;
            }
        }
        let column: Option<(String, Option<u32>)> = sqlx::query_as(
            "SELECT CAST(DATA_TYPE AS CHAR), CAST(DATETIME_PRECISION AS UNSIGNED) FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = 'shedlock' AND column_name = 'lock_until'",
        )
        .fetch_optional(&mut *conn)
        .await?;
        if let Some((kind, precision)) = column {
            if !matches!(kind.to_ascii_lowercase().as_str(), "timestamp" | "datetime") || precision.unwrap_or(0) < 3 {
                return Err(sqlx::Error::Protocol(format!(
                    "table shedlock's lock_until is {kind}({}); jobs need ShedLock's TIMESTAMP(3) (milliseconds)",
                    precision.unwrap_or(0)
                )));
            }
        }
        let _ = self.created.set(());
        Ok(())
    }
}

type ReadRow = (i64, Option<i64>, Option<i64>, Option<String>, Option<Vec<u8>>, Option<String>);

impl JobStore for Jobs {
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT CAST({} DIV 1000 AS SIGNED), CAST(CEIL({} / 1000) AS SIGNED), CAST({} DIV 1000 AS SIGNED), \
                 s.locked_by, {LOCK_TEXT}, r.record \
                 FROM (SELECT 1) one LEFT JOIN shedlock s ON s.name = ? LEFT JOIN distlock_job_runs r ON r.name = ?",
                ms("UTC_TIMESTAMP(3)"),
                ms("s.lock_until"),
                ms("s.locked_at")
            );
            let mut conn = self.conn().await?;
            let row: ReadRow = sqlx::query_as(&sql)
                .bind(job)
                .bind(job)
                .fetch_one(&mut conn.conn)
                .await
                .map_err(|e| backend("read job", job, e))?;
            self.client.put_back(conn);
            let (now_ms, lock_until, locked_at, locked_by, lock_text, record) = row;
            let run = record.as_ref().map(|r| Run::from_stored(job, "distlock_job_runs", r.as_bytes())).transpose()?;
            let lock = match (lock_until, locked_at, locked_by) {
                (Some(lock_until_ms), Some(locked_at_ms), Some(locked_by)) => {
                    Some(JobLock { lock_until_ms, locked_at_ms, locked_by })
                }
                _ => None,
            };
            let lock_text = lock_text.map(|b| String::from_utf8_lossy(&b).into_owned());
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
            let record = run.stored();
            let mut conn = self.conn().await?;
            let outcome: sqlx::Result<bool> = async {
                let mut tx = conn.conn.begin().await?;
                let mut ok = true;
                if let Some(l) = lock {
                    let done = match &seen.lock {
                        None => {
                            sqlx::query(&format!(
                                "INSERT IGNORE INTO shedlock (name, lock_until, locked_at, locked_by) VALUES (?, {AT}, {AT}, ?)"
                            ))
                            .bind(job)
                            .bind(l.lock_until_ms)
                            .bind(l.locked_at_ms)
                            .bind(&l.locked_by)
                            .execute(&mut *tx)
                            .await?
                        }
                        Some(was) => {
                            sqlx::query(&format!(
                                "UPDATE shedlock s SET lock_until = {AT}, locked_at = {AT}, locked_by = ? \
                                 WHERE s.name = ? AND {LOCK_TEXT} = CAST(? AS BINARY)"
                            ))
                            .bind(l.lock_until_ms)
                            .bind(l.locked_at_ms)
                            .bind(&l.locked_by)
                            .bind(job)
                            .bind(was)
                            .execute(&mut *tx)
                            .await?
                        }
                    };
                    ok = done.rows_affected() == 1;
                }
                if ok {
                    let done = match &seen.run {
                        None => {
                            sqlx::query("INSERT IGNORE INTO distlock_job_runs (name, token, record) VALUES (?, ?, ?)")
                                .bind(job)
                                .bind(run.token as i64)
                                .bind(&record)
                                .execute(&mut *tx)
                                .await?
                        }
                        Some(was) => {
                            sqlx::query(
                                "UPDATE distlock_job_runs SET token = ?, record = ? \
                                 WHERE name = ? AND CAST(record AS BINARY) = CAST(? AS BINARY)",
                            )
                            .bind(run.token as i64)
                            .bind(&record)
                            .bind(job)
                            .bind(was)
                            .execute(&mut *tx)
                            .await?
                        }
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
            match outcome {
                Ok(ok) => {
                    self.client.put_back(conn);
                    Ok(ok)
                }
                // The connection is dropped, not put back: an open transaction dies with it.
                Err(e) => Err(backend("write job", job, e)),
            }
        })
    }
}

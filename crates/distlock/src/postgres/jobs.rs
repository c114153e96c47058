//! Scheduled jobs on PostgreSQL ([`crate::schedule`]): ShedLock's table `shedlock (name,
//! lock_until, locked_at, locked_by)`, times in UTC as ShedLock's `usingDbTime()` writes them
//! (`timezone('utc', CURRENT_TIMESTAMP)`), so Java services using ShedLock's JDBC provider and
//! distlock exclude each other by job name; and distlock's record of the last run in
//! `distlock_job_runs (name, token, record)` (the record as JSON). The server's time is
//! `clock_timestamp()`. A write is one transaction that changes each row only if it still reads
//! as it did (the lock row by its values as text, the record by its text).

use super::{backend, Client};
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Seen};
use crate::schedule::Run;
use crate::{Error, Result};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// ShedLock's PostgreSQL table, and distlock's records.
const CREATE_SHEDLOCK: &str = "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL, \
     lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))";
const CREATE_RUNS: &str =
    "CREATE TABLE IF NOT EXISTS distlock_job_runs (name VARCHAR(64) PRIMARY KEY, token BIGINT NOT NULL, record TEXT NOT NULL)";

/// A lock row's values as text: what a write compares.
const LOCK_TEXT: &str = "s.lock_until::text || '|' || s.locked_at::text || '|' || s.locked_by";

/// A UTC `timestamp` from milliseconds since the epoch (exact to the millisecond).
const AT: &str = "('epoch'::timestamp + $2::bigint * interval '1 millisecond')";

/// The job store of a PostgreSQL client.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub(crate) client: Client,
    pub(crate) created: Arc<OnceCell<()>>,
}

impl Jobs {
    /// Creates the tables on first use where they are missing (a user without the right to
    /// create tables can use ones made for it).
    async fn created(&self) -> Result<()> {
        self.created
            .get_or_try_init(|| async {
                let conn = self.client.checkout().await?;
                for (table, create) in [("shedlock", CREATE_SHEDLOCK), ("distlock_job_runs", CREATE_RUNS)] {
                    let there: bool = conn
                        .client
                        .query_one(&format!("SELECT to_regclass('{table}') IS NOT NULL"), &[])
                        .await
                        .map_err(|e| backend("create", table, e))?
                        .get(0);
                    if !there {
                        match conn.client.batch_execute(create).await {
                            Ok(()) => {}
                            Err(e) if super::made_by_another(&e) => {}
                            Err(e) => return Err(backend("create", table, e)),
                        }
                    }
                }
                // ShedLock's UTC wall-clock values need its column type, to the millisecond: a
                // `timestamptz` or a coarser column would move or round every bound.
                let row = conn
                    .client
                    .query_opt(
                        "SELECT data_type, datetime_precision FROM information_schema.columns \
                         WHERE table_schema = current_schema() AND table_name = 'shedlock' AND column_name = 'lock_until'",
                        &[],
                    )
                    .await
                    .map_err(|e| backend("create", "shedlock", e))?;
                if let Some(row) = row {
                    let (kind, precision): (String, Option<i32>) = (row.get(0), row.get(1));
                    if kind != "timestamp without time zone" || precision.is_some_and(|p| p < 3) {
                        return Err(Error::Unsupported {
                            backend: "postgres",
                            what: format!(
                                "jobs on table shedlock whose lock_until is {kind}({}): ShedLock's PostgreSQL table has \
                                 TIMESTAMP (UTC, without time zone, milliseconds at least)",
                                precision.map_or("default".into(), |p| p.to_string())
                            ),
                        });
                    }
                }
                self.client.put_back(conn);
                Ok(())
            })
            .await
            .copied()
    }
}

/// One statement of a write; `Ok(false)` when it changed no row.
async fn changed(
    client: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> std::result::Result<bool, tokio_postgres::Error> {
    Ok(client.execute(sql, params).await? == 1)
}

impl JobStore for Jobs {
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            self.created().await?;
            let sql = format!(
                "SELECT floor(extract(epoch FROM clock_timestamp() AT TIME ZONE 'UTC') * 1000)::bigint, \
                 ceil(extract(epoch FROM s.lock_until) * 1000)::bigint, floor(extract(epoch FROM s.locked_at) * 1000)::bigint, \
                 s.locked_by, {LOCK_TEXT}, r.record \
                 FROM (SELECT 1) one LEFT JOIN shedlock s ON s.name = $1 LEFT JOIN distlock_job_runs r ON r.name = $1"
            );
            let conn = self.client.checkout().await?;
            let row = conn.client.query_one(&sql, &[&job]).await.map_err(|e| backend("read job", job, e))?;
            self.client.put_back(conn);
            let lock_text: Option<String> = row.get(4);
            let record: Option<String> = row.get(5);
            let run = record.as_ref().map(|r| Run::from_stored(job, "distlock_job_runs", r.as_bytes())).transpose()?;
            Ok(JobRead {
                now_ms: row.get(0),
                now_error_ms: 0,
                lock: lock_text.as_ref().map(|_| JobLock {
                    lock_until_ms: row.get(1),
                    locked_at_ms: row.get(2),
                    locked_by: row.get(3),
                }),
                run,
                seen: Seen { lock: lock_text, run: record },
            })
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
            let token = run.token as i64;
            let conn = self.client.checkout().await?;
            let c = &conn.client;
            let outcome: std::result::Result<bool, tokio_postgres::Error> = async {
                // The client's connections commit asynchronously; a start must be durable
                // before it is run (a crash must not forget it and give the slot again).
                c.batch_execute("BEGIN; SET LOCAL synchronous_commit = on").await?;
                let mut ok = true;
                if let Some(l) = lock {
                    let at = AT.replace("$2", "$3");
                    ok = match &seen.lock {
                        None => {
                            changed(
                                c,
                                &format!(
                                    "INSERT INTO shedlock (name, lock_until, locked_at, locked_by) \
                                     VALUES ($1, {AT}, {at}, $4) ON CONFLICT (name) DO NOTHING"
                                ),
                                &[&job, &l.lock_until_ms, &l.locked_at_ms, &l.locked_by],
                            )
                            .await?
                        }
                        Some(was) => {
                            changed(
                                c,
                                &format!(
                                    "UPDATE shedlock s SET lock_until = {AT}, locked_at = {at}, locked_by = $4 \
                                     WHERE s.name = $1 AND {LOCK_TEXT} = $5"
                                ),
                                &[&job, &l.lock_until_ms, &l.locked_at_ms, &l.locked_by, was],
                            )
                            .await?
                        }
                    };
                }
                if ok {
                    ok =
                        match &seen.run {
                            None => {
                                changed(
                                    c,
                                    "INSERT INTO distlock_job_runs (name, token, record) VALUES ($1, $2, $3) \
                                 ON CONFLICT (name) DO NOTHING",
                                    &[&job, &token, &record],
                                )
                                .await?
                            }
                            Some(was) => changed(
                                c,
                                "UPDATE distlock_job_runs SET token = $2, record = $3 WHERE name = $1 AND record = $4",
                                &[&job, &token, &record, was],
                            )
                            .await?,
                        };
                }
                c.batch_execute(if ok { "COMMIT" } else { "ROLLBACK" }).await?;
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

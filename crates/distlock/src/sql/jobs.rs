//! Scheduled jobs on a SQL server ([`crate::schedule`]), written once over a backend's
//! [`Dialect`] and [`Executor`]: ShedLock's table `shedlock (name, lock_until, locked_at,
//! locked_by)`, its times as ShedLock's `usingDbTime()` keeps them on that server (each dialect
//! says how), so that Java services using ShedLock's JDBC provider and distlock exclude each
//! other by job name; and distlock's record of the last run in `distlock_job_runs (name, token,
//! record)` (the record as JSON).
//!
//! A read takes both rows and the server's time in one statement. A write is one transaction
//! that changes each row only if it still reads as it did: an insert (doing nothing where the
//! name is taken) where the read saw no row, else an update of the row as read (the lock row by
//! its values as text, the record by its text). If one changes no row, nothing is written.

use super::{render, Cell, Column, Dialect, Executor, Now, Param, Statement};
use crate::contract::{BoxFuture, JobLock, JobRead, Jobs as JobStore, Seen};
use crate::schedule::Run;
use crate::{Error, Result};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// The job store of a SQL client.
#[derive(Debug, Clone)]
pub(crate) struct Jobs<E> {
    exec: E,
    /// The tables, made sure of on first use.
    created: Arc<OnceCell<()>>,
}

impl<E: Executor + std::fmt::Debug> Jobs<E> {
    pub(crate) fn new(exec: E) -> Jobs<E> {
        Jobs { exec, created: Arc::default() }
    }

    /// Creates the tables on first use where they are missing, and checks that ShedLock's
    /// `lock_until` keeps its values to the millisecond as ShedLock's own would: another type
    /// would move or round every bound.
    async fn created(&self) -> Result<()> {
        self.created
            .get_or_try_init(|| async {
                let tables =
                    [("shedlock", E::Dialect::CREATE_SHEDLOCK), ("distlock_job_runs", E::Dialect::CREATE_RUNS)];
                super::create(&self.exec, &tables).await?;
                let Some(sql) = E::Dialect::LOCK_UNTIL_TYPE else { return Ok(()) };
                let s = Statement { op: "create", name: "shedlock", sql, params: &[] };
                let row = self.exec.row(s, &[Column::Text, Column::Int]).await?;
                match row.as_deref() {
                    Some([Cell::Text(kind), precision]) => E::Dialect::check_lock_until(kind, precision.int()),
                    _ => Ok(()),
                }
            })
            .await
            .copied()
    }

    /// Runs one statement of a write: whether it changed the row.
    async fn changed(&self, tx: &mut E::Tx, job: &str, sql: &str, params: &[Param<'_>]) -> Result<bool> {
        let (sql, params) = render(E::Dialect::PLACEHOLDERS, sql, params);
        Ok(self.exec.execute(tx, Statement { op: "write job", name: job, sql: &sql, params: &params }).await? == 1)
    }

    /// The lock row's statement of a write of `l`, with its parameters.
    fn lock_statement<'a>(job: &'a str, was: Option<&'a str>, l: &'a JobLock) -> (String, Vec<Param<'a>>) {
        let (until, at) = (E::Dialect::write_time("$2"), E::Dialect::write_time("$3"));
        let mut params = vec![
            job.into(),
            E::Dialect::time_param(l.lock_until_ms),
            E::Dialect::time_param(l.locked_at_ms),
            l.locked_by.as_str().into(),
        ];
        let sql = match was {
            None => E::Dialect::insert_new(
                "shedlock",
                "name, lock_until, locked_at, locked_by",
                &format!("$1, {until}, {at}, $4"),
            ),
            Some(was) => {
                params.push(was.into());
                format!(
                    "UPDATE shedlock AS s SET lock_until = {until}, locked_at = {at}, locked_by = $4 \
                     WHERE s.name = $1 AND {}",
                    E::Dialect::same(E::Dialect::LOCK_TEXT, "$5")
                )
            }
        };
        (sql, params)
    }

    /// The record's statement of a write, with its parameters.
    fn run_statement<'a>(job: &'a str, was: Option<&'a str>, token: u64, record: &'a str) -> (String, Vec<Param<'a>>) {
        let mut params = vec![job.into(), Param::Int(token as i64), record.into()];
        let sql = match was {
            None => E::Dialect::insert_new("distlock_job_runs", "name, token, record", "$1, $2, $3"),
            Some(was) => {
                params.push(was.into());
                format!(
                    "UPDATE distlock_job_runs SET token = $2, record = $3 WHERE name = $1 AND {}",
                    E::Dialect::same("record", "$4")
                )
            }
        };
        (sql, params)
    }
}

impl<E: Executor + std::fmt::Debug> JobStore for Jobs<E> {
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            self.created().await?;
            let mut params = vec![Param::from(job)];
            let now = match E::Dialect::now() {
                Now::Sql(now) => now.to_string(),
                Now::Ms(ms) => {
                    params.push(Param::Int(ms));
                    "$2".to_string()
                }
            };
            let sql = format!(
                "SELECT {now}, {}, {}, s.locked_by, {}, r.record \
                 FROM (SELECT 1) one LEFT JOIN shedlock s ON s.name = $1 LEFT JOIN distlock_job_runs r ON r.name = $1",
                E::Dialect::read_time("s.lock_until", true),
                E::Dialect::read_time("s.locked_at", false),
                E::Dialect::LOCK_TEXT,
            );
            let (sql, params) = render(E::Dialect::PLACEHOLDERS, &sql, &params);
            let time = E::Dialect::TIME;
            let columns = [Column::Int, time, time, Column::Text, Column::Text, Column::Text];
            let row =
                self.exec.row(Statement { op: "read job", name: job, sql: &sql, params: &params }, &columns).await?;
            let Some([now, until, at, by, lock_text, record]) = row.and_then(|r| <[Cell; 6]>::try_from(r).ok()) else {
                return Err(Error::Backend {
                    op: "read job",
                    path: job.to_string(),
                    source: "the read gave no row".into(),
                });
            };
            let record = record.text();
            let run = record.as_ref().map(|r| Run::from_stored(job, "distlock_job_runs", r.as_bytes())).transpose()?;
            let lock = match (until, at, by.text()) {
                (Cell::Null, _, _) | (_, Cell::Null, _) | (_, _, None) => None,
                (until, at, Some(locked_by)) => Some(JobLock {
                    lock_until_ms: E::Dialect::time_ms(until, true),
                    locked_at_ms: E::Dialect::time_ms(at, false),
                    locked_by,
                }),
            };
            let now_ms = now.int().unwrap_or(0);
            Ok(JobRead { now_ms, now_error_ms: 0, lock, run, seen: Seen { lock: lock_text.text(), run: record } })
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
            // Dropped unfinished (a statement failed), the transaction is rolled back.
            let begin = Statement { op: "write job", name: job, sql: E::Dialect::BEGIN, params: &[] };
            let mut tx = self.exec.begin(begin).await?;
            let mut ok = true;
            if let Some(l) = lock {
                let (sql, params) = Self::lock_statement(job, seen.lock.as_deref(), l);
                ok = self.changed(&mut tx, job, &sql, &params).await?;
            }
            if ok {
                let (sql, params) = Self::run_statement(job, seen.run.as_deref(), run.token, &record);
                ok = self.changed(&mut tx, job, &sql, &params).await?;
            }
            self.exec.finish(tx, ok, "write job", job).await?;
            Ok(ok)
        })
    }
}

//! Scheduled jobs on PostgreSQL ([`crate::sql::jobs`]): ShedLock's PostgreSQL table, times in
//! UTC as ShedLock's `usingDbTime()` writes them (`timezone('utc', CURRENT_TIMESTAMP)`), and the
//! server's time from `clock_timestamp()`. Here: PostgreSQL's dialect, and the SQL layer's
//! executor over the client's connections (the elections' table is made through it too).

use super::{backend, Client, Tx};
use crate::contract::BoxFuture;
use crate::sql::{Cell, Column, Executor, Now, Param, Placeholders, Statement};
use crate::{Error, Result};

/// PostgreSQL's SQL.
#[derive(Debug)]
pub(crate) struct Dialect;

impl crate::sql::Dialect for Dialect {
    const PLACEHOLDERS: Placeholders = Placeholders::Dollar;
    fn exists(table: &str) -> Option<String> {
        Some(format!("SELECT count(to_regclass('{table}'))"))
    }
    const CREATE_SHEDLOCK: &'static str = "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL, \
         lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))";
    const CREATE_RUNS: &'static str = "CREATE TABLE IF NOT EXISTS distlock_job_runs (name VARCHAR(64) PRIMARY KEY, \
         token BIGINT NOT NULL, record TEXT NOT NULL)";
    const LOCK_UNTIL_TYPE: Option<&'static str> = Some(
        "SELECT data_type::text, datetime_precision::bigint FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = 'shedlock' AND column_name = 'lock_until'",
    );
    fn check_lock_until(kind: &str, precision: Option<i64>) -> Result<()> {
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
        Ok(())
    }
    // The client's connections commit asynchronously; a start must be durable before it is run
    // (a crash must not forget it and give the slot again). The transaction has its connection
    // to itself (no lock on it), so its statements may wait on others' rows as long as they hold
    // them: the lock connections' bound on waits (`lock_timeout`) is lifted for it.
    const BEGIN: &'static str = "BEGIN; SET LOCAL synchronous_commit = on; SET LOCAL lock_timeout = 0";
    const LOCK_TEXT: &'static str = "s.lock_until::text || '|' || s.locked_at::text || '|' || s.locked_by";
    fn now() -> Now {
        Now::Sql("floor(extract(epoch FROM clock_timestamp() AT TIME ZONE 'UTC') * 1000)::bigint")
    }
    fn read_time(v: &str, up: bool) -> String {
        format!("{}(extract(epoch FROM {v}) * 1000)::bigint", if up { "ceil" } else { "floor" })
    }
    /// A UTC `timestamp` (exact to the millisecond).
    fn write_time(p: &str) -> String {
        format!("('epoch'::timestamp + {p}::bigint * interval '1 millisecond')")
    }
}

/// The parameters as the driver takes them.
fn values<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
    let value = |p: &'a Param<'a>| -> &'a (dyn tokio_postgres::types::ToSql + Sync) {
        match p {
            Param::Int(n) => n,
            Param::Text(s) => s,
        }
    };
    params.iter().map(value).collect()
}

impl Executor for Client {
    type Dialect = Dialect;
    /// A connection taken for the transaction alone; dropped unfinished, it is closed: the open
    /// transaction dies with it.
    type Tx = Tx;

    fn row<'a>(&'a self, s: Statement<'a>, columns: &'a [Column]) -> BoxFuture<'a, Result<Option<Vec<Cell>>>> {
        Box::pin(async move {
            let conn = self.statement_conn().await?;
            let row = conn.client.query_opt(s.sql, &values(s.params)).await.map_err(|e| backend(s.op, s.name, e))?;
            let read = |row: &tokio_postgres::Row| {
                crate::sql::cells(columns, |i, column| match column {
                    Column::Int => row.try_get::<_, Option<i64>>(i).map(Cell::from),
                    Column::Text => row.try_get::<_, Option<String>>(i).map(Cell::from),
                })
            };
            row.as_ref().map(read).transpose().map_err(|e| backend(s.op, s.name, e))
        })
    }

    /// On a connection that holds no lock (taken for it alone, or one of its own): a `CREATE`
    /// may wait on the server (for another's `CREATE` of the table to commit, or a migration's
    /// lock on it) for as long as that takes, which on a shared connection would hold up the
    /// health check of every lock on it. It runs once per table and client, so an empty
    /// connection costs nothing that matters; the wait is not bounded (`lock_timeout` lifted
    /// for its implicit transaction).
    fn create<'a>(&'a self, table: &'a str, create: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let tx = self.transaction_conn().await?;
            let sql = format!("SELECT set_config('lock_timeout', '0', true); {create}");
            let created = tx.conn.client.batch_execute(&sql).await;
            // Answered (even with an error): the implicit transaction ended, the connection is idle.
            tx.finished();
            match created {
                Ok(()) => {}
                Err(e) if super::made_by_another(&e) => {}
                Err(e) => return Err(backend("create", table, e)),
            }
            Ok(())
        })
    }

    fn begin<'a>(&'a self, s: Statement<'a>) -> BoxFuture<'a, Result<Tx>> {
        Box::pin(async move {
            let tx = self.transaction_conn().await?;
            tx.conn.client.batch_execute(s.sql).await.map_err(|e| backend(s.op, s.name, e))?;
            Ok(tx)
        })
    }

    fn execute<'a>(&'a self, tx: &'a mut Tx, s: Statement<'a>) -> BoxFuture<'a, Result<u64>> {
        Box::pin(
            async move { tx.conn.client.execute(s.sql, &values(s.params)).await.map_err(|e| backend(s.op, s.name, e)) },
        )
    }

    fn finish<'a>(&'a self, tx: Tx, commit: bool, op: &'static str, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let end = if commit { "COMMIT" } else { "ROLLBACK" };
            tx.conn.client.batch_execute(end).await.map_err(|e| backend(op, name, e))?;
            tx.finished();
            Ok(())
        })
    }
}

//! Scheduled jobs on SQLite ([`crate::sql::jobs`]): ShedLock's table in the database file,
//! times as UTC text `YYYY-MM-DD HH:MM:SS.SSS` (SQLite's own format; integer milliseconds
//! written by a JDBC driver are read too). Here: SQLite's dialect, and the SQL layer's executor
//! over the client's pool (the elections' table is made through it too).
//!
//! # The clock
//!
//! SQLite has no server: the processes that share a database file share one machine, and its
//! kernel's clock is the server's clock. It is read with the `clock_gettime` system call itself,
//! not through the C library, so that a process whose library calls are given another time
//! (libfaketime, a test's skew) still agrees with the others on the slot.

use super::{backend, kernel_now_ms, Client};
use crate::contract::BoxFuture;
use crate::schedule::parse_ms;
use crate::sql::{Cell, Column, Executor, Now, Param, Placeholders, Statement};
use crate::Result;
use sqlx::sqlite::{Sqlite, SqliteArguments};
use sqlx::Row;

/// SQLite's SQL.
#[derive(Debug)]
pub(crate) struct Dialect;

impl crate::sql::Dialect for Dialect {
    const PLACEHOLDERS: Placeholders = Placeholders::Numbered;
    fn exists(_table: &str) -> Option<String> {
        None
    }
    const CREATE_SHEDLOCK: &'static str =
        "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL PRIMARY KEY, \
         lock_until TIMESTAMP NOT NULL, locked_at TIMESTAMP NOT NULL, locked_by VARCHAR(255) NOT NULL)";
    const CREATE_RUNS: &'static str =
        "CREATE TABLE IF NOT EXISTS distlock_job_runs (name VARCHAR(64) NOT NULL PRIMARY KEY, \
         token BIGINT NOT NULL, record TEXT NOT NULL)";
    const LOCK_UNTIL_TYPE: Option<&'static str> = None;
    fn check_lock_until(_kind: &str, _precision: Option<i64>) -> Result<()> {
        Ok(())
    }
    // IMMEDIATE: the write lock is waited for (busy timeout) before anything is read, so a
    // concurrent writer cannot leave this transaction on a stale snapshot.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const LOCK_TEXT: &'static str =
        "CAST(s.lock_until AS TEXT) || '|' || CAST(s.locked_at AS TEXT) || '|' || s.locked_by";
    fn now() -> Now {
        Now::Ms(kernel_now_ms())
    }
    fn read_time(v: &str, _up: bool) -> String {
        format!("CAST({v} AS TEXT)")
    }
    const TIME: Column = Column::Text;
    fn time_ms(cell: Cell, up: bool) -> i64 {
        // A time that does not parse holds the job (ShedLock does the same).
        let fallback = if up { crate::schedule::FOREVER_MS } else { 0 };
        cell.text().and_then(|v| stored_ms(&v)).unwrap_or(fallback)
    }
    fn write_time(p: &str) -> String {
        p.to_string()
    }
    fn time_param(ms: i64) -> Param<'static> {
        Param::Text(text(ms).into())
    }
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

/// A statement with its parameters bound.
fn bound(s: Statement<'_>) -> sqlx::query::Query<'_, Sqlite, SqliteArguments<'_>> {
    s.params.iter().fold(sqlx::query(s.sql), |q, p| match p {
        Param::Int(n) => q.bind(*n),
        Param::Text(s) => q.bind(s.as_ref()),
    })
}

impl Executor for Client {
    type Dialect = Dialect;
    /// Dropped unfinished, it is rolled back.
    type Tx = sqlx::Transaction<'static, Sqlite>;

    fn row<'a>(&'a self, s: Statement<'a>, columns: &'a [Column]) -> BoxFuture<'a, Result<Option<Vec<Cell>>>> {
        Box::pin(async move {
            let row = bound(s).fetch_optional(self.pool()).await.map_err(|e| backend(s.op, s.name, e))?;
            let read = |row: &sqlx::sqlite::SqliteRow| {
                crate::sql::cells(columns, |i, column| match column {
                    Column::Int => row.try_get::<Option<i64>, _>(i).map(Cell::from),
                    Column::Text => row.try_get::<Option<String>, _>(i).map(Cell::from),
                })
            };
            row.as_ref().map(read).transpose().map_err(|e| backend(s.op, s.name, e))
        })
    }

    fn create<'a>(&'a self, table: &'a str, create: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            sqlx::raw_sql(create).execute(self.pool()).await.map(|_| ()).map_err(|e| backend("create", table, e))
        })
    }

    fn begin<'a>(&'a self, s: Statement<'a>) -> BoxFuture<'a, Result<Self::Tx>> {
        let begin = s.sql.to_string();
        Box::pin(async move { self.pool().begin_with(begin).await.map_err(|e| backend(s.op, s.name, e)) })
    }

    fn execute<'a>(&'a self, tx: &'a mut Self::Tx, s: Statement<'a>) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let done = bound(s).execute(&mut **tx).await.map_err(|e| backend(s.op, s.name, e))?;
            Ok(done.rows_affected())
        })
    }

    fn finish<'a>(&'a self, tx: Self::Tx, commit: bool, op: &'static str, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let end = if commit { tx.commit().await } else { tx.rollback().await };
            end.map_err(|e| backend(op, name, e))
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

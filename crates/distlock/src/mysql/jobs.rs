//! Scheduled jobs on MariaDB ([`crate::sql::jobs`]): ShedLock's MySQL table with ShedLock's
//! `usingDbTime()` meaning (the columns hold `UTC_TIMESTAMP(3)` wall-clock values, compared with
//! `UTC_TIMESTAMP(3)`), and the server's time from `UTC_TIMESTAMP(3)`. Here: MariaDB's dialect,
//! and the SQL layer's executor over the client's connections (the elections' table is made
//! through it too).

use super::{backend, Client, Conn};
use crate::contract::BoxFuture;
use crate::sql::{Cell, Column, Executor, Now, Param, Placeholders, Statement};
use crate::Result;
use sqlx::mysql::{MySql, MySqlArguments, MySqlTransactionManager};
use sqlx::{Row, TransactionManager};

/// MariaDB's SQL.
#[derive(Debug)]
pub(crate) struct Dialect;

/// Milliseconds since the epoch of a UTC wall-clock value `v`.
fn ms(v: &str) -> String {
    format!("TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', {v})")
}

impl crate::sql::Dialect for Dialect {
    const PLACEHOLDERS: Placeholders = Placeholders::Positional;
    fn exists(table: &str) -> Option<String> {
        Some(format!(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '{table}'"
        ))
    }
    const CREATE_SHEDLOCK: &'static str = "CREATE TABLE IF NOT EXISTS shedlock (name VARCHAR(64) NOT NULL, \
         lock_until TIMESTAMP(3) NOT NULL, locked_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
         locked_by VARCHAR(255) NOT NULL, PRIMARY KEY (name))";
    const CREATE_RUNS: &'static str =
        "CREATE TABLE IF NOT EXISTS distlock_job_runs (name VARCHAR(64) NOT NULL PRIMARY KEY, \
         token BIGINT NOT NULL, record MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL) DEFAULT CHARSET = utf8mb4";
    const LOCK_UNTIL_TYPE: Option<&'static str> = Some(
        "SELECT CAST(DATA_TYPE AS CHAR), CAST(DATETIME_PRECISION AS SIGNED) FROM information_schema.columns \
         WHERE table_schema = DATABASE() AND table_name = 'shedlock' AND column_name = 'lock_until'",
    );
    fn check_lock_until(kind: &str, precision: Option<i64>) -> Result<()> {
        if !matches!(kind.to_ascii_lowercase().as_str(), "timestamp" | "datetime") || precision.unwrap_or(0) < 3 {
            let why = format!(
                "table shedlock's lock_until is {kind}({}); jobs need ShedLock's TIMESTAMP(3) (milliseconds)",
                precision.unwrap_or(0)
            );
            return Err(backend("create", "shedlock", sqlx::Error::Protocol(why)));
        }
        Ok(())
    }
    const BEGIN: &'static str = "BEGIN";
    /// As bytes: a write compares them to the byte.
    const LOCK_TEXT: &'static str = "CAST(CONCAT(s.lock_until, '|', s.locked_at, '|', s.locked_by) AS BINARY)";
    fn same(a: &str, b: &str) -> String {
        format!("CAST({a} AS BINARY) = CAST({b} AS BINARY)")
    }
    fn insert_new(table: &str, columns: &str, values: &str) -> String {
        format!("INSERT IGNORE INTO {table} ({columns}) VALUES ({values})")
    }
    fn now() -> Now {
        Now::Sql(
            "CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000 AS SIGNED)",
        )
    }
    fn read_time(v: &str, up: bool) -> String {
        if up {
            format!("CAST(CEIL({} / 1000) AS SIGNED)", ms(v))
        } else {
            format!("CAST({} DIV 1000 AS SIGNED)", ms(v))
        }
    }
    /// A wall-clock `TIMESTAMP(3)`, as ShedLock's UTC values.
    fn write_time(p: &str) -> String {
        format!("(TIMESTAMP '1970-01-01 00:00:00' + INTERVAL {p} * 1000 MICROSECOND)")
    }
}

/// A statement with its parameters bound.
fn bound(s: Statement<'_>) -> sqlx::query::Query<'_, MySql, MySqlArguments> {
    s.params.iter().fold(sqlx::query(s.sql), |q, p| match p {
        Param::Int(n) => q.bind(*n),
        Param::Text(s) => q.bind(s.as_ref()),
    })
}

impl Client {
    /// A connection for the SQL layer's statements. ShedLock's JDBC sessions keep the server's
    /// time zone, in which its `TIMESTAMP` values are written and read; the client's sessions
    /// are set to UTC. These statements read and write in the server's zone, so that both see
    /// the same wall-clock values. An idle pooled connection the server closed (`wait_timeout`
    /// is the lease) fails that first statement: then a new one is opened.
    async fn sql_conn(&self, op: &'static str, name: &str) -> Result<Conn> {
        const ZONE: &str = "SET time_zone = @@global.time_zone";
        let mut conn = self.checkout().await?;
        if sqlx::query(ZONE).execute(&mut conn.conn).await.is_err() {
            conn = self.open().await?;
            sqlx::query(ZONE).execute(&mut conn.conn).await.map_err(|e| backend(op, name, e))?;
        }
        Ok(conn)
    }
}

impl Executor for Client {
    type Dialect = Dialect;
    /// Dropped unfinished, the connection is dropped, not put back: the open transaction dies
    /// with it.
    type Tx = Conn;

    fn row<'a>(&'a self, s: Statement<'a>, columns: &'a [Column]) -> BoxFuture<'a, Result<Option<Vec<Cell>>>> {
        Box::pin(async move {
            let mut conn = self.sql_conn(s.op, s.name).await?;
            let row = bound(s).fetch_optional(&mut conn.conn).await.map_err(|e| backend(s.op, s.name, e))?;
            self.put_back(conn);
            let read = |row: &sqlx::mysql::MySqlRow| {
                crate::sql::cells(columns, |i, column| match column {
                    Column::Int => row.try_get::<Option<i64>, _>(i).map(Cell::from),
                    // Text and bytes alike (a compared value is cast to bytes).
                    Column::Text => row
                        .try_get::<Option<Vec<u8>>, _>(i)
                        .map(|v| Cell::from(v.map(|b| String::from_utf8_lossy(&b).into_owned()))),
                })
            };
            row.as_ref().map(read).transpose().map_err(|e| backend(s.op, s.name, e))
        })
    }

    fn create<'a>(&'a self, table: &'a str, create: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut conn = self.sql_conn("create", table).await?;
            sqlx::query(create).execute(&mut conn.conn).await.map_err(|e| backend("create", table, e))?;
            self.put_back(conn);
            Ok(())
        })
    }

    fn begin<'a>(&'a self, s: Statement<'a>) -> BoxFuture<'a, Result<Conn>> {
        Box::pin(async move {
            let mut conn = self.sql_conn(s.op, s.name).await?;
            let begin = Some(s.sql.to_string().into());
            MySqlTransactionManager::begin(&mut conn.conn, begin).await.map_err(|e| backend(s.op, s.name, e))?;
            Ok(conn)
        })
    }

    fn execute<'a>(&'a self, tx: &'a mut Conn, s: Statement<'a>) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let done = bound(s).execute(&mut tx.conn).await.map_err(|e| backend(s.op, s.name, e))?;
            Ok(done.rows_affected())
        })
    }

    fn finish<'a>(&'a self, mut tx: Conn, commit: bool, op: &'static str, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let end = if commit {
                MySqlTransactionManager::commit(&mut tx.conn).await
            } else {
                MySqlTransactionManager::rollback(&mut tx.conn).await
            };
            end.map_err(|e| backend(op, name, e))?;
            self.put_back(tx);
            Ok(())
        })
    }
}

//! What the SQL backends share, written once over two small seams each of them implements in
//! its own folder: a [`Dialect`] (the SQL text that differs: placeholders, the upsert, the
//! server's time, the tables' types) and an [`Executor`] (a row read, a table created, a
//! statement run in a transaction, over the backend's driver). Written here: the scheduled
//! jobs' store (`jobs.rs`: the read and the compare-and-set write on ShedLock's table), making
//! a table once per client (tolerating another client making it at the same moment), and the
//! lock-name check of the backends with named locks.

pub(crate) mod jobs;

use crate::contract::BoxFuture;
use crate::{Error, Result};
use std::borrow::Cow;
use tokio::sync::OnceCell;

/// A lock name that is not empty and has at most `max` characters, or the error naming it;
/// `limit` says whose limit `max` is.
pub(crate) fn check_lock_name(name: &str, max: usize, limit: &str) -> Result<()> {
    crate::contract::check_name(name)?;
    let bad = |reason: String| Error::InvalidLockPath { path: name.to_string(), reason };
    if name.chars().count() > max {
        return Err(bad(format!("{limit} has at most {max} characters")));
    }
    Ok(())
}

/// A statement's parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param<'a> {
    Int(i64),
    Text(Cow<'a, str>),
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(s: &'a str) -> Param<'a> {
        Param::Text(Cow::Borrowed(s))
    }
}

/// How a column of a read row is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Column {
    /// A 64-bit integer.
    Int,
    /// Text (on a server that sends bytes, their UTF-8, lossily).
    Text,
}

/// A column of a read row, decoded as its [`Column`] said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Null,
    Int(i64),
    Text(String),
}

impl From<Option<i64>> for Cell {
    fn from(v: Option<i64>) -> Cell {
        v.map_or(Cell::Null, Cell::Int)
    }
}

impl From<Option<String>> for Cell {
    fn from(v: Option<String>) -> Cell {
        v.map_or(Cell::Null, Cell::Text)
    }
}

impl Cell {
    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Cell::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub(crate) fn text(self) -> Option<String> {
        match self {
            Cell::Text(s) => Some(s),
            _ => None,
        }
    }
}

/// How a dialect writes the parameters of a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placeholders {
    /// `$1`, `$2`: numbered (PostgreSQL).
    Dollar,
    /// `?1`, `?2`: numbered (SQLite).
    Numbered,
    /// `?`: one per use, bound in the order they stand.
    Positional,
}

/// The server's time as a job read takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Now {
    /// An expression for the server's time in milliseconds since the epoch.
    Sql(&'static str),
    /// A client's own reading in milliseconds (a server that is a file on this machine).
    Ms(i64),
}

/// The SQL text that differs from one server to the next. Statements here are written with
/// `$1`-style placeholders, and [`render`] writes them in the dialect's.
pub(crate) trait Dialect: Send + Sync + 'static {
    const PLACEHOLDERS: Placeholders;
    /// A query whose one row's one integer column is nonzero if table `table` is there, or
    /// `None` where the `CREATE TABLE IF NOT EXISTS` alone is asked (it is not refused to a
    /// user without the right to create tables when the table is there).
    fn exists(table: &str) -> Option<String>;
    /// ShedLock's table `shedlock`, as ShedLock's own provider makes it here.
    const CREATE_SHEDLOCK: &'static str;
    /// distlock's records of the last runs, `distlock_job_runs (name, token, record)`.
    const CREATE_RUNS: &'static str;
    /// A query of `shedlock.lock_until`'s type (its text and its precision, an integer), which
    /// [`Dialect::check_lock_until`] judges; `None`: any.
    const LOCK_UNTIL_TYPE: Option<&'static str>;
    /// The error for a `lock_until` of a type whose values ShedLock's would not match.
    fn check_lock_until(kind: &str, precision: Option<i64>) -> Result<()>;
    /// What opens a job write's transaction.
    const BEGIN: &'static str;
    /// The values of the lock row `s` as text: what a write compares.
    const LOCK_TEXT: &'static str;
    /// `a` equal to `b`, to the byte.
    fn same(a: &str, b: &str) -> String {
        format!("{a} = {b}")
    }
    /// An insert of `values` into `columns` of `table` that does nothing where the name is taken.
    fn insert_new(table: &str, columns: &str, values: &str) -> String {
        format!("INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT (name) DO NOTHING")
    }
    /// The server's time.
    fn now() -> Now;
    /// A stored time `v` as read: milliseconds (rounded up if `up`), or text that
    /// [`Dialect::time_ms`] reads.
    fn read_time(v: &str, up: bool) -> String;
    /// How [`Dialect::read_time`]'s column is decoded.
    const TIME: Column = Column::Int;
    /// Milliseconds of a read time (`up`: `lock_until`, which holds the job when it does not read).
    fn time_ms(cell: Cell, _up: bool) -> i64 {
        cell.int().unwrap_or(0)
    }
    /// A time to store from the milliseconds in parameter `p`.
    fn write_time(p: &str) -> String;
    /// The parameter a stored time `ms` is written from.
    fn time_param(ms: i64) -> Param<'static> {
        Param::Int(ms)
    }
}

/// `sql`, written with `$1`-style placeholders, in `style`'s, with `params` in the order its
/// placeholders take them.
pub(crate) fn render<'p>(style: Placeholders, sql: &str, params: &[Param<'p>]) -> (String, Vec<Param<'p>>) {
    if style == Placeholders::Dollar {
        return (sql.to_string(), params.to_vec());
    }
    let (mut out, mut bound) = (String::with_capacity(sql.len()), Vec::new());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        let Ok(n) = rest[at + 1..at + 1 + digits].parse::<usize>() else {
            // Not a placeholder (a `$` in a name or a literal).
            out.push('$');
            rest = &rest[at + 1..];
            continue;
        };
        match style {
            Placeholders::Numbered => out.push_str(&format!("?{n}")),
            _ => {
                out.push('?');
                bound.push(params[n - 1].clone());
            }
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    if style == Placeholders::Numbered {
        bound = params.to_vec();
    }
    (out, bound)
}

/// A statement with its parameters (in the dialect's placeholders), and what its errors name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Statement<'a> {
    pub(crate) op: &'static str,
    pub(crate) name: &'a str,
    pub(crate) sql: &'a str,
    pub(crate) params: &'a [Param<'a>],
}

/// A backend's statements, over its driver. Errors are returned as the crate's, naming the
/// statement's `op` and `name`.
pub(crate) trait Executor: Send + Sync + 'static {
    type Dialect: Dialect;
    /// An open transaction. Dropped unfinished (a statement failed, the future was dropped), it
    /// is rolled back: its connection is closed, or rolls back before reuse.
    type Tx: Send + 'static;
    /// The first row of `s`, its columns decoded as `columns` say.
    fn row<'a>(&'a self, s: Statement<'a>, columns: &'a [Column]) -> BoxFuture<'a, Result<Option<Vec<Cell>>>>;
    /// Runs `create`, a `CREATE … IF NOT EXISTS` of `table`; another client making it at the
    /// same moment is no error (the table is there).
    fn create<'a>(&'a self, table: &'a str, create: &'a str) -> BoxFuture<'a, Result<()>>;
    /// A transaction opened by `s` (the dialect's `BEGIN`).
    fn begin<'a>(&'a self, s: Statement<'a>) -> BoxFuture<'a, Result<Self::Tx>>;
    /// Runs `s` in `tx`: the number of rows it changed.
    fn execute<'a>(&'a self, tx: &'a mut Self::Tx, s: Statement<'a>) -> BoxFuture<'a, Result<u64>>;
    /// Commits `tx` (`commit`) or rolls it back; errors name `op` and `name`.
    fn finish<'a>(&'a self, tx: Self::Tx, commit: bool, op: &'static str, name: &'a str) -> BoxFuture<'a, Result<()>>;
}

/// A row's cells, each read by `read` (its index and how to decode it).
pub(crate) fn cells<E>(
    columns: &[Column],
    read: impl Fn(usize, Column) -> std::result::Result<Cell, E>,
) -> std::result::Result<Vec<Cell>, E> {
    columns.iter().enumerate().map(|(i, c)| read(i, *c)).collect()
}

/// Makes sure of `tables` (each a name and its `CREATE … IF NOT EXISTS`) once for `created`:
/// see [`create`].
pub(crate) async fn create_once<E: Executor>(exec: &E, created: &OnceCell<()>, tables: &[(&str, &str)]) -> Result<()> {
    created.get_or_try_init(|| create(exec, tables)).await.copied()
}

/// Creates each of `tables` (a name and its `CREATE … IF NOT EXISTS`) that is missing: a user
/// without the right to create tables can use ones made for it, and two clients creating one at
/// the same moment both go on.
pub(crate) async fn create<E: Executor>(exec: &E, tables: &[(&str, &str)]) -> Result<()> {
    for &(table, create) in tables {
        let there = match E::Dialect::exists(table) {
            Some(sql) => {
                let row =
                    exec.row(Statement { op: "create", name: table, sql: &sql, params: &[] }, &[Column::Int]).await?;
                row.and_then(|r| r.first().and_then(Cell::int)).is_some_and(|n| n != 0)
            }
            None => false,
        };
        if !there {
            exec.create(table, create).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders() {
        let params = [Param::from("job"), Param::Int(7)];
        let sql = "SELECT $2 FROM t WHERE a = $1 AND b = $1";
        assert_eq!(render(Placeholders::Dollar, sql, &params), (sql.to_string(), params.to_vec()));
        assert_eq!(
            render(Placeholders::Numbered, sql, &params),
            ("SELECT ?2 FROM t WHERE a = ?1 AND b = ?1".to_string(), params.to_vec())
        );
        assert_eq!(
            render(Placeholders::Positional, sql, &params),
            (
                "SELECT ? FROM t WHERE a = ? AND b = ?".to_string(),
                vec![params[1].clone(), params[0].clone(), params[0].clone()]
            )
        );
    }
}

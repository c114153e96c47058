//! Optimistic locking on a database row: an `account` row (balance 1000, version 1), and
//! two sessions that both read it before either writes. Session 1 adds 100, session 2 takes 50.
//! Session 1's `UPDATE … WHERE id = 1 AND version = 1` changes the row; session 2's finds the
//! version moved on and updates nothing: a conflict. Instead of losing session 1's update (a lost
//! update would leave 950) or giving up, it reads again (balance 1100, version 2) and writes 1050.
//!
//! Run: `cargo run --example optimistic_account -- postgres://postgres@127.0.0.1:5432/postgres`,
//! or `-- sqlite:///tmp/bank.db` (or set DISTLOCK_BACKEND to such a URL); with neither, a SQLite
//! file in a temporary directory, so it needs no server. The table is made for the run and dropped.

use distlock::optimistic::{optimistic_update, Updated};
use std::sync::Arc;
use tokio::sync::Barrier;

/// One session's connection: PostgreSQL or SQLite, the same two statements on either.
enum Db {
    Postgres(tokio_postgres::Client),
    Sqlite(tokio::sync::Mutex<sqlx::SqliteConnection>),
}

/// A database error from either driver, as text.
#[derive(Debug)]
struct DbError(String);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbError {}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> DbError {
        DbError(e.to_string())
    }
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> DbError {
        DbError(e.to_string())
    }
}

impl Db {
    async fn connect(url: &str) -> Db {
        if url.starts_with("sqlite:") {
            use sqlx::Connection;
            let conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc")).await.expect("open the database");
            return Db::Sqlite(tokio::sync::Mutex::new(conn));
        }
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        Db::Postgres(client)
    }

    /// Runs statements that return nothing.
    async fn run(&self, sql: &str) -> Result<(), DbError> {
        match self {
            Db::Postgres(c) => c.batch_execute(sql).await?,
            Db::Sqlite(c) => {
                sqlx::raw_sql(sql).execute(&mut *c.lock().await).await?;
            }
        }
        Ok(())
    }

    /// The account's balance and version.
    async fn read(&self, table: &str) -> Result<(i64, i64), DbError> {
        let sql = format!("SELECT balance, version FROM {table} WHERE id = 1");
        Ok(match self {
            Db::Postgres(c) => {
                let row = c.query_one(&sql, &[]).await?;
                (row.get(0), row.get(1))
            }
            Db::Sqlite(c) => sqlx::query_as(&sql).fetch_one(&mut *c.lock().await).await?,
        })
    }

    /// The optimistic write: rows changed (1, or 0 when the version moved on).
    async fn write(&self, table: &str, balance: i64, version: i64) -> Result<u64, DbError> {
        let sql = format!("UPDATE {table} SET balance = $1, version = version + 1 WHERE id = 1 AND version = $2");
        Ok(match self {
            Db::Postgres(c) => c.execute(&sql, &[&balance, &version]).await?,
            Db::Sqlite(c) => {
                let q = sqlx::query(&sql).bind(balance).bind(version);
                q.execute(&mut *c.lock().await).await?.rows_affected()
            }
        })
    }
}

#[tokio::main]
async fn main() {
    let given = std::env::args().nth(1).or_else(|| std::env::var("DISTLOCK_BACKEND").ok()).unwrap_or_default();
    let scratch = std::env::temp_dir().join(format!("distlock-account-{}", uuid::Uuid::new_v4().simple()));
    let url = match given.as_str() {
        "" => {
            std::fs::create_dir_all(&scratch).expect("a temporary directory");
            format!("sqlite://{}/bank.db", scratch.display())
        }
        u if u.starts_with("postgres") || u.starts_with("sqlite:") => u.to_string(),
        u => {
            eprintln!("optimistic_account: {u:?} is neither a postgres:// nor a sqlite:// URL");
            std::process::exit(2);
        }
    };
    println!("account on {}", url.split('?').next().unwrap_or(&url));
    let table = format!("account_{}", uuid::Uuid::new_v4().simple());
    let admin = Db::connect(&url).await;
    admin
        .run(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, balance bigint NOT NULL, version bigint NOT NULL); \
             INSERT INTO {table} VALUES (1, 1000, 1)"
        ))
        .await
        .expect("create the account table");
    // Both sessions read before either writes.
    let both_read = Arc::new(Barrier::new(2));
    let session = |name: &'static str, delta: i64| {
        let (url, table, both_read) = (url.clone(), table.clone(), both_read.clone());
        tokio::spawn(async move {
            let db = Db::connect(&url).await;
            let first = std::sync::atomic::AtomicBool::new(true);
            let updated = optimistic_update(
                5,
                || async {
                    let read = db.read(&table).await?;
                    println!("{name}: read balance {} version {}", read.0, read.1);
                    if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        both_read.wait().await;
                    }
                    Ok::<_, DbError>(read)
                },
                |balance: &i64| Some(balance + delta),
                |new: &i64, version: i64| {
                    let (db, table, new) = (&db, &table, *new);
                    async move {
                        let n = db.write(table, new, version).await?;
                        println!("{name}: UPDATE … WHERE version = {version} changed {n} row(s)");
                        Ok(n == 1)
                    }
                },
            )
            .await
            .expect("the update succeeds within 5 attempts")
            .expect("always computes a value");
            (name, updated)
        })
    };
    let (a, b) = (session("session 1 (+100)", 100), session("session 2 (-50)", -50));
    let results: Vec<(&str, Updated<i64>)> = vec![a.await.unwrap(), b.await.unwrap()];
    for (name, u) in &results {
        println!("{name}: wrote {} as version {} after {} attempt(s)", u.value, u.version, u.attempts);
    }
    let (balance, version) = admin.read(&table).await.unwrap();
    println!("final balance {balance}, version {version}");
    admin.run(&format!("DROP TABLE {table}")).await.unwrap();
    let _ = std::fs::remove_dir_all(&scratch);
    let mut attempts: Vec<u32> = results.iter().map(|(_, u)| u.attempts).collect();
    attempts.sort();
    assert_eq!((balance, version), (1050, 3), "both updates count, neither is lost");
    assert_eq!(attempts, vec![1, 2], "one session wrote at once, the other conflicted once and retried");
}

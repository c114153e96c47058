//! The seeds' optimistic lock on a database row: an `account` row (balance 1000, version 1), and
//! two sessions that both read it before either writes. Session 1 adds 100, session 2 takes 50.
//! Session 1's `UPDATE … WHERE id = 1 AND version = 1` changes the row; session 2's finds the
//! version moved on and updates nothing: a conflict. Instead of losing session 1's update (the
//! seed's 950) or giving up, it reads again (balance 1100, version 2) and writes 1050.
//!
//! Run: `cargo run --example optimistic_account -- postgres://postgres@127.0.0.1:5432/postgres`
//! (or set DISTLOCK_BACKEND to a postgres:// URL). The table is made for the run and dropped.

use distlock::optimistic::{optimistic_update, Updated};
use std::sync::Arc;
use tokio::sync::Barrier;

#[tokio::main]
async fn main() {
    let url = std::env::args().nth(1).or_else(|| std::env::var("DISTLOCK_BACKEND").ok()).unwrap_or_default();
    if !url.starts_with("postgres") {
        eprintln!("usage: optimistic_account postgres://user@host:port/db (or DISTLOCK_BACKEND)");
        std::process::exit(2);
    }
    let table = format!("account_{}", uuid::Uuid::new_v4().simple());
    let admin = connect(&url).await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, balance bigint NOT NULL, version bigint NOT NULL); \
             INSERT INTO {table} VALUES (1, 1000, 1)"
        ))
        .await
        .expect("create the account table");
    // Both sessions read before either writes, as in the seed.
    let both_read = Arc::new(Barrier::new(2));
    let session = |name: &'static str, delta: i64| {
        let (url, table, both_read) = (url.clone(), table.clone(), both_read.clone());
        tokio::spawn(async move {
            let db = connect(&url).await;
            let first = std::sync::atomic::AtomicBool::new(true);
            let updated = optimistic_update(
                5,
                || async {
                    let row = db.query_one(&format!("SELECT balance, version FROM {table} WHERE id = 1"), &[]).await?;
                    let read: (i64, i64) = (row.get(0), row.get(1));
                    println!("{name}: read balance {} version {}", read.0, read.1);
                    if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        both_read.wait().await;
                    }
                    Ok::<_, tokio_postgres::Error>(read)
                },
                |balance: &i64| Some(balance + delta),
                |new: &i64, version: i64| {
                    let (db, table, new) = (&db, &table, *new);
                    async move {
                        let sql = format!(
                            "UPDATE {table} SET balance = $1, version = version + 1 WHERE id = 1 AND version = $2"
                        );
                        let n = db.execute(&sql, &[&new, &version]).await?;
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
    let row = admin.query_one(&format!("SELECT balance, version FROM {table} WHERE id = 1"), &[]).await.unwrap();
    let (balance, version): (i64, i64) = (row.get(0), row.get(1));
    println!("final balance {balance}, version {version}");
    admin.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
    let mut attempts: Vec<u32> = results.iter().map(|(_, u)| u.attempts).collect();
    attempts.sort();
    assert_eq!((balance, version), (1050, 3), "both updates count, neither is lost");
    assert_eq!(attempts, vec![1, 2], "one session wrote at once, the other conflicted once and retried");
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

//! Elections on MariaDB, in distlock's own layout: a candidate takes the election's
//! `GET_LOCK(name)` (the mutex, on a connection of its own), then announces its value in
//! `distlock_leaders (name, conn, token, value)`, only while `IS_USED_LOCK(name)` is its
//! connection. The leader is the holder whose connection the announcement names (a holder not
//! yet announced is not a leader yet); the epoch is its fencing token. MariaDB keeps no holder's
//! token (the fencing sequence is global), so an announcement is refused only when its token is
//! lower than the one announced already. Names are stored as bytes (`VARBINARY`), compared
//! exactly, and each check asks `IS_USED_LOCK` for the name as given.

use super::{backend, Client};
use crate::contract::{self, Ballot, BoxFuture, Recipe};
use crate::election::{Announcing, Leader};
use crate::{Error, LostReason, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// An election's side on MariaDB.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) name: String,
    /// The leaders' table, made sure of on first use.
    pub(crate) created: Arc<OnceCell<()>>,
}

const CREATE: &str = "CREATE TABLE IF NOT EXISTS distlock_leaders (name VARBINARY(256) NOT NULL PRIMARY KEY, \
     conn BIGINT UNSIGNED NOT NULL, token BIGINT NOT NULL, value MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL) \
     DEFAULT CHARSET = utf8mb4";

type Statement<'c, T> = Pin<Box<dyn Future<Output = sqlx::Result<T>> + Send + 'c>>;

impl Election {
    /// Runs `f` on a connection of the client's, after making sure of the table. A pooled
    /// connection may have been closed by the server while idle (`wait_timeout` is the lease):
    /// on an error the statement runs once more on a new connection (every statement here may
    /// run twice).
    async fn on_conn<T, F>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: for<'c> Fn(&'c mut sqlx::MySqlConnection) -> Statement<'c, T>,
    {
        crate::sql::create_once(&self.client, &self.created, &[("distlock_leaders", CREATE)]).await?;
        let mut conn = self.client.checkout().await?;
        let first = match f(&mut conn.conn).await {
            Ok(out) => {
                self.client.put_back(conn);
                return Ok(out);
            }
            Err(e) => e,
        };
        drop(conn);
        tracing::debug!(error = %first, op, "election statement failed; once more on a new connection");
        let mut conn = self.client.open().await?;
        let out = f(&mut conn.conn).await.map_err(|e| backend(op, &self.name, e))?;
        self.client.put_back(conn);
        Ok(out)
    }
}

impl Ballot for Election {
    fn name(&self) -> &str {
        &self.name
    }

    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe> {
        let lock = contract::lock(self.client.mutex(&self.name).expect("the name was checked"));
        Arc::new(Announcing { lock, ballot: Arc::new(self.clone()), value })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            let name = self.name.clone();
            let row: Option<(String, i64, u64)> = self
                .on_conn("leader", move |c| {
                    let name = name.clone();
                    Box::pin(async move {
                        sqlx::query_as(
                            "SELECT value, token, conn FROM distlock_leaders WHERE name = ? AND conn = IS_USED_LOCK(?)",
                        )
                        .bind(name.as_bytes())
                        .bind(&name)
                        .fetch_optional(c)
                        .await
                    })
                })
                .await?;
            Ok(row.map(|(value, epoch, conn)| Leader { value, epoch: epoch as u64, key: format!("connection:{conn}") }))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let lost = || Error::LockLost { lock: self.name.clone(), reason: LostReason::ConnectionClosed };
            // The holder's mark is its lock connection's id.
            let Some(conn) = holder_id.strip_prefix("connection:").and_then(|id| id.parse::<u64>().ok()) else {
                return Err(lost());
            };
            let name = self.name.clone();
            let announced: bool = self
                .on_conn("proclaim", move |c| {
                    let (name, value) = (name.clone(), value.clone());
                    Box::pin(async move {
                        // Tokens rise from one holder to the next: an older one never overwrites.
                        sqlx::query(
                            "INSERT INTO distlock_leaders (name, conn, token, value) \
                             SELECT ?, ?, ?, ? FROM DUAL WHERE IS_USED_LOCK(?) = ? \
                             ON DUPLICATE KEY UPDATE \
                             value = IF(token <= VALUES(token), VALUES(value), value), \
                             conn = IF(token <= VALUES(token), VALUES(conn), conn), \
                             token = IF(token <= VALUES(token), VALUES(token), token)",
                        )
                        .bind(name.as_bytes())
                        .bind(conn)
                        .bind(token as i64)
                        .bind(value.as_ref())
                        .bind(&name)
                        .bind(conn)
                        .execute(&mut *c)
                        .await?;
                        // Whether it is there now (the affected-row count cannot tell: with
                        // CLIENT_FOUND_ROWS an upsert that kept the old row counts as one).
                        let there: Option<i64> = sqlx::query_scalar(
                            "SELECT 1 FROM distlock_leaders WHERE name = ? AND conn = ? AND token = ? \
                             AND IS_USED_LOCK(?) = conn",
                        )
                        .bind(name.as_bytes())
                        .bind(conn)
                        .bind(token as i64)
                        .bind(&name)
                        .fetch_optional(&mut *c)
                        .await?;
                        Ok(there.is_some())
                    })
                })
                .await?;
            if announced {
                Ok(())
            } else {
                Err(lost())
            }
        })
    }
}

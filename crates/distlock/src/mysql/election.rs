//! Elections on MariaDB, in distlock's own layout: a candidate takes the election's
//! `GET_LOCK(name)` (the mutex, on a connection of its own), then announces its value in
//! `distlock_leaders (name, conn, token, value)`, only while `IS_USED_LOCK(name)` is its
//! connection. The leader is the holder whose connection the announcement names (a holder not
//! yet announced is not a leader yet); the epoch is its fencing token. MariaDB keeps no holder's
//! token (the fencing sequence is global), so an announcement from the holding connection is
//! refused only when its token is lower than the one announced on that connection.

use super::{backend, Client};
use crate::contract::{self, Ballot, BoxFuture, Recipe};
use crate::election::{Announcing, Leader};
use crate::{Error, LostReason, Result};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// An election's side on MariaDB.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) name: String,
    /// The leaders' table, created on first use.
    pub(crate) created: Arc<OnceCell<()>>,
}

const CREATE: &str = "CREATE TABLE IF NOT EXISTS distlock_leaders (name VARCHAR(64) NOT NULL PRIMARY KEY, \
     conn BIGINT UNSIGNED NOT NULL, token BIGINT NOT NULL, value MEDIUMTEXT NOT NULL)";

impl Election {
    /// Runs `f` on a connection of the client's, after creating the table on first use.
    async fn on_conn<T, F>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: for<'c> FnOnce(
            &'c mut sqlx::MySqlConnection,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = sqlx::Result<T>> + Send + 'c>>,
    {
        let mut conn = self.client.checkout().await?;
        if self.created.get().is_none() {
            sqlx::query(CREATE).execute(&mut conn.conn).await.map_err(|e| backend("create", &self.name, e))?;
            let _ = self.created.set(());
        }
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
                    Box::pin(async move {
                        sqlx::query_as(
                            "SELECT value, token, conn FROM distlock_leaders WHERE name = ? AND conn = IS_USED_LOCK(name)",
                        )
                        .bind(name)
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
                    Box::pin(async move {
                        sqlx::query(
                            "INSERT INTO distlock_leaders (name, conn, token, value) \
                             SELECT ?, ?, ?, ? FROM DUAL WHERE IS_USED_LOCK(?) = ? \
                             ON DUPLICATE KEY UPDATE \
                             value = IF(conn <> VALUES(conn) OR token <= VALUES(token), VALUES(value), value), \
                             token = IF(conn <> VALUES(conn) OR token <= VALUES(token), VALUES(token), token), \
                             conn = VALUES(conn)",
                        )
                        .bind(&name)
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
                             AND IS_USED_LOCK(name) = conn",
                        )
                        .bind(&name)
                        .bind(conn)
                        .bind(token as i64)
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

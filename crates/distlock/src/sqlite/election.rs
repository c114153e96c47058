//! Elections on SQLite, in distlock's own layout: a candidate takes the election's row of the
//! lease table (the mutex), then announces its value in `<table>_leaders (name, fencing_token,
//! value)`, only while its lease row is its own with that token. The leader is the live lease
//! row's holder whose announcement carries the row's token (a holder not yet announced, or one
//! whose lease ran out, is not a leader); the epoch is the row's fencing token.

use super::{backend, Client, NOW};
use crate::contract::{self, Ballot, BoxFuture, Recipe};
use crate::election::{Announcing, Leader};
use crate::{Error, LostReason, Result};
use std::sync::Arc;
use tokio::sync::OnceCell;

/// An election's side on SQLite.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) name: String,
    /// The leaders' table, created on first use.
    pub(crate) created: Arc<OnceCell<()>>,
}

impl Election {
    fn table(&self) -> &str {
        &self.client.url().table
    }

    async fn created(&self) -> Result<()> {
        let t = self.table();
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {t}_leaders (name VARCHAR(64) NOT NULL PRIMARY KEY, \
             fencing_token BIGINT NOT NULL, value TEXT NOT NULL)"
        );
        crate::sql::create_once(&self.client, &self.created, &[(&format!("{t}_leaders"), &create)]).await
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
            self.created().await?;
            let t = self.table();
            let sql = format!(
                "SELECT v.value, l.fencing_token, l.locked_by FROM {t} l JOIN {t}_leaders v \
                 ON v.name = l.name AND v.fencing_token = l.fencing_token \
                 WHERE l.name = ?1 AND l.lock_until > {NOW}"
            );
            let row: Option<(String, i64, String)> = sqlx::query_as(&sql)
                .bind(&self.name)
                .fetch_optional(self.client.pool())
                .await
                .map_err(|e| backend("leader", &self.name, e))?;
            Ok(row.map(|(value, epoch, key)| Leader { value, epoch: epoch as u64, key }))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.created().await?;
            let t = self.table();
            let sql = format!(
                "INSERT INTO {t}_leaders (name, fencing_token, value) \
                 SELECT name, fencing_token, ?3 FROM {t} \
                 WHERE name = ?1 AND fencing_token = ?2 AND locked_by = ?4 AND lock_until > {NOW} \
                 ON CONFLICT (name) DO UPDATE SET fencing_token = excluded.fencing_token, value = excluded.value"
            );
            let done = sqlx::query(&sql)
                .bind(&self.name)
                .bind(token as i64)
                .bind(value.as_ref())
                .bind(&holder_id)
                .execute(self.client.pool())
                .await
                .map_err(|e| backend("proclaim", &self.name, e))?;
            if done.rows_affected() == 1 {
                Ok(())
            } else {
                Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::KeyDeleted })
            }
        })
    }
}

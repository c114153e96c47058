//! Elections on PostgreSQL, in distlock's own layout: a candidate takes the election's advisory
//! lock (the mutex, on a connection of its own), then announces itself from that connection in
//! `distlock_leaders (name, pid, token, value)`: its `pg_backend_pid()`, its fencing token and
//! its value. The leader is the announcement whose pid holds the advisory lock now (`pg_locks`);
//! a holder not yet announced is not a leader yet. The epoch is the fencing token. A proclaim
//! changes the value only while the announcement is this leadership's (its token) and its pid
//! still holds the lock.
//!
//! The campaign is `election::Announcing`, as on the other SQL backends; what stays here is the
//! announcement itself ([`Ballot::announce`]), which is not a proclaim: it names the holding
//! connection's `pg_backend_pid()`, so it runs on that connection, which only the guard has.

use super::{backend, AdvisoryKey, Client, MutexGuard};
use crate::contract::{self, Ballot, BoxFuture, Held, Recipe};
use crate::election::{Announcing, Leader};
use crate::{Error, LostReason, Result};
use std::sync::Arc;
use tokio::sync::OnceCell;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS distlock_leaders (name TEXT PRIMARY KEY, pid INT NOT NULL, \
     token BIGINT NOT NULL, value TEXT NOT NULL)";

/// The announcement, run on the holding connection.
const ANNOUNCE: &str = "INSERT INTO distlock_leaders (name, pid, token, value) VALUES ($1, pg_backend_pid(), $2, $3) \
     ON CONFLICT (name) DO UPDATE SET pid = excluded.pid, token = excluded.token, value = excluded.value \
     WHERE distlock_leaders.token <= excluded.token";

/// The holders of an advisory key ($ placeholders from `first`).
fn holders(first: usize) -> String {
    format!(
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = ${} \
         AND l.objid::bigint = ${} AND l.objsubid::bigint = ${}",
        first,
        first + 1,
        first + 2
    )
}

/// An election's side on PostgreSQL.
#[derive(Debug, Clone)]
pub(crate) struct Election {
    client: Client,
    name: String,
    key: AdvisoryKey,
    created: Arc<OnceCell<()>>,
}

impl Election {
    pub(crate) fn new(client: Client, name: &str) -> Result<Election> {
        let key = client.key(name)?;
        Ok(Election { client, name: name.to_string(), key, created: Arc::default() })
    }

    async fn created(&self) -> Result<()> {
        crate::sql::create_once(&self.client, &self.created, &[("distlock_leaders", CREATE)]).await
    }

    /// Runs a statement on a connection of the client's, with the key's `pg_locks` ids after
    /// `params`.
    async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        self.created().await?;
        let (classid, objid, objsubid) = self.key.pg_locks_ids();
        let mut all = params.to_vec();
        all.extend([&classid as &(dyn tokio_postgres::types::ToSql + Sync), &objid, &objsubid]);
        let conn = self.client.statement_conn().await?;
        conn.client.query(sql, &all).await.map_err(|e| backend(op, &self.name, e))
    }

    /// Announces `value` from the connection that holds `guard`.
    async fn announce_from(&self, guard: &MutexGuard, value: &str) -> Result<()> {
        self.created().await?;
        let token = guard.fencing_token() as i64;
        match guard.on_own_connection(ANNOUNCE, &[&self.name, &token, &value]).await {
            Ok(1) => Ok(()),
            // A later leader announced already: this grant is not the leader any more.
            Ok(_) => Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::ConnectionClosed }),
            Err(e) if guard.state().is_lost() => {
                tracing::debug!(error = %e, "announcement failed with the lock lost");
                Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::ConnectionClosed })
            }
            Err(e) => Err(backend("announce", &self.name, e)),
        }
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

    fn announce<'a>(&'a self, held: &'a dyn Held, value: Arc<str>) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let guard = held.as_any().downcast_ref::<MutexGuard>().expect("a candidate's grant is its mutex's");
            self.announce_from(guard, &value).await
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            let sql = format!("SELECT value, token FROM distlock_leaders WHERE name = $1 AND pid IN ({})", holders(2));
            let rows = self.query("leader", &sql, &[&self.name]).await?;
            // The mark is the guard's (`advisory:<key>`); the holder's pid is in `inspect`.
            Ok(rows.first().map(|r| Leader {
                value: r.get(0),
                epoch: r.get::<_, i64>(1) as u64,
                key: format!("advisory:{}", self.key),
            }))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // Every holder's mark is the key's; the token and the holding pid tell them apart.
            if holder_id != format!("advisory:{}", self.key) {
                return Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::ConnectionClosed });
            }
            let sql = format!(
                "UPDATE distlock_leaders SET value = $3 WHERE name = $1 AND token = $2 AND pid IN ({}) RETURNING 1",
                holders(4)
            );
            let token = token as i64;
            let rows = self.query("proclaim", &sql, &[&self.name, &token, &value.as_ref()]).await?;
            if rows.is_empty() {
                Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::ConnectionClosed })
            } else {
                Ok(())
            }
        })
    }
}

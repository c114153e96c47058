//! Who holds and who waits for a lock, from `pg_locks`.

use super::{backend, AdvisoryKey, Client, FENCING_SEQUENCE};
use crate::Result;

/// A lock as the server sees it, from [`Client::inspect`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(pg: distlock::postgres::Client) -> distlock::Result<()> {
/// let view = pg.inspect("orders").await?;
/// for s in &view.sessions {
///     println!("pid {} {} {}", s.pid, s.mode, if s.granted { "holds" } else { "waits" });
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LockView {
    /// The lock's name.
    pub name: String,
    /// Its advisory key.
    pub key: AdvisoryKey,
    /// Holders first, then waiters in the order they began to wait.
    pub sessions: Vec<Session>,
    /// The last fencing token handed out on this database (one sequence serves every lock, so
    /// the holder's token is at most this).
    pub last_token: Option<u64>,
}

/// One session holding or waiting for the lock.
///
/// # Examples
///
/// ```
/// let s = distlock::postgres::Session {
///     pid: 4242, mode: "exclusive".into(), granted: true,
///     application_name: "distlock".into(), client_addr: Some("127.0.0.1".into()),
/// };
/// assert!(s.granted);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Session {
    /// The backend's process id (`pg_terminate_backend(pid)` ends it and frees its locks).
    pub pid: i32,
    /// `exclusive` (a mutex or writer) or `shared` (a reader).
    pub mode: String,
    /// Holds it (`true`) or waits for it.
    pub granted: bool,
    /// The session's `application_name`.
    pub application_name: String,
    /// The client's address, if over TCP.
    pub client_addr: Option<String>,
}

impl Client {
    /// Who holds and who waits for lock `name` now.
    pub async fn inspect(&self, name: &str) -> Result<LockView> {
        let key = self.key(name)?;
        let conn = self.checkout().await?;
        let (classid, objid, objsubid) = key.pg_locks_ids();
        let rows = conn
            .client
            .query(
                "SELECT l.pid, l.mode, l.granted, coalesce(a.application_name, ''), host(a.client_addr) \
                 FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.classid::bigint = $1 AND l.objid::bigint = $2 \
                 AND l.objsubid::bigint = $3 ORDER BY l.granted DESC, l.waitstart NULLS FIRST, l.pid",
                &[&classid, &objid, &objsubid],
            )
            .await
            .map_err(|e| backend("inspect", name, e))?;
        let token = conn
            .client
            .query_opt(&format!("SELECT last_value FROM {FENCING_SEQUENCE} WHERE is_called"), &[])
            .await
            .map_err(|e| backend("inspect", name, e))?;
        self.put_back(conn);
        let sessions = rows
            .iter()
            .map(|r| Session {
                pid: r.get(0),
                mode: if r.get::<_, String>(1) == "ShareLock" { "shared" } else { "exclusive" }.to_string(),
                granted: r.get(2),
                application_name: r.get(3),
                client_addr: r.get(4),
            })
            .collect();
        Ok(LockView { name: name.to_string(), key, sessions, last_token: token.map(|r| r.get::<_, i64>(0) as u64) })
    }
}

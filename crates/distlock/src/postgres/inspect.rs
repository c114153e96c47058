//! Who holds and who waits for a lock, from `pg_locks`.

use super::{backend, AdvisoryKey, Client, FENCING_GUARD, FENCING_SEQUENCE};
use crate::listing::{Entry, Found, Listing, LockInfo, MAX_LOCKS};
use crate::{Error, Result};

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
#[non_exhaustive]
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
        self.session_scope_only(&format!("inspecting {name}"))?;
        let key = self.key(name)?;
        let conn = self.statement_conn().await?;
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

impl Client {
    /// The lock `name` in the neutral shape of [`Client::locks`], from [`Client::inspect`]: its
    /// sessions, holders first, and its last fencing token (for [`crate::Client::inspect`]).
    pub(crate) async fn one_lock(&self, name: &str) -> Result<Listing> {
        let view = self.inspect(name).await?;
        let rw = view.sessions.iter().any(|s| s.mode == "shared");
        let entries = view
            .sessions
            .iter()
            .map(|s| {
                let mode = match (s.mode.as_str(), rw) {
                    ("shared", _) => "read",
                    (_, true) => "write",
                    _ => "exclusive",
                };
                let addr = s.client_addr.clone().unwrap_or_else(|| "local".into());
                let owner =
                    if s.application_name.is_empty() { addr } else { format!("{addr} ({})", s.application_name) };
                Entry::new(s.granted, mode, owner, format!("backend pid {} on advisory key {}", s.pid, view.key))
            })
            .collect();
        let recipe = if rw { "rwlock" } else { "mutex" };
        let found = match entries {
            _ if view.sessions.is_empty() => Found::Free { recipe, last_token: view.last_token },
            entries => Found::Lock(LockInfo {
                name: view.name,
                recipe: recipe.into(),
                permits: None,
                last_token: view.last_token,
                entries,
            }),
        };
        Ok(Listing::one(
            "postgres",
            name,
            found,
            vec![
                "hold times and each holder's token: one sequence serves every lock".into(),
                "a semaphore's permits: each is an advisory key of its own, not found by the name".into(),
            ],
        ))
    }

    /// Every advisory lock held or awaited in this database, by key: PostgreSQL records the key
    /// (a hash of the name), not the name, so only the empty prefix can be listed. Holders first,
    /// then waiters in the order they began to wait.
    pub async fn locks(&self, prefix: &str) -> Result<Listing> {
        self.session_scope_only("listing the locks")?;
        if !prefix.is_empty() {
            return Err(Error::Unsupported {
                backend: "postgres",
                what: format!(
                    "listing by name prefix {prefix:?}: pg_locks records advisory keys (hashes of names), not \
                     names; list with an empty prefix, or inspect one lock by name"
                ),
            });
        }
        let conn = self.statement_conn().await?;
        let rows = conn
            .client
            .query(
                "SELECT l.classid::bigint, l.objid::bigint, l.objsubid::int, l.pid, l.mode, l.granted, \
                 coalesce(a.application_name, ''), host(a.client_addr), a.client_port, \
                 (extract(epoch FROM now() - l.waitstart) * 1000)::bigint \
                 FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 ORDER BY l.classid, l.objid, l.objsubid, l.granted DESC, l.waitstart NULLS FIRST, l.pid",
                &[],
            )
            .await
            .map_err(|e| backend("list locks", "pg_locks", e))?;
        let guard = AdvisoryKey::Pair(FENCING_GUARD.0, FENCING_GUARD.1).pg_locks_ids();
        let mut listing = Listing {
            backend: "postgres",
            prefix: String::new(),
            locks: vec![],
            truncated: false,
            unseen: vec![
                "names: pg_locks records advisory keys (hashes of names); a lock is shown by its key".into(),
                "hold times and per-lock fencing tokens: one sequence serves every lock".into(),
            ],
        };
        for r in rows {
            let ids = (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i32>(2) as i64);
            if ids == guard || (ids.0 == super::KIND_MARKER_CLASS as u32 as i64 && ids.2 == 2) {
                continue; // the fencing guard and the kind markers are no locks of their own
            }
            let key = match ids.2 {
                1 => AdvisoryKey::Single((ids.0 << 32) | ids.1),
                _ => AdvisoryKey::Pair(ids.0 as u32 as i32, ids.1 as u32 as i32),
            };
            let name = format!("advisory key {key}");
            let shared = r.get::<_, String>(4) == "ShareLock";
            let granted: bool = r.get(5);
            let app: String = r.get(6);
            let addr = match (r.get::<_, Option<String>>(7), r.get::<_, Option<i32>>(8)) {
                (Some(host), Some(port)) if port > 0 => format!("{host}:{port}"),
                (Some(host), _) => host,
                (None, _) => "local".into(),
            };
            let owner = if app.is_empty() { addr } else { format!("{addr} ({app})") };
            let mut e = Entry::new(
                granted,
                if shared { "read" } else { "exclusive" },
                owner,
                format!("backend pid {}", r.get::<_, i32>(3)),
            );
            e.since_ms = r.get::<_, Option<i64>>(9).map(|ms| ms.max(0) as u64);
            if listing.locks.last().is_none_or(|l| l.name != name) {
                if listing.locks.len() == MAX_LOCKS {
                    listing.truncated = true;
                    break;
                }
                listing.locks.push(LockInfo {
                    name,
                    recipe: "mutex".into(),
                    permits: None,
                    last_token: None,
                    entries: vec![],
                });
            }
            let lock = listing.locks.last_mut().expect("pushed above");
            if shared {
                lock.recipe = "rwlock".into();
            }
            lock.entries.push(e);
        }
        for lock in listing.locks.iter_mut().filter(|l| l.recipe == "rwlock") {
            lock.entries.iter_mut().filter(|e| e.mode == "exclusive").for_each(|e| e.mode = "write".into());
        }
        Ok(listing)
    }
}

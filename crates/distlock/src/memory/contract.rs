//! The one lock contract ([`crate::contract`]) on the in-process store: every lock kind, the
//! listing, elections (a mutex whose holder announces a value) and jobs (rows compared by
//! version).

use super::lock::MemLock;
use super::store::{JobRow, LockRow};
use super::Client;
use crate::contract::{self, Ballot, BoxFuture, JobLock, JobRead, Jobs, Kind, Leader, Recipe, Run, Seen, Watched};
use crate::election::Announcing;
use crate::listing::{Entry, Found, Listing, LockInfo, MAX_LOCKS};
use crate::{Error, LostReason, Result};
use std::sync::Arc;
use tokio::time::Instant;

crate::contract::backend!(Client);

impl contract::Backend for Client {
    fn backend(&self) -> &'static str {
        "memory"
    }

    fn lease(&self) -> std::time::Duration {
        Client::lease(self)
    }

    fn lock_name(&self, name: &str) -> Result<String> {
        self.checked_name(name)
    }

    fn recipe(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        self.make(name, kind)
    }

    fn locks<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Listing>> {
        Box::pin(Client::locks(self, prefix))
    }

    fn lock<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Listing>> {
        Box::pin(Client::one_lock(self, name))
    }

    fn election(&self, name: &str) -> Result<Arc<dyn Ballot>> {
        Ok(Arc::new(Election { client: self.clone(), name: self.checked_name(name)? }))
    }

    fn jobs(&self) -> Result<Arc<dyn Jobs>> {
        Ok(Arc::new(self.clone()))
    }

    fn close(&self, bound: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(self.clone().close(bound))
    }
}

impl Client {
    fn checked_name(&self, name: &str) -> Result<String> {
        crate::contract::check_name(name)?;
        let bad = |reason: &str| Error::InvalidLockPath { path: name.to_string(), reason: reason.into() };
        if name.len() > 1024 {
            return Err(bad("an in-process store's lock name has at most 1024 bytes"));
        }
        Ok(name.to_string())
    }

    fn make(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>> {
        // A semaphore of no permits is refused above the backends (`Client::make`).
        Ok(contract::lock(MemLock { client: self.clone(), name: self.checked_name(name)?, kind }))
    }

    /// The lock `name` in the neutral shape (free: no entries, with its last token).
    pub(crate) async fn one_lock(&self, name: &str) -> Result<Listing> {
        self.reach("inspect", name)?;
        let found = self.store.read(|s, now| match s.locks.get(name) {
            Some(row) if !row.in_use(now) => Found::Free { recipe: "mutex", last_token: Some(row.last_token) },
            Some(row) => Found::Lock(row.info(name, now)),
            None => Found::Free { recipe: "mutex", last_token: None },
        });
        Ok(Listing::one("memory", name, found, vec![]))
    }

    /// Every lock in use whose name starts with `prefix`, holders first, then waiters in queue
    /// order.
    pub async fn locks(&self, prefix: &str) -> Result<Listing> {
        self.reach("list locks", prefix)?;
        let mut locks: Vec<LockInfo> = self.store.read(|s, now| {
            let rows = s.locks.range(prefix.to_string()..).take_while(|(name, _)| name.starts_with(prefix));
            rows.filter(|(_, row)| row.in_use(now)).map(|(name, row)| row.info(name, now)).take(MAX_LOCKS + 1).collect()
        });
        let truncated = locks.len() > MAX_LOCKS;
        locks.truncate(MAX_LOCKS);
        Ok(Listing { backend: "memory", prefix: prefix.to_string(), locks, truncated, unseen: vec![] })
    }
}

impl LockRow {
    fn in_use(&self, now: Instant) -> bool {
        self.holders.iter().any(|h| h.until > now) || !self.queue.is_empty()
    }

    /// The row as a listing shows it.
    fn info(&self, name: &str, now: Instant) -> LockInfo {
        let kinds = self.holders.iter().chain(&self.queue).map(|e| e.kind);
        let (recipe, permits) = kinds.fold(("mutex", None), |seen, kind| match kind {
            Kind::Read | Kind::Write => ("rwlock", None),
            Kind::Permits(n) => ("semaphore", Some(n)),
            Kind::Mutex => seen,
        });
        let holders = self.holders.iter().filter(|h| h.until > now).map(|h| (true, h));
        let entries = holders
            .chain(self.queue.iter().map(|w| (false, w)))
            .map(|(holds, e)| {
                let mode = match e.kind {
                    Kind::Mutex => "exclusive",
                    Kind::Read => "read",
                    Kind::Write => "write",
                    Kind::Permits(_) => "permit",
                };
                let mut entry = Entry::new(holds, mode, format!("pid {}", std::process::id()), e.id.clone());
                entry.since_ms = Some(now.saturating_duration_since(e.since).as_millis() as u64);
                if holds {
                    entry.token = Some(e.token);
                    entry.lease_left_ms = Some(e.until.saturating_duration_since(now).as_millis() as u64);
                }
                entry
            })
            .collect();
        LockInfo { name: name.to_string(), recipe: recipe.into(), permits, last_token: Some(self.last_token), entries }
    }
}

/// An election in the store: a mutex on its name, and the value its holder announced with the
/// holder's token. The leader is the live holder whose announcement carries its token.
#[derive(Debug, Clone)]
struct Election {
    client: Client,
    name: String,
}

impl Election {
    fn read_leader(&self) -> (Option<Leader>, Option<Instant>) {
        self.client.store.read(|s, now| {
            let holder = s.locks.get(&self.name).and_then(|row| row.holders.iter().find(|h| h.until > now));
            let Some(h) = holder else { return (None, None) };
            match s.announced.get(&self.name) {
                Some((token, value)) if *token == h.token => {
                    (Some(Leader { value: value.clone(), epoch: h.token, key: h.id.clone() }), Some(h.until))
                }
                _ => (None, Some(h.until)),
            }
        })
    }
}

impl Ballot for Election {
    fn name(&self) -> &str {
        &self.name
    }

    fn candidate(&self, value: Arc<str>) -> Arc<dyn Recipe> {
        let lock = contract::lock(MemLock { client: self.client.clone(), name: self.name.clone(), kind: Kind::Mutex });
        Arc::new(Announcing { lock, ballot: Arc::new(self.clone()), value })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<Leader>>> {
        Box::pin(async move {
            self.client.reach("leader", &self.name)?;
            Ok(self.read_leader().0)
        })
    }

    fn watch_leader(&self) -> BoxFuture<'_, Result<Watched>> {
        Box::pin(async move {
            self.client.reach("leader", &self.name)?;
            let mut changes = self.client.store.subscribe();
            let (leader, ends) = self.read_leader();
            let changed = async move {
                let ends = ends.map(tokio::time::sleep_until);
                match ends {
                    Some(ends) => tokio::select! { _ = changes.changed() => {}, _ = ends => {} },
                    None => {
                        let _ = changes.changed().await;
                    }
                }
            };
            Ok(Some((leader, Box::pin(changed) as BoxFuture<'static, ()>)))
        })
    }

    fn proclaim(&self, holder_id: String, token: u64, value: Arc<str>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.client.reach("proclaim", &self.name)?;
            let name = self.name.clone();
            let ours = self.client.store.change(|s, now| {
                let row = s.locks.get(&name);
                let ours = row.and_then(|r| r.holder(&holder_id)).is_some_and(|h| h.token == token && h.until > now);
                if ours {
                    s.announced.insert(name.clone(), (token, value.to_string()));
                }
                ours
            });
            match ours {
                true => Ok(()),
                false => Err(Error::LockLost { lock: self.name.clone(), reason: LostReason::LeaseExpired }),
            }
        })
    }
}

impl Jobs for Client {
    fn read<'a>(&'a self, job: &'a str) -> BoxFuture<'a, Result<JobRead>> {
        Box::pin(async move {
            self.reach("read job", job)?;
            let row = self.store.read(|s, _| s.jobs.get(job).cloned().unwrap_or_default());
            Ok(JobRead {
                now_ms: self.store.now_ms(),
                now_error_ms: 0,
                lock: row.lock.as_ref().map(|(l, _)| l.clone()),
                run: row.run.as_ref().map(|(r, _)| r.clone()),
                seen: seen(&row),
            })
        })
    }

    fn write<'a>(
        &'a self,
        job: &'a str,
        seen_before: &'a Seen,
        lock: Option<&'a JobLock>,
        run: &'a Run,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            self.reach("write job", job)?;
            Ok(self.store.change(|s, _| {
                let version = s.next_id();
                let row = s.jobs.entry(job.to_string()).or_default();
                if seen(row) != *seen_before {
                    return false;
                }
                if let Some(lock) = lock {
                    row.lock = Some((lock.clone(), version));
                }
                row.run = Some((run.clone(), version));
                true
            }))
        })
    }
}

/// A job row's versions, as [`Jobs::write`] compares them.
fn seen(row: &JobRow) -> Seen {
    Seen { lock: row.lock.as_ref().map(|(_, v)| v.to_string()), run: row.run.as_ref().map(|(_, v)| v.to_string()) }
}

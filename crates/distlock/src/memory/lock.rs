//! A lock of the in-process store as the contract's [`Recipe`], and its guard as [`Held`]: the
//! client's watchdog renews every lease it holds every third of the lease, all in one change of
//! the store ([`Renew`]), as the server-backed backends renew theirs, so a cut-off client
//! ([`super::Client::partition`]) loses its locks at their deadlines, before the store's leases
//! end. A cut-off client's requests wait for the heal, as they would wait out a silent
//! partition, except a try, which cannot wait.

use super::store::{Entry, Store};
use super::Client;
use crate::contract::{BoxFuture, Held, Kind, Recipe, Wait};
use crate::lease::{Lease, Leased, Renewal};
use crate::{LockState, LostReason, QueueStatus, Result};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::time::Instant;

/// A lock of `kind` named `name` in the client's store.
#[derive(Debug, Clone)]
pub(crate) struct MemLock {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) kind: Kind,
}

impl Recipe for MemLock {
    fn name(&self) -> &str {
        &self.name
    }

    fn acquire<'a>(
        &'a self,
        wait: Wait,
        progress: Option<&'a watch::Sender<QueueStatus>>,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Held>>>> {
        Box::pin(async move { Ok(self.acquire_with(wait, progress).await?.map(|g| Box::new(g) as Box<dyn Held>)) })
    }
}

impl MemLock {
    /// Queues (unless `wait` is `Never` and the lock is not free now) and waits for the grant.
    pub(crate) async fn acquire_with(
        &self,
        wait: Wait,
        progress: Option<&watch::Sender<QueueStatus>>,
    ) -> Result<Option<MemGuard>> {
        let give_up = wait.give_up_at().unwrap_or_else(far_future);
        match wait {
            Wait::Never => self.client.reach("acquire", &self.name)?,
            _ => tokio::select! {
                _ = self.client.arrive() => {}
                _ = tokio::time::sleep_until(give_up) => return Ok(None),
            },
        }
        let store = self.client.store.clone();
        let (name, kind, lease) = (self.name.clone(), self.kind, self.client.lease());
        let mut changes = store.subscribe();
        let entry_of = |id: &str, now| Entry { id: id.to_string(), kind, since: now, until: now, lease, token: 0 };
        let id = store.change(|s, now| {
            let id = format!("{}-{}", std::process::id(), s.next_id());
            let row = s.locks.entry(name.clone()).or_default();
            row.settle(now);
            row.check_permits(&name, kind)?;
            if wait != Wait::Never {
                row.queue.push_back(entry_of(&id, now));
                row.settle(now);
            } else if row.queue.is_empty() && row.fits(kind) {
                row.grant(entry_of(&id, now), now);
            }
            Ok::<_, crate::Error>(id)
        })?;
        // From here a dropped acquire takes its entry out (and gives back a grant it got).
        let mut pending = Pending { store: store.clone(), name: name.clone(), id: Some(id.clone()) };
        loop {
            let (held, next_end, place) = store.read(|s, now| {
                let row = &s.locks[&name];
                let place = row.queue.iter().position(|w| w.id == id).map(|ahead| QueueStatus {
                    ahead: ahead + row.holders.len(),
                    queue_len: row.queue.len() + row.holders.len(),
                });
                // A grant whose lease is already over is not had: in line again (below).
                (row.holder(&id).filter(|h| h.until > now).cloned(), row.next_end(), place)
            });
            if let Some(entry) = held {
                // A grant made while this client is cut off reaches it at the heal (its lease
                // ran from the grant meanwhile).
                if *self.client.cut.borrow() {
                    tokio::select! {
                        _ = self.client.arrive() => {}
                        _ = tokio::time::sleep_until(give_up) => return Ok(None),
                    }
                }
                pending.id = None;
                if let Some(p) = progress {
                    p.send_replace(QueueStatus { ahead: 0, queue_len: 1 });
                }
                return Ok(Some(MemGuard::new(self.client.clone(), name, entry)));
            }
            let Some(place) = place else {
                if wait == Wait::Never {
                    return Ok(None); // not queued: a try that found the lock taken
                }
                // Granted, and the lease ran out before this task looked (a late task, or a
                // jump of the paused clock): in line again, at the back.
                store.change(|s, now| {
                    let row = s.locks.entry(name.clone()).or_default();
                    row.queue.push_back(entry_of(&id, now));
                    row.settle(now);
                });
                continue;
            };
            if let Some(p) = progress {
                p.send_replace(place);
            }
            tokio::select! {
                _ = changes.changed() => {}
                // A holder's lease ends: settle the queue then.
                _ = tokio::time::sleep_until(next_end.unwrap_or_else(far_future)), if next_end.is_some() => {
                    store.change(|s, now| s.locks.entry(name.clone()).or_default().settle(now));
                }
                _ = tokio::time::sleep_until(give_up) => return Ok(None),
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + std::time::Duration::from_secs(86_400 * 365)
}

/// An acquire's entry in the store until it becomes a guard; dropped before that, it takes the
/// entry out (a grant it had is given back).
struct Pending {
    store: Arc<Store>,
    name: String,
    id: Option<String>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.store.change(|s, now| s.locks.entry(self.name.clone()).or_default().remove(&id, now));
        }
    }
}

/// A held lock of the store.
#[derive(Debug)]
pub(crate) struct MemGuard {
    hold: Option<Hold>,
}

#[derive(Debug)]
struct Hold {
    client: Client,
    leased: Leased,
    id: String,
    token: u64,
    /// The hold's place in the client's renewals (dropped: renewed no more).
    renewals: crate::watchdog::Ticket,
}

impl MemGuard {
    fn new(client: Client, name: String, entry: Entry) -> MemGuard {
        // The lease runs from the grant, which the store dated; the guard's deadline is that
        // less the drift margin, so it is lost before the store hands the lock on.
        let lease = Arc::new(Lease::new(entry.since, entry.lease, "memory"));
        let check = Renew { client: client.clone(), name: name.clone(), id: entry.id.clone(), lease: lease.clone() };
        let renewals = client.watchdog.watch(lease.clone(), name.clone(), check);
        let leased = Leased::new(name, lease);
        MemGuard { hold: Some(Hold { client, leased, id: entry.id, token: entry.token, renewals }) }
    }

    fn hold(&self) -> &Hold {
        self.hold.as_ref().expect("a guard holds until released")
    }
}

/// A hold's renewal, as the client's watchdog keeps it: with every other hold of the client due,
/// in one change of the store, each with its own answer. A renewal from a cut-off client arrives
/// at the heal (each hold's wait is bounded by its own deadline, by the watchdog); one that finds
/// its entry gone is a loss of that hold alone.
pub(crate) struct Renew {
    client: Client,
    name: String,
    id: String,
    lease: Arc<Lease>,
}

impl crate::watchdog::Check for Renew {
    type Group = ();

    /// Every hold of the client: one change of the store renews them all.
    const TOGETHER: usize = usize::MAX;

    fn group(&self) {}

    fn renew(&self) -> BoxFuture<'static, Renewal> {
        let together = Self::renew_together(&[self]);
        Box::pin(async move { together.await.pop().unwrap_or(Renewal::Failed) })
    }

    fn renew_together(checks: &[&Self]) -> BoxFuture<'static, Vec<Renewal>> {
        let client = checks[0].client.clone();
        let ours: Vec<(String, String, Arc<Lease>)> =
            checks.iter().map(|c| (c.name.clone(), c.id.clone(), c.lease.clone())).collect();
        Box::pin(async move {
            client.arrive().await;
            client.store.change(|s, now| {
                let renew = |(name, id, lease): &(String, String, Arc<Lease>)| {
                    // A hold whose guard gave up meanwhile (the heal came after its deadline) is
                    // not renewed: the store lets it go at its lease.
                    let ours = now < lease.deadline() && s.locks.get_mut(name).is_some_and(|row| row.renew(id, now));
                    if ours {
                        Renewal::Renewed
                    } else {
                        Renewal::Gone(LostReason::LeaseExpired)
                    }
                };
                ours.iter().map(renew).collect()
            })
        })
    }
}

/// Takes the holder out of the store once the request arrives; whether it still held.
async fn give_back(client: Client, name: String, id: String) -> Result<bool> {
    client.arrive().await;
    Ok(client.store.change(|s, now| s.locks.entry(name).or_default().remove(&id, now)))
}

impl Held for MemGuard {
    fn name(&self) -> &str {
        self.hold().leased.name()
    }
    fn holder_id(&self) -> &str {
        &self.hold().id
    }
    fn fencing_token(&self) -> u64 {
        self.hold().token
    }
    fn lease_deadline(&self) -> std::time::Instant {
        self.hold().leased.lease_deadline()
    }
    fn state(&self) -> LockState {
        self.hold().leased.state()
    }
    fn lost(&self) -> BoxFuture<'static, LostReason> {
        Box::pin(self.hold().leased.lost())
    }
    fn release(mut self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        let Hold { client, leased: Leased { name, lease }, id, renewals, .. } =
            self.hold.take().expect("a guard holds until released");
        drop(renewals);
        Box::pin(async move {
            let (before, lock, deadline) = (lease.state(&name), name.clone(), lease.deadline());
            // From a cut-off client the release waits for the heal, at most until the lease is
            // over: then the lock is no longer ours to release.
            let unlock = async move {
                tokio::select! {
                    released = give_back(client, name, id) => released,
                    _ = tokio::time::sleep_until(deadline) => Ok(false),
                }
            };
            lease.release(before, lock, unlock, LostReason::LeaseExpired).await
        })
    }
}

impl Drop for MemGuard {
    fn drop(&mut self) {
        let Some(Hold { client, leased: Leased { name, lease }, id, renewals, .. }) = self.hold.take() else { return };
        drop(renewals);
        lease.end();
        // Given back at once (a test sees the lock free right after the drop); from a cut-off
        // client, once it heals (or never, outside a runtime: then its lease runs out).
        if !*client.cut.borrow() {
            client.store.change(|s, now| s.locks.entry(name).or_default().remove(&id, now));
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(give_back(client, name, id)));
        }
    }
}

//! The cells of many locks on one client: a client holding a hundred locks, which share one
//! session or a few connections, is cut off or reset while a competitor waits for every one of
//! them. Each lock has a fenced resource of its own: the holder believes it holds
//! from its grant until it is told `lost()` (writing with its token meanwhile), the competitor
//! from its grant on; the checker then says whether any lock had two believed holders at once.
//! After a silent partition longer than the lease every one of the hundred must be lost, and
//! lost before the competitor got it (the overlap check per lock) and, where the locks share one
//! lease (a session, a connection, an etcd lease), the latest loss before the earliest grant; after a reset the locks that survive it are released
//! by the holder and taken by the competitor. Nothing may be left on the server afterwards.

use super::{leaked_after, Recipe, Row, Target, BOUND, WRITE_EVERY};
use distlock::Guard;
use distlock_faults::{mono_now, Fault, FaultProxy, FencedResource, Mode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

/// How many locks the holder takes.
pub(super) const LOCKS: usize = 100;

/// The faults of these cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ManyFault {
    /// The holder silently partitioned for one and a half leases.
    Partition,
    /// The holder's connections reset and reconnecting refused for 0.5 s.
    Reset,
}

impl ManyFault {
    pub(super) fn name(self) -> String {
        match self {
            ManyFault::Partition => format!("{LOCKS} locks on one client, partitioned 1½ leases (silent)"),
            ManyFault::Reset => format!("{LOCKS} locks on one client, reset, reconnect refused 0.5 s"),
        }
    }
}

/// What one of the holder's locks saw.
struct Held {
    resource: Arc<FencedResource>,
    /// mono_now() when the holder learnt the loss (`None`: never lost).
    lost_at: StdMutex<Option<u64>>,
}

/// The holder's side of one lock: a hold from now until `lost()` (or `stop`), writing with the
/// token every few `WRITE_EVERY` while the guard is not lost.
fn hold(guard: Arc<Guard>, held: Arc<Held>, seq: Arc<AtomicU64>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let id = held.resource.begin(0, Mode::Exclusive, guard.fencing_token());
    tokio::spawn(async move {
        let lost = guard.lost();
        tokio::pin!(lost);
        loop {
            if guard.state().is_lost() {
                break;
            }
            if stop.load(Ordering::SeqCst) {
                held.resource.end(id);
                return;
            }
            held.resource.write(0, guard.fencing_token(), seq.fetch_add(1, Ordering::SeqCst));
            tokio::select! {
                _ = &mut lost => break,
                _ = tokio::time::sleep(WRITE_EVERY * 5) => {}
            }
        }
        held.resource.end(id);
        *held.lost_at.lock().unwrap() = Some(mono_now());
    })
}

/// One cell: the holder takes `LOCKS` mutexes, a competitor waits for all of them, `fault`
/// strikes the holder.
pub(super) async fn cell(target: &Target, fault: ManyFault) -> Row {
    let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let names: Vec<String> = (0..LOCKS)
        .map(|i| {
            let name = format!("matrix-many-{tag}-{i}");
            if target.is_zk() {
                format!("/distlock-test/{name}")
            } else {
                name
            }
        })
        .collect();
    let proxy = match &target.addr {
        Some(addr) => Some(FaultProxy::start(addr.parse().unwrap()).await.unwrap()),
        None => None,
    };
    let url = proxy.as_ref().map_or_else(|| target.direct_url(), |p| target.url_via(&p.addr().to_string()));
    let holder = distlock::connect(&url).await.expect("the holder connects");
    let competitor = distlock::connect(&target.direct_url()).await.expect("the competitor connects");
    let (seq, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let mut guards = Vec::new();
    let mut helds = Vec::new();
    let mut holds = Vec::new();
    for name in &names {
        let lock = holder.mutex(name).expect("the lock");
        let guard = Arc::new(lock.lock_timeout(BOUND).await.expect("acquire").expect("a new lock is free"));
        let held = Arc::new(Held { resource: FencedResource::new(true, 1), lost_at: StdMutex::new(None) });
        holds.push(hold(guard.clone(), held.clone(), seq.clone(), stop.clone()));
        guards.push(guard);
        helds.push(held);
    }
    // The competitor waits for every one; once granted it holds (and writes once) until the end.
    let granted_at: Arc<StdMutex<Vec<u64>>> = Arc::default();
    let waits: Vec<_> = names
        .iter()
        .zip(&helds)
        .map(|(name, held)| {
            let (lock, held, granted_at, seq) =
                (competitor.mutex(name).unwrap(), held.clone(), granted_at.clone(), seq.clone());
            tokio::spawn(async move {
                let g = lock.lock_timeout(BOUND).await.expect("the competitor's acquire").expect("granted in time");
                let id = held.resource.begin(1, Mode::Exclusive, g.fencing_token());
                granted_at.lock().unwrap().push(mono_now());
                held.resource.write(1, g.fencing_token(), seq.fetch_add(1, Ordering::SeqCst));
                (g, id)
            })
        })
        .collect();
    let cut = |on: bool| match &proxy {
        Some(p) if on => p.set(Fault::Blackhole),
        Some(p) => p.heal(),
        None => {
            let memory = holder.downcast::<distlock::memory::Client>().expect("no proxy: the in-process store");
            if on {
                memory.partition()
            } else {
                memory.heal()
            }
        }
    };
    let fault_at = mono_now();
    match fault {
        ManyFault::Partition => {
            cut(true);
            // Cut off for one and a half leases, and at least until every lock is lost (bounded);
            // a server that hears nothing from a connection behind the proxy may keep it open
            // (the proxy answers for the holder), so the competitor may get the locks only after
            // the healing lets the holder's closes through.
            let cut_at = tokio::time::Instant::now();
            let deadline = cut_at + BOUND;
            while (holds.iter().any(|h| !h.is_finished()) || cut_at.elapsed() < target.lease * 3 / 2)
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cut(false);
        }
        ManyFault::Reset => {
            let p = proxy.as_ref().expect("a reset needs the proxy");
            p.set(Fault::RefuseNew);
            p.reset_all();
            tokio::time::sleep(Duration::from_millis(500)).await;
            p.heal();
            // The locks that survive a reset (a session, a lease or a key outlives a connection)
            // are still held: let go of them after a while.
            tokio::time::sleep(target.lease).await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for h in holds {
        tokio::time::timeout(BOUND, h).await.expect("a hold ends").unwrap();
    }
    let mut losses = 0;
    for (g, held) in guards.into_iter().zip(&helds) {
        let g = Arc::into_inner(g).expect("the hold's task ended");
        if held.lost_at.lock().unwrap().is_some() {
            losses += 1;
            drop(g);
        } else if tokio::time::timeout(Duration::from_secs(10), g.release()).await.map_or(true, |r| r.is_err()) {
            losses += 1;
        }
    }
    let mut granted = Vec::new();
    for w in waits {
        granted.push(tokio::time::timeout(BOUND, w).await.expect("the competitor is granted every lock").unwrap());
    }
    let released_at = mono_now();
    for ((g, id), held) in granted.into_iter().zip(&helds) {
        held.resource.end(id);
        g.release().await.expect("the competitor releases");
    }
    drop(proxy);
    holder.close(Duration::from_secs(2)).await;
    competitor.close(Duration::from_secs(2)).await;
    let mut leaked = 0;
    for name in &names {
        leaked += leaked_after(target, Recipe::Mutex, name, Duration::from_secs(8)).await;
    }
    let grants = granted_at.lock().unwrap().clone();
    let (first_grant, last_grant) = (grants.iter().min().copied(), grants.iter().max().copied());
    let last_loss = helds.iter().filter_map(|h| *h.lost_at.lock().unwrap()).max();
    let reports: Vec<_> = helds.iter().map(|h| h.resource.report()).collect();
    let mut overlaps: usize = reports.iter().map(|r| r.overlaps.len()).sum();
    // Across all, where the locks share one lease (a session, a connection, an etcd lease):
    // after a partition the last loss comes before the first grant elsewhere. Redis and the
    // in-process store keep an entry, with its own expiry, per lock: there each lock is judged
    // alone (its loss before its own next grant).
    let one_lease = !target.url.starts_with("redis") && !target.url.starts_with("memory");
    if fault == ManyFault::Partition && one_lease && last_loss.zip(first_grant).is_some_and(|(l, g)| l >= g) {
        overlaps += 1;
    }
    let longest_overlap_us = super::longest_overlap_us(reports.iter().flat_map(|r| r.overlaps.iter()), released_at);
    Row {
        scenario: fault.name(),
        recipe: "mutex",
        acquisitions: reports.iter().map(|r| r.holds).sum(),
        faults: 1,
        overlaps,
        longest_overlap_us,
        stale_accepted: reports.iter().map(|r| r.stale_accepted).sum(),
        stale_rejected: reports.iter().map(|r| r.stale_rejected).sum(),
        leaked,
        recovery_ms: last_grant.map_or(0, |g| g.saturating_sub(fault_at) / 1_000_000),
        losses,
        // A lock that lives as long as its connection is freed by the server as the reset
        // reaches the holder: only the fence covers the moment between.
        by_nature: fault == ManyFault::Reset && target.connection_bound,
        pause_holds: false,
        must_lose: if fault == ManyFault::Partition { LOCKS } else { 0 },
        // A reset the lease outlives loses nothing (a session, a lease or a key outlives its
        // connection): a loss reported there would be false.
        must_keep: fault == ManyFault::Reset && !target.connection_bound,
    }
}

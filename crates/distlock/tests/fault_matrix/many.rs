//! The cells of many locks on one client: a client holding a hundred locks, which share one
//! session or a few connections, is cut off or reset while a competitor waits for every one of
//! them. Each lock has a fenced resource of its own: the holder believes it holds
//! from its grant until its lock says it is lost (its lease deadline, or the moment `lost()` is
//! seen if that is earlier; writing with its token meanwhile), the competitor
//! from its grant on; the checker then says whether any lock had two believed holders at once.
//! After a silent partition longer than the lease every one of the hundred must be lost, and
//! lost before the competitor got it (the overlap check per lock) and, where the locks share one
//! lease (a session, a connection, an etcd lease), the latest loss before the earliest grant; after a reset the locks that survive it are released
//! by the holder and taken by the competitor. Nothing may be left on the server afterwards.
//!
//! A file (SQLite) has no connection to cut: there the holder is a process of its own, with its
//! hundred locks, paused past the lease (resumed, it must find every one lost, at most one stale
//! write may reach the resources, and the fence must refuse it) or killed; either way no lock may
//! be granted before the lease deadline the holder last reported for it, and every one must be
//! granted after.

use super::{leaked_after, report_words, say, spawn_test_child, Recipe, Row, Target, BOUND, WRITE_EVERY};
use crate::common;
use distlock::Guard;
use distlock_faults::{mono_now, Fault, FaultProxy, FencedResource, HoldId, Mode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// How many locks the holder takes.
pub(super) const LOCKS: usize = 100;

/// The faults of these cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ManyFault {
    /// The holder silently partitioned for one and a half leases.
    Partition,
    /// The holder's connections reset and reconnecting refused for 0.5 s.
    Reset,
    /// The holder, a process of its own, stopped (SIGSTOP) for one and a half leases and until
    /// the competitor has every lock, then resumed: what a file backend (SQLite) has in place
    /// of a partition, its holder silent while the lease runs out.
    Pause,
    /// The holder, a process of its own, killed (SIGKILL) with its hundred locks.
    Kill,
}

impl ManyFault {
    pub(super) fn name(self) -> String {
        match self {
            ManyFault::Partition => format!("{LOCKS} locks on one client, partitioned 1½ leases (silent)"),
            ManyFault::Reset => format!("{LOCKS} locks on one client, reset, reconnect refused 0.5 s"),
            ManyFault::Pause => format!("{LOCKS} locks in one process, paused 1½ leases (SIGSTOP), fenced"),
            ManyFault::Kill => format!("{LOCKS} locks in one process, killed (SIGKILL)"),
        }
    }

    /// Whether the holder is a child process (the faults made with signals).
    fn in_child(self) -> bool {
        matches!(self, ManyFault::Pause | ManyFault::Kill)
    }
}

/// What one of the holder's locks saw.
struct Held {
    resource: Arc<FencedResource>,
    /// mono_now() when the holder learnt the loss (`None`: never lost).
    lost_at: StdMutex<Option<u64>>,
    /// What the holder was told, or the release's error, when the hold counts as lost.
    why: StdMutex<Option<String>>,
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
        // The hold ended when the lock said it was lost: at its lease deadline (its `state()`
        // turns `Lost` then), or when the loss was seen if that came first. The task that sees
        // it may run later on a starved machine; the promise checked is the deadline's.
        let ended = mono_now().min(mono_at(guard.lease_deadline()));
        held.resource.end_at(id, ended);
        *held.lost_at.lock().unwrap() = Some(ended);
        *held.why.lock().unwrap() = Some(format!("told {:?}", guard.state()));
    })
}

/// `at` (a past or future instant) on [`mono_now`]'s clock (both are CLOCK_MONOTONIC).
fn mono_at(at: std::time::Instant) -> u64 {
    let (now, now_ns) = (std::time::Instant::now(), mono_now());
    match at.checked_duration_since(now) {
        Some(ahead) => now_ns.saturating_add(ahead.as_nanos() as u64),
        None => now_ns.saturating_sub(now.duration_since(at).as_nanos() as u64),
    }
}

/// The names' common start, new for each cell.
fn prefix(target: &Target) -> String {
    let name = format!("matrix-many-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    if target.is_zk() {
        format!("/distlock-test/{name}")
    } else {
        name
    }
}

/// The `LOCKS` names of a cell.
fn names(prefix: &str) -> Vec<String> {
    (0..LOCKS).map(|i| format!("{prefix}-{i}")).collect()
}

/// One cell: the holder takes `LOCKS` mutexes, a competitor waits for all of them, `fault`
/// strikes the holder.
pub(super) async fn cell(target: &Target, fault: ManyFault) -> Row {
    let prefix = prefix(target);
    let names = names(&prefix);
    if fault.in_child() {
        return child_cell(target, fault, &prefix, &names).await;
    }
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
        let held = Arc::new(Held {
            resource: FencedResource::new(true, 1),
            lost_at: StdMutex::default(),
            why: StdMutex::default(),
        });
        holds.push(hold(guard.clone(), held.clone(), seq.clone(), stop.clone()));
        guards.push(guard);
        helds.push(held);
    }
    let resources: Vec<_> = helds.iter().map(|h| h.resource.clone()).collect();
    let (grants, waits) = compete(&competitor, &names, &resources, &seq);
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
        ManyFault::Pause | ManyFault::Kill => unreachable!("a child process holds in these cells"),
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
        } else {
            let released = tokio::time::timeout(Duration::from_secs(10), g.release()).await;
            if let Some(e) =
                released.map_or(Some("no answer within 10 s".to_string()), |r| r.err().map(|e| e.to_string()))
            {
                *held.why.lock().unwrap() = Some(format!("release failed: {e}"));
                losses += 1;
            }
        }
    }
    let whys: std::collections::BTreeSet<String> = helds.iter().filter_map(|h| h.why.lock().unwrap().clone()).collect();
    if !whys.is_empty() {
        say(&mut std::io::stdout(), &format!("{}: {} / {losses} lost: {whys:?}", target.server, fault.name()));
    }
    let released_at = let_go(waits, &resources).await;
    drop(proxy);
    holder.close(Duration::from_secs(2)).await;
    competitor.close(Duration::from_secs(2)).await;
    let leaked = leaked(target, &names).await;
    let grants: Vec<u64> = grants.lock().unwrap().iter().map(|g| g.1).collect();
    let (first_grant, last_grant) = (grants.iter().min().copied(), grants.iter().max().copied());
    let last_loss = helds.iter().filter_map(|h| *h.lost_at.lock().unwrap()).max();
    let reports: Vec<_> = helds.iter().map(|h| h.resource.report()).collect();
    let mut overlaps: usize = reports.iter().map(|r| r.overlaps.len()).sum();
    // Across all, where the locks share one lease (a session, a connection, an etcd lease):
    // after a partition the last loss comes before the first grant elsewhere. Redis, NATS and the
    // in-process store keep an entry, with its own expiry, per lock: there each lock is judged
    // alone (its loss before its own next grant).
    let one_lease = !["redis", "nats", "memory"].iter().any(|s| target.url.starts_with(s));
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
        violations: Vec::new(),
    }
}

/// Each grant of the competitor: the lock's index, when (`mono_now`), its token.
type Grants = Arc<StdMutex<Vec<(usize, u64, u64)>>>;

/// The competitor waits for every lock of `names`; once granted it holds (and writes once to the
/// lock's resource) until [`let_go`]. An acquire that fails (a server or file busy while the
/// holder is stopped or cut off) is made again, within `BOUND`. Returns the grants and the waits.
fn compete(
    competitor: &distlock::Client,
    names: &[String],
    resources: &[Arc<FencedResource>],
    seq: &Arc<AtomicU64>,
) -> (Grants, Vec<tokio::task::JoinHandle<(Guard, HoldId)>>) {
    let grants: Grants = Arc::default();
    let waits = names
        .iter()
        .zip(resources)
        .enumerate()
        .map(|(i, (name, resource))| {
            let (lock, resource, grants, seq, name) =
                (competitor.mutex(name).unwrap(), resource.clone(), grants.clone(), seq.clone(), name.clone());
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + BOUND;
                let g = loop {
                    match lock.lock_timeout(deadline - tokio::time::Instant::now()).await {
                        Ok(Some(g)) => break g,
                        Ok(None) => panic!("the competitor was not granted {name} within {BOUND:?}"),
                        Err(e) if tokio::time::Instant::now() + Duration::from_millis(100) < deadline => {
                            tracing::info!(lock = name, error = %e, "the competitor's acquire failed; again");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("the competitor's acquire of {name}: {e}"),
                    }
                };
                let id = resource.begin(1, Mode::Exclusive, g.fencing_token());
                grants.lock().unwrap().push((i, mono_now(), g.fencing_token()));
                resource.write(1, g.fencing_token(), seq.fetch_add(1, Ordering::SeqCst));
                (g, id)
            })
        })
        .collect();
    (grants, waits)
}

/// Waits (bounded) for the competitor to be granted every lock, then releases them all; returns
/// when the releases began.
async fn let_go(waits: Vec<tokio::task::JoinHandle<(Guard, HoldId)>>, resources: &[Arc<FencedResource>]) -> u64 {
    let mut granted = Vec::new();
    for w in waits {
        granted.push(tokio::time::timeout(BOUND, w).await.expect("the competitor is granted every lock").unwrap());
    }
    let released_at = mono_now();
    let mut lost = 0;
    for ((g, id), resource) in granted.into_iter().zip(resources) {
        resource.end(id);
        match g.release().await {
            Ok(()) => {}
            // A loss the competitor is told of is the contract kept, not broken: on a machine
            // starved for a lease's length (every matrix at once on two cores) its renewals can
            // be late. What the cell judges is the holder's side and the resources' fences.
            Err(distlock::Error::LockLost { .. }) => lost += 1,
            Err(e) => panic!("the competitor releases: {e}"),
        }
    }
    if lost > 0 {
        say(&mut std::io::stdout(), &format!("the competitor was told {lost} of its holds were lost before it let go"));
    }
    released_at
}

/// How many of `names` are left held once every client has ended (bounded).
async fn leaked(target: &Target, names: &[String]) -> usize {
    let mut leaked = 0;
    for name in names {
        leaked += leaked_after(target, Recipe::Mutex, name, Duration::from_secs(8)).await;
    }
    leaked
}

/// What the parent knows of the child holder's locks, from its reports.
#[derive(Default)]
struct ChildLocks {
    /// Per lock: (token, start) while the child reports it held.
    open: Vec<Option<(u64, u64)>>,
    /// How many locks the child reported granted.
    held: usize,
    /// How many the child reported lost.
    lost: usize,
    /// Per lock: the child's token.
    token: Vec<u64>,
    /// Per lock: the latest lease deadline the child reported (`mono_now` ns).
    deadline: Vec<u64>,
}

/// The cells whose holder is a child process: it takes the `LOCKS` locks and reports on its
/// stdout (`HELD i token start deadline`, `WRITE i token seq deadline`, `END i start end
/// lost|released`, a deadline being the hold's lease deadline as the child knows it, in
/// `mono_now` ns); the parent pauses or kills it while a competitor waits for every lock. Beside
/// the fenced resources, the cell checks that no lock was granted to the competitor before the
/// child's last reported deadline for it, that the competitor's token is above the child's, and,
/// after a pause, that at most one stale write reached the resources (the one whose check came
/// just before the stop).
async fn child_cell(target: &Target, fault: ManyFault, prefix: &str, names: &[String]) -> Row {
    let resources: Vec<_> = (0..LOCKS).map(|_| FencedResource::new(true, 1)).collect();
    let state = Arc::new(StdMutex::new(ChildLocks {
        open: vec![None; LOCKS],
        token: vec![0; LOCKS],
        deadline: vec![0; LOCKS],
        ..ChildLocks::default()
    }));
    let killed_at: Arc<StdMutex<Option<u64>>> = Arc::default();
    let (test, url) = (common::test_name(module_path!(), "child_many_holder"), target.direct_url());
    let mut child = spawn_test_child(&test, &[("DISTLOCK_CHILD_URL", url.as_str()), ("DISTLOCK_CHILD_MANY", prefix)]);
    let pid = child.id().unwrap();
    let reader = {
        let (stdout, state, resources, killed_at) =
            (child.stdout.take().unwrap(), state.clone(), resources.clone(), killed_at.clone());
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let f = report_words(&line);
                let num = |s: &str| s.parse::<u64>().unwrap();
                let mut st = state.lock().unwrap();
                match f.as_slice() {
                    ["HELD", i, token, start, deadline] => {
                        let i = num(i) as usize;
                        st.open[i] = Some((num(token), num(start)));
                        st.token[i] = num(token);
                        st.deadline[i] = st.deadline[i].max(num(deadline));
                        st.held += 1;
                    }
                    ["WRITE", i, token, seq, deadline] => {
                        let i = num(i) as usize;
                        st.deadline[i] = st.deadline[i].max(num(deadline));
                        resources[i].write(0, num(token), num(seq));
                    }
                    ["END", i, _, end, how] => {
                        let i = num(i) as usize;
                        if let Some((token, start)) = st.open[i].take() {
                            resources[i].record_hold(0, Mode::Exclusive, token, start, num(end));
                        }
                        st.lost += usize::from(*how == "lost");
                    }
                    _ => {}
                }
            }
            // The child died holding: killed, its holds ended at the SIGKILL (it runs nothing
            // after it); otherwise with its output.
            let end = killed_at.lock().unwrap().unwrap_or_else(mono_now);
            let mut st = state.lock().unwrap();
            for (i, open) in st.open.iter_mut().enumerate() {
                if let Some((token, start)) = open.take() {
                    resources[i].record_hold(0, Mode::Exclusive, token, start, end);
                }
            }
        })
    };
    let until = |what: &'static str, done: Box<dyn Fn(&ChildLocks) -> bool + Send>| {
        let state = state.clone();
        async move {
            let deadline = tokio::time::Instant::now() + BOUND;
            while !done(&state.lock().unwrap()) {
                assert!(tokio::time::Instant::now() < deadline, "the child holder: {what} within {BOUND:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    until("every lock granted", Box::new(|st| st.held == LOCKS)).await;
    let competitor = distlock::connect(&target.direct_url()).await.expect("the competitor connects");
    let seq = Arc::new(AtomicU64::new(1 << 40));
    let (grants, waits) = compete(&competitor, names, &resources, &seq);
    // The competitor waits half a lease while the child holds: a grant meanwhile overlaps.
    tokio::time::sleep(target.lease / 2).await;
    let fault_at = mono_now();
    match fault {
        ManyFault::Kill => {
            *killed_at.lock().unwrap() = Some(mono_now());
            distlock_faults::kill(pid).unwrap();
        }
        _ => {
            distlock_faults::pause(pid).unwrap();
            tokio::time::sleep(target.lease * 3 / 2).await;
            // Stopped until the competitor has every lock (bounded): then the child, resumed,
            // has a hundred stale holds to find lost before it writes (or to be fenced off).
            let deadline = tokio::time::Instant::now() + BOUND;
            while grants.lock().unwrap().len() < LOCKS && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            distlock_faults::resume(pid).unwrap();
            until("every lock found lost after the pause", Box::new(|st| st.open.iter().all(Option::is_none))).await;
        }
    }
    let released_at = let_go(waits, &resources).await;
    // Its stdin closed, the child lets go of what it still holds and exits.
    drop(child.stdin.take());
    if tokio::time::timeout(Duration::from_secs(15), child.wait()).await.is_err() {
        distlock_faults::kill(pid).ok();
    }
    tokio::time::timeout(BOUND, reader).await.expect("the child's output ends").unwrap();
    competitor.close(Duration::from_secs(2)).await;
    let leaked = leaked(target, names).await;
    let grants = grants.lock().unwrap().clone();
    let reports: Vec<_> = resources.iter().map(|r| r.report()).collect();
    let st = state.lock().unwrap();
    let mut violations = Vec::new();
    for &(i, at, token) in &grants {
        if at < st.deadline[i] {
            let early = (st.deadline[i] - at) / 1_000_000;
            violations.push(format!("lock {i} granted {early} ms before the holder's lease deadline"));
        }
        if token <= st.token[i] {
            violations
                .push(format!("lock {i}: the competitor's token {token} is not above the holder's {}", st.token[i]));
        }
    }
    let stale: usize = reports.iter().map(|r| r.stale_rejected + r.stale_accepted).sum();
    if fault == ManyFault::Pause && stale > 1 {
        violations.push(format!("{stale} stale writes after the pause (one can straddle the stop)"));
    }
    let losses = st.lost;
    drop(st);
    let grants: Vec<u64> = grants.iter().map(|g| g.1).collect();
    Row {
        scenario: fault.name(),
        recipe: "mutex",
        acquisitions: reports.iter().map(|r| r.holds).sum(),
        faults: 1,
        overlaps: reports.iter().map(|r| r.overlaps.len()).sum(),
        longest_overlap_us: super::longest_overlap_us(reports.iter().flat_map(|r| r.overlaps.iter()), released_at),
        stale_accepted: reports.iter().map(|r| r.stale_accepted).sum(),
        stale_rejected: reports.iter().map(|r| r.stale_rejected).sum(),
        leaked,
        recovery_ms: grants.iter().max().map_or(0, |g| g.saturating_sub(fault_at) / 1_000_000),
        losses,
        by_nature: false,
        pause_holds: false,
        // Resumed, the child must find every one of its locks lost (a killed child says nothing).
        must_lose: if fault == ManyFault::Pause { LOCKS } else { 0 },
        must_keep: false,
        violations,
    }
}

/// The child process of [`child_cell`]: takes the `LOCKS` mutexes named from
/// `DISTLOCK_CHILD_MANY`, reports each grant, writes with each lock's token every few
/// `WRITE_EVERY` while it is not lost, reports each loss, and lets go of the rest once its stdin
/// closes. Does nothing when started by hand.
#[test]
#[ignore = "run by the fault matrix as a child process"]
fn child_many_holder() {
    let (Ok(url), Ok(prefix)) = (std::env::var("DISTLOCK_CHILD_URL"), std::env::var("DISTLOCK_CHILD_MANY")) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let done = Arc::new(AtomicBool::new(false));
        let stdin_done = done.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(_)) = lines.next_line().await {}
            stdin_done.store(true, Ordering::SeqCst);
        });
        let client = distlock::connect(&url).await.expect("the child connects");
        let mut out = std::io::stdout();
        let mut held = Vec::new();
        for (i, name) in names(&prefix).iter().enumerate() {
            let g =
                client.mutex(name).unwrap().lock_timeout(BOUND).await.expect("acquire").expect("a new lock is free");
            let start = mono_now();
            say(&mut out, &format!("HELD {i} {} {start} {}", g.fencing_token(), deadline_ns(&g)));
            held.push(Some((g, start)));
        }
        let mut seq = 0u64;
        while !done.load(Ordering::SeqCst) {
            for (i, slot) in held.iter_mut().enumerate() {
                let Some((g, start)) = slot else { continue };
                // A careful holder checks before each write; the fence covers what it cannot.
                if g.state().is_lost() {
                    say(&mut out, &format!("END {i} {start} {} lost", mono_now()));
                    *slot = None;
                    continue;
                }
                seq += 1;
                say(&mut out, &format!("WRITE {i} {} {seq} {}", g.fencing_token(), deadline_ns(g)));
            }
            tokio::time::sleep(WRITE_EVERY * 5).await;
        }
        for (i, slot) in held.into_iter().enumerate() {
            if let Some((g, start)) = slot {
                say(&mut out, &format!("END {i} {start} {} released", mono_now()));
                let _ = tokio::time::timeout(Duration::from_secs(10), g.release()).await;
            }
        }
        client.close(Duration::from_secs(2)).await;
    });
}

/// `guard`'s lease deadline as a `mono_now` timestamp.
fn deadline_ns(guard: &Guard) -> u64 {
    mono_at(guard.lease_deadline()).max(mono_now())
}

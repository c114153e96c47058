//! Read/write lock, semaphore and revocation against a real ZooKeeper (scripts/test.sh).

use crate::common::zk::*;
use distlock::zookeeper::QueueStatus;
use distlock::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const BOUND: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
struct Interval {
    write: bool,
    start: Instant,
    end: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_writers_exclusive_readers_shared() {
    const SESSIONS: usize = 6;
    const ITERATIONS: usize = 15;
    let path = unique_path("rw");
    let log = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let (path, log) = (path.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect().await;
            let lock = client.rwlock(&path).unwrap();
            for i in 0..ITERATIONS {
                let write = (s + i) % 3 == 0;
                let (start, end) = if write {
                    let g = lock.write().await.unwrap();
                    let start = Instant::now();
                    tokio::task::yield_now().await;
                    let end = Instant::now();
                    g.release().await.unwrap();
                    (start, end)
                } else {
                    let g = lock.read().await.unwrap();
                    let start = Instant::now();
                    tokio::time::sleep(Duration::from_millis(2)).await; // give readers a chance to overlap
                    let end = Instant::now();
                    g.release().await.unwrap();
                    (start, end)
                };
                log.lock().unwrap().push(Interval { write, start, end });
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await.expect("finish").unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), SESSIONS * ITERATIONS);
    for (i, a) in log.iter().enumerate() {
        for b in &log[i + 1..] {
            let overlap = a.start < b.end && b.start < a.end;
            assert!(!(overlap && (a.write || b.write)), "a writer overlapped: {a:?} {b:?}");
        }
    }
    let admin = connect().await;
    assert!(children(&admin, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_queued_behind_a_writer_proceed_together() {
    const READERS: usize = 3;
    let path = unique_path("rw-batch");
    let w = connect().await;
    let writer = w.rwlock(&path).unwrap().write().await.unwrap();
    let all_in = Arc::new(tokio::sync::Barrier::new(READERS));
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for i in 0..READERS {
        let client = connect().await;
        clients.push(client.clone());
        let (tx, mut rx) = watch::channel(QueueStatus::default());
        let (path, all_in) = (path.clone(), all_in.clone());
        tasks.push(tokio::spawn(async move {
            let g = client.rwlock(&path).unwrap().read_with(None, Some(&tx)).await.unwrap().unwrap();
            // Every reader must hold at the same time for the barrier to open.
            tokio::time::timeout(BOUND, all_in.wait()).await.expect("readers hold together");
            g.release().await.unwrap();
        }));
        tokio::time::timeout(BOUND, rx.wait_for(|s| s.ahead == i + 1)).await.unwrap().unwrap();
    }
    // A writer queued after the readers must wait for them.
    let w2 = connect().await;
    let late_writer = w2.rwlock(&path).unwrap();
    writer.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
    }
    let wakeups: u64 = clients.iter().map(|c| c.metrics().snapshot().watch_wakeups).sum();
    assert_eq!(wakeups, READERS as u64, "one wake-up per reader when the writer leaves");
    late_writer.write_timeout(BOUND).await.unwrap().expect("writer after readers").release().await.unwrap();
}

#[tokio::test]
async fn rwlock_try_and_timeouts() {
    let path = unique_path("rw-try");
    let (a, b) = (connect().await, connect().await);
    let (la, lb) = (a.rwlock(&path).unwrap(), b.rwlock(&path).unwrap());
    let r = la.read().await.unwrap();
    let r2 = lb.try_read().await.unwrap().expect("readers share");
    // b holds a read guard: its own write request would be an upgrade, refused at once.
    assert!(matches!(lb.try_write().await, Err(Error::WouldDeadlock { .. })));
    let c = connect().await;
    let lc = c.rwlock(&path).unwrap();
    assert!(lc.try_write().await.unwrap().is_none(), "writer must wait for readers");
    assert!(lc.write_timeout(Duration::from_millis(200)).await.unwrap_err_or_none());
    r2.release().await.unwrap();
    assert!(lc.write_timeout(Duration::from_millis(200)).await.unwrap().is_none());
    assert_eq!(children(&a, &path).await.len(), 1, "only the reader's node remains");
    r.release().await.unwrap();
    let w = lb.try_write().await.unwrap().expect("free");
    assert!(la.try_read().await.unwrap().is_none(), "readers wait for a writer");
    w.release().await.unwrap();
}

trait UnwrapErrOrNone {
    fn unwrap_err_or_none(self) -> bool;
}
impl<T> UnwrapErrOrNone for Result<Option<T>, Error> {
    /// True when the call returned `Ok(None)`; panics otherwise. (The handle holds no read guard,
    /// so a write attempt is a plain timeout, not an upgrade.)
    fn unwrap_err_or_none(self) -> bool {
        match self {
            Ok(None) => true,
            Ok(Some(_)) => panic!("acquired while readers hold"),
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn downgrade_is_allowed_and_upgrade_refused() {
    let path = unique_path("rw-grade");
    let (a, b) = (connect().await, connect().await);
    let lock = a.rwlock(&path).unwrap();
    // Upgrade: holding a read guard, asking the same handle for write is refused at once.
    let r = lock.read().await.unwrap();
    let e = lock.write().await.unwrap_err();
    assert!(matches!(e, Error::WouldDeadlock { .. }), "{e}");
    assert!(e.to_string().contains("upgrade"), "{e}");
    r.release().await.unwrap();
    // Downgrade: write, then read, then drop the write: a waiting writer still waits, readers enter.
    let w = lock.write().await.unwrap();
    let other = b.rwlock(&path).unwrap();
    let (tx, mut rx) = watch::channel(QueueStatus::default());
    let waiting_writer = tokio::spawn(async move {
        let g = other.write_with(None, Some(&tx)).await.unwrap().unwrap();
        g.release().await.unwrap();
        other
    });
    tokio::time::timeout(BOUND, rx.wait_for(|s| s.ahead == 1)).await.unwrap().unwrap();
    let r = w.downgrade().await.unwrap();
    assert!(r.node_path().contains("__READ__"));
    w.release().await.unwrap();
    // The writer queued behind us still may not enter: our read node sits at our write's place.
    let c = connect().await;
    assert!(c.rwlock(&path).unwrap().try_write().await.unwrap().is_none());
    assert!(!waiting_writer.is_finished());
    r.release().await.unwrap();
    tokio::time::timeout(BOUND, waiting_writer).await.unwrap().unwrap();
    assert!(children(&a, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_never_exceeds_its_permits() {
    const SESSIONS: usize = 6;
    const PERMITS: u32 = 2;
    let path = unique_path("sem");
    // Sharing is forced, not hoped for: two sessions hold a permit each at once, and a third
    // finds none left.
    {
        let (a, b, c) = (connect().await, connect().await, connect().await);
        let pa = a.semaphore(&path, PERMITS).unwrap().acquire().await.unwrap();
        let pb = tokio::time::timeout(BOUND, b.semaphore(&path, PERMITS).unwrap().acquire())
            .await
            .expect("the second permit is free while the first is held")
            .unwrap();
        assert!(c.semaphore(&path, PERMITS).unwrap().try_acquire().await.unwrap().is_none(), "a third permit");
        pa.release().await.unwrap();
        pb.release().await.unwrap();
    }
    // Then six sessions contend; whatever the interleaving, never more than PERMITS inside.
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..SESSIONS {
        let (path, inside, most) = (path.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect().await;
            let sem = client.semaphore(&path, PERMITS).unwrap();
            for _ in 0..8 {
                let p = sem.acquire().await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                p.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await.unwrap().unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS as usize, "{most} holders at once");
    let admin = connect().await;
    assert!(children(&admin, &format!("{path}/leases")).await.is_empty());
    assert!(children(&admin, &format!("{path}/locks")).await.is_empty());
}

#[tokio::test]
async fn semaphore_timeouts_bad_counts_and_dead_holders() {
    let path = unique_path("sem-edge");
    let (a, b) = (connect().await, connect().await);
    let sa = a.semaphore(&path, 2).unwrap();
    let sb = b.semaphore(&path, 2).unwrap();
    assert!(matches!(a.semaphore(&path, 0), Err(Error::InvalidArgument { what: "permit count", .. })));
    assert!(matches!(sa.acquire_many(3).await, Err(Error::InvalidArgument { .. })));
    let two = sa.acquire_many(2).await.unwrap();
    assert_eq!(two.num_permits(), 2);
    assert!(sb.try_acquire().await.unwrap().is_none());
    assert!(sb.acquire_timeout(1, Duration::from_millis(200)).await.unwrap().is_none());
    assert_eq!(children(&a, &format!("{path}/leases")).await.len(), 2, "failed attempts left leases");
    // A holder whose session dies frees its permits.
    let waiter = tokio::spawn(async move { sb.acquire_many(2).await.unwrap() });
    drop(two); // dropped: released without awaiting
    let got = tokio::time::timeout(BOUND, waiter).await.unwrap().unwrap();
    let s2 = a.semaphore_mutex(&format!("{path}-m")).unwrap();
    let m = s2.acquire().await.unwrap();
    // A semaphore mutex permit may be released by another task.
    tokio::spawn(async move { m.release().await.unwrap() }).await.unwrap();
    assert!(s2.try_acquire().await.unwrap().is_some());
    got.release().await.unwrap();
}

#[tokio::test]
async fn revocation_asks_the_holder_to_release() {
    let path = unique_path("revoke");
    let (a, b) = (connect().await, connect().await);
    let holder = a.mutex(&path).unwrap().lock().await.unwrap();
    let asked = holder.revocation_requested();
    let node = holder.node_path().to_string();
    let holder_task = tokio::spawn(async move {
        asked.await;
        holder.release().await.unwrap();
    });
    b.revoke(&node).await.unwrap();
    tokio::time::timeout(BOUND, holder_task).await.expect("holder released on request").unwrap();
    b.mutex(&path).unwrap().try_lock().await.unwrap().expect("free after revocation").release().await.unwrap();
}

#[tokio::test]
async fn reentrant_mutex_counts_holds_per_handle() {
    let path = unique_path("reentrant");
    let (a, b) = (connect().await, connect().await);
    let lock = a.reentrant_mutex(&path).unwrap();
    let outer = lock.lock().await.unwrap();
    let inner = lock.try_lock().await.unwrap().expect("same owner re-enters without waiting");
    let third = lock.lock_timeout(Duration::from_millis(1)).await.unwrap().expect("re-enter");
    assert_eq!(lock.hold_count(), 3);
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert_eq!(children(&a, &path).await.len(), 1, "one node per owner, whatever the count");
    // Another handle is a stranger, even in this process on this session.
    let stranger = a.reentrant_mutex(&path).unwrap();
    assert!(stranger.try_lock().await.unwrap().is_none());
    let other = b.mutex(&path).unwrap();
    inner.release().await.unwrap();
    drop(third);
    assert_eq!(lock.hold_count(), 1);
    assert!(other.try_lock().await.unwrap().is_none(), "still held after 2 of 3 releases");
    outer.release().await.unwrap();
    assert_eq!(lock.hold_count(), 0);
    other.try_lock().await.unwrap().expect("free after the last release").release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_lock_is_all_or_nothing_and_ordered() {
    let base = unique_path("multi");
    let (a, b) = (connect().await, connect().await);
    let spec = |c: &distlock::zookeeper::Client, names: &[&str]| {
        use distlock::zookeeper::{LockSpec, MultiLock};
        MultiLock::new(names.iter().map(|n| LockSpec::Exclusive(c.mutex(&format!("{base}/{n}")).unwrap())).collect())
            .unwrap()
    };
    // Partial failure: c is held elsewhere, so a and b must be given back.
    let c_held = b.mutex(&format!("{base}/c")).unwrap().lock().await.unwrap();
    let abc = spec(&a, &["c", "a", "b"]);
    assert_eq!(abc.specs().iter().map(|s| s.path().rsplit('/').next().unwrap()).collect::<Vec<_>>(), ["a", "b", "c"]);
    assert!(abc.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    for n in ["a", "b"] {
        assert!(children(&a, &format!("{base}/{n}")).await.is_empty(), "{n} not rolled back");
    }
    assert!(matches!(abc.try_lock().await, Ok(None)));
    c_held.release().await.unwrap();
    // Two multi-locks over the same set given in opposite orders never deadlock.
    let mut tasks = Vec::new();
    for (client, names) in [(a.clone(), ["a", "b", "c"]), (b.clone(), ["c", "b", "a"])] {
        let ml = spec(&client, &names);
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                ml.lock().await.unwrap().release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.expect("no deadlock").unwrap();
    }
    let mixed = {
        use distlock::zookeeper::{LockSpec, MultiLock};
        MultiLock::new(vec![
            LockSpec::Read(a.rwlock(&format!("{base}/rw")).unwrap()),
            LockSpec::Permits(a.semaphore(&format!("{base}/sem"), 2).unwrap(), 2),
            LockSpec::Exclusive(a.mutex(&format!("{base}/m")).unwrap()),
        ])
        .unwrap()
    };
    let g = mixed.lock().await.unwrap();
    assert_eq!(g.parts().len(), 3);
    assert!(b.semaphore(&format!("{base}/sem"), 2).unwrap().try_acquire().await.unwrap().is_none());
    assert!(b.rwlock(&format!("{base}/rw")).unwrap().try_read().await.unwrap().is_some(), "readers share");
    g.release().await.unwrap();
    let dup = distlock::zookeeper::MultiLock::new(vec![
        distlock::zookeeper::LockSpec::Exclusive(a.mutex("/x").unwrap()),
        distlock::zookeeper::LockSpec::Exclusive(a.mutex("/x").unwrap()),
    ]);
    assert!(matches!(dup, Err(Error::InvalidLockPath { .. })));
}

/// Watch events delivered to waiters by one release, for the naive lock (`naive`) or the queue
/// lock. Waiters keep what they acquire until the end, so exactly one release is observed.
async fn wakeups_for_one_release(naive: bool, waiters: usize) -> (u64, usize) {
    let path = unique_path(if naive { "herd-naive" } else { "herd-queue" });
    let holder = connect().await;
    let (acq_tx, mut acq_rx) = tokio::sync::mpsc::unbounded_channel();
    let (done_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let naive_held = if naive { Some(holder.naive_lock(&path).unwrap().lock().await.unwrap()) } else { None };
    let queue_held = if naive { None } else { Some(holder.mutex(&path).unwrap().lock().await.unwrap()) };
    let mut clients = Vec::new();
    for i in 0..waiters {
        let client = connect().await;
        clients.push(client.clone());
        let (tx, mut rx) = watch::channel(QueueStatus::default());
        let (path, acq_tx, mut done) = (path.clone(), acq_tx.clone(), done_tx.subscribe());
        tokio::spawn(async move {
            if naive {
                let g = client.naive_lock(&path).unwrap().lock_with(None, Some(&tx)).await.unwrap().unwrap();
                let _ = acq_tx.send(());
                let _ = done.recv().await;
                g.release().await.unwrap();
            } else {
                let g = client.mutex(&path).unwrap().lock_with(None, Some(&tx)).await.unwrap().unwrap();
                let _ = acq_tx.send(());
                let _ = done.recv().await;
                drop(g);
            }
        });
        let ahead = if naive { 1 } else { i + 1 };
        tokio::time::timeout(BOUND, rx.wait_for(|s| s.ahead == ahead)).await.unwrap().unwrap();
    }
    drop(naive_held);
    drop(queue_held);
    tokio::time::timeout(BOUND, acq_rx.recv()).await.expect("a waiter acquires").unwrap();
    let total = || clients.iter().map(|c| c.metrics().snapshot().watch_wakeups).sum::<u64>();
    if naive {
        // Every waiter's watch fires for this one release; wait (bounded) until all are counted.
        crate::common::eventually(BOUND, "every waiter's watch wakeup counted", || {
            std::future::ready(total() >= waiters as u64)
        })
        .await;
    }
    let woke = total();
    let mut acquired = 1;
    while acq_rx.try_recv().is_ok() {
        acquired += 1;
    }
    let _ = done_tx.send(());
    (woke, acquired)
}

/// The seeds' naive lock wakes every waiter on a release; the queue lock wakes the next waiter,
/// and the one after it (whose watch on the node ahead of its predecessor tells it that it is
/// now second), never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn naive_lock_herds_queue_lock_does_not() {
    const WAITERS: usize = 6;
    let (naive, naive_holders) = wakeups_for_one_release(true, WAITERS).await;
    let (queue, queue_holders) = wakeups_for_one_release(false, WAITERS).await;
    println!("one release woke {naive} naive waiters and {queue} queue waiter(s)");
    assert_eq!((naive_holders, queue_holders), (1, 1), "one holder at a time either way");
    assert_eq!(naive, WAITERS as u64, "herd: every naive waiter wakes");
    assert!((1..=2).contains(&queue), "queue lock: {queue} waiters woke, not one or two");
}

/// Holders of a read lock and of semaphore permits that vanish (partitioned beyond their session)
/// free what they held; the next holder gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_readers_writers_and_permit_holders_free_their_locks() {
    let path = unique_path("rw-dead");
    let sem_path = unique_path("sem-dead");
    let (net, doomed) = proxied("2s").await;
    let r = doomed.rwlock(&path).unwrap().read().await.unwrap();
    let p = doomed.semaphore(&sem_path, 1).unwrap().acquire().await.unwrap();
    let (rl, pl) = (r.lost(), p.lost());
    let other = connect().await;
    let writer = other.rwlock(&path).unwrap();
    let sem = other.semaphore(&sem_path, 1).unwrap();
    assert!(writer.try_write().await.unwrap().is_none());
    assert!(sem.try_acquire().await.unwrap().is_none());
    cut_off(&net);
    let w =
        tokio::time::timeout(BOUND, writer.write()).await.expect("writer after the reader's session expired").unwrap();
    assert!(w.fencing_token() > r.fencing_token());
    let q =
        tokio::time::timeout(BOUND, sem.acquire()).await.expect("permit after its holder's session expired").unwrap();
    net.heal();
    assert_eq!(tokio::time::timeout(BOUND, rl).await.unwrap(), distlock::LostReason::LeaseExpired);
    assert_eq!(tokio::time::timeout(BOUND, pl).await.unwrap(), distlock::LostReason::LeaseExpired);
    w.release().await.unwrap();
    q.release().await.unwrap();
}

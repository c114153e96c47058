//! The ZooKeeper locks under real faults, injected by the project's fault proxy
//! (`distlock-faults`) between one client and the test server: silent partitions (no FIN, no
//! RST), resets with refused reconnection, lost replies and delayed replies. Each test states the
//! contract it checks; each failed on the code before the fault work.

use crate::common::zk::*;
use distlock::zookeeper::{Client, LockSpec, LockState, MultiLock};
use distlock::{Error, LostReason};
use distlock_faults::{Fault, FaultProxy};
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(40);
/// The session of the partitioned clients: 10 s (every server here grants it), and a 2 s
/// connect timeout, so the client notices a silent connection after 2 s.
const SESSION: &str = "10s&connect_timeout=2s";

/// A partition long enough that the client's own "no response" timer (the connect timeout, 2 s)
/// fires during it, and short enough that it heals before the lease deadline
/// (73% of the session after the last answer, which is at most 1/6 of the session before the
/// partition began): 40% of a 10 s session heals 4 s in, twice the connect timeout and at least
/// 1.6 s before the deadline, room for a busy machine's late timers. The session is the one the
/// server granted (servers cap it).
fn partition_for(client: &Client) -> Duration {
    client.session_timeout() * 40 / 100
}

/// The fault that a test applies for a while: a silent partition, or resets with reconnection
/// refused.
#[derive(Debug, Clone, Copy)]
enum Cut {
    Silent,
    Reset,
}

impl Cut {
    fn apply(self, proxy: &FaultProxy) {
        match self {
            Cut::Silent => proxy.set(Fault::Blackhole),
            Cut::Reset => {
                proxy.set(Fault::RefuseNew);
                proxy.reset_all();
            }
        }
    }
}

/// A partition within the session: `release()` waits it out and deletes the node (it used to
/// fail and leave the node, so the lock stayed held until the process exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_during_a_partition_completes_after_it() {
    for cut in [Cut::Silent, Cut::Reset] {
        let path = unique_path("release-partition");
        let (proxy, client) = proxied(SESSION).await;
        let guard = client.mutex(&path).unwrap().lock().await.unwrap();
        cut.apply(&proxy);
        let release = tokio::spawn(guard.release());
        tokio::time::sleep(partition_for(&client)).await;
        proxy.heal();
        tokio::time::timeout(BOUND, release).await.expect("release finishes").unwrap().expect("release succeeds");
        let observer = connect().await;
        assert!(children(&observer, &path).await.is_empty(), "{cut:?}: node left behind");
    }
}

/// Dropping a guard during a partition deletes its node once the server is reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_dropped_during_a_partition_is_deleted_after_it() {
    for cut in [Cut::Silent, Cut::Reset] {
        let path = unique_path("drop-partition");
        let (proxy, client) = proxied(SESSION).await;
        let guard = client.mutex(&path).unwrap().lock().await.unwrap();
        cut.apply(&proxy);
        drop(guard);
        tokio::time::sleep(partition_for(&client)).await;
        proxy.heal();
        let observer = connect().await;
        wait_empty(&observer, &path, BOUND).await;
    }
}

/// A partition within the session is `Suspended`, never `Lost` (the first `state()` during a
/// partition used to report the final `Lost(SessionClosed)`), and the lock is still ours after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_within_the_session_is_never_reported_lost() {
    for cut in [Cut::Silent, Cut::Reset] {
        let path = unique_path("no-false-loss");
        let (proxy, client) = proxied(SESSION).await;
        let guard = client.mutex(&path).unwrap().lock().await.unwrap();
        cut.apply(&proxy);
        // The monitor starts during the partition.
        assert!(!guard.state().is_lost(), "{cut:?}: lost at once");
        let mut states = guard.state_changes();
        let mut seen = vec![*states.borrow()];
        let heal_at = tokio::time::Instant::now() + partition_for(&client);
        let mut healed = false;
        let settled = tokio::time::timeout(BOUND, async {
            loop {
                tokio::select! {
                    changed = states.changed() => {
                        changed.unwrap();
                        seen.push(*states.borrow());
                        if healed && *states.borrow() == LockState::Held && seen.contains(&LockState::Suspended) {
                            return;
                        }
                    }
                    _ = tokio::time::sleep_until(heal_at), if !healed => {
                        proxy.heal();
                        healed = true;
                    }
                }
            }
        })
        .await;
        assert!(settled.is_ok(), "{cut:?}: no Suspended -> Held: {seen:?}");
        assert!(!seen.iter().any(|s| s.is_lost()), "{cut:?}: {seen:?}");
        let other = connect().await;
        assert!(other.mutex(&path).unwrap().try_lock().await.unwrap().is_none(), "{cut:?}: still held");
        guard.release().await.unwrap();
    }
}

/// `lock()` started during a partition retries and acquires after it (it used to fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_during_a_partition_acquires_after_it() {
    for cut in [Cut::Silent, Cut::Reset] {
        let path = unique_path("lock-partition");
        let (proxy, client) = proxied(SESSION).await;
        let lock = client.mutex(&path).unwrap();
        cut.apply(&proxy);
        let acquire = tokio::spawn(async move { lock.lock().await });
        tokio::time::sleep(partition_for(&client)).await;
        proxy.heal();
        let guard = tokio::time::timeout(BOUND, acquire).await.expect("lock() finishes").unwrap();
        let guard = guard.unwrap_or_else(|e| panic!("{cut:?}: lock() failed: {e}"));
        let observer = connect().await;
        assert_eq!(children(&observer, &path).await.len(), 1, "{cut:?}: exactly one node of ours");
        guard.release().await.unwrap();
    }
}

/// A `lock_timeout` whose deadline falls inside a partition returns on time and leaves no node:
/// the abandoned node used to become the head once the holder left, and nobody got the lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_inside_a_partition_abandons_nothing() {
    for cut in [Cut::Silent, Cut::Reset] {
        let path = unique_path("timeout-partition");
        let holder_client = connect().await;
        let holder = holder_client.mutex(&path).unwrap().lock().await.unwrap();
        let (proxy, client) = proxied(SESSION).await;
        let lock = client.mutex(&path).unwrap();
        // Timed inside the task: the spawn and the test's own waits are not the call's.
        let waiting = tokio::spawn(async move {
            let started = Instant::now();
            let result = lock.lock_timeout(Duration::from_secs(2)).await;
            (result, started.elapsed())
        });
        wait_children(&holder_client, &path, BOUND, "the waiter to queue", |c| c.len() == 2).await;
        cut.apply(&proxy);
        let (result, took) = tokio::time::timeout(BOUND, waiting).await.unwrap().unwrap();
        assert!(matches!(result, Ok(None)), "{cut:?}: {result:?}");
        assert!(took < Duration::from_millis(2600), "{cut:?}: lock_timeout(2s) took {took:?}");
        tokio::time::sleep(partition_for(&client).saturating_sub(took)).await;
        proxy.heal();
        holder.release().await.unwrap();
        let third = connect().await;
        let next = tokio::time::timeout(BOUND, third.mutex(&path).unwrap().lock())
            .await
            .unwrap_or_else(|_| panic!("{cut:?}: nobody gets the lock after an abandoned wait"))
            .unwrap();
        next.release().await.unwrap();
        wait_empty(&third, &path, BOUND).await;
    }
}

/// Deadlines are totals: against a server that stopped answering, `lock_timeout(1s)` returns in
/// about a second (it used to take 16 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_is_a_total_against_an_unreachable_server() {
    for cut in [Cut::Silent, Cut::Reset] {
        let path = unique_path("timeout-unreachable");
        let (proxy, client) = proxied(SESSION).await;
        cut.apply(&proxy);
        let started = Instant::now();
        let result = client.mutex(&path).unwrap().lock_timeout(Duration::from_secs(1)).await;
        let took = started.elapsed();
        assert!(matches!(result, Ok(None)), "{cut:?}: {result:?}");
        // The bug this guards against took 16 s; the bound leaves a busy machine its delays.
        assert!(took < Duration::from_millis(1800), "{cut:?}: lock_timeout(1s) took {took:?}");
        proxy.heal();
        let observer = connect().await;
        wait_empty(&observer, &path, BOUND).await;
    }
}

/// A reentrant handle's `lock_timeout` counts the wait for its own gate (it returned after 1.86 s
/// for a 1 s timeout).
#[tokio::test]
async fn reentrant_lock_timeout_is_a_total() {
    let path = unique_path("reentrant-total");
    let other = connect().await;
    let held = other.mutex(&path).unwrap().lock().await.unwrap();
    let client = connect().await;
    let lock = client.reentrant_mutex(&path).unwrap();
    let first = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock_timeout(Duration::from_millis(800)).await.map(|g| g.is_some()) })
    };
    wait_children(&other, &path, BOUND, "the first acquisition to queue", |c| c.len() == 2).await;
    let started = Instant::now();
    let second = lock.lock_timeout(Duration::from_secs(1)).await.unwrap();
    let took = started.elapsed();
    assert!(second.is_none());
    assert!(!first.await.unwrap().unwrap());
    // The bug this guards against took 1.86 s (the gate's 0.8 s plus the whole second).
    assert!(took < Duration::from_millis(1650), "lock_timeout(1s) took {took:?}");
    held.release().await.unwrap();
}

/// The reply to the create is lost (the server applied it): the acquire finds its node by its
/// unique prefix instead of failing or queueing a second node.
#[tokio::test]
async fn lost_create_reply_queues_exactly_one_node() {
    let path = unique_path("lost-create");
    let (proxy, client) = proxied(SESSION).await;
    proxy.lose_next_reply(is_lock_create);
    let guard = tokio::time::timeout(BOUND, client.mutex(&path).unwrap().lock()).await.unwrap().unwrap();
    assert!(proxy.accepted() >= 2, "the reply was not lost (no reconnection)");
    let observer = connect().await;
    assert_eq!(children(&observer, &path).await, [guard.node_path().rsplit('/').next().unwrap()]);
    guard.release().await.unwrap();
    assert!(children(&observer, &path).await.is_empty());
}

fn is_lock_create(body: &[u8]) -> bool {
    distlock_faults::zk_reply(body) && contains(body, b"-lock-")
}

fn is_lease_create(body: &[u8]) -> bool {
    distlock_faults::zk_reply(body) && contains(body, b"-lease-")
}

fn is_read_create(body: &[u8]) -> bool {
    distlock_faults::zk_reply(body) && contains(body, b"__READ__")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The reply to a semaphore's lease create is lost: no orphan lease of a live session is left
/// (the next acquirer of the last permit used to get nothing).
#[tokio::test]
async fn lost_lease_reply_leaves_no_orphan_lease() {
    let path = unique_path("lost-lease");
    let (proxy, client) = proxied(SESSION).await;
    proxy.lose_next_reply(is_lease_create);
    let permit =
        tokio::time::timeout(BOUND, client.semaphore(&path, 1).unwrap().acquire()).await.unwrap().expect("acquire");
    assert!(proxy.accepted() >= 2, "the reply was not lost (no reconnection)");
    let observer = connect().await;
    assert_eq!(children(&observer, &format!("{path}/leases")).await.len(), 1);
    permit.release().await.unwrap();
    let next = observer.semaphore(&path, 1).unwrap().try_acquire().await.unwrap();
    assert!(next.is_some(), "the last permit is free again");
    next.unwrap().release().await.unwrap();
    wait_empty(&observer, &format!("{path}/leases"), BOUND).await;
}

/// Every acquire is cancel safe at every await point: under 40 ms reply delay, an acquire dropped
/// after 0, 15, 30, … 300 ms leaves no node behind, for every recipe. The lock directories exist
/// beforehand (persistent), so every drop point falls on a known step of the acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_nothing_at_any_point() {
    let (proxy, client) = proxied(SESSION).await;
    proxy.set(Fault::Delay { to_client: Duration::from_millis(40), to_upstream: Duration::ZERO });
    let observer = connect().await;
    let mut checked = 0;
    // "timeout": a lock_timeout(60 ms) on a held lock, so later drop points fall into its cleanup.
    for recipe in ["mutex", "reentrant", "read", "write", "semaphore", "multi", "timeout"] {
        for drop_after_ms in (0..=300).step_by(15) {
            let path = unique_path(&format!("sweep-{recipe}"));
            let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
            let dirs: &[&str] = match recipe {
                "semaphore" => &["/leases", "/locks"],
                "multi" => &["/a", "/b/leases", "/b/locks"],
                _ => &[""],
            };
            for dir in dirs {
                observer.zookeeper().mkdir(&format!("{path}{dir}"), &persistent).await.unwrap();
            }
            let drop_after = Duration::from_millis(drop_after_ms);
            // Whether it was held (and dropped) or cancelled, nothing may stay.
            match recipe {
                "mutex" => {
                    let m = client.mutex(&path).unwrap();
                    drop(tokio::time::timeout(drop_after, m.lock()).await)
                }
                "reentrant" => {
                    let m = client.reentrant_mutex(&path).unwrap();
                    drop(tokio::time::timeout(drop_after, m.lock()).await)
                }
                "read" => {
                    let l = client.rwlock(&path).unwrap();
                    drop(tokio::time::timeout(drop_after, l.read()).await)
                }
                "write" => {
                    let l = client.rwlock(&path).unwrap();
                    drop(tokio::time::timeout(drop_after, l.write()).await)
                }
                "semaphore" => {
                    let s = client.semaphore(&path, 2).unwrap();
                    drop(tokio::time::timeout(drop_after, s.acquire_many(2)).await)
                }
                "timeout" => {
                    let holder = observer.mutex(&path).unwrap().lock().await.unwrap();
                    let m = client.mutex(&path).unwrap();
                    let gave_up = tokio::time::timeout(drop_after, m.lock_timeout(Duration::from_millis(60))).await;
                    assert!(!matches!(gave_up, Ok(Ok(Some(_)))), "acquired a held lock");
                    wait_children(&observer, &path, BOUND, &format!("timeout dropped at {drop_after_ms} ms"), |c| {
                        c.len() == 1 && holder.node_path().ends_with(&c[0])
                    })
                    .await;
                    holder.release().await.unwrap();
                }
                _ => {
                    let multi = MultiLock::new(vec![
                        LockSpec::Exclusive(client.mutex(&format!("{path}/a")).unwrap()),
                        LockSpec::Permits(client.semaphore(&format!("{path}/b"), 1).unwrap(), 1),
                    ])
                    .unwrap();
                    drop(tokio::time::timeout(drop_after, multi.lock()).await)
                }
            }
            for dir in [path.clone(), format!("{path}/leases"), format!("{path}/locks"), format!("{path}/a")] {
                wait_children(&observer, &dir, BOUND, &format!("{recipe} dropped at {drop_after_ms} ms"), |c| {
                    c.iter().all(|n| n == "leases" || n == "locks" || n == "a" || n == "b")
                })
                .await;
            }
            for dir in [format!("{path}/b/leases"), format!("{path}/b/locks")] {
                wait_empty(&observer, &dir, BOUND).await;
            }
            checked += 1;
        }
    }
    println!("{checked} dropped acquires checked, none left a node");
}

/// Downgrade under faults: a lost reply leaves no orphan read node (it used to block every
/// writer), and the retried downgrade returns a working read guard.
#[tokio::test]
async fn lost_downgrade_reply_leaves_no_orphan_read_node() {
    let path = unique_path("lost-downgrade");
    let (proxy, client) = proxied(SESSION).await;
    let rw = client.rwlock(&path).unwrap();
    let w = rw.write().await.unwrap();
    proxy.lose_next_reply(is_read_create);
    let r = tokio::time::timeout(BOUND, w.downgrade()).await.unwrap().expect("downgrade after a lost reply");
    assert!(proxy.accepted() >= 2, "the reply was not lost (no reconnection)");
    let observer = connect().await;
    assert_eq!(children(&observer, &path).await.len(), 2, "one write and one read node");
    w.release().await.unwrap();
    r.release().await.unwrap();
    let writer = observer.rwlock(&path).unwrap();
    let again = tokio::time::timeout(BOUND, writer.write()).await.expect("a writer gets in").unwrap();
    again.release().await.unwrap();
}

/// Upgrading through a handle whose read guard came from a downgrade is refused (it used to hang).
#[tokio::test]
async fn upgrade_after_a_downgrade_is_refused() {
    let path = unique_path("upgrade-after-downgrade");
    let client = connect().await;
    let rw = client.rwlock(&path).unwrap();
    let w = rw.write().await.unwrap();
    let r = w.downgrade().await.unwrap();
    w.release().await.unwrap();
    let upgrade = tokio::time::timeout(BOUND, rw.write()).await.expect("refused at once, not a hang");
    assert!(matches!(upgrade, Err(Error::WouldDeadlock { .. })), "{upgrade:?}");
    r.release().await.unwrap();
    rw.write().await.unwrap().release().await.unwrap();
}

/// A write lock that is already lost cannot be downgraded into a `Held` read lock.
#[tokio::test]
async fn lost_write_lock_is_not_downgraded() {
    let path = unique_path("downgrade-lost");
    let client = connect().await;
    let w = client.rwlock(&path).unwrap().write().await.unwrap();
    let lost = w.lost();
    let operator = connect().await;
    operator.zookeeper().delete(w.node_path(), None).await.unwrap();
    assert_eq!(tokio::time::timeout(BOUND, lost).await.unwrap(), LostReason::NodeDeleted);
    let result = w.downgrade().await;
    assert!(matches!(result, Err(Error::LockLost { .. })), "{:?}", result.map(|r| r.state()));
    assert!(children(&operator, &path).await.is_empty(), "no read node was created");
}

/// Fencing order across a downgrade: the read guard keeps the writer's token, so the writer
/// queued behind it carries a larger one (A's downgraded read used to get a larger token than B).
#[tokio::test]
async fn downgraded_read_keeps_the_write_token() {
    let path = unique_path("downgrade-token");
    let a = connect().await;
    let b = connect().await;
    let w = a.rwlock(&path).unwrap().write().await.unwrap();
    let b_lock = b.rwlock(&path).unwrap();
    let b_write = tokio::spawn(async move { b_lock.write().await.unwrap() });
    wait_children(&a, &path, BOUND, "B to queue", |c| c.len() == 2).await;
    let r = w.downgrade().await.unwrap();
    assert_eq!(r.fencing_token(), w.fencing_token());
    w.release().await.unwrap();
    assert!(!b_write.is_finished(), "B waits for our read");
    let (r_token, _) = (r.fencing_token(), r.release().await.unwrap());
    let bw = tokio::time::timeout(BOUND, b_write).await.unwrap().unwrap();
    assert!(bw.fencing_token() > r_token, "writer B {} after reader {}", bw.fencing_token(), r_token);
    bw.release().await.unwrap();
}

/// One path, one kind of lock: a semaphore (or semaphore mutex) on a path where a mutex or
/// readers hold is refused (both used to hold at once).
#[tokio::test]
async fn semaphore_on_a_mutex_or_rwlock_path_is_refused() {
    let path = unique_path("mixed");
    let client = connect().await;
    let m = client.mutex(&path).unwrap().lock().await.unwrap();
    let refused = client.semaphore(&path, 2).unwrap().try_acquire().await;
    assert!(matches!(refused, Err(Error::KindConflict { .. })), "{:?}", refused.map(|p| p.is_some()));
    m.release().await.unwrap();
    let rpath = unique_path("mixed-rw");
    let r = client.rwlock(&rpath).unwrap().read().await.unwrap();
    let refused = client.semaphore_mutex(&rpath).unwrap().acquire().await;
    assert!(matches!(refused, Err(Error::KindConflict { .. })), "{:?}", refused.map(|p| p.num_permits()));
    r.release().await.unwrap();
    wait_empty(&client, &format!("{path}/leases"), BOUND).await;
    wait_empty(&client, &format!("{rpath}/leases"), BOUND).await;
}

/// A semaphore and a mutex arriving on one path at the same moment never both hold: whichever
/// comes second sees the other (an empty pair of semaphore directories is ignored only when both
/// are empty, and the semaphore's gate node exists before it looks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_and_a_mutex_racing_for_one_path_never_both_hold() {
    let (a, b) = (connect().await, connect().await);
    for round in 0..500 {
        let path = unique_path("race");
        let (sem, mutex) = (a.semaphore(&path, 1).unwrap(), b.mutex(&path).unwrap());
        let (permit, guard) = tokio::join!(sem.try_acquire(), mutex.try_lock());
        let held = (matches!(permit, Ok(Some(_))), matches!(guard, Ok(Some(_))));
        assert_ne!(held, (true, true), "round {round}: both hold {path}");
        if let Ok(Some(p)) = permit {
            p.release().await.unwrap();
        }
        if let Ok(Some(g)) = guard {
            g.release().await.unwrap();
        }
    }
}

/// If our own node is deleted while we wait, the predecessor's later deletion must not grant us
/// the lock: we queue again and hold with a node that exists.
#[tokio::test]
async fn own_node_deleted_while_waiting_is_never_a_grant() {
    let path = unique_path("own-deleted");
    let a = connect().await;
    let held = a.mutex(&path).unwrap().lock().await.unwrap();
    let b = connect().await;
    let b_lock = b.mutex(&path).unwrap();
    let waiting = tokio::spawn(async move { b_lock.lock().await.unwrap() });
    wait_children(&a, &path, BOUND, "B to queue", |c| c.len() == 2).await;
    let b_node = children(&a, &path).await.into_iter().find(|c| !held.node_path().ends_with(c.as_str())).unwrap();
    // B's node goes first, then A's: both events reach B in this order.
    a.zookeeper().delete(&format!("{path}/{b_node}"), None).await.unwrap();
    held.release().await.unwrap();
    let granted = tokio::time::timeout(BOUND, waiting).await.unwrap().unwrap();
    assert!(!granted.node_path().ends_with(&b_node), "granted on a deleted node");
    assert!(a.zookeeper().check_stat(granted.node_path()).await.unwrap().is_some(), "our node exists");
    granted.release().await.unwrap();
}

/// A waiter deep in the queue (deeper than the waiters that also watch the node ahead of their
/// predecessor) watches only its predecessor, not its own node. If its node is deleted while it
/// waits, it finds out at its next listing and queues again: it is granted with a node that
/// exists, never two hold at once, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_waiter_whose_node_is_deleted_queues_again() {
    const AHEAD: usize = 20; // waiters queued before the deep one
    let path = unique_path("deep-deleted");
    let a = connect().await;
    let held = a.mutex(&path).unwrap().lock().await.unwrap();
    let waiters = connect().await;
    let holding = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hold = |lock: distlock::zookeeper::Mutex, holding: std::sync::Arc<std::sync::atomic::AtomicBool>| async move {
        let g = lock.lock().await.unwrap();
        assert!(!holding.swap(true, std::sync::atomic::Ordering::SeqCst), "two hold {}", lock.path());
        tokio::task::yield_now().await;
        holding.store(false, std::sync::atomic::Ordering::SeqCst);
        g
    };
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..AHEAD {
        let (lock, holding) = (waiters.mutex(&path).unwrap(), holding.clone());
        tasks.spawn(async move { hold(lock, holding).await.release().await.unwrap() });
    }
    wait_children(&a, &path, BOUND, "the waiters to queue", |c| c.len() == AHEAD + 1).await;
    let deep = {
        let (lock, holding) = (waiters.mutex(&path).unwrap(), holding.clone());
        tokio::spawn(async move { hold(lock, holding).await })
    };
    wait_children(&a, &path, BOUND, "the deep waiter to queue", |c| c.len() == AHEAD + 2).await;
    // The deep waiter's node is the newest: the highest sequence number.
    let deep_node =
        children(&a, &path).await.into_iter().max_by_key(|c| c.rsplit('-').next().unwrap().to_string()).unwrap();
    a.zookeeper().delete(&format!("{path}/{deep_node}"), None).await.unwrap();
    held.release().await.unwrap();
    tokio::time::timeout(BOUND, async {
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
    })
    .await
    .expect("the waiters ahead were granted in turn");
    let granted = tokio::time::timeout(BOUND, deep).await.expect("the deep waiter was granted").unwrap();
    assert!(!granted.node_path().ends_with(&deep_node), "granted on a deleted node");
    assert!(a.zookeeper().check_stat(granted.node_path()).await.unwrap().is_some(), "our node exists");
    granted.release().await.unwrap();
    wait_empty(&a, &path, BOUND).await;
}

/// Third in line, a waiter watches its predecessor and the node ahead of it; when that node goes
/// it reads whether everything further ahead is gone. Here the nodes between the holder and the
/// waiter give up while the holder still holds: the waiter must wait for the holder, not take
/// the lock when its predecessor leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_ahead_giving_up_never_pass_the_holder() {
    let path = unique_path("ahead-give-up");
    let a = connect().await;
    let held = a.mutex(&path).unwrap().lock().await.unwrap();
    let others = connect().await;
    let mut give_up = Vec::new();
    for n in 1..=2 {
        let lock = others.mutex(&path).unwrap();
        give_up.push(tokio::spawn(async move { lock.lock().await.unwrap() }));
        wait_children(&a, &path, BOUND, "a waiter to queue", |c| c.len() == n + 1).await;
    }
    let w = connect().await;
    let w_lock = w.mutex(&path).unwrap();
    let mut third = tokio::spawn(async move { w_lock.lock().await.unwrap() });
    wait_children(&a, &path, BOUND, "the third waiter to queue", |c| c.len() == 4).await;
    // The first waiter gives up (the node ahead of the third's predecessor goes), then the second
    // (its predecessor goes): the holder is still ahead.
    for (n, waiter) in give_up.into_iter().enumerate() {
        waiter.abort();
        let _ = waiter.await;
        wait_children(&a, &path, BOUND, "a waiter ahead to leave", |c| c.len() == 3 - n).await;
    }
    // Waiting for an event that must not come: its absence is bounded by a short wait after the
    // queue has settled (any grant would follow the deletions at once).
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut third).await.is_err(),
        "granted while the holder still holds"
    );
    held.release().await.unwrap();
    let granted = tokio::time::timeout(BOUND, third).await.expect("granted after the holder").unwrap();
    granted.release().await.unwrap();
    wait_empty(&a, &path, BOUND).await;
}

/// A silent partition longer than the session: the holder reports `Lost(LeaseExpired)` at its
/// lease deadline, before the server expires the session and grants the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_partition_beyond_the_session_is_lost_before_the_next_grant() {
    let path = unique_path("lease");
    let (proxy, client) = proxied("3s").await;
    let guard = client.mutex(&path).unwrap().lock().await.unwrap();
    let lost = guard.lost();
    let waiter = connect().await;
    let lock = waiter.mutex(&path).unwrap();
    let next = tokio::spawn(async move {
        let g = lock.lock().await.unwrap();
        (g, Instant::now())
    });
    wait_children(&waiter, &path, BOUND, "the waiter to queue", |c| c.len() == 2).await;
    proxy.set(Fault::Blackhole);
    let reason = tokio::time::timeout(BOUND, lost).await.expect("loss reported");
    let lost_at = Instant::now();
    assert_eq!(reason, LostReason::LeaseExpired);
    let (next, granted_at) = tokio::time::timeout(BOUND, next).await.unwrap().unwrap();
    assert!(lost_at < granted_at, "loss reported {:?} after the next grant", lost_at - granted_at);
    assert!(next.fencing_token() > guard.fencing_token());
    proxy.heal();
    next.release().await.unwrap();
    drop(guard);
    drop(client);
    wait_empty(&waiter, &path, BOUND).await;
}

/// The lease is renewed while the server answers: a holder that keeps its lock for several
/// session timeouts is never reported lost (no false loss from the lease).
#[tokio::test]
async fn a_healthy_hold_outlives_its_lease_many_times() {
    let path = unique_path("long-hold");
    let client = Client::connect(&zk_url("4s")).await.unwrap();
    let guard = client.mutex(&path).unwrap().lock().await.unwrap();
    let first_deadline = guard.lease_deadline();
    let lost = guard.lost();
    let held_for = Duration::from_secs(9);
    assert!(tokio::time::timeout(held_for, lost).await.is_err(), "reported lost while healthy");
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.lease_deadline() > first_deadline + Duration::from_secs(6), "the lease was renewed");
    guard.release().await.unwrap();
}

/// The first `state()` after the lease deadline passed is `Lost(LeaseExpired)`, not the `Held`
/// a monitor that has not run yet would still show.
#[tokio::test]
async fn first_state_after_the_lease_deadline_is_lost() {
    let path = unique_path("state-after-lease");
    let (proxy, client) = proxied("3s").await;
    let guard = client.mutex(&path).unwrap().lock().await.unwrap();
    proxy.set(Fault::Blackhole);
    // The event waited for is an instant: the deadline, as known before the partition.
    tokio::time::sleep_until(guard.lease_deadline().into()).await;
    assert_eq!(guard.state(), LockState::Lost(LostReason::LeaseExpired));
    assert_eq!(tokio::time::timeout(BOUND, guard.lost()).await.unwrap(), LostReason::LeaseExpired);
    proxy.heal();
    drop(guard);
    let observer = connect().await;
    wait_empty(&observer, &path, BOUND).await;
}

/// A `release()` the caller stops waiting for (a timeout) still deletes the node, also when its
/// first delete never reached the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_release_still_deletes_the_node() {
    let path = unique_path("abandoned-release");
    let (proxy, client) = proxied(SESSION).await;
    let guard = client.mutex(&path).unwrap().lock().await.unwrap();
    // The delete is written into a silent connection, which is then reset: it is lost unapplied.
    proxy.set(Fault::Blackhole);
    assert!(tokio::time::timeout(Duration::from_millis(300), guard.release()).await.is_err(), "release waits");
    Cut::Reset.apply(&proxy);
    tokio::time::sleep(Duration::from_millis(300)).await; // the fault's duration
    proxy.heal();
    let observer = connect().await;
    wait_empty(&observer, &path, BOUND).await;
}

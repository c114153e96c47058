//! The ZooKeeper mutex against a real server (started by scripts/test.sh).

use crate::common;
use crate::common::zk::*;
use distlock::zookeeper::{Client, LockState, QueueStatus};
use distlock::{Error, LostReason};
use futures::FutureExt;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const BOUND: Duration = Duration::from_secs(30);

/// Waits until the waiter behind `progress` is queued with `ahead` contenders before it.
async fn queued(progress: &mut watch::Receiver<QueueStatus>, ahead: usize) {
    tokio::time::timeout(BOUND, progress.wait_for(|s| s.ahead == ahead && s.queue_len > 0))
        .await
        .expect("waiter queued in time")
        .expect("progress channel open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_eight_sessions() {
    const SESSIONS: usize = 8;
    const ITERATIONS: usize = 25;
    let path = unique_path("mutex");
    let holds = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for who in 0..SESSIONS {
        let (path, holds) = (path.clone(), holds.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect().await;
            let lock = client.mutex(&path).unwrap();
            for _ in 0..ITERATIONS {
                let guard = lock.lock().await.unwrap();
                let start = Instant::now();
                tokio::task::yield_now().await;
                let end = Instant::now();
                holds.lock().unwrap().push(Hold { who, token: guard.fencing_token(), start, end });
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await.expect("contenders finish").unwrap();
    }
    let mut holds = holds.lock().unwrap().clone();
    assert_eq!(holds.len(), SESSIONS * ITERATIONS);
    assert_exclusive(&mut holds);
    let admin = connect().await;
    assert!(children(&admin, &path).await.is_empty(), "nodes left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_order_and_at_most_two_wakeups_per_release() {
    const WAITERS: usize = 6;
    let path = unique_path("fifo");
    let holder_client = connect().await;
    let first = holder_client.mutex(&path).unwrap().lock().await.unwrap();

    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = connect().await;
        clients.push(client.clone());
        let (tx, mut rx) = watch::channel(QueueStatus::default());
        let (path, order) = (path.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lock = client.mutex(&path).unwrap();
            let guard = lock.lock_with(None, Some(&tx)).await.unwrap().unwrap();
            order.lock().unwrap().push((i, guard.fencing_token()));
            guard.release().await.unwrap();
        }));
        // Enqueue strictly one after another: waiter i has i+1 contenders ahead.
        queued(&mut rx, i + 1).await;
    }
    let before: u64 = clients.iter().map(|c| c.metrics().snapshot().watch_wakeups).sum();
    assert_eq!(before, 0, "nobody may wake before the first release");
    first.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.expect("waiters finish").unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (0..WAITERS).collect::<Vec<_>>());
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "tokens rise: {order:?}");
    // WAITERS releases happened while someone waited (the first holder's and WAITERS-1 more);
    // each woke its successor, and at most one more waiter: the one two behind, which watches
    // the node ahead of its predecessor (`LOOKAHEAD_DEPTH` in queue.rs). Never a herd.
    let wakeups: u64 = clients.iter().map(|c| c.metrics().snapshot().watch_wakeups).sum();
    assert!(
        (WAITERS as u64..=2 * WAITERS as u64).contains(&wakeups),
        "{wakeups} watch events delivered to waiters for {WAITERS} releases"
    );
    assert!(children(&holder_client, &path).await.is_empty());
}

#[tokio::test]
async fn uncontended_acquire_and_release_cost_one_round_trip_each() {
    let client = connect().await;
    let lock = client.mutex(&unique_path("rtt")).unwrap();
    // First use creates the lock directory; measure the steady state.
    lock.lock().await.unwrap().release().await.unwrap();
    let a = client.metrics().snapshot();
    let guard = lock.lock().await.unwrap();
    let b = client.metrics().snapshot();
    guard.release().await.unwrap();
    let c = client.metrics().snapshot();
    assert_eq!((b - a).round_trips, 1, "acquire: {:?}", b - a);
    assert_eq!((b - a).requests, 2, "acquire sends create + getChildren");
    assert_eq!((c - b).round_trips, 1, "release: {:?}", c - b);
}

#[tokio::test]
async fn try_lock_and_timeout_leave_no_node() {
    let path = unique_path("busy");
    let a = connect().await;
    let b = connect().await;
    let held = a.mutex(&path).unwrap().lock().await.unwrap();
    let other = b.mutex(&path).unwrap();
    assert!(other.try_lock().await.unwrap().is_none());
    assert_eq!(children(&a, &path).await.len(), 1, "try_lock left a node");
    let started = Instant::now();
    assert!(other.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(children(&a, &path).await, vec![held.node_path().rsplit('/').next().unwrap().to_string()]);
    held.release().await.unwrap();
    let g = other.try_lock().await.unwrap().expect("free now");
    g.release().await.unwrap();
}

#[tokio::test]
async fn dropped_acquire_leaves_no_node() {
    let path = unique_path("cancel");
    let a = connect().await;
    let b = connect().await;
    let held = a.mutex(&path).unwrap().lock().await.unwrap();
    let (tx, mut rx) = watch::channel(QueueStatus::default());
    let lock = b.mutex(&path).unwrap();
    let task = tokio::spawn(async move { lock.lock_with(None, Some(&tx)).await.map(|g| g.is_some()) });
    queued(&mut rx, 1).await;
    assert_eq!(children(&a, &path).await.len(), 2);
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    wait_children(&a, &path, BOUND, "the cancelled waiter's node to go", |c| c.len() == 1).await;
    held.release().await.unwrap();
    assert!(children(&a, &path).await.is_empty());
}

#[tokio::test]
async fn waiter_behind_an_abandoning_predecessor_still_gets_the_lock() {
    let path = unique_path("abandon");
    let (a, b, c) = (connect().await, connect().await, connect().await);
    let held = a.mutex(&path).unwrap().lock().await.unwrap();
    // B queues, then C queues behind B.
    let (btx, mut brx) = watch::channel(QueueStatus::default());
    let block = b.mutex(&path).unwrap();
    let btask =
        tokio::spawn(
            async move { block.lock_with(Some(Duration::from_secs(60)), Some(&btx)).await.map(|g| g.is_some()) },
        );
    queued(&mut brx, 1).await;
    let (ctx, mut crx) = watch::channel(QueueStatus::default());
    let clock = c.mutex(&path).unwrap();
    let ctask = tokio::spawn(async move {
        let g = clock.lock_with(None, Some(&ctx)).await.unwrap().unwrap();
        let t = g.fencing_token();
        g.release().await.unwrap();
        t
    });
    queued(&mut crx, 2).await;
    // B gives up; C must now wait for A, not be granted while A still holds.
    btask.abort();
    let _ = btask.await;
    queued(&mut crx, 1).await;
    assert!(!ctask.is_finished(), "C must not hold while A does");
    let a_token = held.fencing_token();
    held.release().await.unwrap();
    let c_token = tokio::time::timeout(BOUND, ctask).await.expect("C acquires").unwrap();
    assert!(c_token > a_token);
    assert!(children(&a, &path).await.is_empty());
}

#[tokio::test]
async fn partition_beyond_session_timeout_is_loss_reported_before_the_next_grant() {
    let path = unique_path("expiry");
    let (net, holder) = proxied("2s").await;
    let guard = holder.mutex(&path).unwrap().lock().await.unwrap();
    assert_eq!(guard.state(), LockState::Held);
    let old_token = guard.fencing_token();
    let mut states = guard.state_changes();
    let lost = guard.lost();

    let waiter = connect().await;
    let (tx, mut rx) = watch::channel(QueueStatus::default());
    let lock = waiter.mutex(&path).unwrap();
    let next = tokio::spawn(async move {
        let g = lock.lock_with(None, Some(&tx)).await.unwrap().unwrap();
        (g, std::time::Instant::now())
    });
    queued(&mut rx, 1).await;

    // Cut the holder off. First it only knows it is disconnected: suspended, not lost.
    cut_off(&net);
    tokio::time::timeout(BOUND, states.wait_for(|s| *s == LockState::Suspended)).await.unwrap().unwrap();
    // Then its lease runs out: lost, before the server can have expired the session.
    let reason = tokio::time::timeout(BOUND, lost).await.expect("loss reported");
    let lost_at = std::time::Instant::now();
    assert_eq!(reason, LostReason::LeaseExpired);
    let deadline = guard.lease_deadline();
    assert!(lost_at >= deadline, "reported before its own deadline");
    // The server expires the session and hands the lock on only after the holder's deadline, when
    // it was told (the instant this task woke to hear it depends on the machine's load; the
    // deadline does not; the grant's instant is read after it, so never early).
    let (next, granted_at) = tokio::time::timeout(BOUND, next).await.expect("next holder").unwrap();
    assert!(deadline < granted_at, "the next grant came {:?} before the holder's deadline", deadline - granted_at);
    assert!(next.fencing_token() > old_token);
    net.heal();
    assert!(guard.state().is_lost());
    // Releasing a lost lock reports the loss instead of pretending.
    match guard.release().await {
        Err(Error::LockLost { reason: LostReason::LeaseExpired, .. }) => {}
        other => panic!("release of an expired lock: {other:?}"),
    }
    next.release().await.unwrap();
}

#[tokio::test]
async fn short_disconnect_within_the_session_is_suspension_not_loss() {
    let path = unique_path("suspend");
    let (net, holder) = proxied("6s").await;
    let guard = holder.mutex(&path).unwrap().lock().await.unwrap();
    let mut states = guard.state_changes();
    cut_off(&net);
    tokio::time::timeout(BOUND, states.wait_for(|s| *s == LockState::Suspended)).await.unwrap().unwrap();
    net.heal();
    tokio::time::timeout(BOUND, states.wait_for(|s| *s == LockState::Held)).await.unwrap().unwrap();
    let other = connect().await;
    assert!(other.mutex(&path).unwrap().try_lock().await.unwrap().is_none(), "still held after reconnecting");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn node_deleted_by_someone_else_is_loss() {
    let path = unique_path("deleted");
    let holder = connect().await;
    let guard = holder.mutex(&path).unwrap().lock().await.unwrap();
    let mut states = guard.state_changes();
    let admin = connect().await;
    admin.zookeeper().delete(guard.node_path(), None).await.unwrap();
    let state = tokio::time::timeout(BOUND, states.wait_for(|s| s.is_lost())).await.unwrap().unwrap().to_owned();
    assert_eq!(state, LockState::Lost(LostReason::NodeDeleted));
    assert!(matches!(guard.release().await, Err(Error::LockLost { reason: LostReason::NodeDeleted, .. })));
}

/// Many guards watched at once share the session's one monitor: a node deleted by someone else
/// is the loss of its own guard only, a released or dropped guard leaves the monitor, and the
/// session's expiry is every guard's loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watched_guards_each_told_of_their_own_node_and_all_of_the_session() {
    const HELD: usize = 200;
    const VICTIM: usize = 137;
    let root = unique_path("many");
    let (net, holder) = proxied("10s").await;
    let mut guards = Vec::new();
    for i in 0..HELD {
        guards.push(holder.mutex(&format!("{root}/l{i:03}")).unwrap().lock().await.unwrap());
    }
    assert_eq!(holder.watched_nodes(), 0, "nothing is watched before it is asked for");
    let mut losses: Vec<_> = guards.iter().map(|g| Some(Box::pin(g.lost()))).collect();
    assert_eq!(holder.watched_nodes(), HELD);

    // Someone asks one holder to release: that guard alone is told. The monitor learns of the
    // request only from a reply to its getData, so the node's watch is armed on the server once
    // the guard is told.
    let admin = connect().await;
    admin.revoke(guards[VICTIM].node_path()).await.unwrap();
    tokio::time::timeout(BOUND, guards[VICTIM].revocation_requested()).await.expect("the request seen");
    // Someone else deletes that node: its guard alone is lost (told by its watch), and leaves
    // the monitor.
    admin.zookeeper().delete(guards[VICTIM].node_path(), None).await.unwrap();
    let victim = losses[VICTIM].take().unwrap();
    assert_eq!(tokio::time::timeout(BOUND, victim).await.expect("the victim told"), LostReason::NodeDeleted);
    // A round trip of the holder's after the deletion: any event of it has been handled by now.
    holder.zookeeper().sync("/").await.unwrap();
    for (i, g) in guards.iter().enumerate() {
        let expected = if i == VICTIM { LockState::Lost(LostReason::NodeDeleted) } else { LockState::Held };
        assert_eq!(g.state(), expected, "guard {i}");
    }
    assert_eq!(holder.watched_nodes(), HELD - 1, "the lost node left the monitor");
    let asked = guards.iter().filter(|g| g.revocation_requested().now_or_never().is_some()).count();
    assert_eq!(asked, 1, "only the one asked is told to release");

    // A released guard and a dropped one leave it too, and nothing else is lost.
    let victim = guards.remove(VICTIM);
    losses.remove(VICTIM);
    assert!(matches!(victim.release().await, Err(Error::LockLost { reason: LostReason::NodeDeleted, .. })));
    guards.pop().unwrap().release().await.unwrap();
    drop(guards.pop());
    losses.truncate(guards.len());
    assert_eq!(holder.watched_nodes(), guards.len());
    assert!(guards.iter().all(|g| g.state() == LockState::Held));

    // The session ends on the server while the holder is cut off (a thief takes it over and
    // closes it): when the holder comes back, every guard is lost, as the session expired.
    cut_off(&net);
    let session = holder.zookeeper().session().clone();
    let thief = zookeeper_client::Client::connector().with_session(session).connect(&zk_addr()).await.unwrap();
    drop(thief);
    wait_empty(&admin, &format!("{root}/l000"), BOUND).await;
    net.heal();
    let all = futures::future::join_all(losses.into_iter().map(|l| l.unwrap()));
    let reasons = tokio::time::timeout(BOUND, all).await.expect("every guard told");
    assert!(reasons.iter().all(|r| *r == LostReason::SessionExpired), "{reasons:?}");
    assert_eq!(holder.watched_nodes(), 0, "nothing left in the monitor");
    for g in guards {
        assert!(matches!(g.release().await, Err(Error::LockLost { reason: LostReason::SessionExpired, .. })));
    }
}

#[tokio::test]
async fn fencing_token_rises_across_directory_recreation() {
    let path = unique_path("recreate");
    let client = connect().await;
    let lock = client.mutex(&path).unwrap();
    let g = lock.lock().await.unwrap();
    let first = g.fencing_token();
    g.release().await.unwrap();
    // The directory is gone (as when a container is reaped): sequence numbers restart at 0...
    client.zookeeper().delete(&path, None).await.unwrap();
    let g = lock.lock().await.unwrap();
    assert!(g.node_path().ends_with("lock-0000000000"), "{}", g.node_path());
    // ...but the token does not go back.
    assert!(g.fencing_token() > first);
    g.release().await.unwrap();
}

#[tokio::test]
async fn empty_lock_directory_is_a_container_and_is_reaped() {
    let path = unique_path("reap");
    let client = connect().await;
    client.mutex(&path).unwrap().lock().await.unwrap().release().await.unwrap();
    // scripts/zk.sh checks containers every second.
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let (stat, watcher) = client.zookeeper().check_and_watch_stat(&path).await.unwrap();
        if stat.is_none() {
            break;
        }
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!remaining.is_zero(), "lock directory not reaped");
        let _ = tokio::time::timeout(remaining, watcher.changed()).await;
    }
}

#[tokio::test]
async fn with_lock_runs_or_reports_busy() {
    let path = unique_path("template");
    let a = connect().await;
    let lock = a.mutex(&path).unwrap();
    let token = distlock::with_lock(&lock.clone().into(), Duration::from_secs(5), |t| async move { t }).await.unwrap();
    assert!(token > 0);
    let held = lock.lock().await.unwrap();
    let b = connect().await;
    let other = b.mutex(&path).unwrap().into();
    let r = distlock::with_lock(&other, Duration::from_millis(100), |_| async { unreachable!("must not run") }).await;
    assert!(matches!(r, Err(Error::Busy { .. })), "{r:?}");
    held.release().await.unwrap();
    assert!(children(&a, &path).await.is_empty());
}

#[tokio::test]
async fn with_lock_cancels_work_when_the_lock_is_lost() {
    let path = unique_path("template-lost");
    let client = connect().await;
    let admin = connect().await;
    let lock = client.mutex(&path).unwrap().into();
    let (admin_c, path_c) = (admin.clone(), path.clone());
    let r = distlock::with_lock(&lock, Duration::from_secs(5), |_| async move {
        // Someone deletes our node; the work must be stopped, not run to its end.
        let kids = children(&admin_c, &path_c).await;
        admin_c.zookeeper().delete(&format!("{path_c}/{}", kids[0]), None).await.unwrap();
        std::future::pending::<()>().await
    })
    .await;
    assert!(matches!(r, Err(Error::LockLost { reason: LostReason::NodeDeleted, .. })), "{r:?}");
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let client = connect().await;
    for bad in ["locks", "/", "/a//b", "/a/", "/zookeeper/x"] {
        let e = client.mutex(bad).unwrap_err();
        assert!(matches!(e, Error::InvalidLockPath { .. }), "{bad}: {e}");
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
    let e = Client::connect("zk://127.0.0.1:notaport").await.unwrap_err();
    assert!(e.to_string().contains("notaport"), "{e}");
    let started = Instant::now();
    let e = Client::connect("zk://127.0.0.1:1?connect_timeout=500ms").await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10), "a dead address must not hang");
}

#[test]
fn blocking_facade_locks_and_releases() {
    let url = zk_url("4s");
    let path = unique_path("blocking");
    let a = distlock::blocking::Client::connect(&url).unwrap();
    let b = distlock::blocking::Client::connect(&url).unwrap();
    let g = a.mutex(&path).unwrap().lock().unwrap();
    assert!(b.mutex(&path).unwrap().try_lock().unwrap().is_none());
    assert!(b.mutex(&path).unwrap().lock_timeout(Duration::from_millis(100)).unwrap().is_none());
    assert!(g.lost_reason().is_none());
    let t = g.fencing_token();
    drop(g); // release by drop
    let g2 = b.mutex(&path).unwrap().lock_timeout(Duration::from_secs(10)).unwrap().expect("released by drop");
    assert!(g2.fencing_token() > t);
    g2.release().unwrap();
}

/// Apache ZooKeeper set up as production is (scripts/zk.sh start-tls): only a secure client port
/// that requires client certificates, and every session must log in by SASL. A SASL user locks,
/// elects and runs a job over `zks://`, the one round trip per acquire kept; every wrong or
/// missing part is refused, quickly, by name, with the password nowhere in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_server_with_sasl_logins() {
    let server = distlock_faults::OwnServer::start("zk.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let (ca, other_ca) = (server.file("certs/ca.pem"), server.file("certs/other-ca.pem"));
    let (cert, key) = (server.file("certs/client.pem"), server.file("certs/client.key"));
    let addr = server.printed.trim().to_string();
    let files = format!("cacert={ca}&cert={cert}&key={key}");
    let url = format!("zks://distlock:{password}@{addr}?auth=sasl&{files}&lease=4s&connect_timeout=8s");
    common::secure::locks_elects_and_runs_a_job(&url).await;

    let client = Client::connect(&url).await.unwrap();
    let lock = client.mutex(&unique_path("tls-rtt")).unwrap();
    lock.lock().await.unwrap().release().await.unwrap();
    let a = client.metrics().snapshot();
    let guard = lock.lock().await.unwrap();
    let b = client.metrics().snapshot();
    assert_eq!((b - a).round_trips, 1, "acquire over TLS: {:?}", b - a);
    guard.release().await.unwrap();
    client.close(Duration::from_secs(2)).await;

    let plain = format!("zk://{addr}?lease=4s&connect_timeout=8s");
    let refused: Vec<(String, &str)> = vec![
        (url.replace(&ca, &other_ca), "not signed by a CA trusted here"),
        (url.replace(&format!("&cert={cert}&key={key}"), ""), "give cert and key"),
        (plain, "write zks://"),
        (url.replace(&password, "not-the-password"), "wrong user or password"),
        (url.replace("auth=sasl&", ""), "needs auth=sasl"),
        (url.replace(&format!("distlock:{password}@"), "").replace("auth=sasl&", ""), "requires a login"),
        (url.replace(&ca, "/no/such/ca.pem"), "/no/such/ca.pem"),
    ];
    for (bad, says) in refused {
        common::secure::refused_at_once(&bad, says, &password).await;
    }
}

/// A SASL session whose waiter watches its predecessor survives a reset (new connections
/// refused for half a second, as in the fault matrix) on a server that enforces authentication,
/// and the waiter gets the lock at the release. Before the fix in vendor/zookeeper-client the
/// client re-sent its watches (SetWatches) ahead of the SASL exchange on the new connection, and
/// the server closed the session for an unauthenticated request: "authentication failed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sasl_session_with_watches_survives_a_reset() {
    let server = distlock_faults::OwnServer::start("zk.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let files = format!(
        "cacert={}&cert={}&key={}",
        server.file("certs/ca.pem"),
        server.file("certs/client.pem"),
        server.file("certs/client.key")
    );
    let addr = server.printed.trim().to_string();
    let proxy = distlock_faults::FaultProxy::start(addr.parse().unwrap()).await.unwrap();
    let url = |at: &str| format!("zks://distlock:{password}@{at}?auth=sasl&{files}&lease=4s&connect_timeout=8s");
    let holder = Client::connect(&url(&addr)).await.unwrap();
    let waiter = Client::connect(&url(&proxy.addr().to_string())).await.unwrap();
    let name = unique_path("sasl-reset");
    let held = holder.mutex(&name).unwrap().lock().await.unwrap();
    let lock = waiter.mutex(&name).unwrap();
    let (tx, mut progress) = watch::channel(QueueStatus::default());
    let waiting = tokio::spawn(async move { lock.lock_with(Some(Duration::from_secs(20)), Some(&tx)).await });
    queued(&mut progress, 1).await; // its node is in the queue, watching the holder's
    let accepted = proxy.accepted();
    proxy.set(distlock_faults::Fault::RefuseNew);
    proxy.reset_all();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.heal();
    // On a new connection (the same session), still waiting, before the release.
    common::eventually(Duration::from_secs(10), "the waiter's reconnect", || async {
        proxy.connections() == 1 && proxy.accepted() > accepted
    })
    .await;
    held.release().await.unwrap();
    let granted = waiting.await.unwrap().expect("the waiter's session lives on").expect("granted at the release");
    granted.release().await.unwrap();
}

/// `acl=creator` against a stranger who makes the lock's directory first (open, as a client
/// without credentials can under the shared `/distlock`): the owner's acquire is refused with the
/// fix (the directory is someone else's, and would let them queue ahead or delete the holder's
/// node), its node is not left behind, and a directory of the owner's own, or one the stranger
/// made and the owner could take over, works. Fails before the check: the owner held the lock in
/// the stranger's directory, and the stranger deleted the holder's node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_creator_refuses_a_directory_a_stranger_made_first() {
    let addr = zk_addr();
    let owner = format!("zk://owner:{}@{addr}?acl=creator&lease=4s", uuid::Uuid::new_v4().simple());
    let a = distlock::connect(&owner).await.unwrap();
    let stranger = zookeeper_client::Client::connect(&addr).await.unwrap();
    let open = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let _ = stranger.create("/distlock", b"", &open).await;
    let name = common::unique("acl-first");
    let dir = format!("/distlock/{name}");
    stranger.create(&dir, b"", &open).await.unwrap();
    for (what, lock) in [("mutex", a.mutex(&name)), ("read lock", a.read_lock(&name))] {
        let e = lock.unwrap().try_lock().await.err().unwrap_or_else(|| panic!("a {what} in a stranger's directory"));
        let text = e.to_string();
        assert!(matches!(e, Error::InvalidLockPath { .. }), "{what}: {text}");
        assert!(
            text.contains("made by someone else") && text.contains("world:anyone") && text.contains("setAcl"),
            "{text}"
        );
    }
    let wait = a.mutex(&name).unwrap().lock_timeout(Duration::from_secs(3)).await;
    assert!(wait.is_err(), "a waiting acquire in a stranger's directory: {:?}", wait.map(|g| g.is_some()));
    common::eventually(Duration::from_secs(5), "the refused acquires' nodes gone", || async {
        stranger.list_children(&dir).await.unwrap().is_empty()
    })
    .await;
    // Once the directory is gone (its owner, here the stranger, deletes it), the owner's first lock
    // makes it with the owner's ACL, and the stranger can no longer touch the holder's node.
    stranger.delete(&dir, None).await.unwrap();
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let nodes = stranger.list_children(&dir).await.unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let e = stranger.delete(&format!("{dir}/{}", nodes[0]), None).await.unwrap_err();
    assert_eq!(e, zookeeper_client::Error::NoAuth);
    assert!(!held.state().is_lost());
    held.release().await.unwrap();
}

/// `acl=creator`: the nodes of a lock, of an election and of a job are the login's; a neighbour
/// without credentials can read them (holders stay visible) but can neither delete, write, nor
/// queue, and the holder is unaffected; another client with the same login takes the lock next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_creator_keeps_a_neighbour_without_credentials_out() {
    let addr = zk_addr();
    let owner = format!("zk://owner:{}@{addr}?acl=creator&lease=4s", uuid::Uuid::new_v4().simple());
    let (a, b) = (distlock::connect(&owner).await.unwrap(), distlock::connect(&owner).await.unwrap());
    // Under a parent of its own, which the first lock makes: it must stay open to other logins.
    let path = format!("/distlock-acl-{}/lock", uuid::Uuid::new_v4().simple());
    let held = a.mutex(&path).unwrap().lock().await.unwrap();
    let leading = a.election(&format!("{path}-election")).unwrap().campaign("a").await.unwrap();
    let job = a.schedule(&format!("{}-job", path.trim_start_matches('/').replace('/', "-"))).unwrap();
    match job.at_most_for(Duration::from_secs(30)).try_start().await.unwrap() {
        distlock::schedule::Started::Running(run) => drop(run.finish(Some(0)).await.unwrap()),
        distlock::schedule::Started::Skipped(s) => panic!("a fresh job skipped: {s}"),
    }

    let neighbour = zookeeper_client::Client::connect(&addr).await.unwrap();
    let nodes = neighbour.list_children(&path).await.unwrap();
    assert_eq!(nodes.len(), 1, "the holder is visible: {nodes:?}");
    let node = format!("{path}/{}", nodes[0]);
    assert_eq!(neighbour.delete(&node, None).await.unwrap_err(), zookeeper_client::Error::NoAuth);
    assert_eq!(neighbour.set_data(&node, b"mine", None).await.unwrap_err(), zookeeper_client::Error::NoAuth);
    let queue = zookeeper_client::CreateMode::EphemeralSequential.with_acls(zookeeper_client::Acls::anyone_all());
    let intruder = neighbour.create(&format!("{path}/_c_x-lock-"), b"", &queue).await;
    assert_eq!(intruder.unwrap_err(), zookeeper_client::Error::NoAuth, "a neighbour cannot queue");
    let election = format!("{path}-election");
    let candidates = neighbour.list_children(&election).await.unwrap();
    assert!(!candidates.is_empty(), "the leader's node is there");
    for child in candidates {
        let e = neighbour.delete(&format!("{election}/{child}"), None).await.unwrap_err();
        assert_eq!(e, zookeeper_client::Error::NoAuth, "election node {child}");
    }
    assert!(!held.state().is_lost(), "the holder is unaffected");
    // The shared parents stay open: another login makes its own lock (and job) beside ours.
    let other = format!("zk://other:{}@{addr}?acl=creator&lease=4s", uuid::Uuid::new_v4().simple());
    let other = distlock::connect(&other).await.unwrap();
    let beside = other.mutex(&format!("{path}-other")).unwrap().try_lock().await.unwrap().expect("its own lock");
    beside.release().await.unwrap();
    let other_job = other.schedule(&format!("{}-other-job", path.trim_start_matches('/').replace('/', "-"))).unwrap();
    match other_job.at_most_for(Duration::from_secs(30)).try_start().await.unwrap() {
        distlock::schedule::Started::Running(run) => drop(run.finish(Some(0)).await.unwrap()),
        distlock::schedule::Started::Skipped(s) => panic!("a fresh job skipped: {s}"),
    }
    leading.resign().await.unwrap();
    held.release().await.unwrap();
    let next = b.mutex(&path).unwrap().try_lock().await.unwrap().expect("the same login takes it next");
    next.release().await.unwrap();
}

/// A client refused for too many connections learns it, quickly, from the line the embedded
/// server writes before closing (the ZooKeeper client alone sees a closed connection and retries
/// until its timeout, then says only "no session established"): within the connect timeout, and
/// at it when that is too short to ask sooner.
#[tokio::test]
async fn a_client_refused_for_too_many_connections_is_told_why() {
    let server = distlock_server::EmbeddedServer::start_with(distlock_server::Config {
        tick: Duration::from_millis(500),
        max_connections_per_address: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let holder = Client::connect(&format!("{}?session_timeout=4s", server.url())).await.unwrap();
    for connect_timeout in ["10s", "200ms"] {
        let started = Instant::now();
        let url = format!("{}?session_timeout=4s&connect_timeout={connect_timeout}", server.url());
        let refused = tokio::time::timeout(BOUND, Client::connect(&url)).await.expect("connect ended in time");
        let took = started.elapsed();
        let Err(e) = refused else { panic!("a refused client connected") };
        let text = e.to_string();
        assert!(
            text.contains("distlock-server: too many connections from 127.0.0.1 (at most 1 per address)"),
            "connect_timeout={connect_timeout}: {text}"
        );
        assert!(took < Duration::from_secs(3), "connect_timeout={connect_timeout}: told only after {took:?}: {text}");
        eprintln!("connect_timeout={connect_timeout}: refused in {took:?}: {text}");
    }
    holder.close(BOUND).await;
}

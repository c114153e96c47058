//! The etcd backend against real servers: the shared member started by `scripts/test.sh`
//! (`DISTLOCK_TEST_ETCD=host:port`), and 3-member clusters of the fault tests' own
//! (`scripts/etcd.sh cluster`).
#![cfg(feature = "etcd")]

use crate::common;
use crate::common::unique;

use distlock::etcd::etcd_client::{self, LockOptions, TxnOp};
use distlock::etcd::Client;
use distlock::{Error, LockState, LostReason};
use distlock_faults::{Fault, FaultProxy, FencedResource, FreeWatch, Mode};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

fn addr() -> String {
    std::env::var("DISTLOCK_TEST_ETCD")
        .expect("DISTLOCK_TEST_ETCD is not set: run the tests with scripts/test.sh, which starts etcd on a free port")
}

async fn connect(query: &str) -> Client {
    Client::connect(&format!("etcd://{}{query}", addr())).await.expect("connect to the test etcd")
}

/// A plain etcd client, for looking at the server as a third party.
async fn raw() -> etcd_client::Client {
    etcd_client::Client::connect([addr()], None).await.unwrap()
}

/// The keys under `prefix/`, oldest first: (key, create revision, lease).
async fn keys(raw: &mut etcd_client::Client, prefix: &str) -> Vec<(String, i64, i64)> {
    use etcd_client::{GetOptions, SortOrder, SortTarget};
    let opts = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend);
    let resp = raw.get(format!("{prefix}/"), Some(opts)).await.unwrap();
    resp.kvs().iter().map(|kv| (kv.key_str().unwrap().to_string(), kv.create_revision(), kv.lease())).collect()
}

/// Waits (bounded) until `prefix/` holds `n` keys.
async fn wait_keys(raw: &mut etcd_client::Client, prefix: &str, n: usize) {
    common::eventually(Duration::from_secs(10), &format!("{prefix}/ to hold {n} keys"), || {
        let mut raw = raw.clone();
        async move { keys(&mut raw, prefix).await.len() == n }
    })
    .await;
}

#[tokio::test]
async fn the_key_layout_the_token_and_nothing_left_after_release() {
    let etcd = connect("?ttl=10s").await;
    let mut raw = raw().await;
    let name = unique("layout");
    let g = etcd.mutex(&name).unwrap().lock().await.unwrap();
    let lease = etcd.lease_id().await.unwrap();
    // etcdctl's layout: `name/<lease id hex>`, put under the session lease; the token is its
    // create revision.
    assert_eq!(g.key(), format!("{name}/{lease:x}"));
    assert_eq!(keys(&mut raw, &name).await, vec![(g.key().to_string(), g.fencing_token() as i64, lease)]);
    assert_eq!(g.state(), LockState::Held);
    assert!(g.lease_deadline() > std::time::Instant::now() + Duration::from_secs(8));
    // Held: not for anyone else, now or within a bounded wait, and neither leaves a key.
    let other = connect("?ttl=10s").await;
    assert!(other.mutex(&name).unwrap().try_lock().await.unwrap().is_none());
    let began = Instant::now();
    assert!(other.mutex(&name).unwrap().lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    assert!(began.elapsed() >= Duration::from_millis(250), "it waited: {:?}", began.elapsed());
    assert_eq!(keys(&mut raw, &name).await.len(), 1, "the refused acquires left no key");
    // The guarded write goes through while held, and not after.
    let fenced = format!("{name}-data");
    assert!(g.txn_if_held(vec![TxnOp::put(fenced.clone(), "1", None)]).await.unwrap().succeeded());
    let token = g.fencing_token();
    let view = etcd.inspect(&name).await.unwrap();
    assert_eq!(view.keys.len(), 1);
    assert_eq!(view.keys[0].create_revision as u64, token);
    // A second acquire through the same client waits for the first (they would share the key).
    let mine = etcd.mutex(&name).unwrap();
    assert!(mine.try_lock().await.unwrap().is_none());
    let second = tokio::spawn(async move { mine.lock_timeout(Duration::from_secs(10)).await.unwrap() });
    g.release().await.unwrap();
    let again = second.await.unwrap().expect("the local waiter follows");
    assert!(again.fencing_token() > token, "tokens rise");
    assert_eq!(again.key(), format!("{name}/{lease:x}"));
    again.release().await.unwrap();
    assert!(keys(&mut raw, &name).await.is_empty(), "nothing left on the server");
    raw.delete(fenced, None).await.unwrap();
    // Bad names are clear errors.
    assert!(matches!(etcd.mutex(""), Err(Error::InvalidLockPath { .. })));
    assert!(matches!(etcd.mutex("a/"), Err(Error::InvalidLockPath { .. })));
    assert!(matches!(etcd.semaphore("a", 0), Err(Error::InvalidArgument { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusion_with_the_fenced_checker_and_fifo_hand_offs() {
    const CLIENTS: usize = 4;
    const CYCLES: u64 = 15;
    let name = unique("exclusion");
    let resource = FencedResource::new(true, 1);
    let mut tasks = Vec::new();
    for who in 0..CLIENTS {
        let (name, resource) = (name.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let etcd = connect("?ttl=5s").await;
            let lock = etcd.mutex(&name).unwrap();
            for seq in 0..CYCLES {
                let g = tokio::time::timeout(Duration::from_secs(30), lock.lock()).await.unwrap().unwrap();
                let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                assert!(resource.write(who, g.fencing_token(), seq));
                tokio::time::sleep(Duration::from_millis(1)).await;
                resource.end(id);
                g.release().await.unwrap();
            }
            etcd.close(Duration::from_secs(2)).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, CLIENTS * CYCLES as usize);
    let mut raw = raw().await;
    assert!(keys(&mut raw, &name).await.is_empty(), "nothing left on the server");

    // FIFO: waiters queued one after another (each key seen on the server before the next
    // starts) get the lock in that order.
    let holder = connect("?ttl=10s").await;
    let g = holder.mutex(&name).unwrap().lock().await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4usize {
        let (n, order) = (name.clone(), order.clone());
        let etcd = connect("?ttl=10s").await;
        waiters.push(tokio::spawn(async move {
            let g = etcd.mutex(&n).unwrap().lock_timeout(Duration::from_secs(20)).await.unwrap().expect("in time");
            order.lock().unwrap().push((i, g.fencing_token()));
            g.release().await.unwrap();
        }));
        wait_keys(&mut raw, &name, i + 2).await;
    }
    g.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1, 2, 3], "served in queue order");
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "tokens rise: {order:?}");
}

#[tokio::test]
async fn readers_share_a_waiting_writer_holds_back_later_readers_and_permits_count() {
    let (a, b, c) = (connect("?ttl=10s").await, connect("?ttl=10s").await, connect("?ttl=10s").await);
    let mut raw = raw().await;
    let name = unique("rw");
    let r1 = a.rwlock(&name).unwrap().read().await.unwrap();
    assert!(r1.key().starts_with(&format!("{name}/read/")), "{}", r1.key());
    let r2 = b.rwlock(&name).unwrap().try_read().await.unwrap().expect("readers share");
    // A writer queues behind the readers; a reader that comes after it waits for it.
    let writer = c.rwlock(&name).unwrap();
    let w = tokio::spawn(async move { writer.write_timeout(Duration::from_secs(10)).await.unwrap() });
    wait_keys(&mut raw, &name, 3).await;
    assert!(a.rwlock(&name).unwrap().try_read().await.unwrap().is_none(), "a later reader waits for the writer");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = w.await.unwrap().expect("the writer after the readers");
    assert!(w.key().starts_with(&format!("{name}/write/")));
    assert!(w.fencing_token() > 0);
    assert!(b.rwlock(&name).unwrap().try_read().await.unwrap().is_none(), "readers wait for a writer");
    w.release().await.unwrap();
    assert!(keys(&mut raw, &name).await.is_empty());

    // A semaphore of 3 under 6 clients: never more than 3 holders in the checker.
    let pool = unique("pool");
    let resource = FencedResource::new(false, 3);
    let mut tasks = Vec::new();
    for who in 0..6usize {
        let (pool, resource) = (pool.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let etcd = connect("?ttl=10s").await;
            let sem = etcd.semaphore(&pool, 3).unwrap();
            for _ in 0..5 {
                let p = tokio::time::timeout(Duration::from_secs(30), sem.acquire()).await.unwrap().unwrap();
                let id = resource.begin(who, Mode::Exclusive, p.fencing_token());
                tokio::time::sleep(Duration::from_millis(2)).await;
                resource.end(id);
                p.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, 30);
    assert!(keys(&mut raw, &pool).await.is_empty());
}

/// Jepsen's finding against etcd 3.4, shown on this server, and the recipe refusing the same
/// case. A waiter whose key vanishes while it waits (its lease expired, or the key was deleted)
/// must not take the lock: a later waiter queued behind it already holds it.
///
/// - etcd's own Lock RPC (3.4.23 here): waiter B's lease expires while it waits behind A; when A
///   unlocks, B's Lock call still returns success, while C (queued after B) holds the lock too.
/// - distlock's recipe in B's place: its key is deleted while it waits; when A releases, B reads
///   its key again, finds it gone, and queues anew behind C: the checker sees no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_after_the_wait_refuses_what_the_lock_rpc_of_3_4_grants() {
    let mut raw = raw().await;
    // The server's Lock RPC, with leases of the test's own.
    let name = unique("rpc");
    let lease = |ttl| {
        let mut raw = raw.clone();
        async move { raw.lease_grant(ttl, None).await.unwrap().id() }
    };
    let (la, lb, lc) = (lease(60).await, lease(2).await, lease(60).await);
    let mut locks = raw.lock_client();
    let a = locks.lock(name.clone(), Some(LockOptions::new().with_lease(la))).await.unwrap();
    let (mut lb_client, mut lc_client) = (raw.lock_client(), raw.lock_client());
    let (nb, nc) = (name.clone(), name.clone());
    let b = tokio::spawn(async move { lb_client.lock(nb, Some(LockOptions::new().with_lease(lb))).await });
    wait_keys(&mut raw, &name, 2).await;
    let c = tokio::spawn(async move { lc_client.lock(nc, Some(LockOptions::new().with_lease(lc))).await });
    wait_keys(&mut raw, &name, 3).await;
    // B's lease runs out (nobody keeps it alive): its key goes.
    wait_keys(&mut raw, &name, 2).await;
    locks.unlock(a.key().to_vec()).await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(10), c).await.expect("C granted").unwrap().unwrap();
    let b = tokio::time::timeout(Duration::from_secs(10), b).await.expect("B answered").unwrap();
    let rpc_granted_b = b.is_ok();
    let held_now = keys(&mut raw, &name).await;
    assert_eq!(held_now.len(), 1, "only C's key is left: {held_now:?}");
    assert_eq!(held_now[0].0.as_bytes(), c.key());
    if rpc_granted_b {
        eprintln!(
            "etcd's Lock RPC granted B although its key {:?} was gone: B and C both hold {name}",
            String::from_utf8_lossy(b.as_ref().unwrap().key())
        );
    }
    assert!(rpc_granted_b, "this etcd's Lock RPC refused the expired waiter (fixed server: 3.5 or later?)");
    for l in [la, lc] {
        raw.lease_revoke(l).await.unwrap();
    }

    // The recipe in B's place.
    let name = unique("recipe");
    let resource = FencedResource::new(true, 1);
    let (ea, eb, ec) = (connect("?ttl=10s").await, connect("?ttl=10s").await, connect("?ttl=10s").await);
    let ga = ea.mutex(&name).unwrap().lock().await.unwrap();
    let hold_a = resource.begin(0, Mode::Exclusive, ga.fencing_token());
    let spawn = |who: usize, etcd: Client| {
        let (name, resource) = (name.clone(), resource.clone());
        tokio::spawn(async move {
            let g = etcd.mutex(&name).unwrap().lock_timeout(Duration::from_secs(20)).await.unwrap().expect("in time");
            let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
            assert!(resource.write(who, g.fencing_token(), 0), "a fresh holder's write refused");
            tokio::time::sleep(Duration::from_millis(300)).await;
            resource.end(id);
            let token = g.fencing_token();
            g.release().await.unwrap();
            token
        })
    };
    let b = spawn(1, eb.clone());
    wait_keys(&mut raw, &name, 2).await;
    let b_key = keys(&mut raw, &name).await[1].0.clone();
    let c = spawn(2, ec.clone());
    wait_keys(&mut raw, &name, 3).await;
    raw.delete(b_key, None).await.unwrap(); // what an expiry B's client has not heard of yet does
    resource.end(hold_a);
    ga.release().await.unwrap();
    let (tb, tc) = (b.await.unwrap(), c.await.unwrap());
    assert!(tb > tc, "B queued again behind C: tokens {tb} after {tc}");
    let report = resource.report();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, 3);
    assert!(keys(&mut raw, &name).await.is_empty());
}

/// A holder cut off by a silent partition (a proxy that drops everything) is `Lost` at its
/// lease deadline while its key is still on the server; the server expires the lease only later,
/// and the next holder's token is larger.
#[tokio::test]
async fn a_partitioned_holder_is_lost_before_the_server_expires_its_key() {
    let proxy = FaultProxy::start(addr().parse().unwrap()).await.unwrap();
    let a = Client::connect(&format!("etcd://{}?ttl=3s&timeout=1s", proxy.addr())).await.unwrap();
    let raw = raw().await;
    let name = unique("partition");
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let lost = held.lost();
    proxy.set(Fault::Blackhole);
    // The server's side, watched from now on: when our key is first seen gone.
    let watch = FreeWatch::start(Duration::from_millis(5), {
        let name = name.clone();
        move || {
            let (mut raw, name) = (raw.clone(), name.clone());
            async move { !keys(&mut raw, &name).await.is_empty() }
        }
    });
    let reason = tokio::time::timeout(Duration::from_secs(10), lost).await.expect("lost within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    // The holder's deadline came before the server expired its key.
    let deadline = held.lease_deadline();
    let freed = watch.freed_at(Duration::from_secs(10)).await;
    assert!(deadline < freed, "the server expired our key {:?} before the holder's deadline", deadline - freed);
    let b = connect("?ttl=10s").await;
    let g = b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap().expect("the lease expires");
    assert!(g.fencing_token() > held.fencing_token());
    assert!(
        !held.txn_if_held(vec![]).await.map(|r| r.succeeded()).unwrap_or(false),
        "the fence refuses the old holder"
    );
    g.release().await.unwrap();
    proxy.heal();
}

/// A session lease revoked on the server is `Lost(SessionExpired)` at the next keep-alive (a
/// third of the TTL), and the client grants a new lease for the next acquire.
#[tokio::test]
async fn a_revoked_session_is_lost_and_replaced() {
    let etcd = connect("?ttl=3s").await;
    let mut raw = raw().await;
    let name = unique("revoked");
    let g = etcd.mutex(&name).unwrap().lock().await.unwrap();
    let old = etcd.lease_id().await.unwrap();
    let lost = g.lost();
    raw.lease_revoke(old).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), lost).await.expect("lost at the next keep-alive");
    assert_eq!(reason, LostReason::SessionExpired);
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    let again = etcd.mutex(&name).unwrap().try_lock().await.unwrap().expect("free: the key went with the lease");
    assert_ne!(etcd.lease_id().await.unwrap(), old, "a new session");
    again.release().await.unwrap();
}

/// The holder's key deleted by someone else while a waiter is queued: the waiter is granted at
/// that moment, and the holder is told at once (before, it was never told: `exec` ran on for 6 s
/// beside the next holder and exited 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_key_deleted_by_someone_else_is_a_loss_told_at_once() {
    let (a, b) = (connect("?ttl=30s").await, connect("?ttl=30s").await);
    let mut raw = raw().await;
    let name = unique("deleted");
    let g = a.mutex(&name).unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        let name = name.clone();
        async move { b.mutex(&name).unwrap().lock().await.unwrap() }
    });
    wait_keys(&mut raw, &name, 2).await;
    let lost = g.lost();
    let deleted = Instant::now();
    raw.delete(g.key(), None).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), lost).await.expect("the holder is told within 2 s");
    let told = deleted.elapsed();
    assert_eq!(reason, LostReason::NodeDeleted);
    assert!(g.state().is_lost());
    let next = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("the waiter is granted").unwrap();
    assert!(next.fencing_token() > g.fencing_token());
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })), "the release reports the loss");
    next.release().await.unwrap();
    println!("the holder was told {told:?} after its key was deleted");
    // The key made again by someone else under the same name counts as deleted too.
    let g = a.mutex(&name).unwrap().lock().await.unwrap();
    let lost = g.lost();
    raw.delete(g.key(), None).await.unwrap();
    raw.put(g.key(), "not ours", None).await.unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(2), lost).await.unwrap(), LostReason::NodeDeleted);
    drop(g);
    raw.delete(name.clone(), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
}

/// Many locks held by one client share one watch stream (a watcher per key on it): a key deleted
/// by someone else is a loss told at once to its own guard only, also when the stream was broken
/// and opened again meanwhile (the watcher resumes after the last revision it saw), and the
/// guards released along the way leave the others watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_of_many_held_keys_deleted_by_someone_else_is_its_own_loss() {
    let proxy = FaultProxy::start(addr().parse().unwrap()).await.unwrap();
    let a = Client::connect(&format!("etcd://{}?ttl=30s", proxy.addr())).await.unwrap();
    let mut raw = raw().await;
    let base = unique("many-held");
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(a.mutex(&format!("{base}/l{i}")).unwrap().lock().await.unwrap());
    }
    let delete_and_tell = |i: usize, guards: &Vec<distlock::etcd::LockGuard>| {
        let (key, lost) = (guards[i].key().to_string(), guards[i].lost());
        let mut raw = raw.clone();
        async move {
            raw.delete(key, None).await.unwrap();
            tokio::time::timeout(Duration::from_secs(10), lost).await.expect("the holder is told")
        }
    };
    assert_eq!(delete_and_tell(3, &guards).await, LostReason::NodeDeleted);
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.state(), if i == 3 { LockState::Lost(LostReason::NodeDeleted) } else { LockState::Held }, "{i}");
    }
    // Released guards leave the rest watched.
    let released: Vec<_> = guards.drain(10..15).collect();
    for g in released {
        g.release().await.unwrap();
    }
    assert_eq!(delete_and_tell(12, &guards).await, LostReason::NodeDeleted);
    // The stream broken: a key deleted while it is down is told once it is open again.
    proxy.set(Fault::Blackhole);
    let (key, lost) = (guards[7].key().to_string(), guards[7].lost());
    raw.delete(key, None).await.unwrap();
    proxy.reset_all();
    proxy.heal();
    let reason = tokio::time::timeout(Duration::from_secs(20), lost).await.expect("told after the stream reopened");
    assert_eq!(reason, LostReason::NodeDeleted);
    for (i, g) in guards.iter().enumerate() {
        let want = if [3, 7, 12].contains(&i) { LockState::Lost(LostReason::NodeDeleted) } else { LockState::Held };
        assert_eq!(g.state(), want, "{i}");
    }
    drop(guards);
    a.close(Duration::from_secs(5)).await;
    raw.delete(base.clone(), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
}

/// Acquires cut off at every stage (before the create leaves, while it is in flight, after its
/// answer, while waiting) leave no key behind while the client lives. The cut-offs are spread
/// over two round trips of the create, 400 of them, so every stage is hit in every run. (A delete
/// sent at the drop could overtake the create still in flight, on another HTTP/2 stream, and the
/// key stayed for the session's life: "a cancelled acquire kept the lock".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_cut_off_at_every_stage_leave_no_key() {
    let (etcd, other) = (connect("?ttl=30s").await, connect("?ttl=30s").await);
    let mut raw = raw().await;
    for recipe in ["mutex", "semaphore"] {
        let name = unique(&format!("cutoff-{recipe}"));
        let lock = |c: &Client| -> distlock::Lock {
            let c = distlock::Client::from(c.clone());
            if recipe == "mutex" {
                c.mutex(&name).unwrap()
            } else {
                c.semaphore_permit(&name, 2).unwrap()
            }
        };
        // One create's round trip, to spread the cut-offs over.
        let started = Instant::now();
        drop(lock(&etcd).lock().await.unwrap());
        let rtt = started.elapsed().max(Duration::from_micros(200));
        // A holder makes every cut-off acquire wait once it is queued.
        let holder = if recipe == "mutex" { Some(lock(&other).lock().await.unwrap()) } else { None };
        for i in 0..400u32 {
            let cut = rtt * 2 * i / 400;
            let l = lock(&etcd);
            let _ = tokio::time::timeout(cut, l.lock()).await; // a guard got in time is dropped too
        }
        drop(holder);
        // Nothing left once the background clean-ups have run (bounded), while both clients live.
        wait_keys(&mut raw, &name, 0).await;
        // A cut-off create still in flight may land after the count reached 0 and is deleted when
        // its answer comes: allow that, not a key kept for the session's life.
        let g = lock(&other)
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free for another client within 5 s: a cut-off acquire left its key");
        g.release().await.unwrap();
    }
}

/// Acquires dropped while waiting, or cut off mid-request, leave no key behind.
#[tokio::test]
async fn dropped_waits_leave_no_key() {
    let (a, b) = (connect("?ttl=10s").await, connect("?ttl=10s").await);
    let mut raw = raw().await;
    let name = unique("dropped");
    let g = a.mutex(&name).unwrap().lock().await.unwrap();
    // A semaphore waits behind a semaphore's permit (beside a mutex it would be refused).
    let sem = unique("dropped-sem");
    let permit = a.semaphore(&sem, 1).unwrap().acquire().await.unwrap();
    for kind in 0..3 {
        let lock_b = b.clone();
        let name = if kind == 2 { sem.clone() } else { name.clone() };
        let n = name.clone();
        let mut wait: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> = match kind {
            0 => Box::pin(async move { lock_b.mutex(&n).unwrap().lock().await.map(drop) }),
            1 => Box::pin(async move { lock_b.rwlock(&n).unwrap().write().await.map(drop) }),
            _ => Box::pin(async move { lock_b.semaphore(&n, 1).unwrap().acquire().await.map(drop) }),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            tokio::select! {
                r = &mut wait => panic!("granted while held: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            if keys(&mut raw, &name).await.len() == 2 {
                break;
            }
            assert!(Instant::now() < deadline, "the wait never showed on the server");
        }
        drop(wait);
        wait_keys(&mut raw, &name, 1).await;
    }
    permit.release().await.unwrap();
    wait_keys(&mut raw, &sem, 0).await;
    for i in 0..20u64 {
        let _ = tokio::time::timeout(Duration::from_micros(100 * i), b.mutex(&name).unwrap().lock()).await;
    }
    g.release().await.unwrap();
    wait_keys(&mut raw, &name, 0).await;
    let next = b.mutex(&name).unwrap().try_lock().await.unwrap().expect("nobody else took it");
    next.release().await.unwrap();
}

// --- Clusters of the tests' own ---------------------------------------------------------------

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/etcd.sh")
}

/// A 3-member cluster in a directory of its own, stopped on drop.
struct Cluster {
    dir: PathBuf,
    addrs: Vec<String>,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = std::env::temp_dir().join(format!("distlock-etcd-cluster-{}", uuid::Uuid::new_v4().simple()));
        let out = Command::new(script()).arg("cluster").arg(&dir).output().expect("scripts/etcd.sh");
        assert!(out.status.success(), "etcd.sh cluster: {}", String::from_utf8_lossy(&out.stderr));
        let addrs = String::from_utf8(out.stdout).unwrap().trim().split(',').map(String::from).collect();
        Cluster { dir, addrs }
    }

    fn member(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{}", i + 1))
    }

    /// The index of the leader.
    fn leader(&self) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let out = Command::new(script()).arg("leader").arg(&self.dir).output().unwrap();
            if out.status.success() {
                let dir = String::from_utf8(out.stdout).unwrap();
                return (0..3).find(|&i| self.member(i).as_path() == std::path::Path::new(dir.trim())).unwrap();
            }
            assert!(std::time::Instant::now() < deadline, "no leader within 10 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid(&self, i: usize) -> u32 {
        std::fs::read_to_string(self.member(i).join("etcd.pid")).unwrap().trim().parse().unwrap()
    }

    fn run(&self, what: &str, i: usize) {
        let out = Command::new(script()).arg(what).arg(self.member(i)).output().unwrap();
        assert!(out.status.success(), "etcd.sh {what}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn url(&self, members: &[usize], query: &str) -> String {
        let hosts: Vec<&str> = members.iter().map(|&i| self.addrs[i].as_str()).collect();
        format!("etcd://{}{query}", hosts.join(","))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The leader killed under a holder: a new leader is elected within the TTL, the keep-alives go
/// on through the survivors, and the holder keeps its lock (no false loss) while nobody else
/// gets it; after the restart, the lock passes on with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_under_a_holder_is_no_loss_and_no_second_holder() {
    let cluster = Cluster::start();
    let all = [0, 1, 2];
    let a = Client::connect(&cluster.url(&all, "?ttl=6s&timeout=2s")).await.unwrap();
    let b = Client::connect(&cluster.url(&all, "?ttl=6s&timeout=2s")).await.unwrap();
    let name = unique("leader");
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let leader = cluster.leader();
    cluster.run("kill", leader);
    // Twice the TTL later the holder still holds, and nobody else got the lock meanwhile.
    let watch_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < watch_until {
        assert!(!held.state().is_lost(), "a false loss after the leader died: {:?}", held.state());
        let other = b.mutex(&name).unwrap().lock_timeout(Duration::from_millis(500)).await;
        assert!(matches!(other, Ok(None) | Err(_)), "a second holder while the first holds: {other:?}");
    }
    assert!(held.txn_if_held(vec![]).await.unwrap().succeeded(), "still ours on the server");
    cluster.run("restart", leader);
    let token = held.fencing_token();
    held.release().await.unwrap();
    let next = b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap().expect("passed on");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

/// A minority member isolated (paused with SIGSTOP) while our holder talks only to it: the
/// holder is `Lost` at its lease deadline, the majority expires the lease after it and hands the
/// lock to a client of theirs with a larger token; the old holder's fenced write is refused once
/// the member is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_an_isolated_minority_member_is_lost_before_the_majority_hands_the_lock_on() {
    let cluster = Cluster::start();
    // The member to isolate: not the leader (so the majority keeps its leader).
    let leader = cluster.leader();
    let minority = (leader + 1) % 3;
    let majority: Vec<usize> = (0..3).filter(|&i| i != minority).collect();
    let a = Client::connect(&cluster.url(&[minority], "?ttl=3s&timeout=1s")).await.unwrap();
    let b = Client::connect(&cluster.url(&majority, "?ttl=10s&timeout=2s")).await.unwrap();
    let name = unique("minority");
    let resource = FencedResource::new(true, 1);
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let id_a = resource.begin(0, Mode::Exclusive, held.fencing_token());
    let lost = held.lost();
    distlock_faults::pause(cluster.pid(minority)).unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), lost).await.expect("lost within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    resource.end(id_a);
    let g = b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(15)).await.unwrap().expect("the lease expired");
    let id_b = resource.begin(1, Mode::Exclusive, g.fencing_token());
    assert!(resource.write(1, g.fencing_token(), 0));
    let mut view = etcd_client::Client::connect(&cluster.addrs[majority[0]..=majority[0]], None).await.unwrap();
    eprintln!(
        "while paused: A {} rev {}, B {} rev {}, keys {:?}",
        held.key(),
        held.fencing_token(),
        g.key(),
        g.fencing_token(),
        keys(&mut view, &name).await
    );
    distlock_faults::resume(cluster.pid(minority)).unwrap();
    // The old holder, back in touch, is refused by the fence in etcd and in the checker. The
    // fence is a write (a compare-only transaction is a read, which the member just back answered
    // from its old state in our runs: it said "held").
    let data = format!("{name}-data");
    let (late_read, late_write) =
        common::eventually_some(Duration::from_secs(10), "the old holder's read and write answered", || async {
            let read = held.txn_if_held(vec![]).await;
            let write = held.txn_if_held(vec![TxnOp::put(data.clone(), "late write", None)]).await;
            match (read, write) {
                (Ok(r), Ok(w)) => Some((r.succeeded(), w.succeeded())),
                _ => None,
            }
        })
        .await;
    eprintln!("after resume: the old holder's compare-only read said held={late_read}, its fenced write went through={late_write}; keys {:?}", keys(&mut view, &name).await);
    assert!(!late_write, "etcd refused the old holder's fenced write");
    assert!(!resource.write(0, held.fencing_token(), 1), "the checker refused it too");
    resource.end(id_b);
    g.release().await.unwrap();
    let report = resource.report();
    assert!(report.is_clean(), "{report}");
}

/// One follower of three down: fresh clients (as `distlock exec` makes one per run) connect and
/// lock through the live members every time (8 of 20 failed at once with "tcp connect error"
/// before: the lease grant was not retried when the channel picked the dead member).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_clients_use_the_live_members_when_a_follower_is_down() {
    let cluster = Cluster::start();
    let leader = cluster.leader();
    let follower = (leader + 1) % 3;
    cluster.run("kill", follower);
    let url = cluster.url(&[0, 1, 2], "?ttl=5s&connect_timeout=5s");
    let name = unique("follower-down");
    for run in 0..20 {
        let c = Client::connect(&url).await.unwrap_or_else(|e| panic!("run {run}: {e}"));
        let g = c.mutex(&name).unwrap().try_lock().await.unwrap_or_else(|e| panic!("run {run}: {e}"));
        g.expect("nobody else holds it").release().await.unwrap();
        c.close(Duration::from_secs(2)).await;
    }
}

/// An etcd set up as production is (`scripts/etcd.sh start-tls`: TLS only, client certificates
/// required, auth enabled): `etcds://` with the CA and client certificate locks, elects and runs a
/// job both as the certificate's user and with a password; `etcdctl` over TLS sees the lock's
/// key; what falls short is refused, naming the cause, without the password.
#[tokio::test]
async fn a_tls_only_cluster_with_auth_and_client_certificates() {
    let server = distlock_faults::OwnServer::start("etcd.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let (ca, other_ca) = (server.file("certs/ca.pem"), server.file("certs/other-ca.pem"));
    let (cert, key) = (server.file("certs/client.pem"), server.file("certs/client.key"));
    let addr = server.printed.clone();
    let files = format!("cacert={ca}&cert={cert}&key={key}");
    let by_cert = format!("etcds://{addr}?ttl=5s&connect_timeout=3s&{files}");
    let by_password = format!("etcds://distlock:{password}@{addr}?ttl=5s&connect_timeout=3s&{files}");
    for url in [&by_cert, &by_password] {
        common::secure::locks_elects_and_runs_a_job(url).await;
    }
    // etcdctl over TLS sees a held lock's key (etcdctl lock's layout).
    let held = distlock::connect(&by_cert).await.unwrap();
    let g = held.mutex("tls-seen").unwrap().lock().await.unwrap();
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([&format!("--endpoints=https://{addr}"), "--cacert", &ca, "--cert", &cert, "--key", &key])
        .args(["get", "--prefix", "--keys-only", "tls-seen/"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("tls-seen/"), "{}", String::from_utf8_lossy(&out.stderr));
    g.release().await.unwrap();

    let refused: Vec<(String, &str)> = vec![
        (by_cert.replace(&ca, &other_ca), "not signed by a CA trusted here"),
        (by_password.replace(&password, "not-the-password"), "authentication failed"),
        // Plaintext to the TLS port: the server resets the connection, which the client tries
        // again; the probe names the TLS port first ("write etcds://"), or the client's own error
        // does ("ask for TLS: etcds://"). Either way the user reads etcds://.
        (by_cert.replace("etcds://", "etcd://").replace(&format!("&{files}"), ""), "etcds://"),
        (by_cert.replace(&ca, "/no/such/ca.pem"), "/no/such/ca.pem"),
        (by_cert.replace("etcds://", "etcd://"), "write etcds://"),
    ];
    for (bad, says) in refused {
        common::secure::refused_at_once(&bad, says, &password).await;
    }
}

/// Least privilege: a user whose role has readwrite on `team-a/` and `distlock/jobs/team-a/`
/// only (`scripts/etcd.sh start-tls`) locks, elects and runs jobs there; outside, etcd refuses and
/// the error names the key prefix and the grant that would allow it.
#[tokio::test]
async fn a_least_privilege_user_works_under_its_prefix_only() {
    let server = distlock_faults::OwnServer::start("etcd.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("team-a.password")).unwrap().trim().to_string();
    let (ca, cert, key) =
        (server.file("certs/ca.pem"), server.file("certs/client.pem"), server.file("certs/client.key"));
    let url = format!(
        "etcds://team-a:{password}@{}?ttl=5s&connect_timeout=3s&cacert={ca}&cert={cert}&key={key}",
        server.printed
    );
    common::secure::every_recipe_under(&url, "team-a/").await;
    let c = distlock::connect(&url).await.unwrap();
    let refused = |what: &'static str, e: distlock::Error, prefix: &str| {
        let text = e.to_string();
        let grant = format!("etcdctl role grant-permission ROLE --prefix readwrite '{prefix}'");
        assert!(
            text.contains(&format!("permission denied on key prefix {prefix}")) && text.contains(&grant),
            "{what}: {text}"
        );
        assert!(!text.contains(&password), "{what}: {text}");
    };
    refused("lock", c.mutex("team-b/x").unwrap().try_lock().await.unwrap_err(), "team-b/x/");
    refused("election", c.election("team-b/e").unwrap().campaign("v").await.unwrap_err(), "team-b/e/");
    let job = c.schedule("team-b/job").unwrap();
    refused("job", job.at_most_for(Duration::from_secs(5)).try_start().await.unwrap_err(), "distlock/jobs/team-b/job");
    // Nothing of team-a's was left behind; root sees no key outside the prefixes either.
    let root = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([&format!("--endpoints=https://{}", server.printed), "--cacert", &ca, "--cert", &cert, "--key", &key])
        .args(["--user", &format!("root:{root}-root"), "get", "--prefix", "--keys-only", ""])
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let left: Vec<&str> = keys.lines().filter(|k| !k.is_empty() && !k.starts_with("distlock/jobs/team-a/")).collect();
    assert!(left.is_empty(), "keys left behind: {left:?}");
}

/// A waiter of a one-permit semaphore waits on a watch, not in a loop of reads, and is let in
/// when the permit is released (a one-permit waiter once watched a key that never exists and
/// read the queue again at once, over and over, as long as the holder held). The waiter's
/// requests are counted on its own path to the server (a proxy), not on the server, which the
/// other tests share.
#[tokio::test]
async fn a_one_permit_waiter_waits_quietly_and_gets_the_permit() {
    let proxy = FaultProxy::start(addr().parse().unwrap()).await.unwrap();
    let a = connect("?ttl=10s").await;
    let b = Client::connect(&format!("etcd://{}?ttl=10s", proxy.addr())).await.unwrap();
    let mut raw = raw().await;
    let name = unique("one-permit");
    let held = a.semaphore(&name, 1).unwrap().acquire().await.unwrap();
    let sem = b.semaphore(&name, 1).unwrap();
    let waiter = tokio::spawn(async move { sem.acquire_timeout(Duration::from_secs(30)).await });
    wait_keys(&mut raw, &name, 2).await;
    // Over a second of waiting, a handful of writes to the server at most (a loop made thousands).
    let before = proxy.writes_to_upstream();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = proxy.writes_to_upstream() - before;
    assert!(writes < 50, "{writes} requests in a second of waiting");
    held.release().await.unwrap_or_else(|e| panic!("the holder's release: {e}"));
    let got = tokio::time::timeout(Duration::from_secs(20), waiter).await.expect("granted in time").unwrap();
    let got = got.unwrap_or_else(|e| panic!("the waiter's acquire: {e}")).expect("the permit after its release");
    got.release().await.unwrap_or_else(|e| panic!("the waiter's release: {e}"));
}

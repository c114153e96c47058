//! Tests that need redis-servers of their own, started with `scripts/redis.sh` (the shared test
//! server must not be restarted or replicated): a restart without persistence under held locks
//! (reported at once, and by every release), acquires that must be confirmed by a replica
//! (`WAIT`), Redlock over three masters, a Sentinel failover (followed by holders, by waiters and
//! by a client connecting meanwhile), and a 6-node cluster (locks over its slots, a master
//! failover with a wait riding through it, and a failover before replication caught up, through
//! the fenced checker).
#![cfg(feature = "redis")]

use crate::common;
use crate::common::eventually;

use distlock::redis::Client;
use distlock::{Error, LostReason};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

struct Server {
    dir: PathBuf,
    addr: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis.sh")
}

impl Server {
    fn start() -> Server {
        Server::launch(&["start"])
    }

    /// A replica of `master`, its link up.
    fn replica_of(master: &Server) -> Server {
        Server::launch(&["replica", "", &master.addr])
    }

    /// A Sentinel monitoring `master` as `name`.
    fn sentinel(master: &Server, name: &str) -> Server {
        Server::launch(&["sentinel", "", &master.addr, name])
    }

    fn launch(args: &[&str]) -> Server {
        let dir = std::env::temp_dir().join(format!("distlock-redis-own-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new(script());
        command.arg(args[0]).arg(&dir).args(&args[2.min(args.len())..]);
        let out = command.output().expect("scripts/redis.sh");
        assert!(out.status.success(), "redis.sh start: {}", String::from_utf8_lossy(&out.stderr));
        let addr = String::from_utf8(out.stdout).unwrap().trim().to_string();
        Server { dir, addr }
    }

    fn pid(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("redis.pid")).unwrap().trim().parse().unwrap()
    }

    fn restart(&self) {
        let out = Command::new(script()).arg("restart").arg(&self.dir).output().unwrap();
        assert!(out.status.success(), "redis.sh restart: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn a_restart_without_persistence_is_a_loss_and_tokens_keep_rising() {
    let server = Server::start();
    let redis = Client::connect(&format!("redis://{}?lease=2s", server.addr)).await.unwrap();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let g = redis.mutex("restart").unwrap().lock().await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
    }
    let held = redis.mutex("restart").unwrap().lock().await.unwrap();
    tokens.push(held.fencing_token());
    server.restart(); // empty: the lock and the fencing counter are gone
    let reason =
        tokio::time::timeout(Duration::from_secs(10), held.lost()).await.expect("the holder learns of the loss");
    assert!(matches!(reason, LostReason::KeyDeleted | LostReason::LeaseExpired), "{reason:?}");
    // The counter restarted from nothing, yet the next token is larger than every earlier one.
    let next = tokio::time::timeout(Duration::from_secs(10), redis.mutex("restart").unwrap().lock())
        .await
        .expect("the restarted server grants the lock")
        .unwrap();
    assert!(
        tokens.iter().all(|t| next.fencing_token() > *t),
        "token {} after the restart, {tokens:?} before",
        next.fencing_token()
    );
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    next.release().await.unwrap();
    drop(held);
}

/// A server restarted empty under held locks of every recipe: each holder is told at once (the
/// client's connection to the server ended, and the server's run id is another), not at its
/// next renewal a third of the lease later, and each release says the lock was lost. Holds
/// released right after a restart, before the client can have noticed it, report the loss too.
#[tokio::test]
async fn a_restart_without_persistence_is_reported_at_once_and_by_every_release() {
    let server = Server::start();
    // Renewals every 10 s: a loss reported sooner comes from the restart checks.
    let redis = Client::connect(&format!("redis://{}?lease=30s", server.addr)).await.unwrap();
    let mutex = redis.mutex("restart-mutex").unwrap().lock().await.unwrap();
    let simple = redis.simple_lock("restart-simple").unwrap().lock().await.unwrap();
    let read = redis.rwlock("restart-read").unwrap().read().await.unwrap();
    let write = redis.rwlock("restart-write").unwrap().write().await.unwrap();
    let fair = redis.fair_lock("restart-fair").unwrap().lock().await.unwrap();
    let permit = redis.semaphore("restart-pool", 2).unwrap().acquire().await.unwrap();
    let granted = std::time::Instant::now();
    server.restart(); // empty: every lock is gone
    let back = std::time::Instant::now();
    let reasons = tokio::time::timeout(Duration::from_secs(5), async {
        vec![
            mutex.lost().await,
            simple.lost().await,
            read.lost().await,
            write.lost().await,
            fair.lost().await,
            permit.lost().await,
        ]
    })
    .await
    .expect("every holder is told within 5 s of the server's return");
    eprintln!(
        "restart: every holder told {:?} after the server was back, {:?} after the grants",
        back.elapsed(),
        granted.elapsed()
    );
    assert!(reasons.iter().all(|r| *r == LostReason::KeyDeleted), "{reasons:?}");
    assert!(granted.elapsed() < Duration::from_secs(8), "told before the first renewal (10 s after the grants)");
    let releases = [
        mutex.release().await,
        simple.release().await,
        read.release().await,
        write.release().await,
        fair.release().await,
        permit.release().await,
    ];
    for r in &releases {
        assert!(matches!(r, Err(Error::LockLost { .. })), "a release after the loss: {r:?}");
    }

    // Released at once after another restart, whether or not the client noticed it yet: the
    // lock is not ours on the server any more, and the release says so.
    let mutex = redis.mutex("restart-mutex").unwrap().lock().await.unwrap();
    let simple = redis.simple_lock("restart-simple").unwrap().lock().await.unwrap();
    let permit = redis.semaphore("restart-pool", 2).unwrap().acquire().await.unwrap();
    server.restart();
    let releases = [mutex.release().await, simple.release().await, permit.release().await];
    for r in &releases {
        assert!(matches!(r, Err(Error::LockLost { .. })), "a release right after the restart: {r:?}");
    }
    // The client goes on: a new hold on the restarted server is an ordinary one.
    let again = redis.mutex("restart-mutex").unwrap().lock().await.unwrap();
    assert_eq!(again.state(), distlock::LockState::Held);
    again.release().await.unwrap();
}

/// A server restarted empty under 1,000 holds of every renewed kind, renewed in batches of 100:
/// every holder is told `KeyDeleted` (the restart sweep's batched renewals find none of them),
/// no renewal for them goes on afterwards, and their releases (each says the lock was lost)
/// leave nothing on the server.
#[tokio::test]
async fn a_restart_under_a_thousand_batched_holds_loses_every_one_and_leaves_nothing() {
    let server = Server::start();
    let redis = Client::connect(&format!("redis://{}?lease=3s", server.addr)).await.unwrap();
    let holds = crate::redis::hold_every_kind(&redis, "restart-batched", 1000).await;
    crate::redis::renewed_from_now(&holds, Duration::from_secs(20)).await;
    server.restart(); // empty: every lock is gone
    let reasons = tokio::time::timeout(Duration::from_secs(10), async {
        let mut reasons = Vec::with_capacity(holds.len());
        for h in &holds {
            reasons.push(h.lost().await);
        }
        reasons
    })
    .await
    .expect("every holder is told within 10 s of the restart");
    let deleted = reasons.iter().filter(|r| **r == LostReason::KeyDeleted).count();
    assert_eq!(
        deleted,
        holds.len(),
        "every hold lost as KeyDeleted: {:?}",
        reasons.iter().find(|r| **r != LostReason::KeyDeleted)
    );
    // Nothing renews a lost hold: over two renewal periods the server runs no script at all.
    let mut conn = raw_conn(&server.addr).await;
    let before = scripts_run(&mut conn).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // two periods of the 3 s lease: a window, not a condition
    assert_eq!(scripts_run(&mut conn).await, before, "a script ran for holds already lost");
    for h in holds {
        assert!(matches!(h.release().await, Err(Error::LockLost { .. })), "a release after the loss");
    }
    let keys: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(keys, 0, "the releases left keys on the restarted server");
}

/// How many scripts (EVALSHA and EVAL) the server has run since it started.
async fn scripts_run(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split(&[':', ','][..]).find_map(|f| f.strip_prefix("calls=")).and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[tokio::test]
async fn an_acquire_no_replica_confirms_fails_and_takes_nothing() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    // The replica's confirmation may take a while right after it is resumed: 1.5 s, under the
    // bound on each request (a sixth of the 10 s lease).
    let url = format!("redis://{}?lease=10s&replicas=1&replica_timeout=1500ms", master.addr);
    let redis = Client::connect(&url).await.unwrap();
    let g = redis.mutex("replicated").unwrap().lock().await.expect("the replica confirms");
    g.release().await.unwrap();

    distlock_faults::pause(replica.pid()).unwrap();
    for result in [
        redis.mutex("replicated").unwrap().try_lock().await.map(|g| g.is_some()),
        redis.simple_lock("replicated-simple").unwrap().try_lock().await.map(|g| g.is_some()),
        redis.semaphore("replicated-pool", 2).unwrap().try_acquire().await.map(|g| g.is_some()),
    ] {
        match result {
            Err(Error::NotReplicated { wanted: 1, acked: 0, .. }) => {}
            other => panic!("expected NotReplicated, got {other:?}"),
        }
    }
    // The grants were released again (in the background).
    let raw = redis::Client::open(format!("redis://{}", master.addr)).unwrap();
    let conn = raw.get_multiplexed_async_connection().await.unwrap();
    crate::common::eventually(Duration::from_secs(5), "no unconfirmed grants left on the master", || {
        let mut conn = conn.clone();
        async move {
            let n: i64 = redis::cmd("EXISTS")
                .arg("replicated")
                .arg("replicated-simple")
                .arg("replicated-pool")
                .query_async(&mut conn)
                .await
                .unwrap();
            n == 0
        }
    })
    .await;
    distlock_faults::resume(replica.pid()).unwrap();
    let g = redis.mutex("replicated").unwrap().lock_timeout(Duration::from_secs(5)).await.unwrap();
    g.expect("confirmed again once the replica is back").release().await.unwrap();
}

#[tokio::test]
async fn redlock_holds_with_a_majority_and_not_without() {
    let masters = [Server::start(), Server::start(), Server::start()];
    let urls: Vec<String> = masters.iter().map(|m| format!("redis://{}?lease=3s", m.addr)).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = distlock::redis::Redlock::connect(&urls).await.unwrap();
    let b = distlock::redis::Redlock::connect(&urls).await.unwrap();
    assert_eq!(a.quorum(), 2);
    assert!(matches!(distlock::redis::Redlock::connect(&urls[..2]).await, Err(Error::InvalidArgument { .. })));

    let g = a.lock("report").await.unwrap();
    assert!(g.validity_deadline() > std::time::Instant::now() + Duration::from_millis(2500));
    assert!(b.try_lock("report").await.unwrap().is_none(), "a majority holds it");
    let extended = g.extend().await.unwrap();
    assert!(extended >= g.validity_deadline() - Duration::from_millis(1));
    g.release().await.unwrap();

    // One master paused: two of three still agree.
    distlock_faults::pause(masters[2].pid()).unwrap();
    let g = b.lock_timeout("report", Duration::from_secs(5)).await.unwrap().expect("2 of 3 is a majority");
    g.release().await.unwrap();
    // Two paused: no majority, nothing taken (the live master keeps nothing).
    distlock_faults::pause(masters[1].pid()).unwrap();
    assert!(a.lock_timeout("report", Duration::from_millis(600)).await.unwrap().is_none());
    let raw = redis::Client::open(format!("redis://{}", masters[0].addr)).unwrap();
    let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
    let n: i64 = redis::cmd("EXISTS").arg("report").query_async(&mut conn).await.unwrap();
    assert_eq!(n, 0, "a failed round leaves nothing on the masters that said yes");
    distlock_faults::resume(masters[1].pid()).unwrap();
    distlock_faults::resume(masters[2].pid()).unwrap();

    // A release that finds our value gone from one master: the two others still held it. Gone
    // from two: no majority can have held it to the end, and the release says so. (The paused
    // masters may first run the rounds sent to them while paused: wait out their TTL.)
    let g = a.lock_timeout("report", Duration::from_secs(10)).await.unwrap().expect("every master is back");
    let _: i64 = redis::cmd("DEL").arg("report").query_async(&mut conn).await.unwrap();
    g.release().await.expect("2 of 3 masters still had it");
    let g = a.lock_timeout("report", Duration::from_secs(10)).await.unwrap().expect("free again");
    for m in &masters[..2] {
        let mut c = raw_conn(&m.addr).await;
        let _: i64 = redis::cmd("DEL").arg("report").query_async(&mut c).await.unwrap();
    }
    let r = g.release().await;
    assert!(matches!(r, Err(Error::LockLost { reason: LostReason::KeyDeleted, .. })), "gone from 2 of 3: {r:?}");
}

async fn raw_conn(addr: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}")).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// A master, its replica and three Sentinels that know both and each other.
struct SentinelGroup {
    master: Server,
    replica: Server,
    sentinels: [Server; 3],
}

impl SentinelGroup {
    async fn start() -> SentinelGroup {
        let master = Server::start();
        let replica = Server::replica_of(&master);
        let sentinels = [
            Server::sentinel(&master, "mymaster"),
            Server::sentinel(&master, "mymaster"),
            Server::sentinel(&master, "mymaster"),
        ];
        // Every Sentinel knows the replica and the two others (else no failover can be agreed).
        for s in &sentinels {
            eventually(Duration::from_secs(20), "the Sentinels to find each other and the replica", || async {
                let mut conn = raw_conn(&s.addr).await;
                let info: Vec<String> = redis::cmd("SENTINEL")
                    .arg("master")
                    .arg("mymaster")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                let field = |k: &str| info.iter().position(|x| x == k).and_then(|i| info.get(i + 1)).cloned();
                field("num-other-sentinels").as_deref() == Some("2") && field("num-slaves").as_deref() == Some("1")
            })
            .await;
        }
        SentinelGroup { master, replica, sentinels }
    }

    fn url(&self) -> String {
        let hosts: Vec<&str> = self.sentinels.iter().map(|s| s.addr.as_str()).collect();
        format!("redis+sentinel://{}/mymaster?lease=10s&connect_timeout=5s", hosts.join(","))
    }

    /// Waits (bounded) until the Sentinels name the replica as master.
    async fn promoted(&self) {
        eventually(Duration::from_secs(30), "the Sentinels to promote the replica", || async {
            let mut conn = raw_conn(&self.sentinels[0].addr).await;
            let addr: Option<(String, String)> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("mymaster")
                .query_async(&mut conn)
                .await
                .unwrap_or(None);
            addr.is_some_and(|(h, p)| format!("{h}:{p}") == self.replica.addr)
        })
        .await;
    }
}

#[tokio::test]
async fn a_sentinel_failover_moves_the_client_and_its_locks_to_the_new_master() {
    let group = SentinelGroup::start().await;
    let (master, replica) = (&group.master, &group.replica);
    let redis = Client::connect(&group.url()).await.unwrap();
    let before = redis.mutex("orders").unwrap().lock().await.unwrap();
    let t1 = before.fencing_token();
    before.release().await.unwrap();
    let held = redis.mutex("held").unwrap().lock().await.unwrap();
    // The replica has the held lock before the master goes (a failover can lose what it has not).
    eventually(Duration::from_secs(10), "the lock to reach the replica", || async {
        let mut conn = raw_conn(&replica.addr).await;
        redis::cmd("EXISTS").arg("held").query_async::<i64>(&mut conn).await.unwrap_or(0) == 1
    })
    .await;

    distlock_faults::pause(master.pid()).unwrap();
    let silent = std::time::Instant::now();
    group.promoted().await;
    eprintln!("failover: replica promoted {:?} after the master went silent", silent.elapsed());
    follows_the_promotion(&redis, "orders", t1, held).await;
    distlock_faults::resume(master.pid()).unwrap();
}

/// Waits and connects with time left ride through a Sentinel failover. A waiter queued on the
/// master before it went silent (its wake-up is lost with it) is granted soon after the lock is
/// freed on the new master, not when some request to the silent one times out; a client that
/// connects while the Sentinels still name the silent master connects once they name the new
/// one, within its `connect_timeout`, and waits for the lock there.
#[tokio::test]
async fn a_sentinel_failover_ends_no_wait_or_connect_with_time_left() {
    let group = SentinelGroup::start().await;
    let holder = Client::connect(&group.url()).await.unwrap();
    let held = holder.mutex("queue").unwrap().lock().await.unwrap();
    eventually(Duration::from_secs(10), "the lock to reach the replica", || async {
        let mut conn = raw_conn(&group.replica.addr).await;
        redis::cmd("EXISTS").arg("queue").query_async::<i64>(&mut conn).await.unwrap_or(0) == 1
    })
    .await;
    let waiter = Client::connect(&group.url()).await.unwrap();
    let queued = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.mutex("queue").unwrap().lock_timeout(Duration::from_secs(40)).await })
    };
    eventually(Duration::from_secs(10), "the waiter to subscribe on the master", || async {
        let mut conn = raw_conn(&group.master.addr).await;
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("redisson_lock__channel:{queue}")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        n > 0
    })
    .await;

    distlock_faults::pause(group.master.pid()).unwrap();
    let silent = std::time::Instant::now();
    // Connects while the Sentinels still name the silent master (they take seconds to agree).
    let late = {
        let hosts: Vec<&str> = group.sentinels.iter().map(|s| s.addr.as_str()).collect();
        let url = format!("redis+sentinel://{}/mymaster?lease=10s&connect_timeout=30s", hosts.join(","));
        tokio::spawn(async move { Client::connect(&url).await })
    };
    group.promoted().await;
    let promoted = std::time::Instant::now();
    eprintln!("failover: replica promoted {:?} after the master went silent", silent.elapsed());
    // The holder follows the new master (a renewal there succeeds), and frees the lock there.
    eventually(Duration::from_secs(15), "the held lock to be renewed on the new master", || async {
        held.lease_deadline() > promoted + Duration::from_secs(9) && held.state() == distlock::LockState::Held
    })
    .await;
    if queued.is_finished() {
        let ended = queued.await;
        panic!("the failover ended the wait: {ended:?}");
    }
    let freed = std::time::Instant::now();
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(20), queued)
        .await
        .expect("the waiter is granted within its wait")
        .unwrap()
        .expect("the wait rides through the failover")
        .expect("granted, not timed out");
    let after = freed.elapsed();
    eprintln!("failover: the queued waiter granted {after:?} after the lock was freed on the new master");
    assert!(after < Duration::from_secs(4), "granted {after:?} after the lock was freed");

    let late = tokio::time::timeout(Duration::from_secs(40), late)
        .await
        .expect("the connect ends within its connect_timeout")
        .unwrap()
        .expect("a client connecting during the failover reaches the new master");
    eprintln!("failover: a client connecting meanwhile connected {:?} after the master went silent", silent.elapsed());
    let third = {
        let late = late.clone();
        tokio::spawn(async move { late.mutex("queue").unwrap().lock_timeout(Duration::from_secs(20)).await })
    };
    granted.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(25), third)
        .await
        .expect("the late client's wait ends")
        .unwrap()
        .unwrap()
        .expect("granted once the waiter released");
    g.release().await.unwrap();
    distlock_faults::resume(group.master.pid()).unwrap();
}

/// After a promotion: a new acquire of `name` through `redis` reaches the new master with a
/// token above `t1`, and `held` (a 10 s lease held across the failover) is renewed there.
async fn follows_the_promotion(redis: &Client, name: &str, t1: u64, held: distlock::redis::MutexGuard) {
    let promoted = std::time::Instant::now();
    let after = tokio::time::timeout(Duration::from_secs(20), redis.mutex(name).unwrap().lock())
        .await
        .expect("the client follows the new master")
        .unwrap();
    eprintln!("failover: {name} acquired on the new master {:?} after the promotion", promoted.elapsed());
    assert!(after.fencing_token() > t1, "tokens keep rising across the failover");
    // A renewal sent after the promotion succeeded: still ours.
    eventually(Duration::from_secs(10), "the held lock to be renewed on the new master", || async {
        held.lease_deadline() > promoted + Duration::from_secs(9) && held.state() == distlock::LockState::Held
    })
    .await;
    eprintln!("failover: the held lock renewed on the new master {:?} after the promotion", promoted.elapsed());
    after.release().await.unwrap();
    held.release().await.unwrap();
}

/// A 6-node cluster from `scripts/redis.sh cluster` (3 masters, 3 replicas).
struct Cluster {
    dir: PathBuf,
    nodes: Vec<String>,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = std::env::temp_dir().join(format!("distlock-redis-cluster-{}", uuid::Uuid::new_v4().simple()));
        let out = Command::new(script()).arg("cluster").arg(&dir).output().expect("scripts/redis.sh");
        assert!(out.status.success(), "redis.sh cluster: {}", String::from_utf8_lossy(&out.stderr));
        let nodes = String::from_utf8(out.stdout).unwrap().trim().split(',').map(str::to_string).collect();
        Cluster { dir, nodes }
    }

    fn url(&self, query: &str) -> String {
        format!("redis+cluster://{}{query}", self.nodes.join(","))
    }

    fn pid(&self, addr: &str) -> u32 {
        let i = self.nodes.iter().position(|n| n == addr).expect("a node of this cluster");
        std::fs::read_to_string(self.dir.join(format!("n{}/redis.pid", i + 1))).unwrap().trim().parse().unwrap()
    }

    /// The master serving `key`'s slot, and its replica, once the first node knows both (its
    /// view of the replicas may lag the cluster's readiness by a gossip round).
    async fn owners(&self, key: &str) -> (String, String) {
        crate::common::eventually_some(
            Duration::from_secs(10),
            &format!("a master with a replica known for {key}'s slot"),
            || self.owners_now(key),
        )
        .await
    }

    async fn owners_now(&self, key: &str) -> Option<(String, String)> {
        let mut conn = raw_conn(&self.nodes[0]).await;
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(&mut conn).await.unwrap();
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await.unwrap();
        let serves = |line: &str| {
            line.split_whitespace().skip(8).any(|r| match r.split_once('-') {
                Some((a, b)) => (a.parse().unwrap_or(-1)..=b.parse().unwrap_or(-2)).contains(&slot),
                None => r.parse::<i64>().ok() == Some(slot),
            })
        };
        let master_line = nodes.lines().find(|l| l.contains("master") && serves(l))?;
        let master_id = master_line.split_whitespace().next()?;
        let addr = |line: &str| line.split_whitespace().nth(1).unwrap().split('@').next().unwrap().to_string();
        let replica_line = nodes.lines().find(|l| l.split_whitespace().nth(3) == Some(master_id))?;
        Some((addr(master_line), addr(replica_line)))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 1..=6 {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join(format!("n{i}/redis.pid"))) {
                let _ = distlock_faults::resume(pid.trim().parse().unwrap_or(0));
                // a paused node must hear SIGTERM
            }
        }
        let _ = Command::new(script()).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (bounded) until the cluster has promoted `replica`.
async fn promoted(replica: &str) {
    eventually(Duration::from_secs(30), "the replica to be promoted", || async {
        let mut conn = raw_conn(replica).await;
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap_or_default();
        info.contains("role:master")
    })
    .await;
}

async fn count_in_slot(addr: &str, key: &str) -> i64 {
    let mut conn = raw_conn(addr).await;
    let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(&mut conn).await.unwrap_or(-1);
    redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot).query_async(&mut conn).await.unwrap_or(0)
}

#[tokio::test]
async fn a_cluster_spreads_locks_over_its_masters_and_wakes_waiters_by_sharded_pubsub() {
    let cluster = Cluster::start();
    let a = Client::connect(&cluster.url("?lease=30s")).await.unwrap();
    let b = Client::connect(&cluster.url("?lease=30s")).await.unwrap();
    let mut masters = std::collections::BTreeSet::new();
    for i in 0..12 {
        let name = format!("orders-{i}");
        masters.insert(cluster.owners(&name).await.0);
        let g = a.mutex(&name).unwrap().lock().await.unwrap();
        assert!(b.mutex(&name).unwrap().try_lock().await.unwrap().is_none(), "{name}: excluded across clients");
        let view = b.inspect(&name).await.unwrap();
        assert_eq!(view.holders.len(), 1, "{name}: {view:?}");
        assert_eq!(view.last_token, Some(g.fencing_token()));
        g.release().await.unwrap();
    }
    assert_eq!(masters.len(), 3, "twelve names spread over the three masters");
    // Every recipe's keys share a slot (no CROSSSLOT), and names with a hash tag keep it.
    for name in ["simple", "tagged{eu}", "{eu}tagged"] {
        a.simple_lock(name).unwrap().lock().await.unwrap().release().await.unwrap();
        let w = a.rwlock(name).unwrap().write().await.unwrap();
        let r = a.rwlock(name).unwrap().try_read().await.unwrap();
        assert!(r.is_none(), "another handle cannot read under a write");
        w.release().await.unwrap();
        a.fair_lock(name).unwrap().lock().await.unwrap().release().await.unwrap();
        a.semaphore(name, 2).unwrap().acquire().await.unwrap().release().await.unwrap();
    }
    let e = a.mutex("bad{}tag").unwrap_err().to_string();
    assert!(e.contains("hash tag"), "{e}");
    // A waiter is woken by the sharded release message, not by the 30 s lease.
    for name in ["handoff", "handoff{eu}"] {
        let holder = a.mutex(name).unwrap().lock().await.unwrap();
        let waiter = {
            let b = b.clone();
            let name = name.to_string();
            tokio::spawn(async move { b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(20)).await.unwrap() })
        };
        let channel = format!(
            "redisson_lock__channel:{}",
            if name.contains('{') { name.to_string() } else { format!("{{{name}}}") }
        );
        let master = cluster.owners(name).await.0;
        eventually(Duration::from_secs(10), "the waiter to SSUBSCRIBE on the slot's master", || async {
            let mut conn = raw_conn(&master).await;
            let v: Vec<redis::Value> =
                redis::cmd("PUBSUB").arg("SHARDNUMSUB").arg(&channel).query_async(&mut conn).await.unwrap_or_default();
            matches!(v.get(1), Some(redis::Value::Int(n)) if *n > 0)
        })
        .await;
        let released = std::time::Instant::now();
        holder.release().await.unwrap();
        let g = waiter.await.unwrap().expect("woken by the release");
        assert!(
            released.elapsed() < Duration::from_secs(5),
            "woken {:?} after the release (the lease is 30 s)",
            released.elapsed()
        );
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_cluster_master_failover_keeps_replicated_locks_and_rising_tokens() {
    let cluster = Cluster::start();
    let redis = Client::connect(&cluster.url("?lease=10s&connect_timeout=10s")).await.unwrap();
    let (master, replica) = cluster.owners("held").await;
    let t1 = {
        let g = redis.mutex("orders{held}").unwrap().lock().await.unwrap();
        let t = g.fencing_token();
        g.release().await.unwrap();
        t
    };
    let held = redis.mutex("held").unwrap().lock().await.unwrap();
    eventually(Duration::from_secs(10), "the held lock to reach the replica", || async {
        count_in_slot(&replica, "held").await >= 2 // the lock and its token counter
    })
    .await;
    distlock_faults::pause(cluster.pid(&master)).unwrap();
    let silent = std::time::Instant::now();
    promoted(&replica).await;
    eprintln!("failover: replica promoted {:?} after the master went silent", silent.elapsed());
    follows_the_promotion(&redis, "orders{held}", t1, held).await;
}

/// A wait with time left rides through a cluster failover (requests to the silent master time
/// out, the cluster answers CLUSTERDOWN, then MOVED, while the replica takes over): the waiter
/// is granted once the lock is freed on the new master.
#[tokio::test]
async fn a_cluster_failover_ends_no_wait_with_time_left() {
    let cluster = Cluster::start();
    let holder = Client::connect(&cluster.url("?lease=10s&connect_timeout=10s")).await.unwrap();
    let waiter = Client::connect(&cluster.url("?lease=10s&connect_timeout=10s")).await.unwrap();
    let (master, replica) = cluster.owners("queue").await;
    let held = holder.mutex("queue").unwrap().lock().await.unwrap();
    eventually(Duration::from_secs(10), "the held lock to reach the replica", || async {
        count_in_slot(&replica, "queue").await >= 2 // the lock and its token counter
    })
    .await;
    let queued = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.mutex("queue").unwrap().lock_timeout(Duration::from_secs(60)).await })
    };
    eventually(Duration::from_secs(10), "the waiter to SSUBSCRIBE on the slot's master", || async {
        let mut conn = raw_conn(&master).await;
        let v: Vec<redis::Value> = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg("redisson_lock__channel:{queue}")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        matches!(v.get(1), Some(redis::Value::Int(n)) if *n > 0)
    })
    .await;
    distlock_faults::pause(cluster.pid(&master)).unwrap();
    let silent = std::time::Instant::now();
    promoted(&replica).await;
    let promoted_at = std::time::Instant::now();
    eprintln!("failover: replica promoted {:?} after the master went silent", silent.elapsed());
    eventually(Duration::from_secs(20), "the held lock to be renewed on the new master", || async {
        held.lease_deadline() > promoted_at + Duration::from_secs(9) && held.state() == distlock::LockState::Held
    })
    .await;
    if queued.is_finished() {
        let ended = queued.await;
        panic!("the failover ended the wait: {ended:?}");
    }
    let freed = std::time::Instant::now();
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(30), queued)
        .await
        .expect("the waiter is granted within its wait")
        .unwrap()
        .expect("the wait rides through the failover")
        .expect("granted, not timed out");
    eprintln!("failover: the queued waiter granted {:?} after the lock was freed", freed.elapsed());
    assert!(freed.elapsed() < Duration::from_secs(10), "granted {:?} after the lock was freed", freed.elapsed());
    granted.release().await.unwrap();
}

#[tokio::test]
async fn a_cluster_failover_before_replication_caught_up_gives_the_lock_twice_and_only_fencing_saves_the_data() {
    let cluster = Cluster::start();
    let a = Client::connect(&cluster.url("?lease=10s&connect_timeout=10s")).await.unwrap();
    let b = Client::connect(&cluster.url("?lease=10s&connect_timeout=10s")).await.unwrap();
    let (master, replica) = cluster.owners("ledger").await;
    let nodes = Nodes { master: &master, master_pid: cluster.pid(&master), replica_pid: cluster.pid(&replica) };
    lossy_failover(&a, &b, "ledger", nodes, promoted(&replica)).await;
}

#[tokio::test]
async fn a_sentinel_failover_before_replication_caught_up_gives_the_lock_twice_and_only_fencing_saves_the_data() {
    let group = SentinelGroup::start().await;
    let a = Client::connect(&group.url()).await.unwrap();
    let b = Client::connect(&group.url()).await.unwrap();
    let nodes = Nodes { master: &group.master.addr, master_pid: group.master.pid(), replica_pid: group.replica.pid() };
    lossy_failover(&a, &b, "ledger", nodes, group.promoted()).await;
}

/// The master whose replica a test cuts off.
struct Nodes<'a> {
    master: &'a str,
    master_pid: u32,
    replica_pid: u32,
}

/// A holds `name` on a master whose replica heard nothing of it; the master goes silent and the
/// replica is promoted (`promoted` resolves then). B then gets the lock A still believes it
/// holds; the fenced resource refuses A's next write, the unfenced one takes it.
async fn lossy_failover(
    a: &Client,
    b: &Client,
    name: &str,
    nodes: Nodes<'_>,
    promoted: impl std::future::Future<Output = ()>,
) {
    use distlock_faults::{FencedResource, Mode};
    let fenced = FencedResource::new(true, 1);
    let unfenced = FencedResource::new(false, 1);
    // The replica hears nothing of the grant: its link is cut and it is paused before it can
    // reconnect (a paused process still receives TCP data, so pausing alone would not do).
    let mut cut = false;
    for _ in 0..10 {
        let mut conn = raw_conn(nodes.master).await;
        let _: i64 = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica").query_async(&mut conn).await.unwrap();
        distlock_faults::pause(nodes.replica_pid).unwrap();
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap();
        if info.contains("connected_slaves:0") {
            cut = true;
            break;
        }
        distlock_faults::resume(nodes.replica_pid).unwrap(); // it got back in: again
    }
    assert!(cut, "could not cut the replica off its master");
    let ga = a.mutex(name).unwrap().lock().await.unwrap();
    let ta = ga.fencing_token();
    let hold_a = [fenced.begin(1, Mode::Exclusive, ta), unfenced.begin(1, Mode::Exclusive, ta)];
    assert!(fenced.write(1, ta, 1) && unfenced.write(1, ta, 1));
    // The master goes silent before replicating it; the replica comes back and is promoted.
    distlock_faults::pause(nodes.master_pid).unwrap();
    let silent = std::time::Instant::now();
    distlock_faults::resume(nodes.replica_pid).unwrap();
    promoted.await;
    eprintln!("lossy failover: replica promoted {:?} after the master went silent", silent.elapsed());
    // B gets the lock A still believes it holds: Redis replication is asynchronous.
    let gb = tokio::time::timeout(Duration::from_secs(20), b.mutex(name).unwrap().lock())
        .await
        .expect("B acquires on the new master")
        .unwrap();
    let tb = gb.fencing_token();
    eprintln!("lossy failover: B acquired {:?} after the master went silent", silent.elapsed());
    assert!(tb > ta, "the new master's token ({tb}) is above the lost grant's ({ta}): tokens never go back");
    let hold_b = [fenced.begin(2, Mode::Exclusive, tb), unfenced.begin(2, Mode::Exclusive, tb)];
    assert!(fenced.write(2, tb, 1) && unfenced.write(2, tb, 1));
    // A, not yet told, writes once more with its old token.
    assert!(!fenced.write(1, ta, 2), "the fenced resource refuses A's stale write");
    assert!(unfenced.write(1, ta, 2), "the unfenced one takes it: the violation Redis allows");
    // A learns of the loss at its next renewal on the new master.
    let reason = tokio::time::timeout(Duration::from_secs(15), ga.lost()).await.expect("A is told");
    eprintln!("lossy failover: A told ({reason:?}) {:?} after the master went silent", silent.elapsed());
    assert_eq!(reason, LostReason::KeyDeleted);
    let [fa, ua] = hold_a;
    fenced.end(fa);
    unfenced.end(ua);
    gb.release().await.unwrap();
    let [fb, ub] = hold_b;
    fenced.end(fb);
    unfenced.end(ub);
    let (f, u) = (fenced.report(), unfenced.report());
    eprintln!("failover before replication: fenced {f}; unfenced {u}");
    assert_eq!((f.stale_accepted, f.stale_rejected), (0, 1));
    assert_eq!(u.stale_accepted, 1);
    assert_eq!(f.overlaps.len(), 1, "two holders at once: the failover gave the lock twice");
    assert_eq!(u.overlaps.len(), 1);
    distlock_faults::resume(nodes.master_pid).unwrap();
}

/// A server set up as production is (`scripts/redis.sh start-tls`: TLS only, client
/// certificates required, no default user, an ACL user with a password): `rediss://` with the
/// CA, the client certificate and key locks, elects and runs a job; everything short of that is
/// refused with an error naming the cause, within the connect timeout, without the password.
#[tokio::test]
async fn a_tls_only_server_with_an_acl_user() {
    let server = Server::launch(&["start-tls"]);
    let certs = server.dir.join("certs");
    let password = std::fs::read_to_string(server.dir.join("password")).unwrap().trim().to_string();
    let file = |name: &str| certs.join(name).display().to_string();
    let files = format!("cacert={}&cert={}&key={}", file("ca.pem"), file("client.pem"), file("client.key"));
    let url = format!("rediss://distlock:{password}@{}?lease=5s&connect_timeout=3s&{files}", server.addr);

    // Locks exclude each other, tokens rise; an election and a job run.
    common::secure::locks_elects_and_runs_a_job(&url).await;
    let a = distlock::connect(&url).await.unwrap();
    let g = a.mutex("tls-lock").unwrap().lock().await.unwrap();
    // redis-cli over TLS, as its user, sees the lock's hash.
    let out = Command::new("redis-cli")
        .args(["--tls", "--cacert", &file("ca.pem"), "--cert", &file("client.pem"), "--key", &file("client.key")])
        .args(["--user", "distlock", "--no-auth-warning", "-p", server.addr.rsplit(':').next().unwrap()])
        .args(["TYPE", "tls-lock"])
        .env("REDISCLI_AUTH", &password)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hash", "{}", String::from_utf8_lossy(&out.stderr));
    g.release().await.unwrap();

    // Everything short of the production set-up is refused, naming the cause.
    let addr = &server.addr;
    let refused: Vec<(String, &str)> = vec![
        // A CA that did not sign the server's certificate.
        (url.replace(&file("ca.pem"), &file("other-ca.pem")), "not signed by a CA trusted here"),
        // No client certificate, where the server requires one.
        (
            format!("rediss://distlock:{password}@{addr}?connect_timeout=3s&cacert={}", file("ca.pem")),
            "give cert and key",
        ),
        // A wrong password.
        (url.replace(&password, "not-the-password"), "authentication failed"),
        // No user: the default user is off.
        (url.replace(&format!("distlock:{password}@"), ""), "Authentication required"),
        // Plaintext to the TLS port.
        (format!("redis://distlock:{password}@{addr}?connect_timeout=3s"), "ask for TLS: rediss://"),
        // A CA file that does not exist.
        (url.replace(&file("ca.pem"), "/no/such/ca.pem"), "/no/such/ca.pem"),
    ];
    for (bad, says) in refused {
        common::secure::refused_at_once(&bad, says, &password).await;
    }
    // TLS asked of a plaintext server (which says nothing to a TLS handshake): named at once, not
    // at the connect timeout.
    let plain = Server::launch(&["start"]);
    let to_plain = format!("rediss://distlock:{password}@{}?connect_timeout=3s&{files}", plain.addr);
    common::secure::refused_at_once(&to_plain, "not a TLS port", &password).await;
}

/// Least privilege: ACL user `team-a` (`scripts/redis.sh`'s `lock_user_rule team-a/`: the keys
/// and channels of names under team-a/, and only the commands distlock sends) runs every recipe
/// in both layouts, Redisson's fair lock too; a name outside the prefix is refused by Redis, the
/// error naming the key and the ACL; and the user can run nothing else (FLUSHALL, CONFIG, KEYS).
#[tokio::test]
async fn a_least_privilege_acl_user_works_under_its_prefix_only() {
    let server = Server::launch(&["start-tls"]);
    let certs = server.dir.join("certs");
    let password = std::fs::read_to_string(server.dir.join("team-a.password")).unwrap().trim().to_string();
    let file = |name: &str| certs.join(name).display().to_string();
    let files = format!("cacert={}&cert={}&key={}", file("ca.pem"), file("client.pem"), file("client.key"));
    for layout in ["redisson", "simple"] {
        let url =
            format!("rediss://team-a:{password}@{}?lease=5s&connect_timeout=3s&layout={layout}&{files}", server.addr);
        common::secure::every_recipe_under(&url, "team-a/").await;
        let c = distlock::connect(&url).await.unwrap();
        let e = c.mutex("team-b/x").unwrap().try_lock().await.unwrap_err().to_string();
        assert!(e.contains("NOPERM") && e.contains("team-b/x") && !e.contains(&password), "{layout}: {e}");
        if layout == "redisson" {
            let r = c.redis().unwrap();
            let g = r.fair_lock("team-a/fair").unwrap().lock().await.unwrap();
            assert!(r.fair_lock("team-a/fair").unwrap().try_lock().await.unwrap().is_none());
            g.release().await.unwrap();
        }
        c.close(Duration::from_secs(2)).await;
    }
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert", &file("ca.pem"), "--cert", &file("client.pem"), "--key", &file("client.key")])
            .args(["--user", "team-a", "--no-auth-warning", "-p", server.addr.rsplit(':').next().unwrap()])
            .args(args)
            .env("REDISCLI_AUTH", &password)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    for args in [&["FLUSHALL"][..], &["CONFIG", "GET", "*"], &["KEYS", "*"], &["GET", "team-b/x"], &["ACL", "LIST"]] {
        let said = cli(args);
        assert!(said.contains("NOPERM"), "{args:?} was allowed: {said}");
    }
}

/// The same least-privilege rule on a Cluster (set on every node: Redis does not replicate ACLs)
/// runs every recipe under its prefix in both layouts; outside it, Redis refuses.
#[tokio::test]
async fn a_least_privilege_acl_user_on_a_cluster() {
    let cluster = Cluster::start();
    let rule = Command::new(script()).args(["lock-user-rule", "team-a/"]).output().unwrap();
    let rule = String::from_utf8(rule.stdout).unwrap();
    let password = uuid::Uuid::new_v4().simple().to_string();
    for node in &cluster.nodes {
        let mut conn = raw_conn(node).await;
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg("team-a").arg("on").arg(format!(">{password}"));
        for part in rule.split_whitespace() {
            setuser.arg(part);
        }
        let () = setuser.query_async(&mut conn).await.unwrap();
    }
    for layout in ["redisson", "simple"] {
        let url = cluster
            .url(&format!("?lease=5s&connect_timeout=5s&layout={layout}"))
            .replace("://", &format!("://team-a:{password}@"));
        common::secure::every_recipe_under(&url, "team-a/").await;
        let c = distlock::connect(&url).await.unwrap();
        let e = c.mutex("team-b/x").unwrap().try_lock().await.unwrap_err().to_string();
        assert!(e.contains("NOPERM") && !e.contains(&password), "{layout}: {e}");
        c.close(Duration::from_secs(2)).await;
    }
}

/// A Sentinel with a password of its own (`requirepass` in its configuration): the client gives
/// it with `sentinel_password=` and locks on the master it names; without it, or with a wrong
/// one, the connect is refused with the Sentinel's answer, and the password is never shown.
#[tokio::test]
async fn a_sentinel_with_its_own_password() {
    let master = Server::start();
    let dir = std::env::temp_dir().join(format!("distlock-sentinel-pw-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let password = format!("sentinel-{}", uuid::Uuid::new_v4().simple());
    std::fs::write(dir.join("password"), &password).unwrap();
    let sentinel = Server::launch(&["sentinel", "", &master.addr, "pwmaster", dir.join("password").to_str().unwrap()]);
    let url = format!("redis+sentinel://{}/pwmaster?lease=5s&connect_timeout=3s", sentinel.addr);
    let good = format!("{url}&sentinel_password={password}");
    let redis = Client::connect(&good).await.unwrap();
    let g = redis.mutex("sentinel-pw").unwrap().lock().await.unwrap();
    assert!(g.fencing_token() > 0);
    g.release().await.unwrap();
    for bad in [url.clone(), format!("{url}&sentinel_password=wrong")] {
        let e = Client::connect(&bad).await.map(|_| ()).unwrap_err().to_string();
        assert!(e.to_lowercase().contains("auth"), "{e}");
        assert!(!e.contains(&password), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

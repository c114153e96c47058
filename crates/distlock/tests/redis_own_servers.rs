//! Tests that need redis-servers of their own, started with `scripts/redis.sh` (the shared test
//! server must not be restarted or replicated): a restart without persistence under a held lock,
//! acquires that must be confirmed by a replica (`WAIT`), Redlock over three masters, and a
//! Sentinel failover.
#![cfg(feature = "redis")]

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

#[tokio::test]
async fn an_acquire_no_replica_confirms_fails_and_takes_nothing() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let url = format!("redis://{}?lease=5s&replicas=1&replica_timeout=300ms", master.addr);
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
    let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n: i64 = redis::cmd("EXISTS")
            .arg("replicated")
            .arg("replicated-simple")
            .arg("replicated-pool")
            .query_async(&mut conn)
            .await
            .unwrap();
        if n == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{n} unconfirmed grants left on the master");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
}

async fn raw_conn(addr: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}")).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// Waits (bounded) until `cond` holds, re-checking every 50 ms.
async fn eventually<F, Fut>(bound: Duration, what: &str, cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {bound:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_sentinel_failover_moves_the_client_and_its_locks_to_the_new_master() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let sentinels = [
        Server::sentinel(&master, "mymaster"),
        Server::sentinel(&master, "mymaster"),
        Server::sentinel(&master, "mymaster"),
    ];
    // Every Sentinel knows the replica and the two other Sentinels (else no failover can be agreed).
    for s in &sentinels {
        eventually(Duration::from_secs(20), "the Sentinels to find each other and the replica", || async {
            let mut conn = raw_conn(&s.addr).await;
            let info: Vec<String> =
                redis::cmd("SENTINEL").arg("master").arg("mymaster").query_async(&mut conn).await.unwrap_or_default();
            let field = |k: &str| info.iter().position(|x| x == k).and_then(|i| info.get(i + 1)).cloned();
            field("num-other-sentinels").as_deref() == Some("2") && field("num-slaves").as_deref() == Some("1")
        })
        .await;
    }
    let hosts: Vec<&str> = sentinels.iter().map(|s| s.addr.as_str()).collect();
    let url = format!("redis+sentinel://{}/mymaster?lease=10s&connect_timeout=5s", hosts.join(","));
    let redis = Client::connect(&url).await.unwrap();
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
    eventually(Duration::from_secs(30), "the Sentinels to promote the replica", || async {
        let mut conn = raw_conn(&sentinels[0].addr).await;
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("mymaster")
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        addr.is_some_and(|(h, p)| format!("{h}:{p}") == replica.addr)
    })
    .await;
    let promoted = std::time::Instant::now();
    let after = tokio::time::timeout(Duration::from_secs(20), redis.mutex("orders").unwrap().lock())
        .await
        .expect("the client follows the new master")
        .unwrap();
    assert!(after.fencing_token() > t1, "tokens keep rising across the failover");
    // The lock held across the failover is renewed on the new master (a renewal sent after the
    // promotion succeeded): still ours.
    eventually(Duration::from_secs(10), "the held lock to be renewed on the new master", || async {
        held.lease_deadline() > promoted + Duration::from_secs(9) && held.state() == distlock::LockState::Held
    })
    .await;
    after.release().await.unwrap();
    held.release().await.unwrap();
    distlock_faults::resume(master.pid()).unwrap();
}

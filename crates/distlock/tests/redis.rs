//! The Redis backend against a real redis-server (started by `scripts/test.sh` with
//! `scripts/redis.sh`, which exports `DISTLOCK_TEST_REDIS=host:port` and
//! `DISTLOCK_TEST_REDIS_DIR`).
#![cfg(feature = "redis")]

use distlock::redis::Client;
use distlock::{Error, LockState, LostReason};
use distlock_faults::{Fault, FaultProxy, FencedResource, Mode};
use std::time::Duration;
use tokio::time::Instant;

fn redis_addr() -> String {
    std::env::var("DISTLOCK_TEST_REDIS").expect(
        "DISTLOCK_TEST_REDIS is not set: run the tests with scripts/test.sh, which starts redis-server on a free port",
    )
}

fn url(query: &str) -> String {
    format!("redis://{}{query}", redis_addr())
}

async fn connect(query: &str) -> Client {
    Client::connect(&url(query)).await.expect("connect to the test redis-server")
}

/// A raw connection for looking at the server as a third party.
async fn raw() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{}", redis_addr())).unwrap();
    client.get_multiplexed_async_connection().await.expect("raw connection")
}

fn unique(name: &str) -> String {
    format!("distlock-test:{name}:{}", uuid::Uuid::new_v4().simple())
}

async fn cmd<T: redis::FromRedisValue>(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(conn).await.unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Waits (bounded) until `cond` holds, re-checking every 10 ms; panics naming `what`.
async fn eventually<F, Fut>(bound: Duration, what: &str, cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + bound;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out after {bound:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn subscribers(channel: &str) -> i64 {
    let mut conn = raw().await;
    let (_, n): (String, i64) = redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(&mut conn).await.unwrap();
    n
}

#[tokio::test]
async fn redisson_layout_exactly() {
    let redis = connect("?lease=20s").await;
    let key = unique("golden");
    let lock = redis.mutex(&key).unwrap();
    let mut conn = raw().await;
    let channel = format!("redisson_lock__channel:{{{key}}}");

    // A third party listens on Redisson's channel, as a Redisson waiter does.
    let listener = redis::Client::open(format!("redis://{}", redis_addr())).unwrap();
    let mut pubsub = listener.get_async_pubsub().await.unwrap();
    pubsub.subscribe(&channel).await.unwrap();

    let outer = lock.lock().await.unwrap();
    let field = format!("{}:", redis.client_id());
    assert!(lock.field().starts_with(&field), "field {} is <client uuid>:<handle id>", lock.field());
    assert!(uuid::Uuid::parse_str(redis.client_id()).is_ok(), "client id is a UUID as Redisson's");
    let hash: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &key]).await;
    assert_eq!(hash, vec![(lock.field().to_string(), "1".to_string())]);
    let pttl: i64 = cmd(&mut conn, &["PTTL", &key]).await;
    assert!((19_000..=20_000).contains(&pttl), "PTTL {pttl} is the lease");
    let counter: u64 = cmd(&mut conn, &["GET", &format!("redisson_lock_token:{{{key}}}")]).await;
    assert_eq!(counter, outer.fencing_token(), "the token is the counter's value");
    assert_eq!(outer.holder_id(), lock.field());

    // Re-entry through the same handle: count 2, same token.
    let inner = lock.lock().await.unwrap();
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    let count: String = cmd(&mut conn, &["HGET", &key, lock.field()]).await;
    assert_eq!(count, "2");
    // Another handle is another owner.
    assert!(redis.mutex(&key).unwrap().try_lock().await.unwrap().is_none());

    inner.release().await.unwrap();
    let count: String = cmd(&mut conn, &["HGET", &key, lock.field()]).await;
    assert_eq!(count, "1");
    outer.release().await.unwrap();
    let exists: i64 = cmd(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0, "the final release deletes the hash");

    use futures::StreamExt;
    let msg = tokio::time::timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await
        .expect("the final release publishes on Redisson's channel")
        .unwrap();
    assert_eq!(msg.get_channel_name(), channel);
    assert_eq!(msg.get_payload::<String>().unwrap(), "0", "Redisson's UNLOCK message");
    // Nothing else is left but the fencing counter (and no unlock latch).
    let keys: Vec<String> = cmd(&mut conn, &["KEYS", &format!("*{key}*")]).await;
    eventually(Duration::from_secs(5), "the unlock latch to be deleted", || async {
        let mut conn = raw().await;
        let keys: Vec<String> = cmd(&mut conn, &["KEYS", &format!("*{key}*")]).await;
        keys == vec![format!("redisson_lock_token:{{{key}}}")]
    })
    .await;
    drop(keys);
}

#[tokio::test]
async fn waits_for_a_redisson_holder_and_wakes_on_its_message() {
    let redis = connect("").await;
    let key = unique("redisson-peer");
    let mut conn = raw().await;
    // A Redisson client holding the lock, by hand: hash field <uuid>:<thread id>, 30 s lease.
    let java = format!("{}:1", uuid::Uuid::new_v4());
    let _: i64 = cmd(&mut conn, &["HSET", &key, &java, "1"]).await;
    let _: i64 = cmd(&mut conn, &["PEXPIRE", &key, "30000"]).await;

    let lock = redis.mutex(&key).unwrap();
    assert!(lock.try_lock().await.unwrap().is_none(), "a Redisson holder excludes us");
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let g = lock.lock_timeout(Duration::from_secs(10)).await.unwrap();
        (g, started.elapsed())
    });
    let channel = format!("redisson_lock__channel:{{{key}}}");
    eventually(Duration::from_secs(5), "the waiter to subscribe", || subscribers(&channel).map_positive()).await;
    // Redisson's unlock: delete, publish 0.
    let _: i64 = cmd(&mut conn, &["DEL", &key]).await;
    let _: i64 = cmd(&mut conn, &["PUBLISH", &channel, "0"]).await;
    let (guard, waited) = waiter.await.unwrap();
    let guard = guard.expect("woken by the message long before the 30 s lease ran out");
    assert!(waited < Duration::from_secs(10));
    guard.release().await.unwrap();
}

trait Positive {
    async fn map_positive(self) -> bool;
}
impl<F: std::future::Future<Output = i64>> Positive for F {
    async fn map_positive(self) -> bool {
        self.await > 0
    }
}

#[tokio::test]
async fn mutual_exclusion_and_rising_tokens_across_clients() {
    const CLIENTS: usize = 4;
    const CYCLES: usize = 25;
    let key = unique("exclusion");
    // One fenced resource per lock: even clients use the Redisson layout on `key`, odd ones the
    // simple lock on `key:simple`.
    let resources = [FencedResource::new(true, 1), FencedResource::new(true, 1)];
    let mut tasks = Vec::new();
    for who in 0..CLIENTS {
        let (key, resource) = (key.clone(), resources[who % 2].clone());
        tasks.push(tokio::spawn(async move {
            let redis = connect("?lease=5s").await;
            let lock = if who % 2 == 0 { Some(redis.mutex(&key).unwrap()) } else { None };
            let simple = redis.simple_lock(&format!("{key}:simple")).unwrap();
            for seq in 0..CYCLES as u64 {
                match &lock {
                    Some(lock) => {
                        let g = tokio::time::timeout(Duration::from_secs(30), lock.lock()).await.unwrap().unwrap();
                        let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                        assert!(resource.write(who, g.fencing_token(), seq));
                        tokio::task::yield_now().await;
                        resource.end(id);
                        g.release().await.unwrap();
                    }
                    None => {
                        let g = tokio::time::timeout(Duration::from_secs(30), simple.lock()).await.unwrap().unwrap();
                        let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                        assert!(resource.write(who, g.fencing_token(), seq));
                        tokio::task::yield_now().await;
                        resource.end(id);
                        g.release().await.unwrap();
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for resource in &resources {
        let report = resource.report();
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.holds, CLIENTS / 2 * CYCLES);
    }
    let mut conn = raw().await;
    for k in [key.clone(), format!("{key}:simple")] {
        let exists: i64 = cmd(&mut conn, &["EXISTS", &k]).await;
        assert_eq!(exists, 0, "{k} left behind");
    }
}

#[tokio::test]
async fn simple_lock_and_redis_py_exclude_each_other() {
    let redis = connect("?lease=10s").await;
    let key = unique("redis-py");
    let lock = redis.simple_lock(&key).unwrap();
    let py = |code: &str| {
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import redis, sys\nr = redis.Redis(host='127.0.0.1', port={})\nlock = r.lock(sys.argv[1], timeout=10)\n{code}",
                redis_addr().rsplit_once(':').unwrap().1
            ))
            .arg(&key)
            .output()
            .expect("python3 with redis-py (scripts/deps.sh installs it)");
        assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // We hold: redis-py cannot take it.
    let g = lock.lock().await.unwrap();
    assert_eq!(py("print(lock.acquire(blocking=False))"), "False");
    g.release().await.unwrap();
    // redis-py holds (and leaves the key behind on exit, with its 10 s timeout): we cannot.
    assert_eq!(py("print(lock.acquire(blocking=False))"), "True");
    assert!(lock.try_lock().await.unwrap().is_none(), "redis-py's holder excludes us");
    // redis-py releases it with its own token (read back from the key, as a second redis-py
    // process holding the same Lock object would): we get it.
    let mut conn = raw().await;
    let token: String = cmd(&mut conn, &["GET", &key]).await;
    assert_eq!(py(&format!("lock.local.token = b'{token}'\nlock.release()\nprint('ok')")), "ok");
    let g = lock.lock_timeout(Duration::from_secs(5)).await.unwrap().expect("free after redis-py released");
    // And redis-py's release script cannot release ours (its token differs).
    assert_eq!(
        py("lock.local.token = b'not-ours'\ntry:\n    lock.release()\n    print('released')\nexcept redis.exceptions.LockNotOwnedError:\n    print('not owned')"),
        "not owned"
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn lost_before_the_server_can_hand_the_lock_on() {
    // Every byte through a proxy that we black-hole: the watchdog's renewals go unanswered.
    let proxy = FaultProxy::start(redis_addr().parse().unwrap()).await.unwrap();
    let redis = Client::connect(&format!("redis://{}?lease=1500ms&connect_timeout=2s", proxy.addr())).await.unwrap();
    let key = unique("partitioned");
    let lock = redis.mutex(&key).unwrap();
    let guard = lock.lock().await.unwrap();
    assert_eq!(guard.state(), LockState::Held);
    let deadline = guard.lease_deadline();
    proxy.set(Fault::Blackhole);
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    assert!(std::time::Instant::now() >= deadline);
    // At that moment the server still has the key: nobody else can have the lock yet.
    let mut conn = raw().await;
    let pttl: i64 = cmd(&mut conn, &["PTTL", &key]).await;
    assert!(pttl > 0, "lost() must come before the server expires the key (PTTL {pttl})");
    // Someone else gets it once the server expires it, with a higher token.
    let other = connect("").await;
    let g2 = other.mutex(&key).unwrap().lock_timeout(Duration::from_secs(5)).await.unwrap().expect("free after expiry");
    assert!(g2.fencing_token() > guard.fencing_token());
    // The partitioned holder's release reports the loss.
    proxy.heal();
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));
    g2.release().await.unwrap();
}

#[tokio::test]
async fn a_deleted_key_is_reported_lost_at_the_next_renewal() {
    let redis = connect("?lease=900ms").await;
    let key = unique("deleted");
    let guard = redis.mutex(&key).unwrap().lock().await.unwrap();
    let mut conn = raw().await;
    let _: i64 = cmd(&mut conn, &["DEL", &key]).await;
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await.expect("lost at the next renewal");
    assert_eq!(reason, LostReason::KeyDeleted);
    assert!(guard.state().is_lost());
}

#[tokio::test]
async fn the_watchdog_keeps_a_long_hold() {
    let redis = connect("?lease=600ms").await;
    let key = unique("watchdog");
    let lock = redis.mutex(&key).unwrap();
    let guard = lock.lock().await.unwrap();
    let first_deadline = guard.lease_deadline();
    // Hold for three leases: the watchdog must renew, pushing the deadline on.
    let mut changes = guard.state_changes();
    let until = Instant::now() + Duration::from_millis(1800);
    while Instant::now() < until {
        let _ = tokio::time::timeout_at(until, changes.changed()).await;
    }
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.lease_deadline() > first_deadline + Duration::from_millis(1000));
    assert!(redis.mutex(&key).unwrap().try_lock().await.unwrap().is_none());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn cancelled_and_timed_out_acquires_leave_nothing() {
    let redis = connect("?lease=10s").await;
    let key = unique("cancel");
    let holder = redis.mutex(&key).unwrap().lock().await.unwrap();
    let waiter = redis.mutex(&key).unwrap();
    assert!(waiter.lock_timeout(Duration::from_millis(200)).await.unwrap().is_none());
    // Dropped mid-wait.
    let _ = tokio::time::timeout(Duration::from_millis(100), waiter.lock()).await;
    let mut conn = raw().await;
    let hash: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &key]).await;
    assert_eq!(hash.len(), 1, "only the holder's field: {hash:?}");
    holder.release().await.unwrap();
    // Cancelled acquires racing a free lock: whatever they took is released again.
    for _ in 0..20 {
        let _ = tokio::time::timeout(Duration::from_micros(50), waiter.lock()).await;
    }
    let key2 = key.clone();
    eventually(Duration::from_secs(5), "cancelled acquires to release", move || {
        let key = key2.clone();
        async move {
            let mut conn = raw().await;
            let exists: i64 = cmd(&mut conn, &["EXISTS", &key]).await;
            exists == 0
        }
    })
    .await;
    let subs = subscribers(&format!("redisson_lock__channel:{{{key}}}")).await;
    eventually(Duration::from_secs(5), "waiters to unsubscribe", || async {
        subscribers(&format!("redisson_lock__channel:{{{key}}}")).await == 0
    })
    .await;
    let _ = subs;
}

#[tokio::test]
async fn a_waiter_wakes_on_release_not_on_the_lease() {
    let redis = connect("?lease=30s").await;
    let key = unique("handoff");
    let a = redis.mutex(&key).unwrap();
    let holder = a.lock().await.unwrap();
    let other = connect("?lease=30s").await;
    let b = other.mutex(&key).unwrap();
    let waiter = tokio::spawn(async move { b.lock_timeout(Duration::from_secs(10)).await.unwrap() });
    let channel = format!("redisson_lock__channel:{{{key}}}");
    eventually(Duration::from_secs(5), "the waiter to subscribe", || subscribers(&channel).map_positive()).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let g = waiter.await.unwrap().expect("woken by the release, not the 30 s lease");
    assert!(released.elapsed() < Duration::from_secs(10));
    g.release().await.unwrap();
}

#[tokio::test]
async fn bad_names_and_urls_are_clear_errors() {
    let redis = connect("").await;
    assert!(matches!(redis.mutex(""), Err(Error::InvalidLockPath { .. })));
    assert!(matches!(redis.simple_lock("a\nb"), Err(Error::InvalidLockPath { .. })));
    let e = Client::connect("redis://127.0.0.1:1?connect_timeout=2s").await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e}");
    let e = Client::connect(&url("?lease=forever")).await.unwrap_err();
    assert!(e.to_string().contains("lease"), "{e}");
}

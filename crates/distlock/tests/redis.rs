//! The Redis backend against a real redis-server (started by `scripts/test.sh` with
//! `scripts/redis.sh`, which exports `DISTLOCK_TEST_REDIS=host:port` and
//! `DISTLOCK_TEST_REDIS_DIR`).
#![cfg(feature = "redis")]

use crate::common::{eventually, unique};
use distlock::redis::Client;
use distlock::{Error, LockState, LostReason};
use distlock_faults::{Fault, FaultProxy, FencedResource, FreeWatch, Mode};
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

async fn cmd<T: redis::FromRedisValue>(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(conn).await.unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

async fn exists(key: &str) -> bool {
    let mut conn = raw().await;
    cmd::<i64>(&mut conn, &["EXISTS", key]).await == 1
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

    assert_eq!(lock.field(), None, "no hold in progress");
    let outer = lock.lock().await.unwrap();
    let field = lock.field().expect("the hold in progress");
    assert!(field.starts_with(&format!("{}:", redis.client_id())), "field {field} is <client uuid>:<n>");
    assert!(field.rsplit_once(':').unwrap().1.parse::<u64>().is_ok(), "<n> is a number as Redisson's thread id");
    assert!(uuid::Uuid::parse_str(redis.client_id()).is_ok(), "client id is a UUID as Redisson's");
    let hash: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &key]).await;
    assert_eq!(hash, vec![(field.clone(), "1".to_string())]);
    let pttl: i64 = cmd(&mut conn, &["PTTL", &key]).await;
    assert!((19_000..=20_000).contains(&pttl), "PTTL {pttl} is the lease");
    let counter: u64 = cmd(&mut conn, &["GET", &format!("redisson_lock_token:{{{key}}}")]).await;
    assert_eq!(counter, outer.fencing_token(), "the token is the counter's value");
    assert_eq!(outer.holder_id(), field);

    // Re-entry through the same handle: count 2, same token.
    let inner = lock.lock().await.unwrap();
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    let count: String = cmd(&mut conn, &["HGET", &key, &field]).await;
    assert_eq!(count, "2");
    // Another handle is another owner.
    assert!(redis.mutex(&key).unwrap().try_lock().await.unwrap().is_none());

    inner.release().await.unwrap();
    let count: String = cmd(&mut conn, &["HGET", &key, &field]).await;
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
    let conn = raw().await;
    proxy.set(Fault::Blackhole);
    // The server's side, watched from now on: when the key is first seen gone.
    let watch = FreeWatch::start(Duration::from_millis(5), {
        let key = key.clone();
        move || {
            let (mut conn, key) = (conn.clone(), key.clone());
            async move { cmd::<i64>(&mut conn, &["EXISTS", &key]).await == 1 }
        }
    });
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await.expect("lost within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    let deadline = guard.lease_deadline();
    assert!(std::time::Instant::now() >= deadline, "lost() before the deadline it reports");
    // The holder's deadline came before the server expired the key: nobody else could have the
    // lock yet when it was told.
    let freed = watch.freed_at(Duration::from_secs(5)).await;
    assert!(deadline < freed, "the server expired the key {:?} before the holder's deadline", deadline - freed);
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
    // A lease long enough that a busy machine's late timers (the renewal goes every third of it)
    // cannot lose it.
    let redis = connect("?lease=1500ms").await;
    let key = unique("watchdog");
    let lock = redis.mutex(&key).unwrap();
    let guard = lock.lock().await.unwrap();
    let first_deadline = guard.lease_deadline();
    // Hold for two leases: the watchdog must renew, pushing the deadline on.
    let mut changes = guard.state_changes();
    let until = Instant::now() + Duration::from_millis(3000);
    while Instant::now() < until {
        let _ = tokio::time::timeout_at(until, changes.changed()).await;
    }
    assert_eq!(guard.state(), LockState::Held);
    assert!(guard.lease_deadline() > first_deadline + Duration::from_millis(1500));
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
    // Without the message the waiter would sleep out the holder's 30 s TTL.
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken {:?} after the release (the lease is 30 s)",
        released.elapsed()
    );
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

#[tokio::test]
async fn rwlock_in_redisson_layout_shares_reads_and_excludes_writes() {
    let redis = connect("?lease=20s").await;
    let key = unique("rw");
    let mut conn = raw().await;
    let (a, b) = (redis.rwlock(&key).unwrap(), redis.rwlock(&key).unwrap());
    let ra = a.read().await.unwrap();
    let rb = b.try_read().await.unwrap().expect("readers share");
    let mode: String = cmd(&mut conn, &["HGET", &key, "mode"]).await;
    assert_eq!(mode, "read");
    let fields: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &key]).await;
    assert_eq!(fields.len(), 3, "mode and one field per reading handle: {fields:?}");
    let (field_a, _) = fields
        .iter()
        .find(|(f, v)| f != "mode" && v == "1" && f.ends_with(":1"))
        .cloned()
        .unwrap_or_else(|| fields.iter().find(|(f, _)| f != "mode").cloned().unwrap());
    let timeout_key = format!("{{{key}}}:{field_a}:rwlock_timeout:1");
    let pttl: i64 = cmd(&mut conn, &["PTTL", &timeout_key]).await;
    assert!(pttl > 19_000, "per-hold timeout key {timeout_key} with the lease (PTTL {pttl})");
    assert!(ra.fencing_token() != rb.fencing_token());
    let read_token = ra.fencing_token().max(rb.fencing_token());
    assert!(a.try_write().await.is_err(), "upgrade refused with WouldDeadlock");
    let c = redis.rwlock(&key).unwrap();
    assert!(c.try_write().await.unwrap().is_none(), "readers exclude a writer");
    ra.release().await.unwrap();
    rb.release().await.unwrap();
    let exists: i64 = cmd(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0);

    let w = c.write().await.unwrap();
    assert!(w.fencing_token() > read_token);
    let fields: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &key]).await;
    assert!(fields.contains(&("mode".into(), "write".into())));
    assert!(fields.iter().any(|(f, v)| f.ends_with(":write") && v == "1"), "{fields:?}");
    assert!(a.try_read().await.unwrap().is_none(), "a writer excludes other readers");
    // Downgrade: the writer reads, releases the write, keeps reading.
    let r = c.read().await.unwrap();
    w.release().await.unwrap();
    let mode: String = cmd(&mut conn, &["HGET", &key, "mode"]).await;
    assert_eq!(mode, "read");
    let shared = a.try_read().await.unwrap().expect("after the downgrade others read too");
    shared.release().await.unwrap();
    r.release().await.unwrap();
    let exists: i64 = cmd(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0, "nothing left");
}

#[tokio::test]
async fn a_reader_wakes_when_a_redisson_writer_publishes() {
    let redis = connect("").await;
    let key = unique("rw-peer");
    let mut conn = raw().await;
    let writer = format!("{}:7:write", uuid::Uuid::new_v4());
    let _: i64 = cmd(&mut conn, &["HSET", &key, "mode", "write", &writer, "1"]).await;
    let _: i64 = cmd(&mut conn, &["PEXPIRE", &key, "30000"]).await;
    let lock = redis.rwlock(&key).unwrap();
    assert!(lock.try_read().await.unwrap().is_none());
    let waiter = tokio::spawn(async move { lock.read_timeout(Duration::from_secs(10)).await.unwrap() });
    let channel = format!("redisson_rwlock:{{{key}}}");
    eventually(Duration::from_secs(5), "the reader to subscribe", || subscribers(&channel).map_positive()).await;
    let _: i64 = cmd(&mut conn, &["DEL", &key]).await;
    let _: i64 = cmd(&mut conn, &["PUBLISH", &channel, "1"]).await;
    let g = waiter.await.unwrap().expect("woken by Redisson's write-unlock message");
    g.release().await.unwrap();
}

#[tokio::test]
async fn readers_and_writers_never_overlap_wrongly() {
    const CYCLES: u64 = 20;
    let key = unique("rw-exclusion");
    let resource = FencedResource::new(false, 1);
    let mut tasks = Vec::new();
    for who in 0..4usize {
        let (key, resource) = (key.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let redis = connect("?lease=5s").await;
            let lock = redis.rwlock(&key).unwrap();
            for _ in 0..CYCLES {
                if who < 2 {
                    let g = tokio::time::timeout(Duration::from_secs(30), lock.write()).await.unwrap().unwrap();
                    let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                    tokio::task::yield_now().await;
                    resource.end(id);
                    g.release().await.unwrap();
                } else {
                    let g = tokio::time::timeout(Duration::from_secs(30), lock.read()).await.unwrap().unwrap();
                    let id = resource.begin(who, Mode::Shared, g.fencing_token());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    resource.end(id);
                    g.release().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.overlaps.is_empty(), "{report}");
    let mut conn = raw().await;
    let keys: Vec<String> = cmd(&mut conn, &["KEYS", &format!("*{key}*")]).await;
    assert_eq!(keys, vec![format!("redisson_lock_token:{{{key}}}")], "only the fencing counter is left");
}

#[tokio::test]
async fn a_semaphore_admits_n_and_refuses_another_count() {
    let redis = connect("?lease=20s").await;
    let key = unique("sem");
    let pool = redis.semaphore(&key, 3).unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(pool.try_acquire().await.unwrap().expect("3 permits"));
    }
    assert!(pool.try_acquire().await.unwrap().is_none(), "the 4th waits");
    let tokens: std::collections::BTreeSet<u64> = held.iter().map(|p| p.fencing_token()).collect();
    assert_eq!(tokens.len(), 3, "each permit has its own token");
    let e = redis.semaphore(&key, 5).unwrap().try_acquire().await.unwrap_err().to_string();
    assert!(e.contains("3 permits") && e.contains("not 5"), "{e}");
    assert!(matches!(redis.semaphore(&key, 0), Err(Error::InvalidArgument { .. })));
    let mut conn = raw().await;
    let members: Vec<String> = cmd(&mut conn, &["ZRANGE", &key, "0", "-1"]).await;
    assert_eq!(members.len(), 3);
    // A waiter wakes when one is released.
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire_timeout(Duration::from_secs(10)).await.unwrap() })
    };
    let channel = format!("distlock_semaphore__channel:{{{key}}}");
    eventually(Duration::from_secs(5), "the waiter to subscribe", || subscribers(&channel).map_positive()).await;
    held.pop().unwrap().release().await.unwrap();
    held.push(waiter.await.unwrap().expect("woken by the release"));
    for p in held {
        p.release().await.unwrap();
    }
    let keys: Vec<String> = cmd(&mut conn, &["KEYS", &format!("*{key}*")]).await;
    assert_eq!(keys, vec![format!("redisson_lock_token:{{{key}}}")], "only the fencing counter is left");
}

#[tokio::test]
async fn a_dead_holders_permit_comes_back_after_its_lease() {
    let key = unique("sem-dead");
    // The holder is cut off (its renewals and its release never arrive), as if it had died.
    let proxy = FaultProxy::start(redis_addr().parse().unwrap()).await.unwrap();
    let dead = Client::connect(&format!("redis://{}?lease=1s&connect_timeout=2s", proxy.addr())).await.unwrap();
    let permit = dead.semaphore(&key, 1).unwrap().acquire().await.unwrap();
    proxy.set(Fault::Blackhole);
    let redis = connect("?lease=10s").await;
    let started = Instant::now();
    let next = redis.semaphore(&key, 1).unwrap().acquire_timeout(Duration::from_secs(10)).await.unwrap();
    let next = next.expect("the dead holder's permit came back");
    println!("permit came back after {:?}", started.elapsed());
    assert!(next.fencing_token() > permit.fencing_token());
    assert!(permit.state().is_lost(), "the cut-off holder knows by now");
    next.release().await.unwrap();
    drop(permit);
}

#[tokio::test]
async fn two_permits_never_three_holders() {
    let key = unique("sem-exclusion");
    let resource = FencedResource::new(false, 2);
    let mut tasks = Vec::new();
    for who in 0..5usize {
        let (key, resource) = (key.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            let redis = connect("?lease=5s").await;
            let pool = redis.semaphore(&key, 2).unwrap();
            for _ in 0..15 {
                let p = tokio::time::timeout(Duration::from_secs(30), pool.acquire()).await.unwrap().unwrap();
                let id = resource.begin(who, Mode::Exclusive, p.fencing_token());
                tokio::time::sleep(Duration::from_millis(1)).await;
                resource.end(id);
                p.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.overlaps.is_empty(), "{report}");
}

async fn queue_len(key: &str) -> i64 {
    let mut conn = raw().await;
    cmd(&mut conn, &["LLEN", &format!("distlock_fair_queue:{{{key}}}")]).await
}

#[tokio::test]
async fn the_fair_lock_grants_in_arrival_order() {
    const WAITERS: usize = 6;
    let key = unique("fair");
    let redis = connect("?lease=10s").await;
    let holder = redis.fair_lock(&key).unwrap().lock().await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        // Each waiter on a client of its own, queued only after the one before it.
        let client = connect("?lease=10s").await;
        let (key2, order) = (key.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = client.fair_lock(&key2).unwrap().lock_timeout(Duration::from_secs(20)).await.unwrap().unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            g.release().await.unwrap();
        }));
        let want = i as i64 + 1;
        let k = key.clone();
        eventually(Duration::from_secs(5), "the waiter to queue", move || {
            let k = k.clone();
            async move { queue_len(&k).await == want }
        })
        .await;
    }
    // Nobody jumps the queue, not even with the lock free for an instant.
    assert!(redis.fair_lock(&key).unwrap().try_lock().await.unwrap().is_none());
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>(), "granted in arrival order");
    assert_eq!(queue_len(&key).await, 0);
}

#[tokio::test]
async fn a_dead_waiter_loses_its_place_and_a_timed_out_one_leaves() {
    let key = unique("fair-dead");
    let redis = connect("?lease=1s").await;
    let holder = redis.fair_lock(&key).unwrap().lock().await.unwrap();
    // A waiter that gives up leaves the queue at once.
    assert!(redis.fair_lock(&key).unwrap().lock_timeout(Duration::from_millis(200)).await.unwrap().is_none());
    assert_eq!(queue_len(&key).await, 0, "a timed-out waiter leaves the queue");
    // A waiter cut off from the server (as if dead) stays queued until its place runs out.
    let proxy = FaultProxy::start(redis_addr().parse().unwrap()).await.unwrap();
    let dead = Client::connect(&format!("redis://{}?lease=1s&connect_timeout=2s", proxy.addr())).await.unwrap();
    let dead_lock = dead.fair_lock(&key).unwrap();
    let dead_waiter = tokio::spawn(async move { dead_lock.lock_timeout(Duration::from_secs(30)).await });
    let k = key.clone();
    eventually(Duration::from_secs(5), "the doomed waiter to queue", move || {
        let k = k.clone();
        async move { queue_len(&k).await == 1 }
    })
    .await;
    proxy.set(Fault::Blackhole);
    let live = connect("?lease=1s").await;
    let live_lock = live.fair_lock(&key).unwrap();
    let live_waiter = tokio::spawn(async move { live_lock.lock_timeout(Duration::from_secs(10)).await.unwrap() });
    let k = key.clone();
    eventually(Duration::from_secs(5), "the live waiter to queue behind it", move || {
        let k = k.clone();
        async move { queue_len(&k).await == 2 }
    })
    .await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let g = live_waiter.await.unwrap().expect("the live waiter gets the lock once the dead one's place lapses");
    println!("granted {:?} after the release, past a dead waiter", released.elapsed());
    g.release().await.unwrap();
    dead_waiter.abort();
    drop(proxy);
}

#[tokio::test]
async fn a_holder_without_ttl_is_waited_for_not_mistaken_for_a_grant() {
    // redis-py's `r.lock(name)` without a timeout, and a hand-made Redisson hash without
    // PEXPIRE, leave keys whose PTTL is -1: those are held, however long.
    let redis = connect("?lease=10s").await;
    let mut conn = raw().await;
    let simple_key = unique("no-ttl-simple");
    let _: String = cmd(&mut conn, &["SET", &simple_key, "someone-else"]).await;
    let simple = redis.simple_lock(&simple_key).unwrap();
    assert!(simple.try_lock().await.unwrap().is_none());
    assert!(simple.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let hash_key = unique("no-ttl-hash");
    let _: i64 = cmd(&mut conn, &["HSET", &hash_key, "11111111-1111-1111-1111-111111111111:1", "1"]).await;
    let mutex = redis.mutex(&hash_key).unwrap();
    assert!(mutex.try_lock().await.unwrap().is_none());
    assert!(mutex.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let fair = redis.fair_lock(&hash_key).unwrap();
    assert!(fair.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none());
    let rw = redis.rwlock(&hash_key).unwrap();
    assert!(rw.try_write().await.unwrap().is_none());
    // The holders are untouched.
    let value: String = cmd(&mut conn, &["GET", &simple_key]).await;
    assert_eq!(value, "someone-else");
    let hash: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &hash_key]).await;
    assert_eq!(hash.len(), 1, "{hash:?}");
    let _: i64 = cmd(&mut conn, &["DEL", &simple_key, &hash_key]).await;
}

#[tokio::test]
async fn an_ended_holds_late_release_cannot_touch_the_next_hold() {
    let redis = connect("?lease=10s").await;
    let key = unique("stale-guard");
    let lock = redis.mutex(&key).unwrap();
    let old = lock.lock().await.unwrap();
    // The hold ends on the server (as when its lease runs out) while the guard lives on.
    let mut conn = raw().await;
    let _: i64 = cmd(&mut conn, &["DEL", &key]).await;
    // The same handle locks again: not a re-entry of the ended hold, a new hold of its own.
    let new = lock.lock().await.unwrap();
    assert_ne!(new.holder_id(), old.holder_id(), "a new hold gets a new field");
    assert!(new.fencing_token() > old.fencing_token());
    // The old guard's release (and its drop, and its watchdog) find nothing of theirs.
    assert!(matches!(old.release().await, Err(Error::LockLost { .. })));
    let count: Option<String> = cmd(&mut conn, &["HGET", &key, new.holder_id()]).await;
    assert_eq!(count.as_deref(), Some("1"), "the new hold is intact");
    assert_eq!(new.state(), LockState::Held);
    new.release().await.unwrap();
    let exists: i64 = cmd(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0);
}

/// A release that finds the lock no longer ours says so (`LockLost`, which `distlock exec` turns
/// into its status 3), on every recipe, whatever is at the key now: nothing, someone else's
/// lock of the same layout, or a key of another type (not an error either). A permit whose
/// expiry passed by the server's clock is no longer ours even before it is pruned.
#[tokio::test]
async fn every_release_that_finds_the_lock_gone_or_taken_says_it_was_lost() {
    let redis = connect("?lease=20s").await;
    let mut conn = raw().await;
    let mut leftovers = Vec::new();
    for with in ["nothing", "string", "hash", "zset"] {
        let key = unique(&format!("taken-by-{with}"));
        let name = |recipe: &str| format!("{key}-{recipe}");
        let g = redis.mutex(&name("mutex")).unwrap().lock().await.unwrap();
        replace_key(&mut conn, &name("mutex"), with).await;
        says_lost("mutex", with, g.release().await);
        let g = redis.simple_lock(&name("simple")).unwrap().lock().await.unwrap();
        replace_key(&mut conn, &name("simple"), with).await;
        says_lost("simple", with, g.release().await);
        let g = redis.rwlock(&name("read")).unwrap().read().await.unwrap();
        replace_key(&mut conn, &name("read"), with).await;
        says_lost("read", with, g.release().await);
        let g = redis.rwlock(&name("write")).unwrap().write().await.unwrap();
        replace_key(&mut conn, &name("write"), with).await;
        says_lost("write", with, g.release().await);
        let g = redis.fair_lock(&name("fair")).unwrap().lock().await.unwrap();
        replace_key(&mut conn, &name("fair"), with).await;
        says_lost("fair", with, g.release().await);
        let g = redis.semaphore(&name("permit"), 2).unwrap().acquire().await.unwrap();
        replace_key(&mut conn, &name("permit"), with).await;
        says_lost("permit", with, g.release().await);
        leftovers.extend(["mutex", "simple", "read", "write", "fair", "permit"].map(name));
    }
    // Our permit, its expiry passed by the server's clock but not yet pruned.
    let pool = unique("expired-permit");
    let p = redis.semaphore(&pool, 2).unwrap().acquire().await.unwrap();
    let _: i64 = cmd(&mut conn, &["ZADD", &pool, "XX", "1", p.holder_id()]).await;
    says_lost("permit", "its own expired entry", p.release().await);
    leftovers.push(pool);
    for key in &leftovers {
        let _: i64 = cmd(&mut conn, &["DEL", key]).await;
    }
}

/// Deletes `key` and, unless `with` is `nothing`, puts someone else's key of type `with` there.
async fn replace_key(conn: &mut redis::aio::MultiplexedConnection, key: &str, with: &str) {
    let _: i64 = cmd(conn, &["DEL", key]).await;
    match with {
        "string" => {
            let _: String = cmd(conn, &["SET", key, "someone-else"]).await;
        }
        "hash" => {
            let _: i64 = cmd(conn, &["HSET", key, "someone-else:1", "1"]).await;
        }
        "zset" => {
            let _: i64 = cmd(conn, &["ZADD", key, "1", "someone-else"]).await;
        }
        _ => {}
    }
}

fn says_lost(recipe: &str, with: &str, released: distlock::Result<()>) {
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "{recipe}'s release, its key replaced by {with}: {released:?}"
    );
}

#[tokio::test]
async fn an_acquire_whose_answer_was_lost_is_not_counted_twice() {
    // The acquire reaches the server, its answer is held back, and the connection is cut: the
    // client retries on a new connection and must find its own grant, not re-enter it.
    let proxy = FaultProxy::start(redis_addr().parse().unwrap()).await.unwrap();
    let redis = Client::connect(&format!("redis://{}?lease=10s&connect_timeout=5s", proxy.addr())).await.unwrap();
    let mut conn = raw().await;
    for recipe in ["mutex", "simple"] {
        let key = unique(&format!("lost-reply-{recipe}"));
        proxy.set(Fault::Delay { to_client: Duration::from_secs(30), to_upstream: Duration::ZERO });
        let acquire = {
            let (redis, key) = (redis.clone(), key.clone());
            tokio::spawn(async move {
                match recipe {
                    "mutex" => {
                        redis.mutex(&key).unwrap().lock().await.map(|g| Box::new(g) as Box<dyn std::any::Any + Send>)
                    }
                    _ => redis
                        .simple_lock(&key)
                        .unwrap()
                        .lock()
                        .await
                        .map(|g| Box::new(g) as Box<dyn std::any::Any + Send>),
                }
            })
        };
        eventually(Duration::from_secs(5), "the acquire to reach the server", || exists(&key)).await;
        proxy.set(Fault::CutAfter { to_client_bytes: 0 });
        let guard = tokio::time::timeout(Duration::from_secs(10), acquire).await.expect("retried").unwrap().unwrap();
        if recipe == "mutex" {
            let hash: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &key]).await;
            assert_eq!(hash.len(), 1);
            assert_eq!(hash[0].1, "1", "one hold, counted once: {hash:?}");
        }
        drop(guard);
        eventually(Duration::from_secs(5), "the only hold's release to free the lock", || async {
            !exists(&key).await
        })
        .await;
    }
}

/// A counter ahead of the server clock (a clock that stepped back, or tokens handed out in the
/// same microsecond) still gives every holder one more than the last token.
#[tokio::test]
async fn a_counter_ahead_of_the_clock_still_rises_by_one() {
    let redis = Client::connect(&url("?lease=5s")).await.unwrap();
    let mut conn = raw().await;
    for layout in ["mutex", "simple"] {
        let key = unique(&format!("ahead-{layout}"));
        let ahead: u64 = 8_000_000_000_000_000; // year 2223 in µs, still exact in Lua's doubles
        let _: () = cmd(&mut conn, &["SET", &format!("redisson_lock_token:{{{key}}}"), &ahead.to_string()]).await;
        for expected in [ahead + 1, ahead + 2] {
            let token = match layout {
                "mutex" => {
                    let g = redis.mutex(&key).unwrap().lock().await.unwrap();
                    let t = g.fencing_token();
                    g.release().await.unwrap();
                    t
                }
                _ => {
                    let g = redis.simple_lock(&key).unwrap().lock().await.unwrap();
                    let t = g.fencing_token();
                    g.release().await.unwrap();
                    t
                }
            };
            assert_eq!(token, expected, "{layout}");
        }
    }
}

/// A re-entrant release whose answer is lost is retried, and the retry (the only try that reads
/// Redisson's unlock latch) answers what the first did instead of counting down twice.
#[tokio::test]
async fn a_release_whose_answer_was_lost_is_not_counted_twice() {
    let proxy = FaultProxy::start(redis_addr().parse().unwrap()).await.unwrap();
    let redis = Client::connect(&format!("redis://{}?lease=10s&connect_timeout=5s", proxy.addr())).await.unwrap();
    let mut conn = raw().await;
    let key = unique("lost-release-reply");
    let lock = redis.mutex(&key).unwrap();
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    let count = |conn: &mut redis::aio::MultiplexedConnection| {
        let (mut conn, key) = (conn.clone(), key.clone());
        async move {
            let hash: Vec<(String, String)> = cmd(&mut conn, &["HGETALL", &key]).await;
            hash.first().map(|(_, n)| n.clone())
        }
    };
    assert_eq!(count(&mut conn).await.as_deref(), Some("2"));
    proxy.set(Fault::Delay { to_client: Duration::from_secs(30), to_upstream: Duration::ZERO });
    let release = tokio::spawn(inner.release());
    eventually(Duration::from_secs(5), "the release to reach the server", || {
        let mut c = conn.clone();
        async move { count(&mut c).await.as_deref() == Some("1") }
    })
    .await;
    proxy.set(Fault::CutAfter { to_client_bytes: 0 });
    tokio::time::timeout(Duration::from_secs(10), release).await.expect("retried").unwrap().expect("released once");
    assert_eq!(count(&mut conn).await.as_deref(), Some("1"), "the retry found the latch and counted nothing");
    assert_eq!(outer.state(), LockState::Held);
    outer.release().await.unwrap();
    assert!(!exists(&key).await, "the outer release freed the lock");
}

#[test]
fn the_blocking_facade_works_on_redis() {
    let key = unique("blocking");
    let a = distlock::blocking::Client::connect(&url("?lease=5s")).unwrap();
    let b = distlock::blocking::Client::connect(&url("?lease=5s")).unwrap();
    let g = a.mutex(&key).unwrap().lock().unwrap();
    assert!(b.mutex(&key).unwrap().try_lock().unwrap().is_none());
    assert!(b.mutex(&key).unwrap().lock_timeout(Duration::from_millis(100)).unwrap().is_none());
    assert_eq!(g.state(), LockState::Held);
    let t = g.fencing_token();
    drop(g); // released by drop, in the background
    let g2 = b.mutex(&key).unwrap().lock_timeout(Duration::from_secs(5)).unwrap().expect("released by drop");
    assert!(g2.fencing_token() > t);
    g2.release().unwrap();
    // Readers share, a writer waits; a semaphore counts.
    let r1 = a.read_lock(&format!("{key}:rw")).unwrap().lock().unwrap();
    let r2 = b.read_lock(&format!("{key}:rw")).unwrap().try_lock().unwrap().expect("readers share");
    assert!(b.write_lock(&format!("{key}:rw")).unwrap().try_lock().unwrap().is_none());
    r1.release().unwrap();
    r2.release().unwrap();
    let p1 = a.semaphore_permit(&format!("{key}:pool"), 1).unwrap().lock().unwrap();
    assert!(b.semaphore_permit(&format!("{key}:pool"), 1).unwrap().try_lock().unwrap().is_none());
    p1.release().unwrap();
}

/// A key holds one kind of lock: Redisson's hash (a mutex or read/write lock), redis-py's string
/// (`layout=simple`) and a semaphore's sorted set refuse each other with the contract's
/// `KindConflict`, naming what the key holds (the server's WRONGTYPE, read with TYPE), for a try
/// and a waiter alike, and leave the holder's key as it was.
#[tokio::test]
async fn layouts_and_kinds_on_one_key_refuse_each_other_by_name() {
    let (redisson, simple) = (connect("?lease=4s").await, connect("?lease=4s&layout=simple").await);
    let refused = |r: distlock::Result<bool>, holds: &str, wanted: &str| match r {
        Err(e @ Error::KindConflict { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("in use as {holds}")) && text.contains(wanted), "{text}");
        }
        other => panic!("not refused as another kind: {other:?}"),
    };
    let key = unique("layouts");
    let held = redisson.mutex(&key).unwrap().lock().await.unwrap();
    let lock = simple.simple_lock(&key).unwrap();
    refused(lock.try_lock().await.map(|g| g.is_some()), "a Redisson lock", "a redis-py lock (layout=simple)");
    refused(lock.lock_timeout(Duration::from_secs(3)).await.map(|g| g.is_some()), "a Redisson lock", "redis-py");
    let sem = redisson.semaphore(&key, 2).unwrap();
    refused(sem.try_acquire().await.map(|g| g.is_some()), "a Redisson lock", "a semaphore");
    held.release().await.unwrap();

    let key = unique("layouts");
    let held = simple.simple_lock(&key).unwrap().lock().await.unwrap();
    refused(redisson.mutex(&key).unwrap().try_lock().await.map(|g| g.is_some()), "a redis-py lock", "a mutex");
    refused(redisson.rwlock(&key).unwrap().try_read().await.map(|g| g.is_some()), "a redis-py lock", "a read lock");
    held.release().await.unwrap();
    let g = redisson.mutex(&key).unwrap().try_lock().await.unwrap().expect("free once the other kind left");
    g.release().await.unwrap();
}

/// A hold of each kind the watchdog renews, as the batched-renewal tests hold them side by side.
pub(crate) enum AnyHold {
    Mutex(distlock::redis::MutexGuard),
    Simple(distlock::redis::SimpleGuard),
    Read(distlock::redis::ReadGuard),
    Write(distlock::redis::WriteGuard),
    Fair(distlock::redis::FairGuard),
    Permit(distlock::redis::SemaphorePermit),
}

macro_rules! on_any_hold {
    ($hold:expr, |$g:ident| $body:expr) => {
        match $hold {
            AnyHold::Mutex($g) => $body,
            AnyHold::Simple($g) => $body,
            AnyHold::Read($g) => $body,
            AnyHold::Write($g) => $body,
            AnyHold::Fair($g) => $body,
            AnyHold::Permit($g) => $body,
        }
    };
}

impl AnyHold {
    /// The hold's key, whose deletion loses it.
    pub(crate) fn key(&self) -> &str {
        on_any_hold!(self, |g| g.key())
    }

    pub(crate) fn state(&self) -> LockState {
        on_any_hold!(self, |g| g.state())
    }

    pub(crate) fn lease_deadline(&self) -> std::time::Instant {
        on_any_hold!(self, |g| g.lease_deadline())
    }

    pub(crate) fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = LostReason> + Send>> {
        on_any_hold!(self, |g| Box::pin(g.lost()))
    }

    pub(crate) async fn release(self) -> distlock::Result<()> {
        on_any_hold!(self, |g| g.release().await)
    }
}

/// `n` holds through `redis`, on names `{prefix}-{i}`, of every renewed kind in turn: a mutex, a
/// simple lock, a read hold, a write hold, a fair lock and a semaphore permit.
pub(crate) async fn hold_every_kind(redis: &Client, prefix: &str, n: usize) -> Vec<AnyHold> {
    let mut holds = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let hold = match i % 6 {
            0 => AnyHold::Mutex(redis.mutex(&name).unwrap().lock().await.unwrap()),
            1 => AnyHold::Simple(redis.simple_lock(&name).unwrap().lock().await.unwrap()),
            2 => AnyHold::Read(redis.rwlock(&name).unwrap().read().await.unwrap()),
            3 => AnyHold::Write(redis.rwlock(&name).unwrap().write().await.unwrap()),
            4 => AnyHold::Fair(redis.fair_lock(&name).unwrap().lock().await.unwrap()),
            _ => AnyHold::Permit(redis.semaphore(&name, 2).unwrap().acquire().await.unwrap()),
        };
        holds.push(hold);
    }
    holds
}

/// Waits (bounded) until every hold of `holds` has been renewed by a request sent after this
/// call: its lease deadline moved on twice (the second renewal was sent after the first was
/// confirmed, so after the call, whatever was in flight at it).
pub(crate) async fn renewed_from_now(holds: &[AnyHold], bound: Duration) {
    for _ in 0..2 {
        let before: Vec<std::time::Instant> = holds.iter().map(AnyHold::lease_deadline).collect();
        eventually(bound, "every hold renewed", || async {
            holds.iter().zip(&before).all(|(h, d)| h.lease_deadline() > *d)
        })
        .await;
    }
}

/// Batched renewals: 300 holds of every renewed kind through one client cost the server
/// ⌈300/100⌉ = 3 renewal scripts per renewal period (a third of the lease), not one each.
/// Counted as the client's writes through a proxy, over three periods once the holds' renewals
/// have gone together at least once (a count over a time window is what "per period" means: the
/// window is the measure, not a stand-in for a condition).
#[tokio::test]
async fn renewals_go_a_hundred_holds_to_a_request() {
    const HOLDS: usize = 300;
    const PER_PERIOD: u64 = HOLDS.div_ceil(100) as u64;
    let lease = Duration::from_secs(1);
    let period = lease / 3;
    let proxy = FaultProxy::start(redis_addr().parse().unwrap()).await.unwrap();
    let redis = Client::connect(&format!("redis://{}?lease=1s", proxy.addr())).await.unwrap();
    let holds = hold_every_kind(&redis, &unique("batched"), HOLDS).await;
    // Renewed after the last grant: from then on, every hold goes with the rest.
    renewed_from_now(&holds, Duration::from_secs(10)).await;

    let periods = 3;
    let before = proxy.writes_to_upstream();
    tokio::time::sleep(period * periods).await;
    let writes = proxy.writes_to_upstream() - before;
    // The allowance: one more round, whose requests may fall on both edges of the window, and two
    // other requests (the sentry's INFO if it runs late, a retry after a slow answer).
    let allowed = PER_PERIOD * (periods as u64 + 1) + 2;
    eprintln!("batched renewals: {writes} writes to the server in {periods} periods for {HOLDS} holds");
    assert!(
        writes <= allowed,
        "{writes} writes in {periods} renewal periods for {HOLDS} holds: at most {allowed} (3 per period, one round and 2 more)"
    );
    // (The client may send a round's requests in fewer writes: at least one a period.)
    assert!(writes >= periods as u64 - 1, "{writes} writes: were the holds renewed at all?");
    for h in holds {
        assert_eq!(h.state(), LockState::Held, "{}", h.key());
        h.release().await.unwrap();
    }
}

/// Among batched holds, one of each kind whose key is deleted on the server is told lost
/// (`KeyDeleted`) at the next renewal; every other hold of the same requests stays held.
#[tokio::test]
async fn a_deleted_key_among_batched_holds_loses_that_hold_only() {
    let lease = Duration::from_secs(1);
    let period = lease / 3;
    let redis = connect("?lease=1s").await;
    let holds = hold_every_kind(&redis, &unique("batched-delete"), 240).await;
    renewed_from_now(&holds, Duration::from_secs(10)).await;
    // One hold of each kind, spread over the requests (holds 100..106 are in the second).
    let doomed: Vec<usize> = (100..106).collect();
    let mut conn = raw().await;
    for &i in &doomed {
        let _: i64 = cmd(&mut conn, &["DEL", holds[i].key()]).await;
    }
    for &i in &doomed {
        let reason = tokio::time::timeout(period + Duration::from_secs(2), holds[i].lost())
            .await
            .unwrap_or_else(|_| panic!("{} told lost within a renewal period and 2 s", holds[i].key()));
        assert_eq!(reason, LostReason::KeyDeleted, "{}", holds[i].key());
    }
    // The others were renewed after the deletion, by the same requests, and are held.
    let others: Vec<AnyHold> =
        holds.into_iter().enumerate().filter(|(i, _)| !doomed.contains(i)).map(|(_, h)| h).collect();
    renewed_from_now(&others, Duration::from_secs(10)).await;
    for h in others {
        assert_eq!(h.state(), LockState::Held, "{}", h.key());
        h.release().await.unwrap();
    }
}

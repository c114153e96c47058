//! Leader election, one scenario on every backend the run has a server for: one leader at a
//! time, its value announced and re-announced, the epoch rising with every leader, "no leader"
//! reported, a removed or partitioned leader told first.

use distlock::election::Change;
use distlock::Error;
use std::time::Duration;

use crate::common::backends::on_every_backend;
use crate::common::unique;

const BOUND: Duration = Duration::from_secs(30);

async fn connect(url: &str) -> distlock::Client {
    distlock::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// The election (every backend has them; a refusal fails the test naming the backend).
fn election(client: &distlock::Client, name: &str) -> distlock::election::Election {
    client.election(name).unwrap_or_else(|e| panic!("{}: every backend has elections: {e}", client.backend()))
}

async fn next(observer: &mut distlock::election::Observer) -> Change {
    tokio::time::timeout(BOUND, observer.next()).await.expect("a change within the bound").unwrap()
}

on_every_backend!(
    #[tokio::test]
    one_leader_its_value_and_rising_epochs
);
async fn one_leader_its_value_and_rising_epochs(url: String) {
    let (a, b) = (connect(&url).await, connect(&url).await);
    let name = unique("lead");
    let ea = election(&a, &name);
    let eb = election(&b, &name);
    assert_eq!(ea.leader().await.unwrap(), None, "{url}: nobody leads yet");
    let mut observer = eb.observe_every(Duration::from_millis(10));
    assert_eq!(next(&mut observer).await, Change::NoLeader, "{url}");

    let la = ea.campaign("alpha").await.unwrap();
    assert_eq!(la.value(), "alpha");
    let seen = ea.leader().await.unwrap().unwrap_or_else(|| panic!("{url}: a leader"));
    assert_eq!((seen.value.as_str(), seen.epoch, seen.key.as_str()), ("alpha", la.epoch(), la.key().as_str()));
    assert!(la.lease_deadline() > std::time::Instant::now(), "{url}");
    assert_eq!(next(&mut observer).await, Change::Leader(seen.clone()), "{url}");

    // Nobody else leads meanwhile.
    assert!(eb.try_campaign("beta").await.unwrap().is_none(), "{url}: two leaders");
    assert!(eb.campaign_timeout("beta", Duration::from_millis(300)).await.unwrap().is_none(), "{url}");

    // A new value, the same leader and epoch.
    la.proclaim("alpha-2").await.unwrap();
    assert_eq!(la.value(), "alpha-2");
    let mut proclaimed = seen.clone();
    proclaimed.value = "alpha-2".into();
    assert_eq!(eb.leader().await.unwrap(), Some(proclaimed.clone()), "{url}");
    assert_eq!(next(&mut observer).await, Change::Leader(proclaimed), "{url}");

    // The waiting candidate leads once the leader resigns, with a higher epoch.
    let waiting = tokio::spawn(async move { eb.campaign_timeout("beta", BOUND).await.unwrap() });
    // Queued behind the leader (checked on the server, where it records waiters) before the
    // leader resigns.
    let can = a.info().capabilities;
    let lists_waiters = can.records_waiters && can.lists_by_name;
    if lists_waiters {
        crate::common::eventually(BOUND, &format!("{url}: beta queued behind the leader"), || async {
            let listing = a.locks(&a.lock_name(&name).unwrap()).await;
            listing.map_or(true, |l| l.locks.iter().any(|l| l.entries.len() == 2))
        })
        .await;
    }
    let first_epoch = la.epoch();
    la.resign().await.unwrap();
    let lb = waiting.await.unwrap().unwrap_or_else(|| panic!("{url}: elected after the resign"));
    assert!(lb.epoch() > first_epoch, "{url}: epoch {} after {first_epoch}", lb.epoch());
    assert_eq!(ea.leader().await.unwrap().map(|l| (l.value, l.epoch)), Some(("beta".into(), lb.epoch())));
    // The observer may or may not have seen the gap between the two.
    let mut change = next(&mut observer).await;
    if change == Change::NoLeader {
        change = next(&mut observer).await;
    }
    assert_eq!(change.value(), "beta", "{url}: {change:?}");

    // No leader once the last one resigns; dropping a leadership resigns too.
    lb.resign().await.unwrap();
    assert_eq!(next(&mut observer).await, Change::NoLeader, "{url}");
    let lc = ea.try_campaign("gamma").await.unwrap().unwrap_or_else(|| panic!("{url}: free again"));
    assert_eq!(next(&mut observer).await.value(), "gamma", "{url}");
    drop(lc);
    assert_eq!(next(&mut observer).await, Change::NoLeader, "{url}: a dropped leadership resigns");
    assert_eq!(ea.leader().await.unwrap(), None, "{url}: nothing left behind");
}

on_every_backend!(#[tokio::test] a_removed_leader_is_told_and_cannot_proclaim: zookeeper, redis, postgres, mysql, etcd, sqlite);
async fn a_removed_leader_is_told_and_cannot_proclaim(url: String) {
    let client = connect(&url).await;
    let name = unique("removed");
    let election = election(&client, &name);
    let leading = election.campaign("doomed").await.unwrap();
    // An operator deletes the leader's node or key.
    let key = leading.key();
    if let Some(zk) = client.zookeeper() {
        zk.zookeeper().delete(&key, None).await.unwrap();
    } else if let Some(etcd) = client.etcd() {
        etcd.etcd().delete(key.as_str(), None).await.unwrap();
    } else if let Some(redis) = client.redis() {
        // The key is the election's: the leader's mark is a field of its hash.
        let _: i64 = redis::cmd("DEL").arg(election.name()).query_async(&mut redis.connection()).await.unwrap();
    } else if client.sqlite().is_some() {
        use sqlx::Connection;
        let mut raw = sqlx::SqliteConnection::connect(url.split('?').next().unwrap()).await.unwrap();
        sqlx::query("DELETE FROM distlock_leases WHERE name = ?").bind(&name).execute(&mut raw).await.unwrap();
    } else if client.postgres().is_some() {
        // An operator ends the leader's lock connection (its pid is in the announcement).
        let (pg, conn) = tokio_postgres::connect(url.split('?').next().unwrap(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        pg.execute("SELECT pg_terminate_backend(pid) FROM distlock_leaders WHERE name = $1", &[&name]).await.unwrap();
    } else if client.mysql().is_some() {
        // An operator ends the leader's lock connection.
        use sqlx::Connection;
        let mut raw = sqlx::MySqlConnection::connect(url.split('?').next().unwrap()).await.unwrap();
        let id = key.strip_prefix("connection:").unwrap();
        sqlx::query(&format!("KILL {id}")).execute(&mut raw).await.unwrap();
    } else {
        unreachable!("{url}: a backend with elections that this test cannot remove a leader from");
    }
    let reason = tokio::time::timeout(BOUND, leading.lost()).await.expect("the loss is told");
    assert!(
        matches!(
            reason,
            distlock::LostReason::NodeDeleted
                | distlock::LostReason::KeyDeleted
                | distlock::LostReason::ConnectionClosed
        ),
        "{url}: {reason:?}"
    );
    let refused = leading.proclaim("still here").await;
    assert!(matches!(refused, Err(Error::LockLost { .. })), "{url}: {refused:?}");
    // The server forgets the removed leader once it has ended its connection (MariaDB's KILL
    // frees the lock when the killed thread ends, which may come just after the socket
    // closed): waited for, bounded; the refused proclamation's value never shows.
    crate::common::eventually(BOUND, &format!("{url}: the removed leader no longer named"), || async {
        match election.leader().await.unwrap() {
            None => true,
            Some(l) => {
                assert_ne!(l.value, "still here", "{url}: the value was put back");
                false
            }
        }
    })
    .await;
    // Once the lost leadership is let go, a fresh campaign leads with a higher epoch (on
    // etcd one client's campaigns share a key, so they queue locally first).
    let lost_epoch = leading.epoch();
    assert!(matches!(leading.resign().await, Err(Error::LockLost { .. })), "{url}");
    let again = election.try_campaign("back").await.unwrap().unwrap_or_else(|| panic!("{url}: free"));
    assert!(again.epoch() > lost_epoch, "{url}");
    again.resign().await.unwrap();
}

on_every_backend!(
    #[tokio::test]
    bad_values_and_names_are_clear_errors
);
async fn bad_values_and_names_are_clear_errors(url: String) {
    let client = connect(&url).await;
    let election = election(&client, &unique("bad"));
    let big = "x".repeat(distlock::election::MAX_VALUE + 1);
    let e = election.try_campaign(&big).await.unwrap_err().to_string();
    assert!(e.contains("election value") && e.contains("at most"), "{url}: {e}");
    assert!(client.election("").is_err(), "{url}: an empty name");
    assert_eq!(election.leader().await.unwrap(), None, "{url}: nothing was made");
}

/// On ZooKeeper a path holds one of Curator's two layouts: a candidate of the other is refused,
/// naming the layout there and how to choose it, never queued beside it (two leaders).
#[tokio::test]
async fn zookeeper_refuses_to_mix_the_latch_and_selector_layouts() {
    let Ok(addr) = std::env::var("DISTLOCK_TEST_ZK") else { return };
    let path = format!("/distlock-test/{}", unique("mixed"));
    let latch = connect(&format!("zk://{addr}")).await;
    let selector = connect(&format!("zk://{addr}?election=selector")).await;
    let leading = latch.election(&path).unwrap().campaign("latch").await.unwrap();
    let refused = selector.election(&path).unwrap().try_campaign("selector").await.unwrap_err().to_string();
    assert!(refused.contains("leader latch") && refused.contains("election=selector"), "{refused}");
    leading.resign().await.unwrap();
    let leading = selector.election(&path).unwrap().campaign("selector").await.unwrap();
    let refused = latch.election(&path).unwrap().try_campaign("latch").await.unwrap_err().to_string();
    assert!(refused.contains("mutex"), "{refused}");
    // The reader of each layout sees only its own.
    assert_eq!(selector.election(&path).unwrap().leader().await.unwrap().map(|l| l.value), Some("selector".into()));
    assert_eq!(latch.election(&path).unwrap().leader().await.unwrap(), None);
    leading.resign().await.unwrap();
}

/// The server's address inside a backend URL (`None` for SQLite, which has no network).
fn server_addr(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let rest = rest.split_once('@').map_or(rest, |(_, r)| r);
    let addr = rest.split(['/', '?']).next()?;
    let local = url.starts_with("sqlite:") || url.starts_with("memory:");
    (!addr.is_empty() && !local).then(|| addr.replace("localhost", "127.0.0.1"))
}

on_every_backend!(#[tokio::test] a_partitioned_leader_alone_is_told_first_then_observed_as_no_leader: zookeeper, redis, mysql, etcd, memory);
/// A leader cut off from the server (a silent partition) with no other candidate: it is told it
/// lost the lead, and only after that does an observer see "no leader" (never a leader that
/// still believes it leads beside "no leader"); nobody is left behind. Not on PostgreSQL: its
/// server ends a silent session by TCP keepalive, which the loopback proxy answers itself (the
/// fault matrix shows the lock passing on once the partition heals), so nothing ends there.
/// The in-process store is cut off by its own switch ([`distlock::memory::Client::partition`]).
async fn a_partitioned_leader_alone_is_told_first_then_observed_as_no_leader(url: String) {
    let name = unique("alone");
    let direct = connect(&url).await;
    let election = direct.election(&name).unwrap();
    let mut observer = election.observe_every(Duration::from_millis(20));
    assert_eq!(next(&mut observer).await, Change::NoLeader, "{url}");
    let (via, proxy) = match server_addr(&url) {
        Some(addr) => {
            let proxy = distlock_faults::FaultProxy::start(addr.parse().unwrap()).await.unwrap();
            (connect(&url.replacen(&addr, &proxy.addr().to_string(), 1)).await, Some(proxy))
        }
        None => (connect(&url).await, None),
    };
    let leading = via.election(&name).unwrap().campaign("alone").await.unwrap();
    assert_eq!(next(&mut observer).await.value(), "alone", "{url}");
    let memory = via.downcast::<distlock::memory::Client>();
    match (&proxy, memory) {
        (Some(proxy), _) => proxy.set(distlock_faults::Fault::Blackhole),
        (None, Some(memory)) => memory.partition(),
        (None, None) => unreachable!("{url}: a backend this test cannot cut off"),
    }
    let told = tokio::spawn({
        let lost = leading.lost();
        async move {
            let reason = lost.await;
            (std::time::Instant::now(), reason)
        }
    });
    let change = tokio::time::timeout(Duration::from_secs(60), observer.next())
        .await
        .unwrap_or_else(|_| panic!("{url}: no change within 60 s of the partition"))
        .unwrap();
    let seen = std::time::Instant::now();
    assert_eq!(change, Change::NoLeader, "{url}");
    let (told_at, reason) = tokio::time::timeout(BOUND, told).await.expect("the loss is told").unwrap();
    // The leader's deadline came before the observer saw no leader (the instant a task woke
    // to hear either depends on the machine's load; the deadline does not, and `seen` is read
    // after the observer's answer, so never early).
    let deadline = leading.lease_deadline();
    assert!(told_at >= deadline, "{url}: the leader was told ({reason}) before its own deadline");
    assert!(deadline < seen, "{url}: the observer saw no leader {:?} before the leader's deadline", deadline - seen);
    match (&proxy, memory) {
        (Some(proxy), _) => proxy.heal(),
        (_, memory) => memory.expect("cut off above").heal(),
    }
    drop(leading);
    assert_eq!(election.leader().await.unwrap(), None, "{url}: nothing left behind");
}

/// The observer's next change, which must come within five seconds.
async fn next_soon(observer: &mut distlock::election::Observer, url: &str, what: &str) -> Change {
    let soon = Duration::from_secs(5);
    tokio::time::timeout(soon, observer.next())
        .await
        .unwrap_or_else(|_| panic!("{url}: {what} not reported within {soon:?}"))
        .unwrap()
}

on_every_backend!(#[tokio::test] an_observer_is_woken_by_a_watch_where_the_backend_has_one: zookeeper, etcd, memory);
/// On ZooKeeper and etcd (and the in-process store) an observer is woken by a watch, not a poll: with an interval of ten
/// minutes, a new leader, a new value and "no leader" are each reported within seconds, also
/// after a wait was cancelled (the other backends poll, and are left out here).
async fn an_observer_is_woken_by_a_watch_where_the_backend_has_one(url: String) {
    let (a, b) = (connect(&url).await, connect(&url).await);
    let name = unique("watch");
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let mut observer = eb.observe_every(Duration::from_secs(600));
    assert_eq!(next_soon(&mut observer, &url, "the state").await, Change::NoLeader, "{url}");
    // A wait cancelled (as in a select! loop) keeps the watch: the next one is woken too.
    assert!(tokio::time::timeout(Duration::from_millis(50), observer.next()).await.is_err(), "{url}: no change yet");
    let la = ea.campaign("one").await.unwrap();
    let seen = next_soon(&mut observer, &url, "the leader").await;
    assert!(matches!(&seen, Change::Leader(l) if l.value == "one" && l.epoch == la.epoch()), "{url}: {seen:?}");
    la.proclaim("two").await.unwrap();
    let seen = next_soon(&mut observer, &url, "the new value").await;
    assert!(matches!(&seen, Change::Leader(l) if l.value == "two"), "{url}: {seen:?}");
    la.resign().await.unwrap();
    assert_eq!(next_soon(&mut observer, &url, "no leader").await, Change::NoLeader, "{url}");
}

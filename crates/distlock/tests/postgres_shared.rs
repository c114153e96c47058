//! PostgreSQL's shared lock connections (issue 52): a client's locks share at most
//! `connections` (default 4) server connections, whatever their number, and every promise of a
//! lock on a connection of its own stays: two local holders of one name are two sessions (an
//! advisory lock is counted per session, so one session would be granted it twice), a connection
//! that goes takes every lock on it with it and each is told first, and a cancelled acquire
//! leaves nothing and disturbs no other lock on its connection.
#![cfg(feature = "postgres")]

use crate::common::{eventually, unique};
use distlock::postgres::{Client, MutexGuard};
use distlock::{Error, LockState, LostReason};
use distlock_faults::{mono_now, Fault, FaultProxy, FencedResource, Mode};
use std::time::Duration;

fn pg_url() -> String {
    std::env::var("DISTLOCK_TEST_POSTGRES").expect(
        "DISTLOCK_TEST_POSTGRES is not set: run the tests with scripts/test.sh, which starts PostgreSQL on a free port",
    )
}

/// A client whose sessions are named `app` in `pg_stat_activity`.
async fn client_as(app: &str, query: &str) -> Client {
    Client::connect(&format!("{}?application_name={app}{query}", pg_url())).await.expect("connect")
}

/// A short `application_name` of the test's own.
fn app(what: &str) -> String {
    format!("{what}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

async fn raw() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls).await.expect("raw connection");
    tokio::spawn(connection);
    client
}

/// The server connections of sessions named `app`.
async fn connections(raw: &tokio_postgres::Client, app: &str) -> i64 {
    raw.query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", &[&app]).await.unwrap().get(0)
}

/// The advisory locks (granted, and waited for) of sessions named `app`, kind markers included.
async fn advisory_of(raw: &tokio_postgres::Client, app: &str) -> (i64, i64) {
    let row = raw
        .query_one(
            "SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted) FROM pg_locks l \
             JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND a.application_name = $1",
            &[&app],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

use crate::postgres::holders;

/// Takes every lock of `names` on `pg`, all at once.
async fn take_all(pg: &Client, names: &[String]) -> Vec<MutexGuard> {
    let takes = names.iter().map(|n| {
        let lock = pg.mutex(n).unwrap();
        async move { lock.lock_timeout(Duration::from_secs(30)).await.unwrap().expect("free") }
    });
    futures::future::join_all(takes).await
}

/// 1. 150 locks held by one client, taken all at once, use at most 4 server connections (every
/// session of the client counted, under its own `application_name`), and another client can
/// take none of them; released, nothing is left on the server. (With a connection per held
/// lock, as before, this was 150 connections.)
#[tokio::test]
async fn a_hundred_and_fifty_locks_share_at_most_four_connections() {
    const LOCKS: usize = 150;
    let (raw, app) = (raw().await, app("share"));
    let pg = client_as(&app, "&lease=10s").await;
    let other = Client::connect(&pg_url()).await.unwrap();
    let names: Vec<String> = (0..LOCKS).map(|i| unique(&format!("share{i}"))).collect();
    let guards = take_all(&pg, &names).await;
    assert_eq!(guards.len(), LOCKS);
    let n = connections(&raw, &app).await;
    assert!((1..=4).contains(&n), "{LOCKS} locks held over {n} connections");
    assert_eq!(advisory_of(&raw, &app).await, (2 * LOCKS as i64, 0), "each lock and its kind marker, granted");
    for name in &names {
        assert!(other.mutex(name).unwrap().try_lock().await.unwrap().is_none(), "{name} taken by another client");
    }
    // Still held a lease later (the connections' health checks renew every lock on them).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guards.iter().all(|g| g.state() == LockState::Held));
    // The same with the URL's bound: two connections.
    let app2 = format!("{app}-2");
    let names2: Vec<String> = (0..40).map(|i| unique(&format!("two{i}"))).collect();
    let two = client_as(&app2, "&connections=2").await;
    let held2 = take_all(&two, &names2).await;
    let n2 = connections(&raw, &app2).await;
    assert!((1..=2).contains(&n2), "40 locks with connections=2 over {n2} connections");
    for g in held2 {
        g.release().await.unwrap();
    }
    let mut tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), LOCKS, "every lock its own token");
    for g in guards {
        g.release().await.unwrap();
    }
    assert_eq!(advisory_of(&raw, &app).await, (0, 0), "nothing left after the releases");
    for name in &names {
        other.mutex(name).unwrap().try_lock().await.unwrap().expect("free again").release().await.unwrap();
    }
    assert!(connections(&raw, &app).await <= 4);
}

/// 2. Two holders of one name in one client: PostgreSQL would grant a key twice to one session,
/// so the second must wait on another connection while the first holds (no double grant), get
/// it at the first's release (which releases only the first's hold: the second's stays, and
/// keeps out everyone else), and its own release leaves no advisory lock. A try in the same
/// client meanwhile says busy; two local readers share, and a writer elsewhere waits for both.
#[tokio::test]
async fn two_local_holders_of_one_name_are_two_sessions() {
    let (raw, app) = (raw().await, app("twice"));
    let pg = client_as(&app, "&lease=10s").await;
    let other = Client::connect(&pg_url()).await.unwrap();
    let name = unique("twice");
    let key = pg.key(&name).unwrap();
    // Other locks on the client's connections, so that the name's key shares a connection.
    let beside = take_all(&pg, &(0..10).map(|i| unique(&format!("beside{i}"))).collect::<Vec<_>>()).await;
    let first = pg.mutex(&name).unwrap().lock().await.unwrap();
    let second = tokio::spawn({
        let lock = pg.mutex(&name).unwrap();
        async move { lock.lock().await.unwrap() }
    });
    eventually(Duration::from_secs(5), "the second local holder to queue on the server", || async {
        let h = holders(&raw, key).await;
        h.len() == 2 && h[0].1 && !h[1].1
    })
    .await;
    let queued = holders(&raw, key).await;
    assert_ne!(queued[0].0, queued[1].0, "two sessions: {queued:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "granted twice in one client");
    assert!(pg.mutex(&name).unwrap().try_lock().await.unwrap().is_none(), "a local try while it is held");
    assert!(other.mutex(&name).unwrap().try_lock().await.unwrap().is_none());
    let t1 = first.fencing_token();
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), second).await.expect("handed on").unwrap();
    assert!(second.fencing_token() > t1);
    // The first's release let go of its hold only: the second's session holds it, alone.
    let now = holders(&raw, key).await;
    assert_eq!(now, vec![(queued[1].0, true)], "the second's hold, after the first's release");
    assert!(other.mutex(&name).unwrap().try_lock().await.unwrap().is_none(), "kept out after the first's release");
    assert_eq!(second.state(), LockState::Held);
    second.release().await.unwrap();
    assert!(holders(&raw, key).await.is_empty(), "nothing left on the key");
    // Readers: two in this client share (two sessions), a writer elsewhere waits for both.
    let rw = unique("twice-rw");
    let rkey = pg.key(&rw).unwrap();
    let r1 = pg.rwlock(&rw).unwrap().read().await.unwrap();
    let r2 = pg.rwlock(&rw).unwrap().try_read().await.unwrap().expect("readers share in one client");
    let r = holders(&raw, rkey).await;
    assert_eq!(r.len(), 2, "two shared holds: {r:?}");
    assert_ne!(r[0].0, r[1].0, "each reader its own session");
    assert!(pg.rwlock(&rw).unwrap().try_write().await.unwrap().is_none(), "a local writer beside readers");
    r1.release().await.unwrap();
    assert!(other.rwlock(&rw).unwrap().try_write().await.unwrap().is_none(), "one reader still holds");
    r2.release().await.unwrap();
    other.rwlock(&rw).unwrap().try_write().await.unwrap().expect("free").release().await.unwrap();
    for g in beside {
        g.release().await.unwrap();
    }
    assert_eq!(advisory_of(&raw, &app).await, (0, 0), "nothing left by the client");
}

/// Twelve tasks of one client take one name ten times each, on two connections (so most of them
/// cannot wait on a connection of their own and poll): the fenced checker finds no overlap, and
/// nothing is left.
#[tokio::test]
async fn many_local_holders_of_one_name_never_overlap() {
    const TASKS: usize = 12;
    const CYCLES: u64 = 10;
    let (raw, app) = (raw().await, app("local"));
    let pg = client_as(&app, "&lease=10s&connections=2").await;
    let name = unique("local");
    let resource = FencedResource::new(true, 1);
    let tasks: Vec<_> = (0..TASKS)
        .map(|who| {
            let (lock, resource) = (pg.mutex(&name).unwrap(), resource.clone());
            tokio::spawn(async move {
                for seq in 0..CYCLES {
                    let g = tokio::time::timeout(Duration::from_secs(60), lock.lock()).await.expect("granted").unwrap();
                    let id = resource.begin(who, Mode::Exclusive, g.fencing_token());
                    assert!(resource.write(who, g.fencing_token(), seq));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    resource.end(id);
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let report = resource.report();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, TASKS * CYCLES as usize);
    assert!(connections(&raw, &app).await <= 2);
    assert_eq!(advisory_of(&raw, &app).await, (0, 0), "nothing left");
}

/// Holds `names` on `pg` and starts, for each, a task that records in its own fenced resource
/// the hold from its grant until the guard is told it is lost; returns the tokens and the tasks.
async fn hold_and_watch(
    pg: &Client,
    names: &[String],
    resources: &[std::sync::Arc<FencedResource>],
) -> Vec<tokio::task::JoinHandle<(LostReason, MutexGuard)>> {
    let mut watchers = Vec::new();
    for (name, resource) in names.iter().zip(resources) {
        let g = pg.mutex(name).unwrap().lock().await.unwrap();
        let (start, resource) = (mono_now(), resource.clone());
        watchers.push(tokio::spawn(async move {
            let reason = g.lost().await;
            resource.record_hold(0, Mode::Exclusive, g.fencing_token(), start, mono_now());
            (reason, g)
        }));
    }
    watchers
}

/// Waits for every name of `names` on `pg` (queued on the server before the fault), recording
/// each grant in its resource until released.
fn compete(
    pg: Client,
    names: Vec<String>,
    resources: Vec<std::sync::Arc<FencedResource>>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    names
        .into_iter()
        .zip(resources)
        .map(|(name, resource)| {
            let lock = pg.mutex(&name).unwrap();
            tokio::spawn(async move {
                let g = lock.lock_timeout(Duration::from_secs(60)).await.unwrap().expect("freed for the next holder");
                let id = resource.begin(1, Mode::Exclusive, g.fencing_token());
                tokio::time::sleep(Duration::from_millis(5)).await;
                resource.end(id);
                let token = g.fencing_token();
                g.release().await.unwrap();
                token
            })
        })
        .collect()
}

/// 3. A connection carrying many held locks is terminated on the server
/// (`pg_terminate_backend` of its backend, from another session): every lock on it is told
/// `lost()` (the connection closed) at once, before another client waiting for each of them is
/// granted it (the fenced checker, on the holder's telling and the next holder's grant); the
/// locks on the client's other connections stay held; nothing is left.
#[tokio::test]
async fn a_terminated_connection_loses_every_lock_on_it_first() {
    const LOCKS: usize = 40;
    let (raw, app) = (raw().await, app("kill"));
    let pg = client_as(&app, "&lease=30s").await;
    let names: Vec<String> = (0..LOCKS).map(|i| unique(&format!("kill{i}"))).collect();
    let resources: Vec<_> = (0..LOCKS).map(|_| FencedResource::new(true, 1)).collect();
    let watchers = hold_and_watch(&pg, &names, &resources).await;
    // The backend holding the most of them.
    let mut by_pid = std::collections::HashMap::<i32, Vec<usize>>::new();
    for (i, name) in names.iter().enumerate() {
        let h = holders(&raw, pg.key(name).unwrap()).await;
        by_pid.entry(h[0].0).or_default().push(i);
    }
    let (pid, on_it) = by_pid.iter().max_by_key(|(_, v)| v.len()).map(|(p, v)| (*p, v.clone())).unwrap();
    assert!(on_it.len() >= LOCKS / 4, "the locks spread over {by_pid:?}");
    // The next holders queue on the server first (a connection each to wait on): each is granted
    // the moment the server frees it.
    let competitor = Client::connect(&format!("{}?lease=30s&connections={}", pg_url(), LOCKS + 1)).await.unwrap();
    let waiting = compete(
        competitor,
        on_it.iter().map(|&i| names[i].clone()).collect(),
        on_it.iter().map(|&i| resources[i].clone()).collect(),
    );
    for &i in &on_it {
        let key = pg.key(&names[i]).unwrap();
        eventually(Duration::from_secs(20), "the competitor to queue", || async {
            holders(&raw, key).await.iter().any(|(_, granted)| !granted)
        })
        .await;
    }
    let killed = std::time::Instant::now();
    let _: bool = raw.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
    let mut watchers: Vec<Option<_>> = watchers.into_iter().map(Some).collect();
    for &i in &on_it {
        let (reason, g) = tokio::time::timeout(Duration::from_secs(5), watchers[i].take().unwrap())
            .await
            .expect("told within 5 s, not the lease")
            .unwrap();
        assert_eq!(reason, LostReason::ConnectionClosed);
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    }
    println!("{} locks told lost {:?} after pg_terminate_backend", on_it.len(), killed.elapsed());
    let mut next_tokens = Vec::new();
    for w in waiting {
        next_tokens.push(tokio::time::timeout(Duration::from_secs(30), w).await.expect("granted").unwrap());
    }
    for (&i, next) in on_it.iter().zip(next_tokens) {
        let report = resources[i].report();
        assert!(report.is_clean() && report.holds == 2, "{}: {report}", names[i]);
        assert!(next > 0);
    }
    // The others, on other connections, are held still; released, nothing is left.
    for (i, w) in watchers.into_iter().enumerate() {
        let Some(w) = w else { continue };
        assert!(!w.is_finished(), "{} lost with another connection", names[i]);
        w.abort();
    }
    eventually(Duration::from_secs(10), "the client's locks to be let go", || async {
        advisory_of(&raw, &app).await == (0, 0)
    })
    .await;
}

/// 3b. The same cut off by a silent partition (a fault proxy's blackhole): every lock on the
/// client's connections is told `lost()` at its lease deadline, while the server still holds
/// all of them; only once the proxy cuts the connections does the server free them, and each
/// next holder is granted after its lock's holder was told (the fenced checker).
#[tokio::test]
async fn a_partitioned_client_is_told_of_every_lock_before_the_server_frees_any() {
    const LOCKS: usize = 40;
    let target = pg_url();
    let hostport = target.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let proxy = FaultProxy::start(hostport.parse().unwrap()).await.unwrap();
    let proxied = target.replace(&hostport, &proxy.addr().to_string());
    let pg = Client::connect(&format!("{proxied}?lease=3s")).await.unwrap();
    let raw = raw().await;
    let names: Vec<String> = (0..LOCKS).map(|i| unique(&format!("cut{i}"))).collect();
    let resources: Vec<_> = (0..LOCKS).map(|_| FencedResource::new(true, 1)).collect();
    let watchers = hold_and_watch(&pg, &names, &resources).await;
    assert!(proxy.connections() <= 4, "{LOCKS} locks over {} connections", proxy.connections());
    let competitor = Client::connect(&format!("{target}?lease=10s&connections={}", LOCKS + 1)).await.unwrap();
    let waiting = compete(competitor, names.clone(), resources.clone());
    for name in &names {
        let key = pg.key(name).unwrap();
        eventually(Duration::from_secs(20), "the competitor to queue", || async {
            holders(&raw, key).await.iter().any(|(_, granted)| !granted)
        })
        .await;
    }
    proxy.set(Fault::Blackhole);
    let mut told = Vec::new();
    for w in watchers {
        let (reason, g) =
            tokio::time::timeout(Duration::from_secs(10), w).await.expect("told within the lease").unwrap();
        assert_eq!(reason, LostReason::LeaseExpired);
        told.push(g);
    }
    let mut granted = 0;
    for name in &names {
        granted += holders(&raw, pg.key(name).unwrap()).await.iter().filter(|(_, g)| *g).count();
    }
    assert_eq!(granted, LOCKS, "the server still held every lock when the last holder was told");
    proxy.set(Fault::CutAfter { to_client_bytes: 0 });
    for w in waiting {
        tokio::time::timeout(Duration::from_secs(40), w).await.expect("granted once cut").unwrap();
    }
    for (name, resource) in names.iter().zip(&resources) {
        let report = resource.report();
        assert!(report.is_clean() && report.holds == 2, "{name}: {report}");
    }
    for g in told {
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    }
    for name in &names {
        assert!(holders(&raw, pg.key(name).unwrap()).await.is_empty(), "{name} left held");
    }
}

/// 4. Cancelled acquires leave nothing and disturb no other lock of the client: a wait queued on
/// the server, dropped (cancelled there); a wait polling for want of a free connection
/// (`connections=2`: one waits already), dropped; and tries dropped while their statements run
/// on the connection that carries the client's other locks. Afterwards the client's sessions
/// hold exactly its 30 locks (and their markers), each still `Held` and kept from others.
#[tokio::test]
async fn cancelled_acquires_leave_nothing_and_the_other_locks_stay_held() {
    const LOCKS: usize = 30;
    let (raw, app) = (raw().await, app("cancel"));
    let pg = client_as(&app, "&lease=10s&connections=2").await;
    let other = Client::connect(&pg_url()).await.unwrap();
    let names: Vec<String> = (0..LOCKS).map(|i| unique(&format!("held{i}"))).collect();
    let guards = take_all(&pg, &names).await;
    let (busy1, busy2) = (unique("busy1"), unique("busy2"));
    let held_elsewhere =
        [other.mutex(&busy1).unwrap().lock().await.unwrap(), other.mutex(&busy2).unwrap().lock().await.unwrap()];
    let (k1, k2) = (pg.key(&busy1).unwrap(), pg.key(&busy2).unwrap());
    // A wait that queues on the server (on the client's second connection)...
    let w1 = tokio::spawn({
        let lock = pg.mutex(&busy1).unwrap();
        async move { lock.lock().await }
    });
    eventually(Duration::from_secs(5), "the first wait to queue on the server", || async {
        holders(&raw, k1).await.iter().any(|(_, granted)| !granted)
    })
    .await;
    // ... and one that cannot (no connection left to wait on): it polls.
    let w2 = tokio::spawn({
        let lock = pg.mutex(&busy2).unwrap();
        async move { lock.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w2.is_finished());
    assert_eq!(holders(&raw, k2).await.len(), 1, "the second wait does not queue on the server");
    w1.abort();
    w2.abort();
    // Tries dropped mid-statement, on the connection of the held locks: of a busy name and of
    // free ones (granted, then let go in the background).
    for round in 0..20 {
        let free = unique(&format!("free{round}"));
        let tries = [pg.mutex(&busy2).unwrap(), pg.mutex(&free).unwrap()].map(|lock| {
            tokio::spawn(async move {
                let _ = lock.try_lock().await;
            })
        });
        tokio::task::yield_now().await;
        for t in tries {
            t.abort();
        }
    }
    let want = (2 * LOCKS as i64, 0);
    eventually(Duration::from_secs(10), "the cancelled acquires to leave nothing", || async {
        advisory_of(&raw, &app).await == want
    })
    .await;
    assert_eq!(holders(&raw, k1).await.len(), 1, "the cancelled wait left the server's queue");
    assert!(guards.iter().all(|g| g.state() == LockState::Held), "every other lock still held");
    for name in &names {
        assert!(other.mutex(name).unwrap().try_lock().await.unwrap().is_none(), "{name} free after the cancels");
    }
    // Both busy names free for this client once released elsewhere.
    for g in held_elsewhere {
        g.release().await.unwrap();
    }
    for name in [&busy1, &busy2] {
        pg.mutex(name).unwrap().try_lock().await.unwrap().expect("free").release().await.unwrap();
    }
    for g in guards {
        g.release().await.unwrap();
    }
    assert_eq!(advisory_of(&raw, &app).await, (0, 0));
    assert!(connections(&raw, &app).await <= 2);
}

/// A semaphore's permits and the kind rule on shared connections: permits of one semaphore held
/// by one client share its connections (their marker held once per connection), a mutex of the
/// name in the same client is refused (another of its own sessions holds the semaphore's
/// marker), and nothing is left after the releases.
#[tokio::test]
async fn permits_share_connections_and_the_kind_rule_holds_in_one_client() {
    let (raw, app) = (raw().await, app("permits"));
    let pg = client_as(&app, "&lease=10s").await;
    let name = unique("permits");
    let sem = pg.semaphore(&name, 8).unwrap();
    let mut permits = Vec::new();
    for _ in 0..8 {
        permits.push(sem.try_acquire().await.unwrap().expect("a free permit"));
    }
    assert!(sem.try_acquire().await.unwrap().is_none(), "eight of eight");
    assert!(connections(&raw, &app).await <= 4);
    let refused = pg.mutex(&name).unwrap().try_lock().await;
    assert!(matches!(refused, Err(Error::KindConflict { .. })), "{:?}", refused.map(|g| g.is_some()));
    let refused = Client::connect(&pg_url()).await.unwrap().mutex(&name).unwrap().try_lock().await;
    assert!(matches!(refused, Err(Error::KindConflict { .. })), "{:?}", refused.map(|g| g.is_some()));
    for p in permits {
        p.release().await.unwrap();
    }
    assert_eq!(advisory_of(&raw, &app).await, (0, 0), "permits and markers let go");
    pg.mutex(&name).unwrap().try_lock().await.unwrap().expect("the name is free for a mutex").release().await.unwrap();
}

/// The kind markers held (shared) by sessions named `app`: their second integers (the first is
/// the markers' class), as `pg_advisory_lock` takes them.
async fn markers_of(raw: &tokio_postgres::Client, app: &str) -> Vec<i32> {
    raw.query(
        "SELECT l.objid::bigint FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock' AND l.objsubid = 2 \
         AND l.classid::bigint = $1 AND a.application_name = $2",
        &[&(MARKER_CLASS as i64), &app],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<_, i64>(0) as u32 as i32)
    .collect()
}

/// The first integer of the kind markers' advisory keys ("dlkn").
const MARKER_CLASS: i32 = 0x646c_6b6e;

/// A guard dropped on a thread outside any runtime is released on the client's runtime: its
/// connection stays open for the client's other locks, so a release skipped there would leave
/// the lock held on the server for as long as the connection lives.
#[tokio::test]
async fn a_guard_dropped_outside_the_runtime_releases_its_lock() {
    let (raw, app) = (raw().await, app("offrt"));
    let pg = client_as(&app, "&lease=10s&connections=1").await;
    let (name, kept) = (unique("off-runtime"), unique("kept"));
    let other = pg.mutex(&kept).unwrap().lock().await.unwrap();
    let g = pg.mutex(&name).unwrap().lock().await.unwrap();
    let key = pg.key(&name).unwrap();
    assert_eq!(holders(&raw, key).await.len(), 1);
    std::thread::spawn(move || drop(g)).join().unwrap();
    eventually(Duration::from_secs(5), "the lock dropped off the runtime to be released", || async {
        holders(&raw, key).await.is_empty()
    })
    .await;
    assert_eq!(advisory_of(&raw, &app).await, (2, 0), "the other lock (and its marker) alone");
    assert_eq!(other.state(), LockState::Held);
    other.release().await.unwrap();
    assert_eq!(advisory_of(&raw, &app).await, (0, 0));
}

/// Acquires dropped on a thread outside any runtime while their statements run leave nothing: a
/// try on the connection of the client's other lock (finished on the client's runtime: a grant
/// is let go), and a wait queued on the server (cancelled there from the client's runtime, so
/// it is never granted to nobody once the holder lets go).
#[tokio::test]
async fn acquires_dropped_outside_the_runtime_leave_nothing() {
    let (raw, app) = (raw().await, app("offrt-acq"));
    let pg = client_as(&app, "&lease=10s&connections=2").await;
    let other = Client::connect(&pg_url()).await.unwrap();
    let kept = pg.mutex(&unique("kept")).unwrap().lock().await.unwrap();
    // A try, its statement sent, dropped off the runtime.
    let free = unique("free");
    let fkey = pg.key(&free).unwrap();
    let lock = pg.mutex(&free).unwrap();
    let mut attempt = Box::pin(async move { lock.try_lock().await });
    assert!(futures::poll!(attempt.as_mut()).is_pending(), "the try's statement is in flight");
    std::thread::spawn(move || drop(attempt)).join().unwrap();
    eventually(Duration::from_secs(5), "the dropped try to leave nothing", || async {
        holders(&raw, fkey).await.is_empty() && advisory_of(&raw, &app).await == (2, 0)
    })
    .await;
    pg.mutex(&free).unwrap().try_lock().await.unwrap().expect("free for the client again").release().await.unwrap();
    // A wait queued on the server, dropped off the runtime.
    let busy = unique("busy");
    let bkey = pg.key(&busy).unwrap();
    let held = other.mutex(&busy).unwrap().lock().await.unwrap();
    let lock = pg.mutex(&busy).unwrap();
    let mut wait = Box::pin(async move { lock.lock().await });
    async fn queued_on(raw: &tokio_postgres::Client, key: distlock::postgres::AdvisoryKey) -> bool {
        holders(raw, key).await.iter().any(|(_, granted)| !granted)
    }
    let queued = |raw| queued_on(raw, bkey);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !queued(&raw).await {
        assert!(futures::poll!(wait.as_mut()).is_pending());
        assert!(tokio::time::Instant::now() < deadline, "the wait did not queue on the server");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::thread::spawn(move || drop(wait)).join().unwrap();
    eventually(Duration::from_secs(5), "the dropped wait to leave the server's queue", || async {
        !queued(&raw).await
    })
    .await;
    held.release().await.unwrap();
    assert!(holders(&raw, bkey).await.is_empty(), "granted to the dropped wait");
    pg.mutex(&busy).unwrap().try_lock().await.unwrap().expect("free").release().await.unwrap();
    assert_eq!(kept.state(), LockState::Held);
    kept.release().await.unwrap();
    assert_eq!(advisory_of(&raw, &app).await, (0, 0));
}

/// A statement on a lock connection that waits on the server (here a try whose name's kind
/// marker another session holds exclusively, as a job's `CREATE TABLE` or an election's
/// announcement can wait on another's lock) gives up within a sixth of the lease, with an error,
/// rather than holding up the connection's health check until every lock on it is lost.
#[tokio::test]
async fn a_statement_waiting_on_the_server_costs_no_lock_on_its_connection() {
    let (raw, app) = (raw().await, app("stuck"));
    let pg = client_as(&app, "&lease=3s&connections=1").await;
    let name = unique("stuck");
    // The name's kind marker, as the server shows it while the lock is held.
    let g = pg.mutex(&name).unwrap().lock().await.unwrap();
    let marker = markers_of(&raw, &app).await;
    assert_eq!(marker.len(), 1, "{marker:?}");
    g.release().await.unwrap();
    let kept = pg.mutex(&unique("kept")).unwrap().lock().await.unwrap();
    raw.execute("SELECT pg_advisory_lock($1, $2)", &[&MARKER_CLASS, &marker[0]]).await.unwrap();
    let started = std::time::Instant::now();
    let tried = tokio::time::timeout(Duration::from_secs(2), pg.mutex(&name).unwrap().try_lock())
        .await
        .expect("the try gave up within a sixth of the lease");
    assert!(matches!(tried, Err(Error::Backend { .. })), "{:?}", tried.map(|g| g.is_some()));
    println!("the stuck try gave up after {:?}", started.elapsed());
    // The lock beside it outlives a lease: its health checks were answered.
    assert!(tokio::time::timeout(Duration::from_secs(4), kept.lost()).await.is_err(), "the lock beside it was lost");
    assert_eq!(kept.state(), LockState::Held);
    raw.execute("SELECT pg_advisory_unlock($1, $2)", &[&MARKER_CLASS, &marker[0]]).await.unwrap();
    pg.mutex(&name).unwrap().try_lock().await.unwrap().expect("free").release().await.unwrap();
    kept.release().await.unwrap();
    assert_eq!(advisory_of(&raw, &app).await, (0, 0), "nothing left by the failed try");
}

/// A connection whose lease is lost while it stays open (here the client's runtime stalled past
/// the deadline, so no health check was sent in time) is closed as soon as its locks are told
/// `lost()`: the server frees them then, not at the client's next acquire.
#[tokio::test]
async fn a_lost_connection_is_closed_at_once() {
    let (raw, app) = (raw().await, app("stall"));
    let pg = client_as(&app, "&lease=3s&connections=1").await;
    let g = pg.mutex(&unique("stall")).unwrap().lock().await.unwrap();
    let key = g.key();
    // The fault itself: the whole (current-thread) runtime stalls past the lease deadline.
    std::thread::sleep(Duration::from_secs(4));
    let reason = tokio::time::timeout(Duration::from_secs(2), g.lost()).await.expect("told at once");
    assert_eq!(reason, LostReason::LeaseExpired);
    eventually(Duration::from_secs(3), "the server to free the lock of the lost connection", || async {
        holders(&raw, key).await.is_empty()
    })
    .await;
    assert_eq!(connections(&raw, &app).await, 0, "the lost connection closed");
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    pg.mutex(&unique("after")).unwrap().try_lock().await.unwrap().expect("a new connection").release().await.unwrap();
}

/// A try granted on a connection that has a lease already gets a lease confirmed by its own
/// answer: here the connection's lease is 400 ms old (its first health check is due at a sixth
/// of the lease, 500 ms), and the new guard's deadline is still a lease (less the margin) from
/// its try, not the connection's, 400 ms nearer.
#[tokio::test]
async fn a_grant_on_a_leased_connection_gets_a_fresh_lease() {
    let app = app("fresh");
    let pg = client_as(&app, "&lease=3s&connections=1").await;
    let first = pg.mutex(&unique("first")).unwrap().lock().await.unwrap();
    let old = first.lease_deadline();
    // The connection's lease ages (no condition to wait for: the age is the point).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = std::time::Instant::now();
    let second = pg.mutex(&unique("second")).unwrap().try_lock().await.unwrap().expect("free");
    let left = second.lease_deadline().saturating_duration_since(before);
    assert!(
        left > Duration::from_millis(2800),
        "born {left:?} from its deadline (the connection's was {:?} away)",
        old.saturating_duration_since(before)
    );
    assert_eq!(second.state(), LockState::Held);
    second.release().await.unwrap();
    first.release().await.unwrap();
}

/// Many acquires waiting beyond the connections free for waits (`connections=2`: one waits on
/// the server, the rest poll) are all granted soon after the holder lets go.
#[tokio::test]
async fn polling_waiters_are_all_granted_once_freed() {
    let holder = client_as(&app("poll-holder"), "&lease=10s").await;
    let waiter = client_as(&app("poll-waiter"), "&lease=10s&connections=2").await;
    let names: Vec<String> = (0..30).map(|i| unique(&format!("poll{i}"))).collect();
    let held = take_all(&holder, &names).await;
    let waits: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = waiter.mutex(name).unwrap();
            tokio::spawn(async move { lock.lock_timeout(Duration::from_secs(30)).await })
        })
        .collect();
    // One of them waits on the server (the others poll, unseen there).
    let raw = raw().await;
    let keys: Vec<_> = names.iter().map(|n| holder.key(n).unwrap()).collect();
    eventually(Duration::from_secs(10), "a waiter queued on the server", || async {
        for &key in &keys {
            if holders(&raw, key).await.iter().any(|(_, granted)| !granted) {
                return true;
            }
        }
        false
    })
    .await;
    let freed = std::time::Instant::now();
    for g in held {
        g.release().await.unwrap();
    }
    let mut granted = Vec::new();
    for w in waits {
        let g = tokio::time::timeout(Duration::from_secs(30), w).await.expect("granted").unwrap().unwrap();
        granted.push(g.expect("granted within its wait"));
    }
    println!("30 polling waiters granted {:?} after the release", freed.elapsed());
    for g in granted {
        g.release().await.unwrap();
    }
    for &key in &keys {
        assert!(holders(&raw, key).await.is_empty(), "left held");
    }
}

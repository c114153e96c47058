//! NATS JetStream KV: what only this backend has (the shared scenarios run on it through
//! `on_every_backend!`). The server is `DISTLOCK_TEST_NATS` (scripts/nats.sh start); the tests
//! that kill, restart or reconfigure a server start one of their own in a scratch directory.

use distlock::nats::async_nats;
use distlock::nats::Client;
use distlock::LostReason;
use distlock_faults::{Fault, FaultProxy, FreeWatch};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::{eventually, unique};

fn addr() -> Option<String> {
    crate::common::backends::server("DISTLOCK_TEST_NATS", "nats")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nats.sh")
}

/// Runs `scripts/nats.sh CMD DIR`, its output (an address) trimmed.
fn nats_sh(cmd: &str, dir: &std::path::Path) -> String {
    let out = Command::new(script()).arg(cmd).arg(dir).output().expect("scripts/nats.sh");
    assert!(out.status.success(), "scripts/nats.sh {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A server of the test's own (stopped on drop).
struct Server {
    dir: PathBuf,
    addr: String,
}

impl Server {
    fn start() -> Server {
        let dir = std::env::temp_dir().join(unique("distlock-nats"));
        std::fs::create_dir_all(&dir).unwrap();
        let addr = nats_sh("start", &dir);
        Server { dir, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The raw KV store of `bucket` at `addr`, through async-nats itself.
async fn raw_kv(addr: &str, bucket: &str) -> async_nats::jetstream::kv::Store {
    let nats = async_nats::connect(addr).await.unwrap();
    async_nats::jetstream::new(nats).get_key_value(bucket).await.unwrap()
}

/// A token handed out after a server crash and restart, after a purge of the whole bucket, and
/// after the bucket was deleted and made again is above every earlier one: the stream sequence
/// goes on from its last value (written to disk before each ack: `sync_interval: always`), and a
/// new bucket starts from the clock in microseconds.
#[tokio::test]
async fn tokens_rise_across_a_crash_a_purge_and_a_new_bucket() {
    if addr().is_none() {
        return;
    }
    let server = Server::start();
    let bucket = unique("tokens").replace('-', "_");
    let url = format!("nats://{}/{bucket}?ttl=2s", server.addr);
    let name = unique("rising");
    let take = |url: String, name: String| async move {
        let client = Client::connect(&url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let g = client.mutex(&name).unwrap().lock_timeout(Duration::from_secs(10)).await.unwrap().expect("free");
        let token = g.fencing_token();
        g.release().await.unwrap();
        client.close(Duration::from_secs(1)).await;
        token
    };
    let first = take(url.clone(), name.clone()).await;
    let second = take(url.clone(), name.clone()).await;
    assert!(second > first, "{second} after {first}");
    // A crash: SIGKILL, then the same store.
    nats_sh("kill", &server.dir);
    nats_sh("restart", &server.dir);
    let after_crash = take(url.clone(), name.clone()).await;
    assert!(after_crash > second, "after a crash: {after_crash} after {second}");
    // The whole bucket purged (every key and marker gone).
    let nats = async_nats::connect(&server.addr).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    js.get_stream(format!("KV_{bucket}")).await.unwrap().purge().await.unwrap();
    let after_purge = take(url.clone(), name.clone()).await;
    assert!(after_purge > after_crash, "after a purge: {after_purge} after {after_crash}");
    // The bucket deleted and made again by the next client.
    js.delete_stream(format!("KV_{bucket}")).await.unwrap();
    let new_bucket = take(url.clone(), name.clone()).await;
    assert!(new_bucket > after_purge, "in a new bucket: {new_bucket} after {after_purge}");
}

/// A released key is gone from the bucket a moment later (its delete carries a TTL): the
/// bucket keeps nothing of the locks it served. The waiter on a held lock is woken by its watch
/// when the holder releases, not by a poll (its client's TTL, the longest it waits between
/// reads, is 30 s).
#[tokio::test]
async fn a_release_wakes_the_waiter_at_once_and_leaves_nothing() {
    let Some(addr) = addr() else { return };
    let a = Client::connect(&format!("nats://{addr}?ttl=30s")).await.unwrap();
    let b = Client::connect(&format!("nats://{addr}?ttl=30s")).await.unwrap();
    let name = unique("wake");
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let key = held.key().to_string();
    let waiter = b.mutex(&name).unwrap();
    let waiting = tokio::spawn(async move { waiter.lock_timeout(Duration::from_secs(20)).await });
    // The waiter is watching (its create was refused) once it has tried: give it that long.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let g = waiting.await.unwrap().unwrap().expect("granted after the release");
    let took = released.elapsed();
    assert!(took < Duration::from_secs(3), "the waiter got the lock {took:?} after the release");
    g.release().await.unwrap();
    let kv = raw_kv(&addr, "distlock").await;
    eventually(Duration::from_secs(10), &format!("{key} gone from the bucket"), || {
        let (kv, key) = (kv.clone(), key.clone());
        async move { kv.entry(key).await.unwrap().is_none() }
    })
    .await;
}

/// A holder cut off by a silent partition is `Lost` at its lease deadline, before the server
/// expires its key (watched from the server's side); the expiry marker then wakes a waiter
/// whose own client would read again only after 30 s, and its token is larger.
#[tokio::test]
async fn a_partitioned_holder_is_lost_before_its_key_expires_and_the_marker_wakes_the_waiter() {
    let Some(addr) = addr() else { return };
    let proxy = FaultProxy::start(addr.parse().unwrap()).await.unwrap();
    let a = Client::connect(&format!("nats://{}?ttl=3s&timeout=1s", proxy.addr())).await.unwrap();
    let b = Client::connect(&format!("nats://{addr}?ttl=30s")).await.unwrap();
    let name = unique("partition");
    let held = a.mutex(&name).unwrap().lock().await.unwrap();
    let key = held.key().to_string();
    let lost = held.lost();
    let waiter = b.mutex(&name).unwrap();
    let waiting = tokio::spawn(async move {
        let g = waiter.lock_timeout(Duration::from_secs(20)).await;
        (g, std::time::Instant::now())
    });
    proxy.set(Fault::Blackhole);
    let kv = raw_kv(&addr, "distlock").await;
    // Held while the key's live value carries the holder's mark (the waiter's comes next, a few
    // milliseconds after the expiry); a read that does not answer soon says nothing, and is
    // asked again.
    let owner = held.holder_id().to_string();
    let watch = FreeWatch::start(Duration::from_millis(5), {
        let (kv, key) = (kv.clone(), key.clone());
        move || {
            let (kv, key, owner) = (kv.clone(), key.clone(), owner.clone());
            async move {
                match tokio::time::timeout(Duration::from_millis(500), kv.entry(key)).await {
                    Ok(Ok(Some(e))) => {
                        let v: serde_json::Value = serde_json::from_slice(&e.value).unwrap_or_default();
                        e.operation == async_nats::jetstream::kv::Operation::Put && v["owner"] == owner.as_str()
                    }
                    Ok(Ok(None)) => false,
                    Ok(Err(_)) | Err(_) => true,
                }
            }
        }
    });
    let reason = tokio::time::timeout(Duration::from_secs(10), lost).await.expect("lost within the lease");
    assert_eq!(reason, LostReason::LeaseExpired);
    let deadline = held.lease_deadline();
    let freed = watch.freed_at(Duration::from_secs(10)).await;
    assert!(deadline < freed, "the server expired our key {:?} before the holder's deadline", deadline - freed);
    let (g, granted) = waiting.await.unwrap();
    let g = g.unwrap().expect("granted once the key expired");
    // The waiter's grant came after the holder's deadline, and soon after it: woken by the
    // expiry marker (its own client would read again only after 30 s).
    assert!(granted > deadline, "granted {:?} before the holder's deadline", deadline - granted);
    assert!(granted - deadline < Duration::from_secs(5), "woken {:?} after the deadline", granted - deadline);
    assert!(g.fencing_token() > held.fencing_token());
    g.release().await.unwrap();
    proxy.heal();
    drop(held);
}

/// A renewal whose answer a reset swallows is sent again on the new connection, not waited for
/// until the lease runs out: a reset the lease outlives loses nothing. (async-nats keeps a
/// request open across a reconnect, and its answer never comes: before the fix the hold waited
/// the request's 5 s out and was told lost at its 3 s deadline.)
#[tokio::test]
async fn a_renewal_whose_answer_a_reset_swallowed_is_sent_again_after_the_reconnect() {
    let Some(addr) = addr() else { return };
    let proxy = FaultProxy::start(addr.parse().unwrap()).await.unwrap();
    // The request timeout is the default's (5 s): longer than what is left of the lease.
    let a = Client::connect(&format!("nats://{}?ttl=3s", proxy.addr())).await.unwrap();
    let held = a.mutex(&unique("reset-renewal")).unwrap().lock().await.unwrap();
    let kv = raw_kv(&addr, "distlock").await;
    let revision = |kv: async_nats::jetstream::kv::Store, key: String| async move {
        // The last write's sequence if it is a live value (a delete is not a renewal).
        let live = |e: &async_nats::jetstream::kv::Entry| e.operation == async_nats::jetstream::kv::Operation::Put;
        kv.entry(key).await.ok().flatten().filter(live).map_or(0, |e| e.revision)
    };
    let created = revision(kv.clone(), held.key().to_string()).await;
    // The server's answers are held back: the next renewal lands, its answer does not come.
    proxy.set(Fault::Delay { to_client: Duration::from_secs(30), to_upstream: Duration::ZERO });
    let renewed = crate::common::eventually_some(Duration::from_secs(5), "the first renewal to land", || {
        let (kv, key) = (kv.clone(), held.key().to_string());
        async move { Some(revision(kv, key).await).filter(|&r| r > created) }
    })
    .await;
    // Reset, new connections refused for half a second, as the fault matrix does.
    proxy.set(Fault::RefuseNew);
    proxy.reset_all();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.heal();
    // A renewal after the reconnect lands, before the lease of the unanswered one ends.
    eventually(Duration::from_secs(6), "a renewal after the reconnect", || {
        let (kv, key) = (kv.clone(), held.key().to_string());
        async move { revision(kv, key).await > renewed }
    })
    .await;
    assert!(!held.state().is_lost(), "a reset the lease outlives was taken for a loss: {:?}", held.state());
    held.release().await.expect("still ours at release");
}

/// A bucket made otherwise (memory storage, as ShedLock's provider makes its own) is refused
/// with the reason; a bad URL is refused before any I/O.
#[tokio::test]
async fn a_bucket_made_otherwise_is_refused() {
    let Some(addr) = addr() else { return };
    let bucket = unique("memory").replace('-', "_");
    let nats = async_nats::connect(&addr).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: bucket.clone(),
        storage: async_nats::jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();
    let e = Client::connect(&format!("nats://{addr}/{bucket}")).await.unwrap_err().to_string();
    assert!(e.contains("memory storage") && e.contains(&bucket), "{e}");
    js.delete_key_value(&bucket).await.unwrap();
    let e = Client::connect(&format!("nats://{addr}/{bucket}?ttl=1500ms")).await.unwrap_err().to_string();
    assert!(e.contains("whole seconds"), "{e}");
}

/// A server set up as production is (`scripts/nats.sh start-tls`: TLS only, logins required):
/// the user with its password over TLS takes locks; a wrong password, plaintext and a missing CA
/// are refused naming the cause (never the password); the least-privilege user team-a (its
/// bucket's subjects and the JetStream calls on its stream only, docs/security.md) takes locks,
/// lists them and runs a job in bucket team-a, and cannot touch bucket distlock.
#[tokio::test]
async fn a_tls_only_server_with_logins_and_a_least_privilege_user() {
    if addr().is_none() {
        return;
    }
    let own = distlock_faults::OwnServer::start("nats.sh", "start-tls", &[]);
    let at = own.printed.trim().to_string();
    let password = std::fs::read_to_string(own.dir().join("password")).unwrap().trim().to_string();
    let team_password = std::fs::read_to_string(own.dir().join("team-a.password")).unwrap().trim().to_string();
    let ca = format!("cacert={}", own.file("certs/ca.pem"));
    // The admin user makes team-a's bucket (team-a may not create streams).
    let admin = Client::connect(&format!("natss://distlock:{password}@{at}/team-a?{ca}&ttl=5s")).await.unwrap();
    let g = admin.mutex(&unique("admin")).unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    let text = |r: distlock::Result<Client>| r.map(drop).unwrap_err().to_string();
    let e = text(Client::connect(&format!("natss://distlock:wrong-{password}@{at}?{ca}")).await);
    assert!(e.to_lowercase().contains("authorization"), "{e}");
    assert!(!e.contains(&password), "the password in an error: {e}");
    let e = text(Client::connect(&format!("nats://distlock:{password}@{at}")).await);
    assert!(e.contains("requires TLS: write natss://"), "plaintext to a TLS-only server: {e}");
    let e = text(Client::connect(&format!("natss://distlock:{password}@{at}")).await);
    assert!(e.to_lowercase().contains("certificate"), "no CA: {e}");
    // team-a, in its own bucket: locks, a listing, a job.
    let team = distlock::connect(&format!("natss://team-a:{team_password}@{at}/team-a?{ca}&ttl=5s")).await.unwrap();
    let name = unique("team");
    let held = team.mutex(&name).unwrap().lock().await.unwrap();
    let listed = team.locks("").await.unwrap();
    assert!(listed.locks.iter().any(|l| l.name == name), "{listed:?}");
    let reader = team.read_lock(&unique("team-rw")).unwrap().lock().await.unwrap();
    reader.release().await.unwrap();
    held.release().await.unwrap();
    let job = team.schedule(&unique("team-job")).unwrap().once_per(Duration::from_secs(60));
    match job.try_start().await.unwrap() {
        distlock::schedule::Started::Running(run) => drop(run.finish(Some(0)).await.unwrap()),
        distlock::schedule::Started::Skipped(s) => panic!("team-a's job skipped: {s}"),
    }
    // Not bucket distlock.
    let e =
        distlock::connect(&format!("natss://team-a:{team_password}@{at}/distlock?{ca}")).await.map(drop).unwrap_err();
    assert!(e.to_string().contains("distlock"), "{e}");
    admin.close(Duration::from_secs(1)).await;
}

/// A TLS connect slower than the TLS probe's wait (a long way to the server: 250 ms each way
/// through a proxy) succeeds: NATS says `INFO` in plaintext before its handshake, which the probe
/// must read as NATS does, not take for a plaintext port. A wrong CA is still named as such.
#[tokio::test]
async fn a_slow_tls_connect_is_not_taken_for_a_plaintext_port() {
    if addr().is_none() {
        return;
    }
    let own = distlock_faults::OwnServer::start("nats.sh", "start-tls", &[]);
    let at = own.printed.trim().to_string();
    let password = std::fs::read_to_string(own.dir().join("password")).unwrap().trim().to_string();
    let ca = format!("cacert={}", own.file("certs/ca.pem"));
    let proxy = FaultProxy::start(at.parse().unwrap()).await.unwrap();
    let delay = Duration::from_millis(250);
    proxy.set(Fault::Delay { to_client: delay, to_upstream: delay });
    let url = format!("natss://distlock:{password}@{}?{ca}&ttl=5s&connect_timeout=20s&timeout=10s", proxy.addr());
    let started = std::time::Instant::now();
    let client = Client::connect(&url).await.unwrap_or_else(|e| panic!("a slow TLS connect: {e}"));
    assert!(started.elapsed() > Duration::from_millis(300), "the probe had no time to run: {:?}", started.elapsed());
    let g = client.mutex(&unique("slow")).unwrap().lock().await.unwrap();
    g.release().await.unwrap();
    client.close(Duration::from_secs(2)).await;
    // Another CA: refused for the certificate, slow or not.
    let other = distlock_faults::OwnServer::start("nats.sh", "start-tls", &[]);
    let wrong = format!("cacert={}", other.file("certs/ca.pem"));
    let e = Client::connect(&format!("natss://distlock:{password}@{}?{wrong}&connect_timeout=20s", proxy.addr()))
        .await
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(e.to_lowercase().contains("certificate"), "a wrong CA: {e}");
    assert!(!e.contains(&password), "the password in an error: {e}");
}

/// A server whose one user logs in with an NKey: `?nkey=SEEDFILE` takes locks; another user's
/// seed, no login, a file that holds no seed and a missing file are refused with errors that name
/// the file but never show a seed; the URL as shown and its `Debug` carry the path only.
#[tokio::test]
async fn an_nkey_login() {
    if addr().is_none() {
        return;
    }
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let own = distlock_faults::OwnServer::start("nats.sh", "start-nkey", &[&user.public_key()]);
    let at = own.printed.trim().to_string();
    let write = |name: &str, text: &str| {
        let path = own.dir().join(name);
        std::fs::write(&path, format!("{text}\n")).unwrap();
        path.display().to_string()
    };
    let good = write("user.nk", &seed);
    let url = format!("nats://{at}?nkey={good}");
    let parsed = distlock::nats::NatsUrl::parse(&url).unwrap();
    let shown = format!("{parsed} {parsed:?}");
    assert!(shown.contains(&good) && !shown.contains(&seed), "{shown}");
    let client = Client::connect(&url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let g = client.mutex(&unique("nkey")).unwrap().try_lock().await.unwrap().expect("free");
    g.release().await.unwrap();
    client.close(Duration::from_secs(1)).await;
    // Through the one API too (`distlock::connect`), which the CLI uses.
    let any = distlock::connect(&url).await.unwrap();
    any.close(Duration::from_secs(1)).await;
    let other_seed = nkeys::KeyPair::new_user().seed().unwrap();
    let other = write("other.nk", &other_seed);
    let not_seed = write("not-a-seed.nk", &format!("{}-{seed}", "x"));
    for (url, says) in [
        (format!("nats://{at}?nkey={other}"), "authorization"),
        (format!("nats://{at}"), "authorization"),
        (format!("nats://{at}?nkey={not_seed}"), "no user seed"),
        (format!("nats://{at}?nkey={}/missing.nk", own.dir().display()), "missing.nk"),
        (format!("nats://{at}?creds={good}"), "no user jwt"),
    ] {
        let e = Client::connect(&url).await.map(drop).unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(text.to_lowercase().contains(says), "{url}: {text}");
        assert!(!text.contains(&seed) && !text.contains(&other_seed), "{url}: a seed in {text}");
    }
}

/// A server whose clients log in with a token: `nats://TOKEN@host` takes locks, a wrong token is
/// refused and not shown.
#[tokio::test]
async fn a_token_login() {
    if addr().is_none() {
        return;
    }
    let own = distlock_faults::OwnServer::start("nats.sh", "start-token", &[]);
    let at = own.printed.trim().to_string();
    let token = std::fs::read_to_string(own.dir().join("token")).unwrap().trim().to_string();
    let client = Client::connect(&format!("nats://{token}@{at}")).await.unwrap();
    let g = client.mutex(&unique("token")).unwrap().try_lock().await.unwrap().expect("free");
    g.release().await.unwrap();
    let e = Client::connect(&format!("nats://not-{token}@{at}")).await.map(drop).unwrap_err().to_string();
    assert!(e.to_lowercase().contains("authorization") && !e.contains(&token), "{e}");
}

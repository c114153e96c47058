//! Interoperability with Apache Curator (Java) on the same znode paths and the same ZooKeeper.
//!
//! A small Java program (`tests/curator/CuratorPeer.java`) is compiled against Debian's Curator
//! jars and run beside distlock. Both sides append `enter`/`exit` lines to one log file (single
//! O_APPEND writes, so the file is the true interleaving) and the log is checked for exclusion.

use crate::common::zk::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::Duration;

const BOUND: Duration = Duration::from_secs(60);

fn classpath() -> String {
    distlock_faults::peers::curator_classpath().unwrap_or_else(|missing| {
        panic!("{missing} missing: install Debian's libcurator-recipes-java and zookeeper (scripts/test.sh does)")
    })
}

/// Compiles the Java peer once per test process; returns its class directory.
fn peer_classes() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("distlock-curator-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/curator/CuratorPeer.java");
        let out = Command::new("javac")
            .args(["-d", dir.to_str().unwrap(), "-cp", &classpath(), src.to_str().unwrap()])
            .output()
            .expect("javac (Java 17) must be installed");
        assert!(out.status.success(), "javac failed: {}", String::from_utf8_lossy(&out.stderr));
        dir
    })
}

fn curator(kind: &str, path: &str, iterations: usize, log: &Path, permits: u32) -> Child {
    curator_via(Via::Plain(None), kind, path, iterations, log, permits)
}

/// How the Curator peer reaches ZooKeeper.
enum Via<'a> {
    /// The suite's server in plaintext; with `Some("user:password")`, logged in by digest with
    /// an `ACLProvider` giving that login all permissions and anyone read (what distlock's
    /// `acl=creator` gives).
    Plain(Option<&'a str>),
    /// A server of `scripts/zk.sh start-tls`: its secure port over TLS (Netty, the server checked
    /// against the run's CA and its name, the client certificate presented), logged in by SASL
    /// DIGEST-MD5 as `distlock`. The settings are the ZooKeeper client's own system properties,
    /// as a Curator user sets them; the login is a JAAS file of mode 600, never argv.
    Tls(&'a distlock_faults::OwnServer),
}

fn curator_via(via: Via, kind: &str, path: &str, iterations: usize, log: &Path, permits: u32) -> Child {
    let mut cp = format!("{}:{}", peer_classes().display(), classpath());
    let mut java = Command::new("java");
    let connect = match via {
        Via::Plain(login) => {
            if let Some(login) = login {
                java.env("CURATOR_DIGEST", login);
            }
            zk_addr()
        }
        Via::Tls(server) => {
            for jar in ["buffer", "codec", "common", "handler", "resolver", "transport", "transport-native-unix-common"]
            {
                cp.push_str(&format!(":/usr/share/java/netty-{jar}.jar"));
            }
            let certs = server.dir().join("certs");
            let store = certs.join("client-store.pem");
            let jaas = server.dir().join("client-jaas.conf");
            let password = std::fs::read_to_string(server.dir().join("password")).unwrap();
            let mut key = std::fs::read(certs.join("client.key")).unwrap();
            key.extend(std::fs::read(certs.join("client.pem")).unwrap());
            private_file(&store, &key);
            let login = format!(
                "Client {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required\n    \
                 username=\"distlock\"\n    password=\"{}\";\n}};\n",
                password.trim()
            );
            private_file(&jaas, login.as_bytes());
            java.arg("-Dzookeeper.client.secure=true")
                .arg("-Dzookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty")
                .arg(format!("-Dzookeeper.ssl.keyStore.location={}", store.display()))
                .arg("-Dzookeeper.ssl.keyStore.type=PEM")
                .arg(format!("-Dzookeeper.ssl.trustStore.location={}", certs.join("ca.pem").display()))
                .arg("-Dzookeeper.ssl.trustStore.type=PEM")
                .arg(format!("-Djava.security.auth.login.config={}", jaas.display()));
            server.printed.trim().to_string()
        }
    };
    java.args(["-cp", &cp, "CuratorPeer", &connect, kind, path, &iterations.to_string()])
        .arg(log)
        .arg(permits.to_string())
        .spawn()
        .expect("start java")
}

/// Writes `bytes` to a new file only its owner may read.
fn private_file(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

async fn wait_child(mut child: Child) {
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "Curator peer failed: {status}");
}

fn log_file(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("distlock-{name}-{}.log", uuid::Uuid::new_v4().simple()));
    std::fs::write(&p, b"").unwrap();
    p
}

fn append(log: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new().append(true).open(log).unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap(); // one write(2): atomic with O_APPEND
}

fn curator_entries(log: &Path) -> usize {
    std::fs::read_to_string(log).unwrap().lines().filter(|l| l.ends_with("enter curator")).count()
}

/// Checks the interleaving: W alone; R only with R; at most `permits` S. Returns how many holds
/// each side logged.
fn check(log: &Path, permits: usize) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap();
    let (mut w, mut r, mut s) = (0usize, 0usize, 0usize);
    let (mut curator, mut ours) = (0, 0);
    let mut max_r = 0;
    for (n, line) in text.lines().enumerate() {
        let parts: Vec<&str> = line.split(' ').collect();
        if parts[0] == "ready" {
            continue;
        }
        let (mode, what, who) = (parts[0], parts[1], parts[2]);
        if what == "enter" {
            match who {
                "curator" => curator += 1,
                _ => ours += 1,
            }
        }
        match (mode, what) {
            ("W", "enter") => {
                assert!(w == 0 && r == 0, "line {}: writer entered beside w={w} r={r}\n{text}", n + 1);
                w += 1
            }
            ("W", "exit") => w -= 1,
            ("R", "enter") => {
                assert!(w == 0, "line {}: reader entered beside a writer\n{text}", n + 1);
                r += 1;
                max_r = max_r.max(r);
            }
            ("R", "exit") => r -= 1,
            ("S", "enter") => {
                s += 1;
                assert!(s <= permits, "line {}: {s} permits held, only {permits} exist\n{text}", n + 1);
            }
            ("S", "exit") => s -= 1,
            _ => panic!("bad log line {line:?}"),
        }
    }
    (curator, ours)
}

/// Two distlock clients of `url` taking the mutex at `path` `cycles` times each, logging their
/// holds as "W enter/exit distlock" to `log`; waits (bounded) until both are done.
async fn two_distlock_holders(url: &str, path: &str, log: &Path, cycles: usize) {
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (path, log, url) = (path.to_string(), log.to_path_buf(), url.to_string());
        tasks.push(tokio::spawn(async move {
            let client = distlock::zookeeper::Client::connect(&url).await.unwrap();
            let lock = client.mutex(&path).unwrap();
            for _ in 0..cycles {
                let g = lock.lock().await.unwrap();
                append(&log, "W enter distlock");
                tokio::time::sleep(Duration::from_millis(2)).await;
                append(&log, "W exit distlock");
                g.release().await.unwrap();
            }
            client.close(Duration::from_secs(2)).await;
        }));
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutex_excludes_curator_interprocessmutex_both_ways() {
    let path = unique_path("curator-mutex");
    let log = log_file("mutex");
    let java = curator("mutex", &path, 30, &log, 1);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (path, log) = (path.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect().await;
            let lock = client.mutex(&path).unwrap();
            for _ in 0..30 {
                let g = lock.lock().await.unwrap();
                append(&log, "W enter distlock");
                tokio::time::sleep(Duration::from_millis(2)).await;
                append(&log, "W exit distlock");
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
    }
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(check(&log, 1), (30, 60));

    // Curator queues behind a distlock holder (and sorts our node first).
    let client = connect().await;
    let g = client.mutex(&path).unwrap().lock().await.unwrap();
    let java = curator("mutex", &path, 1, &log, 1);
    wait_children(&client, &path, BOUND, "Curator to queue", |c| c.len() == 2).await;
    let view = client.inspect(&path).await.unwrap();
    assert!(view.contenders[0].holds && view.contenders[0].owner.is_some(), "{view:?}");
    assert!(view.contenders[1].owner.is_none(), "Curator writes its IP, not ours: {view:?}");
    assert_eq!(curator_entries(&log), 30, "Curator must not enter while we hold");
    g.release().await.unwrap();
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(curator_entries(&log), 31, "Curator entered after our release");
}

/// With `acl=creator` and the same digest login as Curator's `authorization` plus an
/// `ACLProvider` (all for the login, read for anyone), the two still exclude each other both
/// ways, whoever makes the lock's nodes; every node under the lock is the login's, and a client
/// without it may read but not delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutex_with_acl_creator_interoperates_with_curator_aclprovider() {
    let login = format!("team:{}", uuid::Uuid::new_v4().simple());
    let path = unique_path("curator-acl");
    let log = log_file("acl");
    let url = format!("zk://{login}@{}?acl=creator", zk_addr());
    let java = curator_via(Via::Plain(Some(&login)), "mutex", &path, 15, &log, 1);
    two_distlock_holders(&url, &path, &log, 15).await;
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(check(&log, 1), (15, 30));
    // A Curator holder's node, made under the login's ACL, kept from a client without it.
    let client = distlock::zookeeper::Client::connect(&url).await.unwrap();
    let g = client.mutex(&path).unwrap().lock().await.unwrap();
    let java = curator_via(Via::Plain(Some(&login)), "mutex", &path, 1, &log, 1);
    wait_children(&client, &path, BOUND, "Curator to queue", |c| c.len() == 2).await;
    let zk = client.zookeeper();
    let anonymous = connect().await;
    for child in zk.list_children(&path).await.unwrap() {
        let node = format!("{path}/{child}");
        let (acl, _) = zk.get_acl(&node).await.unwrap();
        assert!(
            acl.iter().all(|a| a.scheme() != "world" || a.permission() == zookeeper_client::Permission::READ),
            "{node}: {acl:?}"
        );
        let denied = anonymous.zookeeper().delete(&node, None).await.unwrap_err();
        assert_eq!(denied, zookeeper_client::Error::NoAuth, "{node}");
    }
    g.release().await.unwrap();
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
}

/// Against Apache ZooKeeper set up as production is (`scripts/zk.sh start-tls`: only a secure
/// port that requires client certificates, SASL logins enforced), Curator over TLS with the
/// ZooKeeper client's own TLS and SASL settings and distlock over `zks://` with the same login
/// exclude each other both ways, checked on one O_APPEND log; Curator queues behind a distlock
/// holder; nothing is left under the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutex_over_tls_with_sasl_interoperates_with_curator() {
    let server = distlock_faults::OwnServer::start("zk.sh", "start-tls", &[]);
    let password = std::fs::read_to_string(server.dir().join("password")).unwrap().trim().to_string();
    let file = |name: &str| server.file(&format!("certs/{name}"));
    let url = format!(
        "zks://distlock:{password}@{}?auth=sasl&cacert={}&cert={}&key={}&lease=4s&connect_timeout=8s",
        server.printed.trim(),
        file("ca.pem"),
        file("client.pem"),
        file("client.key")
    );
    let path = unique_path("curator-tls");
    let log = log_file("tls");
    let java = curator_via(Via::Tls(&server), "mutex", &path, 15, &log, 1);
    two_distlock_holders(&url, &path, &log, 15).await;
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(check(&log, 1), (15, 30));

    let client = distlock::zookeeper::Client::connect(&url).await.unwrap();
    let g = client.mutex(&path).unwrap().lock().await.unwrap();
    let java = curator_via(Via::Tls(&server), "mutex", &path, 1, &log, 1);
    wait_children(&client, &path, BOUND, "Curator to queue over TLS", |c| c.len() == 2).await;
    assert_eq!(curator_entries(&log), 15, "Curator must not enter while we hold");
    g.release().await.unwrap();
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(curator_entries(&log), 16, "Curator entered after our release");
    wait_children(&client, &path, BOUND, "the lock's nodes to go", |c| c.is_empty()).await;
    client.close(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_interoperates_with_curator_interprocessreadwritelock() {
    let path = unique_path("curator-rw");
    let log = log_file("rw");
    let jw = curator("write", &path, 15, &log, 1);
    let jr = curator("read", &path, 15, &log, 1);
    let mut tasks = Vec::new();
    for s in 0..3 {
        let (path, log) = (path.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect().await;
            let lock = client.rwlock(&path).unwrap();
            for i in 0..15 {
                if (s + i) % 3 == 0 {
                    let g = lock.write().await.unwrap();
                    append(&log, "W enter distlock");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    append(&log, "W exit distlock");
                    g.release().await.unwrap();
                } else {
                    let g = lock.read().await.unwrap();
                    append(&log, "R enter distlock");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    append(&log, "R exit distlock");
                    g.release().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
    }
    tokio::time::timeout(BOUND, wait_child(jw)).await.unwrap();
    tokio::time::timeout(BOUND, wait_child(jr)).await.unwrap();
    assert_eq!(check(&log, 1), (30, 45));

    // Curator readers share with a distlock reader: they finish while we hold our read lock.
    let client = connect().await;
    let r = client.rwlock(&path).unwrap().read().await.unwrap();
    tokio::time::timeout(BOUND, wait_child(curator("read", &path, 3, &log, 1))).await.unwrap();
    // A Curator writer queued behind our reader blocks later distlock readers and writers.
    let jw = curator("write", &path, 1, &log, 1);
    wait_children(&client, &path, BOUND, "Curator writer to queue", |c| c.iter().any(|n| n.contains("__WRIT__"))).await;
    let other = connect().await;
    let late = other.rwlock(&path).unwrap();
    assert!(late.try_read().await.unwrap().is_none(), "reader must wait behind a queued Curator writer");
    assert!(late.try_write().await.unwrap().is_none());
    r.release().await.unwrap();
    tokio::time::timeout(BOUND, wait_child(jw)).await.unwrap();
    assert!(late.try_write().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphore_shares_permits_with_curator_interprocesssemaphorev2() {
    const PERMITS: u32 = 2;
    let path = unique_path("curator-sem");
    let log = log_file("sem");
    let java = curator("semaphore", &path, 20, &log, PERMITS);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (path, log) = (path.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let client = connect().await;
            let sem = client.semaphore(&path, PERMITS).unwrap();
            for _ in 0..20 {
                let p = sem.acquire().await.unwrap();
                append(&log, "S enter distlock");
                tokio::time::sleep(Duration::from_millis(2)).await;
                append(&log, "S exit distlock");
                p.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
    }
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(check(&log, PERMITS as usize), (20, 40));
    // With both our permits taken, Curator cannot get one until we let go.
    let client = connect().await;
    let both = client.semaphore(&path, PERMITS).unwrap().acquire_many(2).await.unwrap();
    let java = curator("semaphore", &path, 1, &log, PERMITS);
    let leases = format!("{path}/leases");
    wait_children(&client, &leases, BOUND, "Curator's lease", |c| c.len() == 3).await;
    assert_eq!(curator_entries(&log), 20, "Curator must not get a third permit");
    both.release().await.unwrap();
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(curator_entries(&log), 21);
}

/// Waits (bounded) until the log has a line `line`.
async fn log_has(log: &Path, line: &str) {
    let text = || std::fs::read_to_string(log).unwrap();
    crate::common::eventually(BOUND, &format!("a line {line:?} in {}", log.display()), || async {
        text().lines().any(|l| l == line)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_interoperates_with_curator_leaderselector() {
    election_interoperates_with_curator("selector").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_interoperates_with_curator_leaderlatch() {
    election_interoperates_with_curator("latch").await;
}

/// Curator's `LeaderSelector` or `LeaderLatch` (`layout`) and distlock candidates on one path
/// (the URL's `election=` layout).
async fn election_interoperates_with_curator(layout: &str) {
    let path = unique_path(&format!("curator-elect-{layout}"));
    let url = format!("zk://{}?election={layout}", zk_addr());
    let (leader, ask, until_told) = match layout {
        "selector" => ("leader", "getleader", "lead-until-told"),
        _ => ("latch", "latch-getleader", "latch-until-told"),
    };
    // Leaders alternate between Curator's LeaderSelector and two distlock candidates, never two
    // at once.
    let log = log_file("elect");
    let java = curator(leader, &path, 20, &log, 1);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (path, log, url) = (path.clone(), log.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let client = distlock::connect(&url).await.unwrap();
            let election = client.election(&path).unwrap();
            for _ in 0..20 {
                let leading = election.campaign("distlock").await.unwrap();
                append(&log, "W enter distlock");
                tokio::time::sleep(Duration::from_millis(2)).await;
                append(&log, "W exit distlock");
                leading.resign().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
    }
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
    assert_eq!(check(&log, 1), (20, 40));

    // Curator's getLeader() reads a distlock leader's value as its id.
    let client = distlock::connect(&url).await.unwrap();
    let election = client.election(&path).unwrap();
    let leading = election.campaign("rust-leader").await.unwrap();
    let asked = log_file("elect-ask");
    tokio::time::timeout(BOUND, wait_child(curator(ask, &path, 1, &asked, 1))).await.unwrap();
    log_has(&asked, "leader-is rust-leader").await;
    leading.resign().await.unwrap();

    // distlock reads a Curator leader's id, cannot lead beside it, and leads once it resigns.
    let told = log_file("elect-told");
    let java = curator(until_told, &path, 1, &told, 1);
    log_has(&told, "W enter curator").await;
    let leader = election.leader().await.unwrap().expect("Curator leads");
    assert_eq!(leader.value, "curator", "{leader:?}");
    assert!(election.try_campaign("early").await.unwrap().is_none(), "two leaders");
    let waiting = {
        let election = election.clone();
        tokio::spawn(async move { election.campaign_timeout("after", BOUND).await.unwrap() })
    };
    append(&told, "resign curator");
    let leading = waiting.await.unwrap().expect("elected once Curator resigned");
    assert!(std::fs::read_to_string(&told).unwrap().contains("W exit curator"), "led before Curator resigned");
    assert!(leading.epoch() > leader.epoch, "epochs rise: {} after {}", leading.epoch(), leader.epoch);
    assert_eq!(election.leader().await.unwrap().map(|l| l.value), Some("after".to_string()));
    leading.resign().await.unwrap();
    tokio::time::timeout(BOUND, wait_child(java)).await.unwrap();
}

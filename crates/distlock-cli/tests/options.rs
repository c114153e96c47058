//! The options every backend honours, given the same way on every scheme: `--connect-timeout`
//! gives up on a server that accepts and never answers after the timeout, and `--lease` (alias
//! `--session-timeout`) is taken or refused with a message that names it.

use crate::common;

use common::distlock;
use std::net::TcpListener;
use std::time::{Duration, Instant};

/// A server that accepts connections and never answers: its address. The listener thread keeps
/// every connection open (and ends with the test process).
fn silent_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().map_while(Result::ok) {
            held.push(conn);
        }
    });
    addr
}

#[test]
fn connect_timeout_is_honoured_on_every_scheme() {
    let timeout = Duration::from_secs(2);
    let mut report = Vec::new();
    for scheme in ["zk://{}", "redis://{}", "postgres://u@{}/db", "mysql://u@{}/db", "etcd://{}"] {
        let url = scheme.replace("{}", &silent_server().to_string());
        let started = Instant::now();
        let out =
            distlock(&url, &["exec", "--connect-timeout", "2s", "--lease", "3s", "-n", "options-test", "--", "true"])
                .output()
                .unwrap();
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        // One line saying why (the ZooKeeper client's retries printed a warning each).
        assert_eq!(stderr.lines().count(), 1, "{url}: {stderr}");
        report.push(format!("{url}: gave up after {took:?}"));
        // Not early; late by at most a second (starting a debug build's process on a busy
        // machine), which still tells the timeout honoured from a default one (10 s or more).
        assert!(
            took >= timeout * 9 / 10 && took <= timeout + Duration::from_secs(1),
            "{url}: gave up after {took:?}, not {timeout:?}: {stderr}"
        );
    }
    println!("{}", report.join("\n"));
}

#[test]
fn lease_is_one_flag_on_every_scheme() {
    // A zero lease is refused by name before anything is contacted, whatever the scheme.
    for url in [
        "zk://127.0.0.1:1",
        "redis://127.0.0.1:1",
        "postgres://u@127.0.0.1:1/db",
        "mysql://u@127.0.0.1:1/db",
        "etcd://127.0.0.1:1",
        "sqlite:///nonexistent-dir/x.db",
    ] {
        for flag in ["--lease", "--session-timeout"] {
            let out = distlock(url, &["exec", flag, "0s", "-n", "options-test", "--", "true"]).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{url} {flag}: {stderr}");
            assert!(stderr.contains("lease"), "{url} {flag}: {stderr}");
        }
    }
    // A lease a backend cannot keep is refused with its reason (etcd counts whole seconds).
    let out = distlock("etcd://127.0.0.1:1", &["exec", "--lease", "1500ms", "-n", "x", "--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("whole seconds"), "{stderr}");
    // The URL shown is the one given, and the lease is said to come from the flag.
    assert!(
        stderr.contains("\"etcd://127.0.0.1:1\"") && stderr.contains("set by the options, not the URL: lease 1.5s"),
        "{stderr}"
    );
    // And a lease in range is taken.
    let dir = std::env::temp_dir().join(common::unique("distlock-options-"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/locks.db", dir.display());
    let out = distlock(&url, &["exec", "--lease", "7s", "leased", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that is not there (every address refuses) is reported at once and plainly on every
/// network scheme, far inside a 10 s connect timeout (etcd took 4.7 s and printed the gRPC
/// client's error dump); a name that does not resolve is not blamed on a stopped server.
#[test]
fn a_refused_connection_is_reported_at_once_on_every_network_scheme() {
    for url in [
        "zk://127.0.0.1:1",
        "redis://127.0.0.1:1",
        "postgres://u@127.0.0.1:1/db",
        "mysql://u@127.0.0.1:1/db",
        "etcd://127.0.0.1:1",
        "etcd://127.0.0.1:1,127.0.0.1:2",
    ] {
        let started = Instant::now();
        let out = distlock(url, &["exec", "--connect-timeout", "10s", "x", "--", "true"]).output().unwrap();
        let (took, stderr) = (started.elapsed(), String::from_utf8_lossy(&out.stderr).to_string());
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(stderr.to_lowercase().contains("refused"), "{url}: {stderr}");
        assert!(!stderr.contains("tonic") && !stderr.contains("Error("), "{url}: a raw error: {stderr}");
        assert!(took < Duration::from_secs(3), "{url}: {took:?} (the connect timeout is 10 s): {stderr}");
        println!("{url}: {took:?}: {}", stderr.trim());
    }
    for url in ["zk://no-such-host.invalid:2181", "etcd://no-such-host.invalid:2379"] {
        let out = distlock(url, &["exec", "--connect-timeout", "10s", "x", "--", "true"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(
            stderr.contains("no-such-host.invalid") && !stderr.contains("is the server running"),
            "{url}: {stderr}"
        );
    }
}

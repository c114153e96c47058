//! Helpers for the tests against a real ZooKeeper: the server comes from `scripts/test.sh` (which
//! starts it with `scripts/zk.sh` on a free port and exports `DISTLOCK_TEST_ZK=host:port`).

use distlock::zookeeper::Client;
use std::time::Duration;

pub fn zk_addr() -> String {
    std::env::var("DISTLOCK_TEST_ZK").expect(
        "DISTLOCK_TEST_ZK is not set: run the tests with scripts/test.sh, which starts ZooKeeper on a free port",
    )
}

/// A URL with a short session so expiry tests finish quickly.
pub fn zk_url(session_timeout: &str) -> String {
    format!("zk://{}?session_timeout={session_timeout}", zk_addr())
}

pub async fn connect() -> Client {
    Client::connect(&zk_url("4s")).await.expect("connect to test ZooKeeper")
}

/// A lock path no other test uses.
pub fn unique_path(name: &str) -> String {
    format!("/distlock-test/{name}-{}", uuid::Uuid::new_v4().simple())
}

/// Children of `path` (empty when it does not exist).
pub async fn children(client: &Client, path: &str) -> Vec<String> {
    match client.zookeeper().list_children(path).await {
        Ok(c) => c,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {path}: {e}"),
    }
}

/// Waits (bounded) until `cond` holds, re-checking on every change notification of `path`'s
/// children; panics with `what` if it does not within `bound`.
pub async fn wait_children(client: &Client, path: &str, bound: Duration, what: &str, cond: impl Fn(&[String]) -> bool) {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let (list, watcher) = match client.zookeeper().list_and_watch_children(path).await {
            Ok((c, w)) => (c, Some(w)),
            Err(zookeeper_client::Error::NoNode) => (Vec::new(), None),
            Err(e) => panic!("list {path}: {e}"),
        };
        if cond(&list) {
            return;
        }
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!remaining.is_zero(), "timed out after {bound:?} waiting for {what}; children: {list:?}");
        match watcher {
            Some(w) => {
                let _ = tokio::time::timeout(remaining, w.changed()).await;
            }
            None => {
                // The directory does not exist: wait for its creation.
                let (_, w) = client.zookeeper().check_and_watch_stat(path).await.expect("exists");
                let _ = tokio::time::timeout(remaining, w.changed()).await;
            }
        }
    }
}

/// A hold interval recorded by a contender.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    pub who: usize,
    pub token: u64,
    pub start: std::time::Instant,
    pub end: std::time::Instant,
}

/// Asserts that no two hold intervals overlap and that tokens rise in grant order.
pub fn assert_exclusive(holds: &mut [Hold]) {
    holds.sort_by_key(|h| h.start);
    for pair in holds.windows(2) {
        assert!(pair[0].end <= pair[1].start, "overlapping holds: {:?} and {:?}", pair[0], pair[1]);
        assert!(pair[0].token < pair[1].token, "fencing token did not rise: {:?} then {:?}", pair[0], pair[1]);
    }
}

/// The test server's address as a socket address (for the fault proxy).
pub fn zk_socket() -> std::net::SocketAddr {
    zk_addr().parse().expect("DISTLOCK_TEST_ZK is host:port with a numeric host")
}

/// A client whose every byte passes through a fault proxy of its own.
pub async fn proxied(session_timeout: &str) -> (distlock_faults::FaultProxy, Client) {
    let proxy = distlock_faults::FaultProxy::start(zk_socket()).await.expect("start fault proxy");
    let url = format!("zk://{}?session_timeout={session_timeout}", proxy.addr());
    let client = Client::connect(&url).await.expect("connect through the fault proxy");
    (proxy, client)
}

/// Cuts a proxied client off: every connection reset, new ones refused (until `heal()`), so the
/// client knows at once that it is disconnected.
pub fn cut_off(proxy: &distlock_faults::FaultProxy) {
    proxy.set(distlock_faults::Fault::RefuseNew);
    proxy.reset_all();
}

/// Waits (bounded) until nothing is left under `path` (the lock directory is empty or gone).
pub async fn wait_empty(client: &Client, path: &str, bound: Duration) {
    wait_children(client, path, bound, &format!("{path} to be empty"), |c| c.is_empty()).await;
}

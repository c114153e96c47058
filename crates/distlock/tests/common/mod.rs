//! What the library's tests share: the servers' URLs (`backends`), one name per test
//! (`unique`), a bounded wait on a condition (`eventually`), the ZooKeeper helpers (`zk`), the
//! secured-server scenarios (`secure`), and `on_every_backend!`, which makes one named test per
//! backend of a scenario.

#![allow(dead_code)]

use std::time::Duration;

pub mod backends;
pub mod secure;
pub mod zk;

/// A name no other test uses: `what` and 64 random bits (short enough for every backend's names).
pub fn unique(what: &str) -> String {
    format!("{what}-{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

/// Waits (bounded) until `cond` holds, re-checking every 10 ms; panics naming `what`. For a
/// condition with no event to wait on (a row or key seen from outside, a count on the server).
pub async fn eventually<F, Fut>(bound: Duration, what: &str, cond: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {bound:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded) until `get` gives a value, re-checking every 10 ms, and returns it; panics
/// naming `what`. `eventually` for a wait whose condition is also the value waited for.
pub async fn eventually_some<T, F, Fut>(bound: Duration, what: &str, get: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if let Some(v) = get().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {bound:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The name `cargo test` knows the test `name` of module `module` by (`module_path!()`), for a
/// test that runs another test of this binary in a child process (`--exact` takes it).
pub fn test_name(module: &str, name: &str) -> String {
    let path = module.split_once("::").map_or("", |(_, rest)| rest);
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}::{name}")
    }
}

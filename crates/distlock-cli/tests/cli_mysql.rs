//! `distlock exec` and `inspect` on MariaDB, against the server from scripts/test.sh
//! (`DISTLOCK_TEST_MYSQL=mysql://…`).

mod common;

use common::{distlock, unique, wait_exit, Lines};
use std::process::Stdio;
use std::time::Duration;

fn backend(query: &str) -> String {
    let url =
        std::env::var("DISTLOCK_TEST_MYSQL").expect("run the tests with scripts/test.sh (DISTLOCK_TEST_MYSQL unset)");
    format!("{url}{query}")
}

#[test]
fn exec_on_mariadb_excludes_passes_the_token_and_inspect_shows_the_holder() {
    let (b, lock) = (backend("?lease=5s"), unique("cli-"));
    let mut holder = distlock(&b, &["exec", &lock, "--", "sh", "-c", "echo $DISTLOCK_TOKEN; read _ || true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    let t1: u64 = lines.next(Duration::from_secs(20), "the token").parse().unwrap();
    let busy = distlock(&b, &["exec", "-n", &lock, "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    let view = distlock(&b, &["inspect", "--json", &lock]).output().unwrap();
    let view: serde_json::Value = serde_json::from_slice(&view.stdout).unwrap();
    assert!(view["holder_connection"].as_u64().is_some(), "{view}");
    assert_eq!(view["last_token"].as_u64(), Some(t1), "{view}");
    drop(holder.stdin.take());
    assert!(wait_exit(&mut holder, Duration::from_secs(20)).success());
    let next = distlock(&b, &["exec", "-w", "10", &lock, "--", "sh", "-c", "echo $DISTLOCK_TOKEN"]).output().unwrap();
    assert!(next.status.success(), "{}", String::from_utf8_lossy(&next.stderr));
    let t2: u64 = String::from_utf8_lossy(&next.stdout).trim().parse().unwrap();
    assert!(t2 > t1, "tokens rise: {t1} then {t2}");
    let view = distlock(&b, &["inspect", "--json", &lock]).output().unwrap();
    let view: serde_json::Value = serde_json::from_slice(&view.stdout).unwrap();
    assert!(view["holder_connection"].is_null(), "nothing left held: {view}");
}

/// Paused past its lease (the session's wait_timeout, 3 s), the holder's connection is closed by
/// the server and the lock passes on; its command's late writes are refused by the fence.
#[test]
fn a_paused_holder_is_kept_out_by_its_fencing_token() {
    common::a_paused_holder_is_kept_out_by_its_fencing_token(&backend("?lease=3s"), &unique("cli-pause-"));
}

/// A killed holder (SIGKILL of exec and its command): its connection closes with the process, and
/// the server frees the lock (at once here; within the lease at worst).
#[test]
fn a_killed_holder_frees_the_lock() {
    common::a_killed_holder_frees_the_lock(
        &backend("?lease=5s"),
        &unique("cli-killed-"),
        Duration::from_secs(5),
        false,
    );
}

//! `distlock exec` and `inspect` on etcd, and `etcdctl lock` on the same names, against the
//! member from scripts/test.sh (`DISTLOCK_TEST_ETCD=host:port`).

use crate::common;

use common::{distlock, unique, wait_exit, Lines};
use std::process::{Command, Stdio};
use std::time::Duration;

fn addr() -> String {
    std::env::var("DISTLOCK_TEST_ETCD").expect("run the tests with scripts/test.sh (DISTLOCK_TEST_ETCD unset)")
}

fn backend(query: &str) -> String {
    format!("etcd://{}{query}", addr())
}

fn etcdctl(args: &[&str]) -> Command {
    let mut c = Command::new("etcdctl");
    c.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", addr())).args(args);
    c
}

/// A command that says it holds, then holds until its standard input closes.
const HOLD: &str = "echo \"held $ETCD_LOCK_KEY $ETCD_LOCK_REV\"; read _ || true";

#[test]
fn exec_passes_etcdctl_style_variables_and_inspect_shows_the_queue() {
    let (b, lock) = (backend("?ttl=5s"), unique("cli-"));
    let mut holder = distlock(&b, &["exec", &lock, "--", "sh", "-c", HOLD])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    let said = lines.next(Duration::from_secs(20), "held");
    let parts: Vec<&str> = said.split(' ').collect();
    assert_eq!(parts[0], "held", "{said}");
    assert!(parts[1].starts_with(&format!("{lock}/")), "ETCD_LOCK_KEY is our key: {said}");
    let rev: u64 = parts[2].parse().unwrap();
    let busy = distlock(&b, &["exec", "-n", &lock, "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    let view = common::one_lock(&distlock(&b, &["inspect", "--json", &lock]).output().unwrap());
    assert_eq!(view["entries"][0]["id"].as_str(), Some(parts[1]), "{view}");
    assert_eq!(view["entries"][0]["token"].as_u64(), Some(rev), "ETCD_LOCK_REV is the token: {view}");
    drop(holder.stdin.take());
    assert!(wait_exit(&mut holder, Duration::from_secs(20)).success());
    let view = common::one_lock(&distlock(&b, &["inspect", "--json", &lock]).output().unwrap());
    assert_eq!(view["entries"].as_array().map(Vec::len), Some(0), "nothing left: {view}");
}

/// The same LOCK name given to `etcdctl lock` and to `distlock exec` is one lock: each waits
/// for the other, and the one that waited starts only after the other's command ended.
#[test]
fn etcdctl_lock_and_distlock_exec_exclude_each_other_both_ways() {
    for etcdctl_first in [true, false] {
        let lock = unique("cli-interop-");
        let dir = std::env::temp_dir().join(unique("distlock-interop-"));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        // Each appends "<who> in" and, after a pause, "<who> out".
        let script = |who: &str| format!("echo {who} in >> {0}; sleep 0.5; echo {who} out >> {0}", log.display());
        let first_script = format!("{}; echo done", script("first"));
        let mut first = if etcdctl_first {
            etcdctl(&["lock", &lock, "--", "sh", "-c", &first_script]).stdout(Stdio::piped()).spawn().unwrap()
        } else {
            distlock(&backend("?ttl=5s"), &["exec", &lock, "--", "sh", "-c", &first_script])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        };
        // Start the second once the first holds (its "in" line is written).
        common::eventually(Duration::from_secs(20), "the first to hold", || {
            std::fs::read_to_string(&log).unwrap_or_default().contains("first in")
        });
        let second = if etcdctl_first {
            distlock(&backend("?ttl=5s"), &["exec", "-w", "20s", &lock, "--", "sh", "-c", &script("second")])
                .output()
                .unwrap()
        } else {
            etcdctl(&["lock", &lock, "--", "sh", "-c", &script("second")]).output().unwrap()
        };
        assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
        assert!(wait_exit(&mut first, Duration::from_secs(20)).success());
        let order = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            order.lines().collect::<Vec<_>>(),
            ["first in", "first out", "second in", "second out"],
            "etcdctl first: {etcdctl_first}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Paused past its lease (TTL 2 s, etcd's least), the holder's keys expire and the lock passes
/// on; its command's late writes are refused by the fence.
#[test]
fn a_paused_holder_is_kept_out_by_its_fencing_token() {
    common::a_paused_holder_is_kept_out_by_its_fencing_token(&backend("?ttl=2s"), &unique("cli-pause-"));
}

/// A killed holder: nobody revokes its lease, so the lock is free when the lease expires on the
/// server, not before.
#[test]
fn a_killed_holder_frees_the_lock_when_its_lease_expires() {
    common::a_killed_holder_frees_the_lock(&backend("?ttl=3s"), &unique("cli-killed-"), Duration::from_secs(3), true);
}

#[test]
fn elect_observe_and_leader_on_etcd() {
    common::elect_observe_and_leader(&backend("?ttl=5s"), &unique("cli-elect-"));
}

/// `etcdctl elect` and `distlock elect` campaign in one election (Go's `concurrency.Election`
/// layout), each waiting for the other's leadership to end; `distlock leader` reads etcdctl's
/// proposal and `etcdctl elect -l` a distlock leader's value.
#[test]
fn etcdctl_elect_and_distlock_elect_take_turns_both_ways() {
    let bound = Duration::from_secs(20);
    let name = unique("cli-elect-interop-");
    let b = backend("?ttl=5s");
    // etcdctl leads: it prints its key and proposal once elected.
    let mut theirs = etcdctl(&["elect", &name, "their-proposal"]).stdout(Stdio::piped()).spawn().unwrap();
    let theirs_says = Lines::of(&mut theirs);
    assert!(theirs_says.next(bound, "etcdctl's key").starts_with(&format!("{name}/")));
    assert_eq!(theirs_says.next(bound, "etcdctl's proposal"), "their-proposal");
    let leader = distlock(&b, &["leader", &name]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&leader.stdout).trim_end(), "their-proposal");
    let busy = distlock(&b, &["elect", "-n", "--value", "ours", &name, "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "elected beside etcdctl");
    let mut ours = distlock(&b, &["elect", "--value", "ours", &name, "--", "sh", "-c", "echo lead; read _ || true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ours_says = Lines::of(&mut ours);
    candidates(&name, 2, bound);
    assert!(ours_says.0.recv_timeout(Duration::from_millis(300)).is_err(), "led beside etcdctl");
    // etcdctl resigns on INT; distlock leads then.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(theirs.id() as i32, libc::SIGINT) };
    assert!(wait_exit(&mut theirs, bound).success());
    assert_eq!(ours_says.next(bound, "distlock leading"), "lead");

    // etcdctl observes the distlock leader, and campaigns behind it.
    let mut listen = etcdctl(&["elect", "-l", &name]).stdout(Stdio::piped()).spawn().unwrap();
    let listened = Lines::of(&mut listen);
    assert!(listened.next(bound, "the observed key").starts_with(&format!("{name}/")));
    assert_eq!(listened.next(bound, "the observed value"), "ours");
    let mut theirs = etcdctl(&["elect", &name, "second"]).stdout(Stdio::piped()).spawn().unwrap();
    let theirs_says = Lines::of(&mut theirs);
    candidates(&name, 2, bound);
    assert!(theirs_says.0.recv_timeout(Duration::from_millis(300)).is_err(), "etcdctl led beside distlock");
    drop(ours.stdin.take());
    assert!(wait_exit(&mut ours, bound).success());
    assert!(theirs_says.next(bound, "etcdctl's key").starts_with(&format!("{name}/")));
    assert_eq!(theirs_says.next(bound, "etcdctl's proposal"), "second");
    assert!(listened.next(bound, "the next observed key").starts_with(&format!("{name}/")));
    assert_eq!(listened.next(bound, "the next observed value"), "second");
    for mut child in [theirs, listen] {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        wait_exit(&mut child, bound);
    }
    let none = distlock(&b, &["leader", &name]).output().unwrap();
    assert_eq!(none.status.code(), Some(1), "nothing left behind");
}

/// Waits (bounded) until `n` candidates' keys are under `name/`: the second candidate is queued
/// on the server, so a check that it does not lead means something.
fn candidates(name: &str, n: usize, bound: Duration) {
    common::eventually(bound, &format!("{n} candidates queued on {name}"), || {
        let out = etcdctl(&["get", "--prefix", "--keys-only", &format!("{name}/")]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).count() >= n
    });
}

#[test]
fn once_per_slot_under_skewed_clocks_on_etcd() {
    common::once_per_slot_under_skewed_clocks(&backend("?ttl=5s"), &unique("cli-job-"));
}

/// A marker password through a whole session on etcd set up as production is (TLS only, client
/// certificates, auth on): in no output, file or environment.
#[test]
fn secrets_stay_hidden_on_etcd() {
    let server = common::ScriptServer::start("etcd", "start-tls");
    let (password, tls) = common::password_and_tls_flags(&server);
    let url = format!("etcds://distlock:{password}@{}?ttl=5s&connect_timeout=3s", server.printed);
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    common::a_marker_password_is_never_shown(&url, &password, &tls, "secret/");
}

/// `inspect` closes its client on every path (one lock, `--all`, `--job`, and an error): the
/// session lease it granted at connect is revoked at once, not left to expire. On an etcd of
/// this test's own, so no other test's leases are counted.
#[test]
fn inspect_revokes_its_session_lease_on_every_path() {
    let server = distlock_faults::OwnServer::start("etcd.sh", "start", &[]);
    let at = server.printed.trim().to_string();
    let b = format!("etcd://{at}?ttl=60s");
    let leases = || {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={at}"))
            .args(["lease", "list"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().skip(1).map(str::to_string).collect::<Vec<_>>()
    };
    for args in [&["inspect", "x"][..], &["inspect", "--all"], &["inspect", "--job", "x"], &["inspect", "--json", "x"]]
    {
        let out = distlock(&b, args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(leases(), Vec::<String>::new(), "{args:?} left its lease");
    }
    // An error after connecting (a job name etcd cannot take) still closes.
    let out = distlock(&b, &["inspect", "--job", ""]).output().unwrap();
    assert!(!out.status.success(), "an empty job name accepted");
    assert_eq!(leases(), Vec::<String>::new(), "the failed inspect left its lease");
}

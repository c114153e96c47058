//! `distlock exec` and `inspect` on MariaDB, against the server from scripts/test.sh
//! (`DISTLOCK_TEST_MYSQL=mysql://…`).

use crate::common;

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
    let view = common::one_lock(&distlock(&b, &["inspect", "--json", &lock]).output().unwrap());
    assert!(view["entries"][0]["id"].as_str().is_some_and(|c| c.starts_with("connection ")), "{view}");
    // The sequence's last value: this token, or a later one (other locks, a new connection's raise).
    assert!(view["last_token"].as_u64() >= Some(t1), "{view}");
    drop(holder.stdin.take());
    assert!(wait_exit(&mut holder, Duration::from_secs(20)).success());
    let next = distlock(&b, &["exec", "-w", "10", &lock, "--", "sh", "-c", "echo $DISTLOCK_TOKEN"]).output().unwrap();
    assert!(next.status.success(), "{}", String::from_utf8_lossy(&next.stderr));
    let t2: u64 = String::from_utf8_lossy(&next.stdout).trim().parse().unwrap();
    assert!(t2 > t1, "tokens rise: {t1} then {t2}");
    let view = common::one_lock(&distlock(&b, &["inspect", "--json", &lock]).output().unwrap());
    assert_eq!(view["entries"].as_array().map(Vec::len), Some(0), "nothing left held: {view}");
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

/// `mariadb -e SQL` on the test server: the output (tab-separated, no headers), trimmed.
fn mariadb(sql: &str) -> String {
    let url = backend("");
    let rest = url.strip_prefix("mysql://").unwrap();
    let (user, rest) = rest.split_once('@').unwrap();
    let (hostport, db) = rest.split_once('/').unwrap();
    let (host, port) = hostport.split_once(':').unwrap();
    let (user, password) = user.split_once(':').unwrap_or((user, ""));
    let mut cmd = std::process::Command::new("mariadb");
    cmd.args(["-h", host, "-P", port, "-u", user, "-N", "-B", "-D", db.split('?').next().unwrap(), "-e", sql]);
    if !password.is_empty() {
        cmd.env("MYSQL_PWD", password);
    }
    let out = cmd.output().expect("the mariadb client runs");
    assert!(out.status.success(), "mariadb {sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `KILL` of the holder's connection while another exec waits: the server frees a `GET_LOCK` lock
/// the moment the connection ends, so the holder's command is stopped at once (it ran on for
/// 3.97 s with the default lease before: the closed connection was noticed at the next ping).
#[test]
fn a_holder_whose_connection_is_killed_stops_its_command_at_once() {
    let lock = unique("cli-kill-");
    // Connections waiting in GET_LOCK (other tests' waiters may add to them: then the check only
    // comes early, and the scenario still holds).
    let waiting = || -> u32 {
        mariadb("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'").parse().unwrap()
    };
    let before = waiting();
    common::a_holder_whose_session_the_server_ended_stops_at_once(
        &backend(""),
        &lock,
        || waiting() > before,
        || {
            let id = mariadb(&format!("SELECT IS_USED_LOCK('{lock}')"));
            mariadb(&format!("KILL {id}"));
        },
    );
}

/// The server silent (a proxy drops everything) while exec holds: exec exits 3 soon after the
/// lease deadline (it used to hang for as long as the server stayed silent).
#[test]
fn a_silent_server_ends_the_hold_promptly() {
    let url = std::env::var("DISTLOCK_TEST_MYSQL").unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, rest) = rest.split_once('@').unwrap();
    let (hostport, path) = rest.split_once('/').unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = hostport.replace("localhost", "127.0.0.1").parse().unwrap();
    let proxy = rt.block_on(distlock_faults::FaultProxy::start(upstream)).unwrap();
    let via = format!("{scheme}://{auth}@{}/{path}?lease=3s", proxy.addr());
    common::a_silent_server_ends_the_hold_promptly(&via, &unique("cli-silent-"), &proxy, Duration::from_secs(3));
    drop(proxy);
}

#[test]
fn elect_observe_and_leader_on_mariadb() {
    common::elect_observe_and_leader(&backend("?lease=5s"), &unique("cli-elect-"));
}

#[test]
fn once_per_slot_under_skewed_clocks_on_mariadb() {
    common::once_per_slot_under_skewed_clocks(&backend("?lease=5s"), &unique("cli-job-"));
}

/// A marker password through a whole session on MariaDB set up as production is (TLS required, a
/// password user): in no output, file or environment.
#[test]
fn secrets_stay_hidden_on_mariadb() {
    let server = common::ScriptServer::start("mariadb", "start-tls");
    let password = std::fs::read_to_string(server.dir.join("password")).unwrap().trim().to_string();
    let ca = server.dir.join("certs/ca.pem").display().to_string();
    let url = server.printed.replace("distlock@", &format!("distlock:{password}@"))
        + "?ssl-mode=VERIFY_IDENTITY&lease=5s&connect_timeout=3s";
    common::a_marker_password_is_never_shown(&url, &password, &["--cacert", &ca], "secret/");
}

/// Interop over TLS: Debian's `mariadb` client (`--ssl --ssl-verify-server-cert`, our CA) on a
/// TLS-only server sees the lock `distlock hold` holds, waits on it in `GET_LOCK`, and a lock it
/// holds keeps `distlock exec -w 0` out (exit 1) until its session ends.
#[test]
fn the_mariadb_client_over_tls_shares_our_locks() {
    let server = common::ScriptServer::start("mariadb", "start-tls");
    let password = std::fs::read_to_string(server.dir.join("password")).unwrap().trim().to_string();
    let ca = server.dir.join("certs/ca.pem").display().to_string();
    let url = server.printed.replace("distlock@", &format!("distlock:{password}@"))
        + "?ssl-mode=VERIFY_IDENTITY&lease=5s&connect_timeout=3s";
    let hostport = server.printed.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    let (host, port) = hostport.split_once(':').unwrap();
    let mariadb = |sql: &str| {
        let mut c = std::process::Command::new("mariadb");
        c.args(["--ssl", "--ssl-verify-server-cert", &format!("--ssl-ca={ca}"), "-h", host, "-P", port])
            .args(["-u", "distlock", "-N", "-B", "--unbuffered", "-D", "distlock", "-e", sql])
            .env("MYSQL_PWD", &password);
        c
    };
    let (gate, theirs) = (unique("tls-gate-"), unique("tls-theirs-"));
    let mut hold = distlock(&url, &["hold", "--cacert", &ca, &gate])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let held = Lines::of(&mut hold);
    assert!(held.next(Duration::from_secs(20), "DISTLOCK_KEY").starts_with("DISTLOCK_KEY="));
    let out = mariadb(&format!("SELECT IS_USED_LOCK('{gate}') IS NOT NULL; SHOW SESSION STATUS LIKE 'Ssl_cipher'"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "mariadb --ssl: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"1"), "the mariadb client does not see our lock: {text}");
    let cipher = lines.get(1).and_then(|l| l.strip_prefix("Ssl_cipher\t")).unwrap_or("");
    assert!(!cipher.is_empty(), "the mariadb client's session is not TLS: {text}");
    // The client takes `theirs`, then waits for our `gate` (bounded by GET_LOCK's 60 s).
    let mut peer = mariadb(&format!("SELECT GET_LOCK('{theirs}', 0); SELECT GET_LOCK('{gate}', 60)"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = Lines::of(&mut peer);
    assert_eq!(said.next(Duration::from_secs(20), "GET_LOCK of theirs"), "1");
    let busy = distlock(&url, &["exec", "--cacert", &ca, "-w", "0", &theirs, "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    // Our release lets the client's GET_LOCK through; its session ends, freeing both.
    drop(hold.stdin.take());
    assert_eq!(said.next(Duration::from_secs(20), "GET_LOCK of our gate"), "1");
    assert!(wait_exit(&mut peer, Duration::from_secs(20)).success());
    assert!(wait_exit(&mut hold, Duration::from_secs(20)).success());
    let ours = distlock(&url, &["exec", "--cacert", &ca, "-w", "20s", &theirs, "--", "true"]).output().unwrap();
    assert_eq!(ours.status.code(), Some(0), "{}", String::from_utf8_lossy(&ours.stderr));
}

/// `ssl-mode=PREFERRED` with a password for another machine insists on TLS; the test server has
/// none, so it is refused before the password is sent; the default, `DISABLED`, warns (see the
/// common check).
#[test]
fn a_password_for_another_machine_is_not_sent_in_plaintext_unasked() {
    common::a_password_for_another_machine_is_not_sent_in_plaintext_unasked(
        &backend(""),
        "?connect_timeout=5s&ssl-mode=PREFERRED",
        "?connect_timeout=5s",
    );
}

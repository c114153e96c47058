//! `distlock exec` on PostgreSQL, against the server from scripts/test.sh
//! (`DISTLOCK_TEST_POSTGRES=postgres://…`).

use crate::common;

use common::wait_exit;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

fn backend() -> String {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES")
        .expect("run the tests with scripts/test.sh (DISTLOCK_TEST_POSTGRES unset)");
    format!("{url}?lease=5s")
}

fn name() -> String {
    format!("distlock-cli-test:{}", uuid::Uuid::new_v4().simple())
}

fn distlock(args: &[&str]) -> Command {
    common::distlock(&backend(), args)
}

/// exec runs its command under the lock with the token in its environment; a second exec with
/// -n exits 1 while the first holds; after the holder ends, tokens have risen.
#[test]
fn exec_on_postgres_excludes_and_passes_the_token() {
    let lock = name();
    let mut holder = distlock(&["exec", &lock, "--", "sh", "-c", "echo token=$DISTLOCK_TOKEN; read _ || true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    let t1: u64 = first.trim().strip_prefix("token=").expect("the token line").parse().unwrap();
    let busy = distlock(&["exec", "-n", &lock, "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    drop(holder.stdin.take()); // the command reads EOF and ends; exec releases
    let status = wait_exit(&mut holder, Duration::from_secs(20));
    assert!(status.success(), "the holder's exec: {status:?}");
    let next = distlock(&["exec", "-w", "10", &lock, "--", "sh", "-c", "echo $DISTLOCK_TOKEN"]).output().unwrap();
    assert!(next.status.success(), "{}", String::from_utf8_lossy(&next.stderr));
    let t2: u64 = String::from_utf8_lossy(&next.stdout).trim().parse().unwrap();
    assert!(t2 > t1, "tokens rise: {t1} then {t2}");
    // Readers share; writers wait for them.
    let mut reader = distlock(&["exec", "-s", &lock, "--", "sh", "-c", "echo $DISTLOCK_TOKEN; read _ || true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(reader.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let second = distlock(&["exec", "-s", "-n", &lock, "--", "true"]).output().unwrap();
    assert!(second.status.success(), "readers share: {}", String::from_utf8_lossy(&second.stderr));
    let writer = distlock(&["exec", "-x", "-n", &lock, "--", "true"]).output().unwrap();
    assert_eq!(writer.status.code(), Some(1), "a writer waits for the reader");
    // inspect shows the reader holding, by the session the server knows.
    let view = common::one_lock(&distlock(&["inspect", "--json", &lock]).output().unwrap());
    let sessions = view["entries"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{view}");
    assert_eq!((sessions[0]["mode"].as_str(), sessions[0]["holds"].as_bool()), (Some("read"), Some(true)));
    assert!(view["last_token"].as_u64().unwrap() > t2, "the readers took larger tokens: {view}");
    drop(reader.stdin.take());
    assert!(wait_exit(&mut reader, Duration::from_secs(20)).success());
    let free = distlock(&["inspect", &lock]).output().unwrap();
    assert!(String::from_utf8_lossy(&free.stdout).contains("free"), "{}", String::from_utf8_lossy(&free.stdout));
    // A semaphore's permits (slots of their own, not the mutex's key).
    let permits = distlock(&["exec", "--permits", "2", &lock, "--", "true"]).output().unwrap();
    assert!(permits.status.success(), "{}", String::from_utf8_lossy(&permits.stderr));
}

/// A killed holder (SIGKILL of exec and its command): its connection closes with the process, and
/// the server ends the session, freeing the lock (at once here; within the lease at worst).
#[test]
fn a_killed_holder_frees_the_lock() {
    common::a_killed_holder_frees_the_lock(&backend(), &name(), Duration::from_secs(5), false);
}

/// `psql URL -Atc SQL`: the output, trimmed.
fn psql(sql: &str) -> String {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES").unwrap();
    let out = Command::new("psql").args([url.as_str(), "-Atc", sql]).output().expect("psql runs");
    assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The sessions of lock `lock` as `inspect --json` shows them: (pid, granted).
fn sessions(lock: &str) -> Vec<(i64, bool)> {
    let view = common::one_lock(&distlock(&["inspect", "--json", lock]).output().unwrap());
    view["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let id = s["id"].as_str().and_then(|id| id.strip_prefix("backend pid ")).expect("a session's pid");
            (id.split(' ').next().unwrap().parse().unwrap(), s["holds"].as_bool().unwrap())
        })
        .collect()
}

/// `pg_terminate_backend` of the holder while another exec waits: the server frees the lock at
/// once, and so the holder's command is stopped at once (it ran on for the whole --grace before).
#[test]
fn a_holder_whose_backend_is_terminated_stops_its_command_at_once() {
    let lock = name();
    common::a_holder_whose_session_the_server_ended_stops_at_once(
        &backend(),
        &lock,
        || sessions(&lock).iter().any(|(_, granted)| !granted),
        || {
            let (pid, _) = *sessions(&lock).iter().find(|(_, granted)| *granted).expect("a holder");
            assert_eq!(psql(&format!("SELECT pg_terminate_backend({pid})")), "t");
        },
    );
}

/// The server silent (a proxy drops everything) while exec holds: exec exits 3 soon after the
/// lease deadline (it used to hang for as long as the server stayed silent).
#[test]
fn a_silent_server_ends_the_hold_promptly() {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES").unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, rest) = rest.split_once('@').unwrap();
    let (hostport, path) = rest.split_once('/').unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = hostport.replace("localhost", "127.0.0.1").parse().unwrap();
    let proxy = rt.block_on(distlock_faults::FaultProxy::start(upstream)).unwrap();
    let via = format!("{scheme}://{auth}@{}/{path}?lease=3s", proxy.addr());
    common::a_silent_server_ends_the_hold_promptly(&via, &name(), &proxy, Duration::from_secs(3));
    drop(proxy);
}

/// Connection errors name their cause (they said only "db error" or "error connecting to
/// server"), and a bad URL duration names its key.
#[test]
fn connection_errors_name_their_cause() {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES").unwrap();
    let hostport = url.split('@').nth(1).unwrap().split('/').next().unwrap().to_string();
    for (backend, says) in [
        (format!("postgres://no_such_role@{hostport}/postgres"), "no_such_role"),
        (format!("postgres://postgres@{hostport}/no_such_db"), "no_such_db"),
        ("postgres://postgres@127.0.0.1:1/db".to_string(), "refused"),
        (format!("{url}?lease=abc"), "lease=abc"),
    ] {
        let out = common::distlock(&backend, &["exec", "-n", "x", "--", "true"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{backend}: {stderr}");
        assert!(stderr.contains(says), "{backend}: {stderr}");
    }
}

#[test]
fn elect_observe_and_leader_on_postgres() {
    common::elect_observe_and_leader(&backend(), &name());
}

#[test]
fn once_per_slot_under_skewed_clocks_on_postgres() {
    common::once_per_slot_under_skewed_clocks(&backend(), &format!("cli-job-{}", uuid::Uuid::new_v4().simple()));
}

/// A marker password through a whole session on PostgreSQL set up as production is (hostssl and
/// SCRAM only): in no output, file or environment; and the password from `$PGPASSWORD` or a
/// password file instead of the URL, as libpq reads them (a file others may read is ignored, with
/// a warning).
#[test]
fn secrets_stay_hidden_on_postgres() {
    use std::os::unix::fs::PermissionsExt;
    let server = common::ScriptServer::start("postgres", "start-tls");
    let password = std::fs::read_to_string(server.dir.join("password")).unwrap().trim().to_string();
    let ca = server.dir.join("certs/ca.pem").display().to_string();
    let bare = server.printed.clone() + "?sslmode=verify-full&lease=5s&connect_timeout=3s";
    let url = bare.replace("distlock@", &format!("distlock:{password}@"));
    common::a_marker_password_is_never_shown(&url, &password, &["--cacert", &ca], "secret/");
    // No password in the URL: libpq's sources.
    let addr = bare.split('@').nth(1).unwrap().split('/').next().unwrap();
    let (host, port) = addr.split_once(':').unwrap();
    let pgpass = server.dir.join("pgpass");
    std::fs::write(&pgpass, format!("# for the test\n{host}:{port}:locks:distlock:{password}\n")).unwrap();
    let run = |env: &[(&str, &str)]| {
        let mut c = Command::new(BIN_PATH);
        c.env("DISTLOCK_BACKEND", &bare).env_remove("PGPASSWORD").env_remove("PGPASSFILE");
        c.envs(env.iter().copied()).args(["exec", "--cacert", &ca, "secret-pgpass", "--", "echo", "ran"]);
        let out = c.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains(&password), "{text}");
        (out.status.code(), text)
    };
    let (code, text) = run(&[("PGPASSWORD", &password)]);
    assert_eq!((code, text.contains("ran")), (Some(0), true), "PGPASSWORD: {text}");
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, text) = run(&[("PGPASSFILE", pgpass.to_str().unwrap())]);
    assert_eq!((code, text.contains("ran")), (Some(0), true), "PGPASSFILE: {text}");
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, text) = run(&[("PGPASSFILE", pgpass.to_str().unwrap())]);
    assert_eq!(code, Some(2), "a password file others may read was used: {text}");
    assert!(text.contains("chmod 600"), "{text}");
}

const BIN_PATH: &str = env!("CARGO_BIN_EXE_distlock");

/// Looking at a database no distlock client has used yet: `leader` says nobody leads and
/// `inspect --all` lists nothing (exit 0), as on any database; a database that does not exist is
/// an error naming it.
#[test]
fn looking_at_a_database_nobody_used_yet_finds_nothing() {
    let db = format!("distlock_look_{}", uuid::Uuid::new_v4().simple());
    psql(&format!("CREATE DATABASE {db}"));
    let url = std::env::var("DISTLOCK_TEST_POSTGRES").unwrap();
    let fresh = format!("{}/{db}?lease=5s", url.rsplit_once('/').unwrap().0);
    let out = common::distlock(&fresh, &["leader", "nobody"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let out = common::distlock(&fresh, &["inspect", "--all", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["locks"].as_array().map(Vec::len), Some(0), "{listing}");
    let missing = format!("{}/no_such_db_{}?lease=5s", url.rsplit_once('/').unwrap().0, &db[14..]);
    let out = common::distlock(&missing, &["inspect", "--all"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no_such_db_"), "{stderr}");
}

/// `sslmode=prefer` (the default) with a password for another machine insists on TLS; the test
/// server has none, so it is refused without the password sent; `sslmode=disable` connects and
/// warns (see the common check).
#[test]
fn a_password_for_another_machine_is_not_sent_in_plaintext_unasked() {
    let url = std::env::var("DISTLOCK_TEST_POSTGRES").unwrap();
    common::a_password_for_another_machine_is_not_sent_in_plaintext_unasked(
        &url,
        "?connect_timeout=5s",
        "?connect_timeout=5s&sslmode=disable",
    );
    // On this machine, prefer still falls back to plaintext, without a warning.
    let here = url.replacen("@127.0.0.1:", ":marker-pw-4b1d@127.0.0.1:", 1);
    let out =
        common::distlock(&here, &["exec", "-n", &name(), "--", "true"]).env("DISTLOCK_LOG", "warn").output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

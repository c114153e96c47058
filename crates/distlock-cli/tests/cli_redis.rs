//! `distlock exec`, `hold` and `inspect` on Redis, against the redis-server from scripts/test.sh
//! (`DISTLOCK_TEST_REDIS=host:port`).

use crate::common;

use common::{distlock, wait_exit, Lines};
use std::process::{Command, Stdio};
use std::time::Duration;

fn addr() -> String {
    std::env::var("DISTLOCK_TEST_REDIS").expect("run the tests with scripts/test.sh (DISTLOCK_TEST_REDIS unset)")
}

fn backend(query: &str) -> String {
    format!("redis://{}{query}", addr())
}

fn key() -> String {
    format!("distlock-cli-test:{}", uuid::Uuid::new_v4().simple())
}

fn redis_cli(args: &[&str]) -> String {
    let (host, port) = addr().rsplit_once(':').map(|(h, p)| (h.to_string(), p.to_string())).unwrap();
    let out = Command::new("redis-cli").args(["-h", &host, "-p", &port]).args(args).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn exec_on_redis_passes_env_excludes_and_leaves_nothing() {
    let k = key();
    let b = backend("");
    let out = distlock(&b, &["exec", &k, "--", "sh", "-c", "echo $DISTLOCK_KEY $DISTLOCK_TOKEN $DISTLOCK_NODE"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[0], k, "the key is the name as given");
    let token: u64 = fields[1].parse().unwrap();
    assert!(fields[2].contains(':'), "Redisson field <uuid>:<id>: {}", fields[2]);
    assert_eq!(redis_cli(&["EXISTS", &k]), "0", "released");
    assert_eq!(redis_cli(&["GET", &format!("redisson_lock_token:{{{k}}}")]), token.to_string());

    // A holder; -n gives up with 1, -E changes it; the simple layout is another key type.
    let mut holder =
        distlock(&b, &["exec", &k, "--", "sh", "-c", "echo held; sleep 30"]).stdout(Stdio::piped()).spawn().unwrap();
    let lines = Lines::of(&mut holder);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    assert_eq!(distlock(&b, &["exec", "-n", &k, "--", "true"]).status().unwrap().code(), Some(1));
    assert_eq!(distlock(&b, &["exec", "-n", "-E", "9", &k, "--", "true"]).status().unwrap().code(), Some(9));
    let view = common::one_lock(&distlock(&b, &["inspect", "--json", &k]).output().unwrap());
    assert_eq!(view["recipe"], "mutex", "{view}");
    assert_eq!(view["entries"].as_array().unwrap().len(), 1, "{view}");
    unsafe {
        libc::kill(holder.id() as i32, libc::SIGTERM);
    }
    wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(redis_cli(&["EXISTS", &k]), "0", "released on TERM");

    // --simple: redis-py's layout, a string with a random value.
    let out = distlock(&b, &["exec", "--simple", &k, "--", "sh", "-c", "echo $DISTLOCK_NODE"]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim().len(), 32);
    // Recipes Redis does not have yet are named, before anything is taken.
    let out = distlock(&b, &["exec", "--permits", "3", &format!("{k}:pool"), "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Read/write: Redisson's layout.
    let out = distlock(&b, &["exec", "-s", &k, "--", "sh", "-c", "echo $DISTLOCK_NODE"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The lease flag is the same on every backend (--session-timeout is its alias).
    let out = distlock(&b, &["exec", "--session-timeout", "3s", &k, "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = distlock(&backend("?lease=1h&bogus=1"), &["exec", &k, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}

#[test]
fn partitioned_exec_stops_its_command_before_the_next_holder_starts() {
    let k = key();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt.block_on(distlock_faults::FaultProxy::start(addr().parse().unwrap())).unwrap();
    let holder_backend = format!("redis://{}?lease=3s", proxy.addr());
    let script = "trap '' TERM; echo held; while :; do date +%s%N; sleep 0.02; done";
    let mut holder = distlock(&holder_backend, &["exec", "--grace", "10s", &k, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    let waiter = distlock(&backend("?lease=3s"), &["exec", "-w", "60s", &k, "--", "sh", "-c", "date +%s%N"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    proxy.set(distlock_faults::Fault::Blackhole);
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    assert_eq!(status.code(), Some(3), "exec reports the lock lost");
    let mut last = 0u128;
    while let Ok(line) = lines.0.recv_timeout(Duration::from_secs(5)) {
        if let Ok(t) = line.parse() {
            last = t;
        }
    }
    assert!(last > 0, "the command ran");
    let waited = waiter.wait_with_output().unwrap();
    assert!(waited.status.success());
    let waiter_started: u128 = String::from_utf8(waited.stdout).unwrap().trim().parse().unwrap();
    assert!(
        last < waiter_started,
        "the command still ran {} ms after the next holder started",
        (last - waiter_started) / 1_000_000
    );
    println!(
        "the command's last sign of life was {} ms before the next holder started",
        (waiter_started - last) / 1_000_000
    );
    drop(proxy);
}

/// A paused holder (SIGSTOP past its lease) is kept out of the resource by its fencing token.
#[test]
fn a_paused_holder_is_kept_out_by_its_fencing_token() {
    common::a_paused_holder_is_kept_out_by_its_fencing_token(&backend("?lease=1s"), &key());
}

#[test]
fn elect_observe_and_leader_on_redis() {
    let name = key();
    common::elect_observe_and_leader(&backend("?lease=5s"), &name);
    assert_eq!(redis_cli(&["EXISTS", &name]), "0", "the hash went with the last leader");
}

#[test]
fn once_per_slot_under_skewed_clocks_on_redis() {
    common::once_per_slot_under_skewed_clocks(&backend("?lease=5s"), &key());
}

/// `exec`, `elect` and a scheduled job against a Redis set up as production is (TLS only, client
/// certificates required, an ACL user), the CA and client certificate given by `--cacert --cert
/// --key`; without the CA flag (system roots) the server is refused as untrusted, exit 2; the
/// password is in no output.
#[test]
fn exec_elect_and_a_job_over_tls_with_the_certificate_flags() {
    let server = common::ScriptServer::start("redis", "start-tls");
    let (dir, addr) = (&server.dir, &server.printed);
    let password = std::fs::read_to_string(dir.join("password")).unwrap().trim().to_string();
    let certs = dir.join("certs");
    let file = |name: &str| certs.join(name).display().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let b = format!("rediss://distlock:{password}@{addr}?connect_timeout=3s");
    let tls = ["--cacert", ca.as_str(), "--cert", cert.as_str(), "--key", key.as_str()];
    let run = |args: &[&str]| {
        let out = distlock(&b, &[&args[..1], &tls[..], &args[1..]].concat()).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains(&password), "the password shown: {text}");
        (out.status.code(), text)
    };
    let (code, text) = run(&["exec", "tls-cli", "--", "sh", "-c", "echo token=$DISTLOCK_TOKEN"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("token="), "{text}");
    let (code, text) = run(&["elect", "tls-cli-election", "--", "echo", "leading"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("leading"), "{text}");
    let (code, text) = run(&["exec", "--once-per", "1h", "tls-cli-job", "--", "echo", "ran"]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = run(&["exec", "--once-per", "1h", "tls-cli-job", "--", "echo", "ran"]);
    assert_eq!(code, Some(1), "the slot had its run: {text}");
    // The system's roots do not know the test CA: refused, naming the cause.
    let out = distlock(&b, &["exec", "--cert", &cert, "--key", &key, "tls-cli", "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not signed by a CA trusted here"), "{err}");
    assert!(!err.contains(&password), "{err}");
    // A key without its certificate is refused before anything is contacted.
    let out = distlock(&b, &["exec", "--key", &key, "tls-cli", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A marker password through a whole session on Redis set up as production is (TLS only, client
/// certificates, an ACL user): in no output, file or environment.
#[test]
fn secrets_stay_hidden_on_redis() {
    let server = common::ScriptServer::start("redis", "start-tls");
    let (password, tls) = common::password_and_tls_flags(&server);
    let url = format!("rediss://distlock:{password}@{}?lease=5s&connect_timeout=3s", server.printed);
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    common::a_marker_password_is_never_shown(&url, &password, &tls, "secret/");
}

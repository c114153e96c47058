//! What a hostile neighbour can put in front of a reader (issue 50, items 7, 8 and 10): owner
//! data, names and values read from a server, printed by `inspect`, `top -b`, `leader` and the
//! errors, must reach the terminal escaped; no password of a malformed URL is printed; the web
//! and metrics endpoints answer only loopback `Host` names and only GET.

use crate::common;

use common::{distlock, unique, Lines};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Everything a terminal would act on, planted below.
const HOSTILE: &str = "\x1b]2;pwned\x07\x1b[2J\nFAKE holder row\u{202e}";

/// A fresh SQLite database (its tables made) and its URL.
fn database() -> (String, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(unique("distlock-cli-hostile-"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}/locks.db?lease=30s", dir.display());
    let made = distlock(&url, &["exec", "made", "--", "true"]).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    (url, dir)
}

/// A SQL text literal of `text` built with `char()`, so that any byte can be planted.
fn sql_text(text: &str) -> String {
    text.chars().map(|c| format!("char({})", c as u32)).collect::<Vec<_>>().join("||")
}

/// Holds `base`, then copies its live row under a hostile name with hostile owner data (as a
/// client other than distlock could write it), and lets `base` go.
fn plant_hostile_row(url: &str, dir: &std::path::Path) {
    let (mut holder, _lines) = common::holding(url, &["hold", "base"]);
    let sql = format!(
        "INSERT INTO distlock_leases SELECT {}, lock_until, locked_at, {}, fencing_token + 1000 \
         FROM distlock_leases WHERE name = 'base'",
        sql_text(&format!("evil{HOSTILE}")),
        sql_text(&format!("{HOSTILE} pid 1"))
    );
    let out = Command::new("sqlite3").arg(dir.join("locks.db")).arg(&sql).output().unwrap();
    assert!(out.status.success(), "sqlite3: {}", String::from_utf8_lossy(&out.stderr));
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
}

/// No raw ESC, BEL, bidi override or carriage return anywhere, and no line that starts with the
/// planted fake row (a raw newline inside a field would start one).
fn assert_inert(what: &str, text: &str) {
    let raw = text.chars().find(|c| matches!(c, '\x1b' | '\x07' | '\r' | '\u{202e}'));
    assert!(raw.is_none(), "{what}: a raw {raw:?} reached the output:\n{text:?}");
    assert!(!text.lines().any(|l| l.starts_with("FAKE")), "{what}: a newline inside a field made a row:\n{text}");
}

#[test]
fn hostile_names_and_owner_data_are_escaped_in_inspect_and_top_batch() {
    let (url, dir) = database();
    plant_hostile_row(&url, &dir);
    let table = distlock(&url, &["inspect", "--all"]).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.status.success(), "{}", String::from_utf8_lossy(&table.stderr));
    assert_inert("inspect --all", &text);
    assert!(text.contains("evil\\x1b]2;pwned\\x07\\x1b[2J\\nFAKE holder row\\u{202e}"), "escaped name:\n{text}");
    assert!(text.contains("\\x1b]2;pwned"), "escaped owner:\n{text}");
    let json = distlock(&url, &["inspect", "--all", "--json"]).output().unwrap();
    let json_text = String::from_utf8_lossy(&json.stdout).to_string();
    assert_inert("inspect --all --json", &json_text);
    let parsed: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    let names: Vec<&str> = parsed["locks"].as_array().unwrap().iter().filter_map(|l| l["name"].as_str()).collect();
    assert!(names.contains(&format!("evil{HOSTILE}").as_str()), "JSON keeps the value: {names:?}");
    let top = distlock(&url, &["top", "-b", "-n", "1"]).stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&top.stdout).to_string();
    assert!(top.status.success(), "{}", String::from_utf8_lossy(&top.stderr));
    assert_inert("top -b", &text);
    assert!(text.contains("evil\\x1b]2;pwned"), "{text}");
    let one = distlock(&url, &["inspect", &format!("evil{HOSTILE}")]).output().unwrap();
    assert_inert("inspect NAME", &String::from_utf8_lossy(&one.stdout));
    assert_inert("inspect NAME (stderr)", &String::from_utf8_lossy(&one.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_hostile_leader_value_and_hostile_errors_are_escaped() {
    let (url, dir) = database();
    let script = "echo leading; read _ || true";
    let mut leader = distlock(&url, &["elect", "--value", HOSTILE, "hostile-election", "--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut leader);
    assert_eq!(lines.next(Duration::from_secs(20), "the leader's command"), "leading");
    let out = distlock(&url, &["leader", "hostile-election"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
    assert_inert("leader", &text);
    assert!(text.starts_with("\\x1b]2;pwned\\x07\\x1b[2J\\nFAKE"), "{text:?}");
    let json = distlock(&url, &["leader", "--json", "hostile-election"]).output().unwrap();
    assert_inert("leader --json", &String::from_utf8_lossy(&json.stdout));
    drop(leader.stdin.take());
    assert!(common::wait_exit(&mut leader, Duration::from_secs(20)).success());
    // An error printed by main quotes what it was given, raw: a path, a URL.
    let missing = format!("sqlite://{}/none{HOSTILE}.db", dir.display());
    let file = dir.join(format!("backend{HOSTILE}"));
    let given: [&[&str]; 2] = [&["inspect", "x"], &["inspect", "--backend-file", file.to_str().unwrap(), "x"]];
    for (backend, args) in [(missing.as_str(), given[0]), ("", given[1])] {
        let err = distlock(backend, args).output().unwrap();
        let said = String::from_utf8_lossy(&err.stderr).to_string();
        assert_eq!(err.status.code(), Some(2), "{said}");
        assert_inert("an error", &said);
        assert!(said.contains("\\x1b]2;pwned"), "{said}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn lock_names_with_commas_stay_apart_in_distlock_key() {
    let (url, dir) = database();
    let out =
        distlock(&url, &["exec", "a,b", "c\\d", "--", "sh", "-c", "printf %s \"$DISTLOCK_KEY\""]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let key = String::from_utf8_lossy(&out.stdout).to_string();
    // In lock order (by name): `\` and `,` are escaped in each name, `,` alone separates.
    assert!(key == "a\\,b,c\\\\d" || key == "c\\\\d,a\\,b", "{key}");
    let _ = std::fs::remove_dir_all(dir);
}

const MARK: &str = "S3cr3tMarker";

#[test]
fn no_malformed_url_shows_its_password_on_the_command_line() {
    let shapes = [
        format!("postgres//app:{MARK}@127.0.0.1:1/db"),
        format!("host=127.0.0.1 port=1 user=app password={MARK} dbname=x"),
        format!("redis://user%3a{MARK}@127.0.0.1:1"),
        format!("redis://user:{MARK}?x@127.0.0.1:1"),
        format!("zk://user:{MARK}@127.0.0.1:notaport"),
        format!("etcd://127.0.0.1:1?PASSWORD={MARK}"),
        format!("mysql:app:{MARK}@127.0.0.1:1/db"),
    ];
    for url in shapes {
        let out = Command::new(common::BIN)
            .args(["inspect", "--connect-timeout", "500ms", "--backend", &url, "x"])
            .output()
            .unwrap();
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(2), "{all}");
        assert!(!all.contains(MARK), "the password is shown:\n{all}");
    }
}

/// A raw HTTP/1.1 request to `addr`: the whole answer.
fn request(addr: &str, method: &str, path: &str, host: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// What every endpoint must do: loopback names (with and without a port) served; another name
/// refused; only GET (and HEAD); nosniff on every answer.
fn check_endpoint(addr: &str, path: &str) {
    let port = addr.rsplit_once(':').unwrap().1;
    for host in ["localhost".to_string(), format!("127.0.0.1:{port}"), format!("LocalHost:{port}"), "[::1]".into()] {
        let ok = request(addr, "GET", path, &host);
        assert!(ok.starts_with("HTTP/1.1 200"), "Host {host}: {ok}");
        assert!(ok.to_ascii_lowercase().contains("x-content-type-options: nosniff"), "{ok}");
    }
    for host in ["evil.example", "evil.example:80", "127.0.0.1.evil.example"] {
        let refused = request(addr, "GET", path, host);
        assert!(refused.starts_with("HTTP/1.1 403"), "Host {host}: {refused}");
        assert!(refused.to_ascii_lowercase().contains("x-content-type-options: nosniff"), "{refused}");
    }
    let post = request(addr, "POST", path, "localhost");
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
    assert!(post.to_ascii_lowercase().contains("x-content-type-options: nosniff"), "{post}");
}

/// Waits (bounded) for `file` to hold an address, the child still running.
fn address_in(file: &std::path::Path, child: &mut std::process::Child) -> String {
    common::eventually_some(Duration::from_secs(30), &format!("an address in {}", file.display()), || {
        if let Some(a) = std::fs::read_to_string(file).ok().filter(|a| a.ends_with('\n')) {
            return Some(a.trim().to_string());
        }
        assert!(child.try_wait().unwrap().is_none(), "exited before writing {}", file.display());
        None
    })
}

/// A child killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn top_http_answers_only_loopback_names_and_only_get() {
    let (url, dir) = database();
    let file = dir.join("addr");
    let mut top = distlock(&url, &["top", "--http", "0", "--http-addr-file", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = address_in(&file, &mut top);
    let _top = Killed(top);
    assert!(addr.starts_with("127.0.0.1:"), "a bare port is loopback: {addr}");
    check_endpoint(&addr, "/view");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn serve_metrics_answers_only_loopback_names_and_only_get() {
    let dir = std::env::temp_dir().join(unique("distlock-cli-metrics-"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("addr");
    let args = ["serve", "--listen", "127.0.0.1:0", "--metrics", "localhost:0", "--metrics-addr-file"];
    let mut serve =
        Command::new(common::BIN).args(args).arg(&file).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let addr = address_in(&file, &mut serve);
    let _serve = Killed(serve);
    check_endpoint(&addr, "/metrics");
    let _ = std::fs::remove_dir_all(dir);
}

/// On ZooKeeper a listing without a prefix is of `/distlock/` (bare names' home): it says so,
/// and `/` lists every path (a lock held outside `/distlock` is then seen).
#[test]
fn a_zookeeper_listing_says_the_path_it_listed() {
    let server = common::ScriptServer::start("embedded", "start");
    let url = format!("zk://{}", server.printed);
    let (mut holder, _lines) = common::holding(&url, &["hold", "/elsewhere/job"]);
    let out = distlock(&url, &["inspect", "--all"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("0 locks in use on zookeeper under \"/distlock/\""), "{text}");
    let top = distlock(&url, &["top", "-b", "-n", "1"]).stdin(Stdio::null()).output().unwrap();
    assert!(String::from_utf8_lossy(&top.stdout).contains("under \"/distlock/\""), "{top:?}");
    let every = distlock(&url, &["inspect", "--all", "/"]).output().unwrap();
    let text = String::from_utf8_lossy(&every.stdout).to_string();
    assert!(text.contains("/elsewhere/job") && text.contains("1 lock in use on zookeeper under \"/\""), "{text}");
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
}

//! `distlock top` driven as a person would: in tmux (`send-keys`, `capture-pane`) with a holder
//! and a waiter, on ZooKeeper (`DISTLOCK_TEST_ZK`) and etcd (`DISTLOCK_TEST_ETCD`); and
//! `top --http` read by headless Chromium, which must render the same two rows.

use crate::common;

use common::{holding, unique, wait_exit, BIN};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The backends whose servers record waiters. A server missing from the environment fails the
/// test, naming its variable, unless `DISTLOCK_TEST_SKIP_MISSING=1` asks to run on those there are.
fn backends() -> Vec<String> {
    let skip = std::env::var("DISTLOCK_TEST_SKIP_MISSING").as_deref() == Ok("1");
    let mut urls = Vec::new();
    for (var, scheme) in [("DISTLOCK_TEST_ZK", "zk"), ("DISTLOCK_TEST_ETCD", "etcd")] {
        match std::env::var(var) {
            Ok(addr) => urls.push(format!("{scheme}://{addr}")),
            Err(_) if skip => eprintln!("top: {var} unset: skipped (DISTLOCK_TEST_SKIP_MISSING=1)"),
            Err(_) => panic!("{var} unset: run the tests with scripts/test.sh, or set DISTLOCK_TEST_SKIP_MISSING=1"),
        }
    }
    urls
}

/// A holder of `name` and a waiter queued behind it (seen by `inspect --all`), with the pid of each.
struct Queue {
    holder: std::process::Child,
    _out: common::Lines,
    waiter: std::process::Child,
}

impl Queue {
    fn start(url: &str, name: &str) -> Queue {
        let (holder, _out) = holding(url, &["hold", name]);
        let waiter =
            common::distlock(url, &["exec", "-w", "60s", name, "--", "true"]).stdout(Stdio::null()).spawn().unwrap();
        common::eventually(Duration::from_secs(20), &format!("{url}: the waiter to queue"), || {
            let out = common::distlock(url, &["inspect", "--all", "--json", name]).output().unwrap();
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            json["locks"][0]["entries"].as_array().is_some_and(|e| e.len() == 2)
        });
        Queue { holder, _out, waiter }
    }

    fn end(mut self) {
        drop(self.holder.stdin.take());
        assert!(wait_exit(&mut self.holder, Duration::from_secs(20)).success());
        assert!(wait_exit(&mut self.waiter, Duration::from_secs(20)).success(), "the waiter got the lock next");
    }
}

/// The address `top --http` wrote to `addr_file` once listening (bounded wait).
fn served_at(addr_file: &std::path::Path) -> String {
    common::eventually_some(Duration::from_secs(20), "top --http to write its address", || {
        std::fs::read_to_string(addr_file).ok().filter(|a| a.ends_with('\n')).map(|a| a.trim().to_string())
    })
}

/// A child killed when dropped (a failed assertion must not leave `top --http` running).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A tmux server of this test's own (its own socket), stopped when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").args(["-L", &self.socket, "-f", "/dev/null"]).args(args).output().unwrap()
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// The screen once `done` holds for it (bounded).
    fn wait(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        common::eventually_some(Duration::from_secs(20), &format!("{what} on the screen"), || {
            Some(self.screen()).filter(|screen| done(screen))
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The index of the first line of `screen` containing all of `parts`.
fn line_with(screen: &str, parts: &[&str]) -> Option<usize> {
    screen.lines().position(|l| parts.iter().all(|p| l.contains(p)))
}

#[test]
fn top_in_tmux_shows_the_holder_then_the_waiter_and_answers_keys() {
    for url in backends() {
        let name = unique("top");
        let queue = Queue::start(&url, &name);
        let tmux = Tmux { socket: unique("distlock-top-") };
        let command = format!("{BIN} top --backend '{url}' --interval 200ms {name}");
        let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "230", "-y", "30", &command]);
        assert!(started.status.success(), "tmux: {}", String::from_utf8_lossy(&started.stderr));
        let screen = tmux.wait("a holder and a waiter", |s| {
            line_with(s, &["holder", "0 exclusive"]).is_some() && line_with(s, &["waiter", "1 exclusive"]).is_some()
        });
        let (h, w) = (line_with(&screen, &["holder"]).unwrap(), line_with(&screen, &["waiter"]).unwrap());
        assert!(h < w, "{url}: holder first:\n{screen}");
        assert!(screen.lines().nth(h).unwrap().contains(&name), "{url}: the lock's name on its first row:\n{screen}");
        if url.starts_with("zk://") {
            let pids = (queue.holder.id(), queue.waiter.id());
            assert!(screen.lines().nth(h).unwrap().contains(&format!("pid {}", pids.0)), "{url}:\n{screen}");
            assert!(screen.lines().nth(w).unwrap().contains(&format!("pid {}", pids.1)), "{url}:\n{screen}");
        }
        assert!(screen.contains("1 lock in use") && screen.contains("1 holder, 1 waiter"), "{url}:\n{screen}");
        assert!(screen.contains("ACQUIRED"), "{url}: the sparkline column:\n{screen}");
        // Keys: s moves to the next sort key, q quits.
        assert!(screen.contains("sort name"), "{url}:\n{screen}");
        tmux.run(&["send-keys", "-t", "top", "s"]);
        tmux.wait("sort waiters", |s| s.contains("sort waiters"));
        tmux.run(&["send-keys", "-t", "top", "q"]);
        common::eventually(Duration::from_secs(10), &format!("{url}: q to end top"), || {
            !tmux.run(&["has-session", "-t", "top"]).status.success()
        });
        queue.end();
    }
}

#[test]
fn top_without_a_terminal_or_with_a_bad_interval_says_why() {
    let url = &backends()[0];
    let out = common::distlock(url, &["top"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs a terminal"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = common::distlock(url, &["top", "--interval", "5s"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("from 100ms to 1s"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Headless Chromium (Debian's `chromium`) loads the page of `top --http`, runs its script, and
/// the DOM it dumps shows the holder and the waiter in order.
#[test]
fn top_http_renders_the_holder_and_the_waiter_in_headless_chromium() {
    let url = &backends()[0];
    let name = unique("tophttp");
    let queue = Queue::start(url, &name);
    let dir = std::env::temp_dir().join(unique("distlock-top-http-"));
    std::fs::create_dir_all(&dir).unwrap();
    let addr_file = dir.join("addr");
    let top = common::distlock(
        url,
        &[
            "top",
            "--interval",
            "200ms",
            "--http",
            "127.0.0.1:0",
            "--http-addr-file",
            addr_file.to_str().unwrap(),
            &name,
        ],
    )
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut top = KillOnDrop(top);
    let addr = served_at(&addr_file);
    let chromium = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--no-first-run",
            &format!("--user-data-dir={}", dir.join("profile").display()),
            "--virtual-time-budget=5000",
            "--dump-dom",
            &format!("http://{addr}/"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read its output on a thread, so a full pipe cannot stall it; give it a bound.
    let pid = chromium.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(chromium.wait_with_output()));
    let out = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        panic!("chromium did not finish within 60 s")
    });
    let out = out.unwrap();
    let status = out.status;
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(status.success(), "chromium: {}\n{dom}", String::from_utf8_lossy(&out.stderr));
    let h = line_with(&dom, &["holder", &name]).unwrap_or_else(|| panic!("no holder row in the DOM:\n{dom}"));
    let w = line_with(&dom, &["waiter"]).unwrap_or_else(|| panic!("no waiter row in the DOM:\n{dom}"));
    assert!(h < w, "holder first:\n{dom}");
    // INT ends top --http like a person's Ctrl-C, with status 0.
    assert!(Command::new("kill").args(["-INT", &top.0.id().to_string()]).status().unwrap().success());
    assert!(wait_exit(&mut top.0, Duration::from_secs(10)).success());
    queue.end();
    let _ = std::fs::remove_dir_all(dir);
}

/// `top --job NAME` shows each job's state and last run under the locks, refreshed: one that
/// ran in this slot, one running now (its pid named), on the text `top --http` serves at `/view`.
#[test]
fn top_shows_scheduled_jobs_state_and_last_run() {
    let url = &backends()[0];
    let (done, running) = (unique("topjob-done-"), unique("topjob-running-"));
    let ran = common::distlock(url, &["exec", "--once-per", "1h", &done, "--", "true"]).output().unwrap();
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let dir = std::env::temp_dir().join(unique("distlock-top-jobs-"));
    std::fs::create_dir_all(&dir).unwrap();
    let started = dir.join("started");
    let runner = common::distlock(
        url,
        &["exec", "--once-per", "1h", &running, "-c", &format!("touch {}; sleep 30", started.display())],
    )
    .spawn()
    .unwrap();
    let mut runner = KillOnDrop(runner);
    common::eventually(Duration::from_secs(20), "the running job to start", || started.exists());
    let addr_file = dir.join("addr");
    let top = common::distlock(
        url,
        &[
            "top",
            "--interval",
            "200ms",
            "--http",
            "127.0.0.1:0",
            "--http-addr-file",
            addr_file.to_str().unwrap(),
            "--job",
            &done,
            "--job",
            &running,
            "topjob-",
        ],
    )
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut top = KillOnDrop(top);
    let addr = served_at(&addr_file);
    let view = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /view HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    };
    let jobs = &view[view.find("JOBS").unwrap_or_else(|| panic!("no JOBS section:\n{view}"))..];
    let line = |name: &str| jobs.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}:\n{view}"));
    assert!(line(&done).contains("already run in this slot") && line(&done).contains("with status 0"), "{view}");
    let pid = runner.0.id().to_string();
    assert!(line(&running).contains("running, started by") && line(&running).contains(&pid), "{view}");
    assert!(Command::new("kill").args(["-INT", &top.0.id().to_string()]).status().unwrap().success());
    assert!(wait_exit(&mut top.0, Duration::from_secs(10)).success());
    assert!(Command::new("kill").args(["-TERM", &runner.0.id().to_string()]).status().unwrap().success());
    wait_exit(&mut runner.0, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir);
}

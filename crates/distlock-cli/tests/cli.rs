//! `distlock exec` and `distlock inspect` end to end, against the ZooKeeper from scripts/test.sh.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

fn backend(session: &str) -> String {
    let addr = std::env::var("DISTLOCK_TEST_ZK").expect("run the tests with scripts/test.sh (DISTLOCK_TEST_ZK unset)");
    format!("zk://{addr}?session_timeout={session}")
}

fn lock() -> String {
    format!("/distlock-cli-test/{}", uuid::Uuid::new_v4().simple())
}

fn distlock(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DISTLOCK_BACKEND", backend("4s")).args(args);
    c
}

/// Starts a holder `distlock exec LOCK -- sh -c 'echo held; ...'` and waits until it prints "held".
fn hold(lock: &str, session: &str, script: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend(session))
        .args(["exec", lock, "--", "sh", "-c", &format!("echo held; {script}")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = first_line_is(&mut child, "held");
    (child, out)
}

/// Reads the child's first line of output (bounded: 30 s) and checks it; returns the rest.
fn first_line_is(child: &mut Child, expected: &str) -> BufReader<std::process::ChildStdout> {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let _ = tx.send((line, out));
    });
    let (line, out) =
        rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("no {expected:?} within 30 s"));
    assert_eq!(line.trim(), expected);
    out
}

/// Waits (bounded) for a child to exit.
fn wait_exit(child: &mut Child, bound: Duration) -> std::process::ExitStatus {
    common::wait_exit(child, bound)
}

#[test]
fn exec_passes_env_and_exit_status() {
    let l = lock();
    let out =
        distlock(&["exec", &l, "--", "sh", "-c", "echo \"$DISTLOCK_KEY $DISTLOCK_TOKEN\"; exit 7"]).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (key, token) = stdout.trim().split_once(' ').unwrap();
    assert_eq!(key, l);
    assert!(token.parse::<u64>().unwrap() > 0);
    let out = distlock(&["exec", &l, "--", "sh", "-c", "echo \"$DISTLOCK_NODE\""]).output().unwrap();
    let node = String::from_utf8(out.stdout).unwrap();
    assert!(node.trim().starts_with(&format!("{l}/_c_")) && node.contains("-lock-"), "{node}");
}

#[test]
fn bare_names_live_under_distlock() {
    let name = format!("n{}", uuid::Uuid::new_v4().simple());
    let out = distlock(&["exec", &name, "--", "sh", "-c", "echo $DISTLOCK_KEY"]).output().unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), format!("/distlock/{name}"));
}

#[test]
fn nonblock_and_wait_give_up_with_conflict_code() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "sleep 120");
    let out = distlock(&["exec", "-n", &l, "--", "echo", "ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "the command must not run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not acquired"));
    let started = Instant::now();
    let out = distlock(&["exec", "-w", "400ms", "-E", "42", &l, "--", "echo", "ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(42));
    assert!(started.elapsed() >= Duration::from_millis(400));
    // Nothing left behind by the two failed attempts: only the holder is queued.
    let view = inspect_json(&l);
    let entries = view["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{view}");
    assert_eq!(entries[0]["holds"], true);
    assert!(owned_by(&entries[0], holder.id()), "{view}");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn waiter_runs_after_holder_finishes() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "sleep 0.5");
    let out = distlock(&["exec", "-w", "20s", &l, "--", "echo", "ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "ran");
    assert!(wait_exit(&mut holder, Duration::from_secs(20)).success());
}

#[test]
fn inspect_shows_holder_and_waiters_in_order() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "sleep 120");
    let mut waiter = distlock(&["exec", &l, "--", "true"]).spawn().unwrap();
    // Wait (bounded) until the waiter is queued.
    let view = common::eventually_some(Duration::from_secs(20), "the waiter to queue", || {
        Some(inspect_json(&l)).filter(|view| view["entries"].as_array().unwrap().len() == 2)
    });
    let c = view["entries"].as_array().unwrap();
    assert_eq!((c[0]["holds"].as_bool(), c[1]["holds"].as_bool()), (Some(true), Some(false)));
    assert!(owned_by(&c[0], holder.id()) && owned_by(&c[1], waiter.id()), "{view}");
    let table = distlock(&["inspect", &l]).output().unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("holder") && table.contains("waiter"), "{table}");
    holder.kill().unwrap(); // SIGKILL: the lock passes on when its session expires
    holder.wait().unwrap();
    assert!(wait_exit(&mut waiter, Duration::from_secs(30)).success());
}

#[test]
fn killed_holder_passes_the_lock_on_after_its_session_times_out() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "2s", "sleep 60");
    let started = Instant::now();
    let mut waiter = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend("4s"))
        .args(["exec", &l, "--", "echo", "took over"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    holder.kill().unwrap(); // SIGKILL: no chance to release
    holder.wait().unwrap();
    let status = wait_exit(&mut waiter, Duration::from_secs(30));
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(&mut waiter.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(out.trim(), "took over");
    // The killed holder's node stayed until its 2 s session expired: at least the session less
    // the time since its last ping before the kill (pings go every third of the session, and
    // this test may reach the kill late), so half the session, never at once.
    assert!(started.elapsed() >= Duration::from_millis(1000), "{:?}", started.elapsed());
}

/// Deletes the node of `lock`'s holder, as an operator would: the holder loses the lock.
fn delete_holder_node(lock: &str) {
    let view = inspect_json(lock);
    let node = format!("{lock}/{}", view["entries"][0]["id"].as_str().unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = distlock::zookeeper::Client::connect(&backend("4s")).await.unwrap();
        c.zookeeper().delete(&node, None).await.unwrap();
    });
}

#[test]
fn losing_the_lock_terminates_the_command() {
    let l = lock();
    // The command ignores nothing: SIGTERM ends it. It would otherwise sleep 60 s.
    let (mut holder, _out) = hold(&l, "4s", "sleep 60");
    // An operator deletes the holder's node: the lock is lost.
    delete_holder_node(&l);
    let status = wait_exit(&mut holder, Duration::from_secs(20));
    assert_eq!(status.code(), Some(3), "distlock exits 3 when the lock is lost");
}

#[test]
fn losing_the_lock_kills_a_command_that_ignores_sigterm() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "trap '' TERM; while :; do sleep 0.1; done");
    delete_holder_node(&l);
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    assert_eq!(status.code(), Some(3));
}

#[test]
fn bad_arguments_are_named() {
    let out = distlock(&["exec", "-w", "soon", "x", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"soon\""));
    let out = Command::new(BIN).args(["exec", "--backend", "zk://h", "x", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("zk://h"));
    let out = distlock(&["exec", "a/b", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a/b"));
    let out = distlock(&["exec", "-n", "-w", "1s", "x", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "-n and -w conflict");
}

#[test]
fn signals_are_forwarded_to_the_command() {
    let l = lock();
    let mut child = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend("4s"))
        .args([
            "exec",
            &l,
            "--",
            "sh",
            "-c",
            "trap 'echo got-term; exit 5' TERM; echo held; while :; do sleep 0.1; done",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    assert_eq!(lines.next(Duration::from_secs(30), "held"), "held");
    unsafe { libc_kill(child.id() as i32, 15) };
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert_eq!(lines.next(Duration::from_secs(20), "got-term"), "got-term");
    assert_eq!(status.code(), Some(5), "exit status of the command");
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn shared_locks_share_and_write_excludes() {
    let l = lock();
    let mut reader = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend("4s"))
        .args(["exec", "--shared", &l, "--", "sh", "-c", "echo held; sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = first_line_is(&mut reader, "held");
    let view = inspect_json(&l);
    assert_eq!(view["recipe"], "rwlock", "{view}");
    assert_eq!(
        (view["entries"][0]["mode"].as_str(), view["entries"][0]["holds"].as_bool()),
        (Some("read"), Some(true))
    );
    let r = distlock(&["exec", "-n", "-s", &l, "--", "echo", "second reader"]).output().unwrap();
    assert_eq!(r.status.code(), Some(0), "{}", String::from_utf8_lossy(&r.stderr));
    for exclusive in [&["-x"][..], &["--write"], &[]] {
        let mut args = vec!["exec", "-n"];
        args.extend_from_slice(exclusive);
        args.extend_from_slice(&[&l, "--", "echo", "exclusive"]);
        let w = distlock(&args).output().unwrap();
        // A plain exec (a mutex node) queues with readers like a writer: busy, not an error.
        assert_eq!(w.status.code(), Some(1), "{exclusive:?} must not enter beside a reader: {w:?}");
        assert!(w.stdout.is_empty());
    }
    reader.kill().unwrap();
    reader.wait().unwrap();
}

/// A lock's kind does not depend on who came first: a plain exec, -x and -s on one path form one
/// FIFO queue, in whatever order they arrive.
#[test]
fn plain_exclusive_and_shared_holders_form_one_queue() {
    let l = lock();
    let (mut plain, _out) = hold(&l, "4s", "sleep 120");
    for flags in [&["-s"][..], &["-x"]] {
        let mut args = vec!["exec", "-n"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[&l, "--", "echo", "ran"]);
        let out = distlock(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{flags:?} beside a plain holder: {out:?}");
    }
    // Queue a reader, then a plain waiter, behind the plain holder; the reader goes first.
    let mut reader = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend("4s"))
        .args(["exec", "-s", &l, "--", "sh", "-c", "echo reader; sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let reader_lines = Lines::of(&mut reader);
    wait_queue_len(&l, 2);
    let mut waiter = distlock(&["exec", &l, "--", "echo", "plain"]).stdout(Stdio::piped()).spawn().unwrap();
    wait_queue_len(&l, 3);
    let view = inspect_json(&l);
    let modes: Vec<&str> = view["entries"].as_array().unwrap().iter().map(|c| c["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["exclusive", "read", "exclusive"], "{view}");
    plain.kill().unwrap();
    plain.wait().unwrap();
    assert_eq!(reader_lines.next(Duration::from_secs(20), "the reader's turn"), "reader");
    let view = inspect_json(&l);
    let holds: Vec<(&str, bool)> = view["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["mode"].as_str().unwrap(), c["holds"].as_bool().unwrap()))
        .collect();
    assert_eq!(holds, [("read", true), ("exclusive", false)], "the plain waiter waits for the reader: {view}");
    reader.kill().unwrap();
    reader.wait().unwrap();
    assert!(wait_exit(&mut waiter, Duration::from_secs(20)).success());
}

/// `distlock inspect --json LOCK`, parsed: the one lock of its listing (the shape of
/// `inspect --all`).
fn inspect_json(lock: &str) -> serde_json::Value {
    let out = distlock(&["inspect", "--json", lock]).output().unwrap();
    let listing: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("inspect {lock}: {e}: {out:?}"));
    assert_eq!(listing["locks"].as_array().map(Vec::len), Some(1), "one lock: {listing}");
    listing["locks"][0].clone()
}

/// The entry's owner is the process `pid` (distlock's owner record: `host pid N`).
fn owned_by(entry: &serde_json::Value, pid: u32) -> bool {
    entry["owner"].as_str().is_some_and(|o| o.ends_with(&format!(" pid {pid}")))
}

/// Waits (bounded) until `lock` has `n` nodes queued.
fn wait_queue_len(lock: &str, n: usize) {
    common::eventually(Duration::from_secs(20), &format!("{lock} to have {n} nodes queued"), || {
        inspect_json(lock)["entries"].as_array().map_or(0, |c| c.len()) == n
    });
}

#[test]
fn permits_admit_n_holders() {
    let l = lock();
    let (mut a, _oa) = hold_with(&["--permits", "2"], &l, "sleep 30");
    let (mut b, _ob) = hold_with(&["--permits", "2"], &l, "sleep 30");
    let c = distlock(&["exec", "-n", "--permits", "2", &l, "--", "true"]).output().unwrap();
    assert_eq!(c.status.code(), Some(1), "a third holder of 2 permits");
    let view = inspect_json(&l);
    assert_eq!(view["recipe"], "semaphore", "{view}");
    let holders: Vec<_> = view["entries"].as_array().unwrap().iter().filter(|c| c["holds"] == true).collect();
    assert_eq!(holders.len(), 2, "{view}");
    a.kill().unwrap();
    a.wait().unwrap();
    let c = distlock(&["exec", "-w", "20s", "--permits", "2", &l, "--", "echo", "in"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&c.stdout).trim(), "in", "a permit freed by a dead holder");
    b.kill().unwrap();
    b.wait().unwrap();
    let bad = distlock(&["exec", "--permits", "0", &l, "--", "true"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn several_locks_are_taken_together() {
    let (a, b) = (lock(), lock());
    let out = distlock(&["exec", &b, &a, "--", "sh", "-c", "echo \"$DISTLOCK_KEY $DISTLOCK_TOKEN\""]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    let (keys, tokens) = text.trim().split_once(' ').unwrap();
    let mut sorted = [a.clone(), b.clone()];
    sorted.sort();
    assert_eq!(keys, sorted.join(","), "keys in acquisition (global) order");
    assert_eq!(tokens.split(',').count(), 2);
    // One member busy: nothing is taken and the command does not run.
    let (mut holder, _out) = hold(&b, "4s", "sleep 30");
    let out = distlock(&["exec", "-w", "300ms", &a, &b, "--", "echo", "ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let view = inspect_json(&a);
    assert!(view["entries"].as_array().unwrap().is_empty(), "the free member was given back: {view}");
    holder.kill().unwrap();
    holder.wait().unwrap();
}

fn hold_with(flags: &[&str], lock: &str, script: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut args = vec!["exec"];
    args.extend_from_slice(flags);
    let cmd = format!("echo held; {script}");
    args.extend_from_slice(&[lock, "--", "sh", "-c", &cmd]);
    let mut child =
        Command::new(BIN).env("DISTLOCK_BACKEND", backend("2s")).args(&args).stdout(Stdio::piped()).spawn().unwrap();
    let out = first_line_is(&mut child, "held");
    (child, out)
}

/// Reads a child's stdout lines on a thread of their own, so that every read has a bound.
struct Lines(std::sync::mpsc::Receiver<String>);

impl Lines {
    fn of(child: &mut Child) -> Lines {
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines(rx)
    }

    /// The next line, or a panic naming `what` after `bound`.
    fn next(&self, bound: Duration, what: &str) -> String {
        self.0.recv_timeout(bound).unwrap_or_else(|e| panic!("no line for {what} within {bound:?}: {e}"))
    }

    /// Every line until the output ends (bounded).
    fn rest(&self, bound: Duration) -> Vec<String> {
        let deadline = Instant::now() + bound;
        let mut all = Vec::new();
        loop {
            match self.0.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => all.push(line),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return all,
                Err(e) => panic!("output did not end within {bound:?}: {e}"),
            }
        }
    }
}

/// True while a process with this pid exists and has not exited. A zombie counts as gone: an
/// orphan that exited waits for its new parent to reap it, and the init of these machines reaps
/// only every few seconds (the grandchild below is such an orphan when its shell dies first).
fn alive(pid: i32) -> bool {
    if unsafe { libc_kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) state ...": comm may hold anything, so read the state after its last ')'.
        Ok(stat) => !matches!(
            stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().as_bytes().first()),
            Some(Some(b'Z' | b'X'))
        ),
        Err(_) => false,
    }
}

/// Waits (bounded) until the process `pid` is gone.
fn wait_gone(pid: i32, bound: Duration, what: &str) {
    common::eventually(bound, &format!("{what} (pid {pid}) to end"), || !alive(pid));
}

/// Starts a holder whose command starts a grandchild (a background `sleep`) and prints its pid.
fn hold_with_grandchild(lock: &str, backend_url: &str) -> (Child, i32) {
    let mut child = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend_url)
        .args(["exec", lock, "--", "sh", "-c", "sleep 300 & echo $!; wait"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    let grandchild: i32 = lines.next(Duration::from_secs(20), "the grandchild's pid").trim().parse().unwrap();
    assert!(alive(grandchild));
    (child, grandchild)
}

/// `kill -9` of a holding `distlock exec` ends its whole command group at once (the command used
/// to keep running under pid 1 while the next waiter started).
#[test]
fn killed_exec_takes_its_command_group_with_it() {
    let l = lock();
    let (mut holder, grandchild) = hold_with_grandchild(&l, &backend("4s"));
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_gone(grandchild, Duration::from_secs(10), "the command's child after exec was killed");
}

/// Losing the lock ends the whole command group, not only the direct child.
#[test]
fn losing_the_lock_ends_the_command_group() {
    let l = lock();
    let (mut holder, grandchild) = hold_with_grandchild(&l, &backend("4s"));
    delete_holder_node(&l);
    let status = wait_exit(&mut holder, Duration::from_secs(20));
    assert_eq!(status.code(), Some(3));
    wait_gone(grandchild, Duration::from_secs(5), "the command's child after the loss");
}

/// HUP, USR1 and USR2 sent to exec reach the command (exec used to die of USR1, leaving it).
#[test]
fn hangup_and_user_signals_reach_the_command() {
    let l = lock();
    let script = "trap 'echo got-hup' HUP; trap 'echo got-usr1' USR1; trap 'echo got-usr2; exit 4' USR2; \
                  echo held; while :; do sleep 0.05; done";
    let mut child = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend("4s"))
        .args(["exec", &l, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // If exec dies of a signal (as it used to), its command must not outlive the test.
    struct Cleanup;
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("pkill").args(["-f", "trap 'echo got-usr2"]).status();
        }
    }
    let _cleanup = Cleanup;
    let lines = Lines::of(&mut child);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    for (sig, expect) in [(1, "got-hup"), (10, "got-usr1"), (12, "got-usr2")] {
        unsafe { libc_kill(child.id() as i32, sig) };
        assert_eq!(lines.next(Duration::from_secs(10), expect), expect);
    }
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(4), "exec lived on and passed the command's status through");
}

/// A silent partition of the holder: exec stops its command before the server can hand the lock
/// on, whatever `--grace` says (it used to act only on `Lost`, and then allow the full grace to a
/// command that ignores SIGTERM, while the next holder had started).
#[test]
fn partitioned_exec_stops_its_command_before_the_next_holder_starts() {
    let l = lock();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = std::env::var("DISTLOCK_TEST_ZK").unwrap().parse().unwrap();
    let proxy = rt.block_on(distlock_faults::FaultProxy::start(upstream)).unwrap();
    let holder_backend = format!("zk://{}?session_timeout=4s", proxy.addr());
    // The command ignores SIGTERM and says every 20 ms that it still runs.
    let script = "trap '' TERM; echo held; while :; do date +%s%N; sleep 0.02; done";
    let mut holder = Command::new(BIN)
        .env("DISTLOCK_BACKEND", &holder_backend)
        .args(["exec", "--grace", "10s", &l, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    let waiter =
        distlock(&["exec", "-w", "60s", &l, "--", "sh", "-c", "date +%s%N"]).stdout(Stdio::piped()).spawn().unwrap();
    // Wait (bounded) until the waiter is queued.
    common::eventually(Duration::from_secs(20), "the waiter to queue", || {
        inspect_json(&l)["entries"].as_array().map_or(0, |c| c.len()) >= 2
    });
    proxy.set(distlock_faults::Fault::Blackhole);
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    assert_eq!(status.code(), Some(3), "exec reports the lock lost");
    let last: u128 = lines.rest(Duration::from_secs(30)).last().expect("the command ran").parse().unwrap();
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

/// When one lock of several is lost, exec releases the others at once (they used to stay held
/// until the session expired).
#[test]
fn losing_one_of_several_locks_releases_the_others_at_once() {
    let (a, b) = (lock(), lock());
    let mut holder = Command::new(BIN)
        .env("DISTLOCK_BACKEND", backend("10s"))
        .args(["exec", &a, &b, "--", "sh", "-c", "echo held; sleep 60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    delete_holder_node(&a);
    let status = wait_exit(&mut holder, Duration::from_secs(20));
    assert_eq!(status.code(), Some(3));
    // Within the 10 s session (the most the test servers grant), the other lock is free right away.
    let out = distlock(&["exec", "-n", &b, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// flock(1)'s conventions: -w takes bare seconds (fractions too) and -w 0 never waits; -c runs a
/// string through sh.
#[test]
fn flock_conventions_wait_seconds_and_dash_c() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "sleep 120");
    let started = Instant::now();
    let out = distlock(&["exec", "-w", "0.4", &l, "--", "echo", "ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(started.elapsed() >= Duration::from_millis(400), "-w 0.4 is 0.4 s");
    let out = distlock(&["exec", "-w", "0", &l, "--", "echo", "ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "-w 0 never waits: {out:?}");
    assert!(out.stdout.is_empty());
    holder.kill().unwrap();
    holder.wait().unwrap();
    let free = lock();
    let out = distlock(&["exec", &free, "-c", "echo \"$DISTLOCK_KEY\"; exit 4"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), free);
}

/// Without `--`, the command's words are read as locks (or as flags): say where the command goes.
#[test]
fn a_missing_double_dash_is_explained() {
    for args in [&["exec", "some-lock", "true"][..], &["exec", "some-lock"], &["exec", "some-lock", "ls", "-la"]] {
        let out = distlock(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("put -- before the command"), "{args:?}: {err}");
    }
}

/// A command that cannot be run gives the shell's statuses, and the lock is given back.
#[test]
fn commands_that_cannot_run_exit_127_and_126() {
    let l = lock();
    let out = distlock(&["exec", &l, "--", "/nonexistent/command"]).output().unwrap();
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let dir = std::env::temp_dir().join(format!("distlock-not-executable-{}", std::process::id()));
    std::fs::write(&dir, "#!/bin/sh\necho hi\n").unwrap();
    let out = distlock(&["exec", &l, "--", dir.to_str().unwrap()]).output().unwrap();
    std::fs::remove_file(&dir).unwrap();
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    let out = distlock(&["exec", "-n", &l, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "the lock was released: {out:?}");
}

/// A signal that ends a wait gives 128+N, and leaves nothing queued.
#[test]
fn a_signal_while_waiting_exits_128_plus_n() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "sleep 120");
    use std::os::unix::process::ExitStatusExt;
    // TERM and HUP: exit 128+N. INT and QUIT: distlock dies of the signal itself after cleaning
    // up (a shell shows 128+N), so that a calling script stops as it would for any program.
    for (sig, code) in [(15, Some(143)), (1, Some(129)), (2, None), (3, None)] {
        let mut waiter = distlock(&["exec", &l, "--", "echo", "ran"]).stdout(Stdio::piped()).spawn().unwrap();
        wait_queue_len(&l, 2);
        unsafe { libc_kill(waiter.id() as i32, sig) };
        let status = wait_exit(&mut waiter, Duration::from_secs(20));
        match code {
            Some(code) => assert_eq!(status.code(), Some(code), "signal {sig}"),
            None => assert_eq!(status.signal(), Some(sig), "signal {sig}: {status:?}"),
        }
        wait_queue_len(&l, 1);
    }
    // USR1 while waiting is not kept for the command (it used to kill it the moment it started).
    let mut waiter = distlock(&["exec", &l, "--", "echo", "ran"]).stdout(Stdio::piped()).spawn().unwrap();
    let lines = Lines::of(&mut waiter);
    wait_queue_len(&l, 2);
    unsafe { libc_kill(waiter.id() as i32, 10) };
    unsafe { libc_kill(holder.id() as i32, 15) };
    assert_eq!(lines.next(Duration::from_secs(20), "the waiter's command"), "ran");
    assert_eq!(wait_exit(&mut waiter, Duration::from_secs(20)).code(), Some(0));
    wait_exit(&mut holder, Duration::from_secs(20));
}

/// A free port on loopback that nobody listens on.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Connection refused is reported at once, not after the connect timeout; the connect timeout
/// is the one given; --session-timeout sets the session; an empty DISTLOCK_BACKEND is unset.
#[test]
fn unreachable_servers_and_connection_flags() {
    let refused = format!("zk://127.0.0.1:{}?connect_timeout=60s", dead_port());
    let mut child = Command::new(BIN)
        .args(["exec", "-n", "--backend", &refused, "x", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Well within the 60 s connect timeout: the refusal itself is reported.
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(2));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("refused"), "{err}");

    // A server that accepts but never answers: the connect timeout given, not a second more.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = std::env::var("DISTLOCK_TEST_ZK").unwrap().parse().unwrap();
    let proxy = rt.block_on(distlock_faults::FaultProxy::start(upstream)).unwrap();
    proxy.set(distlock_faults::Fault::Blackhole);
    let silent = format!("zk://{}", proxy.addr());
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["exec", "--connect-timeout", "1s", "--backend", &silent, "x", "--", "true"])
        .output()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("within 1s"), "{out:?}");
    drop(proxy);

    let out = distlock(&["exec", "--session-timeout", "3s", &lock(), "--", "true"])
        .env("DISTLOCK_LOG", "info")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("timeout=3000ms"), "{out:?}");

    // (inspect only reads: harmless if a developer runs a server on the default port.)
    let out = Command::new(BIN)
        .env("DISTLOCK_BACKEND", "")
        .args(["inspect", "--connect-timeout", "1s", "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || err.contains("zk://127.0.0.1:2181"), "{err}");
    assert!(!err.contains("invalid backend URL"), "{err}");
}

/// Messages are plain `distlock: ...` lines without terminal colours, log lines included.
#[test]
fn messages_are_plain_lines() {
    let out = distlock(&["exec", &lock(), "--", "true"]).env("DISTLOCK_LOG", "debug").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!err.is_empty());
    for line in err.lines() {
        assert!(line.starts_with("distlock: ") && !line.contains('\x1b'), "{line:?}");
    }
}

/// A missing chroot is named, by exec and inspect alike; a suggested lock path is a valid one.
#[test]
fn a_missing_chroot_and_bad_lock_names_are_named() {
    let addr = std::env::var("DISTLOCK_TEST_ZK").unwrap();
    let chroot = format!("/no-such-chroot-{}", uuid::Uuid::new_v4().simple());
    let url = format!("zk://{addr}{chroot}");
    for args in [&["exec", "--backend", &url, "x", "--", "true"][..], &["inspect", "--backend", &url, "x"]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(&chroot), "{args:?}: {out:?}");
    }
    let name = format!("x{}", uuid::Uuid::new_v4().simple());
    let out = distlock(&["exec", &format!("{name}/y/"), "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let suggested = format!("/{name}/y");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&suggested), "{out:?}");
    let out = distlock(&["exec", &suggested, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "the suggestion works: {out:?}");
}

/// A child that is not a lock node is neither a holder (inspect) nor in the way (exec).
#[test]
fn non_lock_children_are_ignored() {
    let l = lock();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = distlock::zookeeper::Client::connect(&backend("4s")).await.unwrap();
        let opts = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
        c.zookeeper().mkdir(&format!("{l}/config"), &opts).await.unwrap();
    });
    let (mut holder, _out) = hold(&l, "4s", "sleep 120");
    let view = inspect_json(&l);
    let entries = view["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "the holder only, not the config node: {view}");
    assert!(owned_by(&entries[0], holder.id()), "{view}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_queue_len(&l, 0);
    let out = distlock(&["exec", "-n", &l, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    rt.block_on(async {
        let c = distlock::zookeeper::Client::connect(&backend("4s")).await.unwrap();
        c.zookeeper().delete(&format!("{l}/config"), None).await.unwrap();
    });
}

/// Another permit count on a semaphore in use is refused with both counts; inspect shows it.
#[test]
fn a_different_permit_count_is_refused() {
    let l = lock();
    let (mut a, _oa) = hold_with(&["--permits", "2"], &l, "sleep 30");
    let out = distlock(&["exec", "--permits", "5", &l, "--", "echo", "ran"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("2 permits") && err.contains('5'), "{err}");
    let view = inspect_json(&l);
    assert_eq!(view["permits"], 2, "{view}");
    assert_eq!(view["entries"].as_array().unwrap().len(), 1, "the refused acquire left nothing: {view}");
    let table = distlock(&["inspect", &l]).output().unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("semaphore"));
    a.kill().unwrap();
    a.wait().unwrap();
}

/// `distlock hold`: prints the key, token and node, holds until stdin closes (or a signal), then
/// releases.
#[test]
fn hold_holds_until_stdin_closes_or_a_signal() {
    for by_signal in [false, true] {
        let l = lock();
        let mut holder = distlock(&["hold", &l]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let lines = Lines::of(&mut holder);
        let printed: Vec<String> = (0..3).map(|_| lines.next(Duration::from_secs(20), "hold's output")).collect();
        assert_eq!(printed[0], format!("DISTLOCK_KEY={l}"));
        assert!(printed[1].strip_prefix("DISTLOCK_TOKEN=").unwrap().parse::<u64>().unwrap() > 0);
        assert!(printed[2].starts_with(&format!("DISTLOCK_NODE={l}/_c_")), "{printed:?}");
        let out = distlock(&["exec", "-n", &l, "--", "true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "held while stdin is open");
        if by_signal {
            unsafe { libc_kill(holder.id() as i32, 15) };
        } else {
            drop(holder.stdin.take());
        }
        assert_eq!(wait_exit(&mut holder, Duration::from_secs(20)).code(), Some(0));
        let out = distlock(&["exec", "-n", &l, "--", "true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "released (by_signal: {by_signal})");
    }
}

/// As with flock(1), the lock stays held while processes the command left in its group run.
#[test]
fn the_lock_is_held_until_the_commands_background_children_end() {
    let l = lock();
    let fifo = std::env::temp_dir().join(format!("distlock-bg-{}", uuid::Uuid::new_v4().simple()));
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let script = format!("(read x < {}; echo bg-done) & echo $$", fifo.display());
    let mut holder = distlock(&["exec", &l, "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    let command: i32 = lines.next(Duration::from_secs(20), "the command's pid").parse().unwrap();
    wait_gone(command, Duration::from_secs(20), "the command itself");
    let out = distlock(&["exec", "-n", &l, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "the background child still runs: the lock is held");
    assert_eq!(holder.try_wait().unwrap(), None);
    std::fs::write(&fifo, "go\n").unwrap();
    assert_eq!(lines.next(Duration::from_secs(20), "bg-done"), "bg-done");
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(20)).code(), Some(0));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("stays held until the processes it left behind end"), "{err}");
    std::fs::remove_file(&fifo).unwrap();
    let out = distlock(&["exec", "-n", &l, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

/// On a 40-column terminal the waiting status line never wraps; an acquire that succeeds at once
/// prints no status at all.
#[test]
fn the_status_line_fits_the_terminal() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "sleep 120");
    let backend_url = backend("4s");
    let cmd = format!("stty cols 40; DISTLOCK_BACKEND='{backend_url}' {BIN} exec -w 1.5 {l} -- true");
    let out = Command::new("script").args(["-qec", &cmd, "/dev/null"]).stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let statuses: Vec<&str> =
        text.split(['\r', '\n']).filter(|s| s.contains("waiting") || s.contains("ahead")).collect();
    assert!(!statuses.is_empty(), "no status line: {text:?}");
    for s in &statuses {
        let visible = s.replace("\x1b[K", "");
        assert!(visible.chars().count() < 40, "{visible:?} is wider than the terminal");
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
    let free = lock();
    let cmd = format!("DISTLOCK_BACKEND='{backend_url}' {BIN} exec {free} -- true");
    let out = Command::new("script").args(["-qec", &cmd, "/dev/null"]).stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("waiting"), "{text:?}");
    assert!(!text.contains("\x1b[K"), "nothing to clear when no status was shown: {text:?}");
}

/// A waiter whose session expires (cut off from the server for longer than its session) says so,
/// naming the lock it waited for.
#[test]
fn an_expired_session_error_names_the_lock() {
    let l = lock();
    let (mut holder, _out) = hold(&l, "4s", "sleep 60");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = std::env::var("DISTLOCK_TEST_ZK").unwrap().parse().unwrap();
    let proxy = rt.block_on(distlock_faults::FaultProxy::start(upstream)).unwrap();
    let mut waiter = Command::new(BIN)
        .env("DISTLOCK_BACKEND", format!("zk://{}?session_timeout=4s", proxy.addr()))
        .args(["exec", &l, "--", "echo", "ran"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_queue_len(&l, 2);
    proxy.set(distlock_faults::Fault::Blackhole);
    // The server expires the waiter's session and deletes its node.
    wait_queue_len(&l, 1);
    proxy.set(distlock_faults::Fault::Pass);
    let status = wait_exit(&mut waiter, Duration::from_secs(30));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("expired") && err.contains(&l), "{err}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    drop(proxy);
}

/// The command owns the terminal: it reads it, and one Ctrl-C reaches it once (distlock does not
/// receive it too and pass it on a second time).
#[test]
fn one_ctrl_c_reaches_the_command_once() {
    let l = lock();
    let backend_url = backend("4s");
    // After the read, the command waits (bounded: 20 s) for the INT, then a little for a second
    // one that must not come.
    let script = "n=0; trap 'n=$((n+1)); echo got-int-$n' INT; echo held; read x; echo read-$x; i=0; \
                  while [ $n -eq 0 ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; \
                  i=0; while [ $i -lt 10 ]; do sleep 0.05; i=$((i+1)); done; echo done-$n";
    let file = std::env::temp_dir().join(format!("distlock-ctrl-c-{}.sh", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, script).unwrap();
    // If the test fails, nothing it started may outlive it (a command stopped on the terminal).
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("pkill").args(["-9", "-f", &self.0]).status();
        }
    }
    let _cleanup = Cleanup(file.display().to_string());
    let cmd = format!("DISTLOCK_BACKEND='{backend_url}' {BIN} exec {l} -- sh {}", file.display());
    let mut term = Command::new("script")
        .args(["-qefc", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut term);
    let mut stdin = term.stdin.take().unwrap();
    loop {
        if lines.next(Duration::from_secs(20), "held").trim_end().ends_with("held") {
            break;
        }
    }
    std::io::Write::write_all(&mut stdin, b"hello\n").unwrap();
    loop {
        if lines.next(Duration::from_secs(20), "read-hello").trim_end().ends_with("read-hello") {
            break;
        }
    }
    // Ctrl-Z is ignored (a stopped command owning the terminal would hang the shell with the
    // lock held); Ctrl-C then ends the wait loop's sleep as usual.
    std::io::Write::write_all(&mut stdin, b"\x1a\x03").unwrap();
    let rest: Vec<String> = lines.rest(Duration::from_secs(20)).iter().map(|l| l.trim_end().to_string()).collect();
    assert!(wait_exit(&mut term, Duration::from_secs(20)).success());
    std::fs::remove_file(&file).unwrap();
    let ints: Vec<&String> = rest.iter().filter(|l| l.contains("got-int")).collect();
    assert_eq!(ints.len(), 1, "{rest:?}");
    assert!(rest.iter().any(|l| l.ends_with("done-1")), "{rest:?}");
}

/// A waiter whose binary was removed while it waited (a package upgrade) still starts its
/// watchdog, and so runs its command (it used to fail with the command already started and left
/// running without the lock).
#[test]
fn a_waiter_whose_binary_was_removed_still_guards_its_command() {
    let l = lock();
    let copy = std::env::temp_dir().join(format!("distlock-copy-{}", uuid::Uuid::new_v4().simple()));
    std::fs::copy(BIN, &copy).unwrap();
    let (mut holder, _out) = hold(&l, "4s", "sleep 120");
    let mut waiter = Command::new(&copy)
        .env("DISTLOCK_BACKEND", backend("4s"))
        .args(["exec", &l, "--", "echo", "ran"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_queue_len(&l, 2);
    std::fs::remove_file(&copy).unwrap();
    unsafe { libc_kill(holder.id() as i32, 15) }; // the holder ends its command and releases
    wait_exit(&mut holder, Duration::from_secs(20));
    let out = {
        let status = wait_exit(&mut waiter, Duration::from_secs(30));
        let mut text = String::new();
        std::io::Read::read_to_string(&mut waiter.stdout.take().unwrap(), &mut text).unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut waiter.stderr.take().unwrap(), &mut err).unwrap();
        (status, text, err)
    };
    assert_eq!(out.0.code(), Some(0), "{out:?}");
    assert_eq!(out.1.trim(), "ran");
}

/// INT while still connecting ends at once (it used to wait for the connect timeout, then exit 2).
#[test]
fn a_signal_while_connecting_ends_at_once() {
    use std::os::unix::process::ExitStatusExt;
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // accepts, never answers
    let url = format!("zk://{}", silent.local_addr().unwrap());
    let mut child = Command::new(BIN)
        .args(["exec", "--connect-timeout", "60s", "--backend", &url, "x", "--", "true"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (_conn, _) = silent.accept().unwrap(); // distlock is connecting now
    unsafe { libc_kill(child.id() as i32, 2) };
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert_eq!(status.signal(), Some(2), "{status:?}");
}

/// Odd commands and flags: a script whose #! interpreter is missing (126, as a shell says), words
/// after -c (refused: they would become locks), a -w of centuries (no panic).
#[test]
fn odd_commands_and_flags_are_named() {
    let l = lock();
    let script = std::env::temp_dir().join(format!("distlock-bad-interp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = distlock(&["exec", &l, "--", script.to_str().unwrap()]).output().unwrap();
    std::fs::remove_file(&script).unwrap();
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("interpreter"), "{out:?}");
    let out = distlock(&["exec", &l, "-c", "echo hi", "all"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("after -c"), "{out:?}");
    let out = distlock(&["exec", "-w", "10000000000000000000", &l, "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn elect_observe_and_leader_on_zookeeper() {
    common::elect_observe_and_leader(&backend("4s"), &lock());
}

#[test]
fn once_per_slot_under_skewed_clocks_on_zookeeper() {
    common::once_per_slot_under_skewed_clocks(&backend("4s"), &format!("cli-job-{}", uuid::Uuid::new_v4().simple()));
}

/// `distlock serve` set up as production is (scripts/embedded.sh start-tls: TLS only, client
/// certificates required, `--users` and `--auth-required`): `exec`, `elect` and a job run over
/// `zks://` with the certificate flags and a digest login; a session without a login, a wrong
/// password, a missing client certificate and a plaintext URL are refused (exit 2), naming the
/// cause, without the password.
#[test]
fn serve_tls_only_with_logins() {
    let server = common::ScriptServer::start("embedded", "start-tls");
    let (dir, addr) = (&server.dir, &server.printed);
    let password = std::fs::read_to_string(dir.join("password")).unwrap().trim().to_string();
    let users = std::fs::read_to_string(dir.join("users")).unwrap();
    assert!(!users.contains(&password), "the users file holds a digest, not the password");
    let file = |name: &str| dir.join("certs").join(name).display().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let url = format!("zks://distlock:{password}@{addr}?connect_timeout=5s&lease=4s");
    let tls = ["--cacert", ca.as_str(), "--cert", cert.as_str(), "--key", key.as_str()];
    let run = |url: &str, args: &[&str], tls: &[&str]| {
        let out = Command::new(BIN)
            .env("DISTLOCK_BACKEND", url)
            .args([&args[..1], tls, &args[1..]].concat())
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains(&password), "the password shown: {text}");
        (out.status.code(), text)
    };
    let (code, text) = run(&url, &["exec", "tls-cli", "--", "sh", "-c", "echo token=$DISTLOCK_TOKEN"], &tls);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("token="), "{text}");
    let (code, text) = run(&url, &["elect", "tls-cli-election", "--", "echo", "leading"], &tls);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("leading"), "{text}");
    let (code, text) = run(&url, &["exec", "--once-per", "1h", "tls-cli-job", "--", "echo", "ran"], &tls);
    assert_eq!(code, Some(0), "{text}");
    // kazoo over TLS, logged in with the same digest, sees the holder's node under the lock.
    let hold_args = [&["hold"][..], &tls[..], &["tls-kazoo"][..]].concat();
    let (mut holder, _lines) = common::holding(&url, &hold_args);
    let kazoo = format!(
        "from kazoo.client import KazooClient\n\
         c = KazooClient(hosts='{addr}', use_ssl=True, ca='{ca}', certfile='{cert}', keyfile='{key}', \
         verify_certs=True, auth_data=[('digest', 'distlock:' + open('{pw}').read().strip())], timeout=5)\n\
         c.start(timeout=10)\nprint(len(c.get_children('/distlock/tls-kazoo')))\nc.stop()\n",
        pw = dir.join("password").display()
    );
    let out = Command::new("python3").arg("-c").arg(&kazoo).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "{}", String::from_utf8_lossy(&out.stderr));
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let refused = [
        (format!("zks://{addr}?connect_timeout=5s"), &tls[..], "requires a login"),
        (url.replace(&password, "not-the-password"), &tls[..], "refused user \"distlock\""),
        (url.clone(), &tls[..2], "client certificate"),
        (url.replace("zks://", "zk://"), &[][..], "write zks://"),
    ];
    for (bad, flags, says) in refused {
        let started = Instant::now();
        let (code, text) = run(&bad, &["exec", "tls-cli", "--", "true"], flags);
        assert_eq!(code, Some(2), "{bad}: {text}");
        assert!(text.contains(says), "{bad}: {text}");
        assert!(started.elapsed() < Duration::from_secs(5), "{bad}: took {:?}", started.elapsed());
    }
}

/// `distlock serve` over TLS holds its connection slots against clients that never finish: a
/// silent socket, a TLS record cut short, and a finished TLS handshake with no connect request are
/// all closed at `--handshake-timeout`, after which a real client gets in.
#[test]
fn serve_over_tls_closes_stalled_handshakes() {
    use std::io::{Read, Write};
    let server = common::ScriptServer::start_with(
        "embedded",
        "start-tls",
        &["--max-connections", "3", "--handshake-timeout", "1s"],
    );
    let (dir, addr) = (&server.dir, &server.printed);
    let file = |name: &str| dir.join("certs").join(name).display().to_string();
    let started = Instant::now();
    let silent = std::net::TcpStream::connect(addr).unwrap();
    let mut cut = std::net::TcpStream::connect(addr).unwrap();
    cut.write_all(&[0x16, 0x03, 0x01, 0x00, 0x80, 0x01]).unwrap(); // a handshake record's first bytes
                                                                   // A complete TLS handshake (client certificate and all), then nothing.
    let mut tls_only = Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", addr, "-CAfile", &file("ca.pem")])
        .args(["-cert", &file("client.pem"), "-key", &file("client.key"), "-verify_return_error"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (what, mut sock) in [("silent", silent), ("cut", cut)] {
        sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = Vec::new();
        match sock.read_to_end(&mut rest) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the {what} connection was not closed by the server: {e}"),
        }
        assert!(started.elapsed() >= Duration::from_secs(1), "{what} closed before the deadline");
    }
    // Closed by the server, s_client exits (its stdin is still open).
    wait_exit(&mut tls_only, Duration::from_secs(20));
    let mut said = String::new();
    tls_only.stderr.take().unwrap().read_to_string(&mut said).unwrap();
    assert!(said.contains("verify return:1") || said.contains("depth=0"), "the handshake finished: {said}");
    // The slots are free again: a real client locks.
    let password = std::fs::read_to_string(dir.join("password")).unwrap().trim().to_string();
    let out = Command::new(BIN)
        .env("DISTLOCK_BACKEND", format!("zks://distlock:{password}@{addr}?connect_timeout=10s"))
        .args(["exec", "--cacert", &file("ca.pem"), "--cert", &file("client.pem"), "--key", &file("client.key")])
        .args(["stalled-tls", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Endpoints without authentication (`serve --metrics`, `top --http`) listen beyond loopback only
/// when told to, and then say so; a bad `--four-letter-words` is named.
#[test]
fn unauthenticated_endpoints_stay_on_loopback_unless_allowed() {
    let refused = [
        (vec!["serve", "--listen", "127.0.0.1:0", "--metrics", "0.0.0.0:0"], "serve --metrics 0.0.0.0:"),
        (vec!["top", "--backend", "zk://127.0.0.1:1", "--http", "0.0.0.0:0"], "top --http 0.0.0.0:"),
        (
            vec!["serve", "--listen", "127.0.0.1:0", "--four-letter-words", "srvr,xyzw"],
            "unknown four-letter word \"xyzw\"",
        ),
    ];
    for (args, says) in refused {
        let mut child = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let code = wait_exit(&mut child, Duration::from_secs(20)).code();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        if !says.starts_with("unknown") {
            assert!(stderr.contains("--allow-remote"), "{args:?}: {stderr}");
        }
    }
    // Allowed: it serves, with a warning.
    let mut serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics", "0.0.0.0:0", "--allow-remote"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(serve.stderr.take().unwrap()).lines();
    let first = lines.next().expect("a line").unwrap();
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(first.contains("warning") && first.contains("no authentication"), "{first}");
}

/// A password in `$DISTLOCK_BACKEND` is not shown by `--help` and not passed on to the command.
#[test]
fn a_password_in_distlock_backend_is_neither_shown_nor_passed_on() {
    let marker = format!("Marker{}", uuid::Uuid::new_v4().simple());
    let addr = std::env::var("DISTLOCK_TEST_ZK").expect("DISTLOCK_TEST_ZK");
    let url = format!("zk://someone:{marker}@{addr}?session_timeout=4s");
    for args in [&["exec", "--help"][..], &["inspect", "--help"][..]] {
        let out = Command::new(BIN).env("DISTLOCK_BACKEND", &url).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("DISTLOCK_BACKEND"), "{text}");
        assert!(!text.contains(&marker), "--help shows the password: {text}");
    }
    let out = Command::new(BIN).env("DISTLOCK_BACKEND", &url).args(["exec", &lock(), "--", "env"]).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("DISTLOCK_TOKEN="), "{text}");
    assert!(!text.contains(&marker), "the command's environment has the password: {text}");
}

/// A marker password through a whole session on `distlock serve` set up as production is (TLS,
/// logins required): in no output, file or environment.
#[test]
fn secrets_stay_hidden_on_zookeeper() {
    let server = common::ScriptServer::start("embedded", "start-tls");
    let (password, tls) = common::password_and_tls_flags(&server);
    let url = format!("zks://distlock:{password}@{}?connect_timeout=5s&lease=4s", server.printed);
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    common::a_marker_password_is_never_shown(&url, &password, &tls, "secret-");
}

/// `--backend-file` (or `$DISTLOCK_BACKEND_FILE`): the URL from a file, so that a password is on
/// no command line and in no environment; refused while others may read a file with a password,
/// and when a URL is given too.
#[test]
fn the_backend_url_from_a_file() {
    use std::os::unix::fs::PermissionsExt;
    let addr = std::env::var("DISTLOCK_TEST_ZK").expect("DISTLOCK_TEST_ZK");
    let dir = std::env::temp_dir().join(format!("distlock-backend-file-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("backend");
    let marker = format!("Marker{}", uuid::Uuid::new_v4().simple());
    std::fs::write(&file, format!("# the lock service\nzk://someone:{marker}@{addr}?session_timeout=4s\n")).unwrap();
    let run = |args: &[&str], env: Option<(&str, &std::path::Path)>| {
        let mut c = Command::new(BIN);
        c.env_remove("DISTLOCK_BACKEND").args(args);
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains(&marker), "the password shown: {text}");
        (out.status.code(), text)
    };
    let lock = lock();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let f = file.to_str().unwrap();
    let (code, text) = run(&["exec", "--backend-file", f, &lock, "--", "true"], None);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("chmod 600"), "{text}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, text) = run(&["exec", "--backend-file", f, &lock, "--", "sh", "-c", "echo token=$DISTLOCK_TOKEN"], None);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("token="), "{text}");
    let (code, text) = run(&["exec", &lock, "--", "true"], Some(("DISTLOCK_BACKEND_FILE", &file)));
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = run(&["exec", "--backend", "zk://127.0.0.1:1", "--backend-file", f, &lock, "--", "true"], None);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("keep one"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lease the ZooKeeper server would not grant as asked (the test servers keep sessions of 1 s
/// to 60 s, or to 10 s) is refused, naming both, rather than silently replaced by the server's
/// nearest.
#[test]
fn a_lease_outside_the_servers_bounds_is_refused() {
    for lease in ["500ms", "100s"] {
        let out = distlock(&["exec", "--lease", lease, "-n", &lock(), "--", "true"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(out.stdout.is_empty(), "the command must not run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("grants a session timeout") && err.contains(lease), "{err}");
    }
}

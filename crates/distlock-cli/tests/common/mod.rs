//! What the CLI tests of every backend share: running `distlock`, reading a child's lines with a
//! bound, waiting for an exit with a bound, and the fault scenarios run on each backend.
#![allow(dead_code)] // each test binary uses its own part

use distlock_faults::FencedResource;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// The JSON lines a `bench --json` run printed, after checking it succeeded.
pub fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `distlock inspect --json LOCK`'s output, parsed: the one lock of its listing (the shape of
/// `inspect --all`).
pub fn one_lock(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "inspect: {}", String::from_utf8_lossy(&out.stderr));
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["locks"].as_array().map(Vec::len), Some(1), "one lock: {listing}");
    listing["locks"][0].clone()
}

/// `distlock ARGS` on `backend`.
pub fn distlock(backend: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.env("DISTLOCK_BACKEND", backend).args(args);
    c
}

/// `distlock ARGS` (a `hold`) once it holds: it has printed its `DISTLOCK_KEY=` line. Closing
/// its stdin releases. Keep the reader of its stdout as long as the child: dropped, it closes
/// the pipe, and a `hold` still printing its other lines fails on it.
pub fn holding(b: &str, args: &[&str]) -> (std::process::Child, Lines) {
    let mut child = distlock(b, args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let lines = Lines::of(&mut child);
    assert!(lines.next(Duration::from_secs(20), "DISTLOCK_KEY").starts_with("DISTLOCK_KEY="));
    (child, lines)
}

/// A `start-tls` server's password (DIR/password) and the flags of its CA and client certificate.
pub fn password_and_tls_flags(server: &ScriptServer) -> (String, Vec<String>) {
    let password = std::fs::read_to_string(server.dir.join("password")).unwrap().trim().to_string();
    let file = |name: &str| server.dir.join("certs").join(name).display().to_string();
    let flags = ["--cacert", &file("ca.pem"), "--cert", &file("client.pem"), "--key", &file("client.key")];
    (password, flags.map(String::from).to_vec())
}

/// A server of the project's scripts (`scripts/NAME.sh COMMAND DIR`), in a directory of its own,
/// stopped and removed when dropped; `printed` is what the script printed (its address).
pub struct ScriptServer {
    script: String,
    pub dir: std::path::PathBuf,
    pub printed: String,
}

impl ScriptServer {
    pub fn start(name: &str, command: &str) -> ScriptServer {
        Self::start_with(name, command, &[])
    }

    /// [`ScriptServer::start`], with `args` after the directory (the script passes them on).
    pub fn start_with(name: &str, command: &str, args: &[&str]) -> ScriptServer {
        let dir = std::env::temp_dir().join(format!("distlock-cli-{name}-{}", uuid::Uuid::new_v4().simple()));
        let script = format!("{}/../../scripts/{name}.sh", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(&script).arg(command).arg(&dir).args(args).env("DISTLOCK_BIN", BIN).output().unwrap();
        let server = ScriptServer { script, dir, printed: String::from_utf8_lossy(&out.stdout).trim().to_string() };
        assert!(out.status.success(), "{name}.sh {command}: {}", String::from_utf8_lossy(&out.stderr));
        server
    }
}

impl Drop for ScriptServer {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A lock name no other test uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// Reads lines of a child's stdout on a thread; `next` waits (bounded) for the next one.
pub struct Lines(pub std::sync::mpsc::Receiver<String>);

impl Lines {
    pub fn of(child: &mut std::process::Child) -> Lines {
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    pub fn next(&self, bound: Duration, what: &str) -> String {
        self.0.recv_timeout(bound).unwrap_or_else(|_| panic!("no {what} within {bound:?}"))
    }
}

/// Waits (bounded) until `cond` holds, re-checking every 20 ms; panics naming `what`. For a
/// condition with no event to wait on (a file appearing, a process exit, a count on the server).
pub fn eventually(bound: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    eventually_some(bound, what, || cond().then_some(()))
}

/// Waits (bounded) until `get` gives a value, re-checking every 20 ms, and returns it; panics
/// naming `what`. `eventually` for a wait whose condition is also the value waited for.
pub fn eventually_some<T>(bound: Duration, what: &str, mut get: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(v) = get() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {bound:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn wait_exit(child: &mut std::process::Child, bound: Duration) -> std::process::ExitStatus {
    eventually_some(bound, "the process to exit", || child.try_wait().unwrap())
}

/// A holder whose `distlock exec` is paused (SIGSTOP) past its lease (`backend` should have a
/// lease of about a second): nothing renews, the lock passes on, and the next holder runs while
/// the paused holder's command still writes. Fencing tokens keep the resource safe: the fenced
/// checker rejects every write of the old holder once the new one has written, while the same
/// history unfenced shows stale writes accepted. The old exec exits 3 (lost) once resumed.
pub fn a_paused_holder_is_kept_out_by_its_fencing_token(backend: &str, lock: &str) {
    let dir = std::env::temp_dir().join(unique("distlock-pause-"));
    std::fs::create_dir_all(&dir).unwrap();
    let writes = |name: &str| dir.join(name).to_string_lossy().to_string();
    // Each command writes "token time" every 10 ms until killed (the old one) or 40 times.
    let script = |file: &str, n: &str| {
        format!("echo held; i=0; while [ $i -lt {n} ]; do echo \"$DISTLOCK_TOKEN $(date +%s%N)\" >> {file}; i=$((i+1)); sleep 0.01; done")
    };
    let mut old = distlock(backend, &["exec", lock, "--", "sh", "-c", &script(&writes("old"), "100000")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let old_lines = Lines::of(&mut old);
    assert_eq!(old_lines.next(Duration::from_secs(20), "held"), "held");
    let mut new = distlock(backend, &["exec", "-w", "30s", lock, "--", "sh", "-c", &script(&writes("new"), "40")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Pause distlock itself (not its command, which runs in a group of its own and keeps writing).
    distlock_faults::process::pause(old.id()).unwrap();
    let new_lines = Lines::of(&mut new);
    assert_eq!(new_lines.next(Duration::from_secs(20), "held"), "held", "the next holder starts after the lease");
    let status = wait_exit(&mut new, Duration::from_secs(30));
    assert!(status.success());
    distlock_faults::process::resume(old.id()).unwrap();
    assert_eq!(wait_exit(&mut old, Duration::from_secs(30)).code(), Some(3), "the old holder learns it lost the lock");

    let mut all: Vec<(u128, usize, u64)> = Vec::new();
    for (who, name) in [(0, "old"), (1, "new")] {
        for line in std::fs::read_to_string(writes(name)).unwrap().lines() {
            let (token, at) = line.split_once(' ').unwrap();
            all.push((at.parse().unwrap(), who, token.parse().unwrap()));
        }
    }
    all.sort();
    let report = |fenced: bool| {
        let resource = FencedResource::new(fenced, 1);
        for (seq, (_, who, token)) in all.iter().enumerate() {
            resource.write(*who, *token, seq as u64);
        }
        resource.report()
    };
    let (fenced, unfenced) = (report(true), report(false));
    println!("fenced: {fenced}\nunfenced: {unfenced}");
    assert_eq!(fenced.stale_accepted, 0, "fenced: no stale write accepted");
    assert!(fenced.stale_rejected > 0, "the paused holder's command did write after the new holder: {fenced}");
    assert!(unfenced.stale_accepted > 0, "unfenced, the same history has stale writes: {unfenced}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A holder whose `distlock exec` and command are killed (SIGKILL, no release): the next exec's
/// command starts within `lease` + 5 s of the old one's, and not before `lease` if `lease_bound` (a lease table:
/// nobody notices the death). Session-bound locks (`lease_bound` false) may be freed at once: the
/// dead process's kernel closes its connection.
pub fn a_killed_holder_frees_the_lock(backend: &str, lock: &str, lease: Duration, lease_bound: bool) {
    // Each command prints the clock (ns) once it runs: after its grant. The old holder's lease runs
    // out no earlier than its grant plus the lease, whenever it was last renewed and however late
    // this test gets to kill it, so the next command's clock is at least the old one's plus the
    // lease, less the old command's start-up (allowed a tenth of the lease).
    let mut old = distlock(backend, &["exec", lock, "--", "sh", "-c", "date +%s%N; exec sleep 300"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut old);
    let old_ns: u128 = lines.next(Duration::from_secs(20), "the holder's start").trim().parse().unwrap();
    // The command runs in a process group of its own, led by the shell: kill both.
    let group = std::fs::read_to_string(format!("/proc/{}/task/{}/children", old.id(), old.id())).unwrap_or_default();
    distlock_faults::process::kill(old.id()).unwrap();
    for pid in group.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
        let _ = distlock_faults::process::kill(pid);
    }
    wait_exit(&mut old, Duration::from_secs(10));
    let next = distlock(backend, &["exec", "-w", "60s", lock, "--", "date", "+%s%N"]).output().unwrap();
    assert!(next.status.success(), "{}", String::from_utf8_lossy(&next.stderr));
    let next_ns: u128 = String::from_utf8_lossy(&next.stdout).trim().parse().unwrap();
    let waited = Duration::from_nanos(next_ns.saturating_sub(old_ns) as u64);
    if lease_bound {
        assert!(waited >= lease - lease / 10, "not before the dead holder's lease ran out: {waited:?} < {lease:?}");
    }
    let view = distlock(backend, &["exec", "-n", lock, "--", "true"]).output().unwrap();
    assert!(view.status.success(), "free again after the next holder: {}", String::from_utf8_lossy(&view.stderr));
    assert!(waited < lease + Duration::from_secs(5), "soon after it: {waited:?}");
}

/// The server ends the holder's session (PostgreSQL's `pg_terminate_backend`, MariaDB's `KILL`)
/// while another exec waits: the server frees the lock at that moment and the waiter's command
/// starts, so the holder's command (which ignores SIGTERM) must be stopped at once, whatever
/// `--grace` says (it used to run on for the whole grace: 5 s of two commands at once). Nothing
/// can stop it before the server hands the lock on (the fencing token is the guard for that). `queued`
/// tells when the waiter waits on the server; `end_session` ends the holder's session.
pub fn a_holder_whose_session_the_server_ended_stops_at_once(
    backend: &str,
    lock: &str,
    queued: impl Fn() -> bool,
    end_session: impl FnOnce(),
) {
    let script = "trap '' TERM; echo held; while :; do date +%s%N; sleep 0.005; done";
    let mut holder = distlock(backend, &["exec", "--grace", "10s", lock, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    let waiter = distlock(backend, &["exec", "-w", "60s", lock, "--", "sh", "-c", "date +%s%N"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(20), "the waiter to queue", &queued);
    let ended = Instant::now();
    end_session();
    let status = wait_exit(&mut holder, Duration::from_secs(30));
    let took = ended.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(3), "exec reports the lock lost: {stderr}");
    let mut last = 0u128;
    while let Ok(line) = lines.0.recv_timeout(Duration::from_secs(2)) {
        if let Ok(t) = line.parse() {
            last = t;
        }
    }
    assert!(last > 0, "the command ran");
    let waited = waiter.wait_with_output().unwrap();
    assert!(waited.status.success());
    let next: u128 = String::from_utf8(waited.stdout).unwrap().trim().parse().unwrap();
    // The server hands the lock on the moment it ends the session, before any client can know:
    // the holder's exec learns it from its connection closing, as the waiter learns its grant, and
    // the two race by a few ms. What exec promises is to stop its command at once (no grace):
    // its command's last line comes at most `AT_ONCE` after the next holder's first (the grace,
    // which exec used to wait out, is 10 s here; on a quiet machine it is a few ms, and the bound
    // leaves room for a busy one: it tells "at once" from "after the grace", no more).
    const AT_ONCE: Duration = Duration::from_secs(2);
    let overlap = last.saturating_sub(next);
    assert!(
        overlap < AT_ONCE.as_nanos(),
        "the holder's command ran {:.1} ms after the next holder's started (exec exited {took:?} after the session ended): {stderr}",
        overlap as f64 / 1e6
    );
    println!(
        "exec exited {took:?} after its session ended; its command's last line came {:.1} ms {} the next holder's first",
        (next.abs_diff(last)) as f64 / 1e6,
        if last < next { "before" } else { "after" }
    );
}

/// The server goes silent while exec holds (every packet dropped by a proxy: a silent partition,
/// or a server that is stopped): exec stops its command by the lease deadline and exits 3
/// promptly after it, not when the server answers again (before, it never exited while the
/// server stayed silent: its release waited for an answer). `url` names a server reached through
/// `proxy`, with a lease of `lease`.
pub fn a_silent_server_ends_the_hold_promptly(
    url: &str,
    lock: &str,
    proxy: &distlock_faults::FaultProxy,
    lease: Duration,
) {
    let mut holder = distlock(url, &["exec", lock, "--", "sh", "-c", "echo held; exec sleep 300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut holder);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    let silent = Instant::now();
    proxy.set(distlock_faults::Fault::Blackhole);
    let status = wait_exit(&mut holder, lease + Duration::from_secs(15));
    let took = silent.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(3), "exec reports the lock lost: {stderr}");
    assert!(
        took < lease + Duration::from_secs(8),
        "exec exited {took:?} after the server went silent (lease {lease:?})"
    );
    println!("exec exited 3 {took:?} after the server went silent (lease {lease:?})");
}

/// `distlock elect`, `elect --observe` and `leader` on one election: the leader's command gets
/// its value and epoch, nobody else is elected beside it, the waiting candidate leads once the
/// leader's command ends (with a higher epoch), and the observer prints every leader and an
/// empty line when nobody leads.
pub fn elect_observe_and_leader(b: &str, name: &str) {
    let bound = Duration::from_secs(20);
    let none = distlock(b, &["leader", name]).output().unwrap();
    assert_eq!(none.status.code(), Some(1), "no leader yet: {}", String::from_utf8_lossy(&none.stderr));
    assert!(String::from_utf8_lossy(&none.stderr).contains("has no leader"));

    let mut observer = distlock(b, &["elect", "--observe", "--interval", "20ms", name])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = Lines::of(&mut observer);
    assert_eq!(seen.next(bound, "the observer's first line"), "", "nobody leads at first");

    // Each leader's command records its lead in one log (single appends), checked at the end.
    let log = std::env::temp_dir().join(unique("distlock-elect-log-"));
    std::fs::write(&log, b"").unwrap();
    let lead = format!(
        "echo \"$DISTLOCK_VALUE in\" >> {0}; echo \"lead $DISTLOCK_VALUE $DISTLOCK_EPOCH\"; read _ || true; \
         echo \"$DISTLOCK_VALUE out\" >> {0}",
        log.display()
    );
    let candidate = |value: &str| {
        let mut c = distlock(b, &["elect", "--value", value, name, "--", "sh", "-c", &lead])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Lines::of(&mut c);
        (c, lines)
    };
    let (mut alpha, alpha_says) = candidate("alpha");
    let said = alpha_says.next(bound, "alpha leading");
    let epoch: u64 = said.strip_prefix("lead alpha ").and_then(|e| e.parse().ok()).unwrap_or_else(|| panic!("{said}"));
    assert_eq!(seen.next(bound, "alpha observed"), "alpha");

    let json = distlock(b, &["leader", "--json", name]).output().unwrap();
    assert!(json.status.success());
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!((json["value"].as_str(), json["epoch"].as_u64()), (Some("alpha"), Some(epoch)), "{json}");

    let busy = distlock(b, &["elect", "-n", "--value", "beta", name, "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("not elected"));

    let (mut beta, beta_says) = candidate("beta");
    // Beta waits while alpha leads: its command has not run when alpha's ends.
    assert!(beta_says.0.recv_timeout(Duration::from_millis(300)).is_err(), "beta led beside alpha");
    drop(alpha.stdin.take());
    assert!(wait_exit(&mut alpha, bound).success());
    let said = beta_says.next(bound, "beta leading");
    let next: u64 = said.strip_prefix("lead beta ").and_then(|e| e.parse().ok()).unwrap_or_else(|| panic!("{said}"));
    assert!(next > epoch, "epochs rise: {next} after {epoch}");
    let mut line = seen.next(bound, "beta observed");
    if line.is_empty() {
        line = seen.next(bound, "beta observed");
    }
    assert_eq!(line, "beta");

    drop(beta.stdin.take());
    assert!(wait_exit(&mut beta, bound).success());
    assert_eq!(seen.next(bound, "no leader observed"), "", "no leader once beta's command ended");
    let led = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        led.lines().collect::<Vec<_>>(),
        ["alpha in", "alpha out", "beta in", "beta out"],
        "one leader at a time"
    );
    let _ = std::fs::remove_file(&log);
    let empty = distlock(b, &["elect", "--value", "", name, "--", "true"]).output().unwrap();
    assert_eq!(empty.status.code(), Some(2), "an empty value is refused");
    assert!(String::from_utf8_lossy(&empty.stderr).contains("empty"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(observer.id() as i32, libc::SIGTERM) };
    assert!(wait_exit(&mut observer, bound).success(), "the observer ends on TERM with status 0");
}

/// The number written right after `marker` in `text`, if any.
fn number_after(text: &str, marker: &str) -> Option<u64> {
    let rest = &text[text.find(marker)? + marker.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// libfaketime, to give a client process a wrong wall clock (its monotonic clock is left true).
pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Milliseconds since the Unix epoch by this (unskewed) process's clock.
fn real_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// `distlock exec --once-per 1s` fired every 200 ms by four processes whose wall clocks are off
/// by -5, -2, +2 and +5 minutes (libfaketime), for `DISTLOCK_SCHEDULE_SECS` seconds (default
/// 8; the full run is 30). Meanwhile one run hangs ignoring SIGTERM (killed at its
/// at-most bound) and the `distlock` of another is killed by its own command, which then
/// ignores SIGTERM (its watchdog must kill the command by the job's bound). Checked from the runs' own log:
/// - no two runs at once (each run holds a local `flock -n`; a run that finds it taken logs
///   OVERLAP);
/// - no slot run twice, tokens rising with slots; every skipped start names a run the log has
///   (its token; its slot when it says the slot had its run);
/// - the slots are the server's: within two of the real time's (the clients are 120 to 300
///   slots off);
/// - every `distlock` exited 0 (ran), 1 (slot had its run), 2 (a start confirmed too late for its
///   bound, given back), 3 (the hung run, stopped) or of SIGKILL (the killed one); the record
///   names the last run.
pub fn once_per_slot_under_skewed_clocks(b: &str, name: &str) {
    let secs: u64 = std::env::var("DISTLOCK_SCHEDULE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    assert!(std::path::Path::new(FAKETIME_LIB).exists(), "libfaketime is needed (Debian faketime)");
    let dir = std::env::temp_dir().join(unique("distlock-jobs-"));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display().to_string();
    std::fs::write(
        dir.join("run.sh"),
        format!(
            "echo \"start $DISTLOCK_JOB_SLOT $DISTLOCK_TOKEN\" >> {d}/log\n\
             if mv {d}/hang {d}/hang.taken 2>/dev/null; then echo \"hang $DISTLOCK_JOB_SLOT\" >> {d}/log; trap '' TERM; sleep 30; fi\n\
             if mv {d}/kill {d}/kill.taken 2>/dev/null; then echo \"kill $DISTLOCK_JOB_SLOT\" >> {d}/log; trap '' TERM; kill -9 $DL; sleep 30; fi\n\
             echo \"end $DISTLOCK_JOB_SLOT $DISTLOCK_TOKEN\" >> {d}/log\n"
        ),
    )
    .unwrap();
    let command = format!(
        "export DL=$PPID; flock -n {d}/resource sh {d}/run.sh || echo \"OVERLAP $DISTLOCK_JOB_SLOT\" >> {d}/log"
    );
    let begin_ms = real_ms();
    let until = Instant::now() + Duration::from_secs(secs);
    // The firers go on past `until` (for at most a minute) until a run has taken both markers.
    let markers_taken = {
        let dir = dir.clone();
        move || dir.join("hang.taken").exists() && dir.join("kill.taken").exists()
    };
    let hard_stop = until + Duration::from_secs(60);
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let firers: Vec<_> = ["-300", "-120", "+120", "+300"]
        .into_iter()
        .map(|skew| {
            let (b, name, command, statuses) = (b.to_string(), name.to_string(), command.clone(), statuses.clone());
            let markers_taken = markers_taken.clone();
            std::thread::spawn(move || {
                while (Instant::now() < until || !markers_taken()) && Instant::now() < hard_stop {
                    let fired = Instant::now();
                    let child = distlock(&b, &["exec", "--once-per", "1s", &name, "-c", &command])
                        .env("LD_PRELOAD", FAKETIME_LIB)
                        .env("FAKETIME", skew)
                        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped())
                        .spawn()
                        .unwrap();
                    let out = wait_output(child, Duration::from_secs(30));
                    statuses.lock().unwrap().push((
                        skew,
                        out.status,
                        String::from_utf8_lossy(&out.stderr).into_owned(),
                    ));
                    // Every 200 ms, as cron would fire (a run that took longer fires at once).
                    std::thread::sleep(Duration::from_millis(200).saturating_sub(fired.elapsed()));
                }
            })
        })
        .collect();
    // A run hangs a quarter of the way in; the distlock of another is killed half way in, by its
    // own command (so the kill surely lands while it runs; the command then ignores SIGTERM and
    // sleeps): the watchdog must kill the command by the job's bound, not a grace period after
    // distlock's death.
    std::thread::sleep(Duration::from_secs(secs) / 4);
    std::fs::write(dir.join("hang"), "").unwrap();
    std::thread::sleep(Duration::from_secs(secs) / 4);
    std::fs::write(dir.join("kill"), "").unwrap();
    for f in firers {
        f.join().unwrap();
    }
    assert!(markers_taken(), "no run took the hang and kill markers within a minute");
    let end_ms = real_ms();

    let log = std::fs::read_to_string(dir.join("log")).unwrap();
    assert!(!log.contains("OVERLAP"), "two runs at once:\n{log}");
    let mut runs: Vec<(i64, u64)> = Vec::new();
    let mut stopped = Vec::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["start", slot, token] => runs.push((slot.parse().unwrap(), token.parse().unwrap())),
            ["hang" | "kill", slot] => stopped.push(slot.parse::<i64>().unwrap()),
            ["end", ..] => {}
            _ => panic!("a line of the log not understood: {line:?}\n{log}"),
        }
    }
    assert!(runs.len() >= 3, "too few runs in {secs} s:\n{log}");
    for w in runs.windows(2) {
        assert!(w[1].0 > w[0].0, "slot {} run twice, or out of order:\n{log}", w[1].0);
        assert!(w[1].1 > w[0].1, "tokens do not rise with slots:\n{log}");
    }
    let (first, last) = (runs[0].0, runs[runs.len() - 1].0);
    assert!(
        first >= begin_ms / 1000 - 2 && last <= end_ms / 1000 + 2,
        "slots {first}..{last} are not the server's time ({}..{}): a client's skewed clock was used",
        begin_ms / 1000,
        end_ms / 1000
    );
    let ran: std::collections::HashSet<i64> = runs.iter().map(|r| r.0).collect();
    let tokens: std::collections::HashSet<u64> = runs.iter().map(|r| r.1).collect();
    // Slots with no run are allowed (on a busy machine no start may fall in a slot, or only
    // starts that found the previous run still finishing); every skip must be explained by a run
    // that really happened, below.
    let missing = (first..=last).filter(|s| !ran.contains(s)).count();
    assert_eq!(stopped.len(), 2, "the hung and the killed run:\n{log}");

    let statuses = statuses.lock().unwrap();
    // Starts confirmed too late for their bound were given back: they took their slot without a
    // run, and skips may name them.
    let late: Vec<(u64, Option<u64>)> = statuses
        .iter()
        .filter(|(_, status, stderr)| status.code() == Some(2) && stderr.contains("too late for its bound"))
        .map(|(_, _, stderr)| {
            let token = number_after(stderr, "(token ").unwrap_or_else(|| panic!("no token named: {stderr}"));
            (token, number_after(stderr, ", slot "))
        })
        .collect();
    let tokens: std::collections::HashSet<u64> = tokens.into_iter().chain(late.iter().map(|l| l.0)).collect();
    let ran: std::collections::HashSet<i64> =
        ran.into_iter().chain(late.iter().filter_map(|l| l.1.map(|s| s as i64))).collect();
    let (mut ran_n, mut skipped_n, mut stopped_n, mut killed_n, mut late_n) = (0, 0, 0, 0, 0);
    for (skew, status, stderr) in statuses.iter() {
        match (status.code(), std::os::unix::process::ExitStatusExt::signal(status)) {
            (Some(0), _) => ran_n += 1,
            (Some(1), _) => {
                assert!(stderr.contains("not run"), "{skew}: exit 1 without saying why: {stderr}");
                // The run a skip names is one the log has: "running … (token T)" or "already run
                // in this slot: … (token T, slot S)".
                if let Some(t) = number_after(stderr, "(token ") {
                    assert!(
                        tokens.contains(&t),
                        "{skew}: skipped for run token {t}, which never ran:\n{stderr}\n{log}"
                    );
                }
                if stderr.contains("already run in this slot") {
                    let slot = number_after(stderr, ", slot ").unwrap_or_else(|| panic!("no slot named: {stderr}"));
                    assert!(
                        ran.contains(&(slot as i64)),
                        "{skew}: slot {slot} said run, but never ran:\n{stderr}\n{log}"
                    );
                }
                skipped_n += 1
            }
            // A start confirmed too late for its 1 s bound (a busy machine) is given back.
            (Some(2), _) if stderr.contains("too late for its bound") => late_n += 1,
            (Some(3), _) => stopped_n += 1,
            (None, Some(9)) => killed_n += 1,
            _ => panic!("clock {skew}: distlock ended {status:?}: {stderr}"),
        }
    }
    assert_eq!((stopped_n, killed_n), (1, 1), "one run stopped at its bound, one killed");
    assert_eq!(ran_n + 2, runs.len(), "every start that ran logged its run");
    assert!(skipped_n > 0, "four firers and no start ever found its slot run");

    // The record names the last run, read as JSON.
    let out = distlock(b, &["inspect", "--job", "--json", name]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let last_run = &v["last_run"];
    assert_eq!(last_run["slot"].as_i64(), Some(last), "{v}");
    assert_eq!(last_run["token"].as_u64(), Some(runs[runs.len() - 1].1), "{v}");
    assert!(last_run["pid"].as_u64().is_some() && last_run["pid_start"].as_u64().is_some(), "{v}");
    eprintln!(
        "{b}: {} runs in slots {first}..{last} ({missing} without a run) over {secs} s, {skipped_n} starts skipped, \
         {late_n} confirmed too late and given back, one hung run stopped, one killed",
        runs.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The output of `child`, waiting at most `bound` (killed past it).
pub fn wait_output(mut child: std::process::Child, bound: Duration) -> std::process::Output {
    let status = wait_exit(&mut child, bound);
    let mut stderr = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_end(&mut e, &mut stderr).unwrap();
    }
    std::process::Output { status, stdout: Vec::new(), stderr }
}

/// What one `distlock` run printed (stdout then stderr) and its exit code.
fn shown(out: std::process::Output) -> (Option<i32>, String) {
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// GET `path` from an HTTP server at `addr`: the whole answer (headers and body).
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// A scripted session on a backend whose URL (`url`, in `$DISTLOCK_BACKEND`) holds `marker` as its
/// password, every run at `DISTLOCK_LOG=debug`: `--help`, a lock run whose command prints its
/// environment (and a metrics textfile), `inspect` one lock and a prefix, an election, a job,
/// `hold`, `top --http` (its page and view), and errors (a bad name, an unknown URL key, a port
/// with no server). The marker must appear in no output, no file written and no command's
/// environment. `tls` are the flags the server needs (`--cacert` ...); names start with `prefix`.
pub fn a_marker_password_is_never_shown(url: &str, marker: &str, tls: &[&str], prefix: &str) {
    let scratch = std::env::temp_dir().join(format!("distlock-secret-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&scratch).unwrap();
    let run = |url: &str, sub: &str, args: &[&str]| {
        let out = Command::new(BIN)
            .env("DISTLOCK_BACKEND", url)
            .env("DISTLOCK_LOG", "debug")
            .arg(sub)
            .args(if sub == "leader" || args.first() == Some(&"--help") { &[][..] } else { tls })
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        shown(out)
    };
    let mut said: Vec<(String, String)> = Vec::new();
    let mut note = |what: &str, text: String| said.push((what.to_string(), text));
    let lock = format!("{prefix}secret-lock");
    let textfile = scratch.join("run.prom");
    let (code, text) =
        run(url, "exec", &["--metrics-textfile", textfile.to_str().unwrap(), &lock, "--", "sh", "-c", "echo ran; env"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("ran") && text.contains("DISTLOCK_TOKEN="), "{text}");
    note("exec (and its command's environment)", text);
    note("the metrics textfile", std::fs::read_to_string(&textfile).unwrap_or_default());
    for (sub, args) in [
        ("exec", &["--help"][..]),
        ("top", &["--help"][..]),
        ("inspect", &[lock.as_str()][..]),
        ("inspect", &["--all", prefix][..]),
        ("elect", &[format!("{prefix}secret-election").as_str(), "--", "env"][..]),
        ("exec", &["--once-per", "1h", format!("{prefix}secret-job").as_str(), "--", "env"][..]),
        ("exec", &["", "--", "true"][..]),
    ] {
        let (_, text) = run(url, sub, args);
        note(&format!("{sub} {args:?}"), text);
    }
    // bench over TLS: its floors and peers connect as the lock does (on a TLS-only server nothing
    // else could connect at all), and a failed peer would say so in its report.
    let (code, text) = run(url, "bench", &["--duration", "100ms", "--json", "uncontended"]);
    assert_eq!(code, Some(0), "bench: {text}");
    assert!(text.contains("\"workload\":\"uncontended") && !text.contains("python3 failed"), "bench: {text}");
    note("bench", text);
    for (what, bad) in [
        ("an unknown URL key", format!("{url}{}bogus=1", if url.contains('?') { '&' } else { '?' })),
        ("a port with no server", {
            let at = url.find('@').unwrap() + 1;
            let end = url[at..].find(['/', '?']).map_or(url.len(), |e| at + e);
            format!("{}127.0.0.1:1{}", &url[..at], &url[end..])
        }),
    ] {
        let (code, text) = run(&bad, "exec", &[lock.as_str(), "--", "true"]);
        assert_eq!(code, Some(2), "{what}: {text}");
        note(what, text);
    }
    // hold, released by closing its stdin.
    let mut hold = Command::new(BIN)
        .env("DISTLOCK_BACKEND", url)
        .env("DISTLOCK_LOG", "debug")
        .arg("hold")
        .args(tls)
        .arg(&lock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut hold);
    assert!(lines.next(Duration::from_secs(20), "DISTLOCK_KEY").starts_with("DISTLOCK_KEY="));
    // top --http while it holds: the page and the view.
    let addr_file = scratch.join("top.addr");
    let mut top = Command::new(BIN)
        .env("DISTLOCK_BACKEND", url)
        .env("DISTLOCK_LOG", "debug")
        .arg("top")
        .args(tls)
        .args(["--http", "127.0.0.1:0", "--http-addr-file", addr_file.to_str().unwrap(), prefix])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its address, or None once it exited without one.
    let addr = eventually_some(Duration::from_secs(20), "top --http to write its address", || {
        if let Some(a) = std::fs::read_to_string(&addr_file).ok().filter(|a| a.ends_with('\n')) {
            return Some(Some(a.trim().to_string()));
        }
        top.try_wait().unwrap().map(|_| None)
    });
    if let Some(addr) = addr {
        note("top --http's page", http_get(&addr, "/"));
        note("top --http's view", http_get(&addr, "/view"));
        // SAFETY: a signal to our own child, which has not been waited for.
        unsafe { libc::kill(top.id() as i32, libc::SIGTERM) };
    }
    let (code, text) = shown(top.wait_with_output().unwrap());
    // A backend that cannot list by prefix (MariaDB, PostgreSQL's hashed keys) says so.
    assert!(code == Some(0) || text.contains("does not support listing"), "top --http: {text}");
    note("top --http", text);
    drop(hold.stdin.take());
    assert!(wait_exit(&mut hold, Duration::from_secs(20)).success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut hold.stderr.take().unwrap(), &mut rest).unwrap();
    note("hold", rest);
    let _ = std::fs::remove_dir_all(&scratch);
    for (what, text) in &said {
        assert!(!text.contains(marker), "the password is in {what}: {text}");
    }
    assert!(said.iter().any(|(_, t)| t.contains("DEBUG") || t.contains("debug")), "no debug log was written");
}

/// A password for another machine, on a backend whose test server has no TLS. The test server's
/// `url` (`…user@127.0.0.1:PORT…`) is given a marker password and host 0.0.0.0 (which reaches this
/// machine, but is not `localhost` or a loopback address, so it counts as another machine);
/// `prefer` and `plain` are the queries of the mode that would fall back to plaintext and of
/// plaintext said outright. With `prefer` the password is not sent: refused, naming why and the
/// way out. With `plain` a warning says it goes unverified. Neither shows the password.
pub fn a_password_for_another_machine_is_not_sent_in_plaintext_unasked(url: &str, prefer: &str, plain: &str) {
    let marker = "marker-pw-4b1d";
    let abroad = url.replacen("@127.0.0.1:", &format!(":{marker}@0.0.0.0:"), 1);
    assert_ne!(abroad, url, "the test server's URL names user@127.0.0.1: {url}");
    let run = |query: &str| {
        let out = distlock(&format!("{abroad}{query}"), &["exec", "-n", &unique("abroad-"), "--", "true"])
            .env("DISTLOCK_LOG", "warn")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!stderr.contains(marker), "the password is shown: {stderr}");
        (out.status.code(), stderr)
    };
    let (code, stderr) = run(prefer);
    assert_ne!(code, Some(0), "{prefer}: connected in plaintext with a password for another machine: {stderr}");
    assert!(stderr.contains("does not send a password in plaintext to another machine"), "{prefer}: {stderr}");
    let (_, stderr) = run(plain);
    assert!(stderr.contains("does not verify the server"), "{plain}: no warning: {stderr}");
    assert!(stderr.contains("0.0.0.0"), "{plain}: the warning names the host: {stderr}");
}

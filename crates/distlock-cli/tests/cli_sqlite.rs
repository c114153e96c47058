//! `distlock exec` and `inspect` on a SQLite lease table (a database file per test).

use crate::common;

use common::{distlock, holding, unique};
use std::time::Duration;

/// A fresh database file's URL with `query`.
fn backend(query: &str) -> (String, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(unique("distlock-cli-sqlite-"));
    std::fs::create_dir_all(&dir).unwrap();
    (format!("sqlite://{}/locks.db{query}", dir.display()), dir)
}

#[test]
fn exec_on_sqlite_excludes_passes_the_token_and_inspect_shows_the_row() {
    let (b, dir) = backend("?lease=5s");
    let first = distlock(&b, &["exec", "job", "--", "sh", "-c", "echo $DISTLOCK_TOKEN"]).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let t1: u64 = String::from_utf8_lossy(&first.stdout).trim().parse().unwrap();
    let mut holder = distlock(&b, &["exec", "job", "--", "sh", "-c", "echo $DISTLOCK_TOKEN; read _ || true"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = common::Lines::of(&mut holder);
    let t2: u64 = lines.next(Duration::from_secs(20), "the holder's token").trim().parse().unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    let busy = distlock(&b, &["exec", "-n", "job", "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    let view = common::one_lock(&distlock(&b, &["inspect", "--json", "job"]).output().unwrap());
    assert_eq!(view["entries"][0]["holds"], true, "{view}");
    assert_eq!(view["entries"][0]["token"].as_u64(), Some(t2), "{view}");
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
    let view = common::one_lock(&distlock(&b, &["inspect", "--json", "job"]).output().unwrap());
    assert_eq!(view["entries"].as_array().map(Vec::len), Some(0), "released: {view}");
    assert_eq!(view["last_token"].as_u64(), Some(t2), "the free lock keeps its last token: {view}");
    // A recipe the lease table does not have is named before anything is taken.
    let read = distlock(&b, &["exec", "-s", "job", "--", "true"]).output().unwrap();
    assert!(!read.status.success());
    let said = String::from_utf8_lossy(&read.stderr).to_string();
    assert!(said.contains("does not support a read lock on job") && said.contains("mutex only"), "{said}");
    let permits = distlock(&b, &["exec", "--permits", "2", "job", "--", "true"]).output().unwrap();
    let said = String::from_utf8_lossy(&permits.stderr).to_string();
    assert!(said.contains("a semaphore of 2 permits") && !said.contains("Permits("), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_killed_holder_frees_the_lock_after_its_lease() {
    let (b, dir) = backend("?lease=2s");
    common::a_killed_holder_frees_the_lock(&b, "job", Duration::from_secs(2), true);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_paused_holder_is_kept_out_by_its_fencing_token() {
    let (b, dir) = backend("?lease=1s");
    common::a_paused_holder_is_kept_out_by_its_fencing_token(&b, "job");
    let _ = std::fs::remove_dir_all(dir);
}

/// The exposition in `path`, checked by Prometheus's own linter (`promtool check metrics`, from
/// Debian's `prometheus` package, which scripts/deps.sh installs).
fn promtool_checked(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lint = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .output_with(&text)
        .unwrap_or_else(|e| panic!("promtool (Debian's prometheus package; scripts/deps.sh installs it): {e}"));
    assert!(lint.status.success(), "promtool: {}\n{text}", String::from_utf8_lossy(&lint.stderr));
    text
}

trait OutputWith {
    fn output_with(&mut self, input: &str) -> std::io::Result<std::process::Output>;
}

impl OutputWith for std::process::Command {
    fn output_with(&mut self, input: &str) -> std::io::Result<std::process::Output> {
        use std::io::Write;
        let mut child = self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn()?;
        child.stdin.take().unwrap().write_all(input.as_bytes())?;
        child.wait_with_output()
    }
}

/// The value of the one line of `text` that starts with `series` (name and labels).
fn value(text: &str, series: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("{series} "))).collect();
    assert_eq!(lines.len(), 1, "{series} in\n{text}");
    lines[0].rsplit(' ').next().unwrap().to_string()
}

#[test]
fn metrics_textfile_records_each_run_for_the_textfile_collector() {
    let (b, dir) = backend("?lease=5s");
    let file = dir.join("job.prom");
    let f = file.to_str().unwrap();
    // A run that acquires; the command's status is the run's.
    let out = distlock(&b, &["exec", "--metrics-textfile", f, "job", "--", "sh", "-c", "echo $DISTLOCK_TOKEN; exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let text = promtool_checked(&file);
    let base = r#"command="exec",lock="job""#;
    assert_eq!(value(&text, &format!(r#"distlock_run_outcome{{{base},outcome="acquired"}}"#)), "1");
    assert_eq!(value(&text, &format!(r#"distlock_run_outcome{{{base},outcome="busy"}}"#)), "0");
    assert_eq!(value(&text, &format!("distlock_run_exit_status{{{base}}}")), "3");
    assert_eq!(value(&text, &format!("distlock_run_fencing_token{{{base}}}")), token);
    assert_eq!(value(&text, &format!(r#"distlock_run_lost{{{base},reason=""}}"#)), "0");
    let held: f64 = value(&text, &format!("distlock_run_held_seconds{{{base}}}")).parse().unwrap();
    assert!(held > 0.0, "{text}");
    // A run that finds the lock held: busy, the conflict status, no token; the file is replaced.
    let (mut holder, _out) = holding(&b, &["hold", "job"]);
    let busy = distlock(&b, &["exec", "-n", "-E", "9", "--metrics-textfile", f, "job", "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(9), "{}", String::from_utf8_lossy(&busy.stderr));
    let text = promtool_checked(&file);
    assert_eq!(value(&text, &format!(r#"distlock_run_outcome{{{base},outcome="busy"}}"#)), "1");
    assert_eq!(value(&text, &format!(r#"distlock_run_outcome{{{base},outcome="acquired"}}"#)), "0");
    assert_eq!(value(&text, &format!("distlock_run_exit_status{{{base}}}")), "9");
    assert!(!text.contains("distlock_run_fencing_token{"), "{text}");
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
    // `hold` records too; nothing but the file is left in its directory.
    let (mut hold, _out) = holding(&b, &["hold", "--metrics-textfile", f, "job"]);
    drop(hold.stdin.take());
    assert!(common::wait_exit(&mut hold, Duration::from_secs(20)).success());
    let text = promtool_checked(&file);
    assert_eq!(value(&text, r#"distlock_run_outcome{command="hold",lock="job",outcome="acquired"}"#), "1");
    assert_eq!(value(&text, r#"distlock_run_exit_status{command="hold",lock="job"}"#), "0");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".prom"))
        .collect();
    assert_eq!(left, ["job.prom"]);
    // Ctrl-C while waiting: distlock dies of SIGINT, and the file says so first.
    let (mut holder, _out) = holding(&b, &["hold", "job"]);
    let mut waiter = distlock(&b, &["exec", "--metrics-textfile", f, "job", "--", "true"])
        .env("DISTLOCK_LOG", "debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = waiter.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let mut err = Vec::new();
    while !err.iter().any(|l: &String| l.contains("waiting for job")) {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => err.push(line),
            Err(_) => panic!("no \"waiting for job\" within 20 s: {err:?}"),
        }
    }
    // SAFETY: a signal to a child this test started.
    unsafe { libc::kill(waiter.id() as libc::pid_t, libc::SIGINT) };
    let status = common::wait_exit(&mut waiter, Duration::from_secs(20));
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGINT), "{err:?}");
    let text = promtool_checked(&file);
    assert_eq!(value(&text, &format!(r#"distlock_run_outcome{{{base},outcome="interrupted"}}"#)), "1", "{text}");
    assert_eq!(value(&text, &format!("distlock_run_exit_status{{{base}}}")), "130");
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
    // A path in a directory that does not exist: refused before the run (exit 2, nothing run).
    let bad = distlock(&b, &["exec", "--metrics-textfile", "/nonexistent-dir/x.prom", "job", "--", "echo", "ran"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(bad.stdout.is_empty(), "the command ran");
    let said = String::from_utf8_lossy(&bad.stderr).to_string();
    assert!(said.contains("--metrics-textfile /nonexistent-dir/x.prom"), "{said}");
    // A directory gone by the end of the run: said on stderr, the run's own status kept.
    let gone = dir.join("gone");
    std::fs::create_dir_all(&gone).unwrap();
    let path = gone.join("x.prom");
    let rm = format!("rm -rf {}", gone.display());
    let late =
        distlock(&b, &["exec", "--metrics-textfile", path.to_str().unwrap(), "job", "-c", &rm]).output().unwrap();
    assert_eq!(late.status.code(), Some(0));
    let said = String::from_utf8_lossy(&late.stderr).to_string();
    assert!(said.contains(&format!("cannot write --metrics-textfile {}", path.display())), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inspect_all_lists_the_held_locks_under_a_prefix() {
    let (b, dir) = backend("?lease=30s");
    let (mut a, _a) = holding(&b, &["hold", "jobs/a"]);
    let (mut other, _o) = holding(&b, &["hold", "other"]);
    let out = distlock(&b, &["inspect", "--all", "jobs/"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table.lines().find(|l| l.starts_with("jobs/a ")).unwrap_or_else(|| panic!("no row:\n{table}"));
    assert!(row.contains("holder") && row.contains(&format!("pid {}", a.id())), "{table}");
    assert!(!table.contains("other"), "outside the prefix:\n{table}");
    assert!(table.contains("1 lock in use on sqlite") && table.contains("not recorded by sqlite: waiters"), "{table}");
    let json = distlock(&b, &["inspect", "--all", "--json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let names: Vec<&str> = json["locks"].as_array().unwrap().iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["jobs/a", "other"], "{json}");
    assert_eq!(json["locks"][0]["entries"][0]["holds"], true, "{json}");
    assert!(json["locks"][0]["entries"][0]["token"].as_u64().is_some(), "{json}");
    for child in [&mut a, &mut other] {
        drop(child.stdin.take());
        assert!(common::wait_exit(child, Duration::from_secs(20)).success());
    }
    let json = distlock(&b, &["inspect", "--all", "--json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["locks"].as_array().map(Vec::len), Some(0), "released: {json}");
    // Neither a lock nor --all: a usage error naming what is missing.
    let none = distlock(&b, &["inspect"]).output().unwrap();
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("<LOCK>"), "{}", String::from_utf8_lossy(&none.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn elect_observe_and_leader_on_sqlite() {
    let (b, dir) = backend("?lease=5s");
    // A database someone has used: on a path nobody has, `leader` is an error, not "no leader".
    assert!(distlock(&b, &["exec", "made", "--", "true"]).output().unwrap().status.success());
    common::elect_observe_and_leader(&b, "cli-elect");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn once_per_slot_under_skewed_clocks_on_sqlite() {
    let (b, dir) = backend("?lease=5s");
    common::once_per_slot_under_skewed_clocks(&b, "cli-job");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `distlock setup` makes the election and job tables (where missing; a second run is a no-op)
/// and says so; the password-free URL is shown.
#[test]
fn setup_makes_the_tables_once() {
    let (b, dir) = backend("");
    for _ in 0..2 {
        let out = distlock(&b, &["setup"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("are in place"), "{stderr}");
    }
    let tables = std::process::Command::new("sqlite3").arg(dir.join("locks.db")).arg(".tables").output().unwrap();
    let tables = String::from_utf8_lossy(&tables.stdout);
    for t in ["shedlock", "distlock_job_runs", "distlock_leases_leaders"] {
        assert!(tables.split_whitespace().any(|x| x == t), "{t} not in {tables}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Rough edges of the first hour, each refused by name, before anything is taken or run: a
/// negative duration (clap took `-1` for a flag), a command after `hold LOCK --` (it was taken as
/// more locks), a metrics textfile in a missing directory (found only after the command ran, and
/// the exit was 0), and `elect NAME COMMAND` without `--` (exec's hint).
#[test]
fn first_hour_mistakes_are_refused_by_name_before_anything_runs() {
    let (b, dir) = backend("?lease=5s");
    let marker = dir.join("ran");
    let run = format!("touch {}", marker.display());
    let refused = |args: &[&str], says: &str| {
        let out = distlock(&b, args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!marker.exists(), "{args:?} ran the command");
        text
    };
    for (args, says) in [
        (&["exec", "-w", "-1", "job", "-c", &run][..], "a wait cannot be negative"),
        (&["exec", "--grace", "-1s", "job", "-c", &run][..], "a duration cannot be negative"),
        (&["exec", "--lease", "-5s", "job", "-c", &run][..], "a duration cannot be negative"),
        (&["exec", "--once-per", "-1h", "job", "-c", &run][..], "a duration cannot be negative"),
    ] {
        let text = refused(args, says);
        assert!(!text.contains("unexpected argument"), "{args:?}: {text}");
    }
    let text = refused(&["hold", "orders", "--", "echo", "x"], "hold runs no command");
    assert!(text.contains("distlock exec"), "{text}");
    let missing = dir.join("no/such/dir/m.prom");
    refused(&["exec", "--metrics-textfile", missing.to_str().unwrap(), "job", "-c", &run], "--metrics-textfile");
    refused(&["elect", "leader-x", "echo", "hi"], "put -- before the command: distlock elect NAME");
    // One rule for flags: a bare number is seconds in every one, as -w took it. A URL key keeps
    // its unit (peers write milliseconds there: 30000 would be an eight-hour lease).
    let (bare, bare_dir) = backend("?lease=5s");
    let out =
        distlock(&bare, &["exec", "--lease", "3", "--grace", "0.5", "-w", "2", "job", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (ms, ms_dir) = backend("?lease=30000");
    let out = distlock(&ms, &["exec", "job", "--", "true"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("write 30000s or 30000ms"), "{said}");
    let _ = std::fs::remove_dir_all(bare_dir);
    let _ = std::fs::remove_dir_all(ms_dir);
    // The hint for `--` also when backend flags come before the subcommand.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["--backend", &b, "exec", "job", "echo", "x"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("put -- before the command"), "{out:?}");
    // Nothing was taken: every one of these locks is free.
    for lock in ["job", "orders", "echo", "x"] {
        let free = distlock(&b, &["exec", "-n", lock, "--", "true"]).output().unwrap();
        assert_eq!(free.status.code(), Some(0), "{lock}: {}", String::from_utf8_lossy(&free.stderr));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `-q` keeps a cron line silent: with `-E 0`, a busy lock and a job whose slot has had its run
/// print nothing at all (cron mails any output), and still exit with the -E status.
#[test]
fn quiet_busy_runs_print_nothing() {
    let (b, dir) = backend("?lease=5s");
    let ran = distlock(&b, &["exec", "--once-per", "1h", "report", "--", "true"]).output().unwrap();
    assert_eq!(ran.status.code(), Some(0), "{}", String::from_utf8_lossy(&ran.stderr));
    let again =
        distlock(&b, &["exec", "-q", "-E", "0", "--once-per", "1h", "report", "--", "echo", "ran"]).output().unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert!(again.stdout.is_empty() && again.stderr.is_empty(), "{again:?}");
    // Without -q the same start says why it did not run.
    let loud = distlock(&b, &["exec", "-E", "0", "--once-per", "1h", "report", "--", "echo", "ran"]).output().unwrap();
    assert!(String::from_utf8_lossy(&loud.stderr).contains("already run in this slot"), "{loud:?}");
    let (mut holder, _lines) = holding(&b, &["hold", "busy"]);
    let busy = distlock(&b, &["exec", "-q", "-n", "busy", "--", "echo", "ran"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1));
    assert!(busy.stdout.is_empty() && busy.stderr.is_empty(), "{busy:?}");
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
    let _ = std::fs::remove_dir_all(dir);
}

/// A job's messages say what happened: a start refused after a `--once-per` run names that run
/// (it said "taken by  until …", or named the finished run's pid as the holder); a schedule with
/// neither period nor bound names the flags; a run stopped at its `--at-most-for` bound is said
/// as that, not as a lost lock.
#[test]
fn job_messages_say_what_happened() {
    let (b, dir) = backend("?lease=5s");
    let ran = distlock(&b, &["exec", "--once-per", "1h", "nightly", "--", "true"]).output().unwrap();
    assert_eq!(ran.status.code(), Some(0), "{}", String::from_utf8_lossy(&ran.stderr));
    let taken = distlock(&b, &["exec", "--at-most-for", "2h", "nightly", "--", "true"]).output().unwrap();
    let said = String::from_utf8_lossy(&taken.stderr).to_string();
    assert_eq!(taken.status.code(), Some(1), "{said}");
    assert!(said.contains("taken until") && said.contains("after its last run") && said.contains("ended"), "{said}");
    assert!(!said.contains("taken by  until"), "{said}");
    let neither = distlock(&b, &["exec", "--at-least-for", "5m", "other", "--", "true"]).output().unwrap();
    let said = String::from_utf8_lossy(&neither.stderr).to_string();
    assert_eq!(neither.status.code(), Some(2), "{said}");
    assert!(said.contains("--once-per") && said.contains("--at-most-for"), "{said}");
    let bounded = distlock(&b, &["exec", "--at-most-for", "2s", "bounded", "--", "sleep", "30"]).output().unwrap();
    let said = String::from_utf8_lossy(&bounded.stderr).to_string();
    assert_eq!(bounded.status.code(), Some(3), "{said}");
    assert!(said.contains("job bounded: the job's bound (--at-most-for 2s)") && !said.contains("lost"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `top -b -n N` (top(1)'s batch mode): N plain-text views on stdout, no terminal needed, then
/// exit 0; the ACQUIRED column and `--sort acquired` count the same 20 refreshes.
#[test]
fn top_batch_prints_views_and_stops() {
    let (b, dir) = backend("?lease=30s");
    let (mut holder, _lines) = holding(&b, &["hold", "batch-lock"]);
    let out = distlock(&b, &["top", "-b", "-n", "3", "--interval", "100ms", "--sort", "acquired"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.matches("distlock top: ").count(), 3, "{text}");
    assert_eq!(text.matches("batch-lock").count(), 3, "{text}");
    assert!(text.contains("ACQUIRED (last 20 refreshes)") && !text.contains("q quit"), "{text}");
    let refused = distlock(&b, &["top", "-n", "3"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "-n without -b");
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
    let _ = std::fs::remove_dir_all(dir);
}

/// Every subcommand's help ends with its exit statuses; `elect`'s names the variables its command
/// gets; `leader --json` with nobody leading has every field its help promises (null).
#[test]
fn every_subcommand_documents_its_exit_statuses() {
    for sub in ["exec", "hold", "elect", "leader", "inspect", "top", "serve", "setup"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_distlock")).args([sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success() && help.contains("EXIT STATUS:"), "{sub} --help: {help}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_distlock")).args(["elect", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(help.contains("DISTLOCK_EPOCH") && help.contains("DISTLOCK_VALUE"), "{help}");
    let (b, dir) = backend("?lease=5s");
    // A database someone has used (on a path nobody has, looking is an error: see below).
    assert!(distlock(&b, &["exec", "made", "--", "true"]).output().unwrap().status.success());
    let out = distlock(&b, &["leader", "--json", "nobody-leads"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in ["name", "value", "epoch", "key"] {
        assert!(json.get(field).is_some(), "{field} missing: {json}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Backend flags before the subcommand work as after it (`distlock --backend URL inspect --all`,
/// as the docs write it; clap refused "unexpected argument '--backend'").
#[test]
fn backend_flags_before_the_subcommand() {
    let (b, dir) = backend("");
    let bin = env!("CARGO_BIN_EXE_distlock");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin).env_remove("DISTLOCK_BACKEND").args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, text) = run(&["--backend", &b, "--lease", "5s", "exec", "early", "--", "true"]);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = run(&[&format!("--backend={b}"), "inspect", "--all"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("on sqlite"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `distlock completions bash` is a script bash accepts and that completes subcommands;
/// `distlock man` is a manual page `man` renders, naming the subcommands.
#[test]
fn shell_completions_and_a_manual_page() {
    let script = std::process::Command::new(common::BIN).args(["completions", "bash"]).output().unwrap();
    assert!(script.status.success(), "{}", String::from_utf8_lossy(&script.stderr));
    let dir = std::env::temp_dir().join(format!("distlock-completions-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("distlock.bash");
    std::fs::write(&file, &script.stdout).unwrap();
    let complete = |words: &str| {
        let probe = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _distlock distlock \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; echo \"${{COMPREPLY[@]}}\"",
            file.display()
        );
        let out = std::process::Command::new("bash").args(["-c", &probe]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(complete("distlock ins"), "inspect");
    assert!(complete("distlock exec --gr").split(' ').any(|w| w == "--grace"), "{}", complete("distlock exec --gr"));
    let _ = std::fs::remove_dir_all(&dir);

    let page = std::process::Command::new(common::BIN).arg("man").output().unwrap();
    assert!(page.status.success(), "{}", String::from_utf8_lossy(&page.stderr));
    let mut man = std::process::Command::new("man")
        .args(["-l", "-"])
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    man.stdin.take().unwrap().write_all(&page.stdout).unwrap();
    let shown = man.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success() && text.contains("distlock"), "{text}");
    for sub in ["exec", "hold", "elect", "inspect", "top", "completions"] {
        assert!(text.contains(sub), "the page lacks {sub}:\n{text}");
    }
}

/// Looking makes nothing: `inspect`, `top -b` and `leader` on a mistyped database path fail
/// (exit 2) naming the file, and do not create it; `exec` does, and then they look as usual.
#[test]
fn looking_at_a_missing_database_is_an_error_not_an_empty_server() {
    let (b, dir) = backend("?lease=5s");
    let file = dir.join("locks.db");
    for args in [&["inspect", "--all"][..], &["top", "-b", "-n", "1"], &["leader", "nobody"], &["inspect", "job"]] {
        let out = distlock(&b, args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("no database file {}", file.display())), "{args:?}: {stderr}");
        assert!(!file.exists(), "{args:?} made the database file");
    }
    assert!(distlock(&b, &["exec", "job", "--", "true"]).output().unwrap().status.success());
    let out = distlock(&b, &["inspect", "--all"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(dir);
}

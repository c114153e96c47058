//! `distlock-bench` end to end, on every backend it measures: each workload reports against its
//! floor, nothing is left on the server (after a failure midway and after SIGINT too), plots are
//! written or their absence named, and the crash hand-over's leader is a process of its own.
//!
//! The servers are scripts/test.sh's (DISTLOCK_TEST_ZK, DISTLOCK_TEST_REDIS,
//! DISTLOCK_TEST_POSTGRES); SQLite files and the embedded server are the tests' own.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use distlock_faults::process::{run_bounded, Running, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_distlock-bench");

const DEBUG_WARNING: &str =
    "distlock-bench: warning: this is a debug build; its figures are not representative (cargo build --release)";

fn server(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("run the tests with scripts/test.sh ({var} unset)"))
}

fn zk(lease: &str) -> String {
    format!("zk://{}?lease={lease}", server("DISTLOCK_TEST_ZK"))
}

fn redis() -> String {
    format!("redis://{}", server("DISTLOCK_TEST_REDIS").trim_start_matches("redis://"))
}

fn postgres() -> String {
    format!("{}?lease=5s", server("DISTLOCK_TEST_POSTGRES"))
}

fn sqlite(scratch: &Scratch) -> String {
    format!("sqlite://{}/bench.db?lease=5s", scratch.0.display())
}

/// `distlock-bench --backend BACKEND ARGS…` to its end, which must come within two minutes.
fn bench(backend: &str, args: &[&str]) -> Output {
    run_bounded(
        Command::new(BIN).env_remove("DISTLOCK_BACKEND").args(["--backend", backend]).args(args),
        Duration::from_secs(120),
    )
}

/// A successful run's JSON lines.
fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn redis_cli(args: &[&str]) -> String {
    let addr = redis();
    let (host, port) = addr.trim_start_matches("redis://").rsplit_once(':').unwrap();
    let out = Command::new("redis-cli").args(["-h", host, "-p", port]).args(args).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The children of `path` on the test ZooKeeper, or None if it does not exist.
fn children(path: &str) -> Option<Vec<String>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = distlock::zookeeper::Client::connect(&zk("10s")).await.unwrap();
        let listed = client.zookeeper().list_children(path).await;
        client.close(Duration::from_secs(5)).await;
        match listed {
            Ok(c) => Some(c),
            Err(zookeeper_client::Error::NoNode) => None,
            Err(e) => panic!("listing {path}: {e}"),
        }
    })
}

/// Its help ends with its exit statuses.
#[test]
fn help_documents_the_exit_statuses() {
    let out = run_bounded(Command::new(BIN).arg("--help"), Duration::from_secs(30));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && help.contains("EXIT STATUS:"), "{help}");
}

// One test, so that its runs do not see each other's directories.
#[test]
fn bench_leaves_nothing_on_the_server() {
    let before = children("/distlock-bench");
    let out = run_bounded(
        Command::new(BIN).args([
            "--backend",
            &zk("10s"),
            "--duration",
            "200ms",
            "--json",
            "--clients",
            "2",
            "--locks",
            "8",
            "--tasks",
            "4",
            "--count",
            "10",
        ]),
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Every workload ran (their nodes are what must be gone).
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for want in
        ["raw-sequential", "uncontended-drop-release", "contended-2", "many-locks-8x4", "waiters-10", "herd-queue-2"]
    {
        assert!(lines.iter().any(|l| l["workload"] == want), "{want} missing: {lines:?}");
    }
    // The build profile, in every object and (for a debug build) on stderr.
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    for l in &lines {
        assert_eq!(l["build_profile"], profile, "{l}");
    }
    assert_eq!(stderr.lines().filter(|l| *l == DEBUG_WARNING).count(), usize::from(cfg!(debug_assertions)), "{stderr}");
    assert_no_bench_nodes(&before);

    // A workload that fails midway (its plot cannot be written, after the lock loop ran): the
    // error is reported and the run's nodes are removed all the same.
    let scratch = Scratch::new();
    let file = scratch.0.join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = run_bounded(
        Command::new(BIN)
            .args(["--backend", &zk("10s"), "--duration", "200ms", "--plot"])
            .arg(file.join("plots"))
            .arg("uncontended"),
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let want =
        format!("distlock-bench: --plot: cannot write {}: ", file.join("plots/uncontended-latency.svg").display());
    assert!(stderr.contains(&want), "{stderr}");
    assert_no_bench_nodes(&before);

    // Interrupted (SIGINT) once its directory exists: it removes the directory, then exits 130.
    let run = Running::start(Command::new(BIN).args(["--backend", &zk("10s"), "--duration", "60s", "uncontended"]));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = children("/distlock-bench").unwrap_or_default();
        if now.iter().any(|c| !before.as_ref().is_some_and(|b| b.contains(c))) {
            break;
        }
        assert!(Instant::now() < deadline, "the bench made no directory within 30s");
        std::thread::sleep(Duration::from_millis(20)); // polling the server: no event to wait on
    }
    assert_eq!(unsafe { libc::kill(run.id() as i32, libc::SIGINT) }, 0);
    let out = run.finish(Duration::from_secs(40));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("distlock-bench: interrupted; its nodes are removed"), "{stderr}");
    assert_no_bench_nodes(&before);
}

#[test]
fn bench_plot_names_the_workloads_it_cannot_plot() {
    let scratch = Scratch::new();
    let dir = scratch.0.join("plots");
    let bench = |workloads: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["--backend", "embedded", "--duration", "200ms", "--json", "--plot"]).arg(&dir).args(workloads);
        let out = run_bounded(&mut cmd, Duration::from_secs(120));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let notes: Vec<String> =
            stderr.lines().filter(|l| l.starts_with("distlock-bench: --plot:")).map(String::from).collect();
        notes
    };
    let svgs = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    // Nothing to plot at all: said, and nothing written.
    assert_eq!(
        bench(&["raw"]),
        ["distlock-bench: --plot: nothing to plot for workload raw (only uncontended and contended write plots)"]
    );
    assert!(svgs().is_empty(), "{:?}", svgs());
    // Some plots: the others are named, the plot is written.
    assert_eq!(
        bench(&["raw", "uncontended", "herd"]),
        ["distlock-bench: --plot: nothing to plot for workloads raw, herd (only uncontended and contended write plots)"]
    );
    assert_eq!(svgs(), ["uncontended-latency.svg"]);
    // Only plotted workloads: nothing to say.
    assert_eq!(bench(&["uncontended"]), Vec::<String>::new());
}

/// Asserts that no bench directory was added since `before` (the children of /distlock-bench
/// then): none at all, normally, the root included.
fn assert_no_bench_nodes(before: &Option<Vec<String>>) {
    match before {
        // The usual case: no other run's directory, so the root goes too.
        None => {
            let root = children("/").unwrap();
            assert!(!root.iter().any(|c| c == "distlock-bench"), "left behind: {root:?}");
        }
        // Another run's (or an older binary's) directory is there: ours must not be.
        Some(before) => {
            let after = children("/distlock-bench").unwrap_or_default();
            let new: Vec<_> = after.iter().filter(|c| !before.contains(c)).collect();
            assert!(new.is_empty(), "left behind under /distlock-bench: {new:?}");
        }
    }
}

#[test]
fn bench_reports_every_workload_against_its_limit() {
    let out = bench(
        "embedded",
        &["--duration", "200ms", "--json", "--count", "20", "--clients", "2", "--locks", "4", "--tasks", "4"],
    );
    let lines = json_lines(&out);
    let names: Vec<&str> = lines.iter().map(|l| l["workload"].as_str().unwrap()).collect();
    for want in [
        "raw-sequential",
        "raw-pipelined",
        "uncontended-acquire",
        "contended-2",
        "many-locks-4x4",
        "waiters-20",
        "herd-naive-2",
        "herd-queue-2",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for l in &lines {
        for field in ["ops_per_sec", "p50_us", "p99_us", "limit_ops_per_sec", "ratio_to_limit"] {
            assert!(l[field].is_number(), "{field} missing in {l}");
        }
        assert!(l["ops_per_sec"].as_f64().unwrap() > 0.0, "{l}");
    }
    let acquire = lines.iter().find(|l| l["workload"] == "uncontended-acquire").unwrap();
    assert_eq!(acquire["extra"][0][1], "2.00", "round trips per acquire+release: {acquire}");
    let queue = lines.iter().find(|l| l["workload"] == "herd-queue-2").unwrap();
    let per: f64 = queue["extra"][0][1].as_str().unwrap().parse().unwrap();
    assert!(per <= 1.0, "the queue lock wakes at most one waiter per acquisition: {queue}");
}

/// `bench handover` measures graceful and crash hand-overs; a crash hand-over cannot be quicker
/// than the server's giving up on the dead leader (its session timeout).
#[test]
fn bench_handover_reports_graceful_and_crash_handovers() {
    let out = bench(&zk("2s"), &["--duration", "100ms", "--json", "handover"]);
    let lines = json_lines(&out);
    let r = &lines[0];
    assert_eq!(r["workload"], "handover", "{r}");
    let extra: std::collections::HashMap<String, String> = r["extra"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
        .collect();
    assert!(extra["graceful_handovers"].parse::<u32>().unwrap() >= 10, "{r}");
    assert_eq!(extra["crash_handovers"], "3", "{r}");
    let crash: f64 = extra["crash_p50_ms"].parse().unwrap();
    let lease: f64 = extra["lease_ms"].parse().unwrap();
    assert!(crash >= lease * 0.5, "a crash hand-over before the server can have ended the session: {r}");
    assert!(r["p50_us"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn bench_on_redis_measures_every_floor_and_leaves_nothing() {
    let dir = std::env::temp_dir().join(format!("distlock-bench-plots-{}", uuid::Uuid::new_v4().simple()));
    let out = bench(
        &redis(),
        &[
            "--duration",
            "200ms",
            "--clients",
            "2",
            "--json",
            "--plot",
            dir.to_str().unwrap(),
            "raw",
            "uncontended",
            "contended",
        ],
    );
    let lines = json_lines(&out);
    let workload = |name: &str| {
        lines.iter().find(|l| l["workload"] == name).unwrap_or_else(|| panic!("no {name} in {lines:?}")).clone()
    };
    for floor in ["raw-sequential", "floor-simple", "floor-redisson", "floor-redisson-pipelined"] {
        assert!(workload(floor)["ops_per_sec"].as_f64().unwrap() > 0.0, "{floor}");
    }
    // Each lock against its own floor, measured interleaved with it.
    for (lock, floor) in [("uncontended", "floor-redisson"), ("uncontended-simple", "floor-simple")] {
        let w = workload(lock);
        assert!(w["limit_ops_per_sec"].as_f64().unwrap() > 0.0, "{lock}: {w}");
        let extra: Vec<(String, String)> = serde_json::from_value(w["extra"].clone()).unwrap();
        assert!(
            extra.iter().any(|(k, v)| k == "limit" && v.starts_with(floor) && v.contains("interleaved")),
            "{extra:?}"
        );
    }
    let extra: Vec<(String, String)> = serde_json::from_value(workload("contended")["extra"].clone()).unwrap();
    assert!(extra.iter().any(|(k, _)| k == "min_over_max"), "{extra:?}");
    assert!(dir.join("uncontended-latency.svg").exists() && dir.join("contended-throughput.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(redis_cli(&["--scan", "--pattern", "*distlock-bench*"]), "", "the run's keys are gone");
}

/// `bench scaling` measures every point of the growth (1 to 1,000 names held at once, 2 to 32
/// clients) and writes its three plots.
#[test]
fn bench_scaling_measures_every_point_and_plots() {
    let scratch = Scratch::new();
    let (b, dir) = (sqlite(&scratch), scratch.0.clone());
    let plots = dir.join("plots");
    std::fs::create_dir_all(&plots).unwrap();
    let out = bench(&b, &["--duration", "100ms", "--json", "--plot", plots.to_str().unwrap(), "scaling"]);
    let lines = json_lines(&out);
    let names: Vec<&str> = lines.iter().map(|l| l["workload"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "scaling-names-1",
            "scaling-names-10",
            "scaling-names-100",
            "scaling-names-1000",
            "scaling-clients-2",
            "scaling-clients-8",
            "scaling-clients-32"
        ]
    );
    for l in &lines {
        assert!(l["ops_per_sec"].as_f64().unwrap() > 0.0, "{l}");
    }
    for svg in ["scaling-names.svg", "scaling-names-p99.svg", "scaling-clients.svg"] {
        let text = std::fs::read_to_string(plots.join(svg)).unwrap();
        assert!(text.starts_with("<svg") || text.contains("<svg"), "{svg}");
    }
}

/// bench on PostgreSQL measures the floor, the uncontended lock against it and contended
/// hand-offs.
#[test]
fn bench_on_postgres_measures_the_floor_and_the_lock_against_it() {
    let out = bench(&postgres(), &["--duration", "200ms", "--clients", "2", "--json"]);
    let lines = json_lines(&out);
    let get = |name: &str| lines.iter().find(|l| l["workload"] == name).unwrap_or_else(|| panic!("no {name}")).clone();
    for w in ["floor-sequential", "floor-pipelined", "uncontended", "uncontended-peer", "contended"] {
        assert!(get(w)["ops_per_sec"].as_f64().unwrap() > 0.0, "{w}");
    }
    assert!(get("uncontended")["limit_ops_per_sec"].as_f64().unwrap() > 0.0);
    let extra: Vec<(String, String)> = serde_json::from_value(get("contended")["extra"].clone()).unwrap();
    assert!(extra.iter().any(|(k, _)| k == "min_over_max"), "{extra:?}");
}

/// Through the `--rtt` proxy, bench counts the client's writes on the wire: an uncontended cycle
/// is one statement to acquire (the lock and its token together) and one to release.
#[test]
fn bench_counts_two_writes_per_uncontended_cycle_on_the_wire() {
    let out = bench(&postgres(), &["--duration", "300ms", "--rtt", "0ms", "--json", "uncontended"]);
    let lines = json_lines(&out);
    let ours = lines.iter().find(|l| l["workload"] == "uncontended").expect("the uncontended report");
    let extra: Vec<(String, String)> = serde_json::from_value(ours["extra"].clone()).unwrap();
    let writes: f64 = extra
        .iter()
        .find(|(k, _)| k == "wire_writes_per_cycle")
        .unwrap_or_else(|| panic!("no wire count in {extra:?}"))
        .1
        .parse()
        .unwrap();
    assert!((2.0..2.05).contains(&writes), "client writes per cycle: {writes}");
}

/// The `held` workload's report: the extra field `key` of workload `held-N`.
fn held_field(lines: &[serde_json::Value], n: u32, key: &str) -> String {
    let r =
        lines.iter().find(|l| l["workload"] == format!("held-{n}")).unwrap_or_else(|| panic!("no held-{n}: {lines:?}"));
    let extra = r["extra"].as_array().unwrap();
    let pair = extra.iter().find(|p| p[0] == key).unwrap_or_else(|| panic!("no {key} in {r}"));
    pair[1].as_str().unwrap().to_string()
}

/// `held` holds its locks on an in-process store (no server: no connections or requests to
/// count) and on a server (counted at the proxy, beside the server's floor), and reports every
/// field: how many it held, how long the acquire took, the heap and RSS per lock.
#[test]
fn bench_held_reports_the_cost_per_held_lock() {
    let on_redis = format!("{}?lease=1s", redis());
    for (backend, server) in [("memory://bench-held?lease=1s", false), (on_redis.as_str(), true)] {
        let out = bench(backend, &["--json", "--held", "20", "--held-periods", "1", "held"]);
        let lines = json_lines(&out);
        assert_eq!(held_field(&lines, 20, "held"), "20", "{backend}");
        for key in ["acquire_ms", "acquire_us_per_lock", "heap_bytes_per_lock", "rss_bytes_per_lock", "lease_ms"] {
            let v = held_field(&lines, 20, key);
            assert!(v.parse::<f64>().is_ok(), "{backend}: {key}={v}");
        }
        for key in ["connections", "requests_per_s_per_1000_held"] {
            let v = held_field(&lines, 20, key);
            assert_eq!(v.parse::<f64>().is_ok(), server, "{backend}: {key}={v}");
        }
        if server {
            assert!(held_field(&lines, 20, "connections").parse::<u32>().unwrap() >= 1);
            assert_eq!(held_field(&lines, 20, "floor_held"), "20", "{backend}");
        } else {
            assert_eq!(held_field(&lines, 20, "connections"), "n/a");
        }
    }
}

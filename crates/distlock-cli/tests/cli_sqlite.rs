//! `distlock exec` and `inspect` on a SQLite lease table (a database file per test).

mod common;

use common::{distlock, unique};
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
    let mut holder = distlock(&b, &["exec", "job", "--", "sh", "-c", "echo held; read _ || true"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = common::Lines::of(&mut holder);
    assert_eq!(lines.next(Duration::from_secs(20), "held"), "held");
    let busy = distlock(&b, &["exec", "-n", "job", "--", "true"]).output().unwrap();
    assert_eq!(busy.status.code(), Some(1), "{}", String::from_utf8_lossy(&busy.stderr));
    let view = distlock(&b, &["inspect", "--json", "job"]).output().unwrap();
    let view: serde_json::Value = serde_json::from_slice(&view.stdout).unwrap();
    assert_eq!(view["held"], true, "{view}");
    assert_eq!(view["fencing_token"].as_u64(), Some(t1 + 1), "{view}");
    drop(holder.stdin.take());
    assert!(common::wait_exit(&mut holder, Duration::from_secs(20)).success());
    let view = distlock(&b, &["inspect", "--json", "job"]).output().unwrap();
    let view: serde_json::Value = serde_json::from_slice(&view.stdout).unwrap();
    assert_eq!(view["held"], false, "released: {view}");
    // A recipe the lease table does not have is named before anything is taken.
    let read = distlock(&b, &["exec", "-s", "job", "--", "true"]).output().unwrap();
    assert!(!read.status.success());
    assert!(String::from_utf8_lossy(&read.stderr).contains("mutex only"), "{}", String::from_utf8_lossy(&read.stderr));
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

/// `bench scaling` measures every point of the growth (1 to 1,000 names held at once, 2 to 32
/// clients) and writes its three plots.
#[test]
fn bench_scaling_measures_every_point_and_plots() {
    let (b, dir) = backend("");
    let plots = dir.join("plots");
    std::fs::create_dir_all(&plots).unwrap();
    let out = distlock(&b, &["bench", "--duration", "100ms", "--json", "--plot", plots.to_str().unwrap(), "scaling"])
        .output()
        .unwrap();
    let lines = common::json_lines(&out);
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
    let _ = std::fs::remove_dir_all(&dir);
}

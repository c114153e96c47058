//! A real Prometheus server (Debian's `prometheus`, which scripts/deps.sh installs) scrapes
//! `distlock serve --metrics` and the observability example application; PromQL queries through
//! its HTTP API see exactly the counts this test caused. Every exposition also passes `promtool
//! check metrics`.

use crate::common;

use common::{distlock, Lines};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Children stopped (SIGTERM, then SIGKILL) when the test ends, however it ends.
struct Started(Vec<Child>);

impl Drop for Started {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // SAFETY: a signal to a child this test started.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        for c in &mut self.0 {
            let until = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (bounded) for `file` to hold an address.
fn addr_in(file: &Path, child: &mut Child) -> String {
    common::eventually_some(Duration::from_secs(30), &format!("an address in {}", file.display()), || {
        if let Some(a) = std::fs::read_to_string(file).ok().filter(|a| !a.trim().is_empty()) {
            return Some(a.trim().to_string());
        }
        assert!(child.try_wait().unwrap().is_none(), "exited before writing {}", file.display());
        None
    })
}

/// `GET path` on `addr` over HTTP/1.1 (Connection: close): the status line and the body.
fn get(addr: &str, path: &str) -> std::io::Result<(String, String)> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((head.lines().next().unwrap_or("").to_string(), body.to_string()))
}

/// The body of `/metrics` on `addr`, checked by `promtool check metrics`.
fn linted(addr: &str) -> String {
    let (status, body) = get(addr, "/metrics").unwrap();
    assert!(status.contains("200"), "{status}");
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/deps.sh installs it)");
    lint.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool on {addr}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    body
}

/// A port nobody listened on a moment ago (bound, then let go): someone may take it before
/// Prometheus does, so [`start_prometheus`] tries again on another.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts Prometheus with `config` on a free loopback port, once its log says it is ready; a
/// port taken meanwhile (the process exits with "address already in use") means another port.
fn start_prometheus(dir: &std::path::Path, config: &std::path::Path) -> (std::process::Child, u16) {
    let log = dir.join("prometheus.log");
    for _ in 0..5 {
        let port = free_port();
        let mut prom = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("prometheus (Debian's prometheus package; scripts/deps.sh installs it)");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Server is ready to receive web requests") {
                return (prom, port);
            }
            if let Some(status) = prom.try_wait().unwrap() {
                assert!(text.contains("address already in use"), "prometheus exited ({status}):\n{text}");
                break;
            }
            assert!(Instant::now() < until, "prometheus not ready within 60 s:\n{text}");
            std::thread::sleep(Duration::from_millis(50)); // its log has no event to wait on
        }
    }
    panic!("prometheus found no free port in 5 tries")
}

/// The example application, built by the same cargo if this run has not built it yet.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let debug = exe.parent().unwrap().parent().unwrap();
    let path = debug.join("examples").join("observability");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args(["build", "-p", "distlock", "--example", "observability"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(built.success(), "cargo build --example observability");
    }
    path
}

/// A PromQL instant query's single value, or `None` if it has no result yet.
fn query(prom: &str, promql: &str) -> Option<f64> {
    let enc: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) = get(prom, &format!("/api/v1/query?query={enc}")).ok()?;
    if !status.contains("200") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1].as_str()?.parse().ok()
}

/// Waits (bounded) until `promql` gives `want`.
fn wait_query(prom: &str, promql: &str, want: f64) {
    common::eventually(Duration::from_secs(60), &format!("{promql} to give {want}"), || {
        query(prom, promql) == Some(want)
    });
}

#[test]
fn prometheus_scrapes_serve_and_an_application_and_sees_what_happened() {
    let dir = std::env::temp_dir().join(common::unique("distlock-prometheus-"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut started = Started(Vec::new());

    // The server, with its metrics endpoint.
    let (zk_file, metrics_file) = (dir.join("zk.addr"), dir.join("metrics.addr"));
    let serve = Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
        .arg("--addr-file")
        .arg(&zk_file)
        .arg("--metrics-addr-file")
        .arg(&metrics_file)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    started.0.push(serve);
    let zk = addr_in(&zk_file, &mut started.0[0]);
    let serve_metrics = addr_in(&metrics_file, &mut started.0[0]);
    let backend = format!("zk://{zk}");

    // The application: 6 acquisitions, then it serves its metrics until its stdin closes.
    let app_file = dir.join("app.addr");
    let mut app = Command::new(example())
        .args(["--backend", &backend, "--metrics", "127.0.0.1:0", "--count", "6"])
        .arg("--metrics-addr-file")
        .arg(&app_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut app);
    started.0.push(app);
    let app_metrics = addr_in(&app_file, &mut started.0[1]);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let line = lines.next(until.saturating_duration_since(Instant::now()), "done: 6 acquisitions");
        if line.starts_with("done: 6") {
            break;
        }
    }

    // Three `distlock exec` runs on the server.
    for _ in 0..3 {
        let out = distlock(&backend, &["exec", "job", "--", "true"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    // Both expositions pass Prometheus's linter.
    let text = linted(&serve_metrics);
    assert!(text.contains("\ndistlock_server_connections_accepted_total 4\n"), "{text}");
    let text = linted(&app_metrics);
    assert!(text.contains("distlock_acquires_total{backend=\"zookeeper\",outcome=\"acquired\",lock=\"/distlock/observability-demo\"} 6"), "{text}");

    // Prometheus scrapes both every second.
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: serve\n    static_configs:\n      - targets: ['{serve_metrics}']\n  - job_name: app\n    static_configs:\n      - targets: ['{app_metrics}']\n"
        ),
    )
    .unwrap();
    let (prom, port) = start_prometheus(&dir, &config);
    started.0.push(prom);
    let prom = format!("127.0.0.1:{port}");
    wait_query(&prom, "up{job=\"serve\"}", 1.0);
    wait_query(&prom, "up{job=\"app\"}", 1.0);
    wait_query(&prom, "distlock_server_connections_accepted_total{job=\"serve\"}", 4.0);
    wait_query(&prom, "sum(distlock_acquires_total{job=\"app\",outcome=\"acquired\"})", 6.0);
    wait_query(&prom, "sum(distlock_hold_seconds_count{job=\"app\"})", 6.0);
    wait_query(&prom, "sum(distlock_locks_held{job=\"app\"})", 0.0);
    // The application's session is the only one left; no lock node is.
    wait_query(&prom, "global_sessions{job=\"serve\"}", 1.0);
    wait_query(&prom, "distlock_server_ephemerals{job=\"serve\"}", 0.0);
    drop(started);
    let _ = std::fs::remove_dir_all(&dir);
}

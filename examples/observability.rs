//! An application that exports distlock's metrics and spans: metrics on a Prometheus endpoint
//! (`metrics-exporter-prometheus`), spans as log lines on stdout (`tracing-subscriber`).
//!
//! Run: `cargo run --example observability -- [--backend URL] [--metrics ADDR] [--count N]`.
//! Without `--backend` it starts distlock's embedded ZooKeeper-protocol server in-process.
//! It takes the lock `observability-demo` N times (default 5), two tasks competing for it, then
//! keeps serving `/metrics` until its standard input closes (so a Prometheus server can scrape
//! it), and exits. `--metrics-addr-file FILE` writes the endpoint's address once it listens.

use distlock::observe::{LockNames, Options};
use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;
use tracing_subscriber::fmt::format::FmtSpan;

struct Args {
    backend: Option<String>,
    metrics: SocketAddr,
    metrics_addr_file: Option<String>,
    count: u32,
}

fn args() -> Result<Args, String> {
    let mut a = Args { backend: None, metrics: "127.0.0.1:9464".parse().unwrap(), metrics_addr_file: None, count: 5 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => a.backend = Some(value()?),
            "--metrics" => a.metrics = value()?.parse().map_err(|e| format!("--metrics: {e}"))?,
            "--metrics-addr-file" => a.metrics_addr_file = Some(value()?),
            "--count" => a.count = value()?.parse().map_err(|e| format!("--count: {e}"))?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() {
    let args = args().unwrap_or_else(|e| {
        eprintln!("observability: {e}");
        std::process::exit(2);
    });
    // Spans to stdout: one line as each closes, with its fields and timings.
    tracing_subscriber::fmt().with_span_events(FmtSpan::CLOSE).with_ansi(false).with_target(false).init();
    // Metrics to a Prometheus endpoint; bound here first so a port 0 can be reported.
    let listener = std::net::TcpListener::bind(args.metrics).expect("bind the metrics address");
    let addr = listener.local_addr().unwrap();
    drop(listener);
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .expect("install the Prometheus exporter");
    distlock::observe::enable(Options { lock_names: LockNames::Capped(100) });
    println!("metrics on http://{addr}/metrics");
    if let Some(f) = &args.metrics_addr_file {
        std::fs::write(f, addr.to_string()).expect("write the metrics address file");
    }

    let embedded = match &args.backend {
        Some(_) => None,
        None => Some(distlock_server::EmbeddedServer::start().await.expect("start the embedded server")),
    };
    let url = args.backend.clone().unwrap_or_else(|| embedded.as_ref().unwrap().url());
    let client = distlock::connect(&url).await.expect("connect");
    let lock = client.mutex("observability-demo").expect("lock name");
    // Two tasks take turns: the second often waits, so the wait histogram has something to show.
    let half = args.count / 2;
    let turns = [args.count - half, half];
    let mut tasks = Vec::new();
    for n in turns {
        let lock = lock.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let guard = lock.lock().await.expect("lock");
                tokio::time::sleep(Duration::from_millis(20)).await; // the work under the lock
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    println!("done: {} acquisitions", args.count);
    // Serve until stdin closes.
    tokio::task::spawn_blocking(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    })
    .await
    .ok();
    client.close(Duration::from_secs(2)).await;
}

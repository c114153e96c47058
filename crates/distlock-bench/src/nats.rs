//! `distlock bench` on `nats://`: the server's own floor (a guarded create of one key with its
//! TTL, then a guarded delete at the create's sequence, one pair at a time on the one
//! connection, each create expecting the delete before it: the recipe's two writes with no
//! client logic), the uncontended lock interleaved with it, and contended hand-offs (every
//! waiter woken by its watch), each beside a peer: PyPI's `nats-kv-lock` (a Python lock on the
//! same kind of KV bucket: create, watch for the delete, get-and-delete), run by python3.

use super::harness::{
    check_workloads, contended_on, emit, fairness, interleaved, report, BenchParams, Progress, Report,
};
use distlock::nats::async_nats;
use std::time::{Duration, Instant};

/// The workloads measured on NATS.
pub const WORKLOADS: [&str; 3] = ["raw", "uncontended", "contended"];

const PAIR: &str = "publish(expected seq, Nats-TTL) + publish(DEL, expected seq)";

/// Runs `workloads` against `url` with `clients` contending clients for `duration` each.
pub async fn run(run: BenchParams<'_>) -> anyhow::Result<Vec<Report>> {
    let BenchParams { url, workloads, duration, clients, json, progress, .. } = run;
    check_workloads("nats", workloads, &WORKLOADS)?;
    let client = distlock::connect(url).await?;
    let nats = client.nats().ok_or_else(|| anyhow::anyhow!("{url}: not a nats:// URL"))?;
    let (raw, bucket) = (nats.nats(), nats.url().bucket().to_string());
    let base = format!("distlock-bench-{:x}", uuid::Uuid::new_v4().as_u128() as u32);
    let floor_key = Floor {
        js: async_nats::jetstream::new(raw),
        subject: format!("$KV.{bucket}.bench.{base}"),
        last: Default::default(),
    };
    let sequential = floor(&floor_key, duration, progress).await?;
    let mut reports = Vec::new();
    for w in workloads {
        let r = match w.as_str() {
            "raw" => vec![report("floor-sequential", sequential, sequential, vec![("pair".into(), PAIR.into())])],
            "uncontended" => {
                let lock = client.mutex(&format!("{base}/uncontended"))?;
                let pair = || floor_key.pair();
                let ours = interleaved(&lock, pair, duration, vec![("pair".into(), PAIR.into())], progress).await?;
                let peer = peer_nats_kv_lock(
                    url,
                    &format!("{base}.peer"),
                    1,
                    duration,
                    sequential,
                    "uncontended-nats-kv-lock",
                );
                vec![ours, peer?]
            }
            "contended" => {
                let ours =
                    contended_on(url, &format!("{base}/contended"), clients, duration, sequential, progress).await?;
                let peer = peer_nats_kv_lock(
                    url,
                    &format!("{base}.peer-contended"),
                    clients,
                    duration,
                    sequential,
                    "contended-nats-kv-lock",
                );
                vec![ours, peer?]
            }
            _ => unreachable!("checked above"),
        };
        emit(r, json, progress, &mut reports)?;
    }
    floor_key.clean().await?;
    client.close(Duration::from_secs(2)).await;
    Ok(reports)
}

/// The floor's key.
struct Floor {
    js: async_nats::jetstream::Context,
    subject: String,
    /// The key's last sequence (the last delete's).
    last: std::sync::atomic::AtomicU64,
}

impl Floor {
    /// One pair: create at the previous delete's sequence, delete at the create's.
    async fn pair(&self) -> anyhow::Result<()> {
        use async_nats::jetstream::message::PublishMessage;
        use std::sync::atomic::Ordering;
        let create = PublishMessage::build()
            .payload("bench".into())
            .expected_last_subject_sequence(self.last.load(Ordering::SeqCst))
            .ttl(Duration::from_secs(30));
        let seq = self.js.send_publish(self.subject.clone(), create).await?.await?.sequence;
        // No TTL on this delete (distlock's has one): it must stay the key's last message until
        // the next create, however long the next workload takes to start.
        let delete = PublishMessage::build().header("KV-Operation", "DEL").expected_last_subject_sequence(seq);
        let seq = self.js.send_publish(self.subject.clone(), delete).await?.await?.sequence;
        self.last.store(seq, Ordering::SeqCst);
        Ok(())
    }

    /// Leaves nothing: a purge of the key that expires a second later.
    async fn clean(&self) -> anyhow::Result<()> {
        use async_nats::jetstream::message::PublishMessage;
        let purge = PublishMessage::build()
            .header("KV-Operation", "PURGE")
            .header("Nats-Rollup", "sub")
            .ttl(Duration::from_secs(1));
        self.js.send_publish(self.subject.clone(), purge).await?.await?;
        Ok(())
    }
}

/// Floor pairs per second, one at a time.
async fn floor(key: &Floor, duration: Duration, progress: &Progress) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        key.pair().await?;
        n += 1;
    }
    progress.show("floor", n, start.elapsed());
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// PyPI's `nats-kv-lock` (`NatsKvLock`: a create of the key, a watch for its delete while taken,
/// a get and a delete to release; no TTL: a lock of a dead holder stays), `clients` connections
/// each looping acquire + release on one key of the URL's bucket, run by python3 in the same
/// run. Skipped with a note where it cannot run: the package missing (`pip install
/// nats-kv-lock`), or a URL with TLS or a login (the peer is given neither).
fn peer_nats_kv_lock(
    url: &str,
    key: &str,
    clients: u32,
    duration: Duration,
    limit: f64,
    workload: &str,
) -> anyhow::Result<Report> {
    let note = |why: &str| Ok(report(workload, 0.0, limit, vec![("skipped".into(), why.into())]));
    let parsed = distlock::nats::NatsUrl::parse(url)?;
    if parsed.tls() || parsed.user().is_some() || url.split("://").nth(1).is_some_and(|rest| rest.contains('@')) {
        return note("the nats-kv-lock peer runs on a plaintext server without login only");
    }
    let script = r#"
import asyncio, sys, time
try:
    import nats
    from nats_kv_lock import NatsKvLock
except ImportError:
    print("missing"); sys.exit(0)
servers, bucket, key = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
clients, secs = int(sys.argv[4]), float(sys.argv[5])
async def main():
    conns = [await nats.connect(servers=servers) for _ in range(clients)]
    locks = [NatsKvLock(await c.jetstream().key_value(bucket), key) for c in conns]
    counts = [0] * clients
    start = time.monotonic()
    stop = start + secs
    async def work(i):
        while time.monotonic() < stop:
            await locks[i].acquire()
            await locks[i].release()
            counts[i] += 1
    await asyncio.gather(*(work(i) for i in range(clients)))
    elapsed = time.monotonic() - start
    for c in conns:
        await c.close()
    print(sum(counts) / elapsed, min(counts), max(counts))
asyncio.run(main())
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &parsed.servers().join(","), parsed.bucket(), key])
        .arg(clients.to_string())
        .arg(duration.as_secs_f64().to_string())
        .stdin(std::process::Stdio::null())
        .output();
    let out = match out {
        Ok(out) if out.status.success() => out,
        // The traceback's last line says what went wrong (contended, the server refuses the
        // peer's watch consumers after a while: "maximum consumers limit reached").
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            return note(&format!("the peer failed: {}", err.trim().lines().last().unwrap_or("")));
        }
        Err(e) => return note(&format!("no python3: {e}")),
    };
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if text == "missing" {
        return note("nats-kv-lock not installed (pip install nats-kv-lock)");
    }
    let bad = || anyhow::anyhow!("nats-kv-lock peer printed {text:?}");
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [ops, min, max] = fields[..] else { return Err(bad()) };
    let ops: f64 = ops.parse().map_err(|_| bad())?;
    let (min, max): (u64, u64) = (min.parse().map_err(|_| bad())?, max.parse().map_err(|_| bad())?);
    let peer = vec![("peer".into(), "nats-kv-lock (PyPI) NatsKvLock".into())];
    Ok(report(workload, ops, limit, [peer, fairness(min, max)].concat()))
}

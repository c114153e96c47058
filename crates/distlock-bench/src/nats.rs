//! `distlock bench` on `nats://`: the server's own floor (a guarded create of one key with its
//! TTL, then a guarded delete at the create's sequence, one pair at a time on the one
//! connection, each create expecting the delete before it: the recipe's two writes with no
//! client logic), the uncontended lock interleaved with it, and contended hand-offs (every
//! waiter woken by its watch).

use super::harness::{check_workloads, contended_on, emit, interleaved, report, BenchParams, Progress, Report};
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
                vec![interleaved(&lock, pair, duration, vec![("pair".into(), PAIR.into())], progress).await?]
            }
            "contended" => {
                vec![contended_on(url, &format!("{base}/contended"), clients, duration, sequential, progress).await?]
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

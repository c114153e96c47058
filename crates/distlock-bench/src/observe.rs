//! `distlock bench observe`: what metrics and spans cost, on any backend. Uncontended cycles
//! through the backend-neutral API (`distlock::Client`, where the metrics and spans are
//! recorded), in 20 slices that take turns: observability off (no recorder in use, no
//! subscriber), then on (`distlock::observe::enable` into a Prometheus recorder, and every span
//! at INFO and above kept by a `tracing` registry). Both run on the same connection, so the machine's drift falls
//! on both alike. The ratio is the median over the pairs of slices of on ÷ off (goal ≥ 0.97);
//! the ratio of the totals is kept beside it.

use super::harness::{report, Progress, Report};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tracing::instrument::WithSubscriber;

const SLICES: u32 = 40;

/// The recorder, installed once per process.
fn recorder() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // A recorder installed before (none in distlock) would keep receiving: said in the notes.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

pub(super) async fn run(backend: &str, duration: Duration, progress: &Progress) -> anyhow::Result<Report> {
    let (_embedded, url) = super::harness::embedded_or(backend).await?;
    let client = distlock::connect(&url).await?;
    let lock = client.mutex(&format!("distlock-bench-observe-{}", uuid::Uuid::new_v4().simple()))?;
    let handle = recorder();
    // Every span at INFO and above kept, as an application exporting them would (a filter at
    // INFO: the client libraries' own DEBUG and TRACE callsites stay off, as they would there).
    let spans = tracing::Dispatch::new(tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::registry(),
        tracing_subscriber::filter::LevelFilter::INFO,
    ));
    let slice = duration / (2 * SLICES);
    let (mut n, mut took) = ([0u64; 2], [Duration::ZERO; 2]);
    // Each pair of slices (off, then on) gives a ratio; their median is the figure, as a burst of
    // other work on the machine moves a pair or two, not the median.
    let (mut pairs, mut off_rate) = (Vec::new(), 0.0);
    let start = Instant::now();
    for i in 0..2 * SLICES {
        let on = i % 2 == 1;
        if on {
            distlock::observe::enable(distlock::observe::Options::default());
        } else {
            distlock::observe::disable();
        }
        let cycles = async {
            let (t0, mut count) = (Instant::now(), 0u64);
            while t0.elapsed() < slice {
                lock.lock().await?.release().await?;
                count += 1;
            }
            Ok::<_, distlock::Error>((count, t0.elapsed()))
        };
        let (count, elapsed) = if on { cycles.with_subscriber(spans.clone()).await? } else { cycles.await? };
        n[on as usize] += count;
        took[on as usize] += elapsed;
        let rate = count as f64 / elapsed.as_secs_f64();
        if on {
            pairs.push(rate / off_rate);
        } else {
            off_rate = rate;
        }
        progress.show("observe", n[0] + n[1], start.elapsed());
    }
    distlock::observe::disable();
    let rate = |i: usize| n[i] as f64 / took[i].as_secs_f64();
    pairs.sort_by(f64::total_cmp);
    let mid = pairs.len() / 2;
    let median = if pairs.len() % 2 == 0 { (pairs[mid - 1] + pairs[mid]) / 2.0 } else { pairs[mid] };
    // The recorder saw exactly the cycles run with metrics on.
    let counted: f64 = handle
        .render()
        .lines()
        .filter(|l| l.starts_with("distlock_acquires_total{") && l.contains("outcome=\"acquired\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    client.close(Duration::from_secs(2)).await;
    let mut r = report(
        "observe",
        rate(1),
        rate(0),
        vec![
            ("ratio_of_totals".into(), format!("{:.3}", rate(1) / rate(0))),
            ("limit".into(), "the same cycles with metrics and spans off, in alternate slices".into()),
            ("cycles_on".into(), n[1].to_string()),
            ("acquisitions_counted".into(), format!("{counted}")),
            ("goal".into(), "0.97".into()),
        ],
    );
    r.ratio_to_limit = median;
    Ok(r)
}

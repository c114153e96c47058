//! `distlock bench` on `etcd://`: the server's own floor (a lease-bound put and a delete of one
//! key per cycle, one at a time and with 8 cycles in flight on the one connection), the recipe's
//! own two requests with no client logic (the conditional create and delete transactions), the
//! uncontended lock interleaved with the sequential floor, and contended hand-offs (each waiter
//! woken by its watch alone).

use super::harness::{check_workloads, contended_on, emit, interleaved, report, BenchParams, Progress, Report};
use distlock::etcd::etcd_client::{
    self, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use std::time::{Duration, Instant};

/// The workloads measured on etcd.
pub const WORKLOADS: [&str; 4] = ["raw", "uncontended", "contended", "scaling"];

/// Cycles in flight at once for the pipelined floor.
const IN_FLIGHT: u32 = 8;

/// Runs `workloads` against `url` with `clients` contending clients for `duration` each.
pub async fn run(run: BenchParams<'_>) -> anyhow::Result<Vec<Report>> {
    let BenchParams { url, workloads, .. } = run;
    check_workloads("etcd", workloads, &WORKLOADS)?;
    let client = distlock::connect(url).await?;
    let etcd = client.etcd().ok_or_else(|| anyhow::anyhow!("{url}: not an etcd:// URL"))?.etcd();
    let base = format!("distlock-bench-{:x}", uuid::Uuid::new_v4().as_u128() as u32);
    // The floor's keys live under a lease of their own (revoked at the end: nothing is left).
    let lease = etcd.clone().lease_grant(600, None).await?.id();
    let result = measure(&client, etcd.clone(), lease, &base, run).await;
    let _ = etcd.clone().lease_revoke(lease).await;
    client.close(Duration::from_secs(2)).await;
    result
}

async fn measure(
    client: &distlock::Client,
    etcd: etcd_client::Client,
    lease: i64,
    base: &str,
    run: BenchParams<'_>,
) -> anyhow::Result<Vec<Report>> {
    let BenchParams { url, workloads, duration, clients, json, progress, plot } = run;
    let floor_key = format!("{base}/floor");
    let sequential = floor(&etcd, lease, &floor_key, 1, duration, progress).await?;
    let mut reports = Vec::new();
    for w in workloads {
        let r = match w.as_str() {
            "raw" => {
                let pipelined = floor(&etcd, lease, &floor_key, IN_FLIGHT, duration, progress).await?;
                let recipe = recipe_floor(&etcd, lease, &format!("{base}/recipe/"), duration, progress).await?;
                vec![
                    report("floor-sequential", sequential, sequential, vec![("pair".into(), PAIR.into())]),
                    report(
                        "floor-pipelined",
                        pipelined,
                        sequential,
                        vec![("pair".into(), PAIR.into()), ("in_flight".into(), IN_FLIGHT.to_string())],
                    ),
                    report("floor-recipe", recipe, sequential, vec![("pair".into(), RECIPE.into())]),
                ]
            }
            "uncontended" => {
                let lock = client.mutex(&format!("{base}/uncontended"))?;
                let pair = || pair(etcd.clone(), lease, floor_key.clone());
                vec![interleaved(&lock, pair, duration, vec![("pair".into(), PAIR.into())], progress).await?]
            }
            "scaling" => {
                let this = BenchParams { url, workloads, duration, clients, json, progress, plot };
                super::harness::scaling_on(&this, &format!("{base}/scaling"), sequential).await?
            }
            "contended" => {
                vec![contended_on(url, &format!("{base}/contended"), clients, duration, sequential, progress).await?]
            }
            _ => unreachable!("checked above"),
        };
        emit(r, json, progress, &mut reports)?;
    }
    Ok(reports)
}

const PAIR: &str = "put with lease + delete";

async fn pair(mut etcd: etcd_client::Client, lease: i64, key: String) -> anyhow::Result<()> {
    etcd.put(key.clone(), "", Some(PutOptions::new().with_lease(lease))).await?;
    etcd.delete(key, None).await?;
    Ok(())
}

const RECIPE: &str = "txn(create if absent + read newest 2) + txn(delete if create revision)";

/// The lock recipe's own requests, one cycle at a time, with no client logic: what an
/// uncontended acquire and release cost the server at least.
async fn recipe_floor(
    etcd: &etcd_client::Client,
    lease: i64,
    prefix: &str,
    duration: Duration,
    progress: &Progress,
) -> anyhow::Result<f64> {
    let key = format!("{prefix}{lease:x}");
    let newest = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        let create = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([
            TxnOp::put(key.clone(), "", Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(prefix, Some(newest.clone())),
        ]);
        let rev = etcd.clone().txn(create).await?.header().map_or(0, |h| h.revision());
        let delete = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key.clone(), None)]);
        etcd.clone().txn(delete).await?;
        n += 1;
    }
    progress.show("floor-recipe", n, start.elapsed());
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Floor pairs per second with `in_flight` cycles at once (each on its own key).
async fn floor(
    etcd: &etcd_client::Client,
    lease: i64,
    key: &str,
    in_flight: u32,
    duration: Duration,
    progress: &Progress,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let until = start + duration;
    let mut tasks = Vec::new();
    for i in 0..in_flight {
        let (etcd, key) = (etcd.clone(), format!("{key}-{i}"));
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                pair(etcd.clone(), lease, key.clone()).await?;
                n += 1;
            }
            Ok::<u64, anyhow::Error>(n)
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await??;
    }
    progress.show("floor", n, start.elapsed());
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

//! `distlock bench handover`: how long an election is without a leader when the leader goes, on
//! any backend with elections, through the shared API. Graceful: the leader resigns while a
//! candidate waits; the time from the resign call to the candidate's campaign returning.
//! Crash: a process of its own leads (this program again, with [`LEADER_ARG`]) and is killed
//! (SIGKILL) while a candidate waits; the
//! time from the kill to the candidate's campaign returning, which the lease bounds (the server
//! must first give up on the dead leader).

use super::harness::{report, summarize, Progress, Report};
use std::time::{Duration, Instant};

/// Most graceful hand-overs measured, and crash hand-overs (each lasts about a lease).
const GRACEFUL: usize = 200;
const CRASHES: usize = 3;
const BOUND: Duration = Duration::from_secs(60);

/// Waits (bounded) until `n` candidates are queued on the server: the hand-over is measured from
/// a waiting candidate, not from one still on its way. Where the server records no waiters
/// (Redis: they wait on a channel), the candidate is given `FIRST_TRY` for its first attempt.
async fn queued(client: &distlock::Client, name: &str, n: usize) -> anyhow::Result<()> {
    const FIRST_TRY: Duration = Duration::from_millis(20);
    if !["zookeeper", "etcd"].contains(&client.backend()) {
        tokio::time::sleep(FIRST_TRY).await;
        return Ok(());
    }
    tokio::time::timeout(BOUND, async {
        loop {
            let listing = client.locks(name).await?;
            if listing.locks.iter().any(|l| l.name == name && l.entries.len() >= n) {
                return Ok::<_, anyhow::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("{n} candidates never queued on {name}"))?
}

/// `distlock-bench --handover-leader NAME`: the crash hand-over's leader, which campaigns in
/// election NAME on `$DISTLOCK_BACKEND` with the value `doomed` and leads until it is killed.
pub(super) const LEADER_ARG: &str = "--handover-leader";

/// The leader process's life: returns only on an error (the exit status is then 2).
pub(super) async fn lead_until_killed(name: &str) -> anyhow::Result<()> {
    let url = std::env::var("DISTLOCK_BACKEND")?;
    let client = distlock::connect(&url).await?;
    let _leading = client.election(name)?.campaign("doomed").await?;
    std::future::pending::<()>().await;
    Ok(())
}

pub(super) async fn run(backend: &str, duration: Duration, progress: &Progress) -> anyhow::Result<Report> {
    let (_embedded, url) = super::harness::embedded_or(backend).await?;
    let (a, b) = (distlock::connect(&url).await?, distlock::connect(&url).await?);
    let name = format!("distlock-bench-handover-{}", uuid::Uuid::new_v4().simple());
    let (ea, eb) = (a.election(&name)?, b.election(&name)?);
    let shown = ea.name().to_string();

    // Graceful: alternate who leads and who waits.
    let (mut graceful, start) = (Vec::new(), Instant::now());
    let (mut leader, mut waiter) = (ea.clone(), eb.clone());
    while graceful.len() < GRACEFUL && (start.elapsed() < duration || graceful.len() < 10) {
        let leading = leader.campaign("leader").await?;
        let candidate = waiter.clone();
        let waiting = tokio::spawn(async move {
            let l = candidate.campaign_timeout("next", BOUND).await;
            (Instant::now(), l)
        });
        queued(&a, &shown, 2).await?;
        let t0 = Instant::now();
        leading.resign().await?;
        let (t1, next) = waiting.await?;
        let next = next?.ok_or_else(|| anyhow::anyhow!("no hand-over within {BOUND:?}"))?;
        graceful.push(t1.saturating_duration_since(t0).as_micros() as u64);
        next.resign().await?;
        std::mem::swap(&mut leader, &mut waiter);
        progress.show("handover", graceful.len() as u64, start.elapsed());
    }

    // Crash: a leader process killed.
    let exe = std::env::current_exe()?;
    let mut crashes = Vec::new();
    for _ in 0..CRASHES {
        let mut child = tokio::process::Command::new(&exe)
            // The URL (a password with it) in the environment, never on a command line `ps` shows.
            .env("DISTLOCK_BACKEND", &url)
            .env_remove("DISTLOCK_BACKEND_FILE")
            .args([LEADER_ARG, &name])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        tokio::time::timeout(BOUND, async {
            while eb.leader().await?.is_none_or(|l| l.value != "doomed") {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok::<_, distlock::Error>(())
        })
        .await
        .map_err(|_| anyhow::anyhow!("the child never led"))??;
        let candidate = eb.clone();
        let waiting = tokio::spawn(async move {
            let l = candidate.campaign_timeout("survivor", BOUND).await;
            (Instant::now(), l)
        });
        queued(&a, &shown, 2).await?;
        let t0 = Instant::now();
        let pid = child.id().ok_or_else(|| anyhow::anyhow!("the leader process ended before it was killed"))?;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let (t1, next) = waiting.await?;
        let next = next?.ok_or_else(|| anyhow::anyhow!("no hand-over after the crash within {BOUND:?}"))?;
        crashes.push(t1.saturating_duration_since(t0).as_micros() as u64);
        next.resign().await?;
        let _ = child.wait().await;
        progress.show("handover (crash)", crashes.len() as u64, start.elapsed());
    }
    let lease = a.lease();
    a.close(Duration::from_secs(2)).await;
    b.close(Duration::from_secs(2)).await;
    let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
    let (c50, _, _) = summarize(crashes.clone());
    let cmax = crashes.iter().copied().max().unwrap_or(0);
    let mean = graceful.iter().sum::<u64>() as f64 / graceful.len().max(1) as f64;
    let r = report(
        "handover",
        1e6 / mean.max(1.0),
        0.0,
        vec![
            ("graceful_handovers".into(), graceful.len().to_string()),
            ("crash_handovers".into(), crashes.len().to_string()),
            ("crash_p50_ms".into(), ms(c50)),
            ("crash_max_ms".into(), ms(cmax)),
            ("lease_ms".into(), lease.as_millis().to_string()),
            ("limit".into(), "none: p50/p99 are resign to new leader; crash_* SIGKILL to new leader".into()),
        ],
    );
    Ok(Report { ratio_to_limit: 0.0, ..r.with_latencies(graceful) })
}

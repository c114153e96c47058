//! The deterministic simulation's switches (distlock's tests, `--cfg distlock_sim`).
//!
//! A planted defect is one this server really had and fixed, put back for the simulation to find:
//! on only when built with `--cfg distlock_sim` and `DISTLOCK_SIM_PLANT` names it. In every other
//! build [`planted`] is `false` and compiles away. [`spawn`] keeps the server's tasks in the
//! simulated host's `LocalSet` (in every other build: `tokio::spawn`).

/// Whether the planted defect `name` is switched on.
#[cfg(distlock_sim)]
pub(crate) fn planted(name: &str) -> bool {
    std::env::var("DISTLOCK_SIM_PLANT").is_ok_and(|v| v.split(',').any(|p| p == name))
}

/// Whether the planted defect `name` is switched on: never, outside the simulation.
#[cfg(not(distlock_sim))]
#[inline(always)]
pub(crate) fn planted(_name: &str) -> bool {
    false
}

/// Spawns a server task. In the simulation it joins the host's `LocalSet`, where tasks are kept
/// (and dropped when turmoil crashes the host) in the order they were spawned; tokio's runtime
/// keeps its tasks in lists picked by task id, a process-wide counter, so a crash would close the
/// connections (and draw their packets' latencies) in an order that depends on what ran before
/// on the process: a seed's trace would depend on the seeds run before it.
#[cfg(distlock_sim)]
pub(crate) fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + 'static,
    F::Output: 'static,
{
    tokio::task::spawn_local(task)
}

/// Spawns a server task on the runtime (every build but the simulation's).
#[cfg(not(distlock_sim))]
#[inline(always)]
pub(crate) fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(task)
}

/// The server's wall clock (`mtime`, `ctime`, the first session id): in the simulation a fixed
/// instant (2026-01-01T00:00:00Z) plus the simulated time, so that the times a seed's server
/// hands out (the jobs' slots are its clock's) are the seed's, not the machine's.
#[cfg(distlock_sim)]
pub(crate) fn wall_clock() -> std::time::SystemTime {
    std::time::UNIX_EPOCH
        + std::time::Duration::from_secs(1_767_225_600)
        + turmoil::sim_elapsed().unwrap_or(std::time::Duration::ZERO)
}

/// The server's wall clock: the system's (every build but the simulation's).
#[cfg(not(distlock_sim))]
#[inline(always)]
pub(crate) fn wall_clock() -> std::time::SystemTime {
    std::time::SystemTime::now()
}

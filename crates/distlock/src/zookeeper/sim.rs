//! The deterministic simulation's switches (tests only: `--cfg distlock_sim`, see crates/distlock-sim).
//!
//! A planted defect is one this crate really had and fixed, put back for the simulation to find:
//! on only when built with `--cfg distlock_sim` and `DISTLOCK_SIM_PLANT` names it. In every other
//! build [`planted`] is `false` and compiles away.

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

#!/usr/bin/env bash
# The deterministic simulation (crates/distlock-sim, docs/reliability.md "Deterministic
# simulation"): distlock's ZooKeeper recipes, the vendored client and the embedded server on
# turmoil's simulated network and clock.
#
#   scripts/sim.sh [TEST_FILTER] [libtest args]
#
# Environment: DISTLOCK_SIM_SEEDS=N (schedules per test), DISTLOCK_SIM_SEED=S (one schedule,
# with its trace hash), DISTLOCK_SIM_PLANT=NAME (a planted defect), DISTLOCK_SIM_THREADS=N.
#
# Built with `--cfg distlock_sim` (the simulation's sockets and clock; never a shipped build) and
# `--cfg tokio_unstable` (seeded runtimes: tokio::select! draws from them), in a target directory
# of its own so that these flags never mix with the ordinary build's.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg distlock_sim --cfg tokio_unstable"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/sim"
exec cargo test --release -p distlock-sim --test simulation -- --nocapture --test-threads 1 "$@"

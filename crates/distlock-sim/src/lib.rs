//! distlock's deterministic simulation lives in `tests/simulation.rs` (run it with
//! `scripts/sim.sh`; docs/reliability.md, "Deterministic simulation"). This library is empty.

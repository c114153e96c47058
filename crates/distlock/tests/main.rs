//! The library's tests, one binary with a module per part (built once, linked once):
//!
//! - on every backend, one named test per backend (`common::backends::on_every_backend!`):
//!   `conformance` (the lock contract), `names` (kinds and names: one rule), `election`, `schedule` (once-per-slot jobs, and ShedLock
//!   beside us), `observe` (metrics and spans);
//! - `fault_matrix`: every fault × every recipe, on every backend (the long matrices are
//!   `#[ignore]`d; scripts/test.sh runs them);
//! - one module per backend for what only it has: `zookeeper` (with `recipes`, `faults` under a
//!   fault proxy, `wire` counting writes, and `curator` beside Apache Curator), `redis` (and
//!   `redis_own_servers`: restarts, replicas, Sentinel, Redlock, a cluster), `postgres` (and
//!   `postgres_peer`, beside DistributedLock, and `postgres_shared`, the shared lock connections), `mysql`, `sqlite`, `etcd`.
//!
//! The servers are scripts/test.sh's (`DISTLOCK_TEST_*`); a missing one fails its tests unless
//! `DISTLOCK_TEST_SKIP_MISSING=1`. A test that needs a server set up otherwise starts its own.

mod common;

mod conformance;
mod curator;
mod election;
mod etcd;
mod fault_matrix;
mod faults;
mod mysql;
mod names;
mod nats;
mod observe;
mod postgres;
mod postgres_peer;
mod postgres_shared;
mod recipes;
mod redis;
mod redis_own_servers;
mod schedule;
mod secrets;
mod sqlite;
mod wire;
mod zookeeper;

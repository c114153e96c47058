//! The command line's tests, one binary with a module per part: `cli` (ZooKeeper: `exec`, `hold`,
//! `elect`, signals, the watchdog, the terminal), one `cli_<backend>` per other backend, `options`,
//! `prometheus` (the textfile and promtool), `top`, `bench_serve` (`serve`, and `bench`'s hand-off to
//! distlock-bench). The servers are scripts/test.sh's (`DISTLOCK_TEST_*`); a test that needs a
//! server set up otherwise starts its own.

mod common;

mod bench_serve;
mod cli;
mod cli_etcd;
mod cli_mysql;
mod cli_postgres;
mod cli_redis;
mod cli_sqlite;
mod flood;
mod hostile;
mod options;
mod prometheus;
mod top;

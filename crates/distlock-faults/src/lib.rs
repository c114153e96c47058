//! Fault injection and safety checking for tests of distlock's backends.
//!
//! The same harness serves every backend (ZooKeeper now; Redis, PostgreSQL and etcd later),
//! because it works below the protocol, on TCP connections and processes:
//!
//! - [`proxy`]: [`FaultProxy`], a TCP proxy placed between a client and one server. A test turns
//!   faults on and off while the client runs: delay, a silent partition ([`Fault::Blackhole`]),
//!   refused connections, a connection cut after some bytes, a reset of every connection, and a
//!   lost reply ([`FaultProxy::lose_next_reply`]: the server applied a request but its answer
//!   never arrives). It also counts client-to-server frames and writes, to prove pipelining.
//! - [`checker`]: [`FencedResource`], the "protected resource" of the tests. Clients record the
//!   intervals during which they believe they hold a lock and the writes they make with their
//!   fencing token; the [`Report`] lists overlapping holds and stale writes.
//! - [`process`]: [`pause`], [`resume`] and [`kill`] a server or client process (SIGSTOP,
//!   SIGCONT, SIGKILL), for stop-the-world pauses and crashes; and a test's own child
//!   ([`process::Running`], its end awaited with a bound) and scratch directory.
//! - [`watch`]: [`FreeWatch`], which records when the server first shows a lock free, so a test
//!   compares that with the holder's loss deadline instead of querying the server late.
//!
//! Faults are injected on loopback only: the proxy listens on 127.0.0.1 and needs no root, no
//! `tc` and no firewall rules, so tests can run anywhere and in parallel.
//!
//! # Examples
//!
//! ```
//! use distlock_faults::{FencedResource, Mode};
//!
//! let resource = FencedResource::new(true, 1);
//! let hold = resource.begin(1, Mode::Exclusive, 10);
//! assert!(resource.write(1, 10, 0));
//! resource.end(hold);
//! assert!(resource.report().is_clean());
//! ```

pub mod checker;
pub mod peers;
pub mod process;
pub mod proxy;
pub mod server;
pub mod watch;

pub use checker::{mono_now, FencedResource, Hold, HoldId, Mode, Report, WriteRecord};
pub use process::{kill, pause, resume};
pub use proxy::{zk_reply, ClientWrite, Fault, FaultProxy};
pub use server::OwnServer;
pub use watch::FreeWatch;

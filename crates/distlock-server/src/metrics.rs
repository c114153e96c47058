//! The server's figures in the Prometheus text format, and a small HTTP endpoint serving them.
//!
//! Where Apache ZooKeeper's Prometheus metrics provider has a metric of the same meaning, it has
//! the same name and type, so dashboards built for ZooKeeper read `distlock serve` unchanged:
//! `num_alive_connections`, `outstanding_requests`, `global_sessions`, `approximate_data_size`,
//! `packets_received`, `packets_sent`, `min_latency`/`avg_latency`/`max_latency` (gauges, ms),
//! and the summaries `fsynctime`, `snapshottime`, `readlatency`, `updatelatency` (ms) and
//! `sync_processor_batch_size`. ZooKeeper's three gauges named `*_count` (`znode_count`,
//! `watch_count`, `ephemerals_count`) are here `distlock_server_znodes`,
//! `distlock_server_watches` and `distlock_server_ephemerals`: Prometheus's own linter (`promtool
//! check metrics`) refuses a gauge whose name ends in `_count`, which it reserves for summaries
//! and histograms. The rest is ours, with the `distlock_server_` prefix, in base units.

use crate::proto::op;
use crate::server::Shared;
use std::fmt::Write as _;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Most `/metrics` connections served at once.
pub const METRICS_CONNECTIONS: usize = 16;

/// A handle on a server's figures.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() -> std::io::Result<()> {
/// let server = distlock_server::Server::open(Default::default())?;
/// let text = server.metrics().render();
/// assert!(text.contains("distlock_server_znodes"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Metrics {
    state: Shared,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The name of a request opcode, as ZooKeeper's `OpCode` calls it.
fn op_name(code: i32) -> &'static str {
    match code {
        op::CREATE => "create",
        op::DELETE => "delete",
        op::EXISTS => "exists",
        op::GET_DATA => "getData",
        op::SET_DATA => "setData",
        op::GET_ACL => "getACL",
        op::SET_ACL => "setACL",
        op::GET_CHILDREN => "getChildren",
        op::SYNC => "sync",
        op::PING => "ping",
        op::GET_CHILDREN2 => "getChildren2",
        op::CHECK => "check",
        op::MULTI => "multi",
        op::CREATE2 => "create2",
        op::RECONFIG => "reconfig",
        op::CHECK_WATCHES => "checkWatches",
        op::REMOVE_WATCHES => "removeWatches",
        op::CREATE_CONTAINER => "createContainer",
        op::DELETE_CONTAINER => "deleteContainer",
        op::CREATE_TTL => "createTTL",
        op::MULTI_READ => "multiRead",
        op::AUTH => "auth",
        op::SET_WATCHES => "setWatches",
        op::SASL => "sasl",
        op::GET_EPHEMERALS => "getEphemerals",
        op::GET_ALL_CHILDREN_NUMBER => "getAllChildrenNumber",
        op::SET_WATCHES2 => "setWatches2",
        op::ADD_WATCH => "addWatch",
        op::WHO_AM_I => "whoAmI",
        op::CLOSE_SESSION => "closeSession",
        _ => "other",
    }
}

/// Whether a request of `code` changes the tree (ZooKeeper's `updatelatency`, else `readlatency`).
fn is_update(code: i32) -> bool {
    matches!(
        code,
        op::CREATE
            | op::DELETE
            | op::SET_DATA
            | op::SET_ACL
            | op::MULTI
            | op::CREATE2
            | op::CREATE_CONTAINER
            | op::DELETE_CONTAINER
            | op::CREATE_TTL
            | op::CLOSE_SESSION
    )
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.head(name, kind, help);
        let _ = writeln!(self.0, "{name} {value}");
    }
    /// A summary with no quantiles: its count and sum.
    fn summary(&mut self, name: &str, help: &str, count: u64, sum: impl std::fmt::Display) {
        self.head(name, "summary", help);
        let _ = writeln!(self.0, "{name}_sum {sum}\n{name}_count {count}");
    }
}

impl Metrics {
    pub(crate) fn new(state: Shared) -> Metrics {
        Metrics { state }
    }

    /// The exposition, in the Prometheus text format (version 0.0.4).
    pub fn render(&self) -> String {
        let s = self.state.lock().unwrap();
        let c = s.counters.clone();
        let f = s.figures();
        let snapshots = s.persist.as_ref().map(|p| p.snapshot_times());
        let zxid = s.zxid;
        drop(s);
        let mut o = Out(String::new());
        // ZooKeeper's names.
        o.one("num_alive_connections", "gauge", "Connections with a session, now.", f.alive);
        o.one(
            "outstanding_requests",
            "gauge",
            "Replies waiting for their transactions to reach the disk.",
            f.outstanding,
        );
        o.one("global_sessions", "gauge", "Sessions the server keeps, connected or not.", f.sessions);
        o.one("approximate_data_size", "gauge", "Bytes of node data held.", f.data_size);
        o.one("packets_received", "gauge", "Requests received since the start.", c.received);
        o.one("packets_sent", "gauge", "Replies and events sent since the start.", c.sent);
        let (min, avg, max) = c.latency_ms();
        o.one("min_latency", "gauge", "Shortest request time under the state, ms.", min);
        o.one("avg_latency", "gauge", "Mean request time under the state, ms.", avg);
        o.one("max_latency", "gauge", "Longest request time under the state, ms.", max);
        o.summary(
            "fsynctime",
            "Time of each fsync of the transaction log, ms.",
            c.fsyncs,
            c.fsync_sum_us as f64 / 1000.0,
        );
        let (snaps, snap_us) = snapshots.unwrap_or((0, 0));
        o.summary("snapshottime", "Time to write each snapshot, ms.", snaps, snap_us as f64 / 1000.0);
        o.summary(
            "sync_processor_batch_size",
            "Transactions made durable by each fsync (the group commit's batch).",
            c.fsyncs,
            c.fsync_batched,
        );
        let (mut reads, mut updates) = ((0u64, 0u64), (0u64, 0u64));
        for (code, (n, us)) in c.ops.iter().filter(|(code, _)| **code != op::PING) {
            let t = if is_update(*code) { &mut updates } else { &mut reads };
            t.0 += n;
            t.1 += us;
        }
        o.summary(
            "readlatency",
            "Time of each read request (pings aside) under the state, ms.",
            reads.0,
            reads.1 as f64 / 1000.0,
        );
        o.summary(
            "updatelatency",
            "Time of each write request under the state, ms.",
            updates.0,
            updates.1 as f64 / 1000.0,
        );
        // Ours.
        o.one("distlock_server_znodes", "gauge", "Nodes in the tree (ZooKeeper: znode_count).", f.znodes);
        o.one("distlock_server_watches", "gauge", "Watches set (ZooKeeper: watch_count).", f.watches);
        o.one(
            "distlock_server_watch_path_bytes",
            "gauge",
            "Bytes of the paths watches are set on (against max_watch_bytes).",
            f.watch_bytes,
        );
        o.one("distlock_server_ephemerals", "gauge", "Ephemeral nodes (ZooKeeper: ephemerals_count).", f.ephemerals);
        o.one("distlock_server_last_zxid", "gauge", "The last transaction id.", zxid);
        o.one(
            "distlock_server_connections_accepted_total",
            "counter",
            "Client connections accepted since the start.",
            c.connections_accepted,
        );
        o.head("distlock_server_requests_total", "counter", "Requests handled since the start, by operation.");
        for (code, (n, _)) in &c.ops {
            let _ = writeln!(o.0, "distlock_server_requests_total{{op=\"{}\"}} {n}", op_name(*code));
        }
        o.head("distlock_server_request_seconds", "summary", "Time of each request under the state, by operation.");
        for (code, (n, us)) in &c.ops {
            let name = op_name(*code);
            let _ = writeln!(o.0, "distlock_server_request_seconds_sum{{op=\"{name}\"}} {}", *us as f64 / 1e6);
            let _ = writeln!(o.0, "distlock_server_request_seconds_count{{op=\"{name}\"}} {n}");
        }
        o.one(
            "distlock_server_fsync_seconds_max",
            "gauge",
            "Longest fsync of the transaction log since the start.",
            c.fsync_max_us as f64 / 1e6,
        );
        o.one("process_open_fds", "gauge", "Open file descriptors.", crate::server::open_files());
        o.one("process_max_fds", "gauge", "Limit on open file descriptors.", crate::server::max_open_files());
        o.0
    }

    /// Serves `GET /metrics` on `listener` until `shutdown` resolves, to loopback `Host` names
    /// only ([`Metrics::serve_with`] with `allow_remote` false).
    pub async fn serve(self, listener: TcpListener, shutdown: impl std::future::Future<Output = ()>) {
        self.serve_with(listener, false, shutdown).await
    }

    /// Serves `GET /metrics` on `listener` until `shutdown` resolves, as [`crate::http::Gate`]
    /// allows (any `Host` with `allow_remote`). Any other path is 404; a request that does not
    /// arrive whole within 5 s, or is larger than 8 KiB, is dropped, as is a reply not taken
    /// within 5 s; at most `METRICS_CONNECTIONS` (16) are served at once (more wait to be
    /// accepted), so scrapers cannot use up the server's file descriptors.
    pub async fn serve_with(
        self,
        listener: TcpListener,
        allow_remote: bool,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS));
        let Ok(bound) = listener.local_addr() else { return };
        let gate = crate::http::Gate { bound, allow_remote };
        loop {
            let slot = tokio::select! {
                _ = &mut shutdown => return,
                slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            let (mut socket, _) = tokio::select! {
                _ = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, most likely: wait instead of spinning.
                        tracing::warn!(error = %e, "metrics: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let metrics = self.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let Ok(Ok(head)) = tokio::time::timeout(Duration::from_secs(5), read_head(&mut socket)).await else {
                    return;
                };
                let reply = metrics.answer(&gate, &head);
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    let _ = socket.write_all(reply.as_bytes()).await;
                    let _ = socket.shutdown().await;
                })
                .await;
            });
        }
    }

    /// The reply to the request in `head`.
    fn answer(&self, gate: &crate::http::Gate, head: &str) -> String {
        use crate::http::reply;
        let request = match gate.judge(head) {
            Ok(r) => r,
            Err(refused) => return refused,
        };
        match request.path.as_str() {
            "/metrics" => {
                reply("200 OK", "text/plain; version=0.0.4; charset=utf-8", &self.render(), request.head_only, "")
            }
            _ => {
                reply("404 Not Found", "text/plain; charset=utf-8", "not found: try /metrics\n", request.head_only, "")
            }
        }
    }
}

/// Reads an HTTP request head (up to the blank line), at most 8 KiB.
async fn read_head(socket: &mut tokio::net::TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        if buf.len() > 8 << 10 {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_has_its_zookeeper_name() {
        assert_eq!(op_name(op::CREATE2), "create2");
        assert_eq!(op_name(op::GET_CHILDREN2), "getChildren2");
        assert_eq!(op_name(12345), "other");
        assert!(is_update(op::MULTI) && !is_update(op::EXISTS));
    }
}

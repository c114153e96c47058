//! What connections send: a bounded outbox per connection, and the gate that holds back every
//! reply and event while the transactions it may reveal are not yet on disk.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What a connection task sends to its socket.
#[derive(Debug)]
pub enum Outgoing {
    Frame(Vec<u8>),
    Close(String),
}

/// What a connection has to send: frames and a close, with a bound on the bytes not yet written.
/// Past the bound the connection is closed (at once, not after the queue drains): a client that
/// does not read its replies cannot grow the server's memory.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Outgoing>,
    queued: Arc<AtomicUsize>,
    limit: usize,
    /// Woken when the bound is passed; the writer stops at once.
    overflow: Arc<tokio::sync::Notify>,
}

/// The writer's side of an [`Outbox`].
pub struct OutboxReader {
    pub rx: mpsc::UnboundedReceiver<Outgoing>,
    queued: Arc<AtomicUsize>,
    pub overflow: Arc<tokio::sync::Notify>,
}

impl Outbox {
    pub fn new(limit: usize) -> (Outbox, OutboxReader) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let overflow = Arc::new(tokio::sync::Notify::new());
        let reader = OutboxReader { rx, queued: queued.clone(), overflow: overflow.clone() };
        (Outbox { tx, queued, limit, overflow }, reader)
    }

    /// Queues `out`; false if the connection is gone or has just been cut for not reading.
    pub fn send(&self, out: Outgoing) -> bool {
        if let Outgoing::Frame(f) = &out {
            let before = self.queued.fetch_add(f.len(), Ordering::SeqCst);
            if before + f.len() > self.limit {
                self.queued.fetch_sub(f.len(), Ordering::SeqCst);
                tracing::warn!(
                    queued = before,
                    limit = self.limit,
                    "the client does not read its replies; disconnecting it"
                );
                self.overflow.notify_one();
                return false;
            }
        }
        self.tx.send(out).is_ok()
    }
}

impl OutboxReader {
    /// `n` bytes of frames were written to the socket.
    pub fn written(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Group commit's other half. Transactions are applied and written to the log at once, and the
/// log is fsynced afterwards, one fsync for every transaction written meanwhile (`State::sync`). Until a
/// transaction is durable, nothing that could reveal it leaves the server: every reply and event
/// queued after it (to any connection: a read of another session may show the change) waits
/// here, in order, and is released when the fsync covering it completes. So a client never sees
/// a write that a crash could still undo, exactly as when each transaction was fsynced alone.
#[derive(Default)]
pub struct Gate {
    /// Transactions written to the log (a count, not a zxid).
    appended: u64,
    /// Of those, how many are known to be on disk.
    durable: u64,
    held: VecDeque<(u64, Outbox, Outgoing)>,
}

impl Gate {
    /// A transaction was written to the log; with `durable` it needs no fsync of its own (the
    /// `never` policy), else it waits for [`Gate::durable_up_to`].
    pub fn appended(&mut self, durable: bool) {
        self.appended += 1;
        if durable && self.held.is_empty() {
            self.durable = self.appended;
        }
    }

    /// The count of appended transactions known to be on disk.
    pub fn durable_count(&self) -> u64 {
        self.durable
    }

    /// The count of appended transactions an fsync started now covers.
    pub fn appended_count(&self) -> u64 {
        self.appended
    }

    /// Sends `out` on `conn` now if nothing written is waiting for disk, else once it is there.
    pub fn send(&mut self, conn: &Outbox, out: Outgoing) -> bool {
        if self.held.is_empty() && self.durable >= self.appended {
            conn.send(out)
        } else {
            self.held.push_back((self.appended, conn.clone(), out));
            true
        }
    }

    /// The first `n` transactions are on disk: releases what waited for them.
    pub fn durable_up_to(&mut self, n: u64) {
        self.durable = self.durable.max(n);
        while self.held.front().is_some_and(|(needs, _, _)| *needs <= self.durable) {
            if let Some((_, conn, out)) = self.held.pop_front() {
                conn.send(out);
            }
        }
    }

    /// Whether every transaction written is on disk.
    pub fn is_durable(&self) -> bool {
        self.durable >= self.appended
    }

    /// Replies and events waiting for the disk.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(r: &mut OutboxReader) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Ok(Outgoing::Frame(f)) = r.rx.try_recv() {
            out.push(f);
        }
        out
    }

    #[test]
    fn nothing_passes_a_transaction_not_yet_on_disk() {
        let (conn, mut rx) = Outbox::new(usize::MAX);
        let mut gate = Gate::default();
        gate.send(&conn, Outgoing::Frame(vec![1]));
        assert_eq!(frames(&mut rx), vec![vec![1]], "nothing pending: straight through");
        gate.appended(false);
        gate.send(&conn, Outgoing::Frame(vec![2]));
        gate.appended(false);
        gate.send(&conn, Outgoing::Frame(vec![3]));
        assert!(frames(&mut rx).is_empty());
        gate.durable_up_to(1);
        assert_eq!(frames(&mut rx), vec![vec![2]]);
        // A write that needs no fsync does not overtake what waits.
        gate.appended(true);
        gate.send(&conn, Outgoing::Frame(vec![4]));
        assert!(frames(&mut rx).is_empty());
        gate.durable_up_to(3);
        assert_eq!(frames(&mut rx), vec![vec![3], vec![4]]);
        gate.send(&conn, Outgoing::Frame(vec![5]));
        assert_eq!(frames(&mut rx), vec![vec![5]]);
    }
}

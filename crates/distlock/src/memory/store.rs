//! The in-process store: every lock's holders and queue, the elections' announcements and the
//! jobs' rows, under one mutex, with a change counter that waiters and watchers follow. Times
//! are tokio's (`Instant`), so a paused clock drives every lease.

use crate::contract::{JobLock, Kind, Run};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex as StdMutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// One store, shared by the clients of its name.
#[derive(Debug)]
pub(crate) struct Store {
    /// The store's birth on tokio's clock and on the wall clock: its time for jobs is the wall
    /// clock at birth moved on by tokio's.
    born: Instant,
    born_ms: i64,
    state: StdMutex<State>,
    /// Counts changes; waiters and watchers wake on it.
    changes: watch::Sender<u64>,
}

/// Everything the store keeps.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) locks: BTreeMap<String, LockRow>,
    /// An election's announced leader: the lock token it was announced with, and its value.
    pub(crate) announced: HashMap<String, (u64, String)>,
    /// A job's lock row and run record, each with its version.
    pub(crate) jobs: HashMap<String, JobRow>,
    /// The last id handed out (holders and versions).
    last_id: u64,
}

/// A job's rows, each with the version it was written at.
#[derive(Debug, Default, Clone)]
pub(crate) struct JobRow {
    pub(crate) lock: Option<(JobLock, u64)>,
    pub(crate) run: Option<(Run, u64)>,
}

/// One lock: who holds it, who waits (first come first served), and its last token.
#[derive(Debug, Default)]
pub(crate) struct LockRow {
    pub(crate) last_token: u64,
    pub(crate) holders: Vec<Entry>,
    pub(crate) queue: VecDeque<Entry>,
}

/// A holder or a waiter.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) kind: Kind,
    /// When it was granted (holders) or queued (waiters).
    pub(crate) since: Instant,
    /// A holder's lease end (waiters: unused).
    pub(crate) until: Instant,
    pub(crate) lease: Duration,
    pub(crate) token: u64,
}

impl Store {
    pub(crate) fn new() -> Store {
        let born_ms = crate::schedule::epoch_ms(std::time::SystemTime::now());
        Store { born: Instant::now(), born_ms, state: StdMutex::default(), changes: watch::channel(0).0 }
    }

    /// The store's time in milliseconds since the Unix epoch (for jobs).
    pub(crate) fn now_ms(&self) -> i64 {
        self.born_ms + self.born.elapsed().as_millis() as i64
    }

    /// Reads the state at tokio's `now`.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&State, Instant) -> T) -> T {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&state, Instant::now())
    }

    /// Changes the state at tokio's `now`; waiters and watchers are woken after.
    pub(crate) fn change<T>(&self, f: impl FnOnce(&mut State, Instant) -> T) -> T {
        let out = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut state, Instant::now())
        };
        self.changes.send_modify(|n| *n += 1);
        out
    }

    /// A receiver that sees every later change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

impl State {
    /// A new id, unique in the store.
    pub(crate) fn next_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }
}

impl LockRow {
    /// Drops the holders whose lease ended by `now`, and grants the waiters at the head of the
    /// queue that fit, in order (none overtakes another).
    pub(crate) fn settle(&mut self, now: Instant) {
        self.holders.retain(|h| h.until > now);
        while let Some(next) = self.queue.front() {
            if !self.fits(next.kind) {
                break;
            }
            let next = self.queue.pop_front().expect("the front is there");
            self.grant(next, now);
        }
        // Most locks are held with nobody waiting: their rows keep no room for waiters.
        if self.queue.is_empty() {
            self.queue.shrink_to_fit();
        }
    }

    /// `Ok` unless the name is in use as the other kind (a semaphore, or a mutex or read/write
    /// lock), or `kind` is a semaphore's permit with a count other than the one in use.
    pub(crate) fn check_permits(&self, name: &str, kind: Kind) -> crate::Result<()> {
        // The contract's rule: a semaphore and a mutex or read/write lock cannot share a name.
        let permits = |k: Kind| matches!(k, Kind::Permits(_));
        let entries = || self.holders.iter().chain(&self.queue);
        if let Some(other) = entries().find(|e| permits(e.kind) != permits(kind)) {
            return Err(crate::Error::KindConflict {
                lock: name.to_string(),
                in_use: if permits(other.kind) { "a semaphore".into() } else { other.kind.to_string() },
                wanted: kind.to_string(),
            });
        }
        let Kind::Permits(n) = kind else { return Ok(()) };
        let other = entries().find_map(|e| match e.kind {
            Kind::Permits(m) if m != n => Some(m),
            _ => None,
        });
        match other {
            Some(m) => Err(crate::Error::InvalidArgument {
                what: "permit count",
                reason: format!("the semaphore {name} is in use with {m} permits, not {n}"),
            }),
            None => Ok(()),
        }
    }

    /// Whether a holder of `kind` can join the holders now.
    pub(crate) fn fits(&self, kind: Kind) -> bool {
        match kind {
            Kind::Mutex | Kind::Write => self.holders.is_empty(),
            Kind::Read => self.holders.iter().all(|h| h.kind == Kind::Read),
            Kind::Permits(n) => {
                self.holders.iter().all(|h| matches!(h.kind, Kind::Permits(_))) && self.holders.len() < n as usize
            }
        }
    }

    /// Makes `entry` a holder from `now`, with the next token.
    pub(crate) fn grant(&mut self, mut entry: Entry, now: Instant) {
        self.last_token += 1;
        entry.token = self.last_token;
        entry.since = now;
        entry.until = now + entry.lease;
        // Room for one holder (not the four a first push makes): a mutex never has more.
        if self.holders.capacity() == 0 {
            self.holders.reserve_exact(1);
        }
        self.holders.push(entry);
    }

    /// The holder `id`, if it holds.
    pub(crate) fn holder(&self, id: &str) -> Option<&Entry> {
        self.holders.iter().find(|h| h.id == id)
    }

    /// Takes `id` out, holding or waiting; whether it held. The queue is settled after.
    pub(crate) fn remove(&mut self, id: &str, now: Instant) -> bool {
        let held = self.holders.iter().any(|h| h.id == id && h.until > now);
        self.holders.retain(|h| h.id != id);
        self.queue.retain(|w| w.id != id);
        self.settle(now);
        held
    }

    /// Moves `id`'s lease on from `now`; false if it no longer holds (its lease ran out).
    pub(crate) fn renew(&mut self, id: &str, now: Instant) -> bool {
        self.settle(now);
        match self.holders.iter_mut().find(|h| h.id == id) {
            Some(h) => {
                h.until = now + h.lease;
                true
            }
            None => false,
        }
    }

    /// The earliest lease end among the holders (a waiter wakes then to look again).
    pub(crate) fn next_end(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.until).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, kind: Kind) -> Entry {
        let now = Instant::now();
        Entry { id: id.into(), kind, since: now, until: now, lease: Duration::from_secs(10), token: 0 }
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_is_served_in_order_and_kinds_fit_as_they_should() {
        let mut row = LockRow::default();
        let now = Instant::now();
        for (id, kind) in [("r1", Kind::Read), ("r2", Kind::Read), ("w", Kind::Write), ("r3", Kind::Read)] {
            row.queue.push_back(entry(id, kind));
        }
        row.settle(now);
        // The readers at the head share; the writer waits, and the reader behind it too.
        let holders: Vec<_> = row.holders.iter().map(|h| (h.id.as_str(), h.token)).collect();
        assert_eq!(holders, [("r1", 1), ("r2", 2)]);
        assert!(row.remove("r1", now) && row.remove("r2", now));
        assert_eq!(row.holder("w").map(|h| h.token), Some(3));
        assert!(row.holder("r3").is_none());
        // A lease that runs out frees the lock for the next.
        row.settle(now + Duration::from_secs(10));
        assert_eq!(row.holder("r3").map(|h| h.token), Some(4));
        assert!(!row.renew("w", now + Duration::from_secs(10)));

        let mut sem = LockRow::default();
        for id in ["a", "b", "c"] {
            sem.queue.push_back(entry(id, Kind::Permits(2)));
        }
        sem.settle(now);
        assert_eq!(sem.holders.len(), 2);
        assert!(!sem.fits(Kind::Mutex));
    }
}

//! The watchdog: one task per client renews every hold of that client (Redis's locks,
//! PostgreSQL's), each through the one renewal step ([`Lease::renew_once`]) when it is due.
//!
//! A task per hold would cost a spawn (and, on a multi-thread runtime, usually a wake-up of
//! another worker) for every acquire, although most holds end long before their first renewal:
//! measured on PostgreSQL, 0.58 of the server's floor with a task per hold against 0.82 without.
//! Here a hold is an entry in a schedule ordered by due time; ending it removes the entry. The
//! driving task sleeps until the first entry is due, and never longer than the client's period,
//! so a new entry (due a period from now) never needs to wake it; only an earlier one (a retry
//! after a failed renewal) does. Each due renewal runs in a task of its own, so a slow server
//! delays no other hold's renewal.
//!
//! When the client has reason to think the server may have lost its locks (Redis: its connection
//! was re-established, the server behind it restarted, Sentinel named another master), every hold
//! is renewed at once ([`Watchdog::check_now`]) instead of at its turn, so that a lost lock is
//! reported within a round trip rather than up to a period later.

use crate::contract::BoxFuture;
use crate::lease::{Lease, Renewal};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The renewal schedule of one client.
#[derive(Debug)]
pub(crate) struct Watchdog {
    schedule: StdMutex<Schedule>,
    wake: Arc<Notify>,
    /// The longest the driving task sleeps: the renewal period of the client's holds.
    period: Duration,
}

#[derive(Debug, Default)]
struct Schedule {
    due: BTreeMap<(Instant, u64), Due>,
    next_id: u64,
    /// When the driving task will look next.
    wake_at: Option<Instant>,
    /// The driving task (started again if it ended: its runtime may have shut down).
    driver: Option<tokio::task::JoinHandle<()>>,
    /// When every hold is to be renewed, whatever its turn (set by [`Watchdog::check_now`]).
    all_at: Option<Instant>,
    /// When that last happened: such sweeps come at most every [`SWEEP_GAP`].
    all_last: Option<Instant>,
}

/// The shortest time between two sweeps that renew every hold at once, so that a connection
/// that keeps failing and recovering cannot make the renewals run back to back.
const SWEEP_GAP: Duration = Duration::from_millis(100);

/// Where a hold's entry is in the schedule (to take it out again).
type Slot = (Instant, u64);

/// One renewal of a hold: a backend's request that the server still has it as ours.
pub(crate) trait Check: Send + Sync + 'static {
    fn renew(&self) -> BoxFuture<'static, Renewal>;
}

impl<F: Fn() -> BoxFuture<'static, Renewal> + Send + Sync + 'static> Check for F {
    fn renew(&self) -> BoxFuture<'static, Renewal> {
        self()
    }
}

/// A hold in the schedule.
struct Due {
    lease: Arc<Lease>,
    name: String,
    period: Duration,
    check: Arc<dyn Check>,
    entry: Arc<Entry>,
}

impl std::fmt::Debug for Due {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Due").field("name", &self.name).finish()
    }
}

#[derive(Debug, Default)]
struct Entry {
    /// The hold's place in the schedule (`None` while a renewal runs).
    slot: StdMutex<Option<Slot>>,
    /// Ended: never renewed again.
    ended: AtomicBool,
}

/// A hold's place in its client's renewals: renewed until this is dropped (at the release).
#[derive(Debug)]
pub(crate) struct Ticket {
    watchdog: Arc<Watchdog>,
    entry: Arc<Entry>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.entry.ended.store(true, Ordering::SeqCst);
        let slot = self.entry.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(slot) = slot {
            self.watchdog.cancel(slot);
        }
    }
}

impl Watchdog {
    /// The watchdog of a client whose holds are renewed every `period`.
    pub(crate) fn new(period: Duration) -> Watchdog {
        Watchdog { schedule: StdMutex::default(), wake: Arc::new(Notify::new()), period }
    }

    /// Renews `lease` (of the lock `name`) by `check` every period from now, and sooner after a
    /// failure, until the lease is lost or the ticket dropped.
    pub(crate) fn watch(self: &Arc<Self>, lease: Arc<Lease>, name: String, check: Arc<dyn Check>) -> Ticket {
        let entry = Arc::new(Entry::default());
        let due = Due { lease, name, period: self.period, check, entry: entry.clone() };
        let mut slot = entry.slot.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(self.schedule(Instant::now() + self.period, due));
        drop(slot);
        Ticket { watchdog: self.clone(), entry }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews `due` at `at`; returns its slot.
    fn schedule(self: &Arc<Self>, at: Instant, due: Due) -> Slot {
        let mut s = self.lock();
        s.next_id += 1;
        let slot = (at, s.next_id);
        s.due.insert(slot, due);
        let running = s.driver.as_ref().is_some_and(|d| !d.is_finished());
        match s.wake_at {
            _ if !running => {
                s.wake_at = Some(at);
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    s.driver = Some(runtime.spawn(drive(Arc::downgrade(self), self.wake.clone())));
                }
            }
            Some(w) if at >= w => {}
            _ => {
                s.wake_at = Some(at);
                self.wake.notify_one();
            }
        }
        slot
    }

    /// Takes a hold's entry out (it was released); nothing if it is being renewed right now.
    fn cancel(&self, slot: Slot) {
        self.lock().due.remove(&slot);
    }

    /// Renews every hold now (or, right after such a sweep, [`SWEEP_GAP`] after it), whenever its
    /// turn would have come: the server may have lost them. A renewal that finds its key gone
    /// reports the hold lost; one that fails is retried as usual.
    pub(crate) fn check_now(&self) {
        let mut s = self.lock();
        let running = s.driver.as_ref().is_some_and(|d| !d.is_finished());
        if s.due.is_empty() && !running {
            return; // nothing held
        }
        let now = Instant::now();
        let at = s.all_last.map_or(now, |last| (last + SWEEP_GAP).max(now));
        if s.all_at.is_some_and(|pending| pending <= at) {
            return; // a sweep is coming soon enough
        }
        s.all_at = Some(at);
        if running && s.wake_at.is_none_or(|w| at < w) {
            s.wake_at = Some(at);
            self.wake.notify_one();
        }
    }
}

/// One due renewal, through the one renewal step; the next one is scheduled unless the lease is
/// lost or the hold ended meanwhile.
async fn renew_once(watchdog: Arc<Watchdog>, due: Due, at: Instant) {
    if due.entry.ended.load(Ordering::SeqCst) {
        return;
    }
    let Some(next) = due.lease.renew_once(&due.name, due.period, at, due.check.renew()).await else { return };
    let entry = due.entry.clone();
    let mut slot = entry.slot.lock().unwrap_or_else(|e| e.into_inner());
    if !entry.ended.load(Ordering::SeqCst) {
        *slot = Some(watchdog.schedule(next, due));
    }
}

/// Runs due renewals until the client is gone.
async fn drive(watchdog: Weak<Watchdog>, wake: Arc<Notify>) {
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(w) = watchdog.upgrade() else { return };
        let now = Instant::now();
        let (ready, next) = {
            let mut s = w.lock();
            let ready = if s.all_at.is_some_and(|at| at <= now) {
                // A sweep: every hold, whatever its turn.
                s.all_at = None;
                s.all_last = Some(now);
                std::mem::take(&mut s.due)
            } else {
                let later = s.due.split_off(&(now, u64::MAX));
                std::mem::replace(&mut s.due, later)
            };
            let mut next = s.due.keys().next().map_or(now + w.period, |(at, _)| (*at).min(now + w.period));
            if let Some(at) = s.all_at {
                next = next.min(at);
            }
            s.wake_at = Some(next);
            (ready, next)
        };
        for ((at, _), due) in ready {
            tokio::spawn(renew_once(w.clone(), due, at));
        }
        drop(w);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = &mut notified => {}
        }
    }
}

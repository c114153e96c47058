//! The watchdog: one task per client renews every hold of that client, each every third of the
//! lease.
//!
//! A task per hold would cost a spawn (and, on a multi-thread runtime, usually a wake-up of
//! another worker) for every acquire, although most holds end long before their first renewal.
//! Here a hold is an entry in a schedule ordered by due time; releasing it removes the entry. The
//! driving task sleeps until the first entry is due, and never longer than a third of the lease,
//! so a new entry (due a third of a lease from now) never needs to wake it; only an earlier one
//! (a retry after a failed renewal) does. Each due renewal runs in a task of its own, so a slow
//! server delays no other hold's renewal.

use super::guard::{renew_once, Renewal};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The renewal schedule of one client.
#[derive(Debug)]
pub(crate) struct Watchdog {
    schedule: StdMutex<Schedule>,
    wake: Arc<Notify>,
    /// The longest the driving task sleeps: a third of the client's lease.
    period: Duration,
}

#[derive(Debug, Default)]
struct Schedule {
    due: BTreeMap<(Instant, u64), Renewal>,
    next_id: u64,
    /// When the driving task will look next.
    wake_at: Option<Instant>,
    /// The driving task (started again if it ended: its runtime may have shut down).
    driver: Option<tokio::task::JoinHandle<()>>,
}

/// Where a hold's entry is in the schedule (to take it out again).
pub(crate) type Slot = (Instant, u64);

impl Watchdog {
    pub(crate) fn new(lease: Duration) -> Watchdog {
        Watchdog { schedule: StdMutex::default(), wake: Arc::new(Notify::new()), period: lease / 3 }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews `renewal` at `at`; returns its slot.
    pub(crate) fn schedule(self: &Arc<Self>, at: Instant, renewal: Renewal) -> Slot {
        let mut s = self.lock();
        s.next_id += 1;
        let slot = (at, s.next_id);
        s.due.insert(slot, renewal);
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
    pub(crate) fn cancel(&self, slot: Slot) {
        self.lock().due.remove(&slot);
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
            let later = s.due.split_off(&(now, u64::MAX));
            let ready = std::mem::replace(&mut s.due, later);
            let next = s.due.keys().next().map_or(now + w.period, |(at, _)| (*at).min(now + w.period));
            s.wake_at = Some(next);
            (ready, next)
        };
        for (_, renewal) in ready {
            tokio::spawn(renew_once(w.clone(), renewal));
        }
        drop(w);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = &mut notified => {}
        }
    }
}

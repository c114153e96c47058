//! The watchdog: one task per client renews every hold of that client (Redis's locks,
//! PostgreSQL's, MariaDB's), each through the one renewal step ([`Lease::renew_sent_at`]) when
//! it is due.
//!
//! A task per hold would cost a spawn (and, on a multi-thread runtime, usually a wake-up of
//! another worker) for every acquire, although most holds end long before their first renewal:
//! measured on PostgreSQL, 0.58 of the server's floor with a task per hold against 0.82 without.
//! Here a hold is an entry in a schedule ordered by due time; ending it removes the entry. The
//! driving task sleeps until the first entry is due, and never longer than the client's period,
//! so a new entry (due a period from now) never needs to wake it; only an earlier one (a retry
//! after a failed renewal) does. The due renewals run in tasks of their own, so a slow server
//! delays no other renewal.
//!
//! A backend may renew several holds in one request ([`Check::renew_together`], up to
//! [`Check::TOGETHER`] of one [`Check::group`]; Redis: one script for up to 100 holds of one
//! server, or of one hash slot on a cluster). The default is one request per hold (PostgreSQL's
//! and MariaDB's pings of each hold's own connection). Each hold still goes through the one
//! renewal step with its own answer: renewed, lost for its own reason, or failed (a request that
//! failed fails every hold in it) and retried, lost at its own deadline. So that the holds of a
//! client go out together rather than each at its own phase, a watchdog that renews together
//! takes, whenever a hold's turn comes, every hold whose turn comes within the next period (each
//! then renewed at most a period after its last renewal, possibly sooner: a new hold's first
//! renewal may come at any time in its first period): after one period the client's holds are
//! renewed at one instant, in ⌈holds / TOGETHER⌉ requests per group. Retries keep their own
//! time (a failing request does not drag the others along), and go together too.
//!
//! When the client has reason to think the server may have lost its locks (Redis: its connection
//! was re-established, the server behind it restarted, Sentinel named another master), every hold
//! is renewed at once ([`Watchdog::check_now`]) instead of at its turn, so that a lost lock is
//! reported within a round trip rather than up to a period later.

use crate::contract::BoxFuture;
use crate::lease::{Lease, Next, Renewal};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The renewal schedule of one client, whose holds are renewed by checks of type `C`.
pub(crate) struct Watchdog<C: Check = Alone> {
    schedule: StdMutex<Schedule<C>>,
    wake: Arc<Notify>,
    /// The longest the driving task sleeps: the renewal period of the client's holds.
    period: Duration,
}

struct Schedule<C: Check> {
    due: BTreeMap<(Instant, u64), Due<C>>,
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

impl<C: Check> Default for Schedule<C> {
    fn default() -> Self {
        Schedule { due: BTreeMap::new(), next_id: 0, wake_at: None, driver: None, all_at: None, all_last: None }
    }
}

impl<C: Check> std::fmt::Debug for Watchdog<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog").field("period", &self.period).field("holds", &self.lock().due.len()).finish()
    }
}

/// The shortest time between two sweeps that renew every hold at once, so that a connection
/// that keeps failing and recovering cannot make the renewals run back to back.
const SWEEP_GAP: Duration = Duration::from_millis(100);

/// Where a hold's entry is in the schedule (to take it out again).
type Slot = (Instant, u64);

/// The renewal of a hold: a backend's request that the server still has it as ours.
pub(crate) trait Check: Send + Sync + Sized + 'static {
    /// What the holds renewed in one request share (Redis: the hash slot on a cluster; nothing
    /// on one server).
    type Group: std::hash::Hash + Eq + Send;

    /// At most this many holds in one request ([`renew_together`](Check::renew_together)); 1
    /// (the default): each hold is renewed alone, at its own time.
    const TOGETHER: usize = 1;

    /// This hold's group.
    fn group(&self) -> Self::Group;

    /// Renews this hold alone.
    fn renew(&self) -> BoxFuture<'static, Renewal>;

    /// Renews `checks` (at most [`TOGETHER`](Check::TOGETHER), all of one group, at least one)
    /// together: one answer per check, in their order. Like [`renew`](Check::renew), the future
    /// must send nothing until polled. The default renews each alone, side by side.
    fn renew_together(checks: &[&Self]) -> BoxFuture<'static, Vec<Renewal>> {
        let each: Vec<_> = checks.iter().map(|c| c.renew()).collect();
        Box::pin(futures::future::join_all(each))
    }

    /// The renewal step found this hold lost (its lock gone, or its deadline passed without a
    /// confirmed renewal): called once, when the watchdog stops renewing it, unless the hold
    /// ended first (SQLite: this process's next acquire of the lock need not wait for a
    /// release). The default does nothing.
    fn lost(&self) {}
}

/// A check renewed alone: a backend's renewal of one hold as a function (PostgreSQL's and
/// MariaDB's health checks of the hold's own connection).
pub(crate) struct Alone(Box<dyn Fn() -> BoxFuture<'static, Renewal> + Send + Sync>);

impl Alone {
    pub(crate) fn new(renew: impl Fn() -> BoxFuture<'static, Renewal> + Send + Sync + 'static) -> Alone {
        Alone(Box::new(renew))
    }
}

impl Check for Alone {
    type Group = ();

    fn group(&self) {}

    fn renew(&self) -> BoxFuture<'static, Renewal> {
        (self.0)()
    }
}

/// A hold in the schedule.
struct Due<C> {
    lease: Arc<Lease>,
    name: String,
    period: Duration,
    check: Arc<C>,
    entry: Arc<Entry>,
    /// Its last renewal failed: this turn is a retry.
    retry: bool,
}

impl<C> std::fmt::Debug for Due<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Due").field("name", &self.name).field("retry", &self.retry).finish()
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
    watchdog: Arc<dyn Cancel>,
    entry: Arc<Entry>,
}

/// A watchdog, whatever its checks, as a ticket sees it.
trait Cancel: Send + Sync + std::fmt::Debug {
    /// Takes a hold's entry out (it was released); nothing if it is being renewed right now.
    fn cancel(&self, slot: Slot);
}

impl<C: Check> Cancel for Watchdog<C> {
    fn cancel(&self, slot: Slot) {
        self.lock().due.remove(&slot);
    }
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

impl<C: Check> Watchdog<C> {
    /// The watchdog of a client whose holds are renewed every `period`.
    pub(crate) fn new(period: Duration) -> Watchdog<C> {
        Watchdog { schedule: StdMutex::default(), wake: Arc::new(Notify::new()), period }
    }

    /// Renews `lease` (of the lock `name`) by `check` every period from now, and sooner after a
    /// failure, until the lease is lost or the ticket dropped.
    pub(crate) fn watch(self: &Arc<Self>, lease: Arc<Lease>, name: String, check: C) -> Ticket {
        let entry = Arc::new(Entry::default());
        let due = Due { lease, name, period: self.period, check: Arc::new(check), entry: entry.clone(), retry: false };
        let mut slot = entry.slot.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(self.schedule(Instant::now() + self.period, due));
        drop(slot);
        Ticket { watchdog: self.clone(), entry }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule<C>> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews `due` at `at`; returns its slot.
    fn schedule(self: &Arc<Self>, at: Instant, due: Due<C>) -> Slot {
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

    /// Puts a renewed hold back in the schedule at its next turn, unless it ended meanwhile.
    fn reschedule(self: &Arc<Self>, mut due: Due<C>, next: Next) {
        let entry = due.entry.clone();
        let mut slot = entry.slot.lock().unwrap_or_else(|e| e.into_inner());
        if !entry.ended.load(Ordering::SeqCst) {
            due.retry = next.retry;
            *slot = Some(self.schedule(next.at, due));
        }
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

    /// The holds to renew now, taken out of the schedule: every one on a sweep; otherwise those
    /// due, and, for checks that renew together, also every hold whose turn comes within the
    /// next period when a hold's turn (not a retry) has come, or every retry due within half a
    /// retry's pause when only retries are due (the holds of one failed request are due again
    /// microseconds apart). Each with when it was due.
    fn take_ready(s: &mut Schedule<C>, now: Instant, period: Duration) -> Vec<(Due<C>, Instant)> {
        let taken = if s.all_at.is_some_and(|at| at <= now) {
            // A sweep: every hold, whatever its turn.
            s.all_at = None;
            s.all_last = Some(now);
            std::mem::take(&mut s.due)
        } else if C::TOGETHER <= 1 {
            let later = s.due.split_off(&(now, u64::MAX));
            std::mem::replace(&mut s.due, later)
        } else {
            let turn = s.due.range(..=(now, u64::MAX)).any(|(_, d)| !d.retry);
            let (horizon, retries) = if turn { (now + period, false) } else { (now + crate::lease::RETRY / 2, true) };
            let slots: Vec<Slot> = s
                .due
                .range(..=(horizon, u64::MAX))
                .filter(|((at, _), d)| *at <= now || d.retry == retries)
                .map(|(slot, _)| *slot)
                .collect();
            slots.into_iter().filter_map(|slot| Some((slot, s.due.remove(&slot)?))).collect()
        };
        taken.into_iter().map(|((at, _), due)| (due, at)).collect()
    }
}

/// Renews `batch` (holds of one group, at most [`Check::TOGETHER`]) in one request, each through
/// the one renewal step with its own answer; each is scheduled again unless its lease is lost or
/// its hold ended meanwhile. `at` of each is when it was due (for the lag metric).
async fn renew_batch<C: Check>(watchdog: Arc<Watchdog<C>>, batch: Vec<(Due<C>, Instant)>) {
    let batch: Vec<(Due<C>, Instant)> =
        batch.into_iter().filter(|(d, _)| !d.entry.ended.load(Ordering::SeqCst)).collect();
    if batch.is_empty() {
        return;
    }
    // Read before the request is made: it cannot reach the server earlier. A hold whose deadline
    // has passed is lost without asking (the renewal step says so), and is left out of it.
    let sent = Instant::now();
    let asked: Vec<&C> = batch.iter().filter(|(d, _)| d.lease.deadline() > sent).map(|(d, _)| &*d.check).collect();
    let request = if asked.is_empty() { None } else { Some(C::renew_together(&asked)) };
    let mut answers = Vec::with_capacity(batch.len());
    let mut send_to = Vec::with_capacity(batch.len());
    for (due, _) in &batch {
        let (tx, rx) = tokio::sync::oneshot::channel::<Renewal>();
        if due.lease.deadline() > sent {
            send_to.push(tx);
        }
        // No answer (a request that gave fewer than asked for): a failure.
        answers.push(async move { rx.await.unwrap_or(Renewal::Failed) });
    }
    // The request itself ends by the last deadline it serves: a request stuck behind a silent
    // server (a ping holding a shared connection) must not outlive every hold it was for.
    let until = batch.iter().map(|(due, _)| due.lease.deadline()).max().unwrap_or(sent);
    let holds = futures::future::join_all(batch.into_iter().zip(answers).map(|((due, at), answer)| {
        let watchdog = watchdog.clone();
        async move {
            match due.lease.renew_sent_at(&due.name, due.period, at, sent, answer).await {
                Some(next) => watchdog.reschedule(due, next),
                None if !due.entry.ended.load(Ordering::SeqCst) => due.check.lost(),
                None => {}
            }
        }
    }));
    let ask = async move {
        if let Some(request) = request {
            if let Ok(renewals) = tokio::time::timeout_at(until, request).await {
                for (tx, renewal) in send_to.into_iter().zip(renewals) {
                    let _ = tx.send(renewal);
                }
            }
        }
    };
    futures::future::join(holds, ask).await;
}

/// Runs due renewals until the client is gone.
async fn drive<C: Check>(watchdog: Weak<Watchdog<C>>, wake: Arc<Notify>) {
    loop {
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(w) = watchdog.upgrade() else { return };
        let now = Instant::now();
        let (ready, next) = {
            let mut s = w.lock();
            let ready = Watchdog::<C>::take_ready(&mut s, now, w.period);
            let mut next = s.due.keys().next().map_or(now + w.period, |(at, _)| (*at).min(now + w.period));
            if let Some(at) = s.all_at {
                next = next.min(at);
            }
            s.wake_at = Some(next);
            (ready, next)
        };
        // By group, in requests of at most `TOGETHER` holds (the earliest due first).
        let mut groups: HashMap<C::Group, Vec<(Due<C>, Instant)>> = HashMap::new();
        for (due, at) in ready {
            groups.entry(due.check.group()).or_default().push((due, at));
        }
        for (_, mut holds) in groups {
            while !holds.is_empty() {
                let rest = holds.split_off(holds.len().min(C::TOGETHER.max(1)));
                tokio::spawn(renew_batch(w.clone(), std::mem::replace(&mut holds, rest)));
            }
        }
        drop(w);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = &mut notified => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const LEASE: Duration = Duration::from_secs(3);
    const PERIOD: Duration = Duration::from_secs(1);

    /// Renewed 100 at a time; counts its requests and the holds in them, and fails while `fail`.
    struct Counted {
        requests: Arc<AtomicUsize>,
        renewed: Arc<AtomicUsize>,
        fail: Arc<AtomicBool>,
    }

    impl Check for Counted {
        type Group = ();
        const TOGETHER: usize = 100;

        fn group(&self) {}

        fn renew(&self) -> BoxFuture<'static, Renewal> {
            let together = Self::renew_together(&[self]);
            Box::pin(async move { together.await[0] })
        }

        fn renew_together(checks: &[&Self]) -> BoxFuture<'static, Vec<Renewal>> {
            let (c, n) = (checks[0], checks.len());
            let (requests, renewed, fail) = (c.requests.clone(), c.renewed.clone(), c.fail.clone());
            Box::pin(async move {
                requests.fetch_add(1, Ordering::SeqCst);
                renewed.fetch_add(n, Ordering::SeqCst);
                vec![if fail.load(Ordering::SeqCst) { Renewal::Failed } else { Renewal::Renewed }; n]
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn holds_taken_at_their_own_times_are_renewed_together_a_hundred_to_a_request() {
        let watchdog: Arc<Watchdog<Counted>> = Arc::new(Watchdog::new(PERIOD));
        let (requests, renewed, fail) = (Arc::default(), Arc::default(), Arc::<AtomicBool>::default());
        let mut held = Vec::new();
        // 250 holds taken over a period and a half, each at its own time.
        for i in 0..250 {
            let lease = Arc::new(Lease::new(Instant::now(), LEASE, "test"));
            let check = Counted { requests: Arc::clone(&requests), renewed: Arc::clone(&renewed), fail: fail.clone() };
            held.push((watchdog.watch(lease.clone(), format!("h{i}"), check), lease));
            tokio::time::sleep(Duration::from_millis(6)).await;
        }
        // From the first turn after the last grant on, every hold goes with the others.
        tokio::time::sleep(PERIOD * 2).await;
        let (r0, n0) = (requests.load(Ordering::SeqCst), renewed.load(Ordering::SeqCst));
        tokio::time::sleep(PERIOD * 5).await;
        let (r, n) = (requests.load(Ordering::SeqCst) - r0, renewed.load(Ordering::SeqCst) - n0);
        // Five rounds in five periods (six if one falls on both edges), each of 3 requests.
        let rounds = n / 250;
        assert!(n % 250 == 0 && (5..=6).contains(&rounds), "{n} renewals of 250 holds in five periods");
        assert_eq!(r, 3 * rounds, "{r} requests for {rounds} rounds of 250 holds");
        assert!(held.iter().all(|(_, l)| l.state("h") == crate::LockState::Held));

        // Failed rounds: every hold retried together (not each at its own time), in time.
        fail.store(true, Ordering::SeqCst);
        let (r0, n0) = (requests.load(Ordering::SeqCst), renewed.load(Ordering::SeqCst));
        tokio::time::sleep(PERIOD + crate::lease::RETRY * 2).await;
        fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(PERIOD * 3).await;
        let (r, n) = (requests.load(Ordering::SeqCst) - r0, renewed.load(Ordering::SeqCst) - n0);
        // Each round, failed or not, and each retry of a failed one: 250 holds in 3 requests.
        assert!(n >= 250 * 4 && n == r / 3 * 250, "{n} renewals in {r} requests: 250 holds in 3 requests each time");
        assert!(held.iter().all(|(_, l)| l.state("h") == crate::LockState::Held), "retried in time");

        // An ended hold is renewed no more.
        drop(held.split_off(50));
        let n0 = renewed.load(Ordering::SeqCst);
        tokio::time::sleep(PERIOD * 2).await;
        let n = renewed.load(Ordering::SeqCst) - n0;
        assert!(n == 100 || n == 150, "{n} renewals in two periods of the 50 holds left");
    }
}

//! The lease every lease-bound guard keeps (Redis, PostgreSQL): its state, published to
//! watchers, and its deadline, moved on by confirmed renewals or health checks.
//!
//! The deadline is the send time of the last request the server confirmed, plus the lease, less a
//! drift margin: the server heard from us no earlier than we sent, so it cannot let the lock go
//! before then. At the deadline the state is `Lost(LeaseExpired)`, however late a watcher looks;
//! `Lost` is final.

use crate::{Error, LockState, LostReason, Result};
use std::sync::Mutex as StdMutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The safety margin taken off every lease of a server with no reporting delay (see
/// [`crate::lease_margin::margin`]).
pub(crate) fn drift(lease: Duration) -> Duration {
    crate::lease_margin::margin(lease, Duration::ZERO)
}

/// A lease-bound hold's lock name and lease: what its guard reads its name, deadline, state,
/// changes of state and loss from, written once. etcd's, MariaDB's, SQLite's, PostgreSQL's and
/// the in-process store's guards keep one in their hold and delegate to it, so each public guard
/// keeps methods of its own (no trait to import), as tokio's guards do.
#[derive(Debug)]
pub(crate) struct Leased {
    pub(crate) name: String,
    pub(crate) lease: std::sync::Arc<Lease>,
}

impl Leased {
    pub(crate) fn new(name: String, lease: std::sync::Arc<Lease>) -> Leased {
        Leased { name, lease }
    }

    /// The lock's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The lease's deadline, on the clock the guards report.
    pub(crate) fn lease_deadline(&self) -> std::time::Instant {
        self.lease.deadline().into_std()
    }

    /// The state now (`Lost` once the deadline has passed without a confirmed renewal).
    pub(crate) fn state(&self) -> LockState {
        self.lease.state(&self.name)
    }

    /// Every change of state, as a watch receiver.
    pub(crate) fn state_changes(&self) -> watch::Receiver<LockState> {
        self.lease.subscribe()
    }

    /// Resolves when the lease is lost.
    pub(crate) fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        self.lost_or(std::future::pending())
    }

    /// Resolves when the lease is lost, or with `also`'s reason (a backend's own sign of loss).
    pub(crate) fn lost_or<F>(&self, also: F) -> impl std::future::Future<Output = LostReason> + Send + 'static
    where
        F: std::future::Future<Output = LostReason> + Send + 'static,
    {
        Lease::lost(self.lease.clone(), self.name.clone(), also)
    }
}

/// The lease accessors of a public guard whose lease says all about its state (etcd's, MariaDB's,
/// SQLite's; PostgreSQL's also watches its connection, and writes its own): each a line over the
/// [`Leased`] that `$leased` reads from the guard `$g`.
macro_rules! leased_methods {
    (|$g:ident| $leased:expr) => {
        /// The instant after which the server may give the lock to someone else unless a renewal
        /// (a ping, an extension, a keep-alive) is confirmed first: the send time of the last
        /// confirmed request, plus the lease, less the drift margin. Stop work that needs the
        /// lock before it.
        pub fn lease_deadline(&self) -> std::time::Instant {
            let $g = self;
            $leased.lease_deadline()
        }

        /// The state now (`Lost` once the lease deadline has passed without a confirmed renewal).
        pub fn state(&self) -> $crate::LockState {
            let $g = self;
            $leased.state()
        }

        /// Every change of state, as a watch receiver.
        pub fn state_changes(&self) -> tokio::sync::watch::Receiver<$crate::LockState> {
            let $g = self;
            $leased.state_changes()
        }

        /// Resolves when the lock can no longer be trusted: the backend saw it go (the
        /// connection closed, our key deleted, the row taken over, the lease gone), or the lease
        /// deadline passed without a confirmed renewal.
        pub fn lost(&self) -> impl std::future::Future<Output = $crate::LostReason> + Send + 'static {
            let $g = self;
            $leased.lost()
        }
    };
}
pub(crate) use leased_methods;

/// After a long wait for a grant, the lease runs from a fresh answer: if more than a sixth of
/// `lease` passed since the acquire was `sent`, `ping` must answer within a third of it (the
/// lease then runs from the ping's send time), else the acquire fails and its caller drops the
/// connection, which frees the lock.
pub(crate) async fn fresh_after_wait(
    sent: Instant,
    lease: Duration,
    name: &str,
    ping: impl std::future::Future<Output = Result<()>>,
) -> Result<Instant> {
    if sent.elapsed() <= lease / 6 {
        return Ok(sent);
    }
    let at = Instant::now();
    match tokio::time::timeout(lease / 3, ping).await {
        Ok(answer) => answer.map(|()| at),
        Err(_) => Err(Error::Backend {
            op: "acquire (session check after the wait)",
            path: name.to_string(),
            source: "no answer from the server".into(),
        }),
    }
}

/// What one renewal (a ping, an extension) of a lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The server confirmed it: the deadline moves on.
    Renewed,
    /// It failed, but the hold may still be good: try again while time is left.
    Failed,
    /// The hold is gone, for this reason.
    Gone(LostReason),
}

/// How soon a failed renewal is tried again: a tenth of the lease, at most this.
pub(crate) const RETRY: Duration = Duration::from_millis(100);

/// When a lease's next renewal is due, after one that did not lose it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Next {
    pub(crate) at: Instant,
    /// The last one failed: this is its retry, due sooner than a period.
    pub(crate) retry: bool,
}

impl Renewal {
    /// What a health check of the holding connection (a ping) found: an answer renews; an error
    /// that means the connection is `gone` loses the lock with it (the server frees a
    /// connection's locks); any other error is a failure, tried again.
    pub(crate) fn of_check<E: std::fmt::Display>(
        answer: std::result::Result<(), E>,
        gone: impl FnOnce(&E) -> bool,
        name: &str,
    ) -> Renewal {
        match answer {
            Ok(()) => Renewal::Renewed,
            Err(e) if gone(&e) => {
                tracing::debug!(lock = name, error = %e, "the lock connection is gone");
                Renewal::Gone(LostReason::ConnectionClosed)
            }
            Err(e) => {
                tracing::debug!(lock = name, error = %e, "health check failed");
                Renewal::Failed
            }
        }
    }
}

/// The lease of the lock a pooled connection holds now (PostgreSQL, MariaDB), for the task that
/// watches the connection: when the connection ends, the server frees its locks, so that lease is
/// lost at once.
#[derive(Debug, Default)]
pub(crate) struct HolderSlot(StdMutex<Holding>);

#[derive(Debug, Default)]
struct Holding {
    lease: Option<(std::sync::Weak<Lease>, String)>,
    /// The connection has ended: a lease set now is lost at once.
    closed: bool,
}

impl HolderSlot {
    /// The connection now holds lock `name` under `lease` (lost at once if the connection
    /// ended already: its end may have been seen just before the grant was).
    pub(crate) fn set(&self, lease: &std::sync::Arc<Lease>, name: &str) {
        let mut h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if h.closed {
            drop(h);
            tracing::debug!(lock = name, "the lock connection closed");
            lease.publish(LockState::Lost(LostReason::ConnectionClosed), name);
            return;
        }
        h.lease = Some((std::sync::Arc::downgrade(lease), name.to_string()));
    }

    /// Whether the connection's end has been seen.
    pub(crate) fn is_closed(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).closed
    }

    /// The connection ended: its lock (if still held) is lost, and so is any set later.
    pub(crate) fn connection_closed(&self) {
        let held = {
            let mut h = self.0.lock().unwrap_or_else(|e| e.into_inner());
            h.closed = true;
            h.lease.take()
        };
        if let Some((lease, name)) = held.and_then(|(l, n)| Some((l.upgrade()?, n))) {
            tracing::debug!(lock = name, "the lock connection closed");
            lease.publish(LockState::Lost(LostReason::ConnectionClosed), &name);
        }
    }
}

#[derive(Debug)]
pub(crate) struct Lease {
    tx: watch::Sender<LockState>,
    deadline: StdMutex<Instant>,
    lease: Duration,
    /// Leases confirmed and lost with this one (an etcd session's guards), held weakly.
    followers: StdMutex<Vec<std::sync::Weak<Lease>>>,
    /// The backend's name, for the renewal metrics.
    backend: &'static str,
    /// A lease that carries others (a shared connection's, a session's): its own changes are
    /// logged at debug level, each lock on it logs its own, so that one ending with no lock
    /// on it (a client dropped) is not reported as a lock lost.
    carrier: bool,
}

impl Lease {
    /// A held lease confirmed by a request sent at `sent`.
    pub(crate) fn new(sent: Instant, lease: Duration, backend: &'static str) -> Lease {
        let (tx, _) = watch::channel(LockState::Held);
        Lease {
            tx,
            deadline: StdMutex::new(sent + lease - drift(lease)),
            lease,
            followers: StdMutex::default(),
            backend,
            carrier: false,
        }
    }

    /// A lease that carries others ([`Lease::follower`]), confirmed by a request sent at `sent`.
    pub(crate) fn carrier(sent: Instant, lease: Duration, backend: &'static str) -> Lease {
        Lease { carrier: true, ..Lease::new(sent, lease, backend) }
    }

    /// A lease that follows this one: same deadline and state now, confirmed, suspended and lost
    /// with it from now on (it can also be lost on its own). `None` if this one is lost already.
    pub(crate) fn follower(&self) -> Option<std::sync::Arc<Lease>> {
        let mut followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        // Checked under the list's lock: a loss published after this reaches the new follower.
        let state = *self.tx.borrow();
        if state.is_lost() {
            return None;
        }
        let (tx, _) = watch::channel(state);
        let lease = std::sync::Arc::new(Lease {
            tx,
            deadline: StdMutex::new(self.deadline()),
            lease: self.lease,
            followers: StdMutex::default(),
            backend: self.backend,
            carrier: false,
        });
        // Those gone are dropped only when the list is full, and room is kept for as many again
        // as are left: a look at each (there may be thousands, a shared connection's holds) is
        // paid once per as many followers made, not at every one.
        if followers.len() == followers.capacity() {
            followers.retain(|f| f.strong_count() > 0);
            let live = followers.len();
            followers.reserve(live.max(4));
        }
        followers.push(std::sync::Arc::downgrade(&lease));
        Some(lease)
    }

    fn followers(&self) -> Vec<std::sync::Arc<Lease>> {
        let followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        followers.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request sent at `sent` was confirmed: the deadline moves on (never back), the state is
    /// `Held` again (unless lost), and `lost()` futures re-arm for the new deadline.
    pub(crate) fn confirmed(&self, sent: Instant, name: &str) {
        {
            let mut d = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
            let new = sent + self.lease - drift(self.lease);
            if new > *d {
                *d = new;
            }
        }
        // The followers' deadlines move before anyone is told `Held`, so a follower's `lost()`
        // woken by the news never reads its old deadline.
        for f in self.followers() {
            f.confirmed(sent, name);
        }
        self.publish_own(LockState::Held, name);
        self.tx.send_modify(|_| {});
    }

    /// Publishes `state` (logged) unless the lease is lost already or nothing changes.
    pub(crate) fn publish(&self, state: LockState, name: &str) {
        // This lease's own state first: a follower made after this starts from it (and is
        // refused once lost); one made before is in the list read after it.
        self.publish_own(state, name);
        for f in self.followers() {
            f.publish(state, name);
        }
    }

    fn publish_own(&self, state: LockState, name: &str) {
        self.tx.send_if_modified(|s| {
            if s.is_lost() || *s == state {
                return false;
            }
            match state {
                LockState::Lost(reason) if self.carrier => tracing::debug!(lease = name, %reason, "lease ended"),
                LockState::Suspended | LockState::Held if self.carrier => {
                    tracing::debug!(lease = name, ?state, "lease state")
                }
                LockState::Lost(reason) => tracing::warn!(lock = name, %reason, "lock lost"),
                LockState::Suspended => tracing::info!(lock = name, "the server did not answer; lock suspended"),
                LockState::Held => tracing::info!(lock = name, "the server answered again; lock held"),
            }
            *s = state;
            true
        });
    }

    /// The hold ended (released or dropped): no longer ours to trust, quietly.
    pub(crate) fn end(&self) {
        self.tx.send_if_modified(|s| {
            if s.is_lost() {
                return false; // a loss already told keeps its reason
            }
            *s = LockState::Lost(LostReason::SessionClosed);
            true
        });
        for f in self.followers() {
            f.end();
        }
    }

    /// The state now: what was published, and `Lost` once the deadline has passed.
    pub(crate) fn state(&self, name: &str) -> LockState {
        if !self.tx.borrow().is_lost() && Instant::now() >= self.deadline() {
            self.publish(LockState::Lost(LostReason::LeaseExpired), name);
        }
        *self.tx.borrow()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<LockState> {
        self.tx.subscribe()
    }

    /// One renewal, bounded by the deadline: `Renewed` moves the deadline on from the send and
    /// the next renewal is due a `period` after it; `Failed` is `Suspended`, and the next try is
    /// due soon (a tenth of the lease, at most 100 ms); `Gone(reason)`, or no answer by the
    /// deadline, is `Lost`, and there is no next one (`None`). Every renewal loop of the crate
    /// runs its renewals through this. `renewal` must be lazy (an `async` block): it is made
    /// before the send time is read here, so it must send nothing until polled.
    /// `due` is when it was meant to run (for the lag metric).
    pub(crate) async fn renew_once(
        &self,
        name: &str,
        period: Duration,
        due: Instant,
        renewal: impl std::future::Future<Output = Renewal>,
    ) -> Option<Next> {
        self.renew_sent_at(name, period, due, Instant::now(), renewal).await
    }

    /// [`renew_once`](Lease::renew_once) with its send time read by the caller: `sent` must come
    /// before anything of `renewal` is sent (the watchdog reads it once for a request that renews
    /// several holds, before making the request). A lease whose deadline is `sent` or earlier is
    /// lost without polling `renewal`.
    pub(crate) async fn renew_sent_at(
        &self,
        name: &str,
        period: Duration,
        due: Instant,
        sent: Instant,
        renewal: impl std::future::Future<Output = Renewal>,
    ) -> Option<Next> {
        let deadline = self.deadline();
        let lag = sent.saturating_duration_since(due);
        if sent >= deadline {
            self.publish(LockState::Lost(LostReason::LeaseExpired), name);
            crate::observe::renewal(self.backend, "lost", lag);
            return None;
        }
        let (next, result) = match tokio::time::timeout_at(deadline, renewal).await {
            Ok(Renewal::Renewed) => {
                self.confirmed(sent, name);
                (Some(Next { at: sent + period, retry: false }), "renewed")
            }
            Ok(Renewal::Failed) => {
                self.publish(LockState::Suspended, name);
                (Some(Next { at: Instant::now() + RETRY.min(self.lease / 10), retry: true }), "failed")
            }
            Ok(Renewal::Gone(reason)) => {
                self.publish(LockState::Lost(reason), name);
                (None, "lost")
            }
            Err(_) => {
                self.publish(LockState::Lost(LostReason::LeaseExpired), name);
                (None, "lost")
            }
        };
        crate::observe::renewal(self.backend, result, lag);
        next
    }

    /// Keeps the lease: runs `renew` through [`Lease::renew_once`] when each is due (never later
    /// than half the time left), until the lease is lost.
    pub(crate) async fn keep<F, Fut>(&self, name: &str, period: Duration, mut renew: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Renewal>,
    {
        let mut due = Instant::now() + period;
        loop {
            let now = Instant::now();
            let left = self.deadline().saturating_duration_since(now);
            let at = due.min(now + left / 2);
            tokio::time::sleep_until(at).await;
            match self.renew_once(name, period, at, renew()).await {
                Some(next) => due = next.at,
                None => return,
            }
        }
    }

    /// Ends the lease at a release. A loss seen `before` is the release's error (the server may
    /// have handed the lock on); otherwise `unlock` runs to its answer (in the background if this
    /// future is dropped), and `false` from it means the server no longer had the lock as ours,
    /// for reason `gone`.
    pub(crate) async fn release<F>(&self, before: LockState, name: String, unlock: F, gone: LostReason) -> Result<()>
    where
        F: std::future::Future<Output = Result<bool>> + Send + 'static,
    {
        self.end();
        if let LockState::Lost(reason) = before {
            return Err(Error::LockLost { lock: name, reason });
        }
        match crate::background::detach(unlock).await? {
            true => Ok(()),
            false => Err(Error::LockLost { lock: name, reason: gone }),
        }
    }

    /// Resolves when the lease is lost: published as lost, or the deadline passed without a
    /// confirmation. `also` is a backend's own sign of loss (it resolves with its reason).
    pub(crate) fn lost<F>(
        lease: std::sync::Arc<Lease>,
        name: String,
        also: F,
    ) -> impl std::future::Future<Output = LostReason> + Send + 'static
    where
        F: std::future::Future<Output = LostReason> + Send + 'static,
    {
        let mut rx = lease.subscribe();
        async move {
            tokio::pin!(also);
            let mut also_done = false;
            loop {
                if let LockState::Lost(reason) = *rx.borrow_and_update() {
                    return reason;
                }
                let deadline = lease.deadline();
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() {
                        return LostReason::SessionClosed; // the guard is gone: released
                    },
                    reason = &mut also, if !also_done => {
                        also_done = true;
                        lease.publish(LockState::Lost(reason), &name);
                    }
                    _ = tokio::time::sleep_until(deadline) => {
                        if Instant::now() >= lease.deadline() {
                            lease.publish(LockState::Lost(LostReason::LeaseExpired), &name);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    const LEASE: Duration = Duration::from_secs(3);

    #[tokio::test(start_paused = true)]
    async fn a_follower_is_confirmed_suspended_and_lost_with_its_lease() {
        let start = Instant::now();
        let session = Lease::new(start, LEASE, "test");
        let guard = session.follower().expect("a live lease has followers");
        assert_eq!(guard.deadline(), session.deadline());
        tokio::time::advance(Duration::from_secs(1)).await;
        session.confirmed(Instant::now(), "s");
        assert_eq!(guard.deadline(), session.deadline(), "confirmed together");
        assert!(guard.deadline() > start + LEASE - drift(LEASE));
        session.publish(LockState::Suspended, "s");
        assert_eq!(guard.state("g"), LockState::Suspended);
        let late = session.follower().expect("suspended is not lost");
        assert_eq!(late.state("g"), LockState::Suspended, "a follower starts from the lease's state");
        session.publish(LockState::Held, "s");
        // A follower lost on its own leaves the lease and the others alone.
        guard.publish(LockState::Lost(LostReason::KeyDeleted), "g");
        assert_eq!(session.state("s"), LockState::Held);
        assert_eq!(late.state("g"), LockState::Held);
        session.publish(LockState::Lost(LostReason::SessionExpired), "s");
        assert_eq!(late.state("g"), LockState::Lost(LostReason::SessionExpired));
        assert_eq!(guard.state("g"), LockState::Lost(LostReason::KeyDeleted), "a loss keeps its first reason");
        assert!(session.follower().is_none(), "no follower of a lost lease");
    }

    /// Counts the warnings logged while `f` runs.
    fn warnings(f: impl FnOnce()) -> usize {
        use tracing_subscriber::layer::SubscriberExt;
        struct Count(Arc<AtomicU32>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
            fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
                if *e.metadata().level() == tracing::Level::WARN {
                    self.0.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let n = Arc::new(AtomicU32::new(0));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(Count(n.clone())), f);
        n.load(Ordering::Relaxed) as usize
    }

    #[test]
    fn a_carrier_ending_warns_once_per_lock_on_it_and_not_for_itself() {
        let now = Instant::now();
        // A shared connection whose locks were all released ends quietly (a client dropped).
        let empty = Lease::carrier(now, LEASE, "test");
        assert_eq!(warnings(|| empty.publish(LockState::Lost(LostReason::ConnectionClosed), "c")), 0);
        assert!(empty.state("c").is_lost(), "still lost, only quiet");
        // With two locks on it: one warning each.
        let carrier = Lease::carrier(now, LEASE, "test");
        let (a, b) = (carrier.follower().unwrap(), carrier.follower().unwrap());
        assert_eq!(warnings(|| carrier.publish(LockState::Lost(LostReason::ConnectionClosed), "c")), 2);
        assert!(a.state("a").is_lost() && b.state("b").is_lost());
        // A lease of one lock warns as before.
        let single = Lease::new(now, LEASE, "test");
        assert_eq!(warnings(|| single.publish(LockState::Lost(LostReason::ConnectionClosed), "s")), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_expires_at_the_deadline_without_a_word() {
        let session = Lease::new(Instant::now(), LEASE, "test");
        let guard = session.follower().unwrap();
        let lost = Lease::lost(guard.clone(), "g".into(), std::future::pending());
        let at = tokio::time::timeout(LEASE * 2, lost).await.expect("lost by the deadline");
        assert_eq!(at, LostReason::LeaseExpired);
        assert!(Instant::now() >= session.deadline());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_end_reaches_its_holder_even_before_the_grant_is_set() {
        let slot = HolderSlot::default();
        let first = Arc::new(Lease::new(Instant::now(), LEASE, "test"));
        slot.set(&first, "a");
        slot.connection_closed();
        assert_eq!(first.state("a"), LockState::Lost(LostReason::ConnectionClosed));
        // The end seen first, the grant set after: lost at once all the same.
        let late = Arc::new(Lease::new(Instant::now(), LEASE, "test"));
        slot.set(&late, "b");
        assert_eq!(late.state("b"), LockState::Lost(LostReason::ConnectionClosed));
    }

    #[tokio::test(start_paused = true)]
    async fn keep_retries_a_failure_soon_and_loses_at_the_deadline() {
        let lease = Arc::new(Lease::new(Instant::now(), LEASE, "test"));
        let calls = Arc::new(AtomicU32::new(0));
        let (l, c) = (lease.clone(), calls.clone());
        // Renewed, then failed twice, then renewed, then no answer at all.
        let keeper = tokio::spawn(async move {
            let sent = Vec::<Instant>::new();
            let sent = Arc::new(StdMutex::new(sent));
            let s = sent.clone();
            l.keep("k", LEASE / 3, move || {
                let n = c.fetch_add(1, Ordering::SeqCst);
                s.lock().unwrap().push(Instant::now());
                async move {
                    match n {
                        0 | 3 => Renewal::Renewed,
                        1 | 2 => Renewal::Failed,
                        _ => std::future::pending().await,
                    }
                }
            })
            .await;
            let sent = sent.lock().unwrap().clone();
            sent
        });
        let sent = tokio::time::timeout(LEASE * 4, keeper).await.expect("keep ends at the loss").unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        assert_eq!(sent[1] - sent[0], LEASE / 3, "renewed a period after the confirmed send");
        assert_eq!(sent[2] - sent[1], RETRY, "a failure is retried soon");
        assert_eq!(sent[3] - sent[2], RETRY);
        assert_eq!(sent[4] - sent[3], LEASE / 3);
        assert_eq!(lease.state("k"), LockState::Lost(LostReason::LeaseExpired));
        assert_eq!(Instant::now(), sent[3] + LEASE - drift(LEASE), "lost at the deadline, not later");
    }
}

//! A held Redis lock: fencing token, lease deadline, watchdog, state, release.
//!
//! The lease deadline is the send time of the last acquire or renewal the server confirmed, plus
//! the lease, less a drift margin: the server set its TTL after we sent, so it cannot expire the
//! key before then (clock rates aside, which the margin covers). A watchdog renews every third of
//! the lease, up to 100 holds of the client in one script ([`Renew`]). A failed renewal makes the guard `Suspended` and is retried until the deadline; at
//! the deadline the guard is `Lost(LeaseExpired)`, whatever a late answer says. A renewal that
//! finds the key gone (or someone else's) makes it `Lost(KeyDeleted)` at once. `Lost` is final.
//! Renewals also run at once, out of turn, when the client sees a sign that the server may have
//! lost its keys (`sentry.rs`, [`Watchdog::check_now`](crate::watchdog::Watchdog::check_now)).

use super::{scripts, Answer, Client, Replication};
use crate::lease::{Lease, Renewal};
use crate::{Error, LockState, LostReason, Result};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How a hold is recorded on the server.
#[derive(Debug, Clone)]
pub(crate) enum Holder {
    /// Redisson's hash: our field and the lock's release channel.
    Redisson { field: String, channel: String },
    /// A string key holding our random value.
    Simple { value: String, channel: String },
    /// A read hold of Redisson's read/write lock: our field `F`, the prefix of our per-hold
    /// timeout keys (`{K}:F:rwlock_timeout`) and of every reader's (`{K}`).
    Read { field: String, channel: String, timeouts: String, key_prefix: String },
    /// A write hold of Redisson's read/write lock: field `F:write`.
    Write { field: String, channel: String },
    /// A fair lock's hold: Redisson's hash field, plus the queue to wake the next waiter from.
    Fair { field: String, queue: String, alive: String, channel_prefix: String },
    /// A semaphore permit: our member of the permit set.
    Permit { id: String, permits_key: String, channel: String },
}

#[derive(Debug)]
pub(crate) struct Shared {
    lease: Arc<Lease>,
    /// The hold's place in the client's renewals (`None` once ended).
    ticket: StdMutex<Option<crate::watchdog::Ticket>>,
    /// The run id of the server the hold was last confirmed on (as the client knew it then):
    /// a release whose first try failed, and whose retry finds nothing, counts as released only
    /// on that same server.
    server: StdMutex<Option<Arc<str>>>,
}

impl Shared {
    fn server(&self) -> Option<Arc<str>> {
        self.server.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The state every Redis guard shares.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) client: Client,
    pub(crate) key: String,
    pub(crate) holder: Holder,
    pub(crate) token: u64,
    shared: Arc<Shared>,
    released: bool,
}

impl Hold {
    /// A hold acquired by a request sent at `sent`.
    pub(crate) fn new(client: Client, key: String, holder: Holder, token: u64, sent: Instant) -> Hold {
        let lease = client.lease();
        let shared = Arc::new(Shared {
            lease: Arc::new(Lease::new(sent, lease, "redis")),
            ticket: StdMutex::new(None),
            server: StdMutex::new(client.server_id()),
        });
        client.hold_started();
        let check =
            Renew { client: client.clone(), key: key.clone(), holder: holder.clone(), shared: Arc::downgrade(&shared) };
        let ticket = client.inner.watchdog.watch(shared.lease.clone(), key.clone(), check);
        *shared.ticket.lock().unwrap_or_else(|e| e.into_inner()) = Some(ticket);
        Hold { client, key, holder, token, shared, released: false }
    }

    /// No more renewals: the hold is released or dropped (called once per hold).
    fn end(&self) {
        self.client.hold_ended();
        drop(self.shared.ticket.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    pub(crate) fn lease_deadline(&self) -> std::time::Instant {
        self.shared.lease.deadline().into_std()
    }

    pub(crate) fn holder_id(&self) -> &str {
        match &self.holder {
            Holder::Redisson { field, .. }
            | Holder::Read { field, .. }
            | Holder::Write { field, .. }
            | Holder::Fair { field, .. } => field,
            Holder::Permit { id, .. } => id,
            Holder::Simple { value, .. } => value,
        }
    }

    /// The state now: what the watchdog published, and `Lost` once the deadline has passed
    /// (however late the watchdog runs).
    pub(crate) fn state(&self) -> LockState {
        self.shared.lease.state(&self.key)
    }

    pub(crate) fn state_changes(&self) -> watch::Receiver<LockState> {
        self.shared.lease.subscribe()
    }

    pub(crate) fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        Lease::lost(self.shared.lease.clone(), self.key.clone(), std::future::pending())
    }

    /// Releases on the server (retried on connection errors within the lease). Reports
    /// [`Error::LockLost`] if the lock was lost before, or was no longer ours on the server.
    pub(crate) async fn release(mut self) -> Result<()> {
        self.released = true;
        self.end();
        let before = self.state();
        let (client, key, holder) = (self.client.clone(), self.key.clone(), self.holder.clone());
        let (deadline, server) = (self.shared.lease.deadline(), self.shared.server());
        // A caller that stops waiting does not stop the release: it finishes in the background.
        let outcome = crate::background::detach(async move {
            release_on_server(&client, &key, &holder, deadline, server.as_deref()).await
        })
        .await;
        let lost = |reason| Err(Error::LockLost { lock: self.key.clone(), reason });
        match (before, outcome) {
            // Lost before: that is the news, whatever the release found.
            (LockState::Lost(reason), _) => lost(reason),
            (_, Err(e)) => Err(e),
            (_, Ok(true)) => Ok(()),
            (_, Ok(false)) => lost(LostReason::KeyDeleted),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // No longer ours to trust (quietly: this is the end of a hold, not a loss).
        self.shared.lease.end();
        if self.released {
            return;
        }
        self.end();
        let (client, key, holder) = (self.client.clone(), self.key.clone(), self.holder.clone());
        let (deadline, server) = (self.shared.lease.deadline(), self.shared.server());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = release_on_server(&client, &key, &holder, deadline, server.as_deref()).await {
                    tracing::warn!(key, error = %e, "release on drop failed; the lease frees the lock");
                }
            });
        }
    }
}

/// One release; true if it was ours. Connection errors are retried until the lease deadline
/// (after which the server frees the lock anyway). `server` is the run id of the server the hold
/// was last confirmed on, if known.
async fn release_on_server(
    client: &Client,
    key: &str,
    holder: &Holder,
    deadline: Instant,
    server: Option<&str>,
) -> Result<bool> {
    let lease = client.lease_ms().to_string();
    let k = key.to_string();
    // Redisson's unlock latch (the same for every retry of this release) where the layout has one.
    let latch = super::latch_key(key, &client.fresh_field());
    // Remembered past the last retry (which comes before the lease deadline).
    let latch_ttl = (client.lease_ms() + LATCH_MARGIN_MS).to_string();
    let sharded = client.sharded();
    // Every script answers nil when the hold was not ours (any more).
    let (script, keys, args, latched): (&redis::Script, Vec<&String>, Vec<&String>, bool) = match holder {
        Holder::Redisson { field, channel } => (
            scripts::REDISSON_UNLOCK.pick(sharded),
            vec![&k, channel, &latch],
            vec![&ZERO, &lease, field, &latch_ttl, &ZERO],
            true,
        ),
        Holder::Fair { field, queue, alive, channel_prefix } => (
            scripts::FAIR_UNLOCK.pick(sharded),
            vec![&k, queue, alive, &latch, channel_prefix],
            vec![&lease, field, &latch_ttl, &ZERO],
            true,
        ),
        Holder::Simple { value, channel } => {
            (scripts::SIMPLE_RELEASE.pick(sharded), vec![&k, channel], vec![value], false)
        }
        Holder::Read { field, channel, timeouts, key_prefix } => {
            (scripts::READ_UNLOCK.pick(sharded), vec![&k, channel, timeouts, key_prefix], vec![&ZERO, field], false)
        }
        Holder::Write { field, channel } => {
            (scripts::WRITE_UNLOCK.pick(sharded), vec![&k, channel], vec![&ONE, &lease, field], false)
        }
        Holder::Permit { id, permits_key, channel } => {
            (scripts::SEMAPHORE_RELEASE.pick(sharded), vec![&k, permits_key, channel], vec![id], false)
        }
    };
    let keys: Vec<&str> = keys.into_iter().map(String::as_str).collect();
    let mut args: Vec<String> = args.into_iter().cloned().collect();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        if latched && attempt == 2 {
            // The last argument of a latched release says "retry": only a retry reads the latch.
            *args.last_mut().expect("a latched release has a retry argument") = ONE.clone();
        }
        let r: Result<Option<i64>> = client.eval(script, &keys, &args, "release", key).await;
        match r {
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tracing::debug!(key, attempt, error = %e, "release failed; retrying");
                tokio::time::sleep(RETRY.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
            r => {
                if latched && matches!(r, Ok(Some(0))) {
                    client.forget(&latch); // written only for a re-entrant decrement
                }
                let ours = r?.is_some();
                if ours || attempt == 1 {
                    return Ok(ours);
                }
                // A retry found nothing of ours. Either the failed try released it and its answer
                // was lost, or the server lost the lock meanwhile (restarted without persistence,
                // or replaced by another master). Only the same server can have done the first.
                // (A hold lost before the release is reported from the guard's state.)
                return Ok(client.same_server(server).await);
            }
        }
    }
}

/// Unlock messages: `0` wakes one waiter per Redisson client, `1` wakes all.
static ZERO: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "0".to_string());
static ONE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "1".to_string());

/// How much longer than the lease a retried unlock's outcome is remembered on the server.
const LATCH_MARGIN_MS: u64 = 30_000;
/// Pause between retries of a failed request.
const RETRY: Duration = Duration::from_millis(100);

/// At most this many holds in one renewal script: Redisson's batch, and a script of at most 200
/// keys and 201 arguments, which the server runs in well under a millisecond.
const RENEW_TOGETHER: usize = 100;

/// A hold's renewal, as the client's watchdog keeps it: renewed with the client's other holds
/// (on a cluster, those of its hash slot: a script's keys must share one) in one [`scripts::RENEW`]
/// of up to [`RENEW_TOGETHER`] holds of any kinds, each with its own answer.
pub(crate) struct Renew {
    client: Client,
    key: String,
    holder: Holder,
    shared: std::sync::Weak<Shared>,
}

impl crate::watchdog::Check for Renew {
    type Group = Option<redis::cluster_routing::Slot>;

    const TOGETHER: usize = RENEW_TOGETHER;

    fn group(&self) -> Self::Group {
        self.client.sharded().then(|| redis::cluster_routing::Slot::for_key(&self.key))
    }

    fn renew(&self) -> crate::contract::BoxFuture<'static, Renewal> {
        let together = Self::renew_together(&[self]);
        Box::pin(async move { together.await.pop().unwrap_or(Renewal::Failed) })
    }

    /// One script for them all: a hold whose key is gone or someone else's is `Gone(KeyDeleted)`;
    /// a failed request (a connection error, no answer in time) fails every one of them.
    fn renew_together(checks: &[&Self]) -> crate::contract::BoxFuture<'static, Vec<Renewal>> {
        let client = checks[0].client.clone();
        let first = checks[0].key.clone();
        let mut keys: Vec<String> = Vec::with_capacity(checks.len() * 2);
        let mut args: Vec<String> = Vec::with_capacity(checks.len() * 2 + 1);
        args.push(client.lease_ms().to_string());
        for c in checks {
            let (kind, id) = renewal_of(&c.holder, &c.key, &mut keys);
            args.push(kind.to_string());
            args.push(id.to_string());
        }
        let shared: Vec<std::sync::Weak<Shared>> = checks.iter().map(|c| c.shared.clone()).collect();
        Box::pin(async move {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let answer: Result<Vec<i64>> = client.eval(&scripts::RENEW, &keys, &args, "renew", &first).await;
            match answer {
                Ok(answers) if answers.len() == shared.len() => {
                    let server = client.server_id();
                    answers
                        .into_iter()
                        .zip(shared)
                        .map(|(ours, shared)| {
                            if ours != 1 {
                                return Renewal::Gone(LostReason::KeyDeleted);
                            }
                            if let Some(shared) = shared.upgrade() {
                                *shared.server.lock().unwrap_or_else(|e| e.into_inner()) = server.clone();
                            }
                            Renewal::Renewed
                        })
                        .collect()
                }
                Ok(answers) => {
                    tracing::debug!(key = first, holds = shared.len(), ?answers, "unexpected answer to a renewal");
                    vec![Renewal::Failed; shared.len()]
                }
                Err(e) => {
                    tracing::debug!(key = first, holds = shared.len(), error = %e, "renewal failed");
                    vec![Renewal::Failed; shared.len()]
                }
            }
        })
    }
}

/// A hold's part of a [`scripts::RENEW`]: its keys pushed on `keys`, its kind and identity
/// returned.
fn renewal_of<'a>(holder: &'a Holder, key: &str, keys: &mut Vec<String>) -> (&'static str, &'a str) {
    keys.push(key.to_string());
    match holder {
        Holder::Redisson { field, .. } | Holder::Write { field, .. } | Holder::Fair { field, .. } => ("h", field),
        Holder::Read { field, timeouts, .. } => {
            keys.push(timeouts.clone());
            ("r", field)
        }
        Holder::Permit { id, permits_key, .. } => {
            keys.push(permits_key.clone());
            ("p", id)
        }
        Holder::Simple { value, .. } => ("s", value),
    }
}

/// A handle's hold in progress on one side of a lock (all of a mutex or fair lock; the reads,
/// or the writes, of a read/write lock): the hash field it was granted under, its fencing token
/// and how many guards share it. Acquires through the handle re-enter it; after its last guard,
/// the next acquire is a new hold under a fresh field.
#[derive(Debug, Default)]
pub(crate) struct Reentry(StdMutex<Option<Entered>>);

#[derive(Debug)]
struct Entered {
    field: String,
    token: u64,
    count: usize,
}

/// Which hold an attempt asks for.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) field: String,
    /// The token of the hold in progress when re-entering it; `None` for a new hold.
    reenter: Option<u64>,
}

impl Plan {
    /// The acquire scripts' mode argument: `r` re-enters only, `n` asks for a new hold.
    pub(crate) fn mode(&self) -> String {
        if self.reenter.is_some() { "r" } else { "n" }.to_string()
    }
}

impl Reentry {
    fn state(&self) -> std::sync::MutexGuard<'_, Option<Entered>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-enter the hold in progress, or ask for a new one under `fresh`.
    pub(crate) fn plan(&self, fresh: &str) -> Plan {
        match &*self.state() {
            Some(e) => Plan { field: e.field.clone(), reenter: Some(e.token) },
            None => Plan { field: fresh.to_string(), reenter: None },
        }
    }

    /// The field of the hold in progress.
    pub(crate) fn field(&self) -> Option<String> {
        self.state().as_ref().map(|e| e.field.clone())
    }

    /// Counts a guard of the hold under `field` (granted with `token`, or re-entered); its token.
    fn enter(&self, field: &str, token: Option<u64>) -> u64 {
        let mut state = self.state();
        match &mut *state {
            Some(e) if e.field == field => {
                e.count += 1;
                e.token
            }
            Some(_) => token.unwrap_or(0), // a second hold of its own (readers run side by side)
            None => {
                let token = token.unwrap_or(0);
                *state = Some(Entered { field: field.to_string(), token, count: 1 });
                token
            }
        }
    }

    /// The hold under `field` is over on the server.
    fn forget(&self, field: &str) {
        let mut state = self.state();
        if state.as_ref().is_some_and(|e| e.field == field) {
            *state = None;
        }
    }

    /// One guard of the hold under `field` is gone.
    pub(crate) fn leave(&self, field: &str) {
        let mut state = self.state();
        if let Some(e) = state.as_mut().filter(|e| e.field == field) {
            e.count -= 1;
            if e.count == 0 {
                *state = None;
            }
        }
    }
}

/// What a reentrant attempt came to.
pub(crate) enum Entry {
    /// Someone else holds it: the script's answer, `{HELD, pttl, ...}`.
    Held(Vec<i64>),
    /// Ours: counted in the handle's [`Reentry`].
    Entered { field: String, token: u64, sent: Instant, replication: Replication },
}

/// A reentrant hold's acquire in Redisson's layout (the mutex, and the write side of the
/// read/write lock): one script per attempt through [`enter`], the hold made from the answer.
pub(crate) struct Reentrant<'a> {
    pub(crate) client: &'a Client,
    pub(crate) key: &'a str,
    pub(crate) token_key: &'a str,
    pub(crate) channel: &'a str,
    pub(crate) reentry: &'a Arc<Reentry>,
    pub(crate) script: &'static redis::Script,
    /// Our holder, from our field and the release channel.
    pub(crate) holder: fn(String, String) -> Holder,
    /// An election candidate's value, put with the grant.
    pub(crate) value: Option<Arc<str>>,
}

impl Reentrant<'_> {
    /// Acquires with `fresh` as a new hold's field, until `deadline`; `guard` makes the guard.
    pub(crate) async fn acquire<G: Send + 'static>(
        self,
        fresh: String,
        deadline: Option<Instant>,
        guard: fn(Hold, Arc<Reentry>) -> G,
    ) -> Result<Option<G>> {
        let Reentrant { client, key, token_key, channel, reentry, script, holder, value } = self;
        super::acquire_loop(client, channel, deadline, None, || {
            let (client, key, token_key) = (client.clone(), key.to_string(), token_key.to_string());
            let (channel, reentry, fresh) = (channel.to_string(), reentry.clone(), fresh.clone());
            let value = value.clone();
            async move {
                let eval = |plan: Plan| {
                    let (client, key, token_key, value) = (&client, &key, &token_key, &value);
                    async move {
                        let sent = Instant::now();
                        let mut args = vec![client.lease_ms().to_string(), plan.field.clone(), plan.mode()];
                        args.extend(value.as_deref().map(str::to_string));
                        let (reply, replication) =
                            client.eval_acquire(script, &[key.as_str(), token_key.as_str()], &args, key).await?;
                        Ok((reply, replication, sent))
                    }
                };
                let (field, token, sent, replication) = match enter(&reentry, &fresh, &key, eval).await? {
                    Entry::Held(reply) => return Ok(super::Attempt::Held(reply[1])),
                    Entry::Entered { field, token, sent, replication } => (field, token, sent, replication),
                };
                let hold = Hold::new(client.clone(), key.clone(), holder(field, channel), token, sent);
                let guard = guard(hold, reentry);
                replication.check(&key)?; // not confirmed: the guard drops and releases
                Ok(super::Attempt::Acquired(guard))
            }
        })
        .await
    }
}

/// One attempt of a reentrant recipe: `eval` runs its acquire script for a [`Plan`] and returns
/// the answer with the send time. A re-entry that finds the hold in progress gone on the server
/// (its lease ran out) is not counted on it: the attempt asks for a new hold at once.
pub(crate) async fn enter<F, Fut>(reentry: &Reentry, fresh: &str, key: &str, eval: F) -> Result<Entry>
where
    F: Fn(Plan) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<i64>, Replication, Instant)>>,
{
    loop {
        let plan = reentry.plan(fresh);
        let (reply, replication, sent) = eval(plan.clone()).await?;
        let token = match Answer::parse(&reply, key)? {
            Answer::Granted(token) => reentry.enter(&plan.field, Some(token)),
            Answer::Reentered => reentry.enter(&plan.field, plan.reenter),
            Answer::Held(_) => return Ok(Entry::Held(reply)),
            Answer::Gone => {
                reentry.forget(&plan.field);
                continue;
            }
            Answer::OtherPermits(_) => return Err(Answer::unexpected(&reply, key)),
        };
        return Ok(Entry::Entered { field: plan.field, token, sent, replication });
    }
}

/// The accessors every Redis guard offers, over its `Hold`.
macro_rules! hold_methods {
    ($m:ident) => {
        /// The fencing token: larger than every token any earlier holder of this lock got
        /// (see the [module docs](crate::redis#fencing-tokens)). Pass it to the resource you
        /// protect, which must refuse tokens lower than the highest it has seen.
        pub fn fencing_token(&self) -> u64 {
            self.$m().token
        }

        /// The lock's key.
        pub fn key(&self) -> &str {
            &self.$m().key
        }

        /// The lock's name: its key, as on every backend's guards.
        pub fn name(&self) -> &str {
            &self.$m().key
        }

        /// Our identity on the server: the hash field (Redisson layout) or the key's value
        /// (simple layout).
        pub fn holder_id(&self) -> &str {
            self.$m().holder_id()
        }

        /// The instant after which the server may expire the key and give the lock to someone
        /// else, unless a renewal succeeds first: the send time of the last confirmed acquire or
        /// renewal, plus the lease, less a drift margin. Stop work that needs the lock before it.
        pub fn lease_deadline(&self) -> std::time::Instant {
            self.$m().lease_deadline()
        }

        /// The state now (`Lost` once the lease deadline has passed without a renewal).
        pub fn state(&self) -> crate::LockState {
            self.$m().state()
        }

        /// Every change of state, as a watch receiver.
        pub fn state_changes(&self) -> tokio::sync::watch::Receiver<crate::LockState> {
            self.$m().state_changes()
        }

        /// Resolves when the lock can no longer be trusted: the lease deadline passed without a
        /// confirmed renewal, or the key was found gone or someone else's.
        pub fn lost(&self) -> impl std::future::Future<Output = crate::LostReason> + Send + 'static {
            self.$m().lost()
        }
    };
}
pub(crate) use hold_methods;

/// A guard type of a reentrant recipe: a [`Hold`] plus the handle's re-entry count, released by
/// `release()` or, in the background, on drop.
macro_rules! reentrant_guard {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[must_use = "if unused the lock is released at once"]
        #[clippy::has_significant_drop]
        #[derive(Debug)]
        pub struct $name {
            hold: Option<$crate::redis::guard::Hold>,
            count: std::sync::Arc<$crate::redis::guard::Reentry>,
        }

        impl $name {
            pub(crate) fn new(
                hold: $crate::redis::guard::Hold,
                count: std::sync::Arc<$crate::redis::guard::Reentry>,
            ) -> $name {
                $name { hold: Some(hold), count }
            }

            $crate::redis::guard::hold_methods!(hold_ref);

            fn hold_ref(&self) -> &$crate::redis::guard::Hold {
                self.hold.as_ref().expect("a guard holds until released")
            }

            /// Releases this hold (the lock itself at the last re-entrant hold) and waits for the
            /// server's answer; [`Error::LockLost`](crate::Error::LockLost) if the lock had been
            /// lost before, or was no longer ours on the server.
            pub async fn release(mut self) -> $crate::Result<()> {
                self.count.leave(self.hold_ref().holder_id());
                self.hold.take().expect("a guard holds until released").release().await
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                if let Some(hold) = &self.hold {
                    self.count.leave(hold.holder_id());
                }
            }
        }
    };
}
pub(crate) use reentrant_guard;

//! Metrics and tracing spans: written once over the backend-neutral API ([`crate::Lock`],
//! [`crate::Guard`]) and the shared lease, so they read the same on every backend.
//!
//! **Metrics** go through the [`metrics`](https://docs.rs/metrics) facade: the application
//! installs the exporter it wants (Prometheus, StatsD, ...) and then calls [`enable`] once. Until
//! then the library records nothing and costs one atomic load per acquire. Every metric is
//! listed in [`METRICS`] (name, type, labels, meaning), and [`enable`] describes them to the
//! installed recorder, so an exporter has their help text and units.
//!
//! The `backend` label is always there. The `lock` label (the lock's name on the server) is off
//! by default, because lock names are often made from data (an order id) and a label per name
//! would grow without bound; [`LockNames::Capped`] turns it on for the first N distinct names a
//! process sees, and every later name is counted under [`OTHER_NAMES`].
//!
//! **Spans** (through `tracing`, always on; free when no subscriber listens): `distlock.acquire`
//! around each acquire, with `backend`, `lock`, `outcome` (`acquired`, `busy`, `timed_out`,
//! `error`, `cancelled`), `token` and `waited_s`; and `distlock.hold` from the grant to the release or drop,
//! with `backend`, `lock`, `token`, `held_s` and `end` (`released`, `release_failed`, `dropped`).
//! An application that bridges `tracing` to OpenTelemetry sees lock waits inside its traces.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! // First the application's exporter (any `metrics` recorder), then:
//! distlock::observe::enable(distlock::observe::Options { lock_names: distlock::observe::LockNames::Capped(100) });
//! let client = distlock::connect("sqlite:///tmp/locks.db").await?;
//! let guard = client.mutex("nightly-report")?.lock().await?; // counted and timed
//! guard.release().await?;
//! # Ok(()) }
//! ```

use crate::{LockState, LostReason};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;
use tokio::time::Instant;
use tracing::field::Empty;

/// What to record; see [`enable`].
///
/// # Examples
///
/// ```
/// let o = distlock::observe::Options { lock_names: distlock::observe::LockNames::Off };
/// assert_eq!(o, distlock::observe::Options::default());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Whether metrics carry a `lock` label.
    pub lock_names: LockNames,
}

/// Whether metrics carry the lock's name as a `lock` label.
///
/// # Examples
///
/// ```
/// use distlock::observe::LockNames;
/// assert_eq!(LockNames::default(), LockNames::Off);
/// let capped = LockNames::Capped(50); // the first 50 names, then "_other"
/// # let _ = capped;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockNames {
    /// No `lock` label (the default).
    #[default]
    Off,
    /// A `lock` label for the first N distinct names; later names share [`OTHER_NAMES`].
    Capped(usize),
}

/// The `lock` label of names past the cap of [`LockNames::Capped`].
pub const OTHER_NAMES: &str = "_other";

/// One metric the library records.
///
/// # Examples
///
/// ```
/// let held = distlock::observe::METRICS.iter().find(|m| m.name == "distlock_locks_held").unwrap();
/// assert_eq!(held.kind, "gauge");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metric {
    /// Its name, as exported.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its labels (`lock` only with [`LockNames::Capped`]).
    pub labels: &'static str,
    /// What it measures.
    pub help: &'static str,
}

/// Every metric the library records (docs/observability.md lists the same).
pub const METRICS: &[Metric] = &[
    Metric {
        name: "distlock_acquires_total",
        kind: "counter",
        labels: "backend, outcome, lock",
        help: "Acquires that ended, by outcome: acquired, busy (not free and no wait), timed_out, error, cancelled (the caller dropped the acquire).",
    },
    Metric {
        name: "distlock_acquire_wait_seconds",
        kind: "histogram",
        labels: "backend, outcome, lock",
        help: "Time from the start of an acquire to its outcome.",
    },
    Metric {
        name: "distlock_acquires_waiting",
        kind: "gauge",
        labels: "backend",
        help: "Acquires under way now (waiting for the lock or for the server).",
    },
    Metric { name: "distlock_locks_held", kind: "gauge", labels: "backend", help: "Locks held now by this process." },
    Metric {
        name: "distlock_hold_seconds",
        kind: "histogram",
        labels: "backend, lock",
        help: "Time from a grant to its release (or the guard's drop).",
    },
    Metric {
        name: "distlock_releases_total",
        kind: "counter",
        labels: "backend, result",
        help: "Holds that ended, by result: released, release_failed (the server no longer had it, or failed to answer), dropped (the guard or its release dropped unfinished: released in the background).",
    },
    Metric {
        name: "distlock_locks_lost_total",
        kind: "counter",
        labels: "backend, reason, lock",
        help: "Holds lost before their release, by LostReason (session_expired, lease_expired, ...).",
    },
    Metric {
        name: "distlock_release_lease_left_seconds",
        kind: "histogram",
        labels: "backend",
        help: "Time left before the lease deadline when a hold was released: values near zero are holds that ran close to losing their lock.",
    },
    Metric {
        name: "distlock_lease_renewals_total",
        kind: "counter",
        labels: "backend, result",
        help: "Lease renewals, by result: renewed, failed (no answer; retried), lost. Not on ZooKeeper, whose session is kept by the client's pings.",
    },
    Metric {
        name: "distlock_lease_renewal_lag_seconds",
        kind: "histogram",
        labels: "backend",
        help: "How late a lease renewal was sent after it was due (a busy runtime delays renewals).",
    },
];

static ENABLED: AtomicBool = AtomicBool::new(false);
static OPTIONS: OnceLock<StdMutex<Names>> = OnceLock::new();
/// Whether names are labelled (read without taking [`OPTIONS`]'s lock).
static NAMES_ON: AtomicBool = AtomicBool::new(false);
/// Bumped by every [`enable`]: handles made before belong to an earlier recorder or options.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Each backend's handles of the metrics without a `lock` label (at most one per backend).
static HANDLES: StdMutex<Vec<Arc<Handles>>> = StdMutex::new(Vec::new());

#[derive(Debug, Default)]
struct Names {
    mode: LockNames,
    seen: HashSet<Arc<str>>,
}

/// Starts recording metrics into the installed `metrics` recorder (install it first), with
/// `options`; describes every metric of [`METRICS`] to it. Calling it again changes the options
/// (with names still capped, those already labelled keep their label; with
/// [`LockNames::Off`], none is labelled) and picks up a recorder installed since.
///
/// The library keeps the recorder's handle of each series it records, from one `enable` to
/// the next: an exporter that evicts idle series (`metrics-exporter-prometheus`'s
/// `idle_timeout`) would drop them for good, so do not set one for `distlock_` metrics.
pub fn enable(options: Options) {
    let names = OPTIONS.get_or_init(StdMutex::default);
    names.lock().unwrap_or_else(|e| e.into_inner()).mode = options.lock_names;
    NAMES_ON.store(options.lock_names != LockNames::Off, Ordering::SeqCst);
    for m in METRICS {
        match m.kind {
            "counter" => metrics::describe_counter!(m.name, m.help),
            "gauge" => metrics::describe_gauge!(m.name, m.help),
            _ => metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help),
        }
    }
    GENERATION.fetch_add(1, Ordering::SeqCst);
    HANDLES.lock().unwrap_or_else(|e| e.into_inner()).clear();
    ENABLED.store(true, Ordering::SeqCst);
}

/// Stops recording metrics (spans go on).
pub fn disable() {
    ENABLED.store(false, Ordering::SeqCst);
}

/// Whether [`enable`] is in force.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The `lock` label for `name`, if names are labelled.
fn lock_label(name: &str) -> Option<Arc<str>> {
    if !NAMES_ON.load(Ordering::Relaxed) {
        return None;
    }
    let names = OPTIONS.get()?;
    let mut names = names.lock().unwrap_or_else(|e| e.into_inner());
    let LockNames::Capped(cap) = names.mode else { return None };
    if let Some(n) = names.seen.get(name) {
        return Some(n.clone());
    }
    if names.seen.len() >= cap {
        return Some(Arc::from(OTHER_NAMES));
    }
    let n: Arc<str> = Arc::from(name);
    names.seen.insert(n.clone());
    Some(n)
}

fn labels(pairs: &[(&'static str, &str)], lock: &Option<Arc<str>>) -> Vec<metrics::Label> {
    let mut v: Vec<metrics::Label> = pairs.iter().map(|(k, v)| metrics::Label::new(*k, v.to_string())).collect();
    if let Some(l) = lock {
        v.push(metrics::Label::new("lock", l.to_string()));
    }
    v
}

/// The label value of a [`LostReason`].
pub(crate) fn reason_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::SessionExpired => "session_expired",
        LostReason::SessionClosed => "session_closed",
        LostReason::NodeDeleted => "node_deleted",
        LostReason::LeaseExpired => "lease_expired",
        LostReason::KeyDeleted => "key_deleted",
        LostReason::ConnectionClosed => "connection_closed",
        LostReason::AuthFailed => "auth_failed",
    }
}

/// How an acquire ended (the `outcome` label).
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Acquired,
    Busy,
    TimedOut,
    Error,
    Cancelled,
}

const OUTCOMES: [&str; 5] = ["acquired", "busy", "timed_out", "error", "cancelled"];
const ENDS: [&str; 3] = ["released", "release_failed", "dropped"];

/// One backend's metric handles, looked up in the recorder once (a lookup per record costs a
/// hash of the name and labels, and allocations).
struct Handles {
    backend: &'static str,
    generation: u64,
    waiting: metrics::Gauge,
    held: metrics::Gauge,
    acquires: [metrics::Counter; 5],
    waits: [metrics::Histogram; 5],
    hold: metrics::Histogram,
    releases: [metrics::Counter; 3],
    lease_left: metrics::Histogram,
}

fn handles(backend: &'static str) -> Arc<Handles> {
    let generation = GENERATION.load(Ordering::SeqCst);
    let mut all = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = all.iter().find(|h| h.backend == backend && h.generation == generation) {
        return h.clone();
    }
    let h = Arc::new(Handles {
        backend,
        generation,
        waiting: metrics::gauge!("distlock_acquires_waiting", "backend" => backend),
        held: metrics::gauge!("distlock_locks_held", "backend" => backend),
        acquires: OUTCOMES.map(|o| metrics::counter!("distlock_acquires_total", "backend" => backend, "outcome" => o)),
        waits: OUTCOMES
            .map(|o| metrics::histogram!("distlock_acquire_wait_seconds", "backend" => backend, "outcome" => o)),
        hold: metrics::histogram!("distlock_hold_seconds", "backend" => backend),
        releases: ENDS.map(|e| metrics::counter!("distlock_releases_total", "backend" => backend, "result" => e)),
        lease_left: metrics::histogram!("distlock_release_lease_left_seconds", "backend" => backend),
    });
    all.retain(|h| h.generation == generation);
    all.push(h.clone());
    h
}

/// Where a lock's records go: its backend's handles, and its `lock` label if names are labelled
/// (then the series with that label are looked up per record).
#[derive(Clone)]
struct Sink {
    handles: Arc<Handles>,
    lock: Option<Arc<str>>,
}

impl Sink {
    fn new(backend: &'static str, name: &str) -> Sink {
        Sink { handles: handles(backend), lock: lock_label(name) }
    }

    fn acquire_ended(&self, outcome: Outcome, waited: Duration) {
        let h = &self.handles;
        h.waiting.decrement(1.0);
        let i = outcome as usize;
        match &self.lock {
            None => {
                h.acquires[i].increment(1);
                h.waits[i].record(waited.as_secs_f64());
            }
            lock => {
                let l = labels(&[("backend", h.backend), ("outcome", OUTCOMES[i])], lock);
                metrics::counter!("distlock_acquires_total", l.clone()).increment(1);
                metrics::histogram!("distlock_acquire_wait_seconds", l).record(waited.as_secs_f64());
            }
        }
    }

    fn hold_ended(&self, end: usize, held: Duration) {
        let h = &self.handles;
        h.held.decrement(1.0);
        h.releases[end].increment(1);
        match &self.lock {
            None => h.hold.record(held.as_secs_f64()),
            lock => metrics::histogram!("distlock_hold_seconds", labels(&[("backend", h.backend)], lock))
                .record(held.as_secs_f64()),
        }
    }

    fn lost(&self, reason: LostReason) {
        let l = labels(&[("backend", self.handles.backend), ("reason", reason_label(reason))], &self.lock);
        metrics::counter!("distlock_locks_lost_total", l).increment(1);
    }
}

/// An acquire under way: counted as waiting until it ends (or is dropped: cancelled), and timed.
pub(crate) struct Acquire<'a> {
    backend: &'static str,
    name: &'a str,
    started: Instant,
    /// Metrics on: where they go (taken when the acquire ends).
    sink: Option<Sink>,
    ended: bool,
    pub(crate) span: tracing::Span,
}

impl<'a> Acquire<'a> {
    pub(crate) fn start(backend: &'static str, name: &'a str) -> Acquire<'a> {
        let sink = enabled().then(|| Sink::new(backend, name));
        if let Some(s) = &sink {
            s.handles.waiting.increment(1.0);
        }
        let span = tracing::info_span!(
            "distlock.acquire",
            backend,
            lock = name,
            outcome = Empty,
            token = Empty,
            waited_s = Empty
        );
        Acquire { backend, name, started: Instant::now(), sink, ended: false, span }
    }

    /// The acquire ended: `Some(token)` if granted, `None` if not had in time; `busy` says whether
    /// it was a try (no wait) or a timed wait.
    pub(crate) fn end(mut self, outcome: std::result::Result<Option<u64>, ()>, busy: bool) -> Option<Hold> {
        let waited = self.started.elapsed();
        self.ended = true;
        let how = match outcome {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) if busy => Outcome::Busy,
            Ok(None) => Outcome::TimedOut,
            Err(()) => Outcome::Error,
        };
        self.span.record("outcome", OUTCOMES[how as usize]);
        self.span.record("waited_s", waited.as_secs_f64());
        if let Ok(Some(t)) = outcome {
            self.span.record("token", t);
        }
        let sink = self.sink.take();
        if let Some(s) = &sink {
            s.acquire_ended(how, waited);
        }
        let Ok(Some(token)) = outcome else { return None };
        if let Some(s) = &sink {
            s.handles.held.increment(1.0);
        }
        let span = tracing::info_span!(
            parent: None,
            "distlock.hold",
            backend = self.backend,
            lock = self.name,
            token,
            held_s = Empty,
            end = Empty
        );
        span.follows_from(&self.span);
        let loss_counted = sink.as_ref().map(|_| Arc::default());
        Some(Hold { sink, started: Instant::now(), span, loss_counted, ended: false })
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Dropped unfinished: the caller gave up (a timeout around it, a select!).
        let waited = self.started.elapsed();
        if let Some(s) = self.sink.take() {
            s.acquire_ended(Outcome::Cancelled, waited);
        }
        self.span.record("outcome", "cancelled");
        self.span.record("waited_s", waited.as_secs_f64());
    }
}

/// A hold: counted as held until it ends; its loss counted when the holder learns of it (its
/// `lost()` resolves or its state reads lost) or, at the latest, when it ends.
pub(crate) struct Hold {
    sink: Option<Sink>,
    started: Instant,
    span: tracing::Span,
    /// Whether its loss was counted (or can no longer be: the hold ended); metrics on only.
    loss_counted: Option<Arc<AtomicBool>>,
    ended: bool,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("started", &self.started).finish_non_exhaustive()
    }
}

impl Hold {
    /// The hold's state was read: a loss in it is counted (once).
    pub(crate) fn saw(&self, state: LockState) {
        if let (LockState::Lost(reason), Some(counted), Some(sink)) = (state, &self.loss_counted, &self.sink) {
            if !counted.swap(true, Ordering::SeqCst) {
                sink.lost(reason);
            }
        }
    }

    /// `lost`, counting the loss (once) when it resolves while the hold lasts.
    pub(crate) fn counting_loss(
        &self,
        lost: crate::contract::BoxFuture<'static, LostReason>,
    ) -> crate::contract::BoxFuture<'static, LostReason> {
        let (Some(counted), Some(sink)) = (self.loss_counted.clone(), self.sink.clone()) else { return lost };
        Box::pin(async move {
            let reason = lost.await;
            if !counted.swap(true, Ordering::SeqCst) {
                sink.lost(reason);
            }
            reason
        })
    }

    /// The hold is about to end (a release or a drop), in `state`: a loss in it is counted, and
    /// none after (the release ends the lease, which `lost()` also reports).
    pub(crate) fn ending(&mut self, state: LockState) {
        self.saw(state);
        if let Some(counted) = &self.loss_counted {
            counted.store(true, Ordering::SeqCst);
        }
    }

    /// The hold ends by a release that the server answered (`ok`), with `left` before the lease
    /// deadline when it began.
    /// `found`: a loss the release itself discovered (the state read before it did not show it),
    /// counted here: nothing else can count it once the hold is ending.
    pub(crate) fn released(&mut self, ok: bool, state: LockState, left: Duration, found: Option<LostReason>) {
        if let (Some(s), false) = (&self.sink, state.is_lost()) {
            s.handles.lease_left.record(left.as_secs_f64());
        }
        if let (Some(s), Some(reason)) = (&self.sink, found) {
            s.lost(reason);
        }
        self.finish(if ok { 0 } else { 1 });
    }

    /// `end` indexes [`ENDS`].
    fn finish(&mut self, end: usize) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let held = self.started.elapsed();
        self.span.record("held_s", held.as_secs_f64());
        self.span.record("end", ENDS[end]);
        if let Some(s) = &self.sink {
            s.hold_ended(end, held);
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.finish(2);
    }
}

/// One lease renewal's result (the shared lease's renewal step calls it).
pub(crate) fn renewal(backend: &'static str, result: &'static str, lag: Duration) {
    if !enabled() {
        return;
    }
    metrics::counter!("distlock_lease_renewals_total", "backend" => backend, "result" => result).increment(1);
    metrics::histogram!("distlock_lease_renewal_lag_seconds", "backend" => backend).record(lag.as_secs_f64());
}

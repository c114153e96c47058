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
use std::sync::atomic::{AtomicBool, Ordering};
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
        help: "Holds that ended, by result: released, release_failed (the server no longer had it, or did not answer), dropped (released in the background).",
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

#[derive(Debug, Default)]
struct Names {
    mode: LockNames,
    seen: HashSet<Arc<str>>,
}

/// Starts recording metrics into the installed `metrics` recorder (install it first), with
/// `options`; describes every metric of [`METRICS`] to it. Calling it again changes the options
/// (names already labelled keep their label).
pub fn enable(options: Options) {
    let names = OPTIONS.get_or_init(StdMutex::default);
    names.lock().unwrap_or_else(|e| e.into_inner()).mode = options.lock_names;
    for m in METRICS {
        match m.kind {
            "counter" => metrics::describe_counter!(m.name, m.help),
            "gauge" => metrics::describe_gauge!(m.name, m.help),
            _ => metrics::describe_histogram!(m.name, metrics::Unit::Seconds, m.help),
        }
    }
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

/// An acquire under way: counted as waiting until it ends (or is dropped: cancelled), and timed.
pub(crate) struct Acquire {
    backend: &'static str,
    name: Arc<str>,
    started: Instant,
    metrics: bool,
    ended: bool,
    pub(crate) span: tracing::Span,
}

impl Acquire {
    pub(crate) fn start(backend: &'static str, name: &str) -> Acquire {
        let metrics = enabled();
        if metrics {
            metrics::gauge!("distlock_acquires_waiting", "backend" => backend).increment(1.0);
        }
        let span = tracing::info_span!(
            "distlock.acquire",
            backend,
            lock = name,
            outcome = Empty,
            token = Empty,
            waited_s = Empty
        );
        Acquire { backend, name: Arc::from(name), started: Instant::now(), metrics, ended: false, span }
    }

    /// The acquire ended: `Some(token)` if granted, `None` if not had in time; `busy` says whether
    /// it was a try (no wait) or a timed wait.
    pub(crate) fn end(mut self, outcome: std::result::Result<Option<u64>, ()>, busy: bool) -> Option<Hold> {
        let waited = self.started.elapsed();
        self.ended = true;
        let label = match outcome {
            Ok(Some(_)) => "acquired",
            Ok(None) if busy => "busy",
            Ok(None) => "timed_out",
            Err(()) => "error",
        };
        self.span.record("outcome", label);
        self.span.record("waited_s", waited.as_secs_f64());
        if let Ok(Some(t)) = outcome {
            self.span.record("token", t);
        }
        let metrics = std::mem::replace(&mut self.metrics, false);
        let lock = if metrics { lock_label(&self.name) } else { None };
        if metrics {
            metrics::gauge!("distlock_acquires_waiting", "backend" => self.backend).decrement(1.0);
            let l = labels(&[("backend", self.backend), ("outcome", label)], &lock);
            metrics::counter!("distlock_acquires_total", l.clone()).increment(1);
            metrics::histogram!("distlock_acquire_wait_seconds", l).record(waited.as_secs_f64());
        }
        let Ok(Some(token)) = outcome else { return None };
        if metrics {
            metrics::gauge!("distlock_locks_held", "backend" => self.backend).increment(1.0);
        }
        let span = tracing::info_span!(parent: None, "distlock.hold", backend = self.backend, lock = &*self.name, token, held_s = Empty, end = Empty);
        span.follows_from(&self.span);
        Some(Hold { backend: self.backend, lock, started: Instant::now(), metrics, span, watcher: None, ended: false })
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if self.metrics {
            // Dropped unfinished: the caller gave up (a timeout around it, a select!).
            metrics::gauge!("distlock_acquires_waiting", "backend" => self.backend).decrement(1.0);
            let waited = self.started.elapsed();
            let l = labels(&[("backend", self.backend), ("outcome", "cancelled")], &lock_label(&self.name));
            metrics::counter!("distlock_acquires_total", l.clone()).increment(1);
            metrics::histogram!("distlock_acquire_wait_seconds", l).record(waited.as_secs_f64());
        }
        if self.span.is_none() {
            return;
        }
        if !self.ended {
            self.span.record("outcome", "cancelled");
            self.span.record("waited_s", self.started.elapsed().as_secs_f64());
        }
    }
}

/// A hold: counted as held until it ends; its loss counted when it happens.
pub(crate) struct Hold {
    backend: &'static str,
    lock: Option<Arc<str>>,
    started: Instant,
    metrics: bool,
    span: tracing::Span,
    /// Ends the loss watcher when the hold ends.
    watcher: Option<tokio::sync::oneshot::Sender<()>>,
    ended: bool,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("backend", &self.backend).finish_non_exhaustive()
    }
}

impl Hold {
    /// Counts the hold's loss when `lost` resolves before the hold ends (metrics on only: it
    /// costs a task per hold).
    pub(crate) fn watch_loss(&mut self, lost: crate::contract::BoxFuture<'static, LostReason>) {
        if !self.metrics {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (backend, lock) = (self.backend, self.lock.clone());
        runtime.spawn(async move {
            tokio::select! {
                // The hold's end first: a release ends the lease, which resolves `lost` too.
                biased;
                _ = rx => {}
                reason = lost => {
                    let l = labels(&[("backend", backend), ("reason", reason_label(reason))], &lock);
                    metrics::counter!("distlock_locks_lost_total", l).increment(1);
                }
            }
        });
        self.watcher = Some(tx);
    }

    /// Stops counting losses: the hold is about to end (a release ends the lease, which looks
    /// like a loss to `lost()`).
    pub(crate) fn ending(&mut self) {
        drop(self.watcher.take());
    }

    /// The hold ends by a release that the server answered (`ok`), with `left` before the lease
    /// deadline when it began.
    pub(crate) fn released(&mut self, ok: bool, state: LockState, left: Duration) {
        if self.metrics && !state.is_lost() {
            metrics::histogram!("distlock_release_lease_left_seconds", "backend" => self.backend)
                .record(left.as_secs_f64());
        }
        self.finish(if ok { "released" } else { "release_failed" });
    }

    fn finish(&mut self, end: &'static str) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        // The loss watcher stops: a loss seen by the release itself was counted by it already,
        // or is the release's error (counted as release_failed).
        drop(self.watcher.take());
        let held = self.started.elapsed();
        self.span.record("held_s", held.as_secs_f64());
        self.span.record("end", end);
        if self.metrics {
            metrics::gauge!("distlock_locks_held", "backend" => self.backend).decrement(1.0);
            metrics::histogram!("distlock_hold_seconds", labels(&[("backend", self.backend)], &self.lock))
                .record(held.as_secs_f64());
            metrics::counter!("distlock_releases_total", "backend" => self.backend, "result" => end).increment(1);
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.finish("dropped");
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

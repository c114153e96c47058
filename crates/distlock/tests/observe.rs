//! Metrics and spans on every backend: what a real `metrics` recorder and a `tracing` subscriber
//! receive is exactly what the test caused. The recorder and the subscriber are process-wide, so
//! each test runs its part in a child process of this binary, where nothing else runs beside it.

use distlock::observe::{self, LockNames, Options};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

use crate::common::{self, backends::on_every_backend};

/// Every value recorded so far, summed over snapshots (the debugging recorder resets what it
/// hands out: counters and gauges add up, histograms count their samples).
#[derive(Default)]
struct Totals {
    values: HashMap<(String, Vec<(String, String)>), f64>,
}

impl Totals {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let mut labels: Vec<(String, String)> =
                key.key().labels().map(|l| (l.key().to_string(), l.value().to_string())).collect();
            labels.sort();
            let add = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(v) => v.len() as f64,
            };
            *self.values.entry((key.key().name().to_string(), labels)).or_default() += add;
        }
    }

    /// The sum over series of `name` whose labels include every pair of `with`.
    fn get(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.values
            .iter()
            .filter(|((n, labels), _)| {
                n == name && with.iter().all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| *v)
            .sum()
    }
}

/// Spans closed so far: name and fields.
type Closed = Arc<Mutex<Vec<(String, HashMap<String, String>)>>>;

/// Keeps each span's fields (given at creation and recorded later) and notes them at close.
struct Spans(Closed);

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}").trim_matches('"').to_string());
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &tracing::span::Attributes<'_>, id: &tracing::span::Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        ctx.span(id).unwrap().extensions_mut().insert(f);
    }
    fn on_record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        values.record(ext.get_mut::<Fields>().unwrap());
    }
    fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions_mut().remove::<Fields>().unwrap_or_default();
        self.0.lock().unwrap().push((span.name().to_string(), fields.0));
    }
}

/// Waits (bounded) until `cond` holds of the totals.
async fn wait_for(totals: &mut Totals, snapshotter: &Snapshotter, what: &str, cond: impl Fn(&Totals) -> bool) {
    let totals = std::cell::RefCell::new(totals);
    crate::common::eventually(Duration::from_secs(15), what, || {
        let mut totals = totals.borrow_mut();
        totals.take(snapshotter);
        std::future::ready(cond(&totals))
    })
    .await;
}

on_every_backend!(
    #[tokio::test]
    metrics_and_spans_count_what_happened
);
/// On `url`'s backend, in a process of its own (`alone`).
async fn metrics_and_spans_count_what_happened(url: String) {
    in_a_process_of_its_own(&format!("url={url}"));
}

/// A loss counted when it happens, the cap on lock names, and metrics off (in a process of its own).
#[test]
fn a_loss_the_names_cap_and_off() {
    in_a_process_of_its_own("rest");
}

/// Runs `alone` in a child process of this test binary (the recorder and the subscriber are
/// process-wide, and the other tests of the binary would add to what they see), doing `part`.
fn in_a_process_of_its_own(part: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &common::test_name(module_path!(), "alone"), "--ignored", "--nocapture", "--test-threads=1"])
        .env("DISTLOCK_OBSERVE_PART", part)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "observe's {part} failed in its own process:\n{said}");
    assert!(said.contains("1 passed"), "observe's {part} did not run in its own process:\n{said}");
}

/// The part named by `DISTLOCK_OBSERVE_PART`, with a real recorder and subscriber installed: the
/// only test of its process (`in_a_process_of_its_own` starts it).
#[test]
#[ignore = "run by observe's tests in a process of its own"]
fn alone() {
    let Ok(part) = std::env::var("DISTLOCK_OBSERVE_PART") else {
        return; // run by hand (`--include-ignored`): the tests that start it have run their parts
    };
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap().block_on(async {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder of this test binary");
        let closed: Closed = Arc::default();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Spans(closed.clone()))).unwrap();
        observe::enable(Options { lock_names: LockNames::Capped(1000) });
        let mut totals = Totals::default();

        match part.strip_prefix("url=") {
            Some(url) => on_one_backend(url, &mut totals, &snapshotter, &closed).await,
            None => loss_cap_and_off(&mut totals, &snapshotter).await,
        }
    });
}

/// Locks taken, refused, timed out, cancelled, released and dropped on `url`: every metric and
/// span counts exactly those.
async fn on_one_backend(url: &str, totals: &mut Totals, snapshotter: &Snapshotter, closed: &Closed) {
    let a = distlock::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let b = distlock::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let backend = a.backend();
    let name = a.mutex(&format!("observe-{}", uuid::Uuid::new_v4().simple())).unwrap().name().to_string();
    let (la, lb) = (a.mutex(&name).unwrap(), b.mutex(&name).unwrap());
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let g = la.lock().await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
    }
    let g = la.lock().await.unwrap();
    tokens.push(g.fencing_token());
    assert!(lb.try_lock().await.unwrap().is_none(), "{backend}: held by a");
    assert!(lb.lock_timeout(Duration::from_millis(300)).await.unwrap().is_none(), "{backend}: held by a");
    assert!(tokio::time::timeout(Duration::from_millis(300), lb.lock()).await.is_err(), "{backend}: held by a");
    if backend != "zookeeper" {
        // Renewals of the held lease (every backend but ZooKeeper, whose session is kept by
        // the client's pings).
        wait_for(totals, snapshotter, &format!("{backend}: a lease renewal"), |t| {
            t.get("distlock_lease_renewals_total", &[("backend", backend), ("result", "renewed")]) >= 1.0
        })
        .await;
    }
    g.release().await.unwrap();
    totals.take(snapshotter);

    let lock = [("backend", backend), ("lock", name.as_str())];
    let count = |outcome: &str| totals.get("distlock_acquires_total", &[lock[0], lock[1], ("outcome", outcome)]);
    assert_eq!(count("acquired"), 4.0, "{backend}");
    assert_eq!(count("busy"), 1.0, "{backend}");
    assert_eq!(count("timed_out"), 1.0, "{backend}");
    assert_eq!(count("cancelled"), 1.0, "{backend}");
    assert_eq!(count("error"), 0.0, "{backend}");
    assert_eq!(totals.get("distlock_acquire_wait_seconds", &lock), 7.0, "{backend}: one wait per acquire");
    assert_eq!(totals.get("distlock_hold_seconds", &lock), 4.0, "{backend}");
    assert_eq!(totals.get("distlock_locks_held", &[("backend", backend)]), 0.0, "{backend}: none held now");
    assert_eq!(totals.get("distlock_acquires_waiting", &[("backend", backend)]), 0.0, "{backend}: none waiting now");
    assert_eq!(
        totals.get("distlock_releases_total", &[("backend", backend), ("result", "released")]),
        4.0,
        "{backend}"
    );
    assert_eq!(totals.get("distlock_release_lease_left_seconds", &[("backend", backend)]), 4.0, "{backend}");

    // A dropped guard is a hold too (released in the background).
    drop(la.lock().await.unwrap());
    totals.take(snapshotter);
    assert_eq!(totals.get("distlock_releases_total", &[("backend", backend), ("result", "dropped")]), 1.0, "{backend}");
    // Releases are not losses (a release ends the lease, which `lost()` also sees).
    assert_eq!(totals.get("distlock_locks_lost_total", &lock), 0.0, "{backend}: a release counted as a loss");

    // Spans: one acquire span per acquire with its outcome; one hold span per grant. A span
    // closes when its last handle goes, which a backend's own child span may keep a moment.
    let mine = |n: &str| closed.lock().unwrap().iter().filter(|(s, f)| s == n && f.get("lock") == Some(&name)).count();
    crate::common::eventually(
        Duration::from_secs(15),
        &format!("{backend}: 8 acquire and 5 hold spans closed"),
        || std::future::ready((mine("distlock.acquire"), mine("distlock.hold")) == (8, 5)),
    )
    .await;
    let spans = closed.lock().unwrap().clone();
    let ours = |span: &str| {
        spans
            .iter()
            .filter(|(n, f)| n == span && f.get("lock").map(String::as_str) == Some(name.as_str()))
            .map(|(_, f)| f.clone())
            .collect::<Vec<_>>()
    };
    let acquires = ours("distlock.acquire");
    let outcomes = |o: &str| acquires.iter().filter(|f| f.get("outcome").map(String::as_str) == Some(o)).count();
    assert_eq!(
        (outcomes("acquired"), outcomes("busy"), outcomes("timed_out"), outcomes("cancelled")),
        (5, 1, 1, 1),
        "{backend}: {acquires:?}"
    );
    assert!(acquires
        .iter()
        .all(|f| f.get("backend").map(String::as_str) == Some(backend) && f.contains_key("waited_s")));
    let holds = ours("distlock.hold");
    assert_eq!(holds.len(), 5, "{backend}: {holds:?}");
    let mut held_tokens: Vec<u64> = holds.iter().filter_map(|f| f.get("token")?.parse().ok()).collect();
    held_tokens.sort();
    assert!(held_tokens.starts_with(&tokens), "{backend}: hold spans' tokens {held_tokens:?}, grants {tokens:?}");
    assert_eq!(holds.iter().filter(|f| f.get("end").map(String::as_str) == Some("released")).count(), 4);
    assert_eq!(holds.iter().filter(|f| f.get("end").map(String::as_str) == Some("dropped")).count(), 1);

    a.close(Duration::from_secs(5)).await;
    b.close(Duration::from_secs(5)).await;
}

/// A loss counted when it happens (on SQLite), then the cap on lock names, then metrics off.
async fn loss_cap_and_off(totals: &mut Totals, snapshotter: &Snapshotter) {
    #[cfg(feature = "sqlite")]
    a_loss_is_counted_when_it_happens(totals, snapshotter).await;

    // The cap: names already labelled keep their label; new ones share `_other`.
    observe::enable(Options { lock_names: LockNames::Capped(0) });
    let dir = std::env::temp_dir().join(format!("distlock-observe-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = distlock::connect(&format!("sqlite://{}/locks.db", dir.display())).await.unwrap();
    for i in 0..3 {
        client.mutex(&format!("capped-{i}")).unwrap().lock().await.unwrap().release().await.unwrap();
    }
    totals.take(snapshotter);
    assert_eq!(totals.get("distlock_acquires_total", &[("lock", observe::OTHER_NAMES), ("outcome", "acquired")]), 3.0);
    assert!(totals
        .values
        .keys()
        .all(|(_, labels)| !labels.iter().any(|(k, v)| k == "lock" && v.starts_with("capped-"))));
    // Off: no metric at all.
    observe::disable();
    client.mutex("off").unwrap().lock().await.unwrap().release().await.unwrap();
    totals.take(snapshotter);
    assert_eq!(totals.get("distlock_acquires_total", &[("lock", observe::OTHER_NAMES), ("outcome", "acquired")]), 3.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loss is counted once, with its reason, when it happens (not at the release). On SQLite,
/// whose row a third party can delete.
#[cfg(feature = "sqlite")]
async fn a_loss_is_counted_when_it_happens(totals: &mut Totals, snapshotter: &Snapshotter) {
    use sqlx::Connection;
    let dir = std::env::temp_dir().join(format!("distlock-observe-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = format!("sqlite://{}/locks.db", dir.display());
    let client = distlock::connect(&format!("{file}?lease=2s")).await.unwrap();
    let g = client.mutex("lost-row").unwrap().lock().await.unwrap();
    let mut raw = sqlx::SqliteConnection::connect(&file).await.unwrap();
    sqlx::query("DELETE FROM distlock_leases WHERE name = 'lost-row'").execute(&mut raw).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("loss reported");
    assert_eq!(reason, distlock::LostReason::KeyDeleted);
    let lock = [("backend", "sqlite"), ("lock", "lost-row")];
    wait_for(totals, snapshotter, "the loss counted", |t| {
        t.get("distlock_locks_lost_total", &[lock[0], lock[1], ("reason", "key_deleted")]) == 1.0
    })
    .await;
    assert!(g.release().await.is_err(), "a lost lock's release says so");
    totals.take(snapshotter);
    assert_eq!(totals.get("distlock_locks_lost_total", &lock), 1.0, "counted once");
    assert_eq!(totals.get("distlock_releases_total", &[("backend", "sqlite"), ("result", "release_failed")]), 1.0);
    assert_eq!(totals.get("distlock_locks_held", &[("backend", "sqlite")]), 0.0);

    // A loss that only the release finds (its renewal not due yet): counted by the release.
    let client30 = distlock::connect(&format!("{file}?lease=30s")).await.unwrap();
    let g = client30.mutex("lost-at-release").unwrap().lock().await.unwrap();
    sqlx::query("DELETE FROM distlock_leases WHERE name = 'lost-at-release'").execute(&mut raw).await.unwrap();
    assert!(g.state().is_held(), "no renewal yet: the holder cannot know");
    match g.release().await {
        Err(distlock::Error::LockLost { reason, .. }) => assert_eq!(reason, distlock::LostReason::KeyDeleted),
        other => panic!("the release should find the row gone: {other:?}"),
    }
    totals.take(snapshotter);
    let lock = [("backend", "sqlite"), ("lock", "lost-at-release")];
    assert_eq!(totals.get("distlock_locks_lost_total", &[lock[0], lock[1], ("reason", "key_deleted")]), 1.0);
    client30.close(Duration::from_secs(5)).await;
    client.close(Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/observability.md lists every metric the library records, with its type.
#[test]
fn the_docs_list_every_metric() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/observability.md")).unwrap();
    for m in observe::METRICS {
        assert!(doc.contains(&format!("| `{}` | {} |", m.name, m.kind)), "docs/observability.md lacks {}", m.name);
    }
}

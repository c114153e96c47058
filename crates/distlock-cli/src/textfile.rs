//! `--metrics-textfile PATH`: what one `exec` or `hold` run did, written at exit in the
//! Prometheus text format for node_exporter's textfile collector (the convention for batch
//! jobs): replaced atomically (a temporary file in the same directory, then a rename), so the
//! collector never reads half a file.
//!
//! The run is one per process, so its record is process-wide: the acquire, the release and the
//! loss each note their part, and whoever ends the process writes it.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

#[derive(Debug)]
struct Invocation {
    path: PathBuf,
    command: &'static str,
    locks: String,
    started: Instant,
    /// `acquired`, `busy`, `interrupted` or `error` (until the acquire says otherwise).
    outcome: &'static str,
    waited: Option<f64>,
    acquired_at: Option<Instant>,
    held: Option<f64>,
    tokens: Vec<(String, u64)>,
    lost: Option<String>,
    written: bool,
}

static RUN: Mutex<Option<Invocation>> = Mutex::new(None);

fn with(f: impl FnOnce(&mut Invocation)) {
    let mut run = RUN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(run) = run.as_mut() {
        f(run);
    }
}

/// The run starts: its figures go to `path` at exit (nothing is recorded without a path).
///
/// # Errors
///
/// When a file cannot be written beside `path` (no such directory, no permission): found now,
/// before anything is taken or run, rather than at exit.
pub fn start(path: Option<PathBuf>, command: &'static str, locks: &[String]) -> anyhow::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let probe = temporary(&path).map_err(|e| anyhow::anyhow!("--metrics-textfile {}: {e}", path.display()))?;
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| anyhow::anyhow!("--metrics-textfile {}: cannot write beside it: {e}", path.display()))?;
    *RUN.lock().unwrap_or_else(|e| e.into_inner()) = Some(Invocation {
        path,
        command,
        locks: crate::shown::list(locks.iter().map(String::as_str)),
        started: Instant::now(),
        outcome: "error",
        waited: None,
        acquired_at: None,
        held: None,
        tokens: Vec::new(),
        lost: None,
        written: false,
    });
    Ok(())
}

/// The acquire ended without the locks: `busy`, `interrupted` or `error`.
pub fn not_acquired(outcome: &'static str) {
    with(|r| {
        r.outcome = outcome;
        r.waited = Some(r.started.elapsed().as_secs_f64());
    });
}

/// The locks were granted, with these fencing tokens.
pub fn acquired(tokens: Vec<(String, u64)>) {
    with(|r| {
        r.outcome = "acquired";
        r.waited = Some(r.started.elapsed().as_secs_f64());
        r.acquired_at = Some(Instant::now());
        r.tokens = tokens;
    });
}

/// The hold ends (its release begins).
pub fn released() {
    with(|r| {
        if let (Some(at), None) = (r.acquired_at, r.held) {
            r.held = Some(at.elapsed().as_secs_f64());
        }
    });
}

/// A lock was lost (or about to be) while held.
pub fn lost(reason: &str) {
    with(|r| {
        r.lost.get_or_insert_with(|| reason.to_string());
    });
}

/// Writes the run's figures with its exit status, once; says on stderr if it cannot.
pub fn finish(exit: u8) {
    let mut run = RUN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(run) = run.as_mut() else { return };
    if std::mem::replace(&mut run.written, true) {
        return;
    }
    if let (Some(at), None) = (run.acquired_at, run.held) {
        run.held = Some(at.elapsed().as_secs_f64());
    }
    if run.waited.is_none() {
        run.waited = Some(run.started.elapsed().as_secs_f64());
    }
    if let Err(e) = write(run, exit) {
        crate::shown::say!("distlock: cannot write --metrics-textfile {}: {e}", run.path.display());
    }
}

/// The temporary file the figures are written to before they replace `path`: beside it.
fn temporary(path: &std::path::Path) -> std::io::Result<PathBuf> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::other("the path names no file"))?;
    Ok(dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id())))
}

fn write(run: &Invocation, exit: u8) -> std::io::Result<()> {
    let text = render(run, exit, SystemTime::now());
    let tmp = temporary(&run.path)?;
    let out = (|| {
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &run.path)
    })();
    if out.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    out
}

/// A label value, escaped as the text format wants.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn render(run: &Invocation, exit: u8, now: SystemTime) -> String {
    let base = format!("command=\"{}\",lock=\"{}\"", run.command, esc(&run.locks));
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, lines: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (labels, value) in lines {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let secs = |v: Option<f64>| format!("{}", v.unwrap_or(0.0));
    gauge(
        "distlock_run_wait_seconds",
        "Time the run waited for its locks (connecting included).",
        vec![(base.clone(), secs(run.waited))],
    );
    gauge(
        "distlock_run_held_seconds",
        "Time the run held its locks (0 if never acquired).",
        vec![(base.clone(), secs(run.held))],
    );
    gauge(
        "distlock_run_outcome",
        "How the acquire ended: 1 for the outcome that happened (acquired, busy, interrupted, error), 0 for the others.",
        ["acquired", "busy", "interrupted", "error"]
            .iter()
            .map(|o| (format!("{base},outcome=\"{o}\""), if *o == run.outcome { "1" } else { "0" }.to_string()))
            .collect(),
    );
    gauge("distlock_run_exit_status", "distlock's exit status.", vec![(base.clone(), exit.to_string())]);
    gauge(
        "distlock_run_lost",
        "1 if a lock was lost (or about to be) while held, with the reason; else 0.",
        vec![match &run.lost {
            Some(reason) => (format!("{base},reason=\"{}\"", esc(reason)), "1".into()),
            None => (format!("{base},reason=\"\""), "0".into()),
        }],
    );
    gauge(
        "distlock_run_fencing_token",
        "The fencing token of each lock the run held (label lock: that lock).",
        run.tokens
            .iter()
            .map(|(l, t)| (format!("command=\"{}\",lock=\"{}\"", run.command, esc(l)), t.to_string()))
            .collect(),
    );
    let ts = now.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    gauge("distlock_run_last_timestamp_seconds", "When the run ended (Unix time).", vec![(base, format!("{ts:.3}"))]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_gauge_per_figure_with_escaped_labels() {
        let run = Invocation {
            path: "x.prom".into(),
            command: "exec",
            locks: "a\"b".into(),
            started: Instant::now(),
            outcome: "busy",
            waited: Some(0.5),
            acquired_at: None,
            held: None,
            tokens: vec![],
            lost: None,
            written: false,
        };
        let text = render(&run, 75, SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(10));
        assert!(text.contains("distlock_run_outcome{command=\"exec\",lock=\"a\\\"b\",outcome=\"busy\"} 1\n"), "{text}");
        assert!(text.contains("distlock_run_exit_status{command=\"exec\",lock=\"a\\\"b\"} 75\n"), "{text}");
        assert!(text.contains("distlock_run_wait_seconds{command=\"exec\",lock=\"a\\\"b\"} 0.5\n"), "{text}");
        assert!(
            text.contains("distlock_run_last_timestamp_seconds{command=\"exec\",lock=\"a\\\"b\"} 10.000\n"),
            "{text}"
        );
        assert!(!text.contains("distlock_run_fencing_token{"), "{text}");
    }
}

//! A server of a test's own, started by one of the project's scripts (`scripts/redis.sh`,
//! `scripts/postgres.sh`, …) in a directory of its own, and stopped by the same script when
//! dropped: tests that need a server set up differently from the shared one (TLS only, a
//! restart) start it with this, and stop only what they started.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A server started by `scripts/SCRIPT COMMAND DIR ARGS…`; `scripts/SCRIPT stop DIR` when dropped.
#[derive(Debug)]
pub struct OwnServer {
    script: PathBuf,
    dir: PathBuf,
    /// What the script printed: the server's address or URL.
    pub printed: String,
}

impl OwnServer {
    /// Runs `scripts/{script} {command} DIR {args}` in a new directory under the temporary
    /// directory.
    ///
    /// # Panics
    ///
    /// If the script fails (its standard error is in the message).
    pub fn start(script: &str, command: &str, args: &[&str]) -> OwnServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts").join(script);
        let dir = std::env::temp_dir().join(format!("distlock-own-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = run_script(&script, command, &dir, args);
        OwnServer { script, dir, printed: String::from_utf8_lossy(&out.stdout).trim().to_string() }
    }

    /// The server's directory (the scripts keep its certificates, password and pid there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `scripts/{script} {command} DIR {args}` on this server (e.g. `use-cert DIR expired`).
    ///
    /// # Panics
    ///
    /// If the script fails (its standard error is in the message).
    pub fn run(&self, command: &str, args: &[&str]) {
        run_script(&self.script, command, &self.dir, args);
    }

    /// A file of the server's directory, as a string (for URLs and flags).
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// Runs `SCRIPT COMMAND DIR ARGS…`; its output, once it has succeeded.
///
/// # Panics
///
/// If it cannot be run or fails (the script, its exit status and standard error are in the
/// message).
fn run_script(script: &Path, command: &str, dir: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(script).arg(command).arg(dir).args(args).output().expect("run the server script");
    assert!(
        out.status.success(),
        "{} {command} failed ({}): {}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

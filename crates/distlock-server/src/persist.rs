//! Durability with `--data-dir`: a transaction log and snapshots.
//!
//! Every committed transaction is appended to `log.jsonl` as one JSON line
//! (`{"zxid":..,"time":..,"m":[mutations]}`) before the client sees its reply. Every
//! `snapshot_every` transactions the whole state (tree and sessions) is written to
//! `snapshot.json` (via a temporary file, fsynced, then renamed) and the log is emptied. On
//! start the snapshot is loaded and the log replayed; a torn last line (a crash mid-write) is
//! dropped.
//!
//! Fsync policy ([`Fsync`]): `always` (default, like ZooKeeper's forceSync=yes) fsyncs the log
//! before replying; `never` leaves flushing to the OS (a crash of the machine may lose the last
//! transactions; a crash of the process does not).

use crate::tree::{Mutation, Tree};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// When the transaction log is flushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fsync {
    /// fsync after every transaction, before replying.
    #[default]
    Always,
    /// Never fsync explicitly.
    Never,
}

impl std::str::FromStr for Fsync {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Fsync::Always),
            "never" => Ok(Fsync::Never),
            other => Err(format!("unknown fsync policy {other:?} (always, never)")),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct LogEntry {
    zxid: i64,
    time: i64,
    m: Vec<Mutation>,
}

#[derive(Serialize, Deserialize)]
struct Snapshot {
    zxid: i64,
    tree: Tree,
    sessions: Vec<(i64, Vec<u8>, i32)>,
}

pub struct Persist {
    dir: PathBuf,
    log: File,
    fsync: Fsync,
    since_snapshot: u64,
    snapshot_every: u64,
}

/// What was recovered from the data directory.
pub struct Recovered {
    pub tree: Tree,
    pub zxid: i64,
    pub sessions: Vec<(i64, Vec<u8>, i32)>,
}

impl Persist {
    /// Opens (creating if needed) a data directory and recovers its state.
    pub fn open(dir: &Path, fsync: Fsync, snapshot_every: u64) -> std::io::Result<(Persist, Recovered)> {
        std::fs::create_dir_all(dir)?;
        let snap_path = dir.join("snapshot.json");
        let (mut tree, mut zxid, mut sessions) = match std::fs::read(&snap_path) {
            Ok(bytes) => {
                let s: Snapshot = serde_json::from_slice(&bytes)
                    .map_err(|e| std::io::Error::other(format!("{}: {e}", snap_path.display())))?;
                (s.tree, s.zxid, s.sessions)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Tree::default(), 0, Vec::new()),
            Err(e) => return Err(e),
        };
        let log_path = dir.join("log.jsonl");
        let mut good_len = 0u64;
        let mut replayed = 0u64;
        if let Ok(f) = File::open(&log_path) {
            let mut reader = BufReader::new(f);
            let mut line = String::new();
            loop {
                line.clear();
                let n = reader.read_line(&mut line)?;
                if n == 0 || !line.ends_with('\n') {
                    break;
                }
                let Ok(entry) = serde_json::from_str::<LogEntry>(&line) else { break };
                good_len += n as u64;
                if entry.zxid <= zxid {
                    continue;
                }
                for m in &entry.m {
                    match m {
                        Mutation::OpenSession { id, password, timeout_ms } => {
                            sessions.push((*id, password.clone(), *timeout_ms))
                        }
                        Mutation::CloseSession { id } => sessions.retain(|s| s.0 != *id),
                        m => tree.apply(m),
                    }
                }
                zxid = entry.zxid;
                replayed += 1;
            }
        }
        let log = OpenOptions::new().create(true).append(true).open(&log_path)?;
        if log.metadata()?.len() > good_len {
            tracing::warn!(path = %log_path.display(), "dropping a torn transaction at the end of the log");
            log.set_len(good_len)?;
        }
        tracing::info!(dir = %dir.display(), zxid, replayed, sessions = sessions.len(), "recovered");
        let p = Persist { dir: dir.to_path_buf(), log, fsync, since_snapshot: replayed, snapshot_every };
        Ok((p, Recovered { tree, zxid, sessions }))
    }

    pub fn append(&mut self, zxid: i64, time: i64, m: &[Mutation]) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&LogEntry { zxid, time, m: m.to_vec() }).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.log.write_all(&line)?;
        if self.fsync == Fsync::Always {
            self.log.sync_data()?;
        }
        self.since_snapshot += 1;
        Ok(())
    }

    pub fn wants_snapshot(&self) -> bool {
        self.since_snapshot >= self.snapshot_every
    }

    pub fn snapshot(&mut self, zxid: i64, tree: &Tree, sessions: &[(i64, Vec<u8>, i32)]) -> std::io::Result<()> {
        let tmp = self.dir.join("snapshot.json.tmp");
        let bytes = serde_json::to_vec(&Snapshot { zxid, tree: tree.clone(), sessions: sessions.to_vec() })
            .map_err(std::io::Error::other)?;
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join("snapshot.json"))?;
        self.log.set_len(0)?;
        self.log.sync_all()?;
        self.since_snapshot = 0;
        Ok(())
    }
}

//! Durability with `--data-dir`: a transaction log and snapshots.
//!
//! Every committed transaction is appended to `log.jsonl` as one line, `<crc32> <json>`: the
//! CRC-32 (8 hex digits) of the JSON `{"zxid":..,"time":..,"m":[mutations]}` that follows it,
//! before the client sees its reply. Every `snapshot_every` transactions the whole state (tree and
//! sessions) is written to `snapshot.json` (via a temporary file, fsynced, renamed, and the
//! directory fsynced so the rename survives a power cut) and only then is the log emptied.
//!
//! On start the snapshot is loaded and the log replayed. The last record may be torn (a crash
//! mid-write: no newline, a bad checksum, bytes that are not UTF-8): it is dropped, and the file
//! cut there. A damaged record with records after it is not a crash's doing: the server refuses
//! to start, naming the file and the byte offset, rather than silently dropping acknowledged
//! transactions (Apache ZooKeeper refuses too: "CRC check failed"). Lines from before checksums
//! (starting with `{`) are still read.
//!
//! Fsync policy ([`Fsync`]): `always` (default, like ZooKeeper's forceSync=yes) fsyncs the log
//! before replying; `never` leaves flushing to the OS (a crash of the machine may lose the last
//! transactions; a crash of the process does not).

use crate::tree::{Mutation, Tree};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
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

/// One log line (without its newline): `<crc32> <json>`, or a bare JSON line from before
/// checksums.
fn parse_record(line: &[u8]) -> Result<LogEntry, String> {
    let json = if line.first() == Some(&b'{') {
        line
    } else {
        let (crc, json) = match (line.get(..8), line.get(8), line.get(9..)) {
            (Some(crc), Some(b' '), Some(json)) => (crc, json),
            _ => return Err("no checksum".into()),
        };
        let crc =
            std::str::from_utf8(crc).ok().and_then(|c| u32::from_str_radix(c, 16).ok()).ok_or("bad checksum field")?;
        if crc32fast::hash(json) != crc {
            return Err("checksum mismatch".into());
        }
        json
    };
    serde_json::from_slice(json).map_err(|e| format!("unreadable record: {e}"))
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
        let bytes = match std::fs::read(&log_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut good_len = 0usize;
        let mut replayed = 0u64;
        while good_len < bytes.len() {
            let rest = &bytes[good_len..];
            let Some(end) = rest.iter().position(|&b| b == b'\n') else {
                break; // torn: the crash came before the newline
            };
            let entry = match parse_record(&rest[..end]) {
                Ok(entry) => entry,
                // Nothing complete after it: a crash's torn tail.
                Err(why) if !rest[end + 1..].contains(&b'\n') => {
                    tracing::warn!(path = %log_path.display(), offset = good_len, why, "the last record is torn");
                    break;
                }
                Err(why) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{}: damaged record at byte offset {good_len} ({why}) with {} more bytes after it; \
                             refusing to start rather than drop acknowledged transactions \
                             (move the file aside to start from the snapshot alone)",
                            log_path.display(),
                            rest.len() - end - 1
                        ),
                    ))
                }
            };
            good_len += end + 1;
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
        let good_len = good_len as u64;
        let log = OpenOptions::new().create(true).append(true).open(&log_path)?;
        if log.metadata()?.len() > good_len {
            tracing::warn!(path = %log_path.display(), offset = good_len, "dropping a torn transaction at the end of the log");
            log.set_len(good_len)?;
            log.sync_all()?;
        }
        tracing::info!(dir = %dir.display(), zxid, replayed, sessions = sessions.len(), "recovered");
        let p = Persist { dir: dir.to_path_buf(), log, fsync, since_snapshot: replayed, snapshot_every };
        Ok((p, Recovered { tree, zxid, sessions }))
    }

    pub fn append(&mut self, zxid: i64, time: i64, m: &[Mutation]) -> std::io::Result<()> {
        let json = serde_json::to_vec(&LogEntry { zxid, time, m: m.to_vec() }).map_err(std::io::Error::other)?;
        let mut line = format!("{:08x} ", crc32fast::hash(&json)).into_bytes();
        line.extend_from_slice(&json);
        line.push(b'\n');
        // Written at once; with `always` the fsync is the syncer thread's (group commit), and
        // nothing revealing this transaction is sent before it (see `outbox::Gate`).
        self.log.write_all(&line)?;
        self.since_snapshot += 1;
        Ok(())
    }

    pub fn fsync(&self) -> Fsync {
        self.fsync
    }

    /// A handle on the current log for the syncer thread to fsync.
    pub fn sync_handle(&self) -> std::io::Result<File> {
        self.log.try_clone()
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
        // The rename must be on disk before the log it replaces is emptied.
        File::open(&self.dir)?.sync_all()?;
        self.log.set_len(0)?;
        self.log.sync_all()?;
        self.since_snapshot = 0;
        Ok(())
    }
}

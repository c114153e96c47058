//! Durability with `--data-dir`: a transaction log in segments, and snapshots.
//!
//! Every committed transaction is appended to the current log segment, `log.<first zxid, 16 hex
//! digits>.jsonl`, as one line `<crc32> <json>`: the CRC-32 (8 hex digits) of the JSON
//! `{"zxid":..,"time":..,"m":[mutations]}` that follows it. With fsync `always` nothing that
//! reveals a transaction is sent before an fsync covers it (group commit: `outbox::Gate`).
//!
//! Every `snapshot_every` transactions a snapshot is taken without stalling clients: under the
//! state lock the current segment is fsynced, a new one started, and a copy of the tree made
//! (nodes share their data and ACLs with the live tree, so the copy costs one path per node);
//! a background thread then writes `snapshot.bin` (a compact binary form with a CRC-32 trailer;
//! via a temporary file, fsynced, renamed, and the directory fsynced) and only then deletes the
//! segments the snapshot covers. A crash at any point leaves a snapshot and every segment after
//! it: records the snapshot already holds are skipped on replay.
//!
//! On start the snapshot is loaded and the segments replayed in order. The last record of the
//! last segment may be torn (a crash mid-write: no newline, a bad checksum, bytes that are not
//! UTF-8): it is dropped, and the file cut there. Any other damaged record is not a crash's
//! doing: the server refuses to start, naming the file and the byte offset, rather than silently
//! dropping acknowledged transactions (Apache ZooKeeper refuses too: "CRC check failed"). Files
//! of earlier versions (`log.jsonl`, `snapshot.json`, lines without checksums) are still read.
//!
//! Fsync policy ([`Fsync`]): `always` (default, like ZooKeeper's forceSync=yes) fsyncs the log
//! before replying; `never` leaves flushing to the OS (a crash of the machine may lose the last
//! transactions; a crash of the process does not).

use crate::proto::{Acl, Stat};
use crate::tree::{Data, Mutation, Node, Tree};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// When the transaction log is flushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
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

/// A session as snapshots keep it: id, password, timeout.
pub type SavedSession = (i64, Vec<u8>, i32);

pub struct Persist {
    dir: PathBuf,
    /// The segment being appended to, and the zxid its name starts at.
    log: File,
    log_start: i64,
    fsync: Fsync,
    since_snapshot: u64,
    snapshot_every: u64,
    /// A snapshot is being written in the background.
    snapshotting: Arc<AtomicBool>,
    /// Snapshots written: count and total time (microseconds), for the metrics.
    snapshot_times: Arc<[std::sync::atomic::AtomicU64; 2]>,
    /// The thread writing the latest snapshot (joined when the server stops).
    writer: Option<std::thread::JoinHandle<()>>,
}

/// What was recovered from the data directory.
#[non_exhaustive]
pub struct Recovered {
    pub tree: Tree,
    pub zxid: i64,
    pub sessions: Vec<SavedSession>,
}

const SNAPSHOT: &str = "snapshot.bin";
const MAGIC: &[u8; 8] = b"DLSNAP01";

fn segment_name(start: i64) -> String {
    format!("log.{start:016x}.jsonl")
}

/// The log files of `dir` in replay order: the legacy `log.jsonl` first, then the segments by
/// their first zxid.
fn log_files(dir: &Path) -> std::io::Result<Vec<(i64, PathBuf)>> {
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name == "log.jsonl" {
            logs.push((-1, path));
        } else if let Some(hex) = name.strip_prefix("log.").and_then(|n| n.strip_suffix(".jsonl")) {
            if let Ok(start) = i64::from_str_radix(hex, 16) {
                logs.push((start, path));
            }
        }
    }
    logs.sort();
    Ok(logs)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Persist {
    /// Opens (creating if needed) a data directory and recovers its state.
    pub fn open(dir: &Path, fsync: Fsync, snapshot_every: u64) -> std::io::Result<(Persist, Recovered)> {
        std::fs::create_dir_all(dir)?;
        let (mut tree, mut zxid, mut sessions) = load_snapshot(dir)?;
        let snapshot_zxid = zxid;
        let logs = log_files(dir)?;
        let mut replayed = 0u64;
        for (i, (_, path)) in logs.iter().enumerate() {
            let last = i + 1 == logs.len();
            let good_len = replay(path, last, snapshot_zxid, &mut |entry| {
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
            })?;
            if last {
                let f = OpenOptions::new().write(true).open(path)?;
                if f.metadata()?.len() > good_len {
                    tracing::warn!(path = %path.display(), offset = good_len, "dropping a torn transaction at the end of the log");
                    f.set_len(good_len)?;
                    f.sync_all()?;
                }
            }
        }
        // Appends go on in the last segment (a legacy `log.jsonl` too, until the next snapshot).
        let (log_start, log_path) = match logs.last() {
            Some((start, path)) => (*start, path.clone()),
            None => (zxid + 1, dir.join(segment_name(zxid + 1))),
        };
        let log = OpenOptions::new().create(true).append(true).open(&log_path)?;
        if logs.is_empty() {
            sync_dir(dir)?;
        }
        tracing::info!(dir = %dir.display(), zxid, replayed, sessions = sessions.len(), "recovered");
        let p = Persist {
            dir: dir.to_path_buf(),
            log,
            log_start,
            fsync,
            since_snapshot: replayed,
            snapshot_every,
            snapshotting: Arc::new(AtomicBool::new(false)),
            snapshot_times: Arc::default(),
            writer: None,
        };
        Ok((p, Recovered { tree, zxid, sessions }))
    }

    pub fn append(&mut self, zxid: i64, time: i64, m: &[Mutation]) -> std::io::Result<()> {
        let json = serde_json::to_vec(&LogEntry { zxid, time, m: m.to_vec() }).map_err(std::io::Error::other)?;
        let mut line = format!("{:08x} ", crc32fast::hash(&json)).into_bytes();
        line.extend_from_slice(&json);
        line.push(b'\n');
        // Written at once; with `always` the fsync comes after (group commit), and nothing
        // revealing this transaction is sent before it (see `outbox::Gate`).
        self.log.write_all(&line)?;
        self.since_snapshot += 1;
        Ok(())
    }

    pub fn fsync(&self) -> Fsync {
        self.fsync
    }

    /// A handle on the current segment for `State::sync` to fsync.
    pub fn sync_handle(&self) -> std::io::Result<File> {
        self.log.try_clone()
    }

    pub fn wants_snapshot(&self) -> bool {
        self.since_snapshot >= self.snapshot_every && !self.snapshotting.load(Ordering::SeqCst)
    }

    /// Starts a snapshot of the state as of `zxid` (called under the state lock, right after the
    /// transaction `zxid` was written): ends the current segment, starts the next, and leaves the
    /// writing to a background thread.
    pub fn start_snapshot(&mut self, zxid: i64, tree: &Tree, sessions: Vec<SavedSession>) -> std::io::Result<()> {
        // With `always`, the old segment's records must be on disk before appends move on:
        // `State::sync` only fsyncs the current segment. (With `never` nothing is promised
        // against a power cut, and an fsync here would stall every client.)
        if self.fsync == Fsync::Always {
            self.log.sync_data()?;
        }
        let start = zxid + 1;
        let path = self.dir.join(segment_name(start));
        self.log = OpenOptions::new().create(true).append(true).open(&path)?;
        self.log_start = start;
        sync_dir(&self.dir)?;
        self.since_snapshot = 0;
        // A copy as of now, cheap: paths, and shared data and ACLs.
        let nodes: Vec<(String, Data, Arc<Vec<Acl>>, Stat)> =
            tree.nodes.iter().map(|(p, n)| (p.clone(), n.data.clone(), n.acl.clone(), n.stat)).collect();
        let dir = self.dir.clone();
        let running = self.snapshotting.clone();
        let times = self.snapshot_times.clone();
        running.store(true, Ordering::SeqCst);
        self.writer = Some(std::thread::Builder::new().name("distlock-snapshot".into()).spawn(move || {
            let started = std::time::Instant::now();
            let count = nodes.len();
            match write_snapshot(&dir, zxid, &nodes, &sessions).and_then(|()| drop_covered(&dir, start)) {
                Ok(()) => {
                    tracing::info!(zxid, nodes = count, took = ?started.elapsed(), "snapshot written");
                    times[0].fetch_add(1, Ordering::SeqCst);
                    times[1].fetch_add(started.elapsed().as_micros() as u64, Ordering::SeqCst);
                }
                Err(e) => tracing::warn!(error = %e, "snapshot failed; the log keeps growing until the next"),
            }
            running.store(false, Ordering::SeqCst);
        })?);
        // The deterministic simulation writes the snapshot before going on: a thread's timing
        // must not decide whether the next snapshot may start.
        #[cfg(distlock_sim)]
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        Ok(())
    }

    /// The thread writing the latest snapshot, if any, for a stopping server to wait for: a
    /// server started afterwards on the same directory must not find segments vanishing under
    /// it as the old snapshot's clean-up deletes them.
    pub fn take_snapshot_writer(&mut self) -> Option<std::thread::JoinHandle<()>> {
        self.writer.take()
    }

    /// Snapshots written so far: how many, and their total time in microseconds.
    pub fn snapshot_times(&self) -> (u64, u64) {
        (self.snapshot_times[0].load(Ordering::SeqCst), self.snapshot_times[1].load(Ordering::SeqCst))
    }

    /// Whether a background snapshot is being written (for tests and shutdown).
    pub fn snapshot_running(&self) -> bool {
        self.snapshotting.load(Ordering::SeqCst)
    }
}

/// Replays the records of one log file with zxid above `after`; returns the length of its good
/// prefix. A damaged record is tolerated only as the torn tail of the `last` file.
fn replay(path: &Path, last: bool, after: i64, apply: &mut dyn FnMut(LogEntry)) -> std::io::Result<u64> {
    let bytes = std::fs::read(path)?;
    let mut good_len = 0usize;
    while good_len < bytes.len() {
        let rest = &bytes[good_len..];
        let complete = rest.iter().position(|&b| b == b'\n');
        let parsed = match complete {
            Some(end) => parse_record(&rest[..end]).map(|e| (e, end)),
            None => Err("no newline".to_string()),
        };
        let (entry, end) = match parsed {
            Ok(p) => p,
            // Nothing complete after it in the last file: a crash's torn tail.
            Err(why) if last && !complete.is_some_and(|end| rest[end + 1..].contains(&b'\n')) => {
                tracing::warn!(path = %path.display(), offset = good_len, why, "the last record is torn");
                break;
            }
            Err(why) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: damaged record at byte offset {good_len} ({why}) with {} more bytes after it; \
                         refusing to start rather than drop acknowledged transactions \
                         (move the file aside to start from the snapshot alone)",
                        path.display(),
                        rest.len() - complete.map_or(rest.len(), |e| e + 1)
                    ),
                ))
            }
        };
        good_len += end + 1;
        if entry.zxid > after {
            apply(entry);
        }
    }
    Ok(good_len as u64)
}

/// Deletes what the snapshot just written covers: segments before `start`, and files of earlier
/// versions.
fn drop_covered(dir: &Path, start: i64) -> std::io::Result<()> {
    for (first, path) in log_files(dir)? {
        if first < start {
            std::fs::remove_file(path)?;
        }
    }
    match std::fs::remove_file(dir.join("snapshot.json")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    sync_dir(dir)
}

/// Writes `snapshot.bin`: magic, zxid, sessions, nodes, CRC-32 of all before it.
fn write_snapshot(
    dir: &Path,
    zxid: i64,
    nodes: &[(String, Data, Arc<Vec<Acl>>, Stat)],
    sessions: &[SavedSession],
) -> std::io::Result<()> {
    struct Out<W: Write> {
        w: W,
        crc: crc32fast::Hasher,
    }
    impl<W: Write> Out<W> {
        fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
            self.crc.update(b);
            self.w.write_all(b)
        }
        fn bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
            self.put(&(b.len() as u32).to_be_bytes())?;
            self.put(b)
        }
    }
    let tmp = dir.join("snapshot.bin.tmp");
    let file = File::create(&tmp)?;
    let mut o = Out { w: BufWriter::with_capacity(1 << 20, file), crc: crc32fast::Hasher::new() };
    o.put(MAGIC)?;
    o.put(&zxid.to_be_bytes())?;
    o.put(&(sessions.len() as u32).to_be_bytes())?;
    for (id, password, timeout) in sessions {
        o.put(&id.to_be_bytes())?;
        o.put(&timeout.to_be_bytes())?;
        o.bytes(password)?;
    }
    o.put(&(nodes.len() as u64).to_be_bytes())?;
    for (path, data, acl, st) in nodes {
        o.bytes(path.as_bytes())?;
        match data {
            Some(d) => o.bytes(d)?,
            None => o.put(&u32::MAX.to_be_bytes())?,
        }
        o.put(&(acl.len() as u32).to_be_bytes())?;
        for a in acl.iter() {
            o.put(&a.perms.to_be_bytes())?;
            o.bytes(a.scheme.as_bytes())?;
            o.bytes(a.id.as_bytes())?;
        }
        for v in [st.czxid, st.mzxid, st.ctime, st.mtime, st.ephemeral_owner, st.pzxid] {
            o.put(&v.to_be_bytes())?;
        }
        for v in [st.version, st.cversion, st.aversion, st.data_length, st.num_children] {
            o.put(&v.to_be_bytes())?;
        }
    }
    let crc = o.crc.finalize();
    o.w.write_all(&crc.to_be_bytes())?;
    let file = o.w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(SNAPSHOT))?;
    // The rename must be on disk before the segments it replaces are deleted.
    sync_dir(dir)
}

/// Loads `snapshot.bin` (or an earlier version's `snapshot.json`); an empty tree if neither.
fn load_snapshot(dir: &Path) -> std::io::Result<(Tree, i64, Vec<SavedSession>)> {
    let path = dir.join(SNAPSHOT);
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {why}", path.display()));
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let legacy = dir.join("snapshot.json");
            return match std::fs::read(&legacy) {
                Ok(bytes) => {
                    let s: Snapshot = serde_json::from_slice(&bytes)
                        .map_err(|e| std::io::Error::other(format!("{}: {e}", legacy.display())))?;
                    Ok((s.tree, s.zxid, s.sessions))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Tree::default(), 0, Vec::new())),
                Err(e) => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(bad("not a distlock snapshot"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body) != u32::from_be_bytes(crc.try_into().unwrap()) {
        return Err(bad("checksum mismatch (the snapshot is damaged)"));
    }
    let mut r = &body[MAGIC.len()..];
    let mut take = |n: usize| -> std::io::Result<&[u8]> {
        if r.len() < n {
            return Err(bad("truncated"));
        }
        let (head, rest) = r.split_at(n);
        r = rest;
        Ok(head)
    };
    macro_rules! num {
        ($t:ty) => {
            <$t>::from_be_bytes(take(std::mem::size_of::<$t>())?.try_into().unwrap())
        };
    }
    let zxid = num!(i64);
    let mut sessions = Vec::new();
    for _ in 0..num!(u32) {
        let id = num!(i64);
        let timeout = num!(i32);
        let len = num!(u32) as usize;
        sessions.push((id, take(len)?.to_vec(), timeout));
    }
    let mut tree = Tree { nodes: Default::default() };
    let count = num!(u64);
    for _ in 0..count {
        let len = num!(u32) as usize;
        let path = String::from_utf8(take(len)?.to_vec()).map_err(|_| bad("a path is not UTF-8"))?;
        let data = match num!(u32) {
            u32::MAX => None,
            len => Some(Arc::from(take(len as usize)?)),
        };
        let mut acl = Vec::new();
        for _ in 0..num!(u32) {
            let perms = num!(i32);
            let len = num!(u32) as usize;
            let scheme = String::from_utf8_lossy(take(len)?).into_owned();
            let len = num!(u32) as usize;
            let id = String::from_utf8_lossy(take(len)?).into_owned();
            acl.push(Acl { perms, scheme, id });
        }
        let (czxid, mzxid, ctime, mtime, ephemeral_owner, pzxid) =
            (num!(i64), num!(i64), num!(i64), num!(i64), num!(i64), num!(i64));
        let (version, cversion, aversion, data_length, num_children) =
            (num!(i32), num!(i32), num!(i32), num!(i32), num!(i32));
        let stat = Stat {
            czxid,
            mzxid,
            ctime,
            mtime,
            version,
            cversion,
            aversion,
            ephemeral_owner,
            data_length,
            num_children,
            pzxid,
        };
        tree.nodes.insert(path, Node { data, acl: Arc::new(acl), stat, children: Default::default() });
    }
    // Children sets are not stored: every node but the root is its parent's child.
    let paths: Vec<String> = tree.nodes.keys().filter(|p| p.as_str() != "/").cloned().collect();
    for p in paths {
        let parent = crate::tree::parent_of(&p).to_string();
        let name = crate::tree::name_of(&p).to_string();
        tree.nodes.get_mut(&parent).ok_or_else(|| bad("a node without its parent"))?.children.insert(name);
    }
    Ok((tree, zxid, sessions))
}

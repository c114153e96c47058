//! Crash and corruption: what a data directory recovers, and what it refuses.

use distlock_server::{Config, EmbeddedServer, Fsync};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use zookeeper_client as zk;

use crate::common;
use common::{attach, create_frame, raw, read_reply, BOUND};

fn durable(dir: &std::path::Path, snapshot_every: u64) -> Config {
    Config {
        tick: Duration::from_millis(500),
        data_dir: Some(dir.to_path_buf()),
        fsync: Fsync::Always,
        snapshot_every,
        four_letter_words: distlock_server::FOUR_LETTER_WORDS.to_vec(),
        ..Default::default()
    }
}

/// The session opened by the very transaction that triggers a snapshot is in that snapshot: after
/// a crash it can be resumed (its ephemerals used to stay for ever, the session unknown).
#[tokio::test]
async fn a_session_opened_at_a_snapshot_boundary_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedServer::start_with(durable(dir.path(), 1)).await.unwrap();
    let (_, timeout, id, password) = attach(s.addr(), 0, &[0; 16], 4000).await;
    assert!(timeout > 0);
    s.stop().await; // no close of the session: as after SIGKILL
    let s2 = EmbeddedServer::start_with(durable(dir.path(), 1)).await.unwrap();
    let (_, timeout, resumed, _) = attach(s2.addr(), id, &password, 4000).await;
    assert_eq!((resumed, timeout > 0), (id, true), "the session is known after the restart");
}

/// A real client of `s`.
async fn client(s: &EmbeddedServer) -> zk::Client {
    zk::Client::connector().with_session_timeout(Duration::from_secs(4)).connect(&s.addr().to_string()).await.unwrap()
}

/// Waits (bounded) until `done` holds of the data directory.
async fn wait_for(dir: &std::path::Path, what: &str, done: impl Fn(&std::path::Path) -> bool) {
    let deadline = std::time::Instant::now() + BOUND;
    while !done(dir) {
        assert!(std::time::Instant::now() < deadline, "{what}: {:?}", segments(dir));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Writes `n` persistent nodes through a real client, then stops the server.
async fn write_nodes(dir: &std::path::Path, n: usize) {
    let s = EmbeddedServer::start_with(durable(dir, 10_000)).await.unwrap();
    let c = client(&s).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for i in 0..n {
        c.create(&format!("/n{i}"), format!("value {i}").as_bytes(), &open).await.unwrap();
    }
    drop(c);
    s.stop().await;
}

/// The data directory's one log segment.
fn the_log(dir: &std::path::Path) -> std::path::PathBuf {
    let logs = segments(dir);
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs[0].clone()
}

fn segments(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("log."))
        .collect();
    logs.sort();
    logs
}

/// Byte offsets where each line of the log starts.
fn line_starts(log: &[u8]) -> Vec<usize> {
    let mut starts = vec![0];
    starts.extend(log.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i + 1));
    starts.pop();
    starts
}

/// One changed digit in the middle of the log is caught by its checksum, and the server refuses to
/// start, naming the file and the offset (it used to replay the changed value, or drop every
/// transaction after a record it could not parse).
#[tokio::test]
async fn a_damaged_record_mid_log_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    write_nodes(dir.path(), 6).await;
    let log_path = the_log(dir.path());
    let mut log = std::fs::read(&log_path).unwrap();
    let starts = line_starts(&log);
    assert!(starts.len() >= 6, "one record per transaction");
    let victim = starts[3];
    let digit = victim + log[victim..].iter().position(|b| *b == b'"').unwrap() + 1;
    let digit = digit + log[digit..].iter().position(|b| b.is_ascii_digit()).unwrap();
    log[digit] = if log[digit] == b'7' { b'8' } else { b'7' };
    std::fs::write(&log_path, &log).unwrap();
    let err = EmbeddedServer::start_with(durable(dir.path(), 10_000)).await.err().expect("refuses to start");
    let msg = err.to_string();
    assert!(msg.contains(&log_path.display().to_string()) && msg.contains(&format!("offset {victim}")), "{msg}");
    assert_eq!(std::fs::read(&log_path).unwrap(), log, "the log is left as it was for a person to look at");
}

/// A torn last record, even one cut inside a multi-byte character or not text at all, is dropped
/// and every acknowledged transaction before it is kept.
#[tokio::test]
async fn a_torn_last_record_is_dropped() {
    for tail in [
        &b"0badc0de {\"zxid\":999,\"time\":1,\"m\":[{\"Create\":{\"path\":\"/\xc3"[..],
        b"\xff\xfe\x00garbage",
        b"00000000 {}\n",
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_nodes(dir.path(), 4).await;
        let log_path = the_log(dir.path());
        let good = std::fs::read(&log_path).unwrap();
        let mut torn = good.clone();
        torn.extend_from_slice(tail);
        std::fs::write(&log_path, &torn).unwrap();
        let s = EmbeddedServer::start_with(durable(dir.path(), 10_000)).await.unwrap();
        let c = client(&s).await;
        for i in 0..4 {
            assert_eq!(c.get_data(&format!("/n{i}")).await.unwrap().0, format!("value {i}").as_bytes(), "{tail:?}");
        }
        drop(c);
        s.stop().await;
        let after = std::fs::read(&log_path).unwrap();
        assert!(after.starts_with(&good) && !after.ends_with(tail), "the torn tail was cut: {tail:?}");
    }
}

/// The value of `key` in `mntr`'s output.
async fn mntr(addr: std::net::SocketAddr, key: &str) -> u64 {
    let out = String::from_utf8(raw(addr, b"mntr").await).unwrap();
    let line =
        out.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('\t')).unwrap_or_else(|| panic!("{key} in {out}"));
    line.trim().parse().unwrap()
}

/// Group commit: writes that arrive together share an fsync, every one is answered (only after
/// the fsync covering it: the gate's unit test), and every acknowledged one is there after a
/// restart.
#[tokio::test]
async fn pipelined_writes_share_fsyncs_and_all_survive() {
    const N: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedServer::start_with(durable(dir.path(), 10_000)).await.unwrap();
    let (mut sock, _, _, _) = attach(s.addr(), 0, &[0; 16], 4000).await;
    let before = mntr(s.addr(), "zk_cnt_fsynctime").await;
    let burst: Vec<u8> = (0..N).flat_map(|i| create_frame(&format!("/p{i}"), 0)).collect();
    sock.write_all(&burst).await.unwrap();
    for i in 0..N {
        assert_eq!(read_reply(&mut sock).await.1, 0, "create {i}");
    }
    let fsyncs = mntr(s.addr(), "zk_cnt_fsynctime").await - before;
    assert!(fsyncs * 4 <= N as u64, "{N} pipelined writes took {fsyncs} fsyncs");
    drop(sock);
    s.stop().await;
    let s = EmbeddedServer::start_with(durable(dir.path(), 10_000)).await.unwrap();
    let c = client(&s).await;
    let children = c.list_children("/").await.unwrap();
    assert_eq!(children.iter().filter(|c| c.starts_with('p')).count(), N);
}

/// Snapshots are written in the background in a compact form, replace the log segments they
/// cover, and restore every node: data (null and empty kept apart), ACLs, stats and sessions.
#[tokio::test]
async fn snapshots_replace_the_segments_they_cover() {
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedServer::start_with(durable(dir.path(), 40)).await.unwrap();
    let c = client(&s).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let (mut raw, _, _, _) = attach(s.addr(), 0, &[0; 16], 4000).await;
    let null_create = common::create_body("/null", None, 0);
    assert_eq!(common::request(&mut raw, 1, 1, &null_create).await.0, 0);
    for i in 0..130 {
        c.create(&format!("/n{i}"), format!("value {i}").repeat(i % 7).as_bytes(), &open).await.unwrap();
    }
    let stats: Vec<zk::Stat> = {
        let mut v = Vec::new();
        for i in 0..130 {
            v.push(c.check_stat(&format!("/n{i}")).await.unwrap().unwrap());
        }
        v
    };
    // The last snapshot is done when one segment is left beside it.
    wait_for(dir.path(), "no snapshot", |d| d.join("snapshot.bin").exists() && segments(d).len() == 1).await;
    drop(c);
    drop(raw);
    s.stop().await;
    let s = EmbeddedServer::start_with(durable(dir.path(), 40)).await.unwrap();
    let c = client(&s).await;
    for (i, before) in stats.iter().enumerate() {
        let (data, stat) = c.get_data(&format!("/n{i}")).await.unwrap();
        assert_eq!(data, format!("value {i}").repeat(i % 7).as_bytes());
        assert_eq!(&stat, before, "/n{i}");
    }
    let (mut raw, _, _, _) = attach(s.addr(), 0, &[0; 16], 4000).await;
    let mut get = Vec::new();
    common::jute_string(&mut get, "/null");
    get.push(0);
    let (e, body) = common::request(&mut raw, 1, 4, &get).await;
    assert_eq!((e, &body[..4]), (0, &(-1i32).to_be_bytes()[..]), "null data stays null");
}

/// A damaged snapshot refuses to start, naming the file.
#[tokio::test]
async fn a_damaged_snapshot_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedServer::start_with(durable(dir.path(), 5)).await.unwrap();
    let c = client(&s).await;
    for i in 0..6 {
        c.create(&format!("/d{i}"), b"x", &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())).await.unwrap();
    }
    let snap = dir.path().join("snapshot.bin");
    wait_for(dir.path(), "no snapshot", |d| d.join("snapshot.bin").exists()).await;
    drop(c);
    s.stop().await;
    let mut bytes = std::fs::read(&snap).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&snap, &bytes).unwrap();
    let err = EmbeddedServer::start_with(durable(dir.path(), 5)).await.err().expect("refuses to start");
    assert!(err.to_string().contains("snapshot.bin") && err.to_string().contains("checksum"), "{err}");
}

//! `distlock serve` under one abusive client without credentials, while a `distlock hold` with a
//! short lease holds a lock: 40 sessions that each make 900 ephemeral 1000-byte nodes, and, beside
//! them, as many sessions as four threads can open and drop in 6 s (at most 60,000). Their
//! expiry must not starve the holder: it keeps its lock throughout (a `hold` that lost it exits
//! 3), and every flood session is gone at the end. Before ending a session cost a scan of the
//! whole tree (and every expiry of a round ran under one hold of the state), this holder lost its
//! lock ("no answer from the server").

use crate::common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A frame: its length, then its body.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as i32).to_be_bytes());
    out.extend_from_slice(s);
}

/// A session's handshake asking for `timeout_ms`, with no password: a new session.
fn connect_request(timeout_ms: i32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&timeout_ms.to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    string(&mut b, &[0; 16]);
    frame(&b)
}

/// An ephemeral create of `path` holding `data`, open to anyone.
fn create_request(xid: i32, path: &str, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&xid.to_be_bytes());
    b.extend_from_slice(&1i32.to_be_bytes()); // create
    string(&mut b, path.as_bytes());
    string(&mut b, data);
    b.extend_from_slice(&1i32.to_be_bytes()); // one ACL entry
    b.extend_from_slice(&31i32.to_be_bytes());
    string(&mut b, b"world");
    string(&mut b, b"anyone");
    b.extend_from_slice(&1i32.to_be_bytes()); // ephemeral
    frame(&b)
}

/// A request with no body (ping: xid -2 type 11; close session: type -11).
fn bare_request(xid: i32, typ: i32) -> Vec<u8> {
    let mut b = xid.to_be_bytes().to_vec();
    b.extend_from_slice(&typ.to_be_bytes());
    frame(&b)
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; i32::from_be_bytes(len).max(0) as usize];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// A new raw session on `addr`.
fn session(addr: &str, timeout_ms: i32) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(&connect_request(timeout_ms))?;
    read_frame(&mut s)?;
    Ok(s)
}

/// One of the node-holding sessions: `nodes` creates written at once, their answers read; then a
/// ping a second until `stop`, then a close.
fn node_session(addr: String, who: usize, nodes: usize, stop: Arc<AtomicBool>, made: Arc<AtomicUsize>) {
    let mut s = session(&addr, 10_000).unwrap();
    let data = vec![b'x'; 1000];
    let mut all = Vec::new();
    for i in 0..nodes {
        all.extend(create_request(i as i32 + 1, &format!("/flood-{who}-{i}"), &data));
    }
    s.write_all(&all).unwrap();
    for _ in 0..nodes {
        let reply = read_frame(&mut s).unwrap();
        assert_eq!(i32::from_be_bytes(reply[12..16].try_into().unwrap()), 0, "a flood create failed");
    }
    made.fetch_add(nodes, Ordering::SeqCst);
    while !stop.load(Ordering::SeqCst) {
        s.write_all(&bare_request(-2, 11)).unwrap();
        read_frame(&mut s).unwrap();
        std::thread::park_timeout(Duration::from_secs(1));
    }
    s.write_all(&bare_request(1_000_000, -11)).unwrap();
    let _ = read_frame(&mut s);
}

/// `mntr`'s value of `key`.
fn mntr(addr: &str, key: &str) -> u64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"mntr").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let line = out.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in mntr: {out}"));
    line.split('\t').nth(1).unwrap().parse().unwrap()
}

#[test]
fn one_flooding_client_costs_a_short_lease_holder_nothing() {
    let server = common::ScriptServer::start_with(
        "embedded",
        "start",
        &["--max-connections", "4096", "--four-letter-words", "mntr,srvr,ruok"],
    );
    let addr = server.printed.clone();
    let backend = format!("zk://{addr}");
    let lock = common::unique("flood");
    let (mut holder, _lines) = common::holding(&backend, &["hold", "--lease", "4s", &lock]);
    let sessions_before = mntr(&addr, "zk_global_sessions");

    let (stop, made) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let node_sessions: Vec<_> = (0..40)
        .map(|who| {
            let (addr, stop, made) = (addr.clone(), stop.clone(), made.clone());
            std::thread::spawn(move || node_session(addr, who, 900, stop, made))
        })
        .collect();
    common::eventually(Duration::from_secs(60), "the flood's nodes made", || {
        assert!(holder.try_wait().unwrap().is_none(), "the holder ended while the flood made its nodes");
        made.load(Ordering::SeqCst) >= 40 * 900
    });
    // Sessions opened and dropped (each expires a second later, beside 36,000 nodes).
    let opened = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs(6);
    let droppers: Vec<_> = (0..4)
        .map(|_| {
            let (addr, opened) = (addr.clone(), opened.clone());
            std::thread::spawn(move || {
                while Instant::now() < until && opened.load(Ordering::SeqCst) < 60_000 {
                    if session(&addr, 1000).is_ok() {
                        opened.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for d in droppers {
        d.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for t in node_sessions {
        t.thread().unpark();
        t.join().unwrap();
    }
    // Every flood session ends (the dropped ones by expiry); the holder is there throughout.
    common::eventually(Duration::from_secs(120), "the flood's sessions gone", || {
        assert!(holder.try_wait().unwrap().is_none(), "the holder lost its lock while the flood expired");
        mntr(&addr, "zk_global_sessions") <= sessions_before
    });
    assert!(holder.try_wait().unwrap().is_none(), "the holder lost its lock while the flood expired");
    assert!(opened.load(Ordering::SeqCst) > 1000, "the flood opened only {} sessions", opened.load(Ordering::SeqCst));
    eprintln!("flood: {} sessions opened and dropped beside 36,000 nodes", opened.load(Ordering::SeqCst));
    drop(holder.stdin.take());
    let status = common::wait_exit(&mut holder, Duration::from_secs(20));
    assert!(status.success(), "hold ended with {status}");
}

//! Raw frames shared by the server's tests.
#![allow(dead_code)] // each test file uses its own share

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const BOUND: Duration = Duration::from_secs(20);

pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

pub fn jute_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A create request frame (xid 1, empty data, open ACL) with ZooKeeper's create `flags`
/// (0 persistent, 1 ephemeral).
pub fn create_frame(path: &str, flags: i32) -> Vec<u8> {
    let mut create = Vec::new();
    create.extend_from_slice(&1i32.to_be_bytes()); // xid
    create.extend_from_slice(&1i32.to_be_bytes()); // create
    create_record(&mut create, path, flags);
    frame(&create)
}

/// A create request's record (path, empty data, open ACL, `flags`), alone or inside a multi.
pub fn create_record(out: &mut Vec<u8>, path: &str, flags: i32) {
    jute_string(out, path);
    out.extend_from_slice(&0i32.to_be_bytes()); // empty data
    out.extend_from_slice(&1i32.to_be_bytes()); // one ACL
    out.extend_from_slice(&31i32.to_be_bytes());
    jute_string(out, "world");
    jute_string(out, "anyone");
    out.extend_from_slice(&flags.to_be_bytes());
}

pub async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.write_all(bytes).await.unwrap();
    sock.shutdown().await.unwrap(); // our side is done; the server sees EOF after the bytes
    let mut out = Vec::new();
    let _ = tokio::time::timeout(BOUND, sock.read_to_end(&mut out)).await.expect("server closes the connection");
    out
}

/// A connect request for a new session (timeout 4 s).
pub fn connect_frame() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&0i32.to_be_bytes());
    body.extend_from_slice(&0i64.to_be_bytes());
    body.extend_from_slice(&4000i32.to_be_bytes());
    body.extend_from_slice(&0i64.to_be_bytes());
    body.extend_from_slice(&16i32.to_be_bytes());
    body.extend_from_slice(&[0u8; 16]);
    let mut f = (body.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(&body);
    f
}

/// Attaches to `session` (0: a new one) on a raw socket; returns it with the negotiated timeout,
/// the session id and its password.
pub async fn attach(
    addr: std::net::SocketAddr,
    session: i64,
    password: &[u8],
    timeout_ms: i32,
) -> (TcpStream, i32, i64, Vec<u8>) {
    let mut hello = connect_frame();
    hello[4 + 12..4 + 16].copy_from_slice(&timeout_ms.to_be_bytes());
    hello[4 + 16..4 + 24].copy_from_slice(&session.to_be_bytes());
    hello[4 + 28..4 + 44].copy_from_slice(password);
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.write_all(&hello).await.unwrap();
    // No readOnly byte in the request, none in the reply (ZooKeeper's answer to pre-3.4 clients).
    let mut resp = vec![0u8; 4 + 36];
    tokio::time::timeout(BOUND, sock.read_exact(&mut resp)).await.unwrap().unwrap();
    let timeout = i32::from_be_bytes(resp[8..12].try_into().unwrap());
    let id = i64::from_be_bytes(resp[12..20].try_into().unwrap());
    (sock, timeout, id, resp[24..40].to_vec())
}

/// Sends one request (`opcode` and its record `body`) on an attached socket; returns the reply's
/// error code and body. Watch notifications that arrive first are skipped.
pub async fn request(sock: &mut TcpStream, xid: i32, opcode: i32, body: &[u8]) -> (i32, Vec<u8>) {
    let mut req = xid.to_be_bytes().to_vec();
    req.extend_from_slice(&opcode.to_be_bytes());
    req.extend_from_slice(body);
    sock.write_all(&frame(&req)).await.unwrap();
    loop {
        let (got, err, body) = read_reply(sock).await;
        if got == xid {
            return (err, body);
        }
    }
}

/// Reads one reply or notification: (xid, error code, body).
pub async fn read_reply(sock: &mut TcpStream) -> (i32, i32, Vec<u8>) {
    let mut len = [0u8; 4];
    tokio::time::timeout(BOUND, sock.read_exact(&mut len)).await.expect("a reply within the bound").unwrap();
    let mut reply = vec![0u8; i32::from_be_bytes(len) as usize];
    sock.read_exact(&mut reply).await.unwrap();
    let word = |at: usize| i32::from_be_bytes(reply[at..at + 4].try_into().unwrap());
    (word(0), word(12), reply[16..].to_vec())
}

/// A create record with `data` (None: null) and an open ACL.
pub fn create_body(path: &str, data: Option<&[u8]>, flags: i32) -> Vec<u8> {
    let mut out = jute(path);
    match data {
        Some(d) => {
            out.extend_from_slice(&(d.len() as i32).to_be_bytes());
            out.extend_from_slice(d);
        }
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
    }
    out.extend_from_slice(&1i32.to_be_bytes());
    out.extend_from_slice(&31i32.to_be_bytes());
    jute_string(&mut out, "world");
    jute_string(&mut out, "anyone");
    out.extend_from_slice(&flags.to_be_bytes());
    out
}

/// A jute string on its own.
pub fn jute(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    jute_string(&mut out, s);
    out
}

/// The create opcodes with each mode (flags) a multi accepts them with, and the TTL to send:
/// create (1), create2 (15) and createContainer (19) with every mode but the TTL ones (0
/// persistent, 1 ephemeral, 2 and 3 their sequential forms, 4 container); createTTL (21) with
/// every mode, the TTL ones (5, 6) with a TTL of a minute and the others with none (-1).
pub fn multi_create_cases() -> Vec<(i32, i32, i64)> {
    let mut cases = Vec::new();
    for opcode in [1, 15, 19] {
        for flags in 0..=4 {
            cases.push((opcode, flags, -1));
        }
    }
    for flags in 0..=6 {
        cases.push((21, flags, if flags >= 5 { 60_000 } else { -1 }));
    }
    cases
}

/// A multi request's record holding one create sent as `opcode` (createTTL, 21, also carries
/// `ttl`), with empty data and an open ACL.
pub fn multi_with_one_create(opcode: i32, path: &str, flags: i32, ttl: i64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&opcode.to_be_bytes()); // op header: type, not done, no error
    out.push(0);
    out.extend_from_slice(&(-1i32).to_be_bytes());
    create_record(&mut out, path, flags);
    if opcode == 21 {
        out.extend_from_slice(&ttl.to_be_bytes());
    }
    out.extend_from_slice(&(-1i32).to_be_bytes()); // closing header
    out.push(1);
    out.extend_from_slice(&(-1i32).to_be_bytes());
    out
}

/// What the reply body to [`multi_with_one_create`] holds: the result's type and whether a stat
/// (68 bytes) follows the path, as "type 1 without stat" or "type 15 with stat"; "error CODE"
/// when the op failed.
pub fn one_create_result(body: &[u8]) -> String {
    let word = |at: usize| body.get(at..at + 4).map_or(i32::MIN, |w| i32::from_be_bytes(w.try_into().unwrap()));
    // type (4 bytes), done (1), error (4), then the result's own record.
    let typ = word(0);
    if typ == -1 {
        return format!("error {}", word(9));
    }
    let path_len = word(9).max(0) as usize;
    // What is left between the path and the closing header (type, done, error: 9 bytes).
    match body.len().checked_sub(13 + path_len + 9) {
        Some(0) => format!("type {typ} without stat"),
        Some(68) => format!("type {typ} with stat"),
        other => format!("type {typ}, {other:?} bytes between the path and the closing header"),
    }
}

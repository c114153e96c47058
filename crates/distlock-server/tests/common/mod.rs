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

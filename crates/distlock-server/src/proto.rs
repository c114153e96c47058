//! The ZooKeeper client protocol's wire format (jute): big-endian integers, length-prefixed
//! buffers and strings (-1 for null), vectors as a count and their items.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Why a frame could not be decoded. The connection that sent it is closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame ended in the middle of a field.
    #[error("frame truncated while reading {0}")]
    Truncated(&'static str),
    /// A length field is negative (other than -1 for null) or larger than the frame.
    #[error("invalid length {len} for {what}")]
    BadLength { what: &'static str, len: i32 },
    /// A string is not UTF-8.
    #[error("string is not UTF-8")]
    Utf8,
    /// Bytes left over after the record.
    #[error("{0} trailing bytes after the request")]
    Trailing(usize),
    /// An operation code this server does not know.
    #[error("unknown opcode {0}")]
    UnknownOpcode(i32),
    /// A field holds a value outside its domain.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

pub type DResult<T> = Result<T, DecodeError>;

/// Reads jute records from a frame.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub fn finish(&self) -> DResult<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.buf.len()))
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> DResult<&'a [u8]> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub fn i32(&mut self, what: &'static str) -> DResult<i32> {
        Ok(i32::from_be_bytes(self.take(4, what)?.try_into().unwrap()))
    }

    pub fn i64(&mut self, what: &'static str) -> DResult<i64> {
        Ok(i64::from_be_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    pub fn bool(&mut self, what: &'static str) -> DResult<bool> {
        Ok(self.take(1, what)?[0] != 0)
    }

    /// A buffer; null reads as empty.
    pub fn buffer(&mut self, what: &'static str) -> DResult<Vec<u8>> {
        let len = self.i32(what)?;
        if len == -1 {
            return Ok(Vec::new());
        }
        if len < 0 || len as usize > self.buf.len() {
            return Err(DecodeError::BadLength { what, len });
        }
        Ok(self.take(len as usize, what)?.to_vec())
    }

    /// A buffer that may be null (length -1).
    pub fn data(&mut self, what: &'static str) -> DResult<Data> {
        let len = self.i32(what)?;
        if len == -1 {
            return Ok(None);
        }
        if len < 0 || len as usize > self.buf.len() {
            return Err(DecodeError::BadLength { what, len });
        }
        Ok(Some(self.take(len as usize, what)?.into()))
    }

    /// A string; null reads as empty.
    pub fn string(&mut self, what: &'static str) -> DResult<String> {
        String::from_utf8(self.buffer(what)?).map_err(|_| DecodeError::Utf8)
    }

    pub fn count(&mut self, what: &'static str, min_item: usize) -> DResult<usize> {
        let n = self.i32(what)?;
        if n == -1 {
            return Ok(0);
        }
        if n < 0 || (n as usize).saturating_mul(min_item) > self.buf.len() {
            return Err(DecodeError::BadLength { what, len: n });
        }
        Ok(n as usize)
    }

    pub fn strings(&mut self, what: &'static str) -> DResult<Vec<String>> {
        let n = self.count(what, 4)?;
        (0..n).map(|_| self.string(what)).collect()
    }

    pub fn acls(&mut self) -> DResult<Vec<Acl>> {
        let n = self.count("acl list", 12)?;
        (0..n)
            .map(|_| {
                Ok(Acl {
                    perms: self.i32("acl perms")?,
                    scheme: self.string("acl scheme")?,
                    id: self.string("acl id")?,
                })
            })
            .collect()
    }
}

/// Writes jute records.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Writer { buf: Vec::with_capacity(64) }
    }

    /// Starts a frame: reserves the length prefix, filled by [`Writer::frame`].
    pub fn framed() -> Self {
        Writer { buf: vec![0, 0, 0, 0] }
    }

    pub fn frame(mut self) -> Vec<u8> {
        let len = (self.buf.len() - 4) as i32;
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        self.buf
    }

    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.buf.push(v as u8);
        self
    }

    pub fn buffer(&mut self, v: &[u8]) -> &mut Self {
        self.i32(v.len() as i32);
        self.buf.extend_from_slice(v);
        self
    }

    /// A buffer that may be null (written as length -1).
    pub fn data(&mut self, v: &Data) -> &mut Self {
        match v {
            Some(d) => self.buffer(d),
            None => self.i32(-1),
        }
    }

    pub fn string(&mut self, v: &str) -> &mut Self {
        self.buffer(v.as_bytes())
    }

    pub fn strings<S: AsRef<str>>(&mut self, v: &[S]) -> &mut Self {
        self.i32(v.len() as i32);
        for s in v {
            self.string(s.as_ref());
        }
        self
    }

    /// A stat as clients see it (container and TTL markers hidden, the child version counting
    /// deletes too, as ZooKeeper does).
    pub fn stat(&mut self, s: &Stat) -> &mut Self {
        self.i64(s.czxid)
            .i64(s.mzxid)
            .i64(s.ctime)
            .i64(s.mtime)
            .i32(s.version)
            .i32(client_cversion(s))
            .i32(s.aversion)
            .i64(client_ephemeral_owner(s.ephemeral_owner))
            .i32(s.data_length)
            .i32(s.num_children)
            .i64(s.pzxid)
    }

    pub fn acls(&mut self, acls: &[Acl]) -> &mut Self {
        self.i32(acls.len() as i32);
        for a in acls {
            self.i32(a.perms).string(&a.scheme).string(&a.id);
        }
        self
    }
}

/// A node's data: null and empty differ, as in ZooKeeper (`create(path, null)` reads back
/// null). Shared, so copies of the tree (a snapshot, a multi's undo) do not copy the bytes.
pub type Data = Option<Arc<[u8]>>;

/// `ephemeralOwner` of container nodes (ZooKeeper's EphemeralType.CONTAINER).
pub const CONTAINER_OWNER: i64 = i64::MIN;
/// High byte marking TTL nodes in `ephemeralOwner` (ZooKeeper's extended types).
pub const TTL_MASK: i64 = 0xFF00_0000_0000_0000u64 as i64;

/// A znode's Stat, field for field as ZooKeeper sends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub czxid: i64,
    pub mzxid: i64,
    pub ctime: i64,
    pub mtime: i64,
    pub version: i32,
    pub cversion: i32,
    pub aversion: i32,
    pub ephemeral_owner: i64,
    pub data_length: i32,
    pub num_children: i32,
    pub pzxid: i64,
}

/// An access control entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    pub perms: i32,
    pub scheme: String,
    pub id: String,
}

pub mod perms {
    pub const READ: i32 = 1;
    pub const WRITE: i32 = 2;
    pub const CREATE: i32 = 4;
    pub const DELETE: i32 = 8;
    pub const ADMIN: i32 = 16;
    pub const ALL: i32 = 31;
}

/// Operation codes.
pub mod op {
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const SET_ACL: i32 = 7;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    pub const RECONFIG: i32 = 16;
    pub const CHECK_WATCHES: i32 = 17;
    pub const REMOVE_WATCHES: i32 = 18;
    pub const CREATE_CONTAINER: i32 = 19;
    pub const DELETE_CONTAINER: i32 = 20;
    pub const CREATE_TTL: i32 = 21;
    pub const MULTI_READ: i32 = 22;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
    pub const SASL: i32 = 102;
    pub const GET_EPHEMERALS: i32 = 103;
    pub const GET_ALL_CHILDREN_NUMBER: i32 = 104;
    pub const SET_WATCHES2: i32 = 105;
    pub const ADD_WATCH: i32 = 106;
    pub const WHO_AM_I: i32 = 107;
    pub const CLOSE_SESSION: i32 = -11;
    pub const ERROR: i32 = -1;
}

/// Error codes.
pub mod err {
    pub const OK: i32 = 0;
    pub const RUNTIME_INCONSISTENCY: i32 = -2;
    pub const MARSHALLING_ERROR: i32 = -5;
    pub const UNIMPLEMENTED: i32 = -6;
    pub const BAD_ARGUMENTS: i32 = -8;
    pub const NO_NODE: i32 = -101;
    pub const NO_AUTH: i32 = -102;
    pub const BAD_VERSION: i32 = -103;
    pub const NO_CHILDREN_FOR_EPHEMERALS: i32 = -108;
    pub const NODE_EXISTS: i32 = -110;
    pub const NOT_EMPTY: i32 = -111;
    pub const SESSION_EXPIRED: i32 = -112;
    pub const INVALID_ACL: i32 = -114;
    pub const AUTH_FAILED: i32 = -115;
    /// The session did not log in and the server requires it (ZooKeeper's enforce.auth).
    pub const SESSION_CLOSED_REQUIRE_AUTH: i32 = -124;
    pub const NO_WATCHER: i32 = -121;
    pub const RECONFIG_DISABLED: i32 = -123;
    pub const QUOTA_EXCEEDED: i32 = -125;
    pub const THROTTLED: i32 = -127;
}

/// Special xids. Replies echo the request's xid (the Java client numbers pings -2, auth -4 and
/// setWatches -8; other clients number them like any request); only notifications carry a
/// server-chosen xid.
pub mod xid {
    pub const NOTIFICATION: i32 = -1;
}

/// Watch event types.
pub mod event {
    pub const NODE_CREATED: i32 = 1;
    pub const NODE_DELETED: i32 = 2;
    pub const NODE_DATA_CHANGED: i32 = 3;
    pub const NODE_CHILDREN_CHANGED: i32 = 4;
    pub const SYNC_CONNECTED: i32 = 3;
    /// The keeper state of a session whose login failed (or never came, where one is required).
    pub const AUTH_FAILED: i32 = 4;
}

/// The first request of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub protocol_version: i32,
    pub last_zxid_seen: i64,
    pub timeout_ms: i32,
    pub session_id: i64,
    pub password: Vec<u8>,
    /// Absent in requests of clients older than 3.4 (then the reply leaves it out too).
    pub read_only: Option<bool>,
}

impl ConnectRequest {
    pub fn decode(frame: &[u8]) -> DResult<ConnectRequest> {
        let mut r = Reader::new(frame);
        let req = ConnectRequest {
            protocol_version: r.i32("protocol version")?,
            last_zxid_seen: r.i64("last zxid")?,
            timeout_ms: r.i32("timeout")?,
            session_id: r.i64("session id")?,
            password: r.buffer("password")?,
            read_only: if r.remaining() > 0 { Some(r.bool("read only")?) } else { None },
        };
        r.finish()?;
        Ok(req)
    }
}

/// Decodes the header of a request frame: (xid, opcode, body).
pub fn request_header(frame: &[u8]) -> DResult<(i32, i32, &[u8])> {
    let mut r = Reader::new(frame);
    let xid = r.i32("xid")?;
    let op = r.i32("opcode")?;
    Ok((xid, op, &frame[8..]))
}

/// The `ephemeralOwner` clients see: a session id, or 0. Container and TTL nodes keep a marker in
/// the field internally; ZooKeeper reports 0 for them, and so do we.
pub fn client_ephemeral_owner(owner: i64) -> i64 {
    if owner == CONTAINER_OWNER || (owner & TTL_MASK) == TTL_MASK {
        0
    } else {
        owner
    }
}

/// The `cversion` clients see. Internally it counts the children ever created (what sequential
/// names are numbered by); clients are shown every change, creates and deletes: each child not
/// still present was deleted once. (ZooKeeper's own arithmetic, so the root, created with one
/// child and no create, shows -1.)
pub fn client_cversion(s: &Stat) -> i32 {
    s.cversion.wrapping_mul(2).wrapping_sub(s.num_children)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_records() {
        let mut w = Writer::new();
        w.i32(-1).i64(7).string("/a").buffer(b"xy").strings(&["p", "q"]).bool(true);
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.i32("a").unwrap(), -1);
        assert_eq!(r.i64("b").unwrap(), 7);
        assert_eq!(r.string("c").unwrap(), "/a");
        assert_eq!(r.buffer("d").unwrap(), b"xy");
        assert_eq!(r.strings("e").unwrap(), vec!["p", "q"]);
        assert!(r.bool("f").unwrap());
        r.finish().unwrap();
    }

    #[test]
    fn rejects_bad_lengths_without_allocating() {
        let mut w = Writer::new();
        w.i32(i32::MAX);
        assert!(matches!(Reader::new(&w.buf).buffer("x"), Err(DecodeError::BadLength { .. })));
        assert!(matches!(Reader::new(&w.buf).strings("x"), Err(DecodeError::BadLength { .. })));
        let mut w = Writer::new();
        w.i32(-7);
        assert!(matches!(Reader::new(&w.buf).buffer("x"), Err(DecodeError::BadLength { .. })));
        assert!(matches!(Reader::new(&[0, 0]).i32("x"), Err(DecodeError::Truncated(_))));
    }
}

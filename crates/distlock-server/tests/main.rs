//! The embedded server's tests, one binary with a module per part: `protocol` (the wire protocol,
//! sessions, watches, limits), `durability` (the data directory across crashes), `differential`
//! (the same requests against Apache ZooKeeper and against this server).

mod common;

mod differential;
mod durability;
mod protocol;

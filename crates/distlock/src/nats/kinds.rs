//! The contract's rule that a semaphore and a mutex or read/write lock cannot share a name. On
//! NATS they hold different keys (`permits.NAME.*` against `locks.NAME` and `reads.NAME.*`), so
//! each side, once its own key is written, reads the other side's keys from the stream's leader:
//! of two that race, at least one sees the other (both may refuse), and a refused acquire deletes
//! the key it wrote.

use super::hold::Value;
use super::{key, live, Client};
use crate::contract::Kind;
use crate::{Error, Result};

/// The refusal of `wanted` on `name`, in use as `in_use`.
fn conflict(name: &str, in_use: impl Into<String>, wanted: Kind) -> Error {
    Error::KindConflict { lock: name.to_string(), in_use: in_use.into(), wanted: wanted.to_string() }
}

/// The subject filter of the name's readers' and permits' keys (both `SPACE.NAME.ID`; no other
/// key of the bucket has three tokens with the name second).
pub(crate) fn readers_and_permits(name: &str) -> String {
    format!("{}.*", key("*", name))
}

/// `Err(KindConflict)` if a permit of semaphore `name` is held (for a lock of kind `wanted`).
pub(crate) async fn no_permits(client: &Client, name: &str, wanted: Kind) -> Result<()> {
    let (held, _) = client.scan(&format!("{}.*", key("permits", name))).await?;
    match held.is_empty() {
        true => Ok(()),
        false => Err(conflict(name, "a semaphore", wanted)),
    }
}

/// `Err(KindConflict)` if a mutex, a writer or a reader holds `name` (for a semaphore's permit).
pub(crate) async fn no_locks(client: &Client, name: &str, permits: u32) -> Result<()> {
    let wanted = Kind::Permits(permits);
    if let Some(e) = client.read(&key("locks", name)).await?.filter(live) {
        let in_use = match Value::of(&e).map(|v| v.kind) {
            Some(k) if k == "write" => Kind::Write,
            _ => Kind::Mutex,
        };
        return Err(conflict(name, in_use.to_string(), wanted));
    }
    let (readers, _) = client.scan(&format!("{}.*", key("reads", name))).await?;
    match readers.is_empty() {
        true => Ok(()),
        false => Err(conflict(name, Kind::Read.to_string(), wanted)),
    }
}

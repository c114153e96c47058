//! What the SQL backends with named locks (MariaDB's `GET_LOCK`, SQLite's lease table) share.

use crate::{Error, Result};

/// A lock name that is not empty and has at most `max` characters, or the error naming it;
/// `limit` says whose limit `max` is.
pub(crate) fn check_lock_name(name: &str, max: usize, limit: &str) -> Result<()> {
    crate::contract::check_name(name)?;
    let bad = |reason: String| Error::InvalidLockPath { path: name.to_string(), reason };
    if name.chars().count() > max {
        return Err(bad(format!("{limit} has at most {max} characters")));
    }
    Ok(())
}

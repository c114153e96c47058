//! Human durations: `500ms`, `10s`, `2m`, `1h30m`.

use crate::{Error, Result};
use std::time::Duration;

/// Parses a human duration such as `500ms`, `10s`, `2m` or `1h 30m` (the `humantime` syntax).
///
/// A bare number is rejected: the unit must be explicit, since peers write these values in
/// milliseconds (Redisson's `lockWatchdogTimeout=30000`, ZooKeeper's `sessionTimeoutMs`) and
/// seconds alike; read as seconds, `30000` would be a lease of eight hours. (The command line's
/// flags take bare seconds, as flock(1) does.)
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(distlock::parse_duration("500ms").unwrap(), Duration::from_millis(500));
/// assert_eq!(distlock::parse_duration("2m").unwrap(), Duration::from_secs(120));
/// assert!(distlock::parse_duration("30000").is_err());
/// assert!(distlock::parse_duration("-1s").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration> {
    let trimmed = text.trim();
    let invalid = |reason: String| Error::InvalidDuration { value: text.to_string(), reason };
    if trimmed.is_empty() {
        return Err(invalid("empty; write it like 500ms, 10s or 2m".into()));
    }
    if trimmed.starts_with('-') {
        return Err(invalid("a duration cannot be negative".into()));
    }
    if trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(invalid(format!("no unit; write {trimmed}s or {trimmed}ms")));
    }
    humantime::parse_duration(trimmed).map_err(|e| invalid(format!("{e}; write it like 500ms, 10s or 2m")))
}

/// A duration given as `key=value` in a URL's query: an error names the key.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")), allow(dead_code))]
pub(crate) fn url_duration(key: &str, value: &str) -> Result<Duration> {
    parse_duration(value).map_err(|e| match e {
        Error::InvalidDuration { reason, .. } => Error::InvalidDuration { value: format!("{key}={value}"), reason },
        e => e,
    })
}

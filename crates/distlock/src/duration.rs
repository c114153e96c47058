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

/// Parses a duration as a command-line flag gives it: a bare number is seconds (`5`, `0.5`, as
/// flock(1)'s `-w` and timeout(1) read them); anything else as [`parse_duration`]. For tools built
/// on distlock that want the `distlock` command's rule (URL keys keep [`parse_duration`]'s).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(distlock::parse_duration_flag("5").unwrap(), Duration::from_secs(5));
/// assert_eq!(distlock::parse_duration_flag("0.25").unwrap(), Duration::from_millis(250));
/// assert_eq!(distlock::parse_duration_flag("500ms").unwrap(), Duration::from_millis(500));
/// assert!(distlock::parse_duration_flag("-1").unwrap_err().to_string().contains("cannot be negative"));
/// ```
pub fn parse_duration_flag(text: &str) -> Result<Duration> {
    let t = text.trim();
    if !t.is_empty() && !t.starts_with('-') && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        let invalid = |reason: String| Error::InvalidDuration { value: text.to_string(), reason };
        let secs: f64 = t.parse().map_err(|_| invalid("not a number of seconds".into()))?;
        return Duration::try_from_secs_f64(secs).map_err(|e| invalid(format!("{e} (seconds)")));
    }
    parse_duration(text)
}

/// A duration given as `key=value` in a URL's query: an error names the key.
pub(crate) fn url_duration(key: &str, value: &str) -> Result<Duration> {
    parse_duration(value).map_err(|e| match e {
        Error::InvalidDuration { reason, .. } => Error::InvalidDuration { value: format!("{key}={value}"), reason },
        e => e,
    })
}

//! `etcd://` URLs.

use crate::{parse_duration, Error, Result};
use std::time::Duration;

/// Default session TTL (the lease every lock of a client is put under).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// A parsed `etcd://host:port[,host:port…][?ttl=30s&timeout=5s&connect_timeout=5s]`.
///
/// Query keys:
/// - `ttl` (or `lease`): the session lease's TTL, whole seconds from 2 s (etcd's own minimum) to
///   a day; the client keeps it alive every third of it, and a holder that stops doing so keeps
///   its locks that long at most;
/// - `timeout`: how long one request may take before it counts as failed (default 5 s);
/// - `connect_timeout`: how long connecting may take (default 5 s).
///
/// # Examples
///
/// ```
/// use distlock::etcd::EtcdUrl;
/// let url = EtcdUrl::parse("etcd://127.0.0.1:2379,127.0.0.1:22379?ttl=10s").unwrap();
/// assert_eq!(url.endpoints, ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]);
/// assert_eq!(url.ttl, std::time::Duration::from_secs(10));
/// assert!(EtcdUrl::parse("etcd://127.0.0.1:2379?ttl=1500ms").is_err());
/// ```
#[derive(Debug, Clone)]
pub struct EtcdUrl {
    /// The members to talk to, as `http://host:port`.
    pub endpoints: Vec<String>,
    /// The session lease's TTL.
    pub ttl: Duration,
    /// The bound on one request.
    pub timeout: Duration,
    /// The bound on connecting.
    pub connect_timeout: Duration,
}

impl std::fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&str> = self.endpoints.iter().map(|e| e.trim_start_matches("http://")).collect();
        write!(f, "etcd://{}", hosts.join(","))
    }
}

impl EtcdUrl {
    /// Parses an `etcd://` URL.
    pub fn parse(url: &str) -> Result<EtcdUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: url.to_string(), reason };
        let rest = url.strip_prefix("etcd://").ok_or_else(|| bad("an etcd URL starts with etcd://".into()))?;
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let hosts = hosts.trim_end_matches('/');
        if hosts.contains('/') {
            return Err(bad("an etcd URL has no path: the lock name is the key prefix".into()));
        }
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let (h, port) =
                host.rsplit_once(':').ok_or_else(|| bad(format!("{host:?} has no port: write host:2379")))?;
            if h.is_empty() {
                return Err(bad(format!("{host:?} has no host name")));
            }
            port.parse::<u16>().map_err(|_| bad(format!("{port:?} in {host:?} is not a port number")))?;
            endpoints.push(format!("http://{host}"));
        }
        let mut out = EtcdUrl {
            endpoints,
            ttl: DEFAULT_TTL,
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "ttl" | "lease" => out.ttl = parse_duration(v)?,
                "timeout" => out.timeout = parse_duration(v)?,
                "connect_timeout" => out.connect_timeout = parse_duration(v)?,
                _ => return Err(bad(format!("unknown URL key {k:?} (known: ttl, timeout, connect_timeout)"))),
            }
        }
        if out.ttl.subsec_nanos() != 0 || !(2..=86_400).contains(&out.ttl.as_secs()) {
            return Err(bad(format!(
                "ttl={} must be whole seconds from 2s to 1 day (etcd leases count seconds)",
                humantime::format_duration(out.ttl)
            )));
        }
        for (key, d) in [("timeout", out.timeout), ("connect_timeout", out.connect_timeout)] {
            if d < Duration::from_millis(10) {
                return Err(bad(format!("{key}={} is too short (at least 10ms)", humantime::format_duration(d))));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_their_errors() {
        let u = EtcdUrl::parse("etcd://localhost:2379/?lease=2s&timeout=1s").unwrap();
        assert_eq!(u.endpoints, ["http://localhost:2379"]);
        assert_eq!(u.ttl, Duration::from_secs(2));
        assert_eq!(u.timeout, Duration::from_secs(1));
        assert_eq!(u.to_string(), "etcd://localhost:2379");
        crate::assert_refused(
            EtcdUrl::parse,
            &[
                ("etcd://", "no port"),
                ("etcd://h", "no port"),
                ("etcd://h:x", "not a port"),
                ("etcd://:2379", "no host"),
                ("etcd://h:2379/locks", "no path"),
                ("etcd://h:2379?ttl=1s", "ttl=1s"),
                ("etcd://h:2379?ttl=2500ms", "whole seconds"),
                ("etcd://h:2379?nope=1", "nope"),
                ("etcd://h:2379?timeout=1ms", "too short"),
                ("http://h:2379", "etcd://"),
            ],
        );
    }
}

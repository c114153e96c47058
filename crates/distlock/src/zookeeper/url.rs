//! `zk://` URLs and znode path validation.

use crate::{Error, Result};
use std::time::Duration;

/// Default session timeout when the URL does not name one.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed `zk://host:port[,host:port...][/chroot][?session_timeout=10s&connect_timeout=5s]`.
///
/// # Examples
///
/// ```
/// use distlock::zookeeper::ZkUrl;
/// use std::time::Duration;
/// let url = ZkUrl::parse("zk://10.0.0.1:2181,10.0.0.2:2181/apps/orders?session_timeout=4s").unwrap();
/// assert_eq!(url.hosts, vec!["10.0.0.1:2181", "10.0.0.2:2181"]);
/// assert_eq!(url.chroot.as_deref(), Some("/apps/orders"));
/// assert_eq!(url.session_timeout, Duration::from_secs(4));
/// assert!(ZkUrl::parse("redis://localhost").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkUrl {
    /// `host:port` pairs, in the order given.
    pub hosts: Vec<String>,
    /// Optional chroot every path is relative to.
    pub chroot: Option<String>,
    /// Requested session timeout (the server bounds it to 2..20 ticks).
    pub session_timeout: Duration,
    /// Bound on establishing the first connection.
    pub connect_timeout: Duration,
    /// How long before the session timeout a lock stops counting itself held when the server has
    /// not answered (`lease_margin=`); `None` uses the default, 27% of the negotiated timeout
    /// (see [`lease_deadline`](super::MutexGuard::lease_deadline)).
    pub lease_margin: Option<Duration>,
    /// The layout of elections (`election=latch|selector`): Curator's `LeaderLatch` (the
    /// default) or `LeaderSelector` (an `InterProcessMutex` queue).
    pub election: ElectionLayout,
}

/// Which Curator recipe's nodes a ZooKeeper election uses (see [`crate::election`]).
///
/// # Examples
///
/// ```
/// use distlock::zookeeper::{ElectionLayout, ZkUrl};
/// let url = ZkUrl::parse("zk://127.0.0.1:2181?election=selector").unwrap();
/// assert_eq!(url.election, ElectionLayout::Selector);
/// assert_eq!(ZkUrl::parse("zk://127.0.0.1:2181").unwrap().election, ElectionLayout::Latch);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ElectionLayout {
    /// Curator's `LeaderLatch`: `_c_<uuid>-latch-<seq>` nodes, data = the participant's id.
    #[default]
    Latch,
    /// Curator's `LeaderSelector`: `_c_<uuid>-lock-<seq>` nodes (its `InterProcessMutex`), data =
    /// the participant's id.
    Selector,
}

impl ZkUrl {
    /// Parses a `zk://` URL; the error names the URL and what is wrong with it.
    pub fn parse(url: &str) -> Result<ZkUrl> {
        let bad = |reason: &str| Error::InvalidUrl { url: url.to_string(), reason: reason.to_string() };
        let rest = url.strip_prefix("zk://").ok_or_else(|| bad("must start with zk:// (e.g. zk://127.0.0.1:2181)"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (hosts_part, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        if hosts_part.is_empty() {
            return Err(bad("no host:port given"));
        }
        let mut hosts = Vec::new();
        for hp in hosts_part.split(',') {
            let (host, port) =
                hp.rsplit_once(':').ok_or_else(|| bad(&format!("{hp:?} has no port (write host:port)")))?;
            if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '@') {
                return Err(bad(&format!("{hp:?} has an invalid host")));
            }
            let port: u16 = port.parse().map_err(|_| bad(&format!("{hp:?} has an invalid port {port:?}")))?;
            if port == 0 {
                return Err(bad(&format!("{hp:?}: port 0 is not a server port")));
            }
            hosts.push(format!("{host}:{port}"));
        }
        let chroot = match chroot {
            None | Some("/") => None,
            Some(c) => {
                validate_path(c).map_err(|e| bad(&format!("chroot: {e}")))?;
                Some(c.to_string())
            }
        };
        let mut session_timeout = DEFAULT_SESSION_TIMEOUT;
        let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        let mut lease_margin = None;
        let mut election = ElectionLayout::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| bad(&format!("query {pair:?} is not key=value")))?;
            if key == "election" {
                election = match value {
                    "latch" => ElectionLayout::Latch,
                    "selector" => ElectionLayout::Selector,
                    other => {
                        return Err(bad(&format!(
                            "election: unknown layout {other:?} (latch for Curator's LeaderLatch, selector for its LeaderSelector)"
                        )))
                    }
                };
                continue;
            }
            if ["cacert", "cert", "key"].contains(&key) {
                return Err(bad(&format!(
                    "{key}: TLS to ZooKeeper (its secure client port) is not supported yet; connect to the plain port on a trusted network"
                )));
            }
            if !["lease", "session_timeout", "connect_timeout", "lease_margin"].contains(&key) {
                return Err(bad(&format!(
                    "unknown option {key:?} (known: lease or its alias session_timeout, connect_timeout, lease_margin, election)"
                )));
            }
            let d = crate::parse_duration(value).map_err(|e| bad(&format!("{key}: {e}")))?;
            let slot = match key {
                "lease" | "session_timeout" => &mut session_timeout,
                "connect_timeout" => &mut connect_timeout,
                "lease_margin" => {
                    lease_margin = Some(d);
                    continue;
                }
                _ => &mut connect_timeout,
            };
            if d.is_zero() {
                return Err(bad(&format!("{key} must be greater than zero")));
            }
            *slot = d;
        }
        if let Some(m) = lease_margin {
            if m >= session_timeout {
                return Err(bad(&format!(
                    "lease_margin ({m:?}) must be shorter than session_timeout ({session_timeout:?})"
                )));
            }
        }
        Ok(ZkUrl { hosts, chroot, session_timeout, connect_timeout, lease_margin, election })
    }

    /// The connect string the ZooKeeper client takes: `h1:p1,h2:p2/chroot`.
    pub fn connect_string(&self) -> String {
        format!("{}{}", self.hosts.join(","), self.chroot.as_deref().unwrap_or(""))
    }
}

impl std::fmt::Display for ZkUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "zk://{}", self.connect_string())
    }
}

/// Checks a znode path; returns a reason when it is not acceptable.
pub(crate) fn validate_path(path: &str) -> std::result::Result<(), String> {
    if !path.starts_with('/') {
        return Err("must start with '/'".into());
    }
    if path == "/" {
        return Err("the root node cannot be a lock".into());
    }
    if path.ends_with('/') {
        return Err("must not end with '/'".into());
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return Err("has an empty segment ('//')".into());
        }
        if segment == "." || segment == ".." {
            return Err(format!("relative segment {segment:?} is not allowed"));
        }
        if let Some(c) = segment
            .chars()
            .find(|c| c.is_control() || ('\u{e000}'..='\u{f8ff}').contains(c) || ('\u{fff0}'..='\u{ffff}').contains(c))
        {
            return Err(format!("contains the forbidden character {c:?}"));
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err("/zookeeper is reserved by the server".into());
    }
    Ok(())
}

/// Validates a lock path given by a user and returns it, or an [`Error::InvalidLockPath`].
pub(crate) fn lock_path(path: &str) -> Result<String> {
    validate_path(path).map_err(|reason| Error::InvalidLockPath { path: path.to_string(), reason })?;
    Ok(path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_url() {
        let u = ZkUrl::parse("zk://a:1,b:2/x/y?session_timeout=3s&connect_timeout=500ms").unwrap();
        assert_eq!(u.connect_string(), "a:1,b:2/x/y");
        assert_eq!(u.connect_timeout, Duration::from_millis(500));
    }

    #[test]
    fn rejects_bad_urls_naming_them() {
        crate::assert_refused_naming_url(
            ZkUrl::parse,
            &[
                ("http://a:1", "zk://"),
                ("zk://", "no host"),
                ("zk://a", "no port"),
                ("zk://a:99999", "invalid port"),
                ("zk://a:0", "port 0"),
                ("zk://a:1/x/", "end with"),
                ("zk://a:1?session_timeout=ten", "session_timeout"),
                ("zk://a:1?session_timeout=0s", "greater than zero"),
                ("zk://a:1?colour=red", "unknown option"),
                ("zk://a:1?cacert=/ca.pem", "not supported yet"),
                ("zk://a:1?session_timeout=4s&lease_margin=4s", "lease_margin"),
                ("zk://a:1?election=bully", "LeaderSelector"),
            ],
        );
    }

    #[test]
    fn validates_paths() {
        assert!(validate_path("/locks/a").is_ok());
        for p in ["", "x", "/", "/a/", "/a//b", "/a/../b", "/zookeeper/q", "/a\u{0}b"] {
            assert!(validate_path(p).is_err(), "{p:?}");
        }
        let e = lock_path("locks").unwrap_err().to_string();
        assert!(e.contains("\"locks\"") && e.contains("start with"), "{e}");
    }
}

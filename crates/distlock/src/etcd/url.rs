//! `etcd://` URLs.

use crate::{Error, Result};
use std::time::Duration;

/// Default session TTL (the lease every lock of a client is put under).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// A parsed `etcd://[user:password@]host:port[,host:port…][?ttl=30s&timeout=5s&connect_timeout=5s]`;
/// `etcds://` for TLS (etcdctl's `https://` endpoints), the members' certificates verified.
///
/// With `user:password@`, the client authenticates as that etcd user (etcd's `auth enable`);
/// over `etcds://` with a client certificate and no user, etcd's `--client-cert-auth` takes the
/// user from the certificate's common name.
///
/// Query keys:
/// - `ttl` (or `lease`): the session lease's TTL, whole seconds from 2 s (etcd's own minimum) to
///   a day; the client keeps it alive every third of it, and a holder that stops doing so keeps
///   its locks that long at most;
/// - `timeout`: how long one request may take before it counts as failed (default 5 s);
/// - `connect_timeout`: how long connecting may take (default 5 s);
/// - `cacert`, `cert`, `key` (`etcds://` only): the CA that verifies the members (default: the
///   system's roots), and a client certificate and key, as `etcdctl --cacert --cert --key`.
///
/// The URL's keys are its configuration: an `EtcdUrl` is made by [`parse`](Self::parse) only, and
/// read through its accessors ([`endpoints`](Self::endpoints), [`ttl`](Self::ttl), …). Other
/// settings are another URL (change its keys), or [`ConnectOptions`](crate::ConnectOptions) given
/// to [`connect_with`](crate::connect_with).
///
/// # Examples
///
/// ```
/// use distlock::etcd::EtcdUrl;
/// let url = EtcdUrl::parse("etcd://app:secret@127.0.0.1:2379,127.0.0.1:22379?ttl=10s").unwrap();
/// assert_eq!(url.endpoints(), ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]);
/// assert_eq!(url.ttl(), std::time::Duration::from_secs(10));
/// assert_eq!(url.user(), Some("app"));
/// assert!(!format!("{url} {url:?}").contains("secret"));
/// assert!(EtcdUrl::parse("etcd://127.0.0.1:2379?ttl=1500ms").is_err());
/// ```
#[derive(Clone)]
pub struct EtcdUrl {
    /// The members to talk to, as `http://host:port` (`https://` with TLS).
    pub(crate) endpoints: Vec<String>,
    /// The etcd user and password, if given (the password never shown).
    pub(crate) user: Option<(String, String)>,
    /// TLS (`etcds://`).
    pub(crate) tls: bool,
    /// The TLS files (CA, client certificate and key), with `tls`.
    pub(crate) tls_files: crate::tls::TlsFiles,
    /// The session lease's TTL.
    pub(crate) ttl: Duration,
    /// The bound on one request.
    pub(crate) timeout: Duration,
    /// The bound on connecting.
    pub(crate) connect_timeout: Duration,
}

impl std::fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&str> =
            self.endpoints.iter().map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h)).collect();
        let user = self.user.as_ref().map(|(u, _)| format!("{u}:***@")).unwrap_or_default();
        write!(f, "{}://{user}{}", if self.tls { "etcds" } else { "etcd" }, hosts.join(","))?;
        let files = self.tls_files.query_pairs();
        if !files.is_empty() {
            write!(f, "?{}", files.join("&"))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUrl")
            .field("url", &self.to_string())
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl EtcdUrl {
    /// The members to talk to, as `http://host:port` (`https://` with TLS), in the order given.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The etcd user, if the URL names one.
    pub fn user(&self) -> Option<&str> {
        self.user.as_ref().map(|(user, _)| user.as_str())
    }

    /// The etcd user's password, if the URL names a user; never shown by `Display` or `Debug`.
    pub fn password(&self) -> Option<&str> {
        self.user.as_ref().map(|(_, password)| password.as_str())
    }

    /// Whether the connections are TLS (`etcds://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The TLS files (CA, client certificate and key), with [`tls`](Self::tls).
    pub fn tls_files(&self) -> &crate::tls::TlsFiles {
        &self.tls_files
    }

    /// The session lease's TTL (`ttl=` or `lease=`, default 30 s): how long a holder that stops
    /// keeping it alive keeps its locks at most.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The bound on one request (`timeout=`, default 5 s).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The bound on connecting (`connect_timeout=`, default 5 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Parses an `etcd://` URL.
    pub fn parse(url: &str) -> Result<EtcdUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<EtcdUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: crate::redact_url(url), reason };
        let (tls, rest) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(bad("an etcd URL starts with etcd:// (etcds:// for TLS)".into())),
        };
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (user, hosts) = match hosts.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (name, password) = userinfo.split_once(':').ok_or_else(|| {
                    bad("an etcd user needs its password: write etcd://USER:PASSWORD@host:2379".into())
                })?;
                if name.is_empty() {
                    return Err(bad("an empty etcd user name".into()));
                }
                (Some((name.to_string(), password.to_string())), hosts)
            }
            None => (None, hosts),
        };
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
            endpoints.push(format!("{}://{host}", if tls { "https" } else { "http" }));
        }
        // setup is taken and means nothing here: connecting makes nothing on etcd (the
        // session's lease ends with the client).
        let (common, own) = QUERY.parse(query).map_err(bad)?;
        let common = QUERY.merge(common, over).map_err(&bad)?;
        if let (false, Some(k)) = (tls, common.tls_files.first_given()) {
            return Err(bad(format!("{k} is a TLS file: write etcds:// to connect with TLS")));
        }
        let mut out = EtcdUrl {
            endpoints,
            user,
            tls,
            tls_files: common.tls_files,
            ttl: common.lease.unwrap_or(DEFAULT_TTL),
            timeout: Duration::from_secs(5),
            connect_timeout: common.connect_timeout.unwrap_or(Duration::from_secs(5)),
        };
        for pair in own {
            out.timeout = pair.duration().map_err(bad)?;
        }
        out.tls_files.check().map_err(bad)?;
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

/// The keys of an `etcd://` URL's query beside the common ones.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "ttl",
    keys: &[crate::options::Key::new("timeout", "")],
    tls: crate::options::TlsKeys::Files(&[]),
    connections: crate::options::ConnectionKeys::Refused(
        "an etcd client's locks share one gRPC channel and one lease (the key is for PostgreSQL and MariaDB, whose locks live in server sessions)",
    ),
    pairs_need_values: false,
};

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

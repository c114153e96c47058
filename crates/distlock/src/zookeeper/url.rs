//! `zk://` URLs and znode path validation.

use crate::{Error, Result};
use std::time::Duration;

/// Default session timeout when the URL does not name one.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed `zk://[user:password@]host:port[,host:port...][/chroot][?session_timeout=10s&…]`.
///
/// `zks://` connects to the servers' secure client port (TLS, the server's certificate and name
/// verified against `cacert`, else the system's roots; `cert` and `key` for a server that asks
/// for client certificates, which Apache ZooKeeper does by default). A user and password log in:
/// as ZooKeeper's `digest` scheme (`addauth digest user:password`, Curator's `authorization`,
/// the default) or, with `auth=sasl`, by SASL DIGEST-MD5 (a `user_NAME="…"` entry of the server's
/// JAAS `Server` section). User and password are percent-decoded; the password is never shown.
///
/// The URL's keys are its configuration: a `ZkUrl` is made by [`parse`](Self::parse) only, and
/// read through its accessors ([`hosts`](Self::hosts), [`session_timeout`](Self::session_timeout),
/// …). Other settings are another URL (change its keys), or
/// [`ConnectOptions`](crate::ConnectOptions) given to [`connect_with`](crate::connect_with).
///
/// # Examples
///
/// ```
/// use distlock::zookeeper::ZkUrl;
/// use std::time::Duration;
/// let url = ZkUrl::parse("zk://10.0.0.1:2181,10.0.0.2:2181/apps/orders?session_timeout=4s").unwrap();
/// assert_eq!(url.hosts(), ["10.0.0.1:2181", "10.0.0.2:2181"]);
/// assert_eq!(url.chroot(), Some("/apps/orders"));
/// assert_eq!(url.session_timeout(), Duration::from_secs(4));
/// assert!(ZkUrl::parse("redis://localhost").is_err());
///
/// let secure = ZkUrl::parse("zks://app:s%40cret@zk1:2281?auth=sasl&cacert=/etc/zk/ca.pem").unwrap();
/// assert!(secure.tls());
/// assert_eq!(secure.auth().map(|a| a.user()), Some("app"));
/// assert_eq!(secure.to_string(), "zks://app:***@zk1:2281?auth=sasl&cacert=/etc/zk/ca.pem");
/// assert!(ZkUrl::parse("zk://zk1:2181?cacert=/ca.pem").unwrap_err().to_string().contains("zks://"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkUrl {
    /// `host:port` pairs, in the order given.
    pub(crate) hosts: Vec<String>,
    /// Optional chroot every path is relative to.
    pub(crate) chroot: Option<String>,
    /// Requested session timeout (the server bounds it to 2..20 ticks).
    pub(crate) session_timeout: Duration,
    /// Bound on establishing the first connection.
    pub(crate) connect_timeout: Duration,
    /// How long before the session timeout a lock stops counting itself held when the server has
    /// not answered (`lease_margin=`); `None` uses the default, 27% of the negotiated timeout
    /// (see [`lease_deadline`](super::MutexGuard::lease_deadline)).
    pub(crate) lease_margin: Option<Duration>,
    /// The layout of elections (`election=latch|selector`): Curator's `LeaderLatch` (the
    /// default) or `LeaderSelector` (an `InterProcessMutex` queue).
    pub(crate) election: ElectionLayout,
    /// TLS to the secure client port (`zks://`).
    pub(crate) tls: bool,
    /// The TLS files (CA, client certificate and key), with `tls`.
    pub(crate) tls_files: crate::tls::TlsFiles,
    /// The login, if the URL names a user.
    pub(crate) auth: Option<ZkAuth>,
    /// Who may touch the nodes distlock creates (`acl=open|creator`).
    pub(crate) acl: AclMode,
    /// The lease was asked for (in the URL, or by an option), not left at the default: then a
    /// server that would grant another session timeout is refused rather than followed.
    lease_given: bool,
}

/// The ACL of every node distlock creates (lock nodes, their directories and parents, election
/// and job nodes), chosen by `acl=` (see [`ZkUrl`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AclMode {
    /// `world:anyone` may do anything (ZooKeeper's `OPEN_ACL_UNSAFE`, Curator's default).
    #[default]
    Open,
    /// The identities the session logged in with may do anything (`auth` scheme: `CREATOR_ALL`),
    /// everyone else may only read (so `inspect` and `top` still see holders). Needs a login;
    /// every client of a lock must log in as the same identity.
    Creator,
}

/// How a `zk://` URL's user logs in (see [`ZkUrl`]).
#[derive(Clone, PartialEq, Eq)]
pub enum ZkAuth {
    /// ZooKeeper's `digest` scheme: `addauth digest user:password` on every connection.
    Digest {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// SASL DIGEST-MD5 against the server's JAAS `Server` section.
    Sasl {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
}

impl ZkAuth {
    /// The user name.
    pub fn user(&self) -> &str {
        match self {
            ZkAuth::Digest { user, .. } | ZkAuth::Sasl { user, .. } => user,
        }
    }

    fn scheme(&self) -> &'static str {
        match self {
            ZkAuth::Digest { .. } => "digest",
            ZkAuth::Sasl { .. } => "sasl",
        }
    }
}

impl std::fmt::Debug for ZkAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({}:***)", self.scheme(), self.user())
    }
}

/// Which Curator recipe's nodes a ZooKeeper election uses (see [`crate::election`]).
///
/// # Examples
///
/// ```
/// use distlock::zookeeper::{ElectionLayout, ZkUrl};
/// let url = ZkUrl::parse("zk://127.0.0.1:2181?election=selector").unwrap();
/// assert_eq!(url.election(), ElectionLayout::Selector);
/// assert_eq!(ZkUrl::parse("zk://127.0.0.1:2181").unwrap().election(), ElectionLayout::Latch);
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
    /// The servers, `host:port` each, in the order given.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The chroot every path is relative to, if the URL has a path.
    pub fn chroot(&self) -> Option<&str> {
        self.chroot.as_deref()
    }

    /// The session timeout asked for (`session_timeout=`, or `lease=`; default 10 s): the lease
    /// of every lock of the client. The server bounds it to 2..20 ticks; a timeout asked for and
    /// not granted is refused at connect.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The bound on establishing the first connection (`connect_timeout=`, default 10 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long before the session timeout a lock stops counting itself held when the server has
    /// not answered (`lease_margin=`); `None` uses the default, 27% of the negotiated timeout
    /// (see [`lease_deadline`](super::MutexGuard::lease_deadline)).
    pub fn lease_margin(&self) -> Option<Duration> {
        self.lease_margin
    }

    /// The layout of elections (`election=latch|selector`).
    pub fn election(&self) -> ElectionLayout {
        self.election
    }

    /// Whether the connection is TLS, to the secure client port (`zks://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The TLS files (CA, client certificate and key), with [`tls`](Self::tls).
    pub fn tls_files(&self) -> &crate::tls::TlsFiles {
        &self.tls_files
    }

    /// The login, if the URL names a user.
    pub fn auth(&self) -> Option<&ZkAuth> {
        self.auth.as_ref()
    }

    /// Who may touch the nodes distlock creates (`acl=open|creator`).
    pub fn acl(&self) -> AclMode {
        self.acl
    }

    /// Whether the lease was asked for (not the default).
    pub(crate) fn lease_given(&self) -> bool {
        self.lease_given
    }

    /// Parses a `zk://` URL; the error names the URL and what is wrong with it.
    pub fn parse(url: &str) -> Result<ZkUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<ZkUrl> {
        let bad = |reason: &str| Error::InvalidUrl { url: crate::redact_url(url), reason: reason.to_string() };
        let (tls, rest) = match (url.strip_prefix("zk://"), url.strip_prefix("zks://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(bad("must start with zk:// (e.g. zk://127.0.0.1:2181), or zks:// for TLS")),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (userinfo, rest) = match rest.split_once('/').map_or(rest, |(hosts, _)| hosts).rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let user = match userinfo {
            None => None,
            Some(info) => {
                let (user, password) = info
                    .split_once(':')
                    .ok_or_else(|| bad("a ZooKeeper user needs its password: write zk://USER:PASSWORD@host:2181"))?;
                let user = crate::options::percent_decode(user).map_err(|e| bad(&format!("user: {e}")))?;
                let password = crate::options::percent_decode(password).map_err(|e| bad(&format!("password: {e}")))?;
                if user.is_empty() {
                    return Err(bad("an empty ZooKeeper user name"));
                }
                Some((user, password))
            }
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
        // setup is taken and means nothing here: connecting makes nothing on ZooKeeper (a
        // lock's parents are made with the lock).
        let (common, own) = QUERY.parse(query.unwrap_or("")).map_err(|e| bad(&e))?;
        let common = QUERY.merge(common, over).map_err(|r| bad(&r))?;
        if let (false, Some(k)) = (tls, common.tls_files.first_given()) {
            return Err(bad(&format!("{k} is a TLS file: write zks:// to connect to the secure client port")));
        }
        for (key, d) in [(common.lease_key, common.lease), ("connect_timeout", common.connect_timeout)] {
            if d.is_some_and(|d| d.is_zero()) {
                return Err(bad(&format!("{key} must be greater than zero")));
            }
        }
        let session_timeout = common.lease.unwrap_or(DEFAULT_SESSION_TIMEOUT);
        let connect_timeout = common.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let (tls_files, lease_given) = (common.tls_files, common.lease.is_some());
        let (mut lease_margin, mut election, mut sasl, mut acl) =
            (None, ElectionLayout::default(), None, AclMode::default());
        for pair in own {
            match pair.name {
                "lease_margin" => lease_margin = Some(pair.duration().map_err(|e| bad(&e))?),
                "acl" => acl = acl_of(pair.value).map_err(|e| bad(&e))?,
                "auth" => sasl = Some(sasl_of(pair.value).map_err(|e| bad(&e))?),
                _ => election = election_of(pair.value).map_err(|e| bad(&e))?,
            }
        }
        if let Some(m) = lease_margin {
            if m >= session_timeout {
                return Err(bad(&format!(
                    "lease_margin ({m:?}) must be shorter than session_timeout ({session_timeout:?})"
                )));
            }
        }
        tls_files.check().map_err(|e| bad(&e))?;
        let auth = match (user, sasl) {
            (None, None) => None,
            (None, Some(_)) => return Err(bad("auth= needs a user: write zk://USER:PASSWORD@host:2181?auth=…")),
            (Some((user, password)), Some(true)) => Some(ZkAuth::Sasl { user, password }),
            (Some((user, password)), _) => Some(ZkAuth::Digest { user, password }),
        };
        if acl == AclMode::Creator && auth.is_none() {
            return Err(bad("acl=creator needs a login: write zk://USER:PASSWORD@host:2181?acl=creator"));
        }
        Ok(ZkUrl {
            hosts,
            chroot,
            session_timeout,
            connect_timeout,
            lease_margin,
            election,
            tls,
            tls_files,
            auth,
            acl,
            lease_given,
        })
    }

    /// The connect string the ZooKeeper client takes: `h1:p1,h2:p2/chroot`.
    pub fn connect_string(&self) -> String {
        format!("{}{}", self.hosts.join(","), self.chroot.as_deref().unwrap_or(""))
    }
}

impl std::fmt::Display for ZkUrl {
    /// The URL as it may be shown: the password as `***`, the login and TLS files kept.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self.auth.as_ref().map(|a| format!("{}:***@", a.user())).unwrap_or_default();
        write!(f, "{}://{user}{}", if self.tls { "zks" } else { "zk" }, self.connect_string())?;
        let mut pairs = Vec::new();
        if let Some(ZkAuth::Sasl { .. }) = &self.auth {
            pairs.push("auth=sasl".to_string());
        }
        if self.acl == AclMode::Creator {
            pairs.push("acl=creator".to_string());
        }
        pairs.extend(self.tls_files.query_pairs());
        if !pairs.is_empty() {
            write!(f, "?{}", pairs.join("&"))?;
        }
        Ok(())
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
    crate::contract::check_name(path)?;
    validate_path(path).map_err(|reason| Error::InvalidLockPath { path: path.to_string(), reason })?;
    Ok(path.to_string())
}

/// The keys of a `zk://` URL's query beside the common ones.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "lease",
    keys: &[
        crate::options::Key::new("lease_margin", ""),
        crate::options::Key::new("election", "latch|selector"),
        crate::options::Key::new("auth", "digest|sasl"),
        crate::options::Key::new("acl", "open|creator"),
    ],
    tls: crate::options::TlsKeys::Files(&[]),
    connections: crate::options::ConnectionKeys::Refused(
        "a ZooKeeper client's locks share its one session (the key is for PostgreSQL and MariaDB, whose locks live in server sessions)",
    ),
    pairs_need_values: true,
};

/// The `acl` value.
fn acl_of(value: &str) -> std::result::Result<AclMode, String> {
    match value {
        "open" => Ok(AclMode::Open),
        "creator" => Ok(AclMode::Creator),
        other => Err(format!(
            "acl: unknown ACL {other:?} (open: anyone may do anything; creator: only this login may change, anyone may read)"
        )),
    }
}

/// The `auth` value: whether the login is SASL.
fn sasl_of(value: &str) -> std::result::Result<bool, String> {
    match value {
        "digest" => Ok(false),
        "sasl" => Ok(true),
        other => Err(format!("auth: unknown login {other:?} (digest for addauth digest, sasl for SASL DIGEST-MD5)")),
    }
}

/// The `election` value.
fn election_of(value: &str) -> std::result::Result<ElectionLayout, String> {
    match value {
        "latch" => Ok(ElectionLayout::Latch),
        "selector" => Ok(ElectionLayout::Selector),
        other => Err(format!(
            "election: unknown layout {other:?} (latch for Curator's LeaderLatch, selector for its LeaderSelector)"
        )),
    }
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
                ("zk://a:1?colour=red", "unknown URL key"),
                ("zk://a:1?cacert=/ca.pem", "zks://"),
                ("zks://a:1?cert=/c.pem", "key"),
                ("zk://u@a:1", "password"),
                ("zk://a:1?auth=sasl", "needs a user"),
                ("zk://a:1?session_timeout=4s&lease_margin=4s", "lease_margin"),
                ("zk://a:1?election=bully", "LeaderSelector"),
            ],
        );
        // With a password, the URL is quoted with the password as ***.
        crate::assert_refused(
            ZkUrl::parse,
            &[("zk://u:p@a:1?auth=kerberos", "unknown login"), ("zk://u:%zz@a:1", "hex digits")],
        );
        let e = ZkUrl::parse("zk://u:%zz@a:1").unwrap_err().to_string();
        // (a user part with a malformed escape is hidden whole: where it ends is not known)
        assert!(e.contains("zk://***@a:1") && !e.contains("%zz"), "{e}");
    }

    #[test]
    fn acl_modes() {
        assert_eq!(ZkUrl::parse("zk://a:1").unwrap().acl, AclMode::Open);
        let u = ZkUrl::parse("zk://u:p@a:1?acl=creator").unwrap();
        assert_eq!(u.acl, AclMode::Creator);
        assert_eq!(u.to_string(), "zk://u:***@a:1?acl=creator");
        assert!(ZkUrl::parse("zk://a:1?acl=creator").unwrap_err().to_string().contains("needs a login"));
        assert!(ZkUrl::parse("zk://a:1?acl=mine").unwrap_err().to_string().contains("unknown ACL"));
    }

    #[test]
    fn logins_and_tls() {
        let u = ZkUrl::parse("zks://a%3Ab:p%40ss%3Aw@h:1,h2:2/app?auth=sasl&cacert=/ca.pem").unwrap();
        assert_eq!(u.auth, Some(ZkAuth::Sasl { user: "a:b".into(), password: "p@ss:w".into() }));
        assert_eq!(u.connect_string(), "h:1,h2:2/app");
        assert!(!format!("{u} {u:?}").contains("p@ss"), "the password is never shown: {u:?}");
        let d = ZkUrl::parse("zk://u:pw@h:1").unwrap();
        assert_eq!(d.auth, Some(ZkAuth::Digest { user: "u".into(), password: "pw".into() }));
        assert!(!d.tls);
        let e = ZkUrl::parse("zk://u:secret@h:1?colour=red").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
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

//! `redis://` URLs.

use crate::{Error, Result};
use std::time::Duration;

/// Default lease: Redisson's `lockWatchdogTimeout`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The longest lease a URL may ask for.
const MAX_LEASE: Duration = Duration::from_secs(30 * 86_400);
/// Default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which key layout a lock uses on Redis.
///
/// # Examples
///
/// ```
/// use distlock::redis::Layout;
/// assert_eq!("simple".parse::<Layout>().unwrap(), Layout::Simple);
/// assert!("fair".parse::<Layout>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Redisson's RLock: a hash `K` with field `<client uuid>:<handle id>` holding the hold
    /// count, a PEXPIRE lease renewed by a watchdog, and `0` published on
    /// `redisson_lock__channel:{K}` at the final release. Java services using Redisson's
    /// `getLock(K)` share the lock.
    #[default]
    Redisson,
    /// The plain lock: a string `K` set with `SET K token NX PX lease`, released and renewed by
    /// compare-and-delete / compare-and-pexpire scripts. redis-py's `Lock(K)` shares it.
    Simple,
}

impl std::str::FromStr for Layout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Layout> {
        match s {
            "redisson" => Ok(Layout::Redisson),
            "simple" => Ok(Layout::Simple),
            _ => Err(Error::InvalidArgument {
                what: "Redis lock layout",
                reason: format!("{s:?} is not a layout (redisson or simple)"),
            }),
        }
    }
}

/// A parsed `redis://[user:password@]host:port[/db][?lease=30s&connect_timeout=10s&layout=redisson]`;
/// `rediss://` (and `rediss+sentinel://`, `rediss+cluster://`) for TLS, the server's certificate
/// verified (see [`crate::tls`]).
///
/// Query keys:
/// - `lease`: how long the server keeps a lock whose holder stopped renewing (default 30 s,
///   Redisson's watchdog timeout); renewed every third of it;
/// - `connect_timeout`: bound on connecting and on each request (default 10 s);
/// - `layout`: `redisson` (default) or `simple` for [`Client::mutex`](super::Client::mutex);
/// - `replicas`: that many replicas must confirm each acquire (`WAIT`, pipelined with it) within
///   `replica_timeout` (default 1 s), or the acquire fails with
///   [`Error::NotReplicated`](crate::Error::NotReplicated) and takes nothing (default 0: no wait);
/// - `cacert`, `cert`, `key` (TLS schemes only): the CA that verifies the server (default: the
///   system's roots), and a client certificate and key for a server that asks for one.
///
/// An unknown key is an error naming it.
///
/// The URL's keys are its configuration: a `RedisUrl` is made by [`parse`](Self::parse) only, and
/// read through its accessors ([`host`](Self::host), [`lease`](Self::lease), …). Other settings
/// are another URL (change its keys), or [`ConnectOptions`](crate::ConnectOptions) given to
/// [`connect_with`](crate::connect_with).
///
/// # Examples
///
/// ```
/// use distlock::redis::{Layout, RedisUrl};
/// use std::time::Duration;
/// let url = RedisUrl::parse("redis://127.0.0.1:6379/2?lease=5s&layout=simple").unwrap();
/// assert_eq!(url.host(), "127.0.0.1");
/// assert_eq!(url.port(), 6379);
/// assert_eq!(url.db(), 2);
/// assert_eq!(url.lease(), Duration::from_secs(5));
/// assert_eq!(url.layout(), Layout::Simple);
/// assert!(RedisUrl::parse("redis://127.0.0.1:6379?leese=5s").unwrap_err().to_string().contains("leese"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Host name or address.
    pub(crate) host: String,
    /// Port (default 6379).
    pub(crate) port: u16,
    /// Database number (default 0).
    db: i64,
    /// ACL user name, if any.
    username: Option<String>,
    /// Password, if any (never shown by `Display` or `Debug`).
    password: Option<String>,
    /// Lock lease; renewed every third of it while held.
    pub(crate) lease: Duration,
    /// Bound on connecting, and on every request.
    pub(crate) connect_timeout: Duration,
    /// Default layout of [`Client::mutex`](super::Client::mutex).
    pub(crate) layout: Layout,
    /// Replicas that must confirm every acquire (`WAIT`), or it fails and takes nothing; 0 does
    /// not wait.
    pub(crate) replicas: u32,
    /// How long an acquire waits for those confirmations.
    pub(crate) replica_timeout: Duration,
    /// With `redis+sentinel://`: the Sentinels to ask for the master (`host` and `port` are then
    /// the first Sentinel's until the master is found).
    pub(crate) sentinel: Option<SentinelUrl>,
    /// With `redis+cluster://h1:p1,h2:p2`: the seed nodes (`host:port`) the cluster's layout is
    /// learnt from (`host` and `port` are the first's). Every key of a lock lives in one slot
    /// (hash tags `{K}`); redirects and failovers are followed by the redis crate.
    pub(crate) cluster: Option<Vec<String>>,
    /// TLS (`rediss://`, `rediss+sentinel://`, `rediss+cluster://`): to the servers and to the
    /// Sentinels.
    pub(crate) tls: bool,
    /// The TLS files (CA, client certificate and key), with `tls`.
    pub(crate) tls_files: crate::tls::TlsFiles,
}

/// The Sentinel part of a `redis+sentinel://s1:26379,s2:26379/MASTER[/db]` URL
/// ([`RedisUrl::sentinel`]).
///
/// Like the [`RedisUrl`] it is part of, it is made by parsing the URL, its keys are its
/// configuration, and it is read through its accessors.
///
/// # Examples
///
/// ```
/// use distlock::redis::RedisUrl;
/// let url = RedisUrl::parse("redis+sentinel://10.0.0.1,10.0.0.2:26380/mymaster/2").unwrap();
/// let sentinel = url.sentinel().unwrap();
/// assert_eq!(sentinel.hosts(), ["10.0.0.1:26379", "10.0.0.2:26380"]);
/// assert_eq!(sentinel.master(), "mymaster");
/// assert_eq!(url.db(), 2);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// `host:port` of each Sentinel (port 26379 when not given).
    pub(crate) hosts: Vec<String>,
    /// The monitored master's name.
    pub(crate) master: String,
    /// The Sentinels' own user (`sentinel_user=`), if they have ACL users.
    username: Option<String>,
    /// The Sentinels' own password (`sentinel_password=`, their `requirepass`); never shown.
    password: Option<String>,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("hosts", &self.hosts)
            .field("master", &self.master)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl SentinelUrl {
    /// `host:port` of each Sentinel (port 26379 when not given), in the order given.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The monitored master's name.
    pub fn master(&self) -> &str {
        &self.master
    }

    /// The Sentinels' own user (`sentinel_user=`), if they have ACL users.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The Sentinels' own password (`sentinel_password=`, their `requirepass`), percent-decoded;
    /// never shown by `Display` or `Debug`.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }
}

impl RedisUrl {
    /// The host name or address (with Sentinel, the first Sentinel's until the master is found;
    /// with a cluster, the first seed node's).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port (default 6379; 26379 for a Sentinel).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The database number (default 0).
    pub fn db(&self) -> i64 {
        self.db
    }

    /// The ACL user name, if any.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The password, if any; never shown by `Display` or `Debug`.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The lock lease (`lease=`, default 30 s); renewed every third of it while held.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The bound on connecting, and on every request (`connect_timeout=`, default 10 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The default layout of [`Client::mutex`](super::Client::mutex) (`layout=`).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The replicas that must confirm every acquire (`replicas=`, `WAIT`), or it fails and takes
    /// nothing; 0 (the default) does not wait.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long an acquire waits for those confirmations (`replica_timeout=`, default 1 s).
    pub fn replica_timeout(&self) -> Duration {
        self.replica_timeout
    }

    /// With `redis+sentinel://`: the Sentinels to ask for the master.
    pub fn sentinel(&self) -> Option<&SentinelUrl> {
        self.sentinel.as_ref()
    }

    /// With `redis+cluster://h1:p1,h2:p2`: the seed nodes (`host:port`) the cluster's layout is
    /// learnt from.
    pub fn cluster(&self) -> Option<&[String]> {
        self.cluster.as_deref()
    }

    /// Whether the connections are TLS (`rediss://`, `rediss+sentinel://`, `rediss+cluster://`),
    /// to the servers and to the Sentinels.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The TLS files (CA, client certificate and key), with [`tls`](Self::tls).
    pub fn tls_files(&self) -> &crate::tls::TlsFiles {
        &self.tls_files
    }

    /// Parses a `redis://` URL; the error names the URL and what is wrong with it.
    pub fn parse(url: &str) -> Result<RedisUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<RedisUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: crate::redact_url(url), reason };
        let tls = url.starts_with("rediss");
        let plain = url.strip_prefix("rediss").map(|r| format!("redis{r}"));
        let plain = plain.as_deref().unwrap_or(url);
        let sentinel = plain.starts_with("redis+sentinel://");
        let cluster = plain.starts_with("redis+cluster://");
        let rest = if let Some(rest) = plain.strip_prefix("redis://") {
            rest
        } else if let Some(rest) = plain.strip_prefix("redis+sentinel://") {
            rest
        } else if let Some(rest) = plain.strip_prefix("redis+cluster://") {
            rest
        } else {
            return Err(bad(
                "must start with redis:// (e.g. redis://127.0.0.1:6379), redis+sentinel:// (e.g. redis+sentinel://127.0.0.1:26379/mymaster) or redis+cluster:// (e.g. redis+cluster://127.0.0.1:7000,127.0.0.1:7001), or rediss… for TLS".into(),
            ));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, db) = match rest.split_once('/') {
            Some((a, d)) => (a, Some(d)),
            None => (rest, None),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some(("", p)) => (None, Some(p.to_string())),
                Some((n, p)) => (Some(n.to_string()), Some(p.to_string())),
                None => (Some(u.to_string()), None),
            },
        };
        if hostport.contains(',') && !sentinel && !cluster {
            return Err(bad(
                "several hosts: for Sentinel write redis+sentinel://h1,h2/MASTER, for a cluster redis+cluster://h1,h2"
                    .into(),
            ));
        }
        let default_port = if sentinel { 26379 } else { 6379 };
        let mut hosts = Vec::new();
        for hp in hostport.split(',') {
            let (host, port) = match hp.rsplit_once(':') {
                Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad(format!("invalid port {p:?}")))?),
                None => (hp, default_port),
            };
            if host.is_empty() || host.contains(|c: char| c.is_whitespace()) {
                return Err(bad(format!("invalid host {host:?}")));
            }
            if port == 0 {
                return Err(bad("port 0 is not a server port".into()));
            }
            hosts.push((host.to_string(), port));
        }
        let (host, port) = hosts[0].clone();
        let (sentinel, db) = if sentinel {
            let (master, db) = match db {
                Some(rest) => match rest.split_once('/') {
                    Some((m, d)) => (m, Some(d)),
                    None => (rest, None),
                },
                None => ("", None),
            };
            if master.is_empty() {
                return Err(bad("no master name: write redis+sentinel://HOST[:PORT][,HOST...]/MASTER".into()));
            }
            let hosts = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
            (Some(SentinelUrl { hosts, master: master.to_string(), username: None, password: None }), db)
        } else {
            (None, db)
        };
        if cluster && db.is_some_and(|d| !d.is_empty() && d != "0") {
            return Err(bad("a cluster has only database 0".into()));
        }
        let cluster = cluster.then(|| hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect());
        let db = match db {
            None | Some("") => 0,
            Some(d) => {
                d.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| bad(format!("invalid database {d:?}")))?
            }
        };
        // setup is taken and means nothing here: connecting makes nothing on Redis.
        let (common, own) = QUERY.parse(query.unwrap_or("")).map_err(bad)?;
        let common = QUERY.merge(common, over).map_err(&bad)?;
        if let (false, Some(k)) = (tls, common.tls_files.first_given()) {
            return Err(bad(format!("{k} is a TLS file: write rediss:// to connect with TLS")));
        }
        let mut parsed = RedisUrl {
            host,
            port,
            db,
            username,
            password,
            lease: common.lease.unwrap_or(DEFAULT_LEASE),
            connect_timeout: common.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            layout: Layout::default(),
            replicas: 0,
            replica_timeout: Duration::from_secs(1),
            sentinel,
            cluster,
            tls,
            tls_files: common.tls_files,
        };
        let lease = humantime::format_duration(parsed.lease);
        if parsed.lease < Duration::from_millis(100) {
            return Err(bad(format!("{}={lease} is too short (at least 100ms)", common.lease_key)));
        }
        if parsed.lease > MAX_LEASE {
            return Err(bad(format!("{}={lease} is too long (at most 30 days)", common.lease_key)));
        }
        if parsed.connect_timeout.is_zero() {
            return Err(bad("connect_timeout must be greater than zero".into()));
        }
        for pair in own {
            parsed.take(pair).map_err(bad)?;
        }
        parsed.tls_files.check().map_err(bad)?;
        let request_bound = (parsed.lease / 6).min(parsed.connect_timeout);
        if parsed.replicas > 0 && parsed.replica_timeout >= request_bound {
            return Err(bad(format!(
                "replica_timeout {} is not under the bound on each request ({}: a sixth of the lease, at most \
                 connect_timeout): shorten it or lengthen the lease",
                humantime::format_duration(parsed.replica_timeout),
                humantime::format_duration(request_bound)
            )));
        }
        Ok(parsed)
    }

    /// Takes one of the URL's own keys (see [`QUERY`]).
    fn take(&mut self, pair: crate::options::Pair<'_>) -> std::result::Result<(), String> {
        let (key, value) = (pair.key, pair.value);
        match pair.name {
            "layout" => self.layout = value.parse().map_err(|e: Error| e.to_string())?,
            "replicas" if self.cluster.is_some() => {
                return Err("replicas: WAIT after acquire is not supported on a cluster yet".into())
            }
            "replicas" => {
                self.replicas = value.parse().map_err(|_| format!("replicas: {value:?} is not a number of replicas"))?
            }
            "sentinel_user" | "sentinel_password" => {
                let Some(sentinel) = self.sentinel.as_mut() else {
                    return Err(format!("{key} is for redis+sentinel:// URLs"));
                };
                let value = crate::options::percent_decode(value).map_err(|e| format!("{key}: {e}"))?;
                if key == "sentinel_user" {
                    sentinel.username = Some(value);
                } else {
                    sentinel.password = Some(value);
                }
            }
            _ => {
                self.replica_timeout = pair.duration()?;
                if self.replica_timeout.is_zero() {
                    return Err("replica_timeout must be greater than zero (WAIT 0 waits forever)".into());
                }
            }
        }
        Ok(())
    }

    /// The connection URL for the redis crate (credentials included), for `host:port`.
    pub(crate) fn connection_string_for(&self, host: &str, port: u16) -> String {
        let auth = match (&self.username, &self.password) {
            (None, None) => String::new(),
            (Some(u), None) => format!("{}@", enc(u)),
            (None, Some(p)) => format!(":{}@", enc(p)),
            (Some(u), Some(p)) => format!("{}:{}@", enc(u), enc(p)),
        };
        format!("{}://{auth}{host}:{port}/{}", self.scheme(), self.db)
    }

    /// The connection URL for the redis crate to a Sentinel at `hp` (`host:port`), with the
    /// Sentinels' own credentials (`sentinel_user`, `sentinel_password`), if given.
    pub(crate) fn sentinel_connection_string(&self, hp: &str) -> String {
        let auth = match self.sentinel.as_ref().map(|s| (&s.username, &s.password)) {
            Some((Some(u), Some(p))) => format!("{}:{}@", enc(u), enc(p)),
            Some((None, Some(p))) => format!(":{}@", enc(p)),
            Some((Some(u), None)) => format!("{}@", enc(u)),
            _ => String::new(),
        };
        format!("{}://{auth}{hp}", self.scheme())
    }

    /// `redis` or, with TLS, `rediss`: the redis crate's scheme for one server.
    pub(crate) fn scheme(&self) -> &'static str {
        if self.tls {
            "rediss"
        } else {
            "redis"
        }
    }
}

/// Percent-encodes what a URL's user info cannot carry as is.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = match (&self.username, &self.password) {
            (Some(u), _) => format!("{u}@"),
            (None, Some(_)) => ":***@".to_string(),
            (None, None) => String::new(),
        };
        let scheme = self.scheme();
        match (&self.sentinel, &self.cluster) {
            (Some(s), _) => write!(f, "{scheme}+sentinel://{user}{}/{}/{}", s.hosts.join(","), s.master, self.db)?,
            (None, Some(nodes)) => write!(f, "{scheme}+cluster://{user}{}", nodes.join(","))?,
            (None, None) => write!(f, "{scheme}://{user}{}:{}/{}", self.host, self.port, self.db)?,
        }
        let mut pairs = Vec::new();
        if let Some(s) = &self.sentinel {
            if let Some(u) = &s.username {
                pairs.push(format!("sentinel_user={u}"));
            }
            if s.password.is_some() {
                pairs.push("sentinel_password=***".to_string());
            }
        }
        pairs.extend(self.tls_files.query_pairs());
        if !pairs.is_empty() {
            write!(f, "?{}", pairs.join("&"))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisUrl")
            .field("url", &self.to_string())
            .field("lease", &self.lease)
            .field("connect_timeout", &self.connect_timeout)
            .field("layout", &self.layout)
            .field("replicas", &self.replicas)
            .finish()
    }
}

/// The keys of a `redis://` URL's query beside the common ones.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "lease",
    keys: &[
        crate::options::Key::new("layout", "redisson|simple"),
        crate::options::Key::new("replicas", ""),
        crate::options::Key::new("replica_timeout", ""),
        crate::options::Key::new("sentinel_user", ""),
        crate::options::Key::new("sentinel_password", ""),
    ],
    tls: crate::options::TlsKeys::Files(&[]),
    connections: crate::options::ConnectionKeys::Refused(
        "a Redis client's locks share one multiplexed connection per server (the key is for PostgreSQL and MariaDB, whose locks live in server sessions)",
    ),
    pairs_need_values: true,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentinels_own_credentials_are_never_shown() {
        let u = RedisUrl::parse("redis+sentinel://:m@s1,s2/mymaster?sentinel_user=watch&sentinel_password=s%40ntinel")
            .unwrap();
        let s = u.sentinel.as_ref().unwrap();
        assert_eq!((s.username.as_deref(), s.password.as_deref()), (Some("watch"), Some("s@ntinel")));
        assert_eq!(u.sentinel_connection_string("s1:26379"), "redis://watch:s%40ntinel@s1:26379");
        let shown = format!("{u} {u:?}");
        assert!(!shown.contains("s@ntinel") && !shown.contains("s%40ntinel"), "{shown}");
        assert!(shown.contains("sentinel_password=***"), "{shown}");
        let e = RedisUrl::parse("redis://h?sentinel_password=x").unwrap_err().to_string();
        assert!(e.contains("redis+sentinel://") && !e.contains("=x"), "{e}");
    }

    #[test]
    fn defaults_and_credentials() {
        let u = RedisUrl::parse("redis://:s3cret@localhost").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.db), ("localhost", 6379, 0));
        assert_eq!(u.password.as_deref(), Some("s3cret"));
        assert_eq!(u.lease, DEFAULT_LEASE);
        assert!(!u.to_string().contains("s3cret"));
        assert!(!format!("{u:?}").contains("s3cret"));
        assert_eq!(u.connection_string_for(&u.host, u.port), "redis://:s3cret@localhost:6379/0");
        let u = RedisUrl::parse("redis://app:p@ss@10.0.0.1:7000/3").unwrap();
        assert_eq!(u.username.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(u.connection_string_for(&u.host, u.port), "redis://app:p%40ss@10.0.0.1:7000/3");
    }

    #[test]
    fn tls_schemes_and_files() {
        let u = RedisUrl::parse("rediss://app:pw@db.example:6380?cacert=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert!(u.tls);
        assert_eq!(u.connection_string_for(&u.host, u.port), "rediss://app:pw@db.example:6380/0");
        assert_eq!(u.to_string(), "rediss://app@db.example:6380/0?cacert=/ca.pem&cert=/c.pem&key=/k.pem");
        let c = RedisUrl::parse("rediss+cluster://a:1,b:2").unwrap();
        assert!(c.tls && c.cluster.is_some());
        let s = RedisUrl::parse("rediss+sentinel://a:1/m").unwrap();
        assert!(s.tls && s.sentinel.is_some());
        assert!(!RedisUrl::parse("redis://a:1").unwrap().tls);
    }

    #[test]
    fn cluster_nodes() {
        let u = RedisUrl::parse("redis+cluster://10.0.0.1:7000,10.0.0.2?lease=5s").unwrap();
        assert_eq!(u.cluster.as_deref(), Some(&["10.0.0.1:7000".to_string(), "10.0.0.2:6379".to_string()][..]));
        assert_eq!(u.to_string(), "redis+cluster://10.0.0.1:7000,10.0.0.2:6379");
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, says) in [
            ("zk://h:1", "redis://"),
            ("redis://h:1?cacert=/ca.pem", "rediss://"),
            ("rediss://h:1?cert=/c.pem", "key"),
            ("redis://h:99999", "port"),
            ("redis://h:1/x", "database"),
            ("redis://a:1,b:2", "Sentinel"),
            ("redis+sentinel://a:1,b:2", "master name"),
            ("redis+cluster://a:1/2", "database 0"),
            ("redis+cluster://a:1?replicas=1", "cluster"),
            ("redis://h:1?lease=5s&replicas=1&replica_timeout=1s", "replica_timeout"),
            ("redis://h:1?lease=1ms", "too short"),
            ("redis://h:1?lease=100000h", "too long"),
            ("redis://h:1?lease=soon", "lease"),
            ("redis://h:1?layout=fair", "fair"),
            ("redis://h:1?x", "key=value"),
            ("redis://u:secret@h:1?nope=1", "nope"),
        ] {
            let e = RedisUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: {e}");
        }
    }
}

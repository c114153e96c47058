//! `nats://` URLs.

use crate::{Error, Result};
use std::time::Duration;

/// Default TTL of a lock key (how long a silent holder keeps its lock at most).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Default bucket (a JetStream KV bucket: the stream `KV_distlock`).
pub const DEFAULT_BUCKET: &str = "distlock";

/// How the client logs in.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Login {
    /// No login.
    None,
    /// A user and password (`nats://USER:PASSWORD@host`).
    User(String, String),
    /// A token (`nats://TOKEN@host`, NATS's own convention).
    Token(String),
    /// An NKey: the file holding the user's seed (`?nkey=PATH`), read when connecting.
    Nkey(std::path::PathBuf),
    /// A credentials file, a user JWT and its seed (`?creds=PATH`), read when connecting.
    Creds(std::path::PathBuf),
}

/// A parsed `nats://[USER:PASSWORD@|TOKEN@]host:port[,host:port…][/BUCKET][?ttl=30s&timeout=5s&replicas=1&nkey=PATH|creds=PATH]`;
/// `natss://` for TLS (the servers' certificates verified).
///
/// The bucket is a JetStream key-value bucket (default `distlock`); distlock creates it if
/// missing, with the settings its locks need (see the module's notes), and refuses one made
/// otherwise.
///
/// Query keys:
/// - `ttl` (or `lease`): each lock key's time to live on the server, whole seconds from 2 s to a
///   day (NATS counts per-message TTLs in seconds); the holder renews it every third of it;
/// - `timeout`: how long one request may take before it counts as failed (default 5 s);
/// - `connect_timeout`: how long connecting may take (default 5 s);
/// - `replicas`: the bucket's replicas when distlock creates it (1 to 5, default 1; use 3 on a
///   3-node cluster);
/// - `cacert`, `cert`, `key` (`natss://` only): the CA that verifies the servers (default: the
///   system's roots), and a client certificate and key (for servers that require one);
/// - `nkey`: an NKey login, the path of a file holding the user's seed (`SU…`, as `nk -gen user`
///   writes it); `creds`: a credentials file's path (a user JWT and its seed, as `nsc` writes
///   it). The files are read when connecting; the secrets never go in the URL, and neither goes
///   with a user, password or token.
///
/// # Examples
///
/// ```
/// use distlock::nats::NatsUrl;
/// let url = NatsUrl::parse("nats://app:secret@127.0.0.1:4222,127.0.0.1:4223/locks?ttl=10s").unwrap();
/// assert_eq!(url.servers(), ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]);
/// assert_eq!(url.bucket(), "locks");
/// assert_eq!(url.ttl(), std::time::Duration::from_secs(10));
/// assert!(!format!("{url} {url:?}").contains("secret"));
/// assert!(NatsUrl::parse("nats://127.0.0.1:4222?ttl=1500ms").is_err());
/// ```
#[derive(Clone)]
pub struct NatsUrl {
    pub(crate) servers: Vec<String>,
    pub(crate) login: Login,
    pub(crate) tls: bool,
    pub(crate) tls_files: crate::tls::TlsFiles,
    pub(crate) bucket: String,
    pub(crate) ttl: Duration,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) replicas: usize,
}

impl std::fmt::Display for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&str> =
            self.servers.iter().map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h)).collect();
        let login = match &self.login {
            Login::None => String::new(),
            Login::User(u, _) => format!("{u}:***@"),
            Login::Token(_) => "***@".into(),
            Login::Nkey(_) | Login::Creds(_) => String::new(),
        };
        write!(f, "{}://{login}{}/{}", if self.tls { "natss" } else { "nats" }, hosts.join(","), self.bucket)?;
        let mut files = self.tls_files.query_pairs();
        match &self.login {
            Login::Nkey(p) => files.push(format!("nkey={}", p.display())),
            Login::Creds(p) => files.push(format!("creds={}", p.display())),
            _ => {}
        }
        if !files.is_empty() {
            write!(f, "?{}", files.join("&"))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsUrl")
            .field("url", &self.to_string())
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl NatsUrl {
    /// The servers, as `nats://host:port` (`tls://` with TLS), in the order given.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// The user, if the URL names one (a token is not shown).
    pub fn user(&self) -> Option<&str> {
        match &self.login {
            Login::User(u, _) => Some(u),
            _ => None,
        }
    }

    /// Whether the connections are TLS (`natss://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The TLS files (CA, client certificate and key), with [`tls`](Self::tls).
    pub fn tls_files(&self) -> &crate::tls::TlsFiles {
        &self.tls_files
    }

    /// The KV bucket (the URL's path, default `distlock`).
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Each lock key's TTL (`ttl=` or `lease=`, default 30 s).
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

    /// The bucket's replicas when distlock creates it (`replicas=`, default 1).
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Parses a `nats://` URL.
    pub fn parse(url: &str) -> Result<NatsUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<NatsUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: crate::redact_url(url), reason };
        let (tls, rest) = match (url.strip_prefix("nats://"), url.strip_prefix("natss://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => return Err(bad("a NATS URL starts with nats:// (natss:// for TLS)".into())),
        };
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (login, hosts) = match hosts.rsplit_once('@') {
            Some((userinfo, hosts)) => match userinfo.split_once(':') {
                Some(("", _)) => return Err(bad("an empty NATS user name".into())),
                Some((name, password)) => (Login::User(name.to_string(), password.to_string()), hosts),
                None if userinfo.is_empty() => return Err(bad("an empty NATS token before '@'".into())),
                None => (Login::Token(userinfo.to_string()), hosts),
            },
            None => (Login::None, hosts),
        };
        let (hosts, bucket) = match hosts.split_once('/') {
            Some((h, b)) => (h, b.trim_end_matches('/')),
            None => (hosts, ""),
        };
        let bucket = if bucket.is_empty() { DEFAULT_BUCKET } else { bucket };
        if !bucket.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') || bucket.len() > 64 {
            return Err(bad(format!(
                "bucket {bucket:?}: a KV bucket name is at most 64 letters, digits, '-' and '_' (the URL's path)"
            )));
        }
        let mut servers = Vec::new();
        for host in hosts.split(',') {
            let (h, port) =
                host.rsplit_once(':').ok_or_else(|| bad(format!("{host:?} has no port: write host:4222")))?;
            if h.is_empty() {
                return Err(bad(format!("{host:?} has no host name")));
            }
            port.parse::<u16>().map_err(|_| bad(format!("{port:?} in {host:?} is not a port number")))?;
            servers.push(format!("{}://{host}", if tls { "tls" } else { "nats" }));
        }
        // setup is taken and means nothing here: the bucket is made when missing, whatever it says.
        let (common, own) = QUERY.parse(query).map_err(bad)?;
        let common = QUERY.merge(common, over).map_err(&bad)?;
        if let (false, Some(k)) = (tls, common.tls_files.first_given()) {
            return Err(bad(format!("{k} is a TLS file: write natss:// to connect with TLS")));
        }
        let mut out = NatsUrl {
            servers,
            login,
            tls,
            tls_files: common.tls_files,
            bucket: bucket.to_string(),
            ttl: common.lease.unwrap_or(DEFAULT_TTL),
            timeout: Duration::from_secs(5),
            connect_timeout: common.connect_timeout.unwrap_or(Duration::from_secs(5)),
            replicas: 1,
        };
        for pair in own {
            match pair.name {
                "timeout" => out.timeout = pair.duration().map_err(bad)?,
                "nkey" | "creds" => {
                    if out.login != Login::None {
                        return Err(bad(format!(
                            "{}= with another login: give one of a user and password, a token, nkey= or creds=",
                            pair.name
                        )));
                    }
                    if pair.value.is_empty() {
                        return Err(bad(format!("{}= needs a file's path", pair.name)));
                    }
                    if crate::redact::looks_like_seed(pair.value) {
                        // Never shown back: `redact_url` hides a seed under any key.
                        return Err(Error::InvalidUrl {
                            url: crate::redact_url(url),
                            reason: format!(
                                "{}= takes the path of a file holding the seed, not the seed itself",
                                pair.name
                            ),
                        });
                    }
                    let path = std::path::PathBuf::from(pair.value);
                    out.login = if pair.name == "nkey" { Login::Nkey(path) } else { Login::Creds(path) };
                }
                _ => {
                    out.replicas = pair
                        .value
                        .parse::<usize>()
                        .ok()
                        .filter(|r| (1..=5).contains(r))
                        .ok_or_else(|| bad(format!("replicas={} must be 1 to 5", pair.value)))?
                }
            }
        }
        out.tls_files.check().map_err(bad)?;
        if out.ttl.subsec_nanos() != 0 || !(2..=86_400).contains(&out.ttl.as_secs()) {
            return Err(bad(format!(
                "ttl={} must be whole seconds from 2s to 1 day (NATS counts a key's TTL in seconds)",
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

/// The user seed in the NKey file `path` (`?nkey=`), checked. An error names the file and what is
/// wrong with it, never what it holds.
pub(crate) fn read_seed(path: &std::path::Path) -> std::result::Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("the NKey seed file {}: {e}", path.display()))?;
    let seed = text.trim().to_string();
    let user = seed.starts_with("SU") && nkeys::KeyPair::from_seed(&seed).is_ok();
    if !user {
        return Err(format!(
            "the NKey seed file {} holds no user seed (one line starting with SU, as `nk -gen user` writes it)",
            path.display()
        ));
    }
    Ok(seed)
}

/// `options` with the credentials file `path` (`?creds=`): a user JWT and its seed. An error names
/// the file and what is wrong with it, never what it holds.
pub(crate) async fn with_creds(
    options: async_nats::ConnectOptions,
    path: &std::path::Path,
) -> std::result::Result<async_nats::ConnectOptions, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("the credentials file {}: {e}", path.display()))?;
    options.credentials(&text).map_err(|_| {
        format!(
            "the credentials file {} holds no user JWT and seed (the decorated blocks `nsc` writes)",
            path.display()
        )
    })
}

/// The keys of a `nats://` URL's query beside the common ones.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "ttl",
    keys: &[
        crate::options::Key::new("timeout", ""),
        crate::options::Key::new("replicas", ""),
        crate::options::Key::new("nkey", "path"),
        crate::options::Key::new("creds", "path"),
    ],
    tls: crate::options::TlsKeys::Files(&[]),
    connections: crate::options::ConnectionKeys::Refused(
        "a NATS client's locks share one connection (the key is for PostgreSQL and MariaDB, whose locks live in server sessions)",
    ),
    pairs_need_values: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_their_errors() {
        let u = NatsUrl::parse("nats://localhost:4222/?lease=2s&timeout=1s&replicas=3").unwrap();
        assert_eq!(u.servers, ["nats://localhost:4222"]);
        assert_eq!((u.ttl, u.timeout, u.replicas), (Duration::from_secs(2), Duration::from_secs(1), 3));
        assert_eq!(u.to_string(), "nats://localhost:4222/distlock");
        let t = NatsUrl::parse("natss://s3cret@h:4222/b").unwrap();
        assert!(t.login == Login::Token("s3cret".into()) && t.tls);
        assert_eq!(t.to_string(), "natss://***@h:4222/b");
        let n = NatsUrl::parse("nats://h:4222?nkey=/run/app.nk").unwrap();
        assert!(n.login == Login::Nkey("/run/app.nk".into()));
        assert_eq!(n.to_string(), "nats://h:4222/distlock?nkey=/run/app.nk");
        assert_eq!(NatsUrl::parse(&n.to_string()).unwrap().to_string(), n.to_string(), "shown, parsed back");
        let seed = "SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU";
        let e = NatsUrl::parse(&format!("nats://h:4222?nkey={seed}")).map(drop).unwrap_err();
        assert!(!format!("{e} {e:?}").contains(seed), "{e:?}");
        crate::assert_refused(
            NatsUrl::parse,
            &[
                ("nats://", "no port"),
                ("nats://h", "no port"),
                ("nats://h:x", "not a port"),
                ("nats://:4222", "no host"),
                ("nats://h:4222/a.b", "bucket"),
                ("nats://h:4222?ttl=1s", "ttl=1s"),
                ("nats://h:4222?ttl=2500ms", "whole seconds"),
                ("nats://h:4222?replicas=7", "1 to 5"),
                ("nats://h:4222?nope=1", "nope"),
                ("nats://h:4222?timeout=1ms", "too short"),
                ("nats://h:4222?cacert=/x", "natss://"),
                ("nats://:pw@h:4222", "empty NATS user"),
                ("nats://u:p@h:4222?nkey=/k", "one of"),
                ("nats://h:4222?nkey=/k&creds=/c", "one of"),
                ("nats://h:4222?creds=", "a file's path"),
                (
                    "nats://h:4222?nkey=SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU",
                    "not the seed itself",
                ),
                ("http://h:4222", "nats://"),
            ],
        );
    }
}

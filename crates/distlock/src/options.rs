//! The options every backend honours, given once for any URL: how long connecting may take, and
//! the lease (how long the server keeps a silent holder's lock: ZooKeeper's session timeout,
//! etcd's lease TTL, the lease of Redis keys and of the SQL backends).
//!
//! Every backend reads its URL's query with [`QuerySpec::parse`]: the keys every backend takes
//! (`lease` and its aliases `session_timeout` and `ttl`, `connect_timeout`, `setup`, the TLS
//! files) into one typed [`Common`], and the backend's own keys checked against its one table (a
//! `QUERY` constant in each backend's `url.rs`), so that an unknown key reads the same on every
//! scheme and the list of known keys is never written twice. [`ConnectOptions`] gives a
//! [`Common`] whose values take the place of the URL's ([`Common::overridden`]) before the
//! backend's own checks (etcd's whole seconds, SQLite's one-second minimum) judge them as they
//! judge a URL's: one piece of code for every scheme.

use crate::{Error, Result};
use std::time::Duration;

/// The keys that mean the lease, in any backend's URL.
pub(crate) const LEASE_KEYS: &[&str] = &["lease", "session_timeout", "ttl"];

/// The `setup` URL key every backend takes: `setup=auto` (the default: connecting makes what
/// distlock keeps beside its locks where it is missing: a SQLite database file and its tables,
/// the fencing sequence of PostgreSQL and MariaDB) or `setup=no` (connecting makes nothing, and
/// what is missing is an error naming it). ZooKeeper, Redis and etcd make nothing when connecting
/// either way. Whether connecting may make things, or the reason `value` is refused.
pub(crate) fn parse_setup(value: &str) -> std::result::Result<bool, String> {
    match value {
        "auto" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!(
            "setup={value}: use setup=auto (the default: connecting makes what is missing) or setup=no (it makes nothing)"
        )),
    }
}

/// A URL key as every backend's parser matches it: the lease's aliases (`session_timeout`, as
/// ZooKeeper names it, and `ttl`, as etcd does) are `lease` on every scheme.
pub(crate) fn canonical_key(key: &str) -> &str {
    if LEASE_KEYS.contains(&key) {
        "lease"
    } else {
        key
    }
}

/// How many server connections a client's locks share at most when the URL does not say
/// (`connections=`), on the backends whose locks live in server sessions (PostgreSQL, MariaDB).
pub(crate) const DEFAULT_CONNECTIONS: usize = 4;

/// The most connections a URL or [`ConnectOptions::connections`] may ask for.
pub(crate) const MAX_CONNECTIONS: usize = 1000;

/// The `connections` URL key: how many server connections a client's locks share at most, or
/// the reason `value` is refused.
pub(crate) fn parse_connections(value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=MAX_CONNECTIONS).contains(&n) => Ok(n),
        _ => Err(format!(
            "connections={value}: how many server connections the locks share at most, 1 to {MAX_CONNECTIONS} \
             (default {DEFAULT_CONNECTIONS})"
        )),
    }
}

/// How every backend's "unknown key" error begins (the key follows, quoted).
const UNKNOWN_KEY: &str = "unknown URL key ";

/// A backend's own URL key (beside the [`Common`] ones), as its [`QuerySpec`] lists it.
#[derive(Debug)]
pub(crate) struct Key {
    /// The key's name.
    pub(crate) name: &'static str,
    /// Other names the backend takes for it (`ssl_mode` for `ssl-mode`).
    pub(crate) aliases: &'static [&'static str],
    /// What it takes, shown in the list of known keys (`sequence|row`); empty for nothing.
    pub(crate) hint: &'static str,
}

impl Key {
    /// A key without aliases.
    pub(crate) const fn new(name: &'static str, hint: &'static str) -> Key {
        Key { name, aliases: &[], hint }
    }
}

/// How a backend's URL takes the TLS files (`cacert`, `cert`, `key`).
#[derive(Debug)]
pub(crate) enum TlsKeys {
    /// Taken, also under these `(alias, name)` pairs (libpq's `sslrootcert` for `cacert`…).
    Files(&'static [(&'static str, &'static str)]),
    /// Refused, for this reason (a local file, an in-process store).
    Refused(&'static str),
}

/// How a backend's URL takes `connections`.
#[derive(Debug)]
pub(crate) enum ConnectionKeys {
    /// Taken: the locks live in server sessions, and the client keeps at most this many.
    Shared,
    /// Refused, for this reason (the locks share one session already, or there is no server).
    Refused(&'static str),
}

/// What a backend's URL query takes: the [`Common`] keys, read here for every backend, and the
/// backend's own keys, one table ([`QuerySpec::keys`]) from which the list of known keys of its
/// "unknown URL key" error is made.
#[derive(Debug)]
pub(crate) struct QuerySpec {
    /// The name the backend gives the lease first (`ttl` on etcd, `lease` elsewhere).
    pub(crate) lease_name: &'static str,
    /// The backend's own keys.
    pub(crate) keys: &'static [Key],
    /// Its TLS keys.
    pub(crate) tls: TlsKeys,
    /// Whether it takes `connections`.
    pub(crate) connections: ConnectionKeys,
    /// Whether a pair without `=` is refused (else it is the key with an empty value).
    pub(crate) pairs_need_values: bool,
}

/// The keys every backend's URL takes, parsed (`None`: not in the URL, the backend's default).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Common {
    /// `lease` (or `session_timeout`, `ttl`).
    pub(crate) lease: Option<Duration>,
    /// The name the lease was given under, for messages (`lease` when not given).
    pub(crate) lease_key: &'static str,
    /// `connect_timeout`.
    pub(crate) connect_timeout: Option<Duration>,
    /// `setup` (`Some(false)`: `setup=no`).
    pub(crate) setup: Option<bool>,
    /// `connections` (checked: 1 to 1000).
    pub(crate) connections: Option<usize>,
    /// The TLS files, under their names or the backend's aliases.
    pub(crate) tls_files: crate::tls::TlsFiles,
}

/// One of a backend's own keys in a URL's query, checked against its table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pair<'a> {
    /// The key's name in the table (an alias given is read as it).
    pub(crate) name: &'static str,
    /// The key as the URL writes it.
    pub(crate) key: &'a str,
    /// Its value.
    pub(crate) value: &'a str,
}

impl Pair<'_> {
    /// The value as a duration; the reason names the key when it is not one.
    pub(crate) fn duration(&self) -> std::result::Result<Duration, String> {
        crate::duration::url_duration(self.key, self.value).map_err(|e| e.to_string())
    }
}

impl Common {
    /// These values (a URL's) with what `over` gives in their place.
    pub(crate) fn overridden(mut self, over: &Common) -> Common {
        if over.lease.is_some() {
            (self.lease, self.lease_key) = (over.lease, "lease");
        }
        self.connect_timeout = over.connect_timeout.or(self.connect_timeout);
        self.setup = over.setup.or(self.setup);
        self.connections = over.connections.or(self.connections);
        let files = &over.tls_files;
        for (mine, theirs) in [
            (&mut self.tls_files.cacert, &files.cacert),
            (&mut self.tls_files.cert, &files.cert),
            (&mut self.tls_files.key, &files.key),
        ] {
            if theirs.is_some() {
                mine.clone_from(theirs);
            }
        }
        self
    }
}

impl QuerySpec {
    /// A URL's common values `url` with what the options give in their place ([`Common::overridden`]),
    /// and refused as the URL's own would be where this backend refuses them (a TLS file where
    /// there is no TLS, `connections` where the locks share one session).
    ///
    /// # Errors
    ///
    /// The reason, naming the key.
    pub(crate) fn merge(&self, url: Common, over: &Common) -> std::result::Result<Common, String> {
        let common = url.overridden(over);
        if let (TlsKeys::Refused(reason), Some(k)) = (&self.tls, common.tls_files.first_given()) {
            return Err(format!("{k}: {reason}"));
        }
        if let (ConnectionKeys::Refused(reason), Some(_)) = (&self.connections, common.connections) {
            return Err(format!("connections: {reason}"));
        }
        Ok(common)
    }

    /// The keys this backend's URL takes, in words (`lease (or session_timeout, ttl), …`).
    pub(crate) fn known(&self) -> String {
        let others: Vec<&str> = LEASE_KEYS.iter().copied().filter(|k| *k != self.lease_name).collect();
        let mut known = vec![format!("{} (or {})", self.lease_name, others.join(", ")), "connect_timeout".into()];
        known.push("setup".into());
        if let ConnectionKeys::Shared = self.connections {
            known.push(format!("connections (1-{MAX_CONNECTIONS})"));
        }
        for key in self.keys {
            let mut text = key.name.to_string();
            if !key.aliases.is_empty() {
                text += &format!(" (or {})", key.aliases.join(", "));
            }
            if !key.hint.is_empty() {
                text += &format!(" ({})", key.hint);
            }
            known.push(text);
        }
        if let TlsKeys::Files(aliases) = self.tls {
            for name in ["cacert", "cert", "key"] {
                match aliases.iter().find(|(_, n)| *n == name) {
                    Some((alias, _)) => known.push(format!("{alias} (or {name})")),
                    None => known.push(name.into()),
                }
            }
        }
        known.join(", ")
    }

    /// Parses `query` (what follows a URL's `?`): the common keys into [`Common`], the backend's
    /// own into [`Pair`]s in the URL's order (a key given twice: the last is kept for the common
    /// ones; the backend sees both of its own).
    ///
    /// # Errors
    ///
    /// The reason, naming the key: an unknown key (one wording on every backend), a duration
    /// that is not one, a `setup` value, a TLS file given twice or refused.
    pub(crate) fn parse<'a>(&self, query: &'a str) -> std::result::Result<(Common, Vec<Pair<'a>>), String> {
        let mut common = Common { lease_key: "lease", ..Common::default() };
        let mut own = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = match pair.split_once('=') {
                Some(kv) => kv,
                None if self.pairs_need_values => return Err(format!("query {pair:?} is not key=value")),
                None => (pair, ""),
            };
            match self.tls {
                TlsKeys::Files(aliases) if common.tls_files.take(k, v, aliases)? => continue,
                TlsKeys::Refused(reason) if ["cacert", "cert", "key"].contains(&k) => {
                    return Err(format!("{k}: {reason}"))
                }
                _ => {}
            }
            match canonical_key(k) {
                "lease" => {
                    common.lease = Some(crate::duration::url_duration(k, v).map_err(|e| e.to_string())?);
                    common.lease_key = LEASE_KEYS.iter().find(|l| **l == k).copied().unwrap_or("lease");
                }
                "connect_timeout" => {
                    common.connect_timeout = Some(crate::duration::url_duration(k, v).map_err(|e| e.to_string())?)
                }
                "setup" => common.setup = Some(parse_setup(v)?),
                "connections" => match self.connections {
                    ConnectionKeys::Shared => common.connections = Some(parse_connections(v)?),
                    ConnectionKeys::Refused(reason) => return Err(format!("connections: {reason}")),
                },
                _ => match self.keys.iter().find(|key| key.name == k || key.aliases.contains(&k)) {
                    Some(key) => own.push(Pair { name: key.name, key: k, value: v }),
                    None => return Err(format!("{UNKNOWN_KEY}{k:?} (known: {})", self.known())),
                },
            }
        }
        Ok((common, own))
    }
}

/// Options for [`connect_with`](crate::connect_with), honoured by every backend: each value takes
/// the place of the URL's (under any of its names) and is judged by the backend's own checks as a
/// URL's would be; a value a backend cannot take is refused with its reason, never ignored. The
/// options are values handed to the backend's parser, never written into the URL's text.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> distlock::Result<()> {
/// use distlock::ConnectOptions;
/// use std::time::Duration;
/// let options = ConnectOptions::new().lease(Duration::from_secs(20)).connect_timeout(Duration::from_secs(2));
/// // The lease is 20 s, not the URL's 10 s.
/// let client = distlock::connect_with("zk://127.0.0.1:2181?session_timeout=10s", &options).await?;
/// # let _ = client; Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectOptions {
    connect_timeout: Option<Duration>,
    lease: Option<Duration>,
    tls: crate::tls::TlsFiles,
    /// `Some(false)`: `setup=no`.
    setup: Option<bool>,
    connections: Option<usize>,
}

impl ConnectOptions {
    /// No options: the URL's values, or each backend's defaults.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// Give up connecting after this long (a refused connection is reported at once).
    pub fn connect_timeout(mut self, timeout: Duration) -> ConnectOptions {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long the server keeps the lock of a holder it no longer hears from.
    pub fn lease(mut self, lease: Duration) -> ConnectOptions {
        self.lease = Some(lease);
        self
    }

    /// Verify the server's TLS certificate against the CA certificates in this PEM file (not
    /// the system's roots). The URL must ask for TLS in its backend's way (`rediss://`,
    /// `sslmode=`, `https://` endpoints…); see [`crate::tls`].
    pub fn cacert(mut self, path: impl Into<std::path::PathBuf>) -> ConnectOptions {
        self.tls.cacert = Some(path.into());
        self
    }

    /// Present this client certificate (PEM) to a server that asks for one; needs [`key`](Self::key).
    pub fn cert(mut self, path: impl Into<std::path::PathBuf>) -> ConnectOptions {
        self.tls.cert = Some(path.into());
        self
    }

    /// The client certificate's private key (PEM).
    pub fn key(mut self, path: impl Into<std::path::PathBuf>) -> ConnectOptions {
        self.tls.key = Some(path.into());
        self
    }

    /// Whether connecting may make what distlock keeps beside its locks where it is missing (a
    /// SQLite database file and its lease table, the fencing sequence of PostgreSQL and MariaDB;
    /// the election's and jobs' tables are made when first used either way): yes
    /// by default; `false` (the URL's `setup=no`) makes nothing and reports what is missing, for
    /// a client that only looks (a mistyped SQLite path is then an error, not a new empty
    /// database).
    pub fn setup(mut self, setup: bool) -> ConnectOptions {
        self.setup = Some(setup);
        self
    }

    /// At most this many server connections for the client's locks (held, waited for or
    /// inspected), whatever their number: the URL's `connections` (default 4, 1 to 1000). Taken by the backends whose locks live in server
    /// sessions (PostgreSQL, MariaDB); refused by the others, whose locks share one session or
    /// connection already.
    pub fn connections(mut self, connections: usize) -> ConnectOptions {
        self.connections = Some(connections);
        self
    }

    /// The options set, in words (`lease 500ms`, `cacert ca.pem`).
    fn given(&self) -> Vec<String> {
        let mut given = Vec::new();
        if let Some(d) = self.lease {
            given.push(format!("lease {d:?}"));
        }
        if let Some(d) = self.connect_timeout {
            given.push(format!("connect timeout {d:?}"));
        }
        for (name, path) in [("cacert", &self.tls.cacert), ("cert", &self.tls.cert), ("key", &self.tls.key)] {
            if let Some(path) = path {
                given.push(format!("{name} {}", path.display()));
            }
        }
        if self.setup == Some(false) {
            given.push("setup no".into());
        }
        if let Some(n) = self.connections {
            given.push(format!("connections {n}"));
        }
        given
    }

    /// The options as the values that take the place of a URL's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero duration, or a certificate without its key.
    pub(crate) fn common(&self) -> Result<Common> {
        for (name, d) in [("lease", self.lease), ("connect timeout", self.connect_timeout)] {
            if d.is_some_and(|d| d.is_zero()) {
                return Err(Error::InvalidArgument { what: name, reason: "must be greater than zero".into() });
            }
        }
        self.tls.check().map_err(|reason| Error::InvalidArgument { what: "TLS files", reason })?;
        if let Some(n) = self.connections {
            parse_connections(&n.to_string()).map_err(|reason| Error::InvalidArgument { what: "connections", reason })?;
        }
        Ok(Common {
            lease: self.lease,
            lease_key: "lease",
            connect_timeout: self.connect_timeout,
            setup: self.setup,
            connections: self.connections,
            tls_files: self.tls.clone(),
        })
    }

    /// Error `e` of connecting to `url` with these options, told which options when it is about
    /// one of them (rather than about the rest of the user's URL).
    pub(crate) fn explain(&self, url: &str, e: Error) -> Error {
        match e {
            Error::InvalidUrl { reason, .. } if is_about_options(&reason, self) => Error::InvalidUrl {
                url: crate::redact_url(url),
                reason: format!("{reason} (set by the options, not the URL: {})", self.given().join(", ")),
            },
            e => e,
        }
    }
}

/// Whether a URL error's `reason` is about a key that `options` set (rather than about the rest
/// of the user's URL).
fn is_about_options(reason: &str, options: &ConnectOptions) -> bool {
    // The options only write keys every backend knows: an unknown key is the URL's (its list
    // of known keys names them all).
    if reason.starts_with(UNKNOWN_KEY) {
        return false;
    }
    let keys: &[(&[&str], bool)] = &[
        (LEASE_KEYS, options.lease.is_some()),
        (&["connect_timeout"], options.connect_timeout.is_some()),
        (&["cacert", "cert", "key"], options.tls != crate::tls::TlsFiles::default()),
        (&["setup"], options.setup.is_some()),
        (&["connections"], options.connections.is_some()),
    ];
    keys.iter().any(|(names, set)| *set && names.iter().any(|k| reason.contains(k)))
}

/// `%XX` escapes decoded (a user or password may hold `@`, `:`, `/`…).
pub(crate) fn percent_decode(text: &str) -> std::result::Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or("a '%' not followed by two hex digits (write %25 for '%')")?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent escapes that are not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_read_once_against_the_backends_table() {
        const SPEC: QuerySpec = QuerySpec {
            lease_name: "ttl",
            keys: &[Key { name: "mode", aliases: &["mode_"], hint: "a|b" }],
            tls: TlsKeys::Files(&[("ca", "cacert")]),
            connections: ConnectionKeys::Shared,
            pairs_need_values: false,
        };
        assert_eq!(
            SPEC.known(),
            "ttl (or lease, session_timeout), connect_timeout, setup, connections (1-1000), mode (or mode_) (a|b), ca (or cacert), cert, key"
        );
        let (common, own) = SPEC.parse("session_timeout=3s&mode_=a&ca=/ca.pem&setup=no&connect_timeout=1s").unwrap();
        assert_eq!((common.lease, common.lease_key), (Some(Duration::from_secs(3)), "session_timeout"));
        assert_eq!((common.connect_timeout, common.setup), (Some(Duration::from_secs(1)), Some(false)));
        assert_eq!(common.tls_files.cacert.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!((own.len(), own[0].name, own[0].key, own[0].value), (1, "mode", "mode_", "a"));
        let e = SPEC.parse("timeout=1s").unwrap_err();
        assert!(e.starts_with("unknown URL key \"timeout\" (known: ttl (or lease"), "{e}");
        assert!(SPEC.parse("ttl=10").unwrap_err().contains("\"ttl=10\""));
        let refused = QuerySpec { tls: TlsKeys::Refused("no TLS here"), pairs_need_values: true, ..SPEC };
        assert_eq!(refused.parse("cacert=/ca.pem").unwrap_err(), "cacert: no TLS here");
        assert!(refused.parse("lease").unwrap_err().contains("key=value"));
    }

    #[test]
    fn options_replace_the_keys_and_their_aliases() {
        const SPEC: QuerySpec =
            QuerySpec { lease_name: "ttl", keys: &[], tls: TlsKeys::Files(&[]), connections: ConnectionKeys::Shared, pairs_need_values: true };
        let o = ConnectOptions::new().lease(Duration::from_secs(3));
        let (url, _) = SPEC.parse("ttl=30s&connect_timeout=1s").unwrap();
        let merged = url.overridden(&o.common().unwrap());
        assert_eq!((merged.lease, merged.lease_key), (Some(Duration::from_secs(3)), "lease"));
        assert_eq!(merged.connect_timeout, Some(Duration::from_secs(1)), "what the options leave alone stays the URL's");
        let (url, _) = SPEC.parse("ttl=2s").unwrap();
        assert_eq!(url.clone().overridden(&ConnectOptions::new().common().unwrap()), url, "no options change nothing");
        let tls = ConnectOptions::new().lease(Duration::from_secs(3)).cert("/c.pem").key("/k.pem");
        assert!(!is_about_options(r#"unknown URL key "x" (known: lease (or session_timeout, ttl), key)"#, &tls));
        assert!(is_about_options("lease=3s must be whole seconds", &tls));
        let zero = ConnectOptions::new().connect_timeout(Duration::ZERO).common().unwrap_err();
        assert!(zero.to_string().contains("connect timeout"), "{zero}");
    }
}

//! `sqlite://` URLs.

use crate::{Error, Result};
use std::path::PathBuf;
use std::time::Duration;

/// Default lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A parsed `sqlite://PATH[?lease=30s&table=distlock_leases&busy_timeout=5s]`: `sqlite:///abs/locks.db`
/// is an absolute path, `sqlite://locks.db` (or `sqlite:locks.db`) a relative one.
///
/// Query keys:
/// - `lease`: how long a holder that stopped extending keeps a lock (default 30 s, from 1 s to
///   a day; the watchdog extends it every third);
/// - `table`: the lease table (default `distlock_leases`; `shedlock` shares ShedLock's table if it
///   has the `fencing_token` column);
/// - `busy_timeout`: how long a statement waits for SQLite's file lock (default 5 s);
/// - `connect_timeout`: how long opening the database (and making the table) may take (default
///   5 s).
///
/// The URL's keys are its configuration: a `SqliteUrl` is made by [`parse`](Self::parse) only, and
/// read through its accessors ([`path`](Self::path), [`lease`](Self::lease), …). Other settings
/// are another URL (change its keys), or [`ConnectOptions`](crate::ConnectOptions) given to
/// [`connect_with`](crate::connect_with).
///
/// # Examples
///
/// ```
/// use distlock::sqlite::SqliteUrl;
/// let url = SqliteUrl::parse("sqlite:///tmp/locks.db?lease=5s").unwrap();
/// assert_eq!(url.path().to_str(), Some("/tmp/locks.db"));
/// assert_eq!(url.lease(), std::time::Duration::from_secs(5));
/// assert_eq!(url.table(), "distlock_leases");
/// assert!(SqliteUrl::parse("sqlite:///tmp/locks.db?table=x;drop").is_err());
/// ```
#[derive(Debug, Clone)]
pub struct SqliteUrl {
    /// The database file.
    pub(crate) path: PathBuf,
    /// See the query keys above.
    pub(crate) lease: Duration,
    /// The lease table.
    pub(crate) table: String,
    /// SQLite's busy timeout.
    pub(crate) busy_timeout: Duration,
    /// The bound on opening the database.
    pub(crate) connect_timeout: Duration,
    /// Whether opening may make the database file and its tables where missing (`setup=auto`,
    /// the default) or not (`setup=no`: a missing one is an error).
    pub(crate) setup: bool,
}

impl std::fmt::Display for SqliteUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sqlite://{}", self.path.display())
    }
}

impl SqliteUrl {
    /// The database file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// How long a holder that stopped extending keeps a lock (`lease=`, default 30 s).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The lease table (`table=`, default `distlock_leases`).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// How long a statement waits for SQLite's file lock (`busy_timeout=`, default 5 s).
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// The bound on opening the database (`connect_timeout=`, default 5 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Whether opening may make the database file and its tables where missing (`setup=auto`,
    /// the default) or not (`setup=no`: a missing one is an error).
    pub fn setup(&self) -> bool {
        self.setup
    }

    /// Parses a `sqlite://` (or `sqlite:`) URL.
    pub fn parse(url: &str) -> Result<SqliteUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<SqliteUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: url.to_string(), reason };
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| bad("a SQLite URL starts with sqlite://".into()))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() || path == ":memory:" {
            return Err(bad(
                "give the database file: sqlite:///path/locks.db (a lock shared in memory is shared with nobody)"
                    .into(),
            ));
        }
        let (common, own) = QUERY.parse(query).map_err(&bad)?;
        let common = QUERY.merge(common, over).map_err(&bad)?;
        let mut out = SqliteUrl {
            path: PathBuf::from(path),
            lease: common.lease.unwrap_or(DEFAULT_LEASE),
            table: "distlock_leases".into(),
            busy_timeout: Duration::from_secs(5),
            connect_timeout: common.connect_timeout.unwrap_or(Duration::from_secs(5)),
            setup: common.setup.unwrap_or(true),
        };
        for pair in own {
            match pair.name {
                "table" => out.table = pair.value.to_string(),
                _ => out.busy_timeout = pair.duration().map_err(&bad)?,
            }
        }
        if out.connect_timeout.is_zero() {
            return Err(bad("connect_timeout must be more than 0".into()));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&out.lease) {
            return Err(bad(format!("lease={} must be from 1s to 1 day", humantime::format_duration(out.lease))));
        }
        let t = &out.table;
        let ident = t.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && t.len() <= 63;
        if !ident {
            return Err(bad(format!("table={t}: a table name is letters, digits and _ (not starting with a digit)")));
        }
        Ok(out)
    }

    /// The lease as a SQLite date modifier: `+30.000 seconds`.
    pub(crate) fn lease_modifier(&self) -> String {
        format!("+{}.{:03} seconds", self.lease.as_secs(), self.lease.subsec_millis())
    }
}

/// The keys of a `sqlite://` URL's query beside the common ones.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "lease",
    keys: &[crate::options::Key::new("table", ""), crate::options::Key::new("busy_timeout", "")],
    tls: crate::options::TlsKeys::Refused("a SQLite database is a local file, reached without TLS"),
    connections: crate::options::ConnectionKeys::Refused(
        "a SQLite database is a local file, reached without server connections (the key is for PostgreSQL and MariaDB, whose locks live in server sessions)",
    ),
    pairs_need_values: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_their_errors() {
        let u = SqliteUrl::parse("sqlite:locks.db?lease=1500ms&table=shedlock").unwrap();
        assert_eq!(u.path, PathBuf::from("locks.db"));
        assert_eq!(u.lease_modifier(), "+1.500 seconds");
        assert_eq!(u.table, "shedlock");
        crate::assert_refused(
            SqliteUrl::parse,
            &[
                ("sqlite://", "database file"),
                ("sqlite://:memory:", "memory"),
                ("sqlite:///x.db?lease=10ms", "lease"),
                ("sqlite:///x.db?table=1x", "table=1x"),
                ("sqlite:///x.db?nope=1", "nope"),
                ("mysql://x", "sqlite://"),
            ],
        );
    }
}

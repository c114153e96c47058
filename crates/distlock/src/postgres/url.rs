//! `postgres://` URLs.

use crate::{parse_duration, Error, Result};
use std::time::Duration;

/// Default lease: how long after it last heard from a silent holder the server ends its session.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease: the server's TCP timers count in whole seconds.
const MIN_LEASE: Duration = Duration::from_secs(3);
/// The longest lease a URL may ask for.
const MAX_LEASE: Duration = Duration::from_secs(86_400);
/// Default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How lock names become advisory-lock keys.
///
/// # Examples
///
/// ```
/// use distlock::postgres::KeyScheme;
/// assert_eq!(KeyScheme::Raw.key("42").unwrap(), 42);
/// assert!(KeyScheme::Raw.key("orders").is_err());
/// assert_eq!(KeyScheme::Hash.key("orders").unwrap(), KeyScheme::Hash.key("orders").unwrap());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyScheme {
    /// The first 8 bytes of SHA-1 of the UTF-8 name, read little-endian (DistributedLock's
    /// hashing rule for names it does not encode directly).
    #[default]
    Hash,
    /// The name is the key: a decimal `i64`, for sharing a lock with code that calls
    /// `pg_advisory_lock(<number>)` itself.
    Raw,
}

impl KeyScheme {
    /// The advisory key of lock `name`.
    pub fn key(self, name: &str) -> Result<i64> {
        let bad = |reason: String| Error::InvalidLockPath { path: name.to_string(), reason };
        if name.is_empty() {
            return Err(bad("the lock name is empty".into()));
        }
        match self {
            KeyScheme::Hash => {
                use sha1::Digest;
                let digest = sha1::Sha1::digest(name.as_bytes());
                Ok(i64::from_le_bytes(digest[..8].try_into().expect("SHA-1 has 20 bytes")))
            }
            KeyScheme::Raw => name
                .parse::<i64>()
                .map_err(|_| bad("with ?keys=raw a lock name is the advisory key itself, a decimal i64".into())),
        }
    }
}

/// A parsed `postgres://[user[:password]@]host[:port][/database][?lease=30s&connect_timeout=10s&keys=hash]`
/// (`postgresql://` too). TLS is not compiled in yet.
///
/// Query keys:
/// - `lease`: the longest the server keeps a silent holder's session, and so its locks (default
///   30 s, at least 3 s; see the [module docs](super#leases-and-loss));
/// - `connect_timeout`: bound on connecting (default 10 s);
/// - `keys`: `hash` (default) or `raw` (see [`KeyScheme`]);
/// - `application_name`: shown in `pg_stat_activity` (default `distlock`).
///
/// An unknown key is an error naming it.
///
/// # Examples
///
/// ```
/// use distlock::postgres::PgUrl;
/// use std::time::Duration;
/// let url = PgUrl::parse("postgres://app:secret@127.0.0.1:5433/jobs?lease=6s").unwrap();
/// assert_eq!(url.lease, Duration::from_secs(6));
/// assert!(!url.to_string().contains("secret"));
/// assert!(PgUrl::parse("postgres://127.0.0.1/jobs?leese=6s").unwrap_err().to_string().contains("leese"));
/// ```
#[derive(Clone)]
pub struct PgUrl {
    /// The connection settings (host, port, user, password, database).
    pub config: tokio_postgres::Config,
    /// See the query keys above.
    pub lease: Duration,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// How names become keys.
    pub keys: KeyScheme,
    /// The URL without its password, for messages.
    shown: String,
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Display for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl PgUrl {
    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn parse(url: &str) -> Result<PgUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: redact(url), reason };
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| bad("a PostgreSQL URL starts with postgres:// or postgresql://".into()))?;
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (mut lease, mut connect_timeout, mut keys) = (DEFAULT_LEASE, DEFAULT_CONNECT_TIMEOUT, KeyScheme::Hash);
        let mut application_name = "distlock".to_string();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "lease" => lease = parse_duration(v)?,
                "connect_timeout" => connect_timeout = parse_duration(v)?,
                "keys" => {
                    keys = match v {
                        "hash" => KeyScheme::Hash,
                        "raw" => KeyScheme::Raw,
                        _ => return Err(bad(format!("keys={v}: use keys=hash or keys=raw"))),
                    }
                }
                "application_name" => application_name = v.to_string(),
                _ => {
                    return Err(bad(format!(
                        "unknown URL key {k:?} (known: lease, connect_timeout, keys, application_name)"
                    )))
                }
            }
        }
        if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
            return Err(bad(format!("lease={} must be from 3s to 1 day", humantime::format_duration(lease))));
        }
        if connect_timeout.is_zero() {
            return Err(bad("connect_timeout must be more than 0".into()));
        }
        if base.is_empty() || base.starts_with('/') {
            return Err(bad("no host: give postgres://[user@]host[:port][/database]".into()));
        }
        let mut config: tokio_postgres::Config =
            format!("postgresql://{base}").parse().map_err(|e: tokio_postgres::Error| bad(e.to_string()))?;
        if config.get_user().is_none() {
            config.user("postgres");
        }
        // Our side of the connection notices a dead server too, also without a ping in flight.
        config
            .application_name(&application_name)
            .connect_timeout(connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5).min(lease / 3))
            .tcp_user_timeout(lease);
        Ok(PgUrl { config, lease, connect_timeout, keys, shown: redact(url) })
    }

    /// The session settings of a lock connection: the server ends this session (freeing its
    /// locks) once it has not heard from us for at most the lease, and a backend waiting for a
    /// lock checks every second whether we are still there.
    pub(crate) fn session_settings(&self) -> String {
        // idle + count × interval = the lease exactly, in whole seconds, idle at least half.
        let lease = self.server_bound().as_secs();
        let count = if lease >= 4 { 3 } else { 2 };
        let interval = (lease / 6).max(1);
        let idle = lease - count * interval;
        let bound = self.server_bound();
        format!(
            "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; \
             SET tcp_keepalives_count = {count}; SET tcp_user_timeout = {}; \
             SET client_connection_check_interval = 1000; SET statement_timeout = 0; \
             SET synchronous_commit = off; SET default_transaction_isolation = 'read committed'; \
             SET idle_session_timeout = 0; SET idle_in_transaction_session_timeout = 0",
            bound.as_millis()
        )
    }

    /// The soonest the server may end a session it has not heard from, counted from the last
    /// request it received: the keepalive path (idle + count × interval, whole seconds) or
    /// `tcp_user_timeout`, both set to at most the lease.
    pub(crate) fn server_bound(&self) -> Duration {
        Duration::from_secs(self.lease.as_secs())
    }
}

/// The URL with its password replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let (auth, host) = match rest.rsplit_once('@') {
        Some(parts) => parts,
        None => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_stay_within_the_lease() {
        for secs in [3u64, 4, 10, 30, 61, 3600] {
            let url = PgUrl::parse(&format!("postgres://127.0.0.1/x?lease={secs}s")).unwrap();
            let s = url.session_settings();
            let num = |k: &str| -> u64 {
                let at = s.find(k).unwrap() + k.len() + 3;
                s[at..].split(';').next().unwrap().trim().parse().unwrap()
            };
            let keepalive = num("tcp_keepalives_idle") + num("tcp_keepalives_count") * num("tcp_keepalives_interval");
            assert_eq!(keepalive, secs, "lease {secs}s: the keepalive path ({s})");
            assert!(num("tcp_keepalives_idle") >= 1);
            assert_eq!(num("tcp_user_timeout"), secs * 1000);
        }
    }

    #[test]
    fn names_hash_as_distributedlock_does() {
        // SHA-1("abc") = a9993e36 4706816a ...: the first 8 bytes read little-endian.
        assert_eq!(KeyScheme::Hash.key("abc").unwrap(), 7674422142938552745);
        assert_eq!(KeyScheme::Hash.key("锁/订单").unwrap(), -8107378560486475100);
        assert!(KeyScheme::Hash.key("").is_err());
    }

    #[test]
    fn bad_urls_are_named() {
        for (url, says) in [
            ("postgres://127.0.0.1/x?lease=1s", "lease"),
            ("postgres://127.0.0.1/x?keys=md5", "keys=md5"),
            ("postgres:///x", "no host"),
            ("mysql://127.0.0.1/x", "postgres://"),
            ("postgres://127.0.0.1/x?lease=soon", "soon"),
        ] {
            let e = PgUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        let e = PgUrl::parse("postgres://u:hunter2@127.0.0.1/x?nope=1").unwrap_err().to_string();
        assert!(!e.contains("hunter2") && e.contains("nope"), "{e}");
    }
}

//! `mysql://` URLs.

use crate::{Error, Result};
use std::time::Duration;

/// Default lease: how long after the last request from a silent holder the server closes its
/// connection (and so frees its locks).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A parsed `mysql://[user[:password]@]host[:port]/database[?lease=30s&connect_timeout=10s]`
/// (`mariadb://` too).
///
/// Query keys:
/// - `lease`: the session's `wait_timeout`, whole seconds from 3 s to a day (default 30 s): the
///   longest the server keeps a silent holder's connection, and so its locks;
/// - `connect_timeout`: bound on connecting (default 10 s);
/// - `fencing`: where fencing tokens come from: `sequence` (the default: one MariaDB `SEQUENCE`,
///   `distlock_fencing_seq`, read in the acquire statement; a server without sequences, such as
///   MySQL, falls back to `row`) or `row` (a counter row per lock name in `distlock_fencing`,
///   written by the acquire statement, about half the sequence's speed);
/// - `connections`: how many server connections the client's locks use at most, waits included
///   (default 4, 1 to 1000). `GET_LOCK` locks belong to the connection, so many locks live on
///   one: an acquire tries on a shared connection without waiting; a lock that must wait waits
///   on the server on a connection that holds nothing (at most `connections - 1` at once), or
///   polls when none is free (see [the module docs](crate::mysql#connections));
/// - `ssl-mode` (MySQL's names, any case): `DISABLED` (plaintext; the default without TLS
///   files), `PREFERRED` (TLS if the server offers it, the certificate unchecked), `REQUIRED` (TLS,
///   the certificate unchecked), `VERIFY_IDENTITY` (TLS, the chain and the host's name checked;
///   the default when TLS files are given). `VERIFY_CA` is refused: the driver adds the CA to the
///   system's roots rather than using it alone, so a chain check without the name would take any
///   publicly signed certificate;
/// - `ssl-ca` (or `cacert`), `ssl-cert` (or `cert`), `ssl-key` (or `key`): the CA that verifies
///   the server, and a client certificate and key (for `REQUIRE X509` users).
///
/// The URL's keys are its configuration: a `MysqlUrl` is made by [`parse`](Self::parse) only, and
/// read through its accessors ([`host`](Self::host), [`database`](Self::database),
/// [`lease`](Self::lease), [`ssl_mode`](Self::ssl_mode), …). Other settings are another URL
/// (change its keys), or [`ConnectOptions`](crate::ConnectOptions) given to
/// [`connect_with`](crate::connect_with).
///
/// # Examples
///
/// ```
/// use distlock::mysql::{MysqlUrl, SslMode};
/// let url = MysqlUrl::parse("mysql://app:secret@127.0.0.1:3306/jobs?lease=6s").unwrap();
/// assert_eq!((url.host(), url.port(), url.user(), url.database()), ("127.0.0.1", 3306, "app", "jobs"));
/// assert_eq!(url.lease(), std::time::Duration::from_secs(6));
/// assert_eq!(url.ssl_mode(), SslMode::Disabled);
/// assert!(!format!("{url} {url:?}").contains("secret"));
/// assert!(MysqlUrl::parse("mysql://127.0.0.1/jobs?lease=2500ms").is_err());
/// ```
#[derive(Clone)]
pub struct MysqlUrl {
    /// The connection settings.
    pub(crate) options: sqlx::mysql::MySqlConnectOptions,
    /// See the query keys above.
    pub(crate) lease: Duration,
    /// Bound on connecting.
    pub(crate) connect_timeout: Duration,
    /// See the query keys above.
    pub(crate) fencing: Fencing,
    /// See the query keys above (`connections`).
    pub(crate) connections: usize,
    /// The TLS files (CA, client certificate and key).
    pub(crate) tls_files: crate::tls::TlsFiles,
    /// The `ssl-mode` in force.
    ssl_mode: SslMode,
    /// Whether the connection is TLS (any `ssl-mode` but `DISABLED`).
    pub(crate) tls: bool,
    /// Whether connecting may make the fencing sequence or table where missing (`setup=auto`,
    /// the default) or not (`setup=no`: a missing one is an error).
    pub(crate) setup: bool,
    /// When a password goes to another machine over a connection that does not verify the
    /// server: the mode, for the warning.
    unverified_password: Option<&'static str>,
    /// Whether PREFERRED was kept to TLS for a password going to another machine.
    tls_preferred: bool,
    shown: String,
}

/// Where a MariaDB lock's fencing tokens come from (the URL's `fencing` key).
///
/// # Examples
///
/// ```
/// use distlock::mysql::{Fencing, MysqlUrl};
/// assert_eq!(MysqlUrl::parse("mysql://127.0.0.1/jobs").unwrap().fencing(), Fencing::Sequence);
/// assert_eq!(MysqlUrl::parse("mysql://127.0.0.1/jobs?fencing=row").unwrap().fencing(), Fencing::Row);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// One `SEQUENCE` for every lock; a token is its next value or the server clock in µs read
    /// after the grant, whichever is larger (so tokens rise even if the sequence lost advances).
    Sequence,
    /// A counter row per lock name: `greatest(last + 1, server clock in µs)`.
    Row,
}

/// The TLS of a MariaDB/MySQL connection (the URL's `ssl-mode`, MySQL's names; see [`MysqlUrl`]).
///
/// # Examples
///
/// ```
/// use distlock::mysql::{MysqlUrl, SslMode};
/// assert_eq!(MysqlUrl::parse("mysql://u@h/db?ssl-mode=required").unwrap().ssl_mode(), SslMode::Required);
/// assert_eq!(MysqlUrl::parse("mysql://u@h/db?ssl-ca=/ca.pem").unwrap().ssl_mode(), SslMode::VerifyIdentity);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext (`DISABLED`).
    Disabled,
    /// TLS if the server offers it, the certificate unchecked (`PREFERRED`).
    Preferred,
    /// TLS, the certificate unchecked (`REQUIRED`).
    Required,
    /// TLS, the chain and the host's name checked (`VERIFY_IDENTITY`).
    VerifyIdentity,
}

impl SslMode {
    /// The driver's mode `mode` (never `VERIFY_CA`, which parsing refuses).
    fn of(mode: sqlx::mysql::MySqlSslMode) -> SslMode {
        use sqlx::mysql::MySqlSslMode as M;
        match mode {
            M::Disabled => SslMode::Disabled,
            M::Preferred => SslMode::Preferred,
            M::Required => SslMode::Required,
            M::VerifyCa | M::VerifyIdentity => SslMode::VerifyIdentity,
        }
    }
}

impl std::fmt::Debug for MysqlUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Display for MysqlUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl MysqlUrl {
    /// The server's host name or address.
    pub fn host(&self) -> &str {
        self.options.get_host()
    }

    /// The server's port (default 3306).
    pub fn port(&self) -> u16 {
        self.options.get_port()
    }

    /// The user the connections log in as (default `root`).
    pub fn user(&self) -> &str {
        self.options.get_username()
    }

    /// The database (the URL's path), where the fencing sequence or table lives.
    pub fn database(&self) -> &str {
        self.options.get_database().unwrap_or_default()
    }

    /// The session's `wait_timeout` (`lease=`, default 30 s): the longest the server keeps a
    /// silent holder's connection, and so its locks.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The bound on connecting (`connect_timeout=`, default 10 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Where fencing tokens come from (`fencing=`).
    pub fn fencing(&self) -> Fencing {
        self.fencing
    }

    /// How many server connections the client's locks use at most, waits included
    /// (`connections=`, default 4; see the [module docs](super#connections)).
    pub fn connections(&self) -> usize {
        self.connections
    }

    /// The `ssl-mode` in force: the URL's, else [`VerifyIdentity`](SslMode::VerifyIdentity)
    /// with TLS files and [`Disabled`](SslMode::Disabled) without; `PREFERRED` is kept to TLS
    /// ([`Required`](SslMode::Required)) when a password goes to another machine.
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// Whether the connections are TLS (any [`ssl_mode`](Self::ssl_mode) but `DISABLED`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The TLS files (CA, client certificate and key).
    pub fn tls_files(&self) -> &crate::tls::TlsFiles {
        &self.tls_files
    }

    /// Whether connecting may make the fencing sequence or table where missing (`setup=auto`,
    /// the default) or not (`setup=no`: a missing one is an error).
    pub fn setup(&self) -> bool {
        self.setup
    }

    /// Warns when a password goes to another machine over a connection that does not verify
    /// the server (`ssl-mode` `DISABLED`, `PREFERRED` or `REQUIRED`).
    pub(crate) fn warn_if_unverified(&self) {
        if let Some(how) = self.unverified_password {
            let host = self.options.get_host();
            crate::tls::warn_unverified_password(&self.shown, host, how, "ssl-mode=VERIFY_IDENTITY");
        }
    }

    /// The reason of a failed connect, `reason`, told why when PREFERRED was kept to TLS for a
    /// password and the server did not offer it.
    pub(crate) fn explain_refused_tls(&self, reason: String) -> String {
        if self.tls_preferred && reason.to_lowercase().contains("not support tls") {
            return format!(
                "{reason}: the server did not offer TLS (or someone on the path removed it), and with \
                 ssl-mode=PREFERRED distlock does not send a password in plaintext to another machine; turn TLS \
                 on at the server (and ask for ssl-mode=VERIFY_IDENTITY), or say ssl-mode=DISABLED to send it anyway"
            );
        }
        reason
    }

    /// Parses a `mysql://` or `mariadb://` URL.
    pub fn parse(url: &str) -> Result<MysqlUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<MysqlUrl> {
        let shown = crate::redact_url(url);
        let bad = |reason: String| Error::InvalidUrl { url: shown.clone(), reason };
        let rest = url
            .strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://"))
            .ok_or_else(|| bad("a MariaDB URL starts with mysql:// or mariadb://".into()))?;
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (common, own) = QUERY.parse(query).map_err(&bad)?;
        let common = QUERY.merge(common, over).map_err(&bad)?;
        let (lease, connect_timeout) =
            (common.lease.unwrap_or(DEFAULT_LEASE), common.connect_timeout.unwrap_or(Duration::from_secs(10)));
        let (fencing, ssl_mode) = own_keys(&own).map_err(&bad)?;
        let connections = common.connections.unwrap_or(crate::options::DEFAULT_CONNECTIONS);
        if !(Duration::from_secs(3)..=Duration::from_secs(86_400)).contains(&lease) || lease.subsec_nanos() != 0 {
            return Err(bad(format!(
                "lease={} must be whole seconds from 3s to 1 day (it is the session's wait_timeout)",
                humantime::format_duration(lease)
            )));
        }
        if connect_timeout.is_zero() {
            return Err(bad("connect_timeout must be more than 0".into()));
        }
        let (tls_files, setup) = (common.tls_files, common.setup.unwrap_or(true));
        let (_, path) = base.split_once('/').unwrap_or((base, ""));
        if base.is_empty() || base.starts_with('/') {
            return Err(bad("no host: give mysql://[user@]host[:port]/database".into()));
        }
        if path.is_empty() {
            return Err(bad(
                "no database: give mysql://[user@]host[:port]/database (the fencing table lives there)".into()
            ));
        }
        let mut options: sqlx::mysql::MySqlConnectOptions =
            format!("mysql://{base}").parse().map_err(|e: sqlx::Error| bad(e.to_string()))?;
        // TLS only when asked for (a CA given asks for it, fully verified), then checked as asked.
        use sqlx::mysql::MySqlSslMode as M;
        let ssl_mode = checked_ssl_mode(ssl_mode, &tls_files).map_err(&bad)?;
        let tls_preferred = matches!(ssl_mode, M::Preferred);
        // A password for another machine is not sent in plaintext because the server (or someone
        // on the path, who can then ask for it in cleartext) declined TLS: PREFERRED asks for TLS
        // there; DISABLED says plaintext is meant.
        let password =
            base.rsplit_once('@').is_some_and(|(user, _)| user.split_once(':').is_some_and(|(_, p)| !p.is_empty()));
        let password_abroad = password && !crate::tls::is_this_machine(options.get_host());
        let ssl_mode = if matches!(ssl_mode, M::Preferred) && password_abroad { M::Required } else { ssl_mode };
        let unverified_password = match ssl_mode {
            _ if !password_abroad => None,
            M::Disabled => Some("ssl-mode=DISABLED: plaintext"),
            M::Required if tls_preferred => Some("ssl-mode=PREFERRED (kept to TLS)"),
            M::Preferred | M::Required => Some("ssl-mode=REQUIRED"),
            _ => None,
        };
        options = options.ssl_mode(ssl_mode);
        if let Some(ca) = &tls_files.cacert {
            options = options.ssl_ca(ca);
        }
        if let (Some(cert), Some(key)) = (&tls_files.cert, &tls_files.key) {
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        // A lock wait is a "slow statement" by design: no warnings for it.
        let options = sqlx::ConnectOptions::disable_statement_logging(options);
        let tls = !matches!(ssl_mode, M::Disabled);
        Ok(MysqlUrl {
            options,
            lease,
            connect_timeout,
            fencing,
            connections,
            tls_files,
            ssl_mode: SslMode::of(ssl_mode),
            tls,
            setup,
            unverified_password,
            tls_preferred: tls_preferred && password_abroad,
            shown,
        })
    }
}

/// The keys of a `mysql://` URL's query beside the common ones.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "lease",
    keys: &[
        crate::options::Key::new("fencing", "sequence|row"),
        crate::options::Key { name: "ssl-mode", aliases: &["ssl_mode"], hint: "" },
    ],
    tls: crate::options::TlsKeys::Files(&[("ssl-ca", "cacert"), ("ssl-cert", "cert"), ("ssl-key", "key")]),
    connections: crate::options::ConnectionKeys::Shared,
    pairs_need_values: false,
};

/// The values of the URL's own keys (see [`QUERY`]): `fencing` and `ssl-mode`.
fn own_keys(
    own: &[crate::options::Pair<'_>],
) -> std::result::Result<(Fencing, Option<sqlx::mysql::MySqlSslMode>), String> {
    let (mut fencing, mut ssl_mode) = (Fencing::Sequence, None);
    for pair in own {
        match (pair.name, pair.value) {
            ("ssl-mode", v) => ssl_mode = Some(ssl_mode_of(v)?),
            (_, "sequence") => fencing = Fencing::Sequence,
            (_, "row") => fencing = Fencing::Row,
            (_, v) => return Err(format!("fencing={v:?}: give sequence or row")),
        }
    }
    Ok((fencing, ssl_mode))
}

/// The `ssl-mode` value `v` (MySQL's names, any case, `-` or `_`).
fn ssl_mode_of(v: &str) -> std::result::Result<sqlx::mysql::MySqlSslMode, String> {
    use sqlx::mysql::MySqlSslMode as M;
    Ok(match v.to_ascii_uppercase().replace('-', "_").as_str() {
        "DISABLED" => M::Disabled,
        "PREFERRED" => M::Preferred,
        "REQUIRED" => M::Required,
        "VERIFY_CA" => M::VerifyCa,
        "VERIFY_IDENTITY" => M::VerifyIdentity,
        _ => return Err(format!("ssl-mode={v}: use DISABLED, PREFERRED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY")),
    })
}

/// The `ssl-mode` in force: the URL's, else VERIFY_IDENTITY with TLS files and DISABLED without;
/// or why it cannot be used with these files.
fn checked_ssl_mode(
    ssl_mode: Option<sqlx::mysql::MySqlSslMode>,
    tls_files: &crate::tls::TlsFiles,
) -> std::result::Result<sqlx::mysql::MySqlSslMode, String> {
    use sqlx::mysql::MySqlSslMode as M;
    tls_files.check()?;
    // The driver adds the CA to the system's roots (it cannot use it alone): VERIFY_CA would
    // then take any certificate a public CA signed, for any host, and PREFERRED or REQUIRED
    // would not look at the CA at all. A CA is used with VERIFY_IDENTITY only.
    let ssl_mode = ssl_mode.unwrap_or(if tls_files.is_empty() { M::Disabled } else { M::VerifyIdentity });
    match ssl_mode {
        M::Disabled if !tls_files.is_empty() => {
            Err("TLS files with ssl-mode=DISABLED: drop them or ask for TLS (ssl-mode=VERIFY_IDENTITY)".into())
        }
        M::VerifyCa => Err("ssl-mode=VERIFY_CA is not offered: the driver would accept a certificate any public CA \
                            signed for any host; use VERIFY_IDENTITY (the server's name checked)"
            .into()),
        M::Preferred | M::Required if tls_files.cacert.is_some() => Err(format!(
            "ssl-mode={} does not check the certificate, so the CA would not be used: use VERIFY_IDENTITY",
            if matches!(ssl_mode, M::Preferred) { "PREFERRED" } else { "REQUIRED" }
        )),
        _ => Ok(ssl_mode),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_only_when_asked_and_a_ca_only_where_it_is_used() {
        use sqlx::mysql::MySqlSslMode as M;
        let mode = |q: &str| MysqlUrl::parse(&format!("mysql://u@h/db?{q}")).map(|u| u.options.get_ssl_mode());
        assert!(matches!(mode("").unwrap(), M::Disabled));
        assert!(matches!(mode("ssl-ca=/ca.pem").unwrap(), M::VerifyIdentity));
        assert!(matches!(mode("ssl-cert=/c.pem&ssl-key=/k.pem").unwrap(), M::VerifyIdentity));
        assert!(matches!(mode("ssl-mode=required").unwrap(), M::Required));
        // The accessor says the mode in force: PREFERRED is kept to TLS for a password abroad.
        let shown = |url: &str| MysqlUrl::parse(url).map(|u| (u.ssl_mode(), u.tls())).unwrap();
        assert_eq!(shown("mysql://u@h/db"), (SslMode::Disabled, false));
        assert_eq!(shown("mysql://u:pw@127.0.0.1/db?ssl-mode=PREFERRED"), (SslMode::Preferred, true));
        assert_eq!(shown("mysql://u:pw@db.example/db?ssl-mode=preferred"), (SslMode::Required, true));
        assert_eq!(shown("mysql://u@h/db?cacert=/ca.pem"), (SslMode::VerifyIdentity, true));
        for (q, says) in [
            ("ssl-mode=VERIFY_CA&ssl-ca=/ca.pem", "VERIFY_CA"),
            ("ssl-mode=REQUIRED&ssl-ca=/ca.pem", "REQUIRED"),
            ("ssl-mode=DISABLED&cacert=/ca.pem", "DISABLED"),
            ("ssl-cert=/c.pem", "key"),
        ] {
            let e = mode(q).unwrap_err().to_string();
            assert!(e.contains(says), "{q}: {e}");
        }
    }

    #[test]
    fn bad_urls_are_named() {
        crate::assert_refused(
            MysqlUrl::parse,
            &[
                ("mysql://127.0.0.1/x?lease=1s", "lease"),
                ("mysql://127.0.0.1/x?lease=3500ms", "whole seconds"),
                ("mysql:///x", "no host"),
                ("mysql://127.0.0.1", "no database"),
                ("postgres://127.0.0.1/x", "mysql://"),
                ("mysql://127.0.0.1/x?nope=1", "nope"),
                ("mysql://127.0.0.1/x?fencing=clock", "fencing"),
            ],
        );
        let e = MysqlUrl::parse("mysql://u:hunter2@127.0.0.1/x?nope=1").unwrap_err().to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}

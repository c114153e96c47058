//! `postgres://` URLs.

use crate::{Error, Result};
use std::time::Duration;
use tokio_postgres::config::Host;

/// Default lease: how long after it last heard from a silent holder the server ends its session.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease: the server's TCP timers count in whole seconds.
const MIN_LEASE: Duration = Duration::from_secs(3);
/// The longest lease a URL may ask for.
const MAX_LEASE: Duration = Duration::from_secs(86_400);
/// Default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An advisory-lock key: one `bigint`, or a pair of `integer`s (a separate key space on the
/// server: `pg_advisory_lock(bigint)` and `pg_advisory_lock(integer, integer)` never collide).
///
/// Shown as DistributedLock shows it: 16 hex digits, or `xxxxxxxx,yyyyyyyy`.
///
/// # Examples
///
/// ```
/// use distlock::postgres::{AdvisoryKey, KeyScheme};
/// let key = KeyScheme::DistributedLock.key("00000000000000ff").unwrap();
/// assert_eq!(key, AdvisoryKey::Single(255));
/// assert_eq!(key.to_string(), "00000000000000ff");
/// assert_eq!(KeyScheme::DistributedLock.key("00000001,ffffffff").unwrap(), AdvisoryKey::Pair(1, -1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AdvisoryKey {
    /// `pg_advisory_lock(bigint)`.
    Single(i64),
    /// `pg_advisory_lock(integer, integer)`.
    Pair(i32, i32),
}

impl AdvisoryKey {
    /// The arguments of the advisory-lock functions for this key, as SQL placeholders from `$first`.
    pub(crate) fn sql_args(&self, first: usize) -> String {
        match self {
            AdvisoryKey::Single(_) => format!("${first}"),
            AdvisoryKey::Pair(..) => format!("${first}, ${}", first + 1),
        }
    }

    /// The arguments of the advisory-lock functions for this key, as SQL literals (integers).
    pub(crate) fn sql_literals(&self) -> String {
        match self {
            AdvisoryKey::Single(k) => format!("{k}"),
            AdvisoryKey::Pair(a, b) => format!("{a}, {b}"),
        }
    }

    /// How many placeholders [`sql_args`](Self::sql_args) uses.
    pub(crate) fn arity(&self) -> usize {
        match self {
            AdvisoryKey::Single(_) => 1,
            AdvisoryKey::Pair(..) => 2,
        }
    }

    /// The values of those placeholders, typed.
    pub(crate) fn params(&self) -> Vec<(&(dyn tokio_postgres::types::ToSql + Sync), tokio_postgres::types::Type)> {
        use tokio_postgres::types::Type;
        match self {
            AdvisoryKey::Single(k) => vec![(k, Type::INT8)],
            AdvisoryKey::Pair(a, b) => vec![(a, Type::INT4), (b, Type::INT4)],
        }
    }

    /// How `pg_locks` shows it: `(classid, objid, objsubid)`, each as a `bigint`.
    pub fn pg_locks_ids(&self) -> (i64, i64, i64) {
        match *self {
            AdvisoryKey::Single(k) => ((k >> 32) as u32 as i64, k as u32 as i64, 1),
            AdvisoryKey::Pair(a, b) => (a as u32 as i64, b as u32 as i64, 2),
        }
    }
}

impl serde::Serialize for AdvisoryKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for AdvisoryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdvisoryKey::Single(k) => write!(f, "{:016x}", *k as u64),
            AdvisoryKey::Pair(a, b) => write!(f, "{:08x},{:08x}", *a as u32, *b as u32),
        }
    }
}

/// How lock names become advisory-lock keys.
///
/// # Examples
///
/// ```
/// use distlock::postgres::{AdvisoryKey, KeyScheme};
/// assert_eq!(KeyScheme::Raw.key("42").unwrap(), AdvisoryKey::Single(42));
/// assert!(KeyScheme::Raw.key("orders").is_err());
/// // Up to nine ASCII characters are packed, not hashed: no two such names collide.
/// assert_ne!(KeyScheme::DistributedLock.key("orders").unwrap(), KeyScheme::DistributedLock.key("order").unwrap());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyScheme {
    /// DistributedLock's rules (`PostgresAdvisoryLockKey` with hashing allowed), in order: a
    /// name of at most 9 ASCII characters is packed 7 bits a character, then a 0 bit, then 1
    /// bits; 16 hex digits are the `bigint` itself; `xxxxxxxx,yyyyyyyy` (8 hex digits each) is an
    /// integer pair; any other name is hashed: the first 8 bytes of SHA-1 of its UTF-8,
    /// little-endian. .NET services on DistributedLock and the Rust `distributed-lock-postgres`
    /// crate lock the same keys for the same names.
    #[default]
    DistributedLock,
    /// The name is the key: a decimal `i64`, for sharing a lock with code that calls
    /// `pg_advisory_lock(<number>)` itself.
    Raw,
}

impl KeyScheme {
    /// The advisory key of lock `name`.
    pub fn key(self, name: &str) -> Result<AdvisoryKey> {
        crate::contract::check_name(name)?;
        let bad = |reason: String| Error::InvalidLockPath { path: name.to_string(), reason };
        let key = match self {
            KeyScheme::DistributedLock => {
                Ok(ascii_key(name).or_else(|| hex_key(name)).unwrap_or_else(|| hashed_key(name)))
            }
            KeyScheme::Raw => name
                .parse::<i64>()
                .map(AdvisoryKey::Single)
                .map_err(|_| bad("with ?keys=raw a lock name is the advisory key itself, a decimal i64".into())),
        }?;
        let (g1, g2) = super::FENCING_GUARD;
        if key == AdvisoryKey::Pair(g1, g2) {
            return Err(bad(format!("the key {key} is reserved for distlock's fencing sequence")));
        }
        if matches!(key, AdvisoryKey::Pair(class, _) if class == super::KIND_MARKER_CLASS) {
            return Err(bad(format!(
                "the keys {:08x},… are reserved for distlock's kind markers",
                super::KIND_MARKER_CLASS
            )));
        }
        Ok(key)
    }
}

/// The first 8 bytes of SHA-1 of `name`'s UTF-8, little-endian (DistributedLock's hashing rule).
pub(crate) fn hashed_key(name: &str) -> AdvisoryKey {
    use sha1::Digest;
    let digest = sha1::Sha1::digest(name.as_bytes());
    AdvisoryKey::Single(i64::from_le_bytes(digest[..8].try_into().expect("SHA-1 has 20 bytes")))
}

/// Up to 9 characters below 128: each in 7 bits, then a 0 bit, then 1 bits to fill 64.
fn ascii_key(name: &str) -> Option<AdvisoryKey> {
    if name.len() > 9 || !name.is_ascii() {
        return None;
    }
    let mut key = name.bytes().fold(0u64, |k, c| (k << 7) | c as u64) << 1;
    for _ in name.len()..9 {
        key = (key << 7) | 0x7f;
    }
    Some(AdvisoryKey::Single(key as i64))
}

/// `hhhhhhhhhhhhhhhh` (a bigint) or `hhhhhhhh,hhhhhhhh` (an integer pair), hex digits either case.
fn hex_key(name: &str) -> Option<AdvisoryKey> {
    let word = |s: &str| {
        (s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| u32::from_str_radix(s, 16).ok()).flatten()
    };
    match name.len() {
        16 => Some(AdvisoryKey::Single(((word(&name[..8])? as u64) << 32 | word(&name[8..])? as u64) as i64)),
        17 if name.as_bytes()[8] == b',' => Some(AdvisoryKey::Pair(word(&name[..8])? as i32, word(&name[9..])? as i32)),
        _ => None,
    }
}

/// A parsed `postgres://[user[:password]@]host[:port][/database][?lease=30s&connect_timeout=10s&keys=distributedlock]`
/// (`postgresql://` too).
///
/// Query keys:
/// - `lease`: the longest the server keeps a silent holder's session, and so its locks (default
///   30 s, at least 3 s; see the [module docs](super#leases-and-loss));
/// - `connect_timeout`: bound on connecting (default 10 s);
/// - `keys`: `distributedlock` (default) or `raw` (see [`KeyScheme`]);
/// - `application_name`: shown in `pg_stat_activity` (default `distlock`);
/// - `rescan`: how often a semaphore's waiters try its slots again without having been told of a
///   release (default 500 ms; a permit freed by a dead holder's session is found this way), and
///   the longest a lock's wait polls between tries when no connection is free to wait on;
/// - `connections`: how many server connections the client's locks share at most (default 4,
///   1 to 1000; see the [module docs](super#connections)): every lock held, waited for or
///   inspected goes over these, whatever their number (semaphore waiters also `LISTEN` on one
///   more); with `lock_scope=transaction` each held lock has a connection of its own instead;
/// - `lock_scope`: `session` (default: session advisory locks) or `transaction` (each lock a
///   transaction advisory lock in a transaction held open for its life, for PostgreSQL behind a
///   transaction pooler such as PgBouncer's `pool_mode = transaction`; the lease is the server's
///   `idle_in_transaction_session_timeout`, set for that transaction; elections, jobs and
///   inspection need `session`);
/// - `sslmode`: libpq's, with libpq's meaning: `disable` (plaintext), `prefer` (the default
///   without TLS files: TLS if the server offers it, else plaintext; the certificate not checked), `require` (TLS; the
///   certificate not checked, or its chain when a CA is given, as libpq does), `verify-ca` (TLS,
///   the chain to the CA checked), `verify-full` (TLS, the chain and the host's name checked:
///   the one to use against a server you do not control, and the default when TLS files are
///   given);
/// - `sslrootcert` (or `cacert`), `sslcert` (or `cert`), `sslkey` (or `key`): the CA that
///   verifies the server (default: the system's roots), and a client certificate and key for
///   certificate authentication (see [`crate::tls`]).
///
/// An unknown key is an error naming it.
///
/// Without a password in the URL, libpq's are used: `$PGPASSWORD`, else the matching line of
/// `$PGPASSFILE` or `~/.pgpass` (ignored when group or others may read it), so a password can stay
/// out of the URL, the command line and `ps`.
///
/// The URL's keys are its configuration: a `PgUrl` is made by [`parse`](Self::parse) only, and
/// read through its accessors ([`hosts`](Self::hosts), [`database`](Self::database),
/// [`lease`](Self::lease), [`ssl_mode`](Self::ssl_mode), …). Other settings are another URL
/// (change its keys), or [`ConnectOptions`](crate::ConnectOptions) given to
/// [`connect_with`](crate::connect_with).
///
/// # Examples
///
/// ```
/// use distlock::postgres::{PgUrl, SslMode};
/// use std::time::Duration;
/// let url = PgUrl::parse("postgres://app:secret@127.0.0.1:5433/jobs?lease=6s").unwrap();
/// assert_eq!(url.hosts(), ["127.0.0.1:5433"]);
/// assert_eq!((url.user(), url.database()), ("app", "jobs"));
/// assert_eq!(url.lease(), Duration::from_secs(6));
/// assert_eq!(url.ssl_mode(), SslMode::Prefer);
/// assert!(!format!("{url} {url:?}").contains("secret"));
/// assert!(PgUrl::parse("postgres://127.0.0.1/jobs?leese=6s").unwrap_err().to_string().contains("leese"));
/// ```
#[derive(Clone)]
pub struct PgUrl {
    /// The connection settings (host, port, user, password, database).
    pub(crate) config: tokio_postgres::Config,
    /// The servers, `host:port` each, in the order tried.
    hosts: Vec<String>,
    /// See the query keys above.
    pub(crate) lease: Duration,
    /// Bound on connecting.
    pub(crate) connect_timeout: Duration,
    /// How names become keys.
    pub(crate) keys: KeyScheme,
    /// How often semaphore waiters rescan unprompted.
    pub(crate) rescan: Duration,
    /// TLS, as libpq's `sslmode` says.
    pub(crate) ssl_mode: SslMode,
    /// The TLS files (CA, client certificate and key).
    pub(crate) tls_files: crate::tls::TlsFiles,
    /// Session advisory locks (the default) or transaction-scoped ones for transaction poolers.
    pub(crate) scope: LockScope,
    /// Whether connecting may make the fencing sequence where missing (`setup=auto`, the
    /// default) or not (`setup=no`: a missing one is an error).
    pub(crate) setup: bool,
    /// The most server connections the locks share (`connections=`).
    pub(crate) connections: usize,
    /// Whether a password goes to another machine (a host not [`is_this_machine`]): then
    /// `prefer` insists on TLS, and an unverified server is warned of.
    ///
    /// [`is_this_machine`]: crate::tls
    password_abroad: bool,
    /// The URL without its password, for messages.
    shown: String,
}

/// What a lock belongs to on the server (the URL's `lock_scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockScope {
    /// A session advisory lock (`pg_advisory_lock`), held by the connection's server session.
    Session,
    /// A transaction advisory lock (`pg_advisory_xact_lock`) in a transaction held open for the
    /// lock's life: what works behind a transaction pooler (PgBouncer's `pool_mode =
    /// transaction`), which keeps a client on one server session while its transaction is open.
    Transaction,
}

/// The servers of `config`, `host:port` each, in the order tried (a Unix socket as its path); a
/// host without its own port takes the one port given, else 5432, as tokio-postgres does.
fn hosts_of(config: &tokio_postgres::Config) -> Vec<String> {
    let ports = config.get_ports();
    let hosts = config.get_hosts().iter().enumerate();
    hosts
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
            }
        })
        .collect()
}

/// The password libpq would use when the URL has none: `$PGPASSWORD`, else the first matching
/// line of the password file (`$PGPASSFILE`, else `~/.pgpass`), which is ignored, as libpq does,
/// when others may read it.
fn libpq_password(config: &tokio_postgres::Config) -> Option<Vec<u8>> {
    if let Some(p) = std::env::var_os("PGPASSWORD").filter(|p| !p.is_empty()) {
        return Some(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec());
    }
    let file = match std::env::var_os("PGPASSFILE") {
        Some(f) => std::path::PathBuf::from(f),
        None => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".pgpass"),
    };
    let meta = std::fs::metadata(&file).ok()?;
    if std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077 != 0 {
        tracing::warn!(
            file = %file.display(),
            "the password file has group or world access and is ignored (chmod 600 it), as libpq does"
        );
        return None;
    }
    let text = std::fs::read_to_string(&file).ok()?;
    let host = match config.get_hosts().first()? {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = config.get_user().unwrap_or("postgres");
    let dbname = config.get_dbname().unwrap_or(user);
    pgpass_lookup(&text, [&host, &port, dbname, user]).map(String::into_bytes)
}

/// The password of the first `hostname:port:database:username:password` line of a libpq
/// password file matching `want` (`*` matches anything; `\:` and `\\` are a literal colon and
/// backslash; `#` starts a comment line).
fn pgpass_lookup(text: &str, want: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = vec![String::new()];
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => fields.last_mut().unwrap().extend(chars.next()),
                ':' if fields.len() < 5 => fields.push(String::new()),
                c => fields.last_mut().unwrap().push(c),
            }
        }
        if fields.len() == 5 && fields[..4].iter().zip(want).all(|(f, w)| f == "*" || f == w) {
            return fields.pop();
        }
    }
    None
}

/// libpq's `sslmode` (see [`PgUrl`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext.
    Disable,
    /// TLS when the server offers it, the certificate unchecked (libpq's default).
    Prefer,
    /// TLS; the certificate unchecked, or its chain when a CA is given.
    Require,
    /// TLS, the chain to the CA checked.
    VerifyCa,
    /// TLS, the chain and the host's name checked.
    VerifyFull,
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
    /// The servers, `host:port` each, in the order they are tried (a Unix socket as its path,
    /// `DIR/.s.PGSQL.PORT`).
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The user the connections log in as (default `postgres`).
    pub fn user(&self) -> &str {
        self.config.get_user().unwrap_or("postgres")
    }

    /// The password the connections log in with: the URL's, else libpq's (`$PGPASSWORD`, else
    /// the matching line of the password file); never shown by `Display` or `Debug`. Bytes, as
    /// the server compares them (a percent-encoded password need not be UTF-8).
    pub fn password(&self) -> Option<&[u8]> {
        self.config.get_password()
    }

    /// The database (default: the user's name, as the server takes it).
    pub fn database(&self) -> &str {
        self.config.get_dbname().unwrap_or_else(|| self.user())
    }

    /// The name shown in `pg_stat_activity` (`application_name=`, default `distlock`).
    pub fn application_name(&self) -> &str {
        self.config.get_application_name().unwrap_or_default()
    }

    /// The longest the server keeps a silent holder's session, and so its locks (`lease=`,
    /// default 30 s; see the [module docs](super#leases-and-loss)).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The bound on connecting (`connect_timeout=`, default 10 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How lock names become advisory-lock keys (`keys=`).
    pub fn keys(&self) -> KeyScheme {
        self.keys
    }

    /// How often a semaphore's waiters try its slots again unprompted (`rescan=`, default
    /// 500 ms).
    pub fn rescan(&self) -> Duration {
        self.rescan
    }

    /// The `sslmode` in force: the URL's, else [`Prefer`](SslMode::Prefer) without TLS files and
    /// [`VerifyFull`](SslMode::VerifyFull) with them; `prefer` is kept to TLS
    /// ([`Require`](SslMode::Require)) when a password goes to another machine.
    pub fn ssl_mode(&self) -> SslMode {
        match self.ssl_mode {
            SslMode::Prefer if self.password_abroad => SslMode::Require,
            mode => mode,
        }
    }

    /// The TLS files (CA, client certificate and key).
    pub fn tls_files(&self) -> &crate::tls::TlsFiles {
        &self.tls_files
    }

    /// What a lock belongs to on the server (`lock_scope=`): the session (the default) or a
    /// transaction, for transaction poolers.
    pub fn scope(&self) -> LockScope {
        self.scope
    }

    /// Whether connecting may make the fencing sequence where missing (`setup=auto`, the
    /// default) or not (`setup=no`: a missing one is an error).
    pub fn setup(&self) -> bool {
        self.setup
    }

    /// How many server connections the client's locks share at most (`connections=`, default
    /// 4; `lock_scope=transaction` has a connection for each held lock instead).
    pub fn connections(&self) -> usize {
        self.connections
    }

    /// Parses a `postgres://` or `postgresql://` URL.
    pub fn parse(url: &str) -> Result<PgUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<PgUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: crate::redact_url(url), reason };
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| bad("a PostgreSQL URL starts with postgres:// or postgresql://".into()))?;
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (common, own) = QUERY.parse(query).map_err(bad)?;
        let common = QUERY.merge(common, over).map_err(&bad)?;
        let lease = common.lease.unwrap_or(DEFAULT_LEASE);
        let connect_timeout = common.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let (tls_files, setup) = (common.tls_files, common.setup.unwrap_or(true));
        let OwnKeys { keys, application_name, rescan, ssl_mode, scope } = OwnKeys::parse(&own).map_err(bad)?;
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
        if config.get_password().is_none() {
            if let Some(password) = libpq_password(&config) {
                config.password(password);
            }
        }
        // Our side of the connection notices a dead server too, also without a ping in flight.
        config
            .application_name(&application_name)
            .connect_timeout(connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5).min(lease / 3))
            .tcp_user_timeout(lease);
        if rescan.is_zero() {
            return Err(bad("rescan must be more than 0".into()));
        }
        tls_files.check().map_err(bad)?;
        // libpq's default is prefer; TLS files given without a mode ask for TLS, fully verified
        // (prefer could fall back to plaintext when the server, or someone in between, says no).
        let ssl_mode = ssl_mode.unwrap_or(if tls_files.is_empty() { SslMode::Prefer } else { SslMode::VerifyFull });
        if ssl_mode == SslMode::Disable && !tls_files.is_empty() {
            return Err(bad("TLS files with sslmode=disable: drop them or ask for TLS (sslmode=verify-full)".into()));
        }
        // A password for another machine is not sent in plaintext because the server (or
        // someone on the path, who can then ask for it in cleartext) declined TLS: `prefer`
        // asks for TLS there; `sslmode=disable` says plaintext is meant.
        let password_abroad = config.get_password().is_some()
            && config.get_hosts().iter().any(|h| matches!(h, Host::Tcp(name) if !crate::tls::is_this_machine(name)));
        let tls_for_password = ssl_mode == SslMode::Prefer && password_abroad;
        config.ssl_mode(match ssl_mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer if !tls_for_password => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        Ok(PgUrl {
            hosts: hosts_of(&config),
            config,
            lease,
            connect_timeout,
            keys,
            rescan,
            ssl_mode,
            tls_files,
            scope,
            setup,
            connections: common.connections.unwrap_or(crate::options::DEFAULT_CONNECTIONS),
            password_abroad,
            shown: crate::redact_url(url),
        })
    }

    /// Warns (once per call) when a password goes to another machine over a connection that
    /// does not verify the server (`sslmode` `disable`, `prefer` or `require` without a CA).
    pub(crate) fn warn_if_unverified(&self) {
        let verified = self.ssl_mode == SslMode::VerifyFull
            || self.ssl_mode == SslMode::VerifyCa
            || (self.ssl_mode == SslMode::Require && self.tls_files.cacert.is_some());
        if self.password_abroad && !verified {
            let host = self.config.get_hosts().iter().find_map(|h| match h {
                Host::Tcp(name) if !crate::tls::is_this_machine(name) => Some(name.clone()),
                _ => None,
            });
            let how = match self.ssl_mode {
                SslMode::Disable => "sslmode=disable: plaintext",
                SslMode::Prefer => "sslmode=prefer (kept to TLS)",
                _ => "sslmode=require without a CA",
            };
            crate::tls::warn_unverified_password(&self.shown, &host.unwrap_or_default(), how, "sslmode=verify-full");
        }
    }

    /// The reason of a failed connect, `reason`, told why when `prefer` insisted on TLS for a
    /// password and the server did not offer it.
    pub(crate) fn explain_refused_tls(&self, reason: String) -> String {
        if self.ssl_mode == SslMode::Prefer && self.password_abroad && reason.contains("does not support TLS") {
            return format!(
                "{reason}: the server did not offer TLS (or someone on the path removed it), and with \
                 sslmode=prefer distlock does not send a password in plaintext to another machine; turn TLS \
                 on at the server (and ask for sslmode=verify-full), or say sslmode=disable to send it anyway"
            );
        }
        reason
    }

    /// The TLS connector of this URL: its files read, the server checked as `sslmode` says.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when a TLS file cannot be read.
    pub(crate) fn tls(&self) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
        Ok(tokio_postgres_rustls::MakeRustlsConnect::new(self.tls_client_config()?))
    }

    /// The TLS client configuration this URL's `sslmode` and files make, as the lock's
    /// connections use it: for distlock's own benchmark, whose floor connects as the lock does.
    /// Hidden and outside semver (it names rustls's type): not for applications.
    #[doc(hidden)]
    pub fn tls_client_config(&self) -> Result<rustls::ClientConfig> {
        use crate::tls::Verify;
        let verify = match self.ssl_mode {
            SslMode::Disable | SslMode::Prefer if self.tls_files.cacert.is_none() => Verify::Nothing,
            SslMode::Require if self.tls_files.cacert.is_none() => Verify::Nothing,
            SslMode::VerifyFull => Verify::Full,
            _ => Verify::Chain,
        };
        let pem = self.tls_files.read()?;
        crate::tls::client_config(&pem, verify)
    }

    /// The session settings of a lock connection: the server ends this session (freeing its
    /// locks) once it has not heard from us for at most the lease, and a backend waiting for a
    /// lock checks every second whether we are still there.
    ///
    /// No statement on a lock connection waits on the server for longer than a sixth of the
    /// lease (`lock_timeout`, see [`PgUrl::statement_bound`]) unless it says so itself (a lock's
    /// wait, on a connection that holds nothing else; a job's transaction): the statements
    /// pipelined behind one include the connection's health check, which must be answered
    /// before the deadline of every lock on it.
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
             SET lock_timeout = {}; \
             SET synchronous_commit = off; SET default_transaction_isolation = 'read committed'; \
             SET idle_session_timeout = 0; SET idle_in_transaction_session_timeout = 0",
            bound.as_millis(),
            self.statement_bound().as_millis()
        )
    }

    /// The longest a statement on a shared lock connection may wait for a server lock (a job's
    /// `CREATE TABLE`, an election's announcement waiting on another's row, a try's token
    /// waiting on the fencing guard): a sixth of the lease, the health checks' period. A health
    /// check sent behind such a statement is answered at most that late, and the connection's
    /// deadline is never nearer than five sixths of the lease (less the margin) after the check
    /// before it was sent.
    pub(crate) fn statement_bound(&self) -> Duration {
        (self.server_bound() / 6).max(Duration::from_millis(1))
    }

    /// The soonest the server may end a session it has not heard from, counted from the last
    /// request it received: the keepalive path (idle + count × interval, whole seconds) or
    /// `tcp_user_timeout`, both set to at most the lease.
    pub(crate) fn server_bound(&self) -> Duration {
        Duration::from_secs(self.lease.as_secs())
    }
}

/// The keys of a `postgres://` URL's query beside the common ones.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "lease",
    keys: &[
        crate::options::Key::new("keys", "distributedlock|raw"),
        crate::options::Key::new("application_name", ""),
        crate::options::Key::new("rescan", ""),
        crate::options::Key::new("lock_scope", "session|transaction"),
        crate::options::Key::new("sslmode", "disable|prefer|require|verify-ca|verify-full"),
    ],
    tls: crate::options::TlsKeys::Files(&[("sslrootcert", "cacert"), ("sslcert", "cert"), ("sslkey", "key")]),
    connections: crate::options::ConnectionKeys::Shared,
    pairs_need_values: false,
};

/// The values of a `postgres://` URL's own keys (see [`QUERY`]).
struct OwnKeys {
    keys: KeyScheme,
    application_name: String,
    rescan: Duration,
    ssl_mode: Option<SslMode>,
    scope: LockScope,
}

impl OwnKeys {
    /// Reads the own keys of a URL, in its order.
    fn parse(own: &[crate::options::Pair<'_>]) -> std::result::Result<OwnKeys, String> {
        let (mut keys, mut application_name) = (KeyScheme::DistributedLock, "distlock".to_string());
        let (mut rescan, mut ssl_mode, mut scope) = (Duration::from_millis(500), None, LockScope::Session);
        for pair in own {
            let v = pair.value;
            match pair.name {
                "sslmode" => ssl_mode = Some(ssl_mode_of(v)?),
                "keys" => {
                    keys = match v {
                        "distributedlock" => KeyScheme::DistributedLock,
                        "raw" => KeyScheme::Raw,
                        _ => return Err(format!("keys={v}: use keys=distributedlock (the default) or keys=raw")),
                    }
                }
                "application_name" => application_name = v.to_string(),
                "lock_scope" => {
                    scope = match v {
                        "session" => LockScope::Session,
                        "transaction" => LockScope::Transaction,
                        _ => {
                            return Err(format!(
                                "lock_scope={v}: use session (the default) or transaction (behind a transaction pooler)"
                            ))
                        }
                    }
                }
                _ => rescan = pair.duration()?,
            }
        }
        Ok(OwnKeys { keys, application_name, rescan, ssl_mode, scope })
    }
}

/// libpq's `sslmode` value `v`.
fn ssl_mode_of(v: &str) -> std::result::Result<SslMode, String> {
    match v {
        "disable" => Ok(SslMode::Disable),
        "prefer" => Ok(SslMode::Prefer),
        "require" => Ok(SslMode::Require),
        "verify-ca" => Ok(SslMode::VerifyCa),
        "verify-full" => Ok(SslMode::VerifyFull),
        "allow" => Err("sslmode=allow (plaintext first) is not supported: use prefer or disable".into()),
        _ => Err(format!("sslmode={v}: use disable, prefer, require, verify-ca or verify-full")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_match_as_libpq_reads_them() {
        let file = "# comment\n\
                    db.internal:5432:other:app:wrong-db\n\
                    db.internal:*:jobs:app:pa\\:ss\\\\word\n\
                    *:*:*:*:fallback\n";
        assert_eq!(pgpass_lookup(file, ["db.internal", "5433", "jobs", "app"]).as_deref(), Some("pa:ss\\word"));
        assert_eq!(pgpass_lookup(file, ["db.internal", "5432", "other", "app"]).as_deref(), Some("wrong-db"));
        assert_eq!(pgpass_lookup(file, ["elsewhere", "5432", "jobs", "app"]).as_deref(), Some("fallback"));
        assert_eq!(pgpass_lookup("h:1:d:u\n", ["h", "1", "d", "u"]), None, "four fields: no password");
        assert_eq!(pgpass_lookup("h\\:x:1:d:u:pw\n", ["h:x", "1", "d", "u"]).as_deref(), Some("pw"));
    }

    #[test]
    fn ssl_modes_as_libpq_and_tls_files_ask_for_the_full_check() {
        let mode = |q: &str| PgUrl::parse(&format!("postgres://u@h/db?{q}")).map(|u| u.ssl_mode);
        assert_eq!(mode("").unwrap(), SslMode::Prefer);
        assert_eq!(mode("sslrootcert=/ca.pem").unwrap(), SslMode::VerifyFull);
        assert_eq!(mode("cert=/c.pem&key=/k.pem").unwrap(), SslMode::VerifyFull);
        assert_eq!(mode("sslmode=require&sslrootcert=/ca.pem").unwrap(), SslMode::Require);
        // The accessor says the mode in force: prefer is kept to TLS for a password abroad.
        let in_force = |url: &str| PgUrl::parse(url).unwrap().ssl_mode();
        assert_eq!(in_force("postgres://u:pw@127.0.0.1/db"), SslMode::Prefer);
        assert_eq!(in_force("postgres://u:pw@db.example/db"), SslMode::Require);
        assert_eq!(in_force("postgres://u:pw@db.example/db?sslmode=disable"), SslMode::Disable);
        for (q, says) in
            [("sslmode=allow", "allow"), ("sslmode=disable&cacert=/ca.pem", "disable"), ("sslmode=x", "sslmode=x")]
        {
            let e = mode(q).unwrap_err().to_string();
            assert!(e.contains(says), "{q}: {e}");
        }
    }

    #[test]
    fn accessors_say_the_servers_login_and_database() {
        let u = PgUrl::parse("postgres://app:p%40ss@h1:5433,[::1]:5434/jobs?application_name=orders").unwrap();
        assert_eq!(u.hosts(), ["h1:5433", "[::1]:5434"]);
        assert_eq!((u.user(), u.password(), u.database()), ("app", Some(&b"p@ss"[..]), "jobs"));
        assert_eq!(u.application_name(), "orders");
        assert!(!format!("{u} {u:?}").contains("p@ss"), "{u:?}");
        let d = PgUrl::parse("postgres://h1,h2:6000/x").unwrap();
        assert_eq!(d.hosts(), ["h1:5432", "h2:6000"]);
        assert_eq!((d.user(), d.application_name()), ("postgres", "distlock"));
        assert_eq!(PgUrl::parse("postgres://u@h").unwrap().database(), "u");
    }

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
    fn names_map_to_keys_as_distributedlock_maps_them() {
        let dl = |n: &str| KeyScheme::DistributedLock.key(n).unwrap();
        // Longer than 9 characters, or not ASCII: SHA-1's first 8 bytes, little-endian
        // (SHA-1("abcdefghij") = d68c19a0 a345b7ea ...).
        assert_eq!(
            dl("abcdefghij"),
            AdvisoryKey::Single(i64::from_le_bytes([0xd6, 0x8c, 0x19, 0xa0, 0xa3, 0x45, 0xb7, 0xea]))
        );
        assert_eq!(dl("锁/订单"), AdvisoryKey::Single(-8107378560486475100));
        // Packed ASCII: "" would be 0 then 63 one bits; "a" is 1100001, 0, then 56 one bits.
        assert_eq!(dl("a"), AdvisoryKey::Single(((0x61u64 << 57) | ((1u64 << 56) - 1)) as i64));
        assert_eq!(
            dl("abcdefghi"),
            AdvisoryKey::Single(("abcdefghi".bytes().fold(0u64, |k, c| (k << 7) | c as u64) << 1) as i64)
        );
        // Hex forms, either case; a non-hex 16-character name is hashed.
        assert_eq!(dl("FFFFFFFFFFFFFFFE"), AdvisoryKey::Single(-2));
        assert_eq!(dl("80000000,00000001"), AdvisoryKey::Pair(i32::MIN, 1));
        assert!(matches!(dl("ffffffffffffffzz"), AdvisoryKey::Single(_)));
        assert_ne!(dl("ffffffffffffffzz"), dl("ffffffffffffffff"));
        assert_eq!(dl("80000000,00000001").to_string(), "80000000,00000001");
        assert!(KeyScheme::DistributedLock.key("").is_err());
        let e = KeyScheme::DistributedLock.key("646C6F63,6b736571").unwrap_err().to_string();
        assert!(e.contains("reserved"), "{e}");
    }

    #[test]
    fn bad_urls_are_named() {
        crate::assert_refused(
            PgUrl::parse,
            &[
                ("postgres://127.0.0.1/x?lease=1s", "lease"),
                ("postgres://127.0.0.1/x?keys=md5", "keys=md5"),
                ("postgres:///x", "no host"),
                ("mysql://127.0.0.1/x", "postgres://"),
                ("postgres://127.0.0.1/x?lease=soon", "soon"),
                ("postgres://127.0.0.1/x?connections=0", "connections=0"),
                ("postgres://127.0.0.1/x?connections=many", "1 to 1000"),
            ],
        );
        let e = PgUrl::parse("postgres://u:hunter2@127.0.0.1/x?nope=1").unwrap_err().to_string();
        assert!(!e.contains("hunter2") && e.contains("nope"), "{e}");
    }
}

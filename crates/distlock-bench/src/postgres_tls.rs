//! The PostgreSQL floor's own connection, made as distlock makes the lock's: the URL's server,
//! login and database, and its TLS checked as distlock checks it (libpq's `sslmode` in force, the
//! URL's CA, else the system's roots, and its client certificate). distlock keeps its driver's
//! types out of its API, so the bench makes this connection itself, from the URL's accessors and
//! the TLS configuration the library makes (a hidden hook, outside semver).

use distlock::postgres::{PgUrl, SslMode};

/// The connection settings of `url` (parsed as `parsed`): the URL's server, login and database as
/// tokio-postgres reads them (as distlock does), the user, password and database distlock uses
/// (its defaults, and libpq's password file), and the `sslmode` distlock has in force.
pub fn config(url: &str, parsed: &PgUrl) -> anyhow::Result<tokio_postgres::Config> {
    use tokio_postgres::config::SslMode as Driver;
    let rest = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")).unwrap_or(url);
    let base = rest.split('?').next().unwrap_or(rest);
    let mut config: tokio_postgres::Config = format!("postgresql://{base}").parse()?;
    config
        .user(parsed.user())
        .dbname(parsed.database())
        .application_name("distlock-bench")
        .connect_timeout(parsed.connect_timeout());
    if let Some(password) = parsed.password() {
        config.password(password);
    }
    config.ssl_mode(match parsed.ssl_mode() {
        SslMode::Disable => Driver::Disable,
        SslMode::Prefer => Driver::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Driver::Require,
    });
    Ok(config)
}

/// The TLS connector of `parsed`: the client configuration distlock's own connections use (its
/// `sslmode`, CA, client certificate; the same checks), from the library's hidden hook for this.
pub fn connector(parsed: &PgUrl) -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(parsed.tls_client_config()?))
}

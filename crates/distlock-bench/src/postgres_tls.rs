//! The PostgreSQL floor's own connection, made as distlock makes the lock's: the URL's server,
//! login and database, and its TLS checked as distlock checks it (libpq's `sslmode` in force, the
//! URL's CA, else the system's roots, and its client certificate). distlock keeps its driver's
//! types out of its API, so the bench makes this connection itself, from the URL's accessors.

use distlock::postgres::{PgUrl, SslMode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;

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

/// The TLS connector of `parsed`, checking what distlock checks: the chain and the name with
/// `verify-full`; the chain only with `verify-ca`, or with a CA given under a weaker mode (as libpq
/// does); nothing but the handshake's signatures otherwise.
pub fn connector(parsed: &PgUrl) -> anyhow::Result<tokio_postgres_rustls::MakeRustlsConnect> {
    let files = parsed.tls_files();
    let mode = parsed.ssl_mode();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = if mode == SslMode::VerifyFull || mode == SslMode::VerifyCa || files.cacert.is_some() {
        let mut roots = rustls::RootCertStore::empty();
        match &files.cacert {
            Some(ca) => {
                for cert in CertificateDer::pem_file_iter(ca)? {
                    roots.add(cert?)?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert); // a system root rustls cannot use is skipped
                }
            }
        }
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
        if mode == SslMode::VerifyFull {
            builder.with_webpki_verifier(webpki)
        } else {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
        }
    } else {
        let algorithms = provider.signature_verification_algorithms;
        builder.dangerous().with_custom_certificate_verifier(Arc::new(Unverified(algorithms)))
    };
    let config = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key)?)?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Checks the chain to a trusted CA, not the name (`verify-ca`).
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Checks nothing but the handshake's signatures (`prefer` or `require` without a CA).
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

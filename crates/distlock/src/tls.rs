//! TLS settings every network backend takes the same way: the CA that verifies the server, and
//! the client certificate and key for a server that asks for one (mutual TLS). Their URL keys are
//! etcdctl's flag names, `cacert`, `cert` and `key`, in every scheme (each backend also takes its
//! own client's names for them, such as libpq's `sslrootcert`); `distlock --cacert --cert --key`
//! put them in any URL through [`ConnectOptions`](crate::ConnectOptions).
//!
//! A URL asks for TLS by its scheme (`rediss://`, `etcds://`), its mode (`sslmode=`, `ssl-mode=`)
//! or by naming a TLS file; the server's certificate is then verified by default: against
//! `cacert` when given, else against the system's roots, and its name against the URL's host.
//! Checking less is only possible through the backend's own modes (libpq's `require`, MySQL's
//! `REQUIRED`…). Files are read when connecting; an unreadable or malformed one is an error
//! naming the file, never a silent downgrade.
//!
//! The TLS stack is rustls (with the *ring* provider) for the whole crate: every client library
//! distlock builds on can use it, it needs no system library at build or run time, and one stack
//! means one verification behaviour on every backend.

use crate::{Error, Result};
use std::path::PathBuf;

/// The TLS files of a URL (see the module's docs).
///
/// # Examples
///
/// ```
/// use distlock::tls::TlsFiles;
/// let mut files = TlsFiles::default();
/// assert!(files.take("cacert", "/etc/ssl/ca.pem", &[]).unwrap());
/// assert!(!files.take("lease", "5s", &[]).unwrap());
/// assert_eq!(files.cacert.as_deref(), Some(std::path::Path::new("/etc/ssl/ca.pem")));
/// assert!(files.take("cert", "/c.pem", &[]).is_ok());
/// assert!(files.check().unwrap_err().contains("key"), "a certificate needs its key");
/// ```
#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct TlsFiles {
    /// PEM file of the CA certificates that verify the server (default: the system's roots).
    pub cacert: Option<PathBuf>,
    /// PEM file of the client certificate (chain), for servers that ask for one.
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key: Option<PathBuf>,
}

/// The contents of [`TlsFiles`], read.
#[derive(Clone)]
pub(crate) struct TlsPem {
    /// The CA certificates (PEM), if a CA file was given.
    pub(crate) ca: Option<Vec<u8>>,
    /// The client certificate and key (PEM), if given.
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Takes the URL query pair `key=value` if `key` is `cacert`, `cert` or `key`, or an alias
    /// of one (`(alias, name)` pairs); `Ok(false)` for any other key.
    ///
    /// # Errors
    ///
    /// An empty value, or a file given twice (under two names).
    pub fn take(&mut self, key: &str, value: &str, aliases: &[(&str, &str)]) -> std::result::Result<bool, String> {
        let name = aliases.iter().find(|(alias, _)| *alias == key).map_or(key, |(_, name)| *name);
        let slot = match name {
            "cacert" => &mut self.cacert,
            "cert" => &mut self.cert,
            "key" => &mut self.key,
            _ => return Ok(false),
        };
        if value.is_empty() {
            return Err(format!("{key} needs a file's path"));
        }
        if slot.is_some() {
            return Err(format!("{key}: the {name} file is given twice"));
        }
        *slot = Some(PathBuf::from(value));
        Ok(true)
    }

    /// The name of the first file given (`cacert`, `cert`, `key`), for a message.
    pub(crate) fn first_given(&self) -> Option<&'static str> {
        [("cacert", &self.cacert), ("cert", &self.cert), ("key", &self.key)]
            .into_iter()
            .find_map(|(name, path)| path.as_ref().map(|_| name))
    }

    /// Whether no file is given.
    pub fn is_empty(&self) -> bool {
        self.cacert.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// Checks that a client certificate comes with its key and a key with its certificate.
    ///
    /// # Errors
    ///
    /// What is missing, in words.
    pub fn check(&self) -> std::result::Result<(), String> {
        match (&self.cert, &self.key) {
            (Some(_), None) => Err("a client certificate (cert) needs its private key (key)".into()),
            (None, Some(_)) => Err("a private key (key) needs its client certificate (cert)".into()),
            _ => Ok(()),
        }
    }

    /// The files as URL query pairs (`cacert=…`), for showing a URL.
    pub fn query_pairs(&self) -> Vec<String> {
        [("cacert", &self.cacert), ("cert", &self.cert), ("key", &self.key)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|p| format!("{k}={}", p.display())))
            .collect()
    }

    /// Reads the files.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the file that cannot be read or holds no PEM data.
    pub(crate) fn read(&self) -> Result<TlsPem> {
        let read = |what: &'static str, path: &PathBuf, label: &str| -> Result<Vec<u8>> {
            let bad = |reason: String| Error::InvalidArgument { what, reason };
            let data = std::fs::read(path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
            let text = String::from_utf8_lossy(&data);
            if !text.contains("-----BEGIN ") || (!label.is_empty() && !text.contains(label)) {
                return Err(bad(format!(
                    "{} holds no PEM {}",
                    path.display(),
                    if label.is_empty() { "data".to_string() } else { label.trim_end_matches('-').to_lowercase() }
                )));
            }
            Ok(data)
        };
        self.check().map_err(|reason| Error::InvalidArgument { what: "TLS files", reason })?;
        let ca = match &self.cacert {
            Some(p) => Some(read("CA certificate file (cacert)", p, "CERTIFICATE-----")?),
            None => None,
        };
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((
                read("client certificate file (cert)", c, "CERTIFICATE-----")?,
                read("client key file (key)", k, "PRIVATE KEY-----")?,
            )),
            _ => None,
        };
        Ok(TlsPem { ca, identity })
    }
}

/// How much of the server's certificate a connection checks (libpq's and MySQL's modes map here).
#[cfg(feature = "_tls-client")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verify {
    /// The chain to a trusted CA and the host's name (`verify-full`, `VERIFY_IDENTITY`): the
    /// default of every TLS URL of distlock.
    Full,
    /// The chain only (`verify-ca`, `VERIFY_CA`): any certificate the CA signed.
    Chain,
    /// Nothing (`require`/`prefer` without a CA, as libpq does): encryption without knowing
    /// who answers. Only where the URL says so.
    Nothing,
}

/// A rustls client configuration: the CA of `pem` (else the system's roots) checked as `verify`
/// says, and the client certificate of `pem` if any.
#[cfg(feature = "_tls-client")]
pub(crate) fn client_config(pem: &TlsPem, verify: Verify) -> Result<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::sync::Arc;
    let bad = |what: &'static str, reason: String| Error::InvalidArgument { what, reason };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS settings", e.to_string()))?;
    let builder = if verify == Verify::Nothing {
        let algorithms = provider.signature_verification_algorithms;
        builder.dangerous().with_custom_certificate_verifier(Arc::new(Unverified(algorithms)))
    } else {
        let webpki = webpki_verifier(pem, provider)?;
        match verify {
            Verify::Chain => builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(webpki))),
            _ => builder.with_webpki_verifier(webpki),
        }
    };
    match &pem.identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| bad("client certificate file (cert)", e.to_string()))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad("client key file (key)", e.to_string()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad("client certificate and key (cert, key)", e.to_string()))
        }
    }
}

/// The standard verifier: chains to the CA of `pem`, else to the system's roots.
#[cfg(feature = "_tls-client")]
fn webpki_verifier(
    pem: &TlsPem,
    provider: std::sync::Arc<rustls::crypto::CryptoProvider>,
) -> Result<std::sync::Arc<rustls::client::WebPkiServerVerifier>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let bad = |what: &'static str, reason: String| Error::InvalidArgument { what, reason };
    let mut roots = rustls::RootCertStore::empty();
    match &pem.ca {
        Some(ca) => {
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| bad("CA certificate file (cacert)", e.to_string()))?;
                roots.add(cert).map_err(|e| bad("CA certificate file (cacert)", e.to_string()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert); // a system root rustls cannot use is skipped, as browsers do
            }
            if roots.is_empty() {
                return Err(bad("TLS roots", "no cacert given and no usable system root certificate found".into()));
            }
        }
    }
    rustls::client::WebPkiServerVerifier::builder_with_provider(std::sync::Arc::new(roots), provider)
        .build()
        .map_err(|e| bad("CA certificate file (cacert)", e.to_string()))
}

/// Checks the chain to a trusted CA, not the name (`verify-ca`).
#[cfg(feature = "_tls-client")]
#[derive(Debug)]
struct ChainOnly(std::sync::Arc<rustls::client::WebPkiServerVerifier>);

/// Checks nothing but the handshake's signatures (`require` without a CA).
#[cfg(feature = "_tls-client")]
#[derive(Debug)]
struct Unverified(rustls::crypto::WebPkiSupportedAlgorithms);

#[cfg(feature = "_tls-client")]
impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(feature = "_tls-client")]
impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Whether `host` names this machine: `localhost`, an address of 127.0.0.0/8 or `::1`. Any other
/// name or address counts as another machine (a name is not resolved: what it resolves to can
/// change, and someone on the path can answer for it).
pub(crate) fn is_this_machine(host: &str) -> bool {
    let host = host.trim_matches(['[', ']']);
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The warning for a password sent to another machine over a connection that does not verify
/// the server (`how` names the mode, e.g. `sslmode=prefer`; `verify` the setting that would).
pub(crate) fn warn_unverified_password(url: &str, host: &str, how: &str, verify: &str) {
    tracing::warn!(
        url,
        "the password goes to {host} over a connection that does not verify the server ({how}): \
         someone on the path could answer in its place and take it; ask for {verify} with the server's CA"
    );
}

/// `reason` (a connection error's text) with the likely cause added when it is a TLS failure:
/// an untrusted or misnamed server certificate, a client certificate the server requires, or a
/// plaintext client at a TLS port (`ask_tls` tells how this backend's URL asks for TLS).
pub(crate) fn explain(reason: String, tls: bool, ask_tls: &str) -> String {
    let r = reason.to_lowercase();
    // The specific causes first: OpenSSL (MariaDB's driver may use it) says "certificate verify
    // failed" for each of them, and names the cause after it.
    let hint = if r.contains("notvalidforname")
        || r.contains("not valid for name")
        || r.contains("hostname mismatch")
        || r.contains("ip address mismatch")
    {
        "the server's certificate does not name the host connected to: connect by a name (or address) it lists"
    } else if r.contains("expired") && r.contains("cert") {
        "the server's certificate has expired (or is not valid yet)"
    } else if r.contains("causedasendentity")
        || ((r.contains("self-signed certificate") || r.contains("self signed certificate"))
            && !r.contains("in certificate chain"))
    {
        "the server's certificate is its own CA (self-signed with CA:TRUE, as `openssl req -x509` makes): \
         distlock does not pin a certificate, even one given as cacert; give the server a certificate \
         (CA:FALSE) signed by a CA, and that CA with cacert"
    } else if r.contains("unknownissuer") || r.contains("unknown issuer") || r.contains("verify failed") {
        "the server's certificate is not signed by a CA trusted here: give the CA that signed it with cacert"
    } else if r.contains("certificaterequired")
        || r.contains("certificate required")
        || r.contains("certificate_required")
        || r.contains("requires a valid client certificate")
    {
        "the server requires a client certificate: give cert and key"
    } else if r.contains("alert") && (r.contains("badcertificate") || r.contains("bad certificate")) {
        "the server refused this client's certificate, or wanted one: give cert and key, signed by a CA the server trusts"
    } else if tls && (r.contains("corrupt message") || r.contains("invalidcontenttype") || r.contains("wrong version"))
    {
        "the server did not answer in TLS: is this its TLS port?"
    } else if !tls
        && (r.contains("reset by peer")
            || r.contains("unexpected eof")
            || r.contains("broken pipe")
            || r.contains("no encryption")
            || r.contains("ssl required")
            || r.contains("secure transport")
            // MariaDB refuses a plaintext login of a user made REQUIRE SSL as any bad login.
            || r.contains("access denied"))
    {
        return format!("{reason} (if the server takes TLS only, ask for TLS: {ask_tls})");
    } else {
        return reason;
    };
    format!("{reason} ({hint})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_localhost_and_loopback_addresses_are_this_machine() {
        for host in ["localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "::1", "[::1]"] {
            assert!(is_this_machine(host), "{host}");
        }
        for host in ["0.0.0.0", "10.0.0.1", "db.example.com", "localhost.example.com", "::", "::ffff:10.0.0.1"] {
            assert!(!is_this_machine(host), "{host}");
        }
    }

    #[test]
    fn aliases_map_to_the_three_files_and_unreadable_files_are_named() {
        let mut f = TlsFiles::default();
        assert!(f.take("sslrootcert", "/no/such/ca.pem", &[("sslrootcert", "cacert")]).unwrap());
        assert!(f.take("cacert", "/x", &[]).unwrap_err().contains("twice"));
        assert!(f.take("cert", "", &[]).unwrap_err().contains("path"));
        let Err(e) = f.read() else { panic!("read a missing file") };
        assert!(e.to_string().contains("/no/such/ca.pem"), "{e}");
        let dir = std::env::temp_dir().join(format!("distlock-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("ca.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let f = TlsFiles { cacert: Some(not_pem.clone()), ..Default::default() };
        let Err(e) = f.read() else { panic!("read a file that is not PEM") };
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! What a production server needs at its door: TLS (rustls with the *ring* provider, as the
//! library's clients use) and the digest logins it knows.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
pub use tokio_rustls::rustls::ServerConfig;

/// A TLS server configuration from PEM text: the server's certificate chain and key, and, when
/// given, the CA certificates that client certificates must chain to (then every client must
/// present one: ZooKeeper's `ssl.clientAuth=need`).
///
/// # Errors
///
/// A message naming what does not parse or does not fit (a key that is not the certificate's).
///
/// # Examples
///
/// ```
/// let e = distlock_server::tls::server_config(b"not PEM", b"", None).unwrap_err();
/// assert!(e.contains("certificate"), "{e}");
/// ```
pub fn server_config(cert: &[u8], key: &[u8], client_ca: Option<&[u8]>) -> Result<Arc<ServerConfig>, String> {
    use tokio_rustls::rustls;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("server certificate: {e}"))?;
    if chain.is_empty() {
        return Err("server certificate: no PEM certificate found".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("server key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca) {
                roots.add(c.map_err(|e| format!("client CA: {e}"))?).map_err(|e| format!("client CA: {e}"))?;
            }
            if roots.is_empty() {
                return Err("client CA: no PEM certificate found".into());
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).map_err(|e| format!("server certificate and key: {e}"))?;
    Ok(Arc::new(config))
}

/// Reads a users file: one login per line, `user:BASE64(SHA1(user:password))` (ZooKeeper's
/// digest form), blank lines and `#` comments skipped.
///
/// # Errors
///
/// A message naming the line that is not of that form.
///
/// # Examples
///
/// ```
/// let users = distlock_server::tls::read_users("# logins\napp:Jp1x9ZcVj8FxmTqQqmFOeb8FHkY=\n").unwrap();
/// assert!(users.contains_key("app"));
/// assert!(distlock_server::tls::read_users("app\n").unwrap_err().contains("line 1"));
/// ```
pub fn read_users(text: &str) -> Result<HashMap<String, String>, String> {
    let mut users = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("line {}: expected user:BASE64(SHA1(user:password))", n + 1);
        let (user, digest) = line.split_once(':').ok_or_else(bad)?;
        if user.is_empty() || digest.len() != 28 || !digest.ends_with('=') {
            return Err(bad());
        }
        users.insert(user.to_string(), line.to_string());
    }
    Ok(users)
}

/// `user:password` as the users file holds it (what `addauth digest user:password` proves).
///
/// # Examples
///
/// ```
/// let line = distlock_server::tls::digest_line("app", "secret");
/// assert!(line.starts_with("app:") && line.len() == "app:".len() + 28);
/// ```
pub fn digest_line(user: &str, password: &str) -> String {
    crate::state::digest_id(&format!("{user}:{password}"))
}

//! Whether anything listens at a server's addresses: a connect that every address refuses is
//! reported at once, rather than after the connect timeout (ZooKeeper's and etcd's clients
//! retry a refused connection until then).

use std::time::Duration;

/// Resolves when every one of `hosts` (`host:port`) refuses a TCP connection or cannot be
/// resolved, with the reasons; never while any accepts or stays silent (a server may be starting,
/// or a firewall may drop: those are the connect timeout's). Waits 100 ms first, so a connect
/// that succeeds at once wins.
pub(crate) async fn nobody_listens(hosts: &[String]) -> String {
    // The deterministic simulation's hosts have no real sockets: a probe would resolve the
    // simulated names on the real network (seconds, and an outcome from outside the seed).
    #[cfg(distlock_sim)]
    if true {
        return std::future::pending().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let probes = hosts.iter().map(|host| async move {
        match tokio::net::TcpStream::connect(host.as_str()).await {
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                Some((format!("{host} refused the connection"), true))
            }
            Err(e) => Some((format!("{host}: {e}"), false)),
        }
    });
    let failures: Option<Vec<(String, bool)>> = futures::future::join_all(probes).await.into_iter().collect();
    match failures {
        Some(reasons) => {
            // "Is the server running?" only where something answered that nothing listens.
            let refused = reasons.iter().all(|(_, refused)| *refused);
            let text: Vec<String> = reasons.into_iter().map(|(r, _)| r).collect();
            let hint = if refused { " (is the server running?)" } else { "" };
            format!("{}{hint}", text.join("; "))
        }
        None => std::future::pending().await,
    }
}

/// What a client that retries a failed TLS handshake until its connect timeout (ZooKeeper's and
/// etcd's both do, and only log why) cannot say. After `after` (a connect that succeeds by then
/// wins), tries one handshake of its own to each of `hosts` (`host:port`), and resolves when every
/// one fails for a definite cause: an untrusted, misnamed, expired or CA certificate, a client
/// certificate the server requires, a plaintext port asked for TLS or (`tls` is `None`: the URL
/// asked in plaintext) a port that answers in TLS. Never resolves otherwise (a host that accepts
/// the handshake, or is down or silent, leaves the client's own outcome to stand).
///
/// `secure` is how this backend's URL asks for TLS (`zks://`), for the hint. `greeting` is how a
/// server that speaks in plaintext before taking up TLS opens (NATS: `INFO `): the probe reads
/// that line before its handshake, as the backend's own client does.
pub(crate) async fn tls_trouble(
    hosts: &[String],
    tls: Option<&crate::tls::TlsFiles>,
    secure: &str,
    greeting: Option<&[u8]>,
    after: Duration,
) -> String {
    tokio::time::sleep(after).await;
    let pem = match tls.map(|f| f.read()) {
        Some(Ok(pem)) => Some(pem),
        Some(Err(e)) => return e.to_string(),
        None => None,
    };
    let probes = hosts.iter().map(|host| tls_trouble_at(host, pem.as_ref(), secure, greeting));
    let reasons: Option<Vec<String>> = futures::future::join_all(probes).await.into_iter().collect();
    match reasons {
        Some(reasons) if !reasons.is_empty() => reasons.join("; "),
        _ => std::future::pending().await,
    }
}

/// [`tls_trouble`] at one host: the definite cause, or `None`.
async fn tls_trouble_at(
    host: &str,
    pem: Option<&crate::tls::TlsPem>,
    secure: &str,
    greeting: Option<&[u8]>,
) -> Option<String> {
    use crate::tls::Verify;
    use tokio::io::AsyncReadExt;
    let bound = Duration::from_secs(5);
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h).trim_matches(['[', ']']);
    let none = crate::tls::TlsPem { ca: None, identity: None };
    let config =
        crate::tls::client_config(pem.unwrap_or(&none), if pem.is_some() { Verify::Full } else { Verify::Nothing })
            .ok()?;
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).ok()?;
    let mut stream = tokio::time::timeout(bound, tokio::net::TcpStream::connect(host)).await.ok()?.ok()?;
    if let Some(greeting) = greeting {
        if !plaintext_greeting(&mut stream, greeting).await {
            return None;
        }
    }
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let handshake = tokio::time::timeout(bound, connector.connect(server_name, stream)).await.ok()?;
    let definite = |text: String| {
        let explained = crate::tls::explain(text.clone(), true, secure);
        (explained != text).then_some(explained)
    };
    if pem.is_none() {
        // A server that finishes a handshake, or sends a TLS alert, speaks TLS there.
        return match handshake {
            Ok(_) => {
                Some(format!("{host} answered in TLS: it is a TLS port (write {secure}, with cacert, cert and key)"))
            }
            Err(e) if e.to_string().contains("alert") => Some(format!(
                "{host} answered in TLS ({e}): it is a TLS port (write {secure}, with cacert, cert and key)"
            )),
            Err(_) => None,
        };
    }
    match handshake {
        Ok(mut tls) => {
            // With TLS 1.3 the server refuses a missing client certificate after the handshake.
            let mut byte = [0u8; 1];
            match tokio::time::timeout(Duration::from_millis(500), tls.read(&mut byte)).await {
                Ok(Err(e)) => definite(format!("TLS with {host}: {e}")),
                _ => None,
            }
        }
        // A listening server that closes the handshake without a word of TLS.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Some(format!(
            "{host} closed the connection in the TLS handshake (the server did not answer in TLS: is this its TLS port? a plaintext port does that)"
        )),
        Err(e) => definite(format!("TLS handshake with {host}: {e}")),
    }
}

/// Reads a server's plaintext opening line (up to `\r\n`) if it sends one within half a second:
/// `true` if it sent none (it may wait for a handshake) or one that starts with `greeting`,
/// `false` if it said something else (not the server the probe knows how to ask).
async fn plaintext_greeting(stream: &mut tokio::net::TcpStream, greeting: &[u8]) -> bool {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    let mut chunk = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while !line.ends_with(b"\r\n") && line.len() < 64 * 1024 {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => line.extend_from_slice(&chunk[..n]),
            // Closed or failed: nothing the handshake could tell.
            Ok(_) => return false,
            Err(_) => break,
        }
    }
    line.is_empty() || line.starts_with(greeting)
}

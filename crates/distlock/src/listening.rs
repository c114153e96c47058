//! Whether anything listens at a server's addresses: a connect that every address refuses is
//! reported at once, rather than after the connect timeout (ZooKeeper's and etcd's clients
//! retry a refused connection until then).

use std::time::Duration;

/// Resolves when every one of `hosts` (`host:port`) refuses a TCP connection or cannot be
/// resolved, with the reasons; never while any accepts or stays silent (a server may be starting,
/// or a firewall may drop: those are the connect timeout's). Waits 100 ms first, so a connect
/// that succeeds at once wins.
pub(crate) async fn nobody_listens(hosts: &[String]) -> String {
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

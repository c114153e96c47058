//! `distlock serve`: the embedded ZooKeeper-protocol server, standalone.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on: IP:PORT, HOST:PORT or a bare PORT. A bare port listens on loopback
    /// only (127.0.0.1:PORT); give 0.0.0.0:PORT to listen on every interface. A HOST listens on
    /// the first address it resolves to that can be bound. Port 0 picks a free port (see
    /// --addr-file).
    #[arg(long, value_name = "ADDR", value_parser = listen_arg, default_value = "127.0.0.1:2181")]
    listen: Listen,
    /// Keep a transaction log and snapshots here (created if missing), so nodes and sessions
    /// survive a restart. Without it, everything is in memory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// When to fsync the transaction log: always (before each reply) or never (the OS decides).
    #[arg(long, default_value = "always", value_parser = ["always", "never"])]
    fsync: String,
    /// ZooKeeper's tickTime: session timeouts are bounded to 2..20 ticks.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "2s")]
    tick: Duration,
    /// Largest accepted frame in bytes (jute.maxbuffer).
    #[arg(long, default_value_t = 1 << 20)]
    max_frame: usize,
    /// Most simultaneous connections. One refused past it (or past
    /// --max-connections-per-address) reads "distlock-server: too many connections ..." before it
    /// is closed.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Most simultaneous connections from one IP address (ZooKeeper's maxClientCnxns). The
    /// default, a quarter of --max-connections' default, leaves room for the dozens of sessions
    /// tests and benchmarks open over loopback.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections_per_address: u64,
    /// Most watches per session (Throttled past it).
    #[arg(long, default_value_t = 100_000)]
    max_watches: usize,
    /// Most bytes of watched paths per session (Throttled past it).
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    max_watch_bytes_per_session: u64,
    /// Most bytes of watched paths of all sessions together (Throttled past it).
    #[arg(long, value_name = "BYTES", default_value_t = 128 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    max_watch_bytes: u64,
    /// With --data-dir: transactions between snapshots (ZooKeeper's snapCount).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_every: u64,
    /// Write the bound address to this file once listening (for scripts using port 0).
    #[arg(long, value_name = "FILE")]
    addr_file: Option<PathBuf>,
    /// Serve the server's figures at http://ADDR/metrics in the Prometheus text format
    /// (ZooKeeper's metric names where they mean the same). ADDR as for --listen.
    #[arg(long, value_name = "ADDR", value_parser = listen_arg)]
    metrics: Option<Listen>,
    /// With --metrics: write the metrics endpoint's bound address to this file.
    #[arg(long, value_name = "FILE", requires = "metrics")]
    metrics_addr_file: Option<PathBuf>,
    /// Serve TLS only, with this certificate chain (PEM); clients connect with zks://.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require a client certificate signed by these CA certificates (PEM) from every client.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// The digest logins this server knows, one `user:BASE64(SHA1(user:password))` per line
    /// (ZooKeeper's digest form): `addauth digest` with another user or password fails.
    #[arg(long, value_name = "FILE")]
    users: Option<PathBuf>,
    /// Every session must log in (a digest of --users) before anything else; others are closed
    /// with "authentication required".
    #[arg(long, requires = "users")]
    auth_required: bool,
    /// How long a new connection has, from accept, to finish its TLS handshake and send its
    /// connect request; silent or half-sent connections are closed after it.
    #[arg(allow_hyphen_values = true, long, value_name = "DURATION", value_parser = crate::duration_arg, default_value = "10s")]
    handshake_timeout: Duration,
    /// The four-letter words answered, comma-separated, or `*` for all (ZooKeeper's
    /// 4lw.commands.whitelist). `envi` here carries only the version (kazoo reads it before a
    /// transaction); `stat`, `cons` and `dump` name clients and sessions.
    #[arg(long, value_name = "WORDS", value_parser = four_letter_words_arg, default_value = "srvr,ruok,envi")]
    four_letter_words: FourLetterWords,
    /// Most nodes one session may have made that still exist; a create past it fails with
    /// ZooKeeper's QuotaExceeded.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_nodes_per_session: u64,
    /// Most bytes of data the nodes one session made may hold together (QuotaExceeded past it).
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    max_data_per_session: u64,
    /// Most nodes in the whole tree, every session's together (QuotaExceeded past it).
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    max_nodes: u64,
    /// Most bytes of node data in the whole tree (QuotaExceeded past it).
    #[arg(long, value_name = "BYTES", default_value_t = 512 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    max_data: u64,
    /// Let --metrics listen on an address other hosts can reach (it has no authentication), and
    /// answer requests for any Host name (without it: only localhost, 127.0.0.1, [::1] and the
    /// address it listens on, against DNS rebinding).
    #[arg(long)]
    allow_remote: bool,
}

/// `--four-letter-words`: the words, checked.
#[derive(Debug, Clone)]
struct FourLetterWords(Vec<[u8; 4]>);

fn four_letter_words_arg(s: &str) -> Result<FourLetterWords, String> {
    if s.trim() == "*" {
        return Ok(FourLetterWords(distlock_server::FOUR_LETTER_WORDS.to_vec()));
    }
    let known = || {
        distlock_server::FOUR_LETTER_WORDS.iter().map(|w| String::from_utf8_lossy(w).into_owned()).collect::<Vec<_>>()
    };
    let mut words = Vec::new();
    for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let word: [u8; 4] =
            w.as_bytes().try_into().ok().filter(|b| distlock_server::FOUR_LETTER_WORDS.contains(b)).ok_or_else(
                || format!("unknown four-letter word {w:?} (known: {}, or * for all)", known().join(", ")),
            )?;
        words.push(word);
    }
    Ok(FourLetterWords(words))
}

/// Reads a file a flag names; the error names the flag and the file.
fn read_flag_file(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("{flag}: cannot read {}: {e}", path.display()))
}

/// A `--listen` value, checked for form; host names are resolved when binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listen {
    Addr(SocketAddr),
    /// A bare port: loopback.
    Port(u16),
    Host(String, u16),
}

impl std::fmt::Display for Listen {
    /// As given, with what a bare port means.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Addr(a) => write!(f, "{a}"),
            Listen::Port(p) => write!(f, "{p} (127.0.0.1:{p})"),
            Listen::Host(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

/// Parses `--listen`: `PORT` (loopback), `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT`.
pub(crate) fn listen_arg(s: &str) -> Result<Listen, String> {
    const FORMS: &str = "expected PORT, IP:PORT, [IPv6]:PORT or HOST:PORT";
    let port = |p: &str| -> Result<u16, String> {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{p:?} is not a port number ({FORMS})"));
        }
        p.parse::<u16>().map_err(|_| format!("port {p} is out of range (0..=65535)"))
    };
    if s.is_empty() {
        return Err(format!("empty ({FORMS})"));
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Listen::Port(port(s)?));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Listen::Addr(a));
    }
    if s.parse::<IpAddr>().is_ok() {
        return Err(format!("no port ({FORMS}; IPv6 addresses go in brackets, e.g. [::1]:2181)"));
    }
    let Some((host, p)) = s.rsplit_once(':') else {
        return Err(format!("no port ({FORMS})"));
    };
    if host.is_empty() {
        return Err(format!("no host before ':' ({FORMS})"));
    }
    if host.contains(':') || host.starts_with('[') {
        return Err(format!("not an address ({FORMS}; IPv6 addresses go in brackets, e.g. [::1]:2181)"));
    }
    Ok(Listen::Host(host.to_string(), port(p)?))
}

/// Binds `listen`: the address itself, or the first address the host resolves to that binds.
pub(crate) async fn bind(listen: &Listen) -> anyhow::Result<tokio::net::TcpListener> {
    let candidates: Vec<SocketAddr> = match listen {
        Listen::Addr(a) => vec![*a],
        Listen::Port(p) => vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), *p)],
        Listen::Host(host, port) => tokio::net::lookup_host((host.as_str(), *port))
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: cannot resolve {host}: {e}"))?
            .collect(),
    };
    let mut failures = Vec::new();
    for addr in &candidates {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) if candidates.len() == 1 => anyhow::bail!("cannot listen on {listen}: {e}"),
            Err(e) => failures.push(format!("{addr}: {e}")),
        }
    }
    if failures.is_empty() {
        anyhow::bail!("cannot listen on {listen}: the host resolves to no address");
    }
    anyhow::bail!("cannot listen on {listen}: no address it resolves to can be bound ({})", failures.join("; "))
}

/// Why `dir` cannot be the data directory, in words, from the error opening it.
fn data_dir_problem(dir: &Path, e: &std::io::Error) -> String {
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        return "it exists and is not a directory".into();
    }
    if e.kind() == std::io::ErrorKind::NotADirectory {
        // Some ancestor is a file: name it.
        if let Some(a) = dir.ancestors().skip(1).find(|a| std::fs::metadata(a).is_ok_and(|m| !m.is_dir())) {
            return format!("{} is not a directory", a.display());
        }
    }
    e.to_string()
}

/// Writes the bound address to `file` so that a reader never sees half a line: a temporary file
/// next to it, renamed over it.
fn write_addr_file(file: &Path, addr: SocketAddr) -> anyhow::Result<()> {
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, format!("{addr}\n")).and_then(|()| std::fs::rename(&tmp, file)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("cannot write --addr-file {}: {e}", file.display())
    })
}

/// The server's configuration from the flags, each file read and checked.
fn config(args: &ServeArgs) -> anyhow::Result<distlock_server::Config> {
    if args.tick.is_zero() {
        anyhow::bail!("invalid --tick: must be greater than zero");
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let ca = args.tls_client_ca.as_deref().map(|p| read_flag_file("--tls-client-ca", p)).transpose()?;
            let config = distlock_server::tls::server_config(
                &read_flag_file("--tls-cert", cert)?,
                &read_flag_file("--tls-key", key)?,
                ca.as_deref(),
            )
            .map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
            Some(config)
        }
        _ => None,
    };
    let users = match &args.users {
        Some(file) => {
            let text = String::from_utf8_lossy(&read_flag_file("--users", file)?).into_owned();
            let users = distlock_server::tls::read_users(&text)
                .map_err(|e| anyhow::anyhow!("--users {}: {e}", file.display()))?;
            Some(std::sync::Arc::new(users))
        }
        None => None,
    };
    if args.handshake_timeout.is_zero() {
        anyhow::bail!("invalid --handshake-timeout: must be greater than zero");
    }
    Ok(distlock_server::Config {
        tls,
        users,
        auth_required: args.auth_required,
        tick: args.tick,
        max_frame: args.max_frame,
        max_connections: args.max_connections,
        max_watches_per_session: args.max_watches,
        snapshot_every: args.snapshot_every,
        data_dir: args.data_dir.clone(),
        fsync: args.fsync.parse().map_err(anyhow::Error::msg)?,
        handshake_timeout: args.handshake_timeout,
        four_letter_words: args.four_letter_words.0.clone(),
        max_nodes_per_session: usize::try_from(args.max_nodes_per_session).unwrap_or(usize::MAX),
        max_data_per_session: usize::try_from(args.max_data_per_session).unwrap_or(usize::MAX),
        max_connections_per_address: usize::try_from(args.max_connections_per_address).unwrap_or(usize::MAX),
        max_watch_bytes_per_session: usize::try_from(args.max_watch_bytes_per_session).unwrap_or(usize::MAX),
        max_watch_bytes: usize::try_from(args.max_watch_bytes).unwrap_or(usize::MAX),
        max_nodes: usize::try_from(args.max_nodes).unwrap_or(usize::MAX),
        max_data: usize::try_from(args.max_data).unwrap_or(usize::MAX),
        ..Default::default()
    })
}

pub async fn run(args: ServeArgs) -> anyhow::Result<u8> {
    let config = config(&args)?;
    let tls = config.tls.is_some();
    // The data directory first: nothing is bound or announced for a server that cannot start.
    let server = distlock_server::Server::open(config).map_err(|e| match &args.data_dir {
        Some(d) => anyhow::anyhow!("cannot use data directory {}: {}", d.display(), data_dir_problem(d, &e)),
        None => anyhow::anyhow!("cannot start the server: {e}"),
    })?;
    let listener = bind(&args.listen).await?;
    let addr = listener.local_addr()?;
    let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(listen) = &args.metrics {
        let metrics = bind(listen).await.map_err(|e| anyhow::anyhow!("--metrics: {e}"))?;
        let maddr = metrics.local_addr()?;
        crate::only_loopback_unless_allowed("serve --metrics", maddr, args.allow_remote)?;
        if let Some(f) = &args.metrics_addr_file {
            write_addr_file(f, maddr)?;
        }
        crate::shown::say!("distlock serve: metrics on http://{maddr}/metrics");
        tokio::spawn(server.metrics().serve_with(metrics, args.allow_remote, async {
            let _ = metrics_stopped.await;
        }));
    }
    if let Some(f) = &args.addr_file {
        write_addr_file(f, addr)?;
    }
    crate::shown::say!(
        "distlock serve: ZooKeeper protocol on {addr}{}{} ({})",
        if tls { " over TLS only" } else { "" },
        if args.auth_required { ", login required" } else { "" },
        match &args.data_dir {
            Some(d) => format!("data in {}, fsync {}", d.display(), args.fsync),
            None => "in memory".to_string(),
        }
    );
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    server.serve(listener, shutdown).await;
    let _ = metrics_stop.send(());
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_forms() {
        let v4 = |s: &str| Listen::Addr(s.parse().unwrap());
        assert_eq!(listen_arg("2181"), Ok(Listen::Port(2181)));
        assert_eq!(listen_arg("0"), Ok(Listen::Port(0)));
        assert_eq!(listen_arg("0.0.0.0:2181"), Ok(v4("0.0.0.0:2181")));
        assert_eq!(listen_arg("[::1]:0"), Ok(v4("[::1]:0")));
        assert_eq!(listen_arg("localhost:0"), Ok(Listen::Host("localhost".into(), 0)));
        assert_eq!(listen_arg("zk-1.example:2181"), Ok(Listen::Host("zk-1.example".into(), 2181)));
        for bad in
            ["", "70000", "localhost", "localhost:", ":2181", "localhost:http", "::1", "10.0.0.1", "a:b:1", "[::1"]
        {
            assert!(listen_arg(bad).is_err(), "{bad:?} accepted: {:?}", listen_arg(bad));
        }
    }
}

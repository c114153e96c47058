//! A single-node server that speaks the ZooKeeper client protocol (3.5+ as real clients use it):
//! distlock's embedded default, so distlock runs, and Rust code that takes ZooKeeper locks can be
//! tested, with nothing installed.
//!
//! It is one node: no replication, no quorum. Production keeps pointing at a real ZooKeeper
//! ensemble; this server is for single machines, development and tests.
//!
//! # Examples
//!
//! An in-process server for a test (free port, stopped on drop):
//!
//! ```
//! # #[tokio::main] async fn main() {
//! let server = distlock_server::EmbeddedServer::start().await.unwrap();
//! let url = server.url(); // zk://127.0.0.1:PORT
//! assert!(url.starts_with("zk://127.0.0.1:"));
//! # }
//! ```
//!
//! # Layout
//! - `proto`: the wire format (jute records, opcodes, error codes);
//! - `tree`: the data tree and the mutations writes are made of;
//! - `state`: sessions, watches, ACLs and every request, applied one at a time;
//! - `persist`: the transaction log and snapshots for `--data-dir`;
//! - `server`: connections, framing, four-letter words, session and container timers.

pub mod http;
mod metrics;
mod outbox;
pub mod persist;
pub mod proto;
mod server;
mod sim;
mod state;
pub mod tls;

/// The sockets: tokio's, or turmoil's simulated ones in the deterministic simulation (the tests'
/// `--cfg distlock_sim`, never a shipped build).
mod net {
    #[cfg(not(distlock_sim))]
    pub use tokio::net::{TcpListener, TcpStream};
    #[cfg(distlock_sim)]
    pub use turmoil::net::{TcpListener, TcpStream};
}
mod tree;

pub use metrics::Metrics;
use net::TcpListener;
pub use persist::Fsync;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Server settings.
///
/// # Examples
///
/// ```
/// let c = distlock_server::Config { tick: std::time::Duration::from_millis(500), ..Default::default() };
/// assert_eq!(c.max_frame, 1 << 20);
/// ```
#[derive(Clone)]
pub struct Config {
    /// ZooKeeper's tickTime: session timeouts are bounded to 2..20 ticks. Default 2 s.
    pub tick: Duration,
    /// Largest accepted frame (ZooKeeper's jute.maxbuffer). Default 1 MiB.
    pub max_frame: usize,
    /// Most simultaneous connections. Default 1024. A connection refused past it (or past
    /// `max_connections_per_address`) is told so in one plaintext line before it is closed,
    /// `distlock-server: too many connections ...` (before any TLS handshake), which distlock's
    /// client reports.
    pub max_connections: usize,
    /// Most simultaneous connections from one IP address (ZooKeeper's `maxClientCnxns`, 60
    /// there). Default 256, a quarter of the default `max_connections`: one client cannot take
    /// every slot, while the many sessions a single machine opens over loopback (tests,
    /// `distlock bench`'s contended and herd workloads, dozens of sessions) still fit.
    pub max_connections_per_address: usize,
    /// Most watches one session may hold. Default 100,000. Past it (or past either watch byte
    /// limit) a watch-setting request fails with ZooKeeper's Throttled.
    pub max_watches_per_session: usize,
    /// Most bytes of watched paths one session may hold (each watch counts its path's length;
    /// a path may be up to `max_frame` long). Default 8 MiB: a lock client watches a few short
    /// paths, and 8 MiB is still 80,000 watches on 100-byte paths; without it, 100,000 watches
    /// of 1 MiB paths could cost one session 100 GB.
    pub max_watch_bytes_per_session: usize,
    /// Most bytes of watched paths all sessions together may hold. Default 128 MiB: what 16
    /// sessions at their own limit reach, and a bound on what watches can cost the server's
    /// memory however many sessions there are.
    pub max_watch_bytes: usize,
    /// Where to keep the transaction log and snapshots; `None` keeps everything in memory.
    pub data_dir: Option<PathBuf>,
    /// When to fsync the log. Default [`Fsync::Always`].
    pub fsync: Fsync,
    /// Transactions between snapshots. Default 10,000.
    pub snapshot_every: u64,
    /// How often emptied containers and expired TTL nodes are reaped. Default 1 s.
    pub container_check: Duration,
    /// Most reply and event bytes queued for one connection; a client that does not read its
    /// replies is disconnected past it. Default 64 MiB.
    pub max_queued_output: usize,
    /// TLS: when set, every connection must complete this handshake first (no plaintext at all;
    /// four-letter words too go over TLS). See [`tls::server_config`].
    pub tls: Option<Arc<tls::ServerConfig>>,
    /// The digest logins this server knows (user name → `user:BASE64(SHA1(user:password))`, the
    /// form ZooKeeper's `DigestAuthenticationProvider` prints). When set, an `addauth digest`
    /// of any other user or password fails (the client sees AuthFailed) instead of adding an
    /// identity. See [`tls::read_users`].
    pub users: Option<Arc<std::collections::HashMap<String, String>>>,
    /// Every session must log in (a digest of `users`) before any other request; one that does
    /// not gets ZooKeeper's "session closed: authentication required" (-124) and is closed. A
    /// session not logged in by `handshake_timeout` after its connection was accepted (pings
    /// alone do not count) is ended there and then, its connection closed after an AuthFailed
    /// event: it cannot hold a connection slot until it expires.
    pub auth_required: bool,
    /// How long a new connection has, from the moment it is accepted, to finish its TLS handshake
    /// and send its whole connect request (or a four-letter word); it is closed after that.
    /// Default 10 s.
    pub handshake_timeout: Duration,
    /// The four-letter words answered (Apache ZooKeeper's `4lw.commands.whitelist`); any other of
    /// [`FOUR_LETTER_WORDS`] is answered "not in the whitelist". Default `srvr`, `ruok` and
    /// `envi` (which here carries only the version, as `srvr` does; kazoo reads it before a
    /// transaction): `stat`, `cons` and `dump` name clients and sessions.
    pub four_letter_words: Vec<[u8; 4]>,
    /// Most nodes one session may have made that still exist (persistent ones too); a create past
    /// it fails with ZooKeeper's QuotaExceeded. Default 100,000.
    pub max_nodes_per_session: usize,
    /// Most bytes of data the nodes a session made may hold together; a create or set past it fails
    /// with QuotaExceeded. Default 64 MiB.
    pub max_data_per_session: usize,
    /// Most nodes in the whole tree (every session's, and those recovered from `data_dir`); a
    /// create past it fails with QuotaExceeded. Default 1,000,000: ten sessions at their own
    /// quota, and far more than locks need (a node or two per holder or waiter); per-session
    /// quotas alone let many sessions together fill the memory.
    pub max_nodes: usize,
    /// Most bytes of data in the whole tree; a create or set past it fails with QuotaExceeded.
    /// Default 512 MiB: eight sessions at their own quota, and a bound on what node data can cost
    /// the memory (and each snapshot) however many sessions there are.
    pub max_data: usize,
}

/// Every four-letter word the server knows.
pub const FOUR_LETTER_WORDS: &[[u8; 4]] =
    &[*b"ruok", *b"srvr", *b"stat", *b"mntr", *b"conf", *b"envi", *b"isro", *b"wchs", *b"dump", *b"cons"];

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("tick", &self.tick)
            .field("max_frame", &self.max_frame)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_address", &self.max_connections_per_address)
            .field("max_watches_per_session", &self.max_watches_per_session)
            .field("max_watch_bytes_per_session", &self.max_watch_bytes_per_session)
            .field("max_watch_bytes", &self.max_watch_bytes)
            .field("data_dir", &self.data_dir)
            .field("fsync", &self.fsync)
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.as_ref().map(|u| u.len()))
            .field("auth_required", &self.auth_required)
            .field("handshake_timeout", &self.handshake_timeout)
            .field(
                "four_letter_words",
                &self.four_letter_words.iter().map(|w| String::from_utf8_lossy(w)).collect::<Vec<_>>(),
            )
            .field("max_nodes_per_session", &self.max_nodes_per_session)
            .field("max_data_per_session", &self.max_data_per_session)
            .field("max_nodes", &self.max_nodes)
            .field("max_data", &self.max_data)
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tick: Duration::from_millis(2000),
            max_frame: 1 << 20,
            max_connections: 1024,
            max_connections_per_address: 256,
            max_watches_per_session: 100_000,
            max_watch_bytes_per_session: 8 << 20,
            max_watch_bytes: 128 << 20,
            data_dir: None,
            fsync: Fsync::Always,
            snapshot_every: 10_000,
            container_check: Duration::from_secs(1),
            max_queued_output: 64 << 20,
            tls: None,
            users: None,
            auth_required: false,
            handshake_timeout: Duration::from_secs(10),
            four_letter_words: vec![*b"srvr", *b"ruok", *b"envi"],
            max_nodes_per_session: 100_000,
            max_data_per_session: 64 << 20,
            max_nodes: 1_000_000,
            max_data: 512 << 20,
        }
    }
}

/// Builds the server state (recovering from `data_dir` if set).
fn build_state(config: Config) -> std::io::Result<Arc<Mutex<state::State>>> {
    let state = match &config.data_dir {
        Some(dir) => {
            let (p, rec) = persist::Persist::open(dir, config.fsync, config.snapshot_every)?;
            state::State::new(config.clone(), rec.tree, rec.zxid, rec.sessions, Some(p))
        }
        None => state::State::new(config.clone(), tree::Tree::default(), 0, Vec::new(), None),
    };
    Ok(Arc::new(Mutex::new(state)))
}

/// Serves on `listener` until `shutdown` resolves.
///
/// The only errors are those of opening `config.data_dir` (see [`Server::open`]).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:2181").await?;
/// distlock_server::run(listener, Default::default(), async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    Server::open(config)?.serve(listener, shutdown).await;
    Ok(())
}

/// A server whose state is loaded but which does not serve yet.
///
/// Opening first, then binding, lets a program report a data directory it cannot use before it
/// announces an address to anyone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// let config = distlock_server::Config { data_dir: Some("/var/lib/distlock".into()), ..Default::default() };
/// let server = distlock_server::Server::open(config)?; // a bad data directory fails here
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:2181").await?;
/// server.serve(listener, async { tokio::signal::ctrl_c().await.ok(); }).await;
/// # Ok(()) }
/// ```
pub struct Server {
    state: Arc<Mutex<state::State>>,
}

impl Server {
    /// Loads the state: recovers it from `config.data_dir` (created if missing) when set, else
    /// starts empty in memory.
    ///
    /// # Notable errors
    /// The I/O error of creating or reading the data directory, or of opening its transaction
    /// log for writing; a snapshot that does not parse is an error naming the file.
    pub fn open(config: Config) -> std::io::Result<Server> {
        Ok(Server { state: build_state(config)? })
    }

    /// A handle on the server's figures (Prometheus text format), for `/metrics`.
    pub fn metrics(&self) -> Metrics {
        Metrics::new(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` resolves.
    pub async fn serve(self, listener: TcpListener, shutdown: impl std::future::Future<Output = ()>) {
        server::run(listener, self.state, shutdown).await;
    }
}

/// An in-process server on a free loopback port, stopped when dropped.
///
/// # Examples
///
/// ```
/// # #[tokio::main] async fn main() {
/// use std::time::Duration;
/// let cfg = distlock_server::Config { tick: Duration::from_millis(500), ..Default::default() };
/// let server = distlock_server::EmbeddedServer::start_with(cfg).await.unwrap();
/// println!("ZooKeeper protocol on {}", server.addr());
/// drop(server); // stops it
/// # }
/// ```
pub struct EmbeddedServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl EmbeddedServer {
    /// Starts with default settings (in memory).
    pub async fn start() -> std::io::Result<EmbeddedServer> {
        Self::start_with(Config::default()).await
    }

    /// Starts with `config` on `127.0.0.1:0`.
    pub async fn start_with(config: Config) -> std::io::Result<EmbeddedServer> {
        Self::bind("127.0.0.1:0".parse().unwrap(), config).await
    }

    /// Starts with `config` on `addr`.
    pub async fn bind(addr: SocketAddr, config: Config) -> std::io::Result<EmbeddedServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = build_state(config)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server::run(listener, state, async {
                let _ = stopped.await;
            })
            .await
        });
        Ok(EmbeddedServer { addr, stop: Some(stop), task: Some(task) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `zk://127.0.0.1:PORT`, for distlock.
    pub fn url(&self) -> String {
        format!("zk://{}", self.addr)
    }

    /// Stops accepting and waits for the listener to close. (Open connections end with the
    /// runtime, or when their clients close.)
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Feeds one frame body to the decoders exactly as a connection would (the connect request, then
/// a request of an open session); for the fuzz target in `fuzz/`. Never panics on any input: every
/// malformed frame is an error that closes only its connection.
///
/// # Examples
///
/// ```
/// distlock_server::decode_for_fuzzing(&[0, 0, 0, 1, 0xff]);
/// ```
#[doc(hidden)]
pub fn decode_for_fuzzing(data: &[u8]) {
    let _ = proto::ConnectRequest::decode(data);
    let mut state = state::State::new(Config::default(), tree::Tree::default(), 0, Vec::new(), None);
    let (tx, _rx) = outbox::Outbox::new(usize::MAX);
    let hello = proto::ConnectRequest {
        protocol_version: 0,
        last_zxid_seen: 0,
        timeout_ms: 10_000,
        session_id: 0,
        password: vec![0; 16],
        read_only: Some(false),
    };
    let Ok((_, sid)) = state.connect(&hello, (1, tx), None) else { return };
    if let Some(sid) = sid {
        let _ = state.handle(sid, data);
    }
}

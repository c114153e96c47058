//! [`FaultProxy`]: a loopback TCP proxy that injects network faults between a client and one
//! server, with no root and no firewall rules.
//!
//! Point the client at [`FaultProxy::addr`] instead of the server, then change the proxy's
//! [`Fault`] while the test runs. Every connection is served by one tokio task; reads and writes
//! of each direction run concurrently inside it, joined by a queue of timestamped chunks (so a
//! [`Fault::Delay`] delays every chunk by the same amount without the delays adding up).
//!
//! Framing: [`FaultProxy::lose_next_reply`] and [`FaultProxy::frames_to_upstream`] read the byte
//! streams as frames of a 4-byte big-endian length followed by that many bytes of body, which is
//! ZooKeeper's framing. A stream that is not framed that way (a length above 64 MiB or negative)
//! is simply forwarded and no longer counted in frames.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tracing::{debug, warn};

/// Bytes read from a socket at once.
const CHUNK: usize = 64 * 1024;
/// Chunks queued per direction before the reading side waits (back-pressure).
const QUEUE: usize = 4096;
/// A frame longer than this means the stream is not length-prefixed.
const MAX_FRAME: usize = 64 << 20;

/// The network fault a [`FaultProxy`] applies; change it with [`FaultProxy::set`].
///
/// # Examples
///
/// ```no_run
/// use distlock_faults::{Fault, FaultProxy};
/// use std::time::Duration;
///
/// # async fn demo(server: std::net::SocketAddr) -> std::io::Result<()> {
/// let proxy = FaultProxy::start(server).await?;
/// proxy.set(Fault::Delay { to_client: Duration::from_millis(200), to_upstream: Duration::ZERO });
/// proxy.set(Fault::Blackhole); // a silent partition
/// proxy.heal(); // Fault::Pass
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fault {
    /// Forward everything unchanged.
    #[default]
    Pass,
    /// Deliver every chunk that late, per direction, in order. The delay is taken when a chunk
    /// arrives at the proxy, so consecutive chunks are not delayed cumulatively.
    Delay {
        /// Delay of server-to-client bytes.
        to_client: Duration,
        /// Delay of client-to-server bytes.
        to_upstream: Duration,
    },
    /// A silent partition: nothing is forwarded in either direction, sockets stay open, no FIN or
    /// RST is sent (a close or reset by either side is passed on only after healing). Bytes sent
    /// meanwhile are held, not lost, and delivered in order after healing, as TCP retransmission
    /// delivers them once a real partition heals (a TCP stream never loses bytes and goes on:
    /// either they arrive or the connection dies). New connections are accepted but the server is
    /// not contacted until healing.
    Blackhole,
    /// Open connections keep working; each new connection is reset (RST) at once.
    RefuseNew,
    /// Forward this many more bytes to the client on each open connection, then reset it. A
    /// connection accepted while this fault is set gets the same allowance. After the first cut
    /// the fault becomes [`Fault::Pass`], so the client can reconnect. `0` resets open
    /// connections at once (or, with none open, the next one accepted).
    CutAfter {
        /// Bytes still forwarded to the client before the reset.
        to_client_bytes: u64,
    },
}

/// A predicate on the body of a reply frame; see [`FaultProxy::lose_next_reply`].
type ReplyPredicate = fn(&[u8]) -> bool;

/// True for the body of a ZooKeeper reply to a client request: its reply header's xid (first
/// four bytes, big-endian) is positive. Pings (xid -2), watch notifications (-1), auth and
/// set-watches replies (other negative xids) are not replies to requests. The connect response,
/// which has no xid, is never offered to the predicate (it is each connection's first frame).
///
/// # Examples
///
/// ```
/// use distlock_faults::zk_reply;
///
/// let create_reply = [0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 0];
/// let ping_reply = [0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 0];
/// let notification = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
/// assert!(zk_reply(&create_reply));
/// assert!(!zk_reply(&ping_reply));
/// assert!(!zk_reply(&notification));
/// assert!(!zk_reply(&[0, 0])); // too short to have an xid
/// ```
pub fn zk_reply(body: &[u8]) -> bool {
    match body.first_chunk::<4>() {
        Some(xid) => i32::from_be_bytes(*xid) > 0,
        None => false,
    }
}

/// A loopback TCP proxy in front of one upstream server, injecting [`Fault`]s on command.
///
/// It listens on `127.0.0.1` on a free port. Faults apply at once to open connections and to new
/// ones. Dropping the proxy stops its listener and closes its connections.
///
/// # Examples
///
/// A partition between a client and an echo server, then healing:
///
/// ```
/// use distlock_faults::{Fault, FaultProxy};
/// use std::time::Duration;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::net::{TcpListener, TcpStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let server = TcpListener::bind("127.0.0.1:0").await?;
/// let server_addr = server.local_addr()?;
/// tokio::spawn(async move {
///     let (mut conn, _) = server.accept().await.unwrap();
///     let (mut r, mut w) = conn.split();
///     tokio::io::copy(&mut r, &mut w).await.ok(); // echo
/// });
///
/// let proxy = FaultProxy::start(server_addr).await?;
/// let mut client = TcpStream::connect(proxy.addr()).await?; // instead of server_addr
/// let mut buf = [0u8; 5];
///
/// proxy.set(Fault::Blackhole);
/// client.write_all(b"held!").await?;
/// let silent = tokio::time::timeout(Duration::from_millis(100), client.read(&mut buf)).await;
/// assert!(silent.is_err(), "no answer, no EOF, no error during the partition");
///
/// proxy.heal(); // what was held is delivered now
/// client.read_exact(&mut buf).await?;
/// assert_eq!(&buf, b"held!");
/// # Ok(()) }
/// ```
///
/// Against ZooKeeper:
///
/// ```no_run
/// use distlock_faults::{zk_reply, Fault, FaultProxy};
///
/// # async fn demo() -> std::io::Result<()> {
/// let zookeeper = "127.0.0.1:2181".parse().unwrap();
/// let proxy = FaultProxy::start(zookeeper).await?;
/// let url = format!("zk://{}", proxy.addr()); // give this to the client
///
/// // The server applies the next request, but its reply is lost and the connection reset.
/// proxy.lose_next_reply(zk_reply);
///
/// // Crash-like: every connection is reset; the client reconnects through the proxy.
/// proxy.reset_all();
/// println!("{url}: {} connections accepted", proxy.accepted());
/// # Ok(()) }
/// ```
pub struct FaultProxy {
    inner: Arc<Inner>,
    addr: SocketAddr,
    /// Dropped with the proxy: its receivers (in every task) then see the channel closed and stop.
    _stop: watch::Sender<()>,
}

struct Inner {
    upstream: SocketAddr,
    fault: watch::Sender<Fault>,
    /// Open connections. Lock order: `conns`, then a connection's `cut_budget`.
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    lose_reply: Mutex<Option<ReplyPredicate>>,
    frames_to_upstream: AtomicU64,
    writes_to_upstream: AtomicU64,
    /// Client writes recorded since [`FaultProxy::record_writes`]; `None`: not recording.
    wire_log: Mutex<Option<Vec<ClientWrite>>>,
    accepted: AtomicU64,
    next_id: AtomicU64,
}

/// Most client writes [`FaultProxy::record_writes`] keeps (later ones are counted, not kept).
const WIRE_LOG_MAX: usize = 1 << 20;

/// One chunk read from a client socket (one write, or writes that arrived together), as
/// [`FaultProxy::recorded_writes`] reports it.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(proxy: distlock_faults::FaultProxy) {
/// proxy.record_writes();
/// // ... run the client ...
/// for w in proxy.recorded_writes() {
///     println!("connection {} sent {:?}", w.conn, w.ops);
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientWrite {
    /// Which connection (numbered from 0 in order of acceptance).
    pub conn: u64,
    /// When the proxy read it.
    pub at: Instant,
    /// The ZooKeeper op code (the request header's type) of each request frame that was
    /// completed by this chunk, in order. A connection's first frame (the connect request, which
    /// has no request header) is not listed.
    pub ops: Vec<i32>,
}

/// What the proxy can tell a running connection.
struct Conn {
    /// Its number, as [`ClientWrite::conn`] gives it.
    id: u64,
    reset: Notify,
    /// Bytes still allowed to the client before a [`Fault::CutAfter`] reset; `None`: no limit.
    cut_budget: Mutex<Option<u64>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FaultProxy {
    /// Starts a proxy for `upstream`, listening on `127.0.0.1` on a free port, with
    /// [`Fault::Pass`]. The server is contacted once per client connection, when it arrives.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> std::io::Result<()> {
    /// let proxy = distlock_faults::FaultProxy::start("127.0.0.1:2181".parse().unwrap()).await?;
    /// assert!(proxy.addr().ip().is_loopback());
    /// # Ok(()) }
    /// ```
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(());
        let inner = Arc::new(Inner {
            upstream,
            fault: watch::Sender::new(Fault::Pass),
            conns: Mutex::new(HashMap::new()),
            lose_reply: Mutex::new(None),
            frames_to_upstream: AtomicU64::new(0),
            writes_to_upstream: AtomicU64::new(0),
            wire_log: Mutex::new(None),
            accepted: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
        });
        debug!(%addr, %upstream, "fault proxy listening");
        tokio::spawn(accept_loop(listener, inner.clone(), stopped));
        Ok(FaultProxy { inner, addr, _stop: stop })
    }

    /// The address clients connect to instead of the server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// let url = format!("zk://{}", proxy.addr());
    /// # }
    /// ```
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The fault in force now (a [`Fault::CutAfter`] turns into [`Fault::Pass`] after its cut).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// use distlock_faults::Fault;
    /// proxy.set(Fault::RefuseNew);
    /// assert_eq!(proxy.fault(), Fault::RefuseNew);
    /// # }
    /// ```
    pub fn fault(&self) -> Fault {
        *self.inner.fault.borrow()
    }

    /// Applies `fault` at once to every open connection and to new ones, replacing the previous
    /// fault (and cancelling any [`Fault::CutAfter`] allowance not yet used up).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use distlock_faults::Fault;
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// proxy.set(Fault::CutAfter { to_client_bytes: 100 });
    /// # }
    /// ```
    pub fn set(&self, fault: Fault) {
        let conns = lock(&self.inner.conns);
        self.inner.fault.send_replace(fault);
        let budget = match fault {
            Fault::CutAfter { to_client_bytes } => Some(to_client_bytes),
            _ => None,
        };
        for conn in conns.values() {
            *lock(&conn.cut_budget) = budget;
            if budget == Some(0) {
                conn.reset.notify_one();
            }
        }
        if budget == Some(0) && !conns.is_empty() {
            self.inner.fault.send_replace(Fault::Pass);
        }
        debug!(addr = %self.addr, ?fault, open = conns.len(), "fault set");
    }

    /// Ends the fault: the same as `set(Fault::Pass)`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// proxy.set(distlock_faults::Fault::Blackhole);
    /// proxy.heal();
    /// # }
    /// ```
    pub fn heal(&self) {
        self.set(Fault::Pass);
    }

    /// Resets every open connection now: both the client's and the server's side receive a TCP
    /// RST (the proxy closes them with `SO_LINGER` 0). New connections are still accepted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// proxy.reset_all(); // the client sees ECONNRESET and reconnects through the proxy
    /// # }
    /// ```
    pub fn reset_all(&self) {
        let conns = lock(&self.inner.conns);
        for conn in conns.values() {
            conn.reset.notify_one();
        }
        debug!(addr = %self.addr, open = conns.len(), "reset all connections");
    }

    /// Arms a one-shot lost reply: the next complete server-to-client frame, on any connection,
    /// whose body satisfies `is_reply` is swallowed, and that connection is then reset on both
    /// sides. The server has applied the request; the client never hears so. Frames before it
    /// pass unchanged; the first frame of each connection (ZooKeeper's connect response) is
    /// never offered. Calling it again replaces a predicate not yet used.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// use distlock_faults::zk_reply;
    /// proxy.lose_next_reply(zk_reply); // e.g. the reply to the lock node's create
    /// # }
    /// ```
    pub fn lose_next_reply(&self, is_reply: fn(&[u8]) -> bool) {
        *lock(&self.inner.lose_reply) = Some(is_reply);
    }

    /// Number of complete client-to-server frames received so far, on all connections (counted
    /// on arrival, including while a fault drops them).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// // Three requests sent in fewer writes prove the client pipelines.
    /// assert!(proxy.frames_to_upstream() > proxy.writes_to_upstream());
    /// # }
    /// ```
    pub fn frames_to_upstream(&self) -> u64 {
        self.inner.frames_to_upstream.load(Ordering::SeqCst)
    }

    /// Number of chunks received from clients so far, on all connections: each successful
    /// `read()` on a client socket counts one, so it is how many separate writes arrived.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// println!("{} frames in {} writes", proxy.frames_to_upstream(), proxy.writes_to_upstream());
    /// # }
    /// ```
    pub fn writes_to_upstream(&self) -> u64 {
        self.inner.writes_to_upstream.load(Ordering::SeqCst)
    }

    /// Starts (or restarts, clearing what was kept) recording every chunk read from clients,
    /// with the op codes of the ZooKeeper requests in it: see [`FaultProxy::recorded_writes`].
    /// Up to about a million chunks are kept.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// proxy.record_writes();
    /// # }
    /// ```
    pub fn record_writes(&self) {
        *lock(&self.inner.wire_log) = Some(Vec::new());
    }

    /// The client chunks recorded since [`FaultProxy::record_writes`], in the order read. A
    /// chunk is what one `read()` on a client socket returned: one write of the client, or
    /// several that arrived before the proxy read (so two requests in one chunk do not prove one
    /// write, but two chunks prove two writes).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// const CREATE2: i32 = 15;
    /// let creates_alone = proxy.recorded_writes().iter().filter(|w| w.ops == [CREATE2]).count();
    /// # }
    /// ```
    pub fn recorded_writes(&self) -> Vec<ClientWrite> {
        lock(&self.inner.wire_log).clone().unwrap_or_default()
    }

    /// Number of client connections open now.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// println!("{} client connections open", proxy.connections());
    /// # }
    /// ```
    pub fn connections(&self) -> usize {
        lock(&self.inner.conns).len()
    }

    /// Number of client connections accepted since the start, including those reset at once by
    /// [`Fault::RefuseNew`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(proxy: distlock_faults::FaultProxy) {
    /// let before = proxy.accepted();
    /// proxy.reset_all();
    /// // ... once the client has reconnected, proxy.accepted() > before
    /// # }
    /// ```
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.inner.upstream)
            .field("fault", &self.fault())
            .field("connections", &self.connections())
            .finish()
    }
}

impl Inner {
    /// A [`Fault::CutAfter`] cut a connection: new connections pass from now on.
    fn cut_happened(&self) {
        let _conns = lock(&self.conns);
        if matches!(*self.fault.borrow(), Fault::CutAfter { .. }) {
            self.fault.send_replace(Fault::Pass);
        }
    }
}

/// Closes `stream` with a TCP RST instead of a FIN.
fn reset(stream: TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: the fd is open (we own the stream) and `linger` is a valid `struct linger` of the
    // size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        warn!(error = %io::Error::last_os_error(), "setting SO_LINGER 0 failed; closing with FIN");
    }
    drop(stream);
}

async fn accept_loop(listener: TcpListener, inner: Arc<Inner>, mut stop: watch::Receiver<()>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(error) => {
                // Out of file descriptors and the like: wait a little instead of spinning.
                warn!(%error, "fault proxy accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        inner.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nodelay(true);
        let registered = {
            let mut conns = lock(&inner.conns);
            let fault = *inner.fault.borrow();
            match fault {
                Fault::RefuseNew => None,
                Fault::CutAfter { to_client_bytes: 0 } => {
                    inner.fault.send_replace(Fault::Pass);
                    None
                }
                _ => {
                    let budget = match fault {
                        Fault::CutAfter { to_client_bytes } => Some(to_client_bytes),
                        _ => None,
                    };
                    let id = inner.next_id.fetch_add(1, Ordering::SeqCst);
                    let conn = Arc::new(Conn { id, reset: Notify::new(), cut_budget: Mutex::new(budget) });
                    conns.insert(id, conn.clone());
                    Some((id, conn))
                }
            }
        };
        match registered {
            None => {
                debug!("new connection refused (RST)");
                reset(client);
            }
            Some((id, conn)) => {
                tokio::spawn(serve(inner.clone(), id, conn, client, stop.clone()));
            }
        }
    }
}

/// How a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Both directions finished (EOF passed on both ways), or the proxy was dropped: close.
    Close,
    /// Reset both sides.
    Reset,
}

/// Removes a connection from the registry when its task ends, however it ends.
struct Registered {
    inner: Arc<Inner>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.inner.conns).remove(&self.id);
    }
}

async fn serve(inner: Arc<Inner>, id: u64, conn: Arc<Conn>, mut client: TcpStream, mut stop: watch::Receiver<()>) {
    let _registered = Registered { inner: inner.clone(), id };
    let mut upstream = None;
    let end = tokio::select! {
        end = run(&inner, &conn, &mut client, &mut upstream) => end,
        _ = conn.reset.notified() => End::Reset,
        _ = stop.changed() => End::Close,
    };
    debug!(id, ?end, "connection ends");
    if end == End::Reset {
        reset(client);
        if let Some(upstream) = upstream {
            reset(upstream);
        }
    }
}

/// One chunk (or end) of a direction's byte stream, due at `at`.
struct Timed {
    at: Instant,
    item: Item,
}

enum Item {
    Data(Vec<u8>),
    /// The reading side saw EOF: pass the half-close on.
    Eof,
    /// The reading side failed, or a reply was swallowed: reset the connection.
    Reset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    ToUpstream,
    ToClient,
}

async fn run(inner: &Inner, conn: &Conn, client: &mut TcpStream, upstream: &mut Option<TcpStream>) -> End {
    let mut fault = inner.fault.subscribe();
    let client_frames = Framer { record_ops: true, ..Framer::default() };

    // During a partition the server is not contacted; what the client sends waits in the socket.
    wait_healed(&mut fault).await;

    let stream = match TcpStream::connect(inner.upstream).await {
        Ok(stream) => stream,
        Err(error) => {
            debug!(upstream = %inner.upstream, %error, "upstream connect failed; resetting the client");
            return End::Reset;
        }
    };
    let _ = stream.set_nodelay(true);
    let upstream = upstream.insert(stream);
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    let (to_upstream, to_upstream_queue) = mpsc::channel(QUEUE);
    let (to_client, to_client_queue) = mpsc::channel(QUEUE);

    let readers = async {
        tokio::join!(
            read_side(inner, conn.id, Dir::ToUpstream, client_read, to_upstream, client_frames),
            read_side(inner, conn.id, Dir::ToClient, upstream_read, to_client, Framer::default()),
        );
        std::future::pending::<End>().await
    };
    let writers = async {
        let mut up = pin!(write_side(inner, conn, Dir::ToUpstream, upstream_write, to_upstream_queue));
        let mut down = pin!(write_side(inner, conn, Dir::ToClient, client_write, to_client_queue));
        let (mut up_done, mut down_done) = (false, false);
        while !(up_done && down_done) {
            let end = tokio::select! {
                end = &mut up, if !up_done => { up_done = true; end }
                end = &mut down, if !down_done => { down_done = true; end }
            };
            if end == End::Reset {
                return End::Reset;
            }
        }
        End::Close
    };
    tokio::select! {
        end = readers => end,
        end = writers => end,
    }
}

fn count_from_client(inner: &Inner, conn: u64, frames: &mut Framer, chunk: &[u8]) {
    inner.writes_to_upstream.fetch_add(1, Ordering::SeqCst);
    let before = frames.frames;
    frames.feed(chunk, None, None);
    inner.frames_to_upstream.fetch_add(frames.frames - before, Ordering::SeqCst);
    let ops = std::mem::take(&mut frames.ops);
    if let Some(log) = lock(&inner.wire_log).as_mut() {
        if log.len() < WIRE_LOG_MAX {
            log.push(ClientWrite { conn, at: Instant::now(), ops });
        }
    }
}

async fn wait_healed(fault: &mut watch::Receiver<Fault>) {
    while *fault.borrow_and_update() == Fault::Blackhole {
        if fault.changed().await.is_err() {
            return;
        }
    }
}

/// Reads one direction, applies the read-time part of the fault, and queues what is to be sent.
async fn read_side(
    inner: &Inner,
    conn: u64,
    dir: Dir,
    mut from: ReadHalf<'_>,
    queue: mpsc::Sender<Timed>,
    mut framer: Framer,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut fault = inner.fault.subscribe();
    loop {
        // A partition holds what is sent meanwhile in the socket buffers (TCP retransmits it).
        wait_healed(&mut fault).await;
        let (item, last) = match from.read(&mut buf).await {
            Ok(0) => (Item::Eof, true),
            Err(error) => {
                debug!(?dir, %error, "read failed");
                (Item::Reset, true)
            }
            Ok(n) => {
                let chunk = &buf[..n];
                match dir {
                    Dir::ToUpstream => {
                        count_from_client(inner, conn, &mut framer, chunk);
                        (Item::Data(chunk.to_vec()), false)
                    }
                    Dir::ToClient => {
                        let mut out = Vec::with_capacity(chunk.len());
                        let swallowed = framer.feed(chunk, Some(&inner.lose_reply), Some(&mut out));
                        if swallowed {
                            debug!("reply swallowed; the connection will be reset");
                            if !out.is_empty() {
                                let _ = queue.send(Timed { at: due(inner, dir), item: Item::Data(out) }).await;
                            }
                            (Item::Reset, true)
                        } else if out.is_empty() {
                            continue; // a frame is being held back whole
                        } else {
                            (Item::Data(out), false)
                        }
                    }
                }
            }
        };
        if queue.send(Timed { at: due(inner, dir), item }).await.is_err() || last {
            return;
        }
    }
}

/// When a chunk arriving now is to be delivered.
fn due(inner: &Inner, dir: Dir) -> Instant {
    let now = Instant::now();
    match (*inner.fault.borrow(), dir) {
        (Fault::Delay { to_upstream, .. }, Dir::ToUpstream) => now + to_upstream,
        (Fault::Delay { to_client, .. }, Dir::ToClient) => now + to_client,
        _ => now,
    }
}

/// Delivers one direction's queue, applying the write-time part of the fault.
async fn write_side(
    inner: &Inner,
    conn: &Conn,
    dir: Dir,
    mut to: WriteHalf<'_>,
    mut queue: mpsc::Receiver<Timed>,
) -> End {
    let mut fault = inner.fault.subscribe();
    let mut timer: Option<PreciseTimer> = None;
    while let Some(Timed { at, item }) = queue.recv().await {
        if at > Instant::now() {
            if timer.is_none() {
                timer = PreciseTimer::new().map_err(|e| debug!(error = %e, "no timerfd; delays in whole ms")).ok();
            }
            match &timer {
                Some(t) if t.sleep_until(at).await.is_ok() => {}
                _ => tokio::time::sleep_until(at).await,
            }
        }
        match item {
            Item::Data(bytes) => {
                // Read before the partition began: delivered after it.
                wait_healed(&mut fault).await;
                let (allowed, cut) = match dir {
                    Dir::ToClient => take_budget(conn, bytes.len()),
                    Dir::ToUpstream => (bytes.len(), false),
                };
                if let Err(error) = to.write_all(&bytes[..allowed]).await {
                    debug!(?dir, %error, "write failed");
                    return End::Reset;
                }
                if cut {
                    debug!("cut after the allowed bytes");
                    inner.cut_happened();
                    return End::Reset;
                }
            }
            Item::Eof => {
                wait_healed(&mut fault).await;
                let _ = to.shutdown().await;
                return End::Close;
            }
            Item::Reset => {
                wait_healed(&mut fault).await;
                return End::Reset;
            }
        }
    }
    End::Close
}

/// A timer with the kernel's resolution (a timerfd in tokio's reactor): tokio's own timers fire
/// on whole milliseconds, late, which makes a 1 ms [`Fault::Delay`] 1 to 3 ms.
struct PreciseTimer {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
}

impl PreciseTimer {
    fn new() -> io::Result<PreciseTimer> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the fd it returns is owned by the OwnedFd from here on.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: an OwnedFd keeps its fd open, and the same, until the AsyncFd drops it.
        let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        Ok(PreciseTimer { fd: fd.map_err(|e| e.into_parts().1)? })
    }

    async fn sleep_until(&self, at: Instant) -> io::Result<()> {
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        let value =
            libc::timespec { tv_sec: left.as_secs() as libc::time_t, tv_nsec: left.subsec_nanos() as libc::c_long };
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let spec = libc::itimerspec { it_interval: zero, it_value: value };
        // SAFETY: a valid timerfd and a valid itimerspec; the old value is not asked for.
        if unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            let mut ready = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            // SAFETY: reading 8 bytes into an 8-byte buffer from our timerfd.
            let read = ready.try_io(|fd| {
                match unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), expirations.len()) } {
                    n if n < 0 => Err(io::Error::last_os_error()),
                    _ => Ok(()),
                }
            });
            if let Ok(result) = read {
                return result;
            }
        }
    }
}

/// Takes up to `len` bytes of the connection's [`Fault::CutAfter`] allowance: how many may be
/// written, and whether the connection must be reset after writing them.
fn take_budget(conn: &Conn, len: usize) -> (usize, bool) {
    let mut budget = lock(&conn.cut_budget);
    match *budget {
        None => (len, false),
        Some(left) => {
            let allowed = left.min(len as u64);
            *budget = Some(left - allowed);
            (allowed as usize, left == allowed)
        }
    }
}

/// Tracks 4-byte length-prefixed frames in one direction of a byte stream.
#[derive(Debug, Default)]
struct Framer {
    header: [u8; 4],
    /// Header bytes seen of the current frame (4 once the length is known).
    have: usize,
    /// Body bytes of the current frame still to come.
    remaining: usize,
    /// Frames completed so far.
    frames: u64,
    /// The stream is not length-prefixed: stop framing.
    broken: bool,
    /// The current frame, held back whole while a lost reply is armed.
    held: Option<Vec<u8>>,
    /// The first 8 body bytes of the current frame (a request header: xid, then op code).
    head: [u8; 8],
    /// Op codes of the request frames completed since the owner last took them (not the
    /// stream's first frame, a connect request without a header); only with `record_ops`.
    ops: Vec<i32>,
    record_ops: bool,
}

impl Framer {
    /// Feeds the next bytes of the stream. Bytes to forward are appended to `out`. With `lose`
    /// given and armed, every frame after the first is held until complete and then offered to
    /// the predicate; returns true when it was swallowed (the rest of `chunk` is then dropped:
    /// the connection is about to be reset).
    fn feed(
        &mut self,
        mut chunk: &[u8],
        lose: Option<&Mutex<Option<ReplyPredicate>>>,
        mut out: Option<&mut Vec<u8>>,
    ) -> bool {
        while !chunk.is_empty() {
            if self.broken {
                if let Some(out) = out.as_deref_mut() {
                    out.extend_from_slice(chunk);
                }
                return false;
            }
            if self.have == 0 {
                let armed = self.frames >= 1 && lose.is_some_and(|lose| lock(lose).is_some());
                self.held = armed.then(Vec::new);
            }
            let take;
            if self.have < 4 {
                take = (4 - self.have).min(chunk.len());
                self.header[self.have..self.have + take].copy_from_slice(&chunk[..take]);
                self.have += take;
                if self.have == 4 {
                    let len = i32::from_be_bytes(self.header);
                    match usize::try_from(len) {
                        Ok(len) if len <= MAX_FRAME => self.remaining = len,
                        _ => self.broken = true,
                    }
                }
            } else {
                take = self.remaining.min(chunk.len());
                let len = i32::from_be_bytes(self.header) as usize;
                let seen = len - self.remaining;
                for (i, b) in chunk[..take].iter().enumerate().take(8usize.saturating_sub(seen)) {
                    self.head[seen + i] = *b;
                }
                self.remaining -= take;
            }
            match self.held.as_mut() {
                Some(held) => held.extend_from_slice(&chunk[..take]),
                None => {
                    if let Some(out) = out.as_deref_mut() {
                        out.extend_from_slice(&chunk[..take]);
                    }
                }
            }
            chunk = &chunk[take..];
            if self.broken {
                if let (Some(held), Some(out)) = (self.held.take(), out.as_deref_mut()) {
                    out.extend_from_slice(&held);
                }
                continue;
            }
            if self.have == 4 && self.remaining == 0 {
                self.have = 0;
                if self.record_ops && self.frames > 0 && i32::from_be_bytes(self.header) >= 8 {
                    self.ops.push(i32::from_be_bytes([self.head[4], self.head[5], self.head[6], self.head[7]]));
                }
                self.frames += 1;
                if let Some(frame) = self.held.take() {
                    if let Some(lose) = lose {
                        let mut armed = lock(lose);
                        if armed.is_some_and(|is_reply| is_reply(&frame[4..])) {
                            *armed = None;
                            return true;
                        }
                    }
                    if let Some(out) = out.as_deref_mut() {
                        out.extend_from_slice(&frame);
                    }
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn framer_reads_request_op_codes_split_anywhere() {
        let mut stream = frame(b"connect request, no header");
        // Two requests: xid 1 op 15 (create2) with a body, xid 2 op 8 (getChildren) without.
        stream.extend(frame(&[0, 0, 0, 1, 0, 0, 0, 15, 9, 9, 9]));
        stream.extend(frame(&[0, 0, 0, 2, 0, 0, 0, 8]));
        for split in 0..stream.len() {
            let mut f = Framer { record_ops: true, ..Framer::default() };
            f.feed(&stream[..split], None, None);
            let mut ops = std::mem::take(&mut f.ops);
            f.feed(&stream[split..], None, None);
            ops.extend(std::mem::take(&mut f.ops));
            assert_eq!(ops, [15, 8], "split at {split}");
        }
    }

    #[test]
    fn framer_counts_frames_split_anywhere() {
        let mut stream = Vec::new();
        for body in [&b"first"[..], b"", b"third body"] {
            stream.extend(frame(body));
        }
        for split in 0..stream.len() {
            let mut f = Framer::default();
            let mut out = Vec::new();
            f.feed(&stream[..split], None, Some(&mut out));
            f.feed(&stream[split..], None, Some(&mut out));
            assert_eq!(f.frames, 3, "split at {split}");
            assert_eq!(out, stream);
        }
    }

    #[test]
    fn framer_swallows_the_matching_frame_only() {
        fn is_b(body: &[u8]) -> bool {
            body == b"B"
        }
        let lose = Mutex::new(Some(is_b as ReplyPredicate));
        let mut stream = Vec::new();
        for body in [&b"B"[..], b"A", b"B", b"C"] {
            stream.extend(frame(body));
        }
        let mut f = Framer::default();
        let mut out = Vec::new();
        // The first frame is never offered, even though it matches.
        for byte in &stream {
            if f.feed(std::slice::from_ref(byte), Some(&lose), Some(&mut out)) {
                break;
            }
        }
        let mut expected = frame(b"B");
        expected.extend(frame(b"A"));
        assert_eq!(out, expected);
        assert!(lock(&lose).is_none(), "one-shot");
    }

    #[test]
    fn framer_gives_up_on_unframed_streams() {
        let mut f = Framer::default();
        let mut out = Vec::new();
        f.feed(b"hello, world", Some(&Mutex::new(None)), Some(&mut out));
        assert!(f.broken);
        assert_eq!(out, b"hello, world");
    }
}

//! FaultProxy against tiny upstream servers started by each test on 127.0.0.1:0: an echo server
//! and a length-prefixed request/reply server. Every wait is bounded.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_faults::{zk_reply, Fault, FaultProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

/// Upper bound for anything that should happen promptly.
const WAIT: Duration = Duration::from_secs(10);
/// How long a read must stay silent to count as "timed out" during a partition.
const SILENCE: Duration = Duration::from_millis(300);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out after {WAIT:?}: {what}"))
}

/// A test server: where it listens, how each of its connections ended (Ok for a clean EOF, the
/// error kind otherwise) and, for the request/reply server, the request bodies it applied.
struct Upstream {
    addr: SocketAddr,
    ends: mpsc::UnboundedReceiver<Result<(), io::ErrorKind>>,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Upstream {
    async fn next_end(&mut self) -> Result<(), io::ErrorKind> {
        within("an upstream connection to end", self.ends.recv()).await.expect("server task alive")
    }
}

/// Echoes every byte back.
async fn echo_server() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, ends) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let end = loop {
                    match sock.read(&mut buf).await {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            if let Err(e) = sock.write_all(&buf[..n]).await {
                                break Err(e.kind());
                            }
                        }
                        Err(e) => break Err(e.kind()),
                    }
                };
                let _ = tx.send(end);
            });
        }
    });
    Upstream { addr, ends, requests: Arc::default() }
}

/// Reads length-prefixed frames, records each body, and answers each with a frame carrying the
/// same body (so a request with xid 5 gets a reply with xid 5, as in ZooKeeper).
async fn reply_server() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, ends) = mpsc::unbounded_channel();
    let requests: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let applied = requests.clone();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (tx, applied) = (tx.clone(), applied.clone());
            tokio::spawn(async move {
                let end = loop {
                    let body = match read_frame(&mut sock).await {
                        Ok(body) => body,
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
                        Err(e) => break Err(e.kind()),
                    };
                    applied.lock().unwrap().push(body.clone());
                    if let Err(e) = sock.write_all(&frame(&body)).await {
                        break Err(e.kind());
                    }
                };
                let _ = tx.send(end);
            });
        }
    });
    Upstream { addr, ends, requests }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// A ZooKeeper-like body: a 4-byte xid and a little payload.
fn request(xid: i32, payload: &[u8]) -> Vec<u8> {
    let mut body = xid.to_be_bytes().to_vec();
    body.extend_from_slice(payload);
    body
}

async fn read_frame(sock: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).await?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    sock.read_exact(&mut body).await?;
    Ok(body)
}

async fn round_trip(sock: &mut TcpStream, body: &[u8]) -> Vec<u8> {
    sock.write_all(&frame(body)).await.unwrap();
    within("a reply", read_frame(sock)).await.unwrap()
}

async fn echo(sock: &mut TcpStream, bytes: &[u8]) {
    sock.write_all(bytes).await.unwrap();
    let mut back = vec![0u8; bytes.len()];
    within("the echo", sock.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, bytes);
}

/// Reads until EOF or an error; returns the bytes read and how the stream ended.
async fn read_to_end(sock: &mut TcpStream) -> (Vec<u8>, Result<(), io::ErrorKind>) {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match within("the stream to end", sock.read(&mut buf)).await {
            Ok(0) => return (all, Ok(())),
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) => return (all, Err(e.kind())),
        }
    }
}

/// The read stays silent for SILENCE: no data, no EOF, no error.
async fn assert_silent(sock: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match timeout(SILENCE, sock.read(&mut buf)).await {
        Err(_) => {}
        Ok(Ok(0)) => panic!("EOF during a blackhole"),
        Ok(Ok(n)) => panic!("{n} bytes arrived during a blackhole: {:?}", &buf[..n]),
        Ok(Err(e)) => panic!("error during a blackhole: {e}"),
    }
}

async fn connect(proxy: &FaultProxy) -> TcpStream {
    let sock = within("connect", TcpStream::connect(proxy.addr())).await.unwrap();
    sock.set_nodelay(true).unwrap();
    sock
}

#[tokio::test]
async fn passes_bytes_through() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    assert!(proxy.addr().ip().is_loopback());
    assert_eq!(proxy.fault(), Fault::Pass);

    let mut a = connect(&proxy).await;
    let mut b = connect(&proxy).await;
    echo(&mut a, b"hello").await;
    echo(&mut b, &vec![7u8; 300_000]).await; // more than one chunk
    echo(&mut a, b"again").await;
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.connections(), 2);
}

#[tokio::test]
async fn half_close_is_passed_on() {
    let mut upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    sock.write_all(b"bye").await.unwrap();
    sock.shutdown().await.unwrap();
    let (bytes, end) = read_to_end(&mut sock).await;
    assert_eq!((bytes.as_slice(), end), (&b"bye"[..], Ok(())));
    assert_eq!(upstream.next_end().await, Ok(()));
}

#[tokio::test]
async fn delay_adds_the_delay_to_a_round_trip_without_adding_up() {
    let upstream = reply_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    round_trip(&mut sock, b"warm up").await;

    let (to_client, to_upstream) = (Duration::from_millis(150), Duration::from_millis(100));
    proxy.set(Fault::Delay { to_client, to_upstream });
    let started = Instant::now();
    round_trip(&mut sock, b"one").await;
    let one = started.elapsed();
    assert!(one >= to_client + to_upstream, "round trip took {one:?}");

    // Five requests sent one after another: each is delayed, but the delays overlap.
    let started = Instant::now();
    for i in 0..5u8 {
        sock.write_all(&frame(&[i])).await.unwrap();
    }
    for i in 0..5u8 {
        assert_eq!(within("a delayed reply", read_frame(&mut sock)).await.unwrap(), [i]);
    }
    let five = started.elapsed();
    assert!(five >= to_client + to_upstream, "five round trips took {five:?}");
    assert!(five < 3 * (to_client + to_upstream), "delays added up: {five:?}");

    proxy.heal();
    let started = Instant::now();
    round_trip(&mut sock, b"fast").await;
    assert!(started.elapsed() < to_client + to_upstream, "still delayed after heal");
}

#[tokio::test]
async fn blackhole_is_silent_and_delivers_held_bytes_when_healed() {
    let mut upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    echo(&mut sock, b"before").await;

    proxy.set(Fault::Blackhole);
    sock.write_all(b"held").await.unwrap();
    assert_silent(&mut sock).await;

    // A connection made during the partition is accepted, but nothing flows.
    let mut late = connect(&proxy).await;
    late.write_all(b"held too").await.unwrap();
    assert_silent(&mut late).await;
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.connections(), 2);

    proxy.heal();
    // What was sent during the partition arrives now, in order, as TCP would deliver it.
    let mut back = vec![0u8; 4];
    within("the held bytes", sock.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, b"held");
    let mut back = vec![0u8; 8];
    within("the held bytes", late.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, b"held too");
    echo(&mut sock, b"after").await;
    echo(&mut late, b"late").await;

    // The partition hid nothing else: no upstream connection ended.
    assert!(upstream.ends.try_recv().is_err());
}

#[tokio::test]
async fn blackhole_holds_back_a_close_until_healed() {
    let mut upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    echo(&mut sock, b"x").await;

    proxy.set(Fault::Blackhole);
    drop(sock);
    assert!(timeout(SILENCE, upstream.ends.recv()).await.is_err(), "the close crossed the partition");
    proxy.heal();
    assert_eq!(upstream.next_end().await, Ok(()));
}

#[tokio::test]
async fn reset_all_resets_both_sides_and_keeps_accepting() {
    let mut upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    echo(&mut sock, b"hello").await;

    proxy.reset_all();
    let (bytes, end) = read_to_end(&mut sock).await;
    assert!(bytes.is_empty());
    assert_eq!(end, Err(io::ErrorKind::ConnectionReset), "the client must see a reset, not a clean EOF");
    assert_eq!(upstream.next_end().await, Err(io::ErrorKind::ConnectionReset));

    let mut again = connect(&proxy).await;
    echo(&mut again, b"new connection").await;
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.connections(), 1);
}

#[tokio::test]
async fn lose_next_reply_swallows_exactly_the_matching_reply() {
    let mut upstream = reply_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    proxy.lose_next_reply(zk_reply);

    let mut sock = connect(&proxy).await;
    // The first frame stands for the connect response: never offered, although its "xid" > 0.
    assert_eq!(round_trip(&mut sock, &request(9, b"connect")).await, request(9, b"connect"));
    // A ping reply (xid -2) and a notification-like frame (xid -1) pass.
    assert_eq!(round_trip(&mut sock, &request(-2, b"")).await, request(-2, b""));
    assert_eq!(round_trip(&mut sock, &request(-1, b"watch")).await, request(-1, b"watch"));

    // The server applies request 5, its reply is lost and the connection reset.
    sock.write_all(&frame(&request(5, b"create /lock"))).await.unwrap();
    let (bytes, end) = read_to_end(&mut sock).await;
    assert!(bytes.is_empty(), "part of the lost reply arrived: {bytes:?}");
    assert_eq!(end, Err(io::ErrorKind::ConnectionReset));
    assert_eq!(upstream.next_end().await, Err(io::ErrorKind::ConnectionReset));
    assert_eq!(upstream.requests.lock().unwrap().last().unwrap(), &request(5, b"create /lock"));

    // One-shot: the next connection gets every reply.
    let mut sock = connect(&proxy).await;
    round_trip(&mut sock, &request(0, b"connect")).await;
    assert_eq!(round_trip(&mut sock, &request(6, b"create /lock")).await, request(6, b"create /lock"));
}

#[tokio::test]
async fn lose_next_reply_forwards_frames_before_it_in_the_same_chunk() {
    let upstream = reply_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    round_trip(&mut sock, &request(0, b"connect")).await;

    fn is_seven(body: &[u8]) -> bool {
        zk_reply(body) && body[..4] == 7i32.to_be_bytes()
    }
    proxy.lose_next_reply(is_seven);
    let mut pipelined = frame(&request(6, b"first"));
    pipelined.extend(frame(&request(7, b"second")));
    pipelined.extend(frame(&request(8, b"third")));
    sock.write_all(&pipelined).await.unwrap();
    let (bytes, end) = read_to_end(&mut sock).await;
    assert_eq!(bytes, frame(&request(6, b"first")), "only the reply before the lost one arrives");
    assert_eq!(end, Err(io::ErrorKind::ConnectionReset));
}

#[tokio::test]
async fn refuse_new_resets_new_connections_only() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut old = connect(&proxy).await;
    echo(&mut old, b"x").await;

    proxy.set(Fault::RefuseNew);
    let mut refused = connect(&proxy).await; // the kernel completes the handshake; then RST
    let (bytes, end) = read_to_end(&mut refused).await;
    assert!(bytes.is_empty());
    assert_eq!(end, Err(io::ErrorKind::ConnectionReset));
    echo(&mut old, b"still works").await;
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.connections(), 1);

    proxy.heal();
    let mut new = connect(&proxy).await;
    echo(&mut new, b"welcome").await;
}

#[tokio::test]
async fn cut_after_forwards_that_many_bytes_then_resets() {
    let mut upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    echo(&mut sock, b"before the cut").await;

    proxy.set(Fault::CutAfter { to_client_bytes: 10 });
    sock.write_all(b"0123456").await.unwrap();
    let mut first = [0u8; 7];
    within("bytes under the allowance", sock.read_exact(&mut first)).await.unwrap();
    sock.write_all(b"789abcdefghijklmnopqrstuvwxyz").await.unwrap();
    let (bytes, end) = read_to_end(&mut sock).await;
    assert_eq!(bytes, b"789");
    assert_eq!(end, Err(io::ErrorKind::ConnectionReset));
    assert_eq!(upstream.next_end().await, Err(io::ErrorKind::ConnectionReset));

    // After the cut, new connections pass.
    assert_eq!(proxy.fault(), Fault::Pass);
    let mut again = connect(&proxy).await;
    echo(&mut again, &[b'z'; 100]).await;
}

#[tokio::test]
async fn cut_after_zero_resets_at_once() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let mut sock = connect(&proxy).await;
    echo(&mut sock, b"x").await;
    proxy.set(Fault::CutAfter { to_client_bytes: 0 });
    let (bytes, end) = read_to_end(&mut sock).await;
    assert!(bytes.is_empty());
    assert_eq!(end, Err(io::ErrorKind::ConnectionReset));
    let mut again = connect(&proxy).await;
    echo(&mut again, b"y").await;
}

#[tokio::test]
async fn counters_count_frames_and_writes_to_upstream() {
    let upstream = reply_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    assert_eq!((proxy.frames_to_upstream(), proxy.writes_to_upstream()), (0, 0));
    let mut sock = connect(&proxy).await;

    // Two frames in one write: one write, two frames.
    let mut both = frame(b"first");
    both.extend(frame(b"second"));
    sock.write_all(&both).await.unwrap();
    assert_eq!(within("reply 1", read_frame(&mut sock)).await.unwrap(), b"first");
    assert_eq!(within("reply 2", read_frame(&mut sock)).await.unwrap(), b"second");
    assert_eq!((proxy.frames_to_upstream(), proxy.writes_to_upstream()), (2, 1));

    // One frame in two writes, each answered before the next: two writes, one frame.
    let one = frame(b"split in two");
    sock.write_all(&one[..3]).await.unwrap();
    within("a write to arrive", async {
        while proxy.writes_to_upstream() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    sock.write_all(&one[3..]).await.unwrap();
    assert_eq!(within("reply 3", read_frame(&mut sock)).await.unwrap(), b"split in two");
    assert_eq!((proxy.frames_to_upstream(), proxy.writes_to_upstream()), (3, 3));
}

#[tokio::test]
async fn dropping_the_proxy_closes_everything() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream.addr).await.unwrap();
    let addr = proxy.addr();
    let mut sock = connect(&proxy).await;
    echo(&mut sock, b"x").await;
    drop(proxy);

    let (_, end) = read_to_end(&mut sock).await;
    assert_eq!(end, Ok(()), "a dropped proxy closes its connections");
    within("the listener to close", async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

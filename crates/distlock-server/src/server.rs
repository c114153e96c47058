//! Connections: framing, the handshake, four-letter words, and the timers.

use crate::net::{TcpListener, TcpStream};
use crate::outbox::{Outbox, Outgoing};
use crate::proto::ConnectRequest;
use crate::state::State;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub type Shared = Arc<Mutex<State>>;

/// Frames are gathered into one socket write up to this many bytes.
const WRITE_BATCH: usize = 64 << 10;

static CONN_IDS: AtomicU64 = AtomicU64::new(1);

/// Refusals being written at once; past it, further refused connections are closed unanswered
/// (a flood of connections must not cost a task and a descriptor each for long).
const REFUSALS_IN_FLIGHT: usize = 64;

/// How long a refused connection has to read its refusal line.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// The connections open now: in all and per IP address.
#[derive(Default)]
struct Slots {
    total: AtomicUsize,
    per_address: Mutex<HashMap<IpAddr, usize>>,
}

/// One taken slot, given back when dropped (however the connection's task ends).
struct Slot {
    slots: Arc<Slots>,
    ip: IpAddr,
}

impl Slots {
    /// Takes a slot for `ip`, or returns the refusal to tell it.
    fn take(self: &Arc<Self>, ip: IpAddr, max_total: usize, max_per_address: usize) -> Result<Slot, String> {
        let mut per = self.per_address.lock().unwrap();
        if self.total.load(Ordering::SeqCst) >= max_total {
            return Err(format!("distlock-server: too many connections (at most {max_total} in all)\n"));
        }
        let n = per.entry(ip).or_default();
        if *n >= max_per_address {
            return Err(format!(
                "distlock-server: too many connections from {ip} (at most {max_per_address} per address)\n"
            ));
        }
        *n += 1;
        self.total.fetch_add(1, Ordering::SeqCst);
        Ok(Slot { slots: self.clone(), ip })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per = self.slots.per_address.lock().unwrap();
        if let Some(n) = per.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.ip);
            }
        }
        self.slots.total.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tells a refused connection why, in plaintext (before any TLS: the client reads it on a raw
/// socket), then closes it. Bounded by [`REFUSAL_TIME`]; what the client sent is read and dropped
/// meanwhile, so that closing sends a FIN after the line, not a reset that could discard it.
async fn refuse(mut socket: TcpStream, line: String) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        socket.write_all(line.as_bytes()).await?;
        socket.shutdown().await?;
        let mut sink = [0u8; 1024];
        while socket.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Serves connections from `listener` until `shutdown` resolves.
pub async fn run(listener: TcpListener, state: Shared, shutdown: impl std::future::Future<Output = ()>) {
    let slots = Arc::new(Slots::default());
    let refusing = Arc::new(AtomicUsize::new(0));
    let refused_warning = crate::state::Occasional::default();
    let (tick, max_conns, max_per_address, tls, handshake_timeout) = {
        let s = state.lock().unwrap();
        let tls = s.config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let c = &s.config;
        (c.tick, c.max_connections, c.max_connections_per_address, tls, c.handshake_timeout)
    };
    let timers = crate::sim::spawn(timers(state.clone(), tick));
    // Tells open connections to close when the server stops.
    let (closing, _) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, most likely: wait instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let ip = peer.ip().to_canonical();
                let slot = match slots.take(ip, max_conns, max_per_address) {
                    Ok(slot) => slot,
                    Err(line) => {
                        refused_warning.warn(|held_back| {
                            tracing::warn!(%peer, held_back, "connection refused: {}", line.trim_end())
                        });
                        if refusing.fetch_add(1, Ordering::SeqCst) < REFUSALS_IN_FLIGHT {
                            let refusing = refusing.clone();
                            crate::sim::spawn(async move {
                                refuse(socket, line).await;
                                refusing.fetch_sub(1, Ordering::SeqCst);
                            });
                        } else {
                            refusing.fetch_sub(1, Ordering::SeqCst);
                            drop(socket);
                        }
                        continue;
                    }
                };
                state.lock().unwrap().counters.connections_accepted += 1;
                let (state, tls) = (state.clone(), tls.clone());
                let mut stop = closing.subscribe();
                crate::sim::spawn(async move {
                    let _slot = slot;
                    socket.set_nodelay(true).ok();
                    // From accept, one deadline for the TLS handshake and the whole connect request
                    // (and, with auth_required, the login): silent or half-sent connections cannot
                    // hold the slots.
                    let now = tokio::time::Instant::now();
                    // A deadline past what the clock can hold means none worth counting: a day.
                    let by = now.checked_add(handshake_timeout).unwrap_or(now + Duration::from_secs(86_400));
                    let hello_by = Deadline(by, handshake_timeout);
                    let connection = async {
                        match tls {
                            None => serve(socket, peer, state, hello_by).await,
                            Some(tls) => {
                                let stream = hello_by
                                    .bound("TLS handshake", tls.accept(socket))
                                    .await?
                                    .map_err(|e| format!("TLS handshake: {e}"))?;
                                serve(stream, peer, state, hello_by).await
                            }
                        }
                    };
                    let result = tokio::select! {
                        r = connection => r,
                        _ = stop.wait_for(|c| *c) => Err("server stopping".to_string()),
                    };
                    if let Err(reason) = result {
                        tracing::info!(%peer, %reason, "connection closed");
                    }
                });
            }
        }
    }
    timers.abort();
    closing.send_replace(true);
    // A snapshot still being written finishes (and cleans up) before the server counts as stopped.
    let writer = state.lock().unwrap().persist.as_mut().and_then(|p| p.take_snapshot_writer());
    if let Some(writer) = writer {
        let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    }
}

/// Session expiry, container and TTL reaping.
///
/// No session expires because the server itself was slow: when this loop runs late (a long
/// request or snapshot held the state, the process was paused, the runtime was starved), every
/// session is credited with the delay before anything is expired. Clients could not be heard
/// meanwhile, so their silence says nothing. (Expiring later than the timeout is always safe for
/// locks: a client's lease only assumes the server cannot expire it *sooner*.)
async fn timers(state: Shared, tick: Duration) {
    let period = tick.min(Duration::from_millis(500));
    let mut every = tokio::time::interval(period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reap_at = tokio::time::Instant::now();
    let mut last_run = tokio::time::Instant::now();
    loop {
        every.tick().await;
        let due = {
            let mut s = state.lock().unwrap();
            // Measured from the start of the previous round, so a slow round of our own counts too.
            let started = tokio::time::Instant::now();
            let late = started.duration_since(last_run).saturating_sub(period);
            last_run = started;
            if late > period / 2 {
                tracing::warn!(late = ?late, "the server was slow; sessions get the time back before expiry");
                s.credit_sessions(late);
            }
            s.due_sessions()
        };
        for (round, sids) in due.chunks(crate::state::EXPIRE_PER_ROUND).enumerate() {
            if round > 0 {
                // The state's lock is not fair: a pause lets the requests waiting for it in.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            state.lock().unwrap().expire(sids);
        }
        if tokio::time::Instant::now() >= reap_at {
            let mut s = state.lock().unwrap();
            s.reap();
            reap_at = tokio::time::Instant::now() + s.config.container_check;
        }
        // Expiries and reaping wrote transactions; and nothing waits for the disk longer than a
        // round of this loop, whatever path wrote last.
        State::sync(&state);
    }
}

/// The instant by which a new connection must have said who it is (and the allowance, for errors).
#[derive(Clone, Copy)]
struct Deadline(tokio::time::Instant, Duration);

impl Deadline {
    /// `work`, or an error naming `what` once the deadline has passed.
    async fn bound<T>(self, what: &str, work: impl std::future::Future<Output = T>) -> Result<T, String> {
        tokio::time::timeout_at(self.0, work)
            .await
            .map_err(|_| format!("{what} not done within {:?} of connecting", self.1))
    }
}

async fn read_frame(
    socket: &mut (impl AsyncReadExt + Unpin),
    max: usize,
    first: Option<[u8; 4]>,
) -> Result<Vec<u8>, String> {
    let len_bytes = match first {
        Some(b) => b,
        None => {
            let mut b = [0u8; 4];
            socket.read_exact(&mut b).await.map_err(|e| format!("read: {e}"))?;
            b
        }
    };
    let len = i32::from_be_bytes(len_bytes);
    if len < 0 || len as usize > max {
        return Err(format!("frame length {len} outside 0..={max}"));
    }
    // Memory grows with the bytes that arrive, not with the length a client announces.
    let mut frame = Vec::with_capacity((len as usize).min(64 << 10));
    (&mut *socket).take(len as u64).read_to_end(&mut frame).await.map_err(|e| format!("read: {e}"))?;
    if frame.len() < len as usize {
        return Err(format!("truncated frame: {} of {len} bytes", frame.len()));
    }
    Ok(frame)
}

async fn serve<S>(mut socket: S, peer: SocketAddr, state: Shared, hello_by: Deadline) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let max_frame = state.lock().unwrap().config.max_frame;
    let mut first = [0u8; 4];
    hello_by.bound("connect request", socket.read_exact(&mut first)).await?.map_err(|e| format!("read: {e}"))?;
    if crate::FOUR_LETTER_WORDS.contains(&first) {
        let allowed = state.lock().unwrap().config.four_letter_words.contains(&first);
        let text = if allowed {
            four_letter_word(&first, &state)
        } else {
            // Apache ZooKeeper's answer to a word left out of 4lw.commands.whitelist.
            format!("{} is not executed because it is not in the whitelist.\n", String::from_utf8_lossy(&first))
        };
        let _ = hello_by.bound("four-letter word", socket.write_all(text.as_bytes())).await;
        let _ = socket.shutdown().await;
        return Ok(());
    }
    let frame = hello_by.bound("connect request", read_frame(&mut socket, max_frame, Some(first))).await??;
    let req = ConnectRequest::decode(&frame).map_err(|e| format!("bad connect request: {e}"))?;
    let conn_id = CONN_IDS.fetch_add(1, Ordering::Relaxed);
    let max_output = state.lock().unwrap().config.max_queued_output;
    let (tx, mut outbox) = Outbox::new(max_output);
    let connected = state.lock().unwrap().connect(&req, (conn_id, tx.clone()), Some(peer.ip()));
    let (response, sid) = match connected {
        Ok(c) => c,
        Err(why) => {
            let _ = socket.shutdown().await;
            return Err(why);
        }
    };
    // The new session is on disk before its client learns its id.
    State::sync(&state);
    let (reader, mut writer) = tokio::io::split(socket);
    let mut reader = tokio::io::BufReader::with_capacity(64 << 10, reader);
    writer.write_all(&response).await.map_err(|e| format!("write: {e}"))?;
    let Some(sid) = sid else {
        let _ = writer.shutdown().await;
        return Err(format!("session {:#x} expired or unknown", req.session_id));
    };
    // Set when the writer stops (the server closed the connection: session expired or moved), so
    // the reader stops too instead of waiting on a client that may never speak again.
    let (writer_done, mut closed) = tokio::sync::watch::channel(false);
    let writer_task = crate::sim::spawn(async move {
        let _done = DropSignal(writer_done);
        // Frames queued together leave in one write (a burst of replies released by one fsync, a
        // pipelining client's replies).
        let mut batch: Vec<u8> = Vec::new();
        loop {
            let mut next = tokio::select! {
                out = outbox.rx.recv() => match out {
                    Some(out) => Some(out),
                    None => return,
                },
                _ = outbox.overflow.notified() => return,
            };
            let mut close = None;
            batch.clear();
            while let Some(out) = next.take() {
                match out {
                    Outgoing::Frame(f) if batch.is_empty() && f.len() >= WRITE_BATCH => batch = f,
                    Outgoing::Frame(f) => batch.extend_from_slice(&f),
                    Outgoing::Close(why) => {
                        close = Some(why);
                        break;
                    }
                }
                if batch.len() < WRITE_BATCH {
                    next = outbox.rx.try_recv().ok();
                }
            }
            if !batch.is_empty() {
                let written = tokio::select! {
                    r = writer.write_all(&batch) => r.is_ok(),
                    _ = outbox.overflow.notified() => false,
                };
                if !written {
                    return;
                }
                outbox.written(batch.len());
                if batch.capacity() > 4 * WRITE_BATCH {
                    batch = Vec::new();
                }
            }
            if let Some(why) = close {
                tracing::debug!(why, "closing connection");
                let _ = writer.shutdown().await;
                return;
            }
        }
    });
    // With auth_required, a session that has not logged in by the handshake deadline is ended
    // there (pings would keep it, and its slot, for ever otherwise).
    let mut login_by = {
        let s = state.lock().unwrap();
        (s.config.auth_required && !s.logged_in(sid)).then_some(hello_by)
    };
    let result = async {
        loop {
            // Before waiting on the client, what it wrote goes to disk (and its replies out).
            // Requests already here are handled first: a pipelining client's writes share one
            // fsync.
            if reader.buffer().is_empty() {
                State::sync(&state);
            }
            let frame = tokio::select! {
                frame = read_frame(&mut reader, max_frame, None) => frame?,
                _ = closed.wait_for(|c| *c) => return Err("closed by the server".to_string()),
                // Only armed while the session has not logged in: a frame this cuts short is
                // never read (the connection closes).
                _ = tokio::time::sleep_until(login_by.map_or(hello_by.0, |d| d.0)), if login_by.is_some() => {
                    let mut s = state.lock().unwrap();
                    if s.is_current(sid, conn_id) && !s.logged_in(sid) {
                        s.end_unauthenticated(sid, &tx);
                        return Err(format!("no login within {:?} of connecting (the server requires one)", hello_by.1));
                    }
                    login_by = None;
                    continue;
                }
            };
            let mut s = state.lock().unwrap();
            if !s.is_current(sid, conn_id) {
                return Err("session ended or moved to another connection".to_string());
            }
            s.touch(sid);
            let started = std::time::Instant::now();
            let reply = s.handle(sid, &frame).map_err(|e| format!("malformed request: {e}"))?;
            let took = started.elapsed().as_micros() as u64;
            s.counters.record_latency(took);
            if let Some(op) = frame.get(4..8) {
                s.counters.record_op(i32::from_be_bytes([op[0], op[1], op[2], op[3]]), took);
            }
            if let Some(f) = reply.frame {
                s.counters.sent += 1;
                s.send(&tx, Outgoing::Frame(f));
            }
            if reply.close {
                s.send(&tx, Outgoing::Close("session closed".into()));
                return Ok(());
            }
            if login_by.is_some() && s.logged_in(sid) {
                login_by = None;
            }
        }
    }
    .await;
    State::sync(&state);
    state.lock().unwrap().disconnect(sid, conn_id);
    if result.is_err() {
        let _ = tx.send(Outgoing::Close("connection error".into()));
    }
    drop(tx);
    let _ = writer_task.await;
    result
}

/// Sets its flag when dropped (however the task holding it ends).
struct DropSignal(tokio::sync::watch::Sender<bool>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// The file descriptors the process has open, as `mntr` reports them.
pub(crate) fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// The process's limit on open files (its soft limit), as `mntr` reports it.
pub(crate) fn max_open_files() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The Apache ZooKeeper release whose client protocol the server speaks, as version strings show it.
const ZK_PROTOCOL_VERSION: &str = "3.8.4";

fn four_letter_word(word: &[u8; 4], state: &Shared) -> String {
    let s = state.lock().unwrap();
    // ZooKeeper's form (kazoo and others parse the leading x.y.z): the protocol we speak, then us.
    let version = format!("{ZK_PROTOCOL_VERSION}-distlock-{}, built on distlock-server", env!("CARGO_PKG_VERSION"));
    let f = s.figures();
    let (nodes, conns) = (f.znodes, f.alive);
    let (lat_min, lat_avg, lat_max) = s.counters.latency_ms();
    // One line per connected session, in `cons`'s shape.
    let clients: String = s
        .sessions
        .values()
        .filter(|x| x.conn.is_some())
        .map(|x| {
            let ip = x.addr.map(|a| a.to_string()).unwrap_or_else(|| "?".into());
            format!(" /{ip}[1](queued=0,sid={:#x},to={})\n", x.id, x.timeout_ms)
        })
        .collect();
    match word {
        b"ruok" => "imok".to_string(),
        b"isro" => "rw".to_string(),
        b"srvr" | b"stat" => {
            let mut out = format!(
                "Zookeeper version: {version}\nLatency min/avg/max: {lat_min}/{lat_avg:.4}/{lat_max}\nReceived: {}\nSent: {}\nConnections: {conns}\nOutstanding: {}\nZxid: {:#x}\nMode: standalone\nNode count: {nodes}\n",
                s.counters.received, s.counters.sent, f.outstanding, s.zxid
            );
            if word == b"stat" {
                out = out.replacen("Latency", &format!("Clients:\n{clients}\nLatency"), 1);
            }
            out
        }
        b"mntr" => format!(
            "zk_version\t{version}\nzk_avg_latency\t{lat_avg:.4}\nzk_max_latency\t{lat_max}\nzk_min_latency\t{lat_min}\nzk_server_state\tstandalone\nzk_packets_received\t{}\nzk_packets_sent\t{}\nzk_num_alive_connections\t{conns}\nzk_outstanding_requests\t{}\nzk_znode_count\t{nodes}\nzk_watch_count\t{}\nzk_ephemerals_count\t{}\nzk_approximate_data_size\t{}\nzk_cnt_fsynctime\t{}\nzk_sum_fsynctime\t{}\nzk_max_fsynctime\t{}\nzk_open_file_descriptor_count\t{}\nzk_max_file_descriptor_count\t{}\nzk_global_sessions\t{}\n",
            s.counters.received,
            s.counters.sent,
            f.outstanding,
            f.watches,
            f.ephemerals,
            f.data_size,
            s.counters.fsyncs,
            s.counters.fsync_sum_us / 1000,
            s.counters.fsync_max_us / 1000,
            open_files(),
            max_open_files(),
            s.session_count(),
        ),
        b"conf" => format!(
            "clientPort=?\ntickTime={}\nminSessionTimeout={}\nmaxSessionTimeout={}\nmaxClientCnxns={}\n",
            s.config.tick.as_millis(),
            s.config.tick.as_millis() * 2,
            s.config.tick.as_millis() * 20,
            // ZooKeeper's maxClientCnxns is per address, as ours is.
            s.config.max_connections_per_address
        ),
        b"envi" => format!("Environment:\nzookeeper.version={version}\n"),
        b"wchs" => format!("{} connections watching {} paths\nTotal watches:{}\n", conns, f.watches, f.watches),
        b"dump" => format!("SessionTracker dump:\nSession count: {}\n", s.sessions.len()),
        b"cons" => format!("{clients}\n"),
        _ => String::new(),
    }
}

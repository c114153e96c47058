//! Wake-ups for waiters: one pub/sub connection per client, subscribed to the release channel of
//! every lock someone in this process waits for.
//!
//! A waiter registers its channel ([`Wakeups::register`]), makes sure the server confirmed the
//! subscription ([`Wakeups::ensure`]), arms its [`Notify`] and only then tries the lock, so a
//! release published between the attempt and the wait still wakes it. A message wakes every
//! waiter of that channel in this process (they race for the lock; losers wait again). When the
//! pub/sub connection fails, every waiter is woken and the next `ensure` reconnects; until then
//! waiters re-check at short intervals instead of trusting a silent channel.
//!
//! On a cluster the channels are sharded (SSUBSCRIBE, answered by SPUBLISH in the release
//! scripts), on a RESP3 cluster connection of the client's own whose push messages land here.
//!
//! The same connection tells the client's sentry (`sentry.rs`) when the server went away: while
//! locks are held it is kept open, subscribed or not, and its end ([`Wakeups::ended`]) comes as
//! soon as the server closes it (a restart, a crash), long before the next renewal would fail.
//! A connection that is replaced (the master moved) or whose client is gone is closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::sync::{Mutex, Notify};

#[derive(Debug)]
struct Channel {
    users: usize,
    notify: Arc<Notify>,
    /// The connection generation the server confirmed our SUBSCRIBE on (0: none).
    subscribed: u64,
}

#[derive(Debug, Default)]
struct Shared {
    channels: StdMutex<HashMap<String, Channel>>,
    /// The latest connection generation whose message stream has ended.
    ended: std::sync::atomic::AtomicU64,
    /// Told whenever a connection's message stream ends.
    ended_notify: Notify,
    /// Connections of this generation and older are to be closed (replaced, or the client is
    /// gone); `retire` tells their readers.
    retired: std::sync::atomic::AtomicU64,
    retire: Notify,
}

/// The pub/sub side of a client.
pub(crate) struct Wakeups {
    /// Where to open the pub/sub connection (the master; replaced when the master moves).
    client: StdMutex<Option<redis::Client>>,
    timeout: Duration,
    shared: Arc<Shared>,
    /// The live connection's sink and its generation; `None` before the first use or after a
    /// failure. Held across SUBSCRIBE so that subscriptions and unsubscriptions are ordered.
    sink: Mutex<Option<(redis::aio::PubSubSink, u64)>>,
    generation: std::sync::atomic::AtomicU64,
    /// On a cluster: the URL, and the RESP3 connection whose pushes [`Wakeups::push_sender`]
    /// receives (replaced when a SSUBSCRIBE fails: its node may have gone silent).
    cluster: Option<super::RedisUrl>,
    sharded: StdMutex<Option<redis::cluster_async::ClusterConnection>>,
}

/// What a cluster connection calls with each push message.
pub(crate) type PushSender = Box<dyn Fn(redis::PushInfo) -> Result<(), ()> + Send + Sync>;

/// The generation cluster subscriptions are recorded under (the crate resubscribes them itself
/// after a reconnection; a disconnection clears them so that waiters re-check and resubscribe).
const CLUSTER: u64 = 1;

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups").finish_non_exhaustive()
    }
}

/// A waiter's interest in one channel; unsubscribes when the last one is dropped.
pub(crate) struct Registration {
    wakeups: Arc<Wakeups>,
    channel: String,
    pub(crate) notify: Arc<Notify>,
}

impl Wakeups {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Wakeups {
        Wakeups {
            client: StdMutex::new(Some(client)),
            timeout,
            shared: Arc::default(),
            sink: Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            cluster: None,
            sharded: StdMutex::new(None),
        }
    }

    /// Wake-ups on a cluster (the connection is opened on first use).
    pub(crate) fn cluster(url: super::RedisUrl) -> Wakeups {
        Wakeups {
            client: StdMutex::new(None),
            timeout: super::response_timeout(&url),
            shared: Arc::default(),
            sink: Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            cluster: Some(url),
            sharded: StdMutex::new(None),
        }
    }

    fn sharded_conn(&self) -> Option<redis::cluster_async::ClusterConnection> {
        self.sharded.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Delivers a cluster connection's sharded messages to the waiters; a disconnection wakes
    /// them all (they may have missed a message) and marks every subscription unconfirmed.
    pub(crate) fn push_sender(&self) -> PushSender {
        let shared = self.shared.clone();
        Box::new(move |push: redis::PushInfo| {
            let mut map = shared.channels.lock().unwrap_or_else(|e| e.into_inner());
            match push.kind {
                redis::PushKind::SMessage | redis::PushKind::Message => {
                    let channel = push.data.first().and_then(|v| redis::from_redis_value_ref::<String>(v).ok());
                    if let Some(c) = channel.and_then(|ch| map.get(&ch)) {
                        c.notify.notify_waiters();
                    }
                }
                redis::PushKind::Disconnection => {
                    tracing::debug!("cluster pub/sub connection dropped; waiters re-check");
                    for c in map.values_mut() {
                        c.subscribed = 0;
                        c.notify.notify_waiters();
                    }
                }
                _ => {}
            }
            Ok(())
        })
    }

    /// `ensure` on a cluster: SSUBSCRIBE through the cluster connection; when that fails, the
    /// connection is opened afresh (learning the layout again) for the next call.
    async fn ensure_sharded(&self, url: &super::RedisUrl, channel: &str) -> bool {
        let _ordered = self.sink.lock().await;
        let conn = match self.sharded_conn() {
            Some(conn) => conn,
            None => {
                let nodes = url.cluster.as_deref().unwrap_or_default();
                match super::open_cluster(url, nodes, Some(self.push_sender())).await {
                    Ok(conn) => {
                        let mut map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
                        map.values_mut().for_each(|c| c.subscribed = 0);
                        drop(map);
                        *self.sharded.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
                        conn
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot open the cluster pub/sub connection");
                        return false;
                    }
                }
            }
        };
        let confirmed = {
            let map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
            map.get(channel).map(|c| c.subscribed == CLUSTER)
        };
        match confirmed {
            None => return false,
            Some(true) => return true,
            Some(false) => {}
        }
        match tokio::time::timeout(self.timeout, conn.clone().ssubscribe(channel)).await {
            Ok(Ok(())) => {
                let mut map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = map.get_mut(channel) {
                    c.subscribed = CLUSTER;
                }
                true
            }
            failed => {
                tracing::debug!(channel, ?failed, "SSUBSCRIBE failed; the cluster pub/sub connection is reopened");
                *self.sharded.lock().unwrap_or_else(|e| e.into_inner()) = None;
                false
            }
        }
    }

    pub(crate) fn register(self: &Arc<Self>, channel: &str) -> Registration {
        let mut map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(channel.to_string()).or_insert_with(|| Channel {
            users: 0,
            notify: Arc::new(Notify::new()),
            subscribed: 0,
        });
        entry.users += 1;
        Registration { wakeups: self.clone(), channel: channel.to_string(), notify: entry.notify.clone() }
    }

    /// True once the server has confirmed our subscription to `channel` on the live connection
    /// (connecting first if needed); false if that failed (waiters then re-check often).
    pub(crate) async fn ensure(&self, channel: &str) -> bool {
        if let Some(url) = &self.cluster {
            return self.ensure_sharded(url, channel).await;
        }
        let mut sink = self.sink.lock().await;
        let Some(generation) = self.open(&mut sink).await else { return false };
        let Some((s, _)) = sink.as_mut() else { return false };
        let confirmed = {
            let map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
            map.get(channel).map(|c| c.subscribed == generation)
        };
        match confirmed {
            None => return false, // nobody waits any more
            Some(true) => return true,
            Some(false) => {}
        }
        match tokio::time::timeout(self.timeout, s.subscribe(channel)).await {
            Ok(Ok(())) => {
                let mut map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = map.get_mut(channel) {
                    c.subscribed = generation;
                }
                true
            }
            failed => {
                tracing::debug!(channel, ?failed, "SUBSCRIBE failed; the pub/sub connection is reopened");
                *sink = None;
                self.retire(generation);
                false
            }
        }
    }
}

impl Wakeups {
    /// The live pub/sub connection's generation, opening one if there is none (or the last one
    /// ended); `None` if none can be opened now. Called with the sink locked.
    async fn open(&self, sink: &mut Option<(redis::aio::PubSubSink, u64)>) -> Option<u64> {
        use std::sync::atomic::Ordering::SeqCst;
        if sink.as_ref().is_some_and(|(_, g)| self.shared.ended.load(SeqCst) >= *g) {
            *sink = None; // its connection ended: open another
        }
        if let Some((_, generation)) = sink.as_ref() {
            return Some(*generation);
        }
        let client = self.client.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        match tokio::time::timeout(self.timeout, client.get_async_pubsub()).await {
            Ok(Ok(pubsub)) => {
                let (s, stream) = pubsub.split();
                let generation = self.generation.fetch_add(1, SeqCst) + 1;
                tokio::spawn(read_messages(stream, self.shared.clone(), generation));
                *sink = Some((s, generation));
                Some(generation)
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot open the pub/sub connection");
                None
            }
            Err(_) => None,
        }
    }

    /// For the sentry: the pub/sub connection's generation, opened if needed (not on a cluster,
    /// whose nodes each have their own); `None` if it cannot be opened now.
    pub(crate) async fn watch(&self) -> Option<u64> {
        if self.cluster.is_some() {
            return None;
        }
        let mut sink = self.sink.lock().await;
        self.open(&mut sink).await
    }

    /// Closes the connections of `generation` and older (their readers end, and say so).
    fn retire(&self, generation: u64) {
        self.shared.retired.fetch_max(generation, std::sync::atomic::Ordering::SeqCst);
        self.shared.retire.notify_waiters();
    }

    /// Resolves once the connection of `generation` has ended (the server closed it, or it was
    /// replaced). Holds nothing of the client's.
    pub(crate) fn ended(&self, generation: u64) -> impl std::future::Future<Output = ()> + Send + 'static {
        let shared = self.shared.clone();
        async move {
            loop {
                let notified = shared.ended_notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if shared.ended.load(std::sync::atomic::Ordering::SeqCst) >= generation {
                    return;
                }
                notified.await;
            }
        }
    }

    /// The master moved: subscribe there from now on, and wake every waiter to re-check.
    pub(crate) async fn retarget(&self, client: redis::Client) {
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
        let mut sink = self.sink.lock().await;
        *sink = None;
        // The old master's connection is closed (it would otherwise linger while that server
        // lives, silent: no release is published there any more).
        self.retire(self.generation.load(std::sync::atomic::Ordering::SeqCst));
        let mut map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
        for c in map.values_mut() {
            c.subscribed = 0;
            c.notify.notify_waiters();
        }
    }
}

/// Delivers messages until the connection ends (or is retired, and then closed); then wakes
/// everyone (they may have missed one), marks the subscriptions made on it as gone (not those of
/// a newer connection), and tells the sentry.
async fn read_messages(mut stream: redis::aio::PubSubStream, shared: Arc<Shared>, generation: u64) {
    use futures::StreamExt;
    loop {
        let retire = shared.retire.notified();
        tokio::pin!(retire);
        retire.as_mut().enable();
        if shared.retired.load(std::sync::atomic::Ordering::SeqCst) >= generation {
            break;
        }
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else { break };
                let channel = msg.get_channel_name().to_string();
                let map = shared.channels.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = map.get(&channel) {
                    c.notify.notify_waiters();
                }
            }
            _ = &mut retire => {}
        }
    }
    drop(stream); // closes the connection, if it was retired while open
    tracing::debug!(generation, "pub/sub connection ended; waiters re-check");
    shared.ended.fetch_max(generation, std::sync::atomic::Ordering::SeqCst);
    {
        let mut map = shared.channels.lock().unwrap_or_else(|e| e.into_inner());
        for c in map.values_mut() {
            if c.subscribed == generation {
                c.subscribed = 0;
            }
            c.notify.notify_waiters();
        }
    }
    shared.ended_notify.notify_waiters();
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        // The client is gone: close its pub/sub connection (its reader would keep it open).
        self.shared.retired.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
        self.shared.retire.notify_waiters();
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let last = {
            let mut map = self.wakeups.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
            let Some(c) = map.get_mut(&self.channel) else { return };
            c.users -= 1;
            c.users == 0
        };
        if !last {
            return;
        }
        let (wakeups, channel) = (self.wakeups.clone(), self.channel.clone());
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        handle.spawn(async move {
            let mut sink = wakeups.sink.lock().await;
            // Under the sink lock: a new waiter may have come meanwhile, and keeps the channel.
            let removed = {
                let mut map = wakeups.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
                match map.get(&channel) {
                    Some(c) if c.users == 0 => map.remove(&channel).is_some(),
                    _ => false,
                }
            };
            // Whether or not a SUBSCRIBE was confirmed: one cancelled in flight may still have
            // reached the server, and UNSUBSCRIBE from a channel not subscribed is harmless.
            if let (true, Some(conn)) = (removed, wakeups.sharded_conn()) {
                let _ = tokio::time::timeout(wakeups.timeout, conn.clone().sunsubscribe(&channel)).await;
            } else if let (true, Some((s, generation))) = (removed, sink.as_mut()) {
                let generation = *generation;
                if tokio::time::timeout(wakeups.timeout, s.unsubscribe(&channel)).await.is_err() {
                    *sink = None;
                    wakeups.retire(generation);
                }
            }
        });
    }
}

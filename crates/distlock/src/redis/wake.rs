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
        if sink.is_none() {
            let Some(client) = self.client.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return false };
            match tokio::time::timeout(self.timeout, client.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => {
                    let (s, stream) = pubsub.split();
                    let generation = self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    tokio::spawn(read_messages(stream, self.shared.clone(), generation));
                    *sink = Some((s, generation));
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "cannot open the pub/sub connection");
                    return false;
                }
                Err(_) => return false,
            }
        }
        if sink.as_ref().is_some_and(|(_, g)| self.shared.ended.load(std::sync::atomic::Ordering::SeqCst) >= *g) {
            *sink = None; // its connection ended: open another on the next call
            return false;
        }
        let Some((s, generation)) = sink.as_mut() else { return false };
        let generation = *generation;
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
                false
            }
        }
    }
}

impl Wakeups {
    /// The master moved: subscribe there from now on, and wake every waiter to re-check.
    pub(crate) async fn retarget(&self, client: redis::Client) {
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
        let mut sink = self.sink.lock().await;
        *sink = None;
        let mut map = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
        for c in map.values_mut() {
            c.subscribed = 0;
            c.notify.notify_waiters();
        }
    }
}

/// Delivers messages until the connection ends; then wakes everyone (they may have missed one)
/// and marks the subscriptions made on it as gone (not those of a newer connection).
async fn read_messages(mut stream: redis::aio::PubSubStream, shared: Arc<Shared>, generation: u64) {
    use futures::StreamExt;
    while let Some(msg) = stream.next().await {
        let channel = msg.get_channel_name().to_string();
        let map = shared.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(&channel) {
            c.notify.notify_waiters();
        }
    }
    tracing::debug!(generation, "pub/sub connection ended; waiters re-check");
    shared.ended.fetch_max(generation, std::sync::atomic::Ordering::SeqCst);
    let mut map = shared.channels.lock().unwrap_or_else(|e| e.into_inner());
    for c in map.values_mut() {
        if c.subscribed == generation {
            c.subscribed = 0;
        }
        c.notify.notify_waiters();
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
            } else if let (true, Some((s, _))) = (removed, sink.as_mut()) {
                if tokio::time::timeout(wakeups.timeout, s.unsubscribe(&channel)).await.is_err() {
                    *sink = None;
                }
            }
        });
    }
}

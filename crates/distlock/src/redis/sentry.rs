//! The sentry: while a client holds locks, it notices at once when the server went away or was
//! replaced, and has the watchdog check every hold then instead of at its next renewal.
//!
//! The redis crate's reconnecting connection says nothing when it reconnects, and an idle one
//! does not even notice that its server is gone until the next request. So the sentry keeps the
//! client's pub/sub connection open (the one waiters share; unsubscribed, it costs the server
//! nothing) and waits for it to end: a server that restarts, crashes or is shut down closes it
//! at once. Then every hold is renewed at once; those whose keys the server lost (a restart
//! without persistence) are reported `Lost(KeyDeleted)` as soon as the server answers again.
//!
//! Each time the sentry (re)opens that connection, it also asks the server for its run id
//! (`INFO server`): a run id other than the one the holds were confirmed on means the server was
//! restarted (or another one took its address) while nobody was looking, and every hold is
//! checked too. Requests that fail with a connection error and then succeed do the same (see
//! `Client::answered`).
//!
//! It starts shortly after a client's first hold (holds shorter than that never pay for it; the
//! run id check covers anything that happened meanwhile) and ends when the client holds nothing.
//! It keeps only a weak reference to the client. Not on a cluster, whose connection is the redis
//! crate's own.

use super::{Client, Inner};
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

/// How long after a client's first hold the sentry starts watching.
const START_AFTER: Duration = Duration::from_millis(500);
/// First and longest pause between attempts to open the watched connection.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// How often a quiet sentry looks whether anything is still held.
const LOOK_EVERY: Duration = Duration::from_secs(10);

/// Watches the server for `client` while it holds locks (a task; see the module docs).
pub(crate) async fn run(weak: Weak<Inner>) {
    tokio::time::sleep(START_AFTER).await;
    // The connection generation last checked against the server's run id.
    let mut checked = 0u64;
    let mut pause = RETRY_MIN;
    loop {
        let (ended, look) = {
            let Some(inner) = weak.upgrade() else { return };
            if !keep_watching(&inner) {
                return;
            }
            let client = Client { inner };
            let look = (client.lease() / 3).clamp(RETRY_MAX, LOOK_EVERY);
            // A connection not yet checked against the server's run id is checked first; one
            // that cannot be (the server does not answer yet) is tried again shortly.
            let watched = match client.inner.wake.watch().await {
                Some(generation) if generation == checked => Some(generation),
                Some(generation) => {
                    if client.revalidate().await {
                        checked = generation;
                        Some(generation)
                    } else {
                        None
                    }
                }
                None => None,
            };
            (watched.map(|generation| client.inner.wake.ended(generation)), look)
        };
        match ended {
            Some(ended) => {
                pause = RETRY_MIN;
                tokio::select! {
                    _ = ended => {
                        let Some(inner) = weak.upgrade() else { return };
                        if inner.holds.load(Ordering::SeqCst) > 0 {
                            tracing::info!(
                                url = %inner.url,
                                "the connection to the Redis server ended; checking every held lock at once"
                            );
                            inner.watchdog.check_now();
                        }
                    }
                    _ = tokio::time::sleep(look) => {}
                }
            }
            None => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }
}

/// True while the client holds anything. Otherwise the sentry ends: it forgets its own task
/// under the lock a new hold takes to start one, so a hold that begins now starts another.
fn keep_watching(inner: &Inner) -> bool {
    let mut task = inner.sentry.lock().unwrap_or_else(|e| e.into_inner());
    if inner.holds.load(Ordering::SeqCst) > 0 {
        return true;
    }
    *task = None;
    false
}

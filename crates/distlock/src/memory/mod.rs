//! An in-process backend for tests: `memory://NAME`. No server, no port, no real time: the
//! locks live in this process, and their leases run on tokio's clock, so a test under
//! [`tokio::time::pause`][pause] sees a lease run out, a `lost()` fire and a token rise at the
//! instant it advances to, every run.
//!
//! [pause]: https://docs.rs/tokio/latest/tokio/time/fn.pause.html
//!
//! It keeps the one contract as the server-backed backends do: every lock kind (the mutex,
//! read/write locks, semaphores), elections, scheduled jobs, listing; first come first served
//! (a waiter is never overtaken); fencing tokens that rise per lock; a holder that stops
//! renewing loses its lock at its lease deadline, before the store hands the lock on. Clients
//! connected to the same `memory://NAME` share one store, which lives as long as the process
//! (as a server outlives its clients: give each test a name of its own); `memory://` alone is a
//! store of its own, shared with nobody. Keep a store to one tokio runtime (its leases run on
//! that runtime's clock).
//!
//! URL keys: `lease` (or `ttl`, `session_timeout`; default 30 s, from 100 ms to 1 day),
//! `connect_timeout` (taken, and met at once), `setup` (`setup=no` refuses a name no client of
//! this process has connected to yet, as an unused database is refused elsewhere).
//!
//! To test how code behaves when its holder goes silent, [`Client::partition`] cuts one client
//! off as a silent network partition would: its renewals and releases wait for the partition
//! to end, so its locks are lost at their lease deadline and then handed on; [`Client::heal`]
//! ends it.
//!
//! # Examples
//!
//! A unit test of code that stops its work when its lock is lost:
//!
//! ```
//! use std::time::Duration;
//!
//! #[tokio::main(flavor = "current_thread", start_paused = true)]
//! async fn main() -> distlock::Result<()> {
//!     let ours = distlock::connect("memory://orders-test?lease=10s").await?;
//!     let theirs = distlock::connect("memory://orders-test?lease=10s").await?;
//!     let guard = ours.mutex("orders")?.lock().await?;
//!     assert_eq!(guard.fencing_token(), 1);
//!
//!     // Our client goes silent: the lock is lost at its deadline, then another may take it.
//!     ours.downcast::<distlock::memory::Client>().unwrap().partition();
//!     let started = tokio::time::Instant::now();
//!     let reason = guard.lost().await;
//!     assert_eq!(reason, distlock::LostReason::LeaseExpired);
//!     assert!(started.elapsed() < Duration::from_secs(10));
//!     let next = theirs.mutex("orders")?.lock().await?;
//!     assert!(started.elapsed() >= Duration::from_secs(10));
//!     assert_eq!(next.fencing_token(), 2);
//!     next.release().await
//! }
//! ```

mod contract;
mod lock;
mod store;

pub(crate) use contract::connect;

use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;
use store::Store;

/// The lease when the URL does not give one.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease: well above the margin a guard's deadline keeps from it (2% + 2 ms).
const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest lease.
const MAX_LEASE: Duration = Duration::from_secs(86_400);

/// The keys of a `memory://` URL's query: the common ones only.
const QUERY: crate::options::QuerySpec = crate::options::QuerySpec {
    lease_name: "lease",
    keys: &[],
    tls: crate::options::TlsKeys::Refused("an in-process store is reached without a network, so without TLS"),
    connections: crate::options::ConnectionKeys::Refused(
        "an in-process store is reached without server connections (the key is for PostgreSQL and MariaDB, whose locks live in server sessions)",
    ),
    pairs_need_values: false,
};

/// A parsed `memory://NAME?lease=…` URL.
///
/// The URL's keys are its configuration: a `MemoryUrl` is made by [`parse`](Self::parse) only, and
/// read through its accessors ([`name`](Self::name), [`lease`](Self::lease),
/// [`setup`](Self::setup)). Other settings are another URL (change its keys), or
/// [`ConnectOptions`](crate::ConnectOptions) given to [`connect_with`](crate::connect_with).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let url = distlock::memory::MemoryUrl::parse("memory://orders-test?ttl=5s").unwrap();
/// assert_eq!(url.name(), "orders-test");
/// assert_eq!(url.lease(), Duration::from_secs(5));
/// assert!(distlock::memory::MemoryUrl::parse("memory://x?cacert=/ca.pem").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryUrl {
    /// The store's name: clients of one process with the same name share it (empty: a store of
    /// this client's own).
    name: String,
    /// How long the store keeps a silent holder's lock.
    lease: Duration,
    /// `false` for `setup=no`: refuse a name no client of this process has connected to.
    setup: bool,
}

impl MemoryUrl {
    /// The store's name: clients of one process with the same name share it (empty: a store of
    /// this client's own).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How long the store keeps a silent holder's lock (`lease=`, default 30 s).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// `false` for `setup=no`: connecting refuses a name no client of this process has
    /// connected to.
    pub fn setup(&self) -> bool {
        self.setup
    }

    /// Parses a `memory://NAME` URL.
    pub fn parse(url: &str) -> Result<MemoryUrl> {
        Self::parse_with(url, &Default::default())
    }

    /// As [`parse`](Self::parse), with `over`'s values (from [`crate::ConnectOptions`]) in place of
    /// the URL's.
    pub(crate) fn parse_with(url: &str, over: &crate::options::Common) -> Result<MemoryUrl> {
        let bad = |reason: String| Error::InvalidUrl { url: url.to_string(), reason };
        let rest =
            url.strip_prefix("memory://").ok_or_else(|| bad("an in-process store's URL is memory://NAME".into()))?;
        let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
        if name.chars().any(|c| c == '/' || c.is_control()) {
            return Err(bad(format!("store name {name:?}: a name is one word (no / or control characters)")));
        }
        // connect_timeout is taken, and met at once.
        let (common, _) = QUERY.parse(query).map_err(&bad)?;
        let common = QUERY.merge(common, over).map_err(&bad)?;
        let out = MemoryUrl {
            name: name.to_string(),
            lease: common.lease.unwrap_or(DEFAULT_LEASE),
            setup: common.setup.unwrap_or(true),
        };
        if !(MIN_LEASE..=MAX_LEASE).contains(&out.lease) {
            return Err(bad(format!("lease={} must be from 100ms to 1 day", humantime::format_duration(out.lease))));
        }
        Ok(out)
    }
}

/// The named stores of this process.
fn stores() -> &'static StdMutex<HashMap<String, Arc<Store>>> {
    static STORES: OnceLock<StdMutex<HashMap<String, Arc<Store>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// A client of an in-process store. Cheap to clone; clones share the store and the partition
/// switch.
#[derive(Debug, Clone)]
pub struct Client {
    store: Arc<Store>,
    url: MemoryUrl,
    /// `true` from [`Client::partition`] to [`Client::heal`]: nothing this client sends
    /// reaches the store meanwhile.
    cut: Arc<tokio::sync::watch::Sender<bool>>,
    /// Renews every lock this client (and its clones) holds, in one change of the store.
    watchdog: Arc<crate::watchdog::Watchdog<lock::Renew>>,
}

impl Client {
    /// Connects to the store `url` names (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for a URL that does not parse; [`Error::NotSetUp`] with `setup=no`
    /// for a store no client of this process has connected to.
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_common(url, &Default::default()).await
    }

    /// As [`connect`](Self::connect), with `over`'s values (from [`crate::ConnectOptions`]) in
    /// place of the URL's.
    pub(crate) async fn connect_common(url: &str, over: &crate::options::Common) -> Result<Client> {
        let url = MemoryUrl::parse_with(url, over)?;
        let store = if url.name.is_empty() {
            if !url.setup {
                return Err(not_set_up(&url));
            }
            Arc::new(Store::new())
        } else {
            let mut stores = stores().lock().unwrap_or_else(|e| e.into_inner());
            match stores.get(&url.name) {
                Some(store) => store.clone(),
                None if !url.setup => return Err(not_set_up(&url)),
                None => stores.entry(url.name.clone()).or_insert_with(|| Arc::new(Store::new())).clone(),
            }
        };
        let watchdog = Arc::new(crate::watchdog::Watchdog::new(url.lease / 3));
        Ok(Client { store, url, cut: Arc::new(tokio::sync::watch::channel(false).0), watchdog })
    }

    /// The URL this client was made from.
    pub fn url(&self) -> &MemoryUrl {
        &self.url
    }

    /// How long the store keeps this client's silent locks.
    pub fn lease(&self) -> Duration {
        self.url.lease
    }

    /// Cuts this client off from the store, as a silent network partition would: its renewals,
    /// waiting acquires and releases wait for [`Client::heal`] (a release at most until the
    /// lease is over: then it fails with [`Error::LockLost`]), so its locks run out at their
    /// lease (their guards report the loss at their deadline, before the store hands them on);
    /// what cannot wait (a `try_lock`, a listing, reading a leader or a job) fails at once, as a
    /// request timing out would. Clones of this client are cut off with it; other clients of the
    /// store are not.
    pub fn partition(&self) {
        self.cut.send_replace(true);
    }

    /// Ends a [`Client::partition`]: what waited reaches the store now (locks already run out
    /// stay lost).
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Resolves once this client is not cut off.
    async fn arrive(&self) {
        let mut cut = self.cut.subscribe();
        let _ = cut.wait_for(|cut| !cut).await;
    }

    /// Closes the client: nothing to wait for (its guards release as they are dropped).
    pub async fn close(self, _bound: Duration) {}

    /// `Ok` unless the client is cut off, when `op` on `path` fails as an unanswered request
    /// would.
    fn reach(&self, op: &'static str, path: &str) -> Result<()> {
        if *self.cut.borrow() {
            return Err(Error::Backend {
                op,
                path: path.to_string(),
                source: format!(
                    "the client of memory://{} is cut off from its store (Client::partition)",
                    self.url.name
                )
                .into(),
            });
        }
        Ok(())
    }
}

fn not_set_up(url: &MemoryUrl) -> Error {
    Error::NotSetUp {
        url: format!("memory://{}", url.name),
        what: "the in-process store (no client of this process has connected to it)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_their_errors() {
        let u = MemoryUrl::parse("memory://t?lease=1500ms&connect_timeout=1s&setup=no").unwrap();
        assert_eq!((u.name.as_str(), u.lease, u.setup), ("t", Duration::from_millis(1500), false));
        assert_eq!(MemoryUrl::parse("memory://").unwrap().name, "");
        crate::assert_refused(
            MemoryUrl::parse,
            &[
                ("memory://a/b", "one word"),
                ("memory://x?lease=0s", "lease"),
                ("memory://x?lease=50ms", "100ms"),
                ("memory://x?lease=300000000000y", "lease"),
                ("memory://x?key=/k.pem", "TLS"),
                ("memory://x?nope=1", "nope"),
                ("memory://x?setup=maybe", "setup=maybe"),
                ("redis://x", "memory://"),
            ],
        );
    }
}

#[cfg(test)]
mod behaviour_tests;
#[cfg(test)]
mod sim_tests;

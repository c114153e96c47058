//! Every lock under a prefix, in one shape on every backend: what `distlock inspect --all` and
//! `distlock top` show. Each backend fills it from what its server records (see
//! [`crate::Client::locks`]); what a server does not record is said in [`Listing::unseen`],
//! never guessed.

use serde::Serialize;

/// The most locks one listing returns; [`Listing::truncated`] says when there were more.
pub const MAX_LOCKS: usize = 1000;

/// The locks in use under a prefix, from [`crate::Client::locks`].
///
/// # Examples
///
/// ```
/// use distlock::listing::{Entry, Listing, LockInfo};
/// let listing = Listing {
///     backend: "sqlite", prefix: String::new(), truncated: false, unseen: vec![],
///     locks: vec![LockInfo {
///         name: "orders".into(), recipe: "mutex".into(), permits: None, last_token: Some(7),
///         entries: vec![Entry { holds: true, mode: "exclusive".into(), owner: "web-1 pid 42".into(),
///             id: "web-1:42:0a1b".into(), since_ms: Some(1500), token: Some(7), lease_left_ms: Some(8500) }],
///     }],
/// };
/// assert_eq!(listing.locks[0].holders().count(), 1);
/// assert_eq!(listing.locks[0].waiters().count(), 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// `zookeeper`, `redis`, `postgres`, `mysql`, `sqlite`, `etcd` or `memory`.
    pub backend: &'static str,
    /// The prefix asked for, as given; on ZooKeeper the path it means (a bare name prefix,
    /// or none, is under `/distlock/`), so that a listing says where it looked.
    pub prefix: String,
    /// Locks with at least one holder or waiter, by name.
    pub locks: Vec<LockInfo>,
    /// More than [`MAX_LOCKS`] locks matched; the rest are left out.
    pub truncated: bool,
    /// What this backend's server does not record, so the listing cannot show it (for example
    /// the waiters of a Redis lock, which wait on a channel).
    pub unseen: Vec<String>,
}

/// One lock in a [`Listing`].
///
/// # Examples
///
/// ```
/// let lock = distlock::listing::LockInfo {
///     name: "/distlock/orders".into(), recipe: "mutex".into(), permits: None,
///     last_token: None, entries: vec![],
/// };
/// assert!(lock.holders().next().is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockInfo {
    /// The lock's name on the server (a znode path on ZooKeeper, a key or name elsewhere).
    pub name: String,
    /// `mutex`, `rwlock`, `semaphore`, `naive` (ZooKeeper's one-node lock) or `lease` (SQLite's
    /// lease row).
    pub recipe: String,
    /// A semaphore's permit count, where its holders record it.
    pub permits: Option<u32>,
    /// The highest fencing token known for this lock, if the backend keeps one per lock.
    pub last_token: Option<u64>,
    /// Holders first, then waiters, in queue order where the backend has a queue.
    pub entries: Vec<Entry>,
}

impl LockInfo {
    /// The entries that hold the lock (a share or a permit).
    pub fn holders(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.holds)
    }

    /// The entries that wait, in queue order.
    pub fn waiters(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| !e.holds)
    }
}

/// A holder or a waiter of one lock.
///
/// # Examples
///
/// ```
/// let e = distlock::listing::Entry {
///     holds: false, mode: "write".into(), owner: "10.0.0.7".into(), id: "_c_x-__WRIT__0000000003".into(),
///     since_ms: Some(200), token: None, lease_left_ms: None,
/// };
/// assert!(!e.holds);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Holds (`true`) or waits.
    pub holds: bool,
    /// `exclusive`, `read`, `write` or `permit`.
    pub mode: String,
    /// Who: `host pid N` where the backend records it (distlock's owner record, the SQLite
    /// holder column), else what the server knows (a client address, a connection id), or `-`.
    pub owner: String,
    /// The entry on the server: a node, a hash field, a session or connection id, a key.
    pub id: String,
    /// How long it has held or waited, where the server records a start.
    pub since_ms: Option<u64>,
    /// Its fencing token, where the backend can tell a holder's own.
    pub token: Option<u64>,
    /// Time left on its lease or TTL, for backends whose locks expire.
    pub lease_left_ms: Option<u64>,
}

impl Entry {
    /// An entry with only its role, mode, owner and id known.
    pub(crate) fn new(holds: bool, mode: &str, owner: String, id: String) -> Entry {
        Entry { holds, mode: mode.to_string(), owner, id, since_ms: None, token: None, lease_left_ms: None }
    }
}

/// What [`crate::Client::inspect`] found of one lock.
pub(crate) enum Found {
    /// The lock in use, or as the server records it.
    Lock(LockInfo),
    /// Nothing in use: the lock is free, a `recipe` with this last token if known.
    Free { recipe: &'static str, last_token: Option<u64> },
}

impl Listing {
    /// A listing of the one lock `name`, for [`crate::Client::inspect`].
    pub(crate) fn one(backend: &'static str, name: &str, found: Found, unseen: Vec<String>) -> Listing {
        let info = match found {
            Found::Lock(info) => info,
            Found::Free { recipe, last_token } => {
                LockInfo { name: name.to_string(), recipe: recipe.into(), permits: None, last_token, entries: vec![] }
            }
        };
        Listing { backend, prefix: name.to_string(), locks: vec![info], truncated: false, unseen }
    }
}

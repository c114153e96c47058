//! The one error type of distlock.

use std::time::Duration;

/// Why a held lock can no longer be trusted.
///
/// Reported by a guard's `lost()` future and by [`Error::LockLost`].
///
/// # Examples
///
/// ```
/// use distlock::LostReason;
/// assert_eq!(LostReason::SessionExpired.to_string(), "the session (or lease) that held the lock expired on the server");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The session (ZooKeeper) or lease (etcd) that owned the lock expired on the server, which
    /// has removed the lock's node or key: another contender may already hold the lock.
    SessionExpired,
    /// The client's session was closed (the client shut down) while the lock was held.
    SessionClosed,
    /// The lock's node or key was deleted by someone else (an operator, or a revoker).
    NodeDeleted,
    /// Authentication with the server failed; the session is unusable.
    AuthFailed,
    /// The server did not answer within the lease (the session timeout less a safety margin,
    /// counted from the last request it answered): it may have expired the session and handed
    /// the lock on. Reported before that can happen.
    LeaseExpired,
    /// The lock key was gone (or held by someone else) when the lease was renewed: it expired
    /// while renewals failed, was deleted by someone else, or the server restarted without it.
    KeyDeleted,
    /// The database connection that held the lock closed (the server ended the session or
    /// restarted, or the connection broke); the server released the lock with it.
    ConnectionClosed,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::SessionExpired => "the session (or lease) that held the lock expired on the server",
            LostReason::SessionClosed => "the client's session was closed while the lock was held",
            LostReason::NodeDeleted => "the lock's node or key was deleted by someone else",
            LostReason::AuthFailed => "authentication with the server failed",
            LostReason::LeaseExpired => "no answer from the server within the lease; the lock may be handed on",
            LostReason::KeyDeleted => "the lock key expired or was deleted on the server",
            LostReason::ConnectionClosed => "the database connection holding the lock closed",
        })
    }
}

/// Everything that can go wrong in distlock.
///
/// Invalid input (lock paths, URLs, durations) is reported with the offending value; backend
/// failures name the operation and the path they concern.
///
/// # Examples
///
/// ```
/// let err = distlock::parse_duration("ten seconds").unwrap_err();
/// assert!(err.to_string().contains("ten seconds"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A backend URL could not be understood.
    #[error("invalid backend URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A lock name or znode path is not acceptable.
    #[error("invalid lock path {path:?}: {reason}")]
    InvalidLockPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A duration could not be parsed or is out of range.
    #[error("invalid duration {value:?}: {reason}")]
    InvalidDuration {
        /// The text as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value (other than a URL, path or duration) is out of range.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The lock could not be had without waiting, or within the allowed time
    /// (returned by [`with_lock`](crate::with_lock)).
    #[error("lock {lock} is busy (not acquired within {waited:?})")]
    Busy {
        /// The lock path.
        lock: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The request would deadlock and is refused (e.g. upgrading a read lock to a write lock
    /// through the same handle).
    #[error("lock {lock}: {reason}")]
    WouldDeadlock {
        /// The lock path.
        lock: String,
        /// Why it would deadlock.
        reason: &'static str,
    },
    /// The lock was lost while held, or a release found it already gone.
    #[error("lock {lock} was lost: {reason}")]
    LockLost {
        /// The lock path.
        lock: String,
        /// Why.
        reason: LostReason,
    },
    /// The client's session ended on the server, and with it every lock the client held; this
    /// client can take no more: connect again. A contract-level outcome, not one backend's: it is
    /// returned by a backend whose client lives in one server session that cannot be renewed
    /// once the server ended it (ZooKeeper today); a backend that can open a new session for
    /// later acquires (etcd's lease) does so and reports only the holds that were lost, as
    /// [`LostReason::SessionExpired`].
    #[error("the client's session expired on the server (every lock it held is gone); connect again")]
    SessionExpired,
    /// The client was closed.
    #[error("the client is closed")]
    Closed,
    /// Connecting with `setup=no` (see [`crate::ConnectOptions::setup`]) found the database
    /// without something distlock keeps beside its locks (a table, the fencing sequence), which
    /// it would otherwise have made: no distlock client has used this database yet.
    #[error(
        "{url}: {what} is missing, and setup=no makes nothing: no distlock client has used this database yet \
         (`distlock setup` makes it)"
    )]
    NotSetUp {
        /// The URL (without credentials).
        url: String,
        /// What is missing (`the fencing sequence distlock_fencing_seq`).
        what: String,
    },
    /// Could not establish a session with the backend.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL (without credentials).
        url: String,
        /// Why.
        reason: String,
    },
    /// The connection kept failing while an operation was retried.
    #[error("{op} on {path} failed after {attempts} attempts: connection to the server lost")]
    ConnectionLoss {
        /// The operation.
        op: &'static str,
        /// The path it concerned.
        path: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// Fewer replicas than required confirmed an acquire in time; nothing was taken. A
    /// contract-level outcome of any backend whose URL asks for replicas to confirm a write
    /// before an acquire counts (Redis's `replicas=` today, by `WAIT`); a backend whose server
    /// replicates before it answers (ZooKeeper, etcd) never returns it.
    #[error("lock {lock}: only {acked} of {wanted} replicas confirmed the acquire in time; released it")]
    NotReplicated {
        /// The lock.
        lock: String,
        /// Replicas required (`?replicas=`).
        wanted: u32,
        /// Replicas that confirmed.
        acked: u32,
    },
    /// The name is in use as another kind of lock. One name is one lock on every backend: a
    /// mutex, the readers and the writers of a read/write lock exclude each other as a mutex
    /// and a write lock would, but a semaphore's permits and those locks cannot share a name.
    #[error(
        "lock {lock} is in use as {in_use}, so {wanted} cannot be taken on it \
         (a semaphore and a mutex or read/write lock cannot share a name; use another name)"
    )]
    KindConflict {
        /// The lock's name.
        lock: String,
        /// What the name is in use as (`a semaphore`, `a mutex`, `a read lock`...).
        in_use: String,
        /// What was asked for, worded as `in_use` is.
        wanted: String,
    },
    /// The backend cannot do this (a recipe it does not offer, or a scheme compiled out).
    #[error("{backend} does not support {what}")]
    Unsupported {
        /// The backend (`zookeeper`, `redis`, ...).
        backend: &'static str,
        /// What was asked for, and what to do instead.
        what: String,
    },
    /// The backend refused an operation.
    #[error("{op} on {path} failed: {source}")]
    Backend {
        /// The operation.
        op: &'static str,
        /// The path it concerned.
        path: String,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

/// The source of an [`Error::Backend`] whose outcome is unknown: the request went out, and the
/// connection failed or dropped, or the server did not answer in time. A backend marks its own
/// such failures with it ([`Error::unanswered`]); the recipes written once above the contract
/// send a request that is safe to repeat again after one (a job's end, a release).
#[derive(Debug)]
pub(crate) struct Unanswered(pub(crate) String);

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unanswered {}

impl Error {
    /// `op` on `path` failed with its outcome unknown, for `why`: see [`Unanswered`].
    pub(crate) fn unanswered(op: &'static str, path: &str, why: impl Into<String>) -> Error {
        Error::Backend { op, path: path.to_string(), source: Box::new(Unanswered(why.into())) }
    }

    /// Whether this failure's outcome is unknown and the request may pass if sent again: the
    /// connection failed or dropped, or the server did not answer in time.
    pub(crate) fn is_unanswered(&self) -> bool {
        match self {
            Error::ConnectionLoss { .. } => true,
            Error::Backend { source, .. } => source.is::<Unanswered>(),
            _ => false,
        }
    }
}

/// `Result` with distlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

const _: () = {
    const fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Error>();
};

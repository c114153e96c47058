//! The one lock contract every backend implements, and the pieces written once over it.
//!
//! A backend is three traits for its locks (here), and two for what is built over them: a
//! [`Ballot`] for elections (`election.rs`, with the [`Leader`] it reads) and [`Jobs`] for
//! scheduled jobs (`jobs.rs`, with the [`Run`] record it keeps). The lock traits:
//! - [`Backend`]: a connected client. It names its backend, reports its lease, checks a lock
//!   name, makes a [`Recipe`] of a [`Kind`] (or refuses the kind with [`Error::Unsupported`]),
//!   and closes;
//! - [`Recipe`]: a lock that acquires with one [`Wait`] and returns a [`Held`];
//! - [`Held`]: a held lock. Its name and holder id, its fencing token, its lease deadline and
//!   state, a `lost()` future, and a release. Dropping it releases in the background.
//!
//! [`crate::Client`], [`crate::Lock`] and [`crate::Guard`] are thin over these. Each backend
//! implements them in its own `contract.rs` from its typed recipes, with the [`recipe!`] and
//! [`held!`] macros where the typed API has the usual shape. Nothing above this module matches
//! on a backend.

// With only some backends compiled in, some of the pieces below have no user.

use crate::{Error, LockState, LostReason, QueueStatus, Result};
use std::any::Any;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

mod election;
mod jobs;
pub(crate) use election::{Ballot, Watched};
pub use election::Leader;
pub(crate) use jobs::{JobLock, JobRead, Jobs, Seen};
pub use jobs::Run;

/// A boxed, sendable future: what the contract's methods return.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How long an acquire may wait: the one meaning of a wait on every backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Give up at once if the lock is not free.
    Never,
    /// Wait until this instant.
    Until(Instant),
    /// Wait as long as it takes.
    Forever,
}

impl Wait {
    /// The public API's timeout: `None` waits forever, zero never waits, else until now + t (a
    /// timeout too far to represent is forever).
    pub(crate) fn from_timeout(timeout: Option<Duration>) -> Wait {
        match timeout {
            None => Wait::Forever,
            Some(t) if t.is_zero() => Wait::Never,
            Some(t) => Instant::now().checked_add(t).map_or(Wait::Forever, Wait::Until),
        }
    }

    /// The instant to stop waiting at, if it is a bounded wait (`Never` has none: it does not
    /// wait at all).
    pub(crate) fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until(d) => Some(d),
            _ => None,
        }
    }

    /// The public API's timeout for this wait: `None` forever, zero never (also for a deadline
    /// already passed: one try).
    pub(crate) fn timeout(self) -> Option<Duration> {
        match self {
            Wait::Never => Some(Duration::ZERO),
            Wait::Until(d) => Some(d.saturating_duration_since(Instant::now())),
            Wait::Forever => None,
        }
    }

    /// When to give up: now for `Never`, `None` for `Forever`.
    pub(crate) fn give_up_at(self) -> Option<Instant> {
        match self {
            Wait::Never => Some(Instant::now()),
            Wait::Until(d) => Some(d),
            Wait::Forever => None,
        }
    }
}

/// Which lock a [`Backend`] makes for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An exclusive lock.
    Mutex,
    /// The shared side of a read/write lock.
    Read,
    /// The exclusive side of a read/write lock.
    Write,
    /// One permit of a semaphore with this many permits.
    Permits(u32),
}

impl std::fmt::Display for Kind {
    /// The recipe as a user names it (in errors).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Mutex => f.write_str("a mutex"),
            Kind::Read => f.write_str("a read lock"),
            Kind::Write => f.write_str("a write lock"),
            Kind::Permits(n) => write!(f, "a semaphore of {n} permits"),
        }
    }
}

impl Kind {
    /// The refusal of a backend that offers only the mutex.
    pub(crate) fn mutex_only(self, backend: &'static str, name: &str, why: &str) -> Result<()> {
        match self {
            Kind::Mutex => Ok(()),
            other => Err(Error::Unsupported { backend, what: format!("{other} on {name} ({why})") }),
        }
    }
}

/// The rule every backend's lock names keep, checked before the backend's own limits: a name is
/// not empty and holds no control character (C0, DEL or C1) and no text-direction override or
/// line separator (U+202A–202E, U+2066–2069, U+2028, U+2029): a name is shown in listings,
/// errors and terminals, and such a character there could rewrite or reorder what they show. The same error on
/// every backend.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let bad = |reason: String| Error::InvalidLockPath { path: name.to_string(), reason };
    if name.is_empty() {
        return Err(bad("the lock name is empty".into()));
    }
    let reorders = |c: char| matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}');
    if let Some(c) = name.chars().find(|&c| c.is_control() || reorders(c)) {
        let what = if c.is_control() { "a control character" } else { "a text-direction or separator character" };
        return Err(bad(format!(
            "holds the character U+{:04X} ({what}); a lock name is printable text on every backend",
            c as u32
        )));
    }
    Ok(())
}

/// The typed client behind a [`Backend`] object, for [`crate::Client::downcast`]: every
/// backend has it without writing it.
pub(crate) trait AsAny {
    /// `self`, as [`Any`].
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What a backend owes the contract: its typed client implements this in its `contract.rs`
/// (and [`backend!`] adds the connect function and `From` for the registry). A capability a
/// backend lacks keeps the default, which refuses it with [`Error::Unsupported`].
pub(crate) trait Backend: AsAny + Debug + Send + Sync + 'static {
    /// `zookeeper`, `redis`, `postgres`, `mysql`, `sqlite`, `etcd` or `memory`.
    fn backend(&self) -> &'static str;
    /// How long the server keeps a lock whose holder went silent.
    fn lease(&self) -> Duration;
    /// The lock's name on the server for `name`, or the error naming what is wrong with it.
    fn lock_name(&self, name: &str) -> Result<String>;
    /// A lock of `kind` named `name` (already checked by [`Backend::lock_name`]).
    fn recipe(&self, name: &str, kind: Kind) -> Result<Arc<dyn Recipe>>;
    /// Every lock in use whose name starts with `prefix`, in the neutral shape; or
    /// [`Error::Unsupported`] naming why this server cannot list them.
    fn locks<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<crate::listing::Listing>>;
    /// The one lock named `name` (already checked by [`Backend::lock_name`]) in the same shape:
    /// a listing of exactly one lock, with no entries when it is free. By default, taken from
    /// the listing of `name` as a prefix.
    fn lock<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<crate::listing::Listing>> {
        Box::pin(async move {
            let all = self.locks(name).await?;
            let found = match all.locks.into_iter().find(|l| l.name == name) {
                Some(info) => crate::listing::Found::Lock(info),
                None => crate::listing::Found::Free { recipe: "mutex", last_token: None },
            };
            Ok(crate::listing::Listing::one(all.backend, name, found, all.unseen))
        })
    }
    /// The election named `name`; by default refused: this backend has none.
    fn election(&self, name: &str) -> Result<Arc<dyn Ballot>> {
        Err(Error::Unsupported { backend: self.backend(), what: format!("election {name}") })
    }
    /// The store of scheduled jobs' lock rows and run records (see the `schedule` module); by
    /// default refused: this backend has none.
    fn jobs(&self) -> Result<Arc<dyn Jobs>> {
        Err(Error::Unsupported { backend: self.backend(), what: "scheduled jobs".into() })
    }
    /// Closes the connection, waiting at most `bound`.
    fn close(&self, bound: Duration) -> BoxFuture<'static, ()>;
}

/// A lock that can be acquired.
pub(crate) trait Recipe: Debug + Send + Sync + 'static {
    /// The lock's name on the server.
    fn name(&self) -> &str;
    /// Acquires within `wait`; `None` if not had in time (nothing is left behind). `progress`
    /// receives the queue position where the backend has a queue. Cancel safe.
    fn acquire<'a>(
        &'a self,
        wait: Wait,
        progress: Option<&'a watch::Sender<QueueStatus>>,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Held>>>>;
}

/// A held lock. Dropping it releases in the background. (`AsAny`: so that a backend's ballot can
/// reach its own guard behind a grant.)
pub(crate) trait Held: AsAny + Debug + Send + Sync + 'static {
    /// The lock's name on the server.
    fn name(&self) -> &str;
    /// Our mark on the server (node path, hash field, key, holder column).
    fn holder_id(&self) -> &str;
    /// Strictly increasing from one holder of the lock to the next.
    fn fencing_token(&self) -> u64;
    /// The instant after which the server may give the lock to someone else.
    fn lease_deadline(&self) -> std::time::Instant;
    /// The state now.
    fn state(&self) -> LockState;
    /// Resolves when the lock can no longer be trusted.
    fn lost(&self) -> BoxFuture<'static, LostReason>;
    /// Releases and waits for the server.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

/// Implements [`Held`] for guard types with the usual accessors (`name`, `holder_id`,
/// `fencing_token`, `lease_deadline`, `state`, `lost`, `release`).
macro_rules! held {
    ($($t:ty),* $(,)?) => {$(
        impl $crate::contract::Held for $t {
            fn name(&self) -> &str {
                <$t>::name(self)
            }
            fn holder_id(&self) -> &str {
                <$t>::holder_id(self)
            }
            fn fencing_token(&self) -> u64 {
                <$t>::fencing_token(self)
            }
            fn lease_deadline(&self) -> std::time::Instant {
                <$t>::lease_deadline(self)
            }
            fn state(&self) -> $crate::LockState {
                <$t>::state(self)
            }
            fn lost(&self) -> $crate::contract::BoxFuture<'static, $crate::LostReason> {
                Box::pin(<$t>::lost(self))
            }
            fn release(self: Box<Self>) -> $crate::contract::BoxFuture<'static, $crate::Result<()>> {
                Box::pin(<$t>::release(*self))
            }
        }
    )*};
}
pub(crate) use held;

/// Implements [`Recipe`] for a typed lock from its three public acquires: `$l` is the lock and
/// `$t` the timeout in the expressions. With `=> "backend"`, also `From<typed lock> for`
/// [`crate::Lock`] (for the public lock types; not for the read and write sides of a read/write
/// lock, which are not types of their own in the public API).
///
/// ```ignore
/// recipe!(Mutex => "sqlite", |l, t| name: l.name(), forever: l.lock(), never: l.try_lock(), within: l.lock_timeout(t));
/// ```
macro_rules! recipe {
    ($ty:ty => $backend:literal, |$l:ident, $t:ident| name: $name:expr, forever: $forever:expr, never: $never:expr, within: $within:expr) => {
        $crate::contract::recipe!($ty, |$l, $t| name: $name, forever: $forever, never: $never, within: $within);

        impl From<$ty> for $crate::Lock {
            fn from(lock: $ty) -> $crate::Lock {
                $crate::Lock::from_recipe(std::sync::Arc::new(lock), $backend)
            }
        }
    };
    ($ty:ty, |$l:ident, $t:ident| name: $name:expr, forever: $forever:expr, never: $never:expr, within: $within:expr) => {
        impl $crate::contract::Recipe for $ty {
            fn name(&self) -> &str {
                let $l = self;
                $name
            }
            fn acquire<'a>(
                &'a self,
                wait: $crate::contract::Wait,
                _progress: Option<&'a tokio::sync::watch::Sender<$crate::QueueStatus>>,
            ) -> $crate::contract::BoxFuture<'a, $crate::Result<Option<Box<dyn $crate::contract::Held>>>> {
                use $crate::contract::{Held, Wait};
                let $l = self;
                Box::pin(async move {
                    let held = match wait {
                        Wait::Forever => Some($forever.await?),
                        Wait::Never => $never.await?,
                        Wait::Until(d) => {
                            let $t = d.saturating_duration_since(tokio::time::Instant::now());
                            $within.await?
                        }
                    };
                    Ok(held.map(|g| Box::new(g) as Box<dyn Held>))
                })
            }
        }
    };
}
pub(crate) use recipe;

/// The registry's connect function and `From<typed client> for crate::Client`, for a backend
/// whose typed client has `connect(url)` and implements [`Backend`].
macro_rules! backend {
    ($client:ty) => {
        /// Connects to the URL; the registry in `facade.rs` calls it.
        pub(crate) fn connect<'a>(
            url: &'a str,
            over: &'a $crate::options::Common,
        ) -> $crate::contract::BoxFuture<'a, $crate::Result<$crate::Client>> {
            Box::pin(async move { Ok($crate::contract::client(<$client>::connect_common(url, over).await?)) })
        }

        impl From<$client> for $crate::Client {
            fn from(c: $client) -> $crate::Client {
                $crate::contract::client(c)
            }
        }
    };
}
pub(crate) use backend;

/// The recipe of a backend that offers the mutex only: the mutex `mutex()` makes, for
/// [`Kind::Mutex`]; any other kind refused with `why`.
pub(crate) fn mutex_only<M: Recipe>(
    kind: Kind,
    backend: &'static str,
    name: &str,
    why: &str,
    mutex: impl FnOnce() -> Result<M>,
) -> Result<Arc<dyn Recipe>> {
    kind.mutex_only(backend, name, why)?;
    Ok(lock(mutex()?))
}

/// The three public acquires of a typed lock (wait forever, never, at most a timeout), written
/// once over its one acquire by [`Wait`]: `$l` is the lock and `$w` the wait in `$acquire`.
///
/// ```ignore
/// wait_methods!(MutexGuard, "the lock", |l, w| l.acquire(w); lock, try_lock, lock_timeout);
/// ```
macro_rules! wait_methods {
    ($guard:ty, $what:literal, |$l:ident, $w:ident| $acquire:expr; $lock:ident, $try:ident, $timeout:ident) => {
        #[doc = concat!("Waits for ", $what, " as long as it takes.")]
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: a dropped acquire leaves nothing held on the server. A request already on
        /// its way finishes in the background, and a grant it brings is released at once.
        pub async fn $lock(&self) -> $crate::Result<$guard> {
            let ($l, $w) = (self, $crate::contract::Wait::Forever);
            Ok($acquire.await?.expect("waiting without a deadline ends only with the lock"))
        }

        #[doc = concat!("Takes ", $what, " only if it can be had now; never waits.")]
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: a dropped acquire leaves nothing held on the server. A request already on
        /// its way finishes in the background, and a grant it brings is released at once.
        pub async fn $try(&self) -> $crate::Result<Option<$guard>> {
            let ($l, $w) = (self, $crate::contract::Wait::Never);
            $acquire.await
        }

        #[doc = concat!("Waits at most `timeout` for ", $what, " (one too large to count is forever); `None` if not had in time (nothing is left waiting or held).")]
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: a dropped acquire leaves nothing held on the server. A request already on
        /// its way finishes in the background, and a grant it brings is released at once.
        pub async fn $timeout(&self, timeout: std::time::Duration) -> $crate::Result<Option<$guard>> {
            let ($l, $w) = (self, $crate::contract::Wait::from_timeout(Some(timeout)));
            $acquire.await
        }
    };
}
pub(crate) use wait_methods;

/// The shared side of a read/write lock, as a [`Recipe`].
#[derive(Debug, Clone)]
pub(crate) struct Reading<L>(pub(crate) L);

/// The exclusive side of a read/write lock, as a [`Recipe`].
#[derive(Debug, Clone)]
pub(crate) struct Writing<L>(pub(crate) L);

/// Makes the public [`crate::Client`] of a backend's client.
pub(crate) fn client<B: Backend>(backend: B) -> crate::Client {
    crate::Client::from_backend(Arc::new(backend))
}

/// Makes the public [`crate::Lock`] of a backend's recipe.
pub(crate) fn lock<R: Recipe>(recipe: R) -> Arc<dyn Recipe> {
    Arc::new(recipe)
}

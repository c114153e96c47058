//! What a guard knows about its lock: shared by every backend.

use crate::LostReason;

/// What a guard knows about its lock right now.
///
/// # Examples
///
/// ```
/// use distlock::{LockState, LostReason};
/// assert!(LockState::Held.is_held());
/// assert!(!LockState::Suspended.is_held());
/// assert!(LockState::Lost(LostReason::SessionExpired).is_lost());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockState {
    /// The lock is ours: on ZooKeeper our node exists and the session is connected; on Redis the
    /// last renewal succeeded and its lease has not run out.
    Held,
    /// The connection to the server is lost (ZooKeeper), or a renewal failed (Redis). The lock
    /// may still be ours, but nobody can tell until the server answers: treat it as uncertain.
    /// If the session expires, or the lease deadline passes, meanwhile, the state becomes `Lost`.
    Suspended,
    /// The lock is gone; another contender may hold it. Final.
    Lost(LostReason),
}

impl LockState {
    /// True only in `Held`.
    pub fn is_held(self) -> bool {
        self == LockState::Held
    }

    /// True in `Lost`.
    pub fn is_lost(self) -> bool {
        matches!(self, LockState::Lost(_))
    }
}

/// Where a waiting contender stands, published while it waits (backends with a queue:
/// ZooKeeper; others leave it at the default).
///
/// # Examples
///
/// ```
/// let s = distlock::QueueStatus { ahead: 2, queue_len: 3 };
/// assert_eq!(s.ahead, 2);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStatus {
    /// Contenders ahead of us (0 once we hold).
    pub ahead: usize,
    /// Contenders in the queue, ourselves included.
    pub queue_len: usize,
}

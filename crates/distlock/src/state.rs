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

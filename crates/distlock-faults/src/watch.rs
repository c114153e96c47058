//! The server's side of a lock, watched while a test waits on the client's side.
//!
//! A test that asks "was the holder told it lost the lock before the server could hand it on?"
//! must not answer by querying the server once the holder was told: under load the test's task
//! may run that query late, after the server freed the lock, and fail although the holder was
//! told in time. [`FreeWatch`] polls the server from the start instead and records when it first
//! answered "free"; the server freed the lock before that answer arrived, so the recorded instant
//! is never early, and `deadline < freed_at` cannot fail because the machine is busy.

use std::future::Future;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Polls "is the lock still held on the server?" until the answer is no (see the module's docs).
#[derive(Debug)]
pub struct FreeWatch {
    task: JoinHandle<Instant>,
}

impl FreeWatch {
    /// Starts polling `held` every `every` (the first poll at once).
    pub fn start<F, Fut>(every: Duration, mut held: F) -> FreeWatch
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = bool> + Send,
    {
        let task = tokio::spawn(async move {
            loop {
                if !held().await {
                    // Read after the answer came: the lock was free before this instant.
                    return Instant::now();
                }
                tokio::time::sleep(every).await;
            }
        });
        FreeWatch { task }
    }

    /// When the server was first seen with the lock free (an instant after it freed it), waiting
    /// at most `bound` for that.
    ///
    /// # Panics
    ///
    /// If the server still holds the lock after `bound`, or the poll panicked.
    pub async fn freed_at(self, bound: Duration) -> Instant {
        match tokio::time::timeout(bound, self.task).await {
            Ok(Ok(at)) => at,
            Ok(Err(e)) => panic!("the server watch failed: {e}"),
            Err(_) => panic!("the server still held the lock after {bound:?}"),
        }
    }
}

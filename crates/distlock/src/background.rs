//! Finishing a future that its caller stopped waiting for.
//!
//! An acquire whose request is on its way may be granted after its caller gave up (a timeout, a
//! `select!`, a dropped task); a release must reach the server even if nobody waits for its
//! answer. Spawning every such future keeps that promise but costs a task and, on a multi-thread
//! runtime, usually a wake-up of another worker thread for every request, the main cost of an
//! uncontended cycle on loopback. [`Detach`] runs the future in place instead and spawns it only
//! if it is dropped unfinished, so the promise is kept at no cost when nobody gives up.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `fut`, run by whoever awaits it; if dropped before it finishes, spawned to finish on its own
/// (its output then dropped: a guard it built releases what it got).
pub(crate) fn detach<F>(fut: F) -> Detach<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Detach { fut: Some(Box::pin(fut)), runtime: None }
}

/// [`detach`], finished on `runtime` if dropped outside any runtime (on a thread of its own):
/// for a future whose work must reach the server whoever drops it (a statement on a connection
/// other locks share).
pub(crate) fn detach_on<F>(runtime: tokio::runtime::Handle, fut: F) -> Detach<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Detach { fut: Some(Box::pin(fut)), runtime: Some(runtime) }
}

/// See [`detach`].
pub(crate) struct Detach<T: Send + 'static> {
    fut: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    /// Where to finish it if dropped outside any runtime ([`detach_on`]).
    runtime: Option<tokio::runtime::Handle>,
}

impl<T: Send + 'static> Future for Detach<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let fut = self.fut.as_mut().expect("a Detach is not polled after it finished");
        let out = fut.as_mut().poll(cx);
        if out.is_ready() {
            self.fut = None;
        }
        out
    }
}

impl<T: Send + 'static> Drop for Detach<T> {
    fn drop(&mut self) {
        let Some(fut) = self.fut.take() else { return };
        if let Some(runtime) = tokio::runtime::Handle::try_current().ok().or_else(|| self.runtime.take()) {
            runtime.spawn(fut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_dropped_future_still_finishes() {
        let done = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let d = done.clone();
        let pending = detach(async move {
            let _ = rx.await;
            d.store(true, Ordering::SeqCst);
        });
        // Polled once (it waits), then dropped by a timeout.
        assert!(tokio::time::timeout(std::time::Duration::from_millis(10), pending).await.is_err());
        assert!(!done.load(Ordering::SeqCst));
        tx.send(()).unwrap();
        for _ in 0..100 {
            if done.load(Ordering::SeqCst) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the dropped future did not finish on its own");
    }

    #[tokio::test]
    async fn an_awaited_future_gives_its_output() {
        assert_eq!(detach(async { 7 }).await, 7);
    }
}

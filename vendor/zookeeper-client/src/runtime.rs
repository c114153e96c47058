//! distlock patch: the clock, the timers, the TCP stream and `select!` the client uses, in one place.
//!
//! In every normal build these are upstream's: `async_io::Timer`, `std::time::Instant`,
//! `async_net::TcpStream` and `asyncs::select!`. Built with `--cfg distlock_sim` (distlock's
//! deterministic simulation, never a shipped build) they are tokio's paused clock and timers,
//! turmoil's simulated TCP stream, and a `select!` that polls its branches in order (upstream's
//! starts at a branch chosen from a stack address, which differs between processes).

#[cfg(not(distlock_sim))]
pub use std::time::Instant;

#[cfg(not(distlock_sim))]
pub use async_io::Timer;
#[cfg(not(distlock_sim))]
pub use async_net::TcpStream;
#[cfg(not(distlock_sim))]
pub use asyncs::select;
#[cfg(distlock_sim)]
pub use sim::{Instant, TcpStream, Timer};

#[cfg(distlock_sim)]
macro_rules! select {
    (biased; $($t:tt)*) => { asyncs::select! { biased; $($t)* } };
    ($($t:tt)*) => { asyncs::select! { biased; $($t)* } };
}
#[cfg(distlock_sim)]
pub(crate) use select;

#[cfg(distlock_sim)]
mod sim {
    use std::future::Future;
    use std::io::{IoSlice, Result};
    use std::pin::Pin;
    use std::task::{ready, Context, Poll};
    use std::time::Duration;

    use futures::io::{AsyncRead, AsyncWrite};
    use futures::Stream;
    use tokio::io::{AsyncRead as _, AsyncWrite as _, ReadBuf};
    pub use tokio::time::Instant;

    /// `async_io::Timer`'s calls on tokio's clock: a one-shot timer, an interval, or never.
    pub struct Timer {
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
        period: Option<Duration>,
    }

    impl Timer {
        pub fn never() -> Self {
            Self { sleep: None, period: None }
        }

        pub fn at(at: Instant) -> Self {
            Self { sleep: Some(Box::pin(tokio::time::sleep_until(at))), period: None }
        }

        pub fn after(after: Duration) -> Self {
            match Instant::now().checked_add(after) {
                Some(at) => Self::at(at),
                None => Self::never(),
            }
        }

        pub fn interval(period: Duration) -> Self {
            Self { period: Some(period), ..Self::after(period) }
        }
    }

    impl Future for Timer {
        type Output = Instant;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Instant> {
            let this = self.get_mut();
            let Some(sleep) = this.sleep.as_mut() else { return Poll::Pending };
            ready!(sleep.as_mut().poll(cx));
            let at = sleep.deadline();
            match this.period {
                Some(period) => sleep.as_mut().reset(at + period),
                None => this.sleep = None,
            }
            Poll::Ready(at)
        }
    }

    impl Stream for Timer {
        type Item = Instant;

        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Instant>> {
            self.poll(cx).map(Some)
        }
    }

    /// turmoil's simulated TCP stream behind the futures I/O traits the client reads and writes.
    #[derive(Debug)]
    pub struct TcpStream(turmoil::net::TcpStream);

    impl TcpStream {
        pub async fn connect(addr: (&str, u16)) -> Result<Self> {
            // A real non-blocking connect is pending at first (async-net resolves the name on a
            // thread first); turmoil's can fail at once, and the client's connect loop only
            // notices its deadline when the connect was pending once.
            tokio::task::yield_now().await;
            turmoil::net::TcpStream::connect(addr).await.map(Self)
        }

        pub fn set_nodelay(&self, nodelay: bool) -> Result<()> {
            self.0.set_nodelay(nodelay)
        }
    }

    impl AsyncRead for TcpStream {
        fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<Result<usize>> {
            let mut buf = ReadBuf::new(buf);
            ready!(Pin::new(&mut self.get_mut().0).poll_read(cx, &mut buf))?;
            Poll::Ready(Ok(buf.filled().len()))
        }
    }

    impl AsyncWrite for TcpStream {
        fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize>> {
            Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
        }

        fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<Result<usize>> {
            Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_flush(cx)
        }

        fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
        }
    }
}

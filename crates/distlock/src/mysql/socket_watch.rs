//! Noticing at once that the server closed a connection owned by a client library that has no
//! signal of its own for it (sqlx's MariaDB connection): the connection's socket is found among
//! this process's descriptors when it is opened, a duplicate of it is kept, and the kernel's
//! "peer closed" readiness on the duplicate tells when the server ended the session (`KILL`, a
//! restart, a reset). For a server that frees its locks the moment a session ends, the next
//! holder may start then: a ping a sixth of the lease later is too late.
//!
//! Linux only (`/proc/self/fd`); elsewhere, or when the socket cannot be told apart, nothing is
//! watched and loss is found by the next health check as before.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A duplicate of a connection's socket, watched for the peer closing it. Dropping it closes the
/// duplicate only; the connection's own descriptor is untouched.
#[derive(Debug)]
pub(crate) struct SocketWatch {
    fd: OwnedFd,
}

/// The socket inodes of this process's descriptors, by descriptor.
fn sockets() -> Vec<(RawFd, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
        let target = std::fs::read_link(e.path()).ok()?;
        let inode = target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()?;
        Some((fd, inode))
    })
    .collect()
}

/// The peer address of socket `fd`, if it is an IP socket.
fn peer(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: getpeername fills at most `len` bytes of a zeroed sockaddr_storage.
    unsafe {
        let mut addr: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getpeername(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len) != 0 {
            return None;
        }
        match addr.ss_family as libc::c_int {
            libc::AF_INET => {
                let a = &*(&addr as *const _ as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
            }
            libc::AF_INET6 => {
                let a = &*(&addr as *const _ as *const libc::sockaddr_in6);
                let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
                Some(SocketAddr::from((ip, u16::from_be(a.sin6_port))))
            }
            _ => None,
        }
    }
}

/// Opening connections one at a time, so that the socket a connect made is the one new socket to
/// the server's address.
static OPENING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl SocketWatch {
    /// Runs `connect` (which opens one connection to `host:port`) and finds its socket: the one
    /// socket that appeared meanwhile with that peer. `None` for the watch when it cannot be told
    /// (none or several such sockets, or not Linux).
    pub(crate) async fn around<T, E>(
        host: &str,
        port: u16,
        connect: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<(T, Option<SocketWatch>), E> {
        let peers: HashSet<SocketAddr> = match tokio::net::lookup_host((host, port)).await {
            Ok(addrs) => addrs.collect(),
            Err(_) => HashSet::new(),
        };
        let _one_at_a_time = OPENING.lock().await;
        let before: HashSet<u64> = sockets().into_iter().map(|(_, inode)| inode).collect();
        let conn = connect.await?;
        let mut new: Vec<(RawFd, u64)> = sockets()
            .into_iter()
            .filter(|(fd, inode)| !before.contains(inode) && peer(*fd).is_some_and(|p| peers.contains(&p)))
            .collect();
        new.dedup_by_key(|(_, inode)| *inode);
        let watch = match new.as_slice() {
            [(fd, _)] => {
                // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor of the same socket, owned here.
                let dup = unsafe { libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 0) };
                (dup >= 0).then(|| SocketWatch { fd: unsafe { OwnedFd::from_raw_fd(dup) } })
            }
            _ => None,
        };
        if watch.is_none() {
            tracing::debug!(
                host,
                port,
                candidates = new.len(),
                "cannot tell the connection's socket; loss is found by pings"
            );
        }
        Ok((conn, watch))
    }

    /// Resolves when the peer has closed or reset the connection. Data arriving (replies the
    /// connection's owner reads) is ignored. If the socket cannot be watched, never resolves.
    /// Shuts the socket down (both ways) now, whoever else has it open: the connection is being
    /// dropped, and the server must see it end at once (it frees the session's locks then),
    /// not when this duplicate happens to be closed.
    pub(crate) fn shutdown(&self) {
        // SAFETY: our own descriptor, open for as long as `self`.
        unsafe {
            libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR);
        }
    }

    pub(crate) async fn closed(&self) {
        struct Borrowed(RawFd);
        impl AsRawFd for Borrowed {
            fn as_raw_fd(&self) -> RawFd {
                self.0
            }
        }
        // SAFETY: the descriptor is our own duplicate, open for as long as `self`, which this
        // future borrows: it outlives the registration, and nothing else closes it.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                Borrowed(self.fd.as_raw_fd()),
                tokio::io::Interest::READABLE,
            )
        };
        let Ok(fd) = registered else {
            return std::future::pending().await;
        };
        loop {
            let Ok(mut ready) = fd.readable().await else { return std::future::pending().await };
            let r = ready.ready();
            if r.is_read_closed() || r.is_error() {
                return;
            }
            ready.clear_ready();
        }
    }
}

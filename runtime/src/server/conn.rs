//! The server's accepted connections: each accepted unix stream is wrapped so the server can
//! close every connection it still has when it stops. tonic serves each connection on its own
//! task, which would outlive the serving future (a client would go on talking to a server that
//! was "stopped"); [`Tracker::close_all`] shuts the sockets down so those tasks end, as they
//! would if the process had exited.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

/// The connections a server has accepted and not yet seen closed.
#[derive(Clone, Default)]
pub(super) struct Tracker {
    inner: Arc<Mutex<Registry>>,
}

#[derive(Default)]
struct Registry {
    next: u64,
    /// A duplicate of each open connection's socket, to shut it down from outside.
    open: HashMap<u64, std::os::unix::net::UnixStream>,
}

impl Tracker {
    /// Wraps an accepted stream; it leaves the registry when the connection is dropped.
    pub(super) fn track(&self, io: UnixStream) -> Tracked {
        let dup = io
            .as_fd()
            .try_clone_to_owned()
            .map(std::os::unix::net::UnixStream::from);
        let mut reg = lock(&self.inner);
        reg.next += 1;
        let id = reg.next;
        match dup {
            Ok(dup) => {
                reg.open.insert(id, dup);
            }
            // Without a duplicate the connection still works; it just cannot be forced closed.
            Err(e) => tracing::warn!("CRI server: cannot track a connection: {e}"),
        }
        Tracked {
            io,
            rewriter: super::authority::Rewriter::default(),
            _guard: Guard {
                id,
                registry: Arc::downgrade(&self.inner),
            },
        }
    }

    /// Shuts down every open connection (both directions); their serving tasks then end.
    pub(super) fn close_all(&self) {
        let open = std::mem::take(&mut lock(&self.inner).open);
        if !open.is_empty() {
            tracing::debug!("CRI server: closing {} connection(s)", open.len());
        }
        for sock in open.values() {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// How many connections are open.
    pub(super) fn open(&self) -> usize {
        lock(&self.inner).open.len()
    }
}

fn lock(m: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Closes every tracked connection when dropped (the serving future ending or being dropped).
pub(super) struct CloseOnDrop(pub(super) Tracker);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close_all();
    }
}

struct Guard {
    id: u64,
    registry: Weak<Mutex<Registry>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(reg) = self.registry.upgrade() {
            lock(&reg).open.remove(&self.id);
        }
    }
}

/// An accepted unix stream known to the [`Tracker`]. What the client sends goes through the
/// `:authority` fix-up (see `super::authority`) on its way to the HTTP/2 server.
pub(super) struct Tracked {
    io: UnixStream,
    rewriter: super::authority::Rewriter,
    _guard: Guard,
}

impl Connected for Tracked {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.rewriter.has_output() {
                let n = this.rewriter.drain_into(buf.initialize_unfilled());
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    if let Err(super::authority::Broken(why)) = this.rewriter.feed(read.filled()) {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("CRI server: {why}"),
                        )));
                    }
                }
            }
        }
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn close_all_ends_open_connections_and_drop_untracks() {
        let tracker = Tracker::default();
        let (a, mut peer) = UnixStream::pair().unwrap();
        let mut tracked = tracker.track(a);
        let (b, _peer_b) = UnixStream::pair().unwrap();
        let dropped = tracker.track(b);
        assert_eq!(tracker.open(), 2);
        drop(dropped);
        assert_eq!(tracker.open(), 1);

        tracked.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        peer.read_exact(&mut one).await.unwrap();
        drop(CloseOnDrop(tracker.clone()));
        assert_eq!(tracker.open(), 0);
        // Both ends see the connection gone.
        assert_eq!(peer.read(&mut one).await.unwrap(), 0);
        assert_eq!(tracked.read(&mut one).await.unwrap(), 0);
    }
}

//! A TLS stream over TCP, from either side's handshake, as a [`Transport`].
//!
//! A TLS stream cannot be split into borrowed halves the way a socket can, because
//! reading and writing both go through one rustls session. [`TlsConn`] keeps the
//! session behind a mutex that the halves lock for one poll at a time (never across an
//! await, so never contended for long); with `&mut` access (the common case) no lock
//! is taken at all. The same type carries a client's connection to a `tls` listener
//! and sluice's connection to an `https://` backend, so an upload that the backend
//! answers early is heard the same way over TLS as over a socket.

use std::io;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

use super::transport::{first_bytes, Closed, Transport, FIRST_READ};

/// The one rustls crypto provider (ring) every TLS configuration of the process is
/// built with: listeners, QUIC, backends, ACME, client-certificate checks.
pub(crate) fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    static P: std::sync::OnceLock<std::sync::Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    P.get_or_init(|| std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

pub(crate) struct TlsConn {
    inner: Mutex<TlsStream<TcpStream>>,
}

impl TlsConn {
    pub(crate) fn new(stream: impl Into<TlsStream<TcpStream>>) -> TlsConn {
        TlsConn {
            inner: Mutex::new(stream.into()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TlsStream<TcpStream>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `f` on the TCP socket under the TLS layer.
    pub(crate) fn with_tcp<R>(&self, f: impl FnOnce(&TcpStream) -> R) -> R {
        f(self.lock().get_ref().0)
    }

    fn get_mut(&mut self) -> &mut TlsStream<TcpStream> {
        self.inner.get_mut().unwrap_or_else(|e| e.into_inner())
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().get_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().get_mut()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().get_mut()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().get_mut()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().get_mut()).poll_shutdown(cx)
    }
}

/// One half of a [`TlsConn`], borrowed; locks the session for each poll.
pub(crate) struct Half<'a>(&'a Mutex<TlsStream<TcpStream>>);

impl Half<'_> {
    fn lock(&self) -> MutexGuard<'_, TlsStream<TcpStream>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AsyncRead for Half<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Half<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.lock()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.lock()).poll_shutdown(cx)
    }
}

impl super::transport::SendFile for Half<'_> {}

thread_local! {
    /// Where a kept connection's next request is first read. A read through the TLS
    /// session must be given initialised bytes, and zeroing a fresh 2 KiB on the stack
    /// each time an idle connection was polled cost ~130 instructions a poll, two a
    /// request. Zeroed once a thread; what a read filled is copied out of it and
    /// zeroed again.
    static FIRST: std::cell::RefCell<[u8; FIRST_READ]> = const { std::cell::RefCell::new([0; FIRST_READ]) };
}

impl Transport for TlsConn {
    type Read<'a> = Half<'a>;
    type Write<'a> = Half<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        (Half(&self.inner), Half(&self.inner))
    }

    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
        FIRST.with_borrow_mut(|first| {
            let mut rb = ReadBuf::new(first);
            match Pin::new(&mut *self.lock()).poll_read(cx, &mut rb) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Err(_)) => Poll::Ready(Err(Closed)),
                Poll::Ready(Ok(())) if rb.filled().is_empty() => Poll::Ready(Err(Closed)),
                Poll::Ready(Ok(())) => {
                    let bytes = first_bytes(rb.filled());
                    // No client's plaintext stays behind in the thread's buffer.
                    rb.filled_mut().fill(0);
                    Poll::Ready(Ok(bytes))
                }
            }
        })
    }

    /// The session may hold decrypted bytes the socket no longer shows: always ready,
    /// and the read that follows tells.
    fn poll_read_ready(&self, _: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }

    fn keepalive(&self) {
        super::tcp_keepalive(self.lock().get_ref().0);
    }
}

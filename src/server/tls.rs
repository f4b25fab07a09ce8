//! TLS client connections: the handshake (under its own 10 s deadline) and the
//! transport seam for a TLS stream.
//!
//! A TLS stream cannot be split into borrowed halves the way a socket can, because
//! reading and writing both go through one rustls session. [`TlsConn`] keeps the
//! session behind a mutex that the halves lock for one poll at a time (never across an
//! await, so never contended for long); with `&mut` access (the common case) no lock
//! is taken at all.

use std::io;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::transport::{first_bytes, Closed, Transport, FIRST_READ};
use crate::runtime::certs::Tls;
use crate::stats::{bump, COUNTERS};

/// How long a client has to finish the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct TlsConn {
    inner: Mutex<TlsStream<TcpStream>>,
}

/// What the handshake agreed on that the connection loop needs.
pub struct Handshaken {
    pub conn: TlsConn,
    /// ALPN chose HTTP/2.
    pub h2: bool,
}

/// Runs the server handshake with the generation's certificates. `None`: the client
/// failed it, stalled past the deadline or left; counted, logged at debug only (a scan
/// of the port must not flood the log).
pub async fn accept(tls: &Tls, stream: TcpStream) -> Option<Handshaken> {
    let peer = stream.peer_addr().ok();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
    let r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
    let why = match r {
        Ok(Ok(s)) => {
            let h2 = s.get_ref().1.alpn_protocol() == Some(b"h2");
            return Some(Handshaken {
                conn: TlsConn {
                    inner: Mutex::new(s),
                },
                h2,
            });
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no handshake within 10s".to_string(),
    };
    bump(&COUNTERS.tls_handshake_failures);
    tracing::debug!(
        "sluice: TLS handshake with {} failed: {why}",
        peer.map(|p| p.to_string()).unwrap_or_default()
    );
    None
}

impl TlsConn {
    fn lock(&self) -> MutexGuard<'_, TlsStream<TcpStream>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
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
pub struct Half<'a>(&'a Mutex<TlsStream<TcpStream>>);

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

impl Transport for TlsConn {
    type Read<'a> = Half<'a>;
    type Write<'a> = Half<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        (Half(&self.inner), Half(&self.inner))
    }

    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
        let mut first = [0u8; FIRST_READ];
        let mut rb = ReadBuf::new(&mut first);
        match Pin::new(&mut *self.lock()).poll_read(cx, &mut rb) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(Err(Closed)),
            Poll::Ready(Ok(())) if rb.filled().is_empty() => Poll::Ready(Err(Closed)),
            Poll::Ready(Ok(())) => Poll::Ready(Ok(first_bytes(rb.filled()))),
        }
    }

    fn keepalive(&self) {
        crate::upstream::conn::tcp_keepalive(self.lock().get_ref().0);
    }
}

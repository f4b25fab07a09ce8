//! The transport seam: what the connection loops need of a client stream, so the h1
//! and h2 loops run over any of them (TCP, Unix, and TLS over TCP in `tls`).
//!
//! Beyond reading and writing, a loop needs to read and write at once within one task
//! (a borrowed split), and to wait for a connection's first bytes without holding a
//! buffer (readiness, then a non-blocking read into the stack). TLS, which may hold
//! decrypted bytes the socket no longer shows, waits with a plain read instead.

use std::io;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type Read<'a>: AsyncRead + Unpin + Send
    where
        Self: 'a;
    type Write<'a>: AsyncWrite + Unpin + Send
    where
        Self: 'a;

    /// Both halves, borrowed, for reading and writing within one task.
    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>);

    /// The first bytes after an idle wait, in a fresh buffer; `Err` when the peer
    /// closed. Allocates nothing until bytes are there.
    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>>;

    /// Turns on TCP keepalive where the stream has it, for a connection that becomes a
    /// tunnel (which has no idle timeout of its own).
    fn keepalive(&self) {}
}

/// The peer closed the stream (or it failed) before sending a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// How much the first read after an idle wait takes, into the stack: enough for a
/// typical request head whole, so the head is parsed without a second read (one
/// syscall a request) and a spurious wakeup allocates nothing.
pub(super) const FIRST_READ: usize = 2048;

/// The bytes of a read into the stack, in a fresh buffer.
pub(super) fn first_bytes(first: &[u8]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(4096);
    buf.extend_from_slice(first);
    buf
}

/// Readiness, then a non-blocking read into the stack, so a spurious wakeup allocates
/// nothing.
macro_rules! poll_first_bytes_of_socket {
    ($s:expr, $cx:expr) => {{
        loop {
            match $s.poll_read_ready($cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(Err(Closed)),
                Poll::Ready(Ok(())) => {}
            }
            let mut first = [0u8; FIRST_READ];
            match $s.try_read(&mut first) {
                Ok(0) => return Poll::Ready(Err(Closed)),
                Ok(n) => return Poll::Ready(Ok(first_bytes(&first[..n]))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return Poll::Ready(Err(Closed)),
            }
        }
    }};
}

impl Transport for TcpStream {
    type Read<'a> = tokio::net::tcp::ReadHalf<'a>;
    type Write<'a> = tokio::net::tcp::WriteHalf<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        TcpStream::split(self)
    }

    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
        poll_first_bytes_of_socket!(self, cx)
    }

    fn keepalive(&self) {
        crate::upstream::conn::tcp_keepalive(self);
    }
}

impl Transport for UnixStream {
    type Read<'a> = tokio::net::unix::ReadHalf<'a>;
    type Write<'a> = tokio::net::unix::WriteHalf<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        UnixStream::split(self)
    }

    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
        poll_first_bytes_of_socket!(self, cx)
    }
}

/// Waits for the stream's first bytes (see [`Transport::poll_first_bytes`]).
pub async fn wait_first_bytes<S: Transport>(stream: &S) -> Result<BytesMut, Closed> {
    std::future::poll_fn(|cx| stream.poll_first_bytes(cx)).await
}

/// A response write that makes no progress this long ends the response (h1 writes and
/// h2 streams alike): a client that stops reading must not hold its pool slot and
/// backend connection for ever (nginx's `send_timeout` is the same rule).
pub const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A writer whose writes fail with `TimedOut` once one has made no progress for
/// [`SEND_TIMEOUT`]: the clock starts when a write cannot go on and restarts with each
/// byte the socket takes, so a slow reader is never cut, only a stopped one. The timer
/// is made the first time a write waits, never for writes that go straight through.
pub struct SendTimeout<W> {
    inner: W,
    stall: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The timer runs for the write that waits now.
    armed: bool,
}

impl<W> SendTimeout<W> {
    pub fn new(inner: W) -> SendTimeout<W> {
        SendTimeout {
            inner,
            stall: None,
            armed: false,
        }
    }

    /// The write cannot go on: starts the clock if it is not running, and fails once it
    /// ran out.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let deadline = tokio::time::Instant::now() + SEND_TIMEOUT;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            stall.as_mut().reset(deadline);
            self.armed = true;
        }
        match std::future::Future::poll(stall.as_mut(), cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took no response bytes for 60s",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn went<T>(
        &mut self,
        r: Poll<std::io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<T>> {
        match r {
            Poll::Pending => self.waiting(cx),
            done => {
                self.armed = false;
                done
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for SendTimeout<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.went(r, cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.went(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.went(r, cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

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

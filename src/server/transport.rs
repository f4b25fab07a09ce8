//! The transport seam: what the connection loops need of a client stream, so the h1
//! and h2 loops run over any of them (TCP and Unix today, TLS next).
//!
//! Beyond reading and writing, a loop needs to read and write at once within one task
//! (a borrowed split), and to wait for a connection's first bytes without holding a
//! buffer (readiness, then a non-blocking read into the stack). A stream that cannot
//! peek cheaply (TLS) can implement the wait with a plain read.

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

    /// Ready when the stream may have bytes (a hint: confirm with [`Self::try_first_bytes`]).
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// After readiness: the first bytes in a fresh buffer, `Ok(None)` when nothing was
    /// there after all, `Err` when the peer closed.
    fn try_first_bytes(&self) -> Result<Option<BytesMut>, Closed>;

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
const FIRST_READ: usize = 2048;

/// Reads into the stack first so a spurious wakeup allocates nothing.
fn first_bytes(r: io::Result<usize>, first: &[u8]) -> Result<Option<BytesMut>, Closed> {
    match r {
        Ok(0) => Err(Closed),
        Ok(n) => {
            let mut buf = BytesMut::with_capacity(4096);
            buf.extend_from_slice(&first[..n]);
            Ok(Some(buf))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(_) => Err(Closed),
    }
}

impl Transport for TcpStream {
    type Read<'a> = tokio::net::tcp::ReadHalf<'a>;
    type Write<'a> = tokio::net::tcp::WriteHalf<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        TcpStream::split(self)
    }

    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }

    fn keepalive(&self) {
        crate::upstream::conn::tcp_keepalive(self);
    }

    fn try_first_bytes(&self) -> Result<Option<BytesMut>, Closed> {
        let mut first = [0u8; FIRST_READ];
        first_bytes(self.try_read(&mut first), &first)
    }
}

impl Transport for UnixStream {
    type Read<'a> = tokio::net::unix::ReadHalf<'a>;
    type Write<'a> = tokio::net::unix::WriteHalf<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        UnixStream::split(self)
    }

    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }

    fn try_first_bytes(&self) -> Result<Option<BytesMut>, Closed> {
        let mut first = [0u8; FIRST_READ];
        first_bytes(self.try_read(&mut first), &first)
    }
}

/// Waits for the stream's first bytes (see [`Transport::try_first_bytes`]).
pub async fn wait_first_bytes<S: Transport>(stream: &S) -> Result<BytesMut, Closed> {
    loop {
        std::future::poll_fn(|cx| stream.poll_readable(cx))
            .await
            .map_err(|_| Closed)?;
        if let Some(buf) = stream.try_first_bytes()? {
            return Ok(buf);
        }
    }
}

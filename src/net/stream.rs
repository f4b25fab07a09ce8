//! [`Stream`]: one connection to a backend, whichever transport its peer needs. A pool
//! may name TCP and Unix peers side by side, and an `https://` pool's connections are
//! TLS, so the backend side holds the sum; each arm is a [`Transport`] and the sum is
//! one too, by delegation (the one place that matches on the transport).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use super::tls::{Half, TlsConn};
use super::transport::{Closed, Transport};

pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TLS over TCP (an `https://` backend that chose `http/1.1`).
    Tls(Box<TlsConn>),
}

/// The read half of a borrowed [`Stream`].
pub(crate) enum ReadHalf<'a> {
    Tcp(tokio::net::tcp::ReadHalf<'a>),
    Unix(tokio::net::unix::ReadHalf<'a>),
    Tls(Half<'a>),
}

/// The write half of a borrowed [`Stream`].
pub(crate) enum WriteHalf<'a> {
    Tcp(tokio::net::tcp::WriteHalf<'a>),
    Unix(tokio::net::unix::WriteHalf<'a>),
    Tls(Half<'a>),
}

/// `AsyncRead` by delegation to each arm.
macro_rules! delegate_read {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Unix(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }
    };
}

/// `AsyncWrite` by delegation to each arm.
macro_rules! delegate_write {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Unix(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_write(cx, buf),
                }
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }
            fn is_write_vectored(&self) -> bool {
                true
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_flush(cx),
                    Self::Unix(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s).poll_flush(cx),
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Unix(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_read!(Stream);
delegate_read!(ReadHalf<'_>);
delegate_write!(Stream);
delegate_write!(WriteHalf<'_>);

impl super::transport::SendFile for WriteHalf<'_> {}

impl Stream {
    /// Whether the connection is open with nothing to read, asked of the kernel now (a
    /// `recv` with `MSG_PEEK`, one system call), not of the poller's last word: a FIN or
    /// bytes that arrived since the runtime last polled show here. For TLS, the socket
    /// under it: bytes waiting on an idle TLS connection (a `close_notify`, rarely a
    /// late session ticket) count as not quiet, which costs a fresh connection at
    /// worst, never a request.
    pub(crate) fn is_quiet_now(&self) -> bool {
        fn quiet(fd: &impl std::os::fd::AsFd) -> bool {
            let mut probe = [std::mem::MaybeUninit::uninit(); 1];
            matches!(socket2::SockRef::from(fd).peek(&mut probe),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        }
        match self {
            Stream::Tcp(s) => quiet(s),
            Stream::Unix(s) => quiet(s),
            Stream::Tls(s) => s.with_tcp(quiet),
        }
    }
}

impl Transport for Stream {
    type Read<'a> = ReadHalf<'a>;
    type Write<'a> = WriteHalf<'a>;

    fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
            Stream::Tls(s) => {
                let (r, w) = s.split();
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }

    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
        match self {
            Stream::Tcp(s) => s.poll_first_bytes(cx),
            Stream::Unix(s) => s.poll_first_bytes(cx),
            Stream::Tls(s) => s.poll_first_bytes(cx),
        }
    }

    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            Stream::Tcp(s) => Transport::poll_read_ready(s, cx),
            Stream::Unix(s) => Transport::poll_read_ready(s, cx),
            Stream::Tls(s) => s.poll_read_ready(cx),
        }
    }

    fn keepalive(&self) {
        match self {
            Stream::Tcp(s) => s.keepalive(),
            Stream::Unix(s) => s.keepalive(),
            Stream::Tls(s) => s.keepalive(),
        }
    }
}

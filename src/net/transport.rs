//! The transport seam: what the connection code of either side needs of a stream, so
//! the same code runs over TCP, Unix sockets and TLS (and, later, a QUIC stream).
//!
//! Beyond reading and writing, a connection needs to read and write at once within one
//! task (a borrowed split: a backend may answer before an upload ends), to wait for a
//! connection's first bytes without holding a buffer (readiness, then a non-blocking
//! read into the stack), and to look at an idle connection without waiting. TLS, which
//! may hold decrypted bytes the socket no longer shows, answers each of these through
//! its session instead of the socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

pub(crate) trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    type Read<'a>: AsyncRead + Unpin + Send
    where
        Self: 'a;
    type Write<'a>: AsyncWrite + SendFile + Unpin + Send
    where
        Self: 'a;

    /// Both halves, borrowed, for reading and writing within one task.
    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>);

    /// The first bytes after an idle wait, in a fresh buffer; `Err` when the peer
    /// closed. Allocates nothing until bytes are there.
    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>>;

    /// Ready once bytes (or the close) wait to be read, without reading them.
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()>;

    /// Turns on TCP keepalive where the stream has it, for a connection that becomes a
    /// tunnel (which has no idle timeout of its own).
    fn keepalive(&self) {}
}

/// Sending a file's bytes from the page cache (`sendfile`), for a write half that is a
/// plain socket; the others (TLS) say they cannot, and the file goes through user
/// space.
pub(crate) trait SendFile {
    fn can_send_file(&self) -> bool {
        false
    }

    /// Sends up to `count` bytes of `file` from `*at`, moving `at` past them; the
    /// bytes sent (0: the file ended). Only called when [`can_send_file`] holds.
    ///
    /// [`can_send_file`]: SendFile::can_send_file
    fn poll_send_file(
        &mut self,
        _cx: &mut Context<'_>,
        _file: &std::fs::File,
        _at: &mut u64,
        _count: usize,
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }

    /// Writes bytes that a file's bytes follow at once (a response head before its
    /// `sendfile`): the kernel holds them (`MSG_MORE`) until the file's bytes join them
    /// in full segments, instead of sending the head as a segment of its own. Only
    /// called when [`can_send_file`] holds, and only when a `poll_send_file` or a plain
    /// write follows (either pushes what is held; so does closing the socket). A write
    /// half that says it can send files implements all three methods.
    ///
    /// [`can_send_file`]: SendFile::can_send_file
    fn poll_write_before_file(
        &mut self,
        _cx: &mut Context<'_>,
        _buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }
}

impl SendFile for tokio::net::tcp::WriteHalf<'_> {
    fn can_send_file(&self) -> bool {
        true
    }

    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        file: &std::fs::File,
        at: &mut u64,
        count: usize,
    ) -> Poll<io::Result<usize>> {
        let s: &TcpStream = self.as_ref();
        poll_send_with(s, cx, || {
            rustix::fs::sendfile(s, file, Some(&mut *at), count).map_err(io::Error::from)
        })
    }

    fn poll_write_before_file(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        use rustix::net::SendFlags;
        let s: &TcpStream = self.as_ref();
        poll_send_with(s, cx, || {
            rustix::net::send(s, buf, SendFlags::MORE | SendFlags::NOSIGNAL)
                .map_err(io::Error::from)
        })
    }
}

/// Runs a sending system call on `s` once it is writable, again after a spurious
/// readiness (`WouldBlock` clears it).
fn poll_send_with(
    s: &TcpStream,
    cx: &mut Context<'_>,
    mut call: impl FnMut() -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        if let Poll::Ready(r) = s.poll_write_ready(cx) {
            r?;
        } else {
            return Poll::Pending;
        }
        match s.try_io(tokio::io::Interest::WRITABLE, &mut call) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

impl SendFile for tokio::net::unix::WriteHalf<'_> {}

/// The peer closed the stream (or it failed) before sending a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

/// How much the first read after an idle wait takes, into the stack: enough for a
/// typical request head whole, so the head is parsed without a second read (one
/// syscall a request) and a spurious wakeup allocates nothing.
pub(crate) const FIRST_READ: usize = 2048;

/// A request head's buffer: room for [`FIRST_READ`] and the rest of a larger head (it
/// grows past this). 3.5 KiB rather than 4: when a request's boxed state was just under
/// 4 KiB (4,048 B), two blocks allocated and freed in turn each request in the same
/// mimalloc size class (3.5–4 KiB) sent it searching its pages every other request —
/// 367 instructions a keep-alive request (callgrind). The state has since shrunk to
/// 3,456 B and shares this buffer's class (3–3.5 KiB) again; 4 KiB was measured
/// (performance.md, seventeenth part): 120 instructions fewer on keep-alive, 90–160 more
/// on the h2c front (layout: that front makes this buffer once a connection). Not a
/// clear gain, so this stays; measure it on the PGO build, and again when either size
/// moves (`-Zprint-type-sizes` gives the state's).
const FIRST_BUFFER: usize = 3584;

/// The bytes of a read into the stack, in a fresh buffer of [`FIRST_BUFFER`] bytes.
pub(crate) fn first_bytes(first: &[u8]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(FIRST_BUFFER);
    buf.extend_from_slice(first);
    buf
}

/// Waits for the stream's first bytes (see [`Transport::poll_first_bytes`]).
pub(crate) async fn wait_first_bytes<S: Transport>(stream: &S) -> Result<BytesMut, Closed> {
    std::future::poll_fn(|cx| stream.poll_first_bytes(cx)).await
}

/// Whether an idle stream is quiet: nothing to read and not closed. Never waits; no
/// syscall on a socket that reported no activity.
pub(crate) fn is_quiet<S: AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    let mut probe = [0u8; 1];
    let mut rb = ReadBuf::new(&mut probe);
    matches!(Pin::new(s).poll_read(&mut cx, &mut rb), Poll::Pending)
}

/// Room for `n` more bytes in a read buffer: its own space when that can be had without
/// copying (what was read before and split off may be released already), else a fresh
/// buffer that takes only the unread bytes along. Not `BytesMut::reserve` alone: past
/// its own capacity it grows the underlying `Vec`, copying the consumed prefix too (a
/// response head and the first piece of its body: 8 KiB copied on every large
/// response, measured).
pub(crate) fn make_room(buf: &mut BytesMut, n: usize) {
    if buf.capacity() - buf.len() >= n || buf.try_reclaim(n) {
        return;
    }
    let mut fresh = BytesMut::with_capacity(buf.len() + n);
    fresh.extend_from_slice(buf);
    *buf = fresh;
}

/// What can be read into `buf` now, without waiting: `WouldBlock` when nothing is
/// there.
pub(crate) fn read_now<S: AsyncRead + Unpin>(s: &mut S, buf: &mut BytesMut) -> io::Result<usize> {
    use std::future::Future as _;
    use tokio::io::AsyncReadExt as _;
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::pin!(s.read_buf(buf)).poll(&mut cx) {
        Poll::Ready(r) => r,
        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
    }
}

/// The socket calls [`read_drained`] needs: tokio's TCP and Unix streams alike.
trait Socket {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
    fn try_read_buf(&self, buf: &mut ReadBuf<'_>) -> io::Result<usize>;
}

macro_rules! socket {
    ($t:ty) => {
        impl Socket for $t {
            fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                <$t>::poll_read_ready(self, cx)
            }
            fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
                <$t>::try_io(self, tokio::io::Interest::READABLE, f)
            }
            fn try_read_buf(&self, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
                <$t>::try_read_buf(self, buf)
            }
        }
    };
}

socket!(TcpStream);
socket!(UnixStream);

/// Readiness, then a non-blocking read into the stack, so a spurious wakeup allocates
/// nothing. A request that came whole in this read leaves the socket's readiness
/// forgotten ([`read_drained`]): the connection's watch for a pipelined request or a
/// close while the request is in flight then makes no `EAGAIN` read — one kernel entry
/// in five on a keep-alive request.
fn poll_first_bytes_of<S: Socket>(s: &S, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
    // On the stack, and not zeroed first (the read writes what it reports).
    let mut first = [std::mem::MaybeUninit::<u8>::uninit(); FIRST_READ];
    let mut rb = ReadBuf::uninit(&mut first);
    match read_drained(s, cx, &mut rb) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(Err(_)) => Poll::Ready(Err(Closed)),
        Poll::Ready(Ok(())) if rb.filled().is_empty() => Poll::Ready(Err(Closed)),
        Poll::Ready(Ok(())) => Poll::Ready(Ok(first_bytes(rb.filled()))),
    }
}

/// Reads what the socket has into `buf` through `&self`, and forgets the readiness the
/// read ran on when it came back short, as tokio's own `poll_read` does (its `&self`
/// reads, `try_read*`, forget it only on `WouldBlock`): a read that returns fewer bytes
/// than it asked for emptied the socket, so the next read waits for the next event
/// instead of making a system call that can only say `EAGAIN`. The read runs inside
/// `try_io`, which takes the readiness tick *before* the read and clears only that
/// tick when the closure reports `WouldBlock`: an event that arrives during or after
/// the read is kept (epoll is edge-triggered, and new bytes are a new edge), so nothing
/// is missed.
fn read_drained<S: Socket>(
    s: &S,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    loop {
        if let Poll::Ready(r) = s.poll_read_ready(cx) {
            r?;
        } else {
            return Poll::Pending;
        }
        let want = buf.remaining();
        let mut short = false;
        let read = s.try_io(|| {
            let n = s.try_read_buf(buf)?;
            if n > 0 && n < want {
                short = true;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        return match read {
            Ok(_) => Poll::Ready(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && short => Poll::Ready(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => Poll::Ready(Err(e)),
        };
    }
}

impl Transport for TcpStream {
    type Read<'a> = tokio::net::tcp::ReadHalf<'a>;
    type Write<'a> = tokio::net::tcp::WriteHalf<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        TcpStream::split(self)
    }

    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
        poll_first_bytes_of(self, cx)
    }

    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        TcpStream::poll_read_ready(self, cx).map(|_| ())
    }

    fn keepalive(&self) {
        super::tcp_keepalive(self);
    }
}

impl Transport for UnixStream {
    type Read<'a> = tokio::net::unix::ReadHalf<'a>;
    type Write<'a> = tokio::net::unix::WriteHalf<'a>;

    fn split(&mut self) -> (Self::Read<'_>, Self::Write<'_>) {
        UnixStream::split(self)
    }

    fn poll_first_bytes(&self, cx: &mut Context<'_>) -> Poll<Result<BytesMut, Closed>> {
        poll_first_bytes_of(self, cx)
    }

    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        UnixStream::poll_read_ready(self, cx).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever was read and split off (still held or already released), the
        /// unread bytes stay as they were and there is room for `n` more after them.
        #[test]
        fn make_room_keeps_the_unread_bytes_and_makes_room(
            cap in 0usize..20_000,
            read in 0usize..20_000,
            split in 0usize..20_000,
            hold in any::<bool>(),
            n in 1usize..70_000,
        ) {
            let mut buf = BytesMut::with_capacity(cap);
            let data: Vec<u8> = (0..read).map(|i| (i * 31 % 251) as u8).collect();
            buf.extend_from_slice(&data);
            let split = split.min(read);
            let taken = buf.split_to(split).freeze();
            let held = hold.then_some(taken);
            make_room(&mut buf, n);
            prop_assert_eq!(&buf[..], &data[split..]);
            prop_assert!(buf.capacity() - buf.len() >= n);
            if let Some(t) = held {
                prop_assert_eq!(&t[..], &data[..split]);
            }
        }
    }
}

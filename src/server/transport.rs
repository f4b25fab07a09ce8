//! The send timeout of responses to clients: a client that stops reading must not hold
//! its pool slot and backend connection for ever; and a static file's body sent with
//! `sendfile` under it. (The transport seam itself is `net::transport`, shared with the
//! backend side.)

use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use crate::net::transport::SendFile;

/// A response write that makes no progress this long ends the response (h1 writes and
/// h2 streams alike): a client that stops reading must not hold its pool slot and
/// backend connection for ever (nginx's `send_timeout` is the same rule).
pub(crate) const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A writer whose writes fail with `TimedOut` once one has made no progress for
/// [`SEND_TIMEOUT`]: the clock starts when a write cannot go on and restarts with each
/// byte the socket takes, so a slow reader is never cut, only a stopped one. The timer
/// is made the first time a write waits, never for writes that go straight through.
pub(crate) struct SendTimeout<W> {
    inner: W,
    stall: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The timer runs for the write that waits now.
    armed: bool,
}

impl<W> SendTimeout<W> {
    pub(crate) fn new(inner: W) -> SendTimeout<W> {
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

impl<W: SendFile> SendFile for SendTimeout<W> {
    fn can_send_file(&self) -> bool {
        self.inner.can_send_file()
    }

    fn poll_send_file(
        &mut self,
        cx: &mut Context<'_>,
        file: &std::fs::File,
        at: &mut u64,
        count: usize,
    ) -> Poll<std::io::Result<usize>> {
        let r = self.inner.poll_send_file(cx, file, at, count);
        self.went(r, cx)
    }

    fn poll_write_before_file(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = self.inner.poll_write_before_file(cx, buf);
        self.went(r, cx)
    }
}

/// Writes all of a response head that a file's bytes follow by `sendfile`, under the
/// send timeout; the kernel holds it until they join it ([`SendFile::poll_write_before_file`]).
pub(crate) async fn write_before_file<W: SendFile>(
    wr: &mut SendTimeout<W>,
    mut head: &[u8],
) -> std::io::Result<()> {
    while !head.is_empty() {
        match std::future::poll_fn(|cx| wr.poll_write_before_file(cx, head)).await? {
            0 => return Err(std::io::ErrorKind::WriteZero.into()),
            n => head = &head[n..],
        }
    }
    Ok(())
}

/// The most one `sendfile` call is asked for: the socket takes what its buffer holds,
/// and a large file goes in several calls, each waiting for room.
const SEND_FILE_MAX: u64 = 1 << 20;

/// Sends what is left of a file body with `sendfile`, under the send timeout: the
/// bytes sent, and how it ended. A file that ends early is an error (the length was
/// promised).
pub(crate) async fn send_file<W: SendFile>(
    wr: &mut SendTimeout<W>,
    f: &mut crate::body::FileBody,
) -> (u64, std::io::Result<()>) {
    let mut sent = 0;
    while f.left > 0 {
        let count = f.left.min(SEND_FILE_MAX) as usize;
        let n = match std::future::poll_fn(|cx| wr.poll_send_file(cx, &f.file, &mut f.at, count))
            .await
        {
            Ok(0) => return (sent, Err(crate::body::file_shrank())),
            Ok(n) => n,
            Err(e) => return (sent, Err(e)),
        };
        f.left -= n as u64;
        sent += n as u64;
    }
    (sent, Ok(()))
}

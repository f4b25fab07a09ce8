//! The one body type that flows through sluice, request or response.
//!
//! An enum rather than a boxed trait object so the common cases (no body, a small
//! fixed body, a stream from a client or a backend) cost no allocation. Never buffers:
//! every variant yields frames as they come.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::{mpsc, oneshot};

/// Why a body stopped before its end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// The body passed a `max_body` limit.
    #[error("request body is larger than the limit of {0} bytes")]
    TooLarge(u64),
    /// The client sent a body that breaks HTTP framing.
    #[error("malformed request body: {0}")]
    Malformed(&'static str),
    /// The client went away or stalled before the body ended.
    #[error("client stopped sending the body: {0}")]
    ClientGone(&'static str),
    /// An HTTP/2 client's stream failed (reset, or its connection broke).
    #[error("body stream failed: {0}")]
    Stream(#[from] h2::Error),
    /// A filter that watches the body (`body_deny`) refused it after it began to
    /// stream.
    #[error("request body refused by a filter")]
    Refused,
    /// The backend's body broke off.
    #[error("backend body failed: {0}")]
    Backend(std::io::Error),
}

/// A request body that stalls this long between reads fails (h1 and h2 alike).
pub(crate) const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// An HTTP/2 request body's length when it has no `Content-Length`.
pub(crate) const UNKNOWN: u64 = u64::MAX;

/// The timer of a body read that waits, made the first time one does.
pub(crate) struct Stall {
    timer: Pin<Box<tokio::time::Sleep>>,
    /// A read is waiting now, and the timer runs for it.
    armed: bool,
}

pub(crate) enum Body {
    Empty,
    Full(Option<Bytes>),
    /// An HTTP/2 client's request body: its stream, the bytes its `Content-Length`
    /// says are left ([`UNKNOWN`] without one), and the timer of a read that waits for
    /// it (made the first time one waits): [`BODY_READ_TIMEOUT`] without a byte fails it.
    H2(h2::RecvStream, u64, Option<Box<Stall>>),
    /// An HTTP/1 client's request body, fed by the connection task.
    Channel {
        rx: mpsc::Receiver<Result<Frame<Bytes>, BodyError>>,
        len: Option<u64>,
        /// Told on the first read, for `Expect: 100-continue`.
        want: Option<oneshot::Sender<()>>,
    },
    /// Any other body: a backend's response with the resources it holds until it ends.
    /// One allocation, which keeps this module free of what the bodies hold.
    Boxed(Pin<Box<dyn http_body::Body<Data = Bytes, Error = BodyError> + Send>>),
    Limited(Box<Body>, LimitState),
    /// A static file's bytes: read in pieces as the client takes them, or, on a plain
    /// TCP connection, sent by the kernel from the page cache (`sendfile`).
    File(Box<FileBody>),
}

/// A file's bytes from `at`, `left` of them.
pub(crate) struct FileBody {
    pub file: std::fs::File,
    pub at: u64,
    pub left: u64,
}

/// How much of a file one read takes.
const FILE_READ: usize = 64 * 1024;

impl FileBody {
    /// The next piece, read at `at` (the read runs on the worker: from the page cache
    /// it takes microseconds).
    fn read(&mut self) -> Option<Result<Frame<Bytes>, BodyError>> {
        use std::os::unix::fs::FileExt;
        if self.left == 0 {
            return None;
        }
        let want = (self.left.min(FILE_READ as u64)) as usize;
        let mut buf = bytes::BytesMut::zeroed(want);
        Some(match self.file.read_at(&mut buf, self.at) {
            Err(e) => Err(BodyError::Backend(e)),
            Ok(0) => Err(BodyError::Backend(file_shrank())),
            Ok(n) => {
                self.left -= n as u64;
                self.at += n as u64;
                buf.truncate(n);
                Ok(Frame::data(buf.freeze()))
            }
        })
    }
}

/// A file that ended before the length promised for it.
pub(crate) fn file_shrank() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the file shrank while it was sent",
    )
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Body")
    }
}

/// State of a `max_body` check on a streamed body.
pub(crate) struct LimitState {
    pub limit: u64,
    pub seen: u64,
}

impl Body {
    pub(crate) fn stream(
        b: impl http_body::Body<Data = Bytes, Error = BodyError> + Send + 'static,
    ) -> Body {
        Body::Boxed(Box::pin(b))
    }

    pub(crate) fn full(b: impl Into<Bytes>) -> Body {
        let b = b.into();
        if b.is_empty() {
            Body::Empty
        } else {
            Body::Full(Some(b))
        }
    }

    /// Cuts the body off with `TooLarge` once more than `limit` bytes passed.
    pub(crate) fn limited(self, limit: u64) -> Body {
        Body::Limited(Box::new(self), LimitState { limit, seen: 0 })
    }
}

/// The request, for what consumes it (the proxy's send, FastCGI, a cache), from a
/// pipeline that lends it down by reference; left behind is an empty `GET /` that
/// nothing reads.
pub(crate) fn take_request(req: &mut http::Request<Body>) -> http::Request<Body> {
    std::mem::replace(req, http::Request::new(Body::Empty))
}

/// A read that waits: the clock starts when a read begins to wait, not when the last
/// frame came (time sluice itself spent not reading is not a stall), and fails the body
/// once it ran [`BODY_READ_TIMEOUT`].
fn waited(
    stall: &mut Option<Box<Stall>>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    let timer = match stall {
        Some(s) => {
            let Stall { timer, armed } = &mut **s;
            if !*armed {
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + BODY_READ_TIMEOUT);
                *armed = true;
            }
            timer
        }
        None => {
            let deadline = tokio::time::Instant::now() + BODY_READ_TIMEOUT;
            &mut stall
                .insert(Box::new(Stall {
                    timer: Box::pin(tokio::time::sleep_until(deadline)),
                    armed: true,
                }))
                .timer
        }
    };
    match std::future::Future::poll(timer.as_mut(), cx) {
        Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::ClientGone(
            "no request body bytes for 60s",
        )))),
        Poll::Pending => Poll::Pending,
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Body::Empty => Poll::Ready(None),
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::H2(recv, left, stall) => {
                let r = match recv.poll_data(cx) {
                    Poll::Ready(Some(Ok(d))) => {
                        // Read is read: the client may send as much again.
                        let _ = recv.flow_control().release_capacity(d.len());
                        if *left != UNKNOWN {
                            *left = left.saturating_sub(d.len() as u64);
                        }
                        Poll::Ready(Some(Ok(Frame::data(d))))
                    }
                    Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(BodyError::Stream(e)))),
                    Poll::Ready(None) => match recv.poll_trailers(cx) {
                        Poll::Ready(Ok(t)) => Poll::Ready(t.map(|t| Ok(Frame::trailers(t)))),
                        Poll::Ready(Err(e)) => Poll::Ready(Some(Err(BodyError::Stream(e)))),
                        Poll::Pending => Poll::Pending,
                    },
                    Poll::Pending => Poll::Pending,
                };
                match r {
                    Poll::Pending => waited(stall, cx),
                    ready => {
                        if let Some(s) = stall {
                            s.armed = false;
                        }
                        ready
                    }
                }
            }
            Body::Channel { rx, want, .. } => {
                if let Some(w) = want.take() {
                    let _ = w.send(());
                }
                rx.poll_recv(cx)
            }
            Body::Boxed(b) => b.as_mut().poll_frame(cx),
            Body::File(f) => Poll::Ready(f.read()),
            Body::Limited(b, st) => {
                let r = Pin::new(&mut **b).poll_frame(cx);
                if let Poll::Ready(Some(Ok(f))) = &r {
                    if let Some(d) = f.data_ref() {
                        st.seen += d.len() as u64;
                        if st.seen > st.limit {
                            return Poll::Ready(Some(Err(BodyError::TooLarge(st.limit))));
                        }
                    }
                }
                r
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Empty => true,
            Body::Full(b) => b.is_none(),
            Body::H2(recv, _, _) => recv.is_end_stream(),
            Body::Channel { len, .. } => *len == Some(0),
            Body::Boxed(b) => b.is_end_stream(),
            Body::Limited(b, _) => b.is_end_stream(),
            Body::File(f) => f.left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Empty => SizeHint::with_exact(0),
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::H2(recv, _, _) if recv.is_end_stream() => SizeHint::with_exact(0),
            Body::H2(_, UNKNOWN, _) => SizeHint::default(),
            Body::H2(_, left, _) => SizeHint::with_exact(*left),
            Body::Channel { len: Some(n), .. } => SizeHint::with_exact(*n),
            Body::Channel { len: None, .. } => SizeHint::default(),
            Body::Boxed(b) => b.size_hint(),
            Body::Limited(b, _) => b.size_hint(),
            Body::File(f) => SizeHint::with_exact(f.left),
        }
    }
}

#[cfg(test)]
mod size {
    /// A request's body is moved with it several times a request: a variant that grows
    /// it (a timer inline, say) costs every request its copy. Rare state goes in a box.
    #[test]
    fn a_body_stays_small() {
        assert!(
            std::mem::size_of::<super::Body>() <= 48,
            "Body is {} bytes",
            std::mem::size_of::<super::Body>()
        );
    }
}

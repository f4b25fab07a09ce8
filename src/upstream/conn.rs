//! A backend HTTP/1.1 connection, driven inline by the request that holds it.
//!
//! Why not hyper's client: it runs each connection as its own task and hands requests
//! and responses across channels, which cost two task wakeups and several allocations
//! per request — about a third of sluice's user-space instructions per proxied request
//! (measured with callgrind, docs/performance.md). Here the request's task writes the
//! head, streams the body, reads the response head and then, through
//! `proxy::ResponseBody`, the body, on the pooled socket itself. The bytes are the
//! `http1` codec's, client role.
//!
//! Never buffers a body; a connection is reused only after a response that ended
//! cleanly and a request body that was sent whole.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, Request};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::body::{Body, BodyError};
use crate::http1::decode::{Decoded, Decoder};
use crate::http1::encode::{self, chunk, chunk_into, take_ready, BodyOut};
use crate::http1::head::{parse_response, ResponseHead};
use crate::http1::scan::ResponseScan;
use crate::http1::{COALESCE, MAX_RESPONSE_HEAD, READ_CHUNK};

pub enum Io {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// HTTP/1.1 over TLS (an `https://` backend that chose `http/1.1`).
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

pub struct BackendConn {
    io: Io,
    buf: BytesMut,
    /// Where request heads are encoded; kept small between requests.
    wbuf: Vec<u8>,
}

/// A request on its way to a backend: its head, how its body is framed (decided once,
/// before any of it is read), the body still to come, and the body frames already
/// taken for a write that has not been known to go out, so that a connection found
/// closed before the request left can hand it back whole.
pub struct Outgoing {
    pub parts: http::request::Parts,
    pub body: Body,
    framing: BodyOut,
    /// Data frames taken from `body` for a write that has not gone out yet.
    resend: Vec<Bytes>,
    /// `body` ended while its frames were taken.
    body_ended: bool,
    /// The replay buffer, for a request that may be retried after it was sent.
    kept: Option<Kept>,
    /// Some of the body was handed to an HTTP/2 stream.
    taken: bool,
}

/// Every body frame sent so far, up to a cap: past it, the request can no longer be
/// sent again and the frames are let go.
struct Kept {
    frames: Vec<Bytes>,
    bytes: u64,
    limit: u64,
    overflowed: bool,
}

impl Kept {
    fn push(&mut self, data: Bytes) {
        if self.overflowed || data.is_empty() {
            return;
        }
        self.bytes += data.len() as u64;
        if self.bytes > self.limit {
            self.overflowed = true;
            self.frames = Vec::new();
        } else {
            self.frames.push(data);
        }
    }
}

impl Outgoing {
    pub fn new(req: Request<Body>) -> Outgoing {
        let (parts, body) = req.into_parts();
        let framing = if body.is_end_stream() {
            BodyOut::Empty
        } else if parts.headers.contains_key(header::CONTENT_LENGTH) {
            BodyOut::Declared
        } else if let Some(n) = body.size_hint().exact() {
            BodyOut::Length(n)
        } else {
            BodyOut::Chunked
        };
        Outgoing {
            parts,
            body,
            framing,
            resend: Vec::new(),
            body_ended: false,
            kept: None,
            taken: false,
        }
    }

    /// Keeps the body as it is sent, up to `limit` bytes, so the request can go out
    /// again after it reached a backend (`retry_on`).
    pub fn keep_for_replay(&mut self, limit: u64) {
        self.kept = Some(Kept {
            frames: Vec::new(),
            bytes: 0,
            limit,
            overflowed: false,
        });
    }

    /// Whether [`Self::rewind`] would succeed.
    pub fn can_rewind(&self) -> bool {
        self.kept.as_ref().is_some_and(|k| !k.overflowed)
    }

    /// Makes the request ready to go out again from its start. `false`: it cannot (not
    /// kept, or its body outgrew the replay buffer).
    pub fn rewind(&mut self) -> bool {
        match &mut self.kept {
            Some(k) if !k.overflowed => {
                self.resend = std::mem::take(&mut k.frames);
                k.bytes = 0;
                true
            }
            _ => false,
        }
    }

    /// Nothing of a body to send: the request is its head alone.
    pub fn nothing_to_send(&self) -> bool {
        self.framing == BodyOut::Empty
    }

    /// The next body frame for an HTTP/2 stream (which buffers what it takes): frames
    /// an earlier attempt left first, then the body's. Kept for replay as taken.
    pub async fn next_frame(&mut self) -> Result<Option<http_body::Frame<Bytes>>, BodyError> {
        if !self.resend.is_empty() {
            let data = self.resend.remove(0);
            self.taken = true;
            self.sent(&data);
            return Ok(Some(http_body::Frame::data(data)));
        }
        if self.body_ended || self.framing == BodyOut::Empty {
            return Ok(None);
        }
        match self.body.frame().await {
            None => {
                self.body_ended = true;
                Ok(None)
            }
            Some(Err(e)) => Err(e),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    self.taken = true;
                    let data = data.clone();
                    self.sent(&data);
                }
                Ok(Some(frame))
            }
        }
    }

    /// After an HTTP/2 stream the backend never processed: whether the request can go
    /// out again whole (nothing was taken, or the replay buffer has it all).
    pub fn rewind_all(&mut self) -> bool {
        !self.taken || self.rewind()
    }

    fn sent(&mut self, data: &Bytes) {
        if let Some(k) = &mut self.kept {
            k.push(data.clone());
        }
    }
}

/// Why sending a request or reading its answer failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Not one byte of the request went out (a pooled connection the backend had
    /// closed): the `Outgoing` still holds all of it, to go out on a fresh connection.
    #[error("connection closed before the request went out")]
    NotSent,
    /// The client's body failed: its fault, not the backend's.
    #[error("{0}")]
    Body(BodyError),
    /// The connection broke with the request on it.
    #[error("{0}")]
    Io(io::Error),
    #[error("connection closed before a response")]
    ClosedEarly,
    /// The backend's response head breaks HTTP.
    #[error("invalid response: {0}")]
    Invalid(&'static str),
    /// No response head within the pool's `timeout` (not the peer's failure).
    #[error("no response head in time")]
    TimedOut,
    /// The HTTP/2 library refused the request before it had a stream (its fields break
    /// HTTP/2): the request's fault, never the peer's.
    #[error("the request cannot be sent over HTTP/2: {0}")]
    Unsendable(String),
}

impl BackendConn {
    pub fn new(io: Io) -> BackendConn {
        BackendConn {
            io,
            buf: BytesMut::new(),
            wbuf: Vec::new(),
        }
    }

    /// Whether an idle connection can take a request. No syscall unless the socket
    /// reported activity while idle (then a closed or chatty connection is dropped).
    pub fn is_reusable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let ready = match &mut self.io {
            Io::Tcp(s) => s.poll_read_ready(&mut cx),
            Io::Unix(s) => s.poll_read_ready(&mut cx),
            // Through the TLS layer: a session ticket or close_notify is not data.
            Io::Tls(s) => {
                let mut probe = [0u8; 1];
                let mut rb = ReadBuf::new(&mut probe);
                return matches!(Pin::new(s).poll_read(&mut cx, &mut rb), Poll::Pending);
            }
        };
        match ready {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                let r = match &self.io {
                    Io::Tcp(s) => s.try_read(&mut probe),
                    Io::Unix(s) => s.try_read(&mut probe),
                    Io::Tls(_) => return false,
                };
                matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// The stream and the bytes already read past the last response head (the start
    /// of an upgraded protocol).
    pub fn into_parts(self) -> (Io, BytesMut) {
        (self.io, self.buf)
    }

    /// Turns on TCP keepalive, for a connection that will idle as a tunnel.
    pub fn keepalive(&self) {
        match &self.io {
            Io::Tcp(s) => tcp_keepalive(s),
            Io::Tls(s) => tcp_keepalive(s.get_ref().0),
            Io::Unix(_) => {}
        }
    }

    /// Gives back buffer memory while the connection sits idle.
    pub fn shrink(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
        if self.wbuf.capacity() > 4096 {
            self.wbuf = Vec::new();
        }
    }

    /// Sends the request and reads the response head. The request body streams while
    /// the head is awaited, so a backend may answer before the upload ends.
    pub async fn send(&mut self, out: &mut Outgoing) -> Result<ResponseHead, SendError> {
        let is_head = out.parts.method == Method::HEAD;
        let chunked = encode::request_head(&mut self.wbuf, &out.parts, out.framing);
        // Frames an earlier attempt took go first, then whatever else is ready.
        for data in out.resend.iter().filter(|d| !d.is_empty()) {
            if chunked {
                chunk_into(&mut self.wbuf, data);
            } else {
                self.wbuf.extend_from_slice(data);
            }
        }
        if out.body_ended {
            if chunked {
                self.wbuf.extend_from_slice(b"0\r\n\r\n");
            }
        } else if out.framing != BodyOut::Empty {
            out.body_ended = take_ready(
                &mut out.body,
                chunked,
                &mut self.wbuf,
                COALESCE,
                Some(&mut out.resend),
                &mut 0,
            )
            .map_err(SendError::Body)?;
        } else {
            out.body_ended = true;
        }
        let mut written = 0;
        while written < self.wbuf.len() {
            match self.io.write(&self.wbuf[written..]).await {
                Ok(0) => return Err(SendError::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => written += n,
                // Nothing of the request was taken: it may go out on another connection.
                Err(e) if written == 0 && is_closed_error(&e) => return Err(SendError::NotSent),
                Err(e) => return Err(SendError::Io(e)),
            }
        }
        // Gone out: from here on the request is sent again only from the replay buffer.
        for data in std::mem::take(&mut out.resend) {
            out.sent(&data);
        }
        let mut early = false;
        let mut body_done = out.body_ended;
        let mut write_failed = None;
        if let Io::Tls(tls) = &mut self.io {
            // One TLS session cannot be read and written from two futures at once: one
            // poll loop does both (boxed: it is rare, and the request's future stays
            // small).
            let r = Box::pin(upload_tls(tls, &mut self.buf, out, chunked)).await?;
            match r {
                TlsUpload::Sent => body_done = true,
                TlsUpload::Early => {
                    early = true;
                    body_done = true;
                }
                TlsUpload::WriteFailed(e) => write_failed = Some(e),
            }
        }
        while !body_done {
            let Some((mut rd, mut wr)) = self.io.split() else {
                break;
            };
            tokio::select! {
                biased;
                r = wait_readable(&mut rd) => {
                    r.map_err(SendError::Io)?;
                    // Readiness is a hint: only bytes (or the close) mean the backend
                    // answered before the upload ended.
                    self.buf.reserve(READ_CHUNK);
                    match rd.try_read_buf(&mut self.buf) {
                        Ok(_) => {
                            early = true;
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(SendError::Io(e)),
                    }
                }
                frame = out.body.frame() => match frame {
                    None => {
                        if chunked {
                            if let Err(e) = wr.write_all(b"0\r\n\r\n").await {
                                write_failed = Some(e);
                                break;
                            }
                        }
                        body_done = true;
                        out.body_ended = true;
                    }
                    Some(Err(e)) => return Err(SendError::Body(e)),
                    Some(Ok(frame)) => {
                        let Ok(data) = frame.into_data() else { continue };
                        if data.is_empty() {
                            continue;
                        }
                        out.sent(&data);
                        let w = if chunked { chunk(&mut wr, &data).await } else { wr.write_all(&data).await };
                        if let Err(e) = w {
                            write_failed = Some(e);
                            break;
                        }
                    }
                }
            }
        }
        if let Some(e) = write_failed {
            // The backend may have answered, and closed, before the upload ended: its
            // answer is what the client gets, not a 502.
            return match self.answer_already_here(is_head) {
                Some(mut head) => {
                    head.reusable = false;
                    Ok(head)
                }
                None => Err(SendError::Io(e)),
            };
        }
        let mut head = self.read_head(is_head).await?;
        if early {
            head.reusable = false;
        }
        Ok(head)
    }

    /// A response head that arrived already, read without waiting.
    fn answer_already_here(&mut self, is_head: bool) -> Option<ResponseHead> {
        loop {
            self.buf.reserve(READ_CHUNK);
            let r = match &mut self.io {
                Io::Tcp(s) => s.try_read_buf(&mut self.buf),
                Io::Unix(s) => s.try_read_buf(&mut self.buf),
                Io::Tls(s) => {
                    let mut cx = Context::from_waker(Waker::noop());
                    match std::pin::pin!(s.read_buf(&mut self.buf)).poll(&mut cx) {
                        Poll::Ready(r) => r,
                        Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                    }
                }
            };
            if !matches!(r, Ok(n) if n > 0) || self.buf.len() > MAX_RESPONSE_HEAD {
                break;
            }
        }
        let mut scan = ResponseScan::default();
        loop {
            let len = scan.find_end(&self.buf)?;
            match parse_response(&mut self.buf, len, is_head).ok()? {
                Some(head) => return Some(head),
                None => scan = ResponseScan::default(),
            }
        }
    }

    async fn read_head(&mut self, is_head: bool) -> Result<ResponseHead, SendError> {
        let mut scan = ResponseScan::default();
        loop {
            if let Some(len) = scan.find_end(&self.buf) {
                match parse_response(&mut self.buf, len, is_head) {
                    Ok(Some(head)) => return Ok(head),
                    // An interim answer, taken off: the next head starts afresh.
                    Ok(None) => {
                        scan = ResponseScan::default();
                        continue;
                    }
                    Err(e) => return Err(SendError::Invalid(e.0)),
                }
            }
            // Nothing more can be a head once this much arrived without its end.
            if self.buf.len() > MAX_RESPONSE_HEAD {
                return Err(SendError::Invalid("response head too large"));
            }
            self.buf.reserve(READ_CHUNK);
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) => return Err(SendError::ClosedEarly),
                Ok(_) => {}
                Err(e) => return Err(SendError::Io(e)),
            }
        }
    }

    /// Reads the next piece of a response body into its decoder's output.
    pub fn poll_body(
        &mut self,
        decoder: &mut Decoder,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            match decoder.decode(&mut self.buf) {
                Ok(Decoded::Data(b)) => return Poll::Ready(Some(Ok(b))),
                Ok(Decoded::Done) => return Poll::Ready(None),
                Ok(Decoded::NeedMore) => {}
                Err(why) => {
                    return Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::InvalidData, why))))
                }
            }
            self.buf.reserve(READ_CHUNK);
            let read = std::pin::pin!(self.io.read_buf(&mut self.buf)).poll(cx);
            match read {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Ok(0)) => {
                    if decoder.until_eof() {
                        decoder.finish();
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "backend closed the connection mid-body",
                    ))));
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
    }
}

/// The body of a request over TLS, with the backend's side read before each write, so
/// a backend that answers before the upload ends (and stops reading) is heard at once,
/// as over a plain socket.
async fn upload_tls(
    tls: &mut tokio_rustls::client::TlsStream<TcpStream>,
    buf: &mut BytesMut,
    out: &mut Outgoing,
    chunked: bool,
) -> Result<TlsUpload, SendError> {
    let mut pending: Vec<u8> = Vec::new();
    let mut written = 0;
    std::future::poll_fn(|cx| {
        loop {
            // The backend spoke: its answer comes before the rest of the upload.
            let mut first = [0u8; 4096];
            let mut rb = ReadBuf::new(&mut first);
            match Pin::new(&mut *tls).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    buf.extend_from_slice(rb.filled());
                    return Poll::Ready(Ok(TlsUpload::Early));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(SendError::Io(e))),
                Poll::Pending => {}
            }
            if written < pending.len() {
                match Pin::new(&mut *tls).poll_write(cx, &pending[written..]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Ok(TlsUpload::WriteFailed(
                            io::ErrorKind::WriteZero.into(),
                        )))
                    }
                    Poll::Ready(Ok(n)) => {
                        written += n;
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Ok(TlsUpload::WriteFailed(e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if out.body_ended {
                return match Pin::new(&mut *tls).poll_flush(cx) {
                    Poll::Ready(Ok(())) => Poll::Ready(Ok(TlsUpload::Sent)),
                    Poll::Ready(Err(e)) => Poll::Ready(Ok(TlsUpload::WriteFailed(e))),
                    Poll::Pending => Poll::Pending,
                };
            }
            pending.clear();
            written = 0;
            match Pin::new(&mut out.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    out.body_ended = true;
                    if chunked {
                        pending.extend_from_slice(b"0\r\n\r\n");
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(SendError::Body(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    out.sent(&data);
                    if chunked {
                        chunk_into(&mut pending, &data);
                    } else {
                        pending.extend_from_slice(&data);
                    }
                }
            }
        }
    })
    .await
}

/// How an upload over TLS ended.
enum TlsUpload {
    /// The whole body went out.
    Sent,
    /// The backend answered (or closed) first; what it sent is in the buffer.
    Early,
    WriteFailed(io::Error),
}

fn is_closed_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
    )
}

/// Resolves when the read side has something (data or EOF), without reading it.
async fn wait_readable(rd: &mut IoRead<'_>) -> io::Result<()> {
    std::future::poll_fn(|cx| match rd {
        IoRead::Tcp(r) => r.as_ref().poll_read_ready(cx),
        IoRead::Unix(r) => r.as_ref().poll_read_ready(cx),
    })
    .await
}

impl IoRead<'_> {
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            IoRead::Tcp(r) => r.try_read_buf(buf),
            IoRead::Unix(r) => r.try_read_buf(buf),
        }
    }
}

impl Io {
    /// Borrowed halves of a socket; `None` for TLS, whose session is one.
    fn split(&mut self) -> Option<(IoRead<'_>, IoWrite<'_>)> {
        match self {
            Io::Tcp(s) => {
                let (r, w) = s.split();
                Some((IoRead::Tcp(r), IoWrite::Tcp(w)))
            }
            Io::Unix(s) => {
                let (r, w) = s.split();
                Some((IoRead::Unix(r), IoWrite::Unix(w)))
            }
            Io::Tls(_) => None,
        }
    }
}

enum IoRead<'a> {
    Tcp(tokio::net::tcp::ReadHalf<'a>),
    Unix(tokio::net::unix::ReadHalf<'a>),
}

enum IoWrite<'a> {
    Tcp(tokio::net::tcp::WriteHalf<'a>),
    Unix(tokio::net::unix::WriteHalf<'a>),
}

macro_rules! delegate_write {
    ($t:ty, $($v:ident),+) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }
            fn is_write_vectored(&self) -> bool {
                true
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_flush(cx),)+
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$v(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate_write!(Io, Tcp, Unix, Tls);
delegate_write!(IoWrite<'_>, Tcp, Unix);

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

/// TCP keepalive for a socket that may idle for long as a tunnel's end: the first probe
/// after 60 s of silence, then every 10 s, so a peer that vanished is noticed.
pub fn tcp_keepalive(s: &tokio::net::TcpStream) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(60))
        .with_interval(std::time::Duration::from_secs(10));
    let _ = socket2::SockRef::from(s).set_tcp_keepalive(&ka);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A body fed in `pieces`, with `Content-Length` when `declared`.
    fn request(pieces: &[&'static str], declared: bool) -> Outgoing {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let (tx, rx) = mpsc::channel(pieces.len());
        for p in pieces {
            tx.try_send(Ok(Bytes::from_static(p.as_bytes()))).unwrap();
        }
        let mut req = Request::new(Body::Channel {
            rx,
            len: declared.then_some(total as u64),
            want: None,
        });
        *req.method_mut() = Method::POST;
        *req.uri_mut() = "/upload".parse().unwrap();
        if declared {
            req.headers_mut()
                .insert(header::CONTENT_LENGTH, total.into());
        }
        Outgoing::new(req)
    }

    /// Reads one request off `peer` (until `end` is seen), answers 200, returns it.
    async fn serve_one(mut peer: UnixStream, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !done(&got) {
            let n = peer.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the request ended early: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        peer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        got
    }

    /// The first connection was closed by its peer before anything was written: the
    /// request must go out whole on the next one, body frames taken for the first
    /// write included.
    async fn resent_whole(declared: bool) -> String {
        let mut out = request(&["hello ", "wide ", "world"], declared);
        let (closed, gone) = UnixStream::pair().unwrap();
        drop(gone);
        let mut stale = BackendConn::new(Io::Unix(closed));
        let r = stale.send(&mut out).await;
        assert!(
            matches!(r, Err(SendError::NotSent)),
            "a closed socket sends nothing"
        );

        let (fresh, peer) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(serve_one(peer, move |got: &[u8]| {
            let s = String::from_utf8_lossy(got);
            if declared {
                s.ends_with("world")
            } else {
                s.ends_with("0\r\n\r\n")
            }
        }));
        let mut conn = BackendConn::new(Io::Unix(fresh));
        let head = conn.send(&mut out).await.expect("the resend succeeds");
        assert_eq!(head.parts.status, 200);
        String::from_utf8(reader.await.unwrap()).unwrap()
    }

    #[tokio::test]
    async fn an_empty_frame_never_ends_a_chunked_body_early() {
        let mut out = request(&["abc", "", "rest"], false);
        let (closed, gone) = UnixStream::pair().unwrap();
        drop(gone);
        let r = BackendConn::new(Io::Unix(closed)).send(&mut out).await;
        assert!(matches!(r, Err(SendError::NotSent)));
        let (fresh, peer) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(serve_one(peer, |got: &[u8]| got.ends_with(b"0\r\n\r\n")));
        BackendConn::new(Io::Unix(fresh))
            .send(&mut out)
            .await
            .unwrap();
        let got = String::from_utf8(reader.await.unwrap()).unwrap();
        assert!(
            got.ends_with("\r\n\r\n3\r\nabc\r\n4\r\nrest\r\n0\r\n\r\n"),
            "one terminator, at the end: {got:?}"
        );
    }

    #[tokio::test]
    async fn a_stale_connection_hands_back_every_body_byte() {
        let chunked = resent_whole(false).await;
        assert!(
            chunked.ends_with("\r\n\r\n6\r\nhello \r\n5\r\nwide \r\n5\r\nworld\r\n0\r\n\r\n"),
            "chunked body resent whole: {chunked:?}"
        );
        let sized = resent_whole(true).await;
        assert!(sized.contains("content-length: 16\r\n"), "{sized:?}");
        assert!(
            sized.ends_with("\r\n\r\nhello wide world"),
            "sized body resent whole: {sized:?}"
        );
    }
}

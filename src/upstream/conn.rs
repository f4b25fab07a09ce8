//! A backend HTTP/1.1 connection, driven inline by the request that holds it.
//!
//! Why not hyper's client: it runs each connection as its own task and hands requests
//! and responses across channels, which cost two task wakeups and several allocations
//! per request — about a third of sluice's user-space instructions per proxied request
//! (measured with callgrind, docs/performance.md). Here the request's task writes the
//! head, streams the body, reads the response head and then, through
//! `proxy::ResponseBody`, the body, on the pooled socket itself.
//!
//! Never buffers a body; a connection is reused only after a response that ended
//! cleanly and a request body that was sent whole.

use std::future::Future as _;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::body::{Body, BodyError};
use crate::server::h1::decode::{Decoded, Decoder};
use crate::server::h1::encode::{chunk, take_ready};

/// The largest response head accepted from a backend.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// Most header fields accepted in a backend's response head.
const MAX_RESPONSE_HEADERS: usize = 128;
const READ_CHUNK: usize = 16 * 1024;
/// Request bodies this small leave with the head in one write.
const COALESCE: usize = 16 * 1024;

pub enum Io {
    Tcp(TcpStream),
    Unix(UnixStream),
}

pub struct BackendConn {
    io: Io,
    buf: BytesMut,
    /// Where request heads are encoded; kept small between requests.
    wbuf: Vec<u8>,
}

/// Why sending a request or reading its answer failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Not one byte of the request went out (a pooled connection the backend had
    /// closed): the request is handed back to go out on a fresh connection.
    #[error("connection closed before the request went out")]
    NotSent(Box<Request<Body>>),
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
}

/// A response head and how its body is framed on this connection.
pub struct Head {
    pub parts: http::response::Parts,
    pub decoder: Decoder,
    /// The connection may carry another request once this body ends.
    pub reusable: bool,
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
        let ready = match &self.io {
            Io::Tcp(s) => s.poll_read_ready(&mut cx),
            Io::Unix(s) => s.poll_read_ready(&mut cx),
        };
        match ready {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                let r = match &self.io {
                    Io::Tcp(s) => s.try_read(&mut probe),
                    Io::Unix(s) => s.try_read(&mut probe),
                };
                matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
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

    /// Sends `req` and reads the response head. The request body streams while the
    /// head is awaited, so a backend may answer before the upload ends.
    pub async fn send(&mut self, req: Request<Body>) -> Result<Head, SendError> {
        let is_head = req.method() == Method::HEAD;
        let (parts, mut body) = req.into_parts();
        let chunked = encode_head(&mut self.wbuf, &parts, &body);
        let mut body_done = body.is_end_stream();
        if !body_done {
            body_done = take_ready(&mut body, chunked, &mut self.wbuf, COALESCE)
                .map_err(SendError::Body)?;
        }
        let mut written = 0;
        while written < self.wbuf.len() {
            match self.io.write(&self.wbuf[written..]).await {
                Ok(0) => return Err(SendError::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => written += n,
                // Nothing of the request was taken: it may go out on another connection.
                Err(e) if written == 0 && is_closed_error(&e) => {
                    return Err(SendError::NotSent(Box::new(Request::from_parts(
                        parts, body,
                    ))))
                }
                Err(e) => return Err(SendError::Io(e)),
            }
        }
        let mut early = false;
        while !body_done {
            let (mut rd, mut wr) = self.io.split();
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
                frame = body.frame() => match frame {
                    None => {
                        if chunked {
                            wr.write_all(b"0\r\n\r\n").await.map_err(SendError::Io)?;
                        }
                        body_done = true;
                    }
                    Some(Err(e)) => return Err(SendError::Body(e)),
                    Some(Ok(frame)) => {
                        let Ok(data) = frame.into_data() else { continue };
                        if data.is_empty() {
                            continue;
                        }
                        let w = if chunked { chunk(&mut wr, &data).await } else { wr.write_all(&data).await };
                        w.map_err(SendError::Io)?;
                    }
                }
            }
        }
        let mut head = self.read_head(is_head).await?;
        if early {
            head.reusable = false;
        }
        Ok(head)
    }

    async fn read_head(&mut self, is_head: bool) -> Result<Head, SendError> {
        loop {
            if let Some(head) = parse_head(&mut self.buf, is_head)? {
                return Ok(head);
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

fn is_closed_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
    )
}

/// Writes the request head into `out`; returns whether the body goes chunked.
fn encode_head(out: &mut Vec<u8>, parts: &http::request::Parts, body: &Body) -> bool {
    out.clear();
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let has_length = parts.headers.contains_key(header::CONTENT_LENGTH);
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let chunked = if body.is_end_stream() || has_length {
        false
    } else if let Some(n) = body.size_hint().exact() {
        out.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
        false
    } else {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        true
    };
    out.extend_from_slice(b"\r\n");
    chunked
}

/// Where a response head ends (one past its blank line), if it is complete.
/// Backends get some leniency: a bare LF ends lines too.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(off) = buf[from..].iter().position(|&b| b == b'\n') {
        let lf = from + off;
        match buf.get(lf + 1..lf + 3) {
            Some([b'\r', b'\n']) => return Some(lf + 3),
            Some([b'\n', _]) => return Some(lf + 2),
            None if buf.get(lf + 1) == Some(&b'\n') => return Some(lf + 2),
            _ => {}
        }
        from = lf + 1;
    }
    None
}

/// Parses a response head at the front of `buf` (1xx interim answers are skipped).
fn parse_head(buf: &mut BytesMut, is_head: bool) -> Result<Option<Head>, SendError> {
    loop {
        let Some(len) = head_end(buf) else {
            return Ok(None);
        };
        let head = buf.split_to(len).freeze();
        let mut slots =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        match httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut resp, &head, &mut slots)
        {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => {
                return Err(SendError::Invalid("malformed response head"))
            }
            Err(httparse::Error::TooManyHeaders) => {
                return Err(SendError::Invalid("too many header fields"))
            }
            Err(_) => return Err(SendError::Invalid("malformed response head")),
        }
        let code = resp.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| SendError::Invalid("invalid status code"))?;
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            continue;
        }
        let version = if resp.version == Some(1) {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        let mut headers = HeaderMap::with_capacity(resp.headers.len() + 2);
        let mut length: Option<u64> = None;
        let mut chunked = false;
        let mut te = false;
        let mut close = version == Version::HTTP_10;
        let mut keep_alive = false;
        for h in resp.headers.iter() {
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| SendError::Invalid("invalid header name"))?;
            if name == header::CONTENT_LENGTH {
                let n = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .ok_or(SendError::Invalid("invalid Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(SendError::Invalid("differing Content-Length values"));
                }
                length = Some(n);
            } else if name == header::TRANSFER_ENCODING {
                te = true;
                chunked = h
                    .value
                    .split(|&b| b == b',')
                    .next_back()
                    .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if name == header::CONNECTION {
                for t in h.value.split(|&b| b == b',') {
                    close |= t.trim_ascii().eq_ignore_ascii_case(b"close");
                    keep_alive |= t.trim_ascii().eq_ignore_ascii_case(b"keep-alive");
                }
            }
            let value = HeaderValue::from_maybe_shared(head.slice_ref(h.value))
                .map_err(|_| SendError::Invalid("invalid header value"))?;
            headers.append(name, value);
        }
        if version == Version::HTTP_10 && keep_alive {
            close = false;
        }
        let no_body = is_head
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
            || status.is_informational();
        let (decoder, delimited) = if no_body {
            (Decoder::length(0), true)
        } else if te {
            if chunked {
                (Decoder::chunked(), true)
            } else {
                (Decoder::until_close(), false)
            }
        } else if let Some(n) = length {
            (Decoder::length(n), true)
        } else {
            (Decoder::until_close(), false)
        };
        let mut builder = http::Response::builder().status(status).version(version);
        if let Some(h) = builder.headers_mut() {
            *h = headers;
        }
        let (parts, ()) = builder
            .body(())
            .map_err(|_| SendError::Invalid("invalid response"))?
            .into_parts();
        return Ok(Some(Head {
            parts,
            decoder,
            reusable: delimited && !close,
        }));
    }
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
    fn split(&mut self) -> (IoRead<'_>, IoWrite<'_>) {
        match self {
            Io::Tcp(s) => {
                let (r, w) = s.split();
                (IoRead::Tcp(r), IoWrite::Tcp(w))
            }
            Io::Unix(s) => {
                let (r, w) = s.split();
                (IoRead::Unix(r), IoWrite::Unix(w))
            }
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
                }
            }
            fn is_write_vectored(&self) -> bool {
                true
            }
            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_flush(cx),
                    Self::Unix(s) => Pin::new(s).poll_flush(cx),
                }
            }
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Unix(s) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_write!(Io);
delegate_write!(IoWrite<'_>);

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

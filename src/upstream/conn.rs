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
use std::io::{self, IoSlice};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(crate) use super::outgoing::{Outgoing, SendError};
use super::upload::{upload, Piece, Rest, Upload};
use crate::http1::decode::{Decoded, Decoder};
use crate::http1::encode::{self, chunk_into, spilled_slices, take_ready, BodyOut, Spill};
use crate::http1::head::{parse_response, AsSent, ResponseHead};
use crate::http1::scan::ResponseScan;
use crate::http1::{MAX_RESPONSE_HEAD, READ_CHUNK};
use crate::net::stream::Stream;
use crate::net::transport::{is_quiet, make_room, read_now, Transport};

pub(crate) struct BackendConn {
    io: Stream,
    buf: BytesMut,
    /// Where request heads are encoded; kept small between requests.
    wbuf: Vec<u8>,
    /// A connection to a named origin: the address the name gave, and until when
    /// (boxed: a connection to a literal address, the common case, stays small to
    /// move).
    pub named: Option<Box<Named>>,
    /// The timer of the response-head timeout, kept from request to request: moving a
    /// registered timer's deadline later costs one atomic operation, where a fresh
    /// timer registers with the runtime's timer wheel and leaves it again each time.
    /// (When the deadline passes while the connection idles, it wakes the task that
    /// last waited on it once, for nothing.)
    pub timer: KeptTimer,
}

/// A request's head (and what was copied behind it), written whole; `NotSent` when
/// the connection was found closed before any of it went, the write's error when part
/// of it went.
async fn write_request(io: &mut Stream, wbuf: &[u8]) -> Result<Option<io::Error>, SendError> {
    let mut written = 0;
    while written < wbuf.len() {
        match io.write(&wbuf[written..]).await {
            Ok(0) => return Ok(Some(io::ErrorKind::WriteZero.into())),
            Ok(n) => written += n,
            // Nothing of the request was taken: it may go out on another connection.
            Err(e) if written == 0 && is_closed_error(&e) => return Err(SendError::NotSent),
            Err(e) => return Ok(Some(e)),
        }
    }
    Ok(None)
}

/// The same with the frames spilled beside the head, in one vectored write.
async fn write_spilled(
    io: &mut Stream,
    wbuf: &[u8],
    frames: [Option<&Bytes>; 2],
    chunked: bool,
    last: bool,
) -> Result<Option<io::Error>, SendError> {
    let mut sizes = [[0u8; 18]; 2];
    let (mut slices, n) = spilled_slices(wbuf, frames, chunked, last, &mut sizes);
    let mut slices = &mut slices[..n];
    let mut nothing_written = true;
    while !slices.is_empty() {
        match io.write_vectored(slices).await {
            Ok(0) => return Ok(Some(io::ErrorKind::WriteZero.into())),
            Ok(n) => {
                IoSlice::advance_slices(&mut slices, n);
                nothing_written = false;
            }
            Err(e) if nothing_written && is_closed_error(&e) => return Err(SendError::NotSent),
            Err(e) => return Ok(Some(e)),
        }
    }
    Ok(None)
}

/// A timer kept with a connection between requests (`None` until the first).
pub(crate) type KeptTimer = Option<std::pin::Pin<Box<tokio::time::Sleep>>>;

/// The address a name resolved to when a connection was opened, and until when the
/// answer holds: past that, reusing the connection asks the name again first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Named {
    pub ip: std::net::IpAddr,
    /// When the answer expires ([`now_ms`](crate::clock::now_ms)).
    pub until_ms: u64,
}

impl Named {
    /// `ip`, from an answer valid until `valid_until`.
    pub(crate) fn new(ip: std::net::IpAddr, valid_until: std::time::Instant) -> Named {
        let left = valid_until.saturating_duration_since(std::time::Instant::now());
        Named {
            ip,
            until_ms: crate::clock::now_ms()
                + left.as_secs() * 1000
                + u64::from(left.subsec_millis()),
        }
    }

    pub(crate) fn expired(&self) -> bool {
        crate::clock::now_ms() >= self.until_ms
    }
}

impl BackendConn {
    pub(crate) fn new(io: Stream) -> BackendConn {
        BackendConn {
            io,
            buf: BytesMut::new(),
            wbuf: Vec::new(),
            named: None,
            timer: None,
        }
    }

    /// Whether an idle connection can take a request. No syscall unless the socket
    /// reported activity while idle (then a closed or chatty connection is dropped);
    /// over TLS, a session ticket or close_notify is not data.
    pub(crate) fn is_reusable(&mut self) -> bool {
        self.buf.is_empty() && is_quiet(&mut self.io)
    }

    /// As [`BackendConn::is_reusable`], asked of the kernel (a system call): for a
    /// request that cannot be sent twice, which must not meet a connection the
    /// backend closed a moment ago.
    pub(crate) fn is_quiet_now(&self) -> bool {
        self.buf.is_empty() && self.io.is_quiet_now()
    }

    /// The stream and the bytes already read past the last response head (the start
    /// of an upgraded protocol).
    pub(crate) fn into_parts(self) -> (Stream, BytesMut) {
        (self.io, self.buf)
    }

    /// Writes `bytes` before anything else goes out (a PROXY protocol header).
    pub(crate) async fn write_preface(&mut self, bytes: &[u8]) -> io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        self.io.write_all(bytes).await?;
        self.io.flush().await
    }

    /// Turns on TCP keepalive, for a connection that will idle as a tunnel.
    pub(crate) fn keepalive(&self) {
        self.io.keepalive();
    }

    /// Gives back buffer memory while the connection sits idle.
    pub(crate) fn shrink(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
        if self.wbuf.capacity() > 4096 {
            self.wbuf = Vec::new();
        }
    }

    /// Sends the request and reads the response head. The request body streams while
    /// the head is awaited, so a backend may answer before the upload ends.
    pub(crate) async fn send(&mut self, out: &mut Outgoing) -> Result<ResponseHead, SendError> {
        let is_head = out.parts.method == Method::HEAD;
        let lines = out.lines.as_deref();
        let chunked = encode::request_head(&mut self.wbuf, &out.parts, out.framing, lines);
        // The frames left beside the head are the last ones taken: the request's state
        // keeps their count, not the frames (a local's space is kept while in scope).
        let spilled = self.ready_body(out, chunked)?;
        let mut write_failed = if spilled > 0 {
            let frames = &out.resend[out.resend.len() - spilled..];
            let frames = [frames.first(), frames.get(1)];
            let (io, wbuf, last) = (&mut self.io, &self.wbuf, out.body_ended);
            // Boxed: a request without spilled frames does not carry the slices.
            Box::pin(write_spilled(io, wbuf, frames, chunked, last)).await?
        } else {
            write_request(&mut self.io, &self.wbuf).await?
        };
        // Some of the request went out: from here on it is sent again only from the
        // replay buffer, which must hold every frame this write carried.
        for data in std::mem::take(&mut out.resend) {
            out.sent(&data);
        }
        if write_failed.is_none() {
            // Over TLS, records the session still holds go out now (a socket has none).
            write_failed = self.io.flush().await.err();
        }
        let mut early = false;
        if write_failed.is_none() && !out.body_ended {
            // Boxed: kept only by an upload the backend answers before it ends.
            let mut piece = Box::<Piece>::default();
            match upload(&mut self.io, &mut self.buf, out, chunked, &mut piece).await? {
                Upload::Sent => {}
                Upload::Early => {
                    early = true;
                    // The rest goes on while the answer is read (DESIGN §18.5).
                    let rest = Rest::new(out.take_rest(), *piece, chunked);
                    out.upload = Some(Box::new(rest));
                }
                Upload::WriteFailed(e) => write_failed = Some(e),
            }
        }
        if let Some(e) = write_failed {
            // The backend may have answered, and closed, before the upload ended: its
            // answer is what the client gets, not a 502.
            return match self.answer_already_here(is_head, out.as_sent) {
                Some(mut head) => {
                    head.reusable = false;
                    Ok(head)
                }
                None => Err(SendError::Io(e)),
            };
        }
        let mut head = self
            .read_head(is_head, out.as_sent, out.upload.as_deref_mut())
            .await?;
        if early {
            head.reusable = false;
        }
        Ok(head)
    }

    /// Puts behind the request's head what of its body is ready: frames an earlier
    /// attempt took, then whatever else is ready now (its terminator too when it
    /// ended). Large ready frames are left beside the head instead: the answer is how
    /// many, the last ones in `out.resend` (they go in the same vectored write).
    fn ready_body(&mut self, out: &mut Outgoing, chunked: bool) -> Result<usize, SendError> {
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
            return Ok(0);
        }
        if out.framing == BodyOut::Empty {
            out.body_ended = true;
            return Ok(0);
        }
        let mut spill = Spill::default();
        out.body_ended = take_ready(
            &mut out.body,
            chunked,
            &mut self.wbuf,
            true,
            Some(&mut out.resend),
            Some(&mut spill),
            &mut 0,
        )
        .map_err(SendError::Body)?;
        Ok(spill.len())
    }

    /// A response head that arrived already, read without waiting.
    fn answer_already_here(
        &mut self,
        is_head: bool,
        as_sent: Option<AsSent>,
    ) -> Option<ResponseHead> {
        loop {
            make_room(&mut self.buf, READ_CHUNK);
            let r = read_now(&mut self.io, &mut self.buf);
            if !matches!(r, Ok(n) if n > 0) || self.buf.len() > MAX_RESPONSE_HEAD {
                break;
            }
        }
        let mut scan = ResponseScan::default();
        loop {
            let len = scan.find_end(&self.buf)?;
            match parse_response(&mut self.buf, len, is_head, as_sent).ok()? {
                Some(head) => return Some(head),
                None => scan = ResponseScan::default(),
            }
        }
    }

    /// Reads the response head; an upload the backend answered early (`upload`) goes
    /// on meanwhile.
    async fn read_head(
        &mut self,
        is_head: bool,
        as_sent: Option<AsSent>,
        mut upload: Option<&mut Rest>,
    ) -> Result<ResponseHead, SendError> {
        let mut scan = ResponseScan::default();
        // Whether any byte of an answer came (an interim one is taken off `buf`).
        let mut heard = !self.buf.is_empty();
        loop {
            if let Some(len) = scan.find_end(&self.buf) {
                match parse_response(&mut self.buf, len, is_head, as_sent) {
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
            make_room(&mut self.buf, READ_CHUNK);
            let read = match upload.as_deref_mut() {
                None => self.io.read_buf(&mut self.buf).await,
                // Boxed: only an upload answered early pays for it.
                Some(rest) => Box::pin(read_uploading(&mut self.io, &mut self.buf, rest)).await,
            };
            match read {
                Ok(0) if !heard => return Err(SendError::Unanswered(None)),
                Ok(0) => return Err(SendError::ClosedEarly),
                Ok(_) => heard = true,
                Err(e) if !heard && is_closed_error(&e) => {
                    return Err(SendError::Unanswered(Some(e)))
                }
                Err(e) => return Err(SendError::Io(e)),
            }
        }
    }

    /// Moves an upload the backend answered early along; ready when it ended.
    pub(crate) fn poll_upload(&mut self, rest: &mut Rest, cx: &mut Context<'_>) -> Poll<()> {
        rest.poll_send(&mut self.io, cx)
    }

    /// Reads the next piece of a response body into its decoder's output; a chunked
    /// body's trailer fields, before its end, into `trailers`.
    pub(crate) fn poll_body(
        &mut self,
        decoder: &mut Decoder,
        trailers: &mut Option<Box<http::HeaderMap>>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            match decoder.decode(&mut self.buf) {
                Ok(Decoded::Data(b)) => return Poll::Ready(Some(Ok(b))),
                Ok(Decoded::Trailers(t)) => *trailers = Some(t),
                Ok(Decoded::Done) => return Poll::Ready(None),
                Ok(Decoded::NeedMore) => {}
                Err(why) => {
                    return Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::InvalidData, why))))
                }
            }
            make_room(&mut self.buf, body_read(decoder));
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

/// A read of the response while what is left of the upload goes on (until it ends).
async fn read_uploading(io: &mut Stream, buf: &mut BytesMut, rest: &mut Rest) -> io::Result<usize> {
    let mut sending = true;
    std::future::poll_fn(|cx| {
        if sending && rest.poll_send(io, cx).is_ready() {
            sending = false;
        }
        std::pin::pin!(io.read_buf(buf)).poll(cx)
    })
    .await
}

/// The most a body read asks for at once.
const BODY_READ_MAX: usize = 64 * 1024;

/// How much the next read of a body asks for: what is left of a sized body (a 64 KiB
/// response whose head came with its first 16 KiB takes one more read, not four, and
/// leaves in one write), between [`READ_CHUNK`] and [`BODY_READ_MAX`]; a chunked or
/// close-delimited body reads [`READ_CHUNK`] at a time. One byte more than what is
/// left, so the body's last read comes back short and tokio forgets the socket's
/// readiness (it does after a short read, not after a full one): the pool's check that
/// the idle connection is quiet then costs no `EAGAIN` read.
fn body_read(decoder: &Decoder) -> usize {
    match decoder.remaining() {
        Some(n) => usize::try_from(n)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
            .clamp(READ_CHUNK, BODY_READ_MAX),
        None => READ_CHUNK,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::Body;
    use http::{header, Request};
    use tokio::net::UnixStream;
    use tokio::sync::mpsc;

    /// A body fed in `pieces`, with `Content-Length` when `declared`.
    fn request(pieces: &[&'static str], declared: bool) -> Outgoing {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let (tx, rx) = mpsc::channel(pieces.len());
        for p in pieces {
            tx.try_send(Ok(http_body::Frame::data(Bytes::from_static(p.as_bytes()))))
                .unwrap();
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

    /// A backend that closed a kept connection a moment ago: tokio has not heard yet
    /// (its poller has not turned since), the kernel has. A request that cannot be
    /// sent twice asks the kernel (`is_quiet_now`), so it never takes such a
    /// connection.
    #[tokio::test]
    async fn a_close_the_poller_has_not_reported_is_seen_by_the_kernel() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut conn = BackendConn::new(Stream::Unix(ours));
        assert!(conn.is_reusable() && conn.is_quiet_now(), "open and idle");
        drop(theirs);
        // No await since the close: the runtime has not polled for readiness.
        assert!(
            conn.is_reusable(),
            "tokio's word is stale here: the window this guards"
        );
        assert!(!conn.is_quiet_now(), "the kernel knows it closed");
        let (ours, theirs) = UnixStream::pair().unwrap();
        let conn = BackendConn::new(Stream::Unix(ours));
        let mut theirs = theirs;
        theirs
            .write_all(b"HTTP/1.1 408 late\r\n\r\n")
            .await
            .unwrap();
        assert!(
            !conn.is_quiet_now(),
            "bytes nobody asked for: not quiet either"
        );
    }

    /// The first connection was closed by its peer before anything was written: the
    /// request must go out whole on the next one, body frames taken for the first
    /// write included.
    async fn resent_whole(declared: bool) -> String {
        resent_whole_of(&["hello ", "wide ", "world"], declared).await
    }

    async fn resent_whole_of(pieces: &[&'static str], declared: bool) -> String {
        let last = pieces[pieces.len() - 1];
        let mut out = request(pieces, declared);
        let (closed, gone) = UnixStream::pair().unwrap();
        drop(gone);
        let mut stale = BackendConn::new(Stream::Unix(closed));
        let r = stale.send(&mut out).await;
        assert!(
            matches!(r, Err(SendError::NotSent)),
            "a closed socket sends nothing"
        );

        let (fresh, peer) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(serve_one(peer, move |got: &[u8]| {
            let s = String::from_utf8_lossy(got);
            if declared {
                s.ends_with(last)
            } else {
                s.ends_with("0\r\n\r\n")
            }
        }));
        let mut conn = BackendConn::new(Stream::Unix(fresh));
        let head = conn.send(&mut out).await.expect("the resend succeeds");
        assert_eq!(head.parts.status, 200);
        String::from_utf8(reader.await.unwrap()).unwrap()
    }

    #[tokio::test]
    async fn an_empty_frame_never_ends_a_chunked_body_early() {
        let mut out = request(&["abc", "", "rest"], false);
        let (closed, gone) = UnixStream::pair().unwrap();
        drop(gone);
        let r = BackendConn::new(Stream::Unix(closed)).send(&mut out).await;
        assert!(matches!(r, Err(SendError::NotSent)));
        let (fresh, peer) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(serve_one(peer, |got: &[u8]| got.ends_with(b"0\r\n\r\n")));
        BackendConn::new(Stream::Unix(fresh))
            .send(&mut out)
            .await
            .unwrap();
        let got = String::from_utf8(reader.await.unwrap()).unwrap();
        assert!(
            got.ends_with("\r\n\r\n3\r\nabc\r\n4\r\nrest\r\n0\r\n\r\n"),
            "one terminator, at the end: {got:?}"
        );
    }

    /// Large frames ready with the head are written beside it, not copied behind it:
    /// when the connection turns out closed, they go out again too, in order, with
    /// the frames that were not ready yet.
    #[tokio::test]
    async fn a_stale_connection_hands_back_spilled_frames_too() {
        let piece = |c: char, n: usize| &*String::leak(c.to_string().repeat(n));
        let pieces = [
            piece('a', 100),
            piece('b', 3000),
            piece('c', 5000),
            piece('d', 50),
        ];
        let body: String = pieces.concat();
        let sized = resent_whole_of(&pieces, true).await;
        assert!(
            sized.ends_with(&format!("\r\n\r\n{body}")),
            "sized body resent whole"
        );
        let chunked = resent_whole_of(&pieces, false).await;
        let framed: String = pieces
            .iter()
            .map(|p| format!("{:x}\r\n{p}\r\n", p.len()))
            .collect();
        assert!(
            chunked.ends_with(&format!("\r\n\r\n{framed}0\r\n\r\n")),
            "chunked body resent whole, one terminator"
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

    /// A head write that broke after some of it went out: every body frame it carried
    /// is in the replay buffer, so a retry sends the body whole (a large first frame,
    /// a peer that reads a little and closes).
    #[tokio::test]
    async fn a_write_broken_midway_keeps_its_frames_for_the_replay() {
        const BIG: usize = 4 << 20;
        let big: &'static str = Box::leak("x".repeat(BIG).into_boxed_str());
        let mut out = request(&[big, "tail"], true);
        out.keep_for_replay(16 << 20);
        let (first, mut peer) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1000];
            let _ = peer.read(&mut buf).await;
            drop(peer);
        });
        let r = BackendConn::new(Stream::Unix(first)).send(&mut out).await;
        reader.await.unwrap();
        assert!(matches!(r, Err(SendError::Io(_))), "broken midway");
        assert!(
            out.can_rewind() && out.rewind(),
            "the replay buffer holds it all"
        );
        let (fresh, peer) = UnixStream::pair().unwrap();
        let reader = tokio::spawn(serve_one(peer, |got: &[u8]| got.ends_with(b"tail")));
        let head = BackendConn::new(Stream::Unix(fresh))
            .send(&mut out)
            .await
            .expect("the retry goes out");
        assert_eq!(head.parts.status, 200);
        let got = reader.await.unwrap();
        let body_at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(
            got.len() - body_at,
            BIG + 4,
            "the whole body, the big frame included"
        );
    }
}

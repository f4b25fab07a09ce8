//! HTTP/2 on a plain listener (prior knowledge) or after TLS's ALPN, served with the
//! `h2` crate over any [`Transport`]. The bytes read while sniffing the protocol are
//! replayed in front of the stream.
//!
//! The `h2` crate directly rather than hyper's server on top of it: a stream here is
//! ours from its headers to its last frame, so an interim answer (`103 Early Hints`)
//! can go before the final one (hyper's server has no way to send one), and a
//! WebSocket's stream becomes its tunnel without an upgrade handshake in between.
//! What a stream sends is in [`send`].

mod send;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use h2::server::{Connection, SendResponse};
use h2::{Reason, RecvStream};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::beside::{beside, Ended};
use super::conn::{Access, Counted, StreamDone, StreamLog, IDLE_TIMEOUT};
use super::drain::{Drain, RequestGuard, Watch};
use super::stall::{Held, Stalls};
use super::transport::SEND_TIMEOUT;
use crate::access::{AccessLog, Pending};
use crate::body::{Body, BodyError};
use crate::http1::{MAX_HEAD, MAX_HEADERS};
use crate::net::transport::Transport;
use crate::pipeline::{self, ClientInfo};
use crate::reply::local_response;
use crate::runtime::Live;
use crate::stats::{bump, COUNTERS};

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A stream's window and the connection's, as large as hyper's server made them: a
/// client uploads 1 MiB before it waits for sluice to read.
const WINDOW: u32 = 1024 * 1024;
/// Streams one connection may have open at once.
const MAX_STREAMS: u32 = 200;
/// What a connection buffers of its streams' answers before a stream waits for room.
const SEND_BUFFER: usize = 400 * 1024;
/// Streams a client may make sluice reset for its errors before the connection goes.
const MAX_ERROR_RESETS: usize = 1024;

pub(crate) async fn serve<S: Transport>(
    stream: S,
    pre: Bytes,
    client: ClientInfo,
    live: Arc<Live>,
    drain: Drain,
    mut watch: Watch,
    access: Access,
) {
    let addr = client.addr;
    let activity = Arc::new(Activity::new());
    let io = Rewind {
        pre,
        inner: stream,
        activity: activity.clone(),
    };
    let Some(mut conn) = handshake(io, addr, &mut watch).await else {
        return;
    };
    let start = |req, respond| {
        let held = Holds {
            guard: drain.request(),
            stream: activity.open(),
        };
        // Made in its box: made on the stack, it was copied whole into it.
        let fut = crate::inplace::boxed(|| {
            one_stream(req, respond, &live, &client, held, access.load_full())
        });
        // A panic ends its own stream only, as it would in a task of its own.
        std::panic::AssertUnwindSafe(fut)
            .catch_unwind()
            .map(stream_panicked as fn(_))
    };
    let mut running = FuturesUnordered::new();
    // Polled only when one of them woke the task, not on every frame.
    let ends = async {
        tokio::select! {
            _ = watch.closing() => End::Closing,
            _ = activity.stalls.sweep(addr) => End::Stalled,
            _ = activity.idle(IDLE_TIMEOUT) => End::Idle,
        }
    };
    let idle = match beside(drive(&mut conn, &mut running, &start), ends).await {
        Ended::Work(r) => {
            if let Err(e) = r {
                tracing::debug!(client = %addr, "sluice: h2 connection ended: {e}");
            }
            return;
        }
        Ended::Side(End::Closing) => false,
        // A stream the client stopped reading: the connection closes at once.
        Ended::Side(End::Stalled) => return,
        Ended::Side(End::Idle) => {
            tracing::debug!(client = %addr, "sluice: h2 connection idle for {:?}, closing", IDLE_TIMEOUT);
            true
        }
    };
    // GOAWAY: streams already open finish, no new ones start. A stream the client
    // stopped reading is closed, not waited for.
    conn.graceful_shutdown();
    let ends = activity.after_goaway(addr, idle);
    let _ = beside(drive(&mut conn, &mut running, &start), ends).await;
}

/// The client's preface and settings, within the idle timeout; `None` when they do
/// not come, or sluice began to close first.
async fn handshake<S: Transport>(
    io: Rewind<S>,
    addr: std::net::SocketAddr,
    watch: &mut Watch,
) -> Option<Connection<Rewind<S>, Bytes>> {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_header_list_size(MAX_HEAD as u32)
        .max_concurrent_streams(MAX_STREAMS)
        .max_send_buffer_size(SEND_BUFFER)
        .max_local_error_reset_streams(Some(MAX_ERROR_RESETS))
        .max_concurrent_reset_streams(crate::upstream::h2::RESETS_KEPT)
        .reset_stream_duration(crate::upstream::h2::RESETS_KEPT_FOR)
        .enable_connect_protocol();
    tokio::select! {
        c = tokio::time::timeout(IDLE_TIMEOUT, builder.handshake(io)) => match c {
            Ok(Ok(conn)) => Some(conn),
            Ok(Err(e)) => {
                tracing::debug!(client = %addr, "sluice: h2 connection ended before its preface: {e}");
                None
            }
            Err(_) => None,
        },
        _ = watch.closing() => None,
    }
}

/// What ends an HTTP/2 connection besides its client.
enum End {
    /// Shutdown, or an upgrade handed the listeners on: GOAWAY.
    Closing,
    /// A stream the client stopped reading.
    Stalled,
    /// No stream open for the idle timeout.
    Idle,
}

/// A stream's handling panicked.
fn stream_panicked(r: std::thread::Result<()>) {
    if r.is_err() {
        tracing::error!("sluice: an HTTP/2 stream's handling panicked; the stream was reset, its connection goes on");
    }
}

/// Runs the connection and its streams until the connection ends. The streams run in
/// the connection's own task, not a task each: a stream's work (the pipeline, its
/// backend exchange, its answer's frames) happens where the connection's frames are
/// read and written, with no task to allocate and schedule per stream, and what a
/// stream queued is written in the same wake-up (the streams go first, then the
/// connection). A stream still running when its connection ends is dropped with it,
/// as an HTTP/1.1 request is when its client leaves. All of a connection's streams
/// run on one thread, as in nginx and HAProxy.
fn drive<'a, T: AsyncRead + AsyncWrite + Unpin, F: Future<Output = ()> + Unpin>(
    conn: &'a mut Connection<T, Bytes>,
    running: &'a mut FuturesUnordered<F>,
    start: &'a impl Fn(Request<RecvStream>, SendResponse<Bytes>) -> F,
) -> impl Future<Output = Result<(), h2::Error>> + 'a {
    std::future::poll_fn(move |cx| loop {
        while let Poll::Ready(Some(())) = running.poll_next_unpin(cx) {}
        let mut started = false;
        loop {
            match conn.poll_accept(cx) {
                Poll::Ready(Some(Ok((req, respond)))) => {
                    running.push(start(req, respond));
                    started = true;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        // New streams run now, and what they answered at once is written at once.
        if !started {
            return Poll::Pending;
        }
    })
}

/// What a stream holds until its response body is done: its place in the drain count
/// and in the connection's open streams.
struct Holds {
    guard: RequestGuard,
    stream: StreamOpen,
}

impl Holds {
    /// The response, with the stream's holds and log line riding on its body.
    fn on(self, resp: Response<Body>, log: Option<Box<StreamDone>>) -> Response<Guarded> {
        resp.map(|b| Guarded {
            // Watched only for a line or a meter.
            ended: log.is_none() || http_body::Body::is_end_stream(&b),
            body: Held::new(b),
            _guard: self.guard,
            _stream: self.stream,
            log,
        })
    }
}

/// One stream: checked (header count, extended CONNECT protocol, `:authority`), run
/// through the pipeline, and answered, with the interim answers that came first.
async fn one_stream(
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    live: &Live,
    client: &ClientInfo,
    held: Holds,
    log: Option<Arc<AccessLog>>,
) {
    let (mut parts, recv) = req.into_parts();
    parts.version = Version::HTTP_2;
    let mut req = Request::from_parts(parts, ());
    match refusal(&mut req, client.addr) {
        Ok(None) => {}
        Ok(Some(refused)) => {
            return send::respond(&mut respond, held.on(refused, None), false).await
        }
        Err(reason) => return respond.send_reset(reason),
    }
    // One clock read serves the meter and the log.
    let started = live.metered().then(Instant::now);
    let pending = log.map(|log| Pending::of(log, &req, client.for_log(), started));
    // Request body bytes are counted only for a meter.
    let received = started.map(|_| Arc::default());
    let (body, websocket) = request_body(&mut req, recv, received.as_ref());
    let offer = pipeline::Offer {
        record: pending.is_some(),
        upgrade: websocket.is_some(),
        fields: false,
        as_sent: None,
    };
    let client_addr = client.addr;
    let head_only = req.method() == Method::HEAD;
    let fut = pipeline::handle(live, req.map(|()| body), None, client, offer);
    // `None`: the client reset the stream first; the request is dropped (a 499).
    let Some(answer) = send::answer(fut, &mut respond).await else {
        return;
    };
    let pipeline::Answer {
        mut resp,
        served,
        tunnel,
        meter,
        fields: _,
    } = answer;
    if resp
        .extensions()
        .get::<pipeline::Http11Required>()
        .is_some()
    {
        // The site is not served over HTTP/2: the client retries over HTTP/1.1, and
        // that request gets the line.
        if let Some(p) = pending {
            p.forget();
        }
        return respond.send_reset(Reason::HTTP_1_1_REQUIRED);
    }
    let tunnel = websocket_answer(websocket, tunnel, &mut resp, client_addr);
    crate::stats::count_status(resp.status().as_u16());
    let metered = meter.zip(started);
    let log = pending.map(|pending| StreamLog {
        pending,
        served,
        marks: crate::access::Marks::of(&resp),
    });
    // A tunnel opened: counted as the `101` an HTTP/1.1 client gets (the stream says 200).
    let done = StreamDone::new(log, metered, received, &resp, tunnel.is_some()).map(Box::new);
    let resp = held.on(resp, done);
    match tunnel {
        Some((tunnel, recv)) => send::tunnel(&mut respond, resp, recv, tunnel, client_addr).await,
        None => send::respond(&mut respond, resp, head_only).await,
    }
}

/// The request's body for the pipeline (counted into `received` for a meter). A
/// WebSocket over an h2 stream (RFC 8441) reaches the backend as an HTTP/1.1 upgrade,
/// and its stream, returned, becomes the tunnel's client side. A CONNECT has no body.
fn request_body(
    req: &mut Request<()>,
    recv: RecvStream,
    received: Option<&Arc<AtomicU64>>,
) -> (Body, Option<RecvStream>) {
    // A CONNECT here is a WebSocket's (`refusal` answered any other).
    let (body, websocket) = if req.method() != Method::CONNECT {
        (Body::H2(recv, content_length(req), None), None)
    } else if extended_connect(req) {
        (Body::Empty, Some(recv))
    } else {
        (Body::Empty, None)
    };
    let body = match received {
        None => body,
        Some(n) => Body::stream(Counted {
            body,
            n: Arc::clone(n),
        }),
    };
    (body, websocket)
}

/// The length a request's `Content-Length` gives ([`crate::body::UNKNOWN`] without
/// one); the `h2` crate refuses a stream whose field is not a number or whose DATA
/// disagrees with it.
fn content_length<B>(req: &Request<B>) -> u64 {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(crate::body::UNKNOWN)
}

/// An extended CONNECT's answer: the tunnel to join to the stream, or a 502 for a
/// backend that answered 2xx without switching protocols.
fn websocket_answer(
    websocket: Option<RecvStream>,
    tunnel: Option<Box<crate::tunnel::Tunnel>>,
    resp: &mut Response<Body>,
    client_addr: std::net::SocketAddr,
) -> Option<(Box<crate::tunnel::Tunnel>, RecvStream)> {
    match (websocket, tunnel) {
        (Some(recv), Some(tunnel)) => {
            accepted(resp);
            Some((tunnel, recv))
        }
        // A 2xx to an extended CONNECT means "open": one from a backend that did not
        // switch protocols must not reach the client as such.
        (Some(_), None) if resp.status().is_success() => {
            crate::throttle::H2_WEBSOCKET_REFUSED.warn(format_args!(
                "sluice: the backend answered client {client_addr}'s WebSocket handshake with {} without switching protocols; sent 502",
                resp.status().as_u16()
            ));
            bump(&COUNTERS.bad_gateway);
            *resp = local_response(
                StatusCode::BAD_GATEWAY,
                "The backend did not accept the WebSocket\n",
            );
            None
        }
        _ => None,
    }
}

/// A stream refused before the pipeline: too many header fields (431), a CONNECT that
/// opens no WebSocket or an `:authority` that cannot be a host (400, as HTTP/1.1
/// answers them) — or reset, for an extended CONNECT to a protocol other than
/// WebSocket.
fn refusal(
    req: &mut Request<()>,
    client: std::net::SocketAddr,
) -> Result<Option<Response<Body>>, Reason> {
    if req.headers().len() > MAX_HEADERS {
        bump(&COUNTERS.head_too_large);
        crate::stats::count_status(431);
        return Ok(Some(local_response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "Request header fields too large\n",
        )));
    }
    if let Some(p) = req.extensions().get::<h2::ext::Protocol>() {
        if !p.as_str().eq_ignore_ascii_case("websocket") {
            // No backend speaks it through us: the stream is reset, never passed.
            bump(&COUNTERS.bad_request);
            crate::throttle::H2_CONNECT_PROTOCOL.warn(format_args!(
                "sluice: client {client} asked for an HTTP/2 extended CONNECT to `{}`; only websocket is offered, stream reset",
                p.as_str().escape_debug()
            ));
            return Err(Reason::PROTOCOL_ERROR);
        }
    } else if req.method() == Method::CONNECT {
        bump(&COUNTERS.bad_request);
        crate::stats::count_status(400);
        return Ok(Some(local_response(
            StatusCode::BAD_REQUEST,
            "Bad request: CONNECT is not served
",
        )));
    }
    if let Some(why) = super::conn::host_from_authority(req) {
        bump(&COUNTERS.bad_request);
        crate::stats::count_status(400);
        return Ok(Some(local_response(StatusCode::BAD_REQUEST, why)));
    }
    Ok(None)
}

/// What an h2 connection is doing, for its idle timeout: streams open (a tunnel counts
/// as one) and when the last one ended. Touched twice a stream, never on a timer.
struct Activity {
    /// Response bodies past one window, watched for a client that stopped reading.
    stalls: Stalls,
    open: AtomicUsize,
    started: Instant,
    /// Milliseconds from `started` to the last stream's end (or the connection's start),
    /// or to the last byte written once writes count ([`Activity::count_writes`]).
    last_end: AtomicU64,
    /// Writes count as activity: after the idle timeout's GOAWAY.
    writes_count: AtomicBool,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            stalls: Stalls::default(),
            open: AtomicUsize::new(0),
            started: Instant::now(),
            last_end: AtomicU64::new(0),
            writes_count: AtomicBool::new(false),
        }
    }

    /// Now (this poll's clock reading), as the time of the last activity: a stream's
    /// end, a busy period's, or a byte written once writes count.
    fn stamp(&self) {
        let since = crate::clock::coarse().saturating_duration_since(self.started);
        let ms = since.as_secs() * 1000 + u64::from(since.subsec_millis());
        self.last_end.store(ms, Ordering::Relaxed);
    }

    /// From now on a byte written to the client is activity, and now is the last.
    fn count_writes(&self) {
        self.writes_count.store(true, Ordering::Relaxed);
        self.stamp();
    }

    /// After GOAWAY, what ends the connection before its streams do: a stalled stream;
    /// and after the idle timeout's, the send timeout. No stream of sluice's is open
    /// then: what is left are last frames the client's window has not let in yet, and
    /// the timeout counts from the last byte written (a slow reader is not cut) or
    /// stream open (one the client began before it saw the GOAWAY).
    async fn after_goaway(&self, addr: std::net::SocketAddr, idle: bool) {
        if !idle {
            return self.stalls.sweep(addr).await;
        }
        self.count_writes();
        tokio::select! {
            _ = self.stalls.sweep(addr) => {}
            _ = self.idle(SEND_TIMEOUT) => {}
        }
    }

    /// `n` bytes went to the client.
    #[inline]
    fn wrote(&self, n: usize) {
        if n > 0 && self.writes_count.load(Ordering::Relaxed) {
            self.stamp();
        }
    }

    fn open(self: &Arc<Self>) -> StreamOpen {
        self.open.fetch_add(1, Ordering::Relaxed);
        StreamOpen(self.clone())
    }

    /// Resolves once no stream has been open for `limit`.
    async fn idle(&self, limit: Duration) {
        loop {
            let since = Duration::from_millis(self.last_end.load(Ordering::Relaxed));
            tokio::time::sleep_until((self.started + since + limit).into()).await;
            let still = self.last_end.load(Ordering::Relaxed) == since.as_millis() as u64;
            if still && self.open.load(Ordering::Relaxed) == 0 {
                return;
            }
            if still {
                // Busy the whole time: look again a full period from now.
                self.stamp();
            }
        }
    }
}

/// One open stream of an h2 connection; its end is stamped when dropped.
struct StreamOpen(Arc<Activity>);

impl StreamOpen {
    fn clone_open(&self) -> StreamOpen {
        self.0.open()
    }
}

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.stamp();
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An extended CONNECT for `websocket` (RFC 8441) becomes the HTTP/1.1 handshake a
/// backend expects: `GET` with `Upgrade: websocket` and a fresh `Sec-WebSocket-Key`
/// (h2 has no key; the backend's accept value is checked by nobody and dropped).
/// False for a CONNECT that is not one.
fn extended_connect(req: &mut Request<()>) -> bool {
    let Some(protocol) = req.extensions().get::<h2::ext::Protocol>() else {
        return false;
    };
    if !protocol.as_str().eq_ignore_ascii_case("websocket") {
        return false;
    }
    *req.method_mut() = Method::GET;
    let h = req.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::SEC_WEBSOCKET_KEY, websocket_key());
    h.entry(header::SEC_WEBSOCKET_VERSION)
        .or_insert(HeaderValue::from_static("13"));
    true
}

/// The backend's `101` as the h2 client's `200`: the negotiated subprotocol and
/// extensions stay; the connection-level fields h2 forbids go.
fn accepted(resp: &mut http::Response<Body>) {
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.remove(header::CONNECTION);
    h.remove(header::UPGRADE);
    h.remove(header::SEC_WEBSOCKET_ACCEPT);
}

/// Sixteen unpredictable bytes in base64, as RFC 6455 asks of a client's key: two
/// 64-bit hashes under std's randomly keyed SipHash, of a counter.
fn websocket_key() -> HeaderValue {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let state = std::hash::RandomState::new();
    let mut raw = [0u8; 16];
    for (i, half) in raw.chunks_mut(8).enumerate() {
        let mut h = state.build_hasher();
        h.write_u64(N.fetch_add(1, Ordering::Relaxed));
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = [b'='; 24];
    for (chunk, o) in raw.chunks(3).zip(out.chunks_mut(4)) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (j, &b)| n | (b as u32) << (16 - 8 * j));
        for (k, c) in o.iter_mut().enumerate().take(chunk.len() + 1) {
            *c = B64[(n >> (18 - 6 * k)) as usize & 63];
        }
    }
    HeaderValue::from_bytes(&out).expect("base64 is a valid header value")
}

/// A response body that keeps its request counted (for the drain) until it is done,
/// and writes its access log line when it is.
struct Guarded {
    body: Held,
    /// The body was read to its end (or had none).
    ended: bool,
    _guard: RequestGuard,
    _stream: StreamOpen,
    log: Option<Box<StreamDone>>,
}

impl Drop for Guarded {
    /// Dropped before its end: the client reset the stream (or went away) mid-answer.
    fn drop(&mut self) {
        if let (false, Some(l)) = (self.ended, self.log.as_mut()) {
            l.cut = !l.switched;
        }
    }
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let r = this.body.poll_frame(cx, &this._stream.0.stalls);
        let Some(l) = this.log.as_mut() else {
            return r;
        };
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                l.bytes += f.data_ref().map_or(0, |d| d.len() as u64);
                // Trailers end a stream: the sender polls no more after them.
                this.ended = f.is_trailers() || this.body.is_end_stream();
            }
            // A body that broke off is the backend's doing, not the client's.
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.ended = true,
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A stream with some already-read bytes put back in front; what it writes is told to
/// the connection's [`Activity`].
struct Rewind<S> {
    pre: Bytes,
    inner: S,
    activity: Arc<Activity>,
}

impl<S: Transport> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: Transport> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.activity.wrote(n);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.activity.wrote(n);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::websocket_key;

    /// A byte written is activity only after the idle timeout's GOAWAY: before, a
    /// connection whose client pings it is still idle with no stream open.
    #[tokio::test]
    async fn writes_count_only_after_the_idle_goaway() {
        use std::sync::atomic::Ordering;
        let a = super::Activity::new();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        a.wrote(10);
        assert_eq!(
            a.last_end.load(Ordering::Relaxed),
            0,
            "a write before GOAWAY"
        );
        a.count_writes();
        let at_goaway = a.last_end.load(Ordering::Relaxed);
        assert!(at_goaway >= 20, "GOAWAY is the last activity: {at_goaway}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        a.wrote(0);
        assert_eq!(
            a.last_end.load(Ordering::Relaxed),
            at_goaway,
            "nothing written"
        );
        a.wrote(1);
        assert!(
            a.last_end.load(Ordering::Relaxed) >= at_goaway + 20,
            "a byte written"
        );
    }

    #[test]
    fn websocket_keys_are_sixteen_bytes_in_base64_and_differ() {
        let a = websocket_key();
        let b = websocket_key();
        assert_eq!(a.len(), 24);
        assert!(a.as_bytes().ends_with(b"=="), "{a:?}");
        assert!(a.as_bytes()[..22]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/'));
        assert_ne!(a, b);
    }
}

//! HTTP/3 on a `listen ADDR tls quic` listener: QUIC from `quinn`, HTTP/3 framing and
//! QPACK from `h3`, and each request stream run through the same pipeline as HTTP/1.1
//! and HTTP/2 — sites, routes, filters and every handler.
//!
//! One endpoint per listener, made once: its TLS config asks the live generation for a
//! certificate at each handshake ([`LiveCerts`]), so a reload or a renewed certificate
//! needs nothing of it. Limits match HTTP/2's (200 streams, 64 KiB of header fields, 100
//! fields), a connection idle for 60 s is closed, 0-RTT is off (rustls' default of no
//! early data), and every new address proves it owns its address with a Retry before
//! sluice keeps any handshake state for it. Shutdown, and a reload that removes the
//! listener, send GOAWAY: streams already open finish, no new ones start.

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};
use tokio::sync::{watch, Notify};

use super::conn::{
    ready_for_streams, Access, Counted, StreamDone, StreamLog, CONNECTION_FIELDS, HEAD_TIMEOUT,
    IDLE_TIMEOUT,
};
use super::drain::{ConnectionGuard, Drain};
use super::transport::SEND_TIMEOUT;
use crate::access::{AccessLog, Pending};
use crate::body::{Body, BodyError, BODY_READ_TIMEOUT};
use crate::http1::{MAX_HEAD, MAX_HEADERS};
use crate::pipeline::{self, ClientInfo, Scheme};
use crate::reply::local_response;
use crate::runtime::Live;
use crate::stats::{bump, COUNTERS};

/// A connection with no packet for this long is closed (QUIC's idle timeout, which
/// either side's keep-alive PINGs reset).
const QUIC_IDLE: Duration = Duration::from_secs(60);
/// Request streams open at once on one connection, as on the HTTP/2 front.
const MAX_STREAMS: u32 = 200;
/// A client's own unidirectional streams: control, the two QPACK ones, and room for
/// grease.
const MAX_UNI_STREAMS: u32 = 8;
/// Flow control: what one stream, and one connection, may have in flight unread.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 4 << 20;
/// New connections waiting for their first handshake step, and the datagrams they may
/// buffer meanwhile: past these, new attempts are refused, never queued.
const MAX_INCOMING: usize = 1024;
const INCOMING_BUFFER: u64 = 64 << 10;
const INCOMING_BUFFER_TOTAL: u64 = 16 << 20;
/// Established connections at once per listener: past this, new ones are refused
/// (a QUIC connection holds no descriptor for the process limit to cap).
const MAX_CONNECTIONS: usize = 16_384;

/// The certificate for a QUIC handshake, chosen by SNI among the live generation's:
/// the endpoint's config outlives reloads.
struct LiveCerts(Arc<Live>);

impl std::fmt::Debug for LiveCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveCerts")
    }
}

impl rustls::server::ResolvesServerCert for LiveCerts {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let gen = self.0.load();
        rustls::server::ResolvesServerCert::resolve(&*gen.tls.as_ref()?.certs, hello)
    }
}

/// A QUIC endpoint on a bound UDP socket (and a duplicate of the socket, for an
/// upgrade to hand over); it takes no connection until [`accept_loop`] gives it its
/// server config. An error here (a socket option QUIC needs) stops a start or a
/// reload, naming the listener.
pub(crate) fn endpoint_on(
    socket: std::net::UdpSocket,
) -> std::io::Result<(quinn::Endpoint, Option<std::os::fd::OwnedFd>)> {
    socket.set_nonblocking(true)?;
    let dup = socket.try_clone().ok().map(std::os::fd::OwnedFd::from);
    let runtime = Arc::new(quinn::TokioRuntime);
    let e = quinn::Endpoint::new(Default::default(), None, socket, runtime)?;
    Ok((e, dup))
}

/// What the endpoint answers handshakes with: TLS 1.3 only (QUIC has no other), ALPN
/// `h3`, no early data, the live generation's certificates, and the limits above.
fn server_config(live: Arc<Live>) -> quinn::ServerConfig {
    let provider = crate::net::tls::provider();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring offers TLS 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(LiveCerts(live)));
    tls.alpn_protocols = vec![b"h3".to_vec()];
    // No early data: a replayed 0-RTT request could repeat a POST.
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls))
        .expect("ring offers QUIC's initial suite, TLS13_AES_128_GCM_SHA256");
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(MAX_STREAMS.into())
        .max_concurrent_uni_streams(MAX_UNI_STREAMS.into())
        .max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(QUIC_IDLE).expect("60 s is a valid idle timeout"),
        ))
        .stream_receive_window(STREAM_WINDOW.into())
        .receive_window(CONNECTION_WINDOW.into())
        .send_window(u64::from(CONNECTION_WINDOW))
        // No QUIC DATAGRAM frames: nothing reads them, so none may be buffered.
        .datagram_receive_buffer_size(None);
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server
        .transport_config(Arc::new(transport))
        .max_incoming(MAX_INCOMING)
        .incoming_buffer_size(INCOMING_BUFFER)
        .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL);
    server
}

/// Accepts QUIC connections until shutdown starts or `close` is notified (a reload
/// removed the listener). Then new ones are refused and every open connection is told
/// to finish (GOAWAY); the UDP socket closes once the last one has.
pub(crate) async fn accept_loop(
    endpoint: quinn::Endpoint,
    live: Arc<Live>,
    drain: Drain,
    close: Arc<Notify>,
    access: Access,
) {
    endpoint.set_server_config(Some(server_config(live.clone())));
    let mut watch = drain.watch();
    let (closing, closed) = watch::channel(false);
    let local = endpoint.local_addr().ok();
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i {
                Some(i) => i,
                None => break,
            },
            _ = watch.closing() => break,
            _ = close.notified() => break,
        };
        if endpoint.open_connections() >= MAX_CONNECTIONS {
            crate::throttle::QUIC_FULL.warn(format_args!(
                "sluice: quic {}: {MAX_CONNECTIONS} connections open; refused a new one from {}",
                local.map(|a| a.to_string()).unwrap_or_default(),
                incoming.remote_address()
            ));
            incoming.refuse();
            continue;
        }
        if !incoming.remote_address_validated() {
            // A Retry: the client echoes a token only its real address received, so a
            // flood from spoofed addresses costs one small packet each and no state.
            let _ = incoming.retry();
            continue;
        }
        let counted = drain.connection();
        tokio::spawn(connection(
            incoming,
            local,
            live.clone(),
            counted,
            closed.clone(),
            access.clone(),
        ));
    }
    endpoint.set_server_config(None);
    if watch.stepped_aside() {
        // An upgrade: the new process reads this UDP socket too, and datagrams of this
        // process's connections reaching it would be lost either way. Closed at once,
        // so every datagram is the new process's; clients reconnect there.
        endpoint.close(quinn::VarInt::from_u32(0x100), b"upgrade");
        return;
    }
    let _ = closing.send(true);
    // The drain waits until every connection has closed and its CONNECTION_CLOSE has
    // gone out: a client is told, not left to time out.
    let last = drain.connection();
    tokio::spawn(async move {
        endpoint.wait_idle().await;
        drop(last);
    });
}

/// One QUIC connection: its handshake, then its request streams until the client
/// closes it, it idles out, or sluice asks it to finish.
async fn connection(
    incoming: quinn::Incoming,
    local: Option<SocketAddr>,
    live: Arc<Live>,
    counted: ConnectionGuard,
    mut closing: watch::Receiver<bool>,
    access: Access,
) {
    let peer = incoming.remote_address();
    // The address the client reached (the listener's may be a wildcard).
    let local = local.map(|l| SocketAddr::new(incoming.local_ip().unwrap_or(l.ip()), l.port()));
    let handshake = async {
        let conn = incoming.accept().map_err(|e| e.to_string())?;
        let conn = match tokio::time::timeout(super::tls::HANDSHAKE_TIMEOUT, conn).await {
            Ok(r) => r.map_err(|e| e.to_string())?,
            Err(_) => return Err("no handshake within 10s".to_string()),
        };
        let mut builder = h3::server::builder();
        builder.max_field_section_size(MAX_HEAD as u64);
        let built = builder.build::<_, Bytes>(h3_quinn::Connection::new(conn.clone()));
        match tokio::time::timeout(super::tls::HANDSHAKE_TIMEOUT, built).await {
            Ok(Ok(h3)) => Ok((conn, h3)),
            Ok(Err(e)) => Err(format!("HTTP/3 did not start: {e}")),
            Err(_) => Err("HTTP/3 did not start within 10s".to_string()),
        }
    };
    let (quic, mut h3) = match handshake.await {
        Ok(c) => c,
        Err(why) => {
            bump(&COUNTERS.tls_handshake_failures);
            tracing::debug!("sluice: QUIC handshake with {peer} failed: {why}");
            return;
        }
    };
    bump(&COUNTERS.quic_connections);
    let mut client = ClientInfo::new(peer, Scheme::Https);
    client.tls = Some("TLSv1.3");
    client.local = local;
    // Streams are tasks of their own: they share the connection's facts, not copy them.
    let client = Arc::new(client);
    let drain = counted.drain();
    serve_streams(
        &mut h3,
        &quic,
        peer,
        &mut closing,
        |resolver, hold, reject| {
            tokio::spawn(one_stream(
                resolver,
                live.clone(),
                client.clone(),
                (drain.clone(), hold, reject),
                access.load_full(),
            ));
        },
    )
    .await;
    // After GOAWAY and the last stream: closed with H3_NO_ERROR once the client has had
    // time to acknowledge the last bytes (a close discards what is unacknowledged), or
    // at once when it closes first. `h3` closes the connection when dropped, so it
    // lives until then.
    let linger = (quic.rtt() * 4).max(LINGER);
    let _ = tokio::time::timeout(linger, quic.closed()).await;
    drop(h3);
    quic.close(quinn::VarInt::from_u32(0x100), b"");
}

/// How long a finished connection waits for its last bytes to be acknowledged (at
/// least; four round trips when longer) before it closes.
const LINGER: Duration = Duration::from_millis(250);

/// After GOAWAY, how long a connection stays open for requests the client sent before
/// it heard it (at least; two round trips when longer).
const SETTLE: Duration = Duration::from_millis(100);

/// Takes a connection's request streams (`spawn` runs each) until the client closes
/// it, or sluice asks it to finish, or no stream has been open for 60 s: then GOAWAY,
/// with room for the requests already on their way (as h2's graceful shutdown leaves),
/// and once those have had time to arrive and every stream is done, the caller closes
/// it. `spawn`'s third argument: the stream is to be refused (`H3_REQUEST_REJECTED`),
/// for a GOAWAY sent before any stream, which names stream 0 as unprocessed.
async fn serve_streams(
    h3: &mut h3::server::Connection<h3_quinn::Connection, Bytes>,
    quic: &quinn::Connection,
    peer: SocketAddr,
    closing: &mut watch::Receiver<bool>,
    mut spawn: impl FnMut(Resolver, StreamHold, bool),
) {
    enum Event {
        Stream(Result<Option<Box<Resolver>>, h3::error::ConnectionError>),
        Finish,
        Settled,
        Done,
    }
    let open = Arc::new(OpenStreams::default());
    // Once sluice asked the connection to finish: until when it waits for stragglers.
    let mut settle: Option<tokio::time::Instant> = None;
    let (mut settled, mut accepted, mut reject) = (false, false, false);
    loop {
        let event = tokio::select! {
            biased;
            r = h3.accept() => Event::Stream(r.map(|o| o.map(Box::new))),
            _ = closing.changed(), if settle.is_none() => Event::Finish,
            _ = open.idle(IDLE_TIMEOUT), if settle.is_none() => Event::Finish,
            _ = async { tokio::time::sleep_until(settle.unwrap_or_else(tokio::time::Instant::now)).await },
                if settle.is_some() && !settled => Event::Settled,
            _ = open.none(), if settled => Event::Done,
        };
        match event {
            Event::Stream(Ok(Some(resolver))) => {
                accepted = true;
                spawn(*resolver, open.hold(), reject);
            }
            Event::Stream(Ok(None)) | Event::Done => return,
            Event::Stream(Err(e)) => {
                if !e.is_h3_no_error() {
                    tracing::debug!("sluice: h3 connection from {peer} ended: {e}");
                }
                return;
            }
            Event::Finish => {
                // h3 names the next stream after the last it took as the first
                // unprocessed one, but names stream 0 when it took none and then
                // serves it all the same: refused here, so a client that retries it
                // elsewhere never runs it twice.
                reject = !accepted;
                let goaway = h3.shutdown(MAX_STREAMS as usize);
                let _ = tokio::time::timeout(super::tls::HANDSHAKE_TIMEOUT, goaway).await;
                settle = Some(tokio::time::Instant::now() + (quic.rtt() * 2).max(SETTLE));
            }
            Event::Settled => settled = true,
        }
    }
}

/// The request streams a connection has open: counted, and told when one opens or
/// ends.
#[derive(Default)]
struct OpenStreams {
    n: std::sync::atomic::AtomicUsize,
    changed: Notify,
}

impl OpenStreams {
    fn hold(self: &Arc<Self>) -> StreamHold {
        self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.changed.notify_waiters();
        StreamHold(self.clone())
    }

    fn count(&self) -> usize {
        self.n.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Resolves once no stream is open.
    async fn none(&self) {
        loop {
            let changed = self.changed.notified();
            let mut changed = pin!(changed);
            changed.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            changed.await;
        }
    }

    /// Resolves once no stream has been open for `limit` (h2's idle rule).
    async fn idle(&self, limit: Duration) {
        loop {
            self.none().await;
            let changed = self.changed.notified();
            let mut changed = pin!(changed);
            changed.as_mut().enable();
            if self.count() != 0 {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(limit) => return,
                _ = changed => {}
            }
        }
    }
}

/// One open request stream, counted until dropped.
struct StreamHold(Arc<OpenStreams>);

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.0.n.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.0.changed.notify_waiters();
    }
}

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;
type SendHalf = h3::server::RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type RecvHalf = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// One request stream: its head read (within 10 s) and checked, then served. The
/// request counts in the drain once its head is in.
async fn one_stream(
    resolver: Resolver,
    live: Arc<Live>,
    client: Arc<ClientInfo>,
    (drain, hold, reject): (Drain, StreamHold, bool),
    log: Option<Arc<AccessLog>>,
) {
    let peer = client.addr;
    let (req, stream) = match tokio::time::timeout(HEAD_TIMEOUT, resolver.resolve_request()).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            // h3 has answered (431) or reset the stream itself.
            bump(&COUNTERS.bad_request);
            tracing::debug!("sluice: h3 request from {peer} refused: {e}");
            return;
        }
        Err(_) => {
            bump(&COUNTERS.head_timeout);
            tracing::debug!("sluice: h3 request from {peer}: no head within 10s");
            return;
        }
    };
    let guard = drain.request();
    let (mut send, mut recv) = stream.split();
    if reject {
        send.stop_stream(h3::error::Code::H3_REQUEST_REJECTED);
        recv.stop_sending(h3::error::Code::H3_REQUEST_REJECTED);
        return;
    }
    let (parts, ()) = req.into_parts();
    let mut req = Request::from_parts(parts, ());
    *req.version_mut() = Version::HTTP_3;
    let body = match refusal(&mut req) {
        None => request_body(&req, recv).await,
        Some(r) => Err(r),
    };
    match body {
        Ok(body) => serve_stream(req, body, &mut send, live, client, log).await,
        Err(refused) => {
            crate::stats::count_status(refused.status().as_u16());
            let _ = respond(&mut send, refused, false, None).await;
        }
    }
    drop((guard, hold));
}

/// The pipeline's answer, with the interim answers (`103 Early Hints`) that came before
/// it sent as they come; `None` when the client stopped reading them.
async fn with_interim(
    mut fut: pipeline::ResponseFuture<'_>,
    send: &mut SendHalf,
) -> Option<pipeline::Answer> {
    loop {
        let (answer, heads) = tokio::select! {
            biased;
            a = &mut fut => (Some(a), crate::interim::take().unwrap_or_default()),
            heads = crate::interim::held() => (None, heads),
        };
        for (status, headers) in heads {
            crate::stats::count_status(status.as_u16());
            let mut head = Response::new(());
            *head.status_mut() = status;
            *head.headers_mut() = headers;
            let sent = tokio::time::timeout(SEND_TIMEOUT, send.send_response(head)).await;
            if !matches!(sent, Ok(Ok(()))) {
                return None;
            }
        }
        if answer.is_some() {
            return answer;
        }
    }
}

/// A checked request through the pipeline, and its answer sent, logged and metered.
async fn serve_stream(
    req: Request<()>,
    body: Body,
    send: &mut SendHalf,
    live: Arc<Live>,
    client: Arc<ClientInfo>,
    log: Option<Arc<AccessLog>>,
) {
    let started = live.metered().then(Instant::now);
    let pending = log.map(|log| Pending::of(log, &req, client.for_log(), started));
    let received = started.map(|_| Arc::<AtomicU64>::default());
    let body = match &received {
        None => body,
        Some(n) => Body::stream(Counted {
            body,
            n: Arc::clone(n),
        }),
    };
    let peer = client.addr;
    let head_only = req.method() == http::Method::HEAD;
    let offer = pipeline::Offer {
        record: pending.is_some(),
        upgrade: false,
        fields: false,
        as_sent: None,
    };
    let (parts, ()) = req.into_parts();
    let fut = pipeline::handle(
        &live,
        Request::from_parts(parts, body),
        None,
        &client,
        offer,
    );
    let Some(answer) = with_interim(fut, send).await else {
        return;
    };
    let resp = answer.resp;
    crate::stats::count_status(resp.status().as_u16());
    bump(&COUNTERS.h3_requests);
    let metered = answer.meter.zip(started);
    let log = pending.map(|pending| StreamLog {
        pending,
        served: answer.served,
        marks: crate::access::Marks::of(&resp),
    });
    let mut done = StreamDone::new(log, metered, received, &resp, false);
    if let Err(why) = respond(send, resp, head_only, done.as_mut()).await {
        tracing::debug!("sluice: h3 response to {peer} cut off: {why}");
    }
}

/// A stream refused before the pipeline: too many header fields (431); a
/// connection-specific field, a `TE` other than `trailers`, a `Content-Length` that is
/// not one number, or an `:authority` that cannot be a host (400). A `Content-Length`
/// sent more than once with one value is kept once.
fn refusal(req: &mut Request<()>) -> Option<Response<Body>> {
    if req.headers().len() > MAX_HEADERS {
        bump(&COUNTERS.head_too_large);
        return Some(local_response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "Request header fields too large\n",
        ));
    }
    let h = req.headers();
    let te = h.get_all(header::TE).iter().any(|v| v != "trailers");
    let bad = if te || CONNECTION_FIELDS.iter().any(|n| h.contains_key(n)) {
        Some("Bad request: connection-specific field in an HTTP/3 request\n")
    } else {
        content_length(req).err()
    };
    let why = bad.or_else(|| super::conn::host_from_authority(req))?;
    bump(&COUNTERS.bad_request);
    Some(local_response(StatusCode::BAD_REQUEST, why))
}

/// The request's `Content-Length`, checked (digits only, every copy equal) and left
/// as one field.
fn content_length(req: &mut Request<()>) -> Result<Option<u64>, &'static str> {
    const BAD: &str = "Bad request: invalid Content-Length\n";
    let mut values = req.headers().get_all(header::CONTENT_LENGTH).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let digits = |v: &HeaderValue| !v.is_empty() && v.as_bytes().iter().all(u8::is_ascii_digit);
    if !digits(first) {
        return Err(BAD);
    }
    let n = first
        .to_str()
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or(BAD)?;
    let mut repeated = false;
    for v in values {
        if v != first {
            return Err(BAD);
        }
        repeated = true;
    }
    if repeated {
        let one = first.clone();
        req.headers_mut().insert(header::CONTENT_LENGTH, one);
    }
    Ok(Some(n))
}

/// The request's body: empty when the stream ended with its head (as it does for
/// almost every GET), else read as it arrives. A GET or HEAD without a length waits
/// for its first bytes or its end, so the backend never sees a bodiless GET framed
/// as chunked. `Err`: a `Content-Length` the stream's end already contradicts (400).
async fn request_body(req: &Request<()>, mut recv: RecvHalf) -> Result<Body, Response<Body>> {
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let bodiless = matches!(*req.method(), http::Method::GET | http::Method::HEAD);
    let first = if length.is_none() && bodiless {
        let read = poll_fn(|cx| poll_data(&mut recv, cx));
        match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
            Ok(r) => Some(r),
            Err(_) => Some(Err(BodyError::ClientGone("no request body bytes for 60s"))),
        }
    } else {
        // Whatever has arrived with the head: for most GETs, the stream's end.
        match poll_fn(|cx| Poll::Ready(poll_data(&mut recv, cx))).await {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    };
    let mut body = RequestBody {
        recv,
        left: length,
        first: None,
        done: false,
        stall: None,
    };
    match first {
        Some(Ok(None)) if length.is_some_and(|n| n > 0) => {
            bump(&COUNTERS.bad_request);
            return Err(local_response(
                StatusCode::BAD_REQUEST,
                "Bad request: the body ended before its Content-Length\n",
            ));
        }
        Some(Ok(None)) => return Ok(Body::Empty),
        Some(Ok(Some(b))) => body.first = Some(Ok(b)),
        Some(Err(e)) => body.first = Some(Err(e)),
        None => {}
    }
    Ok(Body::stream(body))
}

/// The next piece of a request body; `None` at its end.
fn poll_data(recv: &mut RecvHalf, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, BodyError>> {
    match recv.poll_recv_data(cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(Ok(Some(mut b))) => Poll::Ready(Ok(Some(b.copy_to_bytes(b.remaining())))),
        Poll::Ready(Ok(None)) => Poll::Ready(Ok(None)),
        Poll::Ready(Err(e)) => {
            tracing::debug!("sluice: h3 request body failed: {e}");
            Poll::Ready(Err(BodyError::ClientGone("the h3 stream was reset")))
        }
    }
}

/// An h3 request body, read as the pipeline asks for it; a read that waits 60 s for a
/// byte fails, as on h1 and h2. A body longer or shorter than its `Content-Length` is
/// malformed (RFC 9114 §4.1.2).
struct RequestBody {
    recv: RecvHalf,
    /// `Content-Length`, less what has been read.
    left: Option<u64>,
    /// What was read before the pipeline began.
    first: Option<Result<Bytes, BodyError>>,
    done: bool,
    /// The timer of a read that waits (made the first time one does), and whether it
    /// runs now: the clock starts when a read begins to wait, so time sluice spent not
    /// reading is never the client's stall.
    stall: Option<(Pin<Box<tokio::time::Sleep>>, bool)>,
}

impl RequestBody {
    /// After the data: the request's trailers, if it has any, then the end.
    fn poll_trailers(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let r = std::task::ready!(self.recv.poll_recv_trailers(cx));
        self.done = true;
        Poll::Ready(match r {
            Ok(Some(mut t)) => {
                crate::http1::keep_trailers(&mut t);
                Some(Ok(Frame::trailers(t)))
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!("sluice: h3 request trailers failed: {e}");
                Some(Err(BodyError::ClientGone("the h3 stream was reset")))
            }
        })
    }

    fn counted(&mut self, b: Bytes) -> Option<Result<Frame<Bytes>, BodyError>> {
        if let Some(left) = &mut self.left {
            match left.checked_sub(b.len() as u64) {
                Some(l) => *left = l,
                None => {
                    self.done = true;
                    return Some(Err(BodyError::Malformed(
                        "h3 body longer than its Content-Length",
                    )));
                }
            }
        }
        Some(Ok(Frame::data(b)))
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(match first {
                Ok(b) => this.counted(b),
                Err(e) => {
                    this.done = true;
                    Some(Err(e))
                }
            });
        }
        if this.done {
            return Poll::Ready(None);
        }
        match poll_data(&mut this.recv, cx) {
            Poll::Pending => {
                let (timer, armed) = this
                    .stall
                    .get_or_insert_with(|| (Box::pin(tokio::time::sleep(BODY_READ_TIMEOUT)), true));
                if !*armed {
                    timer
                        .as_mut()
                        .reset(tokio::time::Instant::now() + BODY_READ_TIMEOUT);
                    *armed = true;
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.done = true;
                        Poll::Ready(Some(Err(BodyError::ClientGone(
                            "no request body bytes for 60s",
                        ))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            Poll::Ready(r) => {
                if let Some((_, armed)) = &mut this.stall {
                    *armed = false;
                }
                match r {
                    Ok(Some(b)) => Poll::Ready(this.counted(b)),
                    Ok(None) => match this.left {
                        Some(l) if l > 0 => {
                            this.done = true;
                            Poll::Ready(Some(Err(BodyError::Malformed(
                                "h3 body shorter than its Content-Length",
                            ))))
                        }
                        // The data ended: trailers may follow (DESIGN §18.5).
                        _ => this.poll_trailers(cx),
                    },
                    Err(e) => {
                        this.done = true;
                        Poll::Ready(Some(Err(e)))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (self.first.is_none() && self.left == Some(0))
    }

    fn size_hint(&self) -> SizeHint {
        let pending = match &self.first {
            Some(Ok(b)) => b.len() as u64,
            _ => 0,
        };
        match self.left {
            Some(l) => SizeHint::with_exact(l),
            None => {
                let mut h = SizeHint::new();
                h.set_lower(pending);
                h
            }
        }
    }
}

/// Sends `resp` on the stream: its head (with `Date`, and `Content-Length` when the
/// body's length is known), its body as it comes (each send waiting on the client's
/// flow control for at most 60 s, so a large body is never held in memory and a client
/// that stops reading frees the backend), then its trailers; no body after a HEAD, 204
/// or 304.
async fn respond(
    send: &mut SendHalf,
    resp: Response<Body>,
    head_only: bool,
    mut done: Option<&mut StreamDone>,
) -> Result<(), String> {
    use http_body::Body as _;
    let (mut parts, body) = resp.into_parts();
    ready_for_streams(&mut parts.headers);
    parts.version = Version::HTTP_3;
    let bodiless = head_only
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    if let (Some(n), false) = (body.size_hint().exact(), bodiless) {
        parts
            .headers
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(n));
    }
    let sent = |e: Result<Result<(), h3::error::StreamError>, _>| match e {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("the client read nothing for 60s".to_string()),
    };
    let head = send.send_response(Response::from_parts(parts, ()));
    if let Err(why) = sent(tokio::time::timeout(SEND_TIMEOUT, head).await) {
        gave_up(done);
        return Err(why);
    }
    let mut body = pin!(body);
    if bodiless {
        return sent(tokio::time::timeout(SEND_TIMEOUT, send.finish()).await);
    }
    loop {
        let frame = poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let data = match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) if !d.is_empty() => d,
                Ok(_) => continue,
                Err(frame) => match frame.into_trailers() {
                    // Trailers end the body (DESIGN §18.5).
                    Ok(mut t) => {
                        crate::http1::keep_trailers(&mut t);
                        let trailers = send.send_trailers(t);
                        if let Err(why) = sent(tokio::time::timeout(SEND_TIMEOUT, trailers).await) {
                            gave_up(done);
                            return Err(why);
                        }
                        break;
                    }
                    Err(_) => continue,
                },
            },
            Some(Err(e)) => {
                send.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
                return Err(e.to_string());
            }
        };
        if let Some(d) = done.as_deref_mut() {
            d.bytes += data.len() as u64;
        }
        if let Err(why) = sent(tokio::time::timeout(SEND_TIMEOUT, send.send_data(data)).await) {
            send.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
            gave_up(done);
            return Err(why);
        }
    }
    sent(tokio::time::timeout(SEND_TIMEOUT, send.finish()).await)
}

/// The client stopped the stream (or stopped reading) before the answer was sent
/// whole: `499` in the log and on the meter (DESIGN §18.4).
fn gave_up(done: Option<&mut StreamDone>) {
    if let Some(d) = done {
        d.cut = true;
    }
}

/// The `Alt-Svc` value a TCP TLS listener's responses carry when a `quic` listener
/// shares its address: HTTP/3 on the same port, remembered for a day.
pub(crate) fn alt_svc(port: u16) -> HeaderValue {
    HeaderValue::from_maybe_shared(Bytes::from(format!("h3=\":{port}\"; ma=86400")))
        .expect("a port number is a valid header value")
}

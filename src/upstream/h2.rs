//! HTTP/2 to backends (`h2c://`, and `https://` when ALPN picks `h2`), multiplexed:
//! one connection (a [`Session`]) carries many requests at once.
//!
//! Why the `h2` crate directly rather than hyper's client connection: the pool must
//! know how many streams the backend allows at once (its `SETTINGS_MAX_CONCURRENT_STREAMS`)
//! to open a second connection instead of queueing behind the first, and must notice a
//! `GOAWAY` the moment it arrives, so no new request is given to a connection that is
//! going away. hyper's client hides both.
//!
//! The rules:
//! - A request takes a stream on a session that is settled (the backend's SETTINGS
//!   arrived), not going away, and below the backend's stream limit. If none has room
//!   and no connection is being opened, it opens one; if one is being opened, it waits
//!   for that one (bounded by `connect_timeout`) rather than opening another.
//! - `GOAWAY` is seen by a frame watcher on the connection's read side ([`Watch`]),
//!   before h2 acts on it: the session takes no new stream from then on. A request whose
//!   stream the backend never processed (above the GOAWAY's last stream id, or refused
//!   with `REFUSED_STREAM`, or failed before it had a stream) went nowhere: it goes out
//!   again, up to three times, on a session that can take it (a new connection when the
//!   old one is going away).
//! - A session with no stream open for the pool's keepalive idle timeout is closed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::RecvStream;
use http::header;
use http::{Request, Response, Uri, Version};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

use super::conn::{Named, Outgoing, SendError};
use crate::clock::now_ms;

/// Per-stream and per-connection receive windows: enough for a fast backend to keep a
/// link busy, small enough that a slow client costs bounded memory per stream.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONN_WINDOW: u32 = 1024 * 1024;
/// Streams an HTTP/2 connection (client or server side) remembers after resetting
/// them, so that frames the peer sent before it saw the reset are not taken for a
/// protocol error; the oldest is forgotten first. Set rather than left to the `h2`
/// crate, whose default (0.4.21) is 2 × the peer's stream limit, else 8,192: a
/// backend connection whose clients cancel requests would keep thousands.
pub(crate) const RESETS_KEPT: usize = 50;
/// How long a reset stream is remembered (the crate's default since 0.4.21).
pub(crate) const RESETS_KEPT_FOR: Duration = Duration::from_secs(5);

/// A backend connection speaking HTTP/2.
pub(crate) struct Session {
    send: SendRequest<Bytes>,
    /// Streams open (taken and not yet finished).
    active: AtomicUsize,
    /// What the connection task and the frame watcher report; shared with the task,
    /// which must not hold the `Session` (the connection closes only once every
    /// `SendRequest` is gone).
    watch: Arc<Watch>,
    /// When the last stream finished (ms, [`now_ms`]), for the idle timeout.
    idle_since: AtomicU64,
    /// A session to a named origin: the address the name gave.
    named: Option<std::net::IpAddr>,
    /// When that answer expires (ms, [`now_ms`]).
    named_until: AtomicU64,
    /// Takes no new stream (its name no longer points here): the streams open finish,
    /// and the connection closes with the last.
    retired: AtomicBool,
}

impl Session {
    fn is_usable(&self) -> bool {
        self.watch.settled.load(Ordering::Acquire) && self.is_open()
    }

    /// Not closed or retired, no GOAWAY seen.
    fn is_open(&self) -> bool {
        !self.watch.closed.load(Ordering::Acquire)
            && !self.retired.load(Ordering::Relaxed)
            && self.watch.goaway.load(Ordering::Acquire) == NO_GOAWAY
    }

    fn has_room(&self) -> bool {
        self.active.load(Ordering::Relaxed) < self.send.current_max_send_streams()
    }
}

/// A stream taken on a session; gives its place back when dropped.
pub(crate) struct Stream {
    session: Arc<Session>,
    /// The rest of a request body still going out after its response head arrived
    /// (DESIGN §18.5): stopped when the response is let go before its end.
    upload: Option<tokio::task::AbortHandle>,
}

impl Stream {
    /// What the session's connection remembers of the name it came from.
    pub(crate) fn named(&self) -> Option<Named> {
        let s = &self.session;
        s.named.map(|ip| Named {
            ip,
            until_ms: s.named_until.load(Ordering::Relaxed),
        })
    }

    /// The name still points here, until `named.until_ms`.
    pub(crate) fn renew(&self, named: Named) {
        let s = &self.session;
        s.named_until.store(named.until_ms, Ordering::Relaxed);
    }

    /// The name no longer points here: the session takes no new stream.
    pub(crate) fn retire(&self) {
        self.session.retired.store(true, Ordering::Relaxed);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            upload.abort();
        }
        if self.session.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.session.idle_since.store(now_ms(), Ordering::Relaxed);
        }
    }
}

/// A peer's HTTP/2 sessions.
#[derive(Default)]
pub(crate) struct Mux {
    state: Mutex<MuxState>,
    /// A connection being opened finished (or failed, or was abandoned).
    opened: Notify,
    /// Connections this peer failed to open, ever: a waiter that sees it move knows
    /// the connection it waited for will not come.
    failures: AtomicU64,
}

#[derive(Default)]
struct MuxState {
    sessions: Vec<Arc<Session>>,
    /// Connections being opened now.
    opening: usize,
}

/// What [`Mux::take`] found.
pub(crate) enum Take<'a> {
    /// A stream on an existing session.
    Stream(Stream),
    /// No room anywhere and nothing being opened: the caller opens a connection and
    /// says how it went through the guard (dropping it unused lets the waiters retry).
    Open(Opening<'a>),
    /// A connection is being opened by another request: wait for it
    /// ([`Mux::wait_opened`]).
    Wait(u64),
}

/// A connection being opened by one request, for the others to wait on.
pub(crate) struct Opening<'a> {
    mux: &'a Mux,
    done: bool,
}

impl Opening<'_> {
    /// The connection is open: it joins the peer's sessions with the caller's stream.
    pub(crate) fn opened(mut self, session: Arc<Session>) -> Stream {
        self.done = true;
        let stream = {
            let mut st = self.mux.lock();
            st.opening -= 1;
            session.active.fetch_add(1, Ordering::AcqRel);
            st.sessions.push(session.clone());
            Stream {
                session,
                upload: None,
            }
        };
        self.mux.opened.notify_waiters();
        stream
    }

    /// The connection could not be opened: the waiters give up too (one dial failure
    /// is not retried by every request that was waiting for it).
    pub(crate) fn failed(mut self) {
        self.done = true;
        self.mux.failures.fetch_add(1, Ordering::AcqRel);
        self.mux.release();
    }
}

impl Drop for Opening<'_> {
    /// Not an HTTP/2 connection after all (ALPN chose http/1.1), or the request went
    /// away mid-dial: the waiters look again.
    fn drop(&mut self) {
        if !self.done {
            self.mux.release();
        }
    }
}

impl Mux {
    fn lock(&self) -> std::sync::MutexGuard<'_, MuxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self) {
        self.lock().opening -= 1;
        self.opened.notify_waiters();
    }

    /// A stream on a session with room, or what to do instead.
    pub(crate) fn take(&self) -> Take<'_> {
        let mut st = self.lock();
        st.sessions.retain(|s| s.is_open());
        // The most loaded session with room first: connections fill before new ones
        // are used, and idle ones can expire.
        if let Some(s) = st
            .sessions
            .iter()
            .filter(|s| s.is_usable() && s.has_room())
            .max_by_key(|s| s.active.load(Ordering::Relaxed))
        {
            s.active.fetch_add(1, Ordering::AcqRel);
            return Take::Stream(Stream {
                session: s.clone(),
                upload: None,
            });
        }
        if st.opening > 0 {
            return Take::Wait(self.failures.load(Ordering::Acquire));
        }
        st.opening += 1;
        Take::Open(Opening {
            mux: self,
            done: false,
        })
    }

    /// A session this peer's caller opened without asking (a TLS peer that chose h2),
    /// with the caller's stream on it.
    pub(crate) fn adopt(&self, session: Arc<Session>) -> Stream {
        session.active.fetch_add(1, Ordering::AcqRel);
        self.lock().sessions.push(session.clone());
        self.opened.notify_waiters();
        Stream {
            session,
            upload: None,
        }
    }

    /// Waits until the connection being opened is done (or `limit` passes). `false`:
    /// it failed (`seen` is [`Take::Wait`]'s count); the caller should not dial again.
    pub(crate) async fn wait_opened(&self, seen: u64, limit: Duration) -> bool {
        let n = self.opened.notified();
        tokio::pin!(n);
        n.as_mut().enable();
        if self.lock().opening > 0 {
            let _ = tokio::time::timeout(limit, n).await;
        }
        self.failures.load(Ordering::Acquire) == seen
    }

    /// Closes sessions with no stream open for `idle` or more, and forgets closed ones.
    pub(crate) fn reap(&self, idle: Duration) {
        let now = now_ms();
        let mut st = self.lock();
        st.sessions.retain(|s| {
            let idle_for = now.saturating_sub(s.idle_since.load(Ordering::Relaxed));
            let expired =
                s.active.load(Ordering::Acquire) == 0 && idle_for >= idle.as_millis() as u64;
            !s.watch.closed.load(Ordering::Acquire) && !expired
        });
    }

    /// Forgets every session: no new stream goes on them; streams on them finish, and
    /// each closes when its last stream does.
    pub(crate) fn clear(&self) {
        self.lock().sessions.clear();
    }

    /// Sessions open now (for the status page).
    pub(crate) fn sessions(&self) -> usize {
        self.lock().sessions.len()
    }
}

/// The backend client's settings.
fn client() -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONN_WINDOW)
        .enable_push(false)
        .max_concurrent_reset_streams(RESETS_KEPT)
        .reset_stream_duration(RESETS_KEPT_FOR)
        // A response head is bounded as over HTTP/1.1 (DESIGN §18.4).
        .max_header_list_size(crate::http1::MAX_RESPONSE_HEAD as u32);
    b
}

/// Opens a session over `io` (a connected socket, or a TLS stream that chose `h2`):
/// the handshake, the connection task, then the backend's SETTINGS, all within
/// `limit`.
pub(crate) async fn handshake<T>(
    io: T,
    limit: Duration,
    peer: String,
    named: Option<Named>,
) -> Result<Arc<Session>, String>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let watch = Arc::new(Watch::default());
    let io = Watched {
        inner: io,
        watch: watch.clone(),
        frames: FrameScan::default(),
    };
    let fut = async {
        let (send, mut conn) = client()
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
        let session = Arc::new(Session {
            send,
            active: AtomicUsize::new(0),
            watch: watch.clone(),
            idle_since: AtomicU64::new(now_ms()),
            named: named.map(|n| n.ip),
            named_until: AtomicU64::new(named.map_or(0, |n| n.until_ms)),
            retired: AtomicBool::new(false),
        });
        let w = watch.clone();
        tokio::spawn(async move {
            let r = std::future::poll_fn(|cx| {
                let r = Pin::new(&mut conn).poll(cx);
                // The SETTINGS frame was read whole in this poll, and h2 applied it
                // before returning: the stream limit is the backend's from now on.
                if w.settings.load(Ordering::Acquire) && !w.settled.load(Ordering::Relaxed) {
                    w.settled.store(true, Ordering::Release);
                    w.changed.notify_waiters();
                }
                r
            })
            .await;
            w.closed.store(true, Ordering::Release);
            w.changed.notify_waiters();
            if let Err(e) = r {
                if !e.is_go_away() && !e.is_io() {
                    tracing::debug!("sluice: HTTP/2 connection to {peer} ended: {e}");
                }
            }
        });
        {
            let n = watch.changed.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if !watch.settled.load(Ordering::Acquire) && !watch.closed.load(Ordering::Acquire) {
                n.await;
            }
        }
        if !watch.settled.load(Ordering::Acquire) {
            return Err("the connection closed before the backend's HTTP/2 SETTINGS".to_string());
        }
        if session.send.current_max_send_streams() == 0 {
            // Every request would wait in h2's queue until its timeout.
            return Err(
                "the backend allows no streams (SETTINGS_MAX_CONCURRENT_STREAMS 0)".to_string(),
            );
        }
        Ok(session)
    };
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err("no HTTP/2 SETTINGS from the backend in time".to_string()),
    }
}

/// Sends `out` on `stream` and reads the response head. `scheme` is the request's
/// `:scheme` (`http` for h2c, `https` over TLS). A request the backend never processed
/// comes back as [`SendError::NotSent`] when it can go out again whole. A response head
/// that arrives before the upload ended does not end it (DESIGN §18.5): the rest goes
/// on beside the response, in a task of its own held by `stream`.
pub(crate) async fn send(
    stream: &mut Stream,
    out: &mut Outgoing,
    scheme: &'static str,
) -> Result<Response<RecvStream>, SendError> {
    let session = &stream.session;
    let req = head(out, scheme);
    let end = out.nothing_to_send();
    let mut send = session.send.clone();
    // Never waits in practice: the stream was counted against the backend's limit.
    send = std::future::poll_fn(|cx| send.poll_ready(cx).map_ok(|_| ()))
        .await
        .map(|_| send)
        .map_err(|e| unprocessed_or(session, None, e, out))?;
    let (mut resp, mut body) = send
        .send_request(req, end)
        .map_err(|e| unprocessed_or(session, None, e, out))?;
    let id = body.stream_id();
    if !end {
        // What of a data frame is not sent yet, kept out of the pump so that stopping
        // it loses nothing.
        let mut pending = Bytes::new();
        let early = {
            let pumped = pump(&mut body, out, &mut pending);
            tokio::pin!(pumped);
            tokio::select! {
                biased;
                r = final_head(&mut resp) => Some(r),
                p = &mut pumped => {
                    match p {
                        // The client's body failed: its fault, nothing to wait for.
                        Err(e @ SendError::Body(_)) => return Err(e),
                        // The backend ended its side (answered and reset the stream,
                        // any code): its answer, if it sent one, says the rest.
                        Ok(()) | Err(_) => None,
                    }
                }
            }
        };
        if let Some(r) = early {
            let r = r.map_err(|e| unprocessed_or(session, Some(id), e, out))?;
            let rest = out.take_rest();
            stream.upload = Some(tokio::spawn(upload_rest(body, rest, pending)).abort_handle());
            return Ok(r);
        }
    }
    final_head(&mut resp)
        .await
        .map_err(|e| unprocessed_or(session, Some(id), e, out))
}

/// The final response head; interim ones (`103`) before it are relayed when the
/// client can take them.
async fn final_head(
    resp: &mut h2::client::ResponseFuture,
) -> Result<Response<RecvStream>, h2::Error> {
    std::future::poll_fn(|cx| {
        while let Poll::Ready(Some(Ok(info))) = resp.poll_informational(cx) {
            let (parts, ()) = info.into_parts();
            crate::interim::relay(parts.status, parts.headers);
        }
        Pin::new(&mut *resp).poll(cx)
    })
    .await
}

/// The rest of a request body after its response head arrived, until it ends, the
/// backend resets the stream (any code: `NO_ERROR` after a complete response too), or
/// the client's body fails (the backend's stream is then cancelled).
async fn upload_rest(mut body: h2::SendStream<Bytes>, mut rest: Outgoing, mut pending: Bytes) {
    let r = pump(&mut body, &mut rest, &mut pending).await;
    if let Err(SendError::Body(_)) = r {
        body.send_reset(h2::Reason::CANCEL);
    }
}

/// The request's head as HTTP/2 has it: `:authority` from `Host`, no connection-level
/// fields.
fn head(out: &Outgoing, scheme: &'static str) -> Request<()> {
    let parts = &out.parts;
    let mut headers = parts.headers.clone();
    let authority = headers
        .remove(header::HOST)
        .and_then(|h| h.to_str().ok().map(str::to_owned));
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    if headers.contains_key(header::TE) {
        // `header_up` may have set one after the scrub.
        crate::http1::head::normalise_te(&mut headers, true);
    }
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = Uri::builder()
        .scheme(scheme)
        .authority(authority.as_deref().unwrap_or("localhost"))
        .path_and_query(pq)
        .build()
        .or_else(|_| {
            Uri::builder()
                .scheme(scheme)
                .authority("localhost")
                .path_and_query(pq)
                .build()
        })
        .unwrap_or_default();
    let mut req = Request::new(());
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_2;
    *req.headers_mut() = headers;
    req
}

/// Streams the request body into the h2 stream, within the flow-control window; the
/// data frame on its way is `pending`. Ends early when the backend resets the stream.
async fn pump(
    body: &mut h2::SendStream<Bytes>,
    out: &mut Outgoing,
    pending: &mut Bytes,
) -> Result<(), SendError> {
    loop {
        send_all(body, pending).await?;
        let frame = tokio::select! {
            biased;
            f = out.next_frame() => f.map_err(SendError::Body)?,
            r = std::future::poll_fn(|cx| body.poll_reset(cx)) => {
                let e = r.map_or_else(h2_io, |why| h2_io(why.into()));
                return Err(e);
            }
        };
        let Some(frame) = frame else {
            return body.send_data(Bytes::new(), true).map_err(h2_io);
        };
        match frame.into_data() {
            Ok(data) => *pending = data,
            Err(frame) => {
                if let Ok(mut trailers) = frame.into_trailers() {
                    crate::http1::keep_trailers(&mut trailers);
                    return body.send_trailers(trailers).map_err(h2_io);
                }
            }
        }
    }
}

/// Sends `data` as the window allows, taking from its front what went.
async fn send_all(body: &mut h2::SendStream<Bytes>, data: &mut Bytes) -> Result<(), SendError> {
    while !data.is_empty() {
        body.reserve_capacity(data.len());
        let got = std::future::poll_fn(|cx| body.poll_capacity(cx))
            .await
            .ok_or_else(|| SendError::Io(io::ErrorKind::BrokenPipe.into()))?
            .map_err(h2_io)?;
        let piece = data.split_to(got.min(data.len()));
        body.send_data(piece, false).map_err(h2_io)?;
    }
    Ok(())
}

fn h2_io(e: h2::Error) -> SendError {
    SendError::Io(io::Error::other(e))
}

/// A stream the backend did not process (refused, or above a GOAWAY's last stream id)
/// is [`SendError::NotSent`] when the request can go out again whole; anything else is
/// a broken connection.
fn unprocessed_or(
    session: &Session,
    id: Option<h2::StreamId>,
    e: h2::Error,
    out: &mut Outgoing,
) -> SendError {
    if id.is_none() && e.reason().is_none() && !e.is_io() && !e.is_go_away() {
        // The library refused the request itself: its fields break HTTP/2. The peer is
        // blameless, and sending it again cannot help — unless the session ran out of
        // stream ids, which only a fresh session cures.
        if e.to_string().contains("stream ID overflowed") {
            session.watch.goaway.store(0, Ordering::Release);
            if out.rewind_all() {
                return SendError::NotSent;
            }
        }
        return SendError::Unsendable(e.to_string());
    }
    let last = session.watch.goaway.load(Ordering::Acquire);
    // No stream id: the request never left (the connection failed as it was taken).
    let refused = id.is_none()
        || e.reason() == Some(h2::Reason::REFUSED_STREAM)
        || (last != NO_GOAWAY && id.is_some_and(|id| u32::from(id) > last));
    if refused && out.rewind_all() {
        return SendError::NotSent;
    }
    SendError::Io(io::Error::other(e))
}

/// A backend's HTTP/2 response body on its way to the client; holds its stream's place
/// and gives flow-control credit back as the client takes the data.
pub(crate) struct ResponseBody {
    recv: RecvStream,
    data_done: bool,
    _stream: Stream,
}

impl ResponseBody {
    pub(crate) fn new(recv: RecvStream, mut stream: Stream) -> ResponseBody {
        let data_done = recv.is_end_stream();
        if data_done {
            // Complete already: what is left of the upload goes on (see `ended`).
            stream.upload = None;
        }
        ResponseBody {
            data_done,
            recv,
            _stream: stream,
        }
    }

    /// The response is complete: what is left of the upload goes on until it ends or
    /// the backend resets the stream, no longer stopped with the response. (A consumer
    /// may stop polling once the end is known, so this is said as soon as it is.)
    fn ended(&mut self) {
        self._stream.upload = None;
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if !this.data_done {
            match this.recv.poll_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(data))) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    // (Asked only with an upload going on: it takes the stream's lock.)
                    if this._stream.upload.is_some() && this.recv.is_end_stream() {
                        this.ended();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(io::Error::other(e)))),
                Poll::Ready(None) => this.data_done = true,
            }
        }
        match this.recv.poll_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(mut t))) => {
                crate::http1::keep_trailers(&mut t);
                this.ended();
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Poll::Ready(Ok(None)) => {
                this.ended();
                Poll::Ready(None)
            }
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(io::Error::other(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Sentinel: no GOAWAY seen.
const NO_GOAWAY: u32 = u32::MAX;

/// What the frame watcher saw on a connection's read side, and what the connection
/// task reports.
pub(crate) struct Watch {
    /// The backend's first SETTINGS frame arrived, payload and all.
    settings: AtomicBool,
    /// The lowest last-stream-id of the GOAWAYs received, or [`NO_GOAWAY`].
    goaway: AtomicU32,
    /// The backend's SETTINGS arrived and h2 applied them.
    settled: AtomicBool,
    /// The connection task ended: nothing more can go on it.
    closed: AtomicBool,
    /// `settled` or `closed` changed.
    changed: Notify,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            settings: AtomicBool::new(false),
            goaway: AtomicU32::new(NO_GOAWAY),
            settled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }
}

/// Follows the frame boundaries of the bytes the backend sends (a 9-byte header, then
/// the payload), looking only at SETTINGS and GOAWAY.
#[derive(Default)]
struct FrameScan {
    head: [u8; 9],
    head_len: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
    /// Reading a GOAWAY's last-stream-id: its bytes so far.
    goaway: Option<([u8; 4], usize)>,
    /// The current frame is the backend's SETTINGS: seen once its payload has passed.
    settings: bool,
}

impl FrameScan {
    fn feed(&mut self, mut b: &[u8], w: &Watch) {
        while !b.is_empty() {
            if let Some((id, have)) = &mut self.goaway {
                let n = (4 - *have).min(b.len());
                id[*have..*have + n].copy_from_slice(&b[..n]);
                *have += n;
                self.skip -= n;
                b = &b[n..];
                if *have == 4 {
                    let last = u32::from_be_bytes(*id) & 0x7fff_ffff;
                    w.goaway.fetch_min(last, Ordering::AcqRel);
                    self.goaway = None;
                }
                continue;
            }
            if self.skip > 0 {
                let n = self.skip.min(b.len());
                self.skip -= n;
                b = &b[n..];
                if self.skip == 0 && std::mem::take(&mut self.settings) {
                    w.settings.store(true, Ordering::Release);
                }
                continue;
            }
            let n = (9 - self.head_len).min(b.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&b[..n]);
            self.head_len += n;
            b = &b[n..];
            if self.head_len < 9 {
                continue;
            }
            self.head_len = 0;
            let len = u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]) as usize;
            let (kind, flags) = (self.head[3], self.head[4]);
            self.skip = len;
            match kind {
                0x4 if flags & 0x1 == 0 && len == 0 => w.settings.store(true, Ordering::Release),
                0x4 if flags & 0x1 == 0 => self.settings = true,
                0x7 if len >= 8 => self.goaway = Some(([0; 4], 0)),
                _ => {}
            }
        }
    }
}

/// The connection's stream with a [`FrameScan`] on its read side.
struct Watched<T> {
    inner: T,
    watch: Arc<Watch>,
    frames: FrameScan,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            this.frames.feed(&buf.filled()[before..], &this.watch);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, b)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frame_scan_sees_settings_and_goaway_across_any_split() {
        let mut bytes = frame(0x4, 0x1, &[]); // a SETTINGS ack: not the backend's settings
        bytes.extend(frame(0x0, 0x0, &[7; 300])); // DATA
        bytes.extend(frame(0x4, 0x0, &[0, 3, 0, 0, 0, 10])); // SETTINGS
        bytes.extend(frame(0x7, 0x0, &[0x80, 0, 0, 9, 0, 0, 0, 0])); // GOAWAY, R bit set
        bytes.extend(frame(0x7, 0x0, &[0, 0, 0, 11, 0, 0, 0, 0, 1, 2])); // a later, higher one
        for step in [1, 2, 5, 9, 10, 64, bytes.len()] {
            let (mut scan, w) = (FrameScan::default(), Watch::default());
            let mut saw_settings_before_data_end = false;
            for (i, piece) in bytes.chunks(step).enumerate() {
                scan.feed(piece, &w);
                if (i + 1) * step <= 9 + 9 + 300 {
                    saw_settings_before_data_end |= w.settings.load(Ordering::Relaxed);
                }
            }
            assert!(!saw_settings_before_data_end, "step {step}");
            assert!(w.settings.load(Ordering::Relaxed), "step {step}");
            assert_eq!(w.goaway.load(Ordering::Relaxed), 9, "step {step}");
        }
        // SETTINGS counts once its payload (the limits) has been read, not at its header.
        let settings = frame(0x4, 0x0, &[0, 3, 0, 0, 0, 1]);
        let (mut scan, w) = (FrameScan::default(), Watch::default());
        scan.feed(&settings[..9], &w);
        assert!(!w.settings.load(Ordering::Relaxed));
        scan.feed(&settings[9..14], &w);
        assert!(!w.settings.load(Ordering::Relaxed));
        scan.feed(&settings[14..], &w);
        assert!(w.settings.load(Ordering::Relaxed));
    }
}

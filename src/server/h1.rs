//! The HTTP/1.1 connection loop, server role of the `http1` codec: one task per
//! connection that reads heads, dispatches requests, pumps request bodies and writes
//! responses, over any [`Transport`].
//!
//! Why our own and not hyper's server: the framing rules of DESIGN.md §14 (bare LF,
//! obs-fold, 501 for unknown codings) must be enforced on raw bytes, and an idle
//! keep-alive connection must hold no buffers (hyper keeps 8 KiB per connection).
//! Here the read and write buffers are released while a connection waits for its next
//! request. Never buffers a body: request bodies go to the handler a chunk at a time
//! through a one-slot channel, responses are written frame by frame.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, timeout_at, Instant};

use super::drain::{ConnectionGuard, Watch};
use crate::access::{Marks, Pending, Seen};
use crate::body::{Body, BodyError};
use crate::http1::decode::{self, Decoded, Decoder};
use crate::http1::encode::{self, Delimit};
use crate::http1::fields::Fields;
use crate::http1::head::{parse_request, Framing, HeadError, RequestHead};
use crate::http1::scan::RequestScan;
use crate::http1::{MAX_HEAD, READ_CHUNK};
use crate::net::transport::{make_room, SendFile, Transport};
use crate::pipeline::{self, ClientInfo};
use crate::reply::date;
use crate::runtime::Live;
use crate::stats::{bump, count_status, COUNTERS};

use super::conn::{Access, BODY_READ_TIMEOUT, HEAD_TIMEOUT, IDLE_TIMEOUT};

pub(crate) struct Conn {
    pub client: ClientInfo,
    pub live: Arc<Live>,
    /// The drain's count of this connection, and its way to the drain.
    pub counted: ConnectionGuard,
    pub watch: Watch,
    pub access: Access,
}

impl Conn {
    /// The request's access log line, begun (when the log is on).
    /// `fields`: the request's fields as they came, when its map (`headers`) was not
    /// built; the line reads them so.
    fn pending(
        &self,
        method: &http::Method,
        uri: &http::Uri,
        (headers, fields): (&HeaderMap, Option<&Fields>),
        version: http::Version,
        started: Option<std::time::Instant>,
    ) -> Option<Pending> {
        let log = self.access.load_full()?;
        let (client, seen) = (self.client.for_log(), Seen::of(headers, fields));
        Some(Pending::new(
            log, method, uri, seen, version, client, started,
        ))
    }

    /// Serves requests on `stream` until the client leaves, a limit is hit or sluice
    /// shuts down. `buf` holds bytes already read (the protocol sniff).
    ///
    /// What an idle connection's task holds is this future: the connection, the
    /// buffer (empty) and the idle wait. A request's state is boxed while it runs.
    pub(crate) fn serve<'a, S: Transport>(
        &'a mut self,
        stream: &'a mut S,
        mut buf: BytesMut,
        accepted: Instant,
    ) -> impl std::future::Future<Output = ()> + 'a {
        // The first head's clock started at the accept; a later one's when its first
        // bytes came, read (once it is needed: a head that came whole never waits).
        let mut deadline = Some(accepted + HEAD_TIMEOUT);
        // A block, not an `async fn`: the arguments are not kept twice in every idle
        // connection's task.
        async move {
            loop {
                let keep = crate::inplace::boxed(|| self.next(stream, &mut buf, deadline)).await;
                if !keep || self.counted.is_stopping() {
                    return;
                }
                if buf.is_empty() {
                    // Idle: hold no buffers while waiting for the next request.
                    drop(std::mem::take(&mut buf));
                    let wheel = self.counted.wheel();
                    match wheel.wait(stream, IDLE_TIMEOUT).await {
                        Some(first) => buf = first,
                        None => return,
                    }
                }
                deadline = None;
            }
        }
    }

    /// Reads the next head and serves its request; whether the connection may carry
    /// another.
    async fn next<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut BytesMut,
        deadline: Option<Instant>,
    ) -> bool {
        match self.read_head(stream, buf, deadline).await {
            Ok(Some(head)) => self.serve_one(stream, buf, head).await,
            Ok(None) => false,
            Err(e) => {
                self.refuse_head(stream, e).await;
                false
            }
        }
    }

    /// Reads until a whole head is in `buf`, scanning each byte once. `Ok(None)`: close
    /// silently (the client left, the deadline passed before any byte came, or sluice
    /// is shutting down: a head not yet whole is not waited for).
    async fn read_head<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut BytesMut,
        mut deadline: Option<Instant>,
    ) -> Result<Option<RequestHead>, HeadError> {
        let mut scan = RequestScan::default();
        loop {
            if let Some(end) = scan.find_end(buf)? {
                let bytes: Bytes = buf.split_to(end).freeze();
                return parse_request(bytes, self.live.defers_fields()).map(Some);
            }
            if buf.capacity() - buf.len() < 1024 {
                // The scanner refuses a head past MAX_HEAD; no need to cap the read here.
                make_room(buf, READ_CHUNK);
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + HEAD_TIMEOUT);
            let read = tokio::select! {
                r = timeout_at(deadline, stream.read_buf(buf)) => r,
                _ = self.watch.draining() => return Ok(None),
            };
            match read {
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
                Ok(Ok(_)) => {}
                Err(_) => {
                    if buf.iter().all(|b| *b == b'\r' || *b == b'\n') {
                        return Ok(None);
                    }
                    bump(&COUNTERS.head_timeout);
                    count_status(408);
                    let msg =
                        encode::simple(StatusCode::REQUEST_TIMEOUT, "Request timeout\n", &[], true);
                    let _ = stream.write_all(&msg).await;
                    return Ok(None);
                }
            }
        }
    }

    /// Answers a head that was refused (400, 431, 501) and closes.
    async fn refuse_head<S: Transport>(&self, stream: &mut S, e: HeadError) {
        let (status, body, counter) = match e {
            HeadError::Bad(why) => {
                tracing::debug!(client = %self.client.addr, "sluice: bad request head: {why}");
                (
                    StatusCode::BAD_REQUEST,
                    format!("Bad request: {why}\n"),
                    &COUNTERS.bad_request,
                )
            }
            HeadError::TooLarge => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "Request header fields too large\n".to_string(),
                &COUNTERS.head_too_large,
            ),
            HeadError::Coding => (
                StatusCode::NOT_IMPLEMENTED,
                "Transfer coding not implemented\n".to_string(),
                &COUNTERS.unsupported_coding,
            ),
        };
        bump(counter);
        count_status(status.as_u16());
        let _ = stream
            .write_all(&encode::simple(status, &body, &[], true))
            .await;
    }

    /// Whether the first chunk-size line of a chunked body is sound; a bad one is
    /// answered 400 here (a closed connection gets nothing).
    async fn first_chunk_ok<S: Transport>(&mut self, stream: &mut S, buf: &mut BytesMut) -> bool {
        match first_chunk_line(stream, buf, &mut self.watch).await {
            Ok(()) => true,
            Err(None) => false,
            Err(Some(why)) => {
                bump(&COUNTERS.bad_request);
                count_status(400);
                let msg = format!("Bad request: {why}\n");
                let out = encode::simple(StatusCode::BAD_REQUEST, &msg, &[], true);
                let _ = stream.write_all(&out).await;
                false
            }
        }
    }

    /// A `101`: the head goes out, then the connection belongs to the tunnel; a reload
    /// or a drain never cuts it (it ends when either side closes).
    async fn switch<S: Transport>(
        &self,
        stream: &mut S,
        buf: &mut BytesMut,
        mut ex: Exchange,
        resp: Response<Body>,
        mut log: Option<Pending>,
        tunnel: Box<crate::tunnel::Tunnel>,
    ) {
        let (parts, _) = resp.into_parts();
        ex.switch(stream, parts.status, parts.headers).await;
        ex.status = 101;
        let done = ex.done(log.is_some());
        ex.meter(0, done);
        if let (Some(l), Some(done)) = (&mut log, done) {
            ex.log(l, None, done);
        }
        let early = buf.split().freeze();
        stream.keepalive();
        tunnel.join(stream, early).await;
    }

    /// One request and its response. Returns whether the connection may carry another.
    async fn serve_one<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut BytesMut,
        head: RequestHead,
    ) -> bool {
        let RequestHead {
            method,
            uri,
            version,
            mut headers,
            mut fields,
            framing,
            keep_alive,
            expect_continue,
            trailers,
            upgrade,
        } = head;
        let is_head = method == Method::HEAD;
        // Without Expect the first chunk-size line is normally here already: it is
        // checked before anything is dispatched, so a bad one never reaches a backend.
        if framing == Framing::Chunked
            && !expect_continue
            && !self.first_chunk_ok(stream, buf).await
        {
            return false;
        }
        let (want, pump, body) = Pump::of(framing, expect_continue);
        // One clock read serves the meter and the log.
        let started = self.live.metered().then(std::time::Instant::now);
        with_map_if(upgrade, &mut headers, &mut fields);
        let mut log = self.pending(&method, &uri, (&headers, fields.as_ref()), version, started);
        let req = request(method, uri, version, headers, body);
        let _guard = self.counted.request();
        let mut ex = Exchange {
            pump,
            keep_alive,
            version,
            is_head,
            trailers,
            record: log.is_some(),
            upgrade,
            status: 0,
            bytes: 0,
            received: 0,
            served: None,
            tunnel: None,
            meter: None,
            fields: None,
            started,
        };
        let Some(resp) = ex
            .dispatch(stream, buf, want, (req, fields), &self.live, &self.client)
            .await
        else {
            return false;
        };
        ex.keep_alive &= !self.counted.is_draining();
        if let Some(tunnel) = ex.tunnel.take() {
            // Boxed: a tunnel's state would otherwise sit in every request's.
            Box::pin(self.switch(stream, buf, ex, resp, log, tunnel)).await;
            return false;
        }
        let marks = log.as_ref().map(|_| Marks::of(&resp));
        let mut keep = ex.respond(stream, buf, resp).await;
        if ex.still_uploading() {
            // Boxed: rare.
            Box::pin(ex.finish_upload(stream, buf)).await;
        }
        // A request body the handler did not read to its end leaves the stream
        // mid-request.
        keep &= ex.pump.is_none();
        ex.count_unread(buf);
        ex.record(log.as_mut(), marks.as_ref());
        if !keep && ex.pump.is_some() {
            // Boxed: its 4 KiB sink would otherwise sit in every request's state.
            Box::pin(linger(stream)).await;
        }
        keep
    }
}

/// The request's map built from its fields as they came (if they were kept so), when
/// `read`: a switch of protocols reads them.
fn with_map_if(read: bool, headers: &mut HeaderMap, fields: &mut Option<Fields>) {
    if read {
        Fields::into_map(fields, headers);
    }
}

/// A parsed head's parts and its body as one request.
fn request(
    method: Method,
    uri: http::Uri,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Request<Body> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    *req.headers_mut() = headers;
    req
}

/// A lingering close, after answering a client that is still sending a body nobody
/// will read: the write side is shut (the client sees the answer end) and what the
/// client still sends is read and dropped for a while, so the connection does not
/// close with unread data — which would reset it and could destroy the answer before
/// the client read it.
async fn linger<S: Transport>(stream: &mut S) {
    /// The most time a lingering close takes, and the longest pause it waits out.
    const LINGER: Duration = Duration::from_secs(5);
    const LINGER_PAUSE: Duration = Duration::from_secs(2);
    let _ = stream.shutdown().await;
    let end = Instant::now() + LINGER;
    let mut sink = [0u8; 4096];
    loop {
        let pause = (Instant::now() + LINGER_PAUSE).min(end);
        match timeout_at(pause, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
}

/// One request's exchange on the connection, once its head is parsed.
struct Exchange {
    /// The request body still being read, if any.
    pump: Option<Pump>,
    keep_alive: bool,
    version: Version,
    is_head: bool,
    /// The client takes trailer fields (`TE: trailers`): a chunked answer carries them.
    trailers: bool,
    /// The access log is on: what it needs is kept.
    record: bool,
    /// The client asked to switch protocols.
    upgrade: bool,
    /// The response's status and body bytes written, and who served it.
    status: u16,
    bytes: u64,
    /// Request body bytes read.
    received: u64,
    served: Option<crate::pipeline::Served>,
    /// The meter the response counts on, and when the request began (metering is on).
    meter: Option<Arc<crate::stats::Meter>>,
    started: Option<std::time::Instant>,
    /// A backend connection that switched protocols, to join with this one.
    tunnel: Option<Box<crate::tunnel::Tunnel>>,
    /// The answer's fields as the backend sent them (`pipeline::Answer::fields`).
    fields: Option<Box<crate::http1::head::SentFields>>,
}

impl Exchange {
    /// Now, read once for the meter and the log, when either needs it.
    fn done(&self, logging: bool) -> Option<std::time::Instant> {
        (self.started.is_some() || logging).then(std::time::Instant::now)
    }

    /// What arrived of a request body the handler let go unread counts as received
    /// (DESIGN §18.4). Only when nothing reads it: the connection closes after this
    /// response, so the bytes taken from `buf` were never a next request.
    #[inline]
    fn count_unread(&mut self, buf: &mut BytesMut) {
        if let Some(p) = self.pump.as_mut().filter(|p| p.tx.is_closed()) {
            p.count_unread(buf, &mut self.received);
        }
    }

    /// Counts the response, done now, on its route's meter.
    fn meter(&self, sent: u64, done: Option<std::time::Instant>) {
        if let (Some(m), Some(t), Some(done)) = (&self.meter, self.started, done) {
            m.record(self.status, done - t, self.received, sent);
        }
    }

    fn log(&self, l: &mut Pending, marks: Option<&Marks>, done: std::time::Instant) {
        let upstream = self.served.as_ref().map(crate::access::Upstream::from);
        l.finish(self.status, self.bytes, upstream, marks, done);
    }

    /// Runs the pipeline while pumping the request body, answering `Expect`, and
    /// noticing a client that leaves. `None`: the client left; close.
    async fn dispatch<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut BytesMut,
        mut want: Option<oneshot::Receiver<()>>,
        (req, fields): (Request<Body>, Option<Fields>),
        live: &Live,
        client: &ClientInfo,
    ) -> Option<Response<Body>> {
        let offer = pipeline::Offer {
            record: self.record,
            upgrade: self.upgrade,
            fields: true,
            as_sent: None,
        };
        let mut fut = pipeline::handle(live, req, fields, client, offer);
        // An HTTP/1.0 client must not get an interim answer.
        let interim = self.version == Version::HTTP_11;
        let (mut rd, mut wr) = stream.split();
        loop {
            tokio::select! {
                biased;
                answer = &mut fut => {
                    // Interim answers (`103`) go first, those of the final poll too.
                    if let Some(heads) = crate::interim::take().filter(|_| interim) {
                        if write_interim(&mut wr, heads).await.is_err() {
                            return None;
                        }
                    }
                    self.served = answer.served;
                    self.tunnel = answer.tunnel;
                    self.meter = answer.meter;
                    self.fields = answer.fields;
                    return Some(answer.resp);
                }
                heads = crate::interim::held(), if interim => {
                    if write_interim(&mut wr, heads).await.is_err() {
                        return None;
                    }
                }
                r = async { want.as_mut().expect("guarded by the precondition").await }, if want.is_some() => {
                    want = None;
                    if r.is_ok() && wr.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err() {
                        return None;
                    }
                }
                r = read_side(&mut self.pump, &mut self.received, &mut rd, buf, true) => {
                    if r == Side::ClientClosed {
                        return None;
                    }
                }
            }
        }
    }

    /// Writes a `101 Switching Protocols` head as it is, with `Date`.
    async fn switch<S: Transport>(
        &mut self,
        stream: &mut S,
        status: StatusCode,
        mut headers: HeaderMap,
    ) {
        count_status(status.as_u16());
        if !headers.contains_key(DATE) {
            headers.insert(DATE, date());
        }
        let mut wbuf = Vec::with_capacity(256);
        // keep_alive: no `Connection: close` beside the `Connection: upgrade` it has.
        encode::head(&mut wbuf, status, &[], &headers, Version::HTTP_11, true);
        let _ = stream.write_all(&wbuf).await;
    }

    /// How the response body is delimited, with the fields that say so.
    fn delimit(
        &mut self,
        status: StatusCode,
        headers: &mut HeaderMap,
        has_length: bool,
        body: &Body,
    ) -> Delimit {
        let out = if self.is_head
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            if !self.is_head {
                headers.remove(CONTENT_LENGTH);
            }
            Delimit::None
        } else if has_length {
            Delimit::Length
        } else if let Some(n) = body.size_hint().exact() {
            headers.insert(CONTENT_LENGTH, n.into());
            Delimit::Length
        } else if self.version == Version::HTTP_11 {
            headers.insert(TRANSFER_ENCODING, http::HeaderValue::from_static("chunked"));
            Delimit::Chunked
        } else {
            self.keep_alive = false;
            Delimit::Close
        };
        if self.is_head && !has_length {
            if let Some(n) = body.size_hint().exact() {
                headers.insert(CONTENT_LENGTH, n.into());
            }
        }
        out
    }

    /// The response's head, encoded (with `Date`, and framed as the body allows), its
    /// body, and how the body is delimited.
    fn encode_head(&mut self, resp: Response<Body>) -> (Body, Delimit, Vec<u8>) {
        let (parts, rbody) = resp.into_parts();
        self.status = parts.status.as_u16();
        let (status, mut headers) = (parts.status, parts.headers);
        count_status(status.as_u16());
        // One pass over the names instead of a hash lookup for each (most heads are
        // short; a long one costs about what the lookups would).
        let fields = self.fields.take();
        let (mut has_length, mut has_date) = fields
            .as_ref()
            .map_or((false, false), |f| (f.has_length, f.has_date));
        for k in headers.keys() {
            has_length |= k == CONTENT_LENGTH;
            has_date |= k == DATE;
        }
        let out = self.delimit(status, &mut headers, has_length, &rbody);
        if !has_date {
            headers.insert(DATE, date());
        }
        if self.pump.as_ref().is_some_and(|p| p.tx.is_closed()) {
            // Answered before the request body arrived, and nothing will read the rest
            // of it: the connection closes after this response, and says so.
            self.keep_alive = false;
        }
        // Per request, so an idle connection holds no write buffer.
        let mut wbuf = Vec::with_capacity(256);
        let sent = fields.as_ref().map_or(&[][..], |f| &f.lines[..]);
        encode::head(
            &mut wbuf,
            status,
            sent,
            &headers,
            self.version,
            self.keep_alive,
        );
        (rbody, out, wbuf)
    }

    /// Writes the response head (with whatever body is ready, in one write), then the
    /// body as it comes, still pumping the request body if it has not ended. Returns
    /// whether the connection may carry another request.
    async fn respond<S: Transport>(
        &mut self,
        stream: &mut S,
        buf: &mut BytesMut,
        resp: Response<Body>,
    ) -> bool {
        let (mut rbody, out, mut wbuf) = self.encode_head(resp);
        // Whatever of the body is ready now leaves with the head, in one write: a small
        // response, proxied or local, costs a single syscall.
        let mut finished = out == Delimit::None;
        let (mut rd, wr) = stream.split();
        let mut wr = super::transport::SendTimeout::new(wr);
        // A static file on a plain socket goes by `sendfile`, after the head (not while
        // a request body is still being read: that loop reads frames).
        let by_send_file = self.pump.is_none()
            && matches!(&rbody, Body::File(f) if f.left > 0)
            && wr.can_send_file();
        let chunked = out == Delimit::Chunked;
        // Large ready frames are left beside the head (in the same vectored write)
        // instead of copied behind it; they live only through this write, not the
        // awaits after it (a local's space in the state is kept while it is in scope).
        let sent = match ready_body(
            &mut rbody,
            chunked,
            &mut wbuf,
            &mut finished,
            by_send_file,
            &mut self.bytes,
            self.trailers,
        ) {
            Err(_) => return false,
            Ok(Some(spill)) => {
                encode::spilled_after(&mut wr, &wbuf, &spill, chunked, finished).await
            }
            // The file's first bytes go out with the head, in full segments.
            Ok(None) if by_send_file && !finished => {
                super::transport::write_before_file(&mut wr, &wbuf).await
            }
            Ok(None) => wr.write_all(&wbuf).await,
        };
        if sent.is_err() {
            return false;
        }
        drop(wbuf);
        if let (Body::File(f), true) = (&mut rbody, by_send_file && !finished) {
            let (sent, r) = super::transport::send_file(&mut wr, f).await;
            self.bytes += sent;
            match r {
                Ok(()) => finished = true,
                // Nothing went: the same body goes by reads below.
                Err(e) if sent == 0 && crate::net::cannot_send_file(&e) => {}
                Err(_) => return false,
            }
        }
        if !finished
            && !self
                .stream_body(&mut rbody, out, &mut wr, &mut rd, buf)
                .await
        {
            return false;
        }
        drop(rbody);
        self.keep_alive && out != Delimit::Close
    }

    /// A backend still takes the upload after its answer (full duplex, DESIGN §18.5):
    /// the body goes on to its end ([`Exchange::finish_upload`]).
    fn still_uploading(&self) -> bool {
        self.pump
            .as_ref()
            .is_some_and(|p| !p.failed && !p.tx.is_closed())
    }

    /// The request is done: metered, and its access log line written.
    #[inline]
    fn record(&self, log: Option<&mut Pending>, marks: Option<&Marks>) {
        let done = self.done(log.is_some());
        self.meter(self.bytes, done);
        if let (Some(l), Some(done)) = (log, done) {
            self.log(l, marks, done);
        }
    }

    /// Pumps what is left of the request body after the answer, for a backend that
    /// still reads it, until it ends, the backend lets it go, the client stalls for
    /// `BODY_READ_TIMEOUT` or leaves.
    async fn finish_upload<S: Transport>(&mut self, stream: &mut S, buf: &mut BytesMut) {
        let (mut rd, _) = stream.split();
        while self
            .pump
            .as_ref()
            .is_some_and(|p| !p.failed && !p.tx.is_closed())
        {
            let step = read_side(&mut self.pump, &mut self.received, &mut rd, buf, false);
            match timeout(BODY_READ_TIMEOUT, step).await {
                Ok(Side::Progress) => {}
                Ok(Side::ClientClosed) => break,
                Err(_) => {
                    // Said, when there is room, so the backend is not told the body
                    // ended where it stopped.
                    if let Some(p) = &self.pump {
                        let _ =
                            p.tx.try_send(Err(BodyError::ClientGone("no body bytes for 60s")));
                    }
                    break;
                }
            }
        }
    }

    /// The rest of the response body, frame by frame, while a request body still being
    /// read is pumped; `false` when the connection must close (a write failed, or the
    /// body broke off).
    async fn stream_body<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
        &mut self,
        rbody: &mut Body,
        out: Delimit,
        wr: &mut W,
        rd: &mut R,
        buf: &mut BytesMut,
    ) -> bool {
        loop {
            tokio::select! {
                biased;
                frame = rbody.frame() => match frame {
                    None => {
                        return out != Delimit::Chunked || wr.write_all(b"0\r\n\r\n").await.is_ok();
                    }
                    Some(Ok(frame)) => {
                        let data = match frame.into_data() {
                            Ok(data) => data,
                            Err(frame) => match frame.trailers_ref() {
                                // Trailers end the body, for a client that takes them.
                                Some(t) if out == Delimit::Chunked && self.trailers => {
                                    let mut end = Vec::with_capacity(64);
                                    encode::last_chunk_with(&mut end, t);
                                    return wr.write_all(&end).await.is_ok();
                                }
                                _ => continue,
                            },
                        };
                        if data.is_empty() {
                            continue;
                        }
                        self.bytes += data.len() as u64;
                        let w = match out {
                            Delimit::Chunked => encode::chunk(wr, &data).await,
                            _ => wr.write_all(&data).await,
                        };
                        if w.is_err() {
                            return false;
                        }
                    }
                    // The body broke off: close so the client sees the truncation.
                    Some(Err(_)) => return false,
                },
                _ = read_side(&mut self.pump, &mut self.received, rd, buf, false), if self.pump.is_some() => {}
            }
        }
    }
}

/// Writes interim answers (`103 Early Hints`) as they came, before the final one.
async fn write_interim<W: AsyncWrite + Unpin>(
    wr: &mut W,
    heads: crate::interim::Heads,
) -> std::io::Result<()> {
    let mut wbuf = Vec::with_capacity(256);
    for (status, headers) in &heads {
        count_status(status.as_u16());
        encode::head(&mut wbuf, *status, &[], headers, Version::HTTP_11, true);
    }
    wr.write_all(&wbuf).await
}

/// Moves what of a response body is ready behind its head in `wbuf` (setting
/// `finished` when that is all of it), unless it is `finished` already or goes `by_file`;
/// large ready frames are left beside it instead (`Some`: written in the same vectored
/// write, not copied).
fn ready_body(
    rbody: &mut Body,
    chunked: bool,
    wbuf: &mut Vec<u8>,
    finished: &mut bool,
    by_file: bool,
    bytes: &mut u64,
    trailers: bool,
) -> Result<Option<encode::Spill>, crate::body::BodyError> {
    if *finished || by_file {
        return Ok(None);
    }
    let mut spill = encode::Spill::default();
    *finished = encode::take_ready(
        rbody,
        chunked,
        wbuf,
        trailers,
        None,
        Some(&mut spill),
        bytes,
    )?;
    Ok((!spill.is_empty()).then_some(spill))
}

/// Waits for the first chunk-size line of a chunked body and checks it.
/// `Err(Some(why))`: malformed; `Err(None)`: the client left or stalled, or sluice is
/// shutting down (the request was not dispatched: nothing to finish).
async fn first_chunk_line<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    watch: &mut Watch,
) -> Result<(), Option<&'static str>> {
    loop {
        match decode::size_line(buf) {
            Ok(Some(_)) => return Ok(()),
            Err(why) => return Err(Some(why)),
            Ok(None) => {}
        }
        make_room(buf, READ_CHUNK);
        let read = tokio::select! {
            r = timeout(BODY_READ_TIMEOUT, stream.read_buf(buf)) => r,
            _ = watch.draining() => return Err(None),
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(None),
        }
    }
}

/// Feeds a request body from the connection into its channel.
struct Pump {
    decoder: Decoder,
    tx: mpsc::Sender<Result<Frame<Bytes>, BodyError>>,
    /// The body failed (malformed, client gone): nothing more is read from it.
    failed: bool,
}

impl Pump {
    /// Counts what is buffered of a body nobody reads any more (DESIGN §18.4: request
    /// bytes count whether or not the handler read them), taking it from `buf`.
    fn count_unread(&mut self, buf: &mut BytesMut, received: &mut u64) {
        while let Ok(Decoded::Data(b)) = self.decoder.decode(buf) {
            *received += b.len() as u64;
        }
    }

    /// The body's channel and its pump for a request framed so (none without a body).
    #[inline]
    fn of(framing: Framing, expect: bool) -> (Option<oneshot::Receiver<()>>, Option<Pump>, Body) {
        match framing {
            Framing::None => (None, None, Body::Empty),
            Framing::Length(n) => Pump::channel(Decoder::length(n), Some(n), expect),
            Framing::Chunked => Pump::channel(Decoder::chunked(), None, expect),
        }
    }

    fn channel(
        decoder: Decoder,
        len: Option<u64>,
        expect: bool,
    ) -> (Option<oneshot::Receiver<()>>, Option<Pump>, Body) {
        let (tx, rx) = mpsc::channel(1);
        let (want_tx, want_rx) = if expect {
            let (t, r) = oneshot::channel();
            (Some(t), Some(r))
        } else {
            (None, None)
        };
        (
            want_rx,
            Some(Pump {
                decoder,
                tx,
                failed: false,
            }),
            Body::Channel {
                rx,
                len,
                want: want_tx,
            },
        )
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Side {
    Progress,
    ClientClosed,
}

/// The read half's work while a request is in flight: pump its body if one is still
/// coming, else (when `watch_eof`) notice the client closing.
async fn read_side<R: AsyncRead + Unpin>(
    pump: &mut Option<Pump>,
    received: &mut u64,
    rd: &mut R,
    buf: &mut BytesMut,
    watch_eof: bool,
) -> Side {
    let Some(p) = pump else {
        if !watch_eof || buf.len() >= MAX_HEAD {
            return std::future::pending().await;
        }
        make_room(buf, 1024);
        // Bytes that arrive now are a pipelined next request; they stay in `buf`.
        return match rd.read_buf(buf).await {
            Ok(0) | Err(_) => Side::ClientClosed,
            Ok(_) => Side::Progress,
        };
    };
    if p.failed {
        return std::future::pending().await;
    }
    let Ok(permit) = p.tx.reserve().await else {
        // The handler dropped the body: stop reading it; the connection will close.
        // What already arrived of it still counts as received.
        p.count_unread(buf, received);
        p.failed = true;
        return std::future::pending().await;
    };
    loop {
        match p.decoder.decode(buf) {
            Ok(Decoded::Data(b)) => {
                *received += b.len() as u64;
                permit.send(Ok(Frame::data(b)));
                return Side::Progress;
            }
            Ok(Decoded::Trailers(t)) => {
                permit.send(Ok(Frame::trailers(*t)));
                *pump = None;
                return Side::Progress;
            }
            Ok(Decoded::Done) => {
                drop(permit);
                *pump = None;
                return Side::Progress;
            }
            Ok(Decoded::NeedMore) => {
                make_room(buf, READ_CHUNK);
                match timeout(BODY_READ_TIMEOUT, rd.read_buf(buf)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    Ok(_) => {
                        permit.send(Err(BodyError::ClientGone("connection closed")));
                        p.failed = true;
                        return Side::ClientClosed;
                    }
                    Err(_) => {
                        permit.send(Err(BodyError::ClientGone("no body bytes for 60s")));
                        p.failed = true;
                        return std::future::pending().await;
                    }
                }
            }
            Err(why) => {
                bump(&COUNTERS.bad_request);
                permit.send(Err(BodyError::Malformed(why)));
                p.failed = true;
                return std::future::pending().await;
            }
        }
    }
}

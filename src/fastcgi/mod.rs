//! The `fastcgi` handler: PHP (or any FastCGI responder) behind sluice, strictly.
//!
//! - Which script (DESIGN §14): a path segment ending in a `suffix` names the script
//!   (`SCRIPT_NAME` up to it, `PATH_INFO` the rest); it must be a regular file under
//!   `root` after symlinks resolve. A folder gets its `index` script (a folder asked for
//!   without its slash: `301`). Another regular file under root is served as a static
//!   file — never one with a script suffix, so a script's source is never sent. With
//!   `fallback` (a front controller), everything else goes to that script; without,
//!   `404`.
//! - What the application gets: the CGI variables sluice derives (none overridable by a
//!   header or by `env`), `HTTP_*` from request headers whose names are plain tokens
//!   without `_` (so `X_Forwarded_For` cannot pose as `X-Forwarded-For`), never
//!   `HTTP_PROXY`; the body buffered (up to `max_body`, else `413`) and sent with its
//!   exact length.
//! - What comes back: the head parsed strictly (`head`), the body streamed as STDOUT
//!   arrives, STDERR logged (capped, control characters escaped) and never sent on.
//! - The connection ([`pool`]) goes back for reuse only after a clean END_REQUEST;
//!   anything else closes it.

pub(crate) mod codec;
pub(crate) mod head;
pub(crate) mod pool;
mod resolve;
pub(crate) mod spool;

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;

use self::codec::{Decoder, Record};
use self::pool::{Conn, Pool};
use self::resolve::Target;
use crate::body::{Body, BodyError};
use crate::config::FastCgiConfig;
use crate::reply::{date, local_response};

/// The most STDERR text logged for one request.
const STDERR_CAP: usize = 4096;
/// The most PARAMS bytes one request sends.
const PARAMS_CAP: usize = 256 * 1024;

/// One `fastcgi` line in one generation: its settings and its connection pool.
pub(crate) struct FastCgi {
    pub name: String,
    pub cfg: FastCgiConfig,
    pub pool: Arc<Pool>,
    /// This handler among all ever built, for the resolution cache (a reload's new
    /// handler, maybe with another root, starts afresh).
    id: u64,
}

impl FastCgi {
    /// The handler of route `name`, on `pool` (carried from the previous generation's
    /// route when it reaches the same application: `Pool::carry`).
    pub(crate) fn new(name: String, cfg: FastCgiConfig, pool: Arc<Pool>) -> FastCgi {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        FastCgi {
            name,
            cfg,
            pool,
            id,
        }
    }
}

/// The request facts the handler needs besides the request itself.
pub(crate) struct Facts<'a> {
    /// The normalised path routes decided on (after `strip`/`rewrite`).
    pub path: &'a str,
    /// The base of a folder redirect: the path as received, normalised.
    pub folder: &'a str,
    /// The request target's path and query as received (before `strip`/`rewrite`).
    pub received: Option<&'a str>,
    pub client: std::net::SocketAddr,
    /// The client's address as text (IPv4-mapped addresses as IPv4).
    pub client_ip: &'a [u8],
    pub https: bool,
}

pub(crate) async fn serve(f: &FastCgi, req: Request<Body>, facts: &Facts<'_>) -> Response<Body> {
    let target = resolve::resolve(f.id, &f.cfg, facts.path);
    let (script_name, path_info, filename) = match &*target {
        Target::Script {
            script_name,
            path_info,
            filename,
        } => (script_name, path_info, filename),
        Target::Static(path) => {
            let head = req.method() == http::Method::HEAD;
            if req.method() != http::Method::GET && !head {
                let mut r = local_response(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed\n");
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
                return r;
            }
            return match crate::files::Opened::lookup(&f.cfg.root, path) {
                Ok(f) => crate::files::file(f, req.headers(), head).await,
                Err(crate::files::Unserved::Forbidden) => crate::files::forbidden(),
                Err(crate::files::Unserved::Absent) => crate::files::not_found(),
            };
        }
        Target::Redirect => return crate::files::slash_redirect(facts.folder, req.uri().query()),
        Target::NotFound => return crate::files::not_found(),
    };
    let (parts, body) = req.into_parts();
    // A declared length over the cap: 413 before anything reads the body, so before
    // `100 Continue` (DESIGN §14), as for `proxy`. Then the body, whole, under the cap:
    // FastCGI wants its exact length up front.
    let declared = http_body::Body::size_hint(&body).exact();
    if declared.is_some_and(|n| n > f.cfg.max_body) {
        return body_refused(
            f,
            spool::SpoolError::Body(BodyError::TooLarge(f.cfg.max_body)),
        );
    }
    // Held until the application has answered: the body is in the records or the file.
    let mut held = spool::Held::default();
    let body = match spool::collect(body, f.cfg.max_body, &mut held).await {
        Ok(b) => b,
        Err(e) => return body_refused(f, e),
    };
    let in_memory = match &body {
        spool::Spooled::Mem(b) => b.as_slice(),
        spool::Spooled::File(..) => &[],
    };
    let mut wire = Vec::with_capacity(1024 + in_memory.len() + in_memory.len() / 8);
    codec::begin_request(&mut wire);
    let mut params = codec::Params::new(&mut wire, PARAMS_CAP);
    variables(
        &mut params,
        &f.cfg,
        &parts,
        facts,
        script_name,
        path_info,
        filename,
        body.len() as usize,
    );
    if let Err(e) = params.finish() {
        tracing::info!("sluice: fastcgi {}: request refused: {e}", f.name);
        return local_response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "Request header fields too large\n",
        );
    }
    let file = match body {
        // Copied into the records, then let go: not held twice while the app runs.
        spool::Spooled::Mem(b) => {
            codec::stdin(&mut wire, &b);
            None
        }
        spool::Spooled::File(file, len) => Some((file, len)),
    };
    let is_head = parts.method == http::Method::HEAD;
    match exchange(f, &wire, file.as_ref().map(|(f, n)| (f, *n)), is_head).await {
        Ok(resp) => resp,
        Err(resp) => resp,
    }
}

/// The answer to a body that could not be read whole.
fn body_refused(f: &FastCgi, e: spool::SpoolError) -> Response<Body> {
    match e {
        spool::SpoolError::Body(BodyError::TooLarge(_)) => {
            crate::stats::bump(&crate::stats::COUNTERS.body_too_large);
            local_response(StatusCode::PAYLOAD_TOO_LARGE, "Request body too large\n")
        }
        spool::SpoolError::Body(e) => {
            tracing::debug!("sluice: fastcgi {}: request body failed: {e}", f.name);
            local_response(
                StatusCode::BAD_REQUEST,
                "Bad request: broken request body\n",
            )
        }
        spool::SpoolError::Budget => {
            crate::stats::bump(&crate::stats::COUNTERS.spool_full);
            tracing::warn!(
                "sluice: fastcgi {}: request bodies held at once would pass spool_max; answered 503",
                f.name
            );
            let mut r = local_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "Server busy, retry in a moment\n",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            r
        }
        spool::SpoolError::File(e) => {
            tracing::warn!(
                "sluice: fastcgi {}: cannot keep a request body in a temporary file in {}: {e}; answered 500",
                f.name,
                std::env::temp_dir().display()
            );
            local_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error: the request body could not be buffered\n",
            )
        }
    }
}

/// Sends the request on a pooled connection and reads the response head.
async fn exchange(
    f: &FastCgi,
    wire: &[u8],
    file: Option<(&std::fs::File, u64)>,
    is_head: bool,
) -> Result<Response<Body>, Response<Body>> {
    // A kept connection that took not one byte of the request: once more, on a fresh
    // one. Anything the application may have received is never sent again.
    let mut fresh_only = false;
    loop {
        let mut conn = acquire(f, fresh_only).await?;
        let reused = conn.reused;
        let ticket = Ticket {
            pool: &f.pool,
            id: f.pool.sent(),
        };
        let mut clock = Clock::start(f);
        // The write too may wait for a worker (a large body into a connection the
        // application has not accepted yet): the same stall rule and deadline apply.
        let mut sent = 0u64;
        let write = spool::write_request(&mut conn, wire, file, &mut sent);
        match clock.within(f, write).await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                if reused && !fresh_only && sent == 0 {
                    fresh_only = true;
                    continue;
                }
                return Err(broken(f, &format!("writing the request: {e}")));
            }
            None => return Err(timed_out(f)),
        }
        let mut state = Reader {
            conn: Some(conn),
            // As large as a read asks for, so the first read does not grow (and copy) it.
            buf: BytesMut::with_capacity(crate::http1::READ_CHUNK),
            decoder: Decoder::default(),
            stderr: Vec::new(),
            stderr_dropped: 0,
            pool: f.pool.clone(),
            name: f.name.clone(),
            body_done: false,
        };
        let (h, rest) = read_head(f, &mut state, &ticket, &mut clock).await?;
        return Ok(response(h, rest, state, is_head).await);
    }
}

/// A connection from the pool, or sluice's answer when none can be had.
async fn acquire(f: &FastCgi, fresh_only: bool) -> Result<pool::Conn, Response<Body>> {
    match f.pool.acquire(fresh_only).await {
        Ok(c) => Ok(c),
        Err(pool::AcquireError::Busy) => {
            tracing::warn!(
                "sluice: fastcgi {}: all {} connections busy for {:?}; answered 503",
                f.name,
                f.cfg.max_conns,
                f.cfg.connect_timeout
            );
            crate::stats::bump(&crate::stats::COUNTERS.limit_rejections);
            Err(local_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "Server busy, retry in a moment\n",
            ))
        }
        Err(pool::AcquireError::Dial(e)) => {
            tracing::warn!(
                "sluice: fastcgi {}: cannot connect to {}: {e}",
                f.name,
                f.cfg.text
            );
            crate::stats::bump(&crate::stats::COUNTERS.bad_gateway);
            Err(local_response(
                StatusCode::BAD_GATEWAY,
                "Bad gateway: the application could not be reached\n",
            ))
        }
    }
}

/// One exchange's clock: the `timeout` deadline for the response head, and the stall
/// point after which idle connections are let go once (the workers may all sit on
/// them).
struct Clock {
    deadline: tokio::time::Instant,
    stall: tokio::time::Instant,
    shed: bool,
}

impl Clock {
    fn start(f: &FastCgi) -> Clock {
        let now = tokio::time::Instant::from_std(crate::clock::coarse());
        Clock {
            deadline: now + f.cfg.timeout,
            stall: now + pool::STALL,
            shed: false,
        }
    }

    /// Lets the pool's idle connections go, once.
    fn shed(&mut self, f: &FastCgi) {
        if !self.shed {
            self.shed = true;
            f.pool.shed_idle();
        }
    }

    /// `work` to its end, shedding at the stall point; `None` past the deadline.
    async fn within<T>(
        &mut self,
        f: &FastCgi,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                // The work first: a write that completes at once arms no timer (in
                // random order, two times in three a clock was polled, and registered,
                // first).
                biased;
                r = &mut work => return Some(r),
                _ = tokio::time::sleep_until(self.stall), if !self.shed => self.shed(f),
                _ = tokio::time::sleep_until(self.deadline) => return None,
            }
        }
    }
}

/// The response head: STDOUT until its empty line, within `timeout`; with the STDOUT
/// bytes that followed it.
async fn read_head(
    f: &FastCgi,
    state: &mut Reader,
    ticket: &Ticket<'_>,
    clock: &mut Clock,
) -> Result<(head::Head, Bytes), Response<Body>> {
    let mut head_bytes = BytesMut::new();
    loop {
        if !clock.shed && head_bytes.is_empty() {
            // No first byte yet: if none comes soon, the workers may all sit on idle
            // connections; let those go.
            let first = tokio::time::timeout_at(clock.stall.min(clock.deadline), state.ready());
            if first.await.is_err() {
                clock.shed(f);
            }
        }
        let Ok(next) = tokio::time::timeout_at(clock.deadline, state.next()).await else {
            state.poison();
            return Err(timed_out(f));
        };
        // Something came back (or the connection closed): no longer waiting.
        ticket.answered();
        let why = match next {
            Ok(Some(Record::Stdout(b))) => {
                head_bytes.extend_from_slice(&b);
                // The head ends at a newline: parse again only when one arrives (or the
                // head outgrew its cap), not once per record.
                if !b.contains(&b'\n') && head_bytes.len() <= head::MAX_HEAD {
                    continue;
                }
                match head::parse(&head_bytes) {
                    Ok(Some((h, used))) => return Ok((h, head_bytes.split_off(used).freeze())),
                    Ok(None) => continue,
                    Err(e) => format!("invalid response head: {e}"),
                }
            }
            Ok(Some(Record::Stderr(_))) => unreachable!("kept by the reader"),
            // An application that ended without a head: the request went out whole and
            // may have run, so it is never sent again (DESIGN §17).
            Ok(Some(Record::End { .. })) | Ok(None) => {
                "the application ended without a response head".to_string()
            }
            Err(e) => e.to_string(),
        };
        state.poison();
        return Err(broken(f, &why));
    }
}

/// The response for a parsed head, its body streamed from the STDOUT records still to
/// come (read and dropped when the response has none, so the connection is reused).
async fn response(h: head::Head, rest: Bytes, state: Reader, is_head: bool) -> Response<Body> {
    let mut resp = Response::new(Body::Empty);
    *resp.status_mut() = h.status;
    *resp.headers_mut() = h.headers;
    crate::reply::drop_powered_by(resp.headers_mut());
    if !resp.headers().contains_key(header::DATE) {
        resp.headers_mut().insert(header::DATE, date());
    }
    let no_body =
        is_head || h.status == StatusCode::NO_CONTENT || h.status == StatusCode::NOT_MODIFIED;
    if let (Some(n), false) = (h.length, no_body) {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    let mut body = StdoutBody {
        first: (!rest.is_empty()).then_some(rest),
        reader: state,
        discard: no_body,
        left: h.length.filter(|_| !no_body),
    };
    if no_body {
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
        return resp;
    }
    *resp.body_mut() = Body::stream(body);
    resp
}

fn timed_out(f: &FastCgi) -> Response<Body> {
    crate::stats::bump(&crate::stats::COUNTERS.gateway_timeout);
    tracing::warn!(
        "sluice: fastcgi {}: {} sent no response head within {:?}; answered 504",
        f.name,
        f.cfg.text,
        f.cfg.timeout
    );
    local_response(StatusCode::GATEWAY_TIMEOUT, "Gateway timeout\n")
}

fn broken(f: &FastCgi, why: &str) -> Response<Body> {
    tracing::warn!(
        "sluice: fastcgi {}: {} {why}; answered 502",
        f.name,
        f.cfg.text
    );
    crate::stats::bump(&crate::stats::COUNTERS.bad_gateway);
    local_response(
        StatusCode::BAD_GATEWAY,
        "Bad gateway: the application's answer was broken\n",
    )
}

/// A request waiting for its first byte, as the pool counts it.
struct Ticket<'a> {
    pool: &'a Pool,
    id: u64,
}

impl Ticket<'_> {
    fn answered(&self) {
        self.pool.answered(self.id);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.pool.answered(self.id);
    }
}

/// Reads records off a connection; STDERR is kept aside for the log.
struct Reader {
    conn: Option<Conn>,
    buf: BytesMut,
    decoder: Decoder,
    stderr: Vec<u8>,
    stderr_dropped: usize,
    pool: Arc<Pool>,
    name: String,
    body_done: bool,
}

impl Reader {
    /// Resolves once the connection has something to read (or closed); reads nothing.
    async fn ready(&mut self) {
        if !self.buf.is_empty() {
            return;
        }
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        std::future::poll_fn(|cx| conn.poll_ready(cx)).await;
    }

    /// The next STDOUT piece or the END_REQUEST; `Ok(None)` when the connection closed.
    async fn next(&mut self) -> Result<Option<Record>, String> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Record>, String>> {
        loop {
            match self.decoder.decode(&mut self.buf) {
                Ok(Some(Record::Stderr(b))) => {
                    let room = STDERR_CAP.saturating_sub(self.stderr.len());
                    self.stderr.extend_from_slice(&b[..b.len().min(room)]);
                    self.stderr_dropped += b.len().saturating_sub(room);
                    continue;
                }
                Ok(Some(r)) => return Poll::Ready(Ok(Some(r))),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(format!("invalid record: {e}"))),
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(Ok(None));
            };
            match conn.poll_read_buf(cx, &mut self.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(None)),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(format!("reading: {e}"))),
            }
        }
    }

    /// The connection cannot be trusted for another request: closed.
    fn poison(&mut self) {
        self.conn = None;
    }

    /// END_REQUEST came cleanly: the connection goes back to the pool.
    fn finish(&mut self, protocol_status: u8) {
        self.body_done = true;
        if let Some(conn) = self.conn.take() {
            if protocol_status == 0 && self.buf.is_empty() && self.decoder.is_idle() {
                self.pool.release(conn);
            }
        }
    }

    fn log_stderr(&mut self) {
        if self.stderr.is_empty() {
            return;
        }
        let text = escape(&self.stderr);
        let more = if self.stderr_dropped > 0 {
            format!(" (+{} bytes not logged)", self.stderr_dropped)
        } else {
            String::new()
        };
        tracing::warn!("sluice: fastcgi {}: stderr: {text}{more}", self.name);
        self.stderr.clear();
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.log_stderr();
    }
}

/// Control characters (newlines included) escaped, so one log line stays one line.
fn escape(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let mut out = String::with_capacity(s.len());
    for c in s.trim_end().chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The response body: what STDOUT carries after the head, until END_REQUEST.
struct StdoutBody {
    first: Option<Bytes>,
    reader: Reader,
    discard: bool,
    /// What the application's `Content-Length` says is still to come: more, or an end
    /// before it, is a broken answer (the client's connection is cut, never a body of
    /// another length than the one announced).
    left: Option<u64>,
}

impl StdoutBody {
    /// `b`, counted against the declared length.
    fn counted(&mut self, b: Bytes) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(left) = &mut self.left {
            match left.checked_sub(b.len() as u64) {
                Some(l) => *left = l,
                None => return self.length_broken("more bytes than its Content-Length"),
            }
        }
        Poll::Ready(Some(Ok(Frame::data(b))))
    }

    fn length_broken(&mut self, what: &str) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.reader.poison();
        tracing::warn!(
            "sluice: fastcgi {}: the application sent {what}; the response was cut off",
            self.reader.name
        );
        Poll::Ready(Some(Err(BodyError::Backend(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the application's body disagrees with its Content-Length",
        )))))
    }
}

impl http_body::Body for StdoutBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(b) = this.first.take() {
            if !this.discard {
                return this.counted(b);
            }
        }
        loop {
            if this.reader.body_done {
                return Poll::Ready(None);
            }
            match this.reader.poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Some(Record::Stdout(b)))) => {
                    if this.discard || b.is_empty() {
                        continue;
                    }
                    return this.counted(b);
                }
                Poll::Ready(Ok(Some(Record::End {
                    protocol_status, ..
                }))) => {
                    if this.left.is_some_and(|l| l > 0) {
                        return this.length_broken("fewer bytes than its Content-Length");
                    }
                    this.reader.finish(protocol_status);
                    this.reader.log_stderr();
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(Some(Record::Stderr(_)))) => continue,
                Poll::Ready(Ok(None)) => {
                    this.reader.poison();
                    return Poll::Ready(Some(Err(BodyError::Backend(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the application closed the connection mid-response",
                    )))));
                }
                Poll::Ready(Err(e)) => {
                    this.reader.poison();
                    tracing::warn!("sluice: fastcgi {}: {e}", this.reader.name);
                    return Poll::Ready(Some(Err(BodyError::Backend(std::io::Error::other(e)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reader.body_done
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            // What is left includes the first piece, not counted yet.
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// The CGI variables for one request, written straight into its PARAMS records.
#[allow(clippy::too_many_arguments)]
fn variables(
    p: &mut codec::Params<'_>,
    cfg: &FastCgiConfig,
    parts: &http::request::Parts,
    facts: &Facts<'_>,
    script_name: &str,
    path_info: &str,
    filename: &Path,
    content_length: usize,
) {
    use std::os::unix::ffi::OsStrExt;
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let (server_name, port) = split_host(host);
    let port = port.unwrap_or(if facts.https { "443" } else { "80" });
    let request_uri = facts
        .received
        .unwrap_or_else(|| parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    let mut set = |n: &str, val: &[u8]| p.pair(&[n.as_bytes()], &[val]);
    set("GATEWAY_INTERFACE", b"CGI/1.1");
    set("SERVER_SOFTWARE", b"sluice");
    set("SERVER_PROTOCOL", protocol(parts.version));
    set("SERVER_NAME", server_name.as_bytes());
    p.last_mut().1.make_ascii_lowercase();
    let mut set = |n: &str, val: &[u8]| p.pair(&[n.as_bytes()], &[val]);
    set("SERVER_PORT", port.as_bytes());
    set("REQUEST_METHOD", parts.method.as_str().as_bytes());
    set("REQUEST_URI", request_uri.as_bytes());
    set(
        "REQUEST_SCHEME",
        if facts.https { b"https" } else { b"http" },
    );
    set("QUERY_STRING", parts.uri.query().unwrap_or("").as_bytes());
    set("SCRIPT_FILENAME", filename.as_os_str().as_bytes());
    set("PATH_INFO", path_info.as_bytes());
    set("DOCUMENT_ROOT", cfg.root.as_os_str().as_bytes());
    // The client's view: a prefix `strip` took off comes back in front of the script,
    // so an application under /php/ builds its links from SCRIPT_NAME and REQUEST_URI
    // alike; SCRIPT_FILENAME stays under `root`.
    let mount = facts
        .folder
        .strip_suffix(facts.path)
        .unwrap_or("")
        .as_bytes();
    p.pair(&[b"SCRIPT_NAME"], &[mount, script_name.as_bytes()]);
    p.pair(
        &[b"DOCUMENT_URI"],
        &[mount, script_name.as_bytes(), path_info.as_bytes()],
    );
    // The address as the connection rendered it once; numbers on the stack.
    let mut set = |n: &str, val: &[u8]| p.pair(&[n.as_bytes()], &[val]);
    set("REMOTE_ADDR", facts.client_ip);
    let mut buf = [0u8; 20];
    let digits = crate::http1::encode::itoa_u64(&mut buf, facts.client.port().into());
    set("REMOTE_PORT", digits);
    let digits = crate::http1::encode::itoa_u64(&mut buf, content_length as u64);
    set("CONTENT_LENGTH", digits);
    set("REDIRECT_STATUS", b"200");
    match parts.headers.get(header::CONTENT_TYPE) {
        Some(ct) => set("CONTENT_TYPE", ct.as_bytes()),
        None => set("CONTENT_TYPE", b""),
    }
    if facts.https {
        set("HTTPS", b"on");
    }
    for (name, value) in &cfg.env {
        set(name, value.as_bytes());
    }
    http_variables(&parts.headers, p);
}

/// `SERVER_PROTOCOL`'s value.
fn protocol(v: http::Version) -> &'static [u8] {
    match v {
        http::Version::HTTP_09 => b"HTTP/0.9",
        http::Version::HTTP_10 => b"HTTP/1.0",
        http::Version::HTTP_2 => b"HTTP/2.0",
        http::Version::HTTP_3 => b"HTTP/3.0",
        _ => b"HTTP/1.1",
    }
}

/// The request's header fields as `HTTP_*` variables: names with `_` are skipped (one
/// could pose as another), `Proxy` never becomes HTTP_PROXY (httpoxy), and the two
/// that have CGI variables of their own are not repeated. Repeated fields join with
/// `, ` (`Cookie` with `; `).
fn http_variables(headers: &http::HeaderMap, p: &mut codec::Params<'_>) {
    for name in headers.keys() {
        let n = name.as_str();
        if n.contains('_')
            || n == "proxy"
            || name == header::CONTENT_TYPE
            || name == header::CONTENT_LENGTH
        {
            continue;
        }
        let mut values = headers.get_all(name).iter();
        let Some(first) = values.next() else {
            continue;
        };
        let var: [&[u8]; 2] = [b"HTTP_", n.as_bytes()];
        match values.next() {
            None => p.pair(&var, &[first.as_bytes()]),
            Some(second) => {
                let sep: &[u8] = if name == header::COOKIE { b"; " } else { b", " };
                let mut pieces = vec![first.as_bytes(), sep, second.as_bytes()];
                for v in values {
                    pieces.extend_from_slice(&[sep, v.as_bytes()]);
                }
                p.pair(&var, &pieces);
            }
        }
        // Header names are lower-case tokens: upper-cased, `-` as `_`.
        for b in p.last_mut().0 {
            *b = match *b {
                b'-' => b'_',
                c => c.to_ascii_uppercase(),
            };
        }
    }
}

fn split_host(host: &str) -> (&str, Option<&str>) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (ip, tail.strip_prefix(':')),
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty() => (h, Some(p)),
        _ => (host, None),
    }
}

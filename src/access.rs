//! The access log: one line a response — a JSON object (`time`, `client`, `host`,
//! `method`, `protocol`, `path`, `status`, `bytes`, `duration_ms`, `pool`, `peer`,
//! `attempts`, `role`, `transition`, `upstream_ms`, `user_agent`, `referer`,
//! `request_id`, `tls`), sluice's text line, Apache's Combined or Common Log Format, or
//! the operator's template — to stdout, stderr or a file.
//!
//! Never blocks the request path, and allocates nothing per line in the steady state:
//! each thread formats its lines into a buffer of its own (one uncontended lock), which
//! the writer thread takes whole every 10 ms and writes in one go; a buffer the writer
//! has not taken past 4 MiB drops lines, counted. SIGUSR1 reopens the file (log
//! rotation) before the next batch. Lines are formatted by hand (no JSON tree per line).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use crate::clock::rfc3339;
use crate::config::template::{LogField, LogPart, LogTemplate};
use crate::config::{AccessFormat, AccessLogConfig, LogTarget};

/// A thread's lines waiting for the writer, at most (bytes): past it lines are dropped.
const MAX_BATCH: usize = 4 << 20;
/// How long the writer sleeps when it has caught up: the most a line waits.
const LAG: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Default)]
struct Flags {
    /// SIGUSR1: reopen the file before the next line.
    reopen: AtomicBool,
    /// Shutting down: write what is queued and stop.
    closing: AtomicBool,
}

/// Lines dropped because the writer fell behind, since start.
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);

/// One response, as the log records it.
pub(crate) struct Entry<'a> {
    pub time: SystemTime,
    pub client: &'a str,
    /// The request's fields as sent (bytes: escaped where a format must, never
    /// validated first).
    pub host: &'a [u8],
    pub method: &'a str,
    /// Path and query as received.
    pub path: &'a str,
    pub status: u16,
    pub bytes: u64,
    pub duration_ms: u64,
    pub protocol: &'static str,
    pub pool: Option<&'a str>,
    pub peer: Option<&'a str>,
    pub attempts: u32,
    pub role: Option<&'static str>,
    pub transition: Option<&'static str>,
    pub user_agent: Option<&'a [u8]>,
    pub referer: Option<&'a [u8]>,
    /// The user a Basic `Authorization` names (as Apache's `%u`: claimed, so shown
    /// on a `401` too).
    pub user: Option<&'a str>,
    /// The `request_id` filter's id.
    pub request_id: Option<&'a [u8]>,
    /// A gRPC call's `grpc-status` (DESIGN §18.5).
    pub grpc_status: Option<u8>,
    /// The TLS version, over TLS.
    pub tls: Option<&'static str>,
    /// From the proxy's first dial to the response head (or its failure).
    pub upstream_ms: Option<u64>,
    pub scheme: &'static str,
    /// The request headers a template asks for, in its order.
    pub headers: &'a [Option<http::HeaderValue>],
}

/// A request the access log will record once its response is done: what it needs of
/// the request, taken before the request is dispatched. Every request gets exactly one
/// line (DESIGN §18.4): one dropped before its line was written (the client closed the
/// connection or reset the stream before the answer) is written then, as `499`.
pub(crate) struct Pending {
    /// The client's address, as its line names it.
    client: http::HeaderValue,
    /// The line was written (or, [`Pending::forget`], is not to be).
    logged: bool,
    log: Arc<AccessLog>,
    /// When the head was read: the start of the line's duration (its wall-clock time
    /// is worked out at the end, so a request reads the clock once at each end).
    start: Instant,
    method: http::Method,
    path: Option<http::uri::PathAndQuery>,
    host: Option<http::HeaderValue>,
    user_agent: Option<http::HeaderValue>,
    referer: Option<http::HeaderValue>,
    user: Option<String>,
    protocol: &'static str,
    tls: Option<&'static str>,
    scheme: &'static str,
    /// What a template's `{header.NAME}` parts show.
    headers: Vec<Option<http::HeaderValue>>,
}

/// What a response carries for its line besides its status, marked on it by whoever
/// knew (a response without extensions costs one test): the `request_id` filter's id,
/// and a gRPC call's end.
#[derive(Default)]
pub(crate) struct Marks {
    pub request_id: Option<http::HeaderValue>,
    pub grpc: Option<Arc<crate::grpc::Call>>,
    /// The response's site has an `access_log` of its own.
    pub site: Option<SiteLine>,
    /// The `sub` of the token a `jwt` filter verified.
    pub user: Option<Arc<str>>,
}

impl Marks {
    pub(crate) fn of<B>(resp: &http::Response<B>) -> Marks {
        let ext = resp.extensions();
        Marks {
            request_id: ext
                .get::<crate::filter::request_id::Logged>()
                .map(|l| l.0.clone()),
            grpc: ext.get::<Arc<crate::grpc::Call>>().cloned(),
            site: ext.get::<SiteLine>().cloned(),
            user: ext
                .get::<crate::filter::jwt::Subject>()
                .map(|s| s.0.clone()),
        }
    }
}

/// A site's own `access_log` (`None`: `off`), as the generation holds it.
pub(crate) struct SiteLog(pub Option<Arc<AccessLog>>);

/// A request's fields as a line reads them: its map, or its fields as they came (an
/// HTTP/1 request whose map was never built, `http1::fields`).
#[derive(Clone, Copy)]
pub(crate) enum Seen<'a> {
    Map(&'a http::HeaderMap),
    Kept(&'a crate::http1::fields::Fields),
}

impl<'a> Seen<'a> {
    /// A request's fields as they came when they were kept (`fields`), else its map.
    pub(crate) fn of(
        headers: &'a http::HeaderMap,
        fields: Option<&'a crate::http1::fields::Fields>,
    ) -> Seen<'a> {
        fields.map_or(Seen::Map(headers), Seen::Kept)
    }

    /// The first value of `name`.
    fn get(self, name: &http::HeaderName) -> Option<http::HeaderValue> {
        match self {
            Seen::Map(h) => h.get(name).cloned(),
            Seen::Kept(f) => f.value(name.as_str().as_bytes()),
        }
    }

    /// The first `Host`, `User-Agent`, `Referer` and `Authorization`, in one pass
    /// over the fields, not a lookup each.
    fn firsts(self) -> [Option<http::HeaderValue>; 4] {
        use http::header;
        match self {
            Seen::Kept(f) => f.firsts([b"host", b"user-agent", b"referer", b"authorization"]),
            Seen::Map(h) => {
                let mut out = [const { None }; 4];
                for (name, value) in h {
                    let slot = if name == header::HOST {
                        0
                    } else if name == header::USER_AGENT {
                        1
                    } else if name == header::REFERER {
                        2
                    } else if name == header::AUTHORIZATION {
                        3
                    } else {
                        continue;
                    };
                    if out[slot].is_none() {
                        out[slot] = Some(value.clone());
                    }
                }
                out
            }
        }
    }
}

/// Where a site's response is logged: its own log, with the request fields its
/// template asks for (taken when the site was found), or nowhere.
#[derive(Clone)]
pub(crate) struct SiteLine {
    log: Option<Arc<AccessLog>>,
    headers: Arc<[Option<http::HeaderValue>]>,
}

impl SiteLog {
    /// The line's destination for a request of the site with these fields.
    pub(crate) fn line(&self, headers: Seen<'_>) -> SiteLine {
        let asked = match self.0.as_ref().map(|l| &l.config.format) {
            Some(AccessFormat::Template(t)) => t.headers.iter().map(|h| headers.get(h)).collect(),
            _ => Arc::from([]),
        };
        SiteLine {
            log: self.0.clone(),
            headers: asked,
        }
    }
}

/// What a line needs of the connection.
#[derive(Clone, Copy)]
pub(crate) struct Client<'a> {
    /// The client's address as text.
    pub ip: &'a http::HeaderValue,
    /// The TLS version, over TLS.
    pub tls: Option<&'static str>,
    pub scheme: &'static str,
}

/// Who served a response (or, for a 502/504, the last peer dialed), for its line.
#[derive(Clone, Copy)]
pub(crate) struct Upstream<'a> {
    pub pool: &'a str,
    pub peer: &'a str,
    pub attempts: u32,
    /// `primary` or `backup`, as `X-Sluice-Origin` says.
    pub role: &'static str,
    /// As `X-Sluice-Origin-Transition` says.
    pub transition: &'static str,
    pub upstream: Option<std::time::Duration>,
}

impl<'a> From<&'a crate::upstream::Served> for Upstream<'a> {
    fn from(s: &'a crate::upstream::Served) -> Upstream<'a> {
        Upstream {
            pool: s.pool_name(),
            peer: s.peer_address(),
            attempts: s.attempts,
            role: s.role,
            transition: s.transition,
            upstream: s.upstream,
        }
    }
}

/// How the access log names a request's protocol.
pub(crate) fn protocol(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

impl Pending {
    /// A line begun for `req`, a whole request (an HTTP/2 or HTTP/3 stream's).
    pub(crate) fn of<B>(
        log: Arc<AccessLog>,
        req: &http::Request<B>,
        client: Client<'_>,
        started: Option<Instant>,
    ) -> Pending {
        let (method, uri, headers) = (req.method(), req.uri(), Seen::Map(req.headers()));
        Pending::new(log, method, uri, headers, req.version(), client, started)
    }

    pub(crate) fn new(
        log: Arc<AccessLog>,
        method: &http::Method,
        uri: &http::Uri,
        headers: Seen<'_>,
        version: http::Version,
        client: Client<'_>,
        started: Option<Instant>,
    ) -> Pending {
        // A site's own log may be Apache's: the user is taken whenever one is named.
        let asked = match &log.config.format {
            AccessFormat::Template(t) => t.headers.iter().map(|h| headers.get(h)).collect(),
            _ => Vec::new(),
        };
        let [host, user_agent, referer, auth] = headers.firsts();
        Pending {
            client: client.ip.clone(),
            logged: false,
            tls: client.tls,
            scheme: client.scheme,
            headers: asked,
            start: started.unwrap_or_else(Instant::now),
            method: method.clone(),
            path: uri.path_and_query().cloned(),
            host,
            user_agent,
            referer,
            user: auth.as_ref().and_then(basic_user),
            protocol: protocol(version),
            log,
        }
    }

    /// No line for this request: it was not one (an HTTP/2 stream sent back to be
    /// retried over HTTP/1.1).
    pub(crate) fn forget(mut self) {
        self.logged = true;
    }

    /// Writes the line.
    pub(crate) fn finish(
        &mut self,
        status: u16,
        bytes: u64,
        upstream: Option<Upstream<'_>>,
        marks: Option<&Marks>,
        done: Instant,
    ) {
        self.logged = true;
        let (log, headers) = match marks.and_then(|m| m.site.as_ref()) {
            Some(SiteLine { log: None, .. }) => return,
            Some(SiteLine {
                log: Some(l),
                headers,
            }) => (l, &headers[..]),
            None => (&self.log, &self.headers[..]),
        };
        if log.discard {
            return;
        }
        let took = done.saturating_duration_since(self.start);
        log.record(&Entry {
            time: SystemTime::now() - took,
            client: self.client.to_str().unwrap_or(""),
            host: self.host.as_ref().map_or(&b""[..], |h| h.as_bytes()),
            method: self.method.as_str(),
            path: self.path.as_ref().map_or("/", |pq| pq.as_str()),
            status,
            bytes,
            duration_ms: took.as_millis() as u64,
            protocol: self.protocol,
            pool: upstream.map(|u| u.pool),
            peer: upstream.map(|u| u.peer),
            attempts: upstream.map_or(0, |u| u.attempts),
            role: upstream.map(|u| u.role),
            transition: upstream.map(|u| u.transition),
            user_agent: self.user_agent.as_ref().map(|v| v.as_bytes()),
            referer: self.referer.as_ref().map(|v| v.as_bytes()),
            user: marks
                .and_then(|m| m.user.as_deref())
                .or(self.user.as_deref()),
            request_id: marks
                .and_then(|m| m.request_id.as_ref())
                .map(|v| v.as_bytes()),
            grpc_status: marks.and_then(|m| m.grpc.as_ref()).and_then(|c| c.status()),
            tls: self.tls,
            upstream_ms: upstream
                .and_then(|u| u.upstream)
                .map(|d| d.as_millis() as u64),
            scheme: self.scheme,
            headers,
        });
    }
}

impl Drop for Pending {
    /// The client gave up before the answer: `499`, nginx's "client closed request",
    /// with what was sent (nothing).
    fn drop(&mut self) {
        if !self.logged {
            self.finish(499, 0, None, None, Instant::now());
        }
    }
}

/// The user name of a Basic `Authorization` value, if it is one (the filter's own
/// reading of the header).
fn basic_user(v: &http::HeaderValue) -> Option<String> {
    crate::filter::basic_auth::credentials(v)
        .map(|(user, _)| user)
        .filter(|u| !u.is_empty())
}

pub(crate) struct AccessLog {
    pub config: AccessLogConfig,
    /// Writes nothing: the connections' log when only sites have their own (so each
    /// request still gets a line begun, for its site's log).
    pub discard: bool,
    /// Tells this log's per-thread buffers from another's (a reload may start one).
    id: u64,
    shared: Arc<Shared>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the request threads and the writer share.
#[derive(Default)]
struct Shared {
    flags: Flags,
    /// Every thread's buffer of lines not yet written.
    batches: Mutex<Vec<Batch>>,
}

/// One thread's lines for one log, formatted in place and taken whole by the writer.
type Batch = Arc<Mutex<Vec<u8>>>;

thread_local! {
    /// This thread's buffer, with the id of the log it belongs to.
    static BATCH: std::cell::RefCell<Option<(u64, Batch)>> = const { std::cell::RefCell::new(None) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl AccessLog {
    /// Starts the writer thread.
    pub(crate) fn start(config: AccessLogConfig) -> std::io::Result<Arc<AccessLog>> {
        if let LogTarget::File(path) = &config.target {
            // Fail at load, not at the first line, when the file cannot be opened.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
        }
        let shared = Arc::new(Shared::default());
        let (target, sh) = (config.target.clone(), shared.clone());
        let writer = std::thread::Builder::new()
            .name("sluice-access-log".into())
            .spawn(move || write(target, &sh))?;
        Ok(Arc::new(AccessLog {
            config,
            discard: false,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shared,
            writer: std::sync::Mutex::new(Some(writer)),
        }))
    }

    /// A log that writes nothing (no thread).
    pub(crate) fn discard() -> Arc<AccessLog> {
        Arc::new(AccessLog {
            config: AccessLogConfig {
                target: LogTarget::Stderr,
                format: AccessFormat::Json,
            },
            discard: true,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shared: Arc::default(),
            writer: std::sync::Mutex::new(None),
        })
    }

    /// Checks that `config`'s file can be opened (before a reload commits to it).
    pub(crate) fn check(config: &AccessLogConfig) -> std::io::Result<()> {
        if let LogTarget::File(path) = &config.target {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }

    /// Formats a line into this thread's buffer; drops it (counted) when the buffer is
    /// full because the writer is behind.
    pub(crate) fn record(&self, e: &Entry<'_>) {
        BATCH.with(|b| {
            let mut b = b.borrow_mut();
            if !matches!(&*b, Some((id, _)) if *id == self.id) {
                let batch = Batch::default();
                lock(&self.shared.batches).push(batch.clone());
                *b = Some((self.id, batch));
            }
            let Some((_, batch)) = b.as_ref() else {
                return;
            };
            let mut buf = lock(batch);
            if buf.len() >= MAX_BATCH {
                DROPPED.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let mut line = Line(std::mem::take(&mut *buf));
            match &self.config.format {
                AccessFormat::Json => json(&mut line, e),
                AccessFormat::Text => text(&mut line, e),
                AccessFormat::Combined => apache(&mut line, e, true),
                AccessFormat::Common => apache(&mut line, e, false),
                AccessFormat::Template(t) => template(&mut line, t, e),
            }
            *buf = line.0;
        });
    }

    /// Reopens the file (after rotation) before the next line; nothing for stdout and
    /// stderr.
    pub(crate) fn reopen(&self) {
        self.shared.flags.reopen.store(true, Ordering::Relaxed);
    }

    /// Writes what is buffered and stops the writer (at shutdown), waiting for it.
    pub(crate) fn close(&self) {
        self.shared.flags.closing.store(true, Ordering::Relaxed);
        let writer = lock(&self.writer).take();
        if let Some(w) = writer {
            let _ = w.join();
        }
    }
}

impl Drop for AccessLog {
    /// The last holder let go (a reload replaced it, and the requests that began a
    /// line on it are done): the writer writes what is queued and ends.
    fn drop(&mut self) {
        self.shared.flags.closing.store(true, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn json(s: &mut Line, e: &Entry<'_>) {
    // Room for the fixed keys and the usual values: one allocation, no regrowth.
    let variable = e.path.len()
        + e.host.len()
        + e.user_agent.map_or(0, <[u8]>::len)
        + e.referer.map_or(0, <[u8]>::len)
        + e.pool.map_or(0, str::len);
    s.0.reserve(384 + variable);
    s.push_str("{\"time\":\"");
    timestamp(s, e.time);
    // The client is an address sluice wrote and the method a token (RFC 9110: no `"`,
    // `\` or control byte): neither needs escaping.
    s.push_str("\",\"client\":\"");
    s.push_str(e.client);
    s.push_str("\",\"host\":");
    string(s, e.host);
    s.push_str(",\"method\":\"");
    s.push_str(e.method);
    s.push_str("\",\"protocol\":\"");
    s.push_str(e.protocol);
    s.push('"');
    s.push_str(",\"path\":");
    string(s, e.path);
    s.push_str(",\"status\":");
    number(s, u64::from(e.status));
    s.push_str(",\"bytes\":");
    number(s, e.bytes);
    s.push_str(",\"duration_ms\":");
    number(s, e.duration_ms);
    s.push_str(",\"pool\":");
    match e.pool {
        Some(p) => string(s, p),
        None => s.push_str("null"),
    }
    s.push_str(",\"peer\":");
    match e.peer {
        Some(p) => string(s, p),
        None => s.push_str("null"),
    }
    s.push_str(",\"attempts\":");
    number(s, u64::from(e.attempts));
    s.push_str(",\"upstream_ms\":");
    match e.upstream_ms {
        Some(n) => number(s, n),
        None => s.push_str("null"),
    }
    for (key, v) in [
        (",\"user_agent\":", e.user_agent),
        (",\"referer\":", e.referer),
        (",\"request_id\":", e.request_id),
        (",\"tls\":", e.tls.map(str::as_bytes)),
    ] {
        s.push_str(key);
        match v {
            Some(v) => string(s, v),
            None => s.push_str("null"),
        }
    }
    for (key, v) in [(",\"role\":", e.role), (",\"transition\":", e.transition)] {
        s.push_str(key);
        match v {
            Some(v) => {
                s.push('"');
                s.push_str(v);
                s.push('"');
            }
            None => s.push_str("null"),
        }
    }
    json_tail(s, e);
}

/// The fields a JSON line has only when they are known.
fn json_tail(s: &mut Line, e: &Entry<'_>) {
    if let Some(u) = e.user {
        // A `jwt` token's subject, a Basic user.
        s.push_str(",\"user\":");
        string(s, u.as_bytes());
    }
    if let Some(code) = e.grpc_status {
        // Only on a gRPC call's line.
        s.push_str(",\"grpc_status\":");
        number(s, u64::from(code));
    }
    s.push_str("}\n");
}

fn text(s: &mut Line, e: &Entry<'_>) {
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let quoted = |v: Option<&[u8]>| {
        let mut out = Line::with_capacity(v.map_or(1, <[u8]>::len));
        match v {
            Some(v) => escaped(&mut out, v),
            None => out.push('-'),
        }
        String::from_utf8(out.0).unwrap_or_default()
    };
    let line = format!(
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" {} {} {} {}ms {} \"{}\" \"{}\" \"{}\" {}\n",
        e.client,
        rfc3339(e.time),
        e.method,
        quote(e.path),
        e.protocol,
        e.status,
        e.bytes,
        quoted(Some(e.host)),
        e.pool
            .map(quote)
            .unwrap_or_else(|| "-".into())
            .replace(' ', "_"),
        e.peer.unwrap_or("-"),
        e.attempts,
        e.duration_ms,
        e.upstream_ms
            .map_or_else(|| "-".to_string(), |n| format!("{n}ms")),
        quoted(e.referer),
        quoted(e.user_agent),
        quoted(e.request_id),
        e.tls.unwrap_or("-"),
    );
    s.push_str(&line);
    if let Some(code) = e.grpc_status {
        // Only on a gRPC call's line: ` grpc=N` before its end.
        s.0.pop();
        s.push_str(&format!(" grpc={code}\n"));
    }
}

/// The operator's template: each value escaped as in Apache's formats, `-` for one
/// that is absent.
fn template(s: &mut Line, t: &LogTemplate, e: &Entry<'_>) {
    s.0.reserve(128 + e.path.len());
    let (path, query) = match e.path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (e.path, None),
    };
    let text = |s: &mut Line, v: Option<&[u8]>| match v {
        Some(v) if !v.is_empty() => escaped(s, v),
        _ => s.push('-'),
    };
    for part in &t.parts {
        match part {
            LogPart::Text(t) => s.push_str(t),
            LogPart::Header(i) => {
                let v = e.headers.get(*i).and_then(|v| v.as_ref());
                text(s, v.map(|v| v.as_bytes()));
            }
            LogPart::Field(f) => match f {
                LogField::Host => text(s, Some(e.host)),
                LogField::Path => text(s, Some(path.as_bytes())),
                LogField::Query => text(s, query.map(str::as_bytes)),
                LogField::Uri => text(s, Some(e.path.as_bytes())),
                LogField::ClientIp => text(s, Some(e.client.as_bytes())),
                LogField::Scheme => s.push_str(e.scheme),
                LogField::Method => text(s, Some(e.method.as_bytes())),
                LogField::Status => number(s, u64::from(e.status)),
                LogField::Bytes => number(s, e.bytes),
                LogField::DurationMs => number(s, e.duration_ms),
                LogField::Pool => text(s, e.pool.map(str::as_bytes)),
                LogField::Peer => text(s, e.peer.map(str::as_bytes)),
                LogField::Attempts => number(s, u64::from(e.attempts)),
                LogField::Protocol => s.push_str(e.protocol),
                LogField::RequestId => text(s, e.request_id),
                LogField::Tls => text(s, e.tls.map(str::as_bytes)),
                LogField::UpstreamMs => match e.upstream_ms {
                    Some(n) => number(s, n),
                    None => s.push('-'),
                },
                LogField::Time => timestamp(s, e.time),
                LogField::GrpcStatus => match e.grpc_status {
                    Some(n) => number(s, u64::from(n)),
                    None => s.push('-'),
                },
            },
        }
    }
    s.push('\n');
}

/// Apache's Common Log Format (`%h %l %u %t "%r" %>s %b`), and with `combined` its
/// Combined (`… "%{Referer}i" "%{User-agent}i"`): `-` for what is absent and for an
/// empty body, the time in UTC, quoted values escaped (`"` as `\"`, control bytes as
/// `\xNN`).
fn apache(s: &mut Line, e: &Entry<'_>, combined: bool) {
    s.0.reserve(160 + e.path.len());
    s.push_str(e.client);
    s.push_str(" - ");
    match e.user {
        Some(u) => escaped(s, u),
        None => s.push('-'),
    }
    s.push_str(" [");
    s.push_str(&httpdate_clf(e.time));
    s.push_str("] \"");
    escaped(s, e.method);
    s.push(' ');
    escaped(s, e.path);
    s.push(' ');
    s.push_str(e.protocol);
    s.push_str("\" ");
    number(s, u64::from(e.status));
    s.push(' ');
    match e.bytes {
        0 => s.push('-'),
        n => number(s, n),
    }
    if combined {
        for v in [e.referer, e.user_agent] {
            s.push_str(" \"");
            match v {
                Some(v) => escaped(s, v),
                None => s.push('-'),
            }
            s.push('"');
        }
    }
    s.push('\n');
}

/// `v` with `"` and `\` backslash-escaped and bytes outside printable ASCII as `\xNN`.
fn escaped(out: &mut Line, v: impl AsRef<[u8]>) {
    for &b in v.as_ref() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
}

/// `10/Oct/2000:13:55:36 +0000`: the Common Log Format's time, in UTC.
fn httpdate_clf(t: SystemTime) -> String {
    // RFC 3339 `2000-10-10T13:55:36.000Z` re-ordered.
    let r = rfc3339(t);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = r[5..7]
        .parse::<usize>()
        .map_or("Jan", |m| MONTHS[(m + 11) % 12]);
    format!("{}/{month}/{}:{} +0000", &r[8..10], &r[0..4], &r[11..19])
}

/// `e.time` in RFC 3339 with milliseconds; the date and time of day are formatted
/// once a second per thread.
fn timestamp(out: &mut Line, t: SystemTime) {
    use std::cell::RefCell;
    thread_local! {
        static CACHE: RefCell<(u64, [u8; 19])> = const { RefCell::new((u64::MAX, [0; 19])) };
    }
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != d.as_secs() {
            let full = rfc3339(t);
            c.1.copy_from_slice(&full.as_bytes()[..19]);
            c.0 = d.as_secs();
        }
        out.0.extend_from_slice(&c.1);
    });
    let ms = d.subsec_millis();
    let digit = |n: u32| b'0' + (n % 10) as u8;
    out.0
        .extend_from_slice(&[b'.', digit(ms / 100), digit(ms / 10), digit(ms), b'Z']);
}

/// A log line being written: bytes (every formatter writes UTF-8), so numbers and
/// plain runs are appended without a validation per piece.
struct Line(Vec<u8>);

impl Line {
    fn with_capacity(n: usize) -> Line {
        Line(Vec::with_capacity(n))
    }

    fn push_str(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }

    fn push(&mut self, c: char) {
        if c.is_ascii() {
            self.0.push(c as u8);
        } else {
            let mut b = [0; 4];
            self.0.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
        }
    }
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

/// A JSON string: quotes, backslashes and control characters escaped, UTF-8 copied,
/// any other byte (a field that is not UTF-8) as the `\u00XX` of its Latin-1 reading;
/// whole runs of plain ASCII copied at once.
fn string(out: &mut Line, v: impl AsRef<[u8]>) {
    let v = v.as_ref();
    out.0.reserve(v.len() + 2);
    out.0.push(b'"');
    let mut rest = v;
    loop {
        let k = plain_run(rest);
        out.0.extend_from_slice(&rest[..k]);
        let Some(&b) = rest.get(k) else {
            break;
        };
        let used = match b {
            b'"' => {
                out.push_str("\\\"");
                1
            }
            b'\\' => {
                out.push_str("\\\\");
                1
            }
            0x80.. => match utf8_char(&rest[k..]) {
                Some(w) => {
                    out.0.extend_from_slice(&rest[k..k + w]);
                    w
                }
                None => {
                    let _ = std::fmt::Write::write_fmt(out, format_args!("\\u{b:04x}"));
                    1
                }
            },
            _ => {
                let _ = std::fmt::Write::write_fmt(out, format_args!("\\u{b:04x}"));
                1
            }
        };
        rest = &rest[k + used..];
    }
    out.0.push(b'"');
}

/// The length of the UTF-8 character `b` starts with, if it starts with a valid one.
fn utf8_char(b: &[u8]) -> Option<usize> {
    let w = match b.first()? {
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return None,
    };
    std::str::from_utf8(b.get(..w)?).ok().map(|_| w)
}

/// How many leading bytes of `v` a JSON string takes as they are (ASCII, and no
/// `"`, `\\` or control byte): eight at a time (the last few padded with a plain byte), with the
/// zero-byte test on each of the three. The lowest flagged byte is exact (a borrow
/// only ever flags bytes above a real hit), so its position is the answer.
fn plain_run(v: &[u8]) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` below `n` (for n <= 0x80) sets its high bit in the result.
    let below = |x: u64, n: u8| x.wrapping_sub(LO * u64::from(n)) & !x & HI;
    let hits =
        |x: u64| below(x, 0x20) | below(x ^ (LO * 0x22), 1) | below(x ^ (LO * 0x5c), 1) | (x & HI);
    let mut chunks = v.chunks_exact(8);
    let mut i = 0;
    for chunk in &mut chunks {
        let h = hits(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
        if h != 0 {
            return i + (h.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    let rest = chunks.remainder();
    let mut last = [b'a'; 8];
    last[..rest.len()].copy_from_slice(rest);
    let h = hits(u64::from_le_bytes(last));
    if h != 0 {
        return i + (h.trailing_zeros() / 8) as usize;
    }
    v.len()
}

/// A decimal number, without the formatting machinery.
fn number(out: &mut Line, mut n: u64) {
    if n < 10 {
        out.0.push(b'0' + n as u8);
        return;
    }
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.0.extend_from_slice(&digits[i..]);
}

fn open(target: &LogTarget) -> Box<dyn std::io::Write + Send> {
    match target {
        LogTarget::Stdout => Box::new(std::io::stdout()),
        LogTarget::Stderr => Box::new(std::io::stderr()),
        LogTarget::File(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => Box::new(f),
            Err(e) => {
                tracing::error!(
                    "sluice: access log: cannot open {}: {e}; lines go to stderr",
                    path.display()
                );
                Box::new(std::io::stderr())
            }
        },
    }
}

/// The writer: its own thread with plain blocking I/O, so a slow disk never stalls a
/// runtime worker. Every [`LAG`] it takes each thread's buffer whole (a spare, emptied
/// buffer goes back in its place, so neither side allocates in the steady state),
/// writes it through a 64 KiB buffer and flushes: a request never wakes it (a wakeup a
/// line cost more than the line), and a line reaches the file within [`LAG`]. It
/// forgets the buffers of threads that are gone once they are empty.
fn write(target: LogTarget, shared: &Shared) {
    use std::io::Write;
    let mut out = open(&target);
    let mut spare = Vec::new();
    loop {
        if shared.flags.reopen.swap(false, Ordering::Relaxed) {
            let _ = out.flush();
            out = open(&target);
        }
        let closing = shared.flags.closing.load(Ordering::Relaxed);
        let batches: Vec<Batch> = lock(&shared.batches).clone();
        for b in &batches {
            std::mem::swap(&mut *lock(b), &mut spare);
            if !spare.is_empty() && out.write_all(&spare).is_err() {
                let lines = spare.iter().filter(|&&c| c == b'\n').count();
                DROPPED.fetch_add(lines as u64, Ordering::Relaxed);
            }
            spare.clear();
        }
        let _ = out.flush();
        drop(batches);
        // A buffer only the list holds belongs to a thread that ended.
        lock(&shared.batches).retain(|b| Arc::strong_count(b) > 1 || !lock(b).is_empty());
        if closing {
            return;
        }
        std::thread::sleep(LAG);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formatted(f: impl FnOnce(&mut Line)) -> String {
        let mut l = Line::with_capacity(0);
        f(&mut l);
        String::from_utf8(l.0).expect("UTF-8")
    }

    #[test]
    fn json_lines_escape_what_a_client_sent() {
        let e = Entry {
            time: SystemTime::UNIX_EPOCH,
            client: "10.0.0.1",
            host: b"a\"b\\c",
            method: "GET",
            path: "/x\ny\u{1}",
            status: 200,
            bytes: 5,
            duration_ms: 3,
            protocol: "HTTP/2",
            pool: Some("a /x/*"),
            peer: None,
            attempts: 1,
            role: Some("backup"),
            transition: None,
            user_agent: Some(b"curl/8 \"x\""),
            referer: None,
            user: None,
            request_id: Some(b"r-1"),
            grpc_status: Some(7),
            tls: None,
            upstream_ms: Some(2),
            scheme: "http",
            headers: &[],
        };
        let line = formatted(|l| json(l, &e));
        assert!(line.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(v["host"], "a\"b\\c");
        assert_eq!(v["path"], "/x\ny\u{1}");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["pool"], "a /x/*");
        assert_eq!(v["peer"], serde_json::Value::Null);
        assert_eq!(v["protocol"], "HTTP/2");
        assert_eq!(v["role"], "backup");
        assert_eq!(v["transition"], serde_json::Value::Null);
        assert_eq!(
            (v["status"].as_u64(), v["bytes"].as_u64()),
            (Some(200), Some(5))
        );
        assert_eq!(v["user_agent"], "curl/8 \"x\"");
        assert_eq!(v["referer"], serde_json::Value::Null);
        assert_eq!(v["request_id"], "r-1");
        assert_eq!(v["grpc_status"], 7);
        assert_eq!(v["tls"], serde_json::Value::Null);
        assert_eq!(v["upstream_ms"], 2);
    }

    proptest::proptest! {
        /// The run found eight bytes at a time is the byte-wise one, and a string
        /// written with it reads back as itself.
        #[test]
        fn json_strings_round_trip(v in ".{0,64}", bytes in proptest::collection::vec(0u8..=255, 0..40)) {
            let naive = bytes.iter().position(|&b| !(0x20..0x80).contains(&b) || b == b'"' || b == b'\\');
            proptest::prop_assert_eq!(plain_run(&bytes), naive.unwrap_or(bytes.len()));
            let mut out = Line::with_capacity(0);
            string(&mut out, &v);
            let back: String = serde_json::from_slice(&out.0).expect("valid JSON");
            proptest::prop_assert_eq!(back, v);
            // Any bytes at all: still one valid JSON string, UTF-8 kept as it is.
            let mut out = Line::with_capacity(0);
            string(&mut out, &bytes);
            let back: String = serde_json::from_slice(&out.0).expect("valid JSON");
            if let Ok(text) = std::str::from_utf8(&bytes) {
                proptest::prop_assert_eq!(back, text);
            }
        }
    }

    /// Apache's formats: `-` for what is absent and an empty body, UTC time, quoted
    /// values escaped so a client cannot end a field or a line.
    #[test]
    fn combined_and_common_lines_as_apache_writes_them() {
        let mut e = Entry {
            time: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(971_186_136),
            client: "127.0.0.1",
            host: b"a.test",
            method: "GET",
            path: "/apache_pb.gif?a=\"b\"\n",
            status: 200,
            bytes: 2326,
            duration_ms: 3,
            protocol: "HTTP/1.0",
            pool: None,
            peer: None,
            attempts: 0,
            role: None,
            transition: None,
            user_agent: Some(b"Mozilla/4.08 [en] (Win98; I ;Nav)"),
            referer: Some(b"http://www.example.com/start.html"),
            user: Some("frank"),
            request_id: None,
            grpc_status: None,
            tls: Some("TLSv1.3"),
            upstream_ms: None,
            scheme: "https",
            headers: &[],
        };
        assert_eq!(
            formatted(|l| apache(l, &e, true)),
            "127.0.0.1 - frank [10/Oct/2000:13:55:36 +0000] \"GET /apache_pb.gif?a=\\\"b\\\"\\x0a HTTP/1.0\" 200 2326 \"http://www.example.com/start.html\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\"\n"
        );
        e.bytes = 0;
        e.user = None;
        e.referer = None;
        assert_eq!(
            formatted(|l| apache(l, &e, false)),
            "127.0.0.1 - - [10/Oct/2000:13:55:36 +0000] \"GET /apache_pb.gif?a=\\\"b\\\"\\x0a HTTP/1.0\" 200 -\n"
        );
        assert!(formatted(|l| apache(l, &e, true))
            .ends_with(" - \"-\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\"\n"));
        // A template: values escaped, `-` for the absent, headers by name.
        let t = LogTemplate::parse(
            "{client_ip} {method} {path} q={query} {status} {bytes} {scheme} {tls} {request_id} <{header.x-trace}> {1,2}",
        )
        .unwrap();
        let headers = [Some(http::HeaderValue::from_static("t\"1"))];
        e.headers = &headers;
        assert_eq!(
            formatted(|l| template(l, &t, &e)),
            "127.0.0.1 GET /apache_pb.gif q=a=\\\"b\\\"\\x0a 200 0 https TLSv1.3 - <t\\\"1> {1,2}\n"
        );
        assert!(LogTemplate::parse("{stauts}").is_err());
        assert!(LogTemplate::parse("{header.}").is_err());
        let v = http::HeaderValue::from_static("Basic ZnJhbms6c2VjcmV0");
        assert_eq!(basic_user(&v).as_deref(), Some("frank"));
        assert_eq!(
            basic_user(&http::HeaderValue::from_static("Bearer x")),
            None
        );
    }
}

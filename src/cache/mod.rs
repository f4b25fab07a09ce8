//! The HTTP cache of a route (DESIGN §15.1): between the request filters and the
//! handler, it answers from stored responses when RFC 9111 allows, revalidates stale
//! ones with the origin, stores what the handler answers (streaming it to the client
//! meanwhile), and serves stale responses in the windows the origin or the config
//! allow. Every response of a cache route carries `Cache-Status` (RFC 9211).
//!
//! A route without `cache` never reaches this module: the pipeline checks one
//! `Option`. Here: a request's way through (`serve`) and the answers made from stored
//! responses; `lookup` (keys, variants, the verdict), `fill` (misses stored as they
//! stream, passes, invalidation) and `revalidate` (stale responses, background
//! refreshes, coalesced misses) hold the rest of `Cache`'s work.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;

use crate::body::{Body, BodyError};
use crate::config::{CacheConfig, CacheKeyPart, CacheMode};
use crate::reply::local_response;
use crate::stats::COUNTERS;

pub(crate) mod control;
mod disk;
mod fill;
mod lookup;
mod object;
mod purge;
mod revalidate;
mod store;

pub(crate) use purge::{publish, purge, Publisher, Purge};

use self::{fill::*, lookup::*};
use control::{RequestDirectives, ResponseDirectives, Rules};
pub(crate) use store::Store;
use store::{Flight, FlightGuard, Held, Stored};

/// A fetch made for a background refresh: owns all it needs.
pub(crate) type Refresh = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// A route's cache: its settings and the store it shares with routes of the same
/// `store` setting.
#[derive(Clone)]
pub(crate) struct Cache {
    settings: Arc<Settings>,
    store: Arc<Store>,
}

/// The longest key the cache stores under (method, scheme, host, target and the
/// key's fields): a longer one passes through uncached, so a client cannot make the
/// store keep its 64 KiB query strings.
const MAX_KEY: usize = 8 * 1024;

struct Settings {
    /// Keys of this route start with this (its name, and an occurrence number when
    /// routes share a name), so routes sharing a store never answer for each other.
    namespace: Box<str>,
    max_object: u64,
    key: Box<[CacheKeyPart]>,
    rules: Rules,
    swr: Duration,
    sie: Duration,
    lock: Duration,
    mode: CacheMode,
    /// The query is part of the key (`key … query`).
    keys_query: bool,
    client_revalidate: bool,
    /// The route's meter (with the admin API on): its requests by outcome.
    meter: Option<Arc<crate::stats::Meter>>,
}

/// How a request counted (`sluice_cache_requests_total{result}`), once each.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    Hit = 0,
    Miss = 1,
    Stale = 2,
    Revalidated = 3,
    Bypass = 4,
    /// Waited for another request's fetch of the same key and got its response.
    Collapsed = 5,
}

impl Outcome {
    pub(crate) const ALL: [(Outcome, &'static str); 6] = [
        (Outcome::Hit, "hit"),
        (Outcome::Miss, "miss"),
        (Outcome::Stale, "stale"),
        (Outcome::Revalidated, "revalidated"),
        (Outcome::Bypass, "bypass"),
        (Outcome::Collapsed, "collapsed"),
    ];

    fn count(self, meter: Option<&crate::stats::Meter>) {
        crate::stats::bump(&COUNTERS.cache[self as usize]);
        if let Some(m) = meter {
            crate::stats::bump(&m.cache[self as usize]);
        }
    }
}

/// What `Cache-Status` says of a response (RFC 9211), sluice's entry.
#[derive(Default, Clone, Copy)]
struct Status {
    hit: bool,
    fwd: Option<&'static str>,
    fwd_status: Option<u16>,
    stored: bool,
    /// Collapsed into another request's forward (RFC 9211 §2.6).
    collapsed: bool,
    ttl: Option<i64>,
    detail: Option<&'static str>,
}

impl Status {
    fn hit() -> Status {
        Status {
            hit: true,
            ..Status::default()
        }
    }

    fn fwd(why: &'static str) -> Status {
        Status {
            fwd: Some(why),
            ..Status::default()
        }
    }

    fn value(&self) -> HeaderValue {
        use std::fmt::Write;
        let mut s = String::from("sluice");
        if self.hit {
            s.push_str("; hit");
        }
        if let Some(f) = self.fwd {
            let _ = write!(s, "; fwd={f}");
        }
        if let Some(c) = self.fwd_status {
            let _ = write!(s, "; fwd-status={c}");
        }
        if self.stored {
            s.push_str("; stored");
        }
        if self.collapsed {
            s.push_str("; collapsed");
        }
        if let Some(t) = self.ttl {
            let _ = write!(s, "; ttl={t}");
        }
        if let Some(d) = self.detail {
            let _ = write!(s, "; detail={d}");
        }
        HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("sluice"))
    }
}

static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// Fields a `304` does not change in the stored response: they describe the stored
/// bytes, or the hop (RFC 9111 §3.2, §4.3.4).
const KEPT_ON_304: [HeaderName; 7] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::ETAG,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::AGE,
];

/// `Cache-Status` on a response leaving the cache; `Surrogate-Control` was for
/// this cache and goes no further.
fn mark(mut resp: Response<Body>, status: Status) -> Response<Body> {
    let h = resp.headers_mut();
    h.remove(&control::SURROGATE_CONTROL);
    h.append(&CACHE_STATUS, status.value());
    resp
}

/// A response as it arrived: its fields (before the cache drops any), when, and how
/// old it already was.
struct Arrival<'h> {
    fields: &'h HeaderMap,
    /// What its fields' cache directives say.
    dirs: ResponseDirectives,
    came: SystemTime,
    age: Duration,
}

/// What a stored response is judged by for one request.
enum Verdict {
    Fresh,
    /// Stale, and the client accepts that (`max-stale`).
    StaleAccepted,
    /// Stale within its `stale-while-revalidate` window.
    StaleWhileRevalidate,
    /// Ask the origin; `true` when the client asked for it.
    Revalidate(bool),
}

/// A request that carries credentials sluice verified outside `Authorization` (a
/// `jwt` token from a cookie or the query): the cache treats it as one with
/// `Authorization` (RFC 9111 §3.5), so no user is served another's stored answer
/// unless the answer says it may be shared.
#[derive(Clone, Copy)]
pub(crate) struct Credentialed;

/// Whether `req` carries credentials (see [`Credentialed`]).
fn credentialed<B>(req: &Request<B>) -> bool {
    req.headers().contains_key(header::AUTHORIZATION)
        || req.extensions().get::<Credentialed>().is_some()
}

/// The request as the cache needs it after the handler took it.
struct Asked {
    method: Method,
    headers: HeaderMap,
    /// It carries credentials ([`credentialed`]).
    credentialed: bool,
    /// The request counts in `sluice_cache_requests_total` here (a background
    /// refresh does not: the request it serves counted as stale).
    count: bool,
}

impl Cache {
    pub(crate) fn new(
        cfg: &CacheConfig,
        store: Arc<Store>,
        namespace: String,
        meter: Option<Arc<crate::stats::Meter>>,
    ) -> Cache {
        Cache {
            settings: Arc::new(Settings {
                namespace: namespace.into(),
                max_object: cfg.max_object,
                rules: Rules {
                    heuristic: cfg.heuristic,
                    default_ttl: cfg.default_ttl,
                    keys_cookie: cfg.key.iter().any(|k| matches!(k, CacheKeyPart::Cookie(_))),
                },
                key: cfg.key.clone().into(),
                swr: cfg.stale_while_revalidate,
                sie: cfg.stale_if_error,
                lock: cfg.lock,
                mode: cfg.mode,
                keys_query: cfg.key.contains(&CacheKeyPart::Query),
                client_revalidate: cfg.client_revalidate,
                meter,
            }),
            store,
        }
    }

    /// Answers `req` from the store or through `fetch` (the handler), storing what it
    /// may. The key is the request as the backend receives it (DESIGN §18.1): the
    /// `scheme` of the client's connection, `host` as the client sent it, and the
    /// target now in `req` (after `strip`/`rewrite`), so two requests the backend would
    /// see differently never share an entry. `refresh` makes a fetch that can run
    /// after this request is answered (a `stale-while-revalidate` refresh).
    pub(crate) async fn serve<F, Fut, R>(
        &self,
        req: Request<Body>,
        scheme: &str,
        host: &str,
        fetch: F,
        refresh: R,
    ) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
        R: FnOnce(Request<Body>) -> Refresh,
    {
        let host = key_host(host);
        let method = req.method();
        let upgrade = req.headers().contains_key(header::UPGRADE);
        if (method != Method::GET && method != Method::HEAD) || upgrade {
            if self.settings.mode == CacheMode::CacheOnly {
                return self.not_cached(Status::fwd("method"));
            }
            return self.pass(req, &host, fetch).await;
        }
        let key = self.key(scheme, &host, self.target(req.uri()), req.headers());
        if key.len() > MAX_KEY {
            return self.too_long(req, fetch).await;
        }
        let mut rdirs = RequestDirectives::of(req.headers());
        if !self.settings.client_revalidate {
            rdirs.no_cache = false;
            rdirs.max_age = None;
        }
        let (found, why) = self.find(&key, req.headers(), credentialed(&req));
        let now = SystemTime::now();
        match self.settings.mode {
            CacheMode::CacheOnly => {
                return match found.filter(|o| o.is_fresh(now) || !o.dirs.never_stale()) {
                    Some(o) => self.answer_stored(&req, &o, "cache-only"),
                    None => {
                        self.not_cached(Status::fwd(if why.is_empty() { "stale" } else { why }))
                    }
                };
            }
            CacheMode::StaleOnly => {
                if let Some(o) = found
                    .as_ref()
                    .filter(|o| o.is_fresh(now) || !o.dirs.never_stale())
                {
                    return self.answer_stored(&req, o, "stale-only");
                }
            }
            CacheMode::Normal => {}
        }
        if let Some(obj) = found {
            match verdict(&obj, &rdirs, now) {
                Verdict::Fresh => {
                    return fresh_hit(self.meter(), &req, &obj);
                }
                Verdict::StaleAccepted => return self.answer_stored(&req, &obj, "max-stale"),
                Verdict::StaleWhileRevalidate => {
                    self.background(&key, &obj, &req, refresh);
                    return self.answer_stored(&req, &obj, "stale-while-revalidate");
                }
                Verdict::Revalidate(by_client) => {
                    if rdirs.only_if_cached {
                        return gateway_timeout(self.meter(), Status::fwd("request"));
                    }
                    return self
                        .revalidate(req, key, obj, by_client, &rdirs, fetch)
                        .await;
                }
            }
        }
        if rdirs.only_if_cached {
            return gateway_timeout(self.meter(), Status::fwd(why));
        }
        self.miss(req, key, why, &rdirs, fetch).await
    }

    /// A request whose key would be over [`MAX_KEY`]: passed through uncached.
    async fn too_long<F, Fut>(&self, req: Request<Body>, fetch: F) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        if self.settings.mode == CacheMode::CacheOnly {
            return self.not_cached(Status::fwd("bypass"));
        }
        Outcome::Bypass.count(self.meter());
        let resp = fetch(req).await;
        let status = Status {
            detail: Some("key"),
            ..Status::fwd("bypass")
        };
        mark(resp, status)
    }

    /// The route's meter, when requests are metered.
    fn meter(&self) -> Option<&crate::stats::Meter> {
        self.settings.meter.as_deref()
    }

    /// A stored response served without asking the origin, stale or not.
    fn answer_stored(
        &self,
        req: &Request<Body>,
        obj: &Stored,
        why: &'static str,
    ) -> Response<Body> {
        let fresh = obj.is_fresh(SystemTime::now());
        let status = Status {
            detail: (!fresh || why == "cache-only").then_some(why),
            ..Status::hit()
        };
        let outcome = if fresh { Outcome::Hit } else { Outcome::Stale };
        answer(
            self.meter(),
            req.method(),
            req.headers(),
            obj,
            status,
            outcome,
        )
    }

    /// `mode cache_only` with nothing to serve.
    fn not_cached(&self, status: Status) -> Response<Body> {
        gateway_timeout(
            self.meter(),
            Status {
                detail: Some("cache-only"),
                ..status
            },
        )
    }
}

/// A fresh stored response as a plain hit.
fn fresh_hit(
    meter: Option<&crate::stats::Meter>,
    req: &Request<Body>,
    obj: &Stored,
) -> Response<Body> {
    answer(
        meter,
        req.method(),
        req.headers(),
        obj,
        Status::hit(),
        Outcome::Hit,
    )
}

/// A stored response as the answer to a request: `304` when the client's copy is
/// current, `206` for one satisfiable `Range` of a stored `200`, else the whole
/// response (no body for `HEAD`), with its `Age`.
fn answer(
    meter: Option<&crate::stats::Meter>,
    method: &Method,
    asked: &HeaderMap,
    obj: &Stored,
    mut status: Status,
    outcome: Outcome,
) -> Response<Body> {
    outcome.count(meter);
    let now = SystemTime::now();
    status.ttl = Some(obj.ttl(now));
    let mut resp = Response::new(Body::Empty);
    *resp.status_mut() = obj.status;
    let mut headers = obj.headers.clone();
    headers.insert(header::AGE, HeaderValue::from(obj.age(now).as_secs()));
    let len = obj.body.len();
    let (mut start, mut count) = (0, len);
    if obj.status == StatusCode::OK {
        let tag = headers
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // Without Last-Modified, the response's Date stands for it (RFC 9110 §13.1.3).
        let modified = control::date_of(&headers, header::LAST_MODIFIED)
            .or_else(|| control::date_of(&headers, header::DATE));
        let conditional = asked.contains_key(header::IF_NONE_MATCH)
            || asked.contains_key(header::IF_MODIFIED_SINCE);
        if conditional && crate::files::not_modified(asked, tag, modified) {
            *resp.status_mut() = StatusCode::NOT_MODIFIED;
            headers.remove(header::CONTENT_LENGTH);
            *resp.headers_mut() = headers;
            return mark(resp, status);
        }
        if let Some((a, b)) = wanted_range(asked, &headers, len) {
            if a > b {
                let mut r =
                    local_response(StatusCode::RANGE_NOT_SATISFIABLE, "Range not satisfiable\n");
                r.headers_mut().insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{len}"))
                        .unwrap_or(HeaderValue::from_static("bytes */0")),
                );
                return mark(r, status);
            }
            *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
            if let Ok(v) = HeaderValue::from_str(&format!("bytes {a}-{b}/{len}")) {
                headers.insert(header::CONTENT_RANGE, v);
            }
            (start, count) = (a, b - a + 1);
        }
    }
    if obj.status != StatusCode::NO_CONTENT {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    }
    *resp.headers_mut() = headers;
    if method != Method::HEAD && count > 0 {
        match body_of(&obj.body, start, count) {
            Ok(b) => *resp.body_mut() = b,
            Err(e) => {
                tracing::warn!("sluice: cache: a stored body cannot be read ({e}); answered 503");
                let lost = local_response(StatusCode::SERVICE_UNAVAILABLE, "Service unavailable\n");
                return mark(lost, status);
            }
        }
    }
    mark(resp, status)
}

/// `count` bytes of a stored body from `start`: a slice of memory, or the file's bytes
/// read as the client takes them (`sendfile` on plain TCP).
fn body_of(held: &Held, start: u64, count: u64) -> std::io::Result<Body> {
    Ok(match held {
        Held::Memory(b) => Body::full(b.slice(start as usize..(start + count) as usize)),
        Held::Disk(d) => Body::File(Box::new(crate::body::FileBody {
            file: std::fs::File::open(&d.path)?,
            at: d.offset + start,
            left: count,
        })),
    })
}

/// The one `Range` a request wants of a stored body of `len` bytes, when `If-Range`
/// (if any) still matches; `(1, 0)` when it cannot be satisfied.
fn wanted_range(asked: &HeaderMap, stored: &HeaderMap, len: u64) -> Option<(u64, u64)> {
    let value = asked.get(header::RANGE)?.to_str().ok()?;
    if let Some(cond) = asked.get(header::IF_RANGE) {
        let strong_tag = stored
            .get(header::ETAG)
            .filter(|t| !t.as_bytes().starts_with(b"W/"));
        let same = Some(cond) == strong_tag || Some(cond) == stored.get(header::LAST_MODIFIED);
        if !same {
            return None;
        }
    }
    match crate::files::range(value, len) {
        Ok(r) => r,
        Err(()) => Some((1, 0)),
    }
}

/// `504 not cached`: `only-if-cached`, or `mode cache_only`, with nothing to serve.
fn gateway_timeout(meter: Option<&crate::stats::Meter>, status: Status) -> Response<Body> {
    Outcome::Miss.count(meter);
    mark(
        local_response(StatusCode::GATEWAY_TIMEOUT, "not cached\n"),
        status,
    )
}

/// An origin's body on its way to the client and, up to `limit` bytes, into the
/// store; stored when it ends whole, dropped when it breaks off or grows too large.
struct Tee {
    inner: Body,
    parts: Vec<Bytes>,
    len: u64,
    limit: u64,
    /// The declared length: reaching it completes the body, whether or not the
    /// reader polls once more for the end.
    expected: Option<u64>,
    pending: Option<Pending>,
}

impl Tee {
    fn commit(&mut self) {
        if let Some(p) = self.pending.take() {
            p.commit(concat(std::mem::take(&mut self.parts), self.len));
        }
    }

    /// Keeps a frame's data for the store while it still fits.
    fn keep(&mut self, frame: &Frame<Bytes>) {
        let Some(data) = frame.data_ref().filter(|_| self.pending.is_some()) else {
            return;
        };
        self.len += data.len() as u64;
        if self.len > self.limit {
            self.pending = None;
            self.parts = Vec::new();
        } else {
            self.parts.push(data.clone());
            if Some(self.len) == self.expected {
                self.commit();
            }
        }
    }
}

/// How far the origin may run ahead of a slow client once its response is no longer
/// being stored (past `max_object`): from there the client's pace holds again.
const AHEAD: u64 = 256 * 1024;

/// The bytes read from the origin that the client has not taken yet.
#[derive(Default)]
struct Window {
    unread: std::sync::atomic::AtomicU64,
    taken: tokio::sync::Notify,
}

type Frames = tokio::sync::mpsc::UnboundedSender<Result<Frame<Bytes>, BodyError>>;

impl Window {
    /// Waits until the client is within [`AHEAD`] bytes; `false` when it went away.
    async fn room(&self, tx: &Frames) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        loop {
            let taken = self.taken.notified();
            if tx.is_closed() {
                return false;
            }
            if self.unread.load(Relaxed) <= AHEAD {
                return true;
            }
            tokio::select! {
                _ = taken => {}
                _ = tx.closed() => return false,
            }
        }
    }
}

/// The body the client reads while a task of its own reads the origin at the
/// origin's pace into the store (DESIGN §18.1): a slow first reader never holds the
/// requests waiting for the store, and a client that leaves does not stop the fill.
/// Memory stays bounded: what is buffered for the client is what is being stored (at
/// most `max_object`), or [`AHEAD`] once the response is too large to store.
fn fill(tee: Tee) -> Body {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let window = Arc::new(Window::default());
    let left = http_body::Body::size_hint(&tee.inner).exact();
    tokio::spawn(fill_from_origin(tee, tx, window.clone()));
    Body::Boxed(Box::pin(Filled { rx, window, left }))
}

async fn fill_from_origin(mut tee: Tee, tx: Frames, window: Arc<Window>) {
    use http_body_util::BodyExt;
    loop {
        if tee.pending.is_none() && !window.room(&tx).await {
            return;
        }
        // Once the client has left, the store is filled only while the origin keeps
        // sending: a stalled one lets go of its connection and the key's `lock`.
        let gone = tx.is_closed();
        let next = tokio::select! {
            f = tee.inner.frame() => f,
            _ = tx.closed(), if !gone => continue,
            _ = tokio::time::sleep(crate::body::BODY_READ_TIMEOUT), if gone => return,
        };
        match next {
            Some(Ok(frame)) => {
                tee.keep(&frame);
                if let Some(d) = frame.data_ref() {
                    let n = d.len() as u64;
                    window
                        .unread
                        .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                }
                if tx.send(Ok(frame)).is_err() && tee.pending.is_none() {
                    return;
                }
            }
            Some(Err(e)) => {
                tee.pending = None;
                let _ = tx.send(Err(e));
                return;
            }
            None => {
                tee.commit();
                return;
            }
        }
    }
}

/// The client's side of [`fill`].
struct Filled {
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<Frame<Bytes>, BodyError>>,
    window: Arc<Window>,
    /// Bytes still to come, when the origin declared its length.
    left: Option<u64>,
}

impl http_body::Body for Filled {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = std::task::ready!(this.rx.poll_recv(cx));
        if let Some(Ok(Some(d))) = polled.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
            let n = d.len() as u64;
            this.window
                .unread
                .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
            this.window.taken.notify_one();
            this.left = this.left.map(|l| l.saturating_sub(n));
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.left {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
        }
    }
}

fn concat(parts: Vec<Bytes>, len: u64) -> Bytes {
    if parts.len() == 1 {
        return parts.into_iter().next().unwrap_or_default();
    }
    let mut all = bytes::BytesMut::with_capacity(len as usize);
    for p in parts {
        all.extend_from_slice(&p);
    }
    all.freeze()
}

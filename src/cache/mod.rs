//! The HTTP cache of a route (DESIGN §15.1): between the request filters and the
//! handler, it answers from stored responses when RFC 9111 allows, revalidates stale
//! ones with the origin, stores what the handler answers (streaming it to the client
//! meanwhile), and serves stale responses in the windows the origin or the config
//! allow. Every response of a cache route carries `Cache-Status` (RFC 9211).
//!
//! A route without `cache` never reaches this module: the pipeline checks one
//! `Option`.

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
mod purge;
mod store;

pub(crate) use purge::{publish, purge, Publisher, Purge};

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
}

/// How a request counted (`sluice_cache_requests_total{result}`), once each.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    Hit = 0,
    Miss = 1,
    Stale = 2,
    Revalidated = 3,
    Bypass = 4,
}

impl Outcome {
    pub(crate) const ALL: [(Outcome, &'static str); 5] = [
        (Outcome::Hit, "hit"),
        (Outcome::Miss, "miss"),
        (Outcome::Stale, "stale"),
        (Outcome::Revalidated, "revalidated"),
        (Outcome::Bypass, "bypass"),
    ];

    fn count(self) {
        crate::stats::bump(&COUNTERS.cache[self as usize]);
    }
}

/// What `Cache-Status` says of a response (RFC 9211), sluice's entry.
#[derive(Default, Clone, Copy)]
struct Status {
    hit: bool,
    fwd: Option<&'static str>,
    fwd_status: Option<u16>,
    stored: bool,
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

/// The request as the cache needs it after the handler took it.
struct Asked {
    method: Method,
    headers: HeaderMap,
    /// The request counts in `sluice_cache_requests_total` here (a background
    /// refresh does not: the request it serves counted as stale).
    count: bool,
}

impl Cache {
    pub(crate) fn new(cfg: &CacheConfig, store: Arc<Store>, namespace: String) -> Cache {
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
        let (found, why) = self.find(&key, req.headers());
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
                    return fresh_hit(&req, &obj);
                }
                Verdict::StaleAccepted => return self.answer_stored(&req, &obj, "max-stale"),
                Verdict::StaleWhileRevalidate => {
                    self.background(&key, &obj, &req, refresh);
                    return self.answer_stored(&req, &obj, "stale-while-revalidate");
                }
                Verdict::Revalidate(by_client) => {
                    if rdirs.only_if_cached {
                        return gateway_timeout(Status::fwd("request"));
                    }
                    return self
                        .revalidate(req, key, obj, by_client, &rdirs, fetch)
                        .await;
                }
            }
        }
        if rdirs.only_if_cached {
            return gateway_timeout(Status::fwd(why));
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
        Outcome::Bypass.count();
        let resp = fetch(req).await;
        let status = Status {
            detail: Some("key"),
            ..Status::fwd("bypass")
        };
        mark(resp, status)
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
        answer(req.method(), req.headers(), obj, status, outcome)
    }

    /// `mode cache_only` with nothing to serve.
    fn not_cached(&self, status: Status) -> Response<Body> {
        gateway_timeout(Status {
            detail: Some("cache-only"),
            ..status
        })
    }

    /// The target a key holds: the path and query as the backend receives them (the
    /// query left out when the key does not list it).
    fn target<'u>(&self, uri: &'u http::Uri) -> &'u str {
        match uri.path_and_query() {
            Some(pq) if self.settings.keys_query => pq.as_str(),
            Some(pq) => pq.path(),
            None => "/",
        }
    }

    /// The key of a request: the route's namespace, a newline, then
    /// `GET https app.test:8443 /x?a=1` and a ` name=value` per header of the config's
    /// `key` (` cookie:name=value` per cookie; values percent-encoded, a bare ` name`
    /// when the request lacks it).
    fn key(&self, scheme: &str, host: &str, target: &str, h: &HeaderMap) -> String {
        let mut k = self.base_key(scheme, host, target);
        for part in self.settings.key.iter() {
            let value = match part {
                CacheKeyPart::Header(name) => {
                    k.push(' ');
                    k.push_str(name.as_str());
                    joined(h, name.as_str())
                }
                CacheKeyPart::Cookie(name) => {
                    k.push_str(" cookie:");
                    k.push_str(name);
                    cookie(h, name).map(|v| encode(v.as_bytes()))
                }
                _ => continue,
            };
            if let Some(v) = value {
                k.push('=');
                k.push_str(&v);
            }
        }
        k
    }

    /// The key's method, scheme, host and target (what a purge by key names). Only
    /// `GET` responses are stored (a `HEAD` is answered from them).
    fn base_key(&self, scheme: &str, host: &str, target: &str) -> String {
        let ns = &self.settings.namespace;
        let mut k = String::with_capacity(ns.len() + host.len() + target.len() + 16);
        for part in [ns, "\nGET ", scheme, " ", host, " ", target] {
            k.push_str(part);
        }
        k
    }

    /// Whether keys have parts past the base (header or cookie values).
    fn keys_have_fields(&self) -> bool {
        self.settings
            .key
            .iter()
            .any(|p| matches!(p, CacheKeyPart::Header(_) | CacheKeyPart::Cookie(_)))
    }

    /// The variant stored under `key` that the request's fields select, or why there is
    /// none (`uri-miss`: nothing for the URI; `vary-miss`: no variant for these fields;
    /// `miss`: one that may not answer a request with `Authorization`).
    fn find(&self, key: &str, h: &HeaderMap) -> (Option<Arc<Stored>>, &'static str) {
        let Some(variants) = self.store.get(key) else {
            return (None, "uri-miss");
        };
        // The newest that matches: after the origin drops a `Vary`, an older variant
        // must not shadow the response stored since.
        let newest = variants
            .into_iter()
            .filter(|v| selects(v, h))
            .max_by_key(|v| v.response_time);
        let Some(obj) = newest else {
            return (None, "vary-miss");
        };
        if h.contains_key(header::AUTHORIZATION)
            && !control::shareable_with_authorization(&obj.dirs)
        {
            return (None, "miss");
        }
        (Some(obj), "")
    }

    /// A method the cache does not answer: forwarded; an unsafe one that succeeds
    /// invalidates what is stored for its target and the targets its `Location` and
    /// `Content-Location` name on the same host (RFC 9111 §4.4), over either scheme.
    async fn pass<F, Fut>(&self, req: Request<Body>, host: &str, fetch: F) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        let unsafe_method = !matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        let is_method = req.method() != Method::GET && req.method() != Method::HEAD;
        let target = unsafe_method.then(|| self.target(req.uri()).to_string());
        let resp = fetch(req).await;
        Outcome::Bypass.count();
        if let Some(target) = target {
            let s = resp.status();
            if s.is_success() || s.is_redirection() {
                self.invalidate(host, &target);
                for name in [header::LOCATION, header::CONTENT_LOCATION] {
                    let named = resp.headers().get(name);
                    if let Some(uri) = named.and_then(|v| same_host(v, host)) {
                        self.invalidate(host, self.target(&uri));
                    }
                }
            }
        }
        mark(
            resp,
            Status::fwd(if is_method { "method" } else { "bypass" }),
        )
    }

    /// Drops what is stored for `target` on `host` over either scheme: every header or
    /// cookie variant of it.
    fn invalidate(&self, host: &str, target: &str) {
        for scheme in ["http", "https"] {
            let base = self.base_key(scheme, host, target);
            if self.keys_have_fields() {
                let under = format!("{base} ");
                self.store.purge(|k| k == base || k.starts_with(&under));
            } else {
                self.store.remove(&base);
            }
        }
    }

    /// Nothing usable stored: one fetch per key at a time (`lock`), the others waiting
    /// for it and answered from what it stored.
    async fn miss<F, Fut>(
        &self,
        req: Request<Body>,
        key: String,
        why: &'static str,
        rdirs: &RequestDirectives,
        fetch: F,
    ) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        let no_store = rdirs.no_store;
        let guard = match self
            .coalesce(req.method(), req.headers(), &key, rdirs, None)
            .await
        {
            Ok(guard) => guard,
            Err(answered) => return answered,
        };
        let asked = Asked {
            method: req.method().clone(),
            headers: req.headers().clone(),
            count: true,
        };
        let sent = SystemTime::now();
        let resp = fetch(req).await;
        let mut status = Status::fwd(why);
        if no_store {
            status.fwd = Some("bypass");
        }
        self.keep(key, &asked, resp, sent, guard, status, !no_store)
    }

    /// A stale (or client-refused) stored response: asked again with its validators.
    /// `304` refreshes it; a failure within its `stale-if-error` window serves it;
    /// anything else replaces it.
    async fn revalidate<F, Fut>(
        &self,
        mut req: Request<Body>,
        key: String,
        obj: Arc<Stored>,
        by_client: bool,
        rdirs: &RequestDirectives,
        fetch: F,
    ) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        let asked = (req.method(), req.headers());
        let guard = match self
            .coalesce(asked.0, asked.1, &key, rdirs, Some(&obj))
            .await
        {
            Ok(guard) => guard,
            Err(answered) => return answered,
        };
        let asked = Asked {
            method: req.method().clone(),
            headers: req.headers().clone(),
            count: true,
        };
        conditional(req.headers_mut(), &obj);
        let sent = SystemTime::now();
        let resp = fetch(req).await;
        let fwd = if by_client { "request" } else { "stale" };
        let code = resp.status();
        let status = Status {
            fwd: Some(fwd),
            fwd_status: Some(code.as_u16()),
            ..Status::default()
        };
        if code == StatusCode::NOT_MODIFIED {
            // A HEAD's 304 refreshes the stored GET response as a GET's does.
            let fresh = Arc::new(self.refreshed(&obj, resp.headers(), sent));
            self.store.replace(&key, &obj, fresh.clone());
            return answer(
                &asked.method,
                &asked.headers,
                &fresh,
                status,
                Outcome::Revalidated,
            );
        }
        // Only a stale response stands in, and not when the client asked the origin.
        let now = SystemTime::now();
        let stale_for = obj.staleness(now);
        let in_window = !stale_for.is_zero() && stale_for <= obj.sie;
        if code.is_server_error() && in_window && !obj.dirs.never_stale() && !by_client {
            let stale = Status {
                fwd: Some("stale"),
                detail: Some("stale-if-error"),
                ..status
            };
            tracing::debug!(
                "sluice: cache: {key}: the origin answered {}; serving the stored response ({}s stale)",
                code.as_u16(),
                obj.staleness(now).as_secs()
            );
            return answer(&asked.method, &asked.headers, &obj, stale, Outcome::Stale);
        }
        self.keep(key, &asked, resp, sent, guard, status, true)
    }

    /// One origin fetch per key at a time (`lock`), for misses and revalidations alike
    /// (a client's `no-cache` included, DESIGN §18.1): the first request leads and holds
    /// the guard until what it fetched is stored or found not storable; the others wait
    /// for it and are answered from what it stored (`Err`), or go themselves when it
    /// stored nothing newer than `had` in time.
    async fn coalesce(
        &self,
        method: &Method,
        headers: &HeaderMap,
        key: &str,
        rdirs: &RequestDirectives,
        had: Option<&Arc<Stored>>,
    ) -> Result<Option<FlightGuard>, Response<Body>> {
        if method != Method::GET || rdirs.no_store || self.settings.lock.is_zero() {
            return Ok(None);
        }
        let rx = match self.store.join(key) {
            Flight::Leader(g) => return Ok(Some(g)),
            Flight::Follower(rx) => rx,
        };
        store::wait(rx, self.settings.lock).await;
        let (Some(obj), _) = self.find(key, headers) else {
            return Ok(None);
        };
        // Stored since this request began waiting (a disk store's write swaps the
        // object in place without making it newer).
        let newer = had.is_none_or(|h| obj.response_time > h.response_time);
        let now = SystemTime::now();
        let usable = match verdict(&obj, rdirs, now) {
            Verdict::Fresh => true,
            // Asked again for this client: what the leader just brought is the
            // origin's word.
            Verdict::Revalidate(true) => newer && obj.is_fresh(now),
            _ => false,
        };
        if usable {
            return Err(answer(method, headers, &obj, Status::hit(), Outcome::Hit));
        }
        Ok(None)
    }

    /// A stale response inside its `stale-while-revalidate` window: one refresh per key
    /// runs in the background while the stale one is served.
    fn background<R>(&self, key: &str, obj: &Arc<Stored>, req: &Request<Body>, refresh: R)
    where
        R: FnOnce(Request<Body>) -> Refresh,
    {
        let Flight::Leader(guard) = self.store.join(key) else {
            return;
        };
        let mut again = Request::new(Body::Empty);
        *again.uri_mut() = req.uri().clone();
        *again.headers_mut() = req.headers().clone();
        again.headers_mut().remove(header::RANGE);
        conditional(again.headers_mut(), obj);
        let asked = Asked {
            method: Method::GET,
            headers: req.headers().clone(),
            count: false,
        };
        let fut = refresh(again);
        let (this, key, obj) = (self.clone(), key.to_string(), obj.clone());
        tokio::spawn(async move {
            let sent = SystemTime::now();
            let resp = fut.await;
            if resp.status() == StatusCode::NOT_MODIFIED {
                let fresh = Arc::new(this.refreshed(&obj, resp.headers(), sent));
                this.store.replace(&key, &obj, fresh);
                return;
            }
            if resp.status().is_server_error() {
                return;
            }
            let resp = this.keep(
                key,
                &asked,
                resp,
                sent,
                Some(guard),
                Status::default(),
                true,
            );
            // Read to the end: the body is stored as it passes.
            let mut body = resp.into_body();
            while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
        });
    }

    /// `obj` after a `304`: its fields updated from the answer's (RFC 9111 §4.3.4),
    /// its age and lifetime counted anew.
    fn refreshed(&self, obj: &Stored, fields: &HeaderMap, sent: SystemTime) -> Stored {
        let mut headers = obj.headers.clone();
        for name in fields.keys() {
            if KEPT_ON_304.contains(name) || *name == CACHE_STATUS || name == "content-md5" {
                continue;
            }
            headers.remove(name);
            for v in fields.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
        let came = SystemTime::now();
        let merged = headers.clone();
        let arrival = Arrival {
            dirs: ResponseDirectives::of(&merged),
            fields: &merged,
            came,
            age: control::initial_age(fields, sent, came),
        };
        unstored(&mut headers, &ResponseDirectives::of(fields));
        self.stored(
            obj.status,
            headers,
            obj.body.clone(),
            arrival,
            obj.vary.clone(),
        )
    }

    /// A stored object of a response's parts, with the times it was asked and came.
    fn stored(
        &self,
        status: StatusCode,
        headers: HeaderMap,
        body: Held,
        arrival: Arrival<'_>,
        vary: Box<[(String, Option<String>)]>,
    ) -> Stored {
        let Arrival {
            fields,
            dirs,
            came,
            age,
        } = arrival;
        let rules = &self.settings.rules;
        // `s-maxage` means "revalidate when stale" for a shared cache (RFC 9111
        // §5.2.2.10): only the response's own stale windows apply then.
        let config = |d: Duration| {
            if dirs.s_maxage.is_some() {
                Duration::ZERO
            } else {
                d
            }
        };
        let window = |own: Option<control::Delta>, setting: Duration| {
            own.map_or(config(setting), |d| Duration::from_secs(d.secs()))
        };
        Stored {
            lifetime: control::lifetime(status, fields, &dirs, came, rules),
            initial_age: age,
            swr: window(dirs.stale_while_revalidate, self.settings.swr),
            sie: window(dirs.stale_if_error, self.settings.sie),
            status,
            headers,
            body,
            response_time: came,
            dirs,
            vary,
        }
    }

    /// The handler's response, stored as it streams to the client when it may be;
    /// `status` is what `Cache-Status` says so far.
    #[allow(clippy::too_many_arguments)]
    fn keep(
        &self,
        key: String,
        asked: &Asked,
        mut resp: Response<Body>,
        sent: SystemTime,
        guard: Option<FlightGuard>,
        mut status: Status,
        may_store: bool,
    ) -> Response<Body> {
        let came = SystemTime::now();
        let why_not = self.why_not_store(asked, &resp, may_store);
        if let Some(why) = why_not {
            tracing::trace!("sluice: cache: {key}: not stored: {why}");
            let bypass =
                asked.headers.contains_key(header::AUTHORIZATION) || status.fwd == Some("bypass");
            match (asked.count, bypass) {
                (false, _) => {}
                (true, true) => Outcome::Bypass.count(),
                (true, false) => Outcome::Miss.count(),
            }
            drop(guard);
            return mark(resp, status);
        }
        if asked.count {
            Outcome::Miss.count();
        }
        let head = self.head_of(asked, resp.headers(), resp.status(), (sent, came));
        status.stored = true;
        status.ttl = Some(head.ttl(came));
        let pending = Pending {
            store: self.store.clone(),
            key,
            head,
            _guard: guard,
        };
        let bodiless = matches!(resp.status().as_u16(), 204 | 304) || asked.method == Method::HEAD;
        let expected = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let body = std::mem::replace(resp.body_mut(), Body::Empty);
        *resp.body_mut() = match body {
            _ if bodiless => {
                pending.commit(Bytes::new());
                Body::Empty
            }
            body if http_body::Body::is_end_stream(&body) => {
                pending.commit(Bytes::new());
                body
            }
            Body::Full(Some(b)) => {
                pending.commit(b.clone());
                Body::Full(Some(b))
            }
            body => fill(Tee {
                inner: body,
                parts: Vec::new(),
                len: 0,
                limit: self.settings.max_object,
                expected,
                pending: Some(pending),
            }),
        };
        mark(resp, status)
    }

    /// What is stored of a response's head: its fields without those that are the
    /// hop's, this cache's, or that `no-cache="…"`/`private="…"` keep out; the
    /// request's values of the fields it varies on.
    fn head_of(
        &self,
        asked: &Asked,
        fields: &HeaderMap,
        code: StatusCode,
        (sent, came): (SystemTime, SystemTime),
    ) -> Stored {
        let dirs = ResponseDirectives::of(fields);
        let mut headers = fields.clone();
        unstored(&mut headers, &dirs);
        let vary: Box<[_]> = control::vary_fields(fields)
            .map(|f| {
                let v = joined(&asked.headers, &f);
                (f, v)
            })
            .collect();
        let arrival = Arrival {
            fields,
            dirs,
            came,
            age: control::initial_age(fields, sent, came),
        };
        self.stored(code, headers, Held::Memory(Bytes::new()), arrival, vary)
    }

    /// Why a response is not stored, or `None` when it is.
    fn why_not_store(
        &self,
        asked: &Asked,
        resp: &Response<Body>,
        may_store: bool,
    ) -> Option<&'static str> {
        if !may_store {
            return Some("the request said no-store");
        }
        if asked.method != Method::GET {
            return Some("only GET responses are stored");
        }
        if crate::reply::is_own(resp) {
            return Some("sluice's own answer");
        }
        let rdirs = RequestDirectives::of(&asked.headers);
        let dirs = ResponseDirectives::of(resp.headers());
        if let Err(why) = control::storable(
            &asked.headers,
            &rdirs,
            resp.status(),
            resp.headers(),
            &dirs,
            &self.settings.rules,
        ) {
            return Some(why);
        }
        let len = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if len.is_some_and(|n| n > self.settings.max_object) {
            return Some("larger than max_object");
        }
        // Kept only if it can serve again: fresh for a while, revalidated cheaply,
        // served stale in a window, or by a mode that serves what is stored.
        let st = &self.settings;
        let useful = control::lifetime(
            resp.status(),
            resp.headers(),
            &dirs,
            SystemTime::now(),
            &st.rules,
        ) > Duration::ZERO
            || control::validators(resp.headers()) != (None, None)
            || !st.swr.is_zero()
            || !st.sie.is_zero()
            || dirs.stale_while_revalidate.is_some()
            || dirs.stale_if_error.is_some()
            || st.mode != CacheMode::Normal;
        if !useful {
            return Some("it could never be served again (no freshness, no validator)");
        }
        None
    }
}

/// How a stored response may answer this request now (RFC 9111 §4.2, §5.2.1).
fn verdict(obj: &Stored, rdirs: &RequestDirectives, now: SystemTime) -> Verdict {
    let age = obj.age(now).as_secs();
    if rdirs.no_cache {
        return Verdict::Revalidate(true);
    }
    if let Some(limit) = rdirs.max_age {
        let limit = limit.secs();
        if limit == 0 || age > limit {
            return Verdict::Revalidate(true);
        }
    }
    if obj.dirs.no_cache {
        return Verdict::Revalidate(false);
    }
    if obj.is_fresh(now) {
        let left = obj.lifetime.as_secs().saturating_sub(age);
        if rdirs.min_fresh.is_some_and(|m| left < m.secs()) {
            return Verdict::Revalidate(true);
        }
        return Verdict::Fresh;
    }
    if obj.dirs.never_stale() {
        return Verdict::Revalidate(false);
    }
    let stale = obj.staleness(now);
    if let Some(limit) = rdirs.max_stale.filter(|_| obj.dirs.s_maxage.is_none()) {
        if limit.is_none_or(|m| stale.as_secs() <= m) {
            return Verdict::StaleAccepted;
        }
    }
    if !obj.swr.is_zero() && stale <= obj.swr {
        return Verdict::StaleWhileRevalidate;
    }
    Verdict::Revalidate(false)
}

/// A fresh stored response as a plain hit.
fn fresh_hit(req: &Request<Body>, obj: &Stored) -> Response<Body> {
    answer(
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
    method: &Method,
    asked: &HeaderMap,
    obj: &Stored,
    mut status: Status,
    outcome: Outcome,
) -> Response<Body> {
    outcome.count();
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

/// Removes from fields about to be stored what must not be: the hop's, this cache's,
/// `Set-Cookie` (one visitor's cookie must never reach the next; the response that
/// set it passed to its own client), and what `no-cache="…"` / `private="…"` name
/// (`dirs`: the directives of the response the fields came with).
fn unstored(headers: &mut HeaderMap, dirs: &ResponseDirectives) {
    for name in [
        header::AGE,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::SET_COOKIE,
    ] {
        headers.remove(name);
    }
    headers.remove(&CACHE_STATUS);
    headers.remove(&control::SURROGATE_CONTROL);
    for f in &dirs.unstored_fields {
        headers.remove(f.as_str());
    }
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
fn gateway_timeout(status: Status) -> Response<Body> {
    Outcome::Miss.count();
    mark(
        local_response(StatusCode::GATEWAY_TIMEOUT, "not cached\n"),
        status,
    )
}

/// The request's validators become the stored response's: its `ETag` and
/// `Last-Modified` are asked about, and the client's own conditions and ranges are
/// answered by the cache afterwards.
fn conditional(h: &mut HeaderMap, obj: &Stored) {
    for name in [
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_RANGE,
        header::RANGE,
    ] {
        h.remove(name);
    }
    let (etag, modified) = control::validators(&obj.headers);
    if let Some(t) = etag {
        h.insert(header::IF_NONE_MATCH, t.clone());
    }
    if let Some(m) = modified {
        h.insert(header::IF_MODIFIED_SINCE, m.clone());
    }
}

/// Whether a stored variant's `Vary` values are the request's.
fn selects(obj: &Stored, h: &HeaderMap) -> bool {
    obj.vary
        .iter()
        .all(|(name, value)| joined(h, name).as_deref() == value.as_deref())
}

/// A field's lines as one value, each item trimmed (`a, b` and `a,b` agree), bytes
/// outside printable ASCII (and `%`, space, `=`) percent-encoded so that no two
/// values read alike; `None` when the request lacks it.
fn joined(h: &HeaderMap, name: &str) -> Option<String> {
    let mut out: Option<String> = None;
    for v in h.get_all(name) {
        for item in v.as_bytes().split(|&b| b == b',') {
            let s = out.get_or_insert_with(String::new);
            if !s.is_empty() {
                s.push(',');
            }
            s.push_str(&encode(item.trim_ascii()));
        }
    }
    out
}

/// Percent-encodes what could make two values, or a value and a separator, alike.
fn encode(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_graphic() && !matches!(b, b'%' | b'=' | b',') {
            s.push(b as char);
        } else {
            let _ = write!(s, "%{b:02X}");
        }
    }
    s
}

/// One cookie's value from the request's `Cookie` lines.
fn cookie<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// The path and query of a `Location` / `Content-Location` on `host` (relative, or
/// absolute naming the same host).
/// The target a `Location` or `Content-Location` names, when it is on `host` (a
/// relative reference always is).
fn same_host(v: &HeaderValue, host: &str) -> Option<http::Uri> {
    let uri: http::Uri = v.to_str().ok()?.parse().ok()?;
    if let Some(h) = uri.host() {
        let name = host.rsplit_once(':').map_or(host, |(n, _)| n);
        if !h.eq_ignore_ascii_case(name) && !h.eq_ignore_ascii_case(host) {
            return None;
        }
    }
    uri.path().starts_with('/').then_some(uri)
}

/// The `Host` as a key holds it (DESIGN §18.1): the name in lower case without one
/// trailing dot, the port as sent.
fn key_host(host: &str) -> String {
    let split = match host.strip_prefix('[') {
        Some(rest) => rest.find(']').map(|i| i + 2),
        None => host.find(':'),
    };
    let (name, port) = host.split_at(split.unwrap_or(host.len()));
    let name = name.strip_suffix('.').unwrap_or(name);
    let mut k = String::with_capacity(host.len());
    k.push_str(name);
    k.make_ascii_lowercase();
    k.push_str(port);
    k
}

/// A response on its way into the store once its body has passed whole.
struct Pending {
    store: Arc<Store>,
    key: String,
    head: Stored,
    /// Followers of the key's fetch wake when this goes (stored or not).
    _guard: Option<FlightGuard>,
}

impl Pending {
    fn commit(self, body: Bytes) {
        let Pending {
            store,
            key,
            mut head,
            _guard,
        } = self;
        let declared = head
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n != body.len() as u64) {
            return;
        }
        head.headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        head.body = Held::Memory(body);
        store.put(&key, Arc::new(head));
    }
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

//! Responses sluice makes itself (refusals, errors, `respond`, redirects): a short
//! plain-text body and a `Date`. The date is rendered at most once a second per
//! thread, so a local answer costs no formatting.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::Body;

/// `global { server_tokens }` of the live config: sluice's own answers say
/// `Server: sluice` unless it is off. Process-wide, set when a config goes live.
static SERVER_TOKENS: AtomicBool = AtomicBool::new(true);

pub(crate) fn set_server_tokens(on: bool) {
    SERVER_TOKENS.store(on, Ordering::Relaxed);
}

/// `Server: sluice`, for an answer sluice makes itself, when `server_tokens` is on (a
/// backend's `Server` passes unchanged).
pub(crate) fn server(h: &mut http::HeaderMap) {
    if SERVER_TOKENS.load(Ordering::Relaxed) {
        h.insert(header::SERVER, HeaderValue::from_static("sluice"));
    }
}

/// The `Server` line of a head sluice writes itself, when `server_tokens` is on.
pub(crate) fn server_line(out: &mut Vec<u8>) {
    if SERVER_TOKENS.load(Ordering::Relaxed) {
        out.extend_from_slice(b"server: sluice\r\n");
    }
}

/// A backend's `X-Powered-By` tells the world its stack and version: dropped from
/// every backend's answer (proxy and FastCGI; `header_down` may set one again). Its
/// `Server` passes unchanged.
pub(crate) fn drop_powered_by(h: &mut http::HeaderMap) {
    static X_POWERED_BY: http::HeaderName = http::HeaderName::from_static("x-powered-by");
    h.remove(&X_POWERED_BY);
}

/// Marks a response as sluice's own (a refusal or an error, not a backend's or a
/// `respond` line's): what `error_page` replaces, and how a subrequest tells "the
/// service could not be reached" from "the service answered 502".
#[derive(Clone, Copy, Debug)]
pub(crate) struct Own;

/// Marks one of sluice's own answers as a refusal for want of room (a pool's `limit`):
/// a gRPC client reads it as `RESOURCE_EXHAUSTED`, not `UNAVAILABLE`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Exhausted;

/// Marks a page sluice made that must reach the client as it is (a `challenge`
/// page: replaced by an `error_page`, it could never be solved).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Whole;

/// Whether sluice made `resp` itself ([`Own`]).
pub(crate) fn is_own(resp: &Response<Body>) -> bool {
    resp.extensions().get::<Own>().is_some()
}

/// A short plain-text answer with `Date` (and `Server`).
pub(crate) fn local_response(status: StatusCode, body: &'static str) -> Response<Body> {
    if status.as_u16() >= 400 {
        tracing::debug!("sluice: answered {} {}", status.as_u16(), body.trim_end());
    }
    let mut r = Response::new(Body::full(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::DATE, date());
    server(h);
    r.extensions_mut().insert(Own);
    r
}

/// The current time as an HTTP date (`Tue, 01 Dec 2026 10:41:29 GMT`).
pub(crate) fn date() -> HeaderValue {
    thread_local! {
        static CACHED: RefCell<(u64, HeaderValue)> =
            const { RefCell::new((0, HeaderValue::from_static(""))) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            let text = httpdate::fmt_http_date(now);
            *c = (
                secs,
                HeaderValue::from_str(&text).expect("an HTTP date is a valid header value"),
            );
        }
        c.1.clone()
    })
}

/// `error_page` lines, compiled for one route (its own, then its site's for the codes
/// it lacks) or for a site's requests no route takes.
pub(crate) struct ErrorPages(Vec<ErrorPage>);

pub(crate) struct ErrorPage {
    pub codes: Vec<StatusCode>,
    pub body: bytes::Bytes,
    pub content_type: HeaderValue,
    /// The backend's answers with these codes too, not only sluice's own.
    pub backend: bool,
}

impl ErrorPages {
    /// `None` when there are none: a route without pays nothing.
    pub(crate) fn new(pages: Vec<ErrorPage>) -> Option<std::sync::Arc<ErrorPages>> {
        (!pages.is_empty()).then(|| std::sync::Arc::new(ErrorPages(pages)))
    }

    /// `resp`, with its body replaced when a page takes its status: sluice's own
    /// answers keep their other fields; a backend's (under `backend`) lose only those
    /// that described the old body (length, type, coding, range, validators).
    pub(crate) fn apply(&self, resp: Response<Body>) -> Response<Body> {
        let status = resp.status();
        let Some(page) = self.0.iter().find(|p| p.codes.contains(&status)) else {
            return resp;
        };
        if resp.extensions().get::<Whole>().is_some() {
            return resp;
        }
        if !page.backend && !is_own(&resp) {
            return resp;
        }
        let (mut parts, _replaced) = resp.into_parts();
        let h = &mut parts.headers;
        for name in [
            header::CONTENT_LENGTH,
            header::CONTENT_ENCODING,
            header::CONTENT_RANGE,
            header::ETAG,
            header::LAST_MODIFIED,
        ] {
            h.remove(name);
        }
        h.insert(header::CONTENT_TYPE, page.content_type.clone());
        Response::from_parts(parts, Body::full(page.body.clone()))
    }
}

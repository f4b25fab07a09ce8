//! Responses sluice makes itself (refusals, errors, `respond`, redirects): a short
//! plain-text body and a `Date`. The date is rendered at most once a second per
//! thread, so a local answer costs no formatting.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::Body;

/// A short plain-text answer with `Date`.
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

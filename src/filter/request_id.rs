//! `request_id`: every request goes to the handler with an `X-Request-Id`, and the
//! response carries the same one back. A valid incoming id (1 to 128 visible ASCII
//! characters, one field) is kept, so a chain of proxies shares one; anything else is
//! replaced by a new UUIDv7 (time-ordered, so ids sort by when they were made).

use http::header::HeaderName;
use http::{HeaderValue, Request, Response};

use super::{Cx, Filter, Step};
use crate::body::Body;

pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub struct RequestId;

impl Filter for RequestId {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let mut given = req.headers().get_all(&X_REQUEST_ID).iter();
        let id = match (given.next(), given.next()) {
            (Some(v), None) if valid(v) => v.clone(),
            _ => fresh(),
        };
        req.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
        cx.request_id = Some(id);
        Step::Pass
    }

    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        if let Some(id) = &cx.request_id {
            resp.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
        }
    }
}

fn valid(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    (1..=128).contains(&b.len()) && b.iter().all(|c| (0x21..=0x7e).contains(c))
}

/// A new UUIDv7, as 36 characters.
fn fresh() -> HeaderValue {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let text = uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf);
    HeaderValue::from_str(text).expect("a UUID is a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(valid(&HeaderValue::from_static("abc-123")));
        assert!(!valid(&HeaderValue::from_static("")));
        assert!(!valid(&HeaderValue::from_static("a b")));
        assert!(!valid(&HeaderValue::from_str(&"x".repeat(129)).unwrap()));
        let id = fresh();
        let s = id.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "7", "version 7: {s}");
        assert_ne!(fresh(), id);
    }
}

//! gRPC as a gateway sees it (DESIGN §18.5): which requests are gRPC calls, sluice's
//! own answers to them as trailers-only `grpc-status` responses, the status each call
//! ended with (for `sluice_grpc_requests_total` and the access log), and the
//! `grpc-timeout` deadline.
//!
//! Nothing here runs for a request that is not a gRPC call: the pipeline asks
//! [`is_call`] only of HTTP/2 and HTTP/3 requests (gRPC needs one of them), and a call's
//! response is watched by a [`Watched`] body only then.

pub(crate) mod web;

use std::pin::Pin;
use std::sync::atomic::{AtomicI16, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body::{Frame, SizeHint};

use crate::body::{Body, BodyError};
use crate::stats::Meter;

pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub(crate) static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
pub(crate) static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The status codes, by number, as the metric and the log carry them.
pub(crate) const CODES: usize = 17;
pub(crate) const CANCELLED: u8 = 1;
pub(crate) const UNKNOWN: u8 = 2;
pub(crate) const DEADLINE_EXCEEDED: u8 = 4;
pub(crate) const PERMISSION_DENIED: u8 = 7;
pub(crate) const RESOURCE_EXHAUSTED: u8 = 8;
pub(crate) const UNIMPLEMENTED: u8 = 12;
pub(crate) const INTERNAL: u8 = 13;
pub(crate) const UNAVAILABLE: u8 = 14;
pub(crate) const UNAUTHENTICATED: u8 = 16;

/// A status code's name, as gRPC spells it.
pub(crate) fn code_name(code: u8) -> &'static str {
    const NAMES: [&str; CODES] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(usize::from(code)).copied().unwrap_or("UNKNOWN")
}

/// Whether `req` is a gRPC call: HTTP/2 or HTTP/3 with a `Content-Type` of
/// `application/grpc` or `application/grpc+…` (gRPC-Web is not: it is translated).
pub(crate) fn is_call<B>(req: &Request<B>) -> bool {
    req.version() >= Version::HTTP_2 && is_grpc_type(req.headers())
}

/// `Content-Type: application/grpc` or `application/grpc+…` (or `;…`).
pub(crate) fn is_grpc_type(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| strip_prefix_ci(v.as_bytes(), b"application/grpc"))
        .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';')))
}

/// What follows `prefix` (any case) at the start of `v`.
fn strip_prefix_ci<'a>(v: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &v[prefix.len()..])
}

/// One call's end, as the meter and the access log see it: the `grpc-status` it ended
/// with, once known (`-1` until then). Shared by the response's [`Watched`] body and
/// the front that logs the request (through the response's extensions).
pub(crate) struct Call {
    status: AtomicI16,
    meter: Option<Arc<Meter>>,
}

impl Call {
    pub(crate) fn new(meter: Option<Arc<Meter>>) -> Arc<Call> {
        Arc::new(Call {
            status: AtomicI16::new(-1),
            meter,
        })
    }

    /// The call ended with `code`; the first word counts, once.
    pub(crate) fn ended(&self, code: u8) {
        let code = code.min(CODES as u8 - 1);
        if self
            .status
            .compare_exchange(-1, i16::from(code), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            if let Some(m) = &self.meter {
                m.grpc[usize::from(code)].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The status the call ended with, if it is known.
    pub(crate) fn status(&self) -> Option<u8> {
        u8::try_from(self.status.load(Ordering::Acquire)).ok()
    }
}

/// A `grpc-status` value's code; an unreadable one is `UNKNOWN`.
fn code_of(v: &HeaderValue) -> u8 {
    std::str::from_utf8(v.as_bytes())
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok())
        .unwrap_or(UNKNOWN)
}

/// The gRPC code for one of sluice's own answers (DESIGN §18.5): no site or route is
/// `UNIMPLEMENTED`, `401` `UNAUTHENTICATED`, `403` `PERMISSION_DENIED`, `413`, `429` and
/// a `limit` refusal `RESOURCE_EXHAUSTED`, `502`/`503` `UNAVAILABLE`, `504` (sluice's
/// own timeout) `DEADLINE_EXCEEDED`, `400` `INTERNAL`, anything else `UNKNOWN`.
pub(crate) fn code_for(status: StatusCode, exhausted: bool) -> u8 {
    match status.as_u16() {
        _ if exhausted => RESOURCE_EXHAUSTED,
        404 | 421 => UNIMPLEMENTED,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        413 | 429 => RESOURCE_EXHAUSTED,
        502 | 503 => UNAVAILABLE,
        504 => DEADLINE_EXCEEDED,
        400 => INTERNAL,
        _ => UNKNOWN,
    }
}

/// sluice's own answer to a gRPC call, as gRPC clients read it: `200` with
/// `grpc-status` and `grpc-message` in the head and no body (trailers-only). The
/// message is the answer's text; its status stays in the access log's `grpc_status`.
pub(crate) fn trailers_only(resp: Response<Body>, call: &Call) -> Response<Body> {
    let exhausted = resp.extensions().get::<crate::reply::Exhausted>().is_some();
    let code = code_for(resp.status(), exhausted);
    let (mut parts, body) = resp.into_parts();
    let text = match body {
        Body::Full(Some(b)) => b,
        _ => Bytes::from(parts.status.canonical_reason().unwrap_or("error")),
    };
    parts.status = StatusCode::OK;
    let h = &mut parts.headers;
    h.remove(header::CONTENT_LENGTH);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(GRPC_STATUS.clone(), HeaderValue::from(u16::from(code)));
    h.insert(GRPC_MESSAGE.clone(), message(&text));
    call.ended(code);
    Response::from_parts(parts, Body::Empty)
}

/// `text` as a `grpc-message` value: trimmed, percent-encoded where gRPC asks (bytes
/// outside printable ASCII, and `%`).
pub(crate) fn message(text: &[u8]) -> HeaderValue {
    let text = text.trim_ascii();
    let mut out = Vec::with_capacity(text.len());
    for &b in text {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    HeaderValue::from_bytes(&out).unwrap_or(HeaderValue::from_static("error"))
}

/// Watches a call's response for its end: a trailers-only head says it at once;
/// otherwise the body's trailers say it, and a body that ends without them is
/// `INTERNAL` (what gRPC clients report), one cut off `CANCELLED`.
pub(crate) fn watch(resp: Response<Body>, call: Arc<Call>) -> Response<Body> {
    if let Some(v) = resp.headers().get(&GRPC_STATUS) {
        call.ended(code_of(v));
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let body = Body::stream(Watched {
        inner: body,
        call,
        ended: false,
    });
    Response::from_parts(parts, body)
}

struct Watched {
    inner: Body,
    call: Arc<Call>,
    ended: bool,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(t) = f.trailers_ref() {
                    this.ended = true;
                    this.call
                        .ended(t.get(&GRPC_STATUS).map_or(INTERNAL, code_of));
                }
            }
            Poll::Ready(None) => {
                this.ended = true;
                this.call.ended(INTERNAL);
            }
            Poll::Ready(Some(Err(_))) => {
                this.ended = true;
                this.call.ended(UNKNOWN);
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if !self.ended {
            self.call.ended(CANCELLED);
        }
    }
}

/// The path of the standard health check (`grpc.health.v1`).
pub(crate) const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// A `HealthCheckRequest { service }` as one gRPC message (uncompressed): the 5-byte
/// prefix, then field 1 (a length-delimited string) when `service` is not empty.
pub(crate) fn health_request(service: &str) -> Bytes {
    let mut msg = Vec::with_capacity(service.len() + 8);
    if !service.is_empty() {
        msg.push(0x0a);
        varint(&mut msg, service.len() as u64);
        msg.extend_from_slice(service.as_bytes());
    }
    let mut out = Vec::with_capacity(5 + msg.len());
    out.push(0);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(&msg);
    out.into()
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn read_varint(b: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        n |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

/// The `status` of a `HealthCheckResponse` gRPC message (prefix included; `0`,
/// `UNKNOWN`, when the field is absent, as protobuf reads it); `None` when the bytes
/// are not one uncompressed message.
pub(crate) fn health_status(frame: &[u8]) -> Option<u64> {
    let (&flag, rest) = frame.split_first()?;
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let mut msg = rest.get(4..4 + len)?;
    if flag != 0 || rest.len() != 4 + len {
        return None;
    }
    let mut status = 0;
    while !msg.is_empty() {
        let key = read_varint(&mut msg)?;
        match key & 7 {
            0 => {
                let v = read_varint(&mut msg)?;
                if key >> 3 == 1 {
                    status = v;
                }
            }
            2 => {
                let n = usize::try_from(read_varint(&mut msg)?).ok()?;
                msg = msg.get(n..)?;
            }
            1 => msg = msg.get(8..)?,
            5 => msg = msg.get(4..)?,
            _ => return None,
        }
    }
    Some(status)
}

/// A `HealthCheckResponse.ServingStatus` by name.
pub(crate) fn serving_name(status: u64) -> &'static str {
    match status {
        0 => "UNKNOWN",
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "an unknown status",
    }
}

/// The deadline a gRPC call's `grpc-timeout` sets, from now.
#[cold]
#[inline(never)]
pub(crate) fn deadline<B>(call: &Request<B>) -> Option<std::time::Instant> {
    let d = parse_timeout(call.headers().get(&GRPC_TIMEOUT)?)?;
    std::time::Instant::now().checked_add(d)
}

/// A `grpc-timeout` value (1–8 digits and a unit: `H`ours, `M`inutes, `S`econds,
/// `m`illi-, `u`micro-, `n`anoseconds); `None` when it is not one.
pub(crate) fn parse_timeout(v: &HeaderValue) -> Option<Duration> {
    let v = v.as_bytes();
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `left` as a `grpc-timeout` value, in the finest unit whose count fits in 8 digits
/// (rounded down: the backend never gets more time than is left).
pub(crate) fn format_timeout(left: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let nanos = left.as_nanos();
    let (n, unit) = [
        (1u128, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ]
    .into_iter()
    .map(|(per, unit)| (nanos / per, unit))
    .find(|(n, _)| *n <= MAX)
    .unwrap_or((MAX, 'H'));
    HeaderValue::from_str(&format!("{n}{unit}")).expect("digits and a letter")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types() {
        for (v, yes) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC;charset=x", true),
            ("application/grpc-web", false),
            ("application/grpc-web-text", false),
            ("application/grpcx", false),
            ("text/plain", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            assert_eq!(is_grpc_type(&h), yes, "{v}");
        }
    }

    #[test]
    fn own_answers_map_to_codes() {
        let c = |s: u16| code_for(StatusCode::from_u16(s).unwrap(), false);
        assert_eq!(c(404), 12);
        assert_eq!(c(421), 12);
        assert_eq!(c(401), 16);
        assert_eq!(c(403), 7);
        assert_eq!(c(413), 8);
        assert_eq!(c(429), 8);
        assert_eq!(c(502), 14);
        assert_eq!(c(503), 14);
        assert_eq!(c(504), 4);
        assert_eq!(c(400), 13);
        assert_eq!(c(418), 2);
        assert_eq!(code_for(StatusCode::SERVICE_UNAVAILABLE, true), 8);
    }

    #[test]
    fn messages_are_percent_encoded_where_grpc_asks() {
        assert_eq!(message(b"No backend available\n"), "No backend available");
        assert_eq!(message("100% é".as_bytes()), "100%25 %C3%A9");
    }

    proptest::proptest! {
        /// Whatever is left, the value written reads back as at most that, and within
        /// the unit it chose of it.
        #[test]
        fn timeouts_round_trip_down(nanos in 0u64..10_000_000_000_000_000) {
            let left = Duration::from_nanos(nanos);
            let v = format_timeout(left);
            let back = parse_timeout(&v).unwrap();
            proptest::prop_assert!(back <= left, "{v:?}");
            proptest::prop_assert!(left - back < Duration::from_secs(3600).max(left / 10_000_000), "{v:?}");
        }

        /// Any byte string is a timeout or not, never a panic.
        #[test]
        fn any_value_parses_or_not(v in proptest::collection::vec(0x21u8..0x7f, 0..12)) {
            let _ = parse_timeout(&HeaderValue::from_bytes(&v).unwrap());
        }
    }

    #[test]
    fn health_messages() {
        assert_eq!(&health_request("")[..], b"\0\0\0\0\0");
        assert_eq!(&health_request("a.B")[..], b"\0\0\0\0\x05\x0a\x03a.B");
        assert_eq!(health_status(b"\0\0\0\0\x02\x08\x01"), Some(1));
        assert_eq!(health_status(b"\0\0\0\0\x02\x08\x02"), Some(2));
        assert_eq!(health_status(b"\0\0\0\0\0"), Some(0));
        // An unknown field before the status is skipped.
        assert_eq!(health_status(b"\0\0\0\0\x05\x12\x01x\x08\x01"), Some(1));
        assert_eq!(health_status(b"\x01\0\0\0\x02\x08\x01"), None, "compressed");
        assert_eq!(health_status(b"\0\0\0\0\x09\x08\x01"), None, "short");
    }

    proptest::proptest! {
        /// Whatever a backend sends as its health answer, it reads or not, never panics.
        #[test]
        fn any_health_answer_reads_or_not(b in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let _ = health_status(&b);
        }
    }

    #[test]
    fn timeout_units() {
        let p = |s: &str| parse_timeout(&HeaderValue::from_str(s).unwrap());
        assert_eq!(p("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(p("2M"), Some(Duration::from_secs(120)));
        assert_eq!(p("3S"), Some(Duration::from_secs(3)));
        assert_eq!(p("250m"), Some(Duration::from_millis(250)));
        assert_eq!(p("7u"), Some(Duration::from_micros(7)));
        assert_eq!(p("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(p("123456789S"), None);
        assert_eq!(p("S"), None);
        assert_eq!(p("1s"), None);
        assert_eq!(p("-1S"), None);
    }
}

//! `compress on|off` (default on): responses compressed with zstd, br or gzip as the
//! client's `Accept-Encoding` prefers (q-values; zstd > gzip > br on ties; `q=0`
//! excludes), streamed: each piece the backend sends is compressed and flushed at
//! once, so server-sent events and long polls stay live when compressed.
//!
//! Skipped for `HEAD`, 1xx/204/206/304, a response with `Content-Encoding` already,
//! `Cache-Control: no-transform`, a declared length under 1024 bytes, and types other
//! than `text/*` or containing `javascript`, `json`, `xml` or `svg`. A compressed
//! response loses `Content-Length` and `Accept-Ranges`, and a strong `ETag` becomes
//! weak. A compressible type gets `Vary: Accept-Encoding` whether or not this response
//! was compressed.

use std::pin::Pin;
use std::task::{Context, Poll};

use async_compression::tokio::write::{BrotliEncoder, GzipEncoder, ZstdEncoder};
use async_compression::Level;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Body as _, Frame, SizeHint};
use tokio::io::AsyncWrite;

use crate::body::{Body, BodyError};

/// `compress on|off|always` as a filter line: when it runs, it decides whether this
/// response is compressed (over the proxy's own `compress`).
pub(crate) struct Compress {
    pub mode: crate::config::Compression,
}

impl super::Filter for Compress {
    fn on_request(&self, _: &mut http::Request<Body>, cx: &mut super::Cx<'_>) -> super::Step {
        cx.compress = Some(self.mode);
        super::Step::Pass
    }
}

/// Responses declared smaller than this are sent as they are.
const MIN_LENGTH: u64 = 1024;
/// Compressed output is sent at least this often, however fast the backend sends.
const FLUSH_EVERY: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coding {
    Zstd,
    Br,
    Gzip,
}

impl Coding {
    pub(crate) fn token(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Br => "br",
            Coding::Gzip => "gzip",
        }
    }
}

/// The coding to use for `accept` (an `Accept-Encoding` value), if any.
pub(crate) fn negotiate(accept: &[u8]) -> Option<Coding> {
    negotiate_among(accept, |_| true)
}

/// The coding to use for `accept` among those `offered` (precompressed files that
/// exist, say), chosen the same way.
pub(crate) fn negotiate_among(accept: &[u8], offered: impl Fn(Coding) -> bool) -> Option<Coding> {
    let mut best: Option<(u32, Coding)> = None;
    let mut star: Option<u32> = None;
    let mut named = [None::<u32>; 3];
    for item in accept.split(|&b| b == b',') {
        let mut parts = item.split(|&b| b == b';');
        let name = parts.next().unwrap_or(b"").trim_ascii();
        let mut q = 1000;
        for p in parts {
            let p = p.trim_ascii();
            if let Some(v) = p.strip_prefix(b"q=").or_else(|| p.strip_prefix(b"Q=")) {
                q = qvalue(v).unwrap_or(0);
            }
        }
        let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
        let slot = if is(b"zstd") {
            0
        } else if is(b"br") {
            1
        } else if is(b"gzip") || is(b"x-gzip") {
            2
        } else if name == b"*" {
            star = Some(q);
            continue;
        } else {
            continue;
        };
        named[slot] = Some(q);
    }
    // Ties go to the first of zstd, gzip, br (DESIGN §14).
    for (slot, coding) in [(0, Coding::Zstd), (2, Coding::Gzip), (1, Coding::Br)] {
        let q = named[slot].or(star).unwrap_or(0);
        if q > 0 && offered(coding) && best.is_none_or(|(bq, _)| q > bq) {
            best = Some((q, coding));
        }
    }
    best.map(|(_, c)| c)
}

/// A q-value in thousandths (`0.5` → 500), spelled as RFC 9110 §12.4.2 allows: `0`
/// or `1`, then at most three decimals (only zeros after `1`). Anything else (`1e0`,
/// `.5`, `0.0004`) is `None`, which the caller reads as 0, as nginx does.
fn qvalue(v: &[u8]) -> Option<u32> {
    let (&int, rest) = v.split_first()?;
    let frac = match rest {
        [] => &[][..],
        [b'.', f @ ..] if f.len() <= 3 && f.iter().all(u8::is_ascii_digit) => f,
        _ => return None,
    };
    let thousandths = (0..3).fold(0, |acc, i| {
        acc * 10 + frac.get(i).map_or(0, |d| u32::from(d - b'0'))
    });
    match int {
        b'0' => Some(thousandths),
        b'1' if thousandths == 0 => Some(1000),
        _ => None,
    }
}

fn compressible(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .is_some_and(|t| crate::http1::head::compressible(t.as_bytes()))
}

/// Applies compression to a response as the request (`accept`, `is_head`) allows.
/// `secret`: the request carried `Authorization` or the response sets a cookie, and
/// the mode is not `always` (BREACH): sent as it is.
pub(crate) fn apply(
    resp: &mut Response<Body>,
    accept: Option<&HeaderValue>,
    is_head: bool,
    always: bool,
    authorized: bool,
) {
    if !compressible(resp.headers()) {
        return;
    }
    vary(resp.headers_mut());
    if !always && (authorized || resp.headers().contains_key(header::SET_COOKIE)) {
        return;
    }
    let Some(coding) = accept.and_then(|a| negotiate(a.as_bytes())) else {
        return;
    };
    let status = resp.status();
    let h = resp.headers();
    let skip = is_head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::PARTIAL_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || h.contains_key(header::CONTENT_ENCODING)
        || h.get_all(header::CACHE_CONTROL).iter().any(|v| {
            v.as_bytes()
                .windows(12)
                .any(|w| w.eq_ignore_ascii_case(b"no-transform"))
        })
        || declared_length(h, resp.body()).is_some_and(|n| n < MIN_LENGTH);
    if skip {
        return;
    }
    let h = resp.headers_mut();
    h.remove(header::CONTENT_LENGTH);
    h.remove(header::ACCEPT_RANGES);
    if let Some(etag) = h.get(header::ETAG) {
        if !etag.as_bytes().starts_with(b"W/") {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(etag.as_bytes());
            if let Ok(v) = HeaderValue::from_bytes(&weak) {
                h.insert(header::ETAG, v);
            }
        }
    }
    h.insert(
        header::CONTENT_ENCODING,
        HeaderValue::from_static(coding.token()),
    );
    let body = std::mem::replace(resp.body_mut(), Body::Empty);
    *resp.body_mut() = Body::stream(Compressed::new(body, coding));
}

fn declared_length(h: &HeaderMap, body: &Body) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .or_else(|| body.size_hint().exact())
}

fn vary(h: &mut HeaderMap) {
    const ACCEPT_ENCODING: HeaderValue = HeaderValue::from_static("accept-encoding");
    match h.entry(header::VARY) {
        header::Entry::Vacant(e) => {
            e.insert(ACCEPT_ENCODING);
        }
        header::Entry::Occupied(mut e) => {
            let present = e.iter().any(|v| {
                v.as_bytes().split(|&b| b == b',').any(|t| {
                    let t = t.trim_ascii();
                    t.eq_ignore_ascii_case(b"accept-encoding") || t == b"*"
                })
            });
            if !present {
                e.append(ACCEPT_ENCODING);
            }
        }
    }
}

enum Encoder {
    Zstd(ZstdEncoder<Vec<u8>>),
    /// Boxed: brotli's state is kilobytes, the others' a few hundred bytes.
    Br(Box<BrotliEncoder<Vec<u8>>>),
    Gzip(GzipEncoder<Vec<u8>>),
}

impl Encoder {
    fn writer(&mut self) -> Pin<&mut (dyn AsyncWrite + Send + Unpin)> {
        match self {
            Encoder::Zstd(e) => Pin::new(e as &mut (dyn AsyncWrite + Send + Unpin)),
            Encoder::Br(e) => Pin::new(&mut **e as &mut (dyn AsyncWrite + Send + Unpin)),
            Encoder::Gzip(e) => Pin::new(e as &mut (dyn AsyncWrite + Send + Unpin)),
        }
    }

    fn output(&mut self) -> &mut Vec<u8> {
        match self {
            Encoder::Zstd(e) => e.get_mut(),
            Encoder::Br(e) => e.get_mut(),
            Encoder::Gzip(e) => e.get_mut(),
        }
    }
}

/// A body compressed as it streams: each piece is compressed and flushed at once.
struct Compressed {
    inner: Body,
    enc: Encoder,
    /// Something was fed since the last flush.
    fed: bool,
    done: bool,
    /// The body's trailers, sent after the compressed body ended (DESIGN §18.5).
    trailers: Option<HeaderMap>,
}

impl Compressed {
    fn new(inner: Body, coding: Coding) -> Compressed {
        let enc = match coding {
            Coding::Zstd => Encoder::Zstd(ZstdEncoder::with_quality(Vec::new(), Level::Precise(3))),
            Coding::Br => Encoder::Br(Box::new(BrotliEncoder::with_quality(
                Vec::new(),
                Level::Precise(4),
            ))),
            Coding::Gzip => Encoder::Gzip(GzipEncoder::with_quality(Vec::new(), Level::Precise(5))),
        };
        Compressed {
            inner,
            enc,
            fed: false,
            done: false,
            trailers: None,
        }
    }

    /// Feeds `data`; the sink is a `Vec`, which never waits.
    fn feed(&mut self, cx: &mut Context<'_>, mut data: &[u8]) -> Result<(), BodyError> {
        while !data.is_empty() {
            match self.enc.writer().poll_write(cx, data) {
                Poll::Ready(Ok(n)) => data = &data[n..],
                Poll::Ready(Err(e)) => return Err(BodyError::Backend(e)),
                Poll::Pending => return Err(BodyError::Malformed("compressor stalled")),
            }
        }
        Ok(())
    }

    /// Flushes what was fed so far and takes the compressed bytes.
    fn flush(&mut self, cx: &mut Context<'_>) -> Result<Bytes, BodyError> {
        match self.enc.writer().poll_flush(cx) {
            Poll::Ready(Ok(())) => Ok(Bytes::from(std::mem::take(self.enc.output()))),
            Poll::Ready(Err(e)) => Err(BodyError::Backend(e)),
            Poll::Pending => Err(BodyError::Malformed("compressor stalled")),
        }
    }

    /// The inner body ended (with `trailers`, or none): the compressed stream's last
    /// bytes, or the trailers when there are none.
    fn end(
        &mut self,
        cx: &mut Context<'_>,
        trailers: Option<HeaderMap>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.done = true;
        self.trailers = trailers;
        match self.finish(cx) {
            Ok(out) if out.is_empty() => {
                Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Ok(out) => Poll::Ready(Some(Ok(Frame::data(out)))),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn finish(&mut self, cx: &mut Context<'_>) -> Result<Bytes, BodyError> {
        match self.enc.writer().poll_shutdown(cx) {
            Poll::Ready(Ok(())) => Ok(Bytes::from(std::mem::take(self.enc.output()))),
            Poll::Ready(Err(e)) => Err(BodyError::Backend(e)),
            Poll::Pending => Err(BodyError::Malformed("compressor stalled")),
        }
    }
}

impl http_body::Body for Compressed {
    type Data = Bytes;
    type Error = BodyError;

    /// Compresses what the backend has ready; flushes when it pauses (so a stream of
    /// events stays live), when 16 KiB of compressed output has gathered, and at the end.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    if !this.fed {
                        return Poll::Pending;
                    }
                    // The backend paused: what was fed goes out now.
                    this.fed = false;
                    return match this.flush(cx) {
                        Ok(out) if out.is_empty() => Poll::Pending,
                        Ok(out) => Poll::Ready(Some(Ok(Frame::data(out)))),
                        Err(e) => Poll::Ready(Some(Err(e))),
                    };
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => match frame.into_trailers() {
                            // Trailers end the body: the compressed stream ends first.
                            Ok(t) => return this.end(cx, Some(t)),
                            Err(_) => continue,
                        },
                    };
                    if data.is_empty() {
                        continue;
                    }
                    if let Err(e) = this.feed(cx, &data) {
                        return Poll::Ready(Some(Err(e)));
                    }
                    this.fed = true;
                    if this.enc.output().len() >= FLUSH_EVERY {
                        this.fed = false;
                        return match this.flush(cx) {
                            Ok(out) => Poll::Ready(Some(Ok(Frame::data(out)))),
                            Err(e) => Poll::Ready(Some(Err(e))),
                        };
                    }
                }
                Poll::Ready(None) => return this.end(cx, None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qvalues_as_the_grammar_spells_them() {
        for (v, q) in [
            ("1", Some(1000)),
            ("1.", Some(1000)),
            ("1.000", Some(1000)),
            ("0", Some(0)),
            ("0.5", Some(500)),
            ("0.05", Some(50)),
            ("0.001", Some(1)),
            ("1.001", None),
            ("1e0", None),
            (".5", None),
            ("0.0004", None),
            ("+0.5", None),
            ("2", None),
            ("", None),
        ] {
            assert_eq!(qvalue(v.as_bytes()), q, "{v:?}");
        }
        assert_eq!(negotiate(b"gzip;q=1e0, br;q=0.5"), Some(Coding::Br));
    }

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(b"gzip, deflate, br, zstd"), Some(Coding::Zstd));
        assert_eq!(
            negotiate(b"gzip, br"),
            Some(Coding::Gzip),
            "gzip before br on a tie"
        );
        assert_eq!(
            negotiate(b"br, gzip"),
            Some(Coding::Gzip),
            "order in the field is no preference"
        );
        assert_eq!(negotiate(b"gzip;q=0.5, br"), Some(Coding::Br), "q decides");
        assert_eq!(negotiate(b"zstd;q=0, gzip, br"), Some(Coding::Gzip));
        assert_eq!(
            negotiate(b"BR, GZip"),
            Some(Coding::Gzip),
            "names in any case"
        );
        assert_eq!(
            negotiate(b"gzip;q=1, br;q=0.5"),
            Some(Coding::Gzip),
            "q decides"
        );
        assert_eq!(
            negotiate(b"zstd;q=0, gzip"),
            Some(Coding::Gzip),
            "q=0 excludes"
        );
        assert_eq!(negotiate(b"identity"), None);
        assert_eq!(negotiate(b"*"), Some(Coding::Zstd));
        assert_eq!(negotiate(b"*;q=0.2, br;q=0"), Some(Coding::Zstd));
        assert_eq!(negotiate(b""), None);
    }
}

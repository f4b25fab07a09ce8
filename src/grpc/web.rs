//! gRPC-Web (DESIGN §18.5): a browser's call, over HTTP/1.1, HTTP/2 or HTTP/3, goes to
//! the backend as gRPC, and the answer comes back as gRPC-Web, its trailers as the last
//! message (flag `0x80`), since a browser cannot read HTTP trailers.
//!
//! `application/grpc-web` and `…+proto` carry messages as they are;
//! `application/grpc-web-text` carries them in base64, each piece padded on its own, so
//! padding may stand mid-stream: both directions work in whole 4-character groups.

use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response};
use http_body::{Frame, SizeHint};

use crate::body::{Body, BodyError};

/// How a gRPC-Web call's messages are carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Binary,
    /// `application/grpc-web-text`: base64.
    Text,
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The call's mode when `req` is a gRPC-Web call (by its `Content-Type`).
pub(crate) fn mode_of<B>(req: &Request<B>) -> Option<Mode> {
    let v = req.headers().get(header::CONTENT_TYPE)?.as_bytes();
    let rest = super::strip_prefix_ci(v, b"application/grpc-web")?;
    if super::strip_prefix_ci(rest, b"-text").is_some() {
        Some(Mode::Text)
    } else if matches!(rest.first(), None | Some(b'+' | b';')) {
        Some(Mode::Binary)
    } else {
        None
    }
}

/// Sets `Content-Type` to `base`, with the `+format` (`+proto`, `+json`) the one it
/// replaces named.
fn retype(h: &mut http::HeaderMap, base: &'static str) {
    let typed = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once('+'))
        .and_then(|(_, format)| HeaderValue::from_str(&format!("{base}+{format}")).ok());
    h.insert(
        header::CONTENT_TYPE,
        typed.unwrap_or(HeaderValue::from_static(base)),
    );
}

/// The call as gRPC: `Content-Type: application/grpc` (its `+format` kept), `TE:
/// trailers`, no `Content-Length` (base64 changes it), the body decoded in text mode.
pub(crate) fn to_grpc(req: &mut Request<Body>, mode: Mode) {
    let h = req.headers_mut();
    retype(h, "application/grpc");
    h.insert(header::TE, HeaderValue::from_static("trailers"));
    if mode == Mode::Text {
        h.remove(header::CONTENT_LENGTH);
        let body = std::mem::replace(req.body_mut(), Body::Empty);
        *req.body_mut() = Body::stream(Decoded {
            inner: body,
            pending: BytesMut::new(),
        });
    }
}

/// The answer as gRPC-Web: its `Content-Type` for `mode` (the backend's `+format`
/// kept), `grpc-status` and `grpc-message` readable by a page of another origin (when
/// `cors` allowed it), and the body translated: trailers become the last message.
pub(crate) fn to_web(resp: Response<Body>, mode: Mode) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    let h = &mut parts.headers;
    retype(
        h,
        match mode {
            Mode::Binary => "application/grpc-web",
            Mode::Text => "application/grpc-web-text",
        },
    );
    h.remove(header::CONTENT_LENGTH);
    if h.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("grpc-status, grpc-message"),
        );
    }
    let body = Body::stream(Encoded {
        inner: body,
        mode,
        carry: BytesMut::new(),
        queued: None,
        done: false,
    });
    Response::from_parts(parts, body)
}

/// The trailer message: flag `0x80`, its length, then `name: value` lines.
fn trailer_message(trailers: &HeaderMap) -> Bytes {
    let mut text = Vec::with_capacity(64);
    for (name, value) in trailers {
        text.extend_from_slice(name.as_str().as_bytes());
        text.extend_from_slice(b": ");
        text.extend_from_slice(value.as_bytes());
        text.extend_from_slice(b"\r\n");
    }
    let mut out = Vec::with_capacity(5 + text.len());
    out.push(0x80);
    out.extend_from_slice(&(text.len() as u32).to_be_bytes());
    out.extend_from_slice(&text);
    out.into()
}

/// A gRPC answer's body as gRPC-Web.
struct Encoded {
    inner: Body,
    mode: Mode,
    /// Text mode: bytes not yet encoded (fewer than 3: base64 works in groups of 3).
    carry: BytesMut,
    /// A frame to give after the one being given.
    queued: Option<Bytes>,
    done: bool,
}

impl Encoded {
    /// `data` as it goes out: itself, or in text mode base64 of whole 3-byte groups
    /// (what is left carried to the next piece).
    fn out(&mut self, data: &[u8]) -> Option<Bytes> {
        if self.mode == Mode::Binary {
            return (!data.is_empty()).then(|| Bytes::copy_from_slice(data));
        }
        self.carry.extend_from_slice(data);
        let whole = self.carry.len() / 3 * 3;
        (whole > 0).then(|| Bytes::from(B64.encode(self.carry.split_to(whole))))
    }

    /// What is carried, padded (text mode), then `last` on its own.
    fn end(&mut self, last: Option<Bytes>) -> Option<Bytes> {
        let carried = (!self.carry.is_empty()).then(|| Bytes::from(B64.encode(self.carry.split())));
        let last = last.map(|m| match self.mode {
            Mode::Binary => m,
            Mode::Text => Bytes::from(B64.encode(m)),
        });
        match (carried, last) {
            (Some(c), Some(l)) => {
                self.queued = Some(l);
                Some(c)
            }
            (c, l) => c.or(l),
        }
    }
}

impl http_body::Body for Encoded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(q) = this.queued.take() {
            return Poll::Ready(Some(Ok(Frame::data(q))));
        }
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(f)) => f,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    return Poll::Ready(this.end(None).map(|b| Ok(Frame::data(b))));
                }
            };
            let out = match frame.into_data() {
                Ok(data) => this.out(&data),
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    this.done = true;
                    this.end(Some(trailer_message(&trailers)))
                }
            };
            if let Some(b) = out {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.queued.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A `grpc-web-text` request body, decoded: whole 4-character groups, each run that
/// ends in padding decoded on its own; whitespace ignored.
struct Decoded {
    inner: Body,
    pending: BytesMut,
}

impl Decoded {
    /// Decodes what of `pending` is whole groups, each on its own (a group may be
    /// padded wherever a piece ended); at the end, a part group is malformed.
    fn decode(&mut self, end: bool) -> Result<Bytes, BodyError> {
        const BAD: BodyError = BodyError::Malformed("invalid base64 in a grpc-web-text body");
        let whole = self.pending.len() / 4 * 4;
        if end && whole != self.pending.len() {
            return Err(BAD);
        }
        let text = self.pending.split_to(whole);
        let mut out = Vec::with_capacity(whole / 4 * 3);
        for group in text.chunks_exact(4) {
            let mut three = [0u8; 3];
            let n = B64.decode_slice(group, &mut three).map_err(|_| BAD)?;
            out.extend_from_slice(&three[..n]);
        }
        Ok(out.into())
    }
}

impl http_body::Body for Decoded {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    this.pending
                        .extend(data.iter().filter(|b| !b.is_ascii_whitespace()));
                    let out = this.decode(false)?;
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None if this.pending.is_empty() => return Poll::Ready(None),
                None => {
                    let out = this.decode(true)?;
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn body_of(pieces: &[&[u8]]) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel(pieces.len().max(1));
        for p in pieces {
            tx.try_send(Ok(Frame::data(Bytes::copy_from_slice(p))))
                .unwrap();
        }
        Body::Channel {
            rx,
            len: None,
            want: None,
        }
    }

    async fn decoded(pieces: &[&[u8]]) -> Result<Vec<u8>, BodyError> {
        let body = Decoded {
            inner: body_of(pieces),
            pending: BytesMut::new(),
        };
        Ok(body.collect().await?.to_bytes().to_vec())
    }

    #[tokio::test]
    async fn text_bodies_decode_however_they_are_cut_and_padded() {
        // Two messages, each encoded (and padded) on its own.
        let a = B64.encode(b"\0\0\0\0\x01A");
        let b = B64.encode(b"\0\0\0\0\x02BC");
        let whole = format!("{a}{b}");
        let want = b"\0\0\0\0\x01A\0\0\0\0\x02BC".to_vec();
        for cut in 0..whole.len() {
            let (x, y) = whole.split_at(cut);
            assert_eq!(
                decoded(&[x.as_bytes(), y.as_bytes()]).await.unwrap(),
                want,
                "cut at {cut}"
            );
        }
        assert!(decoded(&[b"!!!!"]).await.is_err());
    }

    proptest::proptest! {
        /// Whatever a body's pieces and their cuts, text mode gives back base64 that
        /// decodes (group by group) to exactly the bytes and trailer message.
        #[test]
        fn text_answers_decode_to_what_the_backend_sent(
            pieces in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..20), 0..6),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let (tx, rx) = tokio::sync::mpsc::channel(8);
            for p in &pieces {
                tx.try_send(Ok(Frame::data(Bytes::copy_from_slice(p)))).unwrap();
            }
            let mut t = HeaderMap::new();
            t.insert("grpc-status", HeaderValue::from_static("0"));
            tx.try_send(Ok(Frame::trailers(t.clone()))).unwrap();
            drop(tx);
            let inner = Body::Channel { rx, len: None, want: None };
            let resp = to_web(Response::new(inner), Mode::Text);
            let text = rt.block_on(resp.into_body().collect()).unwrap().to_bytes();
            let back = rt
                .block_on(decoded(&[&text]))
                .unwrap();
            let mut want: Vec<u8> = pieces.concat();
            want.extend_from_slice(&trailer_message(&t));
            proptest::prop_assert_eq!(back, want);
        }
    }

    #[test]
    fn modes_by_content_type() {
        let m = |v: &'static str| {
            let r = Request::builder()
                .header("content-type", v)
                .body(())
                .unwrap();
            mode_of(&r)
        };
        assert_eq!(m("application/grpc-web"), Some(Mode::Binary));
        assert_eq!(m("application/grpc-web+proto"), Some(Mode::Binary));
        assert_eq!(m("application/grpc-web-text"), Some(Mode::Text));
        assert_eq!(m("application/grpc-web-text+proto"), Some(Mode::Text));
        assert_eq!(m("application/grpc"), None);
        assert_eq!(m("application/grpc-webx"), None);
    }
}

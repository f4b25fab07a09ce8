//! Writing heads (responses to clients, requests to backends) and chunked framing into
//! a reusable buffer, so a head and a small body leave in one write.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use http_body::Body as _;

use http::{HeaderMap, StatusCode, Version};

use super::{names, COALESCE};
use crate::body::{Body, BodyError};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// How an outgoing response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delimit {
    /// No body may follow (HEAD, 1xx, 204, 304).
    None,
    Length,
    Chunked,
    /// HTTP/1.0 without a length: the body ends when the connection closes.
    Close,
}

/// A response head: the status line, `sent` (fields already written as lines, see
/// `head::SentFields`), then `headers`' fields and the connection's option.
pub(crate) fn head(
    out: &mut Vec<u8>,
    status: StatusCode,
    sent: &[u8],
    headers: &HeaderMap,
    version: Version,
    keep_alive: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(sent);
    fields(out, headers);
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The header fields, one `name: value` line each.
fn fields(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes a request's field lines from `headers`, each field as `pass` decides:
/// `Some(true)` written, `Some(false)` left out, `None` stop (`false`: what was
/// written is not the whole). One `Content-Length`, and every `Cookie` field joined
/// into one by `"; "`: an HTTP/2 client sends each cookie as its own field (RFC 9113
/// §8.2.3), and many HTTP/1.1 servers read only the first.
///
/// `fields`: a map's, or a head's as they came ([`Source`]).
pub(crate) fn request_fields<'h, S: Source>(
    out: &mut Vec<u8>,
    fields: &'h S,
    mut pass: impl FnMut(&'h [u8], &'h [u8]) -> Option<bool>,
) -> bool {
    let (mut cookie_done, mut length_done) = (false, false);
    for (name, value) in fields.fields() {
        match pass(name, value) {
            Some(true) => {}
            Some(false) => continue,
            None => return false,
        }
        let at = out.len();
        match name.len() {
            // One length, whatever the front allowed: equal repeats arrive from HTTP/2
            // clients, and the body was framed by the first.
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                if length_done {
                    continue;
                }
                length_done = true;
            }
            6 if name.eq_ignore_ascii_case(b"cookie") => {
                if !cookie_done {
                    cookie_done = true;
                    cookies(out, fields.fields());
                }
                continue;
            }
            _ => {}
        }
        field(out, name, value);
        if !S::LOWER {
            names::lower_in_place(&mut out[at..at + name.len()]);
        }
    }
    true
}

/// A request's fields, for [`request_fields`] to write: a map's, or a head's as they
/// came (`super::fields::Fields`).
pub(crate) trait Source {
    /// The names come lower-case (a map's); else each is lowered as it is written.
    const LOWER: bool;
    /// Every field as `(name, value)`, a map's with each name's values together.
    fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])>;
}

impl Source for HeaderMap {
    const LOWER: bool = true;
    fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.iter()
            .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
    }
}

/// Every `Cookie` field of `fields` as one line, joined by `"; "`.
fn cookies<'h>(out: &mut Vec<u8>, fields: impl Iterator<Item = (&'h [u8], &'h [u8])>) {
    out.extend_from_slice(b"cookie: ");
    let mut first = true;
    for (_, v) in fields.filter(|(n, _)| n.eq_ignore_ascii_case(b"cookie")) {
        if !first {
            out.extend_from_slice(b"; ");
        }
        first = false;
        out.extend_from_slice(v);
    }
    out.extend_from_slice(b"\r\n");
}

/// One field line.
#[inline]
pub(crate) fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// How a request body going to a backend is framed: decided once, before any of the
/// body is read, so a request sent again is framed the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyOut {
    /// No body.
    Empty,
    /// The request carries its own Content-Length field.
    Declared,
    /// A known length, written as Content-Length.
    Length(u64),
    Chunked,
}

/// Writes a request head for a backend into `out` (cleared first); returns whether the
/// body goes chunked. The target is the origin form: path and query. The fields are
/// `lines` when the proxy wrote them already, else the map's.
pub(crate) fn request_head(
    out: &mut Vec<u8>,
    parts: &http::request::Parts,
    body: BodyOut,
    lines: Option<&[u8]>,
) -> bool {
    out.clear();
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    match lines {
        Some(lines) => out.extend_from_slice(lines),
        None => _ = request_fields(out, &parts.headers, |_, _| Some(true)),
    }
    match body {
        BodyOut::Empty | BodyOut::Declared => {}
        BodyOut::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa_u64(&mut [0u8; 20], n));
            out.extend_from_slice(b"\r\n");
        }
        BodyOut::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
    body == BodyOut::Chunked
}

/// `n` in decimal, written at the end of `buf` without `core::fmt`.
pub(crate) fn itoa_u64(buf: &mut [u8; 20], mut n: u64) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Writes one chunk (size line, data, CRLF) with a single vectored write when it can;
/// `data` is never copied.
pub(crate) async fn chunk<W: AsyncWrite + Unpin>(w: &mut W, data: &[u8]) -> std::io::Result<()> {
    let mut size = [0u8; 18];
    let n = hex_line(&mut size, data.len());
    let mut slices = [
        IoSlice::new(&size[..n]),
        IoSlice::new(data),
        IoSlice::new(b"\r\n"),
    ];
    write_all_vectored(w, &mut slices).await
}

/// The largest ready frame [`take_ready`] copies behind a head when it may spill:
/// copying a larger one (a backend's 16 KiB read) costs more than another slice of a
/// vectored write.
pub(crate) const COPY_AT_MOST: usize = 2 * 1024;

/// Ready frames [`take_ready`] leaves uncopied (two: a backend's first read and the
/// rest of a body it already holds), written after what was copied, in order, by
/// [`spilled_after`].
#[derive(Default)]
pub(crate) struct Spill {
    /// `None` rather than empty `Bytes`: a response that spills nothing (most) makes
    /// and drops no frame.
    frames: [Option<bytes::Bytes>; 2],
}

impl Spill {
    pub(crate) fn is_empty(&self) -> bool {
        self.frames[0].is_none()
    }

    /// How many frames it holds.
    pub(crate) fn len(&self) -> usize {
        self.frames.iter().flatten().count()
    }

    pub(crate) fn frames(&self) -> [Option<&bytes::Bytes>; 2] {
        [self.frames[0].as_ref(), self.frames[1].as_ref()]
    }

    /// Copies the frames into `out` (chunked) and lets them go: rare, for trailers
    /// that follow them.
    fn copy_into(&mut self, out: &mut Vec<u8>) {
        for data in self.frames.iter_mut().filter_map(Option::take) {
            chunk_into(out, &data);
        }
    }

    /// Takes `data`; whether there is room for another frame.
    fn push(&mut self, data: bytes::Bytes) -> bool {
        let room = self.frames[0].is_none();
        self.frames[usize::from(!room)] = Some(data);
        room
    }
}

/// Writes `before` (a head and what was copied behind it), then the spilled frames,
/// each framed as a chunk when `chunked`, then the body's terminator when `last`, in a
/// single vectored write when it can; the frames are never copied.
pub(crate) async fn spilled_after<W: AsyncWrite + Unpin>(
    w: &mut W,
    before: &[u8],
    spill: &Spill,
    chunked: bool,
    last: bool,
) -> std::io::Result<()> {
    let mut sizes = [[0u8; 18]; 2];
    let (mut slices, n) = spilled_slices(before, spill.frames(), chunked, last, &mut sizes);
    write_all_vectored(w, &mut slices[..n]).await
}

/// The slices [`spilled_after`] writes for `frames` spilled after `before` (at least
/// one: without, a body that ended has its terminator in `before`), and how many
/// there are; the chunk-size lines are written into `sizes`.
pub(crate) fn spilled_slices<'a>(
    before: &'a [u8],
    frames: [Option<&'a bytes::Bytes>; 2],
    chunked: bool,
    last: bool,
    sizes: &'a mut [[u8; 18]; 2],
) -> ([IoSlice<'a>; 8], usize) {
    let frames = frames.into_iter().flatten();
    let mut lens = [0usize; 2];
    for ((size, len), data) in sizes.iter_mut().zip(&mut lens).zip(frames.clone()) {
        *len = hex_line(size, data.len());
    }
    let sizes: &'a [[u8; 18]; 2] = sizes;
    let mut slices = [IoSlice::new(&[]); 8];
    slices[0] = IoSlice::new(before);
    let mut n = 1;
    for ((size, len), data) in sizes.iter().zip(lens).zip(frames) {
        if chunked {
            slices[n] = IoSlice::new(&size[..len]);
            n += 1;
        }
        slices[n] = IoSlice::new(data);
        n += 1;
        if chunked {
            slices[n] = IoSlice::new(b"\r\n");
            n += 1;
        }
    }
    if chunked && last {
        slices[n] = IoSlice::new(b"0\r\n\r\n");
        n += 1;
    }
    (slices, n)
}

/// Moves body frames that are ready now (without waiting) into `out`, framed as
/// chunks when `chunked`, until `out` holds [`COALESCE`] bytes. `Ok(true)`: the body
/// ended and its terminator is in `out` (with its trailer fields when `trailers` and
/// `chunked`: any spilled frames are then copied in before them). Used on both sides, so a small message's head and
/// body leave in one write. `taken`, when given, keeps each data frame moved (a
/// reference, not a copy), so the body can go out again if the write fails with
/// nothing written. `spill`, when given, takes the frame that would carry `out` past
/// the limit, or that is larger than [`COPY_AT_MOST`], and the ready frames after it,
/// instead of copying them there (the caller writes them beside `out`, in the same
/// `writev`): a large body is never copied behind its head. With frames spilled, an
/// ended body's terminator is not put in `out`: the caller writes it after them.
/// `counted` grows by the body bytes moved or spilled.
pub(crate) fn take_ready(
    body: &mut Body,
    chunked: bool,
    out: &mut Vec<u8>,
    trailers: bool,
    mut taken: Option<&mut Vec<bytes::Bytes>>,
    mut spill: Option<&mut Spill>,
    counted: &mut u64,
) -> Result<bool, BodyError> {
    let mut cx = Context::from_waker(Waker::noop());
    let limit = COALESCE;
    let mut ended = false;
    while out.len() < limit {
        if body.is_end_stream() {
            ended = true;
            break;
        }
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Pending => return Ok(false),
            Poll::Ready(None) => {
                ended = true;
                break;
            }
            Poll::Ready(Some(Err(e))) => return Err(e),
            Poll::Ready(Some(Ok(frame))) => {
                let data = match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        let Some(t) = frame.trailers_ref().filter(|_| chunked && trailers) else {
                            continue;
                        };
                        // Trailers end the body; frames spilled before them are copied.
                        if let Some(spill) = spill {
                            spill.copy_into(out);
                        }
                        last_chunk_with(out, t);
                        return Ok(true);
                    }
                };
                // An empty frame carries nothing, and chunked it would read as the end.
                if data.is_empty() {
                    continue;
                }
                *counted += data.len() as u64;
                if let Some(t) = taken.as_deref_mut() {
                    t.push(data.clone());
                }
                if let Some(spill) = spill.as_deref_mut().filter(|s| {
                    !s.is_empty() || out.len() + data.len() > limit || data.len() > COPY_AT_MOST
                }) {
                    if !spill.push(data) {
                        return Ok(body.is_end_stream());
                    }
                    continue;
                }
                if chunked {
                    if !data.is_empty() {
                        chunk_into(out, &data);
                    }
                } else {
                    out.extend_from_slice(&data);
                }
            }
        }
    }
    if !ended && !body.is_end_stream() {
        return Ok(false);
    }
    if chunked && spill.is_none_or(|s| s.is_empty()) {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    Ok(true)
}

/// Appends one chunk (size line, data, CRLF) to `out`.
/// The end of a chunked body with its trailer fields: the last chunk, the fields that
/// may be trailers (whatever their source), the empty line.
pub(crate) fn last_chunk_with(out: &mut Vec<u8>, trailers: &HeaderMap) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers {
        if super::names::may_be_trailer(name) {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
}

pub(crate) fn chunk_into(out: &mut Vec<u8>, data: &[u8]) {
    let mut size = [0u8; 18];
    let n = hex_line(&mut size, data.len());
    out.extend_from_slice(&size[..n]);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Writes the chunk-size line for `n` bytes (`1a\r\n`) into `out`; its length.
pub(crate) fn hex_line(out: &mut [u8; 18], n: usize) -> usize {
    let mut buf = [0u8; 16];
    let digits = hex_u64(&mut buf, n as u64);
    let len = digits.len();
    out[..len].copy_from_slice(digits);
    out[len..len + 2].copy_from_slice(b"\r\n");
    len + 2
}

/// `n` in lowercase hexadecimal, written at the end of `buf` without `core::fmt`.
pub(crate) fn hex_u64(buf: &mut [u8; 16], mut n: u64) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = w.write_vectored(slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// A short plain-text answer sluice makes itself (errors, refusals), as raw bytes.
pub(crate) fn simple(
    status: StatusCode,
    body: &str,
    extra: &[(&str, &str)],
    close: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + body.len());
    out.extend_from_slice(
        format!(
            "HTTP/1.1 {} {}\r\n",
            status.as_str(),
            status.canonical_reason().unwrap_or("")
        )
        .as_bytes(),
    );
    out.extend_from_slice(
        format!(
            "content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n",
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(b"date: ");
    out.extend_from_slice(crate::reply::date().as_bytes());
    out.extend_from_slice(b"\r\n");
    crate::reply::server_line(&mut out);
    for (k, v) in extra {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_size_lines() {
        let mut b = [0u8; 18];
        let n = hex_line(&mut b, 0);
        assert_eq!(&b[..n], b"0\r\n");
        let n = hex_line(&mut b, 0x1a2b);
        assert_eq!(&b[..n], b"1a2b\r\n");
    }

    #[test]
    fn numbers_in_both_bases() {
        for v in [0, 9, 10, 15, 16, 255, 1_700_000_000, u64::MAX] {
            assert_eq!(itoa_u64(&mut [0u8; 20], v), v.to_string().as_bytes());
            assert_eq!(hex_u64(&mut [0u8; 16], v), format!("{v:x}").as_bytes());
        }
    }

    #[test]
    fn head_with_close() {
        let mut out = Vec::new();
        let mut h = HeaderMap::new();
        h.insert("content-length", "2".parse().unwrap());
        head(&mut out, StatusCode::OK, &[], &h, Version::HTTP_11, false);
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n"
        );
    }
}

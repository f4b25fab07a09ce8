//! Body framing, both roles: Content-Length, chunked and (responses) close-delimited,
//! decoded from the connection's read buffer without copying (data chunks are split
//! off the buffer as `Bytes`).
//!
//! Strict by design: a chunk size that is not 1–16 hex digits, a size line with
//! anything but an extension after it, a bare LF, or data not followed by CRLF is an
//! error (the connection answers 400 if it still can, and closes).

use bytes::{Buf, Bytes, BytesMut};

/// Longest chunk-size line accepted (size and extensions).
const MAX_SIZE_LINE: usize = 4096;
/// Most trailer bytes accepted (the whole section stays in the read buffer until its
/// end: at most this much).
const MAX_TRAILERS: usize = 64 * 1024;
/// Most trailer fields accepted.
const MAX_TRAILER_FIELDS: usize = 64;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    Data(Bytes),
    /// A chunked body's trailer fields (those that may be trailers: DESIGN §18.5), once,
    /// before [`Decoded::Done`]; a body with none goes straight to `Done`.
    Trailers(Box<http::HeaderMap>),
    NeedMore,
    Done,
}

#[derive(Debug)]
pub(crate) enum Decoder {
    Length(u64),
    Chunked(Chunk),
    /// A response body delimited by the connection closing; `true` once it has.
    UntilClose(bool),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    /// The trailer section, kept at the front of the buffer until its empty line:
    /// where its current line starts, and how much of the buffer was looked at already,
    /// so a trickled trailer is scanned once.
    Trailers {
        line: usize,
        scanned: usize,
    },
    Done,
}

impl Decoder {
    pub(crate) fn length(n: u64) -> Self {
        Decoder::Length(n)
    }

    pub(crate) fn chunked() -> Self {
        Decoder::Chunked(Chunk::Size)
    }

    pub(crate) fn until_close() -> Self {
        Decoder::UntilClose(false)
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(
            self,
            Decoder::Length(0) | Decoder::Chunked(Chunk::Done) | Decoder::UntilClose(true)
        )
    }

    /// Whether the end of the connection is the end of the body.
    pub(crate) fn until_eof(&self) -> bool {
        matches!(self, Decoder::UntilClose(_))
    }

    /// The connection closed: a close-delimited body is complete.
    pub(crate) fn finish(&mut self) {
        if let Decoder::UntilClose(done) = self {
            *done = true;
        }
    }

    /// Bytes still to come, when the framing says.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Chunked(Chunk::Done) | Decoder::UntilClose(true) => Some(0),
            _ => None,
        }
    }

    /// Takes the next piece of body out of `buf`.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, &'static str> {
        match self {
            Decoder::UntilClose(true) => Ok(Decoded::Done),
            Decoder::UntilClose(false) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                Ok(Decoded::Data(buf.split().freeze()))
            }
            Decoder::Length(0) => Ok(Decoded::Done),
            Decoder::Length(rem) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let n = (*rem).min(buf.len() as u64) as usize;
                *rem -= n as u64;
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            Decoder::Chunked(state) => chunked(state, buf),
        }
    }
}

/// The next piece of a chunked body: through size lines, data, line ends and
/// trailers until data or the end is found, or more bytes are needed.
fn chunked(state: &mut Chunk, buf: &mut BytesMut) -> Result<Decoded, &'static str> {
    loop {
        match *state {
            Chunk::Size => match size_line(buf)? {
                None => return Ok(Decoded::NeedMore),
                Some((len, 0)) => {
                    buf.advance(len);
                    *state = Chunk::Trailers {
                        line: 0,
                        scanned: 0,
                    };
                }
                Some((len, size)) => {
                    buf.advance(len);
                    *state = Chunk::Data(size);
                }
            },
            Chunk::Data(rem) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let n = rem.min(buf.len() as u64) as usize;
                *state = if rem == n as u64 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(rem - n as u64)
                };
                return Ok(Decoded::Data(buf.split_to(n).freeze()));
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    if buf.first().is_some_and(|&b| b != b'\r') {
                        return Err("chunk data not followed by CRLF");
                    }
                    return Ok(Decoded::NeedMore);
                }
                if &buf[..2] != b"\r\n" {
                    return Err("chunk data not followed by CRLF");
                }
                buf.advance(2);
                *state = Chunk::Size;
            }
            Chunk::Trailers { line, scanned } => {
                return Ok(trailer_section(state, line, scanned, buf)?.unwrap_or(Decoded::NeedMore));
            }
            Chunk::Done => return Ok(Decoded::Done),
        }
    }
}

/// Looks for the end of the trailer section (the empty line), which stays at the
/// front of `buf` until it is whole: `None` when it is not here yet. The section's
/// fields that may be trailers come back as [`Decoded::Trailers`].
fn trailer_section(
    state: &mut Chunk,
    mut line: usize,
    scanned: usize,
    buf: &mut BytesMut,
) -> Result<Option<Decoded>, &'static str> {
    let mut at = scanned.max(line);
    loop {
        let Some(lf) = memchr::memchr(b'\n', &buf[at..]).map(|off| at + off) else {
            if buf.len() > MAX_TRAILERS {
                return Err("trailers too large");
            }
            *state = Chunk::Trailers {
                line,
                scanned: buf.len(),
            };
            return Ok(None);
        };
        // A line starting with LF, or a CR-less one, is a bare LF.
        if lf == line || buf[lf - 1] != b'\r' {
            return Err("bare LF in trailers");
        }
        if lf >= MAX_TRAILERS {
            return Err("trailers too large");
        }
        if lf == line + 1 {
            let section = buf.split_to(lf + 1);
            *state = Chunk::Done;
            if line == 0 {
                return Ok(Some(Decoded::Done));
            }
            return Ok(Some(match trailer_fields(&section)? {
                Some(map) => Decoded::Trailers(Box::new(map)),
                None => Decoded::Done,
            }));
        }
        line = lf + 1;
        at = line;
    }
}

/// The fields of a whole trailer section (its empty line included) that may be
/// trailers; `None` when that is none of them.
fn trailer_fields(section: &[u8]) -> Result<Option<http::HeaderMap>, &'static str> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    let parsed = match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, parsed))) => parsed,
        Err(httparse::Error::TooManyHeaders) => return Err("too many trailer fields"),
        _ => return Err("invalid trailer field"),
    };
    let mut map = http::HeaderMap::new();
    for f in parsed {
        let name =
            http::HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| "invalid trailer field")?;
        let value = http::HeaderValue::from_bytes(f.value).map_err(|_| "invalid trailer field")?;
        if super::names::may_be_trailer(&name) {
            map.append(name, value);
        }
    }
    Ok((!map.is_empty()).then_some(map))
}

/// Parses a chunk-size line at the start of `buf`: its length with CRLF, and the size.
pub(crate) fn size_line(buf: &[u8]) -> Result<Option<(usize, u64)>, &'static str> {
    let Some(lf) = buf.iter().take(MAX_SIZE_LINE).position(|&b| b == b'\n') else {
        if buf.len() >= MAX_SIZE_LINE {
            return Err("chunk size line too long");
        }
        // Refuse early what can never become a valid size.
        let digits = buf.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits > 16 || (digits < buf.len() && digits == 0 && buf[0] != b'\r') {
            return Err("invalid chunk size");
        }
        return Ok(None);
    };
    if lf == 0 || buf[lf - 1] != b'\r' {
        return Err("bare LF after chunk size");
    }
    let line = &buf[..lf - 1];
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err("invalid chunk size");
    }
    let rest = &line[digits..];
    if !rest.is_empty() && rest[0] != b';' {
        return Err("invalid chunk size");
    }
    let size = u64::from_str_radix(
        std::str::from_utf8(&line[..digits]).map_err(|_| "invalid chunk size")?,
        16,
    )
    .map_err(|_| "invalid chunk size")?;
    Ok(Some((lf + 1, size)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(dec: &mut Decoder, input: &str) -> Result<String, &'static str> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match dec.decode(&mut buf)? {
                Decoded::Data(b) => out.extend_from_slice(&b),
                Decoded::Trailers(t) => {
                    for (k, v) in t.iter() {
                        out.extend_from_slice(format!("[{k}: {}]", v.to_str().unwrap()).as_bytes());
                    }
                }
                Decoded::NeedMore => return Err("incomplete"),
                Decoded::Done => return Ok(String::from_utf8(out).unwrap()),
            }
        }
    }

    #[test]
    fn chunked_roundtrip() {
        let mut d = Decoder::chunked();
        assert_eq!(
            all(
                &mut d,
                "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\n"
            ),
            Ok("hello world[x-t: 1]".into())
        );
    }

    #[test]
    fn trailers_that_may_not_be_trailers_are_dropped() {
        let mut d = Decoder::chunked();
        assert_eq!(
            all(
                &mut d,
                "1\r\na\r\n0\r\ngrpc-status: 0\r\nContent-Length: 5\r\n\
                 Transfer-Encoding: chunked\r\nConnection: close\r\nHost: x\r\n\r\n"
            ),
            Ok("a[grpc-status: 0]".into())
        );
        let mut d = Decoder::chunked();
        assert_eq!(all(&mut d, "0\r\nHost: x\r\n\r\n"), Ok(String::new()));
    }

    proptest::proptest! {
        /// However the bytes arrive, a chunked body with trailers decodes the same, and
        /// what follows it stays in the buffer.
        #[test]
        fn trailers_decode_the_same_in_any_split(cut in proptest::collection::vec(0usize..60, 0..6)) {
            let input = b"3\r\nabc\r\n0\r\nx-a: 1\r\nx-b: two\r\n\r\nNEXT";
            let mut cuts: Vec<usize> = cut.into_iter().map(|c| c.min(input.len())).collect();
            cuts.sort_unstable();
            cuts.push(input.len());
            let mut d = Decoder::chunked();
            let mut buf = BytesMut::new();
            let (mut data, mut trailers, mut done) = (Vec::new(), None, false);
            let mut from = 0;
            for to in cuts {
                buf.extend_from_slice(&input[from..to]);
                from = to;
                while !done {
                    match d.decode(&mut buf).unwrap() {
                        Decoded::Data(b) => data.extend_from_slice(&b),
                        Decoded::Trailers(t) => trailers = Some(t),
                        Decoded::Done => done = true,
                        Decoded::NeedMore => break,
                    }
                }
            }
            proptest::prop_assert!(done);
            proptest::prop_assert_eq!(&data[..], b"abc");
            let t = trailers.unwrap();
            proptest::prop_assert_eq!(t.get("x-a").unwrap(), "1");
            proptest::prop_assert_eq!(t.get("x-b").unwrap(), "two");
            proptest::prop_assert_eq!(&buf[..], b"NEXT");
        }
    }

    #[test]
    fn chunked_errors() {
        for bad in [
            "zz\r\n",
            "5 \r\nhello\r\n0\r\n\r\n",
            "5\nhello\r\n",
            "5\r\nhelloXX",
            "-1\r\n",
            "11111111111111111\r\n",
        ] {
            let mut d = Decoder::chunked();
            assert!(
                all(&mut d, bad).is_err_and(|e| e != "incomplete"),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn length() {
        let mut d = Decoder::length(3);
        let mut buf = BytesMut::from("abcdef");
        assert_eq!(d.decode(&mut buf), Ok(Decoded::Data(Bytes::from("abc"))));
        assert_eq!(d.decode(&mut buf), Ok(Decoded::Done));
        assert_eq!(
            &buf[..],
            b"def",
            "bytes of the next request stay in the buffer"
        );
    }
}

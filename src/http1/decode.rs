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
/// Most trailer bytes accepted; trailers are read and dropped.
const MAX_TRAILERS: usize = 64 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    Data(Bytes),
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
    /// Trailer lines: bytes of complete lines taken so far, and how much of the current
    /// (incomplete) line was already looked at, so a trickled trailer is scanned once.
    Trailers {
        seen: usize,
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
                        seen: 0,
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
            Chunk::Trailers { seen, scanned } => {
                if !trailer_line(state, seen, scanned, buf)? {
                    return Ok(Decoded::NeedMore);
                }
            }
            Chunk::Done => return Ok(Decoded::Done),
        }
    }
}

/// Takes one trailer line (`seen` bytes of trailers so far, `scanned` of `buf` looked
/// at already); `false` when its end is not here yet. The empty line ends the body.
fn trailer_line(
    state: &mut Chunk,
    seen: usize,
    scanned: usize,
    buf: &mut BytesMut,
) -> Result<bool, &'static str> {
    let Some(lf) = buf[scanned..]
        .iter()
        .position(|&b| b == b'\n')
        .map(|off| scanned + off)
    else {
        if seen + buf.len() > MAX_TRAILERS {
            return Err("trailers too large");
        }
        *state = Chunk::Trailers {
            seen,
            scanned: buf.len(),
        };
        return Ok(false);
    };
    if lf == 0 || buf[lf - 1] != b'\r' {
        return Err("bare LF in trailers");
    }
    let empty = lf == 1;
    buf.advance(lf + 1);
    if empty {
        *state = Chunk::Done;
    } else {
        if seen + lf + 1 > MAX_TRAILERS {
            return Err("trailers too large");
        }
        *state = Chunk::Trailers {
            seen: seen + lf + 1,
            scanned: 0,
        };
    }
    Ok(true)
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
            Ok("hello world".into())
        );
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

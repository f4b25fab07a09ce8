//! Finding where a head ends while it arrives in pieces, looking at each byte once.
//!
//! A scanner remembers how far it got, so a head trickled one byte per read costs
//! linear, not quadratic, time. It must be reset (made anew) whenever bytes are taken
//! off the front of the buffer it scans. Line ends are found with `memchr` (vector
//! instructions): a byte-at-a-time loop cost about 1,000 instructions a request.

use super::head::HeadError;
use super::MAX_HEAD;

/// The end of a request head: CRLF lines only (a bare LF is refused as soon as it is
/// seen, before the head is complete), empty lines before the request line tolerated
/// (RFC 9112 §2.2).
#[derive(Debug, Default)]
pub(crate) struct RequestScan {
    /// Next byte to look at.
    pos: usize,
    /// Where the current line starts.
    line_start: usize,
    /// Where the request line starts, once known.
    start: Option<usize>,
}

impl RequestScan {
    /// Where the head ends (one past its blank line), once it is complete.
    pub(crate) fn find_end(&mut self, buf: &[u8]) -> Result<Option<usize>, HeadError> {
        let start = match self.start {
            Some(s) => s,
            None => {
                while buf.len() >= self.pos + 2 && &buf[self.pos..self.pos + 2] == b"\r\n" {
                    self.pos += 2;
                }
                if buf[self.pos..].iter().all(|&b| b == b'\r') && buf.len() < self.pos + 2 {
                    // Nothing but (part of) another empty line so far.
                    return limit(buf.len()).map(|()| None);
                }
                self.line_start = self.pos;
                self.start = Some(self.pos);
                self.pos
            }
        };
        while let Some(off) = memchr::memchr(b'\n', &buf[self.pos..]) {
            let lf = self.pos + off;
            if lf == 0 || buf[lf - 1] != b'\r' {
                return Err(HeadError::Bad("bare LF line ending"));
            }
            if lf - 1 == self.line_start && self.line_start > start {
                return Ok(Some(lf + 1));
            }
            self.line_start = lf + 1;
            self.pos = lf + 1;
        }
        self.pos = buf.len();
        limit(buf.len()).map(|()| None)
    }
}

fn limit(len: usize) -> Result<(), HeadError> {
    if len > MAX_HEAD {
        Err(HeadError::TooLarge)
    } else {
        Ok(())
    }
}

/// The end of a response head from a backend. Backends get some leniency: a bare LF
/// ends lines too.
#[derive(Debug, Default)]
pub(crate) struct ResponseScan {
    pos: usize,
}

impl ResponseScan {
    pub(crate) fn find_end(&mut self, buf: &[u8]) -> Option<usize> {
        while let Some(off) = memchr::memchr(b'\n', &buf[self.pos..]) {
            let lf = self.pos + off;
            match (buf.get(lf + 1), buf.get(lf + 2)) {
                (Some(b'\n'), _) => return Some(lf + 2),
                (Some(b'\r'), Some(b'\n')) => return Some(lf + 3),
                (None, _) | (Some(b'\r'), None) => {
                    // Too few bytes after this LF to tell: look at it again next time.
                    self.pos = lf;
                    return None;
                }
                _ => self.pos = lf + 1,
            }
        }
        self.pos = buf.len();
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `s` one byte at a time, as a trickling peer would.
    fn trickle_request(s: &[u8]) -> Result<Option<usize>, HeadError> {
        let mut scan = RequestScan::default();
        for n in 1..=s.len() {
            if let Some(end) = scan.find_end(&s[..n])? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    #[test]
    fn request_ends_found_piece_by_piece() {
        let h = b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
        let whole = RequestScan::default().find_end(h).unwrap();
        assert_eq!(whole, Some(h.len() - 4));
        assert_eq!(trickle_request(h).unwrap(), whole);
        assert_eq!(
            trickle_request(b"GET / HTTP/1.1\r\nHost: a\nX: 1\r\n\r\n").unwrap_err(),
            HeadError::Bad("bare LF line ending")
        );
        assert_eq!(trickle_request(b"\r\n\r\n\r").unwrap(), None);
    }

    #[test]
    fn response_ends_found_piece_by_piece() {
        for (h, end) in [
            (&b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody"[..], 25),
            (&b"HTTP/1.1 200 OK\nA: b\n\nbody"[..], 22),
            (&b"HTTP/1.1 200 OK\r\n\r\n"[..], 19),
        ] {
            assert_eq!(ResponseScan::default().find_end(h), Some(end), "{h:?}");
            let mut scan = ResponseScan::default();
            let found = (1..=h.len()).find_map(|n| scan.find_end(&h[..n]));
            assert_eq!(found, Some(end), "trickled {h:?}");
        }
    }
}

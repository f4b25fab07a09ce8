//! Request heads: found, parsed and checked so that no request can be smuggled.
//!
//! httparse does the tokenising; the rules it leaves open are enforced here, on the raw
//! bytes, before anything is dispatched: bare LF line endings, obs-fold, white space in
//! or before a field name's colon, both Content-Length and Transfer-Encoding, differing
//! Content-Length values (400), and any transfer coding other than one final `chunked`
//! (501). A head that fails here never reaches a route, let alone a backend.

use std::mem::MaybeUninit;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Uri, Version};

/// The largest request head accepted: more is 431.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields accepted, Host included: more is 431.
pub const MAX_HEADERS: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

#[derive(Debug)]
pub struct Head {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    pub keep_alive: bool,
    pub expect_continue: bool,
}

/// Why a head was refused, and so which status it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// 400, with the reason for the log and the short body.
    Bad(&'static str),
    /// 431.
    TooLarge,
    /// 501.
    Coding,
}

/// Where the head ends (one past its blank line), if it is complete; checks line endings
/// on the way so a bare LF is refused even before the head is complete.
pub fn find_end(buf: &[u8]) -> Result<Option<usize>, HeadError> {
    let mut i = 0;
    // Empty lines before a request line are tolerated (RFC 9112 §2.2).
    while buf.len() >= i + 2 && &buf[i..i + 2] == b"\r\n" {
        i += 2;
    }
    let start = i;
    let mut line_start = i;
    while let Some(off) = memchr_lf(&buf[i..]) {
        let lf = i + off;
        if lf == 0 || buf[lf - 1] != b'\r' {
            return Err(HeadError::Bad("bare LF line ending"));
        }
        if lf - 1 == line_start && line_start > start {
            return Ok(Some(lf + 1));
        }
        line_start = lf + 1;
        i = lf + 1;
    }
    if buf.len() > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    Ok(None)
}

fn memchr_lf(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a complete head (as returned by [`find_end`], leading empty lines included).
pub fn parse(head: Bytes) -> Result<Head, HeadError> {
    if head.len() > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    check_fields(&head)?;
    // Uninitialised slots: zero-filling 100 of them cost more than parsing a head.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(&head, &mut slots) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(HeadError::Bad("incomplete head")),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(httparse::Error::Version) => return Err(HeadError::Bad("unsupported HTTP version")),
        Err(_) => return Err(HeadError::Bad("malformed request head")),
    }
    let method = Method::from_bytes(req.method.unwrap_or("").as_bytes())
        .map_err(|_| HeadError::Bad("invalid method"))?;
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    let path = req.path.unwrap_or("");
    let uri = Uri::from_maybe_shared(head.slice_ref(path.as_bytes()))
        .map_err(|_| HeadError::Bad("invalid request target"))?;
    if method == Method::CONNECT {
        return Err(HeadError::Bad("CONNECT is not served"));
    }
    if uri.path_and_query().is_none() && path != "*" {
        return Err(HeadError::Bad("invalid request target"));
    }

    // Room for the forwarding fields a proxy adds, so they do not regrow the map.
    let mut headers = HeaderMap::with_capacity(req.headers.len() + 4);
    let mut content_length: Option<u64> = None;
    let mut te_seen = false;
    let mut codings: Vec<&[u8]> = Vec::new();
    let mut hosts = 0;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| HeadError::Bad("invalid header name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice_ref(h.value))
            .map_err(|_| HeadError::Bad("invalid header value"))?;
        if name == http::header::CONTENT_LENGTH {
            for part in h.value.split(|&b| b == b',') {
                let n = parse_length(trim(part)).ok_or(HeadError::Bad("invalid Content-Length"))?;
                if content_length.is_some_and(|prev| prev != n) {
                    return Err(HeadError::Bad("differing Content-Length values"));
                }
                content_length = Some(n);
            }
        } else if name == http::header::TRANSFER_ENCODING {
            te_seen = true;
            if h.value.iter().any(|&b| b.is_ascii_control() && b != b'\t') {
                return Err(HeadError::Bad("control character in Transfer-Encoding"));
            }
            codings.extend(
                h.value
                    .split(|&b| b == b',')
                    .map(trim)
                    .filter(|c| !c.is_empty()),
            );
        } else if name == http::header::HOST {
            hosts += 1;
        } else if name == http::header::CONNECTION {
            for token in h.value.split(|&b| b == b',').map(trim) {
                conn_close |= token.eq_ignore_ascii_case(b"close");
                conn_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == http::header::EXPECT {
            expect_continue = trim(h.value).eq_ignore_ascii_case(b"100-continue");
        }
        headers.append(name, value);
    }
    if version == Version::HTTP_11 && hosts != 1 {
        return Err(HeadError::Bad(if hosts == 0 {
            "missing Host"
        } else {
            "more than one Host"
        }));
    }
    if hosts > 1 {
        return Err(HeadError::Bad("more than one Host"));
    }
    let framing = if te_seen {
        if content_length.is_some() {
            return Err(HeadError::Bad("both Content-Length and Transfer-Encoding"));
        }
        match codings.as_slice() {
            [only] if only.eq_ignore_ascii_case(b"chunked") => Framing::Chunked,
            _ => return Err(HeadError::Coding),
        }
    } else {
        match content_length {
            Some(0) | None => Framing::None,
            Some(n) => Framing::Length(n),
        }
    };
    let keep_alive = match version {
        Version::HTTP_11 => !conn_close,
        _ => conn_keep_alive && !conn_close,
    };
    Ok(Head {
        method,
        uri,
        version,
        headers,
        framing,
        keep_alive,
        expect_continue: expect_continue && version == Version::HTTP_11,
    })
}

/// Field lines must not fold and their names must be tokens right up to the colon.
fn check_fields(head: &[u8]) -> Result<(), HeadError> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    // Skip tolerated empty lines, then the request line.
    for l in lines.by_ref() {
        if !l.is_empty() {
            break;
        }
    }
    for line in lines {
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(HeadError::Bad("obsolete line folding"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HeadError::Bad("header line without a colon"))?;
        if colon == 0 || !line[..colon].iter().all(|&b| is_tchar(b)) {
            return Err(HeadError::Bad("invalid character in a header name"));
        }
    }
    Ok(())
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &b[start..end]
}

fn parse_length(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Result<Head, HeadError> {
        let b = Bytes::from(s.to_string());
        let end = find_end(&b)?.expect("complete head");
        parse(b.slice(..end))
    }

    #[test]
    fn plain_get() {
        let h = head("GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(h.uri.path(), "/a");
        assert_eq!(h.framing, Framing::None);
        assert!(h.keep_alive);
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        let bad = |s: &str| head(s).unwrap_err();
        assert_eq!(
            bad("GET / HTTP/1.1\nHost: x\r\n\r\n"),
            HeadError::Bad("bare LF line ending")
        );
        assert_eq!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HeadError::Bad("both Content-Length and Transfer-Encoding")
        );
        assert_eq!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
            HeadError::Bad("differing Content-Length values")
        );
        assert_eq!(
            bad("GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\n\r\n"),
            HeadError::Bad("obsolete line folding")
        );
        assert_eq!(
            bad("GET / HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n"),
            HeadError::Bad("invalid character in a header name")
        );
        assert_eq!(
            bad("GET / HTTP/1.1\r\nHost: x\r\n X-A: 1\r\n\r\n"),
            HeadError::Bad("obsolete line folding")
        );
        assert_eq!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            HeadError::Coding
        );
        assert_eq!(bad("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), HeadError::Coding);
        // httparse or our own check refuses it first; either way a 400.
        assert!(matches!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\x0b\r\n\r\n"),
            HeadError::Bad(_)
        ));
        assert_eq!(
            bad("GET / HTTP/1.1\r\n\r\n"),
            HeadError::Bad("missing Host")
        );
    }

    #[test]
    fn same_content_length_twice_is_one() {
        let h =
            head("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")
                .unwrap();
        assert_eq!(h.framing, Framing::Length(5));
        let h = head("POST / HTTP/1.1\r\nHost: x\r\ntransfer-encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Chunked);
    }

    #[test]
    fn limits() {
        let mut s = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for i in 0..100 {
            s.push_str(&format!("X-{i}: v\r\n"));
        }
        s.push_str("\r\n");
        assert_eq!(
            head(&s).unwrap_err(),
            HeadError::TooLarge,
            "101 fields is over the limit"
        );
        let big = "a".repeat(MAX_HEAD + 1);
        assert_eq!(find_end(big.as_bytes()).unwrap_err(), HeadError::TooLarge);
    }

    #[test]
    fn http10_keep_alive_is_opt_in() {
        assert!(!head("GET / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(
            head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .unwrap()
                .keep_alive
        );
    }
}

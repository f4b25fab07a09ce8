//! The application's response head (CGI style): `Name: value` lines ending at an empty
//! line, CRLF or bare LF. Parsed strictly: one `Status` at most (a second is a broken
//! application, not a choice), `Location` without `Status` means `302`. Connection-level
//! fields (`Connection`, `Keep-Alive`, …) are the hop's, not the application's: dropped,
//! as nginx does (DESIGN §18.4; DokuWiki and others send them). What frames the body is
//! checked: `Transfer-Encoding` is refused (records frame the body, never a coding the
//! application chose), and a `Content-Length` is kept and held to the body.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

/// The most a response head may take.
pub(crate) const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    #[error("two Status fields")]
    TwoStatus,
    #[error("a malformed Status field")]
    BadStatus,
    #[error("a Transfer-Encoding field in the response (FastCGI records frame the body)")]
    TransferEncoding,
    #[error("a malformed or conflicting Content-Length")]
    BadLength,
    #[error("a malformed header line")]
    Malformed,
    #[error("a response head over {MAX_HEAD} bytes")]
    TooLarge,
}

#[derive(Debug)]
pub(crate) struct Head {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body's length, when the application declared it.
    pub length: Option<u64>,
}

/// Fields about the connection, which the application does not own: dropped.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// The head at the start of `buf` and its length (terminator included), `Ok(None)`
/// while it is incomplete.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
    let mut headers = HeaderMap::new();
    let mut status: Option<StatusCode> = None;
    let mut length: Option<u64> = None;
    let mut at = 0;
    loop {
        let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') else {
            if buf.len() > MAX_HEAD {
                return Err(HeadError::TooLarge);
            }
            return Ok(None);
        };
        let line = &buf[at..at + nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        at += nl + 1;
        if at > MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        if line.is_empty() {
            break;
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HeadError::Malformed)?;
        let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| HeadError::Malformed)?;
        let value = line[colon + 1..].trim_ascii();
        if name.as_str() == "status" {
            if status.is_some() {
                return Err(HeadError::TwoStatus);
            }
            let code = value.get(..3).ok_or(HeadError::BadStatus)?;
            if value.len() > 3 && value[3] != b' ' {
                return Err(HeadError::BadStatus);
            }
            let code = std::str::from_utf8(code)
                .ok()
                .and_then(|c| c.parse::<u16>().ok())
                .filter(|c| (200..=599).contains(c))
                .ok_or(HeadError::BadStatus)?;
            status = Some(StatusCode::from_u16(code).map_err(|_| HeadError::BadStatus)?);
            continue;
        }
        if HOP_BY_HOP.contains(&name.as_str()) {
            tracing::debug!(
                "sluice: fastcgi: dropped the hop-by-hop field `{name}` of the application's answer"
            );
            continue;
        }
        if name == http::header::TRANSFER_ENCODING {
            return Err(HeadError::TransferEncoding);
        }
        if name == http::header::CONTENT_LENGTH {
            // The same rule as an HTTP/1.1 head's (a list of equal values is one).
            length = Some(
                crate::http1::head::length_field(value, length)
                    .map_err(|_| HeadError::BadLength)?,
            );
            continue;
        }
        let value = HeaderValue::from_bytes(value).map_err(|_| HeadError::Malformed)?;
        headers.append(name, value);
    }
    let status = match status {
        Some(s) => s,
        None if headers.contains_key(http::header::LOCATION) => StatusCode::FOUND,
        None => StatusCode::OK,
    };
    Ok(Some((
        Head {
            status,
            headers,
            length,
        },
        at,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let (h, n) = parse(b"Status: 404 Not Found\r\nX-A: 1\r\n\r\nbody")
            .unwrap()
            .unwrap();
        assert_eq!((h.status.as_u16(), n), (404, 33));
        assert_eq!(h.headers["x-a"], "1");
        let (h, _) = parse(b"Location: /x\n\n").unwrap().unwrap();
        assert_eq!(h.status, StatusCode::FOUND);
        let (h, _) = parse(b"Content-Type: text/html\nContent-Length: 5\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert!(h.headers.get("content-length").is_none());
        assert_eq!(h.length, Some(5));
        let (h, _) = parse(b"Connection: close\nKeep-Alive: timeout=5\nX-A: 1\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.headers.len(), 1, "hop-by-hop fields are dropped");
        assert_eq!(
            parse(b"Content-Length: 5\nContent-Length: 6\n\n").unwrap_err(),
            HeadError::BadLength
        );
        assert_eq!(
            parse(b"Content-Length: -1\n\n").unwrap_err(),
            HeadError::BadLength
        );
        assert!(parse(b"Status: 200\r\nX-A: 1").unwrap().is_none());
        assert_eq!(
            parse(b"Status: 200\nStatus: 500\n\n").unwrap_err(),
            HeadError::TwoStatus
        );
        assert_eq!(parse(b"Status: abc\n\n").unwrap_err(), HeadError::BadStatus);
        assert_eq!(
            parse(b"Status: 2000\n\n").unwrap_err(),
            HeadError::BadStatus
        );
        assert_eq!(
            parse(b"Transfer-Encoding: chunked\n\n").unwrap_err(),
            HeadError::TransferEncoding
        );
        assert_eq!(parse(b"no colon\n\n").unwrap_err(), HeadError::Malformed);
        assert_eq!(parse(b"Bad Name: x\n\n").unwrap_err(), HeadError::Malformed);
        let big = vec![b'a'; MAX_HEAD + 1];
        assert_eq!(parse(&big).unwrap_err(), HeadError::TooLarge);
    }
}

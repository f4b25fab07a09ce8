//! Field names as they arrive on the wire, turned into [`HeaderName`]s.
//!
//! `HeaderName::from_bytes` lowercases a name byte by byte into a buffer and then looks
//! it up among every standard name: about 110 instructions a field, ten or more fields
//! a proxied request (callgrind). The names nearly every head carries are told apart
//! here by their length, first letter and two or three 8-byte words compared at once,
//! case folded by setting each byte's 0x20 bit; anything else goes the long way.
//!
//! Only for names httparse has already checked to be tokens: folding with 0x20 equals
//! ASCII case folding only there (a `\r`, 0x0D, would fold onto `-`, 0x2D, and it is no
//! token character). Never builds a name of its own: what it returns is one of the
//! `http` crate's constants, so a field is the same whichever way it was named.

use http::header::{self, HeaderName, InvalidHeaderName};

/// Whether field `name` (any case) is one of sluice's own, `X-Sluice-*`, in any
/// spelling a backend would take for it (`_` for `-`): never passed on from a client
/// or a backend.
pub(crate) fn is_sluice(name: &[u8]) -> bool {
    name.len() > 9
        && name[..9]
            .iter()
            .zip(b"x-sluice-")
            .all(|(&a, &n)| a.to_ascii_lowercase() == n || (a == b'_' && n == b'-'))
}

/// The name `token` spells (any case); `token` is a header field name httparse parsed.
#[inline]
pub(crate) fn from_token(token: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    match known(token) {
        Some(n) => Ok(n),
        None => HeaderName::from_bytes(token),
    }
}

/// One of the common standard names, when `b` spells it.
#[inline]
fn known(b: &[u8]) -> Option<HeaderName> {
    let first = *b.first()? | 0x20;
    let hit = |lower: &[u8; 32], name: HeaderName| folded_eq(b, lower).then_some(name);
    match (b.len(), first) {
        (4, b'd') => hit(&const { pad(b"date") }, header::DATE),
        (4, b'h') => hit(&const { pad(b"host") }, header::HOST),
        (4, b'e') => hit(&const { pad(b"etag") }, header::ETAG),
        (4, b'v') => hit(&const { pad(b"vary") }, header::VARY),
        (6, b'a') => hit(&const { pad(b"accept") }, header::ACCEPT),
        (6, b'c') => hit(&const { pad(b"cookie") }, header::COOKIE),
        (6, b'o') => hit(&const { pad(b"origin") }, header::ORIGIN),
        (6, b's') => hit(&const { pad(b"server") }, header::SERVER),
        (6, b'p') => hit(&const { pad(b"pragma") }, header::PRAGMA),
        (7, b'e') => hit(&const { pad(b"expires") }, header::EXPIRES),
        (7, b'r') => hit(&const { pad(b"referer") }, header::REFERER),
        (7, b'u') => hit(&const { pad(b"upgrade") }, header::UPGRADE),
        (8, b'l') => hit(&const { pad(b"location") }, header::LOCATION),
        (10, b'c') => hit(&const { pad(b"connection") }, header::CONNECTION),
        (10, b's') => hit(&const { pad(b"set-cookie") }, header::SET_COOKIE),
        (10, b'u') => hit(&const { pad(b"user-agent") }, header::USER_AGENT),
        (12, b'c') => hit(&const { pad(b"content-type") }, header::CONTENT_TYPE),
        (13, b'a') => hit(&const { pad(b"accept-ranges") }, header::ACCEPT_RANGES)
            .or_else(|| hit(&const { pad(b"authorization") }, header::AUTHORIZATION)),
        (13, b'c') => hit(&const { pad(b"cache-control") }, header::CACHE_CONTROL),
        (13, b'i') => hit(&const { pad(b"if-none-match") }, header::IF_NONE_MATCH),
        (13, b'l') => hit(&const { pad(b"last-modified") }, header::LAST_MODIFIED),
        (14, b'c') => hit(&const { pad(b"content-length") }, header::CONTENT_LENGTH),
        (15, b'a') => hit(&const { pad(b"accept-encoding") }, header::ACCEPT_ENCODING)
            .or_else(|| hit(&const { pad(b"accept-language") }, header::ACCEPT_LANGUAGE)),
        (16, b'c') => hit(
            &const { pad(b"content-encoding") },
            header::CONTENT_ENCODING,
        ),
        (17, b'i') => hit(
            &const { pad(b"if-modified-since") },
            header::IF_MODIFIED_SINCE,
        ),
        (17, b't') => hit(
            &const { pad(b"transfer-encoding") },
            header::TRANSFER_ENCODING,
        ),
        _ => None,
    }
}

/// A lowercase name in a fixed-size array, so its words load without bounds checks.
const fn pad(s: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < s.len() {
        out[i] = s[i];
        i += 1;
    }
    out
}

/// Whether `b` (4 to 24 bytes) folds to as many of `lower`'s first bytes: overlapping
/// words at the start, the end and (past 16 bytes) the middle.
#[inline(always)]
fn folded_eq(b: &[u8], lower: &[u8; 32]) -> bool {
    let n = b.len();
    debug_assert!((4..=24).contains(&n));
    if n < 8 {
        const FOLD: u32 = 0x2020_2020;
        let w = |s: &[u8], at: usize| u32::from_le_bytes([s[at], s[at + 1], s[at + 2], s[at + 3]]);
        return w(b, 0) | FOLD == w(lower, 0) && w(b, n - 4) | FOLD == w(lower, n - 4);
    }
    const FOLD: u64 = 0x2020_2020_2020_2020;
    let w = |s: &[u8], at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&s[at..at + 8]);
        u64::from_le_bytes(a)
    };
    w(b, 0) | FOLD == w(lower, 0)
        && w(b, n - 8) | FOLD == w(lower, n - 8)
        && (n <= 16 || w(b, 8) | FOLD == w(lower, 8))
}

/// Whether a field may travel as a trailer (DESIGN §18.5; RFC 9110 §6.5.1): never
/// framing, routing, connection-level (hop-by-hop) fields, nor those that must be
/// known before the content (its type, coding and range, authentication, controls).
pub(crate) fn may_be_trailer(name: &HeaderName) -> bool {
    use http::header as h;
    const NEVER: [HeaderName; 26] = [
        h::CONNECTION,
        h::TRANSFER_ENCODING,
        h::CONTENT_LENGTH,
        h::TE,
        h::TRAILER,
        h::UPGRADE,
        h::HOST,
        h::CONTENT_TYPE,
        h::CONTENT_ENCODING,
        h::CONTENT_RANGE,
        h::RANGE,
        h::EXPECT,
        h::MAX_FORWARDS,
        h::AUTHORIZATION,
        h::PROXY_AUTHORIZATION,
        h::PROXY_AUTHENTICATE,
        h::WWW_AUTHENTICATE,
        h::SET_COOKIE,
        h::COOKIE,
        h::CACHE_CONTROL,
        h::PRAGMA,
        h::AGE,
        h::EXPIRES,
        h::DATE,
        h::LOCATION,
        h::VARY,
    ];
    if NEVER.contains(name) {
        return false;
    }
    let n = name.as_str();
    !(n == "keep-alive" || n == "proxy-connection" || n == "retry-after" || n.starts_with("if-"))
}

/// Drops from `trailers` the fields that may not be trailers ([`may_be_trailer`]).
pub(crate) fn keep_trailers(trailers: &mut http::HeaderMap) {
    if trailers.keys().all(may_be_trailer) {
        return;
    }
    let drop: Vec<HeaderName> = trailers
        .keys()
        .filter(|k| !may_be_trailer(k))
        .cloned()
        .collect();
    for k in drop {
        trailers.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    const NAMES: &[&str] = &[
        "date",
        "host",
        "etag",
        "vary",
        "accept",
        "cookie",
        "origin",
        "server",
        "pragma",
        "expires",
        "referer",
        "upgrade",
        "location",
        "connection",
        "set-cookie",
        "user-agent",
        "content-type",
        "accept-ranges",
        "authorization",
        "cache-control",
        "if-none-match",
        "last-modified",
        "content-length",
        "accept-encoding",
        "accept-language",
        "content-encoding",
        "if-modified-since",
        "transfer-encoding",
    ];

    #[test]
    fn every_known_name_is_found_in_any_case() {
        for n in NAMES {
            let want = HeaderName::from_bytes(n.as_bytes()).unwrap();
            assert_eq!(known(n.as_bytes()), Some(want.clone()), "{n}");
            assert_eq!(known(n.to_ascii_uppercase().as_bytes()), Some(want), "{n}");
        }
        // One letter off at the start, the middle or the end: not that name.
        for n in NAMES {
            for at in [0, n.len() / 2, n.len() - 1] {
                let mut b = n.as_bytes().to_vec();
                b[at] = if b[at] == b'x' { b'y' } else { b'x' };
                assert_ne!(
                    known(&b).as_ref().map(HeaderName::as_str),
                    Some(*n),
                    "{}",
                    String::from_utf8_lossy(&b)
                );
            }
        }
    }

    /// A token's characters (RFC 9110 §5.6.2), as httparse accepts them in a name.
    const TCHAR: &[u8] =
        b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

    /// A known name with each letter in either case and maybe one byte changed, or any
    /// token.
    fn token() -> impl Strategy<Value = Vec<u8>> {
        let near_known = proptest::sample::select(NAMES).prop_flat_map(|n| {
            let changed = proptest::option::of((0..n.len(), proptest::sample::select(TCHAR)));
            (
                proptest::collection::vec(proptest::bool::ANY, n.len()),
                changed,
            )
                .prop_map(move |(upper, changed)| {
                    let mut b: Vec<u8> = n
                        .bytes()
                        .zip(upper)
                        .map(|(c, u)| if u { c.to_ascii_uppercase() } else { c })
                        .collect();
                    if let Some((at, c)) = changed {
                        b[at] = c;
                    }
                    b
                })
        });
        let any = proptest::collection::vec(proptest::sample::select(TCHAR), 1..30);
        proptest::prop_oneof![near_known, any]
    }

    proptest::proptest! {
        #[test]
        fn a_token_names_what_http_would_name(b in token()) {
            let ours = from_token(&b).map(|n| n.as_str().to_owned()).ok();
            let theirs = HeaderName::from_bytes(&b).map(|n| n.as_str().to_owned()).ok();
            proptest::prop_assert_eq!(ours, theirs);
        }
    }
}

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
    name.len() > 9 && spells(&name[..9], b"x-sluice-")
}

/// What a proxy does with a field for its name alone (DESIGN §8.9), in any case: the
/// one classifier behind the map's scrub (`proxy::headers`), an answer's fields as
/// sent ([`super::head`]) and a request's fields written for a backend. Told apart by
/// length and first letter, then one comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Nothing in its name alone.
    Other,
    /// Hop-by-hop: its place in [`HOP_BY_HOP`] (`Connection` is 0).
    HopByHop(u8),
    /// `TE`: hop-by-hop, but a request's `trailers` goes on.
    Te,
    /// `X-Sluice-*`, in any spelling ([`is_sluice`]).
    Sluice,
    /// `X-Powered-By`: an answer's is dropped.
    PoweredBy,
    /// Carries a client's address or overrides the URL ([`FORWARDING`], `_` read as
    /// `-`): an untrusted client's go. `ours_spelled`: `X-Forwarded-For/Proto/Host`
    /// written with a `_`, which go for every client (sluice sets the real ones).
    Forwarding { ours_spelled: bool },
}

/// `Connection`'s place in [`HOP_BY_HOP`]: read for the options it names.
pub(crate) const CONNECTION_AT: u8 = 0;
/// `Transfer-Encoding`'s place in [`HOP_BY_HOP`]: read for an answer's framing.
pub(crate) const TRANSFER_ENCODING_AT: u8 = 3;

/// `Trailer` is not among them: it announces the trailers, which pass end to end
/// (RFC 9110 §6.6.2; Go's HTTP/2 server keeps only the request trailers it announces).
pub(crate) static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::EXPECT,
];

/// Fields that carry a client's address or override the URL, dropped from a client
/// outside `trust`: the forwarding fields, the other client-address and scheme
/// spellings some frameworks believe, and the URL overrides some servers route by.
/// The first three are the ones sluice sets.
pub(crate) const FORWARDING: [&[u8]; 18] = [
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
    b"x-forwarded-port",
    b"x-forwarded-prefix",
    b"x-forwarded-scheme",
    b"x-forwarded-ssl",
    b"x-original-forwarded-for",
    b"front-end-https",
    b"forwarded",
    b"x-real-ip",
    b"true-client-ip",
    b"cf-connecting-ip",
    b"client-ip",
    b"x-client-ip",
    b"x-cluster-client-ip",
    b"x-original-url",
    b"x-rewrite-url",
];

/// What `name` (any case; a token, as httparse and `HeaderName` hold it) is to a proxy
/// ([`Kind`]).
#[inline]
pub(crate) fn kind(name: &[u8]) -> Kind {
    let Some(&first) = name.first() else {
        return Kind::Other;
    };
    let is = |lower: &[u8; 32]| folded_eq(name, lower);
    match (name.len(), first | 0x20) {
        (2, b't') if name.eq_ignore_ascii_case(b"te") => Kind::Te,
        (6, b'e') if is(&const { pad(b"expect") }) => Kind::HopByHop(7),
        (7, b'u') if is(&const { pad(b"upgrade") }) => Kind::HopByHop(4),
        (10, b'c') if is(&const { pad(b"connection") }) => Kind::HopByHop(CONNECTION_AT),
        (10, b'k') if is(&const { pad(b"keep-alive") }) => Kind::HopByHop(1),
        (12, b'x') if is(&const { pad(b"x-powered-by") }) => Kind::PoweredBy,
        (16, b'p') if is(&const { pad(b"proxy-connection") }) => Kind::HopByHop(2),
        (17, b't') if is(&const { pad(b"transfer-encoding") }) => {
            Kind::HopByHop(TRANSFER_ENCODING_AT)
        }
        (18, b'p') if is(&const { pad(b"proxy-authenticate") }) => Kind::HopByHop(5),
        (19, b'p') if is(&const { pad(b"proxy-authorization") }) => Kind::HopByHop(6),
        // Every forwarding name starts with one of these, and is 9 to 24 bytes long.
        (9..=24, b'x' | b'f' | b't' | b'c') => {
            if first | 0x20 == b'x' && is_sluice(name) {
                return Kind::Sluice;
            }
            match FORWARDING.iter().position(|n| spells(name, n)) {
                Some(i) => Kind::Forwarding {
                    ours_spelled: i < 3 && name.contains(&b'_'),
                },
                None => Kind::Other,
            }
        }
        (_, b'x') if is_sluice(name) => Kind::Sluice,
        _ => Kind::Other,
    }
}

/// What a request field's name tells the parser about framing and the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fact {
    Other,
    ContentLength,
    TransferEncoding,
    Host,
    Connection,
    Upgrade,
    Te,
    Expect,
    /// Not a framing fact: noted for compression, which asks of every request.
    AcceptEncoding,
    Authorization,
}

/// Which [`Fact`] `name` (any case; a token) is, as [`kind`] tells a name's kind: by
/// its length and first byte, then one folded comparison.
#[inline]
pub(crate) fn fact(name: &[u8]) -> Fact {
    let Some(&first) = name.first() else {
        return Fact::Other;
    };
    let is = |lower: &[u8; 32]| folded_eq(name, lower);
    match (name.len(), first | 0x20) {
        (2, b't') if name.eq_ignore_ascii_case(b"te") => Fact::Te,
        (4, b'h') if is(&const { pad(b"host") }) => Fact::Host,
        (6, b'e') if is(&const { pad(b"expect") }) => Fact::Expect,
        (7, b'u') if is(&const { pad(b"upgrade") }) => Fact::Upgrade,
        (10, b'c') if is(&const { pad(b"connection") }) => Fact::Connection,
        (13, b'a') if is(&const { pad(b"authorization") }) => Fact::Authorization,
        (15, b'a') if is(&const { pad(b"accept-encoding") }) => Fact::AcceptEncoding,
        (14, b'c') if is(&const { pad(b"content-length") }) => Fact::ContentLength,
        (17, b't') if is(&const { pad(b"transfer-encoding") }) => Fact::TransferEncoding,
        _ => Fact::Other,
    }
}

/// Whether `name` (any case) spells the lower-case `field`, reading `_` as `-` (CGI-style
/// servers and some frameworks fold the two, so `X_Forwarded_For` would pass as the
/// real thing).
pub(crate) fn spells(name: &[u8], field: &[u8]) -> bool {
    name.len() == field.len()
        && name
            .iter()
            .zip(field)
            .all(|(&a, &b)| a.to_ascii_lowercase() == b || (a == b'_' && b == b'-'))
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
pub(crate) const fn pad(s: &[u8]) -> [u8; 32] {
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
pub(crate) fn folded_eq(b: &[u8], lower: &[u8; 32]) -> bool {
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

/// Lower-cases ASCII letters in place, eight bytes a step: the same result as
/// `make_ascii_lowercase` for any bytes (a property test holds it), a seventh of the
/// instructions on a field name (a byte-at-a-time loop cost ~540 of a keep-alive
/// request's answer of eight fields; docs/performance.md, twelfth part).
#[inline]
pub(crate) fn lower_in_place(b: &mut [u8]) {
    let mut words = b.chunks_exact_mut(8);
    for w in words.by_ref() {
        let x = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        w.copy_from_slice(&lower_word(x).to_le_bytes());
    }
    words.into_remainder().make_ascii_lowercase();
}

/// Each byte of `x` in `A..=Z` gains its 0x20 bit; every other byte is left alone.
/// Each byte's low seven bits plus 0x3F reach the high bit from `A` (0x41) up, plus
/// 0x25 from past `Z` (0x5B) up, and neither carries into the next byte; a byte with
/// its own high bit set is no letter.
#[inline(always)]
fn lower_word(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let low = x & (0x7F * ONES);
    let from_a = low + 0x3F * ONES;
    let past_z = low + 0x25 * ONES;
    let upper = from_a & !past_z & !x & (0x80 * ONES);
    x | (upper >> 2)
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

    /// The `match` and the table name the same fields at the same places (the table
    /// is what the map's removal walks), in any case; near misses are other fields.
    #[test]
    fn kind_names_the_tables() {
        for (i, n) in HOP_BY_HOP.iter().enumerate() {
            let upper = n.as_str().to_ascii_uppercase();
            assert_eq!(kind(n.as_str().as_bytes()), Kind::HopByHop(i as u8), "{n}");
            assert_eq!(kind(upper.as_bytes()), Kind::HopByHop(i as u8), "{n}");
        }
        for (i, n) in FORWARDING.iter().enumerate() {
            let under: Vec<u8> = n
                .iter()
                .map(|&b| if b == b'-' { b'_' } else { b })
                .collect();
            assert_eq!(
                kind(n),
                Kind::Forwarding {
                    ours_spelled: false
                }
            );
            let ours_spelled = i < 3;
            assert_eq!(
                kind(&under.to_ascii_uppercase()),
                Kind::Forwarding { ours_spelled }
            );
        }
        assert_eq!(kind(b"TE"), Kind::Te);
        assert_eq!(kind(b"X-Powered-By"), Kind::PoweredBy);
        assert_eq!(kind(b"X_Sluice_Cache"), Kind::Sluice);
        assert_eq!(
            kind(b"x-sluice-a-name-longer-than-any-forwarding-one"),
            Kind::Sluice
        );
        for other in [
            "host",
            "connectio",
            "upgrades",
            "keep_alive",
            "x-sluice-",
            "x-powered-byy",
            "x-forwarded-fo",
            "forwarded-",
            "t",
            "",
        ] {
            assert_eq!(kind(other.as_bytes()), Kind::Other, "{other}");
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

    /// A name the proxy tells apart, each letter in either case, maybe with `_` for a
    /// `-` and one byte changed; or any token.
    fn kind_token() -> impl Strategy<Value = Vec<u8>> {
        let mut names: Vec<&'static str> = vec!["te", "x-powered-by", "x-sluice-peer"];
        names.extend(HOP_BY_HOP.iter().map(HeaderName::as_str));
        names.extend(FORWARDING.iter().map(|n| std::str::from_utf8(n).unwrap()));
        near_token(names)
    }

    /// The names [`fact`] tells apart, spelled as [`kind_token`] spells its own.
    const FACTS: [(&str, Fact); 9] = [
        ("authorization", Fact::Authorization),
        ("accept-encoding", Fact::AcceptEncoding),
        ("te", Fact::Te),
        ("host", Fact::Host),
        ("expect", Fact::Expect),
        ("upgrade", Fact::Upgrade),
        ("connection", Fact::Connection),
        ("content-length", Fact::ContentLength),
        ("transfer-encoding", Fact::TransferEncoding),
    ];

    /// One of `names`, each letter in either case, maybe with `_` for a `-` and one
    /// byte changed; or any token.
    fn near_token(names: Vec<&'static str>) -> impl Strategy<Value = Vec<u8>> {
        let near = proptest::sample::select(names).prop_flat_map(|n| {
            let changed = proptest::option::of((0..n.len(), proptest::sample::select(TCHAR)));
            let flips =
                proptest::collection::vec((proptest::bool::ANY, proptest::bool::ANY), n.len());
            (flips, changed).prop_map(move |(flips, changed)| {
                let mut b: Vec<u8> = n
                    .bytes()
                    .zip(flips)
                    .map(|(c, (upper, under))| match c {
                        b'-' if under => b'_',
                        c if upper => c.to_ascii_uppercase(),
                        c => c,
                    })
                    .collect();
                if let Some((at, c)) = changed {
                    b[at] = c;
                }
                b
            })
        });
        let any = proptest::collection::vec(proptest::sample::select(TCHAR), 1..30);
        proptest::prop_oneof![3 => near, 1 => any]
    }

    proptest::proptest! {
        #[test]
        fn lowered_in_words_as_byte_by_byte(b in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let mut ours = b.clone();
            lower_in_place(&mut ours);
            proptest::prop_assert_eq!(ours, b.to_ascii_lowercase());
        }

        #[test]
        fn a_token_is_of_the_kind_its_lower_case_spells(b in kind_token()) {
            let lower = String::from_utf8(b.to_ascii_lowercase()).unwrap();
            let dashed = lower.replace('_', "-");
            let want = match lower.as_str() {
                "te" => Kind::Te,
                "x-powered-by" => Kind::PoweredBy,
                l if HOP_BY_HOP.iter().any(|n| n.as_str() == l) => Kind::HopByHop(
                    HOP_BY_HOP.iter().position(|n| n.as_str() == l).unwrap() as u8,
                ),
                _ if dashed.len() > 9 && dashed.starts_with("x-sluice-") => Kind::Sluice,
                _ => match FORWARDING.iter().position(|n| *n == dashed.as_bytes()) {
                    Some(i) => Kind::Forwarding { ours_spelled: i < 3 && lower.contains('_') },
                    None => Kind::Other,
                },
            };
            proptest::prop_assert_eq!(kind(&b), want);
        }

        #[test]
        fn a_token_is_the_fact_its_lower_case_spells(
            b in near_token(FACTS.iter().map(|(n, _)| *n).collect())
        ) {
            let lower = b.to_ascii_lowercase();
            let want = FACTS
                .iter()
                .find(|(n, _)| n.as_bytes() == lower)
                .map_or(Fact::Other, |(_, f)| *f);
            proptest::prop_assert_eq!(fact(&b), want);
        }

        /// A request's names are turned into `HeaderName`s only when its map is built,
        /// long after the head was accepted: every token httparse passes must be one.
        #[test]
        fn every_token_is_a_header_name(
            b in proptest::collection::vec(proptest::sample::select(TCHAR), 1..200)
        ) {
            proptest::prop_assert!(from_token(&b).is_ok());
        }

        #[test]
        fn a_token_names_what_http_would_name(b in token()) {
            let ours = from_token(&b).map(|n| n.as_str().to_owned()).ok();
            let theirs = HeaderName::from_bytes(&b).map(|n| n.as_str().to_owned()).ok();
            proptest::prop_assert_eq!(ours, theirs);
        }
    }
}

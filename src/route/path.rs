//! The normalised path and host that routes, matchers and filters decide on (DESIGN.md
//! §14 "Paths and hosts"), so that no spelling of a path can route a request past a
//! rule: `/public/../admin/x`, `/./admin/x`, `//admin/x` and `/%61dmin/x` are all
//! `/admin/x`.
//!
//! Percent-encoded unreserved characters are decoded, the hex digits of the other
//! escapes upper-cased, `.` and `..` segments resolved (RFC 3986 §5.2.4) and runs of
//! `/` merged. `%2F` and `%5C` stay encoded and are never separators. A `..` above the
//! root, a NUL or a control character, a raw `\`, or a broken escape is refused. A path that is
//! already normal (nearly every path) is borrowed, not copied.

use std::borrow::Cow;

use crate::config::PathPattern;

/// Why a path was refused (the client gets 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    #[error("the path climbs above the root")]
    AboveRoot,
    #[error("a NUL or control character in the path")]
    Control,
    #[error("a malformed percent-escape in the path")]
    BadEscape,
    #[error("the path does not start with /")]
    NotAbsolute,
    /// `..` after an empty segment (`/a//../x`): backends disagree on whether it
    /// removes `a` or the empty segment, so no rule can be sure what they will see.
    #[error("a `..` segment after an empty segment")]
    Ambiguous,
    /// RFC 3986 has no raw `\` in a path; browsers and some servers read it as `/`
    /// (`/\evil.example` in a `Location` is another host to them).
    #[error("a raw backslash in the path")]
    Backslash,
}

/// The normalised form of an origin-form path (no query).
pub(crate) fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        // `*` (OPTIONS) and the like route as themselves.
        return if path == "*" {
            Ok(Cow::Borrowed(path))
        } else {
            Err(PathError::NotAbsolute)
        };
    }
    if is_normal(b)? {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(b)?;
    Ok(Cow::Owned(remove_dots(&decoded)?))
}

/// One pass: whether `b` is already normal; refuses control characters on the way.
fn is_normal(b: &[u8]) -> Result<bool, PathError> {
    let mut normal = true;
    for (i, &c) in b.iter().enumerate() {
        match c {
            0..=0x1f | 0x7f => return Err(PathError::Control),
            b'\\' => return Err(PathError::Backslash),
            // Escaped, so one spelling routes however the client wrote it.
            b'%' | 0x80..=0xff => normal = false,
            b'/' => {
                // `//`, `/./`, `/../`, or a trailing `/.` or `/..`.
                let next = b.get(i + 1).copied();
                let seg_dots = b[i + 1..].iter().take_while(|&&c| c == b'.').count();
                let after = b.get(i + 1 + seg_dots).copied();
                if next == Some(b'/')
                    || ((seg_dots == 1 || seg_dots == 2) && matches!(after, None | Some(b'/')))
                {
                    normal = false;
                }
            }
            _ => {}
        }
    }
    Ok(normal)
}

fn is_unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Decodes escapes of unreserved characters, upper-cases the hex of the others.
fn decode_unreserved(b: &[u8]) -> Result<String, PathError> {
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c != b'%' {
            // Only ASCII reaches here from a parsed request target; keep any other byte
            // as its own escape so the result stays ASCII.
            if c.is_ascii() {
                out.push(c as char);
            } else {
                out.push_str(&format!("%{c:02X}"));
            }
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(PathError::BadEscape);
        };
        let v = hi << 4 | lo;
        if v == 0 || v < 0x20 || v == 0x7f {
            return Err(PathError::Control);
        }
        if is_unreserved(v) {
            out.push(v as char);
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(hi)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(lo)]));
        }
        i += 3;
    }
    Ok(out)
}

/// Resolves `.` and `..` segments and merges runs of `/`; keeps a trailing slash.
fn remove_dots(path: &str) -> Result<String, PathError> {
    let mut segs: Vec<&str> = Vec::new();
    let mut trailing = false;
    let mut after_empty = false;
    for seg in path.split('/').skip(1) {
        trailing = false;
        match seg {
            "" => trailing = true,
            "." => trailing = true,
            ".." => {
                if after_empty {
                    return Err(PathError::Ambiguous);
                }
                if segs.pop().is_none() {
                    return Err(PathError::AboveRoot);
                }
                trailing = true;
            }
            s => segs.push(s),
        }
        // `.` is removed in place, so what it follows is what the next segment follows.
        after_empty = seg.is_empty() || (seg == "." && after_empty);
    }
    let mut out = String::with_capacity(path.len());
    for s in &segs {
        out.push('/');
        out.push_str(s);
    }
    if trailing || segs.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Whether a `Host` value can be one (RFC 3986 `host [":" port]`): a registered name
/// of unreserved, sub-delimiter and `%` characters, or a bracketed IPv6 literal, then
/// an optional port of digits. `evil.test/.example.com` is not a host — as a suffix
/// match it would reach `*.example.com` and come back in a `Location`. Empty is left
/// to routing (it matches `*` only).
pub(crate) fn valid_host(raw: &str) -> bool {
    let b = raw.as_bytes();
    if b.first() == Some(&b'[') {
        return valid_ipv6_host(b);
    }
    // One pass over the name; what stops it must be the port's colon.
    let name = b.iter().take_while(|&&c| NAME[usize::from(c)]).count();
    match b.get(name) {
        None => true,
        Some(b':') => valid_port(&b[name + 1..]),
        Some(_) => false,
    }
}

/// The host routes are chosen by ([`normalize_host`]) when `raw` is a valid host
/// ([`valid_host`]), in one pass over a registered name: what a request's site is
/// found by.
///
/// Bytes, not text: a field value as it came, any byte outside a host's (obs-text
/// included) refused.
/// The site table looks names up as bytes, so no text is made of them.
pub(crate) fn site_host(b: &[u8]) -> Option<Cow<'_, [u8]>> {
    if b.first() == Some(&b'[') {
        // Brackets, hex digits, colons, dots and a port: ASCII throughout.
        let raw = std::str::from_utf8(b).ok()?;
        return valid_ipv6_host(b).then(|| Cow::Owned(normalize_host(raw).into_owned().into()));
    }
    let (mut name, mut upper) = (0, false);
    for &c in b {
        if !NAME[usize::from(c)] {
            break;
        }
        upper |= c.is_ascii_uppercase();
        name += 1;
    }
    match b.get(name) {
        None => {}
        Some(b':') if valid_port(&b[name + 1..]) => {}
        Some(_) => return None,
    }
    let host = &b[..name];
    let host = host.strip_suffix(b".").unwrap_or(host);
    Some(match upper {
        true => Cow::Owned(host.to_ascii_lowercase()),
        false => Cow::Borrowed(host),
    })
}

fn valid_ipv6_host(b: &[u8]) -> bool {
    let Some(close) = b.iter().position(|&c| c == b']') else {
        return false;
    };
    let inner = &b[1..close];
    let literal = !inner.is_empty()
        && inner
            .iter()
            .all(|c| c.is_ascii_hexdigit() || *c == b':' || *c == b'.');
    literal
        && match b.get(close + 1) {
            None => true,
            Some(b':') => valid_port(&b[close + 2..]),
            Some(_) => false,
        }
}

fn valid_port(p: &[u8]) -> bool {
    p.len() <= 5 && p.iter().all(u8::is_ascii_digit)
}

/// The bytes of a registered name: unreserved, sub-delimiters and `%`.
static NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b'%'
            );
        c += 1;
    }
    t
};

/// The host routes are chosen by: lower-cased, without port, without one trailing dot
/// (`App.Test.:80` is `app.test`). Borrows unless it must change the text.
pub(crate) fn normalize_host(raw: &str) -> Cow<'_, str> {
    // One pass: where a port would start, and whether anything is upper case.
    let b = raw.as_bytes();
    let mut end = b.len();
    let mut upper = false;
    if b.first() == Some(&b'[') {
        let close = raw.find(']').unwrap_or(b.len());
        return lower(&raw[1..close]);
    }
    for (i, &c) in b.iter().enumerate().rev() {
        if c == b':' {
            end = i;
            break;
        }
        if !c.is_ascii_digit() {
            break;
        }
    }
    let mut host = &raw[..end];
    if let Some(h) = host.strip_suffix('.') {
        host = h;
    }
    for &c in host.as_bytes() {
        upper |= c.is_ascii_uppercase();
    }
    if upper {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

fn lower(h: &str) -> Cow<'_, str> {
    if h.bytes().any(|c| c.is_ascii_uppercase()) {
        Cow::Owned(h.to_ascii_lowercase())
    } else {
        Cow::Borrowed(h)
    }
}

/// Path patterns are matched here, with the rest of routing, on normalised paths.
impl PathPattern {
    #[inline]
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Exact(p) => path == p,
            PathPattern::Prefix(p) => PathPattern::is_under(p, path),
            PathPattern::Regex(re) => re.0.is_match(path),
        }
    }

    /// Whether `path` is `prefix` or below it at a segment boundary (`/api` covers
    /// `/api` and `/api/x`, not `/apix`).
    pub fn is_under(prefix: &str, path: &str) -> bool {
        path.starts_with(prefix)
            && (path.len() == prefix.len() || path.as_bytes()[prefix.len()] == b'/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_names_or_literals_with_a_port() {
        for ok in [
            "",
            "localhost",
            "App.Test",
            "app.test.",
            "app.test:8080",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:8443",
            "[2001:db8::1]",
            "xn--bcher-kva.example",
            "a_b.test",
        ] {
            assert!(valid_host(ok), "{ok:?}");
        }
        for bad in [
            "evil.test/.example.com",
            "evil.test?.example.com",
            "a@b.test",
            "a b.test",
            "a.test:80x",
            "a.test:123456",
            "[::1",
            "[zz::1]",
            "[::1]x",
            "a.test#x",
            "a.test\\b",
        ] {
            assert!(!valid_host(bad), "{bad:?}");
        }
    }

    fn n(p: &str) -> Result<String, PathError> {
        normalize(p).map(Cow::into_owned)
    }

    #[test]
    fn spellings_of_one_path_are_one_path() {
        for p in [
            "/admin/x",
            "/public/../admin/x",
            "/./admin/x",
            "//admin/x",
            "/%61dmin/x",
            "/%61%64%6D%69%6E/x",
            "/admin/./x",
            "/admin//x",
            "/a/b/../../admin/x",
            "/admin/y/%2E%2E/x",
        ] {
            assert_eq!(n(p).as_deref(), Ok("/admin/x"), "{p}");
        }
    }

    #[test]
    fn what_stays_and_what_is_refused() {
        assert!(matches!(normalize("/a/b?"), Ok(Cow::Borrowed(_))));
        assert_eq!(
            n("/a%2fb").as_deref(),
            Ok("/a%2Fb"),
            "an encoded slash stays"
        );
        assert_eq!(n("/a%5Cb").as_deref(), Ok("/a%5Cb"));
        assert_eq!(n("/\\evil.example"), Err(PathError::Backslash));
        assert_eq!(n("/a/%2e%2e/\\x"), Err(PathError::Backslash));
        assert_eq!(n("/a/b/").as_deref(), Ok("/a/b/"), "a trailing slash stays");
        assert_eq!(n("/a/.").as_deref(), Ok("/a/"));
        assert_eq!(n("/a/..").as_deref(), Ok("/"));
        assert_eq!(n("/").as_deref(), Ok("/"));
        assert_eq!(n("/..."), Ok("/...".into()), "three dots are a name");
        assert_eq!(n("/.."), Err(PathError::AboveRoot));
        assert_eq!(n("/a/../../etc"), Err(PathError::AboveRoot));
        assert_eq!(n("/%2e%2e/etc"), Err(PathError::AboveRoot));
        assert_eq!(n("/a%00b"), Err(PathError::Control));
        assert_eq!(n("/a%0ab"), Err(PathError::Control));
        assert_eq!(n("/a%zz"), Err(PathError::BadEscape));
        assert_eq!(n("/a%4"), Err(PathError::BadEscape));
        assert_eq!(
            n("/admin//../x"),
            Err(PathError::Ambiguous),
            "RFC 3986 says /admin/x, slash merging /x"
        );
        assert_eq!(n("/a/.//x").as_deref(), Ok("/a/x"));
        assert_eq!(n("/a//./../x"), Err(PathError::Ambiguous));
        assert_eq!(
            n("/caf\u{e9}/x").as_deref(),
            Ok("/caf%C3%A9/x"),
            "raw UTF-8 is escaped"
        );
        assert_eq!(
            n("/caf%c3%a9/x").as_deref(),
            Ok("/caf%C3%A9/x"),
            "one spelling either way"
        );
    }

    #[test]
    fn hosts() {
        assert_eq!(normalize_host("App.Test.:80"), "app.test");
        assert_eq!(normalize_host("app.test."), "app.test");
        assert_eq!(normalize_host("[::1]:8080"), "::1");
        assert!(matches!(
            normalize_host("a.test:1"),
            Cow::Borrowed("a.test")
        ));
    }

    proptest::proptest! {
        /// A host that passes is one a URL can carry: nothing that ends the authority
        /// or starts userinfo, and its normal form (the site lookup's key) passes too.
        #[test]
        fn a_valid_host_cannot_leave_the_authority(host in "[a-zA-Z0-9.:\\[\\]/?#@%_~ -]{0,24}") {
            if valid_host(&host) {
                proptest::prop_assert!(!host.contains(['/', '?', '#', '@', ' ']), "{host:?}");
                let n = normalize_host(&host);
                let bracketed = if n.contains(':') { format!("[{n}]") } else { n.to_string() };
                proptest::prop_assert!(valid_host(&bracketed), "{host:?} -> {bracketed:?}");
            }
        }

        /// The one pass finds what the check and the normal form find.
        #[test]
        fn site_host_is_the_valid_hosts_normal_form(host in "[a-zA-Z0-9.:\\[\\]/?#@%_~ -]{0,24}") {
            let want = valid_host(&host).then(|| normalize_host(&host));
            let want = want.map(|h| h.as_bytes().to_vec());
            proptest::prop_assert_eq!(site_host(host.as_bytes()).map(|h| h.to_vec()), want);
        }

        /// Any path built from segments, dots, slashes, escapes and odd bytes: the
        /// normal form is normal (idempotent), starts with one `/`, never has a `.` or
        /// `..` segment or `//`, and a path whose `..` would climb above the root is
        /// refused rather than clamped.
        #[test]
        fn normalising_is_idempotent_and_never_climbs(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::string::string_regex("[a-zA-Z0-9_~-]{1,4}").unwrap(),
                    proptest::strategy::Just(".".to_string()),
                    proptest::strategy::Just("..".to_string()),
                    proptest::strategy::Just(String::new()),
                    proptest::strategy::Just("%2e".to_string()),
                    proptest::strategy::Just("%2E%2e".to_string()),
                    proptest::strategy::Just("%61".to_string()),
                    proptest::strategy::Just("%2f".to_string()),
                    proptest::strategy::Just("%5c".to_string()),
                    proptest::strategy::Just("%zz".to_string()),
                    proptest::strategy::Just("\u{e9}".to_string()),
                ],
                0..8,
            ),
            trailing in proptest::bool::ANY,
        ) {
            let mut p = String::from("/");
            p.push_str(&parts.join("/"));
            if trailing {
                p.push('/');
            }
            if let Ok(once) = normalize(&p) {
                let once = once.into_owned();
                let twice = normalize(&once).map(Cow::into_owned);
                proptest::prop_assert_eq!(twice.as_deref(), Ok(once.as_str()), "{} → {}", p, once);
                proptest::prop_assert!(once.starts_with('/') && !once.contains("//"), "{} → {}", p, once);
                for seg in once.split('/') {
                    proptest::prop_assert!(seg != "." && seg != "..", "{} → {}", p, once);
                }
                // Count depth as the resolution walks: it must never go below the root.
                let mut depth: i64 = 0;
                for seg in p.split('/').skip(1) {
                    let seg = seg.replace("%2e", ".").replace("%2E", ".");
                    match seg.as_str() {
                        ".." => depth -= 1,
                        "." | "" => {}
                        _ => depth += 1,
                    }
                    proptest::prop_assert!(depth >= 0, "{} climbed above / yet gave {}", p, once);
                }
            }
        }
    }
}

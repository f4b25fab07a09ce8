//! What the cache fields of a request and a response say (RFC 9111 §5.2), and what
//! follows from them: whether a response may be stored by a shared cache (§3), how
//! long it stays fresh (§4.2.1, §4.2.2) and how old it is (§4.2.3).
//!
//! Written here rather than taken from a crate: the rules sluice adds (`default_ttl`,
//! the heuristic switch, the stale windows of the config and of `stale-if-error` /
//! `stale-while-revalidate`, the `Cache-Status` ttl) need the parts separately, not one
//! verdict. Pure functions over header maps and times; no I/O.

use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderValue};
use http::StatusCode;

/// `Surrogate-Control`: directives for caches run by the origin's operator.
pub(crate) static SURROGATE_CONTROL: header::HeaderName =
    header::HeaderName::from_static("surrogate-control");

/// The largest delta-seconds honoured (RFC 9111 §1.2.2: larger values mean this).
const MAX_DELTA: u64 = 1 << 31;

/// A heuristic lifetime is at most a day (RFC 9111 §4.2.2 suggests a fraction of the
/// time since `Last-Modified`; sluice takes 10 %).
const MAX_HEURISTIC: Duration = Duration::from_secs(86_400);

/// A response's `Cache-Control` directives that a shared cache acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResponseDirectives {
    pub max_age: Option<Delta>,
    pub s_maxage: Option<Delta>,
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub immutable: bool,
    pub must_understand: bool,
    pub stale_while_revalidate: Option<Delta>,
    pub stale_if_error: Option<Delta>,
    /// `no-cache="Field, …"` / `private="Field, …"`: the response may be stored
    /// without these fields (lower case).
    pub unstored_fields: Vec<String>,
    /// `Surrogate-Control: max-age=N`: this cache's freshness, over `Cache-Control`.
    pub surrogate_max_age: Option<Delta>,
    /// `Surrogate-Control: no-store`.
    pub surrogate_no_store: bool,
}

/// A request's `Cache-Control` directives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RequestDirectives {
    pub no_store: bool,
    pub no_cache: bool,
    pub max_age: Option<Delta>,
    /// `max-stale` with no value accepts any staleness: `Some(None)`.
    pub max_stale: Option<Option<u64>>,
    pub min_fresh: Option<Delta>,
    pub only_if_cached: bool,
}

/// A delta-seconds value, or a directive whose value was not one (which makes the
/// response stale rather than fresh for a guess).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delta {
    Secs(u64),
    Invalid,
}

impl Delta {
    fn parse(value: Option<&str>) -> Delta {
        match value {
            Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                // Longer than any u64 is still "very large".
                Delta::Secs(v.parse::<u64>().unwrap_or(MAX_DELTA).min(MAX_DELTA))
            }
            _ => Delta::Invalid,
        }
    }

    /// Seconds, with an invalid value counting as none at all.
    pub(crate) fn secs(self) -> u64 {
        match self {
            Delta::Secs(s) => s,
            Delta::Invalid => 0,
        }
    }
}

/// Every directive of every `Cache-Control` line: `(name in lower case, value)`; a
/// quoted value loses its quotes (and backslash escapes). Commas inside quotes do not
/// split.
pub(crate) fn directives(headers: &HeaderMap) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for line in headers.get_all(header::CACHE_CONTROL) {
        let Ok(text) = line.to_str() else { continue };
        split_directives(text, &mut out);
    }
    out
}

static CDN_CACHE_CONTROL: header::HeaderName = header::HeaderName::from_static("cdn-cache-control");

/// `CDN-Cache-Control` as a Structured Field dictionary (RFC 9213, RFC 8941): lower-case
/// keys, `key=value` with no space around `=`, values integers, tokens or strings.
/// `None` when absent, or when any member is malformed (the field is then ignored).
fn cdn_directives(headers: &HeaderMap) -> Option<Vec<(String, Option<String>)>> {
    let mut lines = headers.get_all(&CDN_CACHE_CONTROL).iter().peekable();
    lines.peek()?;
    let mut out = Vec::new();
    for line in lines {
        let text = line.to_str().ok()?;
        let mut rest = text;
        while !rest.is_empty() {
            let (item, after) = next_item(rest);
            rest = after;
            let item = item.trim_matches(|c| c == ' ' || c == '\t');
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            let key_ok = key.starts_with(|c: char| c.is_ascii_lowercase() || c == '*')
                && key
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.*".contains(&b));
            let value_ok = value.is_none_or(|v| {
                let bare = v.split(';').next().unwrap_or("");
                let integer = bare.strip_prefix('-').unwrap_or(bare);
                (!integer.is_empty()
                    && integer.len() <= 15
                    && integer.bytes().all(|b| b.is_ascii_digit()))
                    || (bare.len() >= 2 && bare.starts_with('"') && bare.ends_with('"'))
                    || bare.starts_with(|c: char| c.is_ascii_alphabetic() || c == '*')
            });
            // Lifetimes are integers; a string or token there makes the field invalid.
            let lifetime = matches!(
                key,
                "max-age" | "s-maxage" | "stale-while-revalidate" | "stale-if-error"
            );
            let integer = value.is_some_and(|v| {
                let bare = v.split(';').next().unwrap_or("");
                !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_digit())
            });
            if !key_ok || !value_ok || (lifetime && !integer) {
                return None;
            }
            let value = value.map(|v| unquote(v.split(';').next().unwrap_or("")));
            out.push((key.to_string(), value));
        }
    }
    Some(out)
}

fn split_directives(text: &str, out: &mut Vec<(String, Option<String>)>) {
    let mut rest = text;
    while !rest.is_empty() {
        let (item, after) = next_item(rest);
        rest = after;
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n.trim(), Some(unquote(v.trim()))),
            None => (item, None),
        };
        out.push((name.to_ascii_lowercase(), value));
    }
}

/// The text up to the next comma outside quotes, and what follows it.
fn next_item(s: &str) -> (&str, &str) {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => return (&s[..i], &s[i + 1..]),
            _ => {}
        }
    }
    (s, "")
}

fn unquote(v: &str) -> String {
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.extend(chars.next()),
                    c => out.push(c),
                }
            }
            out
        }
        None => v.to_string(),
    }
}

impl ResponseDirectives {
    /// The first occurrence of each directive counts.
    /// From `CDN-Cache-Control` (RFC 9213) when the response has a valid one, which
    /// then stands in for `Cache-Control`; else from `Cache-Control`.
    pub(crate) fn of(headers: &HeaderMap) -> ResponseDirectives {
        let mut d = ResponseDirectives::default();
        let items = cdn_directives(headers).unwrap_or_else(|| directives(headers));
        for (name, value) in items {
            let value = value.as_deref();
            match name.as_str() {
                "max-age" => {
                    d.max_age.get_or_insert(Delta::parse(value));
                }
                "s-maxage" => {
                    d.s_maxage.get_or_insert(Delta::parse(value));
                }
                "stale-while-revalidate" => {
                    d.stale_while_revalidate.get_or_insert(Delta::parse(value));
                }
                "stale-if-error" => {
                    d.stale_if_error.get_or_insert(Delta::parse(value));
                }
                // Qualified, they allow storing without the fields they name.
                "no-cache" | "private" if value.is_some_and(|v| !v.trim().is_empty()) => {
                    let fields = value.unwrap_or("").split(',');
                    d.unstored_fields
                        .extend(fields.map(|f| f.trim().to_ascii_lowercase()));
                }
                "no-store" => d.no_store = true,
                "no-cache" => d.no_cache = true,
                "private" => d.private = true,
                "must-understand" => d.must_understand = true,
                "public" => d.public = true,
                "must-revalidate" => d.must_revalidate = true,
                "proxy-revalidate" => d.proxy_revalidate = true,
                "immutable" => d.immutable = true,
                _ => {}
            }
        }
        // Surrogate-Control (Edge Architecture): for caches like this one, before
        // Cache-Control. A `;target` suffix is taken as naming this cache.
        for line in headers.get_all(&SURROGATE_CONTROL) {
            let Ok(text) = line.to_str() else { continue };
            let mut items = Vec::new();
            split_directives(text, &mut items);
            for (name, value) in items {
                let value = value.map(|v| v.split(';').next().unwrap_or("").to_string());
                match name.split(';').next().unwrap_or("") {
                    "max-age" => {
                        d.surrogate_max_age
                            .get_or_insert(Delta::parse(value.as_deref()));
                    }
                    "no-store" => d.surrogate_no_store = true,
                    _ => {}
                }
            }
        }
        d
    }

    /// The response may never be served stale: not in a stale window, not on error.
    pub(crate) fn never_stale(&self) -> bool {
        self.must_revalidate || self.proxy_revalidate || self.no_cache
    }
}

impl RequestDirectives {
    /// `Pragma: no-cache` counts as `no-cache` only without `Cache-Control`
    /// (RFC 9111 §5.4).
    pub(crate) fn of(headers: &HeaderMap) -> RequestDirectives {
        let mut d = RequestDirectives::default();
        if !headers.contains_key(header::CACHE_CONTROL) {
            d.no_cache = headers
                .get_all(header::PRAGMA)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| {
                    v.split(',')
                        .any(|p| p.trim().eq_ignore_ascii_case("no-cache"))
                });
            return d;
        }
        for (name, value) in directives(headers) {
            let value = value.as_deref();
            match name.as_str() {
                "no-store" => d.no_store = true,
                "no-cache" => d.no_cache = true,
                "only-if-cached" => d.only_if_cached = true,
                "max-age" => {
                    d.max_age.get_or_insert(Delta::parse(value));
                }
                "min-fresh" => {
                    d.min_fresh.get_or_insert(Delta::parse(value));
                }
                "max-stale" => {
                    d.max_stale
                        .get_or_insert(value.map(|_| Delta::parse(value).secs()));
                }
                _ => {}
            }
        }
        d
    }
}

/// Status codes whose meaning for caching sluice knows (for `must-understand`).
pub(crate) fn understood(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 302 | 303 | 307 | 308 | 404 | 405 | 410 | 414 | 451 | 501
    )
}

/// Status codes a cache may give a lifetime it guessed (RFC 9110 §15.1).
pub(crate) fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// What the cache's settings add to the fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// `heuristic on`.
    pub heuristic: bool,
    /// `default_ttl`.
    pub default_ttl: Duration,
    /// `key cookie NAME`: responses with `Set-Cookie` may be stored.
    pub keys_cookie: bool,
}

/// Why a response is not stored (for the debug log), or `Ok`.
pub(crate) fn storable(
    credentialed: bool,
    req_dirs: &RequestDirectives,
    status: StatusCode,
    resp: &HeaderMap,
    dirs: &ResponseDirectives,
    rules: &Rules,
) -> Result<(), &'static str> {
    if dirs.surrogate_no_store {
        return Err("Surrogate-Control: no-store");
    }
    if dirs.must_understand && !understood(status) {
        return Err("must-understand with a status sluice does not know");
    }
    // `must-understand` with a known status, or a surrogate lifetime, overrides
    // the response's `no-store` (RFC 9111 §5.2.2.3).
    let overridden = dirs.must_understand || dirs.surrogate_max_age.is_some();
    if req_dirs.no_store || (dirs.no_store && !overridden) {
        return Err("no-store");
    }
    if dirs.private {
        return Err("private");
    }
    if status == StatusCode::PARTIAL_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Err("a partial or 304 response");
    }
    if status.is_informational() {
        return Err("an interim response");
    }
    if credentialed && !shareable_with_authorization(dirs) {
        return Err("the request carried Authorization");
    }
    if resp.contains_key(header::SET_COOKIE) && !rules.keys_cookie {
        return Err("the response sets a cookie");
    }
    if vary_fields(resp).any(|f| f == "*") {
        return Err("Vary: *");
    }
    let explicit = dirs.max_age.is_some()
        || dirs.s_maxage.is_some()
        || dirs.surrogate_max_age.is_some()
        || resp.contains_key(header::EXPIRES)
        || dirs.public;
    if !explicit && !heuristically_cacheable(status) {
        return Err("the status needs explicit freshness");
    }
    Ok(())
}

/// A response to a request with `Authorization` may be shared only when it says so
/// (RFC 9111 §3.5).
pub(crate) fn shareable_with_authorization(dirs: &ResponseDirectives) -> bool {
    dirs.public || dirs.s_maxage.is_some() || dirs.must_revalidate
}

/// The field names a response varies on, in lower case.
pub(crate) fn vary_fields(resp: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    resp.get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|f| f.trim().to_ascii_lowercase())
        .filter(|f| !f.is_empty())
}

/// A date field, if it parses (see [`lenient_date`]).
pub(crate) fn date_of(h: &HeaderMap, name: header::HeaderName) -> Option<SystemTime> {
    let v = h.get(name)?.to_str().ok()?;
    lenient_date(v.trim())
}

/// An HTTP date in any of its three forms (RFC 9110 §5.6.7), forgiving two slips that
/// origins make and that leave no doubt about the time: the case of the names
/// (`THU`, `AUG`, `gmt`) and a weekday that does not match the date. Nothing else is
/// relaxed: a wrong zone, a two-digit year in the fixed form, missing or extra
/// punctuation stay invalid.
pub(crate) fn lenient_date(v: &str) -> Option<SystemTime> {
    if let Ok(t) = httpdate::parse_http_date(v) {
        return Some(t);
    }
    let mut fixed = String::with_capacity(v.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.eq_ignore_ascii_case("gmt") {
            out.push_str("GMT");
        } else {
            let mut chars = word.chars();
            if let Some(c) = chars.next() {
                out.push(c.to_ascii_uppercase());
                out.extend(chars.map(|c| c.to_ascii_lowercase()));
            }
        }
        word.clear();
    };
    for c in v.chars() {
        if c.is_ascii_alphabetic() {
            word.push(c);
        } else {
            flush(&mut word, &mut fixed);
            fixed.push(c);
        }
    }
    flush(&mut word, &mut fixed);
    if let Ok(t) = httpdate::parse_http_date(&fixed) {
        return Some(t);
    }
    let day_len = fixed.bytes().take_while(u8::is_ascii_alphabetic).count();
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    DAYS.iter().find_map(|d| {
        let name = if day_len == 3 { &d[..3] } else { d };
        httpdate::parse_http_date(&format!("{name}{}", &fixed[day_len..])).ok()
    })
}

/// How long the response is fresh for, counted from its `Date` (RFC 9111 §4.2.1):
/// `s-maxage`, `max-age`, `Expires` − `Date`; else, for the codes that allow a guess,
/// the heuristic (when on, with `Last-Modified`), then `default_ttl`.
pub(crate) fn lifetime(
    status: StatusCode,
    resp: &HeaderMap,
    dirs: &ResponseDirectives,
    response_time: SystemTime,
    rules: &Rules,
) -> Duration {
    if let Some(d) = dirs.surrogate_max_age.or(dirs.s_maxage).or(dirs.max_age) {
        return Duration::from_secs(d.secs());
    }
    let date = date_of(resp, header::DATE).unwrap_or(response_time);
    if resp.contains_key(header::EXPIRES) {
        // An Expires that does not parse (`0`, say) means already expired.
        return match date_of(resp, header::EXPIRES) {
            Some(e) => e.duration_since(date).unwrap_or_default(),
            None => Duration::ZERO,
        };
    }
    if !(heuristically_cacheable(status) || dirs.public) {
        return Duration::ZERO;
    }
    if rules.heuristic {
        if let Some(lm) = date_of(resp, header::LAST_MODIFIED) {
            let since = date.duration_since(lm).unwrap_or_default();
            return (since / 10).min(MAX_HEURISTIC);
        }
    }
    rules.default_ttl
}

/// The age a response had when it arrived (RFC 9111 §4.2.3): the larger of what its
/// `Date` says and its `Age` plus the time the request took.
pub(crate) fn initial_age(
    resp: &HeaderMap,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Duration {
    let apparent = date_of(resp, header::DATE)
        .and_then(|d| response_time.duration_since(d).ok())
        .unwrap_or_default();
    // RFC 9111 §5.1: the first member of the (first) field line counts; a value that
    // is not delta-seconds is ignored.
    let age_value = resp
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|v| match Delta::parse(Some(v.trim())) {
            Delta::Secs(s) => s,
            Delta::Invalid => 0,
        })
        .unwrap_or(0);
    let delay = response_time
        .duration_since(request_time)
        .unwrap_or_default();
    apparent.max(Duration::from_secs(age_value) + delay)
}

/// The validators a stored response offers for revalidation.
pub(crate) fn validators(resp: &HeaderMap) -> (Option<&HeaderValue>, Option<&HeaderValue>) {
    (
        resp.get(header::ETAG),
        resp.get(header::LAST_MODIFIED).filter(|v| {
            v.to_str()
                .is_ok_and(|s| httpdate::parse_http_date(s).is_ok())
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const RULES: Rules = Rules {
        heuristic: false,
        default_ttl: Duration::ZERO,
        keys_cookie: false,
    };

    #[test]
    fn directives_are_split_outside_quotes_and_first_wins() {
        let h = headers(&[
            ("cache-control", "Max-Age=60, no-cache=\"a, b\""),
            ("cache-control", "max-age=5, s-maxage=\"x\""),
        ]);
        let d = ResponseDirectives::of(&h);
        assert_eq!(d.max_age, Some(Delta::Secs(60)));
        assert!(!d.no_cache, "qualified: store without the fields");
        assert_eq!(d.unstored_fields, ["a", "b"]);
        assert_eq!(d.s_maxage, Some(Delta::Invalid));
        assert_eq!(
            directives(&h)[1],
            ("no-cache".to_string(), Some("a, b".to_string()))
        );
    }

    #[test]
    fn freshness_takes_s_maxage_then_max_age_then_expires_then_guesses() {
        let now = SystemTime::now();
        let date = httpdate::fmt_http_date(now);
        let ok = StatusCode::OK;
        let life = |pairs: &[(&str, &str)], rules: &Rules| {
            let h = headers(pairs);
            lifetime(ok, &h, &ResponseDirectives::of(&h), now, rules).as_secs()
        };
        assert_eq!(
            life(&[("cache-control", "max-age=9, s-maxage=7")], &RULES),
            7
        );
        assert_eq!(life(&[("cache-control", "max-age=9")], &RULES), 9);
        assert_eq!(life(&[("cache-control", "max-age=x")], &RULES), 0);
        let later = httpdate::fmt_http_date(now + Duration::from_secs(100));
        assert_eq!(life(&[("date", &date), ("expires", &later)], &RULES), 100);
        assert_eq!(life(&[("date", &date), ("expires", "0")], &RULES), 0);
        let old = httpdate::fmt_http_date(now - Duration::from_secs(1000));
        let lm = [("date", date.as_str()), ("last-modified", old.as_str())];
        assert_eq!(life(&lm, &RULES), 0);
        let on = Rules {
            heuristic: true,
            ..RULES
        };
        assert_eq!(life(&lm, &on), 100);
        let ttl = Rules {
            default_ttl: Duration::from_secs(30),
            ..RULES
        };
        assert_eq!(life(&[], &ttl), 30);
        let h = HeaderMap::new();
        let created = lifetime(
            StatusCode::CREATED,
            &h,
            &ResponseDirectives::default(),
            now,
            &ttl,
        );
        assert_eq!(
            created,
            Duration::ZERO,
            "201 is not heuristically cacheable"
        );
    }

    #[test]
    fn storability_follows_the_shared_cache_rules() {
        let ok = StatusCode::OK;
        let check = |req: &[(&str, &str)], resp: &[(&str, &str)], status| {
            let (q, r) = (headers(req), headers(resp));
            storable(
                q.contains_key(header::AUTHORIZATION),
                &RequestDirectives::of(&q),
                status,
                &r,
                &ResponseDirectives::of(&r),
                &RULES,
            )
        };
        assert!(check(&[], &[("cache-control", "max-age=5")], ok).is_ok());
        assert!(check(&[], &[("cache-control", "private, max-age=5")], ok).is_err());
        assert!(check(&[("cache-control", "no-store")], &[], ok).is_err());
        assert!(check(
            &[("authorization", "x")],
            &[("cache-control", "max-age=5")],
            ok
        )
        .is_err());
        assert!(check(
            &[("authorization", "x")],
            &[("cache-control", "public")],
            ok
        )
        .is_ok());
        assert!(check(&[], &[("set-cookie", "a=b")], ok).is_err());
        assert!(check(&[], &[("vary", "Accept, *")], ok).is_err());
        assert!(check(&[], &[], StatusCode::PARTIAL_CONTENT).is_err());
        assert!(check(&[], &[], StatusCode::CREATED).is_err());
        assert!(check(&[], &[("cache-control", "max-age=5")], StatusCode::CREATED).is_ok());
    }

    #[test]
    fn age_counts_the_larger_of_date_and_age_plus_delay() {
        let now = SystemTime::now();
        let sent = now - Duration::from_secs(2);
        let date = httpdate::fmt_http_date(now - Duration::from_secs(30));
        let h = headers(&[("date", &date), ("age", "10")]);
        assert_eq!(initial_age(&h, sent, now).as_secs(), 30);
        let h = headers(&[("age", "100")]);
        assert_eq!(initial_age(&h, sent, now).as_secs(), 102);
        // The first member counts; what is not delta-seconds is ignored.
        for (fields, age) in [
            (&[("age", "7200, 0")][..], 7200),
            (&[("age", "0, 7200")], 0),
            (&[("age", "0"), ("age", "7200")], 0),
            (&[("age", "1.5")], 0),
            (&[("age", "-1")], 0),
            (&[("age", "99999999999")], MAX_DELTA),
        ] {
            assert_eq!(
                initial_age(&headers(fields), now, now).as_secs(),
                age,
                "{fields:?}"
            );
        }
    }

    #[test]
    fn a_valid_cdn_cache_control_stands_in_for_cache_control() {
        let d = |pairs: &[(&str, &str)]| ResponseDirectives::of(&headers(pairs));
        let cc = ("cache-control", "max-age=10000");
        assert!(d(&[cc, ("cdn-cache-control", "no-store")]).no_store);
        assert!(d(&[cc, ("cdn-cache-control", "private")]).private);
        let fresh = d(&[
            ("cache-control", "no-store"),
            ("cdn-cache-control", "max-age=60"),
        ]);
        assert_eq!(
            (fresh.max_age, fresh.no_store),
            (Some(Delta::Secs(60)), false)
        );
        // Malformed (space before `=`, upper case): ignored, Cache-Control counts.
        for bad in [
            "max-age =100",
            "MaX-aGe=100",
            "max-age=1.5.2",
            "max-age=\"100\"",
        ] {
            assert_eq!(
                d(&[cc, ("cdn-cache-control", bad)]).max_age,
                Some(Delta::Secs(10000)),
                "{bad}"
            );
        }
    }

    #[test]
    fn dates_forgive_case_and_a_wrong_weekday_but_nothing_else() {
        let t = |s: &str| lenient_date(s).map(httpdate::fmt_http_date);
        let want = Some("Thu, 18 Aug 2050 02:01:18 GMT".to_string());
        for ok in [
            "Thu, 18 Aug 2050 02:01:18 GMT",
            "THU, 18 AUG 2050 02:01:18 gmt",
            "Mon, 18 Aug 2050 02:01:18 GMT",
            "Thursday, 18-Aug-50 02:01:18 GMT",
            "Sun Aug 18 02:01:18 2050",
        ] {
            assert_eq!(t(ok), want, "{ok}");
        }
        for bad in [
            "Thu, 18 Aug 2050 02:01:18 UTC",
            "Thu, 18 Aug 50 02:01:18 GMT",
            "Thu 18 Aug 2050 02:01:18 GMT",
            "Thu, 18  Aug  2050 02:01:18 GMT",
            "Thu, 18-Aug-2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 2:01:18 GMT",
            "0",
        ] {
            assert_eq!(t(bad), None, "{bad}");
        }
    }

    #[test]
    fn pragma_counts_only_without_cache_control() {
        let h = headers(&[("pragma", "no-cache")]);
        assert!(RequestDirectives::of(&h).no_cache);
        let h = headers(&[("pragma", "no-cache"), ("cache-control", "max-age=5")]);
        assert!(!RequestDirectives::of(&h).no_cache);
    }

    proptest::proptest! {
        #[test]
        fn any_cache_control_parses_without_panic(s in "[ -~]{0,64}") {
            if let Ok(v) = HeaderValue::from_str(&s) {
                let mut h = HeaderMap::new();
                h.insert(header::CACHE_CONTROL, v);
                let d = ResponseDirectives::of(&h);
                if let Some(Delta::Secs(n)) = d.max_age {
                    proptest::prop_assert!(n <= MAX_DELTA);
                }
                let _ = RequestDirectives::of(&h);
            }
            let _ = lenient_date(&s);
        }
    }
}

//! Entry points for `cargo fuzz` (`fuzz/`, see docs/fuzzing.md): the parsers that read
//! what a peer or an operator writes. Not an API.
//!
//! Each function takes the fuzzer's bytes and either checks its own invariants (and
//! panics when one breaks) or hands back what the target compares with a reference
//! written apart from the code under test.

/// The destination classifier and address parser, for the `safety` target.
pub use crate::safety::{classify, parse_ip, Reason};
use std::net::IpAddr;

use bytes::BytesMut;
use http::Request;

use crate::body::Body;
use crate::config::lexer::Env;
use crate::config::template::{Group, Template, TemplatePart, Values};
use crate::fastcgi::codec::{Decoder as FcgiDecoder, Record};
use crate::fastcgi::head as fcgi_head;
use crate::http1::decode::{Decoded, Decoder};
use crate::http1::head::{self, Framing};
use crate::http1::scan::{RequestScan, ResponseScan};
use crate::http1::MAX_HEAD;
use crate::route::path;

/// The input's first byte as a read size (1–64), and the rest.
fn step_of(data: &[u8]) -> Option<(usize, u8, &[u8])> {
    let (&first, rest) = data.split_first()?;
    Some((usize::from(first % 64) + 1, first, rest))
}

/// The FastCGI record decoder over `data` (its first byte picks the read size), then
/// the head parser over the STDOUT it produced.
pub fn fastcgi_response(data: &[u8]) {
    let Some((step, _, rest)) = step_of(data) else {
        return;
    };
    let mut decoder = FcgiDecoder::default();
    let mut buf = BytesMut::new();
    let mut stdout = Vec::new();
    'feed: for piece in rest.chunks(step) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(Record::Stdout(b))) => {
                    assert!(b.len() <= crate::fastcgi::codec::MAX_CONTENT);
                    stdout.extend_from_slice(&b);
                }
                Ok(Some(Record::Stderr(b))) => {
                    assert!(b.len() <= crate::fastcgi::codec::MAX_CONTENT)
                }
                Ok(Some(Record::End { .. })) => {}
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
        // Never more than a record header's worth, plus what one read added.
        assert!(buf.len() < 8 + step);
    }
    if let Ok(Some((h, used))) = fcgi_head::parse(&stdout) {
        assert!(used <= stdout.len());
        assert!(h.headers.get(http::header::CONNECTION).is_none());
    }
    let _ = fcgi_head::parse(rest);
}

/// The environment a fuzzed config sees: one variable.
struct OneVar;

impl Env for OneVar {
    fn get(&self, name: &str) -> Option<String> {
        (name == "FUZZ").then(|| "127.0.0.1:8080".to_string())
    }
}

/// Config text through the lexer, parser and builder (imports are not read). Every
/// diagnostic must point inside the text and render.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let report = match crate::config::load_alone("fuzz.conf", &text, &OneVar) {
        Ok(loaded) => loaded.warnings,
        Err(report) => report,
    };
    let lines: Vec<&str> = text.lines().collect();
    for d in &report.diagnostics {
        let s = d.span;
        assert_eq!(s.file, 0, "{d:?}");
        assert!(
            s.line >= 1 && s.line as usize <= lines.len().max(1),
            "line outside the text: {d:?}"
        );
        let width = lines
            .get(s.line as usize - 1)
            .map_or(0, |l| l.chars().count());
        assert!(
            s.col >= 1 && s.col as usize <= width + 1,
            "column outside line {} ({width} chars): {d:?}",
            s.line
        );
        assert!(!d.message.is_empty());
        let shown = d.render(&report.sources);
        assert!(shown.contains(&format!("fuzz.conf:{}:{}", s.line, s.col)));
    }
}

/// Requests as a client sends them, pipelined, read in pieces whose size the first
/// byte picks: the head scanner, the head parser and the body decoder in turn.
pub fn http1_request(data: &[u8]) {
    let Some((step, _, rest)) = step_of(data) else {
        return;
    };
    let mut input = rest.chunks(step);
    let mut buf = BytesMut::new();
    let mut fed = 0usize;
    for _ in 0..8 {
        let mut scan = RequestScan::default();
        let end = loop {
            match scan.find_end(&buf) {
                Err(_) => return,
                Ok(Some(end)) => break end,
                Ok(None) => match input.next() {
                    Some(p) => {
                        fed += p.len();
                        buf.extend_from_slice(p);
                    }
                    None => return,
                },
            }
        };
        assert!(end <= buf.len());
        let bytes = buf.split_to(end).freeze();
        let Ok(mut h) = head::parse_request(bytes.clone(), true) else {
            return;
        };
        // The map made at once and the map made later from the fields as they came are
        // the same map.
        let at_once = head::parse_request(bytes, false).expect("the same head parses");
        assert!(at_once.fields.is_none());
        if let Some(f) = h.fields.take() {
            h.headers = f.to_map();
            forwarded_lines(&h.headers, Some(&f));
        }
        assert_eq!(h.headers, at_once.headers);
        forwarded_lines(&h.headers, None);
        let lengths = h
            .headers
            .get_all(http::header::CONTENT_LENGTH)
            .iter()
            .count();
        let te = h.headers.contains_key(http::header::TRANSFER_ENCODING);
        let mut decoder = match h.framing {
            Framing::None => {
                assert!(!te, "{h:?}");
                // A length of zero, however spelled (`00` is one).
                let zero = h.headers.get(http::header::CONTENT_LENGTH);
                let zero = zero.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                assert!(lengths == 0 || zero == Some(0), "{h:?}");
                continue;
            }
            Framing::Length(n) => {
                assert!(!te, "a length and a coding: {h:?}");
                assert_eq!(lengths, 1, "{h:?}");
                let v = &h.headers[http::header::CONTENT_LENGTH];
                assert_eq!(v.to_str().ok().and_then(|v| v.parse().ok()), Some(n));
                Decoder::length(n)
            }
            Framing::Chunked => {
                assert_eq!(lengths, 0, "a coding and a length: {h:?}");
                Decoder::chunked()
            }
        };
        let before = fed - buf.len();
        if !drain(&mut decoder, &mut buf, &mut input, &mut fed, step, before) {
            return;
        }
    }
}

/// Decodes one body; `false` when the input ended or was refused before it did.
fn drain<'a>(
    decoder: &mut Decoder,
    buf: &mut BytesMut,
    input: &mut impl Iterator<Item = &'a [u8]>,
    fed: &mut usize,
    step: usize,
    start: usize,
) -> bool {
    let mut body = 0usize;
    loop {
        match decoder.decode(buf) {
            Err(_) => return false,
            Ok(Decoded::Done) => return true,
            Ok(Decoded::Trailers(_)) => assert!(decoder.is_done()),
            Ok(Decoded::Data(d)) => {
                assert!(!d.is_empty());
                body += d.len();
                // Never more body than bytes arrived for it.
                assert!(body <= *fed - start);
            }
            Ok(Decoded::NeedMore) => {
                // What waits for more is a size line or trailers, bounded.
                assert!(buf.len() <= 64 * 1024 + 4096 + step, "{}", buf.len());
                match input.next() {
                    Some(p) => {
                        *fed += p.len();
                        buf.extend_from_slice(p);
                    }
                    None => {
                        decoder.finish();
                        return decoder.is_done() && decoder.decode(buf) == Ok(Decoded::Done);
                    }
                }
            }
        }
    }
}

/// Responses as a backend sends them: the first byte picks the read size and whether
/// the request was HEAD.
pub fn http1_response(data: &[u8]) {
    let Some((step, first, rest)) = step_of(data) else {
        return;
    };
    let is_head = first & 0x40 != 0;
    let mut input = rest.chunks(step);
    let mut buf = BytesMut::new();
    let mut fed = 0usize;
    for _ in 0..8 {
        let mut scan = ResponseScan::default();
        let end = loop {
            match scan.find_end(&buf) {
                Some(end) => break end,
                None if buf.len() > MAX_HEAD => return,
                None => match input.next() {
                    Some(p) => {
                        fed += p.len();
                        buf.extend_from_slice(p);
                    }
                    None => return,
                },
            }
        };
        assert!(end <= buf.len());
        for (compress, identity_only) in [(false, false), (true, false), (true, true)] {
            let through_map = response_fields(&buf[..end], is_head, compress, identity_only, false);
            let as_sent = response_fields(&buf[..end], is_head, compress, identity_only, true);
            assert_eq!(
                through_map.map(|r| r.map(|(f, flags, _)| (f, flags))),
                as_sent.map(|r| r.map(|(f, flags, _)| (f, flags))),
                "compress {compress}, identity only {identity_only}"
            );
        }
        let h = match head::parse_response(&mut buf, end, is_head, None) {
            Err(_) => return,
            Ok(None) => continue,
            Ok(Some(h)) => h,
        };
        let status = h.parts.status;
        assert!(!status.is_informational() || status == http::StatusCode::SWITCHING_PROTOCOLS);
        if is_head || status == http::StatusCode::NO_CONTENT || status.as_u16() == 304 {
            assert!(
                h.decoder.is_done(),
                "{status} on HEAD={is_head}: {:?}",
                h.decoder
            );
        }
        if h.decoder.until_eof() {
            assert!(!h.reusable);
        }
        let mut decoder = h.decoder;
        let before = fed - buf.len();
        if !drain(&mut decoder, &mut buf, &mut input, &mut fed, step, before) || !h.reusable {
            return;
        }
    }
}

/// The fields of response `head` as an HTTP/1 client gets them, either as sent
/// (`http1::head::SentFields`) or through the map (`as_sent` false): the status line,
/// then the fields sorted by name (a name's own fields keep their order); whether they
/// hold `Date` and `Content-Length`; whether they went as sent. What the proxy, the
/// pipeline (compression, for a client that takes gzip or none) and the client's
/// connection do to them on the way, from parse to `encode::head`. `Ok(None)`: an
/// interim answer. The two ways must agree on every head: the fuzz target
/// `http1_response` and a property test hold them to it.
#[allow(clippy::type_complexity)]
pub fn response_fields(
    head: &[u8],
    is_head: bool,
    compress: bool,
    identity_only: bool,
    as_sent: bool,
) -> Result<Option<(Vec<String>, (bool, bool), bool)>, &'static str> {
    use http::header::{self as h, HeaderValue};
    use http::StatusCode;
    let rule = head::AsSent {
        compress,
        identity_only,
    };
    let mut b = BytesMut::from(head);
    let len = b.len();
    let r = match head::parse_response(&mut b, len, is_head, Some(rule).filter(|_| as_sent)) {
        Err(e) => return Err(e.0),
        Ok(None) => return Ok(None),
        Ok(Some(r)) => r,
    };
    let mut parts = r.parts;
    let cfg = crate::config::ProxyConfig::new(vec![]);
    crate::proxy::headers::response(&mut parts.headers, &cfg, &Values::default());
    let mut resp = http::Response::from_parts(parts, Body::Empty);
    if compress {
        let gzip = HeaderValue::from_static("gzip");
        let accept = (!identity_only).then_some(&gzip);
        crate::filter::compress::apply(&mut resp, accept, is_head, false, false);
    }
    let (parts, _) = resp.into_parts();
    let mut map = parts.headers;
    // What the client's connection does for an answer without a body.
    let no_body =
        parts.status == StatusCode::NO_CONTENT || parts.status == StatusCode::NOT_MODIFIED;
    if no_body && !is_head {
        map.remove(h::CONTENT_LENGTH);
    }
    let (lines, flags) = match &r.fields {
        Some(f) => (&f.lines[..], (f.has_date, f.has_length)),
        None => (
            &[][..],
            (
                map.contains_key(h::DATE),
                map.contains_key(h::CONTENT_LENGTH),
            ),
        ),
    };
    let mut out = Vec::new();
    crate::http1::encode::head(
        &mut out,
        parts.status,
        lines,
        &map,
        http::Version::HTTP_11,
        true,
    );
    let mut fields = lines_of(&out);
    by_name(&mut fields[1..]);
    Ok(Some((fields, flags, r.fields.is_some())))
}

/// The non-empty lines of a head (or of its field lines).
fn lines_of(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .split("\r\n")
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Field lines sorted by name, stably: each name's lines keep their order, which is
/// all a field's meaning depends on.
fn by_name(lines: &mut [String]) {
    lines.sort_by_key(|l| l.split(':').next().unwrap_or("").to_string());
}

/// A request's fields as an HTTP/1 backend gets them from an untrusted client on a
/// plain pool, both ways: written at once (`proxy::headers::forwarded`) from the
/// client's map `h`, or from its fields as they came (`raw`, whose map `h` is), and
/// through the map's work and its encoder. The same fields per name, in order; the
/// lines keep the client's order of its fields (the map's, or the head's), then a kept
/// `TE: trailers`, then the forwarding fields; and the lines are written unless a
/// `Connection` names other fields. The fuzz target `http1_request` and a property
/// test hold every head to it.
pub(crate) fn forwarded_lines(h: &http::HeaderMap, raw: Option<&crate::http1::fields::Fields>) {
    use crate::proxy::headers;
    use http::header::{self as n, HeaderValue};
    let ip = HeaderValue::from_static("192.0.2.1");
    let scheme = HeaderValue::from_static("https");
    let mut mapped = h.clone();
    let cfg = crate::config::ProxyConfig::new(vec![]);
    headers::request(&mut mapped, &ip, &scheme, false, &cfg);
    let mut want = Vec::new();
    crate::http1::encode::request_fields(&mut want, &mapped, |_, _| Some(true));
    let names_other_fields = h.get_all(n::CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|t| {
                !t.is_empty()
                    && !t.eq_ignore_ascii_case(b"close")
                    && !t.eq_ignore_ascii_case(b"keep-alive")
            })
    });
    let got = match raw {
        Some(f) => headers::forwarded(f, &ip, &scheme),
        None => headers::forwarded(h, &ip, &scheme),
    };
    let Some(got) = got else {
        assert!(names_other_fields, "{h:?}");
        return;
    };
    assert!(!names_other_fields, "{h:?}");
    let (got, want) = (lines_of(&got), lines_of(&want));
    let (mut got_sorted, mut want_sorted) = (got.clone(), want.clone());
    by_name(&mut got_sorted);
    by_name(&mut want_sorted);
    assert_eq!(got_sorted, want_sorted, "{h:?}");
    let name = |l: &String| l.split(':').next().unwrap_or("").to_string();
    // sluice's own: an untrusted client's fields of these names never pass.
    let ours = |k: &String| {
        [
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "te",
        ]
        .contains(&k.as_str())
    };
    let mut kept: Vec<String> = match raw {
        None => h.keys().map(|k| k.as_str().to_string()).collect(),
        // The head's order, every `Cookie` joined into the first.
        Some(f) => {
            let mut cookie = false;
            f.iter()
                .map(|(n, _)| String::from_utf8_lossy(n).to_ascii_lowercase())
                .filter(|k| k != "cookie" || !std::mem::replace(&mut cookie, true))
                .collect()
        }
    };
    let passed: Vec<String> = want.iter().map(name).collect();
    kept.retain(|k| !ours(k) && passed.contains(k));
    kept.dedup();
    let mut client: Vec<String> = got.iter().map(name).filter(|k| !ours(k)).collect();
    client.dedup();
    assert_eq!(client, kept, "{h:?}");
    let tail: Vec<String> = got.iter().map(name).skip_while(|k| !ours(k)).collect();
    let mut want_tail = vec!["x-forwarded-for", "x-forwarded-proto"];
    if h.contains_key(n::HOST) {
        want_tail.push("x-forwarded-host");
    }
    if passed.iter().any(|k| k == "te") {
        want_tail.insert(0, "te");
    }
    assert_eq!(tail, want_tail, "{h:?}");
}

/// Path normalisation: a normal result is absolute, has no dot segments or empty
/// segments, no control bytes, no raw backslash, is its own normal form, and is borrowed only when the
/// input was already normal. Host normalisation: idempotent, lower case.
pub fn path(data: &[u8]) {
    let Ok(p) = std::str::from_utf8(data) else {
        // A host is ASCII: bytes that are not even text name no site.
        assert!(path::site_host(data).is_none(), "{data:?}");
        return;
    };
    if let Ok(n) = path::normalize(p) {
        if p != "*" {
            assert!(n.starts_with('/'), "{p:?} -> {n:?}");
            assert!(!n.contains("//"), "{p:?} -> {n:?}");
            assert!(
                n.split('/').all(|s| s != "." && s != ".."),
                "{p:?} -> {n:?}"
            );
            assert!(!n.bytes().any(|b| b < 0x20 || b == 0x7f), "{p:?}");
            assert!(!n.contains('\\'), "a raw backslash passed: {p:?}");
            let b = n.as_bytes();
            for (i, _) in n.match_indices('%') {
                let hex = &b[i + 1..i + 3];
                assert!(hex
                    .iter()
                    .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
                let v = u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap();
                let unreserved = v.is_ascii_alphanumeric() || b"-._~".contains(&v);
                assert!(
                    !unreserved,
                    "{p:?} -> {n:?} keeps an escaped unreserved byte"
                );
            }
            let again = path::normalize(&n).expect("a normal path is accepted");
            assert_eq!(again, n, "not idempotent: {p:?}");
            // Escapes are always looked at again; anything else normal is borrowed.
            if !n.contains('%') {
                assert!(matches!(again, std::borrow::Cow::Borrowed(_)), "{n:?}");
            }
        }
        if let std::borrow::Cow::Borrowed(_) = n {
            assert_eq!(n, p);
        }
    }
    let h = path::normalize_host(p);
    assert!(!h.bytes().any(|b| b.is_ascii_uppercase()), "{p:?} -> {h:?}");
    // The site lookup's one pass finds what the check and the normal form find.
    let want = path::valid_host(p).then(|| h.clone());
    let found = path::site_host(p.as_bytes()).map(|h| h.to_vec());
    assert_eq!(found, want.map(|h| h.as_bytes().to_vec()), "{p:?}");
    // One trailing dot goes (`a.test.` is `a.test`); `a.test..` names no host.
    if !h.contains([':', '[', ']']) && !h.ends_with('.') {
        assert_eq!(path::normalize_host(&h), h, "{p:?}");
    }
}

/// `text` rendered as a `respond`/`redirect`/header template with `values` (host, path,
/// query, method, client_ip, scheme; no query when `values[2]` is `None`), or the
/// unknown placeholder's name. It is a template outside a regex route, as the config
/// loads it: `{re.N}` is refused there (`Err("re.N")`, after any unknown name), and no
/// client certificate is present.
pub fn template(text: &str, values: [Option<&str>; 6]) -> Result<String, String> {
    let mut t = Template::parse(text).map_err(|e| e.0)?;
    if t.resolve_groups(None).is_err() {
        let shown = t.parts.iter().find_map(|p| match p {
            TemplatePart::Group(Group::Index(i)) => Some(i.to_string()),
            TemplatePart::Group(Group::Name(n)) => Some(n.clone()),
            _ => None,
        });
        return Err(format!("re.{}", shown.unwrap_or_default()));
    }
    let v = Values {
        host: values[0].unwrap_or(""),
        path: values[1].unwrap_or(""),
        query: values[2],
        method: values[3].unwrap_or(""),
        client_ip: values[4].unwrap_or(""),
        scheme: values[5].unwrap_or(""),
        captures: None,
        client_cert: None,
    };
    Ok(t.render(&v))
}

/// The coding `Accept-Encoding: accept` picks, by its token.
pub fn accept_encoding(accept: &[u8]) -> Option<&'static str> {
    crate::filter::compress::negotiate(accept).map(|c| c.token())
}

/// A request a filter condition is tested on.
pub struct Probe<'a> {
    pub method: &'a str,
    /// Path and query, as the request line has them.
    pub target: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub client: IpAddr,
}

/// The condition `when COND` on a filter line, loaded from config text, and whether it
/// holds for `probe` (checked to be the opposite of `unless COND`), with the
/// normalised path it was judged on; `None` when the line or the request is refused.
pub fn condition(
    cond: &str,
    probe: &Probe<'_>,
) -> Option<(crate::config::Condition, bool, String)> {
    // A fragment never reaches a server (the URI type cuts it off): not a request.
    if cond.contains(['{', '}', ';', '#', '\n', '\r']) || probe.target.contains('#') {
        return None;
    }
    let text = format!(
        "listen 127.0.0.1:1\nsite * {{\n  header_down X-F 1 when {cond}\n  respond 200\n}}\n"
    );
    let loaded = crate::config::load_alone("fuzz.conf", &text, &OneVar).ok()?;
    // `when status …` is a response condition, and a line may hold only clauses the
    // request is not tested on (`name`, `failure`): nothing to compare.
    let model = loaded.config.sites[0].filters[0].condition.clone()?;
    let mut req = Request::builder().method(probe.method).uri(probe.target);
    for (n, v) in probe.headers {
        req = req.header(*n, *v);
    }
    let req = req.body(Body::Empty).ok()?;
    let normal = path::normalize(req.uri().path()).ok()?.into_owned();
    let cx = crate::filter::Cx::new(Some(normal.clone()), None, probe.client);
    let when = crate::runtime::compile::condition(&model);
    let mut opposite = model.clone();
    opposite.negate = !opposite.negate;
    let unless = crate::runtime::compile::condition(&opposite);
    let holds = when.holds(&req, &cx);
    assert_ne!(
        holds,
        unless.holds(&req, &cx),
        "`unless` is not the opposite"
    );
    Some((model, holds, normal))
}

/// A response head's fields reach an HTTP/1 client the same whether they pass as
/// sent (`http1::head::SentFields`) or through the map (`response`, then the
/// encoder): the same lines, same-name fields in their order (the map groups a
/// name's fields at its first; the lines keep the backend's order).
#[cfg(test)]
mod as_sent {
    use super::response_fields;
    use crate::http1::head::AsSent;
    use proptest::prelude::*;

    const NAMES: &[&str] = &[
        "Server",
        "Date",
        "Content-Type",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "Upgrade",
        "TE",
        "Expect",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "X-Powered-By",
        "X-Sluice-Peer",
        "x_SLUICE_y",
        "X-Sluice",
        "Set-Cookie",
        "Vary",
        "X-Custom",
        "x_forwarded_for",
        "ETag",
        "Trailer",
        "Cache-Control",
        "Last-Modified",
        "Location",
    ];
    const VALUES: &[&str] = &[
        "text/html",
        "application/octet-stream",
        "image/png",
        "application/JSON",
        "close",
        "keep-alive",
        "Close, Keep-Alive",
        "close, x-custom",
        "x-custom",
        "5",
        "5, 5",
        "7",
        "chunked",
        "gzip, chunked",
        "a=b",
        "  spaced  ",
        "",
        "trailers",
    ];

    /// The fields a client gets (status line first, then by name), whether it has
    /// `Date` and `Content-Length`, and whether they went as sent.
    type Seen = (Vec<String>, (bool, bool), bool);

    /// The head's fields as an HTTP/1 client gets them, one way or the other; the
    /// error of a head refused (which must match too).
    fn client_lines(head: &str, rule: AsSent, as_sent: bool) -> Result<Seen, &'static str> {
        response_fields(
            head.as_bytes(),
            false,
            rule.compress,
            rule.identity_only,
            as_sent,
        )
        .map(|r| r.expect("a final answer"))
    }

    fn case(name: &str, upper: &[bool]) -> String {
        name.chars()
            .zip(upper.iter().cycle())
            .map(|(c, &u)| {
                if u {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    }

    #[test]
    fn a_compressible_answer_to_a_client_without_codings_varies() {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nServer: x\r\n\r\n";
        let rule = AsSent {
            compress: true,
            identity_only: true,
        };
        let (lines, _, used) = client_lines(head, rule, true).unwrap();
        assert!(used);
        assert_eq!(lines, client_lines(head, rule, false).unwrap().0);
        assert!(
            lines.contains(&"vary: accept-encoding".to_string()),
            "{lines:?}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn fields_as_sent_are_the_fields_through_the_map(
            status in prop::sample::select(vec![200u16, 204, 304, 404, 101, 500]),
            fields in prop::collection::vec(
                (
                    prop_oneof![
                        4 => prop::sample::select(NAMES).prop_map(str::to_string),
                        1 => "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,12}",
                    ],
                    prop::collection::vec(any::<bool>(), 1..4),
                    prop_oneof![
                        4 => prop::sample::select(VALUES).prop_map(str::to_string),
                        1 => "[ -~\t]{0,20}",
                    ],
                ),
                0..10,
            ),
            compress in any::<bool>(),
            identity_only in any::<bool>(),
        ) {
            let mut head = format!("HTTP/1.1 {status} X\r\n");
            for (name, upper, value) in &fields {
                head.push_str(&format!("{}: {value}\r\n", case(name, upper)));
            }
            head.push_str("\r\n");
            let rule = AsSent {
                compress,
                identity_only,
            };
            let through_map = client_lines(&head, rule, false);
            let as_sent = client_lines(&head, rule, true);
            match (&through_map, &as_sent) {
                (Ok((a, a_date, _)), Ok((b, b_date, _))) => {
                    prop_assert_eq!(a, b, "{}", head);
                    prop_assert_eq!(a_date, b_date);
                }
                (a, b) => prop_assert_eq!(a.as_ref().err(), b.as_ref().err(), "{}", head),
            }
            // The lines are used whenever nothing needs the map.
            if let Ok((_, _, used)) = as_sent {
                let needs_map = status == 101 || fields.iter().any(|(n, _, v)| {
                    n.eq_ignore_ascii_case("connection")
                        && v.split(',').map(str::trim).any(|t| {
                            !t.is_empty()
                                && !t.eq_ignore_ascii_case("close")
                                && !t.eq_ignore_ascii_case("keep-alive")
                        })
                });
                let has = |name: &str| fields.iter().any(|(n, _, _)| n.eq_ignore_ascii_case(name));
                let compressible = compress && fields.iter().find(|(n, _, _)| n.eq_ignore_ascii_case("content-type"))
                    .is_some_and(|(_, _, v)| crate::http1::head::compressible(v.trim().as_bytes()));
                let needs_map = needs_map || (compressible && (!identity_only || has("vary")));
                prop_assert_eq!(used, !needs_map, "{}", head);
            }
        }
    }
}

#[cfg(test)]
mod forwarded {
    use proptest::prelude::*;

    /// Names a request may carry: each kind the proxy tells apart, in several
    /// spellings, and plain ones.
    const NAMES: [&str; 25] = [
        "x-forwarded-x",
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "expect",
        "transfer-encoding",
        "proxy-authorization",
        "te",
        "content-length",
        "cookie",
        "x-forwarded-for",
        "x_forwarded_for",
        "x-forwarded-host",
        "forwarded",
        "x-real-ip",
        "x-sluice-peer",
        "x_sluice_role",
        "x-powered-by",
        "user-agent",
        "accept",
        "x-a",
        "x-b",
        "x_a",
    ];
    const VALUES: [&str; 8] = [
        "",
        "1",
        "close",
        "keep-alive",
        "x-a",
        "trailers",
        "gzip, trailers",
        "a=1",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// Any mix of those names and values: [`super::forwarded_lines`].
        #[test]
        fn forwarded_lines_are_the_maps(
            // Past the fields' 16 inline places too.
            fields in proptest::collection::vec((0..NAMES.len(), 0..VALUES.len(), any::<u32>()), 0..40),
        ) {
            let mut h = http::HeaderMap::new();
            // The same fields in a head, each name in a case of its own.
            let mut head = b"GET / HTTP/1.0\r\n".to_vec();
            let mut host = false;
            for &(n, v, case) in &fields {
                h.append(http::HeaderName::from_static(NAMES[n]), http::HeaderValue::from_static(VALUES[v]));
                // The head keeps what the parser takes as it came: one `Host`, no
                // framing field (their own tests hold those).
                let framing = matches!(NAMES[n], "content-length" | "transfer-encoding");
                if framing || (NAMES[n] == "host" && std::mem::replace(&mut host, true)) {
                    continue;
                }
                let name = NAMES[n].bytes().enumerate().map(|(i, c)| match case >> (i % 32) & 1 {
                    1 => c.to_ascii_uppercase(),
                    _ => c,
                });
                head.extend(name);
                head.extend_from_slice(b": ");
                head.extend_from_slice(VALUES[v].as_bytes());
                head.extend_from_slice(b"\r\n");
            }
            head.extend_from_slice(b"\r\n");
            super::forwarded_lines(&h, None);
            let parsed = crate::http1::head::parse_request(bytes::Bytes::from(head), true);
            let f = parsed.expect("the head parses").fields.expect("kept as they came");
            super::forwarded_lines(&f.to_map(), Some(&f));
        }
    }
}

//! Value parsers: numbers, sizes, durations, addresses, patterns, templates and
//! status codes, each refused at the value's own column with a hint.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use ipnet::IpNet;

use super::args::*;
use super::Res;
use crate::config::diag::Diagnostic;
use crate::config::model::*;
use crate::config::parser::{Directive, Word};
use crate::config::template::Placeholder;
use crate::config::units::{parse_duration, parse_size};

pub(super) fn int_in(w: &Word, min: u64, max: u64) -> Res<u64> {
    match w.text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(
            Diagnostic::error(w.span, format!("{} is out of range", w.text))
                .with_hint(format!("use a whole number from {min} to {max}")),
        ),
        Err(_) => Err(expected(w, &format!("a whole number from {min} to {max}"))),
    }
}

pub(super) fn duration(w: &Word) -> Res<Duration> {
    parse_duration(&w.text).map_err(|e| {
        let d = Diagnostic::error(w.span, e.message);
        match e.hint {
            Some(h) => d.with_hint(h),
            None => d,
        }
    })
}

pub(super) fn positive(w: &Word) -> Res<Duration> {
    let d = duration(w)?;
    if d.is_zero() {
        return Err(Diagnostic::error(
            w.span,
            "this duration must be more than 0s",
        ));
    }
    Ok(d)
}

pub(super) fn size(w: &Word) -> Res<u64> {
    parse_size(&w.text).map_err(|e| {
        let d = Diagnostic::error(w.span, e.message);
        match e.hint {
            Some(h) => d.with_hint(h),
            None => d,
        }
    })
}

/// A network; an IPv4-mapped IPv6 one (`::ffff:10.0.0.0/104`) is read as the IPv4
/// network it names, since clients and answers are compared in their IPv4 form.
pub(super) fn cidr(w: &Word) -> Res<IpNet> {
    let net = w
        .text
        .parse::<IpNet>()
        .map(|n| n.trunc())
        .or_else(|_| w.text.parse::<IpAddr>().map(IpNet::from));
    if let Ok(net) = net {
        if let IpNet::V6(v6) = net {
            if let (Some(v4), true) = (v6.addr().to_ipv4_mapped(), v6.prefix_len() >= 96) {
                return Ok(IpNet::V4(
                    ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).expect("96..128 less 96 fits"),
                ));
            }
        }
        return Ok(net);
    }
    Err(expected(
        w,
        "an address or CIDR like 10.0.0.0/8 or 2001:db8::/32",
    ))
}

/// `strict` or `off`, as `safety` takes.
pub(super) fn strict_or_off(w: &Word) -> Res<bool> {
    match w.text.as_str() {
        "strict" => Ok(true),
        "off" => Ok(false),
        _ => Err(expected(w, "`strict` or `off`")),
    }
}

/// A DNS server for `resolver`: an IP address, with a port when it is not 53.
pub(super) fn dns_server(w: &Word) -> Res<SocketAddr> {
    let bare = w
        .text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(&w.text);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    w.text.parse::<SocketAddr>().map_err(|_| {
        expected(w, "a DNS server's IP address, with :PORT when not 53")
            .with_hint("write 10.0.0.2, 10.0.0.2:5353 or [2001:db8::53]:53; a resolver is named by address, not by name")
    })
}

/// `listen ADDR [tls [quic]] [proxy_protocol] [{ allow …; deny …; rate_limit N/s }]`.
pub(super) fn listen(d: &Directive) -> Res<Listen> {
    const USAGE: &str = "write: listen ADDR [tls [quic]] [proxy_protocol]";
    let w = d
        .args
        .first()
        .ok_or_else(|| missing(d, "listen ADDR", "listen ADDR"))?;
    let mut guards = Vec::new();
    for item in d.block.as_deref().unwrap_or(&[]) {
        match item.name.text.as_str() {
            "allow" | "deny" | "rate_limit" => guards.push(super::proxy::tcp_guard(item)?),
            _ => {
                return Err(Diagnostic::error(
                    item.name.span,
                    format!("`{}` does not belong in a `listen` block", item.name.text),
                )
                .with_hint("a listen block judges connections at accept: allow CIDR...; deny CIDR...; rate_limit N/s [burst N]"))
            }
        }
    }
    let (mut tls, mut proxy_protocol, mut quic) = (false, false, false);
    for t in &d.args[1..] {
        let flag = match t.text.as_str() {
            "tls" => &mut tls,
            "proxy_protocol" => &mut proxy_protocol,
            "quic" => &mut quic,
            _ => {
                return Err(
                    expected(t, "`tls`, `quic`, `proxy_protocol` or nothing").with_hint(USAGE)
                )
            }
        };
        if *flag {
            return Err(extra(t, USAGE));
        }
        *flag = true;
    }
    if let Some(q) = d.args[1..].iter().find(|t| t.text == "quic") {
        if !tls {
            return Err(expected(q, "`tls` before `quic`")
                .with_hint("HTTP/3 is always encrypted: write listen ADDR tls quic"));
        }
        if proxy_protocol {
            return Err(expected(q, "`quic` without `proxy_protocol`").with_hint(
                "a PROXY protocol header travels on TCP only; put quic on a listener of its own",
            ));
        }
        if let Some(s) = d.block_span.filter(|_| !guards.is_empty()) {
            return Err(Diagnostic::error(
                s,
                "a `listen … quic` line cannot judge connections yet",
            )
            .with_hint("put allow/deny/rate_limit on a `listen ADDR tls` line of its own, or filter in the site"));
        }
    }
    let (addr, dual_stack) = listen_addr(w)?;
    Ok(Listen {
        addr,
        text: w.text.clone(),
        dual_stack,
        tls,
        proxy_protocol,
        quic,
        span: d.span(),
        addr_span: w.span,
        guards,
        seq: 0,
    })
}

/// An address to listen on: `127.0.0.1:8080`, `[::1]:8080`, `localhost:8080`, or `:8080`
/// (every interface of both families: the second value is true).
pub(super) fn listen_addr(w: &Word) -> Res<(SocketAddr, bool)> {
    let text = w.text.as_str();
    let dual_stack = text.starts_with(':');
    let addr = if let Some(port) = text.strip_prefix(':') {
        port.parse::<u16>()
            .ok()
            .map(|p| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, p)))
    } else if let Some(port) = text.strip_prefix("localhost:") {
        port.parse::<u16>()
            .ok()
            .map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p)))
    } else {
        text.parse::<SocketAddr>().ok()
    };
    addr.map(|a| (a, dual_stack)).ok_or_else(|| {
        expected(w, "an address with a port")
            .with_hint("write 127.0.0.1:8080, [::1]:8080 or :8080 (all interfaces)")
    })
}

pub(super) fn host_pattern(w: &Word) -> Res<HostPattern> {
    let h = w.text.to_ascii_lowercase();
    if h == "*" {
        return Ok(HostPattern::Any);
    }
    let (wild, name) = match h.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, h.as_str()),
    };
    if let Some((scheme, rest)) = w.text.split_once("://") {
        return Err(Diagnostic::error(
            w.span,
            format!("site host `{}` has a scheme (`{scheme}://`)", w.text),
        )
        .with_hint(format!(
            "a site matches the Host alone: write `site {}`; HTTPS comes from a `listen … tls` line and the site's `tls`",
            rest.trim_end_matches('/')
        )));
    }
    if name.contains(':') && !name.starts_with('[') {
        return Err(
            Diagnostic::error(w.span, format!("site host `{}` has a port", w.text))
                .with_hint("hosts are matched without their port; write the name alone"),
        );
    }
    let ok = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !ok && name.parse::<IpAddr>().is_err() && !name.starts_with('[') {
        return Err(expected(w, "a host name, *.suffix or *")
            .with_hint("for example: site example.com *.example.com {"));
    }
    Ok(if wild {
        HostPattern::Suffix(format!(".{name}"))
    } else {
        HostPattern::Exact(
            name.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        )
    })
}

pub(super) fn path_pattern(w: &Word) -> Res<PathPattern> {
    let t = w.text.as_str();
    if !t.starts_with('/') {
        return Err(expected(w, "a path starting with /").with_hint("write /exact or /prefix/*"));
    }
    if let Some(prefix) = t.strip_suffix("/*") {
        if !prefix.contains('*') {
            normal_form(w, prefix)?;
            return Ok(PathPattern::Prefix(prefix.to_string()));
        }
    } else if !t.contains('*') {
        normal_form(w, t)?;
        return Ok(PathPattern::Exact(t.to_string()));
    }
    Err(Diagnostic::error(
        w.span,
        format!("`{t}` has a `*` that is not a trailing `/*`"),
    )
    .with_hint("patterns are /exact or /prefix/*"))
}

/// `~ "REGEX"`: compiled now, so a bad one is a load error at its column.
pub(super) fn path_regex(w: &Word) -> Res<PathPattern> {
    regex::RegexBuilder::new(&w.text)
        .size_limit(1 << 20)
        .build()
        .map(|re| PathPattern::Regex(PathRegex(re)))
        .map_err(|e| {
            // The crate's message ends with its own one-line summary.
            let why = e.to_string();
            let last = why.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            let last = last.trim();
            let last = last.strip_prefix("error: ").unwrap_or(last);
            Diagnostic::error(w.span, format!("invalid regex `{}`: {last}", w.text))
                .with_hint("the regex crate's syntax: no look-around or backreferences; quote it, e.g. route ~ \"^/v\\d+/\"")
        })
}

/// A route's or `rewrite`'s pattern: `~ "REGEX"` (two words) or one path pattern.
/// The words it took.
pub(super) fn pattern_words(args: &[Word]) -> Option<(Res<PathPattern>, usize)> {
    match args {
        [tilde, re, ..] if tilde.text == "~" && !tilde.quoted => Some((path_regex(re), 2)),
        [tilde] if tilde.text == "~" && !tilde.quoted => None,
        [w, ..] => Some((path_pattern(w), 1)),
        [] => None,
    }
}

/// A path in a pattern or prefix must be in the normal form requests are decided in
/// (route/path.rs): no `//`, `.` or `..` segments, no escape of an unreserved
/// character, escapes in upper case, nothing outside the URL path alphabet. Otherwise
/// the route could never match.
pub(super) fn normal_form(w: &Word, path: &str) -> Res<()> {
    let refuse = |why: &str| {
        Err(Diagnostic::error(w.span, format!("`{path}` is not in normal form: {why}"))
            .with_hint("routes decide on the normalised path; write it the way it normalises, e.g. /caf%C3%A9/a for /café/./a"))
    };
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'%' {
            let hex = |x: Option<&u8>| {
                x.filter(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c))
                    .copied()
            };
            let (Some(hi), Some(lo)) = (hex(b.get(i + 1)), hex(b.get(i + 2))) else {
                return refuse("an escape is not two upper-case hex digits");
            };
            let v =
                u8::from_str_radix(std::str::from_utf8(&[hi, lo]).unwrap_or("00"), 16).unwrap_or(0);
            if v.is_ascii_alphanumeric() || b"-._~".contains(&v) {
                return refuse("it escapes a character that needs no escape");
            }
            i += 3;
            continue;
        }
        if !(c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&c)) {
            return refuse("escape characters outside the URL path alphabet");
        }
        i += 1;
    }
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (k, seg) in segments.iter().enumerate() {
        if *seg == "." || *seg == ".." {
            return refuse("a `.` or `..` segment");
        }
        if seg.is_empty() && k != last {
            return refuse("an empty segment (`//`)");
        }
    }
    Ok(())
}

pub(super) fn matcher(d: &Directive) -> Res<Matcher> {
    matcher_as(d, "match")
}

/// A `match` line's test, or a condition's (`lead`: `when` or `unless`, for messages).
pub(super) fn matcher_as(d: &Directive, lead: &str) -> Res<Matcher> {
    let kind = first_arg(d, &format!("{lead} method|header|query ..."))?;
    let rest = &d.args[1..];
    match kind.text.as_str() {
        "method" => {
            if rest.is_empty() {
                return Err(missing(
                    d,
                    &format!("{lead} method METHOD..."),
                    &format!("{lead} method GET HEAD"),
                ));
            }
            rest.iter()
                .map(|w| {
                    if !w.text.bytes().all(|b| b.is_ascii_uppercase()) {
                        return Err(expected(w, "an upper-case method like GET"));
                    }
                    Method::from_bytes(w.text.as_bytes()).map_err(|_| expected(w, "a method"))
                })
                .collect::<Res<Vec<_>>>()
                .map(Matcher::Method)
        }
        "header" => match rest {
            [n, v] => Ok(Matcher::Header(
                HeaderName::from_bytes(n.text.as_bytes())
                    .map_err(|_| expected(n, "a header name"))?,
                v.text.clone(),
            )),
            [_, _, x, ..] => Err(extra(
                x,
                &format!("write: {lead} header NAME VALUE (quote a value with spaces)"),
            )),
            _ => Err(missing(
                d,
                &format!("{lead} header NAME VALUE"),
                &format!("{lead} header X-Canary 1"),
            )),
        },
        "query" => match rest {
            [n, v] => Ok(Matcher::Query(n.text.clone(), v.text.clone())),
            [_, _, x, ..] => Err(extra(x, &format!("write: {lead} query NAME VALUE"))),
            _ => Err(missing(
                d,
                &format!("{lead} query NAME VALUE"),
                &format!("{lead} query version 2"),
            )),
        },
        _ => Err(expected(kind, "`method`, `header` or `query`")),
    }
}

pub(super) fn header_op(d: &Directive, what: &str) -> Res<HeaderOp> {
    no_block(d)?;
    match d.args.as_slice() {
        [n] if n.text.starts_with('-') => {
            let name = &n.text[1..];
            HeaderName::from_bytes(name.as_bytes())
                .map(HeaderOp::Remove)
                .map_err(|_| expected(n, "a header name after `-`"))
        }
        [n, v] => {
            let name = HeaderName::from_bytes(n.text.as_bytes())
                .map_err(|_| expected(n, "a header name"))?;
            let t = template(v)?;
            let value = if t.has_placeholders() {
                HeaderTemplate::Render(t)
            } else {
                HeaderTemplate::Fixed(HeaderValue::from_str(&v.text).map_err(|_| {
                    Diagnostic::error(v.span, "this value cannot be sent in a header")
                        .with_hint("header values are visible ASCII")
                })?)
            };
            Ok(HeaderOp::Set(name, value))
        }
        [_, _, x, ..] => Err(extra(x, "quote a value that has spaces")),
        _ => Err(missing(
            d,
            &format!("{what} NAME VALUE | -NAME"),
            &format!("{what} X-Served-By edge"),
        )),
    }
}

pub(super) fn template(w: &Word) -> Res<Template> {
    Template::parse(&w.text).map_err(|e| {
        let names = Placeholder::ALL.iter().map(|(n, _)| *n);
        unknown_placeholder(w, &e.0, names, "and a regex's groups {re.N}, {re.NAME}")
    })
}

/// `{name}` in `w` is no placeholder: the error, with the `known` names and `more`.
pub(super) fn unknown_placeholder<'a>(
    w: &Word,
    name: &str,
    known: impl Iterator<Item = &'a str>,
    more: &str,
) -> Diagnostic {
    let names: Vec<String> = known.map(|n| format!("{{{n}}}")).collect();
    Diagnostic::error(w.span, format!("unknown placeholder `{{{name}}}`")).with_hint(format!(
        "placeholders here are {}, {more}",
        names.join(", ")
    ))
}

pub(super) fn status_word(w: &Word) -> Option<u16> {
    (w.text.len() == 3 && !w.quoted)
        .then(|| w.text.parse::<u16>().ok())
        .flatten()
}

pub(super) fn status(w: &Word, range: std::ops::RangeInclusive<u16>) -> Res<StatusCode> {
    let n = status_word(w)
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            expected(
                w,
                &format!("a status code from {} to {}", range.start(), range.end()),
            )
        })?;
    StatusCode::from_u16(n).map_err(|_| expected(w, "a status code"))
}

/// A backend address; a relative `unix:` path is resolved from `base`, the folder of
/// the file that names it.
/// `host[:port]` or `[v6][:port]`, the port `default` when left out; `Err`: what is
/// wrong with it.
fn host_and_port<'a>(rest: &'a str, default: &'a str) -> Result<(String, &'a str), &'static str> {
    let Some(v6) = rest.strip_prefix('[') else {
        return Ok(match rest.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p),
            None => (rest.to_string(), default),
        });
    };
    let (ip, port) = match v6.split_once(']') {
        Some((ip, "")) => (ip, default),
        Some((ip, tail)) => (
            ip,
            tail.strip_prefix(':').ok_or("expected [v6] or [v6]:port")?,
        ),
        None => return Err("expected [v6] or [v6]:port"),
    };
    ip.parse::<std::net::Ipv6Addr>()
        .map_err(|_| "not an IPv6 address")?;
    Ok((ip.to_string(), port))
}

pub(super) fn backend_addr(w: &Word, base: &Path) -> Res<BackendAddr> {
    let text = w.text.as_str();
    let bad = |msg: &str| Diagnostic::error(w.span, format!("`{text}`: {msg}"));
    if let Some(path) = text.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(
                bad("a unix address needs a socket path").with_hint("write unix:/run/app.sock")
            );
        }
        return Ok(BackendAddr {
            text: text.to_string(),
            target: Target::Unix(base.join(PathBuf::from(path))),
            scheme: BackendScheme::Http,
            span: w.span,
        });
    }
    let (scheme, rest) = if let Some(r) = text.strip_prefix("http://") {
        (BackendScheme::Http, r)
    } else if let Some(r) = text.strip_prefix("https://") {
        (BackendScheme::Https, r)
    } else if let Some(r) = text.strip_prefix("h2c://") {
        (BackendScheme::H2c, r)
    } else if let Some((scheme, _)) = text.split_once("://") {
        return Err(bad(&format!("unknown scheme `{scheme}`"))
            .with_hint("use host:port, http://, https://, h2c://, or unix:/path"));
    } else {
        (BackendScheme::Http, text)
    };
    if rest.contains(['/', '?', '#']) {
        return Err(bad("a backend address has no path or query")
            .with_hint("rewrite the path with `rewrite` or `strip` instead"));
    }
    if rest.contains('@') {
        return Err(bad("a backend address has no credentials")
            .with_hint("set an Authorization header with header_up instead"));
    }
    // Without a port: the scheme's (443 for https://, else 80).
    let default = if scheme == BackendScheme::Https {
        "443"
    } else {
        "80"
    };
    let (host, port) = host_and_port(rest, default).map_err(&bad)?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
    if host.is_empty() {
        return Err(bad("the address has no host"));
    }
    if host.len() > 253 {
        return Err(bad(&format!(
            "the host name has {} characters; a DNS name has at most 253",
            host.len()
        )));
    }
    Ok(BackendAddr {
        text: text.to_string(),
        target: Target::Tcp { host, port },
        scheme,
        span: w.span,
    })
}

/// The shortest secret a `secret_file` may hold (RFC 7518 §3.2 asks an HMAC key as
/// long as its hash: 32 bytes for SHA-256).
pub(super) const MIN_SECRET: usize = 32;

/// `secret_file FILE` (`w`, relative to `dir`): its bytes, final newlines dropped, at
/// least [`MIN_SECRET`] of them. `what` says what the secret is for, in the hint.
pub(super) fn secret_file(w: &Word, dir: &Path, what: &str) -> Res<Vec<u8>> {
    let path = dir.join(&w.text);
    let mut raw = std::fs::read(&path).map_err(|e| {
        Diagnostic::error(w.span, format!("{}: {e}", path.display())).with_hint(format!(
            "{what}, in a file readable by sluice only: openssl rand -hex 32 > FILE"
        ))
    })?;
    while raw.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        raw.pop();
    }
    if raw.len() < MIN_SECRET {
        return Err(Diagnostic::error(
            w.span,
            format!(
                "{}: a secret of {} bytes is too short",
                path.display(),
                raw.len()
            ),
        )
        .with_hint(format!(
            "use at least {MIN_SECRET} random bytes: openssl rand -hex 32 > {}",
            w.text
        )));
    }
    Ok(raw)
}

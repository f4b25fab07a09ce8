//! Filter lines: the filter and its arguments, then `when|unless KIND ARGS` (one on the
//! request, one on the response), `failure open|closed` and `name NAME` at the end of
//! the line (DESIGN §14, §17), and the `on RESULT skip_to NAME|handler | reject CODE`
//! and `on matched reject_response CODE ["BODY"]` lines after it.

use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method};

use super::args::*;
use super::route::{compression, on_off};
use super::values::*;
use super::Res;
use crate::config::diag::Diagnostic;
use crate::config::model::*;
use crate::config::parser::{Directive, Word};

/// The words that end a filter's own arguments.
const CLAUSES: [&str; 4] = ["when", "unless", "failure", "name"];

/// The directives that are filters.
pub(super) const FILTERS: &[&str] = &[
    "strip",
    "rewrite",
    "header_down",
    "max_body",
    "compress",
    "request_id",
    "rate_limit",
    "allow",
    "deny",
    "basic_auth",
    "cors",
    "body_deny",
    "forward_auth",
    "grpc_web",
    "jwt",
    "challenge",
];

/// One filter line, its clauses parsed.
/// Files a filter reads (`jwt`'s keys) are found relative to `dir`.
pub(super) fn filter_line(d: &Directive, dir: &Path) -> Res<FilterLine> {
    let cut = d
        .args
        .iter()
        .position(|w| !w.quoted && CLAUSES.contains(&w.text.as_str()))
        .unwrap_or(d.args.len());
    let own = Directive {
        args: d.args[..cut].to_vec(),
        ..d.clone()
    };
    let filter = filter(&own, dir)?;
    let mut line = FilterLine {
        filter,
        condition: None,
        response: None,
        failure_open: false,
        name: None,
        branches: Vec::new(),
        span: d.span(),
    };
    let mut rest = &d.args[cut..];
    let mut seen: Vec<&str> = Vec::new();
    while let Some((kw, tail)) = rest.split_first() {
        let end = tail
            .iter()
            .position(|w| !w.quoted && CLAUSES.contains(&w.text.as_str()))
            .unwrap_or(tail.len());
        let (args, next) = tail.split_at(end);
        let on_response = matches!(
            args.first().map(|w| w.text.as_str()),
            Some("status" | "response_header")
        );
        let key = match kw.text.as_str() {
            "when" | "unless" if on_response => "a response condition",
            "when" | "unless" => "a request condition",
            other => other,
        };
        if seen.contains(&key) {
            return Err(Diagnostic::error(kw.span, format!("{key} is given twice on this line"))
                .with_hint("one request condition, one response condition, one failure mode and one name per filter"));
        }
        seen.push(key);
        match kw.text.as_str() {
            "when" | "unless" => {
                let cond = Directive {
                    name: kw.clone(),
                    args: args.to_vec(),
                    block: None,
                    block_span: None,
                };
                let negate = kw.text == "unless";
                if on_response {
                    let test = response_test(&cond)?;
                    line.response = Some(ResponseCondition { negate, test });
                } else {
                    let (test, flip) = test(&cond)?;
                    line.condition = Some(Condition {
                        negate: negate != flip,
                        test,
                    });
                }
            }
            "failure" => match args {
                [w] if w.text == "open" => line.failure_open = true,
                [w] if w.text == "closed" => line.failure_open = false,
                [w] => return Err(expected(w, "`open` or `closed`")),
                [] => return Err(missing_after(kw, "failure open|closed")),
                [_, x, ..] => return Err(extra(x, "write: failure open|closed")),
            },
            _ => line.name = Some(filter_name(kw, args)?),
        }
        rest = next;
    }
    Ok(line)
}

/// `name NAME`: letters, digits, `_` and `-`; `handler` is reserved.
fn filter_name(kw: &Word, args: &[Word]) -> Res<String> {
    match args {
        [w] => {
            if !w
                .text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(expected(w, "a name of letters, digits, `_` and `-`"));
            }
            if w.text == "handler" {
                return Err(Diagnostic::error(w.span, "`handler` is a reserved name")
                    .with_hint("`skip_to handler` goes straight to the route's handler; name this filter otherwise"));
            }
            Ok(w.text.clone())
        }
        [] => Err(missing_after(kw, "name NAME")),
        [_, x, ..] => Err(extra(x, "write: name NAME")),
    }
}

fn missing_after(kw: &Word, usage: &str) -> Diagnostic {
    let d = Directive {
        name: kw.clone(),
        args: Vec::new(),
        block: None,
        block_span: None,
    };
    missing(&d, usage, usage)
}

/// `when|unless path P | method M... | header N V | query N V | client_ip CIDR... |
/// client_cert | jwt.CLAIM == V`, and whether the test is negated (`!=`).
fn test(d: &Directive) -> Res<(Test, bool)> {
    let lead = d.name.text.as_str();
    let kind = first_arg(d, &format!("{lead} path|method|header|query|client_ip ..."))?;
    if kind.text.starts_with("jwt.") {
        return super::jwt::claim_test(d, kind);
    }
    one_test(d, kind).map(|t| (t, false))
}

fn one_test(d: &Directive, kind: &Word) -> Res<Test> {
    let lead = d.name.text.as_str();
    match kind.text.as_str() {
        "path" => match &d.args[1..] {
            [p] => Ok(Test::Path(path_pattern(p)?)),
            [] => Err(missing(
                d,
                &format!("{lead} path PATTERN"),
                &format!("{lead} path /admin/*"),
            )),
            [_, x, ..] => Err(extra(x, &format!("write: {lead} path PATTERN"))),
        },
        "client_ip" => {
            if d.args.len() < 2 {
                return Err(missing(
                    d,
                    &format!("{lead} client_ip CIDR..."),
                    &format!("{lead} client_ip 10.0.0.0/8"),
                ));
            }
            Ok(Test::ClientIp(
                d.args[1..].iter().map(cidr).collect::<Res<_>>()?,
            ))
        }
        "method" | "header" | "query" => Ok(Test::Match(matcher_as(d, lead)?)),
        "client_cert" => match d.args.get(1) {
            None => Ok(Test::ClientCert),
            Some(x) => Err(extra(x, &format!("write: {lead} client_cert"))),
        },
        _ => Err(expected(
            kind,
            "`path`, `method`, `header`, `query`, `client_ip`, `client_cert` or `jwt.CLAIM`",
        )),
    }
}

/// `when|unless status CODE|CLASS... | response_header NAME VALUE`.
fn response_test(d: &Directive) -> Res<ResponseTest> {
    let lead = d.name.text.as_str();
    let rest = &d.args[1..];
    if d.args[0].text == "response_header" {
        return match rest {
            [n, v] => Ok(ResponseTest::Header(
                HeaderName::from_bytes(n.text.as_bytes())
                    .map_err(|_| expected(n, "a header name"))?,
                v.text.clone(),
            )),
            [_, _, x, ..] => Err(extra(
                x,
                &format!("write: {lead} response_header NAME VALUE (quote a value with spaces)"),
            )),
            _ => Err(missing(
                d,
                &format!("{lead} response_header NAME VALUE"),
                &format!("{lead} response_header Content-Type text/html"),
            )),
        };
    }
    if rest.is_empty() {
        return Err(missing(
            d,
            &format!("{lead} status CODE|CLASS..."),
            &format!("{lead} status 5xx 404"),
        ));
    }
    rest.iter()
        .map(|w| {
            let t = w.text.as_bytes();
            match t {
                [k @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] if !w.quoted => {
                    Ok(StatusSet::Class(u16::from(k - b'0')))
                }
                _ => status(w, 100..=599).map(|c| StatusSet::Code(c.as_u16())),
            }
            .map_err(|_| expected(w, "a status code (404) or class (5xx)"))
        })
        .collect::<Res<Vec<_>>>()
        .map(ResponseTest::Status)
}

/// The filter a line names, from its own arguments.
pub(super) fn filter(d: &Directive, dir: &Path) -> Res<Filter> {
    let name = d.name.text.as_str();
    if !matches!(
        name,
        "basic_auth" | "cors" | "forward_auth" | "jwt" | "challenge"
    ) {
        no_block(d)?;
    }
    match name {
        "strip" => one_arg(d, "strip /prefix").and_then(|w| {
            if !w.text.starts_with('/') || w.text.len() < 2 {
                return Err(Diagnostic::error(
                    w.span,
                    format!("`{}` is not a path prefix", w.text),
                )
                .with_hint("write a prefix starting with /, like strip /api"));
            }
            let prefix = w.text.trim_end_matches('/');
            normal_form(w, prefix)?;
            Ok(Filter::Strip(prefix.to_string()))
        }),
        "rewrite" => rewrite(d),
        "header_down" => header_op(d, "header_down").map(Filter::HeaderDown),
        "max_body" => one_arg(d, "max_body SIZE").and_then(|w| Ok(Filter::MaxBody(size(w)?))),
        "compress" => compression(d).map(Filter::Compress),
        "request_id" => no_args(d).map(|()| Filter::RequestId),
        "grpc_web" => no_args(d).map(|()| Filter::GrpcWeb),
        "allow" | "deny" => {
            if d.args.is_empty() {
                return Err(missing(
                    d,
                    &format!("{name} CIDR..."),
                    &format!("{name} 10.0.0.0/8 192.168.1.5"),
                ));
            }
            let nets = match d.args.as_slice() {
                // `all`, as nginx writes it: every IPv4 and IPv6 client.
                [w] if w.text == "all" && !w.quoted => {
                    vec![
                        "0.0.0.0/0".parse().expect("a net"),
                        "::/0".parse().expect("a net"),
                    ]
                }
                args => args.iter().map(cidr).collect::<Res<Vec<_>>>()?,
            };
            Ok(if name == "allow" {
                Filter::Allow(nets)
            } else {
                Filter::Deny(nets)
            })
        }
        "rate_limit" => rate_limit(d).map(Filter::RateLimit),
        "basic_auth" => basic_auth(d),
        "body_deny" => one_arg(d, "body_deny \"TEXT\"").and_then(|w| {
            if w.text.is_empty() {
                return Err(
                    Diagnostic::error(w.span, "body_deny needs a text to look for")
                        .with_hint("write the text a refused body contains: body_deny \"<script\""),
                );
            }
            Ok(Filter::BodyDeny(w.text.clone()))
        }),
        "cors" => cors(d).map(Filter::Cors),
        "forward_auth" => forward_auth(d).map(|f| Filter::ForwardAuth(Box::new(f))),
        "jwt" => super::jwt::jwt(d, dir).map(|c| Filter::Jwt(Box::new(c))),
        "challenge" => super::challenge::challenge(d, dir).map(|c| Filter::Challenge(Box::new(c))),
        _ => Err(unsupported(d)),
    }
}

/// `rate_limit N/s|N/m [burst N] [key client_ip|header NAME] [store redis://HOST:PORT[/DB]]`.
fn rate_limit(d: &Directive) -> Res<RateLimit> {
    const USAGE: &str =
        "rate_limit N/s|N/m [burst N] [key client_ip|header NAME] [store redis://HOST:PORT]";
    let rate = first_arg(d, USAGE)?;
    let (n, per) = rate
        .text
        .split_once('/')
        .ok_or_else(|| expected(rate, "a rate like 10/s or 600/m"))?;
    let count: u32 = n
        .parse()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))
        .ok_or_else(|| {
            expected(
                rate,
                "a rate like 10/s, 600/m or 5000/h (1..1000000 per second, minute or hour)",
            )
        })?;
    let window = match per {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => {
            return Err(expected(
                rate,
                "a rate per second (`/s`), minute (`/m`) or hour (`/h`)",
            ))
        }
    };
    let mut r = RateLimit {
        count,
        window,
        burst: count,
        key_header: None,
        store: None,
    };
    let mut rest = &d.args[1..];
    while let Some((w, tail)) = rest.split_first() {
        let value = tail
            .first()
            .ok_or_else(|| missing(d, &format!("{} VALUE", w.text), USAGE))?;
        rest = &tail[1..];
        match w.text.as_str() {
            "burst" => r.burst = int_in(value, 1, 1_000_000)? as u32,
            "key" => match value.text.as_str() {
                "client_ip" => r.key_header = None,
                "header" => {
                    let name = rest
                        .first()
                        .ok_or_else(|| missing(d, "key header NAME", "key header X-Api-Key"))?;
                    rest = &rest[1..];
                    r.key_header = Some(
                        HeaderName::from_bytes(name.text.as_bytes())
                            .map_err(|_| expected(name, "a header name"))?,
                    );
                }
                _ => return Err(expected(value, "`client_ip` or `header NAME`")),
            },
            "store" => r.store = Some(redis_url(value)?),
            _ => {
                return Err(
                    expected(w, "`burst`, `key` or `store`").with_hint(format!("write: {USAGE}"))
                )
            }
        }
    }
    Ok(r)
}

/// `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` or `rediss://…` (TLS), DESIGN §18.4:
/// checked for shape and by the Redis client's own parser (the connection is made at
/// run time). `{$ENV}` was expanded by the lexer, so a password can stay out of the
/// file.
pub(super) fn redis_url(w: &Word) -> Res<String> {
    let bad = || {
        expected(
            w,
            "a Redis address like redis://127.0.0.1:6379, redis://:PASSWORD@cache:6379/2 or rediss://cache:6380",
        )
        .with_hint("a password can come from the environment: redis://:{$REDIS_PASSWORD}@cache:6379")
    };
    let rest = w
        .text
        .strip_prefix("redis://")
        .or_else(|| w.text.strip_prefix("rediss://"))
        .ok_or_else(bad)?;
    let (authority, db) = match rest.split_once('/') {
        Some((a, db)) => (a, Some(db)),
        None => (rest, None),
    };
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match hostport.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':')),
            None => return Err(bad()),
        },
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        },
    };
    if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
        return Err(bad());
    }
    if db.is_some_and(|db| !db.is_empty() && db.parse::<u16>().is_err()) {
        return Err(bad());
    }
    redis::IntoConnectionInfo::into_connection_info(w.text.as_str()).map_err(|_| bad())?;
    Ok(w.text.clone())
}

/// `basic_auth USER HASH`, or `basic_auth { USER HASH; ... }`.
fn basic_auth(d: &Directive) -> Res<Filter> {
    const USAGE: &str = "basic_auth USER HASH, or basic_auth { [realm NAME]; USER HASH; ... }";
    let pairs: Vec<(&Word, &Word)> = match (&d.block, d.args.as_slice()) {
        (None, [u, h]) => vec![(u, h)],
        (None, [_, _, x, ..]) => return Err(extra(x, USAGE)),
        (None, _) => {
            return Err(missing(
                d,
                USAGE,
                "basic_auth admin \"$2y$05$...\" (made by htpasswd -nbB admin PASSWORD)",
            ))
        }
        (Some(_), [x, ..]) => {
            return Err(extra(
                x,
                "a basic_auth block lists USER HASH lines; no arguments",
            ))
        }
        (Some(items), []) => items
            .iter()
            // `realm NAME`: the prompt's name (a user called `realm` cannot be listed).
            .filter(|i| i.name.text != "realm")
            .map(|i| match i.args.as_slice() {
                [h] => Ok((&i.name, h)),
                _ => Err(Diagnostic::error(i.span(), "expected USER HASH").with_hint(USAGE)),
            })
            .collect::<Res<_>>()?,
    };
    if pairs.is_empty() {
        return Err(
            Diagnostic::error(d.span(), "a basic_auth block without users lets no one in")
                .with_hint(USAGE),
        );
    }
    let mut users: Vec<(String, String)> = Vec::new();
    for (u, h) in pairs {
        if u.text.is_empty() || u.text.contains(':') {
            return Err(expected(u, "a user name without `:`"));
        }
        if users.iter().any(|(n, _)| *n == u.text) {
            return Err(Diagnostic::error(
                u.span,
                format!("user `{}` is listed twice", u.text),
            ));
        }
        check_hash(h)?;
        users.push((u.text.clone(), h.text.clone()));
    }
    let realm = realm_of(d)?;
    Ok(Filter::BasicAuth { users, realm })
}

/// `realm NAME` in a `basic_auth` block (default `sluice`): one plain name.
fn realm_of(d: &Directive) -> Res<String> {
    let Some(i) = d
        .block
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .find(|i| i.name.text == "realm")
    else {
        return Ok("sluice".into());
    };
    let [name] = i.args.as_slice() else {
        return Err(
            Diagnostic::error(i.span(), "`realm` takes one name").with_hint("realm \"Staff only\"")
        );
    };
    let plain = !name.text.is_empty()
        && !name
            .text
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\');
    if !plain {
        return Err(Diagnostic::error(
            name.span,
            "a realm is a short name without quotes, backslashes or control characters",
        )
        .with_hint("basic_auth { realm \"Staff only\"; admin $2y$05$... }"));
    }
    Ok(name.text.clone())
}

/// A password hash sluice can verify: bcrypt (`$2a$`, `$2b$`, `$2y$`) or argon2id in
/// its PHC form. Anything else (a plain password, MD5-crypt, SHA) is refused.
fn check_hash(w: &Word) -> Res<()> {
    let h = w.text.as_str();
    let ok = if h.starts_with("$2a$") || h.starts_with("$2b$") || h.starts_with("$2y$") {
        h.len() == 60 && h.is_ascii() && h[4..6].parse::<u32>().is_ok_and(|c| (4..=31).contains(&c))
    } else if h.starts_with("$argon2id$") {
        argon2::PasswordHash::new(h).is_ok()
    } else {
        false
    };
    if ok {
        return Ok(());
    }
    Err(Diagnostic::error(w.span, "not a bcrypt or argon2id password hash")
        .with_hint("make one with: htpasswd -nbB USER PASSWORD (bcrypt), or: echo -n PASSWORD | argon2 SALT -id -e"))
}

/// `cors { origins ...; methods ...; headers ...; credentials on|off; max_age D }`.
fn cors(d: &Directive) -> Res<Cors> {
    if let Some(x) = d.args.first() {
        return Err(extra(
            x,
            "write: cors { origins https://app.example.com *.example.com }",
        ));
    }
    let items = block(d, "cors { origins https://app.example.com }")?;
    let mut c = Cors {
        methods: vec![Method::GET, Method::HEAD, Method::POST],
        ..Cors::default()
    };
    let mut has_origins = false;
    for i in items {
        let name = i.name.text.as_str();
        no_block(i)?;
        let (usage, example) = match name {
            "origins" => (
                "origins ORIGIN|*.SUFFIX|*...",
                "origins https://app.example.com *.example.com",
            ),
            "methods" => ("methods METHOD...", "methods GET POST PUT"),
            "headers" => ("headers NAME...", "headers Content-Type Authorization"),
            _ => ("", ""),
        };
        if !usage.is_empty() && i.args.is_empty() {
            return Err(missing(i, usage, example));
        }
        match name {
            "origins" => {
                has_origins = true;
                i.args.iter().try_for_each(|w| cors_origin(w, &mut c))?;
            }
            "methods" => c.methods = i.args.iter().map(cors_method).collect::<Res<_>>()?,
            "headers" => {
                c.headers = i
                    .args
                    .iter()
                    .map(|w| {
                        HeaderName::from_bytes(w.text.as_bytes())
                            .map_err(|_| expected(w, "a header name"))
                    })
                    .collect::<Res<_>>()?
            }
            "credentials" => c.credentials = on_off(i)?,
            "max_age" => c.max_age = Some(duration(one_arg(i, "max_age 10m")?)?),
            _ => {
                return Err(
                    Diagnostic::error(i.span(), format!("`{name}` is not a cors setting"))
                        .with_hint(
                            "a cors block takes: origins, methods, headers, credentials, max_age",
                        ),
                )
            }
        }
    }
    if !has_origins {
        return Err(
            Diagnostic::error(d.span(), "cors without `origins` admits no one")
                .with_hint("list them: cors { origins https://app.example.com }"),
        );
    }
    if c.any && c.credentials {
        return Err(Diagnostic::error(
            d.span(),
            "`origins *` with `credentials on` would let any site act as the user",
        )
        .with_hint("list the origins that may send credentials"));
    }
    Ok(c)
}

/// One word of `origins`: `*`, `*.DOMAIN`, or an exact origin without a path.
fn cors_origin(w: &Word, c: &mut Cors) -> Res<()> {
    let o = w.text.to_ascii_lowercase();
    if o == "*" {
        c.any = true;
    } else if let Some(suffix) = o.strip_prefix("*.") {
        if suffix.is_empty() || suffix.contains(['/', ':']) {
            return Err(expected(w, "`*.` and a domain, like *.example.com"));
        }
        c.suffixes.push(format!(".{suffix}"));
    } else if o.contains('*') {
        return Err(expected(w, "an exact origin, *.DOMAIN or *")
            .with_hint("a wildcard has no scheme: *.example.com (it admits https origins only)"));
    } else if (o.starts_with("https://") || o.starts_with("http://"))
        && !o.split_once("://").unwrap().1.contains('/')
        && o.len() > 8
    {
        c.origins.push(o);
    } else {
        return Err(
            expected(w, "an origin (scheme://host[:port]), *.DOMAIN or *")
                .with_hint("an origin has no path: https://app.example.com"),
        );
    }
    Ok(())
}

/// One word of `methods`: an upper-case method.
fn cors_method(w: &Word) -> Res<Method> {
    if !w.text.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(expected(w, "an upper-case method like PUT"));
    }
    Method::from_bytes(w.text.as_bytes()).map_err(|_| expected(w, "a method"))
}

/// `on RESULT skip_to NAME|handler | reject CODE`, or `on matched reject_response CODE
/// ["BODY"]`, for the filter `line`. A skip's target is resolved once the route's
/// filters are all known: returned as the name's word.
pub(super) fn branch<'a>(d: &'a Directive, line: &FilterLine) -> Res<(Branch, Option<&'a Word>)> {
    const USAGE: &str =
        "on RESULT skip_to NAME, on RESULT reject CODE, or on matched reject_response CODE";
    let (result, action, arg, body) = match d.args.as_slice() {
        [r, a, c] => (r, a, c, None),
        [r, a, c, b] if a.text == "reject_response" => (r, a, c, Some(b)),
        [_, _, _, x, ..] => return Err(extra(x, USAGE)),
        _ => return Err(missing(d, USAGE, "on denied reject 404")),
    };
    no_block(d)?;
    let results = line.filter.results();
    let matched = line.response.is_some().then_some("matched");
    if results.is_none() && matched.is_none() {
        return Err(
            Diagnostic::error(d.span(), "this filter has no result to branch on").with_hint(
                "branch after allow, deny, rate_limit, basic_auth or body_deny, or give the filter a response condition (when status 5xx) and branch on `matched`",
            ),
        );
    }
    let known = |r: &str| results.is_some_and(|(p, f)| r == p || r == f) || matched == Some(r);
    if !known(&result.text) {
        let mut names: Vec<&str> = results.map(|(p, f)| vec![p, f]).unwrap_or_default();
        names.extend(matched);
        let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        let mut e = expected(result, &names.join(" or "));
        if result.text == "matched" {
            e = e.with_hint("`matched` is the result of a response condition: add `when status 5xx` (or `when response_header NAME VALUE`) to the filter's line");
        }
        return Err(e);
    }
    if let Some(first) = line.branches.iter().find(|b| b.result == result.text) {
        return Err(Diagnostic::error(
            result.span,
            format!("`on {}` is already given for this filter", result.text),
        )
        .with_hint(format!(
            "it is on line {}; one branch per result",
            first.span.line
        )));
    }
    let on_response = result.text == "matched";
    let (action, target) = match action.text.as_str() {
        "reject_response" if on_response => {
            // Not 1xx: an interim answer as the final one would leave the client
            // waiting.
            let code = status(arg, 200..=599)?;
            if body.is_some() && matches!(code.as_u16(), 204 | 304) {
                return Err(Diagnostic::error(d.span(), format!("a {} response carries no body", code.as_u16()))
                    .with_hint("drop the body, or answer with another status"));
            }
            (
                BranchAction::RejectResponse(code, body.map(|b| b.text.clone())),
                None,
            )
        }
        "skip_to" | "reject" if on_response => {
            return Err(expected(action, "`reject_response`").with_hint(
                "`matched` comes from the response phase, when the filters before the handler are done; it can only replace the response",
            ))
        }
        "reject_response" => {
            return Err(expected(action, "`skip_to` or `reject`").with_hint(
                "reject_response replaces a response: branch on `matched`, with a response condition on the filter line",
            ))
        }
        "skip_to" => (BranchAction::SkipTo(usize::MAX), Some(arg)),
        "reject" => (BranchAction::Reject(status(arg, 400..=599)?), None),
        _ if on_response => return Err(expected(action, "`reject_response`")),
        _ => return Err(expected(action, "`skip_to` or `reject`")),
    };
    Ok((
        Branch {
            result: result.text.clone(),
            action,
            span: d.span(),
        },
        target,
    ))
}

/// `rewrite FROM TO` or `rewrite ~ "REGEX" TO`.
fn rewrite(d: &Directive) -> Res<Filter> {
    const USAGE: &str = "rewrite FROM TO  or  rewrite ~ \"REGEX\" TO";
    no_block(d)?;
    let Some((from, used)) = pattern_words(&d.args) else {
        return Err(missing(d, USAGE, "rewrite /old/* /new/*"));
    };
    let to = match &d.args[used..] {
        [to] => to,
        [_, x, ..] => return Err(extra(x, &format!("write: {USAGE}"))),
        [] => return Err(missing(d, USAGE, "rewrite /old/* /new/*")),
    };
    let from = from?;
    let to_t = template(to)?;
    if !to.text.starts_with('/') {
        return Err(Diagnostic::error(to.span, "a rewrite target is a path")
            .with_hint("write a path starting with /, like rewrite /old /new"));
    }
    Ok(Filter::Rewrite { from, to: to_t })
}

/// `forward_auth URL { copy_headers NAME...; timeout D }`: URL is `http://` or
/// `https://`, with the path (and query) the service is asked at.
fn forward_auth(d: &Directive) -> Res<ForwardAuth> {
    const USAGE: &str = "forward_auth URL { copy_headers NAME...; timeout D }";
    let w = d.args.first().ok_or_else(|| missing(d, USAGE, USAGE))?;
    if let Some(x) = d.args.get(1) {
        return Err(extra(x, &format!("write: {USAGE}")));
    }
    if !w.text.starts_with("http://") && !w.text.starts_with("https://") {
        return Err(expected(w, "an http:// or https:// URL")
            .with_hint("forward_auth http://127.0.0.1:9091/auth"));
    }
    let after = w.text.find("://").map_or(0, |i| i + 3);
    let (base, path) = match w.text[after..].find(['/', '?']) {
        Some(i) => w.text.split_at(after + i),
        None => (w.text.as_str(), "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let path = http::uri::PathAndQuery::try_from(path.as_str())
        .map_err(|_| expected(w, "a URL whose path and query can be sent"))?;
    let base_word = Word {
        text: base.to_string(),
        ..w.clone()
    };
    let addr = backend_addr(&base_word, std::path::Path::new("/"))?;
    let mut f = ForwardAuth {
        url: w.text.clone(),
        pool: Box::new(ProxyConfig::new(vec![addr])),
        path,
        copy_headers: Vec::new(),
        timeout: Duration::from_secs(5),
    };
    for i in d.block.as_deref().unwrap_or(&[]) {
        no_block(i)?;
        match i.name.text.as_str() {
            "copy_headers" => {
                if i.args.is_empty() {
                    return Err(missing(
                        i,
                        "copy_headers NAME...",
                        "copy_headers X-User X-Groups",
                    ));
                }
                for a in &i.args {
                    f.copy_headers.push(
                        HeaderName::from_bytes(a.text.as_bytes())
                            .map_err(|_| expected(a, "a header name"))?,
                    );
                }
            }
            "timeout" => f.timeout = duration(one_arg(i, "timeout 5s")?)?,
            other => {
                return Err(Diagnostic::error(
                    i.span(),
                    format!("`{other}` is not a forward_auth setting"),
                )
                .with_hint("a forward_auth block takes: copy_headers, timeout"))
            }
        }
    }
    if f.timeout.is_zero() {
        return Err(
            Diagnostic::error(d.span(), "forward_auth's timeout is zero")
                .with_hint("give the auth service time to answer: timeout 5s"),
        );
    }
    // The service's own name in `Host`; sluice's timeouts bound the whole exchange.
    f.pool.host = HostMode::Upstream;
    f.pool.timeout = f.timeout;
    f.pool.connect_timeout = f.pool.connect_timeout.min(f.timeout);
    f.pool.retry_on = RetryOn::default();
    Ok(f)
}

//! From syntax tree to typed model: every directive checked for its place, its
//! arguments and its values, and the whole checked for combinations that cannot work.
//!
//! Never half-applies: any error makes the whole load fail. Directives that DESIGN.md
//! names but whose runtime is not built yet are refused as "not supported yet", never
//! ignored. Warnings are collected beside errors; `--strict` makes them fatal.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use ipnet::IpNet;

use super::diag::{nearest, Diagnostic, Span};
use super::model::*;
use super::template::Placeholder;
use super::parser::{Directive, Word};
use super::units::{parse_duration, parse_size};

/// Where a directive may stand, and which directives each place knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Top,
    Global,
    Site,
    Route,
    Proxy,
    FastCgi,
    Files,
    Tcp,
    Safety,
    Failover,
    Health,
    Outlier,
}

impl Place {
    fn known(self) -> &'static [&'static str] {
        match self {
            Place::Top => &["global", "listen", "site", "tcp", "import"],
            Place::Global => &[
                "admin",
                "workers",
                "trust",
                "max_tunnels",
                "tunnel_drain",
                "grace",
                "access_log",
                "tracing",
                "probe_concurrency",
                "safety",
            ],
            Place::Site => SITE,
            Place::Route => &SITE[2..],
            Place::Proxy => &[
                "lb",
                "weights",
                "backup",
                "failover",
                "health",
                "fail_duration",
                "breaker",
                "all_down",
                "host",
                "header_up",
                "header_down",
                "timeout",
                "connect_timeout",
                "limit",
                "max_body",
                "retries",
                "retry_on",
                "retry_buffer",
                "retry_budget",
                "slow_start",
                "outlier",
                "safety",
                "keepalive",
                "tls_verify",
                "tls_server_name",
                "tls_ca",
                "compress",
                "origin_headers",
            ],
            Place::FastCgi => &[
                "root",
                "suffix",
                "index",
                "fallback",
                "max_conns",
                "connect_timeout",
                "keepalive_timeout",
                "env",
            ],
            Place::Files => &["index", "browse"],
            Place::Tcp => &["proxy"],
            Place::Safety => &["default", "allow_private", "block"],
            Place::Failover => &[
                "failure_threshold",
                "recovery_threshold",
                "hold_down",
                "failback_delay",
            ],
            Place::Health => &[
                "method", "interval", "timeout", "rise", "fall", "expect", "host", "initial",
            ],
            Place::Outlier => &["consecutive_5xx", "ejection", "max_ejected"],
        }
    }

    fn label(self) -> &'static str {
        match self {
            Place::Top => "the top level",
            Place::Global => "a `global` block",
            Place::Site => "a `site` block",
            Place::Route => "a `route` block",
            Place::Proxy => "a `proxy` block",
            Place::FastCgi => "a `fastcgi` block",
            Place::Files => "a `files` block",
            Place::Tcp => "a `tcp` block",
            Place::Safety => "a `safety` block",
            Place::Failover => "a `failover` block",
            Place::Health => "a `health` block",
            Place::Outlier => "an `outlier` block",
        }
    }
}

/// A site block takes everything a route does, plus `tls` and `route`.
const SITE: &[&str] = &[
    "tls",
    "route",
    "match",
    "proxy",
    "fastcgi",
    "files",
    "redirect",
    "respond",
    "strip",
    "rewrite",
    "header_down",
    "request_id",
    "rate_limit",
    "allow",
    "deny",
    "basic_auth",
    "compress",
    "max_body",
    "cors",
];

const ALL_PLACES: [Place; 12] = [
    Place::Top,
    Place::Global,
    Place::Site,
    Place::Route,
    Place::Proxy,
    Place::FastCgi,
    Place::Files,
    Place::Tcp,
    Place::Safety,
    Place::Failover,
    Place::Health,
    Place::Outlier,
];

type Res<T> = Result<T, Diagnostic>;

/// Builds the model, returning it with its warnings, or every error found.
pub fn build(tree: &[Directive]) -> Result<(Config, Vec<Diagnostic>), Vec<Diagnostic>> {
    let mut b = Builder::default();
    let config = b.top(tree);
    if b.errors.is_empty() {
        Ok((config, b.warnings))
    } else {
        b.errors.extend(b.warnings);
        Err(b.errors)
    }
}

#[derive(Default)]
struct Builder {
    errors: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl Builder {
    fn push(&mut self, r: Res<()>) {
        if let Err(e) = r {
            self.errors.push(e);
        }
    }

    /// Checks that `d` belongs in `place`; pushes an error and returns false if not.
    fn known_here(&mut self, d: &Directive, place: Place) -> bool {
        let name = d.name.text.as_str();
        if place.known().contains(&name) {
            return true;
        }
        let elsewhere = ALL_PLACES
            .iter()
            .find(|p| p.known().contains(&name))
            .map(|p| p.label());
        let err = match elsewhere {
            Some(other) => Diagnostic::error(
                d.span(),
                format!("`{name}` does not belong in {}", place.label()),
            )
            .with_hint(format!("`{name}` goes in {other}")),
            None => {
                let e = Diagnostic::error(d.span(), format!("unknown directive `{name}`"));
                match nearest(name, place.known().iter().copied()) {
                    Some(s) => e.with_hint(format!("did you mean `{s}`?")),
                    None => e.with_hint(format!(
                        "{} takes: {}",
                        place.label(),
                        place.known().join(", ")
                    )),
                }
            }
        };
        self.errors.push(err);
        false
    }

    fn top(&mut self, tree: &[Directive]) -> Config {
        let mut global = Global::default();
        let mut listeners: Vec<Listen> = Vec::new();
        let mut sites: Vec<Site> = Vec::new();
        let mut global_seen: Option<Span> = None;
        let mut hosts_seen: HashMap<HostPattern, Span> = HashMap::new();
        for d in tree {
            if !self.known_here(d, Place::Top) {
                continue;
            }
            match d.name.text.as_str() {
                "global" => {
                    if let Some(first) = global_seen {
                        self.errors.push(twice(d, first));
                        continue;
                    }
                    global_seen = Some(d.span());
                    let r = no_args(d).and_then(|_| block(d, "global {"));
                    match r {
                        Ok(items) => self.global(items, &mut global),
                        Err(e) => self.errors.push(e),
                    }
                }
                "listen" => match listen(d) {
                    Ok(l) => {
                        if let Some(prev) = listeners.iter().find(|p| p.addr == l.addr) {
                            self.errors.push(
                                Diagnostic::error(
                                    d.args[0].span,
                                    format!("`{}` is already a listener", l.addr),
                                )
                                .with_hint(format!(
                                    "it was first declared on line {}",
                                    prev.span.line
                                )),
                            );
                        } else {
                            listeners.push(l);
                        }
                    }
                    Err(e) => self.errors.push(e),
                },
                "site" => {
                    if let Some(site) = self.site(d, &mut hosts_seen) {
                        sites.push(site);
                    }
                }
                "tcp" => self.errors.push(unsupported(d)),
                _ => {}
            }
        }
        if listeners.is_empty() {
            listeners.push(Listen {
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
                text: "127.0.0.1:8080".into(),
                dual_stack: false,
                span: Span::default(),
            });
        }
        Config {
            global,
            listeners,
            sites,
        }
    }

    fn global(&mut self, items: &[Directive], g: &mut Global) {
        let mut seen = Seen::default();
        for d in items {
            if !self.known_here(d, Place::Global) || !self.once(&mut seen, d) {
                continue;
            }
            let r = match d.name.text.as_str() {
                "workers" => one_arg(d, "workers N").and_then(|w| {
                    let n = int_in(w, 1, 1024)?;
                    g.workers = Some(n as usize);
                    Ok(())
                }),
                "grace" => one_arg(d, "grace 10s").and_then(|w| {
                    g.grace = duration(w)?;
                    Ok(())
                }),
                "trust" => {
                    if d.args.is_empty() {
                        Err(missing(d, "trust CIDR...", "trust 10.0.0.0/8 192.168.1.5"))
                    } else {
                        d.args.iter().try_for_each(|w| {
                            let net = cidr(w)?;
                            if net.prefix_len() == 0 {
                                self.warnings.push(
                                    Diagnostic::warning(w.span, format!("`trust {}` believes forwarding headers from every client", w.text))
                                        .with_hint("name only your own proxies' addresses"),
                                );
                            }
                            g.trust.push(net);
                            Ok(())
                        })
                    }
                }
                "admin" => match d.args.as_slice() {
                    [w] if w.text == "off" => Ok(()),
                    _ => Err(unsupported(d).with_hint(
                        "the admin API is not built yet; write `admin off` or remove the line",
                    )),
                },
                _ => Err(unsupported(d)),
            };
            self.push(r);
        }
    }

    fn site(&mut self, d: &Directive, hosts_seen: &mut HashMap<HostPattern, Span>) -> Option<Site> {
        if d.args.is_empty() {
            self.errors.push(missing(
                d,
                "site HOST... {",
                "site example.com www.example.com {",
            ));
            return None;
        }
        let items = match block(d, "site example.com {") {
            Ok(b) => b,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        let mut hosts = Vec::new();
        for w in &d.args {
            match host_pattern(w) {
                Ok(h) => {
                    if let Some(prev) = hosts_seen.get(&h) {
                        self.errors.push(
                            Diagnostic::error(
                                w.span,
                                format!("host `{}` already names another site", w.text),
                            )
                            .with_hint(format!("the other site is on line {}", prev.line)),
                        );
                    } else {
                        hosts_seen.insert(h.clone(), w.span);
                        hosts.push(h);
                    }
                }
                Err(e) => self.errors.push(e),
            }
        }
        let name = d.args[0].text.to_ascii_lowercase();
        let mut routes = Vec::new();
        let mut own: Vec<&Directive> = Vec::new();
        for item in items {
            if !self.known_here(item, Place::Site) {
                continue;
            }
            match item.name.text.as_str() {
                "tls" => self.errors.push(unsupported(item)),
                "route" => {
                    if let Some(r) = self.route(item, &name) {
                        routes.push(r);
                    }
                }
                _ => own.push(item),
            }
        }
        if !own.is_empty() {
            let owned: Vec<Directive> = own.into_iter().cloned().collect();
            let span = owned[0].span();
            if let Some(r) = self.route_body(
                &owned,
                name.clone(),
                PathPattern::Prefix(String::new()),
                span,
            ) {
                routes.push(r);
            }
        }
        self.check_shadowed(&routes);
        Some(Site {
            name,
            hosts,
            routes,
        })
    }

    fn route(&mut self, d: &Directive, site: &str) -> Option<Route> {
        let [pattern] = d.args.as_slice() else {
            self.errors.push(if d.args.is_empty() {
                missing(d, "route PATTERN {", "route /api/* {")
            } else {
                Diagnostic::error(d.args[1].span, "`route` takes one path pattern")
                    .with_hint("add matchers inside the block: match method GET")
            });
            return None;
        };
        let items = match block(d, "route /api/* {") {
            Ok(b) => b,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        let pat = match path_pattern(pattern) {
            Ok(p) => p,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        let name = format!("{site} {}", pattern.text);
        let items: Vec<Directive> = items
            .iter()
            .filter(|i| self.known_here(i, Place::Route))
            .cloned()
            .collect();
        self.route_body(&items, name, pat, d.span())
    }

    /// Matchers, filters (in order) and the one handler of a route or a site block.
    fn route_body(
        &mut self,
        items: &[Directive],
        name: String,
        pattern: PathPattern,
        span: Span,
    ) -> Option<Route> {
        let mut matchers = Vec::new();
        let mut filters = Vec::new();
        let mut handler: Option<(Handler, Span)> = None;
        let mut failed = false;
        for d in items {
            if let Some(w) = d
                .args
                .iter()
                .find(|w| !w.quoted && matches!(w.text.as_str(), "when" | "unless" | "failure"))
            {
                self.errors.push(
                    Diagnostic::error(
                        w.span,
                        format!("filter conditions (`{}`) are not supported yet", w.text),
                    )
                    .with_hint(
                        "this build runs every filter unconditionally; remove the condition",
                    ),
                );
                failed = true;
                continue;
            }
            let r: Res<()> = match d.name.text.as_str() {
                "match" => matcher(d).map(|m| matchers.push(m)),
                "strip" => one_arg(d, "strip /prefix").and_then(|w| {
                    if !w.text.starts_with('/') || w.text.len() < 2 {
                        return Err(Diagnostic::error(
                            w.span,
                            format!("`{}` is not a path prefix", w.text),
                        )
                        .with_hint("write a prefix starting with /, like strip /api"));
                    }
                    filters.push(Filter::Strip(w.text.trim_end_matches('/').to_string()));
                    Ok(())
                }),
                "rewrite" => two_args(d, "rewrite FROM TO").and_then(|(from, to)| {
                    let from_pat = path_pattern(from)?;
                    let to_t = template(to)?;
                    if !to.text.starts_with('/') {
                        return Err(Diagnostic::error(to.span, "a rewrite target is a path")
                            .with_hint("write a path starting with /, like rewrite /old /new"));
                    }
                    filters.push(Filter::Rewrite {
                        from: from_pat,
                        to: to_t,
                    });
                    Ok(())
                }),
                "header_down" => {
                    header_op(d, "header_down").map(|op| filters.push(Filter::HeaderDown(op)))
                }
                "max_body" => one_arg(d, "max_body SIZE").and_then(|w| {
                    filters.push(Filter::MaxBody(size(w)?));
                    Ok(())
                }),
                "compress" => compress(d),
                "respond" | "redirect" | "proxy" => {
                    let h = match d.name.text.as_str() {
                        "respond" => respond(d),
                        "redirect" => redirect(d),
                        _ => self.proxy(d),
                    };
                    match h {
                        Ok(h) => {
                            if let Some((_, first)) = &handler {
                                Err(Diagnostic::error(d.span(), "a route has exactly one handler")
                                    .with_hint(format!("the handler on line {} already answers this route; put the other in its own route", first.line)))
                            } else {
                                handler = Some((h, d.span()));
                                Ok(())
                            }
                        }
                        Err(e) => Err(e),
                    }
                }
                _ => Err(unsupported(d)),
            };
            if let Err(e) = r {
                self.errors.push(e);
                failed = true;
            }
        }
        if failed {
            return None;
        }
        Some(Route {
            name,
            pattern,
            matchers,
            filters,
            handler: handler.map(|h| h.0),
            span,
        })
    }

    fn check_shadowed(&mut self, routes: &[Route]) {
        for (i, r) in routes.iter().enumerate() {
            if let Some(earlier) = routes[..i]
                .iter()
                .find(|e| e.pattern == r.pattern && e.matchers.is_empty())
            {
                self.warnings.push(
                    Diagnostic::warning(r.span, format!("route `{}` can never match", r.name))
                        .with_hint(format!("the route on line {} has the same pattern and no matchers, and comes first", earlier.span.line)),
                );
            }
        }
    }

    fn proxy(&mut self, d: &Directive) -> Res<Handler> {
        if d.args.is_empty() {
            return Err(missing(
                d,
                "proxy ADDR...",
                "proxy 127.0.0.1:3000 127.0.0.1:3001",
            ));
        }
        let backends = d.args.iter().map(backend_addr).collect::<Res<Vec<_>>>()?;
        let mut p = ProxyConfig::new(backends);
        let mut seen = Seen::default();
        for item in d.block.as_deref().unwrap_or(&[]) {
            if !self.known_here(item, Place::Proxy) || !self.once(&mut seen, item) {
                continue;
            }
            let r = self.proxy_option(item, &mut p);
            self.push(r);
        }
        Ok(Handler::Proxy(Box::new(p)))
    }

    fn proxy_option(&mut self, d: &Directive, p: &mut ProxyConfig) -> Res<()> {
        match d.name.text.as_str() {
            "lb" => {
                let w = first_arg(d, "lb POLICY")?;
                p.lb = match w.text.as_str() {
                    "first" => Policy::First,
                    "round_robin" => Policy::RoundRobin,
                    "weighted_round_robin"
                    | "least_conn"
                    | "weighted_least_conn"
                    | "p2c"
                    | "hash" => {
                        return Err(Diagnostic::error(
                            w.span,
                            format!("policy `{}` is not supported yet", w.text),
                        )
                        .with_hint("this build balances with `first` or `round_robin`"))
                    }
                    other => {
                        let known = [
                            "first",
                            "round_robin",
                            "weighted_round_robin",
                            "least_conn",
                            "weighted_least_conn",
                            "p2c",
                            "hash",
                        ];
                        let e = Diagnostic::error(w.span, format!("unknown policy `{other}`"));
                        return Err(match nearest(other, known) {
                            Some(s) => e.with_hint(format!("did you mean `{s}`?")),
                            None => e.with_hint(format!("policies: {}", known.join(", "))),
                        });
                    }
                };
                if d.args.len() > 1 {
                    return Err(extra(&d.args[1], "lb takes one policy"));
                }
                Ok(())
            }
            "fail_duration" => {
                p.fail_duration = duration(one_arg(d, "fail_duration 30s")?)?;
                Ok(())
            }
            "breaker" => {
                p.breaker = int_in(one_arg(d, "breaker N")?, 1, 100)? as u32;
                Ok(())
            }
            "all_down" => {
                let w = one_arg(d, "all_down try|fail")?;
                p.all_down = match w.text.as_str() {
                    "try" => AllDown::Try,
                    "fail" => AllDown::Fail,
                    _ => return Err(expected(w, "`try` or `fail`")),
                };
                Ok(())
            }
            "host" => {
                let w = one_arg(d, "host keep|upstream|NAME")?;
                p.host = match w.text.as_str() {
                    "keep" => HostMode::Keep,
                    "upstream" => HostMode::Upstream,
                    name => HostMode::Name(HeaderValue::from_str(name).map_err(|_| {
                        Diagnostic::error(w.span, format!("`{name}` cannot be a Host header"))
                    })?),
                };
                Ok(())
            }
            "header_up" => {
                p.header_up.push(header_op(d, "header_up")?);
                Ok(())
            }
            "header_down" => {
                p.header_down.push(header_op(d, "header_down")?);
                Ok(())
            }
            "timeout" => {
                p.timeout = positive(one_arg(d, "timeout 60s")?)?;
                Ok(())
            }
            "connect_timeout" => {
                p.connect_timeout = positive(one_arg(d, "connect_timeout 5s")?)?;
                Ok(())
            }
            "limit" => {
                match d.args.as_slice() {
                    [w] if w.text == "off" => {
                        self.warnings.push(
                            Diagnostic::warning(
                                w.span,
                                "`limit off` lets a burst open backend connections without end",
                            )
                            .with_hint("keep a cap, e.g. limit 4096 3s"),
                        );
                        p.limit = None;
                    }
                    [n] | [n, _] => {
                        let max = int_in(n, 1, 1_000_000)? as u32;
                        let wait = match d.args.get(1) {
                            Some(w) => duration(w)?,
                            None => Duration::from_secs(3),
                        };
                        p.limit = Some(Limit { max, wait });
                    }
                    [] => return Err(missing(d, "limit N [WAIT] | off", "limit 1024 3s")),
                    [_, _, x, ..] => return Err(extra(x, "limit takes N and an optional WAIT")),
                }
                Ok(())
            }
            "max_body" => {
                p.max_body = Some(size(one_arg(d, "max_body SIZE")?)?);
                Ok(())
            }
            "retries" => {
                p.retries = int_in(one_arg(d, "retries N")?, 0, 2)? as u8;
                Ok(())
            }
            "keepalive" => {
                let (n, t) = two_args(d, "keepalive IDLE_MAX IDLE_TIMEOUT")?;
                p.keepalive = Keepalive {
                    idle_max: int_in(n, 0, 65_536)? as usize,
                    idle_timeout: positive(t)?,
                };
                Ok(())
            }
            "compress" => compress(d),
            _ => Err(unsupported(d)),
        }
    }

    fn once(&mut self, seen: &mut Seen, d: &Directive) -> bool {
        // Directives that stack rather than replace.
        const REPEATABLE: &[&str] = &["header_up", "header_down", "trust", "env", "match"];
        let name = d.name.text.as_str();
        if REPEATABLE.contains(&name) {
            return true;
        }
        if let Some(first) = seen.0.get(name) {
            self.errors.push(twice(d, *first));
            return false;
        }
        seen.0.insert(name.to_string(), d.span());
        true
    }
}

#[derive(Default)]
struct Seen(HashMap<String, Span>);

// Small helpers: each returns a diagnostic that points at the right word.

fn unsupported(d: &Directive) -> Diagnostic {
    Diagnostic::error(d.span(), format!("`{}` is not supported yet", d.name.text)).with_hint(
        "this build knows the directive but cannot run it yet; remove it to load this file",
    )
}

fn twice(d: &Directive, first: Span) -> Diagnostic {
    Diagnostic::error(d.span(), format!("`{}` is set twice", d.name.text))
        .with_hint(format!("it is first set on line {}; keep one", first.line))
}

fn missing(d: &Directive, usage: &str, example: &str) -> Diagnostic {
    Diagnostic::error(
        d.end_span(),
        format!("`{}` expects more: {usage}", d.name.text),
    )
    .with_hint(format!("for example: {example}"))
}

fn extra(w: &Word, what: &str) -> Diagnostic {
    Diagnostic::error(w.span, format!("unexpected `{}`", w.text)).with_hint(what.to_string())
}

fn expected(w: &Word, what: &str) -> Diagnostic {
    Diagnostic::error(w.span, format!("found `{}`, expected {what}", w.text))
}

fn no_args(d: &Directive) -> Res<()> {
    match d.args.first() {
        Some(w) => Err(extra(w, &format!("`{}` takes no arguments", d.name.text))),
        None => Ok(()),
    }
}

fn block<'a>(d: &'a Directive, example: &str) -> Res<&'a [Directive]> {
    d.block.as_deref().ok_or_else(|| {
        Diagnostic::error(d.end_span(), format!("`{}` needs a block", d.name.text))
            .with_hint(format!("open it at the end of the line: {example}"))
    })
}

fn no_block(d: &Directive) -> Res<()> {
    match d.block_span {
        Some(s) => Err(Diagnostic::error(
            s,
            format!("`{}` takes no block", d.name.text),
        )),
        None => Ok(()),
    }
}

fn first_arg<'a>(d: &'a Directive, usage: &str) -> Res<&'a Word> {
    no_block(d)?;
    d.args.first().ok_or_else(|| missing(d, usage, usage))
}

fn one_arg<'a>(d: &'a Directive, usage: &str) -> Res<&'a Word> {
    let w = first_arg(d, usage)?;
    match d.args.get(1) {
        Some(x) => Err(extra(x, &format!("write: {usage}"))),
        None => Ok(w),
    }
}

fn two_args<'a>(d: &'a Directive, usage: &str) -> Res<(&'a Word, &'a Word)> {
    no_block(d)?;
    match d.args.as_slice() {
        [a, b] => Ok((a, b)),
        [_, _, x, ..] => Err(extra(x, &format!("write: {usage}"))),
        _ => Err(missing(d, usage, usage)),
    }
}

fn int_in(w: &Word, min: u64, max: u64) -> Res<u64> {
    match w.text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(_) => Err(
            Diagnostic::error(w.span, format!("{} is out of range", w.text))
                .with_hint(format!("use a whole number from {min} to {max}")),
        ),
        Err(_) => Err(expected(w, &format!("a whole number from {min} to {max}"))),
    }
}

fn duration(w: &Word) -> Res<Duration> {
    parse_duration(&w.text).map_err(|e| {
        let d = Diagnostic::error(w.span, e.message);
        match e.hint {
            Some(h) => d.with_hint(h),
            None => d,
        }
    })
}

fn positive(w: &Word) -> Res<Duration> {
    let d = duration(w)?;
    if d.is_zero() {
        return Err(Diagnostic::error(
            w.span,
            "this duration must be more than 0s",
        ));
    }
    Ok(d)
}

fn size(w: &Word) -> Res<u64> {
    parse_size(&w.text).map_err(|e| {
        let d = Diagnostic::error(w.span, e.message);
        match e.hint {
            Some(h) => d.with_hint(h),
            None => d,
        }
    })
}

fn cidr(w: &Word) -> Res<IpNet> {
    if let Ok(n) = w.text.parse::<IpNet>() {
        return Ok(n.trunc());
    }
    if let Ok(ip) = w.text.parse::<IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    Err(expected(
        w,
        "an address or CIDR like 10.0.0.0/8 or 2001:db8::/32",
    ))
}

fn compress(d: &Directive) -> Res<()> {
    let w = one_arg(d, "compress on|off")?;
    match w.text.as_str() {
        // Nothing is compressed yet, so `off` states what already happens.
        "off" => Ok(()),
        "on" => Err(
            Diagnostic::error(w.span, "compression is not supported yet")
                .with_hint("write `compress off`, or remove the line"),
        ),
        _ => Err(expected(w, "`on` or `off`")),
    }
}

fn listen(d: &Directive) -> Res<Listen> {
    let w = first_arg(d, "listen ADDR")?;
    if let Some(t) = d.args.get(1) {
        if t.text == "tls" {
            return Err(
                Diagnostic::error(t.span, "TLS listeners are not supported yet")
                    .with_hint("serve plain HTTP here and terminate TLS in front for now"),
            );
        }
        return Err(extra(t, "write: listen ADDR [tls]"));
    }
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
    addr.map(|addr| Listen {
        addr,
        text: text.to_string(),
        dual_stack,
        span: d.span(),
    })
    .ok_or_else(|| {
        expected(w, "an address with a port")
            .with_hint("write 127.0.0.1:8080, [::1]:8080 or :8080 (all interfaces)")
    })
}

fn host_pattern(w: &Word) -> Res<HostPattern> {
    let h = w.text.to_ascii_lowercase();
    if h == "*" {
        return Ok(HostPattern::Any);
    }
    let (wild, name) = match h.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, h.as_str()),
    };
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

fn path_pattern(w: &Word) -> Res<PathPattern> {
    let t = w.text.as_str();
    if !t.starts_with('/') {
        return Err(expected(w, "a path starting with /").with_hint("write /exact or /prefix/*"));
    }
    if let Some(prefix) = t.strip_suffix("/*") {
        if !prefix.contains('*') {
            return Ok(PathPattern::Prefix(prefix.to_string()));
        }
    } else if !t.contains('*') {
        return Ok(PathPattern::Exact(t.to_string()));
    }
    Err(Diagnostic::error(
        w.span,
        format!("`{t}` has a `*` that is not a trailing `/*`"),
    )
    .with_hint("patterns are /exact or /prefix/*"))
}

fn matcher(d: &Directive) -> Res<Matcher> {
    let kind = first_arg(d, "match method|header|query ...")?;
    let rest = &d.args[1..];
    match kind.text.as_str() {
        "method" => {
            if rest.is_empty() {
                return Err(missing(
                    d,
                    "match method METHOD...",
                    "match method GET HEAD",
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
                "write: match header NAME VALUE (quote a value with spaces)",
            )),
            _ => Err(missing(
                d,
                "match header NAME VALUE",
                "match header X-Canary 1",
            )),
        },
        "query" => match rest {
            [n, v] => Ok(Matcher::Query(n.text.clone(), v.text.clone())),
            [_, _, x, ..] => Err(extra(x, "write: match query NAME VALUE")),
            _ => Err(missing(
                d,
                "match query NAME VALUE",
                "match query version 2",
            )),
        },
        _ => Err(expected(kind, "`method`, `header` or `query`")),
    }
}

fn header_op(d: &Directive, what: &str) -> Res<HeaderOp> {
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

fn template(w: &Word) -> Res<Template> {
    Template::parse(&w.text).map_err(|e| {
        let names: Vec<String> = Placeholder::ALL.iter().map(|(n, _)| format!("{{{n}}}")).collect();
        Diagnostic::error(w.span, format!("unknown placeholder `{{{}}}`", e.0))
            .with_hint(format!("placeholders are {}", names.join(", ")))
    })
}

fn status_word(w: &Word) -> Option<u16> {
    (w.text.len() == 3 && !w.quoted)
        .then(|| w.text.parse::<u16>().ok())
        .flatten()
}

fn respond(d: &Directive) -> Res<Handler> {
    no_block(d)?;
    let (status, body) = match d.args.as_slice() {
        [] => (StatusCode::OK, None),
        [a] => match status_word(a) {
            Some(_) => (status(a, 100..=599)?, None),
            None => (StatusCode::OK, Some(a)),
        },
        [a, b] => (status(a, 100..=599)?, Some(b)),
        [_, _, x, ..] => {
            return Err(extra(
                x,
                "quote a body that has spaces: respond 200 \"hello there\"",
            ))
        }
    };
    let body = match body {
        Some(w) => template(w)?,
        None => Template { parts: Vec::new() },
    };
    Ok(Handler::Respond { status, body })
}

fn redirect(d: &Directive) -> Res<Handler> {
    no_block(d)?;
    let (status, target) = match d.args.as_slice() {
        [t] => (StatusCode::FOUND, t),
        [c, t] => (status(c, 300..=308)?, t),
        [] => {
            return Err(missing(
                d,
                "redirect [CODE] TARGET",
                "redirect 301 https://{host}{uri}",
            ))
        }
        [_, _, x, ..] => return Err(extra(x, "write: redirect [CODE] TARGET")),
    };
    Ok(Handler::Redirect {
        status,
        target: template(target)?,
    })
}

fn status(w: &Word, range: std::ops::RangeInclusive<u16>) -> Res<StatusCode> {
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

fn backend_addr(w: &Word) -> Res<BackendAddr> {
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
            target: Target::Unix(PathBuf::from(path)),
        });
    }
    let rest = if let Some(r) = text.strip_prefix("http://") {
        r
    } else if text.starts_with("https://") || text.starts_with("h2c://") {
        return Err(bad("this backend scheme is not supported yet").with_hint(
            "this build speaks plain HTTP/1.1 to backends: use host:port or http://host:port",
        ));
    } else if let Some((scheme, _)) = text.split_once("://") {
        return Err(bad(&format!("unknown scheme `{scheme}`"))
            .with_hint("use host:port, http://, or unix:/path"));
    } else {
        text
    };
    if rest.contains(['/', '?', '#']) {
        return Err(bad("a backend address has no path or query")
            .with_hint("rewrite the path with `rewrite` or `strip` instead"));
    }
    if rest.contains('@') {
        return Err(bad("a backend address has no credentials")
            .with_hint("set an Authorization header with header_up instead"));
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (ip, port) = v6
            .split_once("]:")
            .ok_or_else(|| bad("expected [v6]:port"))?;
        ip.parse::<std::net::Ipv6Addr>()
            .map_err(|_| bad("not an IPv6 address"))?;
        (ip.to_string(), port)
    } else {
        rest.rsplit_once(':')
            .map(|(h, p)| (h.to_string(), p))
            .ok_or_else(|| {
                bad("a backend address needs a port")
                    .with_hint(format!("write {rest}:80 or the port your app listens on"))
            })?
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
    if host.is_empty() {
        return Err(bad("the address has no host"));
    }
    Ok(BackendAddr {
        text: text.to_string(),
        target: Target::Tcp { host, port },
    })
}

#[cfg(test)]
mod tests;

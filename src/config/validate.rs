//! Whole-config checks: what no single directive shows. Errors (nothing to serve) and
//! the warnings of DESIGN.md §14 that need the whole model: a route that can never
//! match, a route with filters but no handler. (`limit off` and `trust 0.0.0.0/0` are
//! warned about where they are read.)

use super::diag::{Diagnostic, Sources, Span};
use super::model::*;

/// Addresses listened on twice, and hosts two sites name: an error at each repeat,
/// naming where the first is (`line N`, or `FILE:N` in another file).
pub(crate) fn duplicates(config: &Config, sources: &Sources) -> Vec<Diagnostic> {
    let where_is = |here: Span, there: Span| {
        if here.file == there.file {
            format!("line {}", there.line)
        } else {
            format!("{}:{}", sources.name(there.file), there.line)
        }
    };
    let mut errors = Vec::new();
    // A `tcp` line's port 0 is never taken (each bind gets its own port); two `listen`
    // lines of one address are a repeat even then.
    let http = config.listeners.iter().map(|l| (l, false));
    let tcp = config.tcp.iter().map(|t| (&t.listen, true));
    let mut all: Vec<(&Listen, bool)> = http.chain(tcp).collect();
    // In the order they are read: the later line is the repeat.
    all.sort_by_key(|(l, _)| l.seq);
    for (i, &(l, is_tcp)) in all.iter().enumerate() {
        let first = all[..i]
            .iter()
            .find(|(p, p_tcp)| p.addr == l.addr && (!(is_tcp || *p_tcp) || l.addr.port() != 0));
        if let Some((prev, _)) = first {
            let shown = if is_tcp {
                l.text.clone()
            } else {
                l.addr.to_string()
            };
            errors.push(
                Diagnostic::error(l.addr_span, format!("`{shown}` is already a listener"))
                    .with_hint(format!(
                        "it was first declared on {}",
                        where_is(l.addr_span, prev.addr_span)
                    )),
            );
        }
    }
    let mut seen: std::collections::HashMap<&HostPattern, Span> = Default::default();
    for site in &config.sites {
        for (h, (text, at)) in site.hosts.iter().zip(&site.host_words) {
            let at = *at;
            match seen.get(h) {
                Some(&prev) => errors.push(
                    Diagnostic::error(at, format!("host `{text}` already names another site"))
                        .with_hint(format!("the other site is on {}", where_is(at, prev))),
                ),
                None => {
                    seen.insert(h, at);
                }
            }
        }
    }
    // One disk store per folder: two sizes over one folder would be two stores
    // deleting each other's files.
    let mut folders: std::collections::HashMap<&std::path::Path, (u64, Span)> = Default::default();
    let caches = config
        .sites
        .iter()
        .flat_map(|s| &s.routes)
        .filter_map(|r| r.cache.as_ref());
    for c in caches {
        if let CacheStore::Disk(dir, n) = &c.store {
            match folders.get(dir.as_path()) {
                Some(&(m, prev)) if m != *n => errors.push(
                    Diagnostic::error(c.span, format!("{} is a disk store of another size", dir.display()))
                        .with_hint(format!("the other is on {}; routes share a disk store by writing the same `store disk DIR SIZE`", where_is(c.span, prev))),
                ),
                Some(_) => {}
                None => {
                    folders.insert(dir, (*n, c.span));
                }
            }
        }
    }
    errors
}

/// Errors and warnings about `config` as a whole. `listeners_declared`: whether the
/// file had a `listen` line (sluice adds a default one when not).
pub(crate) fn check(
    config: &Config,
    listeners_declared: bool,
) -> (Vec<Diagnostic>, Vec<Diagnostic>) {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    if config.sites.is_empty() && !listeners_declared {
        errors.push(
            Diagnostic::error(
                Span {
                    file: 0,
                    line: 1,
                    col: 1,
                },
                "nothing to serve: no `site` and no `listen`",
            )
            .with_hint("add a site, e.g. site * { proxy 127.0.0.1:3000 }"),
        );
    }
    if let Some(admin) = config.global.admin {
        for l in config
            .listeners
            .iter()
            .filter(|l| l.addr == admin && admin.port() != 0)
        {
            errors.push(
                Diagnostic::error(l.span, format!("`{}` is the admin API's address", l.text))
                    .with_hint("the admin API never shares a site listener: move one (global { admin 127.0.0.1:2019 }) or write admin off"),
            );
        }
    }
    let tls_listener = config.listeners.iter().any(|l| l.tls);
    for l in config.listeners.iter().filter(|l| l.tls) {
        if !config.sites.iter().any(|s| s.tls.is_some()) {
            errors.push(
                Diagnostic::error(
                    l.span,
                    format!("`listen {} tls` has no certificate to serve", l.text),
                )
                .with_hint("give a site its certificate: tls CERT_FILE KEY_FILE"),
            );
        }
    }
    let now = std::time::SystemTime::now();
    for site in &config.sites {
        if let Some((t, (cert, loaded))) = site.tls.as_ref().and_then(|t| Some((t, t.files()?))) {
            if let Some(w) = super::certs::dates_warning(cert, &loaded.cert[0], now) {
                warnings.push(Diagnostic::warning(t.span, w.message.clone()).with_hint(w.hint()));
            }
        }
        if let Some(t) = site.tls.as_ref().filter(|_| !tls_listener) {
            warnings.push(
                Diagnostic::warning(
                    t.span,
                    format!(
                        "site `{}` has a certificate but there is no `tls` listener",
                        site.name
                    ),
                )
                .with_hint("add one, e.g. listen :443 tls"),
            );
        }
        shadowed(&site.name, &site.routes, &mut warnings);
        filter_lines(site, &mut errors, &mut warnings);
    }
    unsafe_literals(config, &mut errors);
    (errors, warnings)
}

/// What a site's filter lines say of the whole: a route without a handler, a `jwt`
/// that takes any provider's token, a `challenge` that cannot switch on.
fn filter_lines(site: &Site, errors: &mut Vec<Diagnostic>, warnings: &mut Vec<Diagnostic>) {
    let lines = site
        .filters
        .iter()
        .chain(site.routes.iter().flat_map(|r| &r.filters));
    for line in lines {
        if let Filter::Jwt(j) = &line.filter {
            jwt_warnings(j.as_ref(), line.span, warnings);
        }
    }
    unlimited_challenges(site, errors);
    // The page posts to one place a site: every challenge of the site checks with the
    // same key.
    let mut secrets = site
        .filters
        .iter()
        .chain(site.routes.iter().flat_map(|r| &r.filters))
        .filter_map(|l| match &l.filter {
            Filter::Challenge(c) => Some((&c.secret, l.span)),
            _ => None,
        });
    if let Some((first, _)) = secrets.next() {
        if let Some((_, span)) = secrets.find(|(s, _)| *s != first) {
            errors.push(
                Diagnostic::error(span, "the challenges of one site sign with one key")
                    .with_hint("give every challenge of the site the same secret_file (or none)"),
            );
        }
    }
    for r in &site.routes {
        if r.handler.is_none() && !r.filters.is_empty() {
            warnings.push(
                Diagnostic::warning(
                    r.span,
                    format!("route `{}` has filters but no handler", r.name),
                )
                .with_hint("it can only answer 404; add proxy, respond or redirect"),
            );
        }
    }
}

/// `challenge under_load` switches on its route's pool's in-flight count against its
/// `limit`: a route that proxies without one could never switch it on.
fn unlimited_challenges(site: &Site, errors: &mut Vec<Diagnostic>) {
    for r in &site.routes {
        let Some(Handler::Proxy(p)) = &r.handler else {
            continue;
        };
        if p.limit.is_some() {
            continue;
        }
        let under_load = site.filters.iter().chain(&r.filters).find(|l| {
            matches!(&l.filter, Filter::Challenge(c) if matches!(c.mode, ChallengeMode::UnderLoad(_)))
        });
        if let Some(line) = under_load {
            errors.push(
                Diagnostic::error(line.span, format!("`challenge under_load` needs the pool's `limit`, and route `{}` proxies without one", r.name))
                    .with_hint("give the proxy its limit (proxy … { limit 512 }): the challenge switches on at a share of it; or write challenge always"),
            );
            return;
        }
    }
}

/// A `jwt` whose keys are a provider's: without `issuer` or `audience`, any token those
/// keys signed passes (every application of a shared provider, ID tokens included);
/// keys fetched over plain HTTP from another host can be swapped on the way.
fn jwt_warnings(j: &JwtConfig, span: Span, warnings: &mut Vec<Diagnostic>) {
    let JwtKeys::Url(url) = &j.keys else {
        return;
    };
    if j.audiences.is_empty() {
        warnings.push(
            Diagnostic::warning(
                span,
                "this jwt accepts any token its provider's keys signed, for any application",
            )
            .with_hint("name the tokens meant for you: audience API_ID (and issuer URL)"),
        );
    }
    let host = url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_string()));
    let loopback = host.as_deref().is_some_and(|h| {
        h == "localhost"
            || h.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    if url.starts_with("http://") && !loopback {
        warnings.push(
            Diagnostic::warning(span, format!("the keys are fetched over plain HTTP: {url}"))
                .with_hint(
                    "whoever is on the path can hand sluice keys of their own: use https://",
                ),
        );
    }
}

/// A strict pool's literal addresses are judged at load: one it would refuse at every
/// dial is an error where it is written. Names are judged at each dial.
fn unsafe_literals(config: &Config, errors: &mut Vec<Diagnostic>) {
    let policy = config.safety_policy();
    let pools = config
        .pools()
        .map(|(_, p)| p)
        .chain(config.tcp.iter().flat_map(|t| t.proxies()));
    for p in pools.filter(|p| config.is_strict(p)) {
        for b in p.backends.iter().chain(&p.backups) {
            let Target::Tcp { host, port } = &b.target else {
                continue;
            };
            let Some(ip) = crate::safety::parse_ip(host) else {
                continue;
            };
            if let Some(reason) = policy.judge(std::net::SocketAddr::new(ip, *port)) {
                errors.push(
                    Diagnostic::error(
                        b.span,
                        format!(
                            "`{}` ({ip}) is {}: a strict pool never dials it",
                            b.text,
                            reason.what()
                        ),
                    )
                    .with_hint(reason.hint()),
                );
            }
        }
    }
}

/// A route after one with the same pattern and no matchers can never match.
fn shadowed(site: &str, routes: &[Route], warnings: &mut Vec<Diagnostic>) {
    for (i, r) in routes.iter().enumerate() {
        // The site block's own route, when it only carries the site's filters (no
        // handler): the operator wrote no such route, and its filters run on every
        // route anyway.
        if r.name == site && r.handler.is_none() {
            continue;
        }
        if let Some(earlier) = routes[..i]
            .iter()
            .find(|e| e.pattern == r.pattern && e.matchers.is_empty())
        {
            warnings.push(
                Diagnostic::warning(r.span, format!("route `{}` can never match", r.name))
                    .with_hint(format!(
                    "the route on line {} has the same pattern and no matchers, and comes first",
                    earlier.span.line
                )),
            );
        }
    }
}

//! A route's (or a site block's own) matchers, filters and its one handler.

use http::StatusCode;

use super::args::*;
use super::filters::{branch, filter_line, FILTERS};
use super::values::*;
use super::vocab::Place;
use super::{Builder, Res};
use crate::config::diag::{Diagnostic, Span};
use crate::config::model::*;
use crate::config::parser::{Directive, Word};

impl Builder {
    pub(super) fn route(&mut self, d: &Directive, site: &str) -> Option<Route> {
        let Some((pat, used)) = pattern_words(&d.args) else {
            self.errors.push(missing(
                d,
                "route PATTERN {",
                "route /api/* {  or  route ~ \"^/v\\d+/\" {",
            ));
            return None;
        };
        if let Some(x) = d.args.get(used) {
            self.errors.push(
                Diagnostic::error(x.span, "`route` takes one path pattern")
                    .with_hint("add matchers inside the block: match method GET"),
            );
            return None;
        }
        let items = match block(d, "route /api/* {") {
            Ok(b) => b,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        let pat = match pat {
            Ok(p) => p,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        if let PathPattern::Exact(p) = &pat {
            if p.len() > 1 && p.ends_with('/') {
                self.warnings.push(
                    Diagnostic::warning(
                        d.args[0].span,
                        format!("`route {p}` matches only the path {p} itself"),
                    )
                    .with_hint(format!(
                        "did you mean {p}*? (a prefix is written /prefix/*)"
                    )),
                );
            }
        }
        let shown = match &pat {
            PathPattern::Regex(re) => format!("~{}", re.0.as_str()),
            _ => d.args[0].text.clone(),
        };
        let name = format!("{site} {shown}");
        let items: Vec<Directive> = items
            .iter()
            .filter(|i| self.known_here(i, Place::Route))
            .cloned()
            .collect();
        self.route_body(&items, name, pat, d.span())
    }

    /// The cap on filters a request runs, with the site's first: an error at each
    /// route that goes over it with them (alone, its own lines are judged already).
    pub(super) fn filter_cap(&mut self, site: &[FilterLine], routes: &[Route]) {
        if site.is_empty() {
            return;
        }
        for r in routes {
            let n = site.len() + r.filters.len();
            if n > MAX_FILTERS && r.filters.len() <= MAX_FILTERS {
                self.errors.push(
                    Diagnostic::error(
                        r.span,
                        format!(
                            "route `{}` runs {n} filters with its site's {}: more than {MAX_FILTERS}",
                            r.name,
                            site.len()
                        ),
                    )
                    .with_hint("move filters into the routes that need them, or merge them"),
                );
            }
        }
    }

    /// Matchers, filters (in order) and the one handler of a route or a site block.
    pub(super) fn route_body(
        &mut self,
        items: &[Directive],
        name: String,
        pattern: PathPattern,
        span: Span,
    ) -> Option<Route> {
        let mut parts = RouteParts::default();
        let mut failed = false;
        for d in items {
            if let Err(e) = self.route_line(d, &mut parts) {
                self.errors.push(e);
                failed = true;
            }
        }
        let mut errors = parts.resolve();
        let route_re = match &pattern {
            PathPattern::Regex(re) => Some(&re.0),
            _ => None,
        };
        errors.extend(parts.resolve_groups(route_re));
        failed |= !errors.is_empty();
        self.errors.extend(errors);
        if failed {
            return None;
        }
        Some(Route {
            name,
            pattern,
            matchers: parts.matchers,
            filters: parts.filters,
            handler: parts.handler.map(|h| h.0),
            maintenance: parts.maintenance.map(|m| m.0),
            error_pages: parts.error_pages,
            cache: parts.cache,
            span,
        })
    }

    /// One line of a route: a matcher, a filter, a branch of the filter before it, or
    /// the handler.
    fn route_line<'a>(&mut self, d: &'a Directive, parts: &mut RouteParts<'a>) -> Res<()> {
        let name = d.name.text.as_str();
        if name == "on" {
            return parts.branch(d);
        }
        parts.after_filter = FILTERS.contains(&name);
        if !parts.after_filter {
            if let Some(w) = d
                .args
                .iter()
                .find(|w| !w.quoted && matches!(w.text.as_str(), "when" | "unless" | "failure"))
            {
                return Err(
                    Diagnostic::error(w.span, format!("`{}` goes on a filter's line", w.text))
                        .with_hint(format!("`{name}` is not a filter; conditions and failure modes belong to filters (allow, rate_limit, header_down, ...)")),
                );
            }
        }
        match name {
            "match" => matcher(d).map(|m| parts.matchers.push(m)),
            "error_page" => {
                let page = self.error_page(d)?;
                if let Some((c, first)) = page.codes.iter().find_map(|c| {
                    parts
                        .error_pages
                        .iter()
                        .find(|p| p.codes.contains(c))
                        .map(|p| (c, p.span))
                }) {
                    return Err(Diagnostic::error(
                        d.span(),
                        format!("`error_page {}` is given twice here", c.as_u16()),
                    )
                    .with_hint(format!("line {} has it already", first.line)));
                }
                parts.error_pages.push(page);
                Ok(())
            }
            "maintenance" => {
                if let Some((_, first)) = &parts.maintenance {
                    return Err(twice(d, *first));
                }
                parts.maintenance = Some((self.maintenance(d)?, d.span()));
                Ok(())
            }
            "cache" => {
                if let Some(first) = &parts.cache {
                    return Err(twice(d, first.span));
                }
                parts.cache = Some(self.cache(d)?);
                Ok(())
            }
            _ if parts.after_filter => parts.filter(filter_line(d, &self.dir_of(d.span()))?),
            "respond" | "redirect" | "proxy" | "files" | "fastcgi" => {
                let h = match name {
                    "respond" => respond(d)?,
                    "redirect" => redirect(d)?,
                    "files" => self.files(d)?,
                    "fastcgi" => self.fastcgi(d)?,
                    _ => self.proxy(d)?,
                };
                if let Some((_, first)) = &parts.handler {
                    return Err(Diagnostic::error(d.span(), "a route has exactly one handler")
                        .with_hint(format!("the handler on line {} already answers this route; put the other in its own route", first.line)));
                }
                parts.handler = Some((h, d.span()));
                Ok(())
            }
            _ => Err(unsupported(d)),
        }
    }
}

/// The most filters one request runs (the site's and its route's): the pipeline keeps
/// which ran in 128 bits, and the proxy's own `max_body` may take one.
const MAX_FILTERS: usize = 127;

/// What a route's lines add up to while they are read.
#[derive(Default)]
struct RouteParts<'a> {
    matchers: Vec<Matcher>,
    filters: Vec<FilterLine>,
    /// Skips to resolve once every filter's name is known: (filter, branch, NAME).
    skips: Vec<(usize, usize, &'a Word)>,
    /// The previous line was a filter (or a branch of it): `on` may follow.
    after_filter: bool,
    handler: Option<(Handler, Span)>,
    maintenance: Option<(Maintenance, Span)>,
    error_pages: Vec<ErrorPage>,
    cache: Option<CacheConfig>,
}

impl<'a> RouteParts<'a> {
    /// `on RESULT …`: a branch of the filter on the line before.
    fn branch(&mut self, d: &'a Directive) -> Res<()> {
        let at = self.filters.len().wrapping_sub(1);
        let Some(line) = self.filters.last_mut().filter(|_| self.after_filter) else {
            return Err(
                Diagnostic::error(d.span(), "`on` follows the filter it branches on").with_hint(
                    "put it on the line right after the filter (or its other `on` lines)",
                ),
            );
        };
        let (b, target) = branch(d, line)?;
        if let Some(t) = target {
            self.skips.push((at, line.branches.len(), t));
        }
        line.branches.push(b);
        Ok(())
    }

    /// A filter line; its name, if it has one, is unique in the route.
    fn filter(&mut self, line: FilterLine) -> Res<()> {
        if let Some(n) = &line.name {
            if let Some(prev) = self.filters.iter().find(|f| f.name.as_ref() == Some(n)) {
                return Err(Diagnostic::error(
                    line.span,
                    format!("a filter named `{n}` is already in this route"),
                )
                .with_hint(format!(
                    "it is on line {}; names are what skip_to finds, so they are unique",
                    prev.span.line
                )));
            }
        }
        self.filters.push(line);
        Ok(())
    }

    /// Once every line is read: the cap on filters, and each `skip_to NAME` turned
    /// into the index of a later filter. The errors found.
    fn resolve(&mut self) -> Vec<Diagnostic> {
        let mut errors = Vec::new();
        if self.filters.len() > MAX_FILTERS {
            errors.push(
                Diagnostic::error(
                    self.filters[MAX_FILTERS].span,
                    "more than 127 filters in one route",
                )
                .with_hint("split the route, or merge filters (one allow with several CIDRs)"),
            );
        }
        // Skips go forward only: loops are impossible by construction.
        // `skip_to handler` lands past the last filter (on the proxy's own
        // `max_body`, which the route runs last, so no skip passes it).
        for (from, b, target) in std::mem::take(&mut self.skips) {
            let to = match target.text.as_str() {
                "handler" => Some(self.filters.len()),
                name => self
                    .filters
                    .iter()
                    .position(|f| f.name.as_deref() == Some(name)),
            };
            match to {
                Some(to) if to > from => {
                    self.filters[from].branches[b].action = BranchAction::SkipTo(to)
                }
                Some(_) => errors.push(
                    Diagnostic::error(
                        target.span,
                        format!("`{}` is not after this filter", target.text),
                    )
                    .with_hint("skip_to goes forward only; move the named filter below"),
                ),
                None => errors.push(self.no_such_filter(target)),
            }
        }
        errors
    }

    /// Each `{re.N}` / `{re.NAME}` checked against the regex it belongs to: a
    /// `rewrite ~`'s own, otherwise the route's (`route_re`).
    fn resolve_groups(&mut self, route_re: Option<&regex::Regex>) -> Vec<Diagnostic> {
        let mut errors = Vec::new();
        let mut check = |t: &mut Template, re: Option<&regex::Regex>, at: Span| {
            if let Err(why) = t.resolve_groups(re) {
                errors.push(Diagnostic::error(at, why).with_hint(
                    "groups come from `route ~ \"REGEX\"` or the line's own `rewrite ~ \"REGEX\"`; {re.0} is the whole match",
                ));
            }
        };
        for line in &mut self.filters {
            match &mut line.filter {
                Filter::Rewrite { from, to } => {
                    let re = match from {
                        PathPattern::Regex(r) => Some(&r.0),
                        _ => route_re,
                    };
                    check(to, re, line.span);
                }
                Filter::HeaderDown(op) => {
                    if let Some(t) = op.template_mut() {
                        check(t, route_re, line.span);
                    }
                }
                _ => {}
            }
        }
        if let Some((h, at)) = &mut self.handler {
            match h {
                Handler::Respond { body: t, .. } | Handler::Redirect { target: t, .. } => {
                    check(t, route_re, *at)
                }
                Handler::Proxy(p) => {
                    let p = &mut **p;
                    for op in p.header_up.iter_mut().chain(p.header_down.iter_mut()) {
                        if let Some(t) = op.template_mut() {
                            check(t, route_re, *at);
                        }
                    }
                }
                Handler::Files(_) | Handler::FastCgi(_) => {}
            }
        }
        errors
    }

    fn no_such_filter(&self, target: &Word) -> Diagnostic {
        let names: Vec<&str> = self
            .filters
            .iter()
            .filter_map(|f| f.name.as_deref())
            .collect();
        Diagnostic::error(
            target.span,
            format!("no filter named `{}` in this route", target.text),
        )
        .with_hint(if names.is_empty() {
            "name the target filter with `name NAME` at the end of its line".to_string()
        } else {
            format!("named here: {}", names.join(", "))
        })
    }
}

/// An error page's body is kept in memory for every answer it replaces.
const ERROR_PAGE_MAX: u64 = 1 << 20;

impl Builder {
    /// `error_page CODE... FILE|"BODY" [backend]`: FILE is read now (relative to the
    /// config file), so a missing one fails the load.
    fn error_page(&self, d: &Directive) -> Res<ErrorPage> {
        const USAGE: &str = "error_page CODE... FILE|\"BODY\" [backend]";
        no_block(d)?;
        let mut args = d.args.as_slice();
        let backend = match args.split_last() {
            Some((last, rest)) if !last.quoted && last.text == "backend" => {
                args = rest;
                true
            }
            _ => false,
        };
        let n = args.iter().take_while(|w| status_word(w).is_some()).count();
        let (codes, what) = args.split_at(n);
        let [what] = what else {
            return Err(match what.get(1) {
                Some(x) => extra(x, &format!("write: {USAGE}")),
                None => missing(d, USAGE, "error_page 502 503 504 errors/5xx.html"),
            });
        };
        if codes.is_empty() {
            return Err(expected(what, "a status code first").with_hint(format!("write: {USAGE}")));
        }
        let codes = codes
            .iter()
            .map(|w| status(w, 400..=599))
            .collect::<Res<Vec<_>>>()?;
        let (body, content_type) = if what.quoted {
            (
                bytes::Bytes::from(what.text.clone()),
                "text/plain; charset=utf-8".to_string(),
            )
        } else {
            let path = self.dir_of(d.span()).join(&what.text);
            let fail = |e: String| {
                Diagnostic::error(what.span, format!("{}: {e}", path.display()))
                    .with_hint("error_page reads FILE at load, relative to the config file; quote a text to use it as the body")
            };
            let len = std::fs::metadata(&path)
                .map_err(|e| fail(e.to_string()))?
                .len();
            if len > ERROR_PAGE_MAX {
                return Err(fail("larger than 1 MiB".into()));
            }
            let body = std::fs::read(&path).map_err(|e| fail(e.to_string()))?;
            let mime = mime_guess::from_path(&path).first_or_text_plain();
            (bytes::Bytes::from(body), mime.to_string())
        };
        Ok(ErrorPage {
            codes,
            body,
            content_type: http::HeaderValue::from_str(&content_type)
                .unwrap_or(http::HeaderValue::from_static("text/plain")),
            backend,
            span: d.span(),
        })
    }

    /// `files DIR { index NAME...; browse on|off }`: DIR must be a folder now.
    pub(super) fn files(&mut self, d: &Directive) -> Res<Handler> {
        let w = d
            .args
            .first()
            .ok_or_else(|| missing(d, "files DIR", "files /srv/www"))?;
        if let Some(x) = d.args.get(1) {
            return Err(extra(
                x,
                "write: files DIR [{ index NAME...; browse on|off }]",
            ));
        }
        let dir = self.dir_of(d.span()).join(&w.text);
        let root = std::fs::canonicalize(&dir).map_err(|e| {
            Diagnostic::error(w.span, format!("{}: {e}", dir.display()))
                .with_hint("files serves an existing folder; create it or fix the path")
        })?;
        if !root.is_dir() {
            return Err(
                Diagnostic::error(w.span, format!("{} is not a folder", dir.display()))
                    .with_hint("files serves a folder; to serve one file, point at its folder"),
            );
        }
        let mut cfg = FilesConfig {
            root,
            index: vec!["index.html".to_string()],
            browse: false,
            fallback: None,
            precompressed: Vec::new(),
            dotfiles: false,
        };
        let mut seen = std::collections::HashSet::new();
        for item in d.block.as_deref().unwrap_or(&[]) {
            if !self.known_here(item, Place::Files) {
                continue;
            }
            if !seen.insert(item.name.text.clone()) {
                self.errors.push(Diagnostic::error(
                    item.span(),
                    format!("`{}` is given twice", item.name.text),
                ));
                continue;
            }
            let r = files_option(item, &mut cfg);
            self.push(r);
        }
        Ok(Handler::Files(cfg))
    }
}

/// CGI variables sluice derives itself: never from `env` (a load error) or a header.
pub(super) const PROTECTED: &[&str] = &[
    "GATEWAY_INTERFACE",
    "SERVER_SOFTWARE",
    "SERVER_PROTOCOL",
    "SERVER_NAME",
    "SERVER_PORT",
    "REQUEST_METHOD",
    "REQUEST_URI",
    "REQUEST_SCHEME",
    "QUERY_STRING",
    "SCRIPT_NAME",
    "SCRIPT_FILENAME",
    "PATH_INFO",
    "DOCUMENT_ROOT",
    "DOCUMENT_URI",
    "REMOTE_ADDR",
    "REMOTE_PORT",
    "CONTENT_TYPE",
    "CONTENT_LENGTH",
    "HTTPS",
    "REDIRECT_STATUS",
];

impl Builder {
    /// `fastcgi ADDR { root DIR; suffix .php...; index NAME...; fallback /PATH;
    /// max_conns N; connect_timeout D; keepalive_timeout D; env NAME VALUE; max_body SIZE }`.
    pub(super) fn fastcgi(&mut self, d: &Directive) -> Res<Handler> {
        const USAGE: &str = "fastcgi ADDR { root DIR }";
        let w = d.args.first().ok_or_else(|| {
            missing(
                d,
                USAGE,
                "fastcgi unix:/run/php/php-fpm.sock { root /srv/app/public }",
            )
        })?;
        if let Some(x) = d.args.get(1) {
            return Err(extra(x, &format!("write: {USAGE}")));
        }
        let base = self.dir_of(d.span());
        let addr = backend_addr(w, &base)?;
        // FastCGI has no usual port: one is always written.
        let has_port = w.text.rsplit_once(':').is_some_and(|(h, p)| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':')
        });
        if !w.text.starts_with("unix:") && !has_port {
            return Err(Diagnostic::error(
                w.span,
                format!("`{}`: a FastCGI address needs a port", w.text),
            )
            .with_hint("write host:9000, or unix:/run/php/php-fpm.sock"));
        }
        if addr.scheme != BackendScheme::Http || addr.text.starts_with("http://") {
            return Err(Diagnostic::error(
                w.span,
                format!("`{}`: FastCGI speaks to host:port or unix:/path", w.text),
            )
            .with_hint("write the address without a scheme"));
        }
        let mut cfg = FastCgiConfig::new(w.text.clone(), addr.target);
        let mut seen = std::collections::HashSet::new();
        for item in d.block.as_deref().unwrap_or(&[]) {
            if !self.known_here(item, Place::FastCgi) {
                continue;
            }
            // `env` alone may be given more than once.
            if item.name.text != "env" && !seen.insert(item.name.text.clone()) {
                self.errors.push(Diagnostic::error(
                    item.span(),
                    format!("`{}` is given twice", item.name.text),
                ));
                continue;
            }
            if let Some((_, read)) = FASTCGI_OPTIONS.iter().find(|(n, _)| *n == item.name.text) {
                let r = read(item, &base, &mut cfg);
                self.push(r);
            }
        }
        if cfg.root.as_os_str().is_empty() {
            return Err(missing(
                d,
                USAGE,
                "fastcgi 127.0.0.1:9000 { root /srv/app/public }",
            ));
        }
        if let Some(f) = &cfg.fallback {
            if !cfg.suffix.iter().any(|s| f.ends_with(s.as_str())) {
                self.warnings.push(Diagnostic::warning(
                    d.span(),
                    format!("fallback `{f}` has none of the script suffixes: it will be served as a static file, not run"),
                ));
            }
        }
        Ok(Handler::FastCgi(Box::new(cfg)))
    }
}

/// How one option of a `fastcgi { … }` block is read; `base` is the folder relative
/// paths start from.
pub(super) type FastCgiOption = fn(&Directive, &std::path::Path, &mut FastCgiConfig) -> Res<()>;

/// Every option of a `fastcgi { … }` block with its parser.
pub(super) static FASTCGI_OPTIONS: &[(&str, FastCgiOption)] = &[
    ("root", fastcgi_root),
    ("suffix", fastcgi_names),
    ("index", fastcgi_names),
    ("fallback", |d, _, cfg| {
        let f = one_arg(d, "fallback /index.php")?;
        if !f.text.starts_with('/') || f.text.contains("..") {
            return Err(expected(f, "a script path starting with /"));
        }
        cfg.fallback = Some(f.text.clone());
        Ok(())
    }),
    ("max_conns", |d, _, cfg| {
        int_in(one_arg(d, "max_conns N")?, 1, 100_000).map(|n| cfg.max_conns = n as usize)
    }),
    ("connect_timeout", |d, _, cfg| {
        positive(one_arg(d, "connect_timeout 5s")?).map(|t| cfg.connect_timeout = t)
    }),
    ("keepalive_timeout", |d, _, cfg| {
        positive(one_arg(d, "keepalive_timeout 60s")?).map(|t| cfg.keepalive_timeout = t)
    }),
    ("timeout", |d, _, cfg| {
        positive(one_arg(d, "timeout 60s")?).map(|t| cfg.timeout = t)
    }),
    ("max_body", |d, _, cfg| {
        size(one_arg(d, "max_body SIZE")?).map(|n| cfg.max_body = n)
    }),
    ("env", fastcgi_env),
];

/// `root DIR`: the application's existing folder, canonical.
fn fastcgi_root(d: &Directive, base: &std::path::Path, cfg: &mut FastCgiConfig) -> Res<()> {
    let r = one_arg(d, "root DIR")?;
    let dir = base.join(&r.text);
    let canon = std::fs::canonicalize(&dir).map_err(|e| {
        Diagnostic::error(r.span, format!("{}: {e}", dir.display()))
            .with_hint("root is the application's existing folder")
    })?;
    if !canon.is_dir() {
        return Err(Diagnostic::error(
            r.span,
            format!("{} is not a folder", dir.display()),
        ));
    }
    cfg.root = canon;
    Ok(())
}

/// `suffix .php...` and `index NAME...`.
fn fastcgi_names(d: &Directive, _: &std::path::Path, cfg: &mut FastCgiConfig) -> Res<()> {
    if d.args.is_empty() {
        return Err(missing(d, "suffix .php...", "suffix .php"));
    }
    no_block(d)?;
    if let Some(bad) = d
        .args
        .iter()
        .find(|a| a.text.contains('/') || a.text.is_empty())
    {
        return Err(expected(bad, "a name without /"));
    }
    let v = d.args.iter().map(|a| a.text.clone()).collect();
    if d.name.text == "suffix" {
        if let Some(bad) = d.args.iter().find(|a| !a.text.starts_with('.')) {
            return Err(expected(bad, "a suffix starting with a dot, like .php"));
        }
        cfg.suffix = v;
    } else {
        cfg.index = v;
    }
    Ok(())
}

/// `env NAME VALUE`: never one of the variables sluice derives from the request.
fn fastcgi_env(d: &Directive, _: &std::path::Path, cfg: &mut FastCgiConfig) -> Res<()> {
    let (n, v) = two_args(d, "env NAME VALUE")?;
    let upper = n.text.to_ascii_uppercase();
    if PROTECTED.contains(&upper.as_str()) || upper.starts_with("HTTP_") {
        return Err(Diagnostic::error(
            n.span,
            format!(
                "`{}` is set by sluice from the request; env cannot override it",
                n.text
            ),
        )
        .with_hint("protected: the CGI variables sluice derives and every HTTP_* variable"));
    }
    let name_ok = !n.text.is_empty()
        && n.text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !name_ok {
        return Err(expected(n, "a variable name of letters, digits and _"));
    }
    cfg.env.push((n.text.clone(), v.text.clone()));
    Ok(())
}

/// `NAME on|off`, for any directive that is a switch; the error names `d`'s own
/// directive.
pub(super) fn on_off(d: &Directive) -> Res<bool> {
    let w = one_arg(d, &format!("{} on|off", d.name.text))?;
    match w.text.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(expected(w, "`on` or `off`")),
    }
}

pub(super) fn compression(d: &Directive) -> Res<Compression> {
    let w = one_arg(d, "compress on|off|always")?;
    match w.text.as_str() {
        "on" => Ok(Compression::On),
        "off" => Ok(Compression::Off),
        "always" => Ok(Compression::Always),
        _ => Err(expected(w, "`on`, `off` or `always`").with_hint(
            "`always` also compresses responses that set cookies or answer an Authorization",
        )),
    }
}

pub(super) fn respond(d: &Directive) -> Res<Handler> {
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

pub(super) fn redirect(d: &Directive) -> Res<Handler> {
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

/// `precompressed zstd br gzip`: the codings, each once.
fn precompressed(d: &Directive) -> Res<Vec<Precompressed>> {
    if d.args.is_empty() {
        return Err(missing(
            d,
            "precompressed CODING...",
            "precompressed zstd br gzip",
        ));
    }
    let mut out = Vec::new();
    for w in &d.args {
        let c = match w.text.as_str() {
            "zstd" => Precompressed::Zstd,
            "br" => Precompressed::Br,
            "gzip" => Precompressed::Gzip,
            _ => return Err(expected(w, "`zstd`, `br` or `gzip`")),
        };
        if out.contains(&c) {
            return Err(Diagnostic::error(
                w.span,
                format!("`{}` is named twice", w.text),
            ));
        }
        out.push(c);
    }
    Ok(out)
}

/// One line of a `files` block, into `cfg`.
fn files_option(item: &Directive, cfg: &mut FilesConfig) -> Res<()> {
    match item.name.text.as_str() {
        "index" => {
            if item.args.is_empty() {
                Err(missing(item, "index NAME...", "index index.html index.htm"))
            } else if let Some(bad) = item
                .args
                .iter()
                .find(|a| a.text.contains('/') || a.text == "." || a.text == "..")
            {
                Err(expected(bad, "a file name without /"))
            } else {
                cfg.index = item.args.iter().map(|a| a.text.clone()).collect();
                Ok(())
            }
        }
        "browse" => on_off(item).map(|on| cfg.browse = on),
        "fallback" => one_arg(item, "fallback /index.html").and_then(|w| {
            if !w.text.starts_with('/') || w.text.ends_with('/') {
                return Err(expected(
                    w,
                    "a file's path under the folder, like /index.html",
                ));
            }
            normal_form(w, &w.text)?;
            cfg.fallback = Some(w.text.clone());
            Ok(())
        }),
        "precompressed" => precompressed(item).map(|p| cfg.precompressed = p),
        "dotfiles" => one_arg(item, "dotfiles allow|deny").and_then(|w| {
            match w.text.as_str() {
                "allow" => cfg.dotfiles = true,
                "deny" => cfg.dotfiles = false,
                _ => return Err(expected(w, "`allow` or `deny`")),
            }
            Ok(())
        }),
        _ => Ok(()),
    }
}

//! From syntax tree to typed model: every directive checked for its place, its
//! arguments and its values, and the whole checked for combinations that cannot work.
//!
//! Never half-applies: any error makes the whole load fail. Directives that DESIGN.md
//! names but whose runtime is not built yet are refused as "not supported yet", never
//! ignored. Warnings are collected beside errors; `--strict` makes them fatal.

mod acme;
pub(crate) use self::acme::orderable;
mod args;
mod cache;
mod challenge;
mod controls;
mod filters;
mod jwt;
mod proxy;
mod route;
mod values;
mod vocab;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use self::args::*;
use self::values::*;
use self::vocab::{Place, ALL_PLACES};
use super::diag::{nearest, Diagnostic, Sources, Span};
use super::model::*;
use super::parser::{Directive, Word};

type Res<T> = Result<T, Diagnostic>;

/// Builds the model, returning it with its warnings, or every error found.
pub(crate) fn build(
    tree: &[Directive],
    sources: &Sources,
) -> Result<(Config, Vec<Diagnostic>), Vec<Diagnostic>> {
    let mut b = Builder {
        sources: sources.clone(),
        ..Builder::default()
    };
    let config = b.top(tree);
    // Structural, so sound on a config that had errors too.
    b.errors
        .extend(super::validate::duplicates(&config, sources));
    if b.errors.is_empty() {
        let (errors, warnings) = super::validate::check(&config, b.listeners_declared);
        b.errors.extend(errors);
        b.warnings.extend(warnings);
    }
    if b.errors.is_empty() {
        let mut config = config;
        challenge::endpoints(&mut config);
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
    /// The files read, so relative paths resolve from the folder of the file that
    /// names them.
    sources: Sources,
    listeners_declared: bool,
    /// `global { proxy_defaults { … } }`: options (each checked once, where written)
    /// copied into every pool that does not set them.
    proxy_defaults: Vec<Directive>,
    /// `global { retries off }`.
    retries_off: bool,
}

/// A site block's own settings (its certificate and controls), each at most once, with where it was set.
#[derive(Default)]
struct SiteControls {
    tls: Option<(SiteTls, Span)>,
    maintenance: Option<(Maintenance, Span)>,
    https_redirect: Option<(HttpsRedirect, Span)>,
    hsts: Option<(Hsts, Span)>,
    versions: Option<(HttpVersions, Span)>,
    access_log: Option<(SiteLog, Span)>,
}

impl SiteControls {
    fn site(
        self,
        name: String,
        hosts: Vec<HostPattern>,
        host_words: Vec<(String, Span)>,
        routes: Vec<Route>,
        (filters, error_pages): (Vec<FilterLine>, Vec<ErrorPage>),
    ) -> Site {
        Site {
            name,
            hosts,
            host_words,
            routes,
            filters,
            error_pages,
            tls: self.tls.map(|t| t.0),
            maintenance: self.maintenance.map(|m| m.0),
            https_redirect: self.https_redirect.map(|r| r.0),
            hsts: self.hsts.map(|h| h.0),
            versions: self.versions.map_or_else(HttpVersions::default, |v| v.0),
            access_log: self.access_log.map(|l| l.0),
        }
    }

    fn read(&mut self, b: &Builder, d: &Directive) -> Res<()> {
        fn set<T>(slot: &mut Option<(T, Span)>, d: &Directive, v: Res<T>) -> Res<()> {
            if let Some((_, first)) = slot {
                return Err(twice(d, *first));
            }
            *slot = Some((v?, d.span()));
            Ok(())
        }
        match d.name.text.as_str() {
            "tls" => set(&mut self.tls, d, b.site_tls(d)),
            "maintenance" => set(&mut self.maintenance, d, b.maintenance(d)),
            "https_redirect" => set(&mut self.https_redirect, d, controls::https_redirect(d)),
            "hsts" => set(&mut self.hsts, d, controls::hsts(d)),
            "access_log" => {
                let log = access_log_of(b, d).map(|l| l.map_or(SiteLog::Off, SiteLog::To));
                set(&mut self.access_log, d, log)
            }
            _ => set(&mut self.versions, d, controls::http_versions(d)),
        }
    }
}

impl Builder {
    /// `token_file FILE` (its one line, the trailing newline trimmed) or `token VALUE`
    /// (warned about unless it comes from the environment: a secret in the file).
    fn admin_token(&mut self, d: &Directive) -> Res<AdminToken> {
        no_block(d)?;
        let w = one_arg(d, &format!("{} VALUE", d.name.text))?;
        let text = if d.name.text == "token_file" {
            let path = self.dir_of(d.span()).join(&w.text);
            let raw = std::fs::read_to_string(&path).map_err(|e| {
                Diagnostic::error(w.span, format!("{}: {e}", path.display()))
                    .with_hint("write the token in that file (one line), readable by sluice only")
            })?;
            raw.trim_end_matches(['\n', '\r']).to_string()
        } else {
            let line = self
                .sources
                .text(d.span().file)
                .lines()
                .nth(d.span().line.saturating_sub(1) as usize)
                .unwrap_or("");
            if !line.contains("{$") {
                self.warnings.push(
                    Diagnostic::warning(w.span, "the admin token is written in the config file")
                        .with_hint("anyone who can read the file can drive the API: use token_file FILE, or token {$SLUICE_ADMIN_TOKEN}"),
                );
            }
            w.text.clone()
        };
        if text.is_empty() || text.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
            return Err(Diagnostic::error(
                w.span,
                "an admin token is one word of visible ASCII characters",
            )
            .with_hint("make one with: head -c 32 /dev/urandom | base64"));
        }
        Ok(AdminToken(text))
    }

    /// The folder of the file `span` is in: what its relative paths are relative to.
    fn dir_of(&self, span: Span) -> PathBuf {
        std::path::Path::new(self.sources.name(span.file))
            .parent()
            .map(|p| p.to_path_buf())
            .unwrap_or_default()
    }

    fn push(&mut self, r: Res<()>) {
        if let Err(e) = r {
            self.errors.push(e);
        }
    }

    /// Checks that `d` belongs in `place`; pushes an error and returns false if not.
    fn known_here(&mut self, d: &Directive, place: Place) -> bool {
        let name = d.name.text.as_str();
        if place.known().contains(&name) {
            if let Some(hint) = vocab::not_yet(place, name) {
                self.errors.push(unsupported(d).with_hint(hint));
                return false;
            }
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
        let mut tcp: Vec<TcpProxy> = Vec::new();
        let mut global_seen: Option<Span> = None;
        // `global` first, wherever it is written: the pools take its defaults.
        for d in tree.iter().filter(|d| d.name.text == "global") {
            if let Some(first) = global_seen {
                self.errors.push(twice(d, first));
                continue;
            }
            global_seen = Some(d.span());
            match no_args(d).and_then(|_| block(d, "global {")) {
                Ok(items) => self.global(items, &mut global),
                Err(e) => self.errors.push(e),
            }
        }
        for d in tree {
            if !self.known_here(d, Place::Top) {
                continue;
            }
            match d.name.text.as_str() {
                "global" => {}
                "listen" => match listen(d) {
                    Ok(l) => listeners.push(Listen {
                        seq: listeners.len() + tcp.len(),
                        ..l
                    }),
                    Err(e) => self.errors.push(e),
                },
                "site" => {
                    if let Some(site) = self.site(d) {
                        sites.push(site);
                    }
                }
                "tcp" => {
                    if let Some(mut t) = self.tcp(d) {
                        t.listen.seq = listeners.len() + tcp.len();
                        tcp.push(t);
                    }
                }
                _ => {}
            }
        }
        self.listeners_declared = !listeners.is_empty() || !tcp.is_empty();
        if listeners.is_empty() && tcp.is_empty() {
            listeners.push(Listen {
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
                text: "127.0.0.1:8080".into(),
                dual_stack: false,
                tls: false,
                proxy_protocol: false,
                quic: false,
                span: Span::default(),
                addr_span: Span::default(),
                seq: 0,
                guards: Vec::new(),
            });
        }
        self.redirect_ports(&listeners, &mut sites);
        self.acme_sites(&mut global, &listeners, &mut sites);
        Config {
            global,
            listeners,
            sites,
            tcp,
        }
    }

    /// `https_redirect` names the first `tls` listener's port; a site with it and no
    /// `tls` listener cannot be redirected anywhere.
    fn redirect_ports(&mut self, listeners: &[Listen], sites: &mut [Site]) {
        let port = listeners.iter().find(|l| l.tls).map(|l| l.addr.port());
        for r in sites.iter_mut().filter_map(|s| s.https_redirect.as_mut()) {
            match port {
                Some(p) => r.port = p,
                None => self.errors.push(
                    Diagnostic::error(
                        r.span,
                        "https_redirect needs a `tls` listener to send clients to",
                    )
                    .with_hint("add one: listen :443 tls (and a `tls CERT KEY` for the site)"),
                ),
            }
        }
    }

    fn global(&mut self, items: &[Directive], g: &mut Global) {
        let mut seen = Seen::default();
        for d in items {
            if !self.known_here(d, Place::Global) || !self.once(&mut seen, d) {
                continue;
            }
            let r = match GLOBAL_OPTIONS.iter().find(|(n, _)| *n == d.name.text) {
                Some((_, read)) => read(self, d, g),
                None => Err(unsupported(d)),
            };
            self.push(r);
        }
    }

    /// `safety strict|off`, or `safety { default strict|off; allow_private CIDR...;
    /// block CIDR... }`.
    fn global_safety(&mut self, d: &Directive, s: &mut SafetyGlobal) -> Res<()> {
        const USAGE: &str =
            "safety strict|off, or safety { default strict; allow_private CIDR...; block CIDR... }";
        let Some(items) = d.block.as_deref() else {
            s.strict = strict_or_off(one_arg(d, USAGE)?)?;
            return Ok(());
        };
        if let Some(w) = d.args.first() {
            return Err(extra(
                w,
                "a `safety` block takes no arguments; put `default strict` inside",
            ));
        }
        let mut seen = Seen::default();
        for item in items {
            if !self.known_here(item, Place::Safety) || !self.once(&mut seen, item) {
                continue;
            }
            let r = match item.name.text.as_str() {
                "default" => one_arg(item, "default strict|off").and_then(|w| {
                    s.strict = strict_or_off(w)?;
                    Ok(())
                }),
                list => no_block(item).and_then(|()| {
                    if item.args.is_empty() {
                        return Err(missing(
                            item,
                            &format!("{list} CIDR..."),
                            &format!("{list} 10.20.0.0/16"),
                        ));
                    }
                    let nets = item.args.iter().map(cidr).collect::<Res<Vec<_>>>()?;
                    if list == "allow_private" {
                        s.allow_private = nets;
                    } else {
                        s.block = nets;
                    }
                    Ok(())
                }),
            };
            self.push(r);
        }
        Ok(())
    }

    fn site(&mut self, d: &Directive) -> Option<Site> {
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
        let (hosts, host_words) = self.site_hosts(d);
        let name = d.args[0].text.to_ascii_lowercase();
        let mut routes = Vec::new();
        let mut own: Vec<&Directive> = Vec::new();
        let mut controls = SiteControls::default();
        // Whether the item before was one of the site's own (an `on` line must follow
        // its filter directly, not across a `route` or `tls` line).
        let mut after_own = false;
        for item in items {
            if !self.known_here(item, Place::Site) {
                continue;
            }
            let own_item = !matches!(
                item.name.text.as_str(),
                "route" | "tls" | "maintenance" | "https_redirect" | "hsts" | "http_versions"
            );
            if item.name.text == "on" && !after_own {
                self.errors.push(
                    Diagnostic::error(item.span(), "`on` follows the filter it branches on")
                        .with_hint(
                            "put it on the line right after the filter (or its other `on` lines)",
                        ),
                );
                continue;
            }
            after_own = own_item;
            match item.name.text.as_str() {
                "route" => {
                    if let Some(r) = self.route(item, &name) {
                        routes.push(r);
                    }
                }
                "tls" | "maintenance" | "https_redirect" | "hsts" | "http_versions"
                | "access_log" => {
                    let r = controls.read(self, item);
                    self.push(r);
                }
                _ => own.push(item),
            }
        }
        // The site's own lines are its `/*` route (matchers, handler), whose filters
        // become the site's: every route runs them first.
        let mut filters = Vec::new();
        let mut error_pages = Vec::new();
        if !own.is_empty() {
            let owned: Vec<Directive> = own.into_iter().cloned().collect();
            let span = owned[0].span();
            if let Some(mut r) = self.route_body(
                &owned,
                name.clone(),
                PathPattern::Prefix(String::new()),
                span,
            ) {
                filters = std::mem::take(&mut r.filters);
                error_pages = std::mem::take(&mut r.error_pages);
                routes.push(r);
            }
        }
        self.filter_cap(&filters, &routes);
        Some(controls.site(name, hosts, host_words, routes, (filters, error_pages)))
    }

    /// A site's hosts, and each as written with where; a host that cannot be one is an
    /// error pushed.
    fn site_hosts(&mut self, d: &Directive) -> (Vec<HostPattern>, Vec<(String, Span)>) {
        let mut hosts = Vec::new();
        let mut words = Vec::new();
        for w in &d.args {
            match host_pattern(w) {
                Ok(h) => {
                    hosts.push(h);
                    words.push((w.text.clone(), w.span));
                }
                Err(e) => self.errors.push(e),
            }
        }
        (hosts, words)
    }

    /// `tls CERT KEY [{ client_ca FILE; client_auth require|optional; client_crl
    /// FILE... }]`: every file read and checked now, so a bad one fails the load. `tls
    /// auto [{ … }]`: ordered from the ACME server (its names filled in once the site's
    /// hosts are known).
    fn site_tls(&self, d: &Directive) -> Res<SiteTls> {
        let source = match d.args.as_slice() {
            [w] if w.text == "auto" => CertSource::Auto { names: Vec::new() },
            [w] if w.text == "on_demand" => {
                return Ok(SiteTls {
                    source: on_demand(d)?,
                    client: None,
                    span: d.span(),
                })
            }
            [c, k] => {
                let base = self.dir_of(d.span());
                let cert = base.join(&c.text);
                let key = base.join(&k.text);
                let loaded = crate::config::certs::load_pair(&cert, &key)
                    .map_err(|e| Diagnostic::error(d.span(), e.to_string()).with_hint(e.hint()))?;
                CertSource::Files { cert, key, loaded }
            }
            _ => {
                return Err(missing(
                    d,
                    "tls CERT_FILE KEY_FILE, or tls auto",
                    "tls /etc/sluice/example.com.pem /etc/sluice/example.com.key",
                ))
            }
        };
        let client = match d.block.as_deref() {
            Some(items) => self.client_auth(d, items)?,
            None => None,
        };
        Ok(SiteTls {
            source,
            client,
            span: d.span(),
        })
    }

    /// The block of `tls CERT KEY { … }`: mTLS.
    fn client_auth(&self, d: &Directive, items: &[Directive]) -> Res<Option<ClientAuth>> {
        let base = self.dir_of(d.span());
        let (mut ca, mut crls, mut required) = (None, Vec::new(), true);
        for i in items {
            no_block(i)?;
            match i.name.text.as_str() {
                "client_ca" => ca = Some((base.join(&one_arg(i, "client_ca FILE")?.text), i)),
                "client_auth" => {
                    required = match one_arg(i, "client_auth require|optional")?.text.as_str() {
                        "require" => true,
                        "optional" => false,
                        _ => return Err(expected(&i.args[0], "`require` or `optional`")),
                    }
                }
                "client_crl" if !i.args.is_empty() => {
                    crls.extend(i.args.iter().map(|w| base.join(&w.text)))
                }
                "client_crl" => return Err(missing(i, "client_crl FILE...", "client_crl ca.crl")),
                other => {
                    return Err(Diagnostic::error(
                        i.span(),
                        format!("`{other}` is not a tls setting"),
                    )
                    .with_hint("a tls block takes: client_ca, client_auth, client_crl"))
                }
            }
        }
        let Some((ca, line)) = ca else {
            return match items.first() {
                Some(i) => Err(Diagnostic::error(
                    i.span(),
                    "client certificates need `client_ca FILE`",
                )
                .with_hint(
                    "name the CA that issues your clients' certificates: client_ca clients-ca.pem",
                )),
                None => Ok(None),
            };
        };
        let verifier = crate::config::certs::client_verifier(&ca, &crls, required)
            .map_err(|e| Diagnostic::error(line.span(), e.to_string()).with_hint(e.hint()))?;
        Ok(Some(ClientAuth { verifier, required }))
    }

    /// Reads each item of `d`'s block that belongs in `place` and is not a repeat,
    /// with `read`; its error is pushed and the next item read.
    fn block_options(
        &mut self,
        d: &Directive,
        place: Place,
        mut read: impl FnMut(&Directive) -> Res<()>,
    ) {
        let mut seen = Seen::default();
        for item in d.block.as_deref().unwrap_or(&[]) {
            if self.known_here(item, place) && self.once(&mut seen, item) {
                let r = read(item);
                self.push(r);
            }
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

/// How one option of `global { … }` is read.
type GlobalOption = fn(&mut Builder, &Directive, &mut Global) -> Res<()>;

/// `redis_ca FILE`'s bytes, read once: the PEM checked is the PEM kept.
fn redis_ca(w: &Word, path: &std::path::Path) -> Res<Vec<u8>> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let hint = "give the PEM certificate of the CA that issued your Redis servers' certificates";
    let pem = std::fs::read(path).map_err(|e| {
        Diagnostic::error(w.span, format!("{}: {e}", path.display())).with_hint(hint)
    })?;
    if !CertificateDer::pem_slice_iter(&pem).any(|c| c.is_ok()) {
        return Err(Diagnostic::error(
            w.span,
            format!("{}: no PEM certificate in the file", path.display()),
        )
        .with_hint(hint));
    }
    Ok(pem)
}

/// Every option of `global { … }` with its parser.
static GLOBAL_OPTIONS: &[(&str, GlobalOption)] = &[
    ("workers", |_, d, g| {
        int_in(one_arg(d, "workers N")?, 1, 1024).map(|n| g.workers = Some(n as usize))
    }),
    ("grace", |_, d, g| {
        duration(one_arg(d, "grace 10s")?).map(|t| g.grace = t)
    }),
    ("probe_concurrency", |_, d, g| {
        int_in(one_arg(d, "probe_concurrency N")?, 1, 10_000)
            .map(|n| g.probe_concurrency = n as usize)
    }),
    ("trust", trust),
    ("access_log", access_log),
    ("redis_timeout", |_, d, g| {
        positive(one_arg(d, "redis_timeout 50ms")?).map(|t| g.redis_timeout = t)
    }),
    ("redis_ca", |b, d, g| {
        let w = one_arg(d, "redis_ca FILE")?;
        let path = b.dir_of(d.span()).join(&w.text);
        redis_ca(w, &path).map(|pem| g.redis_ca = Some(std::sync::Arc::new(pem)))
    }),
    ("spool_max", |_, d, g| {
        values::size(one_arg(d, "spool_max SIZE")?).map(|n| g.spool_max = n.max(1))
    }),
    ("max_tunnels", |_, d, g| {
        int_in(one_arg(d, "max_tunnels N")?, 1, 10_000_000).map(|n| g.max_tunnels = n)
    }),
    ("tunnel_drain", |_, d, g| {
        duration(one_arg(d, "tunnel_drain 1h")?).map(|t| g.tunnel_drain = t)
    }),
    ("tunnel_idle", |_, d, g| {
        positive(one_arg(d, "tunnel_idle 1h")?).map(|t| g.tunnel_idle = t)
    }),
    ("log_format", |_, d, g| {
        let w = one_arg(d, "log_format text|json")?;
        g.log_json = match w.text.as_str() {
            "json" => true,
            "text" => false,
            _ => return Err(expected(w, "`text` or `json`")),
        };
        Ok(())
    }),
    ("tracing", tracing),
    ("pid_file", |b, d, g| {
        let w = one_arg(d, "pid_file /run/sluice.pid")?;
        g.pid_file = Some(b.dir_of(d.span()).join(&w.text));
        Ok(())
    }),
    ("server_tokens", |_, d, g| {
        route::on_off(d).map(|on| g.server_tokens = on)
    }),
    ("resolver", |_, d, g| {
        no_block(d)?;
        if d.args.is_empty() {
            let usage = "resolver ADDR...";
            return Err(missing(d, usage, "resolver 10.0.0.2 10.0.0.3:5353"));
        }
        g.resolver = d.args.iter().map(dns_server).collect::<Res<_>>()?;
        Ok(())
    }),
    ("safety", |b, d, g| b.global_safety(d, &mut g.safety)),
    ("proxy_defaults", |b, d, _| b.proxy_defaults(d)),
    ("retries", |b, d, g| {
        let w = one_arg(d, "retries off")?;
        if w.text != "off" {
            return Err(expected(w, "`off`").with_hint(
                "a pool's own count goes in its proxy block: proxy ADDR { retries 1 }",
            ));
        }
        g.retries_off = true;
        b.retries_off = true;
        Ok(())
    }),
    ("admin", admin),
    ("fleet", fleet),
    ("acme", |b, d, g| b.acme(d, g)),
    ("verify_key", |_, d, _| {
        Err(Diagnostic::error(d.span(), "`verify_key` cannot be in the config it verifies")
            .with_hint("anyone who can change the file could change the key too: pass it on the command line, sluice run --verify-key FILE"))
    }),
];

/// `admin ADDR [{ token_file FILE | token VALUE }] | off`. An address off loopback
/// without a token is an error: the API can reload the config.
fn admin(b: &mut Builder, d: &Directive, g: &mut Global) -> Res<()> {
    const USAGE: &str = "admin ADDR [{ token_file FILE }] | admin off";
    let [w] = d.args.as_slice() else {
        return Err(match d.args.get(1) {
            Some(x) => extra(x, USAGE),
            None => missing(d, USAGE, "admin 127.0.0.1:2019"),
        });
    };
    if w.text == "off" {
        no_block(d)?;
        g.admin = None;
        return Ok(());
    }
    let addr = listen_addr(w)?.0;
    let mut token = None;
    for item in d.block.as_deref().unwrap_or(&[]) {
        if !b.known_here(item, Place::Admin) {
            continue;
        }
        if token.is_some() {
            return Err(
                Diagnostic::error(item.span(), "the admin API has one token")
                    .with_hint("keep one of token_file and token"),
            );
        }
        token = Some(b.admin_token(item)?);
    }
    let loopback = addr.ip().to_canonical().is_loopback();
    if token.is_none() && !loopback {
        return Err(Diagnostic::error(
            w.span,
            format!("the admin API on {} (off loopback) has no token", w.text),
        )
        .with_hint("anyone who reaches it could reload or switch sites off: add { token_file /etc/sluice/admin.token }, or keep it on 127.0.0.1"));
    }
    g.admin = Some(addr);
    g.admin_token = token;
    Ok(())
}

/// `tls on_demand { ask URL }`: the URL a name is checked with before a certificate
/// is ordered for it (`URL?domain=NAME`, 2xx allows).
fn on_demand(d: &Directive) -> Res<CertSource> {
    const EXAMPLE: &str = "tls on_demand { ask http://127.0.0.1:9000/allowed }";
    let items = d.block.as_deref().unwrap_or(&[]);
    let mut ask = None;
    for i in items {
        match i.name.text.as_str() {
            "ask" => {
                let w = one_arg(i, "ask URL")?;
                if !(w.text.starts_with("http://") || w.text.starts_with("https://")) {
                    return Err(expected(w, "an http:// or https:// URL")
                        .with_hint("sluice asks URL?domain=NAME and orders only on a 2xx answer"));
                }
                ask = Some(w.text.clone());
            }
            other => {
                return Err(Diagnostic::error(
                    i.span(),
                    format!("`{other}` is not an on_demand setting"),
                )
                .with_hint("on_demand takes: ask URL"))
            }
        }
    }
    let ask = ask.ok_or_else(|| {
        Diagnostic::error(d.end_span(), "`tls on_demand` needs `ask URL`").with_hint(format!(
            "without it anyone could make sluice order certificates for any name: {EXAMPLE}"
        ))
    })?;
    Ok(CertSource::OnDemand { ask })
}

/// `fleet redis://… { name NAME; channel NAME }` (DESIGN §18.6).
fn fleet(b: &mut Builder, d: &Directive, g: &mut Global) -> Res<()> {
    const USAGE: &str = "fleet redis://HOST:PORT [{ name NAME; channel NAME }]";
    let w = match d.args.as_slice() {
        [w] => w,
        [_, x, ..] => return Err(extra(x, USAGE)),
        [] => {
            return Err(missing(
                d,
                USAGE,
                "fleet rediss://:{$REDIS_PASSWORD}@redis.internal:6380",
            ))
        }
    };
    let url = filters::redis_url(w)?;
    let mut fleet = FleetConfig {
        url,
        name: host_name(),
        channel: "sluice".into(),
    };
    for item in d.block.as_deref().unwrap_or(&[]) {
        if !b.known_here(item, Place::Fleet) {
            continue;
        }
        let usage = format!("{} NAME", item.name.text);
        let v = one_arg(item, &usage)?;
        if v.text.is_empty()
            || !v
                .text
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
        {
            return Err(expected(v, "a name of letters, digits, `.`, `_` and `-`")
                .with_hint("it is part of the fleet's Redis keys: name edge-eu-1"));
        }
        match item.name.text.as_str() {
            "name" => fleet.name = v.text.clone(),
            _ => fleet.channel = v.text.clone(),
        }
    }
    g.fleet = Some(fleet);
    Ok(())
}

/// This machine's name, the default name of a fleet member.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() {
        "sluice".into()
    } else {
        name
    }
}

/// `trust CIDR...`: warned about when it believes every client.
fn trust(b: &mut Builder, d: &Directive, g: &mut Global) -> Res<()> {
    if d.args.is_empty() {
        return Err(missing(d, "trust CIDR...", "trust 10.0.0.0/8 192.168.1.5"));
    }
    for w in &d.args {
        let net = cidr(w)?;
        if net.prefix_len() == 0 {
            b.warnings.push(
                Diagnostic::warning(
                    w.span,
                    format!(
                        "`trust {}` believes forwarding headers from every client",
                        w.text
                    ),
                )
                .with_hint("name only your own proxies' addresses"),
            );
        }
        g.trust.push(net);
    }
    Ok(())
}

/// `tracing on|off`, or `tracing otlp URL [{ sample F; service NAME; headers { … } }]`.
fn tracing(_: &mut Builder, d: &Directive, g: &mut Global) -> Res<()> {
    const USAGE: &str = "tracing on|off | tracing otlp http://HOST:4318/v1/traces { sample 0.1 }";
    if d.args.first().map(|w| w.text.as_str()) != Some("otlp") {
        g.tracing = route::on_off(d)?;
        return Ok(());
    }
    let w = match d.args.as_slice() {
        [_, w] => w,
        [_, _, x, ..] => return Err(extra(x, USAGE)),
        _ => {
            return Err(missing(
                d,
                USAGE,
                "tracing otlp http://127.0.0.1:4318/v1/traces",
            ))
        }
    };
    let url = w
        .text
        .parse::<http::Uri>()
        .ok()
        .filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
    let Some(url) = url else {
        return Err(expected(w, "the collector's OTLP/HTTP URL")
            .with_hint("e.g. tracing otlp http://127.0.0.1:4318/v1/traces"));
    };
    let mut otlp = OtlpConfig {
        url,
        sample_ppm: 1_000_000,
        service: "sluice".into(),
        headers: Vec::new(),
    };
    for item in d.block.as_deref().unwrap_or(&[]) {
        otlp_option(item, &mut otlp)?;
    }
    g.tracing = true;
    g.otlp = Some(otlp);
    Ok(())
}

/// One line of `tracing otlp URL { … }`.
fn otlp_option(item: &Directive, otlp: &mut OtlpConfig) -> Res<()> {
    match item.name.text.as_str() {
        "sample" => {
            let w = one_arg(item, "sample 0.1")?;
            let f = w
                .text
                .parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f));
            let f = f.ok_or_else(|| {
                expected(w, "a share of traces from 0 to 1")
                    .with_hint("sample 1 records every trace, sample 0.01 one in a hundred")
            })?;
            otlp.sample_ppm = (f * 1e6).round() as u32;
        }
        "service" => otlp.service = one_arg(item, "service NAME")?.text.clone(),
        "headers" => {
            for h in block(item, "headers { x-api-key {$OTLP_KEY} }")? {
                let v = one_arg(h, "NAME VALUE")?;
                let name = http::HeaderName::from_bytes(h.name.text.as_bytes())
                    .map_err(|_| expected(&h.name, "a header name"))?;
                let value = http::HeaderValue::from_str(&v.text)
                    .map_err(|_| expected(v, "a header value"))?;
                otlp.headers.push((name, value));
            }
        }
        other => {
            return Err(Diagnostic::error(
                item.name.span,
                format!("unknown `{other}` in tracing otlp"),
            )
            .with_hint("tracing otlp URL takes: sample, service, headers"))
        }
    }
    Ok(())
}

/// `access_log stdout|stderr|off|FILE [json|text|combined|common|"TEMPLATE"]`.
fn access_log(b: &mut Builder, d: &Directive, g: &mut Global) -> Res<()> {
    g.access_log = access_log_of(b, d)?;
    Ok(())
}

/// An `access_log` line, in `global` or a site (`None`: `off`).
fn access_log_of(b: &Builder, d: &Directive) -> Res<Option<AccessLogConfig>> {
    const USAGE: &str =
        "access_log stdout|stderr|off|FILE [json|text|combined|common|\"TEMPLATE\"]";
    no_block(d)?;
    let [t, rest @ ..] = d.args.as_slice() else {
        return Err(missing(d, USAGE, "access_log stdout"));
    };
    let format = match rest {
        [] => AccessFormat::Json,
        [f] => match f.text.as_str() {
            "json" => AccessFormat::Json,
            "text" => AccessFormat::Text,
            "combined" => AccessFormat::Combined,
            "common" => AccessFormat::Common,
            _ if f.quoted => AccessFormat::Template(std::sync::Arc::new(log_template(f)?)),
            _ => {
                return Err(expected(
                    f,
                    "`json`, `text`, `combined`, `common` or a quoted \"TEMPLATE\"",
                ))
            }
        },
        [_, x, ..] => return Err(extra(x, USAGE)),
    };
    let target = match t.text.as_str() {
        "off" => return Ok(None),
        "stdout" => LogTarget::Stdout,
        "stderr" => LogTarget::Stderr,
        file => LogTarget::File(b.dir_of(d.span()).join(file)),
    };
    Ok(Some(AccessLogConfig { target, format }))
}

/// An access log template, its unknown placeholder refused with the known ones.
fn log_template(w: &crate::config::parser::Word) -> Res<crate::config::template::LogTemplate> {
    use crate::config::template::{LogField, LogTemplate};
    LogTemplate::parse(&w.text).map_err(|e| {
        let names = LogField::ALL.iter().map(|(n, _)| *n);
        values::unknown_placeholder(w, &e.0, names, "and a request header's {header.NAME}")
    })
}

#[cfg(test)]
mod tests;

//! Site and route tables, and finding the site and route for a request on its
//! normalised host and path (`path`).
//!
//! Sites: exact host (a hash lookup), then the longest `*.suffix`, then `*`. Routes
//! within a site are sorted when the table is built: exact paths first, then regexes,
//! then prefixes longest first, ties in file order (nginx's order); the first whose pattern and matchers all pass
//! wins. The tables hold compiled filters and handlers; `runtime` builds them.

pub(crate) mod path;

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, StatusCode};

use crate::config::{Maintenance, PathPattern, Template};
use crate::filter::cond::{header_matches, query_matches};
use crate::filter::Stage;
use crate::upstream::Pool;

pub(crate) struct Sites {
    hosts: HostIndex,
    pub list: Vec<Site>,
}

/// Host patterns to an index, matched as site names are: the exact name, then the
/// longest `*.suffix`, then `*`. The site table, the certificates by SNI and a `tcp`
/// listener's `sni` pools all look names up with it.
#[derive(Default)]
pub(crate) struct HostIndex {
    exact: HashMap<Box<[u8]>, usize>,
    /// `(".example.com", index)`, longest suffix first.
    suffixes: Vec<(Box<[u8]>, usize)>,
    any: Option<usize>,
}

impl HostIndex {
    /// Whether a `*` entry answers every name.
    pub(crate) fn has_any(&self) -> bool {
        self.any.is_some()
    }

    /// Adds `hosts` (lower-case; `*.suffix` as `.suffix`) for `idx`; an exact name
    /// already taken keeps its first index.
    pub(crate) fn add(&mut self, hosts: &[crate::config::HostPattern], idx: usize) {
        use crate::config::HostPattern;
        for h in hosts {
            match h {
                HostPattern::Exact(name) => {
                    self.exact.entry(name.as_bytes().into()).or_insert(idx);
                }
                HostPattern::Suffix(sfx) => self.suffixes.push((sfx.as_bytes().into(), idx)),
                HostPattern::Any => self.any = Some(idx),
            }
        }
        self.suffixes
            .sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
    }

    /// The index for a normalised (lower-case, no trailing dot) host.
    #[inline]
    pub(crate) fn find(&self, host: &[u8]) -> Option<usize> {
        if let Some(&i) = self.exact.get(host) {
            return Some(i);
        }
        self.suffixes
            .iter()
            .find(|(sfx, _)| host.len() > sfx.len() && host.ends_with(sfx))
            .map(|(_, i)| *i)
            .or(self.any)
    }
}

pub(crate) struct Site {
    pub name: String,
    /// Every name of the site as written, lower case (`*`, `*.example.com` too).
    pub hosts: Vec<String>,
    pub routes: Vec<Route>,
    /// `POST /maintenance` for this site since the last reload.
    pub maintenance: Toggle,
    /// The site's own `maintenance` (what routes without their own answer).
    pub own_maintenance: Option<Arc<Maintenance>>,
    /// `https_redirect`: the status and the TLS port.
    pub https_redirect: Option<(StatusCode, u16)>,
    /// `hsts`: the `Strict-Transport-Security` value for responses over TLS.
    pub hsts: Option<http::HeaderValue>,
    pub versions: crate::config::HttpVersions,
    /// Verifies client certificates: served only over a TLS connection made for it.
    pub client_auth: bool,
    /// A version excluded, `https_redirect` or client certificates: checked before
    /// the route is found.
    pub early_controls: bool,
    /// The site's `error_page` lines, for requests no route takes.
    pub error_pages: Option<Arc<crate::reply::ErrorPages>>,
    /// Requests of the site no route took, counted while the admin API is on.
    pub meter: Option<Arc<crate::stats::Meter>>,
    /// The site's own `access_log` (or `off`).
    pub log: Option<crate::access::SiteLog>,
    /// No route of the site is chosen by a field and it has no redirect to HTTPS: a
    /// request's fields as they came can wait until its route is known
    /// ([`Route::defers_fields`]). A log line reads them as they came.
    pub defers_fields: bool,
}

/// A site's maintenance switch at run time: as configured, or forced on or off by the
/// admin API until the next reload.
#[derive(Default)]
pub(crate) struct Toggle(std::sync::atomic::AtomicU8);

const AS_CONFIGURED: u8 = 0;
const FORCED_ON: u8 = 1;
const FORCED_OFF: u8 = 2;

impl Toggle {
    pub(crate) fn set(&self, on: bool) {
        let v = if on { FORCED_ON } else { FORCED_OFF };
        self.0.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    fn get(&self) -> u8 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub(crate) struct Route {
    pub name: String,
    pub pattern: PathPattern,
    pub matchers: Vec<Matcher>,
    /// In written order; the proxy's own `max_body` comes last.
    pub filters: Vec<Stage>,
    /// Some filter or condition decides on the client's address.
    pub uses_client_ip: bool,
    pub handler: Handler,
    /// Some filter or the handler renders placeholders from the request as received.
    pub uses_placeholders: bool,
    /// Compress responses the client accepts compressed (unless a `compress` filter
    /// that runs says otherwise).
    pub compress: crate::config::Compression,
    /// `compress` or a `compress on` filter: the request's `Accept-Encoding` is kept.
    pub may_compress: bool,
    /// The route's `maintenance`, else its site's.
    pub maintenance: Option<Arc<Maintenance>>,
    /// The route's `error_page` lines, then its site's for the codes it lacks.
    pub error_pages: Option<Arc<crate::reply::ErrorPages>>,
    /// Every `copy_headers` name of the route's (and its site's) `forward_auth`
    /// lines: removed from each request before the filters run, so only an auth
    /// service's answer sets them, whether or not the filter runs.
    pub auth_headers: Box<[HeaderName]>,
    /// Its requests, counted while the admin API is on.
    pub meter: Option<Arc<crate::stats::Meter>>,
    /// `cache { … }`: between the filters and the handler.
    pub cache: Option<crate::cache::Cache>,
    /// The route's (first) `challenge`, for `/status`.
    pub challenge: Option<Arc<crate::filter::challenge::Challenge>>,
    /// Nothing of the route reads or changes a proxied answer's fields but framing
    /// and compression's look at its type ([`Route::leaves_fields`]): an HTTP/1
    /// client may get them as the backend sent them.
    pub fields_as_sent: bool,
    /// Nothing of the route reads a request field but what the fields as they came
    /// answer ([`Route::reads_no_field`]): an HTTP/1 request keeps them so, and no map
    /// is built for it.
    pub defers_fields: bool,
}

impl Route {
    /// Whether the route leaves a proxied answer's fields alone: no filter (none
    /// runs on the way back), no cache, no error page, and a proxy without
    /// `header_down` or origin headers. The site's HSTS and `Alt-Svc` are decided per
    /// request.
    pub(crate) fn leaves_fields(&self) -> bool {
        self.filters.is_empty()
            && self.cache.is_none()
            && self.error_pages.is_none()
            && matches!(&self.handler, Handler::Proxy(p)
                if p.cfg.header_down.is_empty() && !p.cfg.origin_headers)
    }
}

impl Route {
    /// The route with what it is judged by at load filled in
    /// ([`Route::fields_as_sent`], [`Route::defers_fields`]).
    pub(crate) fn judged(mut self) -> Route {
        self.fields_as_sent = self.leaves_fields();
        self.defers_fields = self.reads_no_field();
        self
    }

    /// Whether the route reads no request field but routing's `Host`, compression's
    /// `Accept-Encoding` and `Authorization`, and what the proxy reads of a pool that
    /// writes the client's lines ([`Pool::writes_lines`]): no filter, no cache, no
    /// placeholder or client address taken from the request.
    pub(crate) fn reads_no_field(&self) -> bool {
        self.filters.is_empty()
            && self.cache.is_none()
            && !self.uses_placeholders
            && !self.uses_client_ip
            && self.auth_headers.is_empty()
            && matches!(&self.handler, Handler::Proxy(p) if p.writes_lines())
    }
}

pub(crate) enum Matcher {
    Method(Vec<Method>),
    /// Value `*` matches any value of a present header.
    Header(HeaderName, String),
    /// Value `*` matches any value of a present parameter.
    Query(String, String),
}

pub(crate) enum Handler {
    Proxy(Arc<Pool>),
    Respond {
        status: StatusCode,
        body: Template,
    },
    Redirect {
        status: StatusCode,
        target: Template,
    },
    Files(Arc<crate::config::FilesConfig>),
    FastCgi(Arc<crate::fastcgi::FastCgi>),
    /// A route with filters but no handler answers 404.
    None,
}

/// What a route's matchers look at.
pub(crate) struct Probe<'a> {
    pub path: &'a str,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
}

impl Sites {
    pub(crate) fn new() -> Sites {
        Sites {
            hosts: HostIndex::default(),
            list: Vec::new(),
        }
    }

    /// Adds a site answering for `hosts` (lower-case; `*.suffix` as `.suffix`).
    pub(crate) fn add(&mut self, hosts: &[crate::config::HostPattern], mut site: Site) {
        self.hosts.add(hosts, self.list.len());
        // Stable: ties keep file order.
        site.routes.sort_by_key(|r| match &r.pattern {
            PathPattern::Exact(_) => (0, 0),
            PathPattern::Regex(_) => (1, 0),
            PathPattern::Prefix(p) => (2, usize::MAX - p.len()),
        });
        self.list.push(site);
    }

    /// The site for a normalised host ([`path::normalize_host`]).
    pub(crate) fn find(&self, host: &[u8]) -> Option<&Site> {
        self.hosts.find(host).map(|i| &self.list[i])
    }

    pub(crate) fn routes(&self) -> impl Iterator<Item = &Route> {
        self.list.iter().flat_map(|s| s.routes.iter())
    }

    /// Every FastCGI handler, with its pool.
    pub(crate) fn fastcgi(&self) -> impl Iterator<Item = &crate::fastcgi::FastCgi> {
        self.routes().filter_map(|r| match &r.handler {
            Handler::FastCgi(f) => Some(&**f),
            _ => None,
        })
    }

    pub(crate) fn pools(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.routes().filter_map(|r| match &r.handler {
            Handler::Proxy(p) => Some(p),
            _ => None,
        })
    }
}

impl Default for Sites {
    fn default() -> Self {
        Self::new()
    }
}

impl Site {
    /// What `route` answers while in maintenance, if it is (`None`: no route
    /// matched): its own or the site's setting; forced on without one, the default
    /// answer; forced off, nothing.
    #[inline]
    pub(crate) fn maintenance_for<'s>(
        &'s self,
        route: Option<&'s Route>,
    ) -> Option<&'s Maintenance> {
        static DEFAULT: std::sync::OnceLock<Maintenance> = std::sync::OnceLock::new();
        let configured = match route {
            Some(r) => r.maintenance.as_deref(),
            None => self.own_maintenance.as_deref(),
        };
        match self.maintenance.get() {
            AS_CONFIGURED => configured,
            FORCED_ON => {
                Some(configured.unwrap_or_else(|| DEFAULT.get_or_init(Maintenance::default_answer)))
            }
            _ => None,
        }
    }

    /// Whether the site is in maintenance as `/status` shows it: forced, or by its own
    /// `maintenance` line.
    pub(crate) fn in_maintenance(&self) -> bool {
        match self.maintenance.get() {
            AS_CONFIGURED => self.own_maintenance.is_some(),
            v => v == FORCED_ON,
        }
    }

    /// The first route whose pattern (on the normalised path) and matchers pass.
    pub(crate) fn find(&self, probe: &Probe<'_>) -> Option<&Route> {
        self.routes
            .iter()
            .find(|r| r.pattern.matches(probe.path) && r.matchers.iter().all(|m| m.passes(probe)))
    }
}

impl Matcher {
    fn passes(&self, p: &Probe<'_>) -> bool {
        match self {
            Matcher::Method(ms) => ms.contains(p.method),
            Matcher::Header(name, want) => header_matches(p.headers, name, want),
            Matcher::Query(name, want) => query_matches(p.query, name, want),
        }
    }
}

//! From the validated config model to a generation: site and route tables with their
//! compiled matchers, filters and handlers, and a pool for every `proxy` line — given
//! the previous generation, whose pools of unchanged identity hand over their state.
//! Must run inside the tokio runtime (new pools start their reaper).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::carry::{Filled, Kept};
use super::{certs, Generation};
use crate::config::{self, Compression, Config};
use crate::filter::access::Access;
use crate::filter::basic_auth::BasicAuth;
use crate::filter::body_deny::BodyDeny;
use crate::filter::compress::Compress;
use crate::filter::cond::{Condition, ResponseCondition, ResponseTest, Test};
use crate::filter::conn::{ConnGuard, ConnGuards};
use crate::filter::cors::Cors;
use crate::filter::header_down::HeaderDown;
use crate::filter::max_body::MaxBody;
use crate::filter::rate_limit::{self, RateLimit};
use crate::filter::request_id::RequestId;
use crate::filter::rewrite::Rewrite;
use crate::filter::strip::Strip;
use crate::filter::{Action, Filter, Stage};
use crate::route::{Handler, Matcher, Route, Site, Sites};
use crate::safety::{Dns, Policy};
use crate::stats::Meter;
use crate::upstream::dial::Dest;
use crate::upstream::discover::Discovery;
use crate::upstream::{Pool, PoolId, PoolState};

/// The ACME manager when some site has `tls auto`: the previous generation's while the
/// `acme` settings are the same.
fn acme_manager(config: &Config, kept: &Filled) -> Option<Arc<crate::acme::Manager>> {
    let auto = config.sites.iter().any(|s| {
        s.tls.as_ref().is_some_and(|t| {
            matches!(
                t.source,
                config::CertSource::Auto { .. } | config::CertSource::OnDemand { .. }
            )
        })
    });
    let acme = &config.global.acme;
    auto.then(|| {
        kept.acme.take((), |before| match before {
            Some(m) if m.serves(acme) => m.clone(),
            _ => crate::acme::Manager::new(acme, before.map(|m| &**m)),
        })
    })
}

impl Generation {
    /// Compiles `config`; what `previous` holds under an identity this one keeps is
    /// carried (`runtime::carry`).
    pub(crate) fn compile(config: &Config, previous: Option<&Generation>) -> Generation {
        process_wide(config);
        let kept = Kept::fill(previous.map(|g| &g.kept));
        // One process-wide cap on probes at once, carried from generation to generation.
        let probe_slots = kept.probe_slots.take((), |before| {
            before
                .cloned()
                .unwrap_or_else(|| Arc::new(Semaphore::new(config.global.probe_concurrency)))
        });
        // The resolver (and its cache) lives as long as its servers stay the same.
        let servers = &config.global.resolver;
        let dns = kept.dns.take(servers.clone(), |before| {
            before
                .cloned()
                .unwrap_or_else(|| Arc::new(Dns::new(servers)))
        });
        let shared = Shared {
            kept: &kept,
            metered: config.global.admin.is_some(),
            fastcgi_seen: Default::default(),
            auth_pools: Default::default(),
            namespaces: Default::default(),
            publishing: Default::default(),
            pool_ids: Default::default(),
            probe_slots: &probe_slots,
            dns: &dns,
            policy: Arc::new(config.safety_policy()),
            config,
        };
        let mut sites = Sites::new();
        for s in &config.sites {
            sites.add(&s.hosts, site(s, &shared));
        }
        let tcp = tcp_routes(config, &shared);
        let listen_guards = listen_guards(config, &shared);
        shared.publish();
        let auth_pools = shared.auth_pools.take();
        drop(shared);
        let acme = acme_manager(config, &kept);
        let tls = if config.listeners.iter().any(|l| l.tls) {
            let stapler = |site: &str| {
                kept.staplers.take(site.to_string(), |before| {
                    before.cloned().unwrap_or_default()
                })
            };
            certs::build(&config.sites, acme.as_ref(), &stapler)
        } else {
            None
        };
        let sends_proxy_protocol = sites.pools().any(|p| p.cfg.proxy_protocol.is_some());
        let tracer = config.global.otlp.as_ref().map(|c| {
            kept.tracers.take(c.clone(), |before| {
                before
                    .cloned()
                    .unwrap_or_else(|| crate::otel::Tracer::new(c))
            })
        });
        let defers_fields = defers_fields(config, tracer.is_some(), &sites);
        Generation {
            sends_proxy_protocol,
            kept: kept.done(),
            tls,
            sites,
            tcp,
            listen_guards,
            trust: config.global.trust.clone(),
            tracing: config.global.tracing,
            tracer,
            max_tunnels: config.global.max_tunnels,
            tunnel_drain: config.global.tunnel_drain,
            tunnel_idle: config.global.tunnel_idle,
            metered: config.global.admin.is_some(),
            defers_fields,
            auth_pools,
            acme_http01: acme.clone().filter(|m| m.config.http01),
            acme,
        }
    }

    /// Every meter, once (routes of one site and pattern share theirs), with its
    /// labels and the pool it feeds; the one for answers no site took last. Nothing
    /// when requests are not metered.
    pub(crate) fn meters(&self) -> impl Iterator<Item = Metered<'_>> {
        let mut seen = std::collections::HashSet::new();
        let unrouted = self.metered.then(|| Metered {
            site: "",
            route: "",
            pool: None,
            meter: &crate::stats::UNROUTED,
            challenge: None,
        });
        self.sites
            .list
            .iter()
            .flat_map(|s| {
                let own = s.meter.iter().map(|meter| Metered {
                    site: &s.name,
                    route: "",
                    pool: None,
                    meter,
                    challenge: None,
                });
                let routes = s.routes.iter().filter_map(|r| {
                    Some(Metered {
                        site: &s.name,
                        route: route_label(&s.name, &r.name),
                        pool: match &r.handler {
                            Handler::Proxy(p) => Some(p.name()),
                            Handler::FastCgi(f) => Some(f.name.as_str()),
                            _ => None,
                        },
                        meter: r.meter.as_ref()?,
                        challenge: r.challenge.as_deref(),
                    })
                });
                own.chain(routes)
            })
            .filter(move |m| seen.insert(Arc::as_ptr(m.meter)))
            .chain(unrouted)
    }
}

/// A meter and what it counts: `site` and `route` labels (`""` for requests no route,
/// or no site, took), and the pool its route hands requests to.
pub(crate) struct Metered<'g> {
    pub site: &'g str,
    pub route: &'g str,
    pub pool: Option<&'g str>,
    pub meter: &'g Arc<Meter>,
    /// The route's `challenge`.
    pub challenge: Option<&'g crate::filter::challenge::Challenge>,
}

/// A route's `route` label: its pattern as written, `/*` for the site block's own.
pub(crate) fn route_label<'a>(site: &str, route: &'a str) -> &'a str {
    match route.strip_prefix(site).map(str::trim_start) {
        Some("") => "/*",
        Some(pattern) => pattern,
        None => route,
    }
}

/// The stores each purge publisher of one generation applies purges to, by URL.
type Publishing = HashMap<String, (Arc<crate::cache::Publisher>, Vec<Arc<crate::cache::Store>>)>;

/// What every pool and filter of one generation is built with.
struct Shared<'a> {
    /// The state this generation keeps, from the previous one's by identity.
    kept: &'a Filled<'a>,
    /// The admin API is on: sites and routes get meters.
    metered: bool,
    /// The pools `forward_auth` filters ask, as they are built.
    auth_pools: std::cell::RefCell<Vec<Arc<Pool>>>,
    /// How many cache routes of each name so far (their keys' namespaces).
    namespaces: std::cell::RefCell<HashMap<String, usize>>,
    /// The purge publishers, with the stores each serves.
    publishing: std::cell::RefCell<Publishing>,
    /// How many pools of each identity this generation has so far.
    pool_ids: std::cell::RefCell<HashMap<PoolId, usize>>,
    /// How many FastCGI routes of each name so far.
    fastcgi_seen: std::cell::RefCell<HashMap<String, usize>>,
    probe_slots: &'a Arc<Semaphore>,
    dns: &'a Arc<Dns>,
    /// The destination policy strict pools share.
    policy: Arc<Policy>,
    config: &'a Config,
}

impl Shared<'_> {
    /// A site's own access log: the writer already running for the same destination
    /// and format (in this generation or the last), else a new one. The lifecycle
    /// checked the file opens before compiling; a writer that still cannot start is
    /// logged, and the site's lines go nowhere.
    fn site_log(&self, l: &config::SiteLog) -> crate::access::SiteLog {
        use crate::access::{AccessLog, SiteLog};
        let config::SiteLog::To(cfg) = l else {
            return SiteLog(None);
        };
        let mut failed = None;
        let log = self
            .kept
            .site_logs
            .take(cfg.clone(), |before| match before {
                Some(b) => b.clone(),
                None => AccessLog::start(cfg.clone()).unwrap_or_else(|e| {
                    failed = Some(e);
                    AccessLog::discard()
                }),
            });
        if let Some(e) = failed {
            tracing::error!("sluice: a site's access_log cannot be written: {e}");
        }
        SiteLog(Some(log))
    }
}

impl Shared<'_> {
    /// A Redis client's identity: its URL and, for `rediss://`, the `redis_ca` it
    /// trusts (a changed CA makes a new client: the old one trusts the old).
    fn redis_key(&self, url: &str) -> (String, Option<Arc<Vec<u8>>>) {
        let ca = url
            .starts_with("rediss://")
            .then(|| self.config.global.redis_ca.clone())
            .flatten();
        (url.to_string(), ca)
    }

    /// Tells each purge publisher the stores it now serves.
    fn publish(&self) {
        for (p, stores) in self.publishing.take().into_values() {
            p.serve(stores);
        }
    }

    /// A route's FastCGI handler, on the previous generation's pool of the same route
    /// (and occurrence) when it reaches the same application the same way: resized to
    /// the new `max_conns`.
    fn fastcgi(&self, r: &config::Route, c: &config::FastCgiConfig) -> crate::fastcgi::FastCgi {
        let mut seen = self.fastcgi_seen.borrow_mut();
        let n = seen.entry(r.name.clone()).or_insert(0);
        let key = (r.name.clone(), *n);
        *n += 1;
        let app = self.kept.fastcgi_apps.take(c.target.clone(), |before| {
            before.cloned().unwrap_or_default()
        });
        let pool = self.kept.fastcgi.take(key, |before| {
            crate::fastcgi::pool::Pool::carry(before, c, self.dns, &app)
        });
        crate::fastcgi::FastCgi::new(r.name.clone(), c.clone(), pool)
    }

    /// A route's cache, on the store of its `store` setting: one per setting, carried
    /// from the previous generation when it had the same one.
    fn cache(
        &self,
        c: &config::CacheConfig,
        route: &str,
        meter: Option<Arc<Meter>>,
    ) -> crate::cache::Cache {
        let store = self.kept.stores.take(c.store.identity(), |before| {
            before
                .cloned()
                .unwrap_or_else(|| crate::cache::Store::new(&c.store))
        });
        if let Some(url) = &c.purge_store {
            let publisher = self.kept.publishers.take(self.redis_key(url), |before| {
                before
                    .cloned()
                    .unwrap_or_else(|| crate::cache::Publisher::new(url))
            });
            let mut publishing = self.publishing.borrow_mut();
            let (_, stores) = publishing
                .entry(url.clone())
                .or_insert_with(|| (publisher, Vec::new()));
            if !stores.iter().any(|s| Arc::ptr_eq(s, &store)) {
                stores.push(store.clone());
            }
        }
        store.resize(match &c.store {
            config::CacheStore::Memory(n) | config::CacheStore::Disk(_, n) => *n,
        });
        // Routes of one name (one pattern, told apart by matchers) are numbered.
        let mut seen = self.namespaces.borrow_mut();
        let n = seen.entry(route.to_string()).or_insert(0);
        *n += 1;
        let namespace = match *n {
            1 => route.to_string(),
            k => format!("{route}#{k}"),
        };
        crate::cache::Cache::new(c, store, namespace, meter)
    }

    /// The identity of a pool named `name`, told apart from this generation's other
    /// pools that would otherwise share it.
    fn pool_id(&self, name: String, cfg: &config::ProxyConfig) -> PoolId {
        let mut id = PoolId::new(name, cfg);
        let mut seen = self.pool_ids.borrow_mut();
        let n = seen.entry(id.clone()).or_insert(0);
        id.occurrence = *n;
        *n += 1;
        id
    }

    /// A `tcp` block's `allow`, `deny` and `rate_limit` lines, compiled.
    /// A listener's connection guards, named `name` (`tcp ADDR` for a `tcp` block,
    /// `ADDR` for an HTTP listener), with the refusals its predecessor counted.
    fn conn_guards(&self, name: String, filters: &[config::Filter]) -> ConnGuards {
        let guards = filters
            .iter()
            .filter_map(|g| match g {
                config::Filter::Allow(n) => Some(ConnGuard::Allow(n.clone())),
                config::Filter::Deny(n) => Some(ConnGuard::Deny(n.clone())),
                config::Filter::RateLimit(rl) => {
                    Some(ConnGuard::Rate(self.rate(rl, None, true, &name)))
                }
                _ => None,
            })
            .collect();
        let refused = self
            .kept
            .refused
            .take(name.clone(), |before| before.cloned().unwrap_or_default());
        ConnGuards {
            name,
            guards,
            refused,
        }
    }

    /// A `rate_limit` filter named `name` (if it is) on `route`, with the buckets of
    /// the previous generation's filter of the same identity (a second filter of one
    /// identity on a route gets its own).
    fn rate(
        &self,
        rl: &config::RateLimit,
        name: Option<&str>,
        failure_open: bool,
        route: &str,
    ) -> RateLimit {
        let store = match &rl.store {
            Some(url) => {
                let key = (self.redis_key(url), failure_open);
                rate_limit::Store::Redis(self.kept.redis.take(key, |before| {
                    before
                        .cloned()
                        .unwrap_or_else(|| rate_limit::Redis::start(url, failure_open))
                }))
            }
            None => {
                let base = RateLimit::identity(rl, name, route);
                // A second filter of one identity on a route gets buckets of its own.
                let id = (0..)
                    .map(|k| format!("{base}#{k}"))
                    .find(|id| !self.kept.rates.has(id))
                    .expect("an unused identity");
                rate_limit::Store::Memory(self.kept.rates.take(id, |before| {
                    before
                        .cloned()
                        .unwrap_or_else(|| Arc::new(rate_limit::Memory::new()))
                }))
            }
        };
        RateLimit::new(rl, name, route, store)
    }

    /// A pool named `name`, with the state of the previous generation's pool of its
    /// identity.
    /// A `challenge`'s keys: the process's random one, or its `secret_file`'s, carried
    /// across reloads with the nonces used.
    fn challenge_keys(&self, c: &config::ChallengeConfig) -> Arc<crate::filter::challenge::Keys> {
        use crate::filter::challenge::Keys;
        match &c.secret {
            None => Keys::process(),
            Some(s) => self.kept.challenge_keys.take(s.clone(), |before| {
                before.cloned().unwrap_or_else(|| Keys::new(Some(s)))
            }),
        }
    }

    fn pool(&self, name: String, cfg: &config::ProxyConfig) -> Arc<Pool> {
        let id = self.pool_id(name, cfg);
        let dest = self.dest(cfg);
        // A discovered pool's identity is its source; its peers are the last answer.
        let discovery = cfg.discover.as_ref().map(|d| {
            let key = (d.clone(), self.config.global.resolver.clone());
            self.kept.discovery.take(key, |before| match before {
                Some(found) => found.clone(),
                None => Discovery::start(d, self.dns.clone()),
            })
        });
        let found = discovery.as_ref().map(|d| d.apply(cfg));
        let cfg = found.as_ref().unwrap_or(cfg);
        let state = self.kept.pools.take(id.clone(), |before| {
            PoolState::carry(before, &id, cfg, &dest, self.probe_slots)
        });
        Pool::build(id, cfg.clone(), state, dest, discovery)
    }

    /// The meter of `site`'s `route` (labels), the previous generation's if it had
    /// one; `None` when nothing is metered.
    fn meter(&self, site: &str, route: &str) -> Option<Arc<Meter>> {
        let key = (site.to_string(), route.to_string());
        self.metered.then(|| {
            self.kept
                .meters
                .take(key, |before| before.cloned().unwrap_or_default())
        })
    }

    /// The resolver, and the policy when `p` is strict.
    fn dest(&self, p: &config::ProxyConfig) -> Dest {
        Dest {
            dns: self.dns.clone(),
            policy: self.config.is_strict(p).then(|| self.policy.clone()),
            dns_budget: crate::safety::BUDGET.min(p.timeout),
        }
    }
}

/// What the process has one of, set by the generation being made before anything of
/// it is built: a Redis store's CA and check deadline (before its client is made), the
/// FastCGI spool budget.
fn process_wide(config: &Config) {
    crate::net::redis::configure(config.global.redis_timeout, config.global.redis_ca.clone());
    crate::fastcgi::spool::set_budget(config.global.spool_max);
}

/// The `tcp` listeners' routes, each pool with its predecessor's state.
fn tcp_routes(config: &Config, shared: &Shared) -> Vec<Arc<crate::l4::Route>> {
    config
        .tcp
        .iter()
        .map(|t| {
            Arc::new(crate::l4::Route {
                addr: t.listen.addr,
                pools: t
                    .pools
                    .iter()
                    .map(|p| {
                        let mut name = format!("tcp {}", t.listen.text);
                        if let Some(first) = p.sni.first() {
                            name.push_str(&format!(" sni {}", first));
                        }
                        crate::l4::Target {
                            sni: p.sni.clone(),
                            pool: shared.pool(name, &p.proxy),
                            idle_timeout: p.idle_timeout,
                        }
                    })
                    .collect(),
                names: tcp_names(&t.pools),
                max_conns: t.max_conns,
                guards: shared.conn_guards(format!("tcp {}", t.listen.text), &t.guards),
            })
        })
        .collect()
}

/// The HTTP listeners' connection guards (`listen ADDR { allow …; … }`).
fn listen_guards(config: &Config, shared: &Shared) -> Vec<(std::net::SocketAddr, ConnGuards)> {
    config
        .listeners
        .iter()
        .filter(|l| !l.guards.is_empty())
        .map(|l| (l.addr, shared.conn_guards(l.text.clone(), &l.guards)))
        .collect()
}

/// A `tcp` block's `sni` names to their pool's index; the bare `proxy` as `*`.
fn tcp_names(pools: &[config::TcpPool]) -> crate::route::HostIndex {
    let mut names = crate::route::HostIndex::default();
    for (i, p) in pools.iter().enumerate() {
        match p.sni.is_empty() {
            true => names.add(&[config::HostPattern::Any], i),
            false => names.add(&p.sni, i),
        }
    }
    names
}

/// A route's handler; a proxy's own `max_body` joins `filters` as the last.
fn handler(r: &config::Route, shared: &Shared, filters: &mut Vec<Stage>) -> Handler {
    match &r.handler {
        Some(config::Handler::Proxy(p)) => {
            // The proxy's own `max_body` runs as the route's last filter: one place.
            if let Some(max) = p.max_body {
                filters.push(Stage::plain(
                    Arc::new(MaxBody { max }),
                    "the proxy's max_body",
                ));
            }
            Handler::Proxy(shared.pool(r.name.clone(), p))
        }
        Some(config::Handler::Respond { status, body }) => Handler::Respond {
            status: *status,
            body: body.clone(),
        },
        Some(config::Handler::Redirect { status, target }) => Handler::Redirect {
            status: *status,
            target: target.clone(),
        },
        Some(config::Handler::Files(f)) => Handler::Files(Arc::new(f.clone())),
        Some(config::Handler::FastCgi(c)) => Handler::FastCgi(Arc::new(shared.fastcgi(r, c))),
        None => Handler::None,
    }
}

/// [`Generation::defers_fields`]: nothing global reads a request's fields before its
/// route is known (access logs read the fields as they came), and some route has use
/// for them kept (else every request would pay for fields kept only to be made into
/// its map).
fn defers_fields(config: &Config, traced: bool, sites: &Sites) -> bool {
    !config.global.tracing
        && !traced
        && config.global.trust.is_empty()
        && sites.routes().any(|r| r.defers_fields)
}

/// A site: its routes, and its controls (maintenance, redirect, HSTS, versions).
fn site(s: &config::Site, shared: &Shared) -> Site {
    let own = s.maintenance.clone().map(Arc::new);
    let client_auth = s.tls.as_ref().is_some_and(|t| t.client.is_some());
    // Compiled once: a site's `rate_limit` is one set of buckets for all its routes.
    let first = FromSite {
        stages: s
            .filters
            .iter()
            .map(|l| stage(l, &s.name, shared))
            .collect(),
        lines: &s.filters,
        error_pages: &s.error_pages,
        name: &s.name,
    };
    let routes: Vec<Route> = s
        .routes
        .iter()
        .map(|r| route(r, shared, own.as_ref(), &first))
        .collect();
    let routed_by_fields = routes.iter().any(|r| {
        r.matchers
            .iter()
            .any(|m| matches!(m, crate::route::Matcher::Header(..)))
    });
    Site {
        // The redirect to HTTPS reads `Host` before the route is known.
        defers_fields: !routed_by_fields && s.https_redirect.is_none(),
        name: s.name.clone(),
        hosts: s
            .host_words
            .iter()
            .map(|(w, _)| w.to_ascii_lowercase())
            .collect(),
        routes,
        maintenance: Default::default(),
        own_maintenance: own,
        https_redirect: s.https_redirect.as_ref().map(|r| (r.status, r.port)),
        hsts: s
            .hsts
            .as_ref()
            .and_then(|h| http::HeaderValue::from_str(&h.value()).ok()),
        versions: s.versions,
        client_auth,
        early_controls: s.https_redirect.is_some()
            || !(s.versions.h1 && s.versions.h2)
            || client_auth,
        error_pages: error_pages(&[], &s.error_pages),
        meter: shared.meter(&s.name, ""),
        log: s.access_log.as_ref().map(|l| shared.site_log(l)),
    }
}

/// A route's `error_page` lines, then its site's for the codes it has no page for.
fn error_pages(
    own: &[config::ErrorPage],
    site: &[config::ErrorPage],
) -> Option<Arc<crate::reply::ErrorPages>> {
    let page = |p: &config::ErrorPage, codes: Vec<http::StatusCode>| crate::reply::ErrorPage {
        codes,
        body: p.body.clone(),
        content_type: p.content_type.clone(),
        backend: p.backend,
    };
    let mut pages: Vec<_> = own.iter().map(|p| page(p, p.codes.clone())).collect();
    for p in site {
        let codes: Vec<_> = p
            .codes
            .iter()
            .filter(|c| !own.iter().any(|o| o.codes.contains(c)))
            .copied()
            .collect();
        if !codes.is_empty() {
            pages.push(page(p, codes));
        }
    }
    crate::reply::ErrorPages::new(pages)
}

/// What a site gives each of its routes: its filters (run before the route's own)
/// and its error pages.
struct FromSite<'a> {
    name: &'a str,
    stages: Vec<Stage>,
    lines: &'a [config::FilterLine],
    error_pages: &'a [config::ErrorPage],
}

impl FromSite<'_> {
    /// The site's stages, then `own` (a route's), with every `skip_to` renumbered for
    /// the joined list: a site filter's `skip_to handler` passes the route's filters
    /// too; a route filter's target moves past the site's.
    fn join(&self, own: Vec<Stage>) -> Vec<Stage> {
        let (site, all) = (self.stages.len(), self.stages.len() + own.len());
        let renumber = |st: &mut Stage, f: &dyn Fn(usize) -> usize| {
            for a in [&mut st.on_pass, &mut st.on_refuse].into_iter().flatten() {
                if let Action::SkipTo(i) = a {
                    *i = f(*i);
                }
            }
        };
        let mut joined = Vec::with_capacity(all + 1);
        for mut st in self.stages.iter().cloned() {
            renumber(&mut st, &|i| if i == site { all } else { i });
            joined.push(st);
        }
        for mut st in own {
            renumber(&mut st, &|i| i + site);
            joined.push(st);
        }
        joined
    }
}

/// `site_maintenance`: the site's own `maintenance`, for a route without one.
fn route(
    r: &config::Route,
    shared: &Shared,
    site_maintenance: Option<&Arc<config::Maintenance>>,
    site: &FromSite<'_>,
) -> Route {
    let own: Vec<Stage> = r
        .filters
        .iter()
        .map(|l| stage(l, &r.name, shared))
        .collect();
    let mut filters = site.join(own);
    // A `compress` filter that runs decides; else the proxy's own setting; else on.
    let compress = match &r.handler {
        Some(config::Handler::Proxy(p)) => p.compress,
        _ => Compression::On,
    };
    let handler = handler(r, shared, &mut filters);
    let challenge = bind_challenges(r, site, &handler, &mut filters);
    let maintenance = match &r.maintenance {
        Some(m) => Some(Arc::new(m.clone())),
        None => site_maintenance.cloned(),
    };
    let uses_client_ip = filters.iter().any(Stage::uses_client_ip)
        || maintenance.as_ref().is_some_and(|m| !m.allow.is_empty());
    let may_compress = compress != Compression::Off
        || site
            .lines
            .iter()
            .chain(&r.filters)
            .any(|l| matches!(l.filter, config::Filter::Compress(m) if m != Compression::Off));
    let uses_placeholders = filters.iter().any(|f| f.filter.uses_placeholders())
        || match &handler {
            Handler::Respond { body: t, .. } | Handler::Redirect { target: t, .. } => {
                t.has_placeholders()
            }
            Handler::Proxy(p) => p
                .cfg
                .header_up
                .iter()
                .chain(&p.cfg.header_down)
                .any(|op| op.has_placeholders()),
            Handler::None | Handler::Files(_) | Handler::FastCgi(_) => false,
        };
    let meter = shared.meter(site.name, route_label(site.name, &r.name));
    Route {
        name: r.name.clone(),
        pattern: r.pattern.clone(),
        matchers: r.matchers.iter().map(matcher).collect(),
        filters,
        uses_client_ip,
        may_compress,
        handler,
        uses_placeholders,
        compress,
        maintenance,
        error_pages: error_pages(&r.error_pages, site.error_pages),
        auth_headers: site
            .lines
            .iter()
            .chain(&r.filters)
            .flat_map(|l| match &l.filter {
                config::Filter::ForwardAuth(f) => f.copy_headers.clone(),
                config::Filter::Jwt(j) => {
                    j.claims_to_headers.iter().map(|(_, f)| f.clone()).collect()
                }
                _ => Vec::new(),
            })
            .collect(),
        cache: r
            .cache
            .as_ref()
            .map(|c| shared.cache(c, &r.name, meter.clone())),
        challenge,
        meter,
        fields_as_sent: false,
        defers_fields: false,
    }
    .judged()
}

/// Each `challenge` of the route (its site's included) made again for this route: it
/// switches on the route's own pool's load. The first, for `/status`.
fn bind_challenges(
    r: &config::Route,
    site: &FromSite<'_>,
    handler: &Handler,
    filters: &mut [Stage],
) -> Option<Arc<crate::filter::challenge::Challenge>> {
    let limit = match handler {
        Handler::Proxy(p) => p.limit.clone(),
        _ => None,
    };
    let mut first = None;
    let lines = site.lines.iter().chain(&r.filters);
    for (st, line) in filters.iter_mut().zip(lines) {
        if let config::Filter::Challenge(_) = &line.filter {
            let Some(c) = st.filter.challenge() else {
                continue;
            };
            let bound = Arc::new(c.on_route(limit.clone()));
            st.filter = bound.clone();
            first.get_or_insert(bound);
        }
    }
    first
}

/// A `jwt` filter, its JWKS URL's key set carried across reloads.
fn jwt(c: &config::JwtConfig, shared: &Shared) -> crate::filter::jwt::Jwt {
    let jwks = match &c.keys {
        config::JwtKeys::Url(url) => {
            let set = shared.kept.jwks.take(url.clone(), |before| {
                before
                    .cloned()
                    .unwrap_or_else(|| crate::filter::jwt::Jwks::from_url(url, c.refresh))
            });
            set.refresh_every(c.refresh);
            Some(set)
        }
        _ => None,
    };
    crate::filter::jwt::Jwt::new(c, jwks)
}

/// A filter line, compiled: its filter, condition, failure mode and branches.
fn stage(line: &config::FilterLine, route: &str, shared: &Shared) -> Stage {
    let filter: Arc<dyn Filter> = match &line.filter {
        config::Filter::Strip(prefix) => Arc::new(Strip {
            prefix: prefix.clone(),
        }),
        config::Filter::Rewrite { from, to } => Arc::new(Rewrite {
            from: from.clone(),
            to: to.clone(),
        }),
        config::Filter::HeaderDown(op) => Arc::new(HeaderDown { op: op.clone() }),
        config::Filter::MaxBody(max) => Arc::new(MaxBody { max: *max }),
        config::Filter::Compress(mode) => Arc::new(Compress { mode: *mode }),
        config::Filter::RequestId => Arc::new(RequestId),
        config::Filter::GrpcWeb => Arc::new(crate::filter::grpc_web::GrpcWeb),
        config::Filter::Allow(nets) => Arc::new(Access {
            nets: nets.clone(),
            allow: true,
        }),
        config::Filter::Deny(nets) => Arc::new(Access {
            nets: nets.clone(),
            allow: false,
        }),
        config::Filter::RateLimit(rl) => {
            Arc::new(shared.rate(rl, line.name.as_deref(), line.failure_open, route))
        }
        config::Filter::BasicAuth { users, realm } => Arc::new(BasicAuth::new(users, realm)),
        config::Filter::Cors(c) => Arc::new(Cors::new(c)),
        config::Filter::BodyDeny(text) => Arc::new(BodyDeny::new(text.as_bytes())),
        config::Filter::Jwt(c) => Arc::new(jwt(c, shared)),
        config::Filter::Challenge(c) => Arc::new(crate::filter::challenge::Challenge::new(
            c,
            shared.challenge_keys(c),
        )),
        config::Filter::ForwardAuth(f) => {
            let name = format!("{route} forward_auth");
            let pool = shared.pool(name, &f.pool);
            shared.auth_pools.borrow_mut().push(pool.clone());
            Arc::new(crate::proxy::auth::ForwardAuth::new(f, pool))
        }
    };
    let (passed, refused) = line.filter.results().unwrap_or(("", ""));
    let branch = |result: &str| {
        line.branches
            .iter()
            .find(|b| b.result == result)
            .and_then(|b| match b.action {
                config::BranchAction::SkipTo(i) => Some(Action::SkipTo(i)),
                config::BranchAction::Reject(code) => Some(Action::Reject(code)),
                config::BranchAction::RejectResponse(..) => None,
            })
    };
    let on_matched = line.branches.iter().find_map(|b| match &b.action {
        config::BranchAction::RejectResponse(code, body) => {
            let text = match body {
                Some(t) => t.clone(),
                None => format!("{}\n", code.canonical_reason().unwrap_or("Rejected")),
            };
            Some((*code, bytes::Bytes::from(text)))
        }
        _ => None,
    });
    Stage {
        condition: line.condition.as_ref().map(condition),
        response: line.response.as_ref().map(|r| ResponseCondition {
            negate: r.negate,
            test: match &r.test {
                config::ResponseTest::Status(sets) => ResponseTest::Status(sets.clone()),
                config::ResponseTest::Header(n, v) => ResponseTest::Header(n.clone(), v.clone()),
            },
        }),
        on_matched,
        failure_open: line.failure_open,
        on_pass: branch(passed),
        on_refuse: branch(refused),
        name: line.filter.name(),
        line: line.span.line,
        filter,
    }
}

fn matcher(m: &config::Matcher) -> Matcher {
    match m {
        config::Matcher::Method(ms) => Matcher::Method(ms.clone()),
        config::Matcher::Header(n, v) => Matcher::Header(n.clone(), v.clone()),
        config::Matcher::Query(n, v) => Matcher::Query(n.clone(), v.clone()),
    }
}

/// A filter line's `when …` / `unless …`, as the filter stage tests it.
pub(crate) fn condition(c: &config::Condition) -> Condition {
    Condition {
        negate: c.negate,
        test: match &c.test {
            config::Test::Path(p) => Test::Path(p.clone()),
            config::Test::ClientIp(nets) => Test::ClientIp(nets.clone()),
            config::Test::ClientCert => Test::ClientCert,
            config::Test::Claim { claim, values } => Test::Claim(claim.clone(), values.clone()),
            config::Test::Match(config::Matcher::Method(ms)) => Test::Method(ms.clone()),
            config::Test::Match(config::Matcher::Header(n, v)) => {
                Test::Header(n.clone(), v.clone())
            }
            config::Test::Match(config::Matcher::Query(n, v)) => Test::Query(n.clone(), v.clone()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(text: &str, previous: Option<&Generation>) -> Generation {
        let c = config::load_text("t.conf", text).unwrap().config;
        Generation::compile(&c, previous)
    }

    #[tokio::test]
    async fn pools_are_carried_by_identity() {
        let a = gen(
            "site a { route /x/* { proxy 127.0.0.1:1 } proxy 127.0.0.1:2 }",
            None,
        );
        let b = gen(
            "site a { route /x/* { proxy 127.0.0.1:1 { timeout 5s } } proxy 127.0.0.1:3 }",
            Some(&a),
        );
        let state = |g: &Generation, name: &str| {
            g.pools()
                .find(|p| p.name() == name)
                .map(|p| p.state.clone())
                .unwrap()
        };
        assert!(
            Arc::ptr_eq(&state(&a, "a /x/*"), &state(&b, "a /x/*")),
            "same identity, new settings: state carried"
        );
        assert!(
            !Arc::ptr_eq(&state(&a, "a"), &state(&b, "a")),
            "other addresses: a fresh pool"
        );
        let live = super::super::Live::new(a);
        let old_site_pool = state(&live.load(), "a");
        live.swap(b);
        assert!(
            old_site_pool.is_retired(),
            "the dropped pool is retired at the swap"
        );
        assert!(!state(&live.load(), "a /x/*").is_retired());
    }

    /// Two pools that would share an identity (one pattern, told apart by `match`
    /// lines) each carry their own state to their own successor: health, counters
    /// and `limit` are never merged by a reload.
    #[tokio::test]
    async fn alike_pools_keep_their_own_state_across_a_reload() {
        let text = "site * {\n route /api/* { match method GET\n proxy 127.0.0.1:1 { limit 1 } }\n route /api/* { match method POST\n proxy 127.0.0.1:1 { limit 5 } }\n}\n";
        let one = gen(text, None);
        let two = gen(text, Some(&one));
        let before: Vec<&Arc<Pool>> = one.pools().collect();
        let after: Vec<&Arc<Pool>> = two.pools().collect();
        assert_eq!(after.len(), 2);
        assert!(!Arc::ptr_eq(&after[0].state, &after[1].state), "two states");
        for (b, a) in before.iter().zip(&after) {
            assert!(
                Arc::ptr_eq(&b.state, &a.state),
                "each carried to its successor"
            );
        }
        let caps: Vec<usize> = after
            .iter()
            .map(|p| p.limit.as_ref().unwrap().max())
            .collect();
        assert_eq!(caps, [1, 5]);
    }
}

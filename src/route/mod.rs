//! Site and route matching, compiled once per load.
//!
//! Sites: exact host (a hash lookup), then the longest `*.suffix`, then `*`; compared
//! case-insensitively without port. Routes within a site are sorted at load: exact
//! paths first, then prefixes longest first, ties in file order; the first whose
//! pattern and matchers all pass wins.

pub mod template;

use std::collections::HashMap;
use std::sync::Arc;

use http::{Request, StatusCode};

use crate::body::Body;
use crate::config::{self, Filter, HostPattern, Matcher, PathPattern, Template};
use crate::upstream::Pool;

pub struct Sites {
    exact: HashMap<String, usize>,
    /// `(".example.com", site)`, longest suffix first.
    suffixes: Vec<(String, usize)>,
    any: Option<usize>,
    pub list: Vec<Site>,
}

pub struct Site {
    pub name: String,
    pub routes: Vec<Route>,
}

pub struct Route {
    pub name: String,
    pub pattern: PathPattern,
    pub matchers: Vec<Matcher>,
    pub filters: Vec<Filter>,
    pub handler: Handler,
    /// A filter or the handler renders placeholders from the request as received.
    pub uses_placeholders: bool,
}

pub enum Handler {
    Proxy(Arc<Pool>),
    Respond {
        status: StatusCode,
        body: Template,
    },
    Redirect {
        status: StatusCode,
        target: Template,
    },
    /// A route with filters but no handler answers 404.
    None,
}

impl Sites {
    /// Compiles the sites; creates a pool for every `proxy` line.
    pub fn compile(sites: &[config::Site]) -> Sites {
        let mut exact = HashMap::new();
        let mut suffixes = Vec::new();
        let mut any = None;
        let mut list = Vec::with_capacity(sites.len());
        for (idx, s) in sites.iter().enumerate() {
            for h in &s.hosts {
                match h {
                    HostPattern::Exact(name) => {
                        exact.insert(name.clone(), idx);
                    }
                    HostPattern::Suffix(sfx) => suffixes.push((sfx.clone(), idx)),
                    HostPattern::Any => any = Some(idx),
                }
            }
            let mut routes: Vec<Route> = s
                .routes
                .iter()
                .map(|r| Route {
                    name: r.name.clone(),
                    pattern: r.pattern.clone(),
                    matchers: r.matchers.clone(),
                    filters: r.filters.clone(),
                    uses_placeholders: r
                        .filters
                        .iter()
                        .any(|f| matches!(f, Filter::Rewrite { .. }))
                        || matches!(
                            &r.handler,
                            Some(
                                config::Handler::Respond { .. } | config::Handler::Redirect { .. }
                            )
                        ),
                    handler: match &r.handler {
                        Some(config::Handler::Proxy(p)) => {
                            Handler::Proxy(Pool::new(r.name.clone(), (**p).clone()))
                        }
                        Some(config::Handler::Respond { status, body }) => Handler::Respond {
                            status: *status,
                            body: body.clone(),
                        },
                        Some(config::Handler::Redirect { status, target }) => Handler::Redirect {
                            status: *status,
                            target: target.clone(),
                        },
                        None => Handler::None,
                    },
                })
                .collect();
            // Stable: ties keep file order.
            routes.sort_by_key(|r| match &r.pattern {
                PathPattern::Exact(_) => (0, 0),
                PathPattern::Prefix(p) => (1, usize::MAX - p.len()),
            });
            list.push(Site {
                name: s.name.clone(),
                routes,
            });
        }
        suffixes.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        Sites {
            exact,
            suffixes,
            any,
            list,
        }
    }

    /// The site for a Host (port and case already removed by [`host_of`]).
    pub fn find(&self, host: &str) -> Option<&Site> {
        if let Some(&i) = self.exact.get(host) {
            return Some(&self.list[i]);
        }
        self.suffixes
            .iter()
            .find(|(sfx, _)| host.len() > sfx.len() && host.ends_with(sfx.as_str()))
            .map(|(_, i)| &self.list[*i])
            .or_else(|| self.any.map(|i| &self.list[i]))
    }

    pub fn pools(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.list
            .iter()
            .flat_map(|s| s.routes.iter())
            .filter_map(|r| match &r.handler {
                Handler::Proxy(p) => Some(p),
                _ => None,
            })
    }
}

impl Site {
    pub fn find(&self, req: &Request<Body>) -> Option<&Route> {
        let path = req.uri().path();
        self.routes
            .iter()
            .find(|r| r.pattern.matches(path) && r.matchers.iter().all(|m| matcher_passes(m, req)))
    }
}

fn matcher_passes(m: &Matcher, req: &Request<Body>) -> bool {
    match m {
        Matcher::Method(ms) => ms.contains(req.method()),
        Matcher::Header(name, want) => req
            .headers()
            .get_all(name)
            .iter()
            .any(|v| want == "*" || v.as_bytes() == want.as_bytes()),
        Matcher::Query(name, want) => req.uri().query().is_some_and(|q| {
            q.split('&').any(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                k == name && (want == "*" || v == want)
            })
        }),
    }
}

/// The request's host, lower-cased, without port: from the URI (HTTP/2, absolute
/// form) or the Host field. Borrows unless the host has upper-case letters.
pub fn host_of(req: &Request<Body>) -> std::borrow::Cow<'_, str> {
    let raw = req
        .uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| {
            req.headers()
                .get(http::header::HOST)
                .and_then(|v| v.to_str().ok())
        })
        .unwrap_or("");
    let host = strip_port(raw);
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

fn strip_port(h: &str) -> &str {
    // Drop userinfo, if an absolute-form URI carried any.
    let h = h.rsplit_once('@').map_or(h, |(_, rest)| rest);
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match h.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_brackets() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("[::1]:8080"), "::1");
        assert_eq!(strip_port("example.com"), "example.com");
    }
}

//! The pipeline: find the site and route, run the route's filters on the request in
//! written order, call the handler, then run the filters that ran on the response in
//! reverse order.
//!
//! Filters built so far: `strip`, `rewrite`, `max_body` (request side) and
//! `header_down` (response side). A filter never buffers a body.

use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri};
use http_body::Body as _;

use crate::body::Body;
use crate::config::{under_prefix, Filter, PathPattern};
use crate::proxy;
use crate::route::template::{render, Values};
use crate::route::{host_of, Handler};
use crate::runtime::{local_response, Generation};
use crate::server::ClientAddr;
use crate::stats::{bump, COUNTERS};

pub async fn run(gen: &Generation, mut req: Request<Body>, client: &ClientAddr) -> Response<Body> {
    // HTTP/2 carries the host in :authority; backends and rules expect a Host field.
    if !req.headers().contains_key(header::HOST) {
        if let Some(v) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, v);
        }
    }
    let route = {
        let host = host_of(&req);
        let Some(site) = gen.sites.find(&host) else {
            bump(&COUNTERS.unknown_site);
            return local_response(StatusCode::MISDIRECTED_REQUEST, "unknown site\n");
        };
        let Some(route) = site.find(&req) else {
            bump(&COUNTERS.no_route);
            return local_response(StatusCode::NOT_FOUND, "Not found\n");
        };
        route
    };
    // Placeholders speak of the request as received; keep its URI only when needed.
    let original = route.uses_placeholders.then(|| req.uri().clone());
    for f in &route.filters {
        match f {
            Filter::Strip(prefix) => strip(&mut req, prefix),
            Filter::Rewrite { from, to } => {
                if from.matches(req.uri().path()) {
                    let target = rewrite_target(from, to, &host_of(&req), req.uri());
                    set_path(&mut req, &target);
                }
            }
            Filter::MaxBody(max) => {
                if let Some(resp) = proxy::check_declared_body(&req, *max) {
                    return resp;
                }
                if !req.body().is_end_stream() {
                    req = req.map(|b| b.limited(*max));
                }
            }
            Filter::HeaderDown(_) => {}
        }
    }
    let host = if original.is_some() {
        host_of(&req).into_owned()
    } else {
        String::new()
    };
    let original = original.unwrap_or_default();
    let values = Values {
        host: &host,
        uri: &original,
    };
    let mut resp = match &route.handler {
        Handler::Proxy(pool) => {
            let c = proxy::Client {
                addr: client,
                trusted: gen.is_trusted(client.addr),
            };
            proxy::forward(pool, req, &c).await
        }
        Handler::Respond { status, body } => {
            let mut r = Response::new(Body::full(render(body, &values)));
            *r.status_mut() = *status;
            if !body.parts.is_empty() {
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
            }
            r
        }
        Handler::Redirect { status, target } => {
            let mut r = Response::new(Body::Empty);
            *r.status_mut() = *status;
            if let Ok(v) = HeaderValue::from_str(&render(target, &values)) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        Handler::None => {
            bump(&COUNTERS.no_route);
            local_response(StatusCode::NOT_FOUND, "Not found\n")
        }
    };
    for f in route.filters.iter().rev() {
        if let Filter::HeaderDown(op) = f {
            crate::proxy::headers::apply(resp.headers_mut(), std::slice::from_ref(op));
        }
    }
    resp
}

/// Removes `prefix` from the path at a segment boundary; an emptied path becomes `/`.
fn strip(req: &mut Request<Body>, prefix: &str) {
    let path = req.uri().path();
    if !under_prefix(prefix, path) {
        return;
    }
    let rest = &path[prefix.len()..];
    let new = if rest.is_empty() {
        "/".to_string()
    } else {
        rest.to_string()
    };
    let with_query = match req.uri().query() {
        Some(q) => format!("{new}?{q}"),
        None => new,
    };
    set_path(req, &with_query);
}

/// `rewrite /old /new`: the path becomes the target. `rewrite /old/* /new/*`: the prefix
/// is replaced and the rest kept. A target without `?` keeps the request's query.
fn rewrite_target(
    from: &PathPattern,
    to: &crate::config::Template,
    host: &str,
    uri: &Uri,
) -> String {
    let rendered = render(to, &Values { host, uri });
    let mut target = match (from, rendered.strip_suffix("/*")) {
        (PathPattern::Prefix(p), Some(new_prefix)) => {
            format!("{new_prefix}{}", &uri.path()[p.len()..])
        }
        _ => rendered,
    };
    if target.is_empty() {
        target.push('/');
    }
    if !target.contains('?') {
        if let Some(q) = uri.query() {
            target.push('?');
            target.push_str(q);
        }
    }
    target
}

fn set_path(req: &mut Request<Body>, path_and_query: &str) {
    let Ok(pq) = PathAndQuery::try_from(path_and_query) else {
        return;
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(pq);
    if let Ok(u) = Uri::from_parts(parts) {
        *req.uri_mut() = u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Template, TemplatePart};

    fn t(s: &str) -> Template {
        Template {
            parts: vec![TemplatePart::Text(s.into())],
        }
    }

    #[test]
    fn rewrites() {
        let uri: Uri = "/old/a/b?x=1".parse().unwrap();
        let from = PathPattern::Prefix("/old".into());
        assert_eq!(
            rewrite_target(&from, &t("/new/*"), "h", &uri),
            "/new/a/b?x=1"
        );
        let uri: Uri = "/old".parse().unwrap();
        assert_eq!(
            rewrite_target(
                &PathPattern::Exact("/old".into()),
                &t("/new?y=2"),
                "h",
                &uri
            ),
            "/new?y=2"
        );
    }

    #[test]
    fn strips_at_segments() {
        let mut r = Request::new(Body::Empty);
        *r.uri_mut() = "/api/users?x=1".parse().unwrap();
        strip(&mut r, "/api");
        assert_eq!(r.uri(), "/users?x=1");
        *r.uri_mut() = "/api".parse().unwrap();
        strip(&mut r, "/api");
        assert_eq!(r.uri(), "/");
        *r.uri_mut() = "/apix".parse().unwrap();
        strip(&mut r, "/api");
        assert_eq!(r.uri(), "/apix");
    }
}

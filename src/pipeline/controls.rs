//! A site's operator controls (DESIGN §15.2, §15.8), decided before any filter: the
//! HTTP versions the site is served over, the redirect of plain requests to HTTPS,
//! maintenance; and HSTS on every response over TLS on the way out. A site without
//! them pays a few flag tests.

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};

use super::{ClientInfo, Scheme};
use crate::body::Body;
use crate::reply::{date, local_response};
use crate::route::{Route, Site};
use crate::runtime::Generation;
use crate::stats::{bump, COUNTERS};

/// Marks a response the HTTP/2 server turns into `RST_STREAM(HTTP_1_1_REQUIRED)`:
/// the site is not served over HTTP/2.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Http11Required;

/// Where ACME HTTP-01 challenges are asked: never redirected.
const ACME_CHALLENGES: &str = crate::acme::HTTP01_PREFIX;

/// `tls auto` sites answer HTTP-01 challenges, and this request on a plain listener
/// asks for one.
#[inline]
pub(super) fn acme_challenge(
    gen: &Generation,
    client: &ClientInfo,
    req: &Request<Body>,
) -> Option<std::sync::Arc<crate::acme::Manager>> {
    let acme = gen.acme_http01.as_ref()?;
    let asks = client.scheme == Scheme::Http && req.uri().path().starts_with(ACME_CHALLENGES);
    asks.then(|| acme.clone())
}

/// Before the site is looked up, on a plain listener: the answer to an HTTP-01
/// challenge an order of `tls auto` is waiting for (`200`, the key authorization).
/// Anything else under the challenge path goes on to the site's routes (an ACME
/// client of a backend, certbot's webroot, keeps working).
pub(super) async fn acme_http01(acme: &crate::acme::Manager, path: &str) -> Option<Response<Body>> {
    let token = path.strip_prefix(ACME_CHALLENGES)?;
    if token.is_empty()
        || !token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return None;
    }
    // Boxed: the lookup may ask Redis, and the request's future should not carry that
    // state for every request.
    let answer = Box::pin(acme.http01(token)).await?;
    tracing::debug!("sluice: acme: answered an http-01 challenge ({token})");
    let mut r = Response::new(Body::full(answer));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r.headers_mut().insert(header::DATE, date());
    crate::reply::server(r.headers_mut());
    r.extensions_mut().insert(crate::reply::Own);
    Some(r)
}

/// Before the route is found: on a plain listener of a site that redirects to HTTPS,
/// the redirect (to the normalised Host); then, for a site that verifies client
/// certificates, a connection not made for it (`421`); then a request over an HTTP
/// version the site excludes. ACME challenges (`path` is normalised) are neither redirected nor refused
/// for HTTP/1.1.
#[inline]
pub(super) fn before_route(
    site: &Site,
    req: &Request<Body>,
    path: &str,
    client: &ClientInfo,
) -> Option<Response<Body>> {
    if !site.early_controls {
        return None;
    }
    early(site, req, path, client)
}

#[inline(never)]
fn early(
    site: &Site,
    req: &Request<Body>,
    path: &str,
    client: &ClientInfo,
) -> Option<Response<Body>> {
    let acme = path.starts_with(ACME_CHALLENGES);
    // On plain HTTP the redirect comes first: a site served over HTTP/2 only still
    // sends an HTTP/1.1 visitor to HTTPS, and ACME challenges stay reachable.
    if client.scheme == Scheme::Http && !acme {
        if let Some((status, port)) = site.https_redirect {
            let host = crate::route::path::normalize_host(super::host_of(req));
            return Some(to_https(status, port, &host, req));
        }
    }
    // mTLS is decided on the handshake: a connection made for another site's
    // certificate (SNI one name, Host another) or no TLS at all never reaches a site
    // that verifies clients.
    if site.client_auth
        && client
            .tls_client
            .as_ref()
            .is_none_or(|t| t.site != site.name)
    {
        bump(&COUNTERS.bad_request);
        return Some(local_response(
            StatusCode::MISDIRECTED_REQUEST,
            "This site needs a TLS connection made for it (client certificates)\n",
        ));
    }
    let v = site.versions;
    if !v.h1 && req.version() <= Version::HTTP_11 && !acme {
        return Some(local_response(
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            "HTTP version not supported: this site is served over HTTP/2\n",
        ));
    }
    if !v.h2 && req.version() == Version::HTTP_2 {
        let mut r = local_response(
            StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            "HTTP/1.1 required\n",
        );
        r.extensions_mut().insert(Http11Required);
        return Some(r);
    }
    None
}

/// `https://HOST[:PORT]` and the path and query as received.
fn to_https(status: StatusCode, port: u16, host: &str, req: &Request<Body>) -> Response<Body> {
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let location = match port {
        443 => format!("https://{host}{pq}"),
        p => format!("https://{host}:{p}{pq}"),
    };
    let mut r = Response::new(Body::Empty);
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut().insert(header::DATE, date());
    crate::reply::server(r.headers_mut());
    r
}

/// The maintenance answer for `route` (`None`: no route matched), unless the site is
/// not in maintenance or the client (after `trust`) is let through.
#[inline]
pub(super) fn maintenance(
    gen: &Generation,
    site: &Site,
    route: Option<&Route>,
    req: &Request<Body>,
    client: &ClientInfo,
) -> Option<Response<Body>> {
    let m = site.maintenance_for(route)?;
    answer_maintenance(gen, m, req, client)
}

#[inline(never)]
fn answer_maintenance(
    gen: &Generation,
    m: &crate::config::Maintenance,
    req: &Request<Body>,
    client: &ClientInfo,
) -> Option<Response<Body>> {
    if !m.allow.is_empty() {
        let ip = gen.client_ip(client.addr.ip(), req.headers());
        if crate::filter::cond::in_nets(&m.allow, ip) {
            return None;
        }
    }
    bump(&COUNTERS.maintenance_answers);
    let mut r = Response::new(Body::full(m.body.clone()));
    *r.status_mut() = m.status;
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&m.content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("120"));
    h.insert(header::DATE, date());
    crate::reply::server(h);
    Some(r)
}

/// `hsts`: every response over TLS carries it, sluice's own answers included. So does
/// `Alt-Svc` on a TCP TLS listener that has a `quic` twin, for a site served over
/// HTTP/3 (`http_versions` has `3`; a site that verifies client certificates is not:
/// its handshake is TCP's).
#[inline]
pub(super) fn hsts(site: &Site, client: &ClientInfo, resp: &mut Response<Body>) {
    if client.scheme == Scheme::Https {
        if let Some(v) = &site.hsts {
            resp.headers_mut()
                .insert(header::STRICT_TRANSPORT_SECURITY, v.clone());
        }
        if let Some(v) = alt_svc(site, client) {
            resp.headers_mut().insert(header::ALT_SVC, v.clone());
        }
    }
}

/// The `Alt-Svc` a response of `site` gets on this connection, if any.
fn alt_svc<'c>(site: &Site, client: &'c ClientInfo) -> Option<&'c HeaderValue> {
    client
        .alt_svc
        .as_deref()
        .filter(|_| site.versions.h3 && !site.client_auth)
}

/// Whether [`hsts`] adds a field to the site's responses on this connection.
pub(super) fn adds_fields(site: &Site, client: &ClientInfo) -> bool {
    client.scheme == Scheme::Https && (site.hsts.is_some() || alt_svc(site, client).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(port: u16, host: &str, target: &str) -> String {
        let req = Request::get(target).body(Body::Empty).unwrap();
        let r = to_https(StatusCode::PERMANENT_REDIRECT, port, host, &req);
        r.headers()[header::LOCATION].to_str().unwrap().to_string()
    }

    #[test]
    fn the_https_url_names_the_port_unless_443_and_brackets_ipv6() {
        assert_eq!(location(443, "app.test", "/a?b"), "https://app.test/a?b");
        assert_eq!(location(8443, "app.test", "/"), "https://app.test:8443/");
        assert_eq!(location(443, "::1", "/x"), "https://[::1]/x");
        assert_eq!(
            location(8443, "2001:db8::1", "/x"),
            "https://[2001:db8::1]:8443/x"
        );
    }
}

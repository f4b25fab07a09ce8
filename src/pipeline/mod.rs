//! One request's journey: find the site and route on the normalised host and path,
//! run the route's filters' request phase in written order, call the handler, then run
//! the response phase in reverse order for exactly the filters that ran (an early
//! answer included).
//!
//! Each request runs on the generation it started with. Knows no socket: the client's
//! address and scheme arrive as plain values ([`ClientInfo`]).

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri};

use crate::access::Seen;
use crate::body::{take_request, Body};
use crate::config::template::Values;
use crate::config::{Compression, Template};
use crate::filter::hold::{Refused, Stopped};
use crate::filter::{Action, Cx, Stage, Step, Vars, Verified};
use crate::http1::fields::Fields;
use crate::http1::head::{AsSent, SentFields};
use crate::inplace::boxed;
use crate::proxy;
use crate::reply::{date, local_response};
use crate::route::path::{normalize, normalize_host};
use crate::route::{Handler, Probe, Route, Site};
use crate::runtime::{Generation, Live};
use crate::stats::{bump, Meter, COUNTERS, UNROUTED};
pub(crate) use crate::upstream::Served;

mod controls;
pub(crate) use controls::Http11Required;

/// What the connection tells the pipeline about its client, rendered once per
/// connection.
#[derive(Clone)]
pub(crate) struct ClientInfo {
    pub addr: SocketAddr,
    /// The address as a header value, for `X-Forwarded-For`.
    pub ip_value: HeaderValue,
    pub scheme: Scheme,
    /// The TLS handshake was made for a site that verifies client certificates.
    pub tls_client: Option<std::sync::Arc<crate::net::identity::TlsClient>>,
    /// The address the client reached (a PROXY protocol header's destination).
    pub local: Option<SocketAddr>,
    /// Over TLS: the protocol version (`TLSv1.3`), for the access log.
    pub tls: Option<&'static str>,
    /// On a TCP TLS listener that shares its address with a `quic` one: the
    /// `Alt-Svc` its responses carry (for sites served over HTTP/3).
    pub alt_svc: Option<std::sync::Arc<HeaderValue>>,
}

impl ClientInfo {
    /// What the access log records of the connection.
    pub(crate) fn for_log(&self) -> crate::access::Client<'_> {
        crate::access::Client {
            ip: &self.ip_value,
            tls: self.tls,
            scheme: self.scheme.as_str(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.as_str())
    }
}

impl ClientInfo {
    pub(crate) fn new(addr: SocketAddr, scheme: Scheme) -> ClientInfo {
        ClientInfo {
            addr,
            ip_value: ip_value(addr.ip().to_canonical()),
            scheme,
            tls_client: None,
            local: None,
            tls: None,
            alt_svc: None,
        }
    }
}

/// A client's address as a header value, rendered once per connection. IPv4, nearly
/// every client, is written by hand: through `Display` it cost about 1,300
/// instructions a connection (`core::fmt` per octet) and an extra allocation.
fn ip_value(ip: std::net::IpAddr) -> HeaderValue {
    let std::net::IpAddr::V4(v4) = ip else {
        return HeaderValue::from_str(&ip.to_string())
            .expect("an IP address is a valid header value");
    };
    let (mut out, mut n, mut scratch) = ([0u8; 15], 0, [0u8; 20]);
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out[n] = b'.';
            n += 1;
        }
        let digits = crate::http1::encode::itoa_u64(&mut scratch, o.into());
        out[n..n + digits.len()].copy_from_slice(digits);
        n += digits.len();
    }
    HeaderValue::from_bytes(&out[..n]).expect("digits and dots are a valid header value")
}

/// What a request's journey ends with: the response, which pool and peer served it
/// (when asked for), and an upgraded connection to join with the client's (a 101).
pub(crate) struct Answer {
    pub resp: Response<Body>,
    pub served: Option<Served>,
    pub tunnel: Option<Box<crate::tunnel::Tunnel>>,
    /// The meter the response counts on when it is done (the admin API is on).
    pub meter: Option<Arc<Meter>>,
    /// The response's fields as the backend sent them, for an HTTP/1 connection to
    /// write ([`Offer::fields`]); `resp`'s own map then holds only what was added on
    /// the way (nothing, on the routes that take this path).
    pub fields: Option<Box<SentFields>>,
}

/// A request's journey, borrowing its connection's [`ClientInfo`]: an HTTP/1.1
/// connection and an HTTP/2 one (whose streams run in its task) outlive their requests,
/// so these take no copy of it (144 bytes, and a reference count each for its address
/// value, certificate and `Alt-Svc`). HTTP/3 streams, tasks of their own, share their
/// connection's through an `Arc`.
pub(crate) type ResponseFuture<'c> = Pin<Box<dyn Future<Output = Answer> + Send + 'c>>;

/// What the connection can do with a request besides answer it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Offer {
    /// Note which pool and peer served the response (the access log is on).
    pub record: bool,
    /// The connection can be handed over to an upgraded protocol (HTTP/1.1).
    pub upgrade: bool,
    /// The connection writes a proxied answer's fields as sent ([`Answer::fields`]):
    /// HTTP/1, where they leave as the same lines.
    pub fields: bool,
    /// Set by the pipeline for the handler: this request's answer may keep its fields
    /// as sent ([`as_sent`]).
    pub as_sent: Option<AsSent>,
}

/// Serves one request on the current generation, borrowing the connection's `client`.
/// Boxed so a connection's task stays small while it waits idle, and built in its box:
/// returned unboxed (one allocation fewer), a keep-alive request cost 437 instructions
/// more, the state then being made on the stack and moved into the connection's. An
/// ACME HTTP-01 challenge is told apart before any future is made, so requests that are
/// not one carry nothing of it.
///
/// `fields`: an HTTP/1 request's fields as they came, its map empty
/// ([`crate::http1::fields`]); the map is built as soon as something on the request's
/// way may read it, and never when nothing does.
pub(crate) fn handle<'c>(
    live: &Live,
    req: Request<Body>,
    fields: Option<Fields>,
    client: &'c ClientInfo,
    offer: Offer,
) -> ResponseFuture<'c> {
    let gen = live.load();
    if let Some(acme) = controls::acme_challenge(&gen, client, &req) {
        return Box::pin(async move {
            match controls::acme_http01(&acme, req.uri().path()).await {
                Some(resp) => Answer {
                    resp,
                    served: None,
                    tunnel: None,
                    meter: None,
                    fields: None,
                },
                None => serve(gen, req, fields, client, offer).await,
            }
        });
    }
    boxed(|| serve(gen, req, fields, client, offer))
}

/// Builds the request's map from its fields as they came, if they were kept so: a
/// reader of the map comes next.
#[inline]
fn with_map(req: &mut Request<Body>, fields: &mut Option<Fields>) {
    Fields::into_map(fields, req.headers_mut());
}

/// The request's whole journey. An `async move` block, not an `async fn`: the block
/// uses what it captured in place, where an `async fn` would copy its arguments into
/// its state once more when first polled (measured: two more copies a request). Not
/// inlined, so [`boxed`] can have it build its state in its box.
#[allow(clippy::manual_async_fn)]
#[inline(never)]
fn serve(
    gen: Arc<Generation>,
    mut req: Request<Body>,
    mut fields: Option<Fields>,
    client: &ClientInfo,
    offer: Offer,
) -> impl std::future::Future<Output = Answer> + Send + use<'_> {
    async move {
        // The connection asked the generation before this one, as a reload landed.
        if !gen.defers_fields {
            with_map(&mut req, &mut fields);
        }
        // gRPC needs HTTP/2 or HTTP/3: an HTTP/1.1 request is not asked.
        let grpc = crate::grpc::is_call(&req);
        let slots = Slots {
            grpc,
            trace: gen.tracer.as_ref().map(|t| {
                let span = t.begin(&req);
                Box::new(Traced {
                    ctx: span.ctx,
                    span,
                    located: std::sync::OnceLock::new(),
                })
            }),
            ..Slots::default()
        };
        let mut metering = Unanswered {
            meter: None,
            started: gen.metered.then(std::time::Instant::now),
        };
        let mut resp = run(
            &gen,
            (&mut req, fields),
            client,
            &slots,
            offer,
            &mut metering.meter,
        )
        .await;
        // A gRPC-Web call's answer is marked by the `grpc_web` filter.
        if grpc || resp.extensions().get::<crate::grpc::web::Mode>().is_some() {
            grpc_answer(&mut resp, metering.meter.clone());
        }
        if let (Some(t), Some(traced)) = (&gen.tracer, slots.trace) {
            let located = traced.located.get().map(|(s, r)| (s.as_str(), r.as_str()));
            t.end_server(traced.span, resp.status().as_u16(), located);
        }
        Answer {
            resp,
            served: slots.served.into_inner(),
            tunnel: slots.tunnel.into_inner(),
            meter: metering.meter.take(),
            fields: slots
                .fields
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        }
    }
}

/// A gRPC call's answer: sluice's own as trailers-only `grpc-status`, any other
/// watched for the status it ends with, then as gRPC-Web for a gRPC-Web call; either
/// way marked for the access log.
#[inline(never)]
#[cold]
fn grpc_answer(slot: &mut Response<Body>, meter: Option<Arc<Meter>>) {
    let resp = std::mem::replace(slot, Response::new(Body::Empty));
    let web = resp.extensions().get::<crate::grpc::web::Mode>().copied();
    let call = crate::grpc::Call::new(meter);
    let mut resp = if crate::reply::is_own(&resp) {
        crate::grpc::trailers_only(resp, &call)
    } else {
        crate::grpc::watch(resp, call.clone())
    };
    if let Some(mode) = web {
        resp = crate::grpc::web::to_web(resp, mode);
    }
    resp.extensions_mut().insert(call);
    *slot = resp;
}

/// A metered request whose pipeline has not answered: when its future is dropped
/// before then (the client closed or reset it), it is counted as `499`, nginx's
/// "client closed request", with the time it had run.
struct Unanswered {
    meter: Option<Arc<Meter>>,
    started: Option<std::time::Instant>,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let (Some(m), Some(t)) = (&self.meter, self.started) {
            m.record(499, t.elapsed(), 0, 0);
        }
    }
}

/// Where the handler leaves what the connection needs besides the response.
#[derive(Default)]
struct Slots {
    served: std::sync::OnceLock<Served>,
    tunnel: std::sync::OnceLock<Box<crate::tunnel::Tunnel>>,
    /// A proxied answer's fields as sent ([`Answer::fields`]). A lock no one waits
    /// for: two atomic operations, where a `OnceLock`'s set cost 90 instructions.
    fields: std::sync::Mutex<Option<Box<SentFields>>>,
    /// The request is a gRPC call (asked once, for the proxy's `grpc-timeout` too).
    grpc: bool,
    /// `tracing otlp`: the request's trace, and the site and route that took it
    /// (boxed: a request without it carries one pointer).
    trace: Option<Box<Traced>>,
}

impl Slots {
    /// A sampled trace notes the site and route that took the request.
    fn located(&self, site: &Site, route: &Route) {
        if let Some(traced) = self.trace.as_ref().filter(|t| t.ctx.sampled) {
            let pattern = crate::runtime::compile::route_label(&site.name, &route.name);
            let _ = traced.located.set((site.name.clone(), pattern.to_string()));
        }
    }
}

/// What a traced request's spans need from its journey.
struct Traced {
    ctx: crate::otel::Ctx,
    span: crate::otel::ServerSpan,
    located: std::sync::OnceLock<(String, String)>,
}

/// An `async move` block, as [`serve`] (and `call_handler`). The request is lent, not
/// moved: each level that owned it kept its 272 bytes in its state for as long as it
/// ran, and copied it once more on the way down; only what consumes it takes it
/// ([`take_request`]).
#[allow(clippy::manual_async_fn)]
fn run<'a>(
    gen: &'a Arc<Generation>,
    (req, mut fields): (&'a mut Request<Body>, Option<Fields>),
    client: &'a ClientInfo,
    slots: &'a Slots,
    offer: Offer,
    meter: &'a mut Option<Arc<Meter>>,
) -> impl std::future::Future<Output = Response<Body>> + use<'a> {
    async move {
        // Not a nested async fn: awaiting one moves its whole (large) future once more.
        let (site, route, normalized) = match locate(gen, req, &mut fields, client, meter) {
            Ok(found) => found,
            Err(resp) => return *resp,
        };
        slots.located(site, route);
        // A site with its own access_log: its responses say where their line goes.
        let line = site
            .log
            .as_ref()
            .map(|l| Box::new(l.line(Seen::of(req.headers(), fields.as_ref()))));
        if let Some(mut resp) = controls::maintenance(gen, site, Some(route), req, client) {
            controls::hsts(site, client, &mut resp);
            logged_to(line, &mut resp);
            return resp;
        }
        // A certificate speaks for the site whose handshake verified it, no other.
        let tls_client = client.tls_client.as_ref().filter(|t| t.site == site.name);
        let vars = route
            .uses_placeholders
            .then(|| vars(req, client, route, normalized.as_deref(), tls_client));
        let mut cx = Cx::new(
            normalized,
            vars.as_ref(),
            client_ip(gen, route, client, req),
        );
        cx.client_cert = tls_client.is_some_and(|t| t.cert.is_some());
        cx.meter = route.meter.as_ref();
        cx.https = client.scheme == Scheme::Https;
        let asked = Asked::of(route, req, fields.as_ref());
        let received = received(route, req);
        // Bodies a filter watches as they stream (`body_deny` past its hold): a refusal
        // there replaces the handler's answer.
        let mut watched = Vec::new();
        let offer = as_sent(offer, site, route, client, &asked, slots);
        let (ran, early) = request_phase(route, req, &mut cx, &mut watched).await;
        let mut resp = match early {
            Some(r) => r,
            None => {
                if let Some(path) = cx.changed_path() {
                    set_path(req, path);
                }
                let resp = match &route.cache {
                    None => {
                        let req = (req, fields.as_ref());
                        call_handler(gen, route, req, client, &cx, slots, offer, received).await
                    }
                    Some(cache) => {
                        let at = Place { gen, site, route };
                        Box::pin(cached(at, cache, req, client, &cx, slots, offer, received)).await
                    }
                };
                match watched.iter().find(|w| w.happened()) {
                    // The body was cut off past the hold: whatever the handler made of
                    // that, the client gets the filter's refusal.
                    Some(w) => (w.refuse)(),
                    None => resp,
                }
            }
        };
        if ran != 0 {
            response_phase(route, ran, &mut resp, &cx);
        }
        finish(site, route, client, &cx, &asked, &mut resp);
        logged_to(line, &mut resp);
        resp
    }
}

/// The client's address as the route decides on it: through `trust`'s forwarding
/// fields only when some filter or condition of the route asks.
fn client_ip(
    gen: &Generation,
    route: &Route,
    client: &ClientInfo,
    req: &Request<Body>,
) -> std::net::IpAddr {
    match route.uses_client_ip {
        true => gen.client_ip(client.addr.ip(), req.headers()),
        false => client.addr.ip(),
    }
}

/// FastCGI's REQUEST_URI, and the folder redirects of both file handlers, use the
/// target as received, before `strip`/`rewrite`.
fn received(route: &Route, req: &Request<Body>) -> Option<PathAndQuery> {
    matches!(route.handler, Handler::FastCgi(_) | Handler::Files(_))
        .then(|| req.uri().path_and_query().cloned())
        .flatten()
}

/// The offer, with whether a proxied answer may keep its fields as the backend sent
/// them and on what terms: only for a connection that writes them so (HTTP/1), on a
/// route where nothing on the way back reads or adds a field
/// ([`Route::leaves_fields`], no HSTS or `Alt-Svc` on this connection, not gRPC).
/// Compression is the one reader left: it reads the type, and for a client that takes
/// no coding only adds `Vary`.
fn as_sent(
    offer: Offer,
    site: &Site,
    route: &Route,
    client: &ClientInfo,
    asked: &Asked,
    slots: &Slots,
) -> Offer {
    let plain = offer.fields && route.fields_as_sent && !slots.grpc;
    let as_sent = (plain && !controls::adds_fields(site, client)).then(|| AsSent {
        compress: route.compress != Compression::Off,
        identity_only: asked.accept.is_none(),
    });
    Offer { as_sent, ..offer }
}

/// Marks a response of a site with its own `access_log` (nothing otherwise).
#[inline]
fn logged_to(line: Option<Box<crate::access::SiteLine>>, resp: &mut Response<Body>) {
    if let Some(l) = line {
        resp.extensions_mut().insert(*l);
    }
}

/// What every response of a route gets last: its error pages, compression, HSTS.
/// In place: a response is moved only by the steps that rebuild it.
fn finish(
    site: &Site,
    route: &Route,
    client: &ClientInfo,
    cx: &Cx<'_>,
    asked: &Asked,
    resp: &mut Response<Body>,
) {
    if let Some(pages) = &route.error_pages {
        *resp = pages.apply(taken(resp));
    }
    match cx.compress.unwrap_or(route.compress) {
        Compression::Off => {}
        mode => crate::filter::compress::apply(
            resp,
            asked.accept.as_ref(),
            asked.is_head,
            mode == Compression::Always,
            asked.authorized,
        ),
    }
    controls::hsts(site, client, resp);
}

/// The response, for a step that takes it whole (an empty one is left behind).
fn taken(resp: &mut Response<Body>) -> Response<Body> {
    std::mem::replace(resp, Response::new(Body::Empty))
}

/// The request's site and route, on the normalised host and path (and the path, when
/// normalising changed it), with the meter its response counts on; or the answer when
/// there is no site or no route for it. Fields kept as they came become the request's
/// map before a site that reads them looks at its routes, and once a route that reads
/// them is found ([`Site::defers_fields`], [`Route::defers_fields`]).
#[allow(clippy::type_complexity)]
fn locate<'g>(
    gen: &'g Generation,
    req: &mut Request<Body>,
    fields: &mut Option<Fields>,
    client: &ClientInfo,
    meter: &mut Option<Arc<Meter>>,
) -> Result<(&'g Site, &'g Route, Option<String>), Box<Response<Body>>> {
    let host = match fields {
        Some(f) => f.host(),
        None => req.headers().get(header::HOST).map(HeaderValue::as_bytes),
    };
    let host = host.unwrap_or(b"");
    let Some(host) = crate::route::path::site_host(host) else {
        bump(&COUNTERS.bad_request);
        *meter = gen.metered.then(|| UNROUTED.clone());
        let bad = local_response(StatusCode::BAD_REQUEST, "Bad request: invalid Host\n");
        return Err(Box::new(bad));
    };
    let Some(site) = gen.sites.find(&host) else {
        bump(&COUNTERS.unknown_site);
        *meter = gen.metered.then(|| UNROUTED.clone());
        let unknown = local_response(StatusCode::MISDIRECTED_REQUEST, "unknown site\n");
        return Err(Box::new(unknown));
    };
    if !site.defers_fields {
        with_map(req, fields);
    }
    match find_route(gen, site, req, client) {
        Ok((route, normalized)) => {
            meter.clone_from(&route.meter);
            if !route.defers_fields {
                with_map(req, fields);
            }
            Ok((site, route, normalized))
        }
        Err(resp) => {
            meter.clone_from(&site.meter);
            let line = site
                .log
                .as_ref()
                .map(|l| Box::new(l.line(Seen::of(req.headers(), fields.as_ref()))));
            let mut resp = no_route(site, client, *resp);
            logged_to(line, &mut resp);
            Err(Box::new(resp))
        }
    }
}

/// The site's answer when no route took the request (or a control answered first):
/// its error page, if it has one for the status, and HSTS.
fn no_route(site: &Site, client: &ClientInfo, resp: Response<Body>) -> Response<Body> {
    let mut resp = match &site.error_pages {
        Some(pages) => pages.apply(resp),
        None => resp,
    };
    controls::hsts(site, client, &mut resp);
    resp
}

/// What compression needs of the request, taken before the handler takes it.
struct Asked {
    accept: Option<HeaderValue>,
    /// Only a client that accepts a coding can get a compressed answer.
    authorized: bool,
    is_head: bool,
}

impl Asked {
    fn of(route: &Route, req: &Request<Body>, fields: Option<&Fields>) -> Asked {
        let (accept, authorized) = match (route.may_compress, fields) {
            (false, _) => (None, false),
            (true, None) => {
                let accept = req.headers().get(header::ACCEPT_ENCODING).cloned();
                // Asked only when it matters.
                let authorized =
                    accept.is_some() && req.headers().contains_key(header::AUTHORIZATION);
                (accept, authorized)
            }
            (true, Some(f)) => f.accept_encoding(),
        };
        Asked {
            authorized: accept.is_some() && authorized,
            accept,
            is_head: req.method() == http::Method::HEAD,
        }
    }
}

/// The request phase: each filter whose condition holds, in written order, until one
/// answers. Which ran (a bit each: a route has at most `MAX_FILTERS`, checked at
/// load), and the early answer if one came.
async fn request_phase(
    route: &Route,
    req: &mut Request<Body>,
    cx: &mut Cx<'_>,
    watched: &mut Vec<Refused>,
) -> (u128, Option<Response<Body>>) {
    // `forward_auth`'s `copy_headers` come from the auth service only.
    for name in route.auth_headers.iter() {
        crate::proxy::remove_spellings(req.headers_mut(), name);
        req.headers_mut().remove(name);
    }
    let mut ran: u128 = 0;
    let mut i = 0;
    while let Some(st) = route.filters.get(i) {
        if st.condition.as_ref().is_some_and(|c| !c.holds(req, cx)) {
            i += 1;
            continue;
        }
        ran |= 1 << i;
        match stage(route, st, req, cx, watched).await {
            Next::Stage(Some(j)) => i = j,
            Next::Stage(None) => i += 1,
            Next::Answer(resp) => return (ran, Some(resp)),
        }
        // A path a filter produced (`rewrite` with placeholders, say) is decided on,
        // and sent, only in its normal form.
        if let Some(path) = cx.take_dirty() {
            match normalize(path) {
                Ok(Cow::Borrowed(_)) => {}
                Ok(Cow::Owned(p)) => cx.normalized(p),
                Err(why) => {
                    bump(&COUNTERS.bad_request);
                    tracing::debug!(
                        "sluice: {}: a filter made an invalid path: {why}",
                        route.name
                    );
                    let bad =
                        local_response(StatusCode::BAD_REQUEST, "Bad request: invalid path\n");
                    return (ran, Some(bad));
                }
            }
        }
    }
    (ran, None)
}

/// The response phase: in reverse order, each filter whose request phase ran and whose
/// response condition (if any) holds; `on matched reject_response` replaces the
/// response, which goes on through the filters before it.
fn response_phase(route: &Route, ran: u128, resp: &mut Response<Body>, cx: &Cx<'_>) {
    for (k, st) in route.filters.iter().enumerate().rev() {
        if ran & (1 << k) == 0 {
            continue;
        }
        if st.response.as_ref().is_some_and(|c| !c.holds(resp)) {
            continue;
        }
        st.filter.on_response(resp, cx);
        // A `101` is not replaced: the connection is already another protocol's.
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        if let Some((code, body)) = st.on_matched.as_ref().filter(|_| !switching) {
            tracing::debug!(
                "sluice: {}: {} (line {}) replaced a {} response with {}",
                route.name,
                st.name,
                st.line,
                resp.status().as_u16(),
                code.as_u16()
            );
            *resp = reject(*code, body.clone());
        }
    }
}

/// Replaces request fields: each name's client fields, in any spelling (§18.2), give
/// way to the values given (none: the field is removed).
fn amend(req: &mut Request<Body>, fields: Vec<(http::HeaderName, Vec<HeaderValue>)>) {
    let h = req.headers_mut();
    for (name, values) in fields {
        crate::proxy::remove_spellings(h, &name);
        h.remove(&name);
        for v in values {
            h.append(name.clone(), v);
        }
    }
}

/// After one filter: the next to run (a branch's `skip_to`, else the following one),
/// or the answer that ends the request phase.
enum Next {
    Stage(Option<usize>),
    Answer(Response<Body>),
}

/// One filter's request phase, with its whole body read first if it asks, its
/// deferred decision awaited, its failure mode and its branches applied.
async fn stage(
    route: &Route,
    st: &Stage,
    req: &mut Request<Body>,
    cx: &mut Cx<'_>,
    watched: &mut Vec<Refused>,
) -> Next {
    if let Some(cap) = st.filter.whole_body() {
        let body = std::mem::replace(req.body_mut(), Body::Empty);
        match crate::filter::read_whole(body, cap).await {
            Ok(b) => *req.body_mut() = b,
            Err(resp) => return Next::Answer(resp),
        }
    }
    let mut held = None;
    if let Some(h) = st
        .filter
        .hold_body()
        .filter(|_| !http_body::Body::is_end_stream(req.body()))
    {
        let refuse = h.refuse;
        let body = std::mem::replace(req.body_mut(), Body::Empty);
        // Boxed: a held body's read is a large future, which would otherwise make
        // every request's future (and its copies) as large.
        match Box::pin(crate::filter::hold::hold(body, h)).await {
            Ok((b, refused)) => {
                *req.body_mut() = b;
                watched.extend(refused);
            }
            Err(Stopped::Refused(whole)) => {
                *req.body_mut() = whole;
                held = Some(Step::answer(refuse()));
            }
            Err(Stopped::Failed(resp)) => return Next::Answer(resp),
        }
    }
    let mut step = match held {
        Some(refused) => refused,
        None => st.filter.on_request(req, cx),
    };
    if let Step::Later(decided) = step {
        step = match decided.await {
            Step::Later(_) => Step::Error("a decision deferred twice".into()),
            s => s,
        };
    }
    let (refusal, branch) = match step {
        Step::Pass | Step::Later(_) => (None, st.on_pass),
        Step::Amend(fields) => {
            amend(req, fields);
            (None, st.on_pass)
        }
        Step::Verified(v) => {
            let Verified { claims, fields } = *v;
            amend(req, fields);
            cx.claims = Some(claims);
            (None, st.on_pass)
        }
        Step::Answer(resp) => (Some(*resp), st.on_refuse),
        Step::Error(why) => match undecided(route, st, &why, StatusCode::INTERNAL_SERVER_ERROR) {
            Some(closed) => return Next::Answer(closed),
            None => (None, st.on_pass),
        },
        Step::Unreachable(why) => match undecided(route, st, &why, StatusCode::SERVICE_UNAVAILABLE)
        {
            Some(closed) => return Next::Answer(closed),
            None => (None, st.on_pass),
        },
    };
    match (branch, refusal) {
        (Some(Action::SkipTo(j)), _) => Next::Stage(Some(j)),
        (Some(Action::Reject(code)), _) => {
            let reason = code.canonical_reason().unwrap_or("Rejected");
            Next::Answer(reject(code, format!("{reason}\n").into()))
        }
        (None, Some(resp)) => Next::Answer(resp),
        (None, None) => Next::Stage(None),
    }
}

/// A filter that could not decide: counted and logged; failing closed, the answer
/// (`closed`: 500 for a broken store, 503 for a service out of reach); failing open,
/// `None` (as if the filter had passed, its `passed` branch too).
fn undecided(route: &Route, st: &Stage, why: &str, closed: StatusCode) -> Option<Response<Body>> {
    bump(&COUNTERS.filter_failures);
    let mode = if st.failure_open { "open" } else { "closed" };
    tracing::debug!(
        route = %route.name,
        filter = st.name,
        "sluice: {}: {} (line {}) could not decide ({why}); failing {mode}",
        route.name,
        st.name,
        st.line
    );
    if st.failure_open {
        return None;
    }
    Some(if closed == StatusCode::SERVICE_UNAVAILABLE {
        local_response(closed, "Service unavailable\n")
    } else {
        local_response(closed, "Internal server error\n")
    })
}

/// `respond [STATUS] [BODY]`: the rendered body (plain text when it has one).
fn respond(status: StatusCode, body: &Template, values: &Values<'_>) -> Response<Body> {
    let mut r = Response::new(Body::full(body.render(values)));
    *r.status_mut() = status;
    if !body.parts.is_empty() {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    r.headers_mut().insert(header::DATE, date());
    crate::reply::server(r.headers_mut());
    r
}

/// `redirect [STATUS] TARGET`: the rendered `Location`.
fn redirect(status: StatusCode, target: &Template, values: &Values<'_>) -> Response<Body> {
    let mut r = Response::new(Body::Empty);
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(&target.render(values)) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut().insert(header::DATE, date());
    crate::reply::server(r.headers_mut());
    r
}

/// A branch's `reject CODE` (the status and its reason as the body), or
/// `reject_response CODE BODY`.
fn reject(code: StatusCode, body: bytes::Bytes) -> Response<Body> {
    let mut r = Response::new(Body::full(body));
    r.extensions_mut().insert(crate::reply::Own);
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(header::DATE, date());
    crate::reply::server(r.headers_mut());
    r
}

pub(super) fn host_of(req: &Request<Body>) -> &str {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The route in `site` for the request's normalised path, and the normalised path when
/// it differs from the target's. `Err`: sluice's own answer (400, 404), or the site's
/// controls' (a version it is not served over, the redirect to HTTPS, maintenance).
fn find_route<'g>(
    gen: &'g Generation,
    site: &'g Site,
    req: &Request<Body>,
    client: &ClientInfo,
) -> Result<(&'g Route, Option<String>), Box<Response<Body>>> {
    let path = match normalize(req.uri().path()) {
        Ok(p) => p,
        Err(why) => {
            bump(&COUNTERS.bad_request);
            tracing::debug!("sluice: refused path {:?}: {why}", req.uri().path());
            return Err(Box::new(local_response(
                StatusCode::BAD_REQUEST,
                "Bad request: invalid path\n",
            )));
        }
    };
    if let Some(early) = controls::before_route(site, req, &path, client) {
        return Err(Box::new(early));
    }
    let probe = Probe {
        path: &path,
        method: req.method(),
        headers: req.headers(),
        query: req.uri().query(),
    };
    let Some(route) = site.find(&probe) else {
        if let Some(m) = controls::maintenance(gen, site, None, req, client) {
            return Err(Box::new(m));
        }
        bump(&COUNTERS.no_route);
        return Err(Box::new(local_response(
            StatusCode::NOT_FOUND,
            "Not found\n",
        )));
    };
    let normalized = match path {
        std::borrow::Cow::Owned(p) => Some(p),
        std::borrow::Cow::Borrowed(_) => None,
    };
    Ok((route, normalized))
}

/// Placeholder values of the request as received; a regex route's groups are taken
/// from the normalised path it matched (`normalized`, else the target's); the client
/// certificate, when the connection's handshake was made for this site.
fn vars(
    req: &Request<Body>,
    client: &ClientInfo,
    route: &Route,
    normalized: Option<&str>,
    tls_client: Option<&std::sync::Arc<crate::net::identity::TlsClient>>,
) -> Vars {
    let captures = match &route.pattern {
        crate::config::PathPattern::Regex(re) => {
            let path = normalized.unwrap_or_else(|| req.uri().path());
            crate::config::template::Captures::of(&re.0, path).map(Box::new)
        }
        _ => None,
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    Vars {
        host: normalize_host(host).into_owned(),
        uri: req.uri().clone(),
        method: req.method().clone(),
        client_ip: client.ip_value.to_str().unwrap_or("").to_string(),
        scheme: client.scheme.as_str(),
        captures,
        tls_client: tls_client.cloned(),
    }
}

#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
fn call_handler<'a, 'x>(
    gen: &'a Generation,
    route: &'a Route,
    (req, fields): (&'a mut Request<Body>, Option<&'a Fields>),
    client: &'a ClientInfo,
    cx: &'a Cx<'x>,
    slots: &'a Slots,
    offer: Offer,
    received: Option<PathAndQuery>,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'x> {
    async move {
        let values = cx.values();
        match &route.handler {
            Handler::Proxy(pool) => {
                let scheme = client.scheme.header_value();
                let c = proxy::Client {
                    ip: &client.ip_value,
                    scheme: &scheme,
                    trusted: gen.is_trusted(client.addr.ip()),
                    values,
                    served: offer.record.then_some(&slots.served),
                    tracing: gen.tracing,
                    spans: gen
                        .tracer
                        .as_deref()
                        .zip(slots.trace.as_ref().map(|t| &t.ctx)),
                    tunnel: offer.upgrade.then_some(&slots.tunnel),
                    max_tunnels: gen.max_tunnels,
                    tunnel_drain: gen.tunnel_drain,
                    tunnel_idle: gen.tunnel_idle,
                    addrs: client.local.map(|l| (client.addr, l)),
                    metered: gen.metered,
                    grpc: slots.grpc,
                    as_sent: offer.as_sent.map(|rule| (rule, &slots.fields)),
                    fields,
                };
                proxy::forward(pool, req, &c).await
            }
            Handler::Respond { status, body } => respond(*status, body, &values),
            Handler::Redirect { status, target } => redirect(*status, target, &values),
            // Boxed, as the FastCGI call below: their futures are large, and inlined they
            // would make every request's future (the proxy's too) as large.
            Handler::Files(f) => {
                let raw = received_path(received.as_ref(), req);
                let folder = move || folder_base(raw);
                boxed(|| {
                    crate::files::serve(
                        f,
                        req.method(),
                        cx.path(req),
                        folder,
                        req.uri().query(),
                        req.headers(),
                    )
                })
                .await
            }
            Handler::FastCgi(f) => {
                let path = cx.path(req).to_string();
                let folder = folder_base(received_path(received.as_ref(), req)).into_owned();
                let facts = crate::fastcgi::Facts {
                    path: &path,
                    folder: &folder,
                    received: received.as_ref().map(|p| p.as_str()),
                    client: client.addr,
                    client_ip: client.ip_value.as_bytes(),
                    https: client.scheme == Scheme::Https,
                };
                boxed(|| crate::fastcgi::serve(f, take_request(req), &facts)).await
            }
            Handler::None => {
                bump(&COUNTERS.no_route);
                local_response(StatusCode::NOT_FOUND, "Not found\n")
            }
        }
    }
}

/// Where a request is: its generation, site and route.
#[derive(Clone, Copy)]
struct Place<'g> {
    gen: &'g Arc<Generation>,
    site: &'g Site,
    route: &'g Route,
}

/// The handler behind the route's cache.
#[allow(clippy::too_many_arguments)]
async fn cached(
    at: Place<'_>,
    cache: &crate::cache::Cache,
    req: &mut Request<Body>,
    client: &ClientInfo,
    cx: &Cx<'_>,
    slots: &Slots,
    offer: Offer,
    received: Option<PathAndQuery>,
) -> Response<Body> {
    // The cache keys on the request as forwarded: the Host as sent, the target after
    // `strip`/`rewrite` (now in `req`).
    let host = host_of(req).to_owned();
    let path = cx.path(req).to_string();
    if cx.claims.is_some() {
        req.extensions_mut().insert(crate::cache::Credentialed);
    }
    let fetch = |mut req: Request<Body>| async move {
        call_handler(
            at.gen,
            at.route,
            (&mut req, None),
            client,
            cx,
            slots,
            offer,
            received,
        )
        .await
    };
    let refresh = |req| refresh(at, req, client.clone(), path.clone(), cx.client_ip);
    cache
        .serve(
            take_request(req),
            client.scheme.as_str(),
            &host,
            fetch,
            refresh,
        )
        .await
}

/// A fetch of the route's handler that runs on its own (a cache's background
/// refresh): it owns the generation and finds its route again by position.
fn refresh(
    at: Place<'_>,
    mut req: Request<Body>,
    client: ClientInfo,
    path: String,
    client_ip: std::net::IpAddr,
) -> crate::cache::Refresh {
    let gen = at.gen.clone();
    let site = gen.sites.list.iter().position(|s| std::ptr::eq(s, at.site));
    let route = site.and_then(|i| {
        gen.sites.list[i]
            .routes
            .iter()
            .position(|r| std::ptr::eq(r, at.route))
    });
    Box::pin(async move {
        let (Some(s), Some(r)) = (site, route) else {
            return local_response(StatusCode::SERVICE_UNAVAILABLE, "Service unavailable\n");
        };
        let route = &gen.sites.list[s].routes[r];
        let vars = route
            .uses_placeholders
            .then(|| vars(&req, &client, route, Some(&path), None));
        let cx = Cx::new(Some(path), vars.as_ref(), client_ip);
        let slots = Slots::default();
        call_handler(
            &gen,
            route,
            (&mut req, None),
            &client,
            &cx,
            &slots,
            Offer::default(),
            None,
        )
        .await
    })
}

/// The base of a folder redirect (`301` to the path plus `/`): the path as received,
/// before `strip`/`rewrite` (so what they took off stays), normalised — the raw
/// spelling `//evil.example/../img` would make `Location: //evil.example/../img/`,
/// a link to another host.
fn folder_base(raw: &str) -> Cow<'_, str> {
    // Routing normalised the same path already, so this cannot fail in practice.
    normalize(raw).unwrap_or(Cow::Borrowed("/"))
}

/// The path as received (before `strip`/`rewrite`), as the client spelled it.
fn received_path<'r>(received: Option<&'r PathAndQuery>, req: &'r Request<Body>) -> &'r str {
    received.map_or(req.uri().path(), |p| p.path())
}

/// The target becomes the path a filter set (normalised, so already encoded) and the
/// query as received.
fn set_path(req: &mut Request<Body>, path: &str) {
    let pq = match req.uri().query() {
        Some(q) => PathAndQuery::try_from(format!("{path}?{q}")),
        None => PathAndQuery::try_from(path),
    };
    let Ok(pq) = pq else { return };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(pq);
    if let Ok(u) = Uri::from_parts(parts) {
        *req.uri_mut() = u;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn edge_octets_and_mapped_addresses_render_plainly() {
        for (ip, want) in [
            ("0.0.0.0", "0.0.0.0"),
            ("255.255.255.255", "255.255.255.255"),
            ("10.99.100.9", "10.99.100.9"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap();
            assert_eq!(super::ip_value(ip.to_canonical()), want);
        }
    }

    proptest::proptest! {
        /// The hand-written IPv4 rendering is `Display`'s, for every address; IPv6
        /// (and a mapped IPv4) go through `Display` itself.
        #[test]
        fn a_client_address_renders_as_display_does(bits in proptest::num::u32::ANY, v6 in proptest::num::u128::ANY) {
            let v4 = std::net::IpAddr::V4(std::net::Ipv4Addr::from(bits));
            let got = super::ip_value(v4);
            proptest::prop_assert_eq!(got.to_str().unwrap(), v4.to_string());
            let v6 = std::net::IpAddr::V6(std::net::Ipv6Addr::from(v6));
            let got = super::ip_value(v6);
            proptest::prop_assert_eq!(got.to_str().unwrap(), v6.to_string());
        }
    }
}

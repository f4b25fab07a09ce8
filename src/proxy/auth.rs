//! `forward_auth URL`: each request is first asked of an auth service — a `GET` to
//! URL with the client's headers and no body, plus `X-Forwarded-Method` and
//! `X-Forwarded-Uri` (the proxy's own rules add `X-Forwarded-For/Proto/Host`) — over a
//! pool of its own, so connections to the service are kept alive like any backend's.
//! A 2xx answer lets the request on, each `copy_headers` field of the answer in place
//! of the client's; any other answer goes back to the client as the service sent it;
//! no answer (unreachable, over `timeout`) means the filter could not decide (`503`
//! failing closed). Nothing is cached: every request asks.

use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request};
use http_body_util::BodyExt as _;

use crate::body::Body;
use crate::config::template::Values;
use crate::config::units::format_duration;
use crate::filter::{Cx, Filter, Step};
use crate::reply::is_own;
use crate::upstream::Pool;

/// The most of a 2xx answer's body read (and dropped) so its connection can be used
/// again; a longer one closes it.
const DRAIN_MAX: usize = 64 * 1024;

static X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
static X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

pub(crate) struct ForwardAuth {
    pool: Arc<Pool>,
    path: PathAndQuery,
    copy: Arc<[HeaderName]>,
    timeout: Duration,
}

impl ForwardAuth {
    pub(crate) fn new(cfg: &crate::config::ForwardAuth, pool: Arc<Pool>) -> ForwardAuth {
        ForwardAuth {
            pool,
            path: cfg.path.clone(),
            copy: cfg.copy_headers.clone().into(),
            timeout: cfg.timeout,
        }
    }

    /// The question: `GET` at the service's path, with the client's fields (the
    /// proxy's rules drop the hop-by-hop ones) and what the client asked for.
    fn question(&self, req: &Request<Body>, values: &Values<'_>) -> Request<Body> {
        let mut ask = Request::new(Body::Empty);
        *ask.method_mut() = Method::GET;
        *ask.uri_mut() = http::Uri::from(self.path.clone());
        let h = ask.headers_mut();
        h.clone_from(req.headers());
        h.remove(header::CONTENT_LENGTH);
        h.remove(header::TRANSFER_ENCODING);
        super::remove_spellings(h, &X_FORWARDED_METHOD);
        super::remove_spellings(h, &X_FORWARDED_URI);
        h.insert(
            X_FORWARDED_METHOD.clone(),
            HeaderValue::from_str(req.method().as_str()).expect("a method is a header value"),
        );
        let uri = match values.query {
            Some(q) => format!("{}?{q}", values.path),
            None => values.path.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&uri) {
            h.insert(X_FORWARDED_URI.clone(), v);
        }
        ask
    }
}

impl Filter for ForwardAuth {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let values = cx.values();
        let mut ask = self.question(req, &values);
        let ip = HeaderValue::from_str(&cx.client_ip.to_string()).expect("an address");
        let scheme =
            HeaderValue::from_str(values.scheme).unwrap_or(HeaderValue::from_static("http"));
        let (pool, copy, timeout) = (self.pool.clone(), self.copy.clone(), self.timeout);
        Step::Later(Box::pin(async move {
            let client = super::Client {
                ip: &ip,
                scheme: &scheme,
                // The service gets the client as `trust` worked it out, nothing the
                // client wrote about itself.
                trusted: false,
                values: Values::default(),
                served: None,
                tracing: false,
                spans: None,
                tunnel: None,
                max_tunnels: 0,
                tunnel_drain: Duration::ZERO,
                tunnel_idle: Duration::ZERO,
                addrs: None,
                // Observed as before: the filter does not know whether the admin API
                // is on, and a subrequest is not the plain proxy's path.
                metered: true,
                grpc: false,
                // The service's answer is read as a map.
                as_sent: None,
                fields: None,
            };
            let asked = async {
                let answer = super::forward(&pool, &mut ask, &client).await;
                if is_own(&answer) {
                    return Step::Unreachable(format!(
                        "{}: no answer ({})",
                        pool.name(),
                        answer.status().as_u16()
                    ));
                }
                if !answer.status().is_success() {
                    return Step::answer(answer);
                }
                let fields = copy
                    .iter()
                    .map(|n| {
                        (
                            n.clone(),
                            answer.headers().get_all(n).iter().cloned().collect(),
                        )
                    })
                    .collect();
                let _ = http_body_util::Limited::new(answer.into_body(), DRAIN_MAX)
                    .collect()
                    .await;
                Step::Amend(fields)
            };
            tokio::time::timeout(timeout, asked)
                .await
                .unwrap_or_else(|_| {
                    Step::Unreachable(format!(
                        "{}: no answer within {}",
                        pool.name(),
                        format_duration(timeout)
                    ))
                })
        }))
    }

    fn uses_client_ip(&self) -> bool {
        true
    }

    /// The request's method, target and scheme as received go to the service.
    fn uses_placeholders(&self) -> bool {
        true
    }
}

//! Built-in filters, one file each, behind one trait.
//!
//! The pipeline runs a route's filters' request phase in written order, then the
//! handler, then the response phase in reverse order for exactly the filters whose
//! request phase ran (an early answer — 403, 413, 429 — included; a filter its
//! condition skipped, or a branch skipped over, did not run). Filters decide on the
//! normalised path and the client's address after `trust`, never on the raw values. A
//! filter sees the body in one of three ways it declares: not at all or wrapping the
//! stream (most), whole under a cap ([`Filter::whole_body`]), or held until it
//! releases it ([`Filter::hold_body`]).

pub(crate) mod access;
pub(crate) mod basic_auth;
pub(crate) mod body_deny;
pub(crate) mod challenge;
pub(crate) mod compress;
pub(crate) mod cond;
pub(crate) mod conn;
pub(crate) mod cors;
pub(crate) mod grpc_web;
pub(crate) mod header_down;
pub(crate) mod hold;
pub(crate) mod jwt;
pub(crate) mod max_body;
pub(crate) mod rate_limit;
pub(crate) mod request_id;
pub(crate) mod rewrite;
pub(crate) mod strip;

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};

use crate::body::Body;
use crate::config::template::Values;

/// What a filter's request phase decided.
pub(crate) enum Step {
    /// On to the next filter (the filter's "passed" result, for branches).
    Pass,
    /// Answer with this at once (the filter's refusal — 403, 429 — or its own answer,
    /// like a CORS preflight): later filters and the handler do not run. Boxed: the
    /// common `Pass` stays a word or two to move.
    Answer(Box<Response<Body>>),
    /// On to the next filter after replacing these request fields (an empty list of
    /// values removes the field): what an auth service answered, say.
    Amend(Vec<(http::HeaderName, Vec<HeaderValue>)>),
    /// The filter could not decide (its store is down): its `failure` mode decides
    /// (closed: `500`). The filter has logged what it needed to (once per outage, not
    /// per request).
    Error(String),
    /// The service the filter asks could not be reached or did not answer in time:
    /// as `Error`, but closed is `503`.
    Unreachable(String),
    /// Decided off the request path: a remote store's answer, a password hash checked
    /// on a blocking thread. Resolves to one of the above.
    Later(Pin<Box<dyn Future<Output = Step> + Send>>),
    /// A verified token (`jwt`): its claims go on with the request (for `when
    /// jwt.CLAIM` conditions and the log), its fields replace the client's as `Amend`.
    Verified(Box<Verified>),
}

/// What a `jwt` filter verified.
pub(crate) struct Verified {
    pub claims: Arc<jwt::Claims>,
    pub fields: Vec<(http::HeaderName, Vec<HeaderValue>)>,
}

impl Step {
    pub(crate) fn answer(resp: Response<Body>) -> Step {
        Step::Answer(Box::new(resp))
    }
}

/// One filter of a route, compiled at load.
pub(crate) trait Filter: Send + Sync {
    /// Request phase; see [`Step`].
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let _ = (req, cx);
        Step::Pass
    }

    /// Response phase, in reverse order.
    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        let _ = (resp, cx);
    }

    /// Whether this filter renders placeholders from the request as received.
    fn uses_placeholders(&self) -> bool {
        false
    }

    /// Whether this filter decides on the client's address (the pipeline works it out
    /// through `trust` only for routes that need it).
    fn uses_client_ip(&self) -> bool {
        false
    }

    /// A filter that must read the whole request body declares its cap: the pipeline
    /// reads the body first (`413` past the cap) and hands the filter a complete
    /// body. Others never touch it.
    fn whole_body(&self) -> Option<u64> {
        None
    }

    /// A filter that looks at the body before any of it leaves ("buffer until
    /// released", `body_deny`) gives, per request, what holds it: see [`hold`].
    fn hold_body(&self) -> Option<hold::Hold> {
        None
    }

    /// A `challenge`, to be bound to each route's pool at load.
    fn challenge(&self) -> Option<&challenge::Challenge> {
        None
    }
}

/// Reads `body` whole, up to `cap` bytes: `Err(413)` past it, `Err(400)` when the body
/// breaks off. What a [`Filter::whole_body`] filter gets.
pub(crate) async fn read_whole(body: Body, cap: u64) -> Result<Body, Response<Body>> {
    use http_body_util::BodyExt as _;
    let limited = body.limited(cap);
    match limited.collect().await {
        Ok(all) => Ok(Body::full(all.to_bytes())),
        Err(e) => Err(body_failed(e)),
    }
}

/// The answer to a request body that failed while the pipeline read it: 413 past a
/// limit, 400 when it broke off.
fn body_failed(e: crate::body::BodyError) -> Response<Body> {
    if let crate::body::BodyError::TooLarge(_) = e {
        crate::stats::bump(&crate::stats::COUNTERS.body_too_large);
        return crate::reply::local_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large\n",
        );
    }
    crate::stats::bump(&crate::stats::COUNTERS.bad_request);
    crate::reply::local_response(StatusCode::BAD_REQUEST, "Bad request: the body broke off\n")
}

/// A filter line, compiled: the filter, when it runs, what its failure means, and
/// where its results branch to.
#[derive(Clone)]
pub(crate) struct Stage {
    /// Shared by every route of a site when the line is the site's.
    pub filter: Arc<dyn Filter>,
    pub condition: Option<cond::Condition>,
    /// `failure open`: a filter that cannot decide lets the request through.
    pub failure_open: bool,
    /// Where the filter's "passed" result goes instead of the next filter.
    pub on_pass: Option<Action>,
    /// What replaces the filter's refusal.
    pub on_refuse: Option<Action>,
    /// `when status …` / `when response_header …`: the response phase runs only when
    /// this holds (the filter's result is then `matched`).
    pub response: Option<cond::ResponseCondition>,
    /// `on matched reject_response CODE ["BODY"]`: the status and body that replace a
    /// response the condition matched.
    pub on_matched: Option<(StatusCode, bytes::Bytes)>,
    /// How logs name it: the directive and its line (no string per stage: a big
    /// config has thousands).
    pub name: &'static str,
    pub line: u32,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    /// Continue at the route's filter with this index (always a later one).
    SkipTo(usize),
    /// Answer with this status (a short body of its reason).
    Reject(StatusCode),
}

impl Stage {
    /// A stage that always runs, fails closed and branches nowhere.
    pub(crate) fn plain(filter: Arc<dyn Filter>, name: &'static str) -> Stage {
        Stage {
            filter,
            condition: None,
            failure_open: false,
            on_pass: None,
            on_refuse: None,
            response: None,
            on_matched: None,
            name,
            line: 0,
        }
    }

    pub(crate) fn uses_client_ip(&self) -> bool {
        self.filter.uses_client_ip()
            || self
                .condition
                .as_ref()
                .is_some_and(|c| matches!(c.test, cond::Test::ClientIp(_)))
    }
}

/// What a request carries through the pipeline besides its head: the normalised path
/// filters decide on (and may change), and the placeholder values of the request as
/// received.
pub(crate) struct Cx<'a> {
    /// The normalised path when it differs from the request target's path.
    path: Option<String>,
    /// A filter changed the path: the backend gets `path` instead of the target.
    changed: bool,
    /// Changed since the pipeline last normalised it.
    dirty: bool,
    /// Kept only for routes that render placeholders.
    vars: Option<&'a Vars>,
    /// The client's address: the connection's peer, or — when that peer is trusted —
    /// the address it forwarded for.
    pub client_ip: IpAddr,
    /// `request_id`: the id the request went on with, echoed on the response.
    pub request_id: Option<HeaderValue>,
    /// `cors`: the allowed origin to answer with (`None`: none, or no `Origin`).
    pub cors_origin: Option<HeaderValue>,
    /// `compress on|off` ran: it decides over the route's default.
    pub compress: Option<crate::config::Compression>,
    /// The TLS connection carries a verified client certificate.
    pub client_cert: bool,
    /// `grpc_web`: the call came as gRPC-Web, in this mode.
    pub grpc_web: Option<crate::grpc::web::Mode>,
    /// The claims of the token a `jwt` filter verified.
    pub claims: Option<Arc<jwt::Claims>>,
    /// The route's meter (for a filter's own counts), when requests are metered.
    pub meter: Option<&'a Arc<crate::stats::Meter>>,
    /// The client's connection is TLS.
    pub https: bool,
}

impl<'a> Cx<'a> {
    /// `normalized`: the normalised path when it differs from the target's.
    pub(crate) fn new(
        normalized: Option<String>,
        vars: Option<&'a Vars>,
        client_ip: IpAddr,
    ) -> Cx<'a> {
        Cx {
            path: normalized,
            changed: false,
            dirty: false,
            vars,
            client_ip,
            request_id: None,
            cors_origin: None,
            compress: None,
            client_cert: false,
            grpc_web: None,
            claims: None,
            meter: None,
            https: false,
        }
    }

    /// Placeholder values of the request as received (empty for a route that renders
    /// none).
    pub(crate) fn values(&self) -> Values<'_> {
        self.vars.map(Vars::values).unwrap_or_default()
    }

    /// The normalised path (as a filter left it).
    pub(crate) fn path<'r>(&'r self, req: &'r Request<Body>) -> &'r str {
        self.path.as_deref().unwrap_or_else(|| req.uri().path())
    }

    /// Sets the path the backend will receive; the pipeline normalises it before the
    /// next filter looks.
    pub(crate) fn set_path(&mut self, path: String) {
        self.path = Some(path);
        self.changed = true;
        self.dirty = true;
    }

    /// The path a filter set since the last call, to be normalised.
    pub(crate) fn take_dirty(&mut self) -> Option<&str> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        self.path.as_deref()
    }

    /// Replaces the path with its normalised form.
    pub(crate) fn normalized(&mut self, path: String) {
        self.path = Some(path);
    }

    /// The path a filter set, if any changed it.
    pub(crate) fn changed_path(&self) -> Option<&str> {
        self.path.as_deref().filter(|_| self.changed)
    }
}

/// Placeholder values of the request as received, kept only for routes that render
/// them (`Vars::default()` otherwise).
#[derive(Default)]
pub(crate) struct Vars {
    pub host: String,
    pub uri: Uri,
    pub method: Method,
    pub client_ip: String,
    pub scheme: &'static str,
    /// A regex route's groups in the normalised path it matched.
    /// Boxed: the request's future holds a `Vars` slot, which stays small.
    pub captures: Option<Box<crate::config::template::Captures>>,
    /// The connection's client-certificate facts (mTLS sites only).
    pub tls_client: Option<std::sync::Arc<crate::net::identity::TlsClient>>,
}

impl Vars {
    pub(crate) fn values(&self) -> Values<'_> {
        Values {
            host: &self.host,
            path: self.uri.path(),
            query: self.uri.query(),
            method: self.method.as_str(),
            client_ip: &self.client_ip,
            scheme: self.scheme,
            captures: self.captures.as_deref(),
            client_cert: self.tls_client.as_ref().and_then(|t| t.cert.as_ref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt as _;

    fn streamed(chunks: &[&'static [u8]]) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for c in chunks {
            tx.try_send(Ok(http_body::Frame::data(Bytes::from_static(c))))
                .unwrap();
        }
        Body::Channel {
            rx,
            len: None,
            want: None,
        }
    }

    #[tokio::test]
    async fn whole_bodies_are_read_under_their_cap() {
        let b = read_whole(streamed(&[b"hello ", b"world"]), 11)
            .await
            .ok()
            .unwrap();
        assert_eq!(b.collect().await.unwrap().to_bytes(), "hello world");
        let over = read_whole(streamed(&[b"hello ", b"world!"]), 11)
            .await
            .err()
            .unwrap();
        assert_eq!(over.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let empty = read_whole(Body::Empty, 0).await.ok().unwrap();
        assert_eq!(empty.collect().await.unwrap().to_bytes(), "");
    }
}

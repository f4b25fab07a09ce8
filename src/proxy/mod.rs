//! The `proxy` handler, in named steps: take a pool slot ([`acquire_slot`]), then for
//! each attempt pick a peer and get a connection, idle or fresh ([`attempt`]), send the
//! request and read the response head ([`send`]), and hand the body back as a stream
//! ([`stream`]).
//!
//! Rules that are the product (DESIGN.md §8.6–8.8): a request goes to another peer only
//! when the first could not be reached, so its body is intact (body frames taken for a
//! write that never went out are kept in the `Outgoing` and sent again); once it
//! reached a backend it is never sent again, and the backend's own answer (a 500, say)
//! passes unchanged. Client faults (a broken body, `max_body`) and a slow backend
//! (`timeout`) never count against a peer. Never buffers a body. Knows no client socket:
//! the client's address and scheme arrive as plain values.

pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod headers;
mod refusal;
mod retry;
pub(crate) mod trace;
mod upgrade;

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};

pub(crate) use self::body::ResponseBody;
pub(crate) use self::headers::remove_spellings;
use self::refusal::{out_of_capacity, peer_or_refusal, BUSY, UNREACHABLE};
use self::retry::{is_idempotent, retry_sent, retry_to, retry_unreached, Retry};
use crate::body::Body;
use crate::config::template::Values;
use crate::config::units::format_duration;
use crate::config::{HashKey, Policy};
use crate::http1::fields::Fields;
use crate::http1::head::SentFields;
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};
use crate::tunnel::Tunnel;
use crate::upstream::balancer::hash_bytes;
use crate::upstream::conn::{BackendConn, Outgoing, SendError};
use crate::upstream::connect::{ConnectError, Connection};
use crate::upstream::dial::DialError;
use crate::upstream::h2;
use crate::upstream::limit::Slot;
use crate::upstream::{Lease, Note, Pick, Pool, Served, Tried};

/// The client-side facts the proxy needs, as plain values.
pub(crate) struct Client<'a> {
    /// The client's address as a header value (for `X-Forwarded-For`).
    pub ip: &'a HeaderValue,
    /// `http` or `https`, as a header value (for `X-Forwarded-Proto`).
    pub scheme: &'a HeaderValue,
    /// Its forwarding headers are believed (`trust`).
    pub trusted: bool,
    /// Placeholder values for `header_up` / `header_down`.
    pub values: Values<'a>,
    /// Where to note which pool and peer served the response, for the access log.
    pub served: Option<&'a std::sync::OnceLock<Served>>,
    /// `tracing on`: send a `traceparent`.
    pub tracing: bool,
    /// `tracing otlp`: each attempt is a span (and the backend's `traceparent` names it).
    pub spans: Option<(&'a crate::otel::Tracer, &'a crate::otel::Ctx)>,
    /// Where an upgraded connection goes, when the client's protocol can hand its
    /// connection over (HTTP/1.1); `None`: upgrades are not offered to backends.
    pub tunnel: Option<&'a std::sync::OnceLock<Box<Tunnel>>>,
    pub max_tunnels: u64,
    pub tunnel_drain: std::time::Duration,
    pub tunnel_idle: std::time::Duration,
    /// The client's address and the one it reached, for a pool's PROXY protocol
    /// header.
    pub addrs: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
    /// The admin API is on: backend latencies are observed for its metrics.
    pub metered: bool,
    /// The request is a gRPC call: its `grpc-timeout` bounds it.
    pub grpc: bool,
    /// An HTTP/1 backend's answer may keep its fields as sent, and where they go for
    /// the client's connection to write (`None`: the answer's fields as a map).
    pub as_sent: Option<(
        crate::http1::head::AsSent,
        &'a std::sync::Mutex<Option<Box<SentFields>>>,
    )>,
    /// The request's fields as they came, its map not built (only on a route whose
    /// pool writes them at once, `Pool::writes_lines`).
    pub fields: Option<&'a Fields>,
}

/// An `async move` block rather than an `async fn` (here and in [`attempts`]): an
/// `async fn` would copy its arguments into its state once more when first polled. The
/// request is lent (see `pipeline::run`); what sends it takes it.
#[allow(clippy::manual_async_fn)]
pub(crate) fn forward<'a, 'c>(
    pool: &'a Arc<Pool>,
    req: &'a mut Request<Body>,
    client: &'a Client<'c>,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'c> {
    async move {
        let mut dialed = Dialed {
            started: client.served.map(|_| std::time::Instant::now()),
            ..Dialed::default()
        };
        // Only a connection that can be handed over asks (an HTTP/1.1 request with
        // `Connection: upgrade` and `Upgrade`; HTTP/1.0's is ignored, RFC 9110 §7.8):
        // any other request looks at no field for it.
        let protocol = client
            .tunnel
            .and_then(|_| upgrade::upgrade_protocol(req, &pool.cfg.upgrade));
        let resp = match (client.tunnel, protocol) {
            // Boxed: rare, and inline its future would make every request's as large.
            // `websocket off`: the pool takes no WebSocket.
            (_, Some(p)) if !pool.cfg.websocket && upgrade::is_websocket(&p) => {
                refusal::no_websocket(pool)
            }
            (Some(slot), Some(protocol)) => {
                Box::pin(upgrade::upgrade(
                    pool,
                    crate::body::take_request(req),
                    client,
                    slot,
                    protocol,
                    &mut dialed,
                ))
                .await
            }
            _ => attempts(pool, req, client, &mut dialed).await,
        };
        // sluice's own answer after peers were dialed: the log still names the last one.
        if let (Some(cell), Some(peer)) = (client.served, dialed.peer) {
            if cell.get().is_none() {
                let transition = dialed.note.transition.map_or("none", |t| t.as_str());
                let _ = cell.set(Served {
                    pool: pool.clone(),
                    peer,
                    attempts: dialed.attempts,
                    role: role_of(pool, peer),
                    transition,
                    upstream: dialed.started.map(|t| t.elapsed()),
                });
            }
        }
        resp
    }
}

/// What a request's attempts came to, for its access log line.
#[derive(Default)]
struct Dialed {
    /// The last peer an attempt went to.
    peer: Option<usize>,
    attempts: u32,
    note: Note,
    /// When the first dial began (the access log is on).
    started: Option<std::time::Instant>,
}

fn role_of(pool: &Pool, peer: usize) -> &'static str {
    pool.peers()[peer].role.as_str()
}

/// Step 1 to 4 for a plain request: a slot, then attempts until one answers or none
/// may be made.
#[allow(clippy::manual_async_fn)]
fn attempts<'a, 'c>(
    pool: &'a Arc<Pool>,
    req: &'a mut Request<Body>,
    client: &'a Client<'c>,
    dialed: &'a mut Dialed,
) -> impl std::future::Future<Output = Response<Body>> + use<'a, 'c> {
    async move {
        // A gRPC call's `grpc-timeout` bounds it from here, the wait for a slot too.
        let deadline = client.grpc.then(|| crate::grpc::deadline(req)).flatten();
        let mut permit = match acquire_slot(pool, deadline).await {
            Ok(p) => p,
            Err(refusal) => return refusal,
        };
        let cfg = &pool.cfg;
        let key = hash_key(&cfg.lb, req, client);
        // Decided on the client's request, before `header_up` may add fields.
        let stale = Stale::of(req, client.fields, &pool.cfg);
        let out = outgoing(pool, crate::body::take_request(req), client, deadline);
        let mut sending = Sending {
            out,
            stale,
            tried: Tried::default(),
            key,
            switch_retried: false,
            evidence: Evidence::default(),
        };
        let mut next = None;
        loop {
            let i = match peer_or_refusal(sending.pick(pool, next.take(), &mut dialed.note)) {
                Ok(i) => i,
                Err(refusal) => {
                    sending.evidence.record(pool, &mut dialed.note);
                    return *refusal;
                }
            };
            if sending.out.deadline.is_some() && !sending.out.pass_deadline_on() {
                return deadline_passed();
            }
            sending.tried.add(i);
            dialed.peer = Some(i);
            dialed.attempts = sending.tried.count as u32;
            let mut lease = Lease::new(pool.clone(), i, permit.take());
            let span = begin_span(client, &mut sending.out);
            let outcome = attempt(pool, i, &mut sending.out, sending.stale, client).await;
            if let Some(span) = span {
                end_span(client, span, pool, i, dialed.attempts, &outcome);
            }
            // An answer is judged where it lies and moved once, to be streamed: the
            // common case, and 272 bytes each move.
            let note = &mut dialed.note;
            let then = match outcome {
                Attempt::Answered(answer) => match sending.answered(pool, i, answer.status(), note)
                {
                    None => {
                        sending.evidence.record(pool, &mut dialed.note);
                        return stream(pool, answer, lease, client, dialed);
                    }
                    Some(j) => Then::Again(Some(j)),
                },
                Attempt::Refused(resp) => Then::Answer(resp),
                Attempt::Unreachable(e) => sending.unreachable(pool, i, e, note),
                Attempt::Failed(e) => sending.send_failed(pool, i, e, note),
            };
            match then {
                Then::Answer(resp) => {
                    sending.evidence.record(pool, &mut dialed.note);
                    return resp;
                }
                Then::Again(j) => {
                    permit = lease.permit.take();
                    next = j;
                }
            }
        }
    }
}

/// `tracing otlp`: an attempt's span begins, and its id goes to the backend.
fn begin_span(client: &Client<'_>, out: &mut Outgoing) -> Option<crate::otel::ClientSpan> {
    let (t, ctx) = client.spans?;
    Some(t.begin_client(ctx, &mut out.parts.headers))
}

/// `tracing otlp`: the attempt's span ends with its answer's status, or why it had
/// none.
#[cold]
fn end_span(
    client: &Client<'_>,
    span: crate::otel::ClientSpan,
    pool: &Pool,
    i: usize,
    attempts: u32,
    outcome: &Attempt,
) {
    let Some((t, ctx)) = client.spans else {
        return;
    };
    let result = match outcome {
        Attempt::Answered(a) => Ok(a.status().as_u16()),
        Attempt::Refused(r) => Err(format!("refused: {}", r.status().as_u16())),
        Attempt::Unreachable(e) => Err(e.to_string()),
        Attempt::Failed(e) => Err(e.to_string()),
    };
    let peer = &pool.peers()[i].addr.text;
    t.end_client(ctx, span, pool.name(), peer, attempts, result);
}

/// A request between its attempts: what goes out, where it went, and how.
struct Sending {
    out: Outgoing,
    /// What the request does about a kept connection the backend may have closed.
    stale: Stale,
    tried: Tried,
    /// `lb hash`'s key.
    key: Option<u64>,
    /// The one attempt beyond `retries` on a new failover role was made.
    switch_retried: bool,
    evidence: Evidence,
}

/// What the request tells failover, recorded once when it ends: its last attempt's
/// outcome, so a retry that succeeded records no failure and a request whose every
/// attempt failed records one (a peer's own breaker still counts each failed attempt).
/// "When it ends" is the moment its last attempt failed with no retry left, before
/// its answer is made, so a switch it causes can still serve it
/// ([`Sending::switch_instead_of_ending`]). A failed trial of a recovering primary is
/// counted at once: it restarts the hold whatever the retry on a backup then does.
#[derive(Default)]
pub(crate) struct Evidence(Option<(usize, bool)>);

impl Evidence {
    /// Peer `i` answered (`ok`: below 500) or failed (`false`).
    pub(crate) fn note(&mut self, i: usize, ok: bool) {
        self.0 = Some((i, ok));
    }

    /// The request ended: its outcome counts, once.
    pub(crate) fn record(&mut self, pool: &Pool, note: &mut Note) {
        if let Some((i, ok)) = self.0.take() {
            pool.failover_result(i, ok, note);
        }
    }
}

/// What follows an attempt.
enum Then {
    /// Another attempt: on this peer (a retry that already picked one), or the next
    /// pick.
    Again(Option<usize>),
    /// sluice's own answer.
    Answer(Response<Body>),
}

impl Sending {
    /// The request would end here, its last attempt failed: its failover evidence counts
    /// now, and when that switched the pool to the other role (the request reached
    /// `failure_threshold`), it gets one attempt on the new role, within the retry
    /// budget (DESIGN §18.4). Only for a request that may go out again (never sent, or
    /// already being retried).
    /// `charge`: the attempt takes a retry from the budget (not when the retry that
    /// found every peer tried was charged already).
    fn switch_instead_of_ending(&mut self, pool: &Pool, note: &mut Note, charge: bool) -> bool {
        let Some((i, false)) = self.evidence.0 else {
            return false;
        };
        self.evidence.record(pool, note);
        let moved = pool.state.failover.role() != pool.peers()[i].role;
        if !moved || self.switch_retried {
            return false;
        }
        self.switch_retried = true;
        !charge || retry::take_retry(pool, Retry::Unreachable)
    }

    /// A failed attempt's failover evidence: a trial's at once, any other's for when
    /// the request ends.
    fn failed(&mut self, pool: &Pool, i: usize, note: &mut Note) {
        if note.trial {
            pool.failover_result(i, false, note);
            note.trial = false;
        } else {
            self.evidence.note(i, false);
        }
    }

    /// Judges attempt `outcome` on peer `i`: the peer's record and failover evidence,
    /// then whether the request goes to another peer.
    /// The peer to try next: `next` (a retry that already picked one), else the
    /// pool's pick, after switching roles when this one has no peer left.
    #[inline]
    fn pick(&mut self, pool: &Pool, next: Option<usize>, note: &mut Note) -> Pick {
        let pick = next.map_or_else(|| pool.pick(&self.tried, self.key, note), Pick::Peer);
        // The retry that led here was charged already.
        if matches!(pick, Pick::Exhausted) && self.switch_instead_of_ending(pool, note, false) {
            return pool.pick(&self.tried, self.key, note);
        }
        pick
    }

    /// Judges an answer of `status` from peer `i`: the peer's record and failover
    /// evidence, then `Some(j)` when the request goes to peer `j` instead (`retry_on`
    /// names the status; the answer is then dropped unread, its connection closing
    /// with it), `None` when the answer is passed on.
    fn answered(
        &mut self,
        pool: &Pool,
        i: usize,
        status: StatusCode,
        note: &mut Note,
    ) -> Option<usize> {
        let code = status.as_u16();
        pool.record_answer(i, code);
        if code < 500 {
            self.evidence.note(i, true);
        } else {
            self.failed(pool, i, note);
        }
        if !pool.cfg.retry_on.status(code) {
            return None;
        }
        let (tried, key, out) = (&self.tried, self.key, &mut self.out);
        let j = retry_to(pool, tried, key, out, Retry::Status, note)?;
        tracing::debug!(
            "sluice: {}: {} answered {code}; retrying on another backend",
            pool.name(),
            pool.peers()[i].addr.text
        );
        Some(j)
    }

    /// Judges a peer `i` that could not be reached: its record and failover evidence,
    /// then another peer (the body is intact, so even a POST may go elsewhere), or
    /// the other role, or `502`.
    fn unreachable(&mut self, pool: &Pool, i: usize, e: DialError, note: &mut Note) -> Then {
        if pool.unreachable(i, &e) {
            self.failed(pool, i, note);
        }
        let why = Retry::Unreachable;
        if retry_unreached(pool, &self.tried, i, why, note, &mut self.switch_retried)
            || self.switch_instead_of_ending(pool, note, true)
        {
            return Then::Again(None);
        }
        bump(&COUNTERS.bad_gateway);
        Then::Answer(local_response(StatusCode::BAD_GATEWAY, UNREACHABLE))
    }

    /// Judges a send to peer `i` that failed: a timeout or a broken connection is
    /// failover evidence, retried or not (the request's last one counts); then
    /// another peer when the request may go again, or sluice's answer.
    fn send_failed(&mut self, pool: &Pool, i: usize, e: SendError, note: &mut Note) -> Then {
        if matches!(
            e,
            SendError::TimedOut
                | SendError::Io(_)
                | SendError::ClosedEarly
                | SendError::Unanswered(_)
        ) {
            self.failed(pool, i, note);
        }
        let (tried, key, out) = (&self.tried, self.key, &mut self.out);
        match retry_sent(pool, i, e, tried, key, out, note) {
            Ok(j) => Then::Again(Some(j)),
            Err(answer) => Then::Answer(*answer),
        }
    }
}

/// sluice's own answer when a gRPC call's deadline passed before it could go out.
#[cold]
fn deadline_passed() -> Response<Body> {
    bump(&COUNTERS.gateway_timeout);
    local_response(
        StatusCode::GATEWAY_TIMEOUT,
        "Deadline exceeded before the call reached a backend\n",
    )
}

/// Step 1: a slot under the pool's `limit`, waiting up to its WAIT (no longer than a
/// gRPC call's `deadline`). `Err`: the 503, or the 504 when the deadline came first.
async fn acquire_slot(
    pool: &Pool,
    deadline: Option<std::time::Instant>,
) -> Result<Option<Slot>, Response<Body>> {
    let Some(limit) = &pool.limit else {
        return Ok(None);
    };
    // A free slot is taken without arming a timer.
    if let Some(slot) = limit.try_take() {
        return Ok(Some(slot));
    }
    let mut wait = pool.cfg.limit.map(|l| l.wait).unwrap_or_default();
    let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
    let by_deadline = left.is_some_and(|l| l < wait);
    if let Some(l) = left.filter(|_| by_deadline) {
        wait = l;
    }
    if let Some(slot) = limit.take(wait).await {
        return Ok(Some(slot));
    }
    if by_deadline {
        return Err(deadline_passed());
    }
    bump(&COUNTERS.limit_rejections);
    tracing::debug!(
        pool = pool.name(),
        "sluice: {}: limit of {} in flight reached, refused a request",
        pool.name(),
        limit.max()
    );
    let mut r = local_response(StatusCode::SERVICE_UNAVAILABLE, BUSY);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    r.extensions_mut().insert(crate::reply::Exhausted);
    Err(r)
}

/// The key `lb hash` places the request by, if the policy is `hash` and the request
/// has one (no header or cookie: `None`, spread round robin).
fn hash_key(policy: &Policy, req: &Request<Body>, client: &Client<'_>) -> Option<u64> {
    let Policy::Hash(key) = policy else {
        return None;
    };
    let bytes: &[u8] = match key {
        HashKey::ClientIp => client.ip.as_bytes(),
        HashKey::Uri => req.uri().path_and_query()?.as_str().as_bytes(),
        HashKey::Header(name) => req.headers().get(name)?.as_bytes(),
        HashKey::Cookie(name) => cookie(req.headers(), name)?,
    };
    Some(hash_bytes(bytes))
}

/// The value of cookie `name` in the request's `Cookie` fields.
fn cookie<'r>(h: &'r http::HeaderMap, name: &str) -> Option<&'r [u8]> {
    h.get_all(header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let (k, v) = pair.split_at(pair.iter().position(|&b| b == b'=')?);
            (k == name.as_bytes()).then_some(&v[1..])
        })
}

/// The request as every backend of the pool receives it (§8.9), but for what depends
/// on the peer (`host upstream`, `header_up`).
fn prepare(pool: &Pool, req: Request<Body>, client: &Client<'_>) -> Request<Body> {
    let (mut parts, body) = req.into_parts();
    prepare_parts(pool, &mut parts, client);
    Request::from_parts(parts, body)
}

/// [`prepare`]'s work, on a request's parts.
fn prepare_parts(pool: &Pool, parts: &mut http::request::Parts, client: &Client<'_>) {
    headers::request(
        &mut parts.headers,
        client.ip,
        client.scheme,
        client.trusted,
        &pool.cfg,
    );
    // With spans, each attempt sets its own (`begin_span`).
    if client.tracing && client.spans.is_none() {
        trace::propagate(&mut parts.headers);
    }
    origin_form(parts);
}

/// The request as it goes to the pool. An untrusted client's request to a pool that
/// adds no field of its own has its fields written at once, as an HTTP/1 backend gets
/// them ([`headers::forwarded`]), and its map is left alone; any other goes through
/// [`prepare`]. Tracing and gRPC change fields on the way and take the map, as does
/// a pool that speaks only HTTP/2. A request whose map was never built (its fields as
/// they came, `http1::fields`) has its lines written from them.
fn outgoing(
    pool: &Pool,
    req: Request<Body>,
    client: &Client<'_>,
    deadline: Option<std::time::Instant>,
) -> Outgoing {
    let cfg = &pool.cfg;
    // Decided on the client's request, before `header_up` may add fields.
    let replayable = cfg.retry_on.any() && is_idempotent(&req, client.fields);
    let (mut parts, body) = req.into_parts();
    let lines = match client.fields {
        // What the route's and the generation's flags promised (`Route::reads_no_field`,
        // `Generation::defers_fields`): the map's way would write these lines too.
        Some(f) => {
            debug_assert!(!client.trusted && !client.tracing && client.spans.is_none());
            headers::forwarded(f, client.ip, client.scheme)
        }
        None if writes_lines(cfg, client) => {
            headers::forwarded(&parts.headers, client.ip, client.scheme)
        }
        None => None,
    };
    let mut out = match lines {
        Some(_) => {
            origin_form(&mut parts);
            // The lines carry the client's `Content-Length`, if it sent one.
            let fields = client.fields;
            Outgoing::framed(parts, body, |p| {
                fields.map_or_else(
                    || p.headers.contains_key(header::CONTENT_LENGTH),
                    Fields::has_length,
                )
            })
        }
        None => {
            // A `Connection` that names fields: the map after all.
            if let Some(f) = client.fields {
                parts.headers = f.to_map();
            }
            prepare_parts(pool, &mut parts, client);
            Outgoing::from_parts(parts, body)
        }
    };
    out.lines = lines;
    if replayable {
        out.keep_for_replay(cfg.retry_buffer);
    }
    out.deadline = deadline;
    out.as_sent = client.as_sent.map(|(rule, _)| rule);
    out
}

/// Whether a request whose map was built goes out as lines written at once: an
/// untrusted client, no tracing, not gRPC, and a pool that adds no field of its own
/// and whose peers may speak HTTP/1 (an `h2c://` pool's always take the map).
fn writes_lines(cfg: &crate::config::ProxyConfig, client: &Client<'_>) -> bool {
    !client.trusted
        && !client.tracing
        && client.spans.is_none()
        && !client.grpc
        && cfg.header_up.is_empty()
        && matches!(cfg.host, crate::config::HostMode::Keep)
        && cfg.scheme() != crate::config::BackendScheme::H2c
}

/// The target and version a backend gets: HTTP/1.1 (or HTTP/2 frames), the origin
/// form.
fn origin_form(parts: &mut http::request::Parts) {
    parts.version = Version::HTTP_11;
    if let Some(pq) = parts.uri.path_and_query() {
        parts.uri = Uri::from(pq.clone());
    }
}

/// Before an HTTP/2 backend: [`prepare`]'s work done on the map after all, for a
/// request whose lines were written for an HTTP/1 one ([`outgoing`]).
fn lines_to_map(pool: &Pool, out: &mut Outgoing, client: &Client<'_>) {
    if out.lines.take().is_some() {
        prepare_parts(pool, &mut out.parts, client);
    }
}

enum Attempt {
    /// The backend answered.
    Answered(Answer),
    /// The peer could not be reached; the request was not sent and may go elsewhere.
    Unreachable(DialError),
    /// The request went out (some of it, at least) and then failed.
    Failed(SendError),
    /// The attempt ended with an answer of sluice's own (503 out of capacity).
    Refused(Response<Body>),
}

/// A backend's answer: over HTTP/1.1 (its connection and response head), or on an
/// HTTP/2 stream.
pub(crate) enum Answer {
    /// With what is left of an upload the backend answered before it ended.
    H1(
        BackendConn,
        crate::http1::head::ResponseHead,
        Option<Box<crate::upstream::upload::Rest>>,
    ),
    H2(Response<::h2::RecvStream>, h2::Stream),
}

impl Answer {
    fn status(&self) -> StatusCode {
        match self {
            Answer::H1(_, head, _) => head.parts.status,
            Answer::H2(resp, _) => resp.status(),
        }
    }
}

/// How many times one attempt sends a request again on another connection because the
/// backend did not process it (a closed idle connection, a refused HTTP/2 stream).
const NOT_SENT_AGAIN: u32 = 3;

/// A fresh connection of a `proxy_protocol` pool starts with the header naming the
/// client; `false`: it could not be written (or there is no client to name).
pub(crate) async fn preface(pool: &Pool, conn: &mut BackendConn, client: &Client<'_>) -> bool {
    let Some(v) = pool.cfg.proxy_protocol else {
        return true;
    };
    let Some((from, to)) = client.addrs else {
        return false;
    };
    let header = crate::net::proxy_protocol::encode(v.into(), from, to);
    conn.write_preface(&header).await.is_ok()
}

/// Step 2: one peer, on the connection the pool gives ([`Pool::connect`]). A request
/// the connection never took goes out again on another (not a retry): after an idle
/// HTTP/1.1 connection that turned out closed, on a fresh one; after a refused HTTP/2
/// stream, on another stream, a few times.
///
/// A kept HTTP/1.1 connection the backend closed a moment ago may still take the
/// first write (the kernel accepts bytes for a peer that has closed): tokio's poller
/// has not reported the FIN yet, more likely the busier the worker. What follows
/// depends on whether the request can go out again ([`Stale`]).
async fn attempt(
    pool: &Pool,
    i: usize,
    out: &mut Outgoing,
    stale: Stale,
    client: &Client<'_>,
) -> Attempt {
    let peer = &pool.peers()[i];
    headers::finish_request(
        &mut out.parts.headers,
        &pool.cfg,
        peer.host_header.as_ref(),
        &client.values,
    );
    let mut again = 0;
    let mut fresh = false;
    loop {
        let sent = match pool.connect(i, fresh).await {
            Ok(Connection::Http2(mut st)) => {
                lines_to_map(pool, out, client);
                match Box::pin(send_h2(pool, i, &mut st, out, client.metered)).await {
                    Ok(resp) => return Attempt::Answered(Answer::H2(resp, st)),
                    Err(e) => e,
                }
            }
            Ok(Connection::Http1 { mut conn, reused }) => {
                if !reused && !preface(pool, &mut conn, client).await {
                    return not_taken();
                }
                let kept = reused && !fresh;
                if kept && stale == Stale::AskTheKernel && !conn.is_quiet_now() {
                    // Closed since tokio last heard from it: never tried, not counted.
                    fresh = true;
                    continue;
                }
                match send(pool, i, &mut conn, out, client.metered).await {
                    Ok(head) => {
                        return Attempt::Answered(Answer::H1(conn, head, out.upload.take()))
                    }
                    Err(SendError::NotSent) if reused => {
                        fresh = true;
                        continue;
                    }
                    Err(SendError::Unanswered(_)) if kept && stale == Stale::SendAgain => {
                        bump(&pool.state.stale_resends);
                        tracing::debug!(
                            pool = pool.name(),
                            peer = %peer.addr.text,
                            "sluice: {}: a kept connection to {} closed under a request; sent again on a new one",
                            pool.name(),
                            peer.addr.text
                        );
                        fresh = true;
                        continue;
                    }
                    Err(SendError::NotSent) => return not_taken(),
                    Err(e) => e,
                }
            }
            Err(ConnectError::Local) => return Attempt::Refused(out_of_capacity()),
            Err(ConnectError::Unreachable(e)) => return Attempt::Unreachable(e),
            // Only upgrades ask for what a scheme cannot carry.
            Err(ConnectError::Unsupported) => return not_taken(),
        };
        match sent {
            SendError::NotSent if again < NOT_SENT_AGAIN => again += 1,
            SendError::NotSent => return not_taken(),
            e => return Attempt::Failed(e),
        }
    }
}

/// What a request does about a kept connection the backend may have closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stale {
    /// An idempotent request without a body: it trusts the poller (no system call),
    /// and when the kept connection closes or is reset before a response byte
    /// ([`SendError::Unanswered`]) it goes out again on a new connection to the same
    /// peer, as nginx does for a cached connection. Once: a new connection that
    /// breaks is the attempt's failure. The new send has its own `timeout`, as nginx's
    /// next try has, so a backend that holds a request and drops it without a word
    /// is sent it twice, within twice the `timeout`.
    SendAgain,
    /// Any other (a POST, a PUT whose body is gone once sent): it asks the kernel
    /// first (`recv` with `MSG_PEEK`, one system call) and takes a new connection when
    /// the backend closed the kept one. A FIN still in flight then is the one case left,
    /// answered 502 as nginx does: such a request is never sent twice.
    AskTheKernel,
}

impl Stale {
    /// Of the client's request (a body first: a POST with one looks at no field), and
    /// the pool's `resend_stale` (`global { retries off }` sends nothing twice).
    fn of(req: &Request<Body>, fields: Option<&Fields>, cfg: &crate::config::ProxyConfig) -> Stale {
        use http_body::Body as _;
        match cfg.resend_stale && req.body().is_end_stream() && is_idempotent(req, fields) {
            true => Stale::SendAgain,
            false => Stale::AskTheKernel,
        }
    }
}

/// A fresh connection that did not take the request: the peer is unreachable for it.
fn not_taken() -> Attempt {
    let e = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    Attempt::Unreachable(DialError::Connect(e))
}

/// Step 3 over HTTP/2: as [`send`], on a stream of a session.
async fn send_h2(
    pool: &Pool,
    i: usize,
    st: &mut h2::Stream,
    out: &mut Outgoing,
    metered: bool,
) -> Result<Response<::h2::RecvStream>, SendError> {
    let scheme = pool.state.scheme.request_scheme();
    let cap = out.deadline;
    timed(pool, i, None, metered, cap, h2::send(st, out, scheme)).await
}

/// Step 3: the request out and the response head in, under `timeout` (504 past it,
/// which is not the peer's failure).
async fn send(
    pool: &Pool,
    i: usize,
    c: &mut BackendConn,
    out: &mut Outgoing,
    metered: bool,
) -> Result<crate::http1::head::ResponseHead, SendError> {
    let mut timer = c.timer.take();
    let cap = out.deadline;
    let r = timed(pool, i, Some(&mut timer), metered, cap, c.send(out)).await;
    c.timer = timer;
    r
}

/// A send under the pool's `timeout` (or the gRPC call's deadline, `cap`, when sooner),
/// its latency observed when it succeeds and `metered`. `kept`: a connection's own timer, to use (its deadline moved) or to leave
/// the one made in for next time; `None`: a timer on the stack, for this send only (an
/// HTTP/2 stream).
async fn timed<T>(
    pool: &Pool,
    i: usize,
    kept: Option<&mut crate::upstream::conn::KeptTimer>,
    metered: bool,
    cap: Option<std::time::Instant>,
    send: impl std::future::Future<Output = Result<T, SendError>>,
) -> Result<T, SendError> {
    use std::future::Future;
    use std::task::Poll;
    // A latency an operator reads is timed from now; a deadline from the poll's reading.
    let started = match metered {
        true => std::time::Instant::now(),
        false => crate::clock::coarse(),
    };
    let deadline = tokio::time::Instant::from_std(started);
    // A timeout no clock reaches (only an absurd config overflows the addition).
    let deadline = deadline
        .checked_add(pool.cfg.timeout)
        .unwrap_or_else(|| deadline + std::time::Duration::from_secs(86_400 * 365 * 30));
    let capped = cap.is_some_and(|c| tokio::time::Instant::from_std(c) < deadline);
    let deadline = match cap {
        Some(c) if capped => tokio::time::Instant::from_std(c),
        _ => deadline,
    };
    let mut fresh = std::pin::pin!(None);
    let mut sleep = match kept {
        Some(Some(sleep)) => {
            sleep.as_mut().reset(deadline);
            sleep.as_mut()
        }
        Some(slot) => slot
            .insert(Box::pin(tokio::time::sleep_until(deadline)))
            .as_mut(),
        None => {
            fresh.set(Some(tokio::time::sleep_until(deadline)));
            fresh.as_mut().as_pin_mut().expect("set just above")
        }
    };
    let mut send = std::pin::pin!(send);
    // The timer is polled outside tokio's cooperative budget, as `tokio::time::timeout`
    // does once the send used it up: a send that always spends it is still cut.
    let sent = std::future::poll_fn(|cx| match send.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(Ok(r)),
        Poll::Pending => std::pin::pin!(tokio::task::unconstrained(sleep.as_mut()))
            .poll(cx)
            .map(Err),
    });
    match sent.await {
        Ok(r) => {
            if metered && r.is_ok() {
                pool.state.upstream_seconds.observe(started.elapsed());
            }
            r
        }
        Err(_) => Err(timed_out(pool, i, capped)),
    }
}

/// No response head in time: the pool's `timeout`, or (`capped`) a gRPC call's
/// deadline, which is the client's choice and logged at `debug` only.
#[cold]
fn timed_out(pool: &Pool, i: usize, capped: bool) -> SendError {
    bump(&COUNTERS.gateway_timeout);
    let peer = &pool.peers()[i].addr.text;
    if capped {
        tracing::debug!(
            pool = pool.name(),
            peer = %peer,
            reason = "grpc-timeout",
            "sluice: {}: {peer} sent no response head before the call's grpc-timeout ran out",
            pool.name(),
        );
    } else {
        tracing::info!(
            pool = pool.name(),
            peer = %peer,
            reason = "timeout",
            "sluice: {}: {peer} sent no response head within {}",
            pool.name(),
            format_duration(pool.cfg.timeout)
        );
    }
    SendError::TimedOut
}

/// Step 4: the response, its body read from the backend as the client takes it.
fn stream(
    pool: &Pool,
    answer: Answer,
    lease: Lease,
    client: &Client<'_>,
    dialed: &Dialed,
) -> Response<Body> {
    let note = &dialed.note;
    let served = lease.peer;
    let served_pool = client.served.map(|_| lease.pool.clone());
    let (mut parts, body) = match answer {
        Answer::H1(conn, head, upload) => {
            if let (Some(fields), Some((_, cell))) = (head.fields, client.as_sent) {
                *cell
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fields);
            }
            let body = ResponseBody::new(conn, head.decoder, head.reusable, lease, upload);
            (head.parts, Body::stream(body))
        }
        Answer::H2(resp, st) => {
            let (mut parts, recv) = resp.into_parts();
            parts.version = Version::HTTP_11;
            let body = body::H2ResponseBody::new(h2::ResponseBody::new(recv, st), lease);
            (parts, Body::stream(body))
        }
    };
    headers::response(&mut parts.headers, &pool.cfg, &client.values);
    if pool.cfg.origin_headers || client.served.is_some() {
        let role = role_of(pool, served);
        let transition = note
            .transition
            .or_else(|| {
                let backups = !pool.cfg.backups.is_empty();
                backups
                    .then(|| pool.state.failover.take_pending(pool.peers()[served].role))
                    .flatten()
            })
            .map_or("none", |t| t.as_str());
        if pool.cfg.origin_headers {
            parts
                .headers
                .insert("x-sluice-origin", HeaderValue::from_static(role));
            parts.headers.insert(
                "x-sluice-origin-transition",
                HeaderValue::from_static(transition),
            );
        }
        if let (Some(cell), Some(pool)) = (client.served, served_pool) {
            let _ = cell.set(Served {
                pool,
                peer: served,
                attempts: dialed.attempts,
                role,
                transition,
                upstream: dialed.started.map(|t| t.elapsed()),
            });
        }
    }
    Response::from_parts(parts, body)
}

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

pub mod body;
pub mod headers;
pub mod trace;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use tokio::sync::OwnedSemaphorePermit;

pub use self::body::ResponseBody;
use crate::body::{Body, BodyError};
use crate::config::template::Values;
use crate::config::units::format_duration;
use crate::config::{BackendScheme, HashKey, Policy};
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};
use crate::tunnel::{Opened, Tunnel};
use crate::upstream::balancer::hash_bytes;
use crate::upstream::conn::{BackendConn, Outgoing, SendError};
use crate::upstream::connect::{ConnectError, Connection, Want};
use crate::upstream::dial::DialError;
use crate::upstream::h2;
use crate::upstream::{FailureKind, Lease, Note, Pick, Pool, Tried};

const BUSY: &str = "Server busy, retry in a moment\n";
const NO_CAPACITY: &str = "Edge out of connection capacity toward this site, retry in a moment\n";
const UNREACHABLE: &str = "Bad gateway: no backend could be reached\n";
const NO_UPGRADE: &str = "Bad gateway: the backend cannot take an upgrade\n";

/// Which pool and peer served a response — or, for sluice's own 502/504, the last peer
/// dialed — after how many attempts, with the failover role and transition (what
/// `X-Sluice-Origin*` say): noted for the access log (only when it is on).
#[derive(Clone)]
pub struct Served {
    pub pool: Arc<Pool>,
    pub peer: usize,
    pub attempts: u32,
    pub role: &'static str,
    pub transition: &'static str,
}

impl Served {
    pub fn pool_name(&self) -> &str {
        self.pool.name()
    }

    pub fn peer_address(&self) -> &str {
        &self.pool.peers()[self.peer].addr.text
    }
}

/// The client-side facts the proxy needs, as plain values.
pub struct Client<'a> {
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
    /// Where an upgraded connection goes, when the client's protocol can hand its
    /// connection over (HTTP/1.1); `None`: upgrades are not offered to backends.
    pub tunnel: Option<&'a std::sync::OnceLock<Box<Tunnel>>>,
    pub max_tunnels: u64,
    pub tunnel_drain: std::time::Duration,
    pub tunnel_idle: std::time::Duration,
}

pub async fn forward(pool: &Arc<Pool>, req: Request<Body>, client: &Client<'_>) -> Response<Body> {
    let mut dialed = Dialed::default();
    let resp = match (client.tunnel, upgrade_protocol(&req)) {
        // Boxed: rare, and inline its future would make every request's as large.
        (Some(slot), Some(protocol)) => {
            Box::pin(upgrade(pool, req, client, slot, protocol, &mut dialed)).await
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
            });
        }
    }
    resp
}

/// What a request's attempts came to, for its access log line.
#[derive(Default)]
struct Dialed {
    /// The last peer an attempt went to.
    peer: Option<usize>,
    attempts: u32,
    note: Note,
}

fn role_of(pool: &Pool, peer: usize) -> &'static str {
    pool.peers()[peer].role.as_str()
}

/// Step 1 to 4 for a plain request: a slot, then attempts until one answers or none
/// may be made.
async fn attempts(
    pool: &Arc<Pool>,
    req: Request<Body>,
    client: &Client<'_>,
    dialed: &mut Dialed,
) -> Response<Body> {
    let mut permit = match acquire_slot(pool).await {
        Ok(p) => p,
        Err(refusal) => return refusal,
    };
    let cfg = &pool.cfg;
    let key = hash_key(&cfg.lb, &req, client);
    let replayable = cfg.retry_on.any() && is_idempotent(&req);
    let mut out = Outgoing::new(prepare(pool, req, client));
    if replayable {
        out.keep_for_replay(cfg.retry_buffer);
    }
    let mut tried = Tried::default();
    let note = &mut dialed.note;
    let mut next = None;
    let mut switch_retried = false;
    loop {
        let pick = next
            .take()
            .map_or_else(|| pool.pick(&tried, key, note), Pick::Peer);
        let i = match peer_or_refusal(pick) {
            Ok(i) => i,
            Err(refusal) => return *refusal,
        };
        tried.add(i);
        dialed.peer = Some(i);
        dialed.attempts = tried.count as u32;
        let mut lease = Lease::new(pool.clone(), i, permit.take());
        let why = match attempt(pool, i, &mut out, client).await {
            Attempt::Answered(answer) => {
                let code = answer.status().as_u16();
                pool.record_answer(i, code);
                pool.failover_result(i, code < 500, note);
                if cfg.retry_on.status(code) {
                    if let Some(j) = retry_to(pool, &tried, key, &mut out, Retry::Status, note) {
                        // The answer is dropped unread: its connection closes with it.
                        tracing::debug!(
                            "sluice: {}: {} answered {code}; retrying on another backend",
                            pool.name(),
                            pool.peers()[i].addr.text
                        );
                        permit = lease.permit.take();
                        next = Some(j);
                        continue;
                    }
                }
                return stream(pool, answer, lease, client, note, tried.count as u32);
            }
            Attempt::Refused(resp) => return resp,
            Attempt::Unreachable(e) => {
                pool.unreachable(i, &e, note);
                // Not reached: the body is intact, so even a POST may go elsewhere.
                Retry::Unreachable
            }
            Attempt::Failed(e) => match retry_sent(pool, i, e, &tried, key, &mut out, note) {
                Ok(j) => {
                    next = Some(j);
                    permit = lease.permit.take();
                    continue;
                }
                Err(answer) => return *answer,
            },
        };
        permit = lease.permit.take();
        drop(lease);
        if !retry_unreached(pool, &tried, i, why, note, &mut switch_retried) {
            bump(&COUNTERS.bad_gateway);
            return local_response(StatusCode::BAD_GATEWAY, UNREACHABLE);
        }
    }
}

/// A request that reached peer `i` and then failed: the peer to send it to again
/// (`retry_on reset|timeout`, within the rules of [`retry_to`]), or the answer.
fn retry_sent(
    pool: &Pool,
    i: usize,
    e: SendError,
    tried: &Tried,
    key: Option<u64>,
    out: &mut Outgoing,
    note: &mut Note,
) -> Result<usize, Box<Response<Body>>> {
    if matches!(
        e,
        SendError::TimedOut | SendError::Io(_) | SendError::ClosedEarly
    ) {
        // A timeout or a broken connection is failover evidence, retried or not.
        pool.failover_result(i, false, note);
    }
    let why = match &e {
        SendError::TimedOut if pool.cfg.retry_on.timeout => Retry::Timeout,
        SendError::Io(_) | SendError::ClosedEarly if pool.cfg.retry_on.reset => Retry::Reset,
        _ => return Err(Box::new(sent_and_failed(pool, i, e))),
    };
    if why == Retry::Reset {
        pool.peer_failed(i, FailureKind::Broken, &e);
    }
    retry_to(pool, tried, key, out, why, note)
        .ok_or_else(|| Box::new(sent_and_failed_counted(pool, i, e, why == Retry::Reset)))
}

/// The peer a pick named, or sluice's own answer when there is none.
/// (Boxed: sluice's own answers are the rare path; the common one returns a word.)
fn peer_or_refusal(pick: Pick) -> Result<usize, Box<Response<Body>>> {
    match pick {
        Pick::Peer(i) => Ok(i),
        Pick::AllDown => Err(Box::new(local_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "No backend available\n",
        ))),
        Pick::Exhausted => {
            bump(&COUNTERS.bad_gateway);
            Err(Box::new(local_response(
                StatusCode::BAD_GATEWAY,
                UNREACHABLE,
            )))
        }
    }
}

/// Whether a request that never reached peer `i` goes to another: within `retries`,
/// or once on the new role when the failure made the pool switch (the request that
/// causes the switch still succeeds when a backup can serve it, DESIGN §14, §17) —
/// and within the retry budget either way.
fn retry_unreached(
    pool: &Pool,
    tried: &Tried,
    i: usize,
    why: Retry,
    note: &mut Note,
    switch_retried: &mut bool,
) -> bool {
    let within = tried.count <= pool.cfg.retries as usize;
    let on_new_role = !within && !*switch_retried && pool.switched_away_from(i, note);
    *switch_retried |= on_new_role;
    (within || on_new_role) && take_retry(pool, why)
}

/// Why a request goes to another backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Not reached: always allowed (within `retries` and the budget).
    Unreachable = 0,
    Reset = 1,
    Timeout = 2,
    Status = 3,
}

/// Takes a retry from the pool's budget and counts it.
fn take_retry(pool: &Pool, why: Retry) -> bool {
    if !pool.state.budget.try_retry(pool.cfg.retry_budget) {
        tracing::debug!(
            "sluice: {}: retry budget exhausted, not retrying",
            pool.name()
        );
        return false;
    }
    bump(&COUNTERS.retries);
    pool.state.retries[why as usize].fetch_add(1, Ordering::Relaxed);
    true
}

/// For a request that reached a backend: the peer to send it to again, if `retries`,
/// the replay buffer, another untried peer and the budget all allow it (in that order,
/// so the budget is spent only on a retry that happens).
fn retry_to(
    pool: &Pool,
    tried: &Tried,
    key: Option<u64>,
    out: &mut Outgoing,
    why: Retry,
    note: &mut Note,
) -> Option<usize> {
    if tried.count > pool.cfg.retries as usize {
        return None;
    }
    let Pick::Peer(j) = pool.pick(tried, key, note) else {
        return None;
    };
    if !out.can_rewind() || !take_retry(pool, why) {
        return None;
    }
    out.rewind();
    Some(j)
}

/// Methods that may be sent twice (RFC 9110 §9.2.2), or a request that says so with
/// `Idempotency-Key`.
fn is_idempotent(req: &Request<Body>) -> bool {
    use http::Method;
    matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    ) || req.headers().contains_key("idempotency-key")
}

/// The protocol an HTTP/1.1 request asks to switch to (`Upgrade`, with `upgrade` among
/// its `Connection` tokens) when it is one sluice passes on: WebSocket only. Any other
/// (`h2c` above all: a backend that switched would give the client a connection past
/// every filter) goes as a plain request, its `Upgrade` dropped as hop-by-hop.
fn upgrade_protocol(req: &Request<Body>) -> Option<HeaderValue> {
    let asks = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"));
    if !asks {
        return None;
    }
    let asked = req.headers().get(header::UPGRADE)?;
    asked
        .as_bytes()
        .trim_ascii()
        .eq_ignore_ascii_case(b"websocket")
        .then(|| asked.clone())
}

/// An upgrade (WebSocket) handshake: a fresh connection to one peer (never pooled,
/// never retried), a `limit` slot until the answer and a place under `max_tunnels`; a
/// `101` answer gives the slot back and leaves the connection in `slot` for the server
/// to join with the client's.
async fn upgrade(
    pool: &Arc<Pool>,
    req: Request<Body>,
    client: &Client<'_>,
    slot: &std::sync::OnceLock<Box<Tunnel>>,
    protocol: HeaderValue,
    dialed: &mut Dialed,
) -> Response<Body> {
    let cfg = &pool.cfg;
    let (permit, opened) = match admit_upgrade(pool, client).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let key = hash_key(&cfg.lb, &req, client);
    let mut req = prepare(pool, req, client);
    req.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    req.headers_mut().insert(header::UPGRADE, protocol);
    let mut out = Outgoing::new(req);
    let note = &mut dialed.note;
    let i = match peer_or_refusal(pool.pick(&Tried::default(), key, note)) {
        Ok(i) => i,
        Err(refusal) => return *refusal,
    };
    dialed.peer = Some(i);
    dialed.attempts = 1;
    let peer = &pool.peers()[i];
    let lease = Lease::new(pool.clone(), i, permit);
    headers::finish_request(
        &mut out.parts.headers,
        cfg,
        peer.host_header.as_ref(),
        &client.values,
    );
    let mut conn = match dial_upgrade(pool, i, note).await {
        Ok(c) => c,
        Err(refusal) => return refusal,
    };
    let head = match send(pool, i, &mut conn, &mut out).await {
        Ok(h) => h,
        Err(e) => return sent_and_failed(pool, i, e),
    };
    if head.parts.status != StatusCode::SWITCHING_PROTOCOLS {
        // Any other answer passes through as a response; the connection was asked to
        // switch, so it is never pooled.
        let mut head = head;
        head.reusable = false;
        return stream(pool, Answer::H1(conn, head), lease, client, note, 1);
    }
    let tunnel = Tunnel {
        conn,
        lease,
        opened,
        drain: client.tunnel_drain,
        idle: client.tunnel_idle,
    };
    switched(pool, head.parts, tunnel, client, slot)
}

/// Until the `101`, a handshake is a request like any other under `limit`; then a place
/// under `max_tunnels`. The slot first, so one waiting for it holds no tunnel place.
async fn admit_upgrade(
    pool: &Pool,
    client: &Client<'_>,
) -> Result<(Option<OwnedSemaphorePermit>, Opened), Response<Body>> {
    let permit = acquire_slot(pool).await?;
    let Some(opened) = Opened::try_open(client.max_tunnels) else {
        bump(&COUNTERS.limit_rejections);
        tracing::warn!(
            "sluice: {}: max_tunnels ({}) open, refused an upgrade",
            pool.name(),
            client.max_tunnels
        );
        return Err(local_response(StatusCode::SERVICE_UNAVAILABLE, BUSY));
    };
    Ok((permit, opened))
}

/// A fresh HTTP/1.1 connection for an upgrade; a peer that cannot be reached is
/// marked, and the answer is sluice's own.
async fn dial_upgrade(
    pool: &Pool,
    i: usize,
    note: &mut Note,
) -> Result<BackendConn, Response<Body>> {
    match pool.connect(i, Want::Upgrade).await {
        Ok(Connection::Http1 { conn, .. }) => Ok(conn),
        Ok(Connection::Http2(_)) => unreachable!("an upgrade is never given an HTTP/2 stream"),
        Err(ConnectError::Local(_)) => Err(out_of_capacity()),
        Err(ConnectError::Unsupported) => {
            bump(&COUNTERS.bad_gateway);
            Err(local_response(StatusCode::BAD_GATEWAY, NO_UPGRADE))
        }
        Err(ConnectError::Unreachable(e)) => {
            pool.unreachable(i, &e, note);
            bump(&COUNTERS.bad_gateway);
            Err(local_response(StatusCode::BAD_GATEWAY, UNREACHABLE))
        }
    }
}

/// The backend switched: the `101` for the client, and the tunnel left in `slot` for
/// the server to join. From here the tunnel counts under `max_tunnels`, not `limit`.
fn switched(
    pool: &Pool,
    mut parts: http::response::Parts,
    mut tunnel: Tunnel,
    client: &Client<'_>,
    slot: &std::sync::OnceLock<Box<Tunnel>>,
) -> Response<Body> {
    drop(tunnel.lease.permit.take());
    let switched_to = parts.headers.get(header::UPGRADE).cloned();
    headers::response(&mut parts.headers, &pool.cfg, &client.values);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(p) = switched_to {
        parts.headers.insert(header::UPGRADE, p);
    }
    tunnel.conn.keepalive();
    let _ = slot.set(Box::new(tunnel));
    Response::from_parts(parts, Body::Empty)
}

/// Step 1: a slot under the pool's `limit`, waiting up to its WAIT. `Err`: the 503.
async fn acquire_slot(pool: &Pool) -> Result<Option<OwnedSemaphorePermit>, Response<Body>> {
    let Some(sem) = &pool.limit else {
        return Ok(None);
    };
    // A free slot is taken without arming a timer.
    if let Ok(p) = sem.clone().try_acquire_owned() {
        return Ok(Some(p));
    }
    let wait = pool.cfg.limit.map(|l| l.wait).unwrap_or_default();
    if let Ok(Ok(p)) = tokio::time::timeout(wait, sem.clone().acquire_owned()).await {
        return Ok(Some(p));
    }
    bump(&COUNTERS.limit_rejections);
    tracing::debug!(
        "sluice: {}: limit of {} in flight reached, refused a request",
        pool.name(),
        pool.cfg.limit.map_or(0, |l| l.max)
    );
    let mut r = local_response(StatusCode::SERVICE_UNAVAILABLE, BUSY);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
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
    headers::request(
        &mut parts.headers,
        client.ip,
        client.scheme,
        client.trusted,
        &pool.cfg,
    );
    if client.tracing {
        trace::propagate(&mut parts.headers);
    }
    parts.version = Version::HTTP_11;
    if let Some(pq) = parts.uri.path_and_query() {
        parts.uri = Uri::from(pq.clone());
    }
    Request::from_parts(parts, body)
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
pub enum Answer {
    H1(BackendConn, crate::http1::head::ResponseHead),
    H2(Response<::h2::RecvStream>, h2::Stream),
}

impl Answer {
    fn status(&self) -> StatusCode {
        match self {
            Answer::H1(_, head) => head.parts.status,
            Answer::H2(resp, _) => resp.status(),
        }
    }
}

/// How many times one attempt sends a request again on another connection because the
/// backend did not process it (a closed idle connection, a refused HTTP/2 stream).
const NOT_SENT_AGAIN: u32 = 3;

/// Step 2: one peer, on the connection the pool gives ([`Pool::connect`]). A request
/// the connection never took goes out again on another (not a retry): after an idle
/// HTTP/1.1 connection that turned out closed, on a fresh one; after a refused HTTP/2
/// stream, on another stream, a few times.
async fn attempt(pool: &Pool, i: usize, out: &mut Outgoing, client: &Client<'_>) -> Attempt {
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
        let sent = match pool.connect(i, Want::Request { fresh }).await {
            Ok(Connection::Http2(st)) => match Box::pin(send_h2(pool, i, &st, out)).await {
                Ok(resp) => return Attempt::Answered(Answer::H2(resp, st)),
                Err(e) => e,
            },
            Ok(Connection::Http1 { mut conn, reused }) => {
                match send(pool, i, &mut conn, out).await {
                    Ok(head) => return Attempt::Answered(Answer::H1(conn, head)),
                    Err(SendError::NotSent) if reused => {
                        fresh = true;
                        continue;
                    }
                    Err(SendError::NotSent) => return not_taken(),
                    Err(e) => e,
                }
            }
            Err(ConnectError::Local(_)) => return Attempt::Refused(out_of_capacity()),
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

/// A fresh connection that did not take the request: the peer is unreachable for it.
fn not_taken() -> Attempt {
    let e = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    Attempt::Unreachable(DialError::Connect(e))
}

/// Step 3 over HTTP/2: as [`send`], on a stream of a session.
async fn send_h2(
    pool: &Pool,
    i: usize,
    st: &h2::Stream,
    out: &mut Outgoing,
) -> Result<Response<::h2::RecvStream>, SendError> {
    let scheme = match pool.state.scheme {
        BackendScheme::Https => "https",
        _ => "http",
    };
    timed(pool, i, h2::send(st, out, scheme)).await
}

/// Step 3: the request out and the response head in, under `timeout` (504 past it,
/// which is not the peer's failure).
async fn send(
    pool: &Pool,
    i: usize,
    c: &mut BackendConn,
    out: &mut Outgoing,
) -> Result<crate::http1::head::ResponseHead, SendError> {
    timed(pool, i, c.send(out)).await
}

/// A send under the pool's `timeout`, its latency observed when it succeeds.
async fn timed<T>(
    pool: &Pool,
    i: usize,
    send: impl std::future::Future<Output = Result<T, SendError>>,
) -> Result<T, SendError> {
    let started = std::time::Instant::now();
    match tokio::time::timeout(pool.cfg.timeout, send).await {
        Ok(r) => {
            if r.is_ok() {
                pool.state.upstream_seconds.observe(started.elapsed());
            }
            r
        }
        Err(_) => {
            bump(&COUNTERS.gateway_timeout);
            tracing::info!(
                "sluice: {}: {} sent no response head within {}",
                pool.name(),
                pool.peers()[i].addr.text,
                format_duration(pool.cfg.timeout)
            );
            Err(SendError::TimedOut)
        }
    }
}

/// Step 4: the response, its body read from the backend as the client takes it.
fn stream(
    pool: &Pool,
    answer: Answer,
    lease: Lease,
    client: &Client<'_>,
    note: &Note,
    attempts: u32,
) -> Response<Body> {
    let served = lease.peer;
    let served_pool = client.served.map(|_| lease.pool.clone());
    let (mut parts, body) = match answer {
        Answer::H1(conn, head) => {
            let body = ResponseBody::new(conn, head.decoder, head.reusable, lease);
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
                attempts,
                role,
                transition,
            });
        }
    }
    Response::from_parts(parts, body)
}

/// 503 for local exhaustion (ports, descriptors): not the backend's fault (the
/// connector counted and logged it).
fn out_of_capacity() -> Response<Body> {
    let mut resp = local_response(StatusCode::SERVICE_UNAVAILABLE, NO_CAPACITY);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The request went out and then failed: never retried.
fn sent_and_failed(pool: &Pool, peer: usize, e: SendError) -> Response<Body> {
    sent_and_failed_counted(pool, peer, e, false)
}

/// As [`sent_and_failed`]; `counted`: the peer's failure was recorded already.
fn sent_and_failed_counted(
    pool: &Pool,
    peer: usize,
    e: SendError,
    counted: bool,
) -> Response<Body> {
    match e {
        SendError::TimedOut => local_response(StatusCode::GATEWAY_TIMEOUT, "Gateway timeout\n"),
        SendError::Body(BodyError::TooLarge(_)) => {
            bump(&COUNTERS.body_too_large);
            local_response(StatusCode::PAYLOAD_TOO_LARGE, "Request body too large\n")
        }
        SendError::Unsendable(why) => {
            crate::throttle::H2_UNSENDABLE.warn(format_args!(
                "sluice: {}: {why}; answered 502 to that client ({} keeps its place in rotation)",
                pool.name(),
                pool.peers()[peer].addr.text
            ));
            bump(&COUNTERS.bad_gateway);
            local_response(
                StatusCode::BAD_GATEWAY,
                "Bad gateway: the request cannot be sent over HTTP/2\n",
            )
        }
        SendError::Body(other) => {
            tracing::debug!("sluice: {}: request body failed: {other}", pool.name());
            local_response(
                StatusCode::BAD_REQUEST,
                "Bad request: broken request body\n",
            )
        }
        e => {
            let kind = match e {
                SendError::Invalid(_) => FailureKind::Invalid,
                _ => FailureKind::Broken,
            };
            if !counted {
                pool.peer_failed(peer, kind, &e);
            }
            bump(&COUNTERS.bad_gateway);
            local_response(
                StatusCode::BAD_GATEWAY,
                "Bad gateway: the backend connection broke\n",
            )
        }
    }
}

//! The `proxy` handler: takes a pool slot, picks a peer, gets a connection (idle or
//! fresh), sends the request and streams the answer back.
//!
//! Rules that are the product (DESIGN.md §8.6–8.8): a request goes to another peer only
//! when the first could not be reached, so its body is intact; once it reached a
//! backend it is never sent again, and the backend's own answer (a 500, say) passes
//! unchanged. Client faults (a broken body, `max_body`) and a slow backend (`timeout`)
//! never count against a peer. Never buffers a body.

pub mod body;
pub mod headers;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;

use self::body::Lease;
pub use self::body::ResponseBody;
use crate::body::{Body, BodyError};
use crate::runtime::local_response;
use crate::stats::{bump, COUNTERS};
use crate::upstream::conn::SendError;
use crate::upstream::dial::{self, DialError};
use crate::upstream::{Pick, Pool, Tried};

const BUSY: &str = "Server busy, retry in a moment\n";
const NO_CAPACITY: &str = "Edge out of connection capacity toward this site, retry in a moment\n";

/// The client-side facts the proxy needs.
pub struct Client<'a> {
    pub addr: &'a crate::server::ClientAddr,
    pub trusted: bool,
}

pub async fn forward(
    pool: &Arc<Pool>,
    mut req: Request<Body>,
    client: &Client<'_>,
) -> Response<Body> {
    let cfg = &pool.cfg;
    if let Some(max) = cfg.max_body {
        if let Some(resp) = check_declared_body(&req, max) {
            return resp;
        }
        if !req.body().is_end_stream() {
            req = req.map(|b| b.limited(max));
        }
    }
    let permit = match &pool.limit {
        None => None,
        Some(sem) => {
            let wait = cfg.limit.map(|l| l.wait).unwrap_or_default();
            // A free slot is taken without arming a timer.
            let permit = match sem.clone().try_acquire_owned() {
                Ok(p) => Ok(p),
                Err(_) => match tokio::time::timeout(wait, sem.clone().acquire_owned()).await {
                    Ok(Ok(p)) => Ok(p),
                    _ => Err(()),
                },
            };
            match permit {
                Ok(p) => Some(p),
                Err(()) => {
                    bump(&COUNTERS.limit_rejections);
                    tracing::debug!(
                        "sluice: {}: limit of {} in flight reached, refused a request",
                        pool.name,
                        sem.available_permits()
                    );
                    let mut r = local_response(StatusCode::SERVICE_UNAVAILABLE, BUSY);
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
                    return r;
                }
            }
        }
    };

    let (mut parts, body) = req.into_parts();
    headers::request(
        &mut parts.headers,
        &client.addr.ip_value,
        client.trusted,
        cfg,
    );
    parts.version = Version::HTTP_11;
    if let Some(pq) = parts.uri.path_and_query() {
        parts.uri = Uri::from(pq.clone());
    }
    let mut req = Some(Request::from_parts(parts, body));
    let mut permit = permit;
    let mut tried = Tried::default();
    loop {
        let i = match pool.pick(&tried) {
            Pick::Peer(i) => i,
            Pick::AllDown => {
                return local_response(StatusCode::SERVICE_UNAVAILABLE, "No backend available\n");
            }
            Pick::Exhausted => {
                bump(&COUNTERS.bad_gateway);
                return local_response(
                    StatusCode::BAD_GATEWAY,
                    "Bad gateway: no backend could be reached\n",
                );
            }
        };
        if tried.count > 0 {
            bump(&COUNTERS.retries);
        }
        tried.add(i);
        let peer = &pool.peers[i];
        peer.selections.fetch_add(1, Ordering::Relaxed);
        let mut lease = Lease::new(pool.clone(), i, permit.take());
        let mut r = req.take().expect("the request is kept until it is sent");
        headers::finish_request(r.headers_mut(), cfg, peer.host_header.as_ref());

        // An idle connection first; one that turns out closed before the request went
        // out hands the request back, and it goes out on a fresh connection (not a retry).
        let mut conn = peer.idle.checkout(cfg.keepalive.idle_timeout);
        let outcome = loop {
            let fresh = conn.is_none();
            let mut c = match conn.take() {
                Some(c) => c,
                None => match dial::connect(&peer.addr.target, cfg.connect_timeout).await {
                    Ok(c) => {
                        peer.passive.record_success();
                        c
                    }
                    Err(e) => break Err((e, r)),
                },
            };
            match tokio::time::timeout(cfg.timeout, c.send(r)).await {
                Err(_) => {
                    bump(&COUNTERS.gateway_timeout);
                    tracing::info!(
                        "sluice: {}: {} sent no response head within {}",
                        pool.name,
                        peer.addr.text,
                        crate::config::units::format_duration(cfg.timeout)
                    );
                    return local_response(StatusCode::GATEWAY_TIMEOUT, "Gateway timeout\n");
                }
                Ok(Ok(head)) => break Ok((c, head)),
                Ok(Err(SendError::NotSent(back))) if !fresh => r = *back,
                Ok(Err(SendError::NotSent(back))) => {
                    let e = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                    break Err((DialError::Connect(e), *back));
                }
                Ok(Err(e)) => return sent_and_failed(pool, i, e),
            }
        };
        match outcome {
            Ok((c, head)) => {
                let mut parts = head.parts;
                headers::response(&mut parts.headers, cfg);
                let body = ResponseBody::new(c, head.decoder, head.reusable, lease);
                return Response::from_parts(parts, Body::Proxied(body));
            }
            Err((DialError::Local(e), _)) => {
                bump(&COUNTERS.out_of_ports);
                tracing::warn!(
                    "sluice: {}: cannot dial {}: {e}; out of local capacity, backend state unchanged",
                    pool.name,
                    peer.addr.text
                );
                let mut resp = local_response(StatusCode::SERVICE_UNAVAILABLE, NO_CAPACITY);
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return resp;
            }
            Err((e, back)) => {
                pool.peer_failed(i, &e);
                permit = lease.permit.take();
                drop(lease);
                if tried.count > cfg.retries as usize {
                    bump(&COUNTERS.bad_gateway);
                    return local_response(
                        StatusCode::BAD_GATEWAY,
                        "Bad gateway: no backend could be reached\n",
                    );
                }
                // Not reached: the body is intact, so even a POST may go elsewhere.
                req = Some(back);
            }
        }
    }
}

/// The request went out and then failed: never retried.
fn sent_and_failed(pool: &Pool, peer: usize, e: SendError) -> Response<Body> {
    match e {
        SendError::Body(BodyError::TooLarge(_)) => {
            bump(&COUNTERS.body_too_large);
            local_response(StatusCode::PAYLOAD_TOO_LARGE, "Request body too large\n")
        }
        SendError::Body(other) => {
            tracing::debug!("sluice: {}: request body failed: {other}", pool.name);
            local_response(
                StatusCode::BAD_REQUEST,
                "Bad request: broken request body\n",
            )
        }
        e => {
            pool.peer_failed(peer, &e);
            bump(&COUNTERS.bad_gateway);
            local_response(
                StatusCode::BAD_GATEWAY,
                "Bad gateway: the backend connection broke\n",
            )
        }
    }
}

/// 413 for a declared Content-Length over `max`, before anything is sent.
pub fn check_declared_body(req: &Request<Body>, max: u64) -> Option<Response<Body>> {
    let declared = req.body().size_hint().exact().or_else(|| {
        req.headers()
            .get(header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    });
    if declared.is_some_and(|n| n > max) {
        bump(&COUNTERS.body_too_large);
        return Some(local_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large\n",
        ));
    }
    None
}

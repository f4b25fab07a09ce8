//! WebSocket upgrades (DESIGN §8.11): the handshake goes to one peer on a fresh
//! HTTP/1.1 connection (never pooled; a peer that cannot be reached is marked and the
//! next one tried, but a handshake sent is never sent again) under the pool's `limit`; a `101`
//! gives the slot back and leaves the connection with the server, to be joined with
//! the client's as a tunnel counted under `max_tunnels`.

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};

use super::refusal::{no_backend, out_of_capacity, sent_and_failed, BUSY, UNREACHABLE};
use super::{acquire_slot, hash_key, headers, prepare, send, stream, Answer, Client, Dialed};
use crate::body::Body;
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};
use crate::tunnel::{Opened, Tunnel};
use crate::upstream::conn::{BackendConn, Outgoing};
use crate::upstream::connect::{Passage, Unreached};
use crate::upstream::limit::Slot;
use crate::upstream::{Lease, Pool, Tried};

const NO_UPGRADE: &str = "Bad gateway: the backend cannot take an upgrade\n";

/// The protocol an HTTP/1.1 request asks to switch to (`Upgrade`, with `upgrade` among
/// its `Connection` tokens) when it is one sluice passes on: WebSocket, and the tokens
/// the pool's `upgrade` lists (DESIGN §18.4). Any other (`h2c` above all, which no
/// `upgrade` may list: a backend that switched would give the client a connection past
/// every filter) goes as a plain request, its `Upgrade` dropped as hop-by-hop.
#[inline]
pub(super) fn upgrade_protocol(req: &Request<Body>, also: &[String]) -> Option<HeaderValue> {
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
    let token = asked.as_bytes().trim_ascii();
    let relayed = is_websocket(asked)
        || also
            .iter()
            .any(|t| token.eq_ignore_ascii_case(t.as_bytes()));
    relayed.then(|| asked.clone())
}

/// Whether `protocol` is WebSocket (which `websocket off` refuses).
pub(super) fn is_websocket(protocol: &HeaderValue) -> bool {
    protocol
        .as_bytes()
        .trim_ascii()
        .eq_ignore_ascii_case(b"websocket")
}

/// An upgrade (WebSocket) handshake: a fresh connection to one peer (never pooled,
/// never retried), a `limit` slot until the answer and a place under `max_tunnels`; a
/// `101` answer gives the slot back and leaves the connection in `slot` for the server
/// to join with the client's.
pub(super) async fn upgrade(
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
    let (mut conn, mut lease) = match dial_upgrade(pool, key, dialed).await {
        Ok(c) => c,
        Err(refusal) => return refusal,
    };
    lease.permit = permit;
    let i = lease.peer;
    let peer = &pool.peers()[i];
    headers::finish_request(
        &mut out.parts.headers,
        cfg,
        peer.host_header.as_ref(),
        &client.values,
    );
    if !super::preface(pool, &mut conn, client).await {
        bump(&COUNTERS.bad_gateway);
        return local_response(StatusCode::BAD_GATEWAY, UNREACHABLE);
    }
    let head = match send(pool, i, &mut conn, &mut out, client.metered).await {
        Ok(h) => h,
        Err(e) => return sent_and_failed(pool, i, e),
    };
    if head.parts.status != StatusCode::SWITCHING_PROTOCOLS {
        // Any other answer passes through as a response; the connection was asked to
        // switch, so it is never pooled.
        let mut head = head;
        head.reusable = false;
        let upload = out.upload.take();
        return stream(pool, Answer::H1(conn, head, upload), lease, client, dialed);
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
) -> Result<(Option<Slot>, Opened), Response<Body>> {
    let permit = acquire_slot(pool, None).await?;
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

/// A fresh HTTP/1.1 connection for an upgrade, and its peer (`Pool::reach`: a peer
/// that cannot be reached is marked and the next one tried); else sluice's own answer.
async fn dial_upgrade(
    pool: &Arc<Pool>,
    key: Option<u64>,
    dialed: &mut Dialed,
) -> Result<(BackendConn, Lease), Response<Body>> {
    let mut tried = Tried::default();
    let reached = pool
        .reach(Passage::Upgrade, key, &mut tried, &mut dialed.note)
        .await;
    dialed.attempts = tried.count as u32;
    match reached {
        Ok((conn, lease)) => {
            dialed.peer = Some(lease.peer);
            Ok((conn, lease))
        }
        Err(Unreached::AllDown) => Err(no_backend()),
        Err(Unreached::Local(i)) => {
            dialed.peer = Some(i);
            Err(out_of_capacity())
        }
        Err(Unreached::Unsupported(i)) => {
            dialed.peer = Some(i);
            bump(&COUNTERS.bad_gateway);
            Err(local_response(StatusCode::BAD_GATEWAY, NO_UPGRADE))
        }
        Err(Unreached::Exhausted(last)) => {
            dialed.peer = last;
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

//! sluice's own answers when no backend's can be passed on: no peer to try, a peer
//! that could not be reached, a request that reached one and then failed, this host
//! out of capacity. Each is counted, and a failure that is the peer's is recorded
//! against it (once).

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::{Body, BodyError};
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};
use crate::upstream::conn::SendError;
use crate::upstream::{FailureKind, Pick, Pool};

pub(super) const BUSY: &str = "Server busy, retry in a moment\n";
const NO_CAPACITY: &str = "Edge out of connection capacity toward this site, retry in a moment\n";
pub(super) const UNREACHABLE: &str = "Bad gateway: no backend could be reached\n";

/// `403` to a WebSocket handshake for a pool with `websocket off`.
pub(super) fn no_websocket(pool: &Pool) -> Response<Body> {
    tracing::debug!(
        pool = pool.name(),
        "sluice: {}: refused a websocket upgrade (websocket off)",
        pool.name()
    );
    local_response(
        StatusCode::FORBIDDEN,
        "Forbidden: WebSocket upgrades are off here\n",
    )
}

/// The peer a pick named, or sluice's own answer when there is none.
/// (Boxed: sluice's own answers are the rare path; the common one returns a word.)
pub(super) fn peer_or_refusal(pick: Pick) -> Result<usize, Box<Response<Body>>> {
    match pick {
        Pick::Peer(i) => Ok(i),
        Pick::AllDown => Err(Box::new(no_backend())),
        Pick::Exhausted => {
            bump(&COUNTERS.bad_gateway);
            Err(Box::new(local_response(
                StatusCode::BAD_GATEWAY,
                UNREACHABLE,
            )))
        }
    }
}

/// 503: no peer may be tried (every one down, and `all_down fail`).
pub(super) fn no_backend() -> Response<Body> {
    local_response(StatusCode::SERVICE_UNAVAILABLE, "No backend available\n")
}

/// 503 for local exhaustion (ports, descriptors): not the backend's fault (the
/// connector counted and logged it).
pub(super) fn out_of_capacity() -> Response<Body> {
    let mut resp = local_response(StatusCode::SERVICE_UNAVAILABLE, NO_CAPACITY);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The request went out and then failed: never retried.
pub(super) fn sent_and_failed(pool: &Pool, peer: usize, e: SendError) -> Response<Body> {
    sent_and_failed_counted(pool, peer, e, false)
}

/// As [`sent_and_failed`]; `counted`: the peer's failure was recorded already.
pub(super) fn sent_and_failed_counted(
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

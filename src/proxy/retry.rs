//! When a request goes to another backend (DESIGN §8.6, §14): one that never reached
//! a peer may always go elsewhere (its body is intact), within `retries` — or once on
//! the new role when its failure made the pool fail over; one that reached a backend
//! goes again only as `retry_on` allows, with its body in the replay buffer. Every
//! retry is taken from the pool's retry budget and counted by reason.

use std::sync::atomic::Ordering;

use http::{Request, Response};

use super::refusal::{sent_and_failed, sent_and_failed_counted};
use crate::body::Body;
use crate::http1::fields::Fields;
use crate::stats::{bump, COUNTERS};
use crate::upstream::conn::{Outgoing, SendError};
use crate::upstream::{FailureKind, Note, Pick, Pool, Tried};

/// A request that reached peer `i` and then failed: the peer to send it to again
/// (`retry_on reset|timeout`, within the rules of [`retry_to`]), or the answer.
pub(super) fn retry_sent(
    pool: &Pool,
    i: usize,
    e: SendError,
    tried: &Tried,
    key: Option<u64>,
    out: &mut Outgoing,
    note: &mut Note,
) -> Result<usize, Box<Response<Body>>> {
    let why = match &e {
        SendError::TimedOut if pool.cfg.retry_on.timeout => Retry::Timeout,
        SendError::Io(_) | SendError::ClosedEarly | SendError::Unanswered(_)
            if pool.cfg.retry_on.reset =>
        {
            Retry::Reset
        }
        _ => return Err(Box::new(sent_and_failed(pool, i, e))),
    };
    if why == Retry::Reset {
        pool.peer_failed(i, FailureKind::Broken, &e);
    }
    retry_to(pool, tried, key, out, why, note)
        .ok_or_else(|| Box::new(sent_and_failed_counted(pool, i, e, why == Retry::Reset)))
}

/// Whether a request that never reached peer `i` goes to another: within `retries`,
/// or once on the new role when the failure made the pool switch (the request that
/// causes the switch still succeeds when a backup can serve it, DESIGN §14, §17) —
/// and within the retry budget either way.
pub(super) fn retry_unreached(
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
pub(super) enum Retry {
    /// Not reached: always allowed (within `retries` and the budget).
    Unreachable = 0,
    Reset = 1,
    Timeout = 2,
    Status = 3,
}

/// Takes a retry from the pool's budget and counts it.
pub(super) fn take_retry(pool: &Pool, why: Retry) -> bool {
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
pub(super) fn retry_to(
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
/// `fields`: the request's fields as they came, when its map was not built.
#[inline]
pub(super) fn is_idempotent(req: &Request<Body>, fields: Option<&Fields>) -> bool {
    use http::Method;
    matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    ) || match fields {
        Some(f) => f.get(b"idempotency-key").is_some(),
        None => req.headers().contains_key("idempotency-key"),
    }
}

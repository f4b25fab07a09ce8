//! Active health (DESIGN.md §8.4): each peer of a pool with `health` is probed every
//! `interval` from the moment the pool exists — an HTTP request (`GET`/`HEAD` of the
//! path, `User-Agent: sluice-health-check`, no cookies, auth or body, no redirect
//! followed, the response body never read) or a bare connect. `rise` consecutive passes
//! make an unhealthy peer healthy, `fall` consecutive failures a healthy one unhealthy.
//!
//! Probes use their own connections, never the request pool nor its `limit`; at most
//! `probe_concurrency` run at once across the process (a semaphore the generations
//! share); a tick still running when the next is due is skipped. The probe task stops
//! the moment its pool state is retired, and aborts the probes it has under way, so no
//! probe reaches a backend after its pool left the live generation.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Method, Request};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use super::conn::Outgoing;
use super::{dial, Peer, PoolState};
use crate::body::Body;
use crate::config::{Health, Probe};

/// One peer's active health: the verdict and the streak that leads to the next one.
#[derive(Debug)]
pub(crate) struct Verdict {
    healthy: AtomicBool,
    /// Consecutive probes disagreeing with the verdict.
    streak: AtomicU32,
    pub probes_passed: AtomicU64,
    pub probes_failed: AtomicU64,
    pub transitions: AtomicU64,
    /// When the last probe ended (`passive::now_ms`), 0 for never; and whether it passed.
    pub last_probe_ms: AtomicU64,
    pub last_passed: AtomicBool,
    /// When the verdict last changed (`now_ms`), 0 for never.
    pub changed_ms: AtomicU64,
    /// Why the last failed probe failed (written by the probe task only).
    pub last_error: std::sync::Mutex<Option<String>>,
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict {
            healthy: AtomicBool::new(true),
            streak: AtomicU32::new(0),
            probes_passed: AtomicU64::new(0),
            probes_failed: AtomicU64::new(0),
            transitions: AtomicU64::new(0),
            last_probe_ms: AtomicU64::new(0),
            last_passed: AtomicBool::new(false),
            changed_ms: AtomicU64::new(0),
            last_error: std::sync::Mutex::new(None),
        }
    }
}

/// A change of verdict a probe caused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    BecameHealthy,
    BecameUnhealthy,
}

impl Verdict {
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Back to healthy with no streak: the verdict of a pool without `health`.
    pub(crate) fn clear(&self) {
        self.healthy.store(true, Ordering::Relaxed);
        self.streak.store(0, Ordering::Relaxed);
    }

    pub(crate) fn set_initial(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Counts one probe's result; returns the transition it completes, if any. Only the
    /// probe task writes, so plain loads and stores suffice.
    pub(crate) fn record(&self, passed: bool, rise: u32, fall: u32) -> Option<Transition> {
        let counter = if passed {
            &self.probes_passed
        } else {
            &self.probes_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.last_probe_ms
            .store(crate::clock::now_ms(), Ordering::Relaxed);
        self.last_passed.store(passed, Ordering::Relaxed);
        let healthy = self.is_healthy();
        if passed == healthy {
            self.streak.store(0, Ordering::Relaxed);
            return None;
        }
        let streak = self.streak.load(Ordering::Relaxed) + 1;
        let needed = if healthy { fall } else { rise };
        if streak < needed {
            self.streak.store(streak, Ordering::Relaxed);
            return None;
        }
        self.streak.store(0, Ordering::Relaxed);
        self.healthy.store(passed, Ordering::Relaxed);
        self.changed_ms
            .store(crate::clock::now_ms(), Ordering::Relaxed);
        self.transitions.fetch_add(1, Ordering::Relaxed);
        Some(if passed {
            Transition::BecameHealthy
        } else {
            Transition::BecameUnhealthy
        })
    }
}

/// Probes the state's peers until it is retired or dropped.
pub(crate) async fn run(
    state: Weak<PoolState>,
    retire: Arc<Notify>,
    slots: Arc<Semaphore>,
    name: String,
) {
    let mut next = tokio::time::Instant::now();
    loop {
        let retired = retire.notified();
        tokio::pin!(retired);
        retired.as_mut().enable();
        let (health, peers) = {
            let Some(s) = state.upgrade() else { return };
            if s.is_retired() {
                return;
            }
            let settings = s.settings();
            let Some(h) = settings.health.clone() else {
                if s.stop_probing() {
                    return;
                }
                continue;
            };
            (h, s.peers())
        };
        let mut probes = JoinSet::new();
        for peer in peers.iter() {
            let (state, slots, health) = (state.clone(), slots.clone(), health.clone());
            let peer = peer.clone();
            probes.spawn(async move {
                let _slot = slots.acquire_owned().await.ok()?;
                let s = state.upgrade()?;
                let result = probe(&s, &peer, &health).await;
                Some((peer, result))
            });
        }
        drop(peers);
        loop {
            tokio::select! {
                r = probes.join_next() => match r {
                    None => break,
                    Some(Ok(Some((peer, result)))) => {
                        let Some(s) = state.upgrade() else { return };
                        if s.settings().health.is_none() {
                            // Removed by a reload mid-round: the verdicts were cleared.
                            continue;
                        }
                        let result = match result {
                            Err(ProbeError::Local(why)) => {
                                not_run(&name, &peer, &why);
                                continue;
                            }
                            Err(ProbeError::Failed(why)) => Err(why),
                            Ok(()) => Ok(()),
                        };
                        let passed = result.is_ok();
                        report(&name, &peer, &health, result);
                        // A discovered peer that left meanwhile says nothing of the pool.
                        if s.peers().iter().any(|p| Arc::ptr_eq(p, &peer)) {
                            s.probe_for_failover(&name, &peer, passed);
                        }
                    }
                    Some(_) => {}
                },
                // Dropping the set aborts the probes under way.
                _ = &mut retired => return,
            }
        }
        // The next tick; ticks missed while this one ran are skipped.
        let now = tokio::time::Instant::now();
        next += health.interval;
        while next <= now {
            next += health.interval;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = retired => return,
        }
    }
}

fn report(pool: &str, peer: &Peer, h: &Health, result: Result<(), String>) {
    if let Err(why) = &result {
        tracing::debug!(
            "sluice: {pool}: health probe of {} failed: {why}",
            peer.addr.text
        );
        *peer
            .active
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
    }
    match peer.active.record(result.is_ok(), h.rise, h.fall) {
        Some(Transition::BecameUnhealthy) => {
            let why = result.err().unwrap_or_default();
            tracing::warn!(
                pool,
                peer = %peer.addr.text,
                reason = "health",
                "sluice: {pool}: {} failed its health check ({why}); out of rotation until it passes",
                peer.addr.text
            )
        }
        Some(Transition::BecameHealthy) => {
            peer.returns_at(crate::clock::now_ms());
            tracing::info!(
                pool,
                peer = %peer.addr.text,
                "sluice: {pool}: {} passes its health check again",
                peer.addr.text
            )
        }
        None => {}
    }
}

/// Why a probe did not pass.
enum ProbeError {
    /// The peer failed it.
    Failed(String),
    /// This host could not run it (out of ports or descriptors): no verdict either way.
    Local(String),
}

/// A probe this host could not run: counted with the dials refused for the same
/// reason, logged (at most once a minute), and the peer's verdict left as it is.
fn not_run(pool: &str, peer: &Peer, why: &str) {
    crate::stats::bump(&crate::stats::COUNTERS.out_of_ports);
    crate::throttle::PROBE_OUT_OF_CAPACITY.warn(format_args!(
        "sluice: {pool}: cannot probe {}: {why}; out of local capacity, its health verdict unchanged",
        peer.addr.text
    ));
}

/// One probe of `peer`, within the probe's timeout.
async fn probe(state: &PoolState, peer: &Peer, h: &Health) -> Result<(), ProbeError> {
    match tokio::time::timeout(h.timeout, probe_inner(state, peer, h)).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Failed(format!(
            "no answer within {:?}",
            h.timeout
        ))),
    }
}

/// A probe speaks the pool's scheme: HTTP/1.1 in the clear, over TLS (offering only
/// `http/1.1`, or only `h2` for `health grpc`), or HTTP/2 with prior knowledge for
/// `h2c://`.
async fn probe_inner(state: &PoolState, peer: &Peer, h: &Health) -> Result<(), ProbeError> {
    let dialed = dial_probe(state, peer, h).await?;
    exchange(state, peer, h, dialed)
        .await
        .map_err(ProbeError::Failed)
}

/// The probe's connection: its own connect timeout (`timeout` bounds the whole
/// probe), `http/1.1` only over TLS.
async fn dial_probe(
    state: &PoolState,
    peer: &Peer,
    h: &Health,
) -> Result<dial::Dialed, ProbeError> {
    let mut dialed = dial_only(state, peer, h).await?;
    // A backend that expects PROXY headers refuses a connection without one: the
    // probe says it is the proxy's own (`LOCAL`).
    if let (Some(v), dial::Dialed::H1(conn)) = (state.settings().proxy_protocol, &mut dialed) {
        conn.write_preface(crate::net::proxy_protocol::local(v.into()))
            .await
            .map_err(|e| ProbeError::Failed(e.to_string()))?;
    }
    Ok(dialed)
}

async fn dial_only(state: &PoolState, peer: &Peer, h: &Health) -> Result<dial::Dialed, ProbeError> {
    dial::connect_peer(
        &peer.addr.target,
        state.scheme,
        state.tls.as_deref(),
        &state.settings().dest,
        h.timeout + Duration::from_secs(1),
        // HTTP/1.1 over TLS, except for gRPC's check, which needs HTTP/2.
        !matches!(h.probe, Probe::Grpc { .. }),
        &peer.addr.text,
    )
    .await
    .map_err(|e| match e {
        dial::DialError::Local(e) => ProbeError::Local(e.to_string()),
        e => ProbeError::Failed(e.to_string()),
    })
}

/// The probe's request on its connection, and the verdict on the answer's status.
async fn exchange(
    state: &PoolState,
    peer: &Peer,
    h: &Health,
    dialed: dial::Dialed,
) -> Result<(), String> {
    let (path, head, expect, host) = match &h.probe {
        Probe::Http {
            path,
            head,
            expect,
            host,
        } => (path, head, expect, host),
        Probe::Grpc { service } => return grpc_check(state, peer, dialed, service).await,
        Probe::Connect => return Ok(()),
    };
    let method = if *head { Method::HEAD } else { Method::GET };
    let code = ask(state, peer, dialed, method, path, host.clone()).await?;
    if (expect.0..=expect.1).contains(&code) {
        Ok(())
    } else {
        Err(format!("status {code}"))
    }
}

/// `grpc.health.v1.Health/Check` for `service` over the pool's HTTP/2: `SERVING`
/// passes; anything else fails with the status as its reason (`grpc: NOT_SERVING`).
async fn grpc_check(
    state: &PoolState,
    peer: &Peer,
    dialed: dial::Dialed,
    service: &str,
) -> Result<(), String> {
    use crate::grpc;
    let dial::Dialed::H2(session) = dialed else {
        return Err("the backend did not speak HTTP/2".to_string());
    };
    let mut req = Request::new(Body::full(grpc::health_request(service)));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = http::Uri::from_static(grpc::HEALTH_CHECK);
    let h = req.headers_mut();
    h.insert(
        header::HOST,
        peer.host_header
            .clone()
            .unwrap_or(HeaderValue::from_static("localhost")),
    );
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(header::TE, HeaderValue::from_static("trailers"));
    h.insert(
        header::USER_AGENT,
        HeaderValue::from_static("sluice-health-check"),
    );
    let resp = on_own_session(state, session, req).await?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("status {}", resp.status().as_u16()));
    }
    let failed = |t: &http::HeaderMap| {
        t.get(&grpc::GRPC_STATUS)
            .map(|v| {
                v.to_str()
                    .ok()
                    .and_then(|s| s.parse::<u8>().ok())
                    .unwrap_or(2)
            })
            .filter(|&code| code != 0)
            .map(|code| format!("grpc: {}", grpc::code_name(code)))
    };
    // Trailers-only: the status is in the head.
    if let Some(why) = failed(resp.headers()) {
        return Err(why);
    }
    let mut recv = resp.into_body();
    let mut message = Vec::new();
    while let Some(data) = recv.data().await {
        let data = data.map_err(|e| e.to_string())?;
        let _ = recv.flow_control().release_capacity(data.len());
        if message.len() + data.len() > 64 * 1024 {
            return Err("grpc: an answer over 64 KiB".to_string());
        }
        message.extend_from_slice(&data);
    }
    let trailers = recv.trailers().await.map_err(|e| e.to_string())?;
    match trailers.as_ref().map(failed) {
        Some(Some(why)) => return Err(why),
        Some(None) => {}
        None => return Err("grpc: no grpc-status".to_string()),
    }
    match grpc::health_status(&message) {
        Some(1) => Ok(()),
        Some(other) => Err(format!("grpc: {}", grpc::serving_name(other))),
        None => Err("grpc: not a HealthCheckResponse".to_string()),
    }
}

/// Sends `METHOD path` on a fresh connection to `peer`, with `host` (else the peer's
/// own `Host` rule) and `Connection: close`: the response's status. Only the head is
/// read; the connection is dropped with whatever body follows.
pub(super) async fn ask(
    state: &PoolState,
    peer: &Peer,
    dialed: dial::Dialed,
    method: Method,
    path: &str,
    host: Option<HeaderValue>,
) -> Result<u16, String> {
    let mut req = Request::new(Body::Empty);
    *req.method_mut() = method;
    *req.uri_mut() = path.parse().map_err(|_| format!("bad probe path {path}"))?;
    let host = host
        .or_else(|| peer.host_header.clone())
        .unwrap_or(HeaderValue::from_static("localhost"));
    let headers = req.headers_mut();
    headers.insert(header::HOST, host);
    headers.insert(
        header::USER_AGENT,
        HeaderValue::from_static("sluice-health-check"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    match dialed {
        dial::Dialed::H1(mut conn) => {
            let mut out = Outgoing::new(req);
            let resp = conn.send(&mut out).await.map_err(|e| e.to_string())?;
            Ok(resp.parts.status.as_u16())
        }
        dial::Dialed::H2(session) => {
            Ok(on_own_session(state, session, req).await?.status().as_u16())
        }
    }
}

/// `req` on an HTTP/2 session the probe opened for itself: the response head.
async fn on_own_session(
    state: &PoolState,
    session: std::sync::Arc<super::h2::Session>,
    req: Request<Body>,
) -> Result<http::Response<::h2::RecvStream>, String> {
    let mux = super::h2::Mux::default();
    let mut stream = mux.adopt(session);
    let mut out = Outgoing::new(req);
    super::h2::send(&mut stream, &mut out, state.scheme.request_scheme())
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rise_and_fall_count_probe_by_probe() {
        let v = Verdict::default();
        assert_eq!(v.record(false, 2, 3), None);
        assert_eq!(v.record(false, 2, 3), None);
        assert_eq!(v.record(true, 2, 3), None, "a pass breaks the streak");
        assert_eq!(v.record(false, 2, 3), None);
        assert_eq!(v.record(false, 2, 3), None);
        assert_eq!(v.record(false, 2, 3), Some(Transition::BecameUnhealthy));
        assert!(!v.is_healthy());
        assert_eq!(v.record(true, 2, 3), None);
        assert_eq!(v.record(true, 2, 3), Some(Transition::BecameHealthy));
        assert_eq!(v.transitions.load(Ordering::Relaxed), 2);
        assert_eq!(v.probes_failed.load(Ordering::Relaxed), 5);
    }
}

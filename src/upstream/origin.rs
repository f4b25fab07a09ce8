//! An origin test on demand (admin `POST /origin-test`, DESIGN §15.3, §15.8): one
//! request to a pool's first peer of a role, made the way a request would reach it —
//! the name resolved and judged by the pool's destination policy, one approved address
//! dialed, the pool's scheme and TLS settings — and reported, never followed (a
//! redirect is its status). It changes no peer's state.

use std::time::{Duration, Instant};

use http::{HeaderValue, Method};

use super::{dial, health, Pool, Role};
use crate::config::{BackendScheme, Probe};

/// What an origin test found.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// The address dialed (`IP:PORT`, or `unix:PATH`); `None` when none was reached.
    pub address: Option<String>,
    pub latency_ms: u64,
    pub status: Option<u16>,
    /// `verified`, `unverified` (`tls_verify off`) or `none` (no TLS made).
    pub tls_result: &'static str,
    /// `dns`, `unsafe`, `connect`, `timeout`, `tls` or `protocol`.
    pub failure: Option<&'static str>,
}

impl Pool {
    /// Whether the pool has a peer of `role`.
    pub(crate) fn has_role(&self, role: Role) -> bool {
        self.peers().iter().any(|p| p.role == role)
    }

    /// Tests the first peer of `role` (see the module), within the pool's
    /// `connect_timeout` for the connection and `timeout` for the answer.
    pub(crate) async fn test_origin(&self, role: Role) -> Option<Report> {
        let peer = self.peers().iter().find(|p| p.role == role)?;
        let started = Instant::now();
        let settings = self.state.settings();
        let reached = dial::reach_one(
            &peer.addr.target,
            self.state.scheme,
            self.state.tls.as_deref(),
            &settings.dest,
            self.cfg.connect_timeout,
        )
        .await;
        let mut report = Report {
            address: None,
            latency_ms: 0,
            status: None,
            tls_result: "none",
            failure: None,
        };
        match reached {
            Err((address, failure)) => {
                report.address = address;
                report.failure = Some(failure);
            }
            Ok((dialed, address)) => {
                report.address = Some(address);
                if self.state.scheme == BackendScheme::Https {
                    report.tls_result = if self.cfg.tls.verify {
                        "verified"
                    } else {
                        "unverified"
                    };
                }
                let (path, host) = self.test_request();
                let ask = health::ask(&self.state, peer, dialed, Method::GET, &path, host);
                match tokio::time::timeout(self.cfg.timeout, ask).await {
                    Ok(Ok(status)) => report.status = Some(status),
                    Ok(Err(_)) => report.failure = Some("protocol"),
                    Err(_) => report.failure = Some("timeout"),
                }
            }
        }
        report.latency_ms = millis(started.elapsed());
        Some(report)
    }

    /// The pool's health path (else `/`) and the health check's `Host` (else the
    /// peer's own rule).
    fn test_request(&self) -> (String, Option<HeaderValue>) {
        match self.cfg.health.as_ref().map(|h| &h.probe) {
            Some(Probe::Http { path, host, .. }) => (path.clone(), host.clone()),
            _ => ("/".to_string(), None),
        }
    }
}

fn millis(d: Duration) -> u64 {
    d.as_secs() * 1000 + u64::from(d.subsec_millis())
}

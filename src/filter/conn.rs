//! A listener's connection guards (DESIGN §18.4): a `tcp` block's `allow`, `deny` and
//! `rate_limit`, or an HTTP `listen ADDR { … }`'s, judged on each connection at accept,
//! before a byte is read, with what they refused.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

/// One listener's guards, in written order, and what they refused.
pub(crate) struct ConnGuards {
    /// The listener as `sluice_connections_refused_total` labels it.
    pub name: String,
    pub guards: Vec<ConnGuard>,
    pub refused: Arc<Refused>,
}

/// Connections a listener refused, by reason; carried across reloads by its name.
#[derive(Default)]
pub(crate) struct Refused {
    /// `allow`/`deny`.
    pub access: std::sync::atomic::AtomicU64,
    /// `rate_limit`.
    pub rate: std::sync::atomic::AtomicU64,
}

impl ConnGuards {
    /// Whether a connection from `client` is taken; a refused one is counted (here
    /// by listener and reason, and as the same filters on HTTP count them).
    pub(crate) fn admits(&self, client: IpAddr) -> bool {
        use crate::stats::{bump, COUNTERS};
        for g in &self.guards {
            let (ok, counter, mine) = match g {
                ConnGuard::Allow(nets) => (
                    crate::filter::cond::in_nets(nets, client),
                    &COUNTERS.access_denied,
                    &self.refused.access,
                ),
                ConnGuard::Deny(nets) => (
                    !crate::filter::cond::in_nets(nets, client),
                    &COUNTERS.access_denied,
                    &self.refused.access,
                ),
                ConnGuard::Rate(r) => (r.admit(client), &COUNTERS.rate_limited, &self.refused.rate),
            };
            if !ok {
                bump(counter);
                bump(mine);
                return false;
            }
        }
        true
    }
}

/// One line judging a listener's new connection by its client's address.
pub(crate) enum ConnGuard {
    Allow(Vec<IpNet>),
    Deny(Vec<IpNet>),
    Rate(crate::filter::rate_limit::RateLimit),
}

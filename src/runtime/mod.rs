//! The live generation: the compiled config every request reads, swapped atomically.
//!
//! A request loads the current generation once (an `Arc` clone, no lock) and keeps it
//! to the end, so a swap never changes the rules under a request in flight. This module
//! is data: it never calls the pipeline and knows no listener.

pub(crate) mod carry;
pub(crate) mod certs;
pub(crate) mod compile;
pub(crate) mod ocsp;

use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use ipnet::IpNet;

use crate::filter::conn::ConnGuards;
use crate::route::Sites;
use crate::upstream::Pool;

pub(crate) struct Generation {
    pub sites: Sites,
    pub tcp: Vec<Arc<crate::l4::Route>>,
    /// HTTP listeners with `allow`/`deny`/`rate_limit`, by configured address.
    pub listen_guards: Vec<(std::net::SocketAddr, ConnGuards)>,
    pub trust: Vec<IpNet>,
    /// Some HTTP pool sends PROXY protocol headers: a wildcard listener looks up each
    /// connection's own address (the header's destination).
    pub sends_proxy_protocol: bool,
    /// `tracing on`: backends get a `traceparent`.
    pub tracing: bool,
    /// `tracing otlp`: spans recorded and exported.
    pub tracer: Option<std::sync::Arc<crate::otel::Tracer>>,
    pub max_tunnels: u64,
    pub tunnel_drain: std::time::Duration,
    pub tunnel_idle: std::time::Duration,
    /// The certificates and TLS settings of the `tls` listeners, when there are any.
    pub tls: Option<certs::Tls>,
    /// What this generation keeps for the next, by identity: pools' state, FastCGI
    /// pools, rate-limit buckets, cache stores and publishers, meters, … (`carry`).
    pub kept: carry::Kept,
    /// The admin API is on: requests are metered (`sluice_http_*`).
    pub metered: bool,
    /// Nothing global reads a request's fields before its route is known (no
    /// tracing, no `trust`; access logs read them as they came) and some route reads none
    /// (`Route::defers_fields`): an HTTP/1 request may keep its fields as they came
    /// (`http1::fields`), as its site and route then allow.
    pub defers_fields: bool,
    /// The pools `forward_auth` filters ask.
    pub auth_pools: Vec<Arc<Pool>>,
    /// The certificates of `tls auto` sites, when there are any: carried while the
    /// `acme` settings stay the same.
    pub acme: Option<Arc<crate::acme::Manager>>,
    /// `acme`, when plain listeners answer HTTP-01 challenges.
    pub acme_http01: Option<Arc<crate::acme::Manager>>,
}

impl Generation {
    pub(crate) fn is_trusted(&self, client: IpAddr) -> bool {
        if self.trust.is_empty() {
            return false;
        }
        crate::filter::cond::in_nets(&self.trust, client)
    }

    /// The client's address for filters: the connection's peer; when the peer is
    /// trusted, the nearest untrusted address in `X-Forwarded-For` (read right to left,
    /// across all its fields; `ip:port` and `[v6]:port` entries too), or the farthest
    /// one when every address there is trusted. An entry that is not an address, met
    /// before an untrusted one, makes the client unknown: `0.0.0.0`, which no `allow`
    /// admits (never the trusted proxy's own address).
    pub(crate) fn client_ip(&self, peer: IpAddr, headers: &http::HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut client = peer;
        let fields = headers.get_all("x-forwarded-for").iter().rev();
        for entry in fields.flat_map(|v| v.as_bytes().rsplit(|&b| b == b',')) {
            let Some(ip) = forwarded_ip(entry) else {
                return IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
            };
            client = ip.to_canonical();
            if !self.is_trusted(client) {
                break;
            }
        }
        client
    }

    pub(crate) fn pools(&self) -> impl Iterator<Item = &Arc<Pool>> {
        self.sites
            .pools()
            .chain(
                self.tcp
                    .iter()
                    .flat_map(|t| t.pools.iter().map(|p| &p.pool)),
            )
            .chain(&self.auth_pools)
    }

    /// The L4 route for a `tcp` listener's configured address.
    pub(crate) fn tcp_route(&self, addr: std::net::SocketAddr) -> Option<&Arc<crate::l4::Route>> {
        self.tcp.iter().find(|t| t.addr == addr)
    }

    /// The guards of the HTTP listener configured at `addr`, if it has any.
    pub(crate) fn listen_guards(&self, addr: std::net::SocketAddr) -> Option<&ConnGuards> {
        self.listen_guards
            .iter()
            .find_map(|(a, g)| (*a == addr).then_some(g))
    }

    /// Every listener's guards, `tcp` blocks' and HTTP ones'.
    pub(crate) fn conn_guards(&self) -> impl Iterator<Item = &ConnGuards> {
        self.tcp
            .iter()
            .map(|t| &t.guards)
            .chain(self.listen_guards.iter().map(|(_, g)| g))
    }
}

/// One `X-Forwarded-For` entry: an address, `ip:port`, or `[v6]` with a port or not.
fn forwarded_ip(entry: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(entry).ok()?.trim();
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(v6) = s.strip_prefix('[') {
        return v6.split_once(']')?.0.parse().ok();
    }
    let (ip, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

pub(crate) struct Live {
    current: ArcSwap<Generation>,
    /// The current generation meters requests: a connection notes when each began.
    metered: std::sync::atomic::AtomicBool,
    /// The current generation's [`Generation::defers_fields`], for a connection to
    /// read before it parses a head.
    defers_fields: std::sync::atomic::AtomicBool,
}

impl Live {
    pub(crate) fn new(g: Generation) -> Arc<Live> {
        Arc::new(Live {
            metered: g.metered.into(),
            defers_fields: g.defers_fields.into(),
            current: ArcSwap::from_pointee(g),
        })
    }

    /// The generation a new request runs on.
    pub(crate) fn load(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Whether requests are metered now (a request that starts as a reload lands may
    /// go unmetered or be metered without its start time: it is then not counted).
    pub(crate) fn metered(&self) -> bool {
        self.metered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a request's fields may be kept as they came (a request that starts as
    /// a reload lands is checked again on the generation it runs on).
    pub(crate) fn defers_fields(&self) -> bool {
        self.defers_fields
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes `next` the live generation. What the old one kept that `next` did not
    /// carry over is retired now (a pool's background tasks stop and its idle
    /// connections close), while requests still running on the old generation finish
    /// on it.
    pub(crate) fn swap(&self, next: Generation) {
        self.metered
            .store(next.metered, std::sync::atomic::Ordering::Relaxed);
        self.defers_fields
            .store(next.defers_fields, std::sync::atomic::Ordering::Relaxed);
        let old = self.current.swap(Arc::new(next));
        old.kept.retire_gone(&self.current.load().kept);
    }
}

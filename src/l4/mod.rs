//! L4: what a `tcp` listener does with a connection it accepted. Its guards (`allow`,
//! `deny`, `rate_limit`) and `max_conns` judge it at once; its pool is the listener's
//! one, or — with `sni` pools — the one its TLS ClientHello names ([`hello`], read
//! without terminating TLS); then its bytes are relayed to a peer ([`relay`]).
//!
//! The routes are data a generation holds (`Generation::tcp`); the accept loop is a
//! listener's (`server`), which hands each connection here with a way to look up the
//! live route. Nothing here knows the generation.

pub(crate) mod hello;
mod relay;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;

use crate::upstream::Pool;

/// An L4 listener's pool in one generation, found by the listener's address.
pub(crate) struct Route {
    pub addr: std::net::SocketAddr,
    /// `sni` pools in written order, then the bare `proxy`'s (no names).
    pub pools: Vec<Target>,
    /// The `sni` names to their pool; the bare `proxy` is the `*` entry.
    pub names: crate::route::HostIndex,
    pub max_conns: u64,
    /// `allow`, `deny`, `rate_limit` of the `tcp` block, in written order.
    pub guards: crate::filter::conn::ConnGuards,
}

/// One pool of a `tcp` listener, and the TLS server names it takes.
pub(crate) struct Target {
    pub sni: Vec<crate::config::HostPattern>,
    pub pool: Arc<Pool>,
    pub idle_timeout: std::time::Duration,
}

impl Route {
    /// Whether connections are routed by the ClientHello's server name.
    pub(crate) fn by_sni(&self) -> bool {
        self.pools.iter().any(|p| !p.sni.is_empty())
    }

    /// The pool for a ClientHello naming `sni` (any case): an exact name, then the
    /// longest `*.suffix`, then the bare `proxy`.
    pub(crate) fn choose(&self, sni: Option<&str>) -> Option<&Target> {
        let name = sni.map_or(String::new(), |n| {
            n.trim_end_matches('.').to_ascii_lowercase()
        });
        self.names.find(name.as_bytes()).map(|i| &self.pools[i])
    }
}

impl Route {
    /// Whether a connection from `client` is relayed; refused ones are counted.
    pub(crate) fn admits(&self, client: IpAddr) -> bool {
        self.guards.admits(client)
    }
}

/// Connections an L4 listener relays now; carried across reloads with the listener.
pub(crate) type Open = Arc<AtomicU64>;

/// L4 relays open now, process-wide: tunnels, for a process that upgraded.
pub(crate) static RELAYS_OPEN: AtomicU64 = AtomicU64::new(0);

/// One of an L4 listener's open connections, counted until dropped.
struct OpenPlace(Open);

impl OpenPlace {
    fn take(open: &Open) -> OpenPlace {
        open.fetch_add(1, Ordering::Relaxed);
        RELAYS_OPEN.fetch_add(1, Ordering::Relaxed);
        OpenPlace(open.clone())
    }
}

impl Drop for OpenPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        RELAYS_OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the accept loop decided of a connection: to relay it (in a task of its own,
/// [`Admitted::relay`]), or nothing (refused, counted and logged here).
pub(crate) struct Admitted {
    /// The pool, when known without the hello.
    fixed: Option<(Arc<Pool>, Duration)>,
    place: OpenPlace,
    drain: Duration,
}

/// Judges a connection `route`'s listener accepted from `peer`: its guards, then the
/// listener's `max_conns` (`open` relayed now). `None`: closed at once, never relayed
/// (a flood cannot pin a descriptor per client).
pub(crate) fn admit(
    route: &Route,
    peer: SocketAddr,
    open: &Open,
    drain: Duration,
) -> Option<Admitted> {
    let addr = route.addr;
    if !route.admits(peer.ip().to_canonical()) {
        tracing::debug!("sluice: tcp {addr}: refused a connection from {peer}");
        return None;
    }
    if open.load(Ordering::Relaxed) >= route.max_conns {
        crate::stats::bump(&crate::stats::COUNTERS.limit_rejections);
        crate::throttle::TCP_MAX_CONNS.warn(format_args!(
            "sluice: tcp {addr}: max_conns ({}) relayed at once; closed a connection from {peer}",
            route.max_conns
        ));
        return None;
    }
    // Without `sni` pools the one pool is known now; with them, after the hello.
    let fixed = match route.by_sni() {
        false => route.choose(None).map(|t| (t.pool.clone(), t.idle_timeout)),
        true => None,
    };
    Some(Admitted {
        fixed,
        place: OpenPlace::take(open),
        drain,
    })
}

impl Admitted {
    /// Relays the connection to its pool; `now` looks up the listener's route in the
    /// live generation, for a pool chosen by a ClientHello read meanwhile.
    pub(crate) async fn relay(
        self,
        mut stream: TcpStream,
        addr: SocketAddr,
        peer: SocketAddr,
        now: impl FnOnce() -> Option<Arc<Route>>,
    ) {
        let (target, first) = match self.fixed {
            Some(t) => (Some(t), Bytes::new()),
            None => by_sni(addr, &mut stream, peer, now).await,
        };
        if let Some((pool, idle)) = target {
            relay::relay(stream, first, pool, idle, self.drain).await;
        }
        drop(self.place);
    }
}

/// The pool an SNI-routed `tcp` listener relays this connection to, chosen by its
/// ClientHello (read here, and returned to be sent on first) on the listener's live
/// route (`now`). `None` (logged at debug) when the first bytes are no ClientHello, or
/// no pool takes its name.
async fn by_sni(
    addr: SocketAddr,
    stream: &mut TcpStream,
    peer: SocketAddr,
    now: impl FnOnce() -> Option<Arc<Route>>,
) -> (Option<(Arc<Pool>, Duration)>, Bytes) {
    use hello::Hello;
    let (sni, read) = match hello::read(stream).await {
        Hello::Tls { sni, read } => (sni, read),
        Hello::Refused(why) => {
            tracing::debug!("sluice: tcp {addr}: closed a connection from {peer}: {why}");
            return (None, Bytes::new());
        }
    };
    let target = now().and_then(|route| {
        let t = route.choose(sni.as_deref())?;
        Some((t.pool.clone(), t.idle_timeout))
    });
    if target.is_none() {
        tracing::debug!(
            "sluice: tcp {addr}: no pool for server name {:?} from {peer} and no bare proxy; closed",
            sni.as_deref().unwrap_or("")
        );
    }
    (target, read)
}

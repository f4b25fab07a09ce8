//! What a listener kind is, in one place: its key (the same listener across reloads
//! and upgrades), which a config asks for, how its socket is bound or taken over from
//! the process that upgraded, and the accept loop it starts. A new kind is a `Kind`
//! entry here and its loop's file.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::drain::Drain;
use crate::config::{Config, Listen};
use crate::runtime::Live;

/// What a listening socket serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    /// HTTP/1.1 and HTTP/2, plain or TLS.
    Http,
    /// An L4 (`tcp`) relay.
    Tcp,
    /// HTTP/3: the UDP side of a `listen ADDR tls quic`.
    Quic,
}

/// A listener is the same listener across reloads when its address, family mode,
/// kind, TLS and PROXY protocol are.
pub(super) type ListenKey = (SocketAddr, bool, Kind, bool, bool);

pub(super) fn key(l: &Listen, kind: Kind) -> ListenKey {
    (l.addr, l.dual_stack, kind, l.tls, l.proxy_protocol)
}

/// A listener's key as an upgrade names its socket to the new process.
pub(super) fn key_text(k: &ListenKey) -> String {
    let kind = match k.2 {
        Kind::Http => "http",
        Kind::Tcp => "tcp",
        Kind::Quic => "quic",
    };
    format!("{kind}|{}|{}|{}|{}", k.0, k.1, k.3, k.4)
}

/// Every listener a config asks for, with its kind: a `quic` listener is two, its TCP
/// socket and its UDP one.
pub(super) fn wanted(config: &Config) -> Vec<(Listen, Kind)> {
    let quic = config
        .listeners
        .iter()
        .filter(|l| l.quic)
        .map(|l| (l.clone(), Kind::Quic));
    config
        .listeners
        .iter()
        .map(|l| (l.clone(), Kind::Http))
        .chain(config.tcp.iter().map(|t| (t.listen.clone(), Kind::Tcp)))
        .chain(quic)
        .collect()
}

/// A socket bound (or handed over by an upgrade) for a listener, not yet accepting.
pub(super) enum Bound {
    Tcp(TcpListener),
    /// A QUIC endpoint, its server config set when it starts accepting, and its UDP
    /// socket for a later upgrade.
    Quic(quinn::Endpoint, Option<OwnedFd>),
}

impl Bound {
    fn port(&self) -> Option<u16> {
        match self {
            Bound::Tcp(l) => l.local_addr().ok().map(|a| a.port()),
            Bound::Quic(e, _) => e.local_addr().ok().map(|a| a.port()),
        }
    }

    /// A duplicate of the socket, for an upgrade to hand over.
    fn dup(&self) -> Option<OwnedFd> {
        match self {
            Bound::Tcp(l) => l.as_fd().try_clone_to_owned().ok(),
            Bound::Quic(_, fd) => fd.as_ref().and_then(|f| f.try_clone().ok()),
        }
    }
}

pub(super) struct Accepting {
    pub close: Arc<Notify>,
    pub task: JoinHandle<()>,
    /// The address as bound, as the admin API lists it.
    pub local: String,
    /// The port as bound (a `quic` listener's UDP side takes its TCP side's).
    pub port: u16,
    /// A TCP TLS listener's `Alt-Svc`, set while a `quic` listener shares its address.
    pub alt_svc: Option<super::AltSvc>,
    /// A duplicate of the socket, for an upgrade to hand over.
    pub fd: Option<OwnedFd>,
}

/// Binds the listeners of `wanted` that are not running already; all or none. A
/// `quic` listener's UDP socket takes the port its TCP socket has (the one bound for
/// `:0`).
pub(super) fn bind_new(
    wanted: &[(Listen, Kind)],
    running: &HashMap<ListenKey, Accepting>,
) -> Result<Vec<(ListenKey, Bound)>, super::BindError> {
    let fresh = |quic: bool| {
        wanted
            .iter()
            .filter(move |(l, k)| (*k == Kind::Quic) == quic && !running.contains_key(&key(l, *k)))
    };
    let mut bound = Vec::new();
    for (l, kind) in fresh(false) {
        let k = key(l, *kind);
        let s = match super::handover::take_tcp(&key_text(&k)) {
            Some(s) => s
                .set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(s)),
            None => super::bind_one(l),
        }
        .map_err(|source| super::BindError {
            addr: l.text.clone(),
            source,
        })?;
        bound.push((k, Bound::Tcp(s)));
    }
    for (l, _) in fresh(true) {
        let k = key(l, Kind::Quic);
        let socket = match super::handover::take_udp(&key_text(&k)) {
            Some(s) => Ok(s),
            None => quic_socket(l, running, &mut bound),
        };
        let (e, fd) =
            socket
                .and_then(super::h3::endpoint_on)
                .map_err(|source| super::BindError {
                    addr: format!("{} (UDP, for quic)", l.text),
                    source,
                })?;
        bound.push((k, Bound::Quic(e, fd)));
    }
    Ok(bound)
}

/// The UDP socket of `quic` listener `l`, on its TCP twin's port. For `:0`, when the
/// port the kernel gave the TCP socket is taken for UDP, the twin (bound just now) is
/// bound again on another port, a few times.
fn quic_socket(
    l: &Listen,
    running: &HashMap<ListenKey, Accepting>,
    bound: &mut [(ListenKey, Bound)],
) -> std::io::Result<std::net::UdpSocket> {
    let tcp = key(l, Kind::Http);
    if let Some(a) = running.get(&tcp) {
        return crate::net::bind_udp(SocketAddr::new(l.addr.ip(), a.port), l.dual_stack);
    }
    let twin = bound.iter_mut().find(|(k, _)| *k == tcp).map(|(_, b)| b);
    let Some(twin) = twin.filter(|_| l.addr.port() == 0) else {
        return crate::net::bind_udp(l.addr, l.dual_stack);
    };
    let mut tries = 0;
    loop {
        let port = twin.port().unwrap_or(0);
        match crate::net::bind_udp(SocketAddr::new(l.addr.ip(), port), l.dual_stack) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 8 => {
                tries += 1;
                *twin = Bound::Tcp(super::bind_one(l)?);
            }
            r => return r,
        }
    }
}

/// The admin API's listener as an upgrade names its socket to the new process. (The
/// admin listener is bound before the others, so the banner can name it, and a reload
/// never moves it: it is kept apart from `Kind`.)
pub(super) fn admin_key(addr: SocketAddr) -> String {
    format!("admin|{addr}")
}

/// The admin API, started.
pub(super) struct AdminStarted {
    pub local: Option<SocketAddr>,
    /// A duplicate of its socket, for an upgrade to hand over.
    pub fd: Option<OwnedFd>,
    pub task: JoinHandle<()>,
}

/// Binds the admin API's listener at `addr` (or adopts the one an upgrade handed
/// over) and starts serving it.
pub(super) async fn start_admin(
    addr: SocketAddr,
    api: crate::admin::Api,
) -> std::io::Result<AdminStarted> {
    let l = match super::handover::take_tcp(&admin_key(addr)) {
        Some(l) => l
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(l)),
        None => TcpListener::bind(addr).await,
    }?;
    let local = l.local_addr().ok();
    tracing::info!(
        "sluice: admin API on http://{}",
        local.map(|a| a.to_string()).unwrap_or_default()
    );
    Ok(AdminStarted {
        local,
        fd: l.as_fd().try_clone_to_owned().ok(),
        task: tokio::spawn(crate::admin::serve(l, api)),
    })
}

/// What a listener's accept loop starts with.
pub(super) struct Context<'a> {
    pub live: &'a Arc<Live>,
    pub drain: &'a Drain,
    pub access: &'a super::conn::Access,
    /// Printed on stdout with each listening address (the demo's).
    pub banner: Option<&'a str>,
    /// The admin API's address, for the banner.
    pub admin: Option<SocketAddr>,
    /// A TLS listener's `Alt-Svc`: the `quic` listener sharing its address.
    pub alt_svc: Option<Arc<http::HeaderValue>>,
    /// Lists a listener for the admin API — before it is announced, so whoever reads
    /// the announcement finds it on `/status`.
    pub list: &'a dyn Fn(String),
}

/// Starts the accept loop of listener `k` on its socket.
pub(super) fn start(k: ListenKey, b: Bound, ctx: &Context) -> Accepting {
    let port = b.port().unwrap_or(0);
    let fd = b.dup();
    let close = Arc::new(Notify::new());
    let (task, local, alt_svc) = match b {
        Bound::Tcp(l) if k.2 == Kind::Tcp => relay(ctx, l, k, &close),
        Bound::Tcp(l) => http(ctx, l, k, &close),
        Bound::Quic(e, _) => quic(ctx, e, &close),
    };
    Accepting {
        close,
        task,
        local,
        port,
        alt_svc,
        fd,
    }
}

/// An L4 (`tcp`) listener's accept loop, and its name for the admin API.
fn relay(
    ctx: &Context,
    l: TcpListener,
    k: ListenKey,
    close: &Arc<Notify>,
) -> (JoinHandle<()>, String, Option<super::AltSvc>) {
    let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    (ctx.list)(format!("tcp {addr}"));
    tracing::info!("sluice: relaying tcp on {addr}");
    let task = tokio::spawn(super::tcp::accept_loop(
        l,
        ctx.live.clone(),
        ctx.drain.clone(),
        close.clone(),
        k.0,
    ));
    (task, format!("tcp {addr}"), None)
}

/// An HTTP listener's accept loop, and its name for the admin API.
fn http(
    ctx: &Context,
    l: TcpListener,
    k: ListenKey,
    close: &Arc<Notify>,
) -> (JoinHandle<()>, String, Option<super::AltSvc>) {
    let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let scheme = if k.3 { "https" } else { "http" };
    (ctx.list)(addr.clone());
    tracing::info!("sluice: listening on {scheme}://{addr}");
    if let Some(b) = ctx.banner {
        match ctx.admin {
            Some(a) => println!("{b}: listening on {scheme}://{addr} (dashboard http://{a}/)"),
            None => println!("{b}: listening on {scheme}://{addr}"),
        }
    }
    let alt_svc = k.3.then(|| {
        let a = super::AltSvc::default();
        a.store(ctx.alt_svc.clone());
        a
    });
    let task = tokio::spawn(super::accept_loop(
        l,
        k.0,
        ctx.live.clone(),
        ctx.drain.clone(),
        close.clone(),
        ctx.access.clone(),
        super::Front {
            tls: k.3,
            proxy_protocol: k.4,
        },
        alt_svc.clone(),
    ));
    (task, addr, alt_svc)
}

/// A `quic` listener's accept loop, and its name for the admin API.
fn quic(
    ctx: &Context,
    e: quinn::Endpoint,
    close: &Arc<Notify>,
) -> (JoinHandle<()>, String, Option<super::AltSvc>) {
    let addr = e.local_addr().map(|a| a.to_string()).unwrap_or_default();
    (ctx.list)(format!("quic {addr}"));
    tracing::info!("sluice: listening on h3 (QUIC, UDP) {addr}");
    let task = tokio::spawn(super::h3::accept_loop(
        e,
        ctx.live.clone(),
        ctx.drain.clone(),
        close.clone(),
        ctx.access.clone(),
    ));
    (task, format!("quic {addr}"), None)
}

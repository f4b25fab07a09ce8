//! Opening backend connections: resolve the name (through the generation's [`Dns`],
//! whose cache follows the answers' TTLs), judge every address of the answer against
//! the pool's destination policy before dialing any, then connect within
//! `connect_timeout` — which covers the TLS and HTTP/2 handshakes too, for the schemes
//! that have them. The address dialed is the address judged: nothing resolves twice.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpStream, UnixStream};

use super::conn::{BackendConn, Named};
use super::h2::{self, Session};
use super::tls::ClientTls;
use crate::config::{BackendScheme, Target};
use crate::net::stream::Stream;
use crate::net::tls::TlsConn;
use crate::net::EADDRNOTAVAIL;
use crate::safety::{self, Dns, Policy, Refusal};

/// Where a pool's connections may go and how its names resolve: this generation's
/// resolver, and the destination policy when the pool is strict.
#[derive(Clone)]
pub(crate) struct Dest {
    pub dns: Arc<Dns>,
    pub policy: Option<Arc<Policy>>,
    /// How long a name may take to resolve: 3 s, or the pool's `timeout` when smaller.
    pub dns_budget: Duration,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("{0}")]
    Connect(io::Error),
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    /// The name gave no address (the resolver's words).
    #[error("{0}")]
    Resolve(String),
    /// The destination policy refused an address of the answer: nothing was dialed.
    #[error("{0}")]
    Unsafe(Refusal),
    /// Out of local ports or descriptors: not the backend's fault.
    #[error("local resources exhausted: {0}")]
    Local(io::Error),
    /// The TLS handshake failed (an untrusted certificate, a name mismatch, ...).
    #[error("{0}")]
    Tls(String),
    /// The HTTP/2 handshake failed.
    #[error("{0}")]
    H2(String),
    /// The connection another request was opening to this peer (which this one waited
    /// for) failed; that request counted the failure.
    #[error("the connection being opened to this peer failed")]
    Shared,
}

/// A connection to a peer, as its scheme (and ALPN) made it.
pub(crate) enum Dialed {
    H1(BackendConn),
    H2(Arc<Session>),
}

impl DialError {
    /// What kind of failure it counts as against the peer.
    pub(crate) fn kind(&self) -> super::FailureKind {
        match self {
            DialError::Resolve(_) => super::FailureKind::Dns,
            DialError::Unsafe(_) => super::FailureKind::Unsafe,
            _ => super::FailureKind::Connect,
        }
    }

    fn from_io(e: io::Error) -> Self {
        if crate::net::is_local_exhaustion(&e) {
            DialError::Local(e)
        } else {
            DialError::Connect(e)
        }
    }
}

pub(crate) async fn connect(
    target: &Target,
    dest: &Dest,
    connect_timeout: Duration,
) -> Result<BackendConn, DialError> {
    let to = locate(target, dest).await?;
    match tokio::time::timeout(connect_timeout, connect_to(&to, dest, connect_timeout)).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Timeout(connect_timeout)),
    }
}

/// Connects to a peer the way its pool's scheme says: HTTP/1.1 in the clear, HTTP/2
/// with prior knowledge (`h2c`), or TLS and then what ALPN chose. `h1_only`: offer only
/// `http/1.1` over TLS (upgrades, probes). The name is resolved first, under the DNS
/// budget; `connect_timeout` covers the connect and the handshakes.
pub(crate) async fn connect_peer(
    target: &Target,
    scheme: BackendScheme,
    tls: Option<&ClientTls>,
    dest: &Dest,
    connect_timeout: Duration,
    h1_only: bool,
    peer: &str,
) -> Result<Dialed, DialError> {
    let to = locate(target, dest).await?;
    dial_to(
        &to,
        target,
        scheme,
        tls,
        dest,
        connect_timeout,
        h1_only,
        peer,
    )
    .await
}

/// The connection and handshakes of [`connect_peer`], to addresses already judged,
/// within `connect_timeout`.
#[allow(clippy::too_many_arguments)]
async fn dial_to(
    to: &To<'_>,
    target: &Target,
    scheme: BackendScheme,
    tls: Option<&ClientTls>,
    dest: &Dest,
    connect_timeout: Duration,
    h1_only: bool,
    peer: &str,
) -> Result<Dialed, DialError> {
    let dial = handshakes(
        to,
        target,
        scheme,
        tls,
        dest,
        connect_timeout,
        h1_only,
        peer,
    );
    match tokio::time::timeout(connect_timeout, dial).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Timeout(connect_timeout)),
    }
}

#[allow(clippy::too_many_arguments)]
async fn handshakes(
    to: &To<'_>,
    target: &Target,
    scheme: BackendScheme,
    tls: Option<&ClientTls>,
    dest: &Dest,
    connect_timeout: Duration,
    h1_only: bool,
    peer: &str,
) -> Result<Dialed, DialError> {
    match (scheme, to, tls) {
        (BackendScheme::H2c, To::Tcp(a), _) => {
            let (s, ip) = tcp(a, dest, connect_timeout).await?;
            let session = h2::handshake(s, connect_timeout, peer.to_string(), a.named(ip))
                .await
                .map_err(DialError::H2)?;
            Ok(Dialed::H2(session))
        }
        (BackendScheme::Https, To::Tcp(a), Some(tls)) => {
            let (s, ip) = tcp(a, dest, connect_timeout).await?;
            let s = tls
                .handshake(s, target, h1_only)
                .await
                .map_err(DialError::Tls)?;
            if s.get_ref().1.alpn_protocol() == Some(b"h2") {
                let session = h2::handshake(s, connect_timeout, peer.to_string(), a.named(ip))
                    .await
                    .map_err(DialError::H2)?;
                return Ok(Dialed::H2(session));
            }
            let mut conn = BackendConn::new(Stream::Tls(Box::new(TlsConn::new(s))));
            conn.named = a.named(ip).map(Box::new);
            Ok(Dialed::H1(conn))
        }
        _ => connect_to(to, dest, connect_timeout).await.map(Dialed::H1),
    }
}

/// An origin test's connection (admin `POST /origin-test`): the name resolved and the
/// answer judged as for a request, then exactly one address of it (the first) dialed
/// the way the pool's scheme says, offering only `http/1.1` over TLS. `Err`: the
/// address tried (when one was), and the failure's stable name.
pub(crate) async fn reach_one(
    target: &Target,
    scheme: BackendScheme,
    tls: Option<&ClientTls>,
    dest: &Dest,
    connect_timeout: Duration,
) -> Result<(Dialed, String), (Option<String>, &'static str)> {
    let to = locate(target, dest).await.map_err(|e| {
        let failure = match e {
            DialError::Unsafe(_) => "unsafe",
            DialError::Resolve(_) => "dns",
            _ => "connect",
        };
        (None, failure)
    })?;
    let (to, address) = match to {
        To::Tcp(mut a) => {
            a.ips.truncate(1);
            let addr = SocketAddr::new(a.ips[0], a.port).to_string();
            (To::Tcp(a), addr)
        }
        To::Unix(p) => (To::Unix(p), format!("unix:{}", p.display())),
    };
    let peer = address.clone();
    match dial_to(&to, target, scheme, tls, dest, connect_timeout, true, &peer).await {
        Ok(d) => Ok((d, address)),
        Err(e) => {
            let failure = match e {
                DialError::Timeout(_) => "timeout",
                DialError::Tls(_) => "tls",
                DialError::H2(_) => "protocol",
                _ => "connect",
            };
            Err((Some(address), failure))
        }
    }
}

/// Whether a kept connection to a named origin may take another request. Within its
/// answer's lifetime, yes at once; past it the name is asked again and the answer
/// judged as for a dial, and the connection goes on only if its address is still in
/// a safe answer (`named` then holds until the new answer expires). `Err`: why not —
/// the caller closes the connection.
pub(crate) async fn reconfirm(
    target: &Target,
    dest: &Dest,
    named: &mut Named,
) -> Result<(), String> {
    if !named.expired() {
        return Ok(());
    }
    match locate(target, dest).await {
        Ok(To::Tcp(a)) if a.ips.contains(&named.ip) => {
            if let Some(renewed) = a.named(named.ip) {
                *named = renewed;
            }
            Ok(())
        }
        Ok(To::Tcp(a)) => Err(format!("{} no longer answers with {}", a.host, named.ip)),
        Ok(To::Unix(_)) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Where a dial goes: a TCP target's addresses, resolved and judged, or a socket.
enum To<'a> {
    Tcp(Addresses<'a>),
    Unix(&'a std::path::Path),
}

/// A TCP target's addresses: the literal, or the resolver's answer.
struct Addresses<'a> {
    host: &'a str,
    port: u16,
    ips: Vec<IpAddr>,
    /// A name's answer holds until then; `None`: a literal address.
    valid_until: Option<Instant>,
}

impl Addresses<'_> {
    /// What a connection to `ip` remembers of the name it came from.
    fn named(&self, ip: IpAddr) -> Option<Named> {
        self.valid_until
            .map(|valid_until| Named::new(ip, valid_until))
    }
}

/// Resolves a TCP target's name (within the pool's DNS budget: its own, not carved out
/// of `connect_timeout`; running out is a resolution failure) and, for a strict pool,
/// judges the whole answer: one unsafe address fails the attempt with nothing dialed.
async fn locate<'a>(target: &'a Target, dest: &Dest) -> Result<To<'a>, DialError> {
    let (host, port) = match target {
        Target::Unix(path) => return Ok(To::Unix(path)),
        Target::Tcp { host, port } => (host.as_str(), *port),
    };
    let (ips, valid_until) = match safety::parse_ip(host) {
        Some(ip) => (vec![ip], None),
        None => {
            let answer = dest
                .dns
                .lookup(host, dest.dns_budget)
                .await
                .map_err(|e| DialError::Resolve(e.to_string()))?;
            (answer.ips, Some(answer.valid_until))
        }
    };
    if let Some(policy) = &dest.policy {
        for &ip in &ips {
            policy
                .check(SocketAddr::new(ip, port))
                .map_err(DialError::Unsafe)?;
        }
    }
    Ok(To::Tcp(Addresses {
        host,
        port,
        ips,
        valid_until,
    }))
}

/// A TCP connection to one of `a`'s addresses, tried in turn from a rotating start,
/// each with its share of what is left of `budget`, the next after a failure; and the
/// address it reached.
async fn tcp(
    a: &Addresses<'_>,
    dest: &Dest,
    budget: Duration,
) -> Result<(TcpStream, IpAddr), DialError> {
    let start = Instant::now();
    let (ips, port) = (&a.ips, a.port);
    let n = ips.len();
    let first = if n > 1 {
        dest.dns.first_of(a.host, n)
    } else {
        0
    };
    let mut last = DialError::Resolve(format!("cannot resolve {}: no addresses", a.host));
    for k in 0..n {
        let addr = SocketAddr::new(ips[(first + k) % n], port);
        // An equal share of what is left, but never under a second (or what is left):
        // many dead addresses must not starve a live one with a long round trip. A
        // single address has the whole budget, which the caller's deadline enforces.
        let left = budget.saturating_sub(start.elapsed());
        let share = (left / (n - k) as u32).max(left.min(Duration::from_secs(1)));
        let connect = TcpStream::connect(addr);
        let attempt = if n == 1 {
            Ok(connect.await)
        } else {
            tokio::time::timeout(share, connect).await
        };
        let e = match attempt {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, addr.ip()));
            }
            Ok(Err(e)) => DialError::from_io(e),
            Err(_) => DialError::Connect(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {share:?}"),
            )),
        };
        // A name's error says which of its addresses failed.
        last = match e {
            // Out of descriptors: nothing else will connect either.
            DialError::Local(e) if e.raw_os_error() != Some(EADDRNOTAVAIL) => {
                return Err(DialError::Local(e))
            }
            DialError::Connect(e) if a.valid_until.is_some() => {
                DialError::Connect(io::Error::new(e.kind(), format!("{addr}: {e}")))
            }
            e => e,
        };
    }
    Err(last)
}

async fn connect_to(to: &To<'_>, dest: &Dest, budget: Duration) -> Result<BackendConn, DialError> {
    match to {
        To::Tcp(a) => {
            let (s, ip) = tcp(a, dest, budget).await?;
            let mut conn = BackendConn::new(Stream::Tcp(s));
            conn.named = a.named(ip).map(Box::new);
            Ok(conn)
        }
        To::Unix(path) => {
            let s = UnixStream::connect(path)
                .await
                .map_err(DialError::from_io)?;
            Ok(BackendConn::new(Stream::Unix(s)))
        }
    }
}

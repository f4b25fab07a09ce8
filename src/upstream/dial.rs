//! Opening backend connections: resolve the name (at every dial, never cached here)
//! and connect within `connect_timeout` — which covers the TLS and HTTP/2 handshakes
//! too, for the schemes that have them.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};

use std::sync::Arc;

use super::conn::{BackendConn, Io};
use super::h2::{self, Session};
use super::tls::ClientTls;
use crate::config::{BackendScheme, Target};

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("{0}")]
    Connect(io::Error),
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    #[error("cannot resolve {0}")]
    Resolve(String),
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
pub enum Dialed {
    H1(BackendConn),
    H2(Arc<Session>),
}

impl DialError {
    fn from_io(e: io::Error) -> Self {
        const EADDRNOTAVAIL: i32 = 99;
        const EMFILE: i32 = 24;
        const ENFILE: i32 = 23;
        match e.raw_os_error() {
            Some(EADDRNOTAVAIL | EMFILE | ENFILE) => DialError::Local(e),
            _ => DialError::Connect(e),
        }
    }
}

pub async fn connect(target: &Target, connect_timeout: Duration) -> Result<BackendConn, DialError> {
    match tokio::time::timeout(connect_timeout, connect_inner(target)).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Timeout(connect_timeout)),
    }
}

/// Connects to a peer the way its pool's scheme says: HTTP/1.1 in the clear, HTTP/2
/// with prior knowledge (`h2c`), or TLS and then what ALPN chose. `h1_only`: offer only
/// `http/1.1` over TLS (upgrades, probes).
pub async fn connect_peer(
    target: &Target,
    scheme: BackendScheme,
    tls: Option<&ClientTls>,
    connect_timeout: Duration,
    h1_only: bool,
    peer: &str,
) -> Result<Dialed, DialError> {
    let dial = async {
        match (scheme, target, tls) {
            (BackendScheme::H2c, Target::Tcp { host, port }, _) => {
                let s = tcp(host, *port).await?;
                let session = h2::handshake(s, connect_timeout, peer.to_string())
                    .await
                    .map_err(DialError::H2)?;
                Ok(Dialed::H2(session))
            }
            (BackendScheme::Https, Target::Tcp { host, port }, Some(tls)) => {
                let s = tcp(host, *port).await?;
                let s = tls
                    .handshake(s, target, h1_only)
                    .await
                    .map_err(DialError::Tls)?;
                if s.get_ref().1.alpn_protocol() == Some(b"h2") {
                    let session = h2::handshake(s, connect_timeout, peer.to_string())
                        .await
                        .map_err(DialError::H2)?;
                    return Ok(Dialed::H2(session));
                }
                Ok(Dialed::H1(BackendConn::new(Io::Tls(Box::new(s)))))
            }
            _ => connect_inner(target).await.map(Dialed::H1),
        }
    };
    match tokio::time::timeout(connect_timeout, dial).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Timeout(connect_timeout)),
    }
}

/// A TCP connection to `host:port`, trying each address the name resolves to.
async fn tcp(host: &str, port: u16) -> Result<TcpStream, DialError> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| DialError::Resolve(format!("{host}: {e}")))?
            .collect(),
    };
    let mut last = DialError::Resolve(format!("{host}: no addresses"));
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = DialError::from_io(e),
        }
    }
    Err(last)
}

async fn connect_inner(target: &Target) -> Result<BackendConn, DialError> {
    match target {
        Target::Tcp { host, port } => Ok(BackendConn::new(Io::Tcp(tcp(host, *port).await?))),
        Target::Unix(path) => {
            let s = UnixStream::connect(path)
                .await
                .map_err(DialError::from_io)?;
            Ok(BackendConn::new(Io::Unix(s)))
        }
    }
}

//! Opening backend connections: resolve the name (at every dial, never cached here)
//! and connect within `connect_timeout`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};

use super::conn::{BackendConn, Io};
use crate::config::Target;

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

async fn connect_inner(target: &Target) -> Result<BackendConn, DialError> {
    match target {
        Target::Tcp { host, port } => {
            let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
                Ok(ip) => vec![SocketAddr::new(ip, *port)],
                Err(_) => tokio::net::lookup_host((host.as_str(), *port))
                    .await
                    .map_err(|e| DialError::Resolve(format!("{host}: {e}")))?
                    .collect(),
            };
            let mut last = DialError::Resolve(format!("{host}: no addresses"));
            for addr in addrs {
                match TcpStream::connect(addr).await {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(BackendConn::new(Io::Tcp(s)));
                    }
                    Err(e) => last = DialError::from_io(e),
                }
            }
            Err(last)
        }
        Target::Unix(path) => {
            let s = UnixStream::connect(path)
                .await
                .map_err(DialError::from_io)?;
            Ok(BackendConn::new(Io::Unix(s)))
        }
    }
}

//! Listeners: bind, accept, tell HTTP/1.1 from HTTP/2 prior knowledge, and hand each
//! connection to its codec. Owns graceful shutdown (`drain`).
//!
//! Never blocks the runtime; an accept error (out of descriptors) is logged and
//! retried after a pause rather than spinning.

pub mod drain;
pub mod h1;
pub mod h2;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout_at, Instant};

use self::drain::Drain;
use crate::runtime::Live;

/// The client end of a connection, with its address rendered once for the headers
/// that carry it (`X-Forwarded-For`), not once per request.
#[derive(Clone)]
pub struct ClientAddr {
    pub addr: SocketAddr,
    pub ip_value: http::HeaderValue,
}

impl ClientAddr {
    pub fn new(addr: SocketAddr) -> ClientAddr {
        let ip = addr.ip().to_canonical().to_string();
        ClientAddr {
            addr,
            ip_value: http::HeaderValue::from_str(&ip)
                .expect("an IP address is a valid header value"),
        }
    }
}

/// Binds every listener, or fails naming the address that could not be bound.
pub async fn bind(addrs: &[SocketAddr]) -> anyhow::Result<Vec<TcpListener>> {
    let mut out = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        out.push(l);
    }
    Ok(out)
}

/// Accepts on `listener` until shutdown starts.
pub async fn accept_loop(listener: TcpListener, live: Arc<Live>, drain: Drain) {
    let mut watch = drain.watch();
    loop {
        let (stream, client) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("sluice: accept failed on {}: {e}; pausing 100ms", listener.local_addr().map(|a| a.to_string()).unwrap_or_default());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = watch.draining() => return,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(stream, client, live.clone(), drain.clone()));
    }
}

async fn connection(mut stream: TcpStream, client: SocketAddr, live: Arc<Live>, drain: Drain) {
    let _conn = drain.connection();
    let accepted = Instant::now();
    let deadline = accepted + h1::HEAD_TIMEOUT;
    // Allocate nothing until the client really sent something.
    let mut buf = loop {
        match timeout_at(deadline, stream.readable()).await {
            Ok(Ok(())) => {}
            _ => return,
        }
        match first_bytes(&stream) {
            Ok(Some(buf)) => break buf,
            Ok(None) => continue,
            Err(()) => return,
        }
    };
    // Enough to tell HTTP/2's preface from an HTTP/1 request line.
    while buf.len() < h2::PREFACE.len() && h2::PREFACE.starts_with(&buf) {
        match timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
    let watch = drain.watch();
    let client = ClientAddr::new(client);
    if buf.starts_with(h2::PREFACE) {
        // Boxed: an HTTP/1 connection's task should not be as large as an h2 one's.
        Box::pin(h2::serve(stream, buf.freeze(), client, live, drain, watch)).await;
    } else {
        let conn = h1::Conn {
            client,
            live,
            drain,
            watch,
        };
        conn.serve(stream, buf, accepted).await;
    }
}

/// After readiness (which a socket may report without data): the first bytes in a
/// fresh buffer, `Ok(None)` when nothing was there after all, `Err` when the peer
/// closed. Reads into the stack first so a spurious wakeup allocates nothing.
pub(crate) fn first_bytes(stream: &TcpStream) -> Result<Option<BytesMut>, ()> {
    let mut first = [0u8; 64];
    match stream.try_read(&mut first) {
        Ok(0) => Err(()),
        Ok(n) => {
            let mut buf = BytesMut::with_capacity(4096);
            buf.extend_from_slice(&first[..n]);
            Ok(Some(buf))
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(_) => Err(()),
    }
}

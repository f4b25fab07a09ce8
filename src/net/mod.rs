//! The byte streams both sides speak over, and the socket basics they share: a leaf,
//! importing nothing of the crate, that `server` (the client side) and `upstream` (the
//! backend side) both build on.
//!
//! [`transport::Transport`] is the one seam: TCP, Unix and TLS streams implement it
//! whichever side opened them, so TLS is handled one way (a [`tls::TlsConn`] either
//! way) and a new transport (a QUIC stream) is added beside them. [`stream::Stream`]
//! is the sum a pool's connections need: one pool may reach peers over TCP and Unix
//! sockets, with or without TLS.

pub(crate) mod fetch;
pub(crate) mod identity;
pub(crate) mod proxy_protocol;
pub(crate) mod redis;
pub(crate) mod stream;
pub(crate) mod tls;
pub(crate) mod transport;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

const ENFILE: i32 = 23;
const EMFILE: i32 = 24;
/// No local port (or address) left to connect from.
pub(crate) const EADDRNOTAVAIL: i32 = 99;
/// The host has no such address family (no IPv6).
const EAFNOSUPPORT: i32 = 97;

/// Whether `e` says this host is out of ports or descriptors: never a peer's fault.
pub(crate) fn is_local_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(EADDRNOTAVAIL | EMFILE | ENFILE))
}

/// Whether `e` says the file system cannot `sendfile` this file (some FUSE and network
/// file systems): the same body can still go by reads.
pub(crate) fn cannot_send_file(e: &io::Error) -> bool {
    const EINVAL: i32 = 22;
    const ENOSYS: i32 = 38;
    const EOPNOTSUPP: i32 = 95;
    matches!(e.raw_os_error(), Some(EINVAL | ENOSYS | EOPNOTSUPP))
}

/// TCP keepalive for a socket that may idle for long as a tunnel's end: the first probe
/// after 60 s of silence, then every 10 s, so a peer that vanished is noticed.
pub(crate) fn tcp_keepalive(s: &tokio::net::TcpStream) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10));
    let _ = socket2::SockRef::from(s).set_tcp_keepalive(&ka);
}

/// A listening TCP socket on `addr` (address reuse on, `TCP_NODELAY` for every
/// connection it accepts, backlog 1024). `dual_stack`:
/// an IPv6 wildcard takes both families on one socket, and a host without IPv6 gets
/// the IPv4 wildcard instead.
pub(crate) fn bind_tcp(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let open = |addr: SocketAddr| -> io::Result<TcpListener> {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        if addr.is_ipv6() {
            s.set_only_v6(!dual_stack)?;
        }
        s.set_reuse_address(true)?;
        s.set_nonblocking(true)?;
        // Accepted connections inherit it: no `setsockopt` per connection.
        s.set_tcp_nodelay(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        TcpListener::from_std(s.into())
    };
    match open(addr) {
        Err(e) if dual_stack && e.raw_os_error() == Some(EAFNOSUPPORT) => {
            open(SocketAddr::from(([0, 0, 0, 0], addr.port())))
        }
        r => r,
    }
}

/// A UDP socket on `addr` for QUIC, non-blocking, with the same family rules as
/// [`bind_tcp`]. Receive and send buffers are asked for 2 MiB each (the kernel caps them
/// at its `rmem_max`/`wmem_max`): a burst of packets waits there instead of being
/// dropped while a worker is busy.
pub(crate) fn bind_udp(addr: SocketAddr, dual_stack: bool) -> io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let open = |addr: SocketAddr| -> io::Result<std::net::UdpSocket> {
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            s.set_only_v6(!dual_stack)?;
        }
        s.set_nonblocking(true)?;
        let _ = s.set_recv_buffer_size(2 << 20);
        let _ = s.set_send_buffer_size(2 << 20);
        s.bind(&addr.into())?;
        Ok(s.into())
    };
    match open(addr) {
        Err(e) if dual_stack && e.raw_os_error() == Some(EAFNOSUPPORT) => {
            open(SocketAddr::from(([0, 0, 0, 0], addr.port())))
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    /// Linux copies the listener's `TCP_NODELAY` into each accepted socket, which is
    /// why the accept loops set nothing per connection.
    #[tokio::test]
    async fn accepted_connections_inherit_nodelay() {
        let l = super::bind_tcp("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = l.accept().await.unwrap();
        assert!(
            accepted.nodelay().unwrap(),
            "the accepted socket has TCP_NODELAY"
        );
        drop(c);
    }
}

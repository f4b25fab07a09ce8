//! A `tcp` (L4) listener's accept loop: each connection is judged and relayed by `l4`,
//! on the route the live generation has for this listener's address.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::drain::Drain;
use crate::runtime::Live;

/// Accepts on an L4 (`tcp`) listener until shutdown or `close`: each connection is
/// judged and relayed by `l4`, on the route the current generation has for this
/// listener's address.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    live: Arc<Live>,
    drain: Drain,
    close: Arc<tokio::sync::Notify>,
    addr: SocketAddr,
) {
    // Connections this listener relays now; carried across reloads with the listener.
    let open = crate::l4::Open::default();
    let mut taking = super::Taking::new(&drain, close);
    while let Some((stream, peer)) = taking.next(&listener, || format!("tcp {addr}")).await {
        let gen = live.load();
        let Some(route) = gen.tcp_route(addr) else {
            continue;
        };
        let Some(admitted) = crate::l4::admit(route, peer, &open, gen.tunnel_drain) else {
            continue;
        };
        let counted = drain.connection();
        let in_flight = drain.request();
        let live = live.clone();
        tokio::spawn(async move {
            // A pool chosen by the hello is the live generation's once it was read.
            let now = || live.load().tcp_route(addr).cloned();
            admitted.relay(stream, addr, peer, now).await;
            drop((in_flight, counted));
        });
    }
}

//! An L4 relay: the backend connection opens as soon as the client is accepted
//! (protocols where the server speaks first work) — or, routed by SNI, once its
//! ClientHello was read, which goes to the backend first — on a peer the pool reaches
//! (`Pool::reach`: one that cannot be reached is marked and the next one tried), and
//! bytes are relayed both ways until both directions end or nothing moved for `idle`.
//! A relay whose pool a reload removed closes `tunnel_drain` after.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use crate::tunnel::{idle_for, pump};
use crate::upstream::connect::{Passage, Unreached};
use crate::upstream::{Note, Pool, Tried};

pub(super) async fn relay(
    mut client: tokio::net::TcpStream,
    first: Bytes,
    pool: Arc<Pool>,
    idle: Duration,
    drain: Duration,
) {
    let mut note = Note::default();
    let reached = pool
        .reach(Passage::Relay, None, &mut Tried::default(), &mut note)
        .await;
    let (conn, lease) = match reached {
        Ok(reached) => reached,
        // Counted and logged by the connector; no other peer would do better.
        Err(Unreached::Local(_) | Unreached::Unsupported(_)) => return,
        Err(Unreached::AllDown | Unreached::Exhausted(_)) => {
            tracing::info!(
                pool = pool.name(),
                "sluice: {}: no backend could be reached; closed the client's connection",
                pool.name()
            );
            return;
        }
    };
    conn.keepalive();
    let (mut backend, _) = conn.into_parts();
    // `proxy_protocol`: the backend learns whose connection this is, before any byte.
    if let Some(v) = pool.cfg.proxy_protocol {
        let (Ok(peer), Ok(local)) = (client.peer_addr(), client.local_addr()) else {
            return;
        };
        let header = crate::net::proxy_protocol::encode(v.into(), peer, local);
        if backend.write_all(&header).await.is_err() {
            return;
        }
    }
    // What was read from the client to choose the pool (a ClientHello) goes next.
    if !first.is_empty() && backend.write_all(&first).await.is_err() {
        return;
    }
    let retired = lease.pool.state.retired();
    tokio::select! {
        _ = relay_idle(&mut client, backend, idle) => {}
        _ = async {
            retired.await;
            tokio::time::sleep(drain).await;
        } => {}
    }
    drop(lease);
}

/// Both directions, each ending on its own (a half-close is passed on), until both
/// ended or no byte moved either way for `idle`.
async fn relay_idle(
    client: &mut tokio::net::TcpStream,
    backend: crate::net::stream::Stream,
    idle: Duration,
) {
    let last = AtomicU64::new(crate::clock::now_ms());
    let (mut cr, mut cw) = client.split();
    let (mut br, mut bw) = tokio::io::split(backend);
    let both = async { tokio::join!(pump(&mut cr, &mut bw, &last), pump(&mut br, &mut cw, &last)) };
    tokio::select! {
        _ = both => {}
        _ = idle_for(&last, idle) => {}
    }
}

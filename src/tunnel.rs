//! Upgraded connections (WebSockets): after a backend answered `101 Switching
//! Protocols`, the client's connection and the backend's are joined and bytes relayed
//! both ways until either side closes (a half-close is passed on: each direction ends
//! on its own). A tunnel has no idle timeout of its own — TCP keepalive on both sides
//! finds vanished peers — counts as in flight on its peer (for `least_conn`), takes no
//! `limit` slot, and is capped by `max_tunnels`. A reload never cuts one; a tunnel whose
//! pool a reload removed closes after `tunnel_drain`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::upstream::conn::BackendConn;
use crate::upstream::Lease;

/// Tunnels open now, process-wide.
pub static OPEN: AtomicU64 = AtomicU64::new(0);

/// Counts an open tunnel until dropped.
pub struct Opened(());

impl Opened {
    /// Takes a place under `max`, or `None` when `max` tunnels are open.
    pub fn try_open(max: u64) -> Option<Opened> {
        let mut n = OPEN.load(Ordering::Relaxed);
        loop {
            if n >= max {
                return None;
            }
            match OPEN.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(Opened(())),
                Err(now) => n = now,
            }
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A backend connection that answered 101, waiting for the client side.
pub struct Tunnel {
    pub conn: BackendConn,
    /// The peer's in-flight count, held while the tunnel is open.
    pub lease: Lease,
    pub opened: Opened,
    pub drain: Duration,
}

impl Tunnel {
    /// Relays between `client` and the backend until both directions end. `early`: bytes
    /// the client sent after its request head, which belong to the backend.
    pub async fn join<C: AsyncRead + AsyncWrite + Unpin>(self, client: &mut C, early: Bytes) {
        let Tunnel {
            conn,
            lease,
            opened,
            drain,
        } = self;
        let (mut backend, leftover) = conn.into_parts();
        if !early.is_empty() && backend.write_all(&early).await.is_err() {
            return;
        }
        if !leftover.is_empty() && client.write_all(&leftover).await.is_err() {
            return;
        }
        let retired = lease.pool.state.retired();
        tokio::pin!(retired);
        let relay = tokio::io::copy_bidirectional(client, &mut backend);
        tokio::pin!(relay);
        tokio::select! {
            _ = &mut relay => {}
            _ = async {
                retired.await;
                tokio::time::sleep(drain).await;
            } => {
                tracing::info!(
                    "sluice: {}: closed a tunnel to {} whose pool a reload removed, after tunnel_drain",
                    lease.pool.name(),
                    lease.pool.peers()[lease.peer].addr.text
                );
            }
        }
        drop(opened);
    }
}

//! Upgraded connections (WebSockets): after a backend answered `101 Switching
//! Protocols`, the client's connection and the backend's are joined and bytes relayed
//! both ways until either side closes (a half-close is passed on: each direction ends
//! on its own) or no byte moved either way for `tunnel_idle` (TCP keepalive on both
//! sides finds vanished peers sooner). A tunnel counts as in flight on its peer (for
//! `least_conn`), holds no `limit` slot once open, and is capped by `max_tunnels`. A
//! reload never cuts one; a tunnel whose pool a reload removed closes after
//! `tunnel_drain`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::upstream::conn::BackendConn;
use crate::upstream::Lease;

/// Tunnels open now, process-wide.
pub(crate) static OPEN: AtomicU64 = AtomicU64::new(0);

/// Counts an open tunnel until dropped.
pub(crate) struct Opened(());

impl Opened {
    /// Takes a place under `max`, or `None` when `max` tunnels are open.
    pub(crate) fn try_open(max: u64) -> Option<Opened> {
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
pub(crate) struct Tunnel {
    pub conn: BackendConn,
    /// The peer's in-flight count, held while the tunnel is open.
    pub lease: Lease,
    pub opened: Opened,
    pub drain: Duration,
    /// No byte either way for this long closes the tunnel.
    pub idle: Duration,
}

impl Tunnel {
    /// Relays between `client` and the backend until both directions end. `early`: bytes
    /// the client sent after its request head, which belong to the backend.
    pub(crate) async fn join<C: AsyncRead + AsyncWrite + Unpin>(
        self,
        client: &mut C,
        early: Bytes,
    ) {
        let Tunnel {
            conn,
            lease,
            opened,
            drain,
            idle,
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
        let last = AtomicU64::new(crate::clock::now_ms());
        let relay = async {
            let mut client = Stamped {
                inner: client,
                last: &last,
            };
            let mut backend = Stamped {
                inner: &mut backend,
                last: &last,
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut backend) => {}
                _ = idle_for(&last, idle) => {}
            }
        };
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

/// Resolves once no byte moved (as `last` says, in `now_ms`) for `idle`.
pub(crate) async fn idle_for(last: &AtomicU64, idle: Duration) {
    loop {
        let since = crate::clock::now_ms().saturating_sub(last.load(Ordering::Relaxed));
        let left = (idle.as_millis() as u64).saturating_sub(since);
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(left)).await;
    }
}

/// A stream that notes in `last` when it last read a byte, for a tunnel's idle timeout.
struct Stamped<'a, S> {
    inner: S,
    last: &'a AtomicU64,
}

impl<S: AsyncRead + Unpin> AsyncRead for Stamped<'_, S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.last.store(crate::clock::now_ms(), Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Stamped<'_, S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One direction: copies until EOF, noting each move in `last`, then passes the
/// half-close on.
pub(crate) async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    last: &AtomicU64,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                last.store(crate::clock::now_ms(), Ordering::Relaxed);
                if w.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = w.shutdown().await;
}

//! HTTP/2 response streams a client stopped reading. A stream asks its response body
//! for the next frame only once the last one found room in the stream's flow-control
//! window and the connection's send buffer (`h2::send`), so a stalled stream
//! is one whose body is not asked for anything: nothing inside the body can notice.
//! A body that yields a frame and is not done (any streamed response: a client can
//! hold its window at zero from the start) is therefore moved where its connection's
//! sweeper can see it; once one has waited [`SEND_TIMEOUT`] to be asked again, the
//! sweeper drops it — freeing its pool slot and backend connection — and the connection
//! is closed (as nginx's `send_timeout` does). A response whose body ends with its
//! first frame, nearly every small one, costs nothing.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as _, Frame};

use super::transport::SEND_TIMEOUT;
use crate::body::{Body, BodyError};
use crate::clock::now_ms;

/// How often a connection with watched bodies looks at them.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The watched bodies of one connection.
#[derive(Default)]
pub(super) struct Stalls {
    watched: Mutex<Vec<Weak<Watched>>>,
    wake: tokio::sync::Notify,
}

/// A body under watch: when it started waiting to be asked again (0: it is being
/// asked), and the body itself, until the sweeper drops it.
pub(super) struct Watched {
    waiting_since: AtomicU64,
    body: Mutex<Option<Body>>,
}

/// A response body as an h2 stream holds it.
pub(super) enum Held {
    Inline(Body),
    Watched(Arc<Watched>),
}

impl Held {
    pub(super) fn new(body: Body) -> Held {
        Held::Inline(body)
    }

    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
        stalls: &Stalls,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self {
            Held::Inline(body) => {
                let r = Pin::new(&mut *body).poll_frame(cx);
                if matches!(r, Poll::Ready(Some(Ok(_)))) && !body.is_end_stream() {
                    let body = std::mem::replace(body, Body::Empty);
                    *self = Held::Watched(stalls.watch(body));
                }
                r
            }
            Held::Watched(w) => {
                w.waiting_since.store(0, Ordering::Relaxed);
                let mut body = w.body.lock().unwrap_or_else(|e| e.into_inner());
                let Some(b) = body.as_mut() else {
                    return Poll::Ready(Some(Err(BodyError::ClientGone(
                        "the client read nothing of the response for 60s",
                    ))));
                };
                let r = Pin::new(b).poll_frame(cx);
                if matches!(r, Poll::Ready(Some(Ok(_)))) {
                    w.waiting_since.store(now_ms(), Ordering::Relaxed);
                }
                r
            }
        }
    }

    pub(super) fn is_end_stream(&self) -> bool {
        match self {
            Held::Inline(body) => body.is_end_stream(),
            Held::Watched(w) => w
                .body
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_none_or(Body::is_end_stream),
        }
    }

    pub(super) fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Held::Inline(body) => body.size_hint(),
            Held::Watched(_) => http_body::SizeHint::default(),
        }
    }
}

impl Stalls {
    fn watch(&self, body: Body) -> Arc<Watched> {
        let w = Arc::new(Watched {
            waiting_since: AtomicU64::new(now_ms()),
            body: Mutex::new(Some(body)),
        });
        let mut list = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&w));
        drop(list);
        self.wake.notify_one();
        w
    }

    /// Drops the bodies that waited [`SEND_TIMEOUT`] to be asked again, and returns
    /// once it did: the connection is to be closed.
    pub(super) async fn sweep(&self, client: std::net::SocketAddr) {
        loop {
            if self.is_empty() {
                self.wake.notified().await;
            }
            tokio::time::sleep(SWEEP_EVERY).await;
            let now = now_ms();
            let limit = SEND_TIMEOUT.as_millis() as u64;
            let mut cut = Vec::new();
            {
                let mut list = self.watched.lock().unwrap_or_else(|e| e.into_inner());
                list.retain(|w| {
                    let Some(w) = w.upgrade() else { return false };
                    let since = w.waiting_since.load(Ordering::Relaxed);
                    if since != 0 && now.saturating_sub(since) >= limit {
                        cut.extend(w.body.lock().unwrap_or_else(|e| e.into_inner()).take());
                        return false;
                    }
                    true
                });
            }
            if !cut.is_empty() {
                tracing::debug!(
                    client = %client,
                    "sluice: {} HTTP/2 response(s) not read for {SEND_TIMEOUT:?}; closing the connection",
                    cut.len()
                );
                // Dropped outside the lock: a body's drop frees its slot and connection.
                drop(cut);
                return;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

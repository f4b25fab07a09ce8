//! A backend's response body on its way to the client, holding what the request
//! leased: the pool slot, the peer's in-flight count and the connection. The
//! connection goes back to the idle list only when the body ended cleanly; a body
//! the client abandoned (dropped early) closes its connection.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::OwnedSemaphorePermit;

use crate::body::BodyError;
use crate::upstream::connpool::Sender;
use crate::upstream::Pool;

/// What one request holds on its pool until its response has been passed on.
pub struct Lease {
    pub pool: Arc<Pool>,
    pub peer: usize,
    pub sender: Option<Sender>,
    pub permit: Option<OwnedSemaphorePermit>,
}

impl Lease {
    pub fn new(pool: Arc<Pool>, peer: usize, permit: Option<OwnedSemaphorePermit>) -> Lease {
        pool.peers[peer].in_flight.fetch_add(1, Ordering::Relaxed);
        Lease {
            pool,
            peer,
            sender: None,
            permit,
        }
    }

    /// The response is complete: its connection may carry another request.
    fn release_connection(&mut self) {
        if let Some(s) = self.sender.take() {
            let ka = self.pool.cfg.keepalive;
            self.pool.peers[self.peer].idle.checkin(s, ka.idle_max);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.peers[self.peer]
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct ResponseBody {
    inner: Incoming,
    lease: Option<Lease>,
}

impl ResponseBody {
    pub fn new(inner: Incoming, mut lease: Lease) -> ResponseBody {
        if inner.is_end_stream() {
            lease.release_connection();
        }
        ResponseBody {
            inner,
            lease: Some(lease),
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                if let Some(mut lease) = this.lease.take() {
                    lease.release_connection();
                }
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(mut lease) = this.lease.take() {
                    lease.sender = None;
                    lease
                        .pool
                        .peer_failed(lease.peer, &format_args!("response body broke off: {e}"));
                }
                Poll::Ready(Some(Err(BodyError::Upstream(e))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                // A consumer may stop polling once `is_end_stream` holds (hyper's h2
                // server does), so the connection goes back as soon as the end is known.
                if this.inner.is_end_stream() {
                    if let Some(lease) = this.lease.as_mut() {
                        lease.release_connection();
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

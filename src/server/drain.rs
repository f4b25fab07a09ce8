//! Graceful shutdown: counts open connections and in-flight requests, and tells
//! connections when sluice stops taking new work. Atomics and one watch channel; no lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify};

use super::idle::Wheel;

#[derive(Clone)]
pub(crate) struct Drain {
    inner: Arc<Inner>,
}

struct Inner {
    connections: AtomicUsize,
    requests: AtomicUsize,
    idle: Notify,
    tx: watch::Sender<bool>,
    /// Where kept-alive connections wait for their next request.
    wheel: Arc<Wheel>,
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

impl Drain {
    pub(crate) fn new() -> Self {
        Drain {
            inner: Arc::new(Inner {
                connections: AtomicUsize::new(0),
                requests: AtomicUsize::new(0),
                idle: Notify::new(),
                tx: watch::channel(false).0,
                wheel: Wheel::new(),
            }),
        }
    }

    pub(crate) fn watch(&self) -> Watch {
        watch(&self.inner)
    }

    pub(crate) fn connection(&self) -> ConnectionGuard {
        self.inner.connections.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard {
            inner: self.inner.clone(),
        }
    }

    pub(crate) fn request(&self) -> RequestGuard {
        request(&self.inner)
    }

    /// Stop taking new work: listeners stop accepting, idle connections close.
    pub(crate) fn start(&self) {
        self.inner.tx.send_replace(true);
        self.inner.wheel.drain();
    }

    pub(crate) fn requests_in_flight(&self) -> usize {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Resolves when no connection is open.
    pub(crate) async fn closed(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.inner.connections.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

fn request(inner: &Arc<Inner>) -> RequestGuard {
    inner.requests.fetch_add(1, Ordering::Relaxed);
    RequestGuard {
        inner: inner.clone(),
    }
}

fn watch(inner: &Inner) -> Watch {
    Watch {
        rx: inner.tx.subscribe(),
    }
}

pub(crate) struct Watch {
    rx: watch::Receiver<bool>,
}

impl Watch {
    pub(crate) async fn draining(&mut self) {
        let _ = self.rx.wait_for(|d| *d).await;
    }
}

pub(crate) struct ConnectionGuard {
    inner: Arc<Inner>,
}

impl ConnectionGuard {
    /// The drain this connection is counted in.
    pub(crate) fn drain(&self) -> Drain {
        Drain {
            inner: self.inner.clone(),
        }
    }

    /// A request of this connection, counted until the guard drops.
    pub(crate) fn request(&self) -> RequestGuard {
        request(&self.inner)
    }

    pub(crate) fn watch(&self) -> Watch {
        watch(&self.inner)
    }

    /// Whether the drain has started (one atomic load).
    pub(crate) fn is_draining(&self) -> bool {
        self.inner.wheel.is_draining()
    }

    /// Where the connection waits while it is idle.
    pub(crate) fn wheel(&self) -> &Arc<Wheel> {
        &self.inner.wheel
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if self.inner.connections.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

pub(crate) struct RequestGuard {
    inner: Arc<Inner>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.inner.requests.fetch_sub(1, Ordering::Relaxed);
    }
}
